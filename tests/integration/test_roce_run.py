"""``ibemu run`` on a RoCE fabric: the shipped RoCE scenario end to end, compressed to 6 s.

The fabric manager takes the SM's place: its bring-up is ``bringup.sm_s``, each fault's
``detect`` is the carrier change it read, ``routed``/``programmed`` its reroute (there is no
trap), and every flow runs on RocePorts through the IP routers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from ibemu.kernel import netns
from ibemu.report import validate
from ibemu.scenario import load_scenario
from ibemu.scenario.runner import ScenarioRun

pytestmark = pytest.mark.root

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "roce-fat-tree.yaml"


def test_roce_scenario_runs_end_to_end(state_dir: Path, tmp_path: Path) -> None:
    scen = load_scenario(SCENARIO)
    f = 6.0 / scen.duration_s
    scen = dataclasses.replace(
        scen, duration_s=6.0, faults=[dataclasses.replace(x, at_s=x.at_s * f) for x in scen.faults],
        traffic=[dataclasses.replace(t, stop_s=min(t.stop_s, 16.0) * f) for t in scen.traffic])
    runner = ScenarioRun(scen, tmp_path / "out")
    result = trio.run(runner.run)
    assert validate(result) == []
    # nothing of this run is left (other runs may come and go on a shared machine)
    assert not [n for n in netns.list_names() if n.startswith(f"ibemu-{runner.state.run_id}-")]
    assert result["fabric"]["kind"] == "roce" and result["sm"]["impl"] == "none"
    assert result["bringup"]["sm_s"] is not None and result["bringup"]["sm_s"] < 1.0
    assert result["files"]["events"].endswith("fm.jsonl")
    for t in result["traffic"]:
        assert t["bytes"] > 0 and "error" not in t["extra"], t
    down, up = result["faults"]
    assert (down["action"], up["action"]) == ("link_down", "link_up")
    for fault in (down, up):
        ph = fault["phases_ms"]
        assert ph["trap"] is None
        assert ph["detect"] is not None and ph["routed"] is not None and ph["programmed"] is not None
        assert 0 <= ph["detect"] <= ph["routed"] <= ph["programmed"] < 1000, ph
    assert all(fl["resume_ms"] is not None for fl in down["flows"]), down["flows"]
