"""`ibemu run --dilation 2`: the run is on the emulated clock (its traffic lasts the configured
duration in emulated time and twice that in real time), and the agent host and the SM process
stamp one trap on the same clock."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibemu.events import Kind, read_events
from ibemu.kernel import netns
from ibemu.report import validate

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
DURATION_S = 3.0
RATE_PPS = 2000

SCENARIO = f"""
name: pytest-dilated
topology: {{generator: leaf-spine, leaves: 2, spines: 2}}
sm: {{impl: ibemu, engine: minhop, host: h0}}
traffic:
  - {{name: probe, kind: stream, from: h1, to: h5, size: 256, rate_pps: {RATE_PPS}}}
faults:
  - {{at_s: 1, action: link_down, link: "leaf0:5"}}
duration_s: {DURATION_S:g}
time: {{dilation: 4}}
"""


def _tid(tid: int | str) -> int:
    return int(tid, 0) if isinstance(tid, str) else tid


def test_a_run_at_dilation_2_is_on_the_emulated_clock(tmp_path: Path) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(SCENARIO)
    out, result_path = tmp_path / "o", tmp_path / "result.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--dilation", "2",
                           "--json", str(result_path), "--out", str(out), "--no-plots"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    wall_s = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_id,) = set(re.findall(r"ibemu-([0-9a-f]+)-", (out / "run" / "traffic-0.json").read_text()))
    assert not [n for n in netns.list_names() if run_id in n]  # torn down
    result = json.loads(result_path.read_text())
    assert validate(result) == []
    assert result["fabric"]["dilation"] == 2  # the command line over the scenario's 4
    assert "time dilation 2" in proc.stdout

    # The traffic phase: the configured duration in emulated time, twice that in real time.
    stamps = {m.group(2): float(m.group(1))
              for m in re.finditer(r"\[\s*([\d.]+)s\] (traffic|drain)\s", proc.stderr)}
    real_traffic_s = stamps["drain"] - stamps["traffic"]
    assert 2 * DURATION_S * 0.9 <= real_traffic_s <= 2 * DURATION_S + 3.0, proc.stderr
    assert wall_s > 2 * DURATION_S
    (probe,) = [t for t in result["traffic"] if t["name"] == "probe"]
    sent = probe["extra"]["sent"]
    assert RATE_PPS * DURATION_S * 0.85 <= sent <= RATE_PPS * DURATION_S * 1.05  # paced on emulated time
    timeline = probe["timeline"]["t_s"]
    assert DURATION_S * 0.8 <= timeline[-1] - timeline[0] + (timeline[1] - timeline[0]) <= DURATION_S * 1.2

    # One trap, stamped by the switch agent (agent host) and by the SM (its own process).
    run_dir = out / "run"
    sent_at = {_tid(r["tid"]): r["t_ns"] for r in read_events(run_dir / "events.jsonl")
               if r["kind"] == Kind.TRAP_SENT and not r.get("repeat")}
    got_at = {_tid(r["tid"]): r["t_ns"] for r in read_events(run_dir / "ibemu" / "events.jsonl") if r["kind"] == Kind.TRAP}
    common = sorted(set(sent_at) & set(got_at))
    assert common, (sent_at, got_at)
    for tid in common:
        lag_ms = (got_at[tid] - sent_at[tid]) / 1e6
        # The same clock on both sides: received after sent, within a few emulated ms (a second
        # clock, e.g. real monotonic time, would be seconds apart at dilation 2).
        assert 0 <= lag_ms < 50, (tid, lag_ms)
    (fault,) = result["faults"]
    ph = fault["phases_ms"]
    assert 0 < ph["detect"] <= ph["trap"] <= ph["routed"] <= ph["programmed"] < 2000
    # The probe's receive stamps (the kernel's, converted once onto the emulated clock): it is
    # seen to resume after the fault (with the stamps dilated twice, it never was).
    for flow in fault["flows"]:
        assert flow["resume_ms"] is not None and flow["resume_ms"] < 1000, flow
    # Each delivery's one-way latency (kernel receive stamp - send stamp, both emulated): never
    # negative, a few ms at most (with the dilation applied twice it was seconds negative).
    (out_probe,) = [f for p in sorted(run_dir.glob("flows-*.json")) for f in json.loads(p.read_text())["flows"]
                    if f["name"] == "probe"]
    lat_ms = sorted((t - out_probe["sent_t_ns"][q]) / 1e6 for t, q in zip(out_probe["t_ns"], out_probe["recv_seq"],
                                                                           strict=True))
    assert lat_ms and lat_ms[0] >= -0.5 and lat_ms[len(lat_ms) // 2] < 20, (lat_ms[:5], lat_ms[len(lat_ms) // 2])


AUTO_SCENARIO = """
name: pytest-auto
topology: {{generator: leaf-spine, leaves: 2, spines: 2}}
sm: {{impl: {sm}, engine: minhop, host: h0}}
traffic:
  - {{name: probe, kind: stream, from: h1, to: h5, size: 256, rate_pps: 2000}}
duration_s: 2
time: {{dilation: auto}}
"""


def test_auto_picks_the_factor_from_the_load_and_the_calibration(tmp_path: Path) -> None:
    """On a machine calibrated at 20k frame-hops/s, a 2000 frames/s stream on the kernel
    datapath (a stream's endpoints: 4 a frame, 8k frame-hops/s) fits the run's 50% headroom
    but not its one worker's 25% (``autodilation.WORKER_HEADROOM``; the worker also carries the
    3 switches its frames and ACKs cross: 4 + 0.5 x 3 x 2 = 7 units, 14k): N = 3; with OpenSM
    as the SM (when installed), it runs on that clock under libfaketime, as the result says."""
    from ibemu.fabric import calibrate, opensm
    from ibemu.fabric.umad2sim import umad2sim_path
    from ibemu.kernel import faketime

    with_opensm = opensm.opensm_available() and umad2sim_path() is not None and faketime.library_path() is not None
    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({calibrate.cache_key(256 + 42): {"frame_hops_per_s": 20_000.0, "measured_at": "t"}}))
    scen = tmp_path / "s.yaml"
    scen.write_text(AUTO_SCENARIO.format(sm="opensm" if with_opensm else "ibemu"))
    out, result_path = tmp_path / "o", tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--json", str(result_path),
                           "--out", str(out), "--no-plots"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "IBEMU_CALIBRATION": str(cal)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("dilation auto:"))
    assert "offered load 8k frame-hops/s, capacity 20k frame-hops/s" in line and line.split(" -> ")[1].startswith(
        "N = 3:") and "worker probe: 14k / 3 = 4.67k <= 5k" in line, line
    result = json.loads(result_path.read_text())
    assert validate(result) == []
    assert result["fabric"]["dilation"] == 3
    assert result["sm"]["clock"] == ("libfaketime" if with_opensm else "emulated")
    (probe,) = result["traffic"]
    assert 2000 * 2 * 0.85 <= probe["extra"]["sent"] <= 2000 * 2 * 1.05  # paced on the emulated clock
