"""SM takeover on a live fabric: ibemu's master SM is killed (fault ``sm_down``), the standby
on another host stops getting answers to its SMInfo polls, takes over, re-sweeps, and a cable
cut later is rerouted by it; the result gives the takeover phases in order."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ibemu.events import read_events
from ibemu.kernel import netns
from ibemu.report import validate
from ibemu.scenario import loads_scenario
from ibemu.scenario.runner import ScenarioRun

pytestmark = pytest.mark.root

SCENARIO = """
name: sm-takeover
topology: {generator: leaf-spine, leaves: 2, spines: 2, hosts_per_leaf: 2}
sm:
  host: h0
  priority: 5
  poll_interval_ms: 100
  poll_retries: 3
  standby: {host: h3, priority: 1}
traffic:
  - {name: s12, kind: stream, from: h1, to: h2, rate_pps: 1000}
faults:
  - {at_s: 0.2, action: sm_down}
  - {at_s: 1.3, action: link_down, link: "leaf1:3-spine0:2"}
duration_s: 2
"""


def test_standby_takes_over_and_reroutes(state_dir: Path, tmp_path: Path) -> None:
    scen = loads_scenario(SCENARIO, "takeover.yaml", tmp_path)
    runner = ScenarioRun(scen, tmp_path / "out")
    result = trio.run(runner.run)
    assert validate(result) == []
    assert not [n for n in netns.list_names() if runner.state.run_id in n]
    down, cut = result["faults"]
    assert down["action"] == "sm_down" and cut["action"] == "link_down"
    ph = down["phases_ms"]
    # master silent -> the standby notices -> it is master -> the fabric re-swept, in that order;
    # it gives up after three failed polls, sent 100 ms apart
    assert 0 < ph["sm_silent"] <= ph["sm_noticed"] <= ph["sm_master"] <= ph["sm_swept"] < 1100
    assert ph["sm_noticed"] >= 200  # the third failed poll goes out 200 ms after the first, at the earliest
    standby = read_events(runner.run_dir / "ibemu-standby" / "events.jsonl")
    states = [(e["new"], e["reason"]) for e in standby if e["kind"] == "sm_state"]
    assert states == [("standby", "master found"), ("discovering", "master lost"), ("master", "no other SM")]
    # the cable cut after the takeover: the new master got the trap and rerouted
    assert cut["phases_ms"]["trap"] is not None and cut["phases_ms"]["programmed"] is not None
    assert any(e["kind"] == "reroute" for e in standby)
    master = read_events(runner.run_dir / "ibemu" / "events.jsonl")
    assert not any(e["kind"] == "reroute" for e in master)  # dead by then
    flow = cut["flows"][0]
    assert flow["lost"] == 0 and flow["resume_ms"] is not None  # the stream got through on the new routes
