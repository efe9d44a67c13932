"""Effective bisection of a routed fabric: flows on fixed paths, their max-min fair rates.

Pure, on paths: a routing (the SM's LFTs, an ECMP hash) is whatever turns a flow into a
:data:`Path`, a tuple of directed links ``(node, egress port)`` from the source host's port to
the last switch's port toward the destination. Who computes it lives above this layer
(``ibemu.testing.bisection`` traces the real tables: ibemu's routing engines for IB, the RoCE
fabric manager's ECMP routes and the user datapath's hash for RoCE); here:

- :func:`trace`: a path over a :class:`~ibemu.topo.model.Topology`, asking a callback for the
  egress port at every switch (the forwarding decision is the caller's).
- Traffic patterns: :func:`random_permutation` (a seeded random derangement: every host sends
  to one other and receives from one) and :func:`shift_permutation` (host ``i`` to
  ``i + s mod n``, hosts in the order the caller gives: for ftree, its shift order).
- :func:`max_min_rates`: the flows' max-min fair rates on the links (progressive filling: every
  unfrozen flow grows at the same pace; a link that fills freezes the flows through it). This
  is the analytic expectation of a fabric whose flows each take their fair share of their
  bottleneck and no more: what a lossless fabric with per-input round robin tends to and what
  a congestion control aims at. Each flow also has its own sender's link in the path, so no
  flow exceeds the line rate.
- :func:`congestion_rates`: Hoefler's simpler figure (T. Hoefler, T. Schneider, A. Lumsdaine,
  "Multistage switches are not crossbars", Cluster 2008), each flow gets ``1 / load`` of its
  most loaded link; never above max-min (max-min hands out what congested flows leave).
- :func:`evaluate`: both, the effective bisection (mean flow rate / line rate) and the worst
  link's load.
- :func:`simulate`: the same flows on the same paths through the model's packet-level
  reference simulator (:mod:`ibemu.physics.sim`), per-flow rates measured over a window after
  a warm-up, as a fraction of what one flow alone gets (the line rate less framing). The
  simulator's IB fabric has credits and head-of-line blocking, which max-min fairness has not:
  where a flow's frames wait for a congested port in an input buffer another flow shares, the
  simulator may give that other flow less than its max-min share (the gap is the parking-lot
  effect; contention-free patterns match exactly). Its egress arbiter is also fair among
  *input ports*, not flows: two flows from one input port share the slot a lone flow from
  another gets. Measured (``benchmarks/bench_bisection.py``): k=4 fat-tree permutations match
  per flow within 0.3 points; k=8 random permutations match on the mean within ~1.5 points,
  single flows differ by up to ~40.

Adaptive routing (``simulate(..., groups=...)``): a switch takes each frame, when it reaches
it, by the least-loaded port of the group of the frame's destination (``groups(switch,
destination)``: the LFT's port first, then the alternates ibemu's SM computes, ``ftree_ar``),
the load as the live datapath's adaptive routing reads it (``physics.live.egress_load``:
bytes queued, on the wire and in the pipeline for the port, and credits in use at the next
switch), ties broken round robin (a pointer per switch); per packet, or per flowlet (``flowlet_gap_ns``: a flow keeps
its port while its frames follow each other within the gap). The same choice as
``Forwarder.adapt`` on the live datapath. Reordering is counted per flow (``SimResult.reordered``).

Deviation: every link of a fat-tree has one rate here (``capacity`` may say otherwise per
link); a flow is a saturating sender (infinite demand), as in the published figures.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from ibemu.physics.link import SwitchModel, default_switch_model
from ibemu.physics.live import egress_load
from ibemu.physics.model import EthConfig, Frame, Kind
from ibemu.physics.plan import build_nodes
from ibemu.physics.sim import Flow, Simulator
from ibemu.topo.model import Topology

Link = tuple[str, int]
"""One direction of a cable: the node it leaves and the port it leaves by."""
Path = tuple[Link, ...]

EPS = 1e-12


class RoutingLoop(ValueError):
    """A traced path did not reach its destination (a loop or a dead end in the tables)."""


def trace(topo: Topology, src: str, dst: str, egress: Callable[[str], int], *,
          src_port: int = 1, max_hops: int = 64) -> Path:
    """The path from host ``src`` (leaving by ``src_port``) to host ``dst``: at every switch
    ``egress(switch)`` names the port the flow leaves by."""
    hops: list[Link] = [(src, src_port)]
    at = topo.peer(src, src_port)
    while at is not None and at.node != dst:
        if len(hops) > max_hops or not topo.nodes[at.node].is_switch:
            raise RoutingLoop(f"{src} -> {dst}: lost at {at.node} after {len(hops)} hops")
        port = egress(at.node)
        hops.append((at.node, port))
        at = topo.peer(at.node, port)
    if at is None:
        raise RoutingLoop(f"{src} -> {dst}: dead end after {hops[-1]}")
    return tuple(hops)


# --- traffic patterns ---------------------------------------------------------------------


def random_permutation(n: int, seed: int) -> list[int]:
    """A random derangement of ``range(n)`` (``perm[i]`` is where host ``i`` sends; nobody sends
    to itself), seeded; uniform over derangements (shuffles drawn until one has no fixed
    point: ~e tries)."""
    if n < 2:
        raise ValueError("a permutation without fixed points needs two hosts")
    rng = random.Random(seed)
    perm = list(range(n))
    while True:
        rng.shuffle(perm)
        if all(p != i for i, p in enumerate(perm)):
            return perm


def shift_permutation(n: int, shift: int) -> list[int]:
    """Host ``i`` sends to host ``(i + shift) mod n``."""
    if shift % n == 0:
        raise ValueError(f"a shift by {shift} of {n} hosts sends every host to itself")
    return [(i + shift) % n for i in range(n)]


# --- rates --------------------------------------------------------------------------------


def link_loads(paths: Sequence[Sequence[Hashable]]) -> dict[Hashable, int]:
    """How many flows cross each link."""
    loads: dict[Hashable, int] = {}
    for path in paths:
        for link in path:
            loads[link] = loads.get(link, 0) + 1
    return loads


def _cap(capacity: float | Mapping[Hashable, float], link: Hashable) -> float:
    return capacity if isinstance(capacity, int | float) else capacity[link]


def max_min_rates(paths: Sequence[Sequence[Hashable]],
                  capacity: float | Mapping[Hashable, float] = 1.0) -> list[float]:
    """Max-min fair rate of every flow (progressive filling, see the module docstring).

    ``capacity``: one figure for every link or one per link. A flow crossing a link twice
    counts twice on it; a flow with an empty path has no bottleneck and gets ``inf``.
    """
    n = len(paths)
    rates = [0.0] * n
    through: dict[Hashable, list[int]] = {}
    for f, path in enumerate(paths):
        for link in path:
            through.setdefault(link, []).append(f)
    left = {link: float(_cap(capacity, link)) for link in through}
    active_on = {link: len(fs) for link, fs in through.items()}
    active = [bool(p) for p in paths]
    for f in range(n):
        if not paths[f]:
            rates[f] = float("inf")
    remaining = sum(active)
    while remaining:
        share = min(left[lk] / c for lk, c in active_on.items() if c)
        for f in range(n):
            if active[f]:
                rates[f] += share
        full: list[Hashable] = []
        for lk, c in active_on.items():
            if c:
                left[lk] -= share * c
                if left[lk] <= EPS * max(1.0, _cap(capacity, lk)):
                    full.append(lk)
        for lk in full:
            for f in through[lk]:
                if active[f]:
                    active[f] = False
                    remaining -= 1
                    for other in paths[f]:
                        active_on[other] -= 1
    return rates


def congestion_rates(paths: Sequence[Sequence[Hashable]],
                     capacity: float | Mapping[Hashable, float] = 1.0) -> list[float]:
    """Each flow's share of its most loaded link: ``min over its links of capacity / load``."""
    loads = link_loads(paths)
    return [min((_cap(capacity, lk) / loads[lk] for lk in p), default=float("inf")) for p in paths]


@dataclass(frozen=True, slots=True)
class Bisection:
    """One pattern on one routing: rates as fractions of the line rate."""

    rates: list[float]
    """Max-min fair rate of every flow."""
    congestion: list[float]
    """Every flow's 1 / (load of its most loaded link)."""
    max_load: int
    """Flows on the most loaded link."""

    @property
    def effective(self) -> float:
        """Effective bisection: the mean max-min flow rate over the line rate."""
        return statistics.fmean(self.rates)

    @property
    def effective_congestion(self) -> float:
        return statistics.fmean(self.congestion)

    @property
    def contention_free(self) -> bool:
        return self.max_load <= 1


def evaluate(paths: Sequence[Path], line: float = 1.0) -> Bisection:
    """Max-min and congestion rates of ``paths`` on links of rate ``line``, as fractions of it."""
    loads = link_loads(paths)
    return Bisection([r / line for r in max_min_rates(paths, line)],
                     [r / line for r in congestion_rates(paths, line)],
                     max(loads.values(), default=0))


# --- the packet-level cross-check ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimResult:
    rates: list[float]
    """Each flow's frame bytes delivered in the window over what one flow alone delivers."""
    events: int
    drops: int
    reordered: list[int] = dataclasses.field(default_factory=list)
    """Per flow, frames delivered after a later one of the same flow (whole run)."""
    delivered: list[int] = dataclasses.field(default_factory=list)
    """Per flow, frames delivered (whole run)."""
    ports_used: dict[tuple[str, Hashable], set[int]] = dataclasses.field(default_factory=dict)
    """Adaptive routing: (switch, destination) -> the ports frames took."""


Groups = Callable[[str, Hashable], Sequence[int]]
"""(switch, destination host) -> its ports for it, the LFT's first (adaptive routing)."""


def simulate(topo: Topology, flows: Sequence[tuple[str, str, Path]], *, kind: Kind = "ib",
             switch: SwitchModel | None = None, eth: EthConfig | None = None, size: int = 4122,
             warmup_ns: int = 50_000, window_ns: int = 200_000, backlog: int = 8,
             seed: int = 0, groups: Groups | None = None, flowlet_gap_ns: int | None = None) -> SimResult:
    """``flows`` (source host, destination host, path) as saturating senders of ``size``-byte
    frames through the model (:func:`ibemu.physics.plan.build_nodes` on ``topo``), every switch
    forwarding a flow's frames by its path (a per-flow static route: what the LFTs or the ECMP
    hash decided), or with ``groups`` by adaptive routing (module docstring; per packet, or
    per flowlet with ``flowlet_gap_ns``). Rates are measured from ``warmup_ns`` for ``window_ns``."""
    if switch is None:
        switch = default_switch_model(topo.defaults.rate, ethernet=kind == "eth")
        if kind == "ib":  # room for a few frames in flight per VL whatever the frame size
            switch = dataclasses.replace(switch, buffer_bytes=max(switch.buffer_bytes, 8 * size))
    nodes = build_nodes(topo, kind=kind, switch=switch, eth=eth)
    table: dict[str, dict[str, int]] = {}
    for i, (_s, _d, path) in enumerate(flows):
        table[str(i)] = dict(path[1:])

    used: dict[tuple[str, Hashable], set[int]] = {}
    flowlets: dict[tuple[str, str], tuple[int, int]] = {}
    turns: dict[str, int] = {}

    def route(sw: str, frame: Frame) -> int:
        fl = frame.flow
        assert isinstance(fl, Flow)
        if groups is None:
            return table[fl.name][sw]
        node = nodes[sw]
        now = sim.now
        if flowlet_gap_ns is not None:
            last = flowlets.get((sw, fl.name))
            if last is not None and now - last[1] <= flowlet_gap_ns:
                flowlets[(sw, fl.name)] = (last[0], now)
                return last[0]
        best, best_load = 0, -1
        group = tuple(groups(sw, fl.dst))
        turn = turns.get(sw, 0)
        turns[sw] = turn + 1
        turn %= len(group)
        for p in group[turn:] + group[:turn]:
            load = egress_load(node, p)
            if best_load < 0 or load < best_load:
                best, best_load = p, load
        if flowlet_gap_ns is not None:
            flowlets[(sw, fl.name)] = (best, now)
        used.setdefault((sw, fl.dst), set()).add(best)
        return best

    sim = Simulator(kind, route, seed=seed)
    sim.adopt(nodes)
    fls = [sim.add_flow(Flow(src, dst, size=size, backlog=backlog, name=str(i), port=path[0][1]))
           for i, (src, dst, path) in enumerate(flows)]
    sim.run(warmup_ns)
    before = [f.delivered_bytes for f in fls]
    sim.run(warmup_ns + window_ns)
    link = nodes[flows[0][0]].ports[flows[0][2][0][1]].link if flows else None
    full = size * 8 / link.frame_ns(size) if link else 1.0  # Gb/s of one flow alone
    rates = [(f.delivered_bytes - b) * 8 / window_ns / full for f, b in zip(fls, before, strict=True)]
    return SimResult(rates, sim.events, sim.drops, [f.reordered for f in fls], [f.delivered for f in fls], used)
