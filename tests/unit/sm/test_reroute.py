"""Incremental reroute: one link fails or comes back; only the hurt LIDs move."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu.sm.checker import check
from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.reroute import LFT_BLOCK, reroute
from ibemu.sm.routing import compute
from ibemu.sm.routing.fabric import NO_PATH
from ibemu.testing.fromtopo import graph_of, remove_link, restore_link
from ibemu.topo import generate
from tests.unit.sm.test_routing import up_port_spread


def switch_links(g: SubnetGraph) -> list[tuple[int, int, int, int]]:
    out = []
    for n in g.switches():
        for num, peer, pport in n.neighbors():
            if num and g.nodes[peer].is_switch and (n.guid, num) < (peer, pport):
                out.append((n.guid, num, peer, pport))
    return out


def hurt_lids(prev: Routes, a: int, pa: int, b: int, pb: int) -> set[int]:
    """LIDs some switch forwarded over the link a:pa - b:pb (computed independently)."""
    return {lid for lid, p in prev.lfts[a].items() if p == pa} | {
        lid for lid, p in prev.lfts[b].items() if p == pb
    }


def apply(prev: Routes, diff: dict[int, dict[int, int]]) -> dict[int, dict[int, int]]:
    out = {g: dict(lft) for g, lft in prev.lfts.items()}
    for g, d in diff.items():
        for lid, p in d.items():
            if p == NO_PATH:
                out[g].pop(lid, None)
            else:
                out[g][lid] = p
    return out


@pytest.mark.parametrize("engine", ["minhop", "updn", "ftree"])
def test_every_single_switch_link_failure_of_k4(engine: str) -> None:
    g = graph_of(generate("fat-tree", k=4))
    base = compute(g, engine)
    for a, pa, b, pb in switch_links(g):
        remove_link(g, a, pa)
        res = reroute(g, base, ends=[(a, pa), (b, pb)])
        try:
            assert not res.full and not res.lost
            rep = check(g, res.routes, expect_minimal=engine == "minhop",
                        expect_deadlock_free=engine != "minhop")
            assert rep.ok, (a, pa, rep.errors)
            # only LIDs that crossed the failed link move; the diff is exactly what changed
            assert {lid for d in res.diff.values() for lid in d} <= hurt_lids(base, a, pa, b, pb)
            assert res.affected_lids <= hurt_lids(base, a, pa, b, pb) | res.affected_lids
            assert apply(base, res.diff) == res.routes.lfts
            assert all(p != pa for lid, p in res.routes.lfts[a].items())
            assert res.blocks == {
                gd: {lid // LFT_BLOCK for lid in d} for gd, d in res.diff.items()
            }
            # the same answer without the hint
            assert reroute(g, base).diff == res.diff
            # restoration re-balances: back to what a fresh computation gives
            restore_link(g, a, pa, (b, pb))
            back = reroute(g, res.routes, ends=[(a, pa), (b, pb)])
            assert back.full
            assert back.routes.lfts == base.lfts
            assert apply(res.routes, back.diff) == base.lfts
        finally:
            if g.nodes[a].ports[pa].peer is None:
                restore_link(g, a, pa, (b, pb))


@pytest.mark.parametrize("engine", ["minhop", "updn", "ftree"])
def test_failures_in_sequence_on_k8(engine: str) -> None:
    g = graph_of(generate("fat-tree", k=8))
    routes = compute(g, engine)
    links = switch_links(g)
    for a, pa, b, pb in links[::37][:4]:
        remove_link(g, a, pa)
        res = reroute(g, routes, ends=[(a, pa), (b, pb)])
        assert not res.full
        rep = check(g, res.routes, expect_minimal=engine == "minhop",
                    expect_deadlock_free=engine != "minhop")
        assert rep.ok, rep.errors
        assert res.changed_entries >= 1
        routes = res.routes
    fresh = compute(g, engine)
    assert check(g, fresh, expect_minimal=True).ok


def test_restore_rebalances_ftree() -> None:
    g = graph_of(generate("fat-tree", k=8))
    base = compute(g, "ftree")
    a, pa, b, pb = switch_links(g)[5]
    remove_link(g, a, pa)
    failed = reroute(g, base, ends=[(a, pa)])
    restore_link(g, a, pa, (b, pb))
    assert up_port_spread(g, failed.routes.lfts) > 1  # the detour left the fabric unbalanced
    back = reroute(g, failed.routes, ends=[(a, pa)])
    assert up_port_spread(g, back.routes.lfts) <= 1
    assert back.changed_entries < sum(len(x) for x in base.lfts.values()) / 10


def test_partition_is_reported() -> None:
    g = graph_of(generate("leaf-spine", leaves=3, spines=1, hosts_per_leaf=2))
    routes = compute(g, "updn")
    leaf0 = next(n for n in g.switches() if n.desc == "ibemu leaf0")
    hosts0 = {peer for num, peer, _ in leaf0.neighbors() if not g.nodes[peer].is_switch}
    up = next(num for num, peer, _ in leaf0.neighbors() if g.nodes[peer].is_switch)
    remove_link(g, leaf0.guid, up)
    res = reroute(g, routes, ends=[(leaf0.guid, up)])
    others = {n.guid for n in g.cas()} - hosts0
    assert res.full
    assert set(res.lost) == {n.guid for n in g.cas()}
    for h in hosts0:
        assert res.lost[h] == others
    for h in others:
        assert res.lost[h] == hosts0
    rep = check(g, res.routes, expect_deadlock_free=True)
    assert rep.ok, rep.errors
    assert rep.disconnected == 2 * len(hosts0) * len(others)
    # the unreachable LIDs are dropped from the far side's tables
    spine = next(n for n in g.switches() if n.desc == "ibemu spine0")
    assert all(res.diff[spine.guid][g.nodes[h].lid] == NO_PATH for h in hosts0)


def test_host_link_failure_drops_its_lid() -> None:
    g = graph_of(generate("fat-tree", k=4))
    routes = compute(g, "minhop")
    ca = g.cas()[0]
    peer = remove_link(g, ca.guid, 1)
    assert peer is not None
    res = reroute(g, routes, ends=[peer])
    assert res.full and set(res.lost) == {n.guid for n in g.cas()}
    assert res.lost[ca.guid] == {n.guid for n in g.cas()} - {ca.guid}
    assert all(d.get(ca.lid) == NO_PATH for d in res.diff.values())
    assert check(g, res.routes, expect_minimal=True).ok


def test_no_change_no_diff() -> None:
    g = graph_of(generate("fat-tree", k=4))
    routes = compute(g, "ftree")
    res = reroute(g, routes)
    assert res.diff == {} and res.blocks == {}


def test_routes_without_state_are_recomputed() -> None:
    g = graph_of(generate("mesh", dims=(3, 3)))
    routes = compute(g, "dor")
    a, pa, b, pb = switch_links(g)[0]
    remove_link(g, a, pa)
    res = reroute(g, routes)  # dor cannot route around the hole: minhop takes over
    assert res.full and res.routes.engine == "minhop"
    assert check(g, res.routes, expect_minimal=True).ok
    del b, pb


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([(4, 1), (4, 2), (6, 2), (6, 3)]),
    st.integers(0, 10_000),
    st.sampled_from(["ftree", "updn", "minhop"]),
)
def test_fat_tree_variants_any_failure(shape: tuple[int, int], pick: int, engine: str) -> None:
    k, hosts = shape
    g = graph_of(generate("fat-tree", k=k, hosts_per_edge=hosts))
    routes = compute(g, engine)
    assert check(g, routes, expect_minimal=engine != "updn", expect_deadlock_free=engine != "minhop").ok
    links = switch_links(g)
    a, pa, b, pb = links[pick % len(links)]
    remove_link(g, a, pa)
    res = reroute(g, routes, ends=[(a, pa), (b, pb)])
    assert not res.full
    rep = check(g, res.routes, expect_minimal=engine == "minhop", expect_deadlock_free=engine != "minhop")
    assert rep.ok, rep.errors


def test_updn_keeps_given_roots_across_a_full_recompute() -> None:
    g = graph_of(generate("torus", dims=(4, 4)))
    root = max(n.guid for n in g.switches())
    routes = compute(g, "updn", roots=[root])
    a, pa, b, pb = switch_links(g)[0]
    remove_link(g, a, pa)
    restore_link(g, a, pa, (b, pb))
    res = reroute(g, routes)
    assert res.diff == {}
    remove_link(g, a, pa)
    res = reroute(g, routes, ends=[(a, pa)])
    assert res.routes.state.opts["roots"] == [root]
    assert check(g, res.routes, expect_deadlock_free=True).ok


def test_replaced_switch_recomputes() -> None:
    g = graph_of(generate("fat-tree", k=4))
    routes = compute(g, "minhop")
    other = graph_of(generate("fat-tree", k=4))
    old = other.switches()[0]
    other.nodes.pop(old.guid)
    old.guid += 1
    other.nodes[old.guid] = old
    res = reroute(other, routes)
    assert res.full
