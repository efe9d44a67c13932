"""The RoCE address plan and the ECMP routes the fabric manager installs (pure)."""

from __future__ import annotations

import ipaddress

import pytest

from ibemu.errors import ConfigError
from ibemu.roce.addressing import AddressPlan, plan_addresses
from ibemu.roce.routes import NextHop, compute, diff, local_repair, routers
from ibemu.topo import generate
from ibemu.wire.roce import EMULATED_NET


def test_plan_is_deterministic_inside_the_range() -> None:
    topo = generate("fat-tree", k=4)
    plan = plan_addresses(topo)
    assert plan.to_dict() == plan_addresses(generate("fat-tree", k=4)).to_dict()
    assert len(plan.ports) == 2 * len(topo.links)
    ips = [p.ip for p in plan.ports.values()]
    assert len(set(ips)) == len(ips)
    assert all(ipaddress.ip_address(ip) in EMULATED_NET for ip in ips)
    for pa in plan.ports.values():  # both ends of a cable share one /31
        assert ipaddress.ip_network(f"{pa.ip}/31", strict=False) == ipaddress.ip_network(f"{pa.peer_ip}/31",
                                                                                         strict=False)
        assert plan.ports[pa.peer].peer_ip == pa.ip
    gw = plan.gateway("h0")
    assert gw.node == "edge0_0" and int(ipaddress.ip_address(gw.ip)) % 2 == 0  # router takes the even half
    assert sorted(plan.lid_ips()) == list(range(1, 17))
    assert plan.lid("h15") == 16 and plan.lid_ips()[16] == plan.host_ip("h15")
    assert AddressPlan.from_dict(plan.to_dict()).to_dict() == plan.to_dict()


def test_bad_plans_say_why() -> None:
    topo = generate("fat-tree", k=4)
    with pytest.raises(ConfigError, match=r"outside 198\.18\.0\.0/15"):
        plan_addresses(topo, "10.0.0.0/16")
    with pytest.raises(ConfigError, match="bad RoCE network"):
        plan_addresses(topo, "198.18.0.300/24")
    with pytest.raises(ConfigError, match="48 cables need"):
        plan_addresses(topo, "198.18.0.0/26")
    plan = plan_addresses(topo)
    with pytest.raises(ConfigError, match="not a cabled"):
        plan.host_ip("h99")
    with pytest.raises(ConfigError, match="not a cabled CA"):
        plan.lid("edge0_0", 1)
    bad = plan.to_dict()
    bad["ports"][0][3] = "192.168.0.1"
    with pytest.raises(ValueError, match="outside"):
        AddressPlan.from_dict(bad)


def test_fat_tree_routes_are_all_shortest_paths() -> None:
    topo = generate("fat-tree", k=4)
    plan = plan_addresses(topo)
    names = routers(topo)
    routes = compute(plan, names)
    h15 = f"{plan.host_ip('h15')}/32"
    assert h15 not in routes["edge3_1"]  # its own first hop: the connected /31
    assert len(routes["edge0_0"][h15]) == 2  # two aggregation uplinks
    assert len(routes["agg0_0"][h15]) == 2  # two core uplinks
    assert len(routes["core0"][h15]) == 1  # one way down into pod 3
    assert len(routes["agg3_0"][h15]) == 1
    assert sum(map(len, routes.values())) == 20 * 16 - 16


def test_reroute_changes_only_what_the_cut_cable_carried() -> None:
    topo = generate("fat-tree", k=4)
    plan = plan_addresses(topo)
    names = routers(topo)
    before = compute(plan, names)
    cut = plan.port("agg3_0", 3)  # agg3_0:3 - core0
    after = compute(plan, names, down={cut.cable})
    changes = diff(before, after)
    pod3 = {f"{plan.host_ip(f'h{i}')}/32" for i in range(12, 16)}
    # the other pods' aggs stop using core0 towards pod 3; core0 takes a longer way down
    assert not changes.delete
    assert set(changes.put) == {"core0", "agg0_0", "agg1_0", "agg2_0", "agg3_0"}
    assert all(set(p) <= pod3 for r, p in changes.put.items() if r != "agg3_0")
    assert all(hop.ifname != "core0-4" for hops in after["core0"].values() for hop in hops)
    dead = [NextHop(cut.ifname, cut.peer_ip)]
    covered, blackholed = local_repair(before, dead, "agg3_0")
    assert covered == 12 and blackholed == 0  # agg3_0 keeps core1 towards the other pods
    core_end = plan.port("core0", 4)
    assert local_repair(before, [NextHop(core_end.ifname, core_end.peer_ip)], "core0") == (0, 4)
    assert diff(after, before).count == changes.count
