"""OpenSM's MAD-socket slot served by the C twin (``kernel.madtwin``) on a live fabric.

One small leaf-spine (4 leaves, 2 spines, 2 hosts each: hop counts 1 to 3) brought up by the
real OpenSM on h0 through ``ibemu up``: the twin is started for OpenSM's slot and owned by the
run, runs on OpenSM's CPU (the SM's, as the runtime places it, not the agent host's), its
counters (read from its memfd) show the sweep's SMPs sent and answered by it with no
bad frame and no timeout, infiniband-diags on other slots (the SM host's too) still work
through the agent host's path, and ``ibemu down`` leaves no twin behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ibemu.fabric.umad2sim import umad2sim_path
from ibemu.kernel import cpus, madtwin

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None or shutil.which("opensm") is None
                       or shutil.which("ibnetdiscover") is None,
                       reason="needs opensm, ibsim-utils and infiniband-diags (scripts/setup.sh installs them)"),
    pytest.mark.skipif(not madtwin.available(), reason="madtwin is not built (make native)"),
]


def ibemu(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    env.pop(madtwin.ENV, None)
    env.pop(madtwin.CPU_ENV, None)
    return subprocess.run([sys.executable, "-m", "ibemu.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env=env, check=False)


def test_opensm_reaches_subnet_up_through_the_twin_and_diags_still_work(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = ibemu(state, "up", "--topo", "leaf-spine,leaves=4,spines=2,hosts_per_leaf=2", "--sm", "opensm",
               "--sm-host", "h0")
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        (run_file,) = (state / "runs").glob("*.json")
        procs = json.loads(run_file.read_text())["processes"]
        (twin,) = [p for p in procs if p["role"] == "madtwin"]
        assert madtwin.process_name(twin["pid"]) == "madtwin"
        (sm,) = [p for p in procs if p["role"] == "sm-opensm"]
        if len(os.sched_getaffinity(0)) >= 2 and os.environ.get("IBEMU_PIN", "1") != "0":
            # on the fabric's one CPU, where the runtime's placement puts it (``cpus_for``):
            # not OpenSM's, which it would share if it inherited the SM's placement
            assert os.sched_getaffinity(twin["pid"]) == set(madtwin.cpus_for(cpus.placement()) or ())
            assert len(os.sched_getaffinity(twin["pid"])) == 1
            assert os.sched_getaffinity(twin["pid"]).isdisjoint(os.sched_getaffinity(sm["pid"]))
        counters = madtwin.read_counters(twin["pid"])
        assert counters["sent"] > 50 and counters["answered"] == counters["sent"]
        assert counters["bad_frame"] == counters["timed_out"] == counters["dr_discard"] == 0
        assert counters["forwarded"] > 0  # HopCount 0 and the SA's MADs went to the agent host

        topo = ibemu(state, "diag", "h3", "ibnetdiscover")
        assert topo.returncode == 0, topo.stderr[-2000:]
        assert len(re.findall(r"^Switch\s", topo.stdout, re.M)) == 6
        assert len(re.findall(r"^Ca\s", topo.stdout, re.M)) == 8
        node = ibemu(state, "diag", "h0", "smpquery", "-D", "nodeinfo", "0,1,3")  # h0 - leaf - spine
        assert node.returncode == 0 and re.search(r"NodeType:\.+Switch", node.stdout), node.stderr[-2000:]
        assert madtwin.read_counters(twin["pid"])["answered"] >= counters["answered"]
    finally:
        down = ibemu(state, "down")
    assert down.returncode == 0, down.stderr
    assert madtwin.process_name(twin["pid"]) != "madtwin"
