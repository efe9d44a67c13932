"""RC requester: PSNs, AckReq coalescing, ACK/NAK handling, go-back-N, retry and RNR timers."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.cq import WcOpcode, WcStatus, WorkCompletion
from ibemu.hca.transport.mr import Segment, capacity, gather, scatter
from ibemu.hca.transport.qp import QpState
from ibemu.hca.transport.segment import (
    PSN_HALF,
    PSN_MASK,
    READ_RESP_OPS,
    SEND_IMM_OPS,
    SEND_OPS,
    WRITE_IMM_OPS,
    WRITE_OPS,
    npkts,
    psn_diff,
    segment_opcode,
)
from ibemu.hca.transport.timers import rnr_delay_ns
from ibemu.hca.transport.wr import SendWr, WrOpcode
from ibemu.wire import fast
from ibemu.wire.opcodes import Op

if TYPE_CHECKING:
    from ibemu.hca.transport.rc import RcQp

log = logging.getLogger(__name__)

_NAK_STATUS = {
    0x61: WcStatus.REM_INV_REQ_ERR,
    0x62: WcStatus.REM_ACCESS_ERR,
    0x63: WcStatus.REM_OP_ERR,
    0x64: WcStatus.REM_INV_REQ_ERR,
}
_READ_REQ = int(Op.RDMA_READ_REQUEST)
_NO_SEGS: list[Segment] = []
_RTS = QpState.RTS
_WR_READ = WrOpcode.RDMA_READ
_WR_WRITE = WrOpcode.RDMA_WRITE
_WR_SEND = WrOpcode.SEND
_WR_SEND_IMM = WrOpcode.SEND_WITH_IMM
_READ = WcOpcode.RDMA_READ
_WRITE = WcOpcode.RDMA_WRITE
_reth = fast.reth
_immdt = fast.immdt


@dataclass(slots=True, eq=False)
class SendWqe:
    """A posted send-queue request and where its packets are in PSN space."""

    wr_id: int
    kind: WcOpcode
    ops: tuple[int, int, int, int]
    data: bytes | memoryview | None  # SEND / WRITE source
    segs: list[Segment]  # READ destination
    length: int
    raddr: int
    rkey: int
    imm: int | None
    signaled: bool
    solicited: bool
    psn: int = 0
    n: int = 1
    done: int = 0  # READ: response packets placed
    base: int = 0  # READ: the packet the last request asked from (its responses restart at First)


class RcRequester:
    """The send side of one RC QP (IBA 9.7.4/9.7.5 requester behaviour)."""

    def __init__(self, qp: RcQp) -> None:
        self.qp = qp
        self.next_psn = 0
        self.una = 0  # oldest PSN neither acknowledged nor (READ) answered
        self.outstanding: deque[SendWqe] = deque()
        self.pending: deque[SendWqe] = deque()  # posted, not started (window full, or SQD)
        self.max_inflight = 4096  # PSNs sent and not yet acknowledged
        self.timeout_ns: int | None = None
        self.retry_cnt = 7
        self.retry_left = 7
        self.rnr_retry = 7
        self.rnr_left = 7
        self.ack_every = 16
        self.max_send_wr = 4096
        self.ack_deadline: int | None = None
        self.rnr_deadline: int | None = None
        self._since_ackreq = 0
        self._gap_psn = -1  # una at the last READ-gap / seq-NAK go-back (once per error)

    # -- posting -------------------------------------------------------------------------
    def make_wqe(self, wr: SendWr) -> SendWqe:
        op = wr.opcode
        resolve = self.qp.hca.mrs.resolve
        if op is _WR_READ:
            segs = resolve(wr.sg_list, write=True)
            return SendWqe(wr.wr_id, _READ, READ_RESP_OPS, None, segs, capacity(segs),
                           wr.remote_addr, wr.rkey, None, wr.signaled, False)
        data = gather(resolve(wr.sg_list, write=False))
        if op is _WR_WRITE:
            return SendWqe(wr.wr_id, _WRITE, WRITE_OPS, data, _NO_SEGS, len(data), wr.remote_addr,
                           wr.rkey, None, wr.signaled, wr.solicited)
        if op is _WR_SEND or op is _WR_SEND_IMM:
            imm = wr.imm if op is _WR_SEND_IMM else None
            if op is _WR_SEND_IMM and imm is None:
                raise ValueError("SEND_WITH_IMM needs imm")
            return SendWqe(wr.wr_id, WcOpcode.SEND, SEND_OPS if imm is None else SEND_IMM_OPS, data,
                           _NO_SEGS, len(data), 0, 0, imm, wr.signaled, wr.solicited)
        if wr.imm is None:
            raise ValueError("RDMA_WRITE_WITH_IMM needs imm")
        return SendWqe(wr.wr_id, _WRITE, WRITE_IMM_OPS, data, _NO_SEGS, len(data), wr.remote_addr,
                       wr.rkey, wr.imm, wr.signaled, wr.solicited)

    def post(self, wrs: Sequence[SendWr], out: list[Send], *, queue_only: bool) -> None:
        if len(self.outstanding) + len(self.pending) + len(wrs) > self.max_send_wr:
            raise OverflowError(f"send queue of QP {self.qp.qpn:#x} full ({self.max_send_wr})")
        wqes = [self.make_wqe(wr) for wr in wrs]
        mtu = self.qp.mtu
        for w in wqes:
            w.n = npkts(w.length, mtu)
        self.pending.extend(wqes)
        if not queue_only:
            self.fill(out)

    def fill(self, out: list[Send]) -> None:
        """Start waiting WQEs while fewer than ``max_inflight`` PSNs are unacknowledged (a WQE
        is started whole: one message may go over the window)."""
        pending = self.pending
        if not pending:
            return
        inflight = (self.next_psn - self.una) & PSN_MASK
        limit = self.max_inflight
        if inflight >= limit:
            return
        wqes: list[SendWqe] = []
        psn = self.next_psn
        while pending and inflight < limit:
            w = pending.popleft()
            w.psn = psn
            psn = (psn + w.n) & PSN_MASK
            inflight += w.n
            wqes.append(w)
        self.next_psn = psn
        self.outstanding.extend(wqes)
        self._emit(wqes, 0, out)
        if (self.ack_deadline is None and self.rnr_deadline is None and self.timeout_ns is not None
                and self.outstanding):
            self.ack_deadline = self.qp.hca.clock() + self.timeout_ns

    def _emit(self, wqes: Sequence[SendWqe], k: int, out: list[Send]) -> int:
        """Packets of ``wqes`` onto ``out``, the first WQE from its packet ``k``; AckReq on the
        last packet of signaled messages, of the burst, and every ``ack_every`` packets."""
        qp = self.qp
        packet = qp.tmpl.packet
        port = qp.hca.port
        mtu = qp.mtu
        every = self.ack_every
        since = self._since_ackreq
        append = out.append
        last_w = wqes[-1] if wqes else None
        count = 0
        for w in wqes:
            psn0 = w.psn
            n = w.n
            kind = w.kind
            if kind is _READ:
                off = k * mtu
                w.base = k
                append(Send(port, packet(_READ_REQ, (psn0 + k) & PSN_MASK,
                                         ext=_reth(w.raddr + off, w.rkey, w.length - off))))
                count += 1
                k = 0
                continue
            data = w.data or b""
            ops = w.ops
            imm = w.imm
            end_ack = w.signaled or w is last_w
            if n == 1:  # the common one-packet message, without the loop
                since += 1
                ackreq = since >= every or end_ack
                if ackreq:
                    since = 0
                ext = _reth(w.raddr, w.rkey, w.length) if kind is _WRITE else b""
                if imm is not None:
                    ext += _immdt(imm)
                append(Send(port, packet(ops[3], psn0, data, ackreq=ackreq, se=w.solicited, ext=ext)))
                count += 1
                continue
            is_write = kind is _WRITE
            for i in range(k, n):
                ext = b""
                if i == 0:
                    op = ops[0]
                    if is_write:
                        ext = _reth(w.raddr, w.rkey, w.length)
                elif i == n - 1:
                    op = ops[2]
                    if imm is not None:
                        ext = _immdt(imm)
                else:
                    op = ops[1]
                tail = i == n - 1
                since += 1
                ackreq = since >= every or (tail and end_ack)
                if ackreq:
                    since = 0
                append(Send(port, packet(op, (psn0 + i) & PSN_MASK, data[i * mtu : (i + 1) * mtu],
                                         ackreq=ackreq, se=tail and w.solicited, ext=ext)))
            count += n - k
            k = 0
        self._since_ackreq = since
        qp.stats.tx_packets += count
        return count

    def go_back(self, out: list[Send]) -> None:
        """Go-back-N: resend everything from ``una`` (the front WQE contains it)."""
        q = self.outstanding
        if not q:
            return
        w = q[0]
        k = w.done if w.kind is WcOpcode.RDMA_READ else psn_diff(self.una, w.psn)
        if not 0 <= k < w.n:
            k = 0
        count = self._emit(list(q), k, out)
        self.qp.stats.retransmitted += count
        log.debug("QP %#x: go-back-N from PSN %#x, %d packets", self.qp.qpn, self.una, count)
        if self.timeout_ns is not None:
            self.ack_deadline = self.qp.hca.clock() + self.timeout_ns

    # -- responses -----------------------------------------------------------------------
    def ack_upto(self, p: int, out: list[Send]) -> bool:
        """Everything up to PSN ``p`` is acknowledged; complete WQEs, restart timers."""
        una = self.una
        d = (p - una) & PSN_MASK
        if d >= PSN_HALF or ((p - self.next_psn) & PSN_MASK) < PSN_HALF:
            return False  # stale (p < una) or for PSNs never sent
        q = self.outstanding
        new_una = (p + 1) & PSN_MASK
        while q:
            w = q[0]
            last = (w.psn + w.n - 1) & PSN_MASK
            if ((last - p) & PSN_MASK) < PSN_HALF and last != p:  # w extends beyond p
                if w.kind is WcOpcode.RDMA_READ:
                    new_una = (w.psn + w.done) & PSN_MASK
                break
            if w.kind is WcOpcode.RDMA_READ and w.done < w.n:
                # acknowledged past a READ whose responses were lost: ask again (implicit NAK)
                new_una = (w.psn + w.done) & PSN_MASK
                if new_una != una:
                    self._progress()
                self.una = new_una
                if self._gap_psn != new_una:
                    self._gap_psn = new_una
                    self.go_back(out)
                return new_una != una
            q.popleft()
            self._complete(w, WcStatus.SUCCESS)
        if new_una == una:
            return False
        self.una = new_una
        self._progress()
        return True

    def _progress(self) -> None:
        self.retry_left = self.retry_cnt
        self.rnr_left = self.rnr_retry
        self._gap_psn = -1
        if self.outstanding and self.timeout_ns is not None and self.rnr_deadline is None:
            self.ack_deadline = self.qp.hca.clock() + self.timeout_ns
        else:
            self.ack_deadline = None

    def on_ack(self, syndrome: int, psn: int, out: list[Send]) -> None:
        kind = syndrome >> 5
        st = self.qp.stats
        if kind == 0:
            st.acks_received += 1
            if self.ack_upto(psn, out) and self.pending and self.qp.state is _RTS:
                self.fill(out)
            return
        self.ack_upto((psn - 1) & PSN_MASK, out)
        if not self.outstanding or psn_diff(psn, self.una) != 0:
            st.dropped += 1  # stale NAK
            return
        if kind == 1:
            st.rnr_naks_received += 1
            if self.rnr_deadline is not None:
                return
            if self.rnr_retry != 7:
                if self.rnr_left == 0:
                    self.fail(WcStatus.RNR_RETRY_EXC_ERR, out)
                    return
                self.rnr_left -= 1
            self.ack_deadline = None
            self.rnr_deadline = self.qp.hca.clock() + rnr_delay_ns(syndrome & 0x1F)
            return
        if syndrome == 0x60:
            st.seq_naks_received += 1
            if self._gap_psn == psn:
                return  # the same sequence error again (a duplicated NAK)
            self._gap_psn = psn
            if self._use_retry(out):
                self.go_back(out)
            return
        self.fail(_NAK_STATUS.get(syndrome, WcStatus.REM_OP_ERR), out)

    def on_read_response(self, opcode: int, psn: int, payload: memoryview, out: list[Send]) -> None:
        st = self.qp.stats
        self.ack_upto((psn - 1) & PSN_MASK, out)
        q = self.outstanding
        if not q or q[0].kind is not _READ:
            if psn_diff(psn, self.una) < 0:
                st.duplicates += 1  # a late answer to a READ already complete
            else:
                st.dropped += 1
            return
        w = q[0]
        expect = (w.psn + w.done) & PSN_MASK
        d = psn_diff(psn, expect)
        if d < 0:
            st.duplicates += 1
            return
        if d > 0:
            st.dropped += 1
            if d < w.n - w.done and self._gap_psn != expect:  # a lost response: ask again
                self._gap_psn = expect
                if self._use_retry(out):
                    self.go_back(out)
            return
        i = w.done
        n = w.n
        want_op = segment_opcode(READ_RESP_OPS, i - w.base, n - w.base)
        mtu = self.qp.mtu
        off = i * mtu
        if opcode != want_op or len(payload) != min(mtu, w.length - off):
            st.dropped += 1
            return
        if payload:
            scatter(w.segs, off, payload)
        w.done = i + 1
        self.una = (psn + 1) & PSN_MASK
        if w.done == n:
            q.popleft()
            self._complete(w, WcStatus.SUCCESS)
        self._progress()
        if self.pending and self.qp.state is _RTS:
            self.fill(out)

    # -- timers and errors ---------------------------------------------------------------
    def _use_retry(self, out: list[Send]) -> bool:
        if self.retry_left == 0:
            self.fail(WcStatus.RETRY_EXC_ERR, out)
            return False
        self.retry_left -= 1
        return True

    def tick(self, now: int, out: list[Send]) -> None:
        if self.rnr_deadline is not None and now >= self.rnr_deadline:
            self.rnr_deadline = None
            self.go_back(out)
        if self.ack_deadline is not None and now >= self.ack_deadline:
            self.ack_deadline = None
            if not self.outstanding:
                return
            self.qp.stats.timeouts += 1
            log.debug("QP %#x: local ACK timeout at PSN %#x", self.qp.qpn, self.una)
            if self._use_retry(out):
                self.go_back(out)

    def next_deadline(self) -> int | None:
        a, r = self.ack_deadline, self.rnr_deadline
        if a is None:
            return r
        return a if r is None else min(a, r)

    def _complete(self, w: SendWqe, status: WcStatus) -> None:
        if w.signaled or status is not WcStatus.SUCCESS:
            self.qp.send_cq.push(WorkCompletion(w.wr_id, status, w.kind, self.qp.qpn, w.length))

    def fail(self, status: WcStatus, out: list[Send]) -> None:
        """The front WQE completes with ``status``; the QP goes to ERROR and flushes."""
        log.info("QP %#x: %s, to ERROR", self.qp.qpn, status.name)
        if self.outstanding:
            self._complete(self.outstanding.popleft(), status)
        self.qp.enter_error()

    def flush(self) -> None:
        for q in (self.outstanding, self.pending):
            while q:
                self._complete(q.popleft(), WcStatus.WR_FLUSH_ERR)
        self.ack_deadline = self.rnr_deadline = None
