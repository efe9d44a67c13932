"""Credit loops: minhop on a ring under all-to-all deadlocks, updn on the same ring does not,
ftree on a fat-tree does not; congestion without a cycle is not a deadlock."""

from __future__ import annotations

import pytest

from ibemu.physics.deadlock import find_credit_loops
from ibemu.physics.sim import Flow, Simulator
from ibemu.testing.physics import fabric_sim
from ibemu.topo.generators import generate


def _all_to_all(engine: str, topo_name: str, until_ns: int, **params: int) -> tuple[Simulator, list]:
    topo = generate(topo_name, **params)
    sim, lids = fabric_sim(topo, engine, buffer_bytes=4096)
    hosts = sorted(lids)
    for s in hosts:
        for d in hosts:
            if s != d:
                sim.add_flow(Flow(s, lids[d], size=2048, backlog=1))
    loops = sim.run(until_ns, check_deadlock_ns=20_000, stall_ns=20_000)
    return sim, loops


def test_minhop_on_a_ring_deadlocks() -> None:
    sim, loops = _all_to_all("minhop", "ring", 300_000, switches=5, hosts_per_switch=2)
    assert len(loops) == 1
    loop = loops[0]
    assert len(loop.hops) == 5
    assert {n for n, _p, _vl in loop.hops} == {f"sw{i}" for i in range(5)}
    assert {vl for _n, _p, vl in loop.hops} == {0}
    # each hop's port is cabled to the next hop's switch
    for (n, p, _vl), (m, _q, _w) in zip(loop.hops, loop.hops[1:] + loop.hops[:1], strict=True):
        peer = sim.nodes[n].ports[p].peer
        assert peer is not None and peer[0] == m
    assert loop.stalled_ns >= 20_000
    assert "credit loop over 5 ports" in loop.describe()
    # traffic stopped: nothing moves any more, nothing was dropped
    delivered = sum(f.delivered for f in sim.flows)
    sim.run(sim.now + 200_000)
    assert sum(f.delivered for f in sim.flows) == delivered
    assert sim.drops == 0


def test_updn_on_the_same_ring_does_not() -> None:
    sim, loops = _all_to_all("updn", "ring", 300_000, switches=5, hosts_per_switch=2)
    assert loops == []
    assert all(f.delivered > 0 for f in sim.flows)
    before = sum(f.delivered for f in sim.flows)
    sim.run(sim.now + 50_000)
    assert sum(f.delivered for f in sim.flows) > before
    assert find_credit_loops(sim.nodes, sim.now, 20_000) == []
    assert sim.drops == 0


@pytest.mark.parametrize("engine", ["ftree", "updn"])
def test_fat_tree_does_not_deadlock(engine: str) -> None:
    sim, loops = _all_to_all(engine, "fat-tree", 40_000, k=4)
    assert loops == []
    assert all(f.delivered > 0 for f in sim.flows)


def test_congestion_without_a_cycle_is_no_deadlock() -> None:
    sim = Simulator("ib", lambda sw, f: 3)
    from ibemu.physics.link import LinkModel
    from ibemu.physics.model import IbPortConfig
    from ibemu.topo.rates import parse_rate

    link = LinkModel.of(parse_rate("EDR"))
    sim.add_switch("s", latency_ns=90)
    cfg = IbPortConfig(buffer_bytes=4096)
    for i in range(3):
        sim.add_host(f"h{i}")
        sim.cable(f"h{i}", 1, "s", i + 1, link, ib_a=cfg, ib_b=cfg)
    sim.add_flow(Flow("h0", "h2", size=2048))
    sim.add_flow(Flow("h1", "h2", size=2048))
    assert sim.run(200_000, check_deadlock_ns=10_000, stall_ns=1_000) == []
    assert sim.nodes["h0"].ports[1].counters.xmit_wait_ns > 0
