"""Client side of a host's MAD socket (ibsim's protocol): what ibemu's own SM attaches with.

``UmadClient.connect(ns)`` binds ``<base>:ctl<id>`` and ``<base>:in<id>`` in the host's
namespace, sends CONNECT, and connects its data socket to the slot the server gives it. Then
``send(req)`` / ``await recv()`` move 288-byte ``sim_request`` datagrams. A client id other
than the pid lets one process hold several clients.
"""

from __future__ import annotations

import itertools
import os
import socket

import trio

from ibemu import clock
from ibemu.kernel.commands import KernelError
from ibemu.kernel.unix import abstract_address, open_abstract_dgram
from ibemu.wire.umad import (
    CTL_LEN,
    DEFAULT_SOCKNAME,
    SIM_REQUEST_LEN,
    ClientInfo,
    CtlMessage,
    CtlType,
    SimRequest,
)

_ids = itertools.count(1)


class UmadClient:
    def __init__(self, ctl: socket.socket, data: socket.socket, slot: int, client_id: int,
                 attached_to: str) -> None:
        self.ctl = ctl
        self.data = data
        self.slot = slot
        self.client_id = client_id
        self.attached_to = attached_to

    @classmethod
    def connect_blocking(cls, ns: str | None, *, sockname: str = DEFAULT_SOCKNAME, issm: bool = False,
                         client_id: int | None = None, timeout_s: float = 5.0) -> UmadClient:
        """Attach (blocking: call from a worker thread or before trio)."""
        cid = client_id if client_id is not None else (os.getpid() * 100 + next(_ids)) % (1 << 31)
        ctl = open_abstract_dgram(ns, f"{sockname}:ctl{cid}")
        data = open_abstract_dgram(ns, f"{sockname}:in{cid}")
        try:
            ctl.setblocking(True)
            ctl.settimeout(clock.real_s(timeout_s))  # emulated seconds
            ctl.connect(abstract_address(f"{sockname}:ctl"))
            info = ClientInfo(id=cid, qp=0, issm=int(issm)).pack()
            ctl.send(CtlMessage(CtlType.CONNECT, data=info, length=len(info)).pack())
            reply = CtlMessage.unpack(ctl.recv(CTL_LEN))
            if reply.type != CtlType.CONNECT:
                raise KernelError(f"MAD socket {sockname!r} in {ns}: CONNECT refused (all slots taken?)")
            attached = ClientInfo.unpack(reply.data)
            data.connect(abstract_address(f"{sockname}:out{attached.id}"))
            if issm:
                ctl.send(CtlMessage(CtlType.SET_ISSM, clientid=attached.id, data=(1).to_bytes(4, "little"),
                                    length=4).pack())
                CtlMessage.unpack(ctl.recv(CTL_LEN))
        except (OSError, KernelError) as exc:
            ctl.close()
            data.close()
            if isinstance(exc, KernelError):
                raise
            raise KernelError(f"MAD socket {sockname!r} in {ns}: {exc}") from exc
        return cls(ctl, data, attached.id, cid, attached.nodeid)

    @classmethod
    async def connect(cls, ns: str | None, **kw: object) -> UmadClient:
        return await trio.to_thread.run_sync(lambda: cls.connect_blocking(ns, **kw))  # type: ignore[arg-type]

    def send(self, req: SimRequest) -> None:
        self.data.send(req.pack())

    def try_recv(self) -> SimRequest | None:
        try:
            raw = self.data.recv(SIM_REQUEST_LEN + 16)
        except BlockingIOError:
            return None
        return SimRequest.unpack(raw)

    async def recv(self) -> SimRequest:
        while True:
            req = self.try_recv()
            if req is not None:
                return req
            await trio.lowlevel.wait_readable(self.data)

    def close(self) -> None:
        """DISCONNECT (waiting briefly for the server's reply, so it has a socket to answer)."""
        try:
            self.ctl.settimeout(clock.real_s(0.2))
            self.ctl.send(CtlMessage(CtlType.DISCONNECT, clientid=self.slot).pack())
            self.ctl.recv(CTL_LEN)
        except OSError:
            pass
        self.ctl.close()
        self.data.close()
