"""Fidelity of a real run: every long-running process reports its lag, and a run whose agent
host is made to stall is judged INVALID (so the verdict cannot pass vacuously)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import trio

from ibemu import clock
from ibemu.report import summary, validate
from ibemu.report.summary import INVALID_MARK
from ibemu.scenario import loads_scenario
from ibemu.scenario.runner import ScenarioRun
from tests.integration.test_run_scenario import SCENARIO

pytestmark = pytest.mark.root
log = logging.getLogger(__name__)

SHAPE = {"valid", "dilation", "threshold_us", "worst_lag_us", "worst_process", "processes", "worst_link", "note"}
SMALL = """
name: pytest-stall
topology: {generator: leaf-spine, leaves: 2, spines: 2}
sm: {impl: ibemu, engine: minhop, host: h0}
traffic:
  - {name: probe, kind: stream, from: h1, to: h5, size: 256, rate_pps: 2000}
duration_s: 3
"""


def test_every_process_of_a_run_reports_its_lag(state_dir: Path, tmp_path: Path) -> None:
    result = trio.run(ScenarioRun(loads_scenario(SCENARIO), tmp_path / "out").run)
    assert validate(result) == [] and result["schema"] == "ibemu.run/2"
    fid = result["fidelity"]
    assert set(fid) == SHAPE and fid["worst_link"] is None and fid["dilation"] == 1
    assert set(fid["processes"]) == {"agent-host", "sm", "traffic bulk", "traffic probe", "traffic ring"}
    for name, p in fid["processes"].items():
        assert p["samples"] >= 100, name  # 4 s of traffic at one wake-up per 10 ms, and the drain
        assert 0 <= p["p50_us"] <= p["p99_us"] <= p["max_us"], name
    assert fid["worst_process"] in fid["processes"]
    # Validity depends on the machine's load: said, not asserted.
    log.warning("fidelity: valid=%s %s", fid["valid"], {n: p["p99_us"] for n, p in fid["processes"].items()})
    assert ("Fidelity" in summary(result)) and (fid["valid"] or INVALID_MARK in summary(result))


def test_a_stalled_agent_host_makes_the_run_invalid(state_dir: Path, tmp_path: Path) -> None:
    runner = ScenarioRun(loads_scenario(SMALL), tmp_path / "out")

    async def stall() -> None:
        """Once traffic runs, block the event loop the agent host runs in: 10 x 50 ms."""
        while not runner.t0_ns or clock.now_ns() < runner.t0_ns + 200_000_000:
            await trio.sleep(0.05)
        for _ in range(10):
            time.sleep(0.05)
            await trio.sleep(0.03)

    async def main() -> dict:
        async with trio.open_nursery() as n:
            n.start_soon(stall)
            return await runner.run()

    result = trio.run(main)
    assert validate(result) == []
    fid = result["fidelity"]
    assert fid["valid"] is False
    host = fid["processes"]["agent-host"]
    assert host["p99_us"] >= fid["threshold_us"] and host["max_us"] >= 40_000
    assert "agent-host fell behind the emulated clock" in fid["note"]
    text = summary(result)
    assert "INVALID: fell behind the emulated clock" in text and "agent-host p99 lag" in text
    assert text.count(INVALID_MARK) >= 4  # the header, Fabric, Faults, Traffic
