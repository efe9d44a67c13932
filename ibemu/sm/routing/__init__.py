"""Routing engines of the SM: pure functions from a SubnetGraph to LFTs, and their registry.

``ENGINES`` is the one table of routing engines (as OpenSM's routing-module table): per name,
the function that routes and what it promises (minimal hops, deadlock freedom). The SM, the
scenario loader's ``sm.engine`` check and the command line's ``--sm-engine`` read it; a new
engine is one entry (and its module).

``compute(graph, "minhop" | "updn" | "ftree" | "dor")`` returns :class:`Routes` (per switch
GUID: LID -> egress port, own LID -> 0; ``state`` keeps the hop layers for
``ibemu.sm.reroute``). An engine that cannot apply raises :class:`RoutingError`;
``compute_with_fallback`` then uses minhop, as OpenSM does. Options: ``updn`` takes
``roots=[switch GUID, ...]``; ``dor`` takes ``coords`` (per switch, in GUID order), else
uses ``SmNode.coords`` or infers them from port numbers.

Modules: ``fabric`` (indexed bitset view of the graph), ``core`` (layers, balanced
filling), one per engine, ``grid`` (mesh/torus coordinates), ``fromtopo`` (Topology ->
SubnetGraph for tests and benchmarks). ``ibemu.sm.checker`` validates the result.
``alternates`` (imported on its own: it uses the checker) computes adaptive-routing groups
for ftree and updn (``AR_ENGINES``). ``ftree_ar`` and ``updn_ar`` are in ``ENGINES`` too
(``adaptive``): ``compute`` gives their base engine's LFTs; the SM adds the alternates
(``ibemu.sm.manager.default_route_fn``) and writes them to the switches, whose kernel
datapath fails over to them when a port goes down (``ibemu.kernel.lft_map``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.routing import dor, ftree, minhop, updn
from ibemu.sm.routing.core import RoutingError, State
from ibemu.sm.routing.fabric import Fabric

log = logging.getLogger(__name__)

Route = Callable[..., tuple[list[dict[int, int]], State]]


@dataclass(frozen=True, slots=True)
class Engine:
    """One routing engine: its function and what it promises (for ``ibemu.sm.checker``)."""

    route: Route
    """``route(fabric, **opts)`` -> (per switch index: LID -> port, the engine's state)."""
    minimal: bool
    """Every path has the fewest hops."""
    deadlock_free: bool
    """Its channel dependency graph is acyclic."""
    coords: bool = False
    """It takes ``coords`` (per switch, in GUID order): from ``SmNode.coords`` unless given."""
    adaptive: bool = False
    """Its routes come with alternate ports per LID (``alternates.AR_ENGINES``: the SM
    writes them to the switches, which fail over to them locally)."""


ENGINES: dict[str, Engine] = {
    "minhop": Engine(minhop.route, minimal=True, deadlock_free=False),
    "updn": Engine(updn.route, minimal=False, deadlock_free=True),
    "ftree": Engine(ftree.route, minimal=True, deadlock_free=True),
    "dor": Engine(dor.route, minimal=True, deadlock_free=False, coords=True),  # deadlock-free on a mesh only
    # adaptive: the base engine's LFTs, plus alternates (``alternates.compute_ar``) for local failover
    "ftree_ar": Engine(ftree.route, minimal=True, deadlock_free=True, adaptive=True),
    "updn_ar": Engine(updn.route, minimal=False, deadlock_free=True, adaptive=True),
}
"""Every routing engine, by name (the order errors and ``--sm-engine`` list them in)."""

#: What each engine promises, for the checker: (minimal hops, deadlock-free).
PROMISES: dict[str, tuple[bool, bool]] = {name: (e.minimal, e.deadlock_free) for name, e in ENGINES.items()}


def compute(graph: SubnetGraph, engine: str = "minhop", **opts: Any) -> Routes:
    """Route ``graph`` with ``engine``; RoutingError when the engine cannot apply."""
    entry = ENGINES.get(engine)
    if entry is None:
        raise RoutingError(f"unknown routing engine {engine!r}; choose from {', '.join(ENGINES)}")
    t0 = time.perf_counter()
    fab = Fabric.of(graph)
    if entry.coords and "coords" not in opts:
        opts["coords"] = [graph.nodes[g].coords for g in fab.guids]
    lfts, st = entry.route(fab, **opts)
    routes = Routes(engine, {fab.guids[v]: lft for v, lft in enumerate(lfts)}, state=st)
    routes.compute_s = time.perf_counter() - t0
    log.debug("%s routed %d switches in %.1f ms", engine, fab.n, routes.compute_s * 1e3)
    return routes


def compute_with_fallback(graph: SubnetGraph, engine: str = "minhop", **opts: Any) -> Routes:
    """``compute``, falling back to minhop (logged) when ``engine`` cannot apply."""
    try:
        return compute(graph, engine, **opts)
    except RoutingError as e:
        if engine == "minhop":
            raise
        log.warning("%s; falling back to minhop", e)
        return compute(graph, "minhop")


__all__ = ["ENGINES", "PROMISES", "Engine", "Fabric", "RoutingError", "compute", "compute_with_fallback"]
