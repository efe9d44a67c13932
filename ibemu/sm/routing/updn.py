"""updn: up*/down* routing (deadlock-free), roots found as OpenSM does when none are given.

Roots: the switches farthest from any CA (the spines/cores of a tree); when every switch has
CAs (torus, mesh, dragonfly), the centre of the switch graph. Ranks are BFS distances from
the roots; a link goes *up* towards the lower (rank, index). CA destinations follow only
up*down* paths (no down->up turn, so the channel dependency graph is acyclic); switch LIDs
(management traffic on VL15, which has no credit flow control) take plain shortest paths.
"""

from __future__ import annotations

import logging

from ibemu.sm.routing.core import (
    Job,
    Layers,
    RoutingError,
    State,
    base_lfts,
    fallback_jobs,
    fill_balanced,
    updown_layers,
)
from ibemu.sm.routing.fabric import Fabric, bits
from ibemu.sm.routing.minhop import minhop_tables

log = logging.getLogger(__name__)


def leaf_mask(fab: Fabric) -> int:
    out = 0
    for v, lids in enumerate(fab.ca_lids):
        if lids:
            out |= 1 << v
    return out


def bfs_dist(adj: list[int], seed: int, n: int) -> list[int]:
    """Hops from the bitset ``seed`` to every switch (-1 when unreachable)."""
    dist = [-1] * n
    seen = frontier = seed
    k = 0
    while frontier:
        for v in bits(frontier):
            dist[v] = k
        nxt = 0
        for x in bits(frontier):
            nxt |= adj[x]
        frontier = nxt & ~seen
        seen |= frontier
        k += 1
    return dist


def centre(adj: list[int], comp: int, n: int) -> int:
    """Switch of ``comp`` with the smallest eccentricity (lowest index on ties)."""
    best, best_ecc = -1, 1 << 30
    for v in bits(comp):
        ecc = max(bfs_dist(adj, 1 << v, n))
        if ecc < best_ecc:
            best, best_ecc = v, ecc
    return best


def find_roots(fab: Fabric) -> list[int]:
    """Per component: its switches farthest from CAs, or its centre if all have CAs."""
    n = fab.n
    level = bfs_dist(fab.adj, leaf_mask(fab), n)
    roots: list[int] = []
    for comp in fab.components():
        members = list(bits(comp))
        top = max(level[v] for v in members)
        if top > 0:
            roots += [v for v in members if level[v] == top]
        else:
            roots.append(centre(fab.adj, comp, n))
    return roots


def directions(fab: Fabric, rank: list[int]) -> tuple[list[int], list[int]]:
    """(up_adj, down_adj): per switch, neighbours above / below it."""
    up, down = [0] * fab.n, [0] * fab.n
    for v in range(fab.n):
        key = (rank[v], v)
        for u in bits(fab.adj[v]):
            if (rank[u], u) < key:
                up[v] |= 1 << u
            else:
                down[v] |= 1 << u
    return up, down


def updown_tables(
    fab: Fabric, up: list[int], down: list[int]
) -> tuple[list[Layers | None], bool]:
    """up*/down* layers of every switch with CAs; False if some CA pair found no path."""
    leaves = leaf_mask(fab)
    comp_of = [0] * fab.n
    for comp in fab.components():
        for v in bits(comp):
            comp_of[v] = comp
    out: list[Layers | None] = [None] * fab.n
    ok = True
    for w in bits(leaves):
        lay = updown_layers(up, down, w)
        out[w] = lay
        if leaves & comp_of[w] & ~lay.reached():
            ok = False
    return out, ok


def build_state(fab: Fabric, engine: str, rank: list[int]) -> tuple[State, bool]:
    up, down = directions(fab, rank)
    ud, ok = updown_tables(fab, up, down)
    st = State(engine, fab, minhop_tables(fab), ud, up, down)
    return st, ok


def fill(st: State) -> list[dict[int, int]]:
    fab = st.fabric
    assert st.updown is not None
    lfts = base_lfts(fab)
    jobs: list[Job] = []
    for w in range(fab.n):
        ud, mh = st.updown[w], st.minhop[w]
        if ud is not None and fab.ca_lids[w]:
            jobs.append((ud, w, fab.ca_lids[w], -1))
        if mh is not None and fab.sw_lid[w]:
            jobs.append((mh, w, [fab.sw_lid[w]], -1))
    jobs += fallback_jobs(st)
    fill_balanced(st, lfts, jobs)
    return lfts


def route(fab: Fabric, roots: list[int] | None = None, **_opts: object) -> tuple[list[dict[int, int]], State]:
    """``roots``: switch GUIDs to use as roots (default: detected)."""
    if roots:
        try:
            root_idx = [fab.index[g] for g in roots]
        except KeyError as e:
            raise RoutingError(f"updn: root GUID {e.args[0]:#x} is not a switch of the fabric") from None
    else:
        root_idx = find_roots(fab)
    rank = bfs_dist(fab.adj, sum(1 << r for r in set(root_idx)), fab.n)
    st, ok = build_state(fab, "updn", rank)
    if not ok:
        single = []
        for comp in fab.components():
            mine = [r for r in root_idx if comp >> r & 1]
            single.append(mine[0] if mine else centre(fab.adj, comp, fab.n))
        log.info("updn: %d roots leave CA pairs without an up*/down* path; using one root per component", len(root_idx))
        rank = bfs_dist(fab.adj, sum(1 << r for r in single), fab.n)
        st, ok = build_state(fab, "updn", rank)
        assert ok, "a single root per component always gives every pair an up*/down* path"
    st.opts["rank"] = rank
    if roots:
        st.opts["roots"] = list(roots)
    return fill(st), st
