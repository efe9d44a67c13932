"""The MAD socket of an emulated HCA port: ibsim's client protocol served with trio.

Binds ``<base>:ctl`` and ``<base>:out0`` .. ``out9`` (abstract AF_UNIX datagram sockets) in
the host's network namespace, answers control messages from the port backend, hands client
MADs to ``backend.send_mad`` and writes MADs given to ``UmadServer.deliver`` to the right
client. Protocol logic lives in ``ibemu.wire.umad`` (sans-IO).

    server = await nursery.start(serve, backend, ns)
    backend.deliver = server.deliver      # the fabric's responses and traps come back here

A killed client sends no DISCONNECT: its slot is freed when a send to it fails, when a
CONNECT finds all slots taken, or by the periodic check (``reap_interval``), which asks the
kernel whether the client's ``in<pid>`` socket still exists (a connect(), no data sent).
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
from collections import Counter

import trio

from ibemu.kernel.unix import open_abstract_dgram
from ibemu.wire.umad import (
    CTL_LEN,
    DEFAULT_SOCKNAME,
    MAX_CLIENTS,
    Client,
    Delivery,
    SimRequest,
    UmadPortBackend,
    UmadSession,
)

log = logging.getLogger(__name__)

RECV_BUF = 4096  # larger than any valid datagram, so oversized ones are seen as such
_DEAD = frozenset({errno.ECONNREFUSED, errno.ENOTCONN, errno.ECONNRESET, errno.EPIPE})
_FAIRNESS = 256  # datagrams handled per socket before yielding to other tasks (a whole SM window)


class UmadServer:
    """One MAD socket; ``run`` serves it, ``deliver`` sends MADs to its clients."""

    def __init__(self, backend: UmadPortBackend, ns: str | None, sockname: str = DEFAULT_SOCKNAME,
                 *, restore_tid: bool = True, reap_interval: float | None = 1.0,
                 backlog: int = 256, stall_timeout: float = 5.0) -> None:
        self.backend = backend
        self.ns = ns
        self.sockname = sockname
        self.session = UmadSession(backend, sockname, restore_tid=restore_tid)
        self.reap_interval = reap_interval
        self.backlog_limit = backlog
        self.stall_timeout = stall_timeout
        self._ctl: socket.socket | None = None
        # Slot i's data socket is bound on the first CONNECT that gets slot i (a port that no
        # client ever uses costs one descriptor, not eleven).
        self._out: list[socket.socket | None] = [None] * MAX_CLIENTS
        self._backlog: list[collections.deque[bytes]] = [collections.deque() for _ in range(MAX_CLIENTS)]
        self._flushing = [False] * MAX_CLIENTS
        self._nursery: trio.Nursery | None = None

    @property
    def stats(self) -> Counter[str]:
        return self.session.stats

    # ----------------------------------------------------------------- lifecycle

    def _open_sockets(self) -> None:
        self._ctl = open_abstract_dgram(self.ns, f"{self.sockname}:ctl")

    def _data_socket(self, slot: int) -> socket.socket:
        """Slot ``slot``'s ``<base>:out<slot>``, bound (and served) on first use.

        Binding enters the namespace from the trio thread for a few microseconds, in one
        synchronous step: no other task runs meanwhile.
        """
        sock = self._out[slot]
        if sock is None:
            sock = open_abstract_dgram(self.ns, f"{self.sockname}:out{slot}")
            self._out[slot] = sock
            if self._nursery is not None:
                self._nursery.start_soon(self._data_loop, slot, sock)
        return sock

    async def serve(self, *, task_status: trio.TaskStatus[UmadServer] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the sockets and serve until cancelled; ``task_status.started(self)``."""
        # Entering a namespace must happen off the trio thread.
        await trio.to_thread.run_sync(self._open_sockets)
        assert self._ctl is not None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._ctl_loop, self._ctl)
                if self.reap_interval:
                    nursery.start_soon(self._reap_loop, self.reap_interval)
                log.info("MAD socket %r serving in %s", self.sockname, self.ns or "this namespace")
                task_status.started(self)
        finally:
            self._nursery = None
            for s in [self._ctl, *self._out]:
                if s is not None:
                    s.close()
            self._ctl, self._out = None, [None] * MAX_CLIENTS

    # ----------------------------------------------------------------- receiving

    async def _ctl_loop(self, sock: socket.socket) -> None:
        budget = _FAIRNESS
        while True:
            try:
                data, addr = sock.recvfrom(RECV_BUF)
            except BlockingIOError:
                budget = _FAIRNESS
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:  # e.g. a reply to an earlier sender bounced
                self.stats["ctl_recv_error"] += 1
                log.debug("control socket: %s", exc)
                await trio.lowlevel.checkpoint()
                continue
            try:
                self._handle_ctl(sock, data, addr)
            except Exception:  # a bug must not take the port's MAD socket down
                self.stats["internal_error"] += 1
                log.exception("control message from %r", addr)
            budget -= 1
            if not budget:
                budget = _FAIRNESS
                await trio.lowlevel.checkpoint()

    def _handle_ctl(self, sock: socket.socket, data: bytes, addr: object) -> None:
        if len(data) == CTL_LEN and data[8] == 1 and (self.session.clients.full()
                                                       or self.session.clients.sm_client() is not None):
            # a CONNECT while full, or while an SM is attached (a new SM after one was killed):
            # make room from dead clients first
            self.reap()
        outcome = self.session.on_ctl(data, addr)
        reply = outcome.reply
        attach = outcome.attach
        if attach is not None:
            self._backlog[attach.slot].clear()
            try:
                self._data_socket(attach.slot).connect(attach.address)
            except OSError as exc:
                log.warning("slot %d: cannot connect to the client's data socket %r: %s",
                            attach.slot, attach.address, exc)
                self.stats["connect_no_data_socket"] += 1
                self.session.client_gone(attach.slot)
                reply, attach = attach.error_reply, None
        if reply is None:
            return
        try:
            sock.sendto(reply, addr)  # type: ignore[call-overload]
        except OSError as exc:
            self.stats["ctl_reply_failed"] += 1
            log.warning("control reply to %r failed: %s", addr, exc)
            if attach is not None:
                self.session.client_gone(attach.slot)

    async def _data_loop(self, slot: int, sock: socket.socket) -> None:
        budget = _FAIRNESS
        while True:
            try:
                data = sock.recv(RECV_BUF)
            except BlockingIOError:
                budget = _FAIRNESS
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                self.stats["data_recv_error"] += 1
                log.debug("slot %d data socket: %s", slot, exc)
                await trio.lowlevel.checkpoint()
                continue
            try:
                bounce = self.session.on_data(slot, data)
                if bounce is not None:
                    self._send(slot, bounce)
            except Exception:  # a bug must not take the port's MAD socket down
                self.stats["internal_error"] += 1
                log.exception("MAD from slot %d", slot)
            budget -= 1
            if not budget:
                budget = _FAIRNESS
                await trio.lowlevel.checkpoint()

    # ----------------------------------------------------------------- sending

    def deliver(self, req: SimRequest) -> Delivery:
        """Send a MAD from the fabric to the client it belongs to (trio thread only).

        Responses and undeliverable requests (status 110) go to the slot in TID bits 48-63;
        unsolicited MADs (traps) to the SM client. Never blocks: a client whose receive queue
        is full gets the MAD later (QUEUED) or, past ``backlog`` MADs, not at all (DROPPED).
        """
        if self._ctl is None:
            self.stats["deliver_not_running"] += 1
            return Delivery.DROPPED
        routed = self.session.route(req)
        if isinstance(routed, Delivery):
            return routed
        slot, payload = routed
        return self._send(slot, payload)

    def _send(self, slot: int, payload: bytes) -> Delivery:
        queue = self._backlog[slot]
        if queue:
            return self._enqueue(slot, payload)
        sock = self._out[slot]
        if sock is None:
            self.stats["deliver_no_socket"] += 1
            return Delivery.DROPPED
        try:
            sock.send(payload)
        except BlockingIOError:
            return self._enqueue(slot, payload)
        except OSError as exc:
            return self._send_failed(slot, exc)
        self.stats["delivered"] += 1
        return Delivery.DELIVERED

    def _send_failed(self, slot: int, exc: OSError) -> Delivery:
        self._backlog[slot].clear()
        if exc.errno in _DEAD:
            log.info("slot %d: client seems dead (%s)", slot, exc)
            self.session.client_gone(slot)
            return Delivery.CLIENT_GONE
        self.stats["send_error"] += 1
        log.warning("slot %d: send failed: %s", slot, exc)
        return Delivery.DROPPED

    def _enqueue(self, slot: int, payload: bytes) -> Delivery:
        queue = self._backlog[slot]
        if len(queue) >= self.backlog_limit or self._nursery is None:
            self.stats["backlog_dropped"] += 1
            return Delivery.DROPPED
        queue.append(payload)
        self.stats["queued"] += 1
        if not self._flushing[slot]:
            client = self.session.clients.get(slot)
            if client is not None:
                self._flushing[slot] = True
                self._nursery.start_soon(self._flush, slot, client)
        return Delivery.QUEUED

    async def _flush(self, slot: int, client: Client) -> None:
        """Drain a slot's backlog as its client reads; drop a MAD the client will not take."""
        queue, sock = self._backlog[slot], self._out[slot]
        if sock is None:
            self._flushing[slot] = False
            queue.clear()
            return
        try:
            while queue and self.session.clients.get(slot) is client:
                try:
                    sock.send(queue[0])
                except BlockingIOError:
                    with trio.move_on_after(self.stall_timeout) as scope:
                        await trio.lowlevel.wait_writable(sock)
                    if scope.cancelled_caught:
                        queue.popleft()
                        self.stats["stall_dropped"] += 1
                        log.warning("slot %d: client not reading for %.1f s: MAD dropped",
                                    slot, self.stall_timeout)
                    continue
                except OSError as exc:
                    self._send_failed(slot, exc)
                    return
                queue.popleft()
                self.stats["delivered"] += 1
            if self.session.clients.get(slot) is not client:
                queue.clear()
        finally:
            self._flushing[slot] = False

    # ----------------------------------------------------------------- liveness

    def reap(self) -> list[int]:
        """Free the slots whose client's data socket is gone; returns them."""
        gone = []
        for client in list(self.session.clients):
            sock = self._out[client.slot]
            if sock is None:
                continue
            try:
                # Re-connecting to the same live peer is a no-op; a vanished name refuses.
                sock.connect(client.data_addr)
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    gone.append(client.slot)
                    self._backlog[client.slot].clear()
                    self.session.client_gone(client.slot)
                else:
                    log.debug("slot %d liveness check: %s", client.slot, exc)
        return gone

    async def _reap_loop(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            self.reap()


async def serve(port_backend: UmadPortBackend, ns: str | None, sockname: str = DEFAULT_SOCKNAME, *,
                restore_tid: bool = True, reap_interval: float | None = 1.0,
                task_status: trio.TaskStatus[UmadServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the MAD socket of ``port_backend`` in namespace ``ns`` until cancelled.

    ``ns=None`` binds in the caller's own namespace. ``task_status.started(server)`` hands
    over the ``UmadServer``: give its ``deliver`` to the backend so responses and traps
    reach the clients.
    """
    server = UmadServer(port_backend, ns, sockname, restore_tid=restore_tid,
                        reap_interval=reap_interval)
    await server.serve(task_status=task_status)
