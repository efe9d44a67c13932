"""`ibemu run` killed with SIGKILL at random points, then `ibemu clean`: nothing of ibemu's
survives (namespaces, cables, the SM, the traffic workers, the daemon), and foreign look-alike
namespaces, links and processes are untouched."""

from __future__ import annotations

import json
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
            # this run's namespaces (those it recorded, and any named for it): other jobs on the
            # machine may add and remove theirs meanwhile
            mine = {n for run in runs for n in run.namespaces}
            left = {n for n in netns.list_names() if n in mine or any(run.run_id in n for run in runs)}
            assert not left, f"kill {i}: namespaces left: {sorted(left)[:5]}"
            assert netns.exists(foreign_ns), f"kill {i}: clean removed what was not its own"
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


SMALL = """
name: pytest-killed-small
topology: {generator: leaf-spine, leaves: 2, spines: 1, hosts_per_leaf: 2}
sm: {impl: ibemu, host: h0}
traffic:
  - {name: probe, kind: stream, from: h1, to: h2, rate_pps: 500}
duration_s: 20
"""


def _start(tmp_path: Path, text: str) -> tuple[subprocess.Popen[str], Path, dict[str, str]]:
    state_dir = tmp_path / "state"
    env = {**os.environ, "IBEMU_STATE_DIR": str(state_dir), "PYTHONPATH": str(REPO)}
    scen = tmp_path / "s.yaml"
    scen.write_text(text)
    proc = subprocess.Popen([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--quiet", "--no-plots",
                             "--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json")],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a shell
    return proc, state_dir, env


def _wait_role(proc: subprocess.Popen[str], state_dir: Path, role: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        for path in (state_dir / "runs").glob("*.json"):
            try:
                if any(p.role.startswith(role) for p in ownership.RunState.load(path).processes):
                    return
            except ValueError:
                continue
        time.sleep(0.01)
    raise AssertionError(f"no {role} process appeared")


def _clean(state_dir: Path, env: dict[str, str]) -> None:
    """What is left of the run (nothing, when the run tore itself down) removed."""
    runs = [p.stem for p in (state_dir / "runs").glob("*.json")]
    if runs:
        subprocess.run([sys.executable, "-m", "ibemu.cli.main", "clean", *runs], cwd=REPO, env=env,
                       capture_output=True, timeout=120)
    assert not runs, f"the run left its state file: {runs}"


def test_ctrl_c_during_the_sm_bring_up_stops_the_run_at_once(tmp_path: Path) -> None:
    """The wait for SUBNET UP ran in a thread that a cancel waited for: a Ctrl-C there held
    the run until SUBNET UP or the wait's minute. The SM is stopped (SIGSTOP) so that its
    SUBNET UP cannot end the wait first."""
    proc, state_dir, env = _start(tmp_path, SMALL)
    try:
        _wait_role(proc, state_dir, "sm-")
        run = ownership.RunState.load(next((state_dir / "runs").glob("*.json")))
        sm = next(p for p in run.processes if p.role.startswith("sm-"))
        os.kill(sm.pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=25)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (2, 130), proc.stderr.read() if proc.stderr else ""
    _clean(state_dir, env)


def test_sigterm_in_warm_up_returns_a_result_without_a_timeline_from_the_epoch(tmp_path: Path) -> None:
    """Interrupted before the flows' time zero, the result's timeline ran from the clock's
    epoch: hours of 0.1 s bins (and a minute of CPU before the exit)."""
    proc, state_dir, env = _start(tmp_path, SMALL)
    try:
        _wait_role(proc, state_dir, "traffic-worker-")
        assert not (tmp_path / "o" / "run" / "go.json").exists(), "warm-up already over"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, proc.stderr.read() if proc.stderr else ""
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["interrupted"] is True
    assert all(len(t["timeline"]["t_s"]) <= 1 for t in result["traffic"]), [len(t["timeline"]["t_s"])
                                                                           for t in result["traffic"]]
    _clean(state_dir, env)


def test_a_killed_roce_user_datapath_ends_the_run_with_an_error(tmp_path: Path) -> None:
    """Without its user datapath a RoCE run moves no frame: it stops and says so instead of
    waiting out its workers' ready and drain timeouts (the chaos campaign's userpath-kill hangs)."""
    proc, state_dir, env = _start(tmp_path, SMALL.replace("sm: {impl: ibemu, host: h0}",
                                                          "fabric: {kind: roce, datapath: user}"))
    try:
        _wait_role(proc, state_dir, "traffic-worker-")
        run = ownership.RunState.load(next((state_dir / "runs").glob("*.json")))
        userpath = next(p for p in run.processes if p.role == "roce-userpath")
        os.kill(userpath.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 2 and "user datapath exited" in err, err
    _clean(state_dir, env)
