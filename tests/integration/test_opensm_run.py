"""A scenario run managed by the unmodified OpenSM: SUBNET UP, traffic, a cut cable, traffic
resumes on the routes OpenSM recomputed, and the reroute phases come from OpenSM's own log."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import trio

from ibemu.fabric import opensm
from ibemu.fabric.umad2sim import umad2sim_path
from ibemu.kernel import netns
from ibemu.report import validate
from ibemu.scenario import load_scenario
from ibemu.scenario.runner import ScenarioRun
from tests.integration.test_scenarios_smoke import compressed

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None, reason="libumad2sim.so missing (apt-get install ibsim-utils)"),
    pytest.mark.skipif(not opensm.opensm_available(), reason="opensm missing (apt-get install opensm)"),
]

DEFAULT = Path(__file__).resolve().parents[2] / "ibemu" / "scenario" / "builtin" / "default.yaml"


def test_default_scenario_under_opensm(state_dir: Path, tmp_path: Path) -> None:
    scen = load_scenario(DEFAULT)
    scen = compressed(dataclasses.replace(scen, sm=dataclasses.replace(scen.sm, impl="opensm")), 6.0)
    runner = ScenarioRun(scen, tmp_path / "out")
    result = trio.run(runner.run)
    assert validate(result) == []
    # nothing of this run is left (other processes may be building and removing their own)
    assert not [n for n in netns.list_names() if runner.state.run_id in n]
    assert result["sm"]["impl"] == "opensm" and result["bringup"]["sm_s"] > 0
    down = next(f for f in result["faults"] if f["action"] == "link_down")
    p = down["phases_ms"]
    # Every phase seen, in order, on one clock: OpenSM's log stamps moved onto the monotonic one.
    assert None not in p.values(), p
    assert 0 < p["detect"] <= p["trap"] <= p["routed"] <= p["programmed"] < 2000, p
    for flow in down["flows"]:
        assert flow["resume_ms"] is not None and flow["resume_ms"] < 1000, flow  # traffic came back
    for t in result["traffic"]:
        assert "error" not in t["extra"] and t["bytes"] > 0, t
    events = [json.loads(line) for line in (runner.run_dir / "opensm" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "reroute" and e["t_routed"] for e in events)
