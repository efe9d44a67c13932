"""SM takeover between ibemu's SM and the unmodified OpenSM, both ways: the master is killed
(``sm_down``), the standby of the other kind sees its SMInfo polls go unanswered, becomes
master and sweeps the subnet; the stream between two hosts keeps going."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ibemu.events import read_events
from ibemu.fabric import opensm
from ibemu.fabric.umad2sim import umad2sim_path
from ibemu.report import validate
from ibemu.scenario import loads_scenario
from ibemu.scenario.runner import ScenarioRun

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None, reason="libumad2sim.so missing (apt-get install ibsim-utils)"),
    pytest.mark.skipif(not opensm.opensm_available(), reason="opensm missing (apt-get install opensm)"),
]

SCENARIO = """
name: sm-takeover-{master}-{standby}
topology: {{generator: leaf-spine, leaves: 2, spines: 2, hosts_per_leaf: 2}}
sm:
  impl: {master}
  host: h0
  priority: 5
  poll_interval_ms: 100
  poll_retries: 3
  standby: {{host: h3, priority: 1, impl: {standby}}}
traffic:
  - {{name: s12, kind: stream, from: h1, to: h2, rate_pps: 1000}}
faults:
  - {{at_s: 0.2, action: sm_down}}
duration_s: 1.6
"""


@pytest.mark.parametrize(("master", "standby"), [("ibemu", "opensm"), ("opensm", "ibemu")])
def test_the_other_kind_takes_over(master: str, standby: str, state_dir: Path, tmp_path: Path) -> None:
    scen = loads_scenario(SCENARIO.format(master=master, standby=standby), "x.yaml", tmp_path)
    runner = ScenarioRun(scen, tmp_path / "out")
    result = trio.run(runner.run)
    assert validate(result) == []
    (down,) = result["faults"]
    ph = down["phases_ms"]
    assert 0 < ph["sm_master"] <= ph["sm_swept"] < 1400
    states = [e["new"] for e in read_events(runner.run_dir / f"{standby}-standby" / "events.jsonl")
              if e["kind"] == "sm_state"]
    assert states[-1] == "master" and "standby" in states[:-1], states  # stood by first, then took over
    if standby == "ibemu":  # its own polls are in its log (OpenSM logs none at its default level)
        assert ph["sm_silent"] is not None and ph["sm_silent"] <= ph["sm_noticed"] <= ph["sm_master"]
    flow = down["flows"][0]
    assert flow["lost"] == 0  # the routes stay in the switches while no SM runs
