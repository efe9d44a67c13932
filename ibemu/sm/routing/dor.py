"""dor: dimension-order routing on a mesh or torus (lowest dimension first, shortest way).

Uses the switches' coordinates (``SmNode.coords``, set by the topology converter: discovery
cannot know them), else infers them from port numbers (:mod:`ibemu.sm.routing.grid`); a dimension whose ends are linked is a ring and is crossed the short way
round (ties go +). On a mesh the routes are minimal and deadlock-free. On a torus they are
minimal but NOT deadlock-free: each ring is a credit loop unless a dateline moves packets to
a second VL, which ibemu does not do; the checker reports that cycle as a warning.
"""

from __future__ import annotations

import logging

from ibemu.sm.routing.core import Layers, RoutingError, State, base_lfts, port_loads, spread
from ibemu.sm.routing.fabric import Fabric
from ibemu.sm.routing.grid import infer_coords
from ibemu.sm.routing.minhop import lids_on

log = logging.getLogger(__name__)


def grid(fab: Fabric, coords: list[tuple[int, ...] | None]) -> tuple[dict[tuple[int, ...], int], list[int], list[bool]]:
    """(coordinate -> switch, size per dimension, wraps per dimension)."""
    if not coords or any(c is None for c in coords):
        missing = sum(c is None for c in coords)
        raise RoutingError(
            f"dor: {missing} of {len(coords)} switches have no coordinates; dor needs a mesh or "
            "torus whose switch coordinates are known (SmNode.coords)"
        )
    at: dict[tuple[int, ...], int] = {}
    dims = len(coords[0] or ())
    for v, c in enumerate(coords):
        assert c is not None
        if len(c) != dims:
            raise RoutingError(f"dor: switch {fab.guids[v]:#x} has {len(c)} coordinates, others {dims}")
        if c in at:
            raise RoutingError(f"dor: switches {fab.guids[at[c]]:#x} and {fab.guids[v]:#x} share coordinates {c}")
        at[c] = v
    size = [max(c[d] for c in at) + 1 for d in range(dims)]
    wraps = [False] * dims
    for c, v in at.items():
        for d in range(dims):
            if size[d] > 2 and c[d] == size[d] - 1:
                far = at.get((*c[:d], 0, *c[d + 1:]))
                if far is not None and fab.adj[v] >> far & 1:
                    wraps[d] = True
    return at, size, wraps


def next_coord(c: tuple[int, ...], t: tuple[int, ...], size: list[int], wraps: list[bool]) -> tuple[int, ...]:
    for d, (a, b) in enumerate(zip(c, t, strict=True)):
        if a == b:
            continue
        if wraps[d]:
            fwd = (b - a) % size[d]
            step = 1 if fwd <= size[d] - fwd else -1
            nxt = (a + step) % size[d]
        else:
            nxt = a + (1 if b > a else -1)
        return (*c[:d], nxt, *c[d + 1:])
    return c


def route(
    fab: Fabric, coords: list[tuple[int, ...] | None] | None = None, **_opts: object
) -> tuple[list[dict[int, int]], State]:
    if not coords or any(c is None for c in coords):
        inferred = infer_coords(fab)  # RoutingError when the ports do not describe a grid
        log.info("dor: switch coordinates inferred from port numbers (%d switches)", fab.n)
        coords = list(inferred)
    at, size, wraps = grid(fab, coords)
    n = fab.n
    lfts = base_lfts(fab)
    loads = [port_loads(lft) for lft in lfts]
    pos = list(coords)
    for v in range(n):
        cv = pos[v]
        assert cv is not None
        for w in range(n):
            if w == v:
                continue
            lids = lids_on(fab, w)
            if not lids:
                continue
            cw = pos[w]
            assert cw is not None
            u = at.get(next_coord(cv, cw, size, wraps))
            if u is None or not fab.adj[v] >> u & 1:
                raise RoutingError(
                    f"dor: switch {fab.guids[v]:#x} {cv} has no link towards {cw}; dimension "
                    "order cannot route around a missing link"
                )
            ports = fab.nbr_ports[v][u]
            lfts[v].update(zip(lids, spread(ports, loads[v], len(lids)), strict=True))
    st = State("dor", fab, [Layers([]) for _ in range(n)])
    st.opts.update(coords=pos, size=size, wraps=wraps)
    return lfts, st
