"""Routing engines: every engine's LFTs pass the checker with the properties it promises."""

from __future__ import annotations

import pytest

from ibemu.errors import IbemuError
from ibemu.sm.checker import check
from ibemu.sm.graph import SubnetGraph
from ibemu.sm.routing import ENGINES, PROMISES, RoutingError, compute, compute_with_fallback
from ibemu.sm.routing.fabric import Fabric
from ibemu.testing.fromtopo import graph_of
from ibemu.topo import generate
from tests.unit.sm.conftest import TOPOLOGIES

TREES = ["fat-tree-k4", "fat-tree-k8", "fat-tree-2l", "leaf-spine"]
GRIDS = ["torus-4x4", "torus-3x3x3", "mesh-4x4", "mesh-3x4x2", "ring"]
CASES = [(t, e) for t in TOPOLOGIES for e in ("minhop", "updn")]
CASES += [(t, "ftree") for t in TREES] + [(t, "dor") for t in GRIDS]

_GRAPHS: dict[str, SubnetGraph] = {}


def graph(name: str) -> SubnetGraph:
    if name not in _GRAPHS:
        gen, params = TOPOLOGIES[name]
        _GRAPHS[name] = graph_of(generate(gen, **params))
    return _GRAPHS[name]


@pytest.mark.parametrize(("topo", "engine"), CASES)
def test_engine_passes_checker(topo: str, engine: str) -> None:
    g = graph(topo)
    routes = compute(g, engine)
    minimal, deadlock_free = PROMISES[engine]
    if engine == "dor" and topo.startswith("mesh"):
        deadlock_free = True
    rep = check(g, routes, expect_minimal=minimal, expect_deadlock_free=deadlock_free)
    assert rep.ok, rep.errors
    assert rep.ca_pairs == len(g.cas()) * (len(g.cas()) - 1)
    assert rep.unreachable == rep.loops == rep.blackholes == 0
    assert routes.engine == engine and routes.compute_s > 0
    # every switch has an entry for every LID, its own LID -> 0
    lids = set(g.lid_owners())
    for sw in g.switches():
        assert set(routes.lfts[sw.guid]) == lids
        assert routes.lfts[sw.guid][sw.lid] == 0


@pytest.mark.parametrize("topo", ["torus-4x4", "ring"])
def test_dor_on_torus_warns_of_the_credit_loop(topo: str) -> None:
    g = graph(topo)
    rep = check(g, compute(g, "dor"), expect_minimal=True, expect_deadlock_free=False)
    assert rep.ok and rep.cdg_cycle and rep.warnings
    strict = check(g, compute(g, "dor"), expect_deadlock_free=True)
    assert not strict.ok


def test_dor_on_3_rings_has_no_credit_loop() -> None:
    """With 3 switches per ring no route takes two hops in one ring: nothing to close a loop."""
    g = graph("torus-3x3x3")
    assert check(g, compute(g, "dor"), expect_deadlock_free=True).ok


@pytest.mark.parametrize("topo", ["torus-4x4", "dragonfly", "ring"])
def test_minhop_on_cyclic_fabrics_has_credit_loops_updn_has_none(topo: str) -> None:
    g = graph(topo)
    assert check(g, compute(g, "minhop")).cdg_cycle
    assert check(g, compute(g, "updn")).cdg_cycle is None


def up_port_spread(g: SubnetGraph, routes_lfts: dict[int, dict[int, int]]) -> int:
    """Worst per-switch (max - min) of CA LIDs carried by each up-port (towards the core)."""
    fab = Fabric.of(g)
    level = {n.guid: 0 for n in g.cas()}
    # level by distance from CAs
    from ibemu.sm.routing.updn import bfs_dist, leaf_mask

    dist = bfs_dist(fab.adj, leaf_mask(fab), fab.n)
    worst = 0
    for v, guid in enumerate(fab.guids):
        ups = [p for p, u in fab.port_peer[v].items() if dist[u] > dist[v]]
        if len(ups) < 2:
            continue
        count = dict.fromkeys(ups, 0)
        for lid, p in routes_lfts[guid].items():
            if p in count and lid in fab.ca_at:
                count[p] += 1
        worst = max(worst, max(count.values()) - min(count.values()))
    del level
    return worst


@pytest.mark.parametrize("topo", ["fat-tree-k4", "fat-tree-k8", "fat-tree-2l"])
@pytest.mark.parametrize("engine", ["ftree", "minhop", "updn"])
def test_up_ports_balanced_on_full_fat_tree(topo: str, engine: str) -> None:
    g = graph(topo)
    assert up_port_spread(g, compute(g, engine).lfts) <= 1


def test_ftree_converges_on_one_top_switch_per_destination() -> None:
    g = graph("fat-tree-k8")
    routes = compute(g, "ftree")
    fab = Fabric.of(g)
    cores = {n.guid for n in g.switches() if n.desc.startswith("ibemu core")}
    used: dict[int, set[int]] = {}
    for ca in g.cas():
        lid = ca.lid
        for core in cores:
            del core
        # follow every leaf's route up to the top
        for v in range(fab.n):
            if not fab.ca_lids[v]:
                continue
            x = v
            while fab.guids[x] not in cores:
                port = routes.lfts[fab.guids[x]][lid]
                nxt = fab.port_peer[x].get(port)
                if nxt is None:
                    break
                x = nxt
            if fab.guids[x] in cores:
                used.setdefault(lid, set()).add(fab.guids[x])
    assert used and all(len(s) == 1 for s in used.values())
    owners = [next(iter(s)) for s in used.values()]
    per_core = {c: owners.count(c) for c in cores}
    assert max(per_core.values()) - min(per_core.values()) <= 1


@pytest.mark.parametrize("topo", ["torus-4x4", "mesh-4x4", "dragonfly", "ring"])
def test_ftree_refuses_non_trees(topo: str) -> None:
    with pytest.raises(RoutingError, match="ftree"):
        compute(graph(topo), "ftree")


def test_dor_infers_coordinates_or_refuses() -> None:
    g = graph_of(generate("fat-tree", k=4))
    with pytest.raises(RoutingError, match="mesh/torus"):
        compute(g, "dor")
    for gen, params in (("mesh", {"dims": (3, 4)}), ("torus", {"dims": (3, 4, 5), "hosts_per_switch": 2})):
        g = graph_of(generate(gen, **params))
        known = compute(g, "dor")
        for n in g.switches():
            n.coords = None
        inferred = compute(g, "dor")  # from port numbers, as discovery would leave it
        assert inferred.lfts == known.lfts
    g = graph_of(generate("mesh", dims=(3, 3)))
    g.switches()[0].coords = (0, 0, 0)
    with pytest.raises(RoutingError, match="coordinates"):
        compute(g, "dor")


def test_fallback_to_minhop_and_errors_are_ibemu_errors(caplog: pytest.LogCaptureFixture) -> None:
    g = graph("torus-4x4")
    routes = compute_with_fallback(g, "ftree")
    assert routes.engine == "minhop"
    assert "falling back to minhop" in caplog.text
    with pytest.raises(IbemuError, match="unknown routing engine"):
        compute(g, "lash")
    with pytest.raises(ValueError):
        compute(g, "lash")
    assert set(ENGINES) == {"minhop", "updn", "ftree", "dor", "ftree_ar", "updn_ar"}


def test_updn_given_roots() -> None:
    g = graph("torus-4x4")
    root = min(n.guid for n in g.switches())
    routes = compute(g, "updn", roots=[root])
    rep = check(g, routes, expect_deadlock_free=True)
    assert rep.ok, rep.errors
    with pytest.raises(RoutingError, match="root"):
        compute(g, "updn", roots=[12345])


def test_updn_roots_are_the_cores_of_a_fat_tree() -> None:
    from ibemu.sm.routing.updn import find_roots

    g = graph("fat-tree-k4")
    fab = Fabric.of(g)
    roots = {g.nodes[fab.guids[r]].desc for r in find_roots(fab)}
    assert roots == {f"ibemu core{i}" for i in range(4)}


def test_single_switch_and_lone_switches() -> None:
    g = graph_of(generate("single-switch", hosts=3))
    for engine in ("minhop", "updn", "ftree"):
        rep = check(g, compute(g, engine), expect_minimal=True, expect_deadlock_free=True)
        assert rep.ok and rep.ca_pairs == 6 and rep.max_hops == 2


@pytest.mark.parametrize("engine", ["minhop", "updn"])
@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_minhop_balances_ca_lids_on_partial_fat_trees(engine: str, hosts: int) -> None:
    """CA LIDs are spread first, switch LIDs after: no up-port is left without data LIDs."""
    g = graph_of(generate("fat-tree", k=8, hosts_per_edge=hosts))
    assert up_port_spread(g, compute(g, engine).lfts) <= 1


def test_the_engine_registry_is_what_the_scenario_and_the_cli_take() -> None:
    import argparse

    from ibemu.cli import run_cmd
    from ibemu.scenario import ScenarioError, loads_scenario

    for name, entry in ENGINES.items():
        assert callable(entry.route) and PROMISES[name] == (entry.minimal, entry.deadlock_free)
        scen = loads_scenario(f"topology: {{generator: fat-tree, k: 4}}\nsm: {{engine: {name}}}\n", "x.yaml")
        assert scen.sm.engine == name
    with pytest.raises(ScenarioError) as exc:
        loads_scenario("topology: {generator: fat-tree, k: 4}\nsm: {engine: lash}\n", "x.yaml")
    assert str(exc.value).splitlines()[0] == f"x.yaml:2 sm.engine: expected one of {', '.join(ENGINES)}, got 'lash'"
    parser = argparse.ArgumentParser()
    run_cmd.register(parser.add_subparsers())
    (action,) = [a for sub in parser._subparsers._group_actions for p in sub.choices.values()  # type: ignore[union-attr]
                 for a in p._actions if "--sm-engine" in a.option_strings]
    assert tuple(action.choices or ()) == tuple(ENGINES)
