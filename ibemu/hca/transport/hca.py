"""The transport engine of one emulated HCA port: packets in, packets and completions out.

Sans-IO: ``receive(packet)`` and ``tick(now_ns)`` return the ``Send`` actions the IO layer
puts on the port; completions go to the CQs the user polls. Every received packet has its
length, VCRC and ICRC checked, its DLID and P_Key matched, before a QP sees it.
"""

from __future__ import annotations

import logging
import random
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ibemu import clock as _clock
from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.cq import CompletionQueue
from ibemu.hca.transport.mr import Access, MemoryRegion, MrTable
from ibemu.hca.transport.qp import QpType
from ibemu.hca.transport.rc import RcQp
from ibemu.hca.transport.segment import check_mtu
from ibemu.hca.transport.ud import UdQp
from ibemu.wire import crc as _crc

log = logging.getLogger(__name__)

_LRH_BTH = struct.Struct("!BBHHHBBHII")
_TAIL = struct.Struct("<IH")  # ICRC, VCRC
_crc32 = zlib.crc32
_vcrc = _crc.vcrc_calc
FIRST_QPN = 0x11


@dataclass(slots=True)
class HcaStats:
    """Port-level receive counters (drops are counted here, never raised)."""

    rx_packets: int = 0
    malformed: int = 0
    crc_errors: int = 0
    dlid_mismatch: int = 0
    unknown_qp: int = 0
    pkey_violations: int = 0
    qkey_violations: int = 0


class Hca:
    """One HCA port's transport: memory regions, CQs, QPs, and the receive/timer paths."""

    def __init__(self, *, lid: int = 0, port: int = 1, pkeys: Sequence[int] = (0xFFFF,),
                 mtu: int = 4096, clock: Callable[[], int] | None = None,
                 seed: int | None = None, first_qpn: int = FIRST_QPN) -> None:
        """``first_qpn``: where QP numbers start (processes sharing a port take disjoint ranges)."""
        if not 2 <= first_qpn < 1 << 24:
            raise ValueError("QP numbers are 2 .. 2^24-1 (0 and 1 are QP0 and QP1)")
        self.lid = lid
        self.port = port
        self.pkeys = list(pkeys)
        self.mtu = check_mtu(mtu)
        self.clock = clock or _clock.now_ns
        self.mrs = MrTable()
        self.stats = HcaStats()
        self.qps: dict[int, RcQp | UdQp] = {}
        self._rng = random.Random(seed)
        self._next_qpn = first_qpn
        self._next_cqn = 1

    # -- verbs ---------------------------------------------------------------------------
    def create_cq(self, depth: int = 1 << 20) -> CompletionQueue:
        cq = CompletionQueue(self._next_cqn, depth)
        self._next_cqn += 1
        return cq

    def reg_mr(self, buf: bytearray, access: Access = Access.LOCAL_WRITE, *,
               addr: int | None = None) -> MemoryRegion:
        """Register ``buf``; its VA range starts at ``addr`` (default: a distinct base per MR)."""
        if not isinstance(buf, bytearray):
            raise TypeError("memory regions are bytearrays")
        return self.mrs.register(buf, access, addr)

    def dereg_mr(self, mr: MemoryRegion) -> None:
        self.mrs.deregister(mr)

    def create_qp(self, qp_type: QpType, send_cq: CompletionQueue,
                  recv_cq: CompletionQueue | None = None, *, psn: int | None = None,
                  max_send_wr: int = 4096, max_recv_wr: int = 4096) -> RcQp | UdQp:
        qpn = self._next_qpn
        self._next_qpn += 1
        cls = RcQp if qp_type is QpType.RC else UdQp
        start = self._rng.getrandbits(24) if psn is None else psn
        qp = cls(self, qpn, send_cq, recv_cq or send_cq, start, max_send_wr, max_recv_wr)
        self.qps[qpn] = qp
        return qp

    def create_rc_qp(self, send_cq: CompletionQueue, recv_cq: CompletionQueue | None = None, *,
                     psn: int | None = None, max_send_wr: int = 4096, max_recv_wr: int = 4096) -> RcQp:
        qp = self.create_qp(QpType.RC, send_cq, recv_cq, psn=psn, max_send_wr=max_send_wr,
                            max_recv_wr=max_recv_wr)
        assert isinstance(qp, RcQp)
        return qp

    def create_ud_qp(self, send_cq: CompletionQueue, recv_cq: CompletionQueue | None = None, *,
                     max_recv_wr: int = 4096) -> UdQp:
        qp = self.create_qp(QpType.UD, send_cq, recv_cq, max_recv_wr=max_recv_wr)
        assert isinstance(qp, UdQp)
        return qp

    def destroy_qp(self, qp: RcQp | UdQp) -> None:
        self.qps.pop(qp.qpn, None)

    # -- packets and timers --------------------------------------------------------------
    def receive(self, packet: bytes | bytearray | memoryview) -> list[Send]:
        """One packet from the port (LRH .. VCRC); returns what to transmit in answer."""
        st = self.stats
        st.rx_packets += 1
        n = len(packet)
        try:
            _b0, b1, dlid, pktlen, _slid, op, b1bth, pkey, dqp, apsn = _LRH_BTH.unpack_from(packet)
        except struct.error:
            st.malformed += 1
            return []
        if (b1 & 3) != 2 or (pktlen & 0x7FF) * 4 + 2 != n or n < 26:
            st.malformed += 1  # a GRH (LNH=3) or raw packet, or a length that does not match
            return []
        mv = memoryview(packet)
        icrc, vcrc = _TAIL.unpack_from(packet, n - 6)
        if _vcrc(mv[: n - 2]) != vcrc:
            st.crc_errors += 1
            return []
        masked = bytearray(mv[:13])
        masked[0] |= 0xF0
        masked[12] = 0xFF
        if _crc32(mv[13 : n - 6], _crc32(masked)) != icrc:
            st.crc_errors += 1
            return []
        if dlid != self.lid:
            st.dlid_mismatch += 1
            return []
        qp = self.qps.get(dqp & 0xFFFFFF)
        if qp is None:
            st.unknown_qp += 1
            return []
        qpkey = qp.pkey
        if (pkey ^ qpkey) & 0x7FFF or not (pkey | qpkey) & 0x8000:
            st.pkey_violations += 1
            return []
        out: list[Send] = []
        qp.receive(packet, mv, op, b1bth, apsn >> 31, apsn & 0xFFFFFF, n, out)
        return out

    def tick(self, now_ns: int) -> list[Send]:
        """Run the timers due at ``now_ns`` (ACK timeouts, RNR waits)."""
        out: list[Send] = []
        for qp in list(self.qps.values()):
            d = qp.next_deadline()
            if d is not None and d <= now_ns:
                qp.tick(now_ns, out)
        return out

    def next_deadline(self) -> int | None:
        """The earliest time ``tick`` has something to do, or None."""
        best: int | None = None
        for qp in self.qps.values():
            d = qp.next_deadline()
            if d is not None and (best is None or d < best):
                best = d
        return best
