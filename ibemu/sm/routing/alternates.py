"""Adaptive-routing groups: per switch and destination LID, the alternate egress ports.

A switch with adaptive routing (AR) keeps, next to its LFT entry (the *primary* port), a
group of other ports it may forward a LID to when the primary is down or congested. This
module computes those groups, purely, from a SubnetGraph and the primary ``Routes`` of a
deadlock-free engine, and checks them (``ibemu.sm.checker.check_alternates``) before
offering them.

Rules for CA LIDs:

- ``ftree_ar`` (base ``ftree``): where the primary goes *up* (the destination is not below
  the switch), the alternates are the switch's other up-ports that reach the destination
  in the same number of hops (equal-cost up-ports towards the roots). Where it goes *down*,
  only other down-ports at the same distance (parallel cables; usually none in a fat-tree).
- ``updn_ar`` (base ``updn``): the other ports that keep the route legal under up*/down*
  with the ranks ``updn`` chose (never a down->up turn: a switch that reaches the
  destination by down-links alone may only go down, every other switch only up) and that
  keep the primary's up*/down* distance (a neighbour one layer closer).

Switch LIDs (both engines): the other ports one minhop layer closer to the switch (equal-cost
paths, as the engines route switch LIDs by minhop). Their traffic is management: SMPs on VL15,
which has no credits, so it takes no part in the channel dependency graph (the checker leaves
switch LIDs out of it, alternates or not; it still walks them for loops and black holes). A
switch that loses the port a switch LID goes through then moves it instead of announcing it
lost: before, every equal-cost detour was unknown to the switches, and a cut cable made the
switches above it announce the LIDs of the switches beyond it, a round of fault notices each
(``benchmarks/bench_local_failover.py``: ~50 of the ~160 notices of a k=8 edge-aggregation
cut, all in front of the notices for the hosts' LIDs).

Both rules read the engine's own hop layers (``State.updown`` and ``State.cand_mask``): the
alternates are the candidates the engine chose the primary from. Every choice stays up*
then down* and shortens the remaining distance by one, so any mix of primary and alternate
hops reaches the destination and the channel dependency graph of all of them is acyclic;
``compute_ar`` verifies it and raises RoutingError naming the cycle otherwise.

Order and bound: at most ``MAX_ALTERNATES`` ports per entry. The candidates are taken in
cyclic port order after the primary, then rotated by the rank of the LID (ascending) among
the LIDs of that switch with the same primary port and the same candidates: the first
alternates of the LIDs one port carries are spread round-robin over the other candidates, so
when a port fails its load moves evenly (local failover) rather than onto its neighbour. Deterministic: no randomness, no
dependency on dict order.

Entries whose primary is not one of the engine's candidates (a minhop fallback where the
up*/down* layers do not reach, a reroute's repair) get no alternates.

Offered in ``ENGINES`` as ``ftree_ar`` and ``updn_ar`` (``Engine.adaptive``): the SM
computes them with ``compute_ar`` and writes the alternates with the vendor attribute
AlternatePorts (``ibemu.agents.switch.ATTR_ALTERNATES``); the kernel datapath fails over to
them when a port loses carrier (``ibemu.kernel.lft_map``). minhop and dor make no
deadlock-freedom promise and get no alternates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ibemu.sm.checker import check_alternates
from ibemu.sm.graph import ArRoutes, Routes, SubnetGraph
from ibemu.sm.routing import ENGINES, compute
from ibemu.sm.routing.core import Layers, RoutingError, State, ports_of
from ibemu.sm.routing.fabric import bits

log = logging.getLogger(__name__)

MAX_ALTERNATES = 3
"""The most alternate ports per (switch, LID): real AR groups are small."""

Alternates = dict[int, dict[int, tuple[int, ...]]]
"""Switch GUID -> LID -> alternate egress ports (the primary excluded), preferred first."""


def _state(graph: SubnetGraph, routes: Routes, base: str) -> State:
    """The up*/down* layers behind ``routes``: their own, else recomputed (same roots when
    the routes' state names them; the defaults otherwise)."""
    st = routes.state
    if isinstance(st, State) and st.engine == base and st.updown is not None:
        return st
    log.debug("%s: routes carry no %s layers; recomputing them", base, base)
    opts = {"roots": st.opts["roots"]} if isinstance(st, State) and "roots" in st.opts else {}
    fresh = compute(graph, base, **opts).state
    assert isinstance(fresh, State) and fresh.updown is not None
    return fresh


def _choices(st: State, lay: Layers, cache: dict[tuple[int, int], tuple[int, ...]]) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Per switch ``v`` of ``lay``'s rings: the ports one layer closer (the engine's
    candidates), where there are at least two."""
    fab = st.fabric
    for k in range(1, len(lay.rings)):
        for v in bits(lay.rings[k]):
            mask = st.cand_mask(lay, v, k)
            ports = cache.get((v, mask))
            if ports is None:
                ports = cache[(v, mask)] = tuple(ports_of(fab, v, mask)) if mask else ()
            if len(ports) >= 2:
                yield v, ports


def updown_alternates(graph: SubnetGraph, routes: Routes, base: str) -> Alternates:
    """The alternates of ``routes`` (from the up*/down* engine ``base``): see the module."""
    st = _state(graph, routes, base)
    fab = st.fabric
    assert st.updown is not None
    # per switch: LID -> (primary, candidate ports), gathered then ordered by LID
    found: list[dict[int, tuple[int, tuple[int, ...]]]] = [{} for _ in range(fab.n)]
    cache: dict[tuple[int, int], tuple[int, ...]] = {}
    # CA LIDs: up*/down* layers; switch LIDs: their minhop layers (management on VL15, not
    # part of the channel dependency graph: see the module docstring)
    jobs = [(lay, fab.ca_lids[w]) for w, lay in enumerate(st.updown)]
    jobs += [(lay, [fab.sw_lid[w]] if fab.sw_lid[w] else []) for w, lay in enumerate(st.minhop)]
    for lay, lids in jobs:
        if lay is None or not lids:
            continue
        for v, ports in _choices(st, lay, cache):
            lft = routes.lfts.get(fab.guids[v], {})
            for lid in lids:
                p = lft.get(lid)
                if p in ports:
                    assert p is not None
                    found[v][lid] = (p, ports)
    out: Alternates = {}
    for v, entries in enumerate(found):
        if not entries:
            continue
        seen: dict[tuple[int, tuple[int, ...]], int] = {}
        table: dict[int, tuple[int, ...]] = {}
        for lid in sorted(entries):
            p, ports = entries[lid]
            j = ports.index(p)
            others = ports[j + 1:] + ports[:j]
            i = seen.get((p, ports), 0)
            seen[(p, ports)] = i + 1
            r = i % len(others)
            table[lid] = (others[r:] + others[:r])[:MAX_ALTERNATES]
        out[fab.guids[v]] = table
    return out


def ftree_alternates(graph: SubnetGraph, routes: Routes) -> Alternates:
    return updown_alternates(graph, routes, "ftree")


def updn_alternates(graph: SubnetGraph, routes: Routes) -> Alternates:
    return updown_alternates(graph, routes, "updn")


@dataclass(frozen=True, slots=True)
class ArEngine:
    """An adaptive engine: the engine that gives the primary LFTs, and the alternates rule."""

    base: str
    alternates: Callable[[SubnetGraph, Routes], Alternates]


AR_ENGINES: dict[str, ArEngine] = {
    "ftree_ar": ArEngine("ftree", ftree_alternates),
    "updn_ar": ArEngine("updn", updn_alternates),
}
"""Adaptive engines by name (in ``ENGINES`` too, with their base engine's routing)."""


def compute_ar(graph: SubnetGraph, engine: str, **opts: object) -> ArRoutes:
    """Primary routes of ``engine``'s base and their checked alternates.

    RoutingError when ``engine`` is unknown, makes no deadlock-freedom promise (minhop,
    dor), or its alternates fail ``check_alternates`` (the cycle or first errors named).
    """
    entry = AR_ENGINES.get(engine)
    if entry is None:
        base = ENGINES.get(engine)
        if base is not None and not base.deadlock_free:
            raise RoutingError(f"{engine} does not promise deadlock freedom: it offers no alternate ports")
        raise RoutingError(f"unknown adaptive routing engine {engine!r}; choose from {', '.join(AR_ENGINES)}")
    t0 = time.perf_counter()
    primary = compute(graph, entry.base, **opts)
    ar = ArRoutes(engine, primary, entry.alternates(graph, primary))
    rep = check_alternates(graph, ar)
    if not rep.ok:
        raise RoutingError(f"{engine}: alternates break the promise: {'; '.join(rep.errors[:3])}")
    ar.compute_s = time.perf_counter() - t0
    log.debug("%s: %d alternates over %d switches in %.1f ms", engine, rep.alternates,
              len(ar.alternates), ar.compute_s * 1e3)
    return ar


def refresh_ar(graph: SubnetGraph, engine: str, primary: Routes) -> ArRoutes:
    """Checked alternates of ``engine`` for routes computed otherwise (an SM's incremental
    reroute of ``engine``'s base): entries whose primary is not one of the engine's
    candidates get none. RoutingError as ``compute_ar``."""
    entry = AR_ENGINES.get(engine)
    if entry is None:
        raise RoutingError(f"unknown adaptive routing engine {engine!r}; choose from {', '.join(AR_ENGINES)}")
    t0 = time.perf_counter()
    ar = ArRoutes(engine, primary, entry.alternates(graph, primary))
    rep = check_alternates(graph, ar)
    if not rep.ok:
        raise RoutingError(f"{engine}: alternates break the promise: {'; '.join(rep.errors[:3])}")
    ar.compute_s = time.perf_counter() - t0
    return ar


__all__ = [
    "AR_ENGINES",
    "MAX_ALTERNATES",
    "Alternates",
    "ArEngine",
    "ArRoutes",
    "compute_ar",
    "ftree_alternates",
    "refresh_ar",
    "updn_alternates",
    "updown_alternates",
]
