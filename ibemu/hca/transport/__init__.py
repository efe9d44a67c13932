"""HCA transport as sans-IO protocol logic: RC and UD queue pairs over native IB packets.

``Hca`` is one port's engine: ``receive(packet)`` / ``tick(now_ns)`` return ``Send`` actions,
verbs (``reg_mr``, ``create_cq``, ``create_qp``, ``QP.connect``, ``post_send``, ``post_recv``,
``CQ.poll``) drive it. ``ibemu.hca.verbs`` is the user-facing face of the same objects;
``loopback`` wires two engines in memory with a simulated clock and seeded faults.

Packets are LRH .. VCRC without a GRH (LNH=2), built with ``wire.fast.NativeTemplate`` (one
per QP and path) and checked on receive (length, VCRC, ICRC, DLID, QPN, P_Key: each drop
counted in ``Hca.stats``). Choices where the spec leaves room or where this is simpler:

- AckReq on the last packet of every signaled message, of every post/retransmission burst,
  and every ``ack_every`` packets; the responder ACKs exactly those (credits 0x1F, MSN).
- Go-back-N restarts at the oldest unacknowledged PSN (a lost READ response re-requests the
  rest of the READ); seq-error NAKs and timeouts both use up ``retry_cnt``, forward progress
  restores it and ``rnr_retry`` (7 = unlimited).
- The responder NAKs once per sequence error/RNR and drops later packets until the expected
  PSN returns; after a remote access / invalid request NAK it stays in RTS, the requester
  goes to ERROR (WQE in error, the rest flushed).
- Send window: WQEs start while fewer than ``max_inflight`` PSNs are unacknowledged (whole
  WQEs), the rest wait in the send queue and go out from the ACK path.
- Peers must agree on the path MTU (both use min(path MTU, port MTU)).
- UD receives land at offset 0 (no 40-byte GRH area); a send error puts the QP in SQE.
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
