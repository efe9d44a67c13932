"""``RocePort``: the HCA transport on a RoCE fabric — ``HcaPort`` with RoCEv2 frames on the cable.

The sans-IO transport (``ibemu.hca.transport``) is unchanged: it still speaks native packets
(LRH .. ICRC .. VCRC, addressed by LID). On the way out each packet becomes a RoCEv2 frame:
Ethernet to the first-hop router's MAC / IPv4 (DF, TTL 64) from this port's address to the
address its DLID maps to / UDP from a source port derived from the destination QP (ECMP
entropy: different QPs hash onto different paths) to 4791 / BTH .. pad / ICRC recomputed
over the RoCEv2 invariant fields (IBA A16.4: a pseudo-LRH of ones, IP and UDP with their
variant fields masked). On the way in the frame is checked (IPv4, UDP 4791, lengths, known
source, ours, ICRC) and becomes the native packet the transport expects (LRH from the address
table, fresh ICRC and VCRC). Malformed or unknown frames are counted in ``roce_stats``, never
raised.

The socket is an ``ETH_P_ALL`` packet socket (outgoing frames ignored) with a classic BPF
filter for UDP 4791 (and this process's QP range, when processes share the port): it sees
frames before tc ingress, where the host's guard (``netconf.guard_hosts``) drops them so the
host kernel never answers with ICMP.

Congestion control (``enable_dcqcn``): frames leave ECN-capable (ECT(0)); a data frame that
arrives with Congestion Experienced (set by a router's virtual queue, ``ibemu.kernel.ecn``) is
answered with a CNP (BTH opcode 0x81, to the sending QP, at most one per QP every 50 us:
the notification point), and a CNP that arrives cuts that QP's rate (DCQCN, the reaction
point, ``ibemu.hca.dcqcn``): its frames then leave paced, from a heap a pacer task drains
(trio's timers have ~1 ms granularity: a paced flow leaves in bursts of up to 1 ms worth).
Counted in ``roce_stats`` (ce_received, cnp_sent, cnp_received, tx_paced).

Priorities: data frames leave with DSCP 26 (priority 3 at a router, DSCP >> 3), CNPs with
DSCP 48 (priority 6), untagged, as RoCE deployments configure NICs. PFC (``enable_pfc``, on a
user-datapath fabric with ``pfc``): a pause frame from the first-hop router for the data
priority holds every frame this port would send (transport and pacer alike) until its quanta
expire or an XON comes, then sends them in order: a sender blocked by PFC, not a drop.
Counted in ``roce_stats`` (pfc_pause_received, pfc_held, pfc_paused_us).
"""

from __future__ import annotations

import heapq
import socket
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import trio

from ibemu import clock
from ibemu.hca.dcqcn import DcqcnParams, DcqcnState, Pacer
from ibemu.hca.nic import PORT_BUFFER, HcaPort
from ibemu.hca.transport import Hca
from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.hca import FIRST_QPN
from ibemu.hca.transport.rc import RcQp
from ibemu.kernel import sockfilter
from ibemu.kernel.packet import ETH_P_ALL, ignore_outgoing, mac_address, open_packet_socket
from ibemu.wire import pfc
from ibemu.wire.roce import ROCEV2_UDP_PORT
from ibemu.wire.rocecodec import HDR_LEN, RoceCodec, RoceStats

CNP_OPCODE = 0x81
CNP_INTERVAL_NS = 50_000
"""The notification point sends a QP at most one CNP per this interval."""
CNP_PAYLOAD = bytes(16)
DATA_DSCP = 26
"""DSCP of RoCE data frames (priority 3: DSCP >> 3)."""
CNP_DSCP = 48
"""DSCP of CNPs (priority 6)."""


@dataclass(slots=True)
class RocePortStats(RoceStats):
    """``RoceStats`` and what PFC did to this port's transmissions."""

    pfc_pause_received: int = 0
    pfc_held: int = 0
    pfc_paused_us: int = 0


def _set_dscp(frame: bytes, dscp: int) -> bytes:
    """``frame`` with IPv4 DSCP ``dscp`` and Not-ECT, its header checksum recomputed."""
    buf = bytearray(frame)
    buf[15] = dscp << 2
    buf[24] = buf[25] = 0
    s = sum((buf[i] << 8) | buf[i + 1] for i in range(14, 34, 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    buf[24], buf[25] = (~s >> 8) & 0xFF, ~s & 0xFF
    return bytes(buf)


def socket_filter(qpns: tuple[int, int] | None = None, *, pause: bool = False) -> list[sockfilter.Insn]:
    """Classic BPF: IPv4 / UDP to 4791 [and BTH DestQP in ``qpns`` = (first, end)] [or a MAC
    control frame, ``pause``: PFC]."""
    if qpns is not None and not 2 <= qpns[0] < qpns[1] <= 1 << 24:
        raise ValueError("a QP range lies within 2 .. 2^24")
    drop = 8 if qpns is None else 12  # index of the final "ret 0"

    def unless(i: int, k: int) -> sockfilter.Insn:  # jeq k, else drop
        return (0x15, 0, drop - i - 1, k)

    prog: list[sockfilter.Insn] = [
        (0x28, 0, 0, 12),                    # 0: ldh [12]
        unless(1, 0x0800),                   # 1: IPv4
        (0x30, 0, 0, 23),                    # 2: ldb [23]
        unless(3, socket.IPPROTO_UDP),       # 3: UDP
        (0xB1, 0, 0, 14),                    # 4: ldxb 4*([14]&0xf): X = IP header length
        (0x48, 0, 0, 16),                    # 5: ldh [x+16]: UDP destination port
        unless(6, ROCEV2_UDP_PORT),          # 6: 4791
    ]
    if qpns is not None:
        prog += [
            (0x40, 0, 0, 26),                # 7: ld [x+26]: BTH word 1 (14 + IHL + 8 + 4)
            (0x54, 0, 0, 0xFFFFFF),          # 8: DestQP
            (0x35, 0, drop - 9 - 1, qpns[0]),  # 9: >= first, else drop
            (0x35, drop - 10 - 1, 0, qpns[1]),  # 10: >= end: drop
        ]
    prog += [(0x06, 0, 0, sockfilter.ACCEPT), (0x06, 0, 0, 0)]
    assert len(prog) == drop + 1
    if pause:  # jumps are relative: the rest runs unchanged after these three
        prog = [(0x28, 0, 0, 12), (0x15, 0, 1, pfc.ETH_P_PAUSE), (0x06, 0, 0, sockfilter.ACCEPT), *prog]
    return prog


class RocePort(HcaPort):
    """One host port on a RoCE fabric: ``HcaPort``'s API, RoCEv2 frames on the cable."""

    def __init__(self, sock: socket.socket, hca: Hca, peer_mac: bytes, *, ip: str,
                 lid_ips: Mapping[int, str], name: str = "", timestamps: bool = False) -> None:
        super().__init__(sock, hca, peer_mac, name=name, timestamps=timestamps)
        self.codec = RoceCodec(lid=hca.lid, ip=ip, lid_ips=lid_ips, mac=mac_address(sock), peer_mac=peer_mac)
        self.ip = ip
        self.dcqcn: DcqcnParams | None = None
        self._rp: dict[tuple[int, int], Pacer] = {}  # (DLID, DestQP) of a flow -> its pacer
        self._cnp_at: dict[int, int] = {}            # local QPN -> when it last sent a CNP
        self._held: list[tuple[int, int, tuple[int, int], bytes]] = []  # (due, seq, flow, frame)
        self._held_per_flow: dict[tuple[int, int], int] = {}
        self._seq = 0
        self._pace_kick = trio.Event()
        self.codec.stats = RocePortStats()
        self.codec.tos = DATA_DSCP << 2  # the codec builds its headers lazily, with this
        self.qpns: tuple[int, int] | None = None
        self.pfc_priority: int | None = None
        self.pfc_line_gbps = 0.0
        self._pfc_until = 0
        self._pfc_since: int | None = None
        self._pfc_held: deque[bytes] = deque()
        self._pfc_kick = trio.Event()

    def enable_dcqcn(self, params: DcqcnParams | None = None) -> None:
        """ECT(0) on every frame, CNPs for CE, DCQCN rate control on CNPs."""
        self.dcqcn = params or DcqcnParams()
        self.codec.set_ect(True)
        self.codec.tos |= DATA_DSCP << 2

    def enable_pfc(self, line_gbps: float, priority: int = DATA_DSCP >> 3) -> None:
        """Honour PFC pause frames for ``priority`` (this port's data), quanta at ``line_gbps``."""
        if line_gbps <= 0:
            raise ValueError("PFC quanta need a line rate")
        self.pfc_priority, self.pfc_line_gbps = priority, line_gbps
        sockfilter.attach(self.sock, socket_filter(self.qpns, pause=True))

    @property
    def roce_stats(self) -> RocePortStats:
        st = self.codec.stats
        assert isinstance(st, RocePortStats)
        if self._pfc_since is not None:  # the pause going on, so far
            now = clock.now_ns()
            st.pfc_paused_us += (min(now, self._pfc_until) - self._pfc_since) // 1000
            self._pfc_since = min(now, self._pfc_until)
        return st

    @classmethod
    def open(cls, ns: str | None, ifname: str, peer_mac: bytes, lid: int, *,  # type: ignore[override]
             ip: str, lid_ips: Mapping[int, str], mtu: int = 4096, port: int = 1, seed: int | None = None,
             name: str = "", qpns: tuple[int, int] | None = None, timestamps: bool = False) -> RocePort:
        """Open the port's socket on ``ifname`` in ``ns``. Blocking.

        ``peer_mac``: the first-hop router's interface; ``lid``/``ip``: this port's LID (what the
        transport calls it) and address; ``lid_ips``: LID -> address of every port it talks to.
        """
        sock = open_packet_socket(ns, ifname, ETH_P_ALL, bpf=socket_filter(qpns), buffer_bytes=PORT_BUFFER)
        try:
            ignore_outgoing(sock)
            hca = Hca(lid=lid, port=port, mtu=mtu, seed=seed, first_qpn=qpns[0] if qpns else FIRST_QPN)
            p = cls(sock, hca, peer_mac, ip=ip, lid_ips=lid_ips, name=name or ifname, timestamps=timestamps)
            p.qpns = qpns
            return p
        except BaseException:
            sock.close()
            raise

    def transmit(self, sends: Iterable[Send]) -> None:
        """Put the transport's packets on the cable as RoCEv2 frames (a full queue drops);
        a flow DCQCN slowed down is held back to its rate."""
        encap, rp = self.codec.encapsulate, self._rp
        ready: list[bytes] = []
        for s in sends:
            frame = encap(s.packet)
            if frame is None:
                continue
            if rp:
                pkt = s.packet
                flow = ((pkt[2] << 8) | pkt[3], (pkt[13] << 16) | (pkt[14] << 8) | pkt[15])
                pacer = rp.get(flow)
                if pacer is not None and (pacer.state.limited or self._held_per_flow.get(flow)):
                    now = clock.now_ns()
                    due = pacer.due(now, len(frame))
                    if due > now or self._held_per_flow.get(flow):
                        self._hold(due, flow, frame)
                        continue
            ready.append(frame)
        self.send_frames(ready)

    def _hold(self, due: int, flow: tuple[int, int], frame: bytes) -> None:
        self._seq += 1
        heapq.heappush(self._held, (due, self._seq, flow, frame))
        self._held_per_flow[flow] = self._held_per_flow.get(flow, 0) + 1
        self.codec.stats.tx_paced += 1
        self._pace_kick.set()

    def send_frames(self, frames: Iterable[bytes]) -> None:
        """``HcaPort.send_frames``, unless the first-hop router paused this port's data priority."""
        if self.pfc_priority is not None and (self._pfc_held or self._pfc_paused(clock.now_ns())):
            frames = list(frames)
            self._pfc_held.extend(frames)
            self.roce_stats.pfc_held += len(frames)
            self._pfc_kick.set()
            return
        super().send_frames(frames)

    def _pfc_paused(self, now: int) -> bool:
        if self._pfc_since is not None and self._pfc_until <= now:
            self._pfc_resume(self._pfc_until)
        return self._pfc_since is not None

    def _pfc_resume(self, at: int) -> None:
        if self._pfc_since is not None:
            self.codec.stats.pfc_paused_us += max(0, at - self._pfc_since) // 1000  # type: ignore[attr-defined]
        self._pfc_since = None

    def _on_pause(self, frame: bytes) -> None:
        """A PFC frame from the first-hop router: pause (or resume) this port's data."""
        quanta = pfc.parse_pause(frame)
        if quanta is None or self.pfc_priority is None or self.pfc_priority not in quanta:
            return
        st = self.roce_stats
        st.pfc_pause_received += 1
        now = clock.now_ns()
        self._pfc_paused(now)
        q = quanta[self.pfc_priority]
        if q:
            if self._pfc_since is None:
                self._pfc_since = now
            self._pfc_until = now + pfc.quanta_ns(q, self.pfc_line_gbps)
        else:
            self._pfc_resume(now)
        self._pfc_kick.set()

    async def _pfc_sender(self) -> None:
        """Send what a pause held back once it is over."""
        held = self._pfc_held
        while True:
            kick = self._pfc_kick = trio.Event()
            now = clock.now_ns()
            if held and not self._pfc_paused(now):
                frames = list(held)
                held.clear()
                super().send_frames(frames)
                await trio.lowlevel.checkpoint()
                continue
            if held:
                with trio.move_on_after(max(0, self._pfc_until - now) / 1e9):
                    await kick.wait()
            else:
                await kick.wait()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(super().serve)
            nursery.start_soon(self._pacer)
            nursery.start_soon(self._pfc_sender)
            task_status.started()

    async def _pacer(self) -> None:
        """Send held frames when they are due."""
        held = self._held
        while True:
            kick = self._pace_kick = trio.Event()
            if not held:
                await kick.wait()
                continue
            now = clock.now_ns()
            if held[0][0] > now:
                with trio.move_on_after((held[0][0] - now) / 1e9):
                    await kick.wait()
                continue
            due: list[bytes] = []
            while held and held[0][0] <= now:
                _due, _seq, flow, frame = heapq.heappop(held)
                self._held_per_flow[flow] -= 1
                due.append(frame)
            self.send_frames(due)
            await trio.lowlevel.checkpoint()

    def packet_of(self, frame: bytes) -> bytes | bytearray | memoryview | None:
        """The native packet a RoCEv2 frame carries (None, counted in ``roce_stats``, if it is
        not a good one of ours, or a CNP, which goes to DCQCN)."""
        if frame[12] == 0x88 and frame[13] == 0x08:
            self._on_pause(frame)
            return None
        if len(frame) > HDR_LEN and frame[HDR_LEN] == CNP_OPCODE:
            self._on_cnp(frame)
            return None
        pkt = self.codec.decapsulate(frame)
        if pkt is not None and frame[15] & 3 == 3:
            self._on_ce(pkt)
        return pkt

    def _on_ce(self, pkt: bytes | bytearray) -> None:
        """Notification point: a CNP to the QP that sent this CE-marked packet."""
        st = self.codec.stats
        st.ce_received += 1
        qpn = (pkt[13] << 16) | (pkt[14] << 8) | pkt[15]
        qp = self.hca.qps.get(qpn)
        if not isinstance(qp, RcQp) or not qp.remote_qpn:
            return
        now = clock.now_ns()
        if now - self._cnp_at.get(qpn, -CNP_INTERVAL_NS) < CNP_INTERVAL_NS:
            return
        self._cnp_at[qpn] = now
        frame = self.codec.encapsulate(qp.tmpl.packet(CNP_OPCODE, 0, CNP_PAYLOAD))
        if frame is None:
            return
        try:
            self.sock.send(_set_dscp(frame, CNP_DSCP))
            st.cnp_sent += 1
        except OSError:
            self.tx_dropped += 1

    def _on_cnp(self, frame: bytes) -> None:
        """Reaction point: a checked CNP cuts the rate of the flow its QP sends."""
        if self.codec.decapsulate(frame) is None:  # counted there
            return
        self.codec.stats.cnp_received += 1
        if self.dcqcn is None:
            return
        qp = self.hca.qps.get((frame[HDR_LEN + 5] << 16) | (frame[HDR_LEN + 6] << 8) | frame[HDR_LEN + 7])
        if not isinstance(qp, RcQp) or not qp.remote_qpn:
            return
        flow = (qp.path_dlid, qp.remote_qpn)
        pacer = self._rp.get(flow)
        if pacer is None:
            pacer = self._rp[flow] = Pacer(DcqcnState(self.dcqcn))
        pacer.state.on_cnp(clock.now_ns())
