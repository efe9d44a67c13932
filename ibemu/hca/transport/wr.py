"""Work requests posted to a queue pair."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from ibemu.hca.transport.mr import Sge


class WrOpcode(IntEnum):
    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4


@dataclass(frozen=True, slots=True)
class AddressHandle:
    """Where a UD datagram goes: destination LID and service level."""

    dlid: int
    sl: int = 0


@dataclass(slots=True)
class SendWr:
    """A send-queue request. RDMA ops name ``remote_addr``/``rkey``; UD sends ``ah``,
    ``remote_qpn`` and ``remote_qkey``."""

    wr_id: int
    opcode: WrOpcode
    sg_list: Sequence[Sge] = ()
    remote_addr: int = 0
    rkey: int = 0
    imm: int | None = None
    signaled: bool = True
    solicited: bool = False
    ah: AddressHandle | None = None
    remote_qpn: int = 0
    remote_qkey: int = 0


@dataclass(slots=True)
class RecvWr:
    """A receive buffer for one incoming SEND (or WRITE with immediate)."""

    wr_id: int
    sg_list: Sequence[Sge] = field(default_factory=tuple)
