"""Head-of-line blocking and congestion spreading on the live IB user datapath.

``testing.livephysics.hol_topology``: two leaves under a spine, the hosts' cables 1x SDR
(2 Gb/s) and the leaf-spine cables 1x DDR (4 Gb/s), at dilation 200 (about a thousand frames a
second of real time). The hot flow (h0 -> h3, across the spine) and the local flow (h4 -> h3)
share h3's port 2:1; the victim (h1 -> h5) shares only the hot flow's leaf0 -> spine -> leaf1
ports. On one VL the frames for h3 fill leaf1's input buffer, leave the spine no credits, and
the victim behind them is slowed to about the hot flow's half (the model: 50%); with the
victim on SL1 and the scenario's QoS mapping SL1 to VL1 (``fabric.qos``: ``vls: 2, sl2vl:
{1: 1}``, programmed through the agents' SMA) it runs at its line rate (the model: 99%).
PortXmitWait moves on the upstream ports (leaf0 -> spine, spine -> leaf1) in the agents' PMA.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ibemu import clock
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import ownership
from ibemu.physics.link import LinkModel
from ibemu.scenario import loads_scenario
from ibemu.sm.qos import SmQos
from ibemu.testing.livephysics import (
    hol_flows,
    hol_topology,
    program,
    program_qos,
    routes,
    run_traffic,
    wire_bytes,
)
from tests.integration.live import fabric_in_thread

pytestmark = pytest.mark.root

DILATION = 200
SCENARIO = """
topology: {generator: single-switch, hosts: 2}
fabric:
  datapath: user
  qos: {vls: 2, sl2vl: {1: 1}}
"""


def test_a_victim_slows_behind_a_congested_port_on_one_vl_and_not_on_its_own(state_dir: Path, tmp_path: Path) -> None:
    qos_spec = loads_scenario(SCENARIO, "hol.yaml").fabric.qos
    assert qos_spec is not None
    qos = SmQos.from_json(qos_spec.sm_json())
    topo = hol_topology("1x SDR", "1x DDR")
    lids, lfts = routes(topo, "minhop")
    host_link = LinkModel.of(topo.defaults.rate)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-physics-hol")
    clock.configure(DILATION)
    try:
        rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp_path,
                           mad_sockets=False)
        with fabric_in_thread(rt, emulated_clock=True) as live:
            time.sleep(0.3)  # every carrier seen
            host = live.host
            assert host is not None and host.links is not None
            live.on_loop(program, host, lids, lfts)
            live.on_loop(program_qos, host, qos)
            links = host.links
            plane = links.plane
            every = {name: rt_.agent for name, rt_ in host.nodes.items()}
            # the agent host's ticker does this every 50 ms of emulated time (10 s real here)
            live.on_loop(links.sync_qos, every)
            assert live.on_loop(lambda: plane.nodes["spine0"].ib_config[2].data_vls) == 2
            plan = rt.plan
            agents = {n: host.nodes[n].agent for n in ("leaf0", "spine0")}

            def waits() -> tuple[int, int]:
                live.on_loop(links.push_counters)  # the model's counters into the PMA (the ticker's)
                return live.on_loop(lambda: (agents["leaf0"].counters(4).port_xmit_wait,
                                             agents["spine0"].counters(2).port_xmit_wait))

            rates: dict[int, float] = {}
            moved: dict[int, tuple[int, int]] = {}
            for sl in (0, 1):
                flows = hol_flows(plan, lids, host_link, DILATION, victim_sl=sl, n=32)
                before = waits()
                out = run_traffic(flows, [{"ns": plan.nodes["h5"].ns, "if": plan.nodes["h5"].ports[1].ifname}],
                                  seconds=1.0, drain_s=0.4, workdir=tmp_path)
                after = waits()
                moved[sl] = (after[0] - before[0], after[1] - before[1])
                stamps = sorted(clock.to_emulated_ns(s - out["offset"]) for s, slid, _ in out["got"][0]
                                if slid == lids["h1"])
                window = stamps[len(stamps) // 5: len(stamps) * 4 // 5]
                assert len(window) > 60, (sl, len(stamps), out["sent"])
                bits = (wire_bytes(flows[2]["frames"][0]) + host_link.framing_bytes) * 8
                rates[sl] = (len(window) - 1) * bits / (window[-1] - window[0]) / host_link.gbps
    finally:
        clock.configure(1)
    assert rates[0] < 0.7, rates  # behind the hot flow's frames on VL0: about half (model 50%)
    assert rates[1] > 0.85, rates  # on VL1: its line rate (model 99%)
    assert moved[0][0] > 0 and moved[0][1] > 0, moved  # congestion spread upstream: both ports waited
