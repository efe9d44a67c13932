"""ibsim's client protocol (what ``libumad2sim.so`` speaks), sans-IO: codec and session state.

A MAD-socket server owns one HCA port. Clients (OpenSM, infiniband-diags under
``LD_PRELOAD=libumad2sim.so``, ibemu's own SM) attach over abstract AF_UNIX datagram sockets:
control messages (80 bytes) on ``<base>:ctl``, MADs as 288-byte ``sim_request`` records on
``<base>:out<slot>``. Layout and behaviour: ../shared/ref/umad-socket.md, checked against
linux-rdma/ibsim 0.10 (``include/ibsim.h``, ``ibsim/ibsim.c``, ``umad2sim/*.c``).

This module does no IO. ``UmadSession`` turns received datagrams into replies and backend
calls, and routes MADs from the backend to a slot; ``umad_server`` moves the bytes.

Where ibemu deliberately differs from ibsim (all for robustness; a well-behaved client never
sees a difference):

- every control message gets a reply; a malformed or unknown one gets type 0 (ibsim stays
  silent on bad size/magic/client id, which blocks the client forever, and echoes unknown
  types as if they succeeded);
- control messages for a slot are accepted only from the socket that connected it;
- TrapRepress is treated as a response (its TID is left alone), as the kernel's umad does;
- a response's TID bits 48-63 are restored to what the client sent (``restore_tid``; ibsim
  leaves the slot number there - clients only match the low 32 bits);
- umad2sim writes its agent id into TID bits 32-47 of every MAD without the R bit, so also
  into a TrapRepress, which then no longer matches its trap (the kernel leaves it alone).
  With ``restore_tid`` the server puts back the TID of the unsolicited MAD it delivered
  (matched on the other TID bits and the peer LID);
- the port's IsSM bit is the OR of all clients' issm flags, so it clears when the last SM
  client disconnects or dies;
- unsolicited MADs go only to an SM client, and only for the classes an SM registers
  (``SM_CLASSES``): umad2sim dereferences NULL for a class nobody registered.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import Enum, IntEnum
from typing import Protocol, TypeVar

from ibemu.errors import DecodeError

log = logging.getLogger(__name__)
K = TypeVar("K")

SIM_MAGIC = 0xDEADBEEF
MAX_CLIENTS = 10
DEFAULT_SOCKNAME = "sim"
CTL_LEN = 80
CTL_DATA_LEN = 64
CLIENT_INFO_LEN = 44
SIM_REQUEST_LEN = 288
MAD_LEN = 256
STATUS_OK = 0
STATUS_TIMEOUT = 110  # ETIMEDOUT: "dropped", the client reports a timeout
PERMISSIVE_LID = 0xFFFF

CLASS_SUBN_LID = 0x01
CLASS_SUBN_DR = 0x81
CLASS_SA = 0x03
METHOD_TRAP_REPRESS = 0x07
# What an SM client (OpenSM: SMI, SMI directed route, SA) is known to have registered.
SM_CLASSES = frozenset({CLASS_SUBN_LID, CLASS_SUBN_DR, CLASS_SA})

SLOT_SHIFT = 48
LOW48 = (1 << SLOT_SHIFT) - 1
AGENT_BITS = 0xFFFF << 32  # where umad2sim puts its agent id


class CtlType(IntEnum):
    """``enum SIM_CTL_TYPES``; ERROR is the reply type meaning "failed"."""

    ERROR = 0
    CONNECT = 1
    DISCONNECT = 2
    GET_PORT = 3
    GET_VENDOR = 4
    GET_GID = 5
    GET_GUID = 6
    GET_NODEINFO = 7
    GET_PORTINFO = 8
    SET_ISSM = 9
    GET_PKEYS = 10


# --------------------------------------------------------------------------- codec

_CTL = struct.Struct("<IIII64s")
_CLIENT_INFO = struct.Struct("<III32s")
_VENDOR = struct.Struct("<IIIxxxxQ")
_PORT = struct.Struct("<HBx")
# dlid/slid: a big-endian u16 in the first two bytes of a 4-byte field; the rest big-endian.
_REQUEST = struct.Struct(">H2xH2xIII4sQ256s")
_TID = struct.Struct(">Q")


@dataclass(slots=True)
class CtlMessage:
    """``struct sim_ctl``: 80 bytes, host (little-endian) order."""

    type: int
    clientid: int = 0
    data: bytes = b""
    length: int = 0  # ``len``: bytes of ``data`` the sender cares about
    magic: int = SIM_MAGIC

    def pack(self) -> bytes:
        if len(self.data) > CTL_DATA_LEN:
            raise ValueError(f"control data is at most {CTL_DATA_LEN} bytes, not {len(self.data)}")
        return _CTL.pack(self.magic, self.clientid, self.type, self.length, self.data)

    @classmethod
    def unpack(cls, buf: bytes) -> CtlMessage:
        if len(buf) != CTL_LEN:
            raise DecodeError(f"control message is {CTL_LEN} bytes, not {len(buf)}")
        magic, clientid, type_, length, data = _CTL.unpack(buf)
        return cls(type_, clientid, data, length, magic)

    def reply(self, data: bytes | None = None) -> CtlMessage:
        """The echo with ``data`` written over the start of the data area (as ibsim does)."""
        if data is None:
            return replace(self, magic=SIM_MAGIC)
        body = (data + self.data[len(data):])[:CTL_DATA_LEN]
        return replace(self, magic=SIM_MAGIC, data=body)

    def error(self) -> CtlMessage:
        return replace(self, magic=SIM_MAGIC, type=CtlType.ERROR)


def error_reply_for(datagram: bytes) -> bytes:
    """An 80-byte type-0 reply to a datagram that is not a valid control message."""
    body = bytearray(datagram[:CTL_LEN].ljust(CTL_LEN, b"\0"))
    struct.pack_into("<I", body, 0, SIM_MAGIC)
    struct.pack_into("<I", body, 8, CtlType.ERROR)
    return bytes(body)


@dataclass(slots=True)
class ClientInfo:
    """``struct sim_client_info``, the CONNECT payload (44 bytes).

    Request: ``id`` = the client's pid (it names the client's ``<base>:in<pid>`` socket),
    ``issm`` = connect as SM, ``nodeid`` = node to attach to (empty: the default).
    Reply: ``id`` = the slot, ``nodeid`` = the node attached to.
    """

    id: int
    qp: int = 0
    issm: int = 0
    nodeid: str = ""

    def pack(self) -> bytes:
        raw = self.nodeid.encode()[:31]
        return _CLIENT_INFO.pack(self.id, self.qp, self.issm, raw)

    @classmethod
    def unpack(cls, data: bytes) -> ClientInfo:
        id_, qp, issm, raw = _CLIENT_INFO.unpack(data[:CLIENT_INFO_LEN].ljust(CLIENT_INFO_LEN, b"\0"))
        return cls(id_, qp, issm, raw.split(b"\0", 1)[0].decode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class Vendor:
    """``struct sim_vendor`` (24 bytes, host order; fw_ver at offset 16)."""

    vendor_id: int
    vendor_part_id: int
    hw_ver: int
    fw_ver: int = 1

    def pack(self) -> bytes:
        return _VENDOR.pack(self.vendor_id, self.vendor_part_id, self.hw_ver, self.fw_ver)

    @classmethod
    def unpack(cls, data: bytes) -> Vendor:
        return cls(*_VENDOR.unpack(data[: _VENDOR.size]))


def pack_port(lid: int, state: int) -> bytes:
    """``struct sim_port``: lid u16, state u8 (host order)."""
    return _PORT.pack(lid, state)


def unpack_port(data: bytes) -> tuple[int, int]:
    lid, state = _PORT.unpack(data[: _PORT.size])
    return lid, state


@dataclass(slots=True)
class SimRequest:
    """``struct sim_request``: one MAD and its addressing, 288 bytes.

    ``dlid``/``slid`` are LIDs (0xFFFF permissive; slid 0 = "fill in the port's LID"),
    ``dqp``/``sqp`` QP numbers (0 SMP, 1 GSI), ``status`` 0 or 110 (undeliverable),
    ``length`` the MAD length (256), ``pad`` bytes 20-23, echoed untouched.
    """

    dlid: int
    slid: int
    dqp: int
    sqp: int
    mad: bytes
    status: int = STATUS_OK
    length: int = MAD_LEN
    pad: bytes = b"\0\0\0\0"

    def pack(self) -> bytes:
        if len(self.mad) > MAD_LEN:
            raise ValueError(f"a MAD is at most {MAD_LEN} bytes, not {len(self.mad)}")
        return _REQUEST.pack(self.dlid, self.slid, self.dqp, self.sqp, self.status, self.pad,
                             self.length, self.mad)

    @classmethod
    def unpack(cls, buf: bytes) -> SimRequest:
        if len(buf) != SIM_REQUEST_LEN:
            raise DecodeError(f"sim_request is {SIM_REQUEST_LEN} bytes, not {len(buf)}")
        dlid, slid, dqp, sqp, status, pad, length, mad = _REQUEST.unpack(buf)
        return cls(dlid, slid, dqp, sqp, mad, status, length, pad)

    @property
    def tid(self) -> int:
        return mad_tid(self.mad)

    @property
    def mgmt_class(self) -> int:
        return self.mad[1] if len(self.mad) > 1 else 0

    @property
    def method(self) -> int:
        return self.mad[3] if len(self.mad) > 3 else 0

    @property
    def is_response(self) -> bool:
        """R bit set, or TrapRepress (answers a Trap): routed back by TID, TID not rewritten."""
        return is_response_like(self.mad)

    def with_tid(self, tid: int) -> SimRequest:
        # not dataclasses.replace: this is on every MAD's path (~10 us a call there)
        return SimRequest(self.dlid, self.slid, self.dqp, self.sqp, set_mad_tid(self.mad, tid),
                          self.status, self.length, self.pad)

    def with_slid(self, slid: int) -> SimRequest:
        return SimRequest(self.dlid, slid, self.dqp, self.sqp, self.mad, self.status, self.length, self.pad)


RMPP_ACTIVE, RMPP_FIRST, RMPP_LAST = 0x01, 0x02, 0x04
RMPP_TYPE_DATA = 1
_MAD_HEADER_AND_RMPP = 36
RMPP_CLASSES = frozenset({0x03, *range(0x30, 0x50)})
"""Classes whose MADs carry an RMPP header: SubnAdm and the vendor classes with RMPP (the
bytes after other classes' MAD header are theirs: an SMP's M_Key, a PMA's reserved field)."""


def rmpp_length(mad: bytes) -> int:
    """How many bytes of ``mad`` a client gets, as the kernel's RMPP code would hand them
    over: a single-segment RMPP DATA MAD (an SA response) ends at its PayloadLength (which
    counts from the class header on); any other MAD is whole. saquery counts the records it
    prints from this length: every MAD at 256 bytes made it print garbage records."""
    if len(mad) < _MAD_HEADER_AND_RMPP or mad[1] not in RMPP_CLASSES or mad[25] != RMPP_TYPE_DATA:
        return MAD_LEN
    flags = mad[26] & 0x07
    if flags != RMPP_ACTIVE | RMPP_FIRST | RMPP_LAST:
        return MAD_LEN
    payload = int.from_bytes(mad[32:36], "big")
    return min(MAD_LEN, _MAD_HEADER_AND_RMPP + payload) if payload else MAD_LEN


def rmpp_seal(mad: bytes, length: int) -> bytes:
    """``mad`` as the kernel's RMPP layer sends a single-segment transfer a client asked for
    (RMPP Active set, the rest left to the kernel, as OpenSM leaves it): RMPPVersion 1, DATA,
    First and Last, segment 1, PayloadLength from the ``length`` the client gave. Anything
    else is returned as it is. (A transfer of more than one MAD does not fit a sim_request.)"""
    if len(mad) < MAD_LEN or mad[1] not in RMPP_CLASSES or not mad[26] & RMPP_ACTIVE or mad[24] or mad[25]:
        return mad
    out = bytearray(mad)
    out[24], out[25] = 1, RMPP_TYPE_DATA
    out[26] = (mad[26] & 0xF8) | RMPP_ACTIVE | RMPP_FIRST | RMPP_LAST
    out[27] = 0
    out[28:32] = (1).to_bytes(4, "big")
    out[32:36] = max(0, min(length, MAD_LEN) - _MAD_HEADER_AND_RMPP).to_bytes(4, "big")
    return bytes(out)


def mad_tid(mad: bytes) -> int:
    """TransactionID (MAD bytes 8-15, big-endian)."""
    return int(_TID.unpack_from(mad, 8)[0]) if len(mad) >= 16 else 0


def set_mad_tid(mad: bytes, tid: int) -> bytes:
    return mad[:8] + _TID.pack(tid) + mad[16:]


def is_response_like(mad: bytes) -> bool:
    if len(mad) < 4:
        return False
    return bool(mad[3] & 0x80) or mad[3] == METHOD_TRAP_REPRESS


# --------------------------------------------------------------------------- backend


class UmadPortBackend(Protocol):
    """The emulated HCA port behind a MAD socket (implemented by the CA agent's adapter).

    All methods are called on the server's trio thread and must not block. The byte
    strings are wire format (big-endian, as in a MAD's attribute data); the server pads or
    truncates them to the control message's 64-byte data area.
    """

    @property
    def node_guid(self) -> int:
        """NodeGUID (GET_GUID, GET_GID)."""
        ...

    @property
    def gid_prefix(self) -> int:
        """The port's GID prefix (GET_GID), e.g. 0xFE80000000000000."""
        ...

    @property
    def node_name(self) -> str:
        """Reported at CONNECT; a client's SIM_HOST must be empty or equal to it."""
        ...

    def node_info(self) -> bytes:
        """64-byte NodeInfo attribute data (LocalPortNum = the attached port)."""
        ...

    def port_info(self, port: int) -> bytes:
        """64-byte PortInfo of ``port``; 0 (or a port the node lacks) = the attached port."""
        ...

    def pkeys(self) -> bytes:
        """The first P_Key block: 32 big-endian P_Keys (64 bytes), entry 0 = 0xFFFF."""
        ...

    def port_lid_state(self) -> tuple[int, int]:
        """(LID, PortState) of the attached port."""
        ...

    def vendor(self) -> tuple[int, int, int, int]:
        """(VendorID, DeviceID, Revision, firmware version)."""
        ...

    def set_issm(self, on: bool) -> None:
        """Set or clear CapabilityMask.IsSM (bit 1) of the attached port."""
        ...

    def send_mad(self, req: SimRequest) -> None:
        """Send a client's MAD into the fabric.

        Requests already carry the client's slot in TID bits 48-63 and a filled-in ``slid``
        (LID-routed). Every request must eventually come back through ``deliver``: the
        response, or the request itself with ``status`` 110 if it cannot be delivered.
        """
        ...


# --------------------------------------------------------------------------- clients


@dataclass(slots=True)
class Client:
    """One attached client: a slot, its sockets' names, its SM flag."""

    slot: int
    pid: int
    ctl_addr: bytes
    data_addr: bytes
    qp: int = 0
    issm: bool = False
    tids: dict[int, int] = field(default_factory=dict)  # TID as sent -> TID the client wrote
    # unsolicited MADs delivered: (TID without bits 32-47, sender LID) -> their TID
    peer_tids: dict[tuple[int, int], int] = field(default_factory=dict)


class ClientTable:
    """Up to ``size`` slots; the lowest free slot is given out first (as ibsim does)."""

    def __init__(self, size: int = MAX_CLIENTS) -> None:
        self._slots: list[Client | None] = [None] * size

    @property
    def size(self) -> int:
        return len(self._slots)

    def __iter__(self) -> Iterator[Client]:
        return (c for c in self._slots if c is not None)

    def __len__(self) -> int:
        return sum(c is not None for c in self._slots)

    def full(self) -> bool:
        return all(c is not None for c in self._slots)

    def get(self, slot: int) -> Client | None:
        return self._slots[slot] if 0 <= slot < len(self._slots) else None

    def free_slot(self) -> int | None:
        return next((i for i, c in enumerate(self._slots) if c is None), None)

    def add(self, client: Client) -> None:
        if self._slots[client.slot] is not None:
            raise ValueError(f"slot {client.slot} is taken")
        self._slots[client.slot] = client

    def remove(self, slot: int) -> Client | None:
        client = self.get(slot)
        if client is not None:
            self._slots[slot] = None
        return client

    def sm_client(self) -> Client | None:
        return next((c for c in self if c.issm), None)


# --------------------------------------------------------------------------- session


@dataclass(frozen=True, slots=True)
class Attach:
    """CONNECT accepted: connect slot ``slot``'s out socket to ``address``, then reply.

    If that connect fails, call ``UmadSession.client_gone(slot)`` and send ``error_reply``.
    """

    slot: int
    address: bytes
    error_reply: bytes


@dataclass(frozen=True, slots=True)
class CtlOutcome:
    """What to do for one control datagram: send ``reply`` to the sender (None: cannot)."""

    reply: bytes | None
    attach: Attach | None = None


class Delivery(Enum):
    """The fate of a MAD handed to ``deliver``."""

    DELIVERED = "delivered"
    QUEUED = "queued"  # the client's receive queue is full: sent when it drains
    NO_CLIENT = "no_client"  # nobody to take it (no such slot / no SM client / class)
    CLIENT_GONE = "client_gone"  # the client died; its slot is now free
    DROPPED = "dropped"  # backlog full or a send error


def address_bytes(addr: object) -> bytes:
    """A unix socket address as ``recvfrom`` returns it (bytes or str), as bytes."""
    if isinstance(addr, bytes):
        return addr
    if isinstance(addr, str):
        return os.fsencode(addr)
    return b""


class UmadSession:
    """The protocol state of one MAD socket: slots, control replies, TIDs, routing.

    ``stats`` counts everything unusual (malformed datagrams, refusals, drops) by name.
    """

    def __init__(self, backend: UmadPortBackend, sockname: str = DEFAULT_SOCKNAME, *,
                 restore_tid: bool = True, sm_classes: frozenset[int] = SM_CLASSES,
                 tid_memory: int = 4096, slots: int = MAX_CLIENTS) -> None:
        self.backend = backend
        self.sockname = sockname
        self.restore_tid = restore_tid
        self.sm_classes = sm_classes
        self.tid_memory = tid_memory
        self.clients = ClientTable(slots)
        self.stats: Counter[str] = Counter()
        self._port_issm = False

    # ----------------------------------------------------------------- control

    def on_ctl(self, datagram: bytes, sender: object) -> CtlOutcome:
        """Handle one datagram received on ``<base>:ctl`` from ``sender``."""
        addr = address_bytes(sender)
        if not addr:
            self.stats["ctl_unreplyable"] += 1
            log.warning("control datagram from an unbound socket: cannot reply, ignored")
            return CtlOutcome(None)
        if len(datagram) != CTL_LEN:
            self.stats["ctl_bad_size"] += 1
            log.warning("control datagram of %d bytes (not %d) from %r", len(datagram), CTL_LEN, addr)
            return CtlOutcome(error_reply_for(datagram))
        msg = CtlMessage.unpack(datagram)
        if msg.magic != SIM_MAGIC:
            self.stats["ctl_bad_magic"] += 1
            log.warning("control message with bad magic %#x from %r", msg.magic, addr)
            return CtlOutcome(msg.error().pack())
        try:
            kind = CtlType(msg.type)
        except ValueError:
            kind = CtlType.ERROR
        if kind is CtlType.ERROR:
            self.stats["ctl_bad_type"] += 1
            log.warning("control message of unknown type %d from %r", msg.type, addr)
            return CtlOutcome(msg.error().pack())
        if kind is CtlType.CONNECT:
            try:
                return self._connect(msg, addr)
            except Exception:
                log.exception("CONNECT from %r failed", addr)
                self.stats["ctl_backend_error"] += 1
                return CtlOutcome(msg.error().pack())
        if msg.clientid >= self.clients.size:
            return self._refuse(msg, "ctl_bad_client", "no slot %d", msg.clientid)
        client = self.clients.get(msg.clientid)
        if kind is CtlType.DISCONNECT and client is None:
            return CtlOutcome(msg.reply().pack())  # ibsim: not connected is fine
        if client is None or client.ctl_addr != addr:
            return self._refuse(msg, "ctl_bad_client", "%s for slot %d from %r, which does not own it",
                                kind.name, msg.clientid, addr)
        try:
            data = self._answer(kind, msg, client)
        except Exception:
            log.exception("backend failed answering %s for slot %d", kind.name, client.slot)
            self.stats["ctl_backend_error"] += 1
            return CtlOutcome(msg.error().pack())
        return CtlOutcome(msg.reply(data).pack())

    def _refuse(self, msg: CtlMessage, stat: str, fmt: str, *args: object) -> CtlOutcome:
        self.stats[stat] += 1
        log.warning("refused: " + fmt, *args)
        return CtlOutcome(msg.error().pack())

    def _connect(self, msg: CtlMessage, addr: bytes) -> CtlOutcome:
        info = ClientInfo.unpack(msg.data)
        for stale in [c for c in self.clients if c.ctl_addr == addr]:
            # The same control socket connects again: its previous session is over.
            self._free(stale.slot, "reconnect")
        slot = self.clients.free_slot()
        if slot is None:
            return self._refuse(msg, "connect_full", "client pid %d: all %d slots taken",
                                info.id, self.clients.size)
        name = self.backend.node_name
        if info.nodeid and info.nodeid != name[:31]:
            return self._refuse(msg, "connect_unknown_node", "client pid %d asks for node %r; this is %r",
                                info.id, info.nodeid, name)
        if info.issm and self.clients.sm_client() is not None:
            return self._refuse(msg, "connect_sm_exists", "client pid %d: an SM is already attached",
                                info.id)
        data_addr = b"\0" + f"{self.sockname}:in{info.id}".encode() + b"\0"
        self.clients.add(Client(slot, info.id, addr, data_addr, info.qp, bool(info.issm)))
        self._update_issm()
        self.stats["connect"] += 1
        log.info("client pid %d attached as slot %d%s", info.id, slot, " (SM)" if info.issm else "")
        reply = ClientInfo(slot, info.qp, info.issm, name)
        return CtlOutcome(msg.reply(reply.pack()).pack(), Attach(slot, data_addr, msg.error().pack()))

    def _answer(self, kind: CtlType, msg: CtlMessage, client: Client) -> bytes | None:
        b = self.backend
        if kind is CtlType.DISCONNECT:
            self._free(client.slot, "disconnect")
            return None
        if kind is CtlType.GET_PORT:
            return pack_port(*b.port_lid_state())
        if kind is CtlType.GET_VENDOR:
            return Vendor(*b.vendor()).pack()
        if kind is CtlType.GET_GID:
            # ibsim copies the NodeGUID in host order after the wire-order prefix.
            return struct.pack(">Q", b.gid_prefix) + struct.pack("<Q", b.node_guid)
        if kind is CtlType.GET_GUID:
            return struct.pack("<Q", b.node_guid)
        if kind is CtlType.GET_NODEINFO:
            return _area(b.node_info())
        if kind is CtlType.GET_PORTINFO:
            return _area(b.port_info(msg.data[0]))
        if kind is CtlType.SET_ISSM:
            on = struct.unpack_from("<i", msg.data)[0] != 0
            client.issm = on
            log.info("slot %d %s SM", client.slot, "is" if on else "is no longer")
            self._update_issm()
            return None
        if kind is CtlType.GET_PKEYS:
            return _area(b.pkeys())
        raise AssertionError(kind)

    def _update_issm(self) -> None:
        on = self.clients.sm_client() is not None
        if on != self._port_issm:
            self._port_issm = on
            try:
                self.backend.set_issm(on)
            except Exception:
                log.exception("backend failed to %s IsSM", "set" if on else "clear")
                self.stats["issm_backend_error"] += 1

    def _free(self, slot: int, why: str) -> Client | None:
        client = self.clients.remove(slot)
        if client is not None:
            self.stats[why] += 1
            log.info("slot %d (pid %d) freed: %s", slot, client.pid, why)
            self._update_issm()
        return client

    def client_gone(self, slot: int) -> None:
        """The client of ``slot`` cannot be reached (a send failed, it died): free its slot."""
        self._free(slot, "client_gone")

    # ----------------------------------------------------------------- data

    def on_data(self, slot: int, datagram: bytes) -> bytes | None:
        """A MAD from slot ``slot``'s client: rewrite, hand to the backend.

        Returns a datagram to send straight back to that client (the request bounced with
        status 110), or None.
        """
        client = self.clients.get(slot)
        if client is None:
            self.stats["data_unconnected"] += 1
            return None
        if len(datagram) != SIM_REQUEST_LEN:
            self.stats["data_bad_size"] += 1
            log.warning("slot %d sent %d bytes (not %d): dropped", slot, len(datagram), SIM_REQUEST_LEN)
            return None
        req = SimRequest.unpack(datagram)
        response = is_response_like(req.mad)
        if req.mad[0] != 1:  # BaseVersion
            self.stats["data_bad_mad"] += 1
            log.warning("slot %d sent a MAD with BaseVersion %d", slot, req.mad[0])
            return None if response else self._bounce(req)
        out = req
        if not response:
            tid = req.tid
            sent = (tid & LOW48) | (slot << SLOT_SHIFT)
            if sent != tid:
                out = req.with_tid(sent)
                if self.restore_tid:
                    _remember(client.tids, sent, tid, self.tid_memory)
        elif client.peer_tids:
            tid = req.tid
            original = client.peer_tids.get((tid & ~AGENT_BITS, req.dlid))
            if original is not None and original != tid:
                out = req.with_tid(original)  # a TrapRepress umad2sim rewrote
                self.stats["tid_repaired"] += 1
        if out.slid == 0 and out.mgmt_class != CLASS_SUBN_DR:
            out = out.with_slid(self.backend.port_lid_state()[0])
        try:
            self.backend.send_mad(out)
        except Exception:
            log.exception("backend failed sending a MAD from slot %d", slot)
            self.stats["data_backend_error"] += 1
            return None if response else self._bounce(req)
        self.stats["data_sent"] += 1
        return None

    def _bounce(self, req: SimRequest) -> bytes:
        self.stats["data_bounced"] += 1
        return replace(req, status=STATUS_TIMEOUT).pack()

    def route(self, req: SimRequest) -> tuple[int, bytes] | Delivery:
        """Where a MAD from the backend goes: (slot, datagram) or why it goes nowhere.

        Responses, TrapRepress and returned requests (status != 0) go to slot ``tid >> 48``;
        other requests (traps, SMInfo, SA queries) to the first SM client, class permitting.
        """
        mad = req.mad
        if is_response_like(mad) or req.status != STATUS_OK:
            tid = mad_tid(mad)
            client = self.clients.get(tid >> SLOT_SHIFT)
            if client is None:
                self.stats["deliver_no_slot"] += 1
                return Delivery.NO_CLIENT
            original = client.tids.get(tid) if self.restore_tid else None
            if original is not None:
                req = req.with_tid(original)
        else:
            client = self.clients.sm_client()
            if client is None:
                self.stats["deliver_no_sm"] += 1
                return Delivery.NO_CLIENT
            if req.mgmt_class not in self.sm_classes:
                self.stats["deliver_class_refused"] += 1
                log.warning("unsolicited MAD of class %#x not delivered (an SM registers %s)",
                            req.mgmt_class, sorted(self.sm_classes))
                return Delivery.NO_CLIENT
            if self.restore_tid:
                tid = mad_tid(mad)
                _remember(client.peer_tids, (tid & ~AGENT_BITS, req.slid), tid, self.tid_memory)
        return client.slot, req.pack()


def _remember(table: dict[K, int], key: K, tid: int, limit: int) -> None:
    """Record ``key -> tid``, newest last, forgetting the oldest past ``limit`` entries."""
    table.pop(key, None)
    table[key] = tid
    if len(table) > limit:
        del table[next(iter(table))]


def _area(data: bytes) -> bytes:
    """Fit attribute data to the 64-byte control data area."""
    return data[:CTL_DATA_LEN].ljust(CTL_DATA_LEN, b"\0")
