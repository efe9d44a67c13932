"""HCA transport as sans-IO protocol logic: RC and UD queue pairs over native IB packets.

``Hca`` is one port's engine: ``receive(packet)`` / ``tick(now_ns)`` return ``Send`` actions,
verbs (``reg_mr``, ``create_cq``, ``create_qp``, ``QP.connect``, ``post_send``, ``post_recv``,
``CQ.poll``) drive it. ``ibemu.hca.verbs`` is the user-facing face of the same objects.
"""

from ibemu.hca.transport.cq import CompletionQueue, WcOpcode, WcStatus, WorkCompletion
from ibemu.hca.transport.hca import Hca, HcaStats
from ibemu.hca.transport.mr import Access, MemoryRegion, Sge
from ibemu.hca.transport.qp import PathRecord, QpInfo, QpState, QpStateError, QpStats, QpType
from ibemu.hca.transport.rc import RcQp
from ibemu.hca.transport.ud import UdQp
from ibemu.hca.transport.wr import AddressHandle, RecvWr, SendWr, WrOpcode

__all__ = [
    "Access",
    "AddressHandle",
    "CompletionQueue",
    "Hca",
    "HcaStats",
    "MemoryRegion",
    "PathRecord",
    "QpInfo",
    "QpState",
    "QpStateError",
    "QpStats",
    "QpType",
    "RcQp",
    "RecvWr",
    "SendWr",
    "Sge",
    "UdQp",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
]
