"""Generators: counts by formula, port bounds, connectivity, names (hypothesis), conventions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu.errors import ConfigError
from ibemu.topo.generators import GENERATORS, ParamError, generate
from ibemu.topo.model import NodeKind, Topology
from ibemu.topo.names import IFNAME_MAX, MAX_NODE_NAME

FAST = settings(max_examples=30, deadline=None)


def check_invariants(t: Topology) -> None:
    """What every generated topology must satisfy."""
    assert t.validate() == [], [str(p) for p in t.validate()]
    assert t.is_connected()
    names = list(t.nodes)
    assert len(names) == len(set(names))
    for n in t.nodes.values():
        assert len(n.name) <= MAX_NODE_NAME
        for p in n.port_range:
            assert len(t.ifname(n.name, p)) <= IFNAME_MAX
    for lk in t.links:
        for end in lk.ends:
            assert 1 <= end.port <= t.nodes[end.node].num_ports
    ifnames = [t.ifname(e.node, e.port) for lk in t.links for e in lk.ends]
    assert len(ifnames) == len(set(ifnames))
    guids = [n.guid for n in t.nodes.values()]
    assert len(guids) == len(set(guids))


@FAST
@given(k=st.integers(1, 7).map(lambda x: 2 * x), hpe=st.none() | st.integers(0, 14))
def test_fat_tree_3_levels(k: int, hpe: int | None) -> None:
    half = k // 2
    if hpe is not None and hpe > half:
        with pytest.raises(ParamError, match="host ports"):
            generate("fat-tree", k=k, hosts_per_edge=hpe)
        return
    t = generate("fat-tree", k=k, hosts_per_edge=hpe)
    h = half if hpe is None else hpe
    c = t.counts()
    assert c.switches == 5 * k * k // 4
    assert c.cas == k * half * h
    assert c.links == k * half * h + 2 * k**3 // 4
    assert all(n.num_ports == k for n in t.switches())
    if h:
        check_invariants(t)


@FAST
@given(k=st.integers(1, 8).map(lambda x: 2 * x))
def test_fat_tree_2_levels(k: int) -> None:
    t = generate("fat-tree", k=k, levels=2)
    c = t.counts()
    assert (c.switches, c.cas, c.links) == (3 * k // 2, k * k // 2, k * k)
    check_invariants(t)


@FAST
@given(
    leaves=st.integers(1, 12),
    spines=st.integers(1, 6),
    hosts=st.integers(1, 20),
    mult=st.integers(1, 3),
)
def test_leaf_spine(leaves: int, spines: int, hosts: int, mult: int) -> None:
    up = spines * mult
    t = generate(
        "leaf-spine", leaves=leaves, spines=spines, hosts_per_leaf=hosts, uplinks_per_leaf=up
    )
    c = t.counts()
    assert (c.switches, c.cas) == (leaves + spines, leaves * hosts)
    assert c.links == leaves * hosts + leaves * up
    assert all(t.node(f"leaf{i}").num_ports == hosts + up for i in range(leaves))
    assert all(t.node(f"spine{j}").num_ports == leaves * mult for j in range(spines))
    for i in range(leaves):  # every leaf reaches every spine with `mult` parallel links
        for j in range(spines):
            assert len(t.links_between(f"leaf{i}", f"spine{j}")) == mult
    check_invariants(t)


@FAST
@given(dims=st.lists(st.integers(3, 6), min_size=2, max_size=3), hosts=st.integers(0, 3))
def test_torus(dims: list[int], hosts: int) -> None:
    t = generate("torus", dims=dims, hosts_per_switch=hosts)
    n = math.prod(dims)
    c = t.counts()
    assert (c.switches, c.cas) == (n, n * hosts)
    assert c.links == n * len(dims) + n * hosts
    assert all(len(t.neighbor_names(s.name)) - hosts == 2 * len(dims) for s in t.switches())
    check_invariants(t)


@FAST
@given(dims=st.lists(st.integers(2, 6), min_size=2, max_size=3), hosts=st.integers(1, 3))
def test_mesh(dims: list[int], hosts: int) -> None:
    t = generate("mesh", dims=dims, hosts_per_switch=hosts)
    n = math.prod(dims)
    assert t.counts().links == sum(n // d * (d - 1) for d in dims) + n * hosts
    check_invariants(t)


@FAST
@given(a=st.integers(1, 5), h=st.integers(1, 3), p=st.integers(1, 3), data=st.data())
def test_dragonfly(a: int, h: int, p: int, data: st.DataObject) -> None:
    ports = a * h
    g = data.draw(st.sampled_from([d + 1 for d in range(1, ports + 1) if ports % d == 0]))
    t = generate("dragonfly", groups=g, routers_per_group=a, hosts_per_router=p, global_links=h)
    c = t.counts()
    assert (c.switches, c.cas) == (g * a, g * a * p)
    assert c.links == g * a * p + g * a * (a - 1) // 2 + g * a * h // 2
    # every pair of groups is joined by the same number of global links
    per_pair = ports // (g - 1)
    between: dict[tuple[int, int], int] = {}
    for lk in t.iter_switch_links():
        ga, gb = t.node(lk.a.node).group, t.node(lk.b.node).group
        assert ga is not None and gb is not None
        if ga != gb:
            key = (min(ga, gb), max(ga, gb))
            between[key] = between.get(key, 0) + 1
    assert len(between) == g * (g - 1) // 2
    assert set(between.values()) == {per_pair}
    check_invariants(t)


@FAST
@given(n=st.integers(3, 40), hosts=st.integers(0, 4))
def test_ring(n: int, hosts: int) -> None:
    t = generate("ring", switches=n, hosts_per_switch=hosts)
    assert (t.counts().switches, t.counts().links) == (n, n + n * hosts)
    check_invariants(t)


@FAST
@given(hosts=st.integers(1, 64), spare=st.integers(0, 10))
def test_single_switch(hosts: int, spare: int) -> None:
    t = generate("single-switch", hosts=hosts, ports=hosts + spare)
    assert t.node("sw0").num_ports == hosts + spare
    assert t.counts().links == hosts
    check_invariants(t)


def test_k16_matches_issue_figures() -> None:
    t = generate("fat-tree", k=16)
    c = t.counts()
    assert (c.nodes, c.links) == (1344, 3072)


def test_fat_tree_port_convention() -> None:
    t = generate("fat-tree", k=4)
    assert t.peer("h0", 1) == ("edge0_0", 1)
    assert t.peer("edge0_0", 3) == ("agg0_0", 1)
    assert t.peer("edge0_1", 4) == ("agg0_1", 2)
    assert t.peer("agg0_0", 3) == ("core0", 1)
    assert t.peer("agg2_1", 4) == ("core3", 3)
    levels = {n.name: n.level for n in t.nodes.values()}
    assert (levels["h0"], levels["edge0_0"], levels["agg0_0"], levels["core0"]) == (0, 1, 2, 3)
    assert t.node("edge0_0").desc == "ibemu edge0_0"
    assert t.node("h3").desc == "h3 HCA-1"


def test_torus_port_convention() -> None:
    t = generate("torus", dims=[3, 4], hosts_per_switch=1)
    assert t.peer("sw0_0", 2) == ("sw1_0", 3)  # +x
    assert t.peer("sw2_0", 2) == ("sw0_0", 3)  # wrap-around
    assert t.peer("sw0_0", 4) == ("sw0_1", 5)  # +y
    assert t.node("sw1_2").coords == (1, 2)


def test_mesh_has_no_wrap() -> None:
    t = generate("mesh", dims="3x3")
    assert t.link_at("sw2_0", 2) is None
    assert t.link_at("sw0_0", 3) is None


def test_guids_are_deterministic_and_follow_ib_rules() -> None:
    a, b = generate("fat-tree", k=4), generate("fat-tree", k=4)
    assert [n.guid for n in a.nodes.values()] == [n.guid for n in b.nodes.values()]
    h = a.node("h0")
    assert h.port_guid(1) == h.guid + 1
    sw = a.node("edge0_0")
    assert sw.port_guid(3) == sw.guid
    assert a.by_guid(h.guid + 1) is h


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("fat-tree", {"k": 5}, "fat-tree: k must be even, got 5"),
        ("fat-tree", {"k": 0}, "fat-tree: k: expected an integer in 2..64, got 0"),
        ("fat-tree", {"k": -4}, "fat-tree: k: expected an integer in 2..64, got -4"),
        ("fat-tree", {}, "fat-tree: missing k (switch radix (even))"),
        ("fat-tree", {"k": "eight"}, "fat-tree: k: expected an integer in 2..64, got 'eight'"),
        (
            "fat-tree",
            {"k": 4, "leaves": 2},
            "fat-tree: no parameter 'leaves' (did you mean 'levels'?)",
        ),
        ("leaf-spine", {"spines": 3, "uplinks_per_leaf": 4}, "must be a multiple of spines (3)"),
        (
            "leaf-spine",
            {"hosts_per_leaf": 8, "leaf_ports": 9},
            "a leaf needs 10 ports (8 hosts + 2 uplinks)",
        ),
        (
            "leaf-spine",
            {"leaves": 300, "spines": 1},
            "a spine would need 300 ports, more than the 255",
        ),
        ("torus", {"dims": [2, 4]}, "every dimension needs >= 3 switches (2 would double"),
        ("torus", {"dims": [4]}, "dims must have 2 or 3 sizes, got [4]"),
        ("mesh", {"dims": "4xq"}, "dims: expected dimensions like"),
        (
            "dragonfly",
            {"groups": 4, "routers_per_group": 4, "global_links": 2},
            "must split evenly over the 3",
        ),
        ("ring", {"switches": 2}, "ring: switches: expected an integer in 3..1024, got 2"),
        ("single-switch", {"hosts": 4, "ports": 2}, "4 hosts need 4 ports, ports is 2"),
        ("fat-tee", {"k": 4}, "unknown generator 'fat-tee' (did you mean 'fat-tree'?)"),
    ],
)
def test_bad_params(name: str, params: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        generate(name, params)
    assert message in str(info.value)


def test_cli_strings_are_accepted() -> None:
    t = generate(
        "leaf-spine", {"leaves": "2", "spines": "1", "hosts-per-leaf": "3", "uplink_rate": "4x HDR"}
    )
    uplinks = list(t.iter_switch_links())
    assert all(str(t.rate_of(lk)) == "4xHDR" for lk in uplinks)
    assert str(t.rate_of(t.links[-1])) == "4xEDR"  # a host link keeps the default


def test_every_generator_has_working_defaults() -> None:
    required = {"fat-tree": {"k": 4}, "torus": {"dims": "3x3"}, "mesh": {"dims": "2x2"}}
    for name in GENERATORS:
        t = generate(name, required.get(name, {}))
        assert t.generator == name
        check_invariants(t)
        assert any(n.kind is NodeKind.CA for n in t.nodes.values())
