"""`ibemu perf` as a user runs it: a server and a client in two hosts' namespaces (two processes,
meeting over the run's out-of-band socket), and a collective from the root namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root


def ibemu_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ibemu.cli.main", *args]


def run(state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    return subprocess.run(ibemu_argv(*args), capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One fabric for the module's tests: each runs its own processes on it, one after another."""
    state = tmp_path_factory.mktemp("perf") / "state"
    up = run(state, "up", "--topo", "fat-tree,k=4", "--sm", "ibemu")
    try:
        assert up.returncode == 0, up.stderr
        yield state
    finally:
        assert run(state, "down").returncode == 0


@pytest.mark.parametrize(("test", "column"), [("write_bw", "BW average[MiB/sec]"), ("send_lat", "t_typical[usec]")])
def test_server_and_client_in_two_hosts(fabric: Path, test: str, column: str, tmp_path: Path) -> None:
    env = {**os.environ, "IBEMU_STATE_DIR": str(fabric)}
    server = subprocess.Popen(ibemu_argv("exec", "h1", "--", sys.executable, "-m", "ibemu.cli.main", "perf", test),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out_json = tmp_path / "perf.json"
    try:
        client = run(fabric, "exec", "h15", "--", sys.executable, "-m", "ibemu.cli.main", "perf", test, "h1",
                     "-n", "300", "-s", "8192", "--out-json", str(out_json))
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, err
    assert "h15 (LID" in client.stdout and "-> h1 (LID" in client.stdout
    header, values = [ln for ln in client.stdout.splitlines() if ln.startswith(" ")][:2]
    assert column in header and values.split()[:2] == ["8192", "300"]
    assert "waiting for a client" in out
    # perftest's --out_json: its keys, its units (MiB/s, Mpps; usec), the same figures as the table
    doc = json.loads(out_json.read_text())
    assert doc["test_info"]["Link_type"] == "IB" and doc["test_info"]["Number_of_qps"] == 1
    res = doc["results"]
    assert res["MsgSize"] == 8192 and res["n_iterations"] == 300
    if test == "write_bw":
        assert set(res) == {"MsgSize", "n_iterations", "BW_peak", "BW_average", "MsgRate"}
        assert res["BW_average"] == pytest.approx(float(values.split()[3]), abs=0.01) and res["MsgRate"] > 0
    else:
        assert {"t_min", "t_typical", "t_avg", "percentile_99", "percentile_99.9"} <= set(res)
        assert 0 < res["t_min"] <= res["t_typical"] <= res["percentile_99.9"]


def test_allreduce_from_the_root_namespace(fabric: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "nccl.json"
    r = run(fabric, "perf", "allreduce", "--hosts", "h0,h3,h6,h9,h12", "-s", "256KiB", "-n", "2", "-J", str(out_json))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if not ln.startswith("#")).split()
    assert int(line[0]) == 256 * 1024 // 20 * 20 and line[-1] == "0"  # whole floats per rank; #wrong
    # nccl-tests' footer, as scripts grep it, and its -J JSON
    busbw = float(next(ln for ln in r.stdout.splitlines() if ln.startswith("# Avg bus bandwidth")).split(":")[1])
    assert "# Out of bounds values : 0 OK" in r.stdout and abs(busbw - float(line[6])) <= 0.0005 + 1e-9  # %.3f
    doc = json.loads(out_json.read_text())
    (res,) = doc["results"]
    assert res["size"] == int(line[0]) and res["redop"] == "sum" and res["out_of_place"]["nwrong"] == 0
    assert doc["average_bus_bandwidth"]["bandwidth"] == pytest.approx(busbw, rel=0.01)
    assert doc["out_of_bounds"] == {"count": 0, "okay": True}


def test_bad_arguments_are_located(fabric: Path) -> None:
    r = run(fabric, "perf", "allreduce", "--hosts", "h0,sw9")
    assert r.returncode == 2 and "sw9" in r.stderr
    r = run(fabric, "exec", "h2", "--", sys.executable, "-m", "ibemu.cli.main", "perf", "write_bw", "h2")
    assert r.returncode == 2 and "the server is this host" in r.stderr
    r = run(fabric, "perf", "write_bw", "h1", "-s", "12XB")
    assert r.returncode == 2 and "not a size" in r.stderr
    r = run(fabric, "perf", "allreduce", "--out-json", "/nonexistent-dir/x.json")
    assert r.returncode == 2 and "--out-json /nonexistent-dir/x.json: no directory" in r.stderr
