"""Reliable-connected queue pair: the state machine around a requester and a responder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.cq import CompletionQueue, WcStatus
from ibemu.hca.transport.qp import PathRecord, QpInfo, QpState, QpStateError, QpType, QueuePair
from ibemu.hca.transport.rc_requester import RcRequester
from ibemu.hca.transport.rc_responder import RcResponder
from ibemu.hca.transport.segment import PSN_HALF, PSN_MASK, check_mtu
from ibemu.hca.transport.timers import ack_timeout_ns
from ibemu.hca.transport.wr import SendWr
from ibemu.wire.fast import NativeTemplate

if TYPE_CHECKING:
    from ibemu.hca.transport.hca import Hca

_ACK = 0x11
_RESP_FIRST, _RESP_LAST = 0x0D, 0x10
_AETH_OPS = (0x0D, 0x0F, 0x10)
_RC_EXTRA = frozenset(range(0x12, 0x20))  # atomics, SEND with invalidate: NAKed as unsupported


class RcQp(QueuePair):
    """An RC QP: ``connect()`` (RESET -> INIT -> RTR -> RTS), ``post_send``, ``post_recv``."""

    qp_type = QpType.RC

    def __init__(self, hca: Hca, qpn: int, send_cq: CompletionQueue, recv_cq: CompletionQueue,
                 psn: int, max_send_wr: int, max_recv_wr: int) -> None:
        super().__init__(hca, qpn, send_cq, recv_cq, psn, max_recv_wr)
        self.req = RcRequester(self)
        self.req.max_send_wr = max_send_wr
        self.resp = RcResponder(self)
        self.tmpl: NativeTemplate = NativeTemplate(slid=0, dlid=0, destqp=0)
        self.mtu = 4096
        self.remote_qpn = 0
        self.path_dlid = 0
        self.path: PathRecord | None = None

    # -- state machine -------------------------------------------------------------------
    def modify_to_rtr(self, remote: QpInfo | Mapping[str, int], path: PathRecord | None = None, *,
                      min_rnr_timer: int = 1, reorder_window: int = 0) -> None:
        """INIT -> RTR: remote QPN and starting PSN, the path (DLID, SL, MTU) to it.
        ``reorder_window``: requests up to that many PSNs ahead are held, not NAKed
        (``rc_responder``; for paths under adaptive routing)."""
        if not 0 <= reorder_window <= PSN_HALF:
            raise ValueError(f"reorder window must be within 0..{PSN_HALF}, not {reorder_window}")
        self._need(QpState.INIT)
        info = remote if isinstance(remote, QpInfo) else QpInfo(remote["qpn"], remote["psn"], remote["lid"])
        path = path or PathRecord(dlid=info.lid)
        self.mtu = check_mtu(min(path.mtu, self.hca.mtu))
        self.path = path
        self.remote_qpn = info.qpn
        self.path_dlid = path.dlid
        self.tmpl = NativeTemplate(slid=self.hca.lid, dlid=path.dlid, destqp=info.qpn, pkey=self.pkey,
                                   sl=path.sl, vl=path.sl if path.vl is None else path.vl)
        self.resp.epsn = info.psn & PSN_MASK
        self.resp.min_rnr_timer = min_rnr_timer & 0x1F
        self.resp.reorder_window = reorder_window
        self.state = QpState.RTR

    def modify_to_rts(self, *, timeout: int = 14, retry_cnt: int = 7, rnr_retry: int = 7,
                      ack_every: int = 16, max_inflight: int = 4096) -> list[Send]:
        """RTR -> RTS (or SQD -> RTS, which sends what was posted meanwhile).

        ``timeout``: local ACK timeout 4.096 us x 2^timeout (0 = none); ``retry_cnt``: transport
        retries (0..7); ``rnr_retry``: RNR retries (7 = unlimited); ``ack_every``: AckReq on
        every N-th packet besides the last of each signaled message; ``max_inflight``: PSNs
        sent and not yet acknowledged before further WQEs wait.
        """
        out: list[Send] = []
        if self.state is QpState.SQD:
            self.state = QpState.RTS
            self.req.fill(out)
            return out
        self._need(QpState.RTR)
        if not (0 <= retry_cnt <= 7 and 0 <= rnr_retry <= 7 and ack_every >= 1
                and 1 <= max_inflight < 1 << 22):
            raise ValueError("retry_cnt and rnr_retry are 0..7, ack_every >= 1, max_inflight 1..2^22")
        r = self.req
        r.timeout_ns = ack_timeout_ns(timeout)
        r.retry_cnt = r.retry_left = retry_cnt
        r.rnr_retry = r.rnr_left = rnr_retry
        r.ack_every = ack_every
        r.max_inflight = max_inflight
        r.next_psn = r.una = self.sq_psn
        self.state = QpState.RTS
        return out

    def connect(self, remote: QpInfo | Mapping[str, int], path: PathRecord | None = None, *,
                pkey_index: int = 0, min_rnr_timer: int = 1, timeout: int = 14, retry_cnt: int = 7,
                rnr_retry: int = 7, ack_every: int = 16, max_inflight: int = 4096,
                reorder_window: int = 0) -> None:
        """RESET -> INIT -> RTR -> RTS in one call, with ``remote`` = the peer's ``info()``."""
        if self.state is QpState.RESET:
            self.modify_to_init(pkey_index=pkey_index)
        self.modify_to_rtr(remote, path, min_rnr_timer=min_rnr_timer, reorder_window=reorder_window)
        self.modify_to_rts(timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                           ack_every=ack_every, max_inflight=max_inflight)

    def modify_to_sqd(self) -> None:
        """RTS -> SQD: sends posted from now on wait; outstanding ones still complete."""
        self._need(QpState.RTS)
        self.state = QpState.SQD

    def enter_error(self) -> None:
        """To ERROR: every outstanding and posted WQE is flushed (WR_FLUSH_ERR)."""
        self.state = QpState.ERROR
        self.req.flush()
        self.flush_recv()

    def reset(self) -> None:
        super().reset()
        self.req = RcRequester(self)
        self.resp = RcResponder(self)

    @property
    def send_queue_depth(self) -> int:
        """WQEs posted and not yet completed (in flight or waiting for the send window)."""
        return len(self.req.outstanding) + len(self.req.pending)

    # -- verbs ---------------------------------------------------------------------------
    def post_send(self, wrs: SendWr | Sequence[SendWr]) -> list[Send]:
        """Post one or more WRs; returns the packets to transmit now (AckReq on the last)."""
        batch = [wrs] if isinstance(wrs, SendWr) else list(wrs)
        out: list[Send] = []
        st = self.state
        if st is QpState.RTS:
            self.req.post(batch, out, queue_only=False)
        elif st is QpState.SQD:
            self.req.post(batch, out, queue_only=True)
        elif st is QpState.ERROR:
            for wr in batch:
                w = self.req.make_wqe(wr)
                self.req._complete(w, WcStatus.WR_FLUSH_ERR)
        else:
            raise QpStateError(f"QP {self.qpn:#x} is {st.name}: post_send needs RTS")
        return out

    # -- data path -----------------------------------------------------------------------
    def receive(self, pkt: bytes | bytearray | memoryview, mv: memoryview, op: int, b1bth: int,
                ackreq: int, psn: int, n: int, out: list[Send]) -> None:
        st = self.state
        if (op > _ACK and op not in _RC_EXTRA) or (
                st is not QpState.RTS and st is not QpState.SQD
                and (st is not QpState.RTR or _RESP_FIRST <= op <= _ACK)):  # not RC, or not now
            self.stats.dropped += 1
            return
        self.stats.rx_packets += 1
        if op < _RESP_FIRST or op > _ACK:
            self.resp.on_request(pkt, mv, op, b1bth, ackreq, psn, n, out)
        elif op == _ACK:
            self.req.on_ack(pkt[20], psn, out)
        else:
            pad = (b1bth >> 4) & 3
            hl = 24 if op in _AETH_OPS else 20
            if n - 6 - pad < hl:
                self.stats.dropped += 1
                return
            self.req.on_read_response(op, psn, mv[hl : n - 6 - pad], out)

    def tick(self, now: int, out: list[Send]) -> None:
        if self.state is QpState.RTS or self.state is QpState.SQD:
            self.req.tick(now, out)

    def next_deadline(self) -> int | None:
        if self.state is QpState.RTS or self.state is QpState.SQD:
            return self.req.next_deadline()
        return None
