"""Completion queues and work completions."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import IntEnum


class WcStatus(IntEnum):
    """Completion status (values as ibv_wc_status)."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13


class WcOpcode(IntEnum):
    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


@dataclass(slots=True)
class WorkCompletion:
    """One completion: a send-queue WQE (SEND/WRITE/READ) or a receive (RECV)."""

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    qpn: int
    byte_len: int = 0
    imm: int | None = None
    src_qp: int = 0
    slid: int = 0


class CompletionQueue:
    """Completions in the order the HCA produced them; ``poll`` takes them out."""

    __slots__ = ("_q", "cqn", "depth", "overflows")

    def __init__(self, cqn: int, depth: int = 1 << 20) -> None:
        self.cqn = cqn
        self.depth = depth
        self.overflows = 0
        self._q: deque[WorkCompletion] = deque()

    def push(self, wc: WorkCompletion) -> None:
        if len(self._q) >= self.depth:
            self.overflows += 1
            return
        self._q.append(wc)

    def poll(self, max_entries: int = 16) -> list[WorkCompletion]:
        q = self._q
        n = min(max_entries, len(q))
        return [q.popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._q)
