"""Fidelity of a real run: every long-running process reports its lag, a run whose agent
host is made to stall is judged INVALID (so the verdict cannot pass vacuously), and the load
decides: a default-like run this machine carries is valid at dilation 1, the same with a load it
cannot carry is INVALID at dilation 1 and valid at the factor ``--dilation auto`` picks."""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
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
REPO = Path(__file__).resolve().parents[2]

SHAPE = {"valid", "dilation", "threshold_us", "worst_lag_us", "worst_process", "processes", "worst_link", "note",
         "threshold_real_us", "threshold_basis", "figure_us"}
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
    assert validate(result) == [] and result["schema"] == "ibemu.run/3"
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


# --- the load a run may offer: valid at dilation 1, invalid when overloaded, valid at `auto` ---

DEFAULT_LIKE = """
name: pytest-default-like
topology: {{generator: leaf-spine, leaves: 2, spines: 2}}
sm: {{impl: ibemu, engine: minhop, host: h0}}
traffic:
  - {{name: bulk, kind: write_bw, from: h0, to: h5, size: 64KiB, qps: 2, rate_pps: {bulk}}}
  - {{name: probe, kind: stream, from: h1, to: h5, size: 256, rate_pps: {probe}}}
faults:
  - {{at_s: {cut}, action: link_down, link: "leaf0:5"}}
duration_s: {duration}
"""
"""The default scenario's shape (a paced bulk RDMA WRITE flow and an RC probe stream across
the spine, a cable cut under them) on a smaller fabric, so that a run stays short."""


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, all) jiffies of every CPU so far (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(f[:8])  # user .. steal (guest time is counted in user already)
    return total - f[3] - f[4], total


def _run_cli(tmp_path: Path, name: str, text: str, *args: str,
             env: dict[str, str] | None = None) -> tuple[dict, str, float]:
    """Run ``text`` with ``ibemu run``: the result, what it printed, and the CPUs other jobs
    took meanwhile on average (all CPUs' busy time less the run's own processes')."""
    scen = tmp_path / f"{name}.yaml"
    scen.write_text(text)
    out, result_path = tmp_path / f"{name}-out", tmp_path / f"{name}.json"
    busy0, all0 = _cpu_jiffies()
    own0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--json", str(result_path),
                           "--out", str(out), "--no-plots", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=240, env={**os.environ, **(env or {})})
    busy1, all1 = _cpu_jiffies()
    own1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert validate(result) == []
    ncpu = os.cpu_count() or 1
    wall_s = (all1 - all0) / os.sysconf("SC_CLK_TCK") / ncpu
    own_s = (own1.ru_utime - own0.ru_utime) + (own1.ru_stime - own0.ru_stime)  # the run and every process it waited for
    foreign = max(0.0, ((busy1 - busy0) / os.sysconf("SC_CLK_TCK") - own_s) / max(wall_s, 1e-9))
    return result, proc.stdout, foreign


def _lags(fid: dict) -> dict[str, float]:
    return {n: p["p99_us"] for n, p in fid["processes"].items()}


MAX_FOREIGN_CPUS = 0.15
"""Validity is a claim about this machine's CPUs: when other jobs took more than this many
CPUs on average while a run ran, a run that should be valid is not asserted to be, and the
test says why. Little: the traffic workers run at nice 10, behind any job at nice 0, and one
CPU-bound job sharing the agent host's or the SM's CPU holds it for the scheduler's slices of
a few ms, over the 2 ms threshold at p99 (seen: 0.3-0.5 CPUs of other jobs, the agent host
and the SM 4-5 ms late at p99, a 2 kpps probe 13 ms)."""


def _skip_if_others_took_the_cpus(foreign: float, what: str, fid: dict) -> None:
    if foreign > MAX_FOREIGN_CPUS and not fid["valid"]:
        pytest.skip(f"other jobs took {foreign:.2f} of {os.cpu_count()} CPUs during {what} (> {MAX_FOREIGN_CPUS}): "
                    f"INVALID, as expected on a busy machine ({fid['note']})")


def test_a_default_like_run_is_judged_at_dilation_1_and_valid_at_4(tmp_path: Path) -> None:
    """A load this machine carries (the bulk flow paced and a 2 kpps probe, as in
    ``scenarios/default.yaml``). At dilation 1 every process is measured and the verdict names
    what fell behind, if anything did: on this 2-core machine, quiet, the 16 s default
    scenario was valid in 3 runs of 3, but this 2 s one is at the edge (p99 lags 0.6-2.9 ms,
    the five processes' bursts meeting on two cores), so it is not asserted valid there. At
    N = 4 the same run is valid."""
    text = DEFAULT_LIKE.format(bulk=100, probe=2000, duration=2, cut=1)
    result, _, foreign = _run_cli(tmp_path, "light1", text)
    fid = result["fidelity"]
    assert fid["dilation"] == 1
    assert set(fid["processes"]) >= {"agent-host", "sm", "traffic bulk", "traffic probe"}, fid["processes"]
    log.warning("dilation 1: valid=%s, p99 lags %s; other jobs took %.2f CPUs", fid["valid"], _lags(fid), foreign)
    assert fid["valid"] or "fell behind the emulated clock" in fid["note"], fid["note"]
    result, _, foreign = _run_cli(tmp_path, "light4", text, "--dilation", "4")
    fid = result["fidelity"]
    assert fid["dilation"] == 4
    _skip_if_others_took_the_cpus(foreign, "the run at dilation 4", fid)
    assert fid["valid"], (fid["note"], f"other jobs: {foreign:.2f} CPUs")
    (probe,) = [t for t in result["traffic"] if t["name"] == "probe"]
    assert probe["extra"]["lost"] == 0, probe
    (bulk,) = [t for t in result["traffic"] if t["name"] == "bulk"]
    assert bulk["extra"]["avg_mibps"] > 0 and not bulk.get("error"), bulk


def test_an_overloaded_run_is_invalid_at_dilation_1_and_valid_at_the_factor_auto_picks(tmp_path: Path) -> None:
    """The same scenario with a probe stream no Python endpoint here carries undilated: at
    dilation 1 a process of the run falls behind and the run is INVALID; ``--dilation auto``
    (a fresh calibration of this machine) picks N > 1, and at N the same run is valid."""
    text = DEFAULT_LIKE.format(bulk=100, probe=60000, duration=1.2, cut=0.6)
    result, _, _ = _run_cli(tmp_path, "over1", text, "--dilation", "1")
    fid = result["fidelity"]
    assert fid["dilation"] == 1 and fid["valid"] is False, fid["note"]
    # which process the overload lands on (the probe's worker, the SM or the agent host
    # beside it) is the scheduler's choice: at 30,000 probes a second each of them, or none,
    # was the one behind in turn on a quiet machine
    assert "fell behind the emulated clock" in fid["note"], fid["note"]

    cal = tmp_path / "calibration.json"  # measured afresh
    result, stdout, foreign = _run_cli(tmp_path, "over-auto", text, "--dilation", "auto",
                                       env={"IBEMU_CALIBRATION": str(cal)})
    line = next(x for x in stdout.splitlines() if x.startswith("dilation auto:"))
    n = result["fabric"]["dilation"]
    assert 1 < n <= 30, line
    fid = result["fidelity"]
    log.warning("%s; p99 lags at N = %d: %s; other jobs took %.2f CPUs", line, n, _lags(fid), foreign)
    _skip_if_others_took_the_cpus(foreign, f"the run at N = {n:g}", fid)
    assert fid["valid"], (line, fid["note"], f"other jobs: {foreign:.2f} CPUs")
