"""Two HCAs with one connected RC QP pair each side, on an in-memory cable."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ibemu.hca.transport import (
    Access,
    CompletionQueue,
    Hca,
    MemoryRegion,
    RcQp,
    RecvWr,
    SendWr,
    Sge,
    WorkCompletion,
    WrOpcode,
)
from ibemu.testing.loopback import Loopback, SimClock
from ibemu.wire import fast

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


@dataclass
class Pair:
    clock: SimClock
    a: Hca
    b: Hca
    link: Loopback
    cqa: CompletionQueue
    cqb: CompletionQueue
    qa: RcQp
    qb: RcQp
    src: MemoryRegion  # on a, random contents
    sink: MemoryRegion  # on a, zeros (READ destination)
    dst: MemoryRegion  # on b, zeros, remotely writable/readable
    rbuf: MemoryRegion  # on b, receive buffers
    wcs_a: list[WorkCompletion] = field(default_factory=list)
    wcs_b: list[WorkCompletion] = field(default_factory=list)

    def post(self, wrs: SendWr | list[SendWr]) -> None:
        self.link.send(self.a, self.qa.post_send(wrs))

    def run(self, **kw: Any) -> None:
        self.link.run(**kw)
        self.wcs_a += self.cqa.poll(1 << 20)
        self.wcs_b += self.cqb.poll(1 << 20)

    def write(self, wr_id: int, off: int, n: int, doff: int = 0, *, imm: int | None = None,
              signaled: bool = True) -> SendWr:
        op = WrOpcode.RDMA_WRITE if imm is None else WrOpcode.RDMA_WRITE_WITH_IMM
        return SendWr(wr_id, op, [Sge(self.src.addr + off, n, self.src.lkey)],
                      remote_addr=self.dst.addr + doff, rkey=self.dst.rkey, imm=imm, signaled=signaled)

    def read(self, wr_id: int, off: int, n: int, soff: int = 0) -> SendWr:
        return SendWr(wr_id, WrOpcode.RDMA_READ, [Sge(self.sink.addr + soff, n, self.sink.lkey)],
                      remote_addr=self.dst.addr + off, rkey=self.dst.rkey)

    def send(self, wr_id: int, off: int, n: int, *, imm: int | None = None, signaled: bool = True) -> SendWr:
        op = WrOpcode.SEND if imm is None else WrOpcode.SEND_WITH_IMM
        return SendWr(wr_id, op, [Sge(self.src.addr + off, n, self.src.lkey)], imm=imm, signaled=signaled)

    def recv(self, wr_id: int, off: int, n: int) -> None:
        self.qb.post_recv(RecvWr(wr_id, [Sge(self.rbuf.addr + off, n, self.rbuf.lkey)]))


def make_pair(*, mtu: int = 4096, size: int = 1 << 18, psn_a: int = 0, psn_b: int = 0,
              seed: int = 0, latency_ns: int = 1000, loss: float = 0.0, dup: float = 0.0,
              reorder: float = 0.0, corrupt: float = 0.0, **attrs: Any) -> Pair:
    clock = SimClock()
    a = Hca(lid=1, mtu=mtu, clock=clock, seed=seed)
    b = Hca(lid=2, mtu=mtu, clock=clock, seed=seed + 1)
    link = Loopback(a, b, clock, latency_ns=latency_ns, loss=loss, dup=dup, reorder=reorder,
                    corrupt=corrupt, seed=seed, trace=[])
    cqa, cqb = a.create_cq(), b.create_cq()
    qa = a.create_rc_qp(cqa, psn=psn_a)
    qb = b.create_rc_qp(cqb, psn=psn_b)
    attrs.setdefault("timeout", 8)  # ~1 ms
    qa.connect(qb.info(), **attrs)
    qb.connect(qa.info(), **attrs)
    src = a.reg_mr(bytearray(os.urandom(size)), Access.LOCAL_WRITE)
    sink = a.reg_mr(bytearray(size), Access.LOCAL_WRITE)
    dst = b.reg_mr(bytearray(size), RW)
    rbuf = b.reg_mr(bytearray(size), Access.LOCAL_WRITE)
    return Pair(clock, a, b, link, cqa, cqb, qa, qb, src, sink, dst, rbuf)


def sent_by(pair: Pair, hca: Hca) -> list[fast.Peek]:
    """Headers of every packet ``hca`` put on the cable, in order."""
    assert pair.link.trace is not None
    return [fast.peek(p) for _t, h, p in pair.link.trace if h is hca]


def padcnt(pkt: bytes) -> int:
    return (pkt[9] >> 4) & 3
