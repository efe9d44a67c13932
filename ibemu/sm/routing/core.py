"""What the engines share: per-destination hop layers, candidate ports, balanced LFT filling.

For every destination switch ``w`` an engine computes *layers*: ``rings[k]`` is the bitset
of switches whose route to ``w`` is ``k`` switch hops long. A switch ``v`` in ring ``k`` may
forward to any neighbour in its *candidate mask* (neighbours one ring closer, restricted to
legal up/down turns for up*/down*); engines differ in the layers and in how they pick one
candidate per LID. The layers are kept in :class:`State` so a reroute can reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ibemu.errors import IbemuError
from ibemu.sm.routing.fabric import Fabric, bits, rings


class RoutingError(IbemuError, ValueError):
    """An engine cannot route this fabric (ftree on a non-tree, dor without a grid, ...)."""


@dataclass(slots=True)
class Layers:
    rings: list[int]
    """rings[k]: switches k hops from the destination along the engine's routes."""
    down: list[int] | None = None
    """up*/down* only: down[k] is the part of rings[k] that routes down (pure-down path)."""

    def reached(self) -> int:
        out = 0
        for r in self.rings:
            out |= r
        return out

    def ring_of(self, v: int) -> int:
        bit = 1 << v
        for k, r in enumerate(self.rings):
            if r & bit:
                return k
        return -1


@dataclass
class State:
    """Engine output kept for incremental reroute."""

    engine: str
    fabric: Fabric
    minhop: list[Layers | None]
    """Per destination switch: unrestricted shortest-path layers (minhop, switch LIDs)."""
    updown: list[Layers | None] | None = None
    """Per destination switch with CAs: up*/down* layers (updn, ftree CA LIDs)."""
    up_adj: list[int] | None = None
    down_adj: list[int] | None = None
    ca_index: dict[int, int] = field(default_factory=dict)
    """ftree: endpoint LID -> its index in the shift order."""
    stride: list[int] = field(default_factory=list)
    """ftree: per switch, the divisor applied to the LID index before ``mod`` up-ports."""
    opts: dict[str, object] = field(default_factory=dict)
    loads: list[dict[int, int]] | None = None
    """Per switch: port -> LIDs it forwards (minhop, updn), for balanced re-picks."""

    def layers_for(self, lid: int, w: int) -> Layers | None:
        """The layers that govern ``lid`` (living on switch ``w``)."""
        if self.updown is not None and lid in self.fabric.ca_at:
            return self.updown[w]
        return self.minhop[w]

    def cand_mask(self, lay: Layers, v: int, k: int) -> int:
        """Neighbours of ``v`` (in ring ``k`` >= 1) it may forward to."""
        fab = self.fabric
        if lay.down is None:
            return fab.adj[v] & lay.rings[k - 1]
        assert self.up_adj is not None and self.down_adj is not None
        if lay.down[k] >> v & 1:
            return self.down_adj[v] & fab.adj[v] & lay.down[k - 1]
        return self.up_adj[v] & fab.adj[v] & lay.rings[k - 1]


def minhop_layers(adj: list[int], w: int) -> Layers:
    return Layers(rings(adj, w))


def updown_layers(up_adj: list[int], down_adj: list[int], w: int) -> Layers:
    """Layers of up*/down* routes to ``w`` that stay legal under destination-based LFTs.

    Switches that reach ``w`` by down-links alone route down (their shortest pure-down path);
    every other switch routes up to a neighbour whose own route is at most one hop shorter.
    A packet that took a down-link therefore never meets an up-link again.
    """
    down = [1 << w]
    seen = frontier = 1 << w
    while True:
        nxt = 0
        for x in bits(frontier):
            nxt |= up_adj[x]
        frontier = nxt & ~seen
        if not frontier:
            break
        seen |= frontier
        down.append(frontier)
    rings = [1 << w]
    prev = 1 << w
    k = 1
    while True:
        nxt = 0
        for x in bits(prev):
            nxt |= down_adj[x]
        up = nxt & ~seen
        seen |= up
        d = down[k] if k < len(down) else 0
        layer = d | up
        if not layer:
            break
        rings.append(layer)
        prev = layer
        k += 1
    down += [0] * (len(rings) - len(down))
    return Layers(rings, down[: len(rings)])


def ports_of(fab: Fabric, v: int, mask: int) -> list[int]:
    nbr = fab.nbr_ports[v]
    if mask & (mask - 1) == 0:
        return nbr[mask.bit_length() - 1]
    out: list[int] = []
    for u in bits(mask):
        out += nbr[u]
    out.sort()
    return out


def spread(ports: list[int], load: dict[int, int], count: int) -> list[int]:
    """``count`` port choices, each going to the least-loaded port (lowest number on ties)."""
    m = len(ports)
    if m == 1:
        p = ports[0]
        load[p] = load.get(p, 0) + count
        return [p] * count
    order = sorted(ports, key=lambda p: (load.get(p, 0), p))
    level = load.get(order[0], 0)
    seq: list[int] = []
    left = count
    t = 1
    while left:
        while t < m and load.get(order[t], 0) <= level:
            t += 1
        if t == m:
            seq += (order * (left // m + 1))[:left]
            break
        gap = load.get(order[t], 0) - level
        if gap * t >= left:
            seq += (order[:t] * (left // t + 1))[:left]
            break
        seq += order[:t] * gap
        left -= gap * t
        level += gap
    for p in set(seq):
        load[p] = load.get(p, 0) + seq.count(p)
    return seq


def port_loads(lft: dict[int, int]) -> dict[int, int]:
    load: dict[int, int] = {}
    for p in lft.values():
        load[p] = load.get(p, 0) + 1
    return load


def base_lfts(fab: Fabric) -> list[dict[int, int]]:
    """Per switch: its own LID -> 0 and its cabled endpoints' LIDs -> their ports."""
    out: list[dict[int, int]] = []
    for v in range(fab.n):
        lft = {lid: fab.ca_at[lid][1] for lid in fab.ca_lids[v]}
        if fab.sw_lid[v]:
            lft[fab.sw_lid[v]] = 0
        out.append(lft)
    return out


Job = tuple[Layers, int, list[int], int]
"""(layers, destination switch, LIDs, bitset of the switches to route: -1 = all)."""


def fallback_jobs(st: State) -> list[Job]:
    """Minhop routes for CA LIDs at switches their up*/down* layers do not reach.

    A switch cut off from the up*/down* routes of a destination (a core whose only link to a
    pod failed) never carries that destination's CA traffic, but still needs an entry; a
    shortest path from it cannot loop: it ends in switches whose routes are legal.
    """
    if st.updown is None:
        return []
    fab = st.fabric
    comp_of = [0] * fab.n
    for comp in fab.components():
        for v in bits(comp):
            comp_of[v] = comp
    out: list[Job] = []
    for w, lay in enumerate(st.updown):
        if lay is None or not fab.ca_lids[w]:
            continue
        left = comp_of[w] & ~lay.reached()
        mh = st.minhop[w]
        if left and mh is not None:
            out.append((mh, w, fab.ca_lids[w], left))
    return out


def fill_balanced(
    st: State, lfts: list[dict[int, int]], jobs: list[Job], count_all: bool = True
) -> None:
    """Route ``jobs`` (layers, destination switch, LIDs, switches) with balanced choices.

    Choices are gathered per (switch, candidate mask) and handed out least-loaded first,
    most constrained groups first: OpenSM minhop's port-load balancing, batched. CA LIDs are
    spread first and switch LIDs (management traffic) after them, so that the data traffic
    is even over the ports (interleaving them would park all switch LIDs on one port and
    the CA LIDs on the others). The loads count every LID already in ``lfts`` (kept in
    ``st.loads``), or with ``count_all`` False only the LIDs of these jobs.
    """
    fab = st.fabric
    ca_at = fab.ca_at
    # per switch: mask -> LIDs, CA LIDs in groups[v][0], switch LIDs in groups[v][1]
    groups: list[tuple[dict[int, list[int]], dict[int, list[int]]]] = [
        ({}, {}) for _ in range(fab.n)
    ]
    cand = st.cand_mask
    adj = fab.adj
    for lay, _w, lids, only in jobs:
        parts = [(0, [x for x in lids if x in ca_at]), (1, [x for x in lids if x not in ca_at])]
        parts = [(i, part) for i, part in parts if part]
        rings = lay.rings
        plain = lay.down is None
        for k in range(1, len(rings)):
            prev = rings[k - 1]
            for v in bits(rings[k] & only):
                mask = adj[v] & prev if plain else cand(lay, v, k)
                gv = groups[v]
                for i, part in parts:
                    g = gv[i].get(mask)
                    if g is None:
                        gv[i][mask] = list(part)
                    else:
                        g += part
    loads: list[dict[int, int]] = []
    for v in range(fab.n):
        lft = lfts[v]
        load = port_loads(lft) if count_all else {}
        loads.append(load)
        for by_mask in groups[v]:
            for m in sorted(by_mask, key=lambda x: (x.bit_count(), x)):
                chosen = by_mask[m]
                lft.update(zip(chosen, spread(ports_of(fab, v, m), load, len(chosen)), strict=True))
    st.loads = loads if count_all else None
