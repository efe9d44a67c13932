"""Test doubles for the MAD socket: a port backend with a tiny local SMA, and a Python client.

``LocalSma`` answers directed-route SMPs with HopCount 0 (and LID-routed SMPs to its own
LID): NodeInfo, NodeDescription, PortInfo, P_KeyTable Get. Anything else comes back with
status 110, as the fabric returns a MAD it cannot deliver. ``PyClient`` speaks the client
side of the protocol the way ``umad2sim/sim_client.c`` does.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ibemu.wire.mad import NodeDescription, NodeInfo, PKeyTable, PortInfo
from ibemu.wire.umad import (
    CTL_LEN,
    SIM_REQUEST_LEN,
    STATUS_TIMEOUT,
    ClientInfo,
    CtlMessage,
    CtlType,
    Delivery,
    SimRequest,
)

NODE_GUID = 0x0008F10403960558
LID = 0x17
SM_LID = 0x01
NODE_DESC = "ibemu-test h1 HCA-1"
ISSM_BIT = 1 << 1


@dataclass
class LocalSma:
    """A one-port CA behind a MAD socket, answering its own SMPs synchronously."""

    node_guid: int = NODE_GUID
    gid_prefix: int = 0xFE80000000000000
    node_name: str = "h1"
    lid: int = LID
    state: int = 4  # Active
    capmask: int = 0x02510868
    deliver: Callable[[SimRequest], Delivery] | None = None
    sent: list[SimRequest] = field(default_factory=list)
    issm_calls: list[bool] = field(default_factory=list)
    answer: bool = True
    keep_sent: bool = True

    def node_info(self) -> bytes:
        return bytes(NodeInfo(node_type=1, num_ports=1, system_image_guid=self.node_guid,
                              node_guid=self.node_guid, port_guid=self.node_guid + 1,
                              partition_cap=128, device_id=0x1017, revision=0x0,
                              local_port_num=1, vendor_id=0x02C9)).ljust(64, b"\0")

    def port_info(self, port: int = 0) -> bytes:
        return bytes(PortInfo(gid_prefix=self.gid_prefix, lid=self.lid, master_sm_lid=SM_LID,
                              capability_mask=self.capmask, local_port_num=1,
                              link_width_enabled=2, link_width_supported=2, link_width_active=2,
                              link_speed_supported=1, port_state=self.state, port_phys_state=5,
                              link_speed_active=1, link_speed_enabled=1, neighbor_mtu=5,
                              vl_cap=4, mtu_cap=5, operational_vls=4, subnet_timeout=18,
                              resp_time_value=16)).ljust(64, b"\0")

    def pkeys(self) -> bytes:
        return bytes(PKeyTable())

    def port_lid_state(self) -> tuple[int, int]:
        return self.lid, self.state

    def vendor(self) -> tuple[int, int, int, int]:
        return 0x02C9, 0x1017, 0, 1

    def set_issm(self, on: bool) -> None:
        self.issm_calls.append(on)
        self.capmask = self.capmask | ISSM_BIT if on else self.capmask & ~ISSM_BIT

    def send_mad(self, req: SimRequest) -> None:
        if self.keep_sent:
            self.sent.append(req)
        if not self.answer or self.deliver is None:
            return
        if req.is_response:
            return  # a client answering someone: nobody else here
        self.deliver(self.respond(req))

    def respond(self, req: SimRequest) -> SimRequest:
        """The response this CA gives ``req``, or ``req`` bounced with status 110."""
        mad = req.mad
        cls, method, attr = mad[1], mad[3], struct.unpack_from(">H", mad, 16)[0]
        local = (cls == 0x81 and mad[7] == 0) or (cls == 0x01 and req.dlid in (self.lid, 0xFFFF))
        data = self._attribute(attr) if local and method == 0x01 else None
        if data is None:
            return replace(req, status=STATUS_TIMEOUT)
        out = bytearray(mad)
        out[3] = 0x81  # GetResp
        if cls == 0x81:
            struct.pack_into(">H", out, 4, 0x8000)  # D bit, status 0
        else:
            struct.pack_into(">H", out, 4, 0)
        out[64:128] = data
        return SimRequest(dlid=req.slid, slid=req.dlid, dqp=req.sqp, sqp=req.dqp, mad=bytes(out),
                          pad=req.pad)

    def _attribute(self, attr: int) -> bytes | None:
        if attr == 0x0010:
            return bytes(NodeDescription(node_string=NODE_DESC.encode())).ljust(64, b"\0")
        if attr == 0x0011:
            return self.node_info()
        if attr == 0x0015:
            return self.port_info()
        if attr == 0x0016:
            return self.pkeys()
        return None


def smp_get(attr: int, tid: int, *, directed: bool = True) -> bytes:
    """A 256-byte SubnGet MAD (directed route, HopCount 0, or LID-routed)."""
    mad = bytearray(256)
    mad[0:4] = bytes([1, 0x81 if directed else 0x01, 1, 0x01])
    struct.pack_into(">QH", mad, 8, tid, attr)
    if directed:
        struct.pack_into(">HH", mad, 32, 0xFFFF, 0xFFFF)
    return bytes(mad)


def abstract(name: str) -> bytes:
    return b"\0" + name.encode() + b"\0"


class PyClient:
    """The client side of the protocol (as ``sim_client.c``), blocking with timeouts."""

    def __init__(self, sockname: str, pid: int | None = None, timeout: float = 2.0) -> None:
        self.sockname = sockname
        self.pid = os.getpid() if pid is None else pid
        self.ctl = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.data = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for s in (self.ctl, self.data):
            s.settimeout(timeout)
        self.ctl.bind(abstract(f"{sockname}:ctl{self.pid}"))
        self.ctl.connect(abstract(f"{sockname}:ctl"))
        self.data.bind(abstract(f"{sockname}:in{self.pid}"))
        self.slot = -1

    def close(self) -> None:
        self.ctl.close()
        self.data.close()

    def ctl_raw(self, datagram: bytes) -> bytes:
        self.ctl.send(datagram)
        reply = self.ctl.recv(4096)
        assert len(reply) == CTL_LEN, len(reply)
        return reply

    def call(self, type_: int, data: bytes = b"", length: int | None = None) -> CtlMessage:
        msg = CtlMessage(type_, max(self.slot, 0), data, len(data) if length is None else length)
        return CtlMessage.unpack(self.ctl_raw(msg.pack()))

    def connect(self, issm: bool = False, nodeid: str = "") -> CtlMessage:
        reply = self.call(CtlType.CONNECT, ClientInfo(self.pid, 0, int(issm), nodeid).pack())
        if reply.type != CtlType.ERROR:
            self.slot = ClientInfo.unpack(reply.data).id
            self.data.connect(abstract(f"{self.sockname}:out{self.slot}"))
        return reply

    def disconnect(self) -> CtlMessage:
        return self.call(CtlType.DISCONNECT)

    def send(self, req: SimRequest) -> None:
        self.data.send(req.pack())

    def recv(self) -> SimRequest:
        raw = self.data.recv(4096)
        assert len(raw) == SIM_REQUEST_LEN, len(raw)
        return SimRequest.unpack(raw)

    def query(self, attr: int, tid: int) -> SimRequest:
        self.send(SimRequest(0xFFFF, 0xFFFF, 0, 0, smp_get(attr, tid)))
        return self.recv()
