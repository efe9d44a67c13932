"""Validate LFTs against the subnet graph: reachability, loops, hop counts, credit loops.

Every (switch, LID) entry is followed through ``SmPort.peer`` links until it reaches the LID's
owner, loops or falls off the fabric. CA-to-CA routes (the traffic that matters) give the
hop figures (links from CA to CA, both CA links included), the minimality check against BFS
distances, and the channel dependency graph: nodes are directed switch-to-switch links
(switch, egress port), edges join consecutive links of a route; a cycle there is a potential
credit-loop deadlock. Pairs that the graph itself cannot connect (a partition) are counted
apart and are not errors.

``check_alternates`` validates adaptive-routing groups (``ArRoutes``): every alternate port,
taken at its switch with the primary LFTs everywhere else, must reach the LID without coming
back to that switch; and the channel dependency graph of every choice a packet could meet
(at each switch its CA traffic can reach: the primary and all alternates, so a packet may
deviate at several switches) must be acyclic. That is the promise an adaptive engine makes:
whatever the switches pick, no credit loop; a cycle is always an error here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ibemu.sm.graph import ArRoutes, Routes, SubnetGraph
from ibemu.sm.routing.fabric import NO_PATH, Fabric, hop_table

log = logging.getLogger(__name__)

_UNK, _BUSY, _BAD = -1, -2, -3
_P = 256  # channel id = switch index * 256 + egress port


@dataclass
class CheckReport:
    ok: bool = True
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ca_pairs: int = 0
    """Ordered pairs of CA ports (source, destination LID) the graph connects."""
    unreachable: int = 0
    """Of those, pairs the LFTs do not deliver."""
    disconnected: int = 0
    """Ordered CA port pairs the graph itself cannot connect (partition)."""
    loops: int = 0
    """(switch, LID) entries whose walk loops."""
    blackholes: int = 0
    """(switch, LID) entries (graph-connected) that end without reaching the LID."""
    max_hops: int = 0
    avg_hops: float = 0.0
    non_minimal: int = 0
    """CA pairs routed over more links than the shortest path."""
    cdg_channels: int = 0
    cdg_edges: int = 0
    cdg_cycle: list[tuple[int, int]] | None = None
    """A credit loop as (switch GUID, egress port) channels, if any."""
    alternates: int = 0
    """check_alternates: (switch, LID, alternate port) entries checked."""
    alt_longer: int = 0
    """check_alternates: alternates whose route is longer than the primary's."""
    elapsed_s: float = 0.0

    def fail(self, msg: str) -> None:
        self.ok = False
        if len(self.errors) < 20:
            self.errors.append(msg)

    def summary(self) -> str:
        state = "ok" if self.ok else f"FAILED ({len(self.errors)} errors)"
        return (
            f"{state}: {self.ca_pairs} CA pairs, hops max {self.max_hops} avg {self.avg_hops:.2f}, "
            f"{self.non_minimal} non-minimal, {self.unreachable} unreachable, {self.loops} loops, "
            f"CDG {self.cdg_channels} channels {self.cdg_edges} edges "
            f"{'cyclic' if self.cdg_cycle else 'acyclic'}"
        )


def check(
    graph: SubnetGraph,
    routes: Routes,
    *,
    expect_minimal: bool = False,
    expect_deadlock_free: bool = False,
) -> CheckReport:
    t0 = time.perf_counter()
    rep = CheckReport()
    fab = Fabric.of(graph)
    n = fab.n
    lfts = [routes.lfts.get(g, {}) for g in fab.guids]
    for g in fab.guids:
        if g not in routes.lfts:
            rep.fail(f"switch {g:#x} has no LFT")
    comp_of = _component_of(fab)
    peer = fab.port_peer
    ncas = [len(x) for x in fab.ca_lids]
    total_cas = sum(ncas)
    cas_in = {comp: sum(ncas[v] for v in range(n) if comp >> v & 1) for comp in set(comp_of)}
    deps: set[int] = set()
    dists: dict[int, list[int]] = {}
    hop_sum = 0
    lid_owner = [(lid, at[0], at[1]) for lid, at in fab.ca_at.items()]
    lid_owner += [(lid, v, 0) for v, lid in enumerate(fab.sw_lid) if lid]
    for lid, o, oport in lid_owner:
        is_ca = lid in fab.ca_at
        comp = comp_of[o]
        hops = _walk_hops(fab, lfts, lid, o, oport, comp, rep)
        if not is_ca:
            continue
        dist: list[int] | None = None
        if expect_minimal:
            dist = dists.get(o)
            if dist is None:
                dist = dists[o] = hop_table(fab.adj, o, n)
        rep.disconnected += total_cas - cas_in[comp]
        walked = [False] * n
        for s in range(n):
            c = ncas[s]
            if not c or not comp >> s & 1:
                continue
            if s == o:
                c -= 1
                if not c:
                    continue
            rep.ca_pairs += c
            h = hops[s]
            if h < 0:
                rep.unreachable += c
                continue
            hop_sum += (h + 2) * c
            rep.max_hops = max(rep.max_hops, h + 2)
            if dist is not None and h > dist[s]:
                rep.non_minimal += c
            # channel dependencies along this source's route (shared suffixes walked once)
            x = s
            while x != o and not walked[x]:
                walked[x] = True
                port = lfts[x][lid]
                y = peer[x][port]
                if y == o:
                    break
                deps.add((x * _P + port) << 20 | (y * _P + lfts[y][lid]))
                x = y
    if rep.unreachable:
        rep.fail(f"{rep.unreachable} CA pairs are connected in the graph but not by the LFTs")
    if expect_minimal and rep.non_minimal:
        rep.fail(f"{rep.non_minimal} CA pairs take more hops than the shortest path")
    rep.avg_hops = hop_sum / max(1, rep.ca_pairs - rep.unreachable)
    rep.cdg_edges = len(deps)
    cycle = _find_cycle(deps)
    chans = {k >> 20 for k in deps} | {k & 0xFFFFF for k in deps}
    rep.cdg_channels = len(chans)
    if cycle:
        rep.cdg_cycle = [(fab.guids[c // _P], c % _P) for c in cycle]
        msg = f"channel dependency graph has a cycle of {len(cycle)} channels (credit loop possible)"
        if expect_deadlock_free:
            rep.fail(msg)
        else:
            rep.warnings.append(msg)
    rep.elapsed_s = time.perf_counter() - t0
    log.debug("check %s: %s", routes.engine, rep.summary())
    return rep


def _walk_hops(
    fab: Fabric, lfts: list[dict[int, int]], lid: int, o: int, oport: int, comp: int, rep: CheckReport
) -> list[int]:
    """Per switch: switch hops to ``lid``'s owner ``o`` along the LFTs, or a negative value
    (loop, black hole, wrong owner entry); failures are counted and reported in ``rep``."""
    n = fab.n
    peer = fab.port_peer
    hops = [_UNK] * n
    if lfts[o].get(lid) != oport:
        rep.fail(f"switch {fab.guids[o]:#x} owns LID {lid} but forwards it to {lfts[o].get(lid)}, not {oport}")
        hops[o] = _BAD
    else:
        hops[o] = 0
    for v in range(n):
        if hops[v] != _UNK:
            continue
        stack = []
        x = v
        while hops[x] == _UNK:
            hops[x] = _BUSY
            stack.append(x)
            port = lfts[x].get(lid, NO_PATH)
            nxt = peer[x].get(port)
            if nxt is None:
                if comp >> x & 1:
                    rep.blackholes += 1
                    if rep.blackholes <= 3:
                        rep.fail(f"switch {fab.guids[x]:#x}: LID {lid} goes to port {port}, which leads nowhere")
                stack.pop()
                hops[x] = _BAD
                break
            x = nxt
        if hops[x] == _BUSY:
            rep.loops += 1
            if rep.loops <= 3:
                rep.fail(f"forwarding loop for LID {lid} through switch {fab.guids[x]:#x}")
            base = _BAD
        else:
            base = hops[x]
        for y in reversed(stack):
            base = base + 1 if base >= 0 else _BAD
            hops[y] = base
    return hops


def check_alternates(graph: SubnetGraph, ar: ArRoutes) -> CheckReport:
    """Validate ``ar``'s alternate ports against ``graph`` (see the module docstring).

    The report counts the alternates checked, those that lengthen the route
    (``alt_longer``: allowed, reported), loops and black holes of alternate walks, and the
    union channel dependency graph (``cdg_*``; a cycle fails). The primary LFTs themselves
    are validated by ``check``; a primary that does not deliver fails here too, as the
    alternates lead into it.
    """
    t0 = time.perf_counter()
    rep = CheckReport()
    fab = Fabric.of(graph)
    n = fab.n
    lfts = [ar.primary.lfts.get(g, {}) for g in fab.guids]
    alts = [ar.alternates.get(g, {}) for g in fab.guids]
    for g in ar.alternates:
        if g not in fab.index:
            rep.fail(f"alternates given for {g:#x}, which is not a switch of the fabric")
    comp_of = _component_of(fab)
    peer = fab.port_peer
    owner = dict(fab.ca_at)
    owner.update({lid: (v, 0) for v, lid in enumerate(fab.sw_lid) if lid})
    alt_lids: set[int] = set()
    for table in alts:
        alt_lids.update(table)
    for lid in sorted(alt_lids - owner.keys()):
        rep.fail(f"alternates given for LID {lid}, which no port of the fabric owns")
    sources = [v for v in range(n) if fab.ca_lids[v]]
    deps: set[int] = set()
    # every CA LID: its primary routes take part in the channel dependency graph too
    for lid in sorted((alt_lids & owner.keys()) | fab.ca_at.keys()):
        o, oport = owner[lid]
        comp = comp_of[o]
        if lid in fab.ca_at:
            _union_deps(peer, lfts, alts, lid, o, [s for s in sources if comp >> s & 1 and s != o], deps)
        if lid not in alt_lids:
            continue
        hops = _walk_hops(fab, lfts, lid, o, oport, comp, rep)
        for v in range(n):
            ports = alts[v].get(lid)
            if not ports:
                continue
            where = f"switch {fab.guids[v]:#x} LID {lid}"
            if v == o:
                rep.fail(f"{where}: the owner of a LID must deliver it, yet has alternates {ports}")
                continue
            primary = lfts[v].get(lid)
            if primary in ports or len(set(ports)) != len(ports):
                rep.fail(f"{where}: alternates {ports} repeat a port or the primary {primary}")
            for a in ports:
                rep.alternates += 1
                u = peer[v].get(a)
                if u is None:
                    rep.blackholes += 1
                    rep.fail(f"{where}: alternate port {a} leads to no switch")
                    continue
                length = _alt_length(lfts, peer, hops, lid, v, u, n)
                if length == _BUSY:
                    rep.loops += 1
                    rep.fail(f"{where}: alternate port {a} comes back to the switch (loop)")
                elif length < 0:
                    rep.blackholes += 1
                    rep.fail(f"{where}: alternate port {a} does not reach the LID")
                elif hops[v] >= 0 and length > hops[v]:
                    rep.alt_longer += 1
    rep.cdg_edges = len(deps)
    rep.cdg_channels = len({k >> 20 for k in deps} | {k & 0xFFFFF for k in deps})
    cycle = _find_cycle(deps)
    if cycle:
        rep.cdg_cycle = [(fab.guids[c // _P], c % _P) for c in cycle]
        names = " -> ".join(f"{g:#x}/{p}" for g, p in rep.cdg_cycle)
        rep.fail(f"channel dependency graph with alternates has a cycle of {len(cycle)} channels "
                 f"(credit loop possible): {names}")
    rep.elapsed_s = time.perf_counter() - t0
    log.debug("check_alternates %s: %d alternates, %d longer, %s", ar.engine, rep.alternates,
              rep.alt_longer, rep.summary())
    return rep


def _alt_length(
    lfts: list[dict[int, int]], peer: list[dict[int, int]], hops: list[int], lid: int, v: int, u: int, n: int
) -> int:
    """Switch hops of the route leaving ``v`` for ``u`` then following the LFTs: _BUSY when
    it comes back to ``v``, _BAD when it does not arrive."""
    if hops[u] < 0:
        return _BAD
    if hops[v] >= 0 and hops[u] < hops[v]:
        return hops[u] + 1  # hops fall strictly along the primary: it cannot pass ``v``
    x = u
    for _ in range(n):
        if x == v:
            return _BUSY
        if hops[x] == 0:
            return hops[u] + 1
        y = peer[x].get(lfts[x].get(lid, NO_PATH))
        if y is None:
            return _BAD
        x = y
    return _BAD


def _union_deps(
    peer: list[dict[int, int]],
    lfts: list[dict[int, int]],
    alts: list[dict[int, tuple[int, ...]]],
    lid: int,
    o: int,
    sources: list[int],
    deps: set[int],
) -> None:
    """Add to ``deps`` the channel dependencies of every route to ``lid`` (owner ``o``) that
    starts at a switch in ``sources`` and takes, at each switch, the primary or an alternate."""

    def choices(x: int) -> list[int]:
        out = []
        p = lfts[x].get(lid)
        if p is not None:
            out.append(p)
        out += alts[x].get(lid, ())
        return [q for q in out if q in peer[x]]

    seen = set(sources)
    todo = list(sources)
    while todo:
        x = todo.pop()
        for p in choices(x):
            y = peer[x][p]
            if y == o:
                continue
            for q in choices(y):
                deps.add((x * _P + p) << 20 | (y * _P + q))
            if y not in seen:
                seen.add(y)
                todo.append(y)


def _component_of(fab: Fabric) -> list[int]:
    """Per switch index, the bitset of the connected component it is in."""
    comp_of = [0] * fab.n
    for comp in fab.components():
        for v in range(fab.n):
            if comp >> v & 1:
                comp_of[v] = comp
    return comp_of


def _find_cycle(deps: set[int]) -> list[int] | None:
    """A cycle of the dependency graph (iterative DFS), or None."""
    out: dict[int, list[int]] = {}
    for k in deps:
        out.setdefault(k >> 20, []).append(k & 0xFFFFF)
    color: dict[int, int] = {}
    for root in out:
        if root in color:
            continue
        color[root] = 1
        path = [root]
        iters = [iter(out.get(root, ()))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                iters.pop()
                continue
            c = color.get(nxt, 0)
            if c == 1:
                return path[path.index(nxt):]
            if c == 0:
                color[nxt] = 1
                path.append(nxt)
                iters.append(iter(out.get(nxt, ())))
    return None
