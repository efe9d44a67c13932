"""ibemu's SM programs QoS (fabric.qos) into real device agents in memory: OperationalVLs,
VLHighLimit, SL -> VL on every switch port pair and CA port, VL arbitration on every port."""

from __future__ import annotations

import pytest

from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.physics.qos import Sl2Vl, VlArb
from ibemu.sm.manager import SmConfig, SubnetManager
from ibemu.sm.qos import SmQos
from ibemu.testing.madport import InMemoryPort
from ibemu.topo import generate
from tests.unit.sm.helpers import fabric_from_topology, minhop, run

MAP = (0, 1, 2, 3, 0, 1, 2, 3, 3, 3, 3, 3, 0, 0, 0, 0)


def test_sm_programs_qos_before_activation() -> None:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2)
    fab = fabric_from_topology(topo)
    qos = SmQos(vls=4, sl2vl=MAP, vlarb_high=((3, 32),), vlarb_low=((0, 8), (1, 8), (2, 16)), vl_high_limit=2)
    sm = SubnetManager(InMemoryPort(fab, "h0"), SmConfig(qos=SmQos.from_json(qos.to_json())), route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")

    run(main)
    assert sm.stats["qos_failed"] == 0 and sm.stats["qos_sl2vl"] > 0
    want_arb = VlArb(high=((3, 32),), low=((0, 8), (1, 8), (2, 16)), high_limit=2)
    checked = 0
    for name, agent in fab.agents.items():
        live = [num for (n, num) in fab.links if n == name]
        for num in live:
            checked += 1
            assert agent.data_vls(num) == 4, (name, num)
            assert agent.vl_arbitration(num) == want_arb, (name, num)
            if isinstance(agent, SwitchAgent):
                for inp in (0, *live):
                    assert agent.sl2vl_map(inp, num) == Sl2Vl(MAP)
            else:
                assert isinstance(agent, CaAgent)
                assert agent.sl2vl_map(0, num) == Sl2Vl(MAP)
    assert checked == 2 * len(topo.links)


def test_without_qos_nothing_is_written() -> None:
    topo = generate("single-switch", hosts=2)
    fab = fabric_from_topology(topo)
    sm = SubnetManager(InMemoryPort(fab, "h0"), SmConfig(), route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")

    run(main)
    assert "qos_sl2vl" not in sm.stats
    assert fab.agents["sw0"].data_vls(1) == 8  # OperationalVLs as the port started: VLCap


def test_smqos_checks() -> None:
    with pytest.raises(ValueError):
        SmQos(vls=3)
    with pytest.raises(ValueError):
        SmQos(sl2vl=(0, 1))
    assert SmQos(vls=2).tables() == ((), ((0, 1), (1, 1)))
