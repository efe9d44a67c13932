"""Collectives across many hosts: ring and tree allreduce, all-to-all (and incast/permutation as bw sets).

Every rank is a host port of this process; data moves as RDMA WRITE with immediate into the
receiver's staging area, and the immediate's receive completion tells the receiver which step
arrived, as NCCL's IB transport does with its own flags. The data are float32 vectors whose
sums are exact, and every rank's result is checked element by element (``wrong``).

Figures as nccl-tests prints them: ``time`` per iteration, ``algbw`` = size / time,
``busbw`` = algbw x 2(n-1)/n for allreduce and x (n-1)/n for all-to-all.

**Tree allreduce** (``algorithm="tree"``): a double binary tree as NCCL builds one between
nodes (``double_tree``, pure). Tree 0 is the in-order binary tree over ranks 0..n-1 (rank r's
parent clears r's lowest set bit and sets the next one, or only clears it when that is beyond
n - 1; rank 0 is the root, with one child); tree 1 is tree 0 mirrored (r -> n-1-r) for even n
and shifted by one (r -> r+1 mod n) for odd n, so that every rank has at most two children over
both trees (a leaf in one of them, but for rank 0 with one child in each when n is odd). Each tree reduces and broadcasts one half of the vector, cut into
``tree_chunk`` byte pieces that follow each other up and down the tree (a pipeline): a rank
adds its children's piece to its own and writes the sum to its parent; the root's sums go back
down, every rank copying its parent's piece and writing it on to its children. Per rank and
tree the reduce and the broadcast run as two tasks, so a piece goes down while later ones
still go up. Each node sends and receives 2 S bytes in all (half up and down the tree it is a
leaf of, a half up and two down the other), where a ring moves 2(n-1)/n S: the tree trades
bandwidth for 2 log2(n) steps of latency instead of 2(n-1). The construction is the one NCCL
describes (``ncclGetBtree``/``ncclGetDtree``, ``src/graph/trees.cc``), written here from that
description.

numpy is imported by the functions that use it: the scenario loader reads the traffic-kind
registry (``ibemu.traffic.flows``), and ``ibemu validate`` need not load numpy for that.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    import numpy as np

from ibemu import clock
from ibemu.hca.nic import HcaPort
from ibemu.hca.transport import (
    Access,
    CompletionQueue,
    MemoryRegion,
    PathRecord,
    QpInfo,
    RcQp,
    RecvWr,
    SendWr,
    Sge,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from ibemu.hca.transport.timers import ack_timeout_ns
from ibemu.traffic.perftest import TransportError

COLLECTIVES = ("allreduce", "alltoall")
ALLREDUCE_ALGORITHMS = ("ring", "tree")
TREE_CHUNK = 64 * 1024
"""Bytes of a tree allreduce's pipeline piece (the last of a half may be shorter)."""


@dataclass
class CollectiveResult:
    kind: str
    ranks: int
    size: int
    """Bytes per rank."""
    iterations: int
    seconds: list[float]
    """Each timed iteration."""
    wrong: int
    retransmitted: int

    @property
    def time_us(self) -> float:
        return sum(self.seconds) / len(self.seconds) * 1e6 if self.seconds else 0.0

    @property
    def algbw_gbs(self) -> float:
        t = self.time_us / 1e6
        return self.size / t / 1e9 if t else 0.0

    @property
    def busbw_gbs(self) -> float:
        n = self.ranks
        factor = 2 * (n - 1) / n if self.kind == "allreduce" else (n - 1) / n
        return self.algbw_gbs * factor


def nccl_header() -> str:
    return ("#       size         count    type   redop     time   algbw   busbw  #wrong\n"
            "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)")


def nccl_line(r: CollectiveResult) -> str:
    redop = "sum" if r.kind == "allreduce" else "none"
    return (f"{r.size:12d}  {r.size // 4:12d}   float  {redop:>6}  {r.time_us:9.1f}  "
            f"{r.algbw_gbs:6.3f}  {r.busbw_gbs:6.3f}  {r.wrong:6d}")


def nccl_footer(r: CollectiveResult) -> str:
    """nccl-tests' footer lines that scripts grep."""
    return (f"# Out of bounds values : {r.wrong} {'FAILED' if r.wrong else 'OK'}\n"
            f"# Avg bus bandwidth    : {r.busbw_gbs:g} \n#")


def nccl_json(r: CollectiveResult, *, args: list[str], start_time: str, end_time: str) -> dict[str, Any]:
    """``r`` as nccl-tests' ``-J``/``--output_file FILE.json`` writes it (its keys: ``config``,
    ``results`` with ``out_of_place`` ``time`` (us), ``alg_bw``/``bus_bw`` (GB/s),
    ``nwrong``; ``out_of_bounds``; ``average_bus_bandwidth``). One rank per host, one size."""
    redop = "sum" if r.kind == "allreduce" else "none"
    return {
        "version": 1, "start_time": start_time, "args": args,
        "config": {"nthreads": 1, "ngpus": 1, "ranks": r.ranks, "minimum_bytes": r.size, "maximum_bytes": r.size,
                   "iterations": r.iterations, "validation": 1},
        "results": [{"size": r.size, "count": r.size // 4, "type": "float", "redop": redop, "root": -1,
                     "out_of_place": {"time": round(r.time_us, 3), "alg_bw": round(r.algbw_gbs, 6),
                                      "bus_bw": round(r.busbw_gbs, 6), "nwrong": r.wrong},
                     "in_place": None, "actual_iterations": r.iterations, "experiment_name": r.kind}],
        "out_of_bounds": {"count": r.wrong, "okay": r.wrong == 0},
        "average_bus_bandwidth": {"bandwidth": round(r.busbw_gbs, 6), "okay": "unchecked"},
        "end_time": end_time,
    }


@dataclass(frozen=True, slots=True)
class RcTimers:
    """A job's RC QP timers (IBA 9.7.6.1.3, C9-140): the local ACK timeout, 4.096 us x
    2^``timeout`` (14: 67 ms; NCCL's default ``NCCL_IB_TIMEOUT`` is 20, 4.3 s), and how many
    times a request is retried before the QP gives up (``retry_cnt``, 0..7)."""

    timeout: int = 14
    retry_cnt: int = 7

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> RcTimers:
        """From a flow's spec (``rc_timeout``, ``rc_retry_cnt``; the defaults where absent)."""
        default = cls()
        return cls(int(spec.get("rc_timeout", default.timeout)), int(spec.get("rc_retry_cnt", default.retry_cnt)))


class _Rank:
    """One rank: its port, CQ, vector and staging memory, and QPs to the ranks it talks to."""

    def __init__(self, index: int, port: HcaPort, size: int, staging_bytes: int) -> None:
        self.index = index
        self.port = port
        hca = port.hca
        self.cq: CompletionQueue = hca.create_cq()
        acc = Access.LOCAL_WRITE | Access.REMOTE_WRITE
        self.data: MemoryRegion = hca.reg_mr(bytearray(size), acc)
        self.stage: MemoryRegion = hca.reg_mr(bytearray(staging_bytes), acc)
        self.out: MemoryRegion = hca.reg_mr(bytearray(staging_bytes), Access.LOCAL_WRITE)
        self.tx: dict[int, RcQp] = {}
        self.rx: dict[int, RcQp] = {}
        self.arrived: dict[int, int] = {}  # immediate -> count
        self.sends_done = 0
        self.waiting: int | None = None  # the immediate it waits for (a stall's report says)
        self.completions = 0  # work completions reaped: its progress, for a stall's watch

    def vector(self) -> np.ndarray:
        import numpy as np
        return np.frombuffer(self.data.buf, dtype=np.float32)

    def staged(self, offset: int, count: int) -> np.ndarray:
        import numpy as np
        return np.frombuffer(self.stage.buf, dtype=np.float32, count=count, offset=offset)

    def reap(self) -> None:
        wcs = self.cq.poll(1 << 16)
        self.completions += len(wcs)
        for wc in wcs:
            if wc.status is not WcStatus.SUCCESS:
                raise TransportError(f"rank {self.index}: {wc.opcode.name} completed with {wc.status.name}")
            if wc.opcode >= WcOpcode.RECV:
                imm = wc.imm or 0
                self.arrived[imm] = self.arrived.get(imm, 0) + 1
                qp = next((q for q in self.rx.values() if q.qpn == wc.qpn), None)
                if qp is not None:
                    qp.post_recv(RecvWr(0, ()))
            else:
                self.sends_done += 1

    async def wait_imm(self, imm: int, count: int = 1) -> None:
        self.waiting = imm
        while True:
            self.reap()
            if self.arrived.get(imm, 0) >= count:
                self.arrived[imm] -= count
                self.waiting = None
                return
            await self.port.wait_progress()

    def describe(self) -> str:
        """Where this rank is: the immediate it waits for, its QPs' send queues."""
        wait = "not waiting" if self.waiting is None else f"waits for step {self.waiting & 0xFFFF:#x}"
        qps = "; ".join(f"to rank {peer}: QP {qp.qpn:#x} {qp.state.name}, {len(qp.req.outstanding)} sent "
                        f"unacknowledged, {len(qp.req.pending)} queued, retries left {qp.req.retry_left}"
                        for peer, qp in sorted(self.tx.items()))
        return f"rank {self.index} (LID {self.port.hca.lid:#x}) {wait}; {qps or 'no send QP'}"

    def write(self, peer: int, src_off: int, length: int, raddr: int, rkey: int, imm: int) -> None:
        self.port.post(self.tx[peer], SendWr(imm, WrOpcode.RDMA_WRITE_WITH_IMM,
                                             [Sge(self.out.addr + src_off, length, self.out.lkey)],
                                             remote_addr=raddr, rkey=rkey, imm=imm))


def _connect(a: _Rank, b: _Rank, mtu: int, rc: RcTimers) -> None:
    """An RC QP from ``a`` to ``b`` (a's tx, b's rx), with receives posted for immediates."""
    qa = a.port.hca.create_rc_qp(a.cq)
    qb = b.port.hca.create_rc_qp(b.cq)
    qa.connect(QpInfo(qb.qpn, qb.sq_psn, b.port.hca.lid), PathRecord(b.port.hca.lid, mtu=mtu),
               max_inflight=256, timeout=rc.timeout, retry_cnt=rc.retry_cnt)
    qb.connect(QpInfo(qa.qpn, qa.sq_psn, a.port.hca.lid), PathRecord(a.port.hca.lid, mtu=mtu),
               max_inflight=256, timeout=rc.timeout, retry_cnt=rc.retry_cnt)
    for _ in range(256):
        qb.post_recv(RecvWr(0, ()))
    a.tx[b.index], b.rx[a.index] = qa, qb


def _fill(ranks: list[_Rank], count: int) -> np.ndarray:
    """Each rank's input (small integers: float32 sums stay exact); returns the expected sum."""
    import numpy as np
    base = (np.arange(count, dtype=np.int64) % 7).astype(np.float32)
    for r in ranks:
        r.vector()[:] = base + r.index
    n = len(ranks)
    return base * n + n * (n - 1) / 2


def _chunk_slot(count: int, n: int) -> int:
    """Elements of the largest of the ``n`` chunks a ring allreduce cuts ``count`` into."""
    return -(-count // n)


async def _ring_allreduce(r: _Rank, ranks: list[_Rank], count: int, it: int) -> None:
    import numpy as np
    n = len(ranks)
    nxt = ranks[(r.index + 1) % n]
    bounds = [count * k // n for k in range(n + 1)]
    vec = r.vector()
    out = np.frombuffer(r.out.buf, dtype=np.float32)
    slot = _chunk_slot(count, n)
    for step in range(2 * (n - 1)):
        gather = step >= n - 1
        s = step - (n - 1) if gather else step
        send_chunk = (r.index - s + (1 if gather else 0)) % n
        lo, hi = bounds[send_chunk], bounds[send_chunk + 1]
        # Copy into this step's own send slot: a retransmission must resend the same bytes.
        base = step * slot
        out[base : base + hi - lo] = vec[lo:hi]
        imm = (it << 16) | step
        r.write(nxt.index, base * 4, (hi - lo) * 4, nxt.stage.addr + base * 4, nxt.stage.rkey, imm)
        await r.wait_imm(imm)
        recv_chunk = (r.index - s - (0 if gather else 1)) % n
        lo, hi = bounds[recv_chunk], bounds[recv_chunk + 1]
        incoming = r.staged(base * 4, hi - lo)
        if gather:
            vec[lo:hi] = incoming
        else:
            vec[lo:hi] += incoming


@dataclass(frozen=True, slots=True)
class Tree:
    """One binary tree over ranks 0..n-1: each rank's parent (-1: the root) and children (at
    most two, ascending)."""

    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, parent: Sequence[int]) -> Tree:
        kids: list[list[int]] = [[] for _ in parent]
        for r, p in enumerate(parent):
            if p >= 0:
                kids[p].append(r)
        return cls(tuple(parent), tuple(tuple(sorted(k)) for k in kids))

    @property
    def root(self) -> int:
        return self.parent.index(-1)

    def slot(self, rank: int) -> int:
        """``rank``'s place among its parent's children (0 or 1)."""
        return self.children[self.parent[rank]].index(rank)

    def depth(self) -> int:
        """Edges on the longest path from a leaf to the root."""
        def up(r: int) -> int:
            d = 0
            while self.parent[r] >= 0:
                r, d = self.parent[r], d + 1
            return d
        return max(up(r) for r in range(len(self.parent)))


def binary_tree(n: int) -> Tree:
    """The in-order binary tree over ranks 0..n-1 (module docstring): rank r > 0's parent sets
    the bit above r's lowest set bit and clears that bit (only clears it when the result is
    beyond n - 1); rank 0 is the root."""
    if n < 1:
        raise ValueError(f"a tree needs at least one rank, got {n}")
    parent = [-1] * n
    for r in range(1, n):
        low = r & -r
        up = (r ^ low) | (low << 1)
        parent[r] = up if up < n else r ^ low
    return Tree.of(parent)


def double_tree(n: int) -> tuple[Tree, Tree]:
    """NCCL's double binary tree over ``n`` ranks: ``binary_tree(n)`` and its mirror (even n) or
    its shift by one rank (odd n); no rank has more than two children over both."""
    t0 = binary_tree(n)
    if n % 2 == 0:
        p1 = [-1 if t0.parent[n - 1 - r] < 0 else n - 1 - t0.parent[n - 1 - r] for r in range(n)]
    else:
        p1 = [-1 if t0.parent[(r - 1) % n] < 0 else (t0.parent[(r - 1) % n] + 1) % n for r in range(n)]
    return t0, Tree.of(p1)


TREE_MAX_PIECES = 48
"""At most this many pieces a half (the chunk grows beyond ``TREE_CHUNK`` for larger vectors):
a sender runs ahead of its receiver by up to a half's pieces, two trees each way on one QP,
within the 256 receives each QP keeps posted."""


def tree_pieces(count: int, chunk_bytes: int = TREE_CHUNK) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Each tree's pieces of a ``count``-element float32 vector, as [lo, hi) element ranges:
    tree 0 the first half, tree 1 the second."""
    halves = ((0, count // 2), (count // 2, count))
    out: list[list[tuple[int, int]]] = []
    for lo, hi in halves:
        size = hi - lo
        step = max(1, chunk_bytes // 4, -(-size // TREE_MAX_PIECES))
        out.append([(a, min(a + step, hi)) for a in range(lo, hi, step)] or [(lo, hi)])
    return out[0], out[1]


def _tree_imm(it: int, phase: int, slot: int, tree: int, piece: int) -> int:
    """A tree write's immediate: iteration, phase (0 up, 1 down), the child's slot at its parent,
    the tree and the piece."""
    return (it << 16) | (phase << 15) | (slot << 14) | (tree << 13) | piece


def _send_down(r: _Rank, ranks: list[_Rank], count: int, t: int, tree: Tree, piece: int, lo: int, hi: int,
               it: int) -> None:
    """The reduced piece [lo, hi) to ``r``'s children in ``tree`` (their staging's third part)."""
    import numpy as np
    kids = tree.children[r.index]
    if not kids:
        return
    out = np.frombuffer(r.out.buf, dtype=np.float32)
    out[count + lo : count + hi] = r.vector()[lo:hi]
    for c in kids:
        peer = ranks[c]
        r.write(c, (count + lo) * 4, (hi - lo) * 4, peer.stage.addr + (2 * count + lo) * 4, peer.stage.rkey,
                _tree_imm(it, 1, 0, t, piece))


async def _tree_reduce(r: _Rank, ranks: list[_Rank], count: int, it: int, t: int, tree: Tree,
                       pieces: list[tuple[int, int]]) -> None:
    """Up ``tree``: each piece's children's sums added to ours, then written to the parent (the
    root sends the piece down instead)."""
    import numpy as np
    vec = r.vector()
    out = np.frombuffer(r.out.buf, dtype=np.float32)
    parent, kids = tree.parent[r.index], tree.children[r.index]
    slot = tree.slot(r.index) if parent >= 0 else 0
    for p, (lo, hi) in enumerate(pieces):
        for j in range(len(kids)):
            await r.wait_imm(_tree_imm(it, 0, j, t, p))
            vec[lo:hi] += r.staged((j * count + lo) * 4, hi - lo)
        if parent < 0:
            _send_down(r, ranks, count, t, tree, p, lo, hi, it)
            continue
        out[lo:hi] = vec[lo:hi]
        peer = ranks[parent]
        r.write(parent, lo * 4, (hi - lo) * 4, peer.stage.addr + (slot * count + lo) * 4, peer.stage.rkey,
                _tree_imm(it, 0, slot, t, p))


async def _tree_bcast(r: _Rank, ranks: list[_Rank], count: int, it: int, t: int, tree: Tree,
                      pieces: list[tuple[int, int]]) -> None:
    """Down ``tree`` (not the root): each piece from the parent into the vector and on to the
    children. The parent's piece p comes after ours went up, so it never overtakes our reduce."""
    vec = r.vector()
    for p, (lo, hi) in enumerate(pieces):
        await r.wait_imm(_tree_imm(it, 1, 0, t, p))
        vec[lo:hi] = r.staged((2 * count + lo) * 4, hi - lo)
        _send_down(r, ranks, count, t, tree, p, lo, hi, it)


async def _tree_allreduce(r: _Rank, ranks: list[_Rank], count: int, it: int, trees: tuple[Tree, Tree],
                          pieces: tuple[list[tuple[int, int]], list[tuple[int, int]]]) -> None:
    async with trio.open_nursery() as nursery:
        for t, tree in enumerate(trees):
            nursery.start_soon(_tree_reduce, r, ranks, count, it, t, tree, pieces[t])
            if tree.parent[r.index] >= 0:
                nursery.start_soon(_tree_bcast, r, ranks, count, it, t, tree, pieces[t])


async def _alltoall(r: _Rank, ranks: list[_Rank], count: int, it: int) -> None:
    import numpy as np
    n = len(ranks)
    chunk = count // n
    vec = r.vector()
    out = np.frombuffer(r.out.buf, dtype=np.float32)
    imm = it << 16
    for peer in ranks:
        if peer is r:
            continue
        src = peer.index * chunk
        out[src : src + chunk] = vec[src : src + chunk]
        dst_off = r.index * chunk * 4
        r.write(peer.index, src * 4, chunk * 4, peer.stage.addr + dst_off, peer.stage.rkey, imm)
    await r.wait_imm(imm, n - 1)


class CollectiveStalled(TransportError):
    """A collective under way when its flow was told to stop did not finish in the time an RC
    QP of it takes to give up: no rank errs and none advances. The message says where each
    rank is."""


class RankSet:
    """Ranks joined by RC QPs, as a collective or a pipeline's stage boundary holds them: what
    ``stall_bound`` watches (``completions``, ``stall_s``, ``describe``), the retransmissions,
    and ``close()``, which destroys the QPs. A subclass sets ``kind``, ``rc`` and ``ranks``, and
    counts the elements it found wrong in ``wrong``."""

    kind: str
    rc: RcTimers
    ranks: list[_Rank]
    wrong: int

    @property
    def retransmitted(self) -> int:
        return sum(q.stats.retransmitted for r in self.ranks for q in r.tx.values())

    @property
    def completions(self) -> int:
        return sum(r.completions for r in self.ranks)

    @property
    def stall_s(self) -> float:
        """How long a collective under way after its flow's stop may go without any rank
        completing anything (emulated s): twice the time an RC QP of the set takes to give
        up on a peer that is gone, its local ACK timeout x (retry count + 1) (IBA
        9.7.6.1.3), and at least 1 s; 5 s where the timeout is infinite (``rc_timeout: 0``)."""
        ack = ack_timeout_ns(self.rc.timeout)
        return 5.0 if ack is None else max(1.0, 2 * ack * (self.rc.retry_cnt + 1) / 1e9)

    def describe(self) -> str:
        return " | ".join(r.describe() for r in self.ranks)

    def close(self) -> None:
        for r in self.ranks:
            for qp in (*r.tx.values(), *r.rx.values()):
                r.port.hca.destroy_qp(qp)


class CollectiveGroup(RankSet):
    """The ranks of one collective over ``ports``, connected once, run as often as wanted.

    ``await group.run(it)`` is one iteration (fill, run, check): it returns its time in
    seconds on the emulated clock (the collective alone) and counts wrong elements in
    ``wrong``. ``close()`` destroys the QPs.
    """

    def __init__(self, kind: str, ports: Sequence[HcaPort], size: int, *, mtu: int = 4096,
                 algorithm: str = "ring", tree_chunk: int = TREE_CHUNK, rc: RcTimers | None = None) -> None:
        """``rc``: the QPs' local ACK timeout and retry count (default ``RcTimers()``, IBA's
        exponent 14 and 7 retries; NCCL's ``NCCL_IB_TIMEOUT``/``NCCL_IB_RETRY_CNT`` are the
        same two numbers)."""
        rc = rc or RcTimers()
        if kind not in COLLECTIVES:
            raise ValueError(f"unknown collective {kind!r}: one of {', '.join(COLLECTIVES)}")
        if algorithm not in ALLREDUCE_ALGORITHMS or (kind != "allreduce" and algorithm != "ring"):
            raise ValueError(f"unknown {kind} algorithm {algorithm!r}: one of "
                             f"{', '.join(ALLREDUCE_ALGORITHMS if kind == 'allreduce' else ('ring',))}")
        n = len(ports)
        if n < 2:
            raise ValueError("a collective needs at least 2 hosts")
        self.kind = kind
        self.algorithm = algorithm
        self.rc = rc
        self.count = max(n, size // 4 // n * n)
        self.size = self.count * 4
        self.trees = double_tree(n)
        self.pieces = tree_pieces(self.count, tree_chunk)
        # ring allreduce: one chunk-sized slot per step (2(n-1) of them, about 2x the vector in
        # all); tree: two children's pieces and the parent's, each at its element's offset (3x
        # the vector; sent from: up, down); alltoall: the vector, each peer's chunk at its own offset
        tree = kind == "allreduce" and algorithm == "tree"
        staging = (3 * self.size if tree else 2 * (n - 1) * _chunk_slot(self.count, n) * 4 if kind == "allreduce"
                   else self.size)
        self.ranks = [_Rank(i, p, self.size, staging) for i, p in enumerate(ports)]
        ranks = self.ranks
        if tree:
            pairs = {(i, j) for t in self.trees for c, p in enumerate(t.parent) if p >= 0
                     for i, j in ((c, p), (p, c))}
            for i, j in sorted(pairs):
                _connect(ranks[i], ranks[j], mtu, rc)
        elif kind == "allreduce":
            for i in range(n):
                _connect(ranks[i], ranks[(i + 1) % n], mtu, rc)
        else:
            for a in ranks:
                for b in ranks:
                    if a is not b:
                        _connect(a, b, mtu, rc)
        self.wrong = 0

    async def run(self, it: int) -> float:
        expected = _fill(self.ranks, self.count)
        t0 = clock.now_ns()
        async with trio.open_nursery() as nursery:
            for r in self.ranks:
                if self.kind == "allreduce" and self.algorithm == "tree":
                    nursery.start_soon(_tree_allreduce, r, self.ranks, self.count, it, self.trees, self.pieces)
                else:
                    nursery.start_soon(_ring_allreduce if self.kind == "allreduce" else _alltoall, r, self.ranks,
                                       self.count, it)
        seconds = (clock.now_ns() - t0) / 1e9
        self.wrong += _check(self.kind, self.ranks, self.count, expected)
        return seconds


class PipeLink(RankSet):
    """Two ports joined both ways, for a pipeline's stage boundary: ``send(0, it, slot)`` writes
    ``size`` bytes of microbatch ``slot``'s activations from ``a`` to ``b``, ``send(1, ...)`` its
    gradients back from ``b`` to ``a``, each into the receiver's own slot (``slots`` of them: a
    step's microbatches are all in flight at once without overwriting each other); ``await
    recv(direction, it, slot)`` waits for it at the receiver and checks every element
    (``wrong``). The sender does not wait: a stage computes on while its transfer goes out, as
    Megatron-LM's non-blocking sends do."""

    kind = "pipeline transfer"

    def __init__(self, a: HcaPort, b: HcaPort, size: int, slots: int, *, mtu: int = 4096,
                 rc: RcTimers | None = None) -> None:
        self.rc = rc or RcTimers()
        self.count = max(1, size // 4)
        self.size = self.count * 4
        self.slots = slots
        self.ranks = [_Rank(i, p, 4, self.size * slots) for i, p in enumerate((a, b))]
        _connect(self.ranks[0], self.ranks[1], mtu, self.rc)
        _connect(self.ranks[1], self.ranks[0], mtu, self.rc)
        self.wrong = 0

    def _pattern(self, direction: int, it: int, slot: int) -> np.ndarray:
        """Small integers (exact in float32), different per step, microbatch and direction."""
        import numpy as np
        base = (np.arange(self.count, dtype=np.int64) % 251).astype(np.float32)
        return base + float((it * 7 + slot * 3 + direction) % 4099)

    @staticmethod
    def _imm(direction: int, it: int, slot: int) -> int:
        return ((it & 0xFFFF) << 16) | (direction << 15) | slot

    def send(self, direction: int, it: int, slot: int) -> None:
        import numpy as np
        src, dst = (self.ranks[0], self.ranks[1]) if direction == 0 else (self.ranks[1], self.ranks[0])
        off = slot * self.size
        np.frombuffer(src.out.buf, dtype=np.float32, count=self.count, offset=off)[:] = \
            self._pattern(direction, it, slot)
        src.write(dst.index, off, self.size, dst.stage.addr + off, dst.stage.rkey, self._imm(direction, it, slot))

    async def recv(self, direction: int, it: int, slot: int) -> None:
        import numpy as np
        dst = self.ranks[1] if direction == 0 else self.ranks[0]
        await dst.wait_imm(self._imm(direction, it, slot))
        got = dst.staged(slot * self.size, self.count)
        self.wrong += int(np.count_nonzero(got != self._pattern(direction, it, slot)))

    def reap(self) -> None:
        """Collect the send completions (a stage that only sends reaps them here)."""
        for r in self.ranks:
            r.reap()


@asynccontextmanager
async def stall_bound(groups: Sequence[RankSet], stop: trio.Event | None) -> AsyncIterator[None]:
    """The body, watched once ``stop`` is set: if no rank of ``groups`` completes anything
    for their longest ``stall_s``, it is cancelled and ``CollectiveStalled`` says where each
    rank is (a QP that retries gives up sooner than that, and errs instead)."""
    if stop is None:
        yield
        return
    bound = max(g.stall_s for g in groups)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            async def _watch() -> None:
                await stop.wait()
                seen = -1
                while (now := sum(g.completions for g in groups)) != seen:
                    seen = now
                    await trio.sleep(bound)
                scope.cancel()
            nursery.start_soon(_watch)
            yield
            nursery.cancel_scope.cancel()
    if scope.cancelled_caught:
        raise CollectiveStalled(f"{groups[0].kind} stalled: no rank completed anything in {bound:.2f} s after "
                                f"the flow's stop: " + " || ".join(g.describe() for g in groups))


async def run_collective(kind: str, ports: Sequence[HcaPort], size: int, *, iterations: int = 5,
                         warmup: int = 1, mtu: int = 4096, algorithm: str = "ring",
                         rc: RcTimers | None = None, stop: trio.Event | None = None) -> CollectiveResult:
    """``kind`` ("allreduce" or "alltoall") over ``ports`` (their serve tasks running); an
    allreduce by ``algorithm`` ("ring" or "tree"); ``rc`` the QPs' timers.

    ``stop``: once set, a collective under way whose ranks complete nothing for
    ``CollectiveGroup.stall_s`` raises ``CollectiveStalled`` saying where each rank is, so
    that a flow's end is bounded (``stall_bound``)."""
    group = CollectiveGroup(kind, ports, size, mtu=mtu, algorithm=algorithm, rc=rc)
    seconds: list[float] = []
    try:
        async with stall_bound([group], stop):
            for it in range(warmup + iterations):
                t = await group.run(it)
                if it >= warmup:
                    seconds.append(t)
    finally:
        retrans = group.retransmitted
        group.close()
    return CollectiveResult(kind, len(ports), group.size, iterations, seconds, group.wrong, retrans)


def _check(kind: str, ranks: list[_Rank], count: int, expected: np.ndarray) -> int:
    """Elements that differ from the right answer, over every rank."""
    import numpy as np
    wrong = 0
    n = len(ranks)
    if kind == "allreduce":
        for r in ranks:
            wrong += int(np.count_nonzero(r.vector() != expected))
        return wrong
    chunk = count // n
    base = (np.arange(count, dtype=np.int64) % 7).astype(np.float32)
    for r in ranks:
        for src in ranks:
            if src is r:
                continue
            got = r.staged(src.index * chunk * 4, chunk)
            want = base[r.index * chunk : (r.index + 1) * chunk] + src.index
            wrong += int(np.count_nonzero(got != want))
    return wrong
