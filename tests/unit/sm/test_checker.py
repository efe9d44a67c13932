"""The checker finds what is wrong: loops, black holes, detours, credit loops, partitions."""

from __future__ import annotations

import pytest

from ibemu.sm.checker import check
from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.routing import compute
from ibemu.sm.routing.fabric import NO_PATH
from ibemu.testing.fromtopo import graph_of, remove_link
from ibemu.topo import generate


def fat4() -> tuple[SubnetGraph, Routes]:
    g = graph_of(generate("fat-tree", k=4))
    return g, compute(g, "ftree")


def by_desc(g: SubnetGraph, desc: str) -> int:
    return next(n.guid for n in g.switches() if n.desc == f"ibemu {desc}")


def port_to(g: SubnetGraph, a: int, b: int) -> int:
    return next(num for num, peer, _ in g.nodes[a].neighbors() if peer == b)


def test_clean_routes_pass_with_figures() -> None:
    g, routes = fat4()
    rep = check(g, routes, expect_minimal=True, expect_deadlock_free=True)
    assert rep.ok and not rep.errors and not rep.warnings
    assert rep.ca_pairs == 16 * 15
    assert rep.max_hops == 6  # CA, edge, agg, core, agg, edge, CA
    assert 2 < rep.avg_hops < 6
    assert rep.cdg_channels > 0 and rep.cdg_edges > 0 and rep.cdg_cycle is None
    assert "ok" in rep.summary()


def test_forwarding_loop_is_found() -> None:
    g, routes = fat4()
    edge, agg = by_desc(g, "edge0_0"), by_desc(g, "agg0_0")
    lid = next(n.lid for n in g.cas() if n.desc.startswith("h4 "))  # a host in pod 1
    routes.lfts[edge][lid] = port_to(g, edge, agg)
    routes.lfts[agg][lid] = port_to(g, agg, edge)
    rep = check(g, routes)
    assert not rep.ok and rep.loops >= 1 and rep.unreachable > 0
    assert any("loop" in e for e in rep.errors)


def test_missing_entry_and_dead_port_are_black_holes() -> None:
    g, routes = fat4()
    core = by_desc(g, "core0")
    lid = g.cas()[0].lid
    del routes.lfts[core][lid]
    rep = check(g, routes)
    assert not rep.ok and rep.blackholes == 1
    g, routes = fat4()
    edge = by_desc(g, "edge0_0")
    routes.lfts[edge][g.cas()[-1].lid] = NO_PATH
    rep = check(g, routes)
    assert not rep.ok and rep.blackholes == 1 and rep.unreachable == 2  # both hosts of edge0_0


def test_owner_must_deliver_to_its_own_port() -> None:
    g, routes = fat4()
    edge = by_desc(g, "edge0_0")
    lid = g.cas()[0].lid  # h0 on edge0_0 port 1
    routes.lfts[edge][lid] = 2
    rep = check(g, routes)
    assert not rep.ok and any("owns LID" in e for e in rep.errors)


def test_detour_is_not_minimal() -> None:
    g = graph_of(generate("ring", switches=6))
    routes = compute(g, "minhop")
    sw = [by_desc(g, f"sw{i}") for i in range(6)]
    lid = g.nodes[sw[1]].lid
    # sw0 -> sw1 the long way round: sw0, sw5, sw4, sw3, sw2, sw1
    for a, b in ((0, 5), (5, 4), (4, 3)):
        routes.lfts[sw[a]][lid] = port_to(g, sw[a], sw[b])
    host = next(peer for _, peer, _ in g.nodes[sw[1]].neighbors() if not g.nodes[peer].is_switch)
    lid = g.nodes[host].lid
    for a, b in ((0, 5), (5, 4), (4, 3)):
        routes.lfts[sw[a]][lid] = port_to(g, sw[a], sw[b])
    assert check(g, routes).ok
    rep = check(g, routes, expect_minimal=True)
    assert not rep.ok and rep.non_minimal == 2  # hosts of sw0, sw5 (sw4 is 3 hops either way)


def test_credit_loop_is_found() -> None:
    g = graph_of(generate("ring", switches=4))
    routes = compute(g, "minhop")
    rep = check(g, routes, expect_deadlock_free=True)
    assert not rep.ok and rep.cdg_cycle is not None and len(rep.cdg_cycle) >= 3
    switches = {n.guid for n in g.switches()}
    assert all(guid in switches for guid, _ in rep.cdg_cycle)
    soft = check(g, routes, expect_deadlock_free=False)
    assert soft.ok and soft.warnings


def test_partition_counts_pairs_not_errors() -> None:
    g = graph_of(generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2))
    leaf0 = by_desc(g, "leaf0")
    up = next(num for num, peer, _ in g.nodes[leaf0].neighbors() if g.nodes[peer].is_switch)
    remove_link(g, leaf0, up)
    routes = compute(g, "minhop")
    rep = check(g, routes, expect_minimal=True)
    assert rep.ok, rep.errors
    assert rep.disconnected == 2 * 2 * 2 * 2 // 2 and rep.ca_pairs == 4


def test_missing_switch_table() -> None:
    g, routes = fat4()
    del routes.lfts[by_desc(g, "core3")]
    assert not check(g, routes).ok


@pytest.mark.parametrize("engine", ["minhop", "updn", "ftree"])
def test_k8_checks_fast_enough_to_run_in_tests(engine: str) -> None:
    g = graph_of(generate("fat-tree", k=8))
    rep = check(g, compute(g, engine), expect_minimal=engine != "updn")
    assert rep.ok and rep.ca_pairs == 128 * 127
