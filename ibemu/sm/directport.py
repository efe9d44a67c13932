"""The SM's own port: SMPs sent and received on a packet socket of its HCA's cable.

A real SM reaches the fabric through its HCA: the kernel hands its SMPs to the HCA's QP0
and the responses come back the same way, with no other process in between. Through the
MAD socket (``UmadPort``) every SMP of ibemu's SM crosses the agent host twice: the CA agent
frames the request and sends it, and when the response arrives it checks it and writes it
to the SM's socket. That process also runs every other agent of the fabric, so the SM's
round trips waited behind whatever it was doing.

``DirectPort`` is a ``MadPort`` that does what the HCA would:

- **send**: a directed-route SMP that leaves the host (HopCount >= 1, DrSLID permissive,
  InitialPath[1] = our port) or a LID-routed SMP to another LID is framed here (LRH on VL15,
  BTH/DETH to QP0, ICRC, VCRC; ``wire.madpacket.frame_mad``, the framing the CA agent uses)
  and written to the HCA veth in the SM host's namespace; a batch (``send_many_nowait``,
  what ``Transport.submit`` hands over) as one ``sendmmsg`` per run of frames
  (``kernel.mmsg``). Everything else (HopCount 0 and
  loopback to our own LID, which the local SMA answers; DR SMPs with a LID-routed part; GSI
  classes) goes through the MAD socket as before.
- **receive**: a packet socket on the same veth with a classic BPF filter
  (``sockfilter.SM_REPLIES``) takes only QP0 GetResp and Trap frames, every frame waiting
  in one ``recvmmsg`` with the kernel's receive stamps (``kernel.mmsg.RecvMany``); each is
  checked as the CA agent checks it (``wire.madpacket.check``: lengths, ICRC, VCRC) and
  handed to the transport as the MAD socket would have delivered it. The MAD socket is read
  as well.

Requests sent here carry TID bits 48-63 = ``TID_TAG``, a slot the MAD socket never gives a
client; the agent host's CA agent, whose packet socket on the same veth would get a copy of
their responses, filters those out in the kernel (``sockfilter.CA_MANAGEMENT``), so a
response reaches the SM once and costs the agent host nothing. A trap arrives both ways: the copy that
comes second within ``TRAP_DEDUP_NS`` (far shorter than the 2 s a device waits before it
repeats a trap) is dropped here. The SM's LID, for the SLID of LID-routed SMPs, is learned
from its own PortInfo as the SM reads or sets it through the MAD socket (HopCount 0); until
then, LID-routed SMPs use the MAD socket.

Deviations: frames that fail the check are counted in this port's ``stats``, not in the
HCA port's PortRcvErrors (the CA agent's copy counts them there anyway).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

import trio

from ibemu import clock
from ibemu.agents import dr
from ibemu.kernel import mmsg, sockfilter
from ibemu.kernel.packet import ETH_P_IB, open_packet_socket, stamp_received
from ibemu.sm.transport import UmadPort
from ibemu.wire.madpacket import (
    INITIAL_PATH,
    M_ATTR_ID,
    M_CLASS,
    M_DR_SLID,
    M_HOP_COUNT,
    M_METHOD,
    M_STATUS,
    MAD_OFFSET,
    PACKET_LEN,
    PERMISSIVE_LID,
    PKTLEN_WORDS,
    QP0_QKEY,
    SMP_DATA,
    check,
    frame_mad,
    reseal_at,
)
from ibemu.wire.umad import SimRequest

log = logging.getLogger(__name__)

_ARRIVALS_KEPT = 64
"""Trap arrival stamps kept for the SM to take (``DirectPort.arrival_ns``)."""

ETH_LEN = 14
CLASS_SMP_LR = 0x01
CLASS_SMP_DR = 0x81
GET_RESP = 0x81
TRAP = 0x05
TID_TAG = sockfilter.SM_OWN_TID_TAG << 48
"""TID bits 48-63 of SMPs sent here: no MAD-socket slot, so the agent host drops its copy."""
TRAP_DEDUP_NS = 100_000_000
_TID_TAG_BYTES = (TID_TAG >> 48).to_bytes(2, "big")
_TAIL = bytes(PACKET_LEN - MAD_OFFSET - 256)
"""ICRC and VCRC, written by ``reseal_at``."""
_LIDS = struct.Struct("!HHH")  # LRH DLID, PktLen, SLID
_PSN = struct.Struct("!I")  # BTH PSN (the byte above it 0: no AckReq)
VL15 = 15
_RX_SLOTS = 64
"""Frames one ``recvmmsg`` takes at most."""
_RX_SLOT = 512
"""Bytes a received frame may have (a MAD frame: 304; the socket filter passes only those)."""
_WAKE_KEEP = 1 << 16
ATTR_PORT_INFO = 0x0015  # (not ibemu.wire.mad's AttrId: that module loads scapy, ~0.4 s)
_PI_LID = 16  # PortInfo: LID at bytes 16-17 of the SMP data


class DirectPort:
    """A ``MadPort`` on the SM host's HCA cable, with the MAD socket for the rest.

    ``serve`` (start it with ``nursery.start``) reads both sources; ``recv`` returns what
    they delivered, in arrival order.
    """

    def __init__(self, umad: UmadPort, sock: socket.socket, eth_header: bytes, *, port: int = 1) -> None:
        if len(eth_header) != ETH_LEN:
            raise ValueError("an Ethernet header is 14 bytes")
        self.umad = umad
        self.sock = sock
        self.eth = eth_header
        self.port = port
        self.lid = 0
        self.stats: Counter[str] = Counter()
        self._psn = 0
        self._traps: OrderedDict[bytes, int] = OrderedDict()
        self._arrivals: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        """(SLID, TID) of a trap received here -> when the kernel received it (``arrival_ns``)."""
        self._in_send, self._in_recv = trio.open_memory_channel[SimRequest](4096)
        self.deliver: Callable[[SimRequest], None] | None = None
        """Set by ``attach``: called with each datagram instead of queueing it for ``recv``."""
        self.wake_ns: list[int] = []
        self._head = self.eth + frame_mad(bytes(256), dlid=0, slid=0, dqp=0, sqp=0, qkey=QP0_QKEY,
                                          vl=VL15)[:MAD_OFFSET]
        """The Ethernet header and a frame's LRH, BTH and DETH but its LIDs and PSN."""
        self._rx = mmsg.RecvMany(_RX_SLOTS, _RX_SLOT)
        with contextlib.suppress(OSError):  # without stamps, no wake-up figures
            stamp_received(sock)

    @classmethod
    def open(cls, umad: UmadPort, ns: str | None, ifname: str, peer_mac: bytes, *, port: int = 1) -> DirectPort:
        """The port on ``ifname`` (in ``ns``), whose cable's far end has ``peer_mac``."""
        if len(peer_mac) != 6:
            raise ValueError("a MAC address is 6 bytes")
        sock = open_packet_socket(ns, ifname, ETH_P_IB, bpf=sockfilter.SM_REPLIES)
        own = sock.getsockname()[4]
        return cls(umad, sock, peer_mac + bytes(own) + ETH_P_IB.to_bytes(2, "big"), port=port)

    def close(self) -> None:
        self.sock.close()

    # ------------------------------------------------------------------ MadPort

    async def send(self, req: SimRequest) -> None:
        frame = self._frame(req)
        if frame is None:
            self._learn_lid(req.mad, outgoing=True)
            await self.umad.send(req)
            return
        self.stats["tx_direct"] += 1
        try:
            self.sock.send(frame)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(self.sock)
            self.sock.send(frame)

    def send_nowait(self, req: SimRequest) -> None:
        """``send`` without a checkpoint (``Transport.submit`` sends a batch in one pass);
        ``trio.WouldBlock`` when the socket is full (nothing was sent)."""
        frame = self._frame(req)
        if frame is None:
            self._learn_lid(req.mad, outgoing=True)
            self.umad.send_nowait(req)
            return
        try:
            self.sock.send(frame)
        except BlockingIOError:
            raise trio.WouldBlock from None
        self.stats["tx_direct"] += 1

    def send_many_nowait(self, reqs: list[SimRequest]) -> int:
        """Send ``reqs`` in order without a checkpoint: each run of frames for the wire in one
        ``sendmmsg`` (``kernel.mmsg``), the others through the MAD socket. Returns how many
        of the first went out; the next one could not go now, and ``send_nowait`` of it says
        why (raises ``trio.WouldBlock`` or the ``OSError``)."""
        sent = 0
        run: list[bytes] = []
        for req in reqs:
            frame = self._frame(req)
            if frame is not None:
                run.append(frame)
                continue
            if run:
                n = self._send_run(run)
                sent += n
                if n < len(run):
                    return sent
                run = []
            self._learn_lid(req.mad, outgoing=True)
            try:
                self.umad.send_nowait(req)
            except (trio.WouldBlock, OSError):
                return sent
            sent += 1
        if run:
            sent += self._send_run(run)
        return sent

    def _send_run(self, frames: list[bytes]) -> int:
        try:
            n = mmsg.send_many(self.sock, frames)
        except OSError:  # BlockingIOError too: the caller sends the first alone
            return 0
        self.stats["tx_direct"] += n
        self.stats["tx_sendmmsg"] += 1
        return n

    async def recv(self) -> SimRequest:
        return await self._in_recv.receive()

    async def recv_many(self) -> list[SimRequest]:
        """Everything received so far, at least one (waits for it): the transport takes a
        burst of responses in one step instead of one scheduler pass each."""
        got = [await self._in_recv.receive()]
        while True:
            try:
                got.append(self._in_recv.receive_nowait())
            except trio.WouldBlock:
                return got

    # ------------------------------------------------------------------ service

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the packet socket and the MAD socket until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_wire)
            nursery.start_soon(self._read_umad)
            task_status.started()

    def attach(self, deliver: Callable[[SimRequest], None] | None) -> None:
        """From now on, hand each datagram to ``deliver`` from the task that read it (the
        transport's ``on_datagram``: it must not block), what ``recv`` had not taken first;
        ``None``: back to ``recv``. A frame's trip from the socket to its handler then costs
        no hand-over between tasks (a trap's, ~0.05 ms of its way to the SM, hand-timed)."""
        self.deliver = deliver
        if deliver is not None:
            while True:
                try:
                    req = self._in_recv.receive_nowait()
                except trio.WouldBlock:
                    return
                deliver(req)

    async def _hand_on(self, req: SimRequest) -> None:
        deliver = self.deliver
        if deliver is not None:
            deliver(req)
            return
        try:  # no checkpoint per frame: a burst is read in one go, then handed over
            self._in_send.send_nowait(req)
        except trio.WouldBlock:
            await self._in_send.send(req)

    async def _read_umad(self) -> None:
        while True:
            req = await self.umad.recv()
            self._learn_lid(req.mad, outgoing=False)
            if self._is_repeat_trap(req):
                continue
            self.stats["rx_umad"] += 1
            await self._hand_on(req)

    async def _read_wire(self) -> None:
        """Every frame waiting, in one ``recvmmsg`` (``kernel.mmsg.RecvMany``), then each
        handed over without a checkpoint between them."""
        rx = self._rx
        while True:
            got = rx.recv(self.sock)
            if rx.truncated:  # longer than a slot (the socket filter passes MAD frames only)
                self.stats["rx_too_long"] += rx.truncated
                rx.truncated = 0
            if not got:
                await trio.lowlevel.wait_readable(self.sock)
                continue
            self._note_wake(got)
            for frame, stamp in got:
                req = self._parse(frame)
                if req is None or self._is_repeat_trap(req):
                    continue
                if req.mad[M_METHOD] == TRAP:
                    self._note_arrival(req, stamp)
                self.stats["rx_direct"] += 1
                await self._hand_on(req)

    def _note_wake(self, got: list[tuple[bytes, int | None]]) -> None:
        """How long each frame of a batch waited between the kernel and this process (real ns)."""
        now = time.clock_gettime_ns(time.CLOCK_REALTIME)
        self.wake_ns.extend(now - stamp for _, stamp in got if stamp is not None)
        if len(self.wake_ns) > _WAKE_KEEP:
            del self.wake_ns[: _WAKE_KEEP // 2]

    def _note_arrival(self, req: SimRequest, stamp: int | None) -> None:
        """Trap ``req`` was received by the kernel at ``stamp`` (CLOCK_REALTIME ns; None: not known)."""
        if stamp is None:
            return
        self._arrivals[(req.slid, req.mad[8:16])] = clock.realtime_to_emulated_ns(stamp)
        while len(self._arrivals) > _ARRIVALS_KEPT:
            self._arrivals.popitem(last=False)

    def arrival_ns(self, req: SimRequest) -> int | None:
        """When the kernel received trap ``req`` at this port (the emulated clock's ns), had it
        come by wire; None otherwise. What a trap's time at the SM's HCA is, before this
        process woke up and handed it to the SM (~0.3-0.5 ms of the SM's own Python here,
        hand-timed: the wake-up, the parse, two task switches)."""
        return self._arrivals.pop((req.slid, req.mad[8:16]), None)

    def wake_summary(self) -> dict[str, float]:
        """Percentiles (µs, real time) of what ``_note_wake`` saw: the SM process's own delay
        in taking a frame the kernel had already delivered."""
        if not self.wake_ns:
            return {}
        w = sorted(self.wake_ns)
        pick = lambda q: w[min(len(w) - 1, int(q * len(w)))] / 1e3  # noqa: E731
        return {"rx_wait_p50_us": pick(0.5), "rx_wait_p99_us": pick(0.99), "rx_wait_max_us": w[-1] / 1e3}

    # ------------------------------------------------------------------ sans-IO parts

    def _frame(self, req: SimRequest) -> bytes | None:
        """The frame for ``req``, or None when it goes through the MAD socket."""
        mad = req.mad
        if len(mad) != 256 or req.dqp != 0 or req.status:
            return None
        mclass = mad[M_CLASS]
        if mclass == CLASS_SMP_DR:
            if (not mad[M_HOP_COUNT] or mad[M_STATUS] & 0x80
                    or int.from_bytes(mad[M_DR_SLID:M_DR_SLID + 2], "big") != PERMISSIVE_LID
                    or mad[INITIAL_PATH + 1] != self.port):
                return None
            dlid = slid = PERMISSIVE_LID
        elif mclass == CLASS_SMP_LR:
            if not self.lid or req.dlid in (0, PERMISSIVE_LID, self.lid):
                return None
            dlid, slid = req.dlid, self.lid
        else:
            return None
        # one buffer, Ethernet header to VCRC, from a template of the fixed headers; the MAD
        # placed and edited in it (was: a copy of the MAD, a packet built around it, its
        # bytes, then the Ethernet header and those bytes joined: ~40% more of the SM's
        # CPU per frame, hand-timed)
        buf = bytearray(self._head)
        buf += mad
        buf += _TAIL
        m = ETH_LEN + MAD_OFFSET
        buf[m + 8:m + 10] = _TID_TAG_BYTES
        if mclass == CLASS_SMP_DR and dr.on_originate(buf, m, self.port)[0] != dr.PORT:
            return None
        self._psn = psn = (self._psn + 1) & 0xFFFFFF
        _LIDS.pack_into(buf, ETH_LEN + 2, dlid, PKTLEN_WORDS, slid)
        _PSN.pack_into(buf, ETH_LEN + 16, psn)
        reseal_at(buf, ETH_LEN)
        return bytes(buf)

    def _parse(self, frame: bytes) -> SimRequest | None:
        """A received frame as the MAD socket would have delivered it (None: dropped)."""
        pkt = frame[ETH_LEN:]
        try:
            check(pkt)
        except ValueError:
            self.stats["rx_bad_packet"] += 1
            return None
        m = MAD_OFFSET
        if pkt[m + M_CLASS] not in (CLASS_SMP_LR, CLASS_SMP_DR) or pkt[m + M_METHOD] not in (GET_RESP, TRAP):
            self.stats["rx_not_ours"] += 1
            return None
        slid = (pkt[6] << 8) | pkt[7]
        dlid = (pkt[2] << 8) | pkt[3]
        sqp = int.from_bytes(pkt[25:28], "big")
        return SimRequest(dlid=dlid, slid=slid, dqp=0, sqp=sqp, mad=bytes(pkt[m:m + 256]))

    def _is_repeat_trap(self, req: SimRequest) -> bool:
        """The second copy of a trap (one comes by wire, one by the MAD socket)."""
        mad = req.mad
        if len(mad) != 256 or mad[M_METHOD] != TRAP:
            return False
        now = clock.now_ns()
        while self._traps:
            first_key, t = next(iter(self._traps.items()))
            if now - t <= TRAP_DEDUP_NS:
                break
            del self._traps[first_key]
        key = req.slid.to_bytes(2, "big") + mad[12:16] + mad[16:]
        if key in self._traps:
            del self._traps[key]
            self.stats["rx_trap_second_copy"] += 1
            return True
        self._traps[key] = now
        return False

    def _learn_lid(self, mad: bytes, *, outgoing: bool) -> None:
        """Our LID, from our own PortInfo (HopCount-0 DR Get response, or our Set of it)."""
        if (len(mad) != 256 or mad[M_CLASS] != CLASS_SMP_DR or mad[M_HOP_COUNT]
                or int.from_bytes(mad[M_ATTR_ID:M_ATTR_ID + 2], "big") != ATTR_PORT_INFO):
            return
        if outgoing and mad[M_METHOD] != 0x02:  # our Set carries the LID we give ourselves
            return
        if not outgoing and (mad[M_METHOD] != GET_RESP or int.from_bytes(mad[M_STATUS:M_STATUS + 2], "big") & 0x7FFF):
            return
        lid = int.from_bytes(mad[SMP_DATA + _PI_LID:SMP_DATA + _PI_LID + 2], "big")
        if lid and lid < 0xC000 and lid != self.lid:
            log.debug("the SM's port has LID %d", lid)
            self.lid = lid
