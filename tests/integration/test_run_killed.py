"""`ibemu run` killed with SIGKILL at random points, then `ibemu clean`: nothing of ibemu's
survives (namespaces, cables, the SM, the traffic workers, the daemon), and foreign look-alike
namespaces, links and processes are untouched."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibemu.kernel import netns, ownership

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
SCENARIO = """
name: pytest-killed
topology: {generator: fat-tree, k: 4}
sm: {impl: ibemu, engine: ftree, host: h0}
traffic:
  - {name: bulk, kind: write_bw, from: h0, to: h14}
  - {name: probe, kind: stream, from: h1, to: h14, rate_pps: 2000}
faults:
  - {at_s: 1, action: link_down, link: "agg0_0:4"}
duration_s: 30
"""
KILL_POINTS_S = 4
"""How many runs; each is killed at a random moment between start and traffic."""


def ibemu_processes(state: ownership.RunState) -> list[int]:
    return [p.pid for p in state.processes if p.alive()]


def test_sigkill_at_random_points_then_clean(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = {**os.environ, "IBEMU_STATE_DIR": str(state_dir)}
    scen = tmp_path / "s.yaml"
    scen.write_text(SCENARIO)
    foreign_ns = "ibemu-pytest-foreign"
    subprocess.run(["ip", "netns", "add", foreign_ns], check=True)
    subprocess.run(["ip", "link", "add", "ibfrgnk0", "type", "veth", "peer", "name", "ibfrgnk1"], check=True)
    foreign_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    rng = random.Random(7)
    try:
        for i in range(KILL_POINTS_S):
            before = set(netns.list_names())
            proc = subprocess.Popen([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--quiet",
                                     "--no-plots", "--out", str(tmp_path / f"o{i}"),
                                     "--json", str(tmp_path / f"r{i}.json")],
                                    cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.5, 6.0))  # building, SM bring-up, warm-up or traffic
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            runs = [ownership.RunState.load(p) for p in (state_dir / "runs").glob("*.json")]
            clean = subprocess.run([sys.executable, "-m", "ibemu.cli.main", "clean"], cwd=REPO, env=env,
                                   capture_output=True, text=True, timeout=120)
            assert clean.returncode == 0, clean.stderr
            assert set(netns.list_names()) <= before, f"kill {i}: namespaces left"
            for run in runs:
                assert not ibemu_processes(run), f"kill {i}: processes of {run.run_id} left"
            assert not list((state_dir / "runs").glob("*.json"))
        assert netns.exists(foreign_ns)
        assert subprocess.run(["ip", "link", "show", "ibfrgnk0"], capture_output=True).returncode == 0
        assert foreign_proc.poll() is None
    finally:
        foreign_proc.kill()
        subprocess.run(["ip", "netns", "del", foreign_ns], check=False)
        subprocess.run(["ip", "link", "del", "ibfrgnk0"], check=False)
