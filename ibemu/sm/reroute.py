"""Incremental reroute after a link failure; re-balancing full recompute after a restoration.

A destination LID can only be hurt by a failed switch-to-switch link if one of the link's two
switches forwards it over that link: the LFTs of the two ends *are* the reverse index
"link -> LIDs". For each hurt LID the engine's hop layers (kept in ``Routes.state``) say
whether the upstream switch has another equal-cost candidate: then only that one entry
moves and no hop count changes anywhere. Otherwise the layers of that destination are
recomputed on the degraded fabric and every entry that is no longer on a shortest (legal)
path is re-picked. Only changed entries are returned, with the 64-entry LFT blocks that
hold them. A failure that partitions the fabric, a restored link, an endpoint link, or
routes without state fall back to a full recompute (still returning only the diff).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.routing import compute_with_fallback
from ibemu.sm.routing.core import (
    Layers,
    State,
    minhop_layers,
    port_loads,
    ports_of,
    spread,
    updown_layers,
)
from ibemu.sm.routing.fabric import NO_PATH, Fabric, bits, reach
from ibemu.sm.routing.minhop import lids_on

log = logging.getLogger(__name__)

LFT_BLOCK = 64


@dataclass
class RerouteResult:
    routes: Routes
    diff: dict[int, dict[int, int]] = field(default_factory=dict)
    """Switch GUID -> {LID: new port}; ``NO_PATH`` (255) where a LID lost its route."""
    blocks: dict[int, set[int]] = field(default_factory=dict)
    """Switch GUID -> LFT block numbers (LID // 64) to write."""
    affected_lids: set[int] = field(default_factory=set)
    """LIDs whose route crossed a failed link (incremental) or changed (full)."""
    lost: dict[int, set[int]] = field(default_factory=dict)
    """CA GUID -> CA GUIDs it reached before and no longer can (partition)."""
    full: bool = False
    """True when the routes were recomputed from scratch."""
    compute_s: float = 0.0

    @property
    def changed_entries(self) -> int:
        return sum(len(d) for d in self.diff.values())

    @property
    def changed_blocks(self) -> int:
        return sum(len(b) for b in self.blocks.values())


Link = tuple[int, int, int, int]  # switch index, port, switch index, port


def reroute(
    graph: SubnetGraph,
    prev: Routes,
    ends: Iterable[tuple[int, int]] | None = None,
    **opts: Any,
) -> RerouteResult:
    """New routes for ``graph`` (``prev`` computed before its last link changes).

    ``ends``: the (node GUID, port) ends that changed, as the SM learns them from traps or a
    sweep; without them the switch ports are compared with ``prev``'s fabric.
    """
    t0 = time.perf_counter()
    st = prev.state
    res: RerouteResult | None = None
    if isinstance(st, State) and st.engine in ("minhop", "updn", "ftree"):
        changes = _changes(st.fabric, graph, ends)
        if changes is not None:
            removed, added = changes
            if not removed and not added:  # nothing the routes depend on changed
                res = RerouteResult(replace(prev))
            elif removed and not added:
                res = _incremental(st, prev, removed)
    if res is None:
        res = _full(graph, prev, **opts)
    res.compute_s = time.perf_counter() - t0
    res.routes.compute_s = res.compute_s
    log.debug(
        "reroute (%s): %d LIDs, %d entries in %d blocks, %.2f ms",
        "full" if res.full else "incremental", len(res.affected_lids), res.changed_entries,
        res.changed_blocks, res.compute_s * 1e3,
    )
    return res


def _changes(
    fab: Fabric, graph: SubnetGraph, ends: Iterable[tuple[int, int]] | None
) -> tuple[list[Link], list[Link]] | None:
    """Switch-to-switch links removed/added since ``fab``; None if anything else changed."""
    if sum(1 for nd in graph.nodes.values() if nd.is_switch) != fab.n:
        return None
    if any(g not in graph.nodes for g in fab.guids):
        return None  # a switch was replaced
    if ends is None:
        todo: Iterable[tuple[int, int]] = (
            (g, num) for g in fab.guids for num in graph.nodes[g].ports if num
        )
    else:
        todo = ends
    endpoint = {at: fab.ca_guid[lid] for lid, at in fab.ca_at.items()}
    removed: list[Link] = []
    added: list[Link] = []
    seen: set[tuple[int, int]] = set()
    for guid, num in todo:
        node = graph.nodes.get(guid)
        v = fab.index.get(guid)
        if node is None or v is None or not node.is_switch:
            return None  # an endpoint's or unknown node's port: the LID set may change
        p = node.ports.get(num)
        if p is None:
            return None
        if (v, num) in seen:
            continue
        now = p.peer
        was = fab.port_peer[v].get(num)
        if (v, num) in endpoint:
            if now is None or now[0] != endpoint[(v, num)]:
                return None
            continue
        if was is not None:
            if now is not None and now[0] == fab.guids[was]:
                continue
            back = fab.peer_port(v, num)
            if back is None or now is not None:
                return None  # recabled elsewhere
            removed.append((v, num, was, back))
            seen.update({(v, num), (was, back)})
        elif now is not None:
            far = graph.nodes.get(now[0])
            if far is None or not far.is_switch or now[0] not in fab.index:
                return None
            u = fab.index[now[0]]
            added.append((v, num, u, now[1]))
            seen.update({(v, num), (u, now[1])})
    return removed, added


def _incremental(st: State, prev: Routes, removed: list[Link]) -> RerouteResult | None:
    fab = st.fabric
    for i, pi, j, pj in removed:
        fab = fab.without_link(i, pi, j, pj)
        if not reach(fab.adj, 1 << i) >> j & 1:
            return None  # partition: full recompute reports who lost whom
    new = replace(st, fabric=fab, minhop=list(st.minhop))
    if st.updown is not None:
        assert st.up_adj is not None and st.down_adj is not None
        new.updown = list(st.updown)
        new.up_adj = [a & b for a, b in zip(st.up_adj, fab.adj, strict=True)]
        new.down_adj = [a & b for a, b in zip(st.down_adj, fab.adj, strict=True)]
    lfts = dict(prev.lfts)
    copied: set[int] = set()
    diff: dict[int, dict[int, int]] = {}
    loads: dict[int, dict[int, int]] = {}
    affected: set[int] = set()

    def lft_of(v: int) -> dict[int, int]:
        g = fab.guids[v]
        if g not in copied:
            lfts[g] = dict(lfts[g])
            copied.add(g)
        return lfts[g]

    new_loads = None if st.loads is None else list(st.loads)
    new.loads = new_loads

    def load_of(v: int) -> dict[int, int]:
        if v not in loads:
            if new_loads is None:
                loads[v] = port_loads(lfts[fab.guids[v]])
            else:
                loads[v] = new_loads[v] = dict(new_loads[v])
        return loads[v]

    def set_entry(v: int, lid: int, port: int) -> None:
        lft = lft_of(v)
        old = lft.get(lid)
        if old == port:
            return
        if new_loads is not None or v in loads:  # ftree keeps no load counters
            load = load_of(v)
            if old is not None:
                load[old] = load.get(old, 1) - 1
            load[port] = load.get(port, 0) + 1
        lft[lid] = port
        diff.setdefault(fab.guids[v], {})[lid] = port

    def repick(v: int, lay: Layers, k: int, lids: list[int]) -> None:
        if new.engine == "ftree":
            ports = ports_of(fab, v, new.cand_mask(lay, v, k))
            if lay.down is not None:  # ``routing.ftree.pick`` for each LID, the ports found once
                m, idx = len(ports), new.ca_index
                if lay.down[k] >> v & 1:
                    for lid in lids:
                        set_entry(v, lid, ports[idx.get(lid, lid) % m])
                else:
                    stride = new.stride[v]
                    for lid in lids:
                        set_entry(v, lid, ports[(idx.get(lid, lid) // stride) % m])
                return
            for lid in lids:  # switch LIDs: spread by LID, no load counters
                set_entry(v, lid, ports[lid % len(ports)])
            return
        ports = ports_of(fab, v, new.cand_mask(lay, v, k))
        load = dict(load_of(v))
        for lid in lids:
            old = lfts[fab.guids[v]].get(lid)
            if old is not None:
                load[old] = load.get(old, 1) - 1
        for lid, port in zip(lids, spread(ports, load, len(lids)), strict=True):
            set_entry(v, lid, port)

    ends = 0
    for i, _, j, _ in removed:
        ends |= 1 << i | 1 << j

    def fix(lay: Layers, lids: list[int], only: int, old: Layers | None) -> None:
        """Re-pick every entry of ``lids`` that is not on a route of ``lay``.

        Only switches whose layer changed (from ``old``), their neighbours and the ends of
        the failed links can hold such an entry.
        """
        if old is not None:
            only &= _zone(fab.adj, old, lay) | ends
        rings, cand_mask, guids, port_peer, n = lay.rings, new.cand_mask, fab.guids, fab.port_peer, fab.n
        one = lids[0] if len(lids) == 1 else None  # a switch's own LID: most calls
        for k in range(1, len(rings)):
            ring = rings[k] & only
            if not ring:
                continue
            for v in bits(ring):
                mask = cand_mask(lay, v, k)
                lft = lfts[guids[v]]
                peer = port_peer[v]
                if one is not None:
                    if mask >> peer.get(lft.get(one, NO_PATH), n) & 1:
                        continue
                    bad = lids
                else:
                    bad = [lid for lid in lids if not mask >> peer.get(lft.get(lid, NO_PATH), n) & 1]
                if bad:
                    repick(v, lay, k, bad)
                    affected.update(bad)

    refreshed: set[int] = set()

    def refresh_minhop(w: int) -> Layers:
        """Shortest-path layers of ``w`` on the degraded fabric, entries they govern fixed."""
        if w not in refreshed:
            refreshed.add(w)
            old = new.minhop[w]
            new.minhop[w] = mh = minhop_layers(fab.adj, w)
            own = [fab.sw_lid[w]] if fab.sw_lid[w] else []
            fix(mh, lids_on(fab, w) if new.updown is None else own, -1, old)
        lay = new.minhop[w]
        assert lay is not None
        return lay

    leaves = 0
    for v in range(fab.n):
        if fab.ca_lids[v]:
            leaves |= 1 << v

    # hurt LIDs, grouped by the layers that govern them: (updown?, destination switch)
    hurt: dict[tuple[bool, int], dict[int, list[int]]] = {}
    for i, pi, j, pj in removed:
        for x, px in ((i, pi), (j, pj)):
            for lid, port in prev.lfts[fab.guids[x]].items():
                if port != px:
                    continue
                w = fab.lid_switch(lid)
                if w is None:
                    continue
                ud = new.updown is not None and lid in fab.ca_at
                hurt.setdefault((ud, w), {}).setdefault(x, []).append(lid)
                affected.add(lid)
    for (ud, w), by_switch in hurt.items():
        table = new.updown if ud else new.minhop
        assert table is not None
        lay = table[w]
        if lay is None:
            return None
        ring_at: dict[int, int] = {}
        for x in by_switch:
            k = ring_at[x] = lay.ring_of(x)
            if k <= 0 or not new.cand_mask(lay, x, k):
                break
        else:
            for x, lids in by_switch.items():
                repick(x, lay, ring_at[x], lids)
            continue
        if ud:
            assert new.up_adj is not None and new.down_adj is not None
            lay = updown_layers(new.up_adj, new.down_adj, w)
            if leaves & ~lay.reached():
                return None  # no up*/down* path left for some leaf: recompute (new roots)
            lids = fab.ca_lids[w]
            old = new.updown[w]  # type: ignore[index]
            new.updown[w] = lay  # type: ignore[index]
            fix(lay, lids, -1, old)
            left = reach(fab.adj, 1 << w) & ~lay.reached()
            if left:  # cut off from the up*/down* routes: shortest paths (see fallback_jobs)
                fix(refresh_minhop(w), lids, left, None)
        else:
            refresh_minhop(w)
    routes = Routes(prev.engine, lfts, state=new)
    return RerouteResult(routes, diff, _blocks(diff), affected)


def _zone(adj: list[int], old: Layers, new: Layers) -> int:
    """Switches whose layer (or up/down type) differs between ``old`` and ``new``, with
    their neighbours."""
    changed = 0
    for k in range(max(len(old.rings), len(new.rings))):
        a = old.rings[k] if k < len(old.rings) else 0
        b = new.rings[k] if k < len(new.rings) else 0
        changed |= a ^ b
        if old.down is not None and new.down is not None:
            da = old.down[k] if k < len(old.down) else 0
            db = new.down[k] if k < len(new.down) else 0
            changed |= da ^ db
    zone = changed
    for v in _bits(changed):
        zone |= adj[v]
    return zone


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _blocks(diff: dict[int, dict[int, int]]) -> dict[int, set[int]]:
    return {g: {lid // LFT_BLOCK for lid in d} for g, d in diff.items() if d}


def _full(graph: SubnetGraph, prev: Routes, **opts: Any) -> RerouteResult:
    engine = prev.engine
    if isinstance(prev.state, State):
        opts = {**{k: v for k, v in prev.state.opts.items() if k == "roots"}, **opts}
    routes = compute_with_fallback(graph, engine, **opts)
    diff: dict[int, dict[int, int]] = {}
    for g, new in routes.lfts.items():
        old = prev.lfts.get(g, {})
        if new == old:
            continue
        d = {lid: p for lid, p in new.items() if old.get(lid) != p}
        d.update({lid: NO_PATH for lid in old if lid not in new})
        if d:
            diff[g] = d
    affected = {lid for d in diff.values() for lid in d}
    return RerouteResult(routes, diff, _blocks(diff), affected, _lost(prev, routes), full=True)


def _lost(prev: Routes, routes: Routes) -> dict[int, set[int]]:
    """CA GUID -> CA GUIDs in its component before that are not in it now."""
    old, new = prev.state, routes.state
    if not isinstance(old, State) or not isinstance(new, State):
        return {}

    def comp_of(fab: Fabric) -> dict[int, int]:
        out: dict[int, int] = {}
        for c, comp in enumerate(fab.components()):
            for lid, (v, _) in fab.ca_at.items():
                if comp >> v & 1:
                    out[fab.ca_guid[lid]] = c
        return out

    before, after = comp_of(old.fabric), comp_of(new.fabric)
    groups: dict[tuple[int, int], set[int]] = {}
    for ca, c in before.items():
        groups.setdefault((c, after.get(ca, -1)), set()).add(ca)
    lost: dict[int, set[int]] = {}
    for (cb, ca_), members in groups.items():
        others = set()
        for (cb2, ca2), m2 in groups.items():
            if cb2 == cb and (ca2 != ca_ or ca_ == -1):
                others |= m2
        if others:
            for x in members:
                lost[x] = others - {x}
    return {k: v for k, v in lost.items() if v}
