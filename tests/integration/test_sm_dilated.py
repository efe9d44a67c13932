"""ibemu's SM brings a fabric up under time dilation: `ftree_ar` on the user datapath at N = 100
and 20,000, one cold sweep with no SMP unanswered, SUBNET UP within seconds of real time.

Before the fix, the alternates' LID-routed Sets of the cold sweep went out before the tops
(LinearFDBTop) were set, their answers were dropped, and each waited out the SMP timeout in
emulated time: at N = 20,000 (4,000 s of real time) no LinearFDBTop was written for as long as
anyone waited; at N = 100 the sweep took 20 s and the next one came 100 s later."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ibemu.events import Kind, read_events

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]

SCENARIO = """
name: pytest-sm-dilated
topology: {{generator: leaf-spine, leaves: 2, spines: 2, hosts_per_leaf: 1}}
defaults: {{rate: 4x NDR, cable_m: 2}}
fabric: {{kind: ib, datapath: user}}
sm: {{impl: ibemu, engine: ftree_ar, host: h0}}
duration_s: {duration:.6f}
time: {{dilation: {n}}}
"""


@pytest.mark.parametrize("n", [100, 20_000])
def test_the_sm_brings_a_dilated_fabric_up_in_one_clean_sweep(tmp_path: Path, n: int) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(SCENARIO.format(n=n, duration=1.0 / n))  # one second of real time
    out, result_path = tmp_path / "o", tmp_path / "result.json"
    proc = subprocess.Popen([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--json", str(result_path),
                             "--out", str(out), "--no-plots"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)  # ~5 s here; before the fix 2 minutes (N = 100) or hours
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the run tears its fabric down
        _, err = proc.communicate(timeout=120)
        pytest.fail(f"no end within 60 s of real time: {err[-2000:]}")
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(result_path.read_text())["fabric"]["dilation"] == n
    sm = read_events(out / "run" / "ibemu" / "events.jsonl")
    sweeps = [r for r in sm if r["kind"] == Kind.SWEEP_END and r["reason"] == "cold"]
    assert len(sweeps) == 1 and sweeps[0]["ok"], sweeps  # one cold sweep: nothing to sweep again for
    smps = sweeps[0]["smps"]
    assert not smps.get("failed") and not smps.get("timeouts") and not smps.get("fell_back"), smps
    (sm_start,) = [r for r in sm if r["kind"] == Kind.SM_START]
    # the SM process took the run's dilation from its clock: its SMP timeout is one real second
    assert sm_start["dilation"] == n and sm_start["timeout_real_s"] == pytest.approx(1.0)
    assert sm_start["timeout_s"] == pytest.approx(1.0 / n)
    start = sm_start["t_ns"]
    (up,) = [r["t_ns"] for r in sm if r["kind"] == Kind.SUBNET_UP]
    assert (up - start) * n / 1e9 < 10.0  # seconds of real time (it was 20 s at N = 100, hours at 20,000)
    groups = [r for r in sm if r["kind"] == Kind.GROUPS_PROGRAMMED]
    assert groups and groups[0]["blocks"] > 0 and not groups[0]["failed"]
    fabric = read_events(out / "run" / "events.jsonl")
    assert not [r for r in fabric if r["kind"] == Kind.SMP_DISCARD]  # no answer dropped (no_route: top 0)
    tops = [r for r in fabric if r["kind"] == Kind.LFT_TOP]
    assert len(tops) == 4 and all(r["top"] > 0 for r in tops)  # every switch routes
