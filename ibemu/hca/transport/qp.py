"""Queue pair basics: types, states, path and connection records, counters, receive queue."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ibemu.hca.transport.cq import CompletionQueue, WcOpcode, WcStatus, WorkCompletion
from ibemu.hca.transport.mr import Segment, capacity
from ibemu.hca.transport.wr import RecvWr

if TYPE_CHECKING:
    from ibemu.hca.transport.hca import Hca


class QpType(Enum):
    RC = "rc"
    UD = "ud"


class QpState(Enum):
    RESET = "reset"
    INIT = "init"
    RTR = "rtr"
    RTS = "rts"
    SQD = "sqd"
    SQE = "sqe"
    ERROR = "error"


class QpStateError(RuntimeError):
    """A verb was called in a QP state that does not allow it."""


@dataclass(frozen=True, slots=True)
class PathRecord:
    """The path to the remote port (from the SM's LIDs): DLID, SL, VL, MTU."""

    dlid: int
    sl: int = 0
    vl: int | None = None  # default: VL = SL
    mtu: int = 4096


@dataclass(frozen=True, slots=True)
class QpInfo:
    """What two RC QPs exchange out of band before ``connect``."""

    qpn: int
    psn: int
    lid: int

    def as_dict(self) -> dict[str, int]:
        return {"qpn": self.qpn, "psn": self.psn, "lid": self.lid}


@dataclass(slots=True)
class QpStats:
    tx_packets: int = 0
    rx_packets: int = 0
    retransmitted: int = 0
    timeouts: int = 0
    acks_sent: int = 0
    acks_received: int = 0
    seq_naks_sent: int = 0
    seq_naks_received: int = 0
    rnr_naks_sent: int = 0
    rnr_naks_received: int = 0
    access_naks_sent: int = 0
    inv_req_naks_sent: int = 0
    duplicates: int = 0
    out_of_order: int = 0  # requests that arrived ahead of the expected PSN (reordered or after a loss)
    dropped: int = 0  # out of sequence while a NAK is outstanding, stale responses, ...
    no_recv_drops: int = 0  # UD datagrams without a posted receive
    qkey_violations: int = 0


@dataclass(slots=True)
class RecvWqe:
    wr_id: int
    segs: list[Segment]
    capacity: int


class QueuePair:
    """State machine and receive queue shared by RC and UD queue pairs."""

    qp_type: QpType

    def __init__(self, hca: Hca, qpn: int, send_cq: CompletionQueue, recv_cq: CompletionQueue,
                 psn: int, max_recv_wr: int) -> None:
        self.hca = hca
        self.qpn = qpn
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.state = QpState.RESET
        self.sq_psn = psn & 0xFFFFFF  # first PSN we send (exchanged in QpInfo)
        self.pkey_index = 0
        self.pkey = 0xFFFF
        self.max_recv_wr = max_recv_wr
        self.rq: deque[RecvWqe] = deque()
        self.stats = QpStats()

    def info(self) -> QpInfo:
        return QpInfo(self.qpn, self.sq_psn, self.hca.lid)

    def modify_to_init(self, *, pkey_index: int = 0) -> None:
        self._need(QpState.RESET, QpState.INIT)
        self.pkey_index = pkey_index
        self.pkey = self.hca.pkeys[pkey_index]
        self.state = QpState.INIT

    def reset(self) -> None:
        """Back to RESET: every queue emptied without completions."""
        self.rq.clear()
        self.state = QpState.RESET

    def _need(self, *states: QpState) -> None:
        if self.state not in states:
            raise QpStateError(f"QP {self.qpn:#x} is {self.state.name}, needs {'/'.join(s.name for s in states)}")

    def post_recv(self, wr: RecvWr) -> None:
        if self.state is QpState.RESET:
            raise QpStateError(f"QP {self.qpn:#x} is RESET: post_recv needs INIT or later")
        segs = self.hca.mrs.resolve(wr.sg_list, write=True)
        if self.state is QpState.ERROR:
            self.recv_cq.push(WorkCompletion(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, self.qpn))
            return
        if len(self.rq) >= self.max_recv_wr:
            raise QpStateError(f"QP {self.qpn:#x}: receive queue full ({self.max_recv_wr})")
        self.rq.append(RecvWqe(wr.wr_id, segs, capacity(segs)))

    def flush_recv(self) -> None:
        while self.rq:
            r = self.rq.popleft()
            self.recv_cq.push(WorkCompletion(r.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, self.qpn))
