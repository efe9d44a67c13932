"""ftree: fat-tree routing with OpenSM's balanced "shift" of destinations over up-ports.

Levels come from the distance to CAs (leaves = switches with CAs = level 1); every
switch-to-switch link must join adjacent levels, else this is not a fat-tree. CA LIDs are
numbered leaf by leaf (leaves grouped by their parents, i.e. pod by pod) and CA by CA. A
switch at level l forwards a destination of index i that it cannot reach downwards on
up-port ``(i // S_l) mod m`` of its m up-ports, ``S_l`` being the product of the up-port
counts of the levels below (d-mod-k): all sources converge on one top switch per
destination and each up-port of a full fat-tree carries the same number of destinations.
Down-paths are the (usually unique) shortest ones; switch LIDs take minhop paths.
"""

from __future__ import annotations

from ibemu.sm.routing.core import (
    Job,
    Layers,
    RoutingError,
    State,
    base_lfts,
    fallback_jobs,
    fill_balanced,
    ports_of,
)
from ibemu.sm.routing.fabric import Fabric, bits
from ibemu.sm.routing.minhop import minhop_tables
from ibemu.sm.routing.updn import bfs_dist, directions, leaf_mask, updown_tables


def levels(fab: Fabric) -> list[int]:
    """Fat-tree level of every switch (1 = leaf); RoutingError if the fabric is no tree."""
    leaves = leaf_mask(fab)
    if not leaves:
        raise RoutingError("ftree: no switch has CAs, cannot find the leaves of a fat-tree")
    dist = bfs_dist(fab.adj, leaves, fab.n)
    lvl = [d + 1 if d >= 0 else 0 for d in dist]
    for v in range(fab.n):
        if not lvl[v]:
            raise RoutingError(f"ftree: switch {fab.guids[v]:#x} has no path to any CA")
        for u in bits(fab.adj[v]):
            if abs(lvl[u] - lvl[v]) != 1:
                raise RoutingError(
                    f"ftree: switches {fab.guids[v]:#x} and {fab.guids[u]:#x} are linked at levels "
                    f"{lvl[v]} and {lvl[u]}; a fat-tree only links adjacent levels"
                )
    return lvl


def shift_order(fab: Fabric, up: list[int]) -> dict[int, int]:
    """CA LID -> index: leaves grouped by their lowest parent (pod), CAs in port order."""
    order = sorted(
        (v for v in range(fab.n) if fab.ca_lids[v]),
        key=lambda v: ((up[v] & -up[v]).bit_length(), v),
    )
    out: dict[int, int] = {}
    for v in order:
        for lid in sorted(fab.ca_lids[v], key=lambda lid: fab.ca_at[lid][1]):
            out[lid] = len(out)
    return out


def strides(fab: Fabric, lvl: list[int], up: list[int]) -> list[int]:
    top = max(lvl)
    width = [1] * (top + 2)
    for v in range(fab.n):
        m = sum(len(fab.nbr_ports[v][u]) for u in bits(up[v]))
        width[lvl[v]] = max(width[lvl[v]], m)
    per_level = [1] * (top + 2)
    for level in range(2, top + 2):
        per_level[level] = per_level[level - 1] * width[level - 1]
    return [per_level[lvl[v]] for v in range(fab.n)]


def pick(st: State, v: int, lay: Layers, k: int, lid: int) -> int:
    """ftree's port for ``lid`` at switch ``v`` (ring ``k`` of ``lay``)."""
    ports = ports_of(st.fabric, v, st.cand_mask(lay, v, k))
    i = st.ca_index.get(lid, lid)
    assert lay.down is not None
    if lay.down[k] >> v & 1:
        return ports[i % len(ports)]
    return ports[(i // st.stride[v]) % len(ports)]


def route(fab: Fabric, **_opts: object) -> tuple[list[dict[int, int]], State]:
    lvl = levels(fab)
    top = max(lvl)
    rank = [top - x for x in lvl]
    up, down = directions(fab, rank)
    ud, ok = updown_tables(fab, up, down)
    if not ok:
        raise RoutingError("ftree: some CA pairs have no up/down path; not a fat-tree")
    st = State("ftree", fab, minhop_tables(fab), ud, up, down)
    st.ca_index = shift_order(fab, up)
    st.stride = strides(fab, lvl, up)
    st.opts["rank"] = rank
    lfts = base_lfts(fab)
    idx = st.ca_index
    stride = st.stride
    nbr = fab.nbr_ports
    cache: list[dict[int, list[int]]] = [{} for _ in range(fab.n)]

    def cached(v: int, mask: int) -> list[int]:
        ports = cache[v].get(mask)
        if ports is None:
            ports = cache[v][mask] = ports_of(fab, v, mask)
        return ports

    for w in range(fab.n):
        lay = ud[w]
        lids = fab.ca_lids[w]
        if lay is None or not lids:
            continue
        assert lay.down is not None
        shifts = [idx[lid] for lid in lids]
        # this destination's entries for a port list and stride, worked out once and
        # written with one dict.update per switch (most switches share a few of them)
        picked: dict[tuple[tuple[int, ...], int], dict[int, int]] = {}
        rings, downs = lay.rings, lay.down
        for k in range(1, len(rings)):
            prev, dprev, dk = rings[k - 1], downs[k - 1], downs[k]
            for v in bits(rings[k]):
                if dk >> v & 1:
                    mask = down[v] & dprev
                    ports = nbr[v][mask.bit_length() - 1] if mask & (mask - 1) == 0 else cached(v, mask)
                    s = 1
                else:
                    mask = up[v] & prev
                    ports = nbr[v][mask.bit_length() - 1] if mask & (mask - 1) == 0 else cached(v, mask)
                    s = stride[v]
                key = (tuple(ports), s)
                entries = picked.get(key)
                if entries is None:
                    m = len(ports)
                    entries = picked[key] = dict(zip(lids, [ports[(i // s) % m] for i in shifts], strict=True))
                lfts[v].update(entries)
    jobs: list[Job] = [
        (mh, w, [fab.sw_lid[w]], -1)
        for w, mh in enumerate(st.minhop)
        if mh is not None and fab.sw_lid[w]
    ]
    jobs += fallback_jobs(st)
    fill_balanced(st, lfts, jobs, count_all=False)
    return lfts, st
