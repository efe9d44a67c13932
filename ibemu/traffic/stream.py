"""Sequence-numbered streams for reroute studies: every packet's delivery time is recorded.

A stream sends ``rate_pps`` messages of ``size`` bytes (one packet each up to the MTU) from
one host to another, over RC (default: lost packets are retransmitted by the transport and
counted as such) or UD (lost packets stay lost and show as gaps). Each message carries its
sequence number and send time; the receiver keeps ``(seq, t_recv)`` for every delivery, so
the blackout of the flow across a fault is exact (``blackout.analyse``).
"""

from __future__ import annotations

import struct
from array import array
from collections import deque
from dataclasses import dataclass, field

import trio

from ibemu import clock
from ibemu.hca.nic import HcaPort
from ibemu.hca.transport import (
    Access,
    AddressHandle,
    MemoryRegion,
    PathRecord,
    QpInfo,
    RcQp,
    RecvWr,
    SendWr,
    Sge,
    UdQp,
    WcOpcode,
    WcStatus,
    WrOpcode,
)

HEADER = struct.Struct("!QQ")  # seq, t_send_ns
RING = 4096
QKEY = 0x1BE0_0001
TICK_S = 0.001
POST_CHUNK = 64
"""Receives posted between two checkpoints of the worker's loop (~1 ms)."""
SEND_QUEUE = RING // 2
"""Messages a stream keeps posted and unacknowledged at most (its slots are not reused
before they are acknowledged: a retransmission resends the same bytes)."""


REQUESTER_COUNTERS = ("timeouts", "seq_naks_received", "rnr_naks_received", "dropped")
RESPONDER_COUNTERS = ("seq_naks_sent", "rnr_naks_sent", "duplicates", "dropped", "out_of_order")


@dataclass
class StreamOptions:
    rate_pps: float = 10_000.0
    size: int = 256
    transport: str = "rc"
    duration_s: float | None = None
    count: int | None = None
    timeout: int = 14
    """RC local ACK timeout exponent: 4.096 us x 2^14 = 67 ms (7 retries: ~0.5 s of path
    loss before the QP gives up). A lost packet followed by others is NAKed at once."""
    retry_cnt: int = 7
    reorder_window: int = 0
    """RC: the receiver holds requests up to this many PSNs ahead (adaptive routing)."""

    def __post_init__(self) -> None:
        if self.transport not in ("rc", "ud"):
            raise ValueError(f"stream transport is rc or ud, not {self.transport!r}")
        if not 0 < self.rate_pps <= 1_000_000:
            raise ValueError("rate_pps must be in (0, 1,000,000]")
        if not HEADER.size <= self.size <= 4096:
            raise ValueError(f"stream messages are {HEADER.size} .. 4096 bytes (one packet)")


@dataclass
class StreamRecord:
    """What a stream's two ends saw."""

    sent: int = 0
    sent_t_ns: array = field(default_factory=lambda: array("q"))
    """Send time of every message, by sequence number."""
    recv_seq: array = field(default_factory=lambda: array("q"))
    recv_t_ns: array = field(default_factory=lambda: array("q"))
    retransmitted: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    """RC: the requester's and responder's transport counters (timeouts, NAKs, duplicates...)
    and the frames the ports read before a timer was judged (``HcaPort.caught_up``), nonzero
    ones only: how the stream recovered, or why it did not."""
    errors: list[str] = field(default_factory=list)

    @property
    def delivered(self) -> int:
        return len(set(self.recv_seq))

    @property
    def lost(self) -> int:
        return self.sent - self.delivered


class Stream:
    """A stream between two ports of this process."""

    def __init__(self, src: HcaPort, dst: HcaPort, opts: StreamOptions) -> None:
        self.src, self.dst, self.opts = src, dst, opts
        self.record = StreamRecord()
        access = Access.LOCAL_WRITE
        self.tx_mr = src.hca.reg_mr(bytearray(RING * opts.size), access)
        self.rx_mr = dst.hca.reg_mr(bytearray(RING * opts.size), access)
        self.tx_cq, self.rx_cq = src.hca.create_cq(), dst.hca.create_cq()
        self.tx_qp: RcQp | UdQp
        self.rx_qp: RcQp | UdQp
        if opts.transport == "rc":
            a = src.hca.create_rc_qp(self.tx_cq, max_send_wr=SEND_QUEUE)
            b = dst.hca.create_rc_qp(self.rx_cq)
            path_ab = PathRecord(dlid=dst.hca.lid, mtu=min(4096, src.hca.mtu))
            path_ba = PathRecord(dlid=src.hca.lid, mtu=min(4096, dst.hca.mtu))
            a.connect(QpInfo(b.qpn, b.sq_psn, dst.hca.lid), path_ab, timeout=opts.timeout,
                      retry_cnt=opts.retry_cnt, max_inflight=RING // 2)
            b.connect(QpInfo(a.qpn, a.sq_psn, src.hca.lid), path_ba, timeout=opts.timeout,
                      retry_cnt=opts.retry_cnt, reorder_window=opts.reorder_window)
            self.tx_qp, self.rx_qp = a, b
        else:
            u, v = src.hca.create_ud_qp(self.tx_cq), dst.hca.create_ud_qp(self.rx_cq)
            u.activate(qkey=QKEY)
            v.activate(qkey=QKEY)
            self.tx_qp, self.rx_qp = u, v
        self._unposted = iter(range(RING))  # posted by ``run`` before anything is sent
        # Every receive completion gets its frame's arrival time (the kernel's stamp when the
        # port has them): the CQ is FIFO, so stamps queue in the same order.
        self._stamps: deque[int] = deque()
        self._stamped = 0
        dst.on_frame.append(self._on_frame)

    async def _post_receives(self) -> None:
        """Every slot's receive, posted before the first send, ``POST_CHUNK`` at a time with a
        checkpoint between: the 4,096 posts took ~50 ms of the worker's loop in one go, a
        stall every other task of the process (its other flows, the lag monitor) waited out."""
        for n, slot in enumerate(self._unposted, 1):
            self.rx_qp.post_recv(RecvWr(slot, [self._slot(self.rx_mr, slot)]))
            if n % POST_CHUNK == 0:
                await trio.lowlevel.checkpoint()

    def _on_frame(self, t_ns: int) -> None:
        n = len(self.rx_cq)
        while self._stamped < n:
            self._stamps.append(t_ns)
            self._stamped += 1

    def _slot(self, mr: MemoryRegion, slot: int) -> Sge:
        size = self.opts.size
        return Sge(mr.addr + slot * size, size, mr.lkey)

    async def run(self, *, stop: trio.Event | None = None, task_status: trio.TaskStatus[None]
                  = trio.TASK_STATUS_IGNORED) -> StreamRecord:
        """Send until the duration/count is reached or ``stop`` is set; then drain briefly."""
        await self._post_receives()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receiver)
            nursery.start_soon(self._reaper)
            task_status.started()
            await self._sender(stop)
            # Let the last packets (and any retransmission) arrive.
            with trio.move_on_after(max(0.2, 4 * 4.096e-6 * (1 << self.opts.timeout))):
                while self.record.delivered < self.record.sent:
                    await self.dst.wait_progress()
            nursery.cancel_scope.cancel()
        self.dst.on_frame.remove(self._on_frame)
        self.record.retransmitted = self.tx_qp.stats.retransmitted
        self.record.counters = self._counters()
        return self.record

    def _counters(self) -> dict[str, int]:
        if not isinstance(self.tx_qp, RcQp):
            return {}
        tx, rx = self.tx_qp.stats, self.rx_qp.stats
        got = {f"req_{k}": getattr(tx, k) for k in REQUESTER_COUNTERS}
        got |= {f"resp_{k}": getattr(rx, k) for k in RESPONDER_COUNTERS}
        got["caught_up"] = self.src.caught_up + self.dst.caught_up
        return {k: v for k, v in got.items() if v}

    async def _sender(self, stop: trio.Event | None) -> None:
        opts, rec, buf = self.opts, self.record, self.tx_mr.buf
        size = opts.size
        t0 = clock.now_ns()
        end = None if opts.duration_s is None else t0 + int(opts.duration_s * 1e9)
        limit = opts.count
        period_ns = 1e9 / opts.rate_pps
        ud = opts.transport == "ud"
        ah = AddressHandle(self.dst.hca.lid)
        seq = 0
        while True:
            now = clock.now_ns()
            if (stop is not None and stop.is_set()) or (end is not None and now >= end) or (
                    limit is not None and seq >= limit):
                return
            due = int((now - t0) / period_ns) + 1
            if limit is not None:
                due = min(due, limit)
            # While the path is down an RC sender cannot get ahead of its send queue: it
            # falls behind (as an application blocked on a full queue) and catches up later.
            due = min(due, seq + self._room())
            wrs = []
            while seq < due:
                slot = seq % RING
                HEADER.pack_into(buf, slot * size, seq, now)
                rec.sent_t_ns.append(now)
                if ud:
                    wrs.append(SendWr(seq, WrOpcode.SEND, [self._slot(self.tx_mr, slot)], ah=ah,
                                      remote_qpn=self.rx_qp.qpn, remote_qkey=QKEY, signaled=slot % 64 == 63))
                else:
                    wrs.append(SendWr(seq, WrOpcode.SEND, [self._slot(self.tx_mr, slot)],
                                      signaled=slot % 64 == 63))
                seq += 1
            rec.sent = seq
            if wrs:
                self.src.post(self.tx_qp, wrs)
            await trio.sleep(TICK_S)

    def _room(self) -> int:
        """Messages the sender may post now."""
        qp = self.tx_qp
        if isinstance(qp, RcQp):
            return max(0, SEND_QUEUE - qp.send_queue_depth)
        return SEND_QUEUE

    async def _receiver(self) -> None:
        rec, cq, qp, buf, size = self.record, self.rx_cq, self.rx_qp, self.rx_mr.buf, self.opts.size
        stamps = self._stamps
        while True:
            await self.dst.wait_progress()
            wcs = cq.poll(1 << 16)
            self._stamped -= len(wcs)
            for wc in wcs:
                t_ns = stamps.popleft() if stamps else clock.now_ns()
                if wc.opcode < WcOpcode.RECV:
                    continue
                if wc.status is WcStatus.SUCCESS:
                    seq, _t_send = HEADER.unpack_from(buf, wc.wr_id * size)
                    rec.recv_seq.append(seq)
                    rec.recv_t_ns.append(t_ns)
                elif wc.status is not WcStatus.WR_FLUSH_ERR:
                    rec.errors.append(f"receive: {wc.status.name}")
                qp.post_recv(RecvWr(wc.wr_id, [self._slot(self.rx_mr, wc.wr_id)]))

    async def _reaper(self) -> None:
        """Take the sender's completions; an error ends the stream's QP (recorded)."""
        while True:
            await self.src.wait_progress()
            for wc in self.tx_cq.poll(1 << 16):
                if wc.status is not WcStatus.SUCCESS and not self.record.errors:
                    self.record.errors.append(f"send: {wc.status.name}")
