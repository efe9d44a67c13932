"""Routing engines of the SM: pure functions from a SubnetGraph to LFTs.

``compute(graph, "minhop" | "updn" | "ftree" | "dor")`` returns :class:`Routes` (per switch
GUID: LID -> egress port, own LID -> 0; ``state`` keeps the hop layers for
``ibemu.sm.reroute``). An engine that cannot apply raises :class:`RoutingError`;
``compute_with_fallback`` then uses minhop, as OpenSM does. Options: ``updn`` takes
``roots=[switch GUID, ...]``; ``dor`` takes ``coords`` (per switch, in GUID order), else
uses ``SmNode.coords`` or infers them from port numbers.

Modules: ``fabric`` (indexed bitset view of the graph), ``core`` (layers, balanced
filling), one per engine, ``grid`` (mesh/torus coordinates), ``fromtopo`` (Topology ->
SubnetGraph for tests and benchmarks). ``ibemu.sm.checker`` validates the result.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.routing import dor, ftree, minhop, updn
from ibemu.sm.routing.core import RoutingError, State
from ibemu.sm.routing.fabric import Fabric

log = logging.getLogger(__name__)

Engine = Callable[..., tuple[list[dict[int, int]], State]]

ENGINES: dict[str, Engine] = {
    "minhop": minhop.route,
    "updn": updn.route,
    "ftree": ftree.route,
    "dor": dor.route,
}

#: What each engine promises, for the checker: (minimal hops, deadlock-free).
PROMISES: dict[str, tuple[bool, bool]] = {
    "minhop": (True, False),
    "updn": (False, True),
    "ftree": (True, True),
    "dor": (True, False),  # deadlock-free on a mesh only
}


def compute(graph: SubnetGraph, engine: str = "minhop", **opts: Any) -> Routes:
    """Route ``graph`` with ``engine``; RoutingError when the engine cannot apply."""
    fn = ENGINES.get(engine)
    if fn is None:
        raise RoutingError(f"unknown routing engine {engine!r}; choose from {', '.join(ENGINES)}")
    t0 = time.perf_counter()
    fab = Fabric.of(graph)
    if engine == "dor" and "coords" not in opts:
        opts["coords"] = [graph.nodes[g].coords for g in fab.guids]
    lfts, st = fn(fab, **opts)
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


__all__ = ["ENGINES", "PROMISES", "Fabric", "RoutingError", "compute", "compute_with_fallback"]
