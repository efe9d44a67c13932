"""A small verbs-like API over the sans-IO transport, for user workloads and the generators.

::

    dev = open_device(lid=1)                          # one HCA port (LID from the SM)
    cq = dev.create_cq()
    mr = dev.reg_mr(bytearray(1 << 20), Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    qp = dev.create_rc_qp(cq)
    qp.connect(peer_info)                             # peer_info = the other side's qp.info()
    sends = qp.post_send(SendWr(1, WrOpcode.RDMA_WRITE, [Sge(mr.addr, 4096, mr.lkey)],
                                remote_addr=raddr, rkey=rkey))
    # the IO layer transmits `sends`, feeds packets to dev.receive(), calls dev.tick(now)
    for wc in cq.poll():
        ...

Every call that can put packets on the wire returns them as ``Send`` actions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ibemu.hca.transport import (
    Access,
    AddressHandle,
    CompletionQueue,
    Hca,
    MemoryRegion,
    PathRecord,
    QpInfo,
    QpState,
    QpStateError,
    QpType,
    RcQp,
    RecvWr,
    SendWr,
    Sge,
    UdQp,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
)
from ibemu.hca.transport.actions import Send

Device = Hca


def open_device(lid: int, *, port: int = 1, pkeys: Sequence[int] = (0xFFFF,), mtu: int = 4096,
                clock: Callable[[], int] | None = None, seed: int | None = None) -> Hca:
    """The transport of HCA port ``port`` whose LID (from the SM) is ``lid``."""
    return Hca(lid=lid, port=port, pkeys=pkeys, mtu=mtu, clock=clock, seed=seed)


def connect_pair(a: RcQp, b: RcQp, *, path_ab: PathRecord | None = None,
                 path_ba: PathRecord | None = None, **attrs: int) -> None:
    """Connect two RC QPs to each other (the out-of-band exchange done in one place)."""
    ia, ib = a.info(), b.info()
    a.connect(ib, path_ab, **attrs)
    b.connect(ia, path_ba, **attrs)


def sge(mr: MemoryRegion, offset: int = 0, length: int | None = None) -> Sge:
    """An SGE for ``length`` bytes (default: the rest) at ``offset`` into ``mr``."""
    n = mr.length - offset if length is None else length
    return Sge(mr.addr + offset, n, mr.lkey)


__all__ = [
    "Access",
    "AddressHandle",
    "CompletionQueue",
    "Device",
    "Hca",
    "MemoryRegion",
    "PathRecord",
    "QpInfo",
    "QpState",
    "QpStateError",
    "QpType",
    "RcQp",
    "RecvWr",
    "Send",
    "SendWr",
    "Sge",
    "UdQp",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
    "connect_pair",
    "open_device",
    "sge",
]
