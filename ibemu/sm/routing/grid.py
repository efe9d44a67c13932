"""Infer mesh/torus coordinates from port numbers, when the graph does not carry them.

The convention is the one ibemu's generators cable and OpenSM's dor assumes: a switch's
CA ports come first (1..h), then per dimension d a ``+`` port (h+2d+1) and a ``-`` port
(h+2d+2). Every switch-to-switch link must join a ``+`` port to a ``-`` port of the same
dimension; a dimension whose ``+`` walk comes back to its start is a ring.
"""

from __future__ import annotations

from ibemu.sm.routing.core import RoutingError
from ibemu.sm.routing.fabric import Fabric


def _slots(fab: Fabric) -> list[dict[int, tuple[int, int]]]:
    """Per switch: switch port -> (dimension, +1 | -1)."""
    out: list[dict[int, tuple[int, int]]] = []
    for v in range(fab.n):
        h = max((fab.ca_at[lid][1] for lid in fab.ca_lids[v]), default=0)
        slots = {}
        for p in fab.port_peer[v]:
            off = p - h - 1
            if off < 0:
                raise RoutingError(
                    f"dor: switch {fab.guids[v]:#x} port {p} links a switch among its CA ports; "
                    "cannot infer grid coordinates"
                )
            slots[p] = (off // 2, 1 if off % 2 == 0 else -1)
        out.append(slots)
    return out


def infer_coords(fab: Fabric) -> list[tuple[int, ...]]:
    """Coordinates of every switch of a mesh/torus (RoutingError if it is not one)."""
    if not fab.n:
        raise RoutingError("dor: no switches")
    slots = _slots(fab)
    step: list[dict[tuple[int, int], int]] = [{} for _ in range(fab.n)]
    dims = 0
    for v, u_port in enumerate(fab.port_peer):
        for p, u in u_port.items():
            q = fab.peer_port(v, p)
            d, s = slots[v][p]
            if q is None or slots[u].get(q) != (d, -s) or (d, s) in step[v]:
                raise RoutingError(
                    f"dor: link {fab.guids[v]:#x}:{p} - {fab.guids[u]:#x}:{q} does not join the + "
                    "and - ports of one dimension; not a mesh/torus cabled in dimension order"
                )
            step[v][(d, s)] = u
            dims = max(dims, d + 1)
    if dims > 3 or dims == 0:
        raise RoutingError(f"dor: ports suggest {dims} dimensions; a mesh/torus has 1 to 3")
    origin = 0
    size, wraps = [], []
    for d in range(dims):
        x, fwd = origin, 0
        while (d, 1) in step[x] and step[x][(d, 1)] != origin and fwd <= fab.n:
            x = step[x][(d, 1)]
            fwd += 1
        if step[x].get((d, 1)) == origin:
            size.append(fwd + 1)
            wraps.append(True)
            continue
        x, back = origin, 0
        while (d, -1) in step[x] and back <= fab.n:
            x = step[x][(d, -1)]
            back += 1
        size.append(fwd + back + 1)
        wraps.append(False)
    pos: list[list[int] | None] = [None] * fab.n
    pos[origin] = [0] * dims
    todo = [origin]
    while todo:
        v = todo.pop()
        cv = pos[v]
        assert cv is not None
        for (d, s), u in step[v].items():
            c = list(cv)
            c[d] = (c[d] + s) % size[d] if wraps[d] else c[d] + s
            if pos[u] is None:
                pos[u] = c
                todo.append(u)
            elif pos[u] != c:
                raise RoutingError(f"dor: switch {fab.guids[u]:#x} sits at two grid positions")
    if any(c is None for c in pos):
        raise RoutingError("dor: the switch graph is not connected")
    full = [c for c in pos if c is not None]
    for d in range(dims):
        if not wraps[d]:
            low = min(c[d] for c in full)
            for c in full:
                c[d] -= low
    out = [tuple(c) for c in full]
    if len(set(out)) != len(out):
        raise RoutingError("dor: two switches got the same grid position; not a mesh/torus")
    return out
