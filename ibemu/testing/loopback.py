"""Two ``Hca``s wired back to back in memory: a deterministic clock and seeded link faults.

For tests, examples and benchmarks without a kernel::

    clock = SimClock()
    a, b = Hca(lid=1, clock=clock), Hca(lid=2, clock=clock)
    link = Loopback(a, b, clock, loss=0.01, seed=7)
    link.send(a, qp.post_send(wr))
    link.run()                     # until no packet is in flight and no timer is armed
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.hca import Hca


@dataclass(slots=True)
class SimClock:
    """A clock that moves only when told to (nanoseconds)."""

    now: int = 0

    def __call__(self) -> int:
        return self.now


@dataclass(slots=True)
class LinkStats:
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    corrupted: int = 0
    filtered: int = 0


Filter = Callable[[Hca, int, bytes], bool]
"""``filter(sender, index, packet)``: False drops the packet (``index`` counts per sender)."""


@dataclass
class Loopback:
    """A cable between ``a`` and ``b`` with latency and optional loss/dup/reorder/corruption."""

    a: Hca
    b: Hca
    clock: SimClock
    latency_ns: int = 1000
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    seed: int = 0
    filter: Filter | None = None
    stats: LinkStats = field(default_factory=LinkStats)
    trace: list[tuple[int, Hca, bytes]] | None = None  # (time, sender, packet) when a list

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._heap: list[tuple[int, int, Hca, bytes]] = []
        self._seq = 0
        self._sent = {id(self.a): 0, id(self.b): 0}

    def peer(self, hca: Hca) -> Hca:
        return self.b if hca is self.a else self.a

    def send(self, sender: Hca, actions: Iterable[Send]) -> None:
        """Put ``sender``'s packets on the cable."""
        dst = self.peer(sender)
        rng = self._rng
        for act in actions:
            pkt = act.packet
            idx = self._sent[id(sender)]
            self._sent[id(sender)] = idx + 1
            if self.trace is not None:
                self.trace.append((self.clock.now, sender, pkt))
            if self.filter is not None and not self.filter(sender, idx, pkt):
                self.stats.filtered += 1
                continue
            if self.loss and rng.random() < self.loss:
                self.stats.lost += 1
                continue
            if self.corrupt and rng.random() < self.corrupt:
                b = bytearray(pkt)
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                pkt = bytes(b)
                self.stats.corrupted += 1
            copies = 2 if self.dup and rng.random() < self.dup else 1
            self.stats.duplicated += copies - 1
            for _ in range(copies):
                t = self.clock.now + self.latency_ns
                if self.reorder and rng.random() < self.reorder:
                    t += rng.randrange(1, 8) * self.latency_ns
                    self.stats.reordered += 1
                self._seq += 1
                heapq.heappush(self._heap, (t, self._seq, dst, pkt))

    def step(self) -> bool:
        """Deliver the next packet or fire the next timer; False when nothing is left."""
        heap = self._heap
        deadlines = [(d, h) for h in (self.a, self.b) if (d := h.next_deadline()) is not None]
        t_timer, h_timer = min(deadlines, key=lambda x: x[0]) if deadlines else (None, None)
        if heap and (t_timer is None or heap[0][0] <= t_timer):
            t, _s, dst, pkt = heapq.heappop(heap)
            self.clock.now = max(self.clock.now, t)
            self.stats.delivered += 1
            self.send(dst, dst.receive(pkt))
            return True
        if t_timer is not None and h_timer is not None:
            self.clock.now = max(self.clock.now, t_timer)
            self.send(h_timer, h_timer.tick(self.clock.now))
            return True
        return False

    def run(self, max_steps: int = 1_000_000, until_ns: int | None = None) -> int:
        """Step until idle (or ``max_steps`` / ``until_ns``); returns the steps taken."""
        steps = 0
        while steps < max_steps:
            if until_ns is not None and self.clock.now >= until_ns:
                break
            if not self.step():
                break
            steps += 1
        return steps

    @property
    def in_flight(self) -> int:
        return len(self._heap)


@dataclass(slots=True)
class ExchangedPair:
    """Two HCAs after one exchange of every kind of packet, and what their link carried."""

    a: Hca
    b: Hca
    corpus: list[bytes]
    """Every packet the link carried, both ways, in order: the fuzz campaigns' seeds."""


def exchanged_pair(*, qkey: int = 0x1234) -> ExchangedPair:
    """Hca LID 1 and Hca LID 2 in memory, with an RC and a UD QP each, after a SEND, an RDMA
    WRITE of several MTUs, a WRITE with immediate, an RDMA READ (RC) and a UD SEND from 1 to
    2, their ACKs and responses. Deterministic: seeded HCAs, fixed data."""
    from ibemu.hca.transport import Access, RecvWr, SendWr, Sge, WrOpcode
    from ibemu.hca.transport.wr import AddressHandle

    clock = SimClock()
    a, b = Hca(lid=1, clock=clock, seed=1), Hca(lid=2, clock=clock, seed=2)
    link = Loopback(a, b, clock, trace=[])
    cqa, cqb = a.create_cq(), b.create_cq()
    qa, qb = a.create_rc_qp(cqa, psn=100), b.create_rc_qp(cqb, psn=200)
    qa.connect(qb.info(), timeout=8)
    qb.connect(qa.info(), timeout=8)
    ua, ub = a.create_ud_qp(cqa), b.create_ud_qp(cqb)
    ua.activate(qkey=qkey)
    ub.activate(qkey=qkey)
    rw = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
    src = a.reg_mr(bytearray(random.Random(1).randbytes(1 << 14)), rw)
    dst, rbuf = b.reg_mr(bytearray(1 << 14), rw), b.reg_mr(bytearray(1 << 14), rw)
    for k in range(8):
        qb.post_recv(RecvWr(k, [Sge(rbuf.addr + k * 1024, 1024, rbuf.lkey)]))
        ub.post_recv(RecvWr(100 + k, [Sge(rbuf.addr + k * 1024, 1024, rbuf.lkey)]))
    link.send(a, qa.post_send([
        SendWr(1, WrOpcode.SEND, [Sge(src.addr, 300, src.lkey)]),
        SendWr(2, WrOpcode.RDMA_WRITE, [Sge(src.addr, 9000, src.lkey)], remote_addr=dst.addr, rkey=dst.rkey),
        SendWr(3, WrOpcode.RDMA_WRITE_WITH_IMM, [Sge(src.addr, 64, src.lkey)], remote_addr=dst.addr,
               rkey=dst.rkey, imm=7),
        SendWr(4, WrOpcode.RDMA_READ, [Sge(src.addr, 5000, src.lkey)], remote_addr=dst.addr, rkey=dst.rkey)]))
    link.send(a, ua.post_send(SendWr(5, WrOpcode.SEND, [Sge(src.addr, 100, src.lkey)], ah=AddressHandle(2),
                                     remote_qpn=ub.qpn, remote_qkey=qkey)))
    link.run()
    return ExchangedPair(a, b, [p for _t, _h, p in link.trace or []])
