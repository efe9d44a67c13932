"""`ibemu up / status / exec / diag / down` as a user runs them (subprocesses, real fabric)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibemu.fabric.umad2sim import umad2sim_path
from ibemu.kernel import madtwin

pytestmark = pytest.mark.root


def ibemu(state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "ibemu.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


def test_up_without_an_sm_leaves_the_ports_in_init(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = ibemu(state, "up", "--topo", "single-switch,hosts=2", "--sm", "none")
    try:
        assert up.returncode == 0, up.stderr
        assert "no SM (ports stay in Init)" in up.stdout
        assert json.loads(ibemu(state, "status", "--json").stdout)[0]["processes"] == ["fabric-daemon"]
    finally:
        down = ibemu(state, "down")
    assert down.returncode == 0, down.stderr


def test_up_exec_diag_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = ibemu(state, "up", "--topo", "fat-tree,k=4")  # ibemu's SM by default, as mn starts its controller
    try:
        assert up.returncode == 0, up.stderr
        assert "20 switches, 16 hosts, 48 links" in up.stdout and "ibemu on h0: SUBNET UP" in up.stdout
        status = json.loads(ibemu(state, "status", "--json").stdout)
        assert len(status) == 1 and status[0]["status"] == "up" and status[0]["namespaces"] == 36
        assert sorted(status[0]["processes"]) == ["fabric-daemon", "sm-ibemu"]
        links = ibemu(state, "exec", "edge0_0", "--", "ip", "-br", "link")
        assert links.returncode == 0 and links.stdout.count("UP") >= 4 and "edge0_0-1" in links.stdout
        if umad2sim_path() and subprocess.run(["which", "smpquery"], capture_output=True).returncode == 0:
            node = ibemu(state, "diag", "h5", "smpquery", "-D", "nodeinfo", "0,1")
            assert node.returncode == 0 and "NodeType:........................Switch" in node.stdout
        bad = ibemu(state, "exec", "nosuch", "--", "true")
        assert bad.returncode == 2 and "no node 'nosuch'" in bad.stderr
    finally:
        down = ibemu(state, "down")
    assert down.returncode == 0, down.stderr
    assert json.loads(ibemu(state, "status", "--json").stdout) == []
    run_id = up.stdout.split()[1]
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if run_id in n]


@pytest.mark.skipif(umad2sim_path() is None or shutil.which("opensm") is None or shutil.which("ibtracert") is None,
                    reason="needs opensm, ibsim-utils and infiniband-diags (scripts/setup.sh installs them)")
@pytest.mark.parametrize("sm", ["opensm", "ibemu"])
def test_up_with_an_sm_then_ibtracert_across_the_fabric(tmp_path: Path, sm: str) -> None:
    state = tmp_path / "state"
    up = ibemu(state, "up", "--topo", "fat-tree,k=4", "--sm", sm, "--sm-host", "h0")
    try:
        assert up.returncode == 0, up.stderr
        assert f"{sm} on h0: SUBNET UP" in up.stdout
        status = json.loads(ibemu(state, "status", "--json").stdout)
        # OpenSM's MAD-socket hot path runs in its C twin when it is built (kernel.madtwin)
        twin = ["madtwin"] if sm == "opensm" and madtwin.enabled() else []
        assert sorted(status[0]["processes"]) == sorted(["fabric-daemon", f"sm-{sm}", *twin])

        def lid(host: str) -> int:
            out = ibemu(state, "diag", host, "smpquery", "-D", "portinfo", "0").stdout
            m = re.search(r"^Lid:\.+(\d+)", out, re.M)
            assert m, out
            return int(m.group(1))

        l1, l15 = lid("h1"), lid("h15")
        assert l1 and l15 and l1 != l15
        trace = ibemu(state, "diag", "h1", "ibtracert", str(l1), str(l15))
        assert trace.returncode == 0, trace.stderr
        assert trace.stdout.count("-> switch port") == 5 and '"h15 HCA-1"' in trace.stdout
        if sm == "ibemu":  # the SM's own view of the same path agrees with ibtracert's
            time.sleep(0.7)  # its snapshot is written within half a second of programming
            path = ibemu(state, "sm", "path", "h1", "h15")
            assert path.returncode == 0 and "arrived after 5 switches" in path.stdout, path.stdout
            ours = re.findall(r"ibemu (\w+)", path.stdout)
            theirs = re.findall(r'"ibemu (\w+)"', trace.stdout)
            assert ours == theirs
            routes = ibemu(state, "sm", "routes", ours[0])
            assert f"{l15:#06x}" in routes.stdout and "valid lids dumped" in routes.stdout
            events = ibemu(state, "sm", "events", "--kind", "subnet_up")
            assert events.returncode == 0 and "subnet_up" in events.stdout
            listed = ibemu(state, "sm", "dumps")  # OpenSM's files, from ibemu's SM
            assert listed.returncode == 0 and len(listed.stdout.split()) == 3, listed.stderr
            lfts = ibemu(state, "sm", "dumps", "opensm-lfts.dump")
            assert lfts.returncode == 0 and f"0x{l15:04x} " in lfts.stdout and lfts.stdout.count("lids dumped") == 20
    finally:
        down = ibemu(state, "down")
    assert down.returncode == 0, down.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["up", "--topo", "fat-tree,k=3"], "k"),
    (["up", "--topo", "fat-tree,k"], "expected NAME,key=value"),
    (["up", "--topo", "no-such-gen"], "no-such-gen"),
    (["up", "--sm", "opensm", "--sm-host", "sw0", "--topo", "single-switch"], "--sm-host sw0"),
    (["down"], "no fabric is running"),
    (["up", "/nonexistent/scenario.yaml"], "nonexistent"),
])
def test_bad_input_exits_2_and_builds_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    state = tmp_path / "state"
    r = ibemu(state, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert not list(state.glob("runs/*.json"))


def test_up_a_roce_fabric_fault_it_through_the_control_socket_and_down(tmp_path: Path) -> None:
    from ibemu.fabric import control

    state = tmp_path / "state"
    bad = ibemu(state, "up", "--topo", "fat-tree,k=4", "--fabric", "roce", "--sm", "ibemu")
    assert bad.returncode == 2 and "no subnet manager" in bad.stderr
    delayed = tmp_path / "delayed.yaml"
    delayed.write_text("name: d\ntopology: {generator: fat-tree, k: 4}\nfabric: {kind: roce, delay_us: 20}\n")
    from ibemu.kernel.impair import has_sch_fq

    if not has_sch_fq():  # this kernel cannot hold frames back: said before anything is built
        bad = ibemu(state, "up", str(delayed))
        assert bad.returncode == 2 and "delayed.yaml:3 fabric.delay_us" in bad.stderr, bad.stderr
    assert json.loads(ibemu(state, "status", "--json").stdout) == []  # nothing built
    up = ibemu(state, "up", "--topo", "fat-tree,k=4", "--fabric", "roce")
    try:
        assert up.returncode == 0, up.stderr
        assert "20 IP routers (ECMP)" in up.stdout
        status = json.loads(ibemu(state, "status", "--json").stdout)
        assert sorted(status[0]["processes"]) == ["fabric-daemon", "roce-manager"]
        addr = ibemu(state, "exec", "h0", "--", "ip", "-4", "-br", "addr")
        assert re.search(r"h0-1\S*\s+UP\s+198\.1[89]\.", addr.stdout), addr.stdout
        run_dir = state / "runs" / up.stdout.split()[2]
        got = control.request(control.socket_path(run_dir), {"fault": "link_down", "link": "edge0_0:3"})
        assert got["ok"] and "edge0_0:3" in got["link"], got
        links = ibemu(state, "exec", "edge0_0", "--", "ip", "-br", "link", "show", "edge0_0-3")
        assert "DOWN" in links.stdout
        refused = control.request(control.socket_path(run_dir), {"fault": "smp_loss", "percent": 5})
        assert not refused["ok"] and "no SMPs" in refused["error"]
    finally:
        down = ibemu(state, "down")
    assert down.returncode == 0, down.stderr
    assert json.loads(ibemu(state, "status", "--json").stdout) == []
