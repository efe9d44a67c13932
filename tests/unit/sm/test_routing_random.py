"""Random connected fabrics (hypothesis): minhop is minimal, updn has no credit loop, and a
reroute after any single link failure keeps both properties (or reports the partition)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibemu.sm.checker import check
from ibemu.sm.graph import NodeType, SmNode, SmPort, SubnetGraph
from ibemu.sm.reroute import reroute
from ibemu.sm.routing import compute
from ibemu.testing.fromtopo import remove_link


@st.composite
def fabrics(draw: st.DrawFn) -> SubnetGraph:
    n = draw(st.integers(2, 12))
    edges = [(draw(st.integers(0, i - 1)), i) for i in range(1, n)]  # a random spanning tree
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n))
    edges += [(a, b) for a, b in extra if a != b]  # parallel links allowed
    hosts = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    if sum(hosts) < 2:
        hosts[0] = hosts[-1] = 1
    g = SubnetGraph()
    used = [0] * n
    for a, b in edges:
        used[a] += 1
        used[b] += 1
    lid = 1
    sw_guid = [0x1000 + 16 * i for i in range(n)]
    for i in range(n):
        nd = g.add(SmNode(sw_guid[i], NodeType.SWITCH, used[i] + hosts[i]))
        nd.ports[0] = SmPort(0, nd.guid, lid, 4)
        lid += 1
        for p in range(1, used[i] + hosts[i] + 1):
            nd.ports[p] = SmPort(p, nd.guid, state=4)
    # connect the links in order: the k-th link of a switch is its port k
    count = [0] * n
    for a, b in edges:
        count[a] += 1
        count[b] += 1
        g.connect(sw_guid[a], count[a], sw_guid[b], count[b])
    h = 0
    for i in range(n):
        for k in range(hosts[i]):
            guid = 0x900000 + 16 * h
            ca = g.add(SmNode(guid, NodeType.CA, 1))
            ca.ports[1] = SmPort(1, guid + 1, lid, 4)
            lid += 1
            g.connect(guid, 1, sw_guid[i], used[i] + k + 1)
            h += 1
    return g


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(fabrics())
def test_minhop_minimal_updn_deadlock_free(g: SubnetGraph) -> None:
    rep = check(g, compute(g, "minhop"), expect_minimal=True)
    assert rep.ok, rep.errors
    rep = check(g, compute(g, "updn"), expect_deadlock_free=True)
    assert rep.ok, rep.errors
    assert rep.ca_pairs == len(g.cas()) * (len(g.cas()) - 1)


@SETTINGS
@given(fabrics(), st.data())
def test_reroute_any_link_failure(g: SubnetGraph, data: st.DataObject) -> None:
    links = [
        (n.guid, num) for n in g.switches() for num, peer, _ in n.neighbors()
        if g.nodes[peer].is_switch
    ]
    if not links:
        return
    guid, num = data.draw(st.sampled_from(links))
    engine = data.draw(st.sampled_from(["minhop", "updn"]))
    routes = compute(g, engine)
    peer = remove_link(g, guid, num)
    assert peer is not None
    res = reroute(g, routes, ends=[(guid, num), peer])
    rep = check(g, res.routes, expect_minimal=engine == "minhop",
                expect_deadlock_free=engine == "updn")
    assert rep.ok, rep.errors
    assert bool(res.lost) == (rep.disconnected > 0)
    # the reroute equals a fresh computation in what it promises
    fresh = check(g, compute(g, engine))
    assert fresh.ca_pairs == rep.ca_pairs and fresh.disconnected == rep.disconnected
