"""Analysis: hop counts, diameter, oversubscription and bisection against closed formulas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu.topo import Topology, generate
from ibemu.topo import analysis as an
from ibemu.topo.rates import LinkRate


def test_hops_do_not_cross_hosts() -> None:
    t = Topology()
    t.add_switch("a", 2)
    t.add_switch("b", 2)
    t.add_ca("h", 2)  # dual-homed: must not become a path between a and b
    t.connect("h", 1, "a", 1)
    t.connect("h", 2, "b", 1)
    d = an.hop_distances(t, "a")
    assert d == {"a": 0, "h": 1}
    assert an.hop_distances(t, "h") == {"h": 0, "a": 1, "b": 1}
    assert an.switch_hops(t)["a"] == {"a": 0}


def test_fat_tree_hops() -> None:
    t = generate("fat-tree", k=4)
    d = an.hop_distances(t, "h0")
    assert (d["h1"], d["h2"], d["h4"]) == (2, 4, 6)
    assert an.switch_hops(t)["edge0_0"]["edge3_1"] == 4
    assert an.host_diameter(t) == 6


@pytest.mark.parametrize(
    ("gen", "params", "diameter"),
    [
        ("fat-tree", {"k": 4, "levels": 2}, 4),
        ("leaf-spine", {"leaves": 3}, 4),
        ("torus", {"dims": "5x5"}, 2 + 4),
        ("mesh", {"dims": "3x4"}, 2 + 5),
        ("ring", {"switches": 7}, 2 + 3),
        ("single-switch", {"hosts": 4}, 2),
        ("dragonfly", {"routers_per_group": 2, "global_links": 1, "hosts_per_router": 1}, 2 + 3),
    ],
)
def test_diameters(gen: str, params: dict[str, object], diameter: int) -> None:
    assert an.host_diameter(generate(gen, params)) == diameter


def test_diameter_of_disconnected_fabric_is_none() -> None:
    t = Topology()
    t.add_ca("a")
    t.add_ca("b")
    assert an.host_diameter(t) is None


@settings(max_examples=15, deadline=None)
@given(hosts=st.integers(1, 12), mult=st.integers(1, 3), spines=st.integers(1, 3))
def test_leaf_spine_oversubscription_and_bisection(hosts: int, mult: int, spines: int) -> None:
    up = spines * mult
    t = generate("leaf-spine", leaves=4, spines=spines, hosts_per_leaf=hosts, uplinks_per_leaf=up)
    assert an.oversubscription(t) == pytest.approx(hosts / up)
    # two leaves' worth of hosts on each side: limited by hosts or by the two leaves' uplinks
    assert an.bisection_gbps(t) == pytest.approx(100 * min(2 * hosts, 2 * up))


def test_uplink_rate_changes_oversubscription() -> None:
    t = generate("leaf-spine", leaves=2, spines=2, hosts_per_leaf=8, uplink_rate=LinkRate(4, "NDR"))
    assert an.oversubscription(t) == pytest.approx(800 / 800)
    tiers = an.tier_loads(t)
    assert [(x.level, x.switches, x.down_gbps, x.up_gbps) for x in tiers] == [
        (1, 2, 800, 800),
        (2, 2, 800, 0),
    ]


@pytest.mark.parametrize("k", [2, 4, 6])
def test_fat_tree_full_bisection(k: int) -> None:
    t = generate("fat-tree", k=k)
    assert an.bisection_gbps(t) == pytest.approx(100 * k**3 / 8)
    assert an.oversubscription(t) == 1.0


def test_thin_fat_tree() -> None:
    t = generate("fat-tree", k=4, hosts_per_edge=1)
    assert an.oversubscription(t) == 1.0  # the edge tier is under-, not over-subscribed
    assert an.tier_loads(t)[0].down_gbps == 100


def test_summary_and_levels_of_an_import() -> None:
    from ibemu.topo import ibnetdiscover as ib

    t = ib.loads(ib.dumps(generate("fat-tree", k=4)))
    assert all(n.level is None for n in t.nodes.values())
    levels = an.infer_levels(t)
    assert (levels["h0"], levels["edge0_0"], levels["agg0_0"], levels["core0"]) == (0, 1, 2, 3)
    s = an.summarize(t)
    assert (s.nodes, s.links, s.switch_links, s.radix, s.rates, s.parts, s.diameter) == (
        36, 48, 32, {4: 20}, {"4xEDR": 48}, 1, 6,
    )  # fmt: skip
    assert s.tiers == []  # no levels in an import
