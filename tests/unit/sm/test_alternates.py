"""Adaptive-routing groups: ftree_ar / updn_ar alternates reach, stay legal, keep the CDG
acyclic, survive the loss of the primary's link; the checker catches alternates that do not."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from hypothesis import given

from ibemu.sm.checker import check_alternates
from ibemu.sm.graph import ArRoutes, SubnetGraph
from ibemu.sm.routing import ENGINES, RoutingError, compute
from ibemu.sm.routing import alternates as alt_mod
from ibemu.sm.routing.alternates import AR_ENGINES, MAX_ALTERNATES, ArEngine, compute_ar
from ibemu.sm.routing.core import State
from ibemu.sm.routing.fabric import Fabric
from ibemu.testing.fromtopo import graph_of, remove_link, restore_link
from ibemu.topo import generate
from tests.unit.sm.conftest import TOPOLOGIES
from tests.unit.sm.test_routing_random import SETTINGS, fabrics

UPDN_TOPOS = ["ring", "torus-4x4", "mesh-4x4", "torus-3x3x3", "dragonfly", "leaf-spine", "fat-tree-2l"]


def topo(name: str) -> SubnetGraph:
    gen, params = TOPOLOGIES[name]
    return graph_of(generate(gen, **params))


def desc(g: SubnetGraph, guid: int) -> str:
    return g.nodes[guid].desc.removeprefix("ibemu ")


def walk(fab: Fabric, lfts: dict[int, dict[int, int]], v: int, port: int, lid: int) -> int | None:
    """Switch hops from switch index ``v`` leaving on ``port``, then along ``lfts``, to the
    switch that delivers ``lid``; None if it visits a switch twice or falls off the fabric."""
    dest = fab.lid_switch(lid)
    seen = {v}
    while v != dest:
        nxt = fab.port_peer[v].get(port)
        if nxt is None or nxt in seen:
            return None
        v = nxt
        seen.add(v)
        port = lfts[fab.guids[v]].get(lid, 0xFF)
    return len(seen) - 1


def all_alternates(ar: ArRoutes) -> list[tuple[int, int, tuple[int, ...]]]:
    return [(g, lid, ports) for g, table in ar.alternates.items() for lid, ports in table.items()]


def test_ftree_ar_k4_groups() -> None:
    g = topo("fat-tree-k4")
    t0 = time.perf_counter()
    ar = compute_ar(g, "ftree_ar")
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.1, elapsed
    assert ar.engine == "ftree_ar" and ar.primary.engine == "ftree" and ar.compute_s > 0
    edge_of = {ca.lid: desc(g, ca.ports[1].peer[0]) for ca in g.cas() if ca.ports[1].peer}
    assert len(edge_of) == 16
    switch_lids = {sw.lid for sw in g.switches()}
    switch_alts = 0
    for sw in g.switches():
        name = desc(g, sw.guid)
        table = {lid: ports for lid, ports in ar.alternates.get(sw.guid, {}).items() if lid not in switch_lids}
        assert sw.lid not in ar.alternates.get(sw.guid, {})  # a switch delivers its own LID
        switch_alts += sum(len(p) for lid, p in ar.alternates.get(sw.guid, {}).items() if lid in switch_lids)
        if name.startswith("core"):
            assert not table  # a core reaches each pod by its single down port
            continue
        pod = name[len("edge") if name.startswith("edge") else len("agg"):].split("_")[0]
        for lid, edge in edge_of.items():
            primary = ar.primary.lfts[sw.guid][lid]
            # an edge: LIDs on other edges; an aggregation switch: LIDs in other pods
            remote = edge != name if name.startswith("edge") else edge.split("_")[0] != f"edge{pod}"
            if not remote:
                assert lid not in table, (name, lid)
                continue
            ports = table[lid]
            assert len(ports) == 1 and ports[0] != primary  # k/2 = 2 up ports: one alternate
            up = g.nodes[sw.ports[ports[0]].peer[0]]
            assert desc(g, up.guid).startswith("agg" if name.startswith("edge") else "core")
    rep = check_alternates(g, ar)
    assert rep.ok, rep.errors
    assert rep.alternates == 8 * 14 + 8 * 12 + switch_alts  # edges: remote LIDs; aggs: other pods'
    assert switch_alts > 0
    assert rep.alt_longer == 0 and rep.loops == rep.blackholes == 0
    assert rep.cdg_cycle is None and rep.cdg_edges > 0


@pytest.mark.parametrize(("name", "engine"), [("fat-tree-k4", "ftree_ar"), ("leaf-spine", "ftree_ar")]
                         + [(t, "updn_ar") for t in ["fat-tree-k4", *UPDN_TOPOS]])
def test_every_alternate_reaches_its_lid_at_the_primary_cost(name: str, engine: str) -> None:
    g = topo(name)
    ar = compute_ar(g, engine)
    fab = Fabric.of(g)
    lfts = ar.primary.lfts
    for guid, lid, ports in all_alternates(ar):
        v = fab.index[guid]
        primary = walk(fab, lfts, v, lfts[guid][lid], lid)
        assert primary is not None
        for p in ports:
            assert walk(fab, lfts, v, p, lid) == primary, (hex(guid), lid, p)


def test_ftree_ar_k8_bounded_balanced_and_fast() -> None:
    g = topo("fat-tree-k8")
    t0 = time.perf_counter()
    ar = compute_ar(g, "ftree_ar")
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed
    assert all(len(p) == MAX_ALTERNATES for _, _, p in all_alternates(ar))  # 4 up ports: 3 others
    # the first alternates of the LIDs one up-port carries are spread evenly over the others
    for sw in g.switches():
        name = desc(g, sw.guid)
        if not name.startswith("edge"):
            continue
        table = ar.alternates[sw.guid]
        by_primary: dict[int, Counter[int]] = {}
        for lid, ports in table.items():
            by_primary.setdefault(ar.primary.lfts[sw.guid][lid], Counter())[ports[0]] += 1
        assert len(by_primary) == 4
        for primary, firsts in by_primary.items():
            assert primary not in firsts and len(firsts) == 3
            assert max(firsts.values()) - min(firsts.values()) <= 1, (name, primary, firsts)
    rep = check_alternates(g, ar)
    assert rep.ok and rep.cdg_cycle is None and rep.alt_longer == 0


@pytest.mark.parametrize("name", UPDN_TOPOS)
def test_updn_ar_keeps_the_cdg_acyclic_and_turns_legal(name: str) -> None:
    g = topo(name)
    ar = compute_ar(g, "updn_ar")
    rep = check_alternates(g, ar)
    assert rep.ok, rep.errors
    assert rep.cdg_cycle is None and rep.alternates > 0 and rep.alt_longer == 0
    st = ar.primary.state
    assert isinstance(st, State) and st.down_adj is not None
    fab = st.fabric
    # a hop down (to a switch in down_adj) is never followed by a hop up, whatever is chosen
    for guid, table in ar.alternates.items():
        v = fab.index[guid]
        for lid, ports in table.items():
            assert len(ports) <= MAX_ALTERNATES
            if lid not in fab.ca_at:
                continue  # a switch LID: minhop's equal-cost ports (management, VL15)
            dest = fab.lid_switch(lid)
            for p in (ar.primary.lfts[guid][lid], *ports):
                u = fab.port_peer[v][p]
                if u == dest or not st.down_adj[v] >> u & 1:
                    continue
                ug = fab.guids[u]
                for q in (ar.primary.lfts[ug][lid], *ar.alternates.get(ug, {}).get(lid, ())):
                    assert st.down_adj[u] >> fab.port_peer[u][q] & 1, (name, lid, guid, p, q)


def test_ring_alternates_only_where_both_ways_are_legal_and_equal() -> None:
    """6 switches, updn's root sw0: the bottom sw3 may go up either way to sw0's hosts, and
    sw0 down either way to sw3's; every other pair has one legal shortest way (for CA LIDs;
    a switch LID has minhop's equal-cost ports, see the next test)."""
    g = topo("ring")
    ar = compute_ar(g, "updn_ar")
    by_name = {desc(g, guid): {lid: p for lid, p in table.items() if lid in {ca.lid for ca in g.cas()}}
               for guid, table in ar.alternates.items()}
    by_name = {name: table for name, table in by_name.items() if table}
    assert set(by_name) == {"sw0", "sw3"}
    hosts = {sw: {ca.lid for ca in g.cas() if desc(g, ca.ports[1].peer[0]) == sw} for sw in ("sw0", "sw3")}
    assert set(by_name["sw3"]) == hosts["sw0"] and set(by_name["sw0"]) == hosts["sw3"]


@pytest.mark.parametrize("engine", list(AR_ENGINES))
def test_deterministic(engine: str) -> None:
    a = compute_ar(topo("fat-tree-k4"), engine)
    b = compute_ar(topo("fat-tree-k4"), engine)
    assert a.alternates == b.alternates and a.primary.lfts == b.primary.lfts
    assert list(a.alternates) == list(b.alternates)


def test_alternates_recomputed_when_routes_carry_no_state() -> None:
    g = topo("fat-tree-k4")
    routes = compute(g, "ftree")
    with_state = AR_ENGINES["ftree_ar"].alternates(g, routes)
    routes.state = None
    assert AR_ENGINES["ftree_ar"].alternates(g, routes) == with_state


@pytest.mark.parametrize("engine", ["minhop", "dor"])
def test_engines_without_deadlock_freedom_offer_no_alternates(engine: str) -> None:
    with pytest.raises(RoutingError, match="does not promise deadlock freedom"):
        compute_ar(topo("mesh-4x4"), engine)


def test_unknown_and_offered_as_adaptive_engines() -> None:
    with pytest.raises(RoutingError, match="unknown adaptive"):
        compute_ar(topo("fat-tree-k4"), "nope")
    # offered as engines (the SM writes the alternates; the kernel datapath fails over to them)
    assert all(ENGINES[n].adaptive and ENGINES[n].deadlock_free for n in AR_ENGINES)
    assert not any(e.adaptive for n, e in ENGINES.items() if n not in AR_ENGINES)
    assert {e.base for e in AR_ENGINES.values()} <= {n for n, e in ENGINES.items() if e.deadlock_free}


@pytest.mark.parametrize(("name", "engine"), [("fat-tree-k4", "ftree_ar"), ("fat-tree-k4", "updn_ar"),
                                              ("leaf-spine", "updn_ar"), ("dragonfly", "updn_ar")])
def test_first_alternate_survives_the_primary_link_going_down(name: str, engine: str) -> None:
    """Local failover: a dead primary port, its LIDs on their first alternate still arrive."""
    g = topo(name)
    ar = compute_ar(g, engine)
    fab = Fabric.of(g)
    lfts = ar.primary.lfts
    tried = 0
    ends = [end for i, port, j, jport in fab.links() for end in ((i, port), (j, jport))]
    for i, port in ends:
        guid = fab.guids[i]
        peer = remove_link(g, guid, port)
        assert peer is not None
        dead = Fabric.of(g)
        for lid, p in lfts[guid].items():
            if p != port or lid not in dead.ca_at:
                continue
            ports = ar.alternates.get(guid, {}).get(lid)
            if engine == "ftree_ar" and desc(g, guid).startswith("edge") and dead.lid_switch(lid) != i:
                assert ports, (desc(g, guid), lid)  # an up-port's LIDs always have one
            if ports:
                tried += 1
                assert walk(dead, lfts, i, ports[0], lid) is not None, (desc(g, guid), port, lid)
        restore_link(g, guid, port, peer)
    assert tried > 0


# --- the checker catches alternates that break the promise ---------------------------------


def ring_updn() -> tuple[SubnetGraph, ArRoutes, Fabric]:
    g = topo("ring")
    return g, ArRoutes("hand", compute(g, "updn")), Fabric.of(g)


def port_towards(g: SubnetGraph, a: str, b: str) -> tuple[int, int]:
    guid = {desc(g, s.guid): s.guid for s in g.switches()}
    return guid[a], next(n for n, peer, _ in g.nodes[guid[a]].neighbors() if peer == guid[b])


def host_lid(g: SubnetGraph, sw: str) -> int:
    return min(ca.lid for ca in g.cas() if desc(g, ca.ports[1].peer[0]) == sw)


def test_illegal_turns_close_a_credit_loop() -> None:
    """On the 6-ring under updn, every switch gets for the hosts two switches clockwise the
    clockwise port as alternate (2 hops, each walk alone arrives): at sw2 that turns down->up
    at the bottom switch sw3, and the clockwise chain closes the ring's credit loop."""
    g, ar, fab = ring_updn()
    st = ar.primary.state
    assert isinstance(st, State) and st.up_adj is not None and st.down_adj is not None
    turns = 0
    for i in range(6):
        here, nxt, dest = f"sw{i}", f"sw{(i + 1) % 6}", f"sw{(i + 2) % 6}"
        guid, cw = port_towards(g, here, nxt)
        assert ar.primary.lfts[port_towards(g, nxt, dest)[0]][host_lid(g, dest)] == port_towards(g, nxt, dest)[1]
        for lid in (ca.lid for ca in g.cas() if desc(g, ca.ports[1].peer[0]) == dest):
            if ar.primary.lfts[guid][lid] != cw:
                ar.alternates.setdefault(guid, {})[lid] = (cw,)
                v = fab.index[guid]
                u = fab.port_peer[v][cw]
                w = fab.port_peer[u][ar.primary.lfts[fab.guids[u]][lid]]
                turns += st.down_adj[v] >> u & st.up_adj[u] >> w & 1
    assert turns > 0
    rep = check_alternates(g, ar)
    assert rep.loops == rep.blackholes == 0  # each walk alone arrives: only the CDG tells
    assert not rep.ok and rep.cdg_cycle is not None and len(rep.cdg_cycle) == 6
    assert {guid for guid, _ in rep.cdg_cycle} == {s.guid for s in g.switches()}
    assert any("cycle of 6 channels" in e for e in rep.errors)
    # without the one illegal turn's alternate the chain is open again
    guid, _ = port_towards(g, "sw2", "sw3")
    del ar.alternates[guid]
    assert check_alternates(g, ar).ok


def bad(graph: SubnetGraph, routes: object) -> dict[int, dict[int, tuple[int, ...]]]:
    """Alternates along the shortest way round (minhop's), where updn goes the other way."""
    shortest = compute(graph, "minhop")
    primary = compute(graph, "updn")
    cas = {ca.lid for ca in graph.cas()}
    out: dict[int, dict[int, tuple[int, ...]]] = {}
    for guid, lft in shortest.lfts.items():
        for lid, q in lft.items():
            if lid in cas and q != primary.lfts[guid][lid]:
                out.setdefault(guid, {})[lid] = (q,)
    return out


def test_compute_ar_refuses_alternates_that_break_the_promise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(alt_mod.AR_ENGINES, "updn_ar", ArEngine("updn", bad))
    with pytest.raises(RoutingError, match=r"alternates break the promise.*(loop|cycle)"):
        compute_ar(topo("ring"), "updn_ar")
    with pytest.raises(RoutingError, match=r"cycle of \d+ channels .*: 0x[0-9a-f]+/\d+ -> 0x"):
        compute_ar(graph_of(generate("ring", switches=4)), "updn_ar")


def test_checker_finds_bad_alternate_entries() -> None:
    g, ar, _ = ring_updn()
    sw0, to1 = port_towards(g, "sw0", "sw1")
    _, to5 = port_towards(g, "sw0", "sw5")
    lid1 = host_lid(g, "sw1")
    # sw0 -> sw1 is direct; sw0's alternate via sw5 comes back through sw0 (updn's way to sw1)
    assert ar.primary.lfts[sw0][lid1] == to1
    ar.alternates[sw0] = {lid1: (to5,)}
    rep = check_alternates(g, ar)
    assert not rep.ok and rep.loops == 1 and any("comes back" in e for e in rep.errors)
    ar.alternates[sw0] = {lid1: (to1,)}  # the primary itself
    assert not check_alternates(g, ar).ok
    ar.alternates[sw0] = {lid1: (1,)}  # a host port: leads to no switch
    rep = check_alternates(g, ar)
    assert not rep.ok and rep.blackholes == 1
    ar.alternates[sw0] = {host_lid(g, "sw0"): (to1,)}  # the owner must deliver
    assert any("must deliver" in e for e in check_alternates(g, ar).errors)
    ar.alternates = {sw0: {9999: (to1,)}}
    assert any("no port" in e for e in check_alternates(g, ar).errors)
    ar.alternates = {}
    rep = check_alternates(g, ar)
    assert rep.ok and rep.alternates == 0


def test_union_cdg_includes_the_primary_routes() -> None:
    """No alternates at all: the primary's own credit loop (minhop on a 4-ring) still fails."""
    g = graph_of(generate("ring", switches=4))
    rep = check_alternates(g, ArRoutes("hand", compute(g, "minhop")))
    assert not rep.ok and rep.cdg_cycle is not None and rep.alternates == 0


@SETTINGS
@given(fabrics())
def test_updn_ar_on_random_fabrics(g: SubnetGraph) -> None:
    """Random irregular fabrics (parallel links too): updn_ar never breaks its promise."""
    ar = compute_ar(g, "updn_ar")  # raises if check_alternates fails
    fab = Fabric.of(g)
    for guid, lid, ports in all_alternates(ar):
        v = fab.index[guid]
        primary = walk(fab, ar.primary.lfts, v, ar.primary.lfts[guid][lid], lid)
        assert all(walk(fab, ar.primary.lfts, v, p, lid) == primary for p in ports)


@pytest.mark.parametrize(("name", "engine"), [("fat-tree-k4", "ftree_ar"), ("fat-tree-k8", "ftree_ar"),
                                              ("fat-tree-k4", "updn_ar"), ("dragonfly", "updn_ar")])
def test_degraded_fabric_keeps_the_promise(name: str, engine: str) -> None:
    """Links already down when routing: entries the engine routes by fallback get no
    alternates, and the check still passes (an irregular fabric may get new ranks)."""
    g = topo(name)
    fab = Fabric.of(g)
    full = sum(len(p) for _, _, p in all_alternates(compute_ar(g, engine)))
    for i, port, _j, _jport in list(fab.links())[::7][:3]:
        remove_link(g, fab.guids[i], port)
    ar = compute_ar(g, engine)
    rep = check_alternates(g, ar)
    assert rep.ok and rep.cdg_cycle is None and rep.alternates > 0
    if name.startswith("fat-tree"):
        assert rep.alternates < full  # the same ranks: only the cut links' alternates go


@pytest.mark.parametrize(("name", "engine"), [("fat-tree-k4", "ftree_ar"), ("ring", "updn_ar"), ("torus-4x4", "updn_ar")])
def test_switch_lids_get_the_equal_cost_ports_of_minhop(name: str, engine: str) -> None:
    """A switch LID's alternates at a switch are exactly its other neighbours one hop closer to
    that switch (capped at MAX_ALTERNATES), so a switch that loses the port moves the LID
    instead of announcing it lost; the CDG is built from CA LIDs only, and stays acyclic."""
    g = topo(name)
    ar = compute_ar(g, engine)
    fab = Fabric.of(g)
    dist = {}
    for w in range(fab.n):  # BFS hop counts between switches
        d = {w: 0}
        todo = [w]
        for v in todo:
            for u in (i for i in range(fab.n) if fab.adj[v] >> i & 1):
                if u not in d:
                    d[u] = d[v] + 1
                    todo.append(u)
        dist[w] = d
    seen = 0
    for v, guid in enumerate(fab.guids):
        table = ar.alternates.get(guid, {})
        for w, lid in enumerate(fab.sw_lid):
            if not lid or w == v:
                continue
            primary = ar.primary.lfts[guid][lid]
            closer = sorted({p for p, u in fab.port_peer[v].items() if dist[w].get(u, -1) == dist[w][v] - 1})
            assert primary in closer
            want = [p for p in closer if p != primary]
            got = table.get(lid, ())
            assert sorted(got) == want[:MAX_ALTERNATES] or (len(want) > MAX_ALTERNATES and len(got) == MAX_ALTERNATES
                                                            and set(got) <= set(want)), (name, v, lid)
            seen += len(got)
    assert seen > 0
    rep = check_alternates(g, ar)
    assert rep.ok and rep.cdg_cycle is None, rep.errors
