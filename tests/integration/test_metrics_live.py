"""A live fabric's sysfs trees and Prometheus endpoint, read by real clients under traffic.

One ``ibemu up --metrics`` fabric (a switch, two hosts, ibemu's SM) serves the module: its
trees are read as files and by Debian's prometheus-node-exporter (``--path.sysfs``), its
endpoint over HTTP; frames cross it from h0 to h1 on raw sockets between scrapes. A cut cable
shows in the tree. ``ibemu run --metrics`` is scraped while its flows run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ibemu.fabric import control
from ibemu.fabric.plan import FabricPlan, plan_fabric
from ibemu.fabric.probe import send_and_count
from ibemu.fabric.session import link_request
from ibemu.topo import parse_topo_spec

pytestmark = pytest.mark.root

TOPO = "single-switch,hosts=2"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PORT = "class/infiniband/ibemu0/ports/1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ibemu(state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "ibemu.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


class Fabric:
    def __init__(self, state: Path, run_id: str, run_dir: Path, metrics_port: int) -> None:
        self.state, self.run_id, self.run_dir, self.metrics_port = state, run_id, run_dir, metrics_port
        self.plan: FabricPlan = plan_fabric(parse_topo_spec(TOPO), run_id)
        self.url = f"http://127.0.0.1:{metrics_port}/metrics"

    def file(self, node: str, rel: str) -> str:
        return (self.run_dir / "sysfs" / node / rel).read_text().strip()

    def link(self, word: str) -> None:
        """The h1 cable down or up, through the daemon's control channel (as `ibemu cli` does)."""
        reply = control.request(control.socket_path(self.run_dir),
                                link_request(parse_topo_spec(TOPO), ["h1", "sw0", word]))
        assert reply.get("ok", True), reply

    def blast(self, n: int = 400, size: int = 1000) -> int:
        """h0 -> h1 frames on raw sockets, LIDs as the hosts' trees have them."""
        lid0, lid1 = (int(self.file(h, f"{PORT}/lid"), 16) for h in ("h0", "h1"))
        return send_and_count(self.plan, "h0", "h1", lid0, lid1, n, size=size)


@pytest.fixture(scope="module", name="fab")
def fab_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    state = tmp_path_factory.mktemp("metrics") / "state"
    port = free_port()
    up = ibemu(state, "up", "--topo", TOPO, "--metrics", str(port))
    try:
        assert up.returncode == 0, up.stderr
        assert f"http://127.0.0.1:{port}/metrics" in up.stdout
        [row] = json.loads(ibemu(state, "status", "--json").stdout)
        fab = Fabric(state, row["run"], state / "runs" / row["run"], port)
        # written at most a refresh after the SM made the ports active
        assert wait_until(lambda: all((fab.run_dir / "sysfs" / h / PORT / "state").exists()
                                      and fab.file(h, f"{PORT}/state") == "4: ACTIVE" for h in ("h0", "h1")))
        yield fab
    finally:
        down = ibemu(state, "down")
        assert down.returncode == 0, down.stderr


def test_the_sysfs_tree_has_the_kernels_files_and_follows_traffic(fab: Fabric) -> None:
    assert fab.file("h0", f"{PORT}/state") == "4: ACTIVE"
    assert fab.file("h0", f"{PORT}/phys_state") == "5: LinkUp"
    assert fab.file("h0", f"{PORT}/rate") == "100 Gb/sec (4X EDR)"
    assert fab.file("h0", "class/infiniband/ibemu0/node_type") == "1: CA"
    assert fab.file("sw0", "class/infiniband/ibemu0/node_type") == "2: switch"
    words0 = int(fab.file("h0", f"{PORT}/counters/port_xmit_data"))
    rcv0 = int(fab.file("h1", f"{PORT}/counters/port_rcv_packets"))
    got = fab.blast(n=300, size=1000)  # all leave h0's cable; what reached h1 is counted there
    assert got > 0
    # 300 frames of more than 1000 bytes: more than 75,000 4-octet words, within a refresh or two
    assert wait_until(lambda: int(fab.file("h0", f"{PORT}/counters/port_xmit_data")) - words0 >= 75_000)
    assert wait_until(lambda: int(fab.file("h1", f"{PORT}/counters/port_rcv_packets")) - rcv0 >= got)


@pytest.mark.skipif(not os.path.exists(NODE_EXPORTER), reason="needs Debian's prometheus-node-exporter "
                    "(scripts/setup.sh installs it)")
def test_node_exporter_reads_a_hosts_tree_and_its_counters_move(fab: Fabric) -> None:
    port = free_port()
    proc = subprocess.Popen([NODE_EXPORTER, "--path.sysfs", str(fab.run_dir / "sysfs" / "h0"),
                             "--collector.disable-defaults", "--collector.infiniband",
                             "--web.listen-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    ib = (("device", "ibemu0"), ("port", "1"))
    tx = ("node_infiniband_port_data_transmitted_bytes_total", ib)
    try:
        def listening() -> bool:
            try:
                return tx in scrape(url)
            except OSError:
                return False

        assert wait_until(listening), proc.stderr.read().decode() if proc.poll() is not None else "no metrics"
        first = scrape(url)
        assert first[("node_infiniband_state_id", ib)] == 4
        assert first[("node_infiniband_physical_state_id", ib)] == 5
        assert first[("node_infiniband_rate_bytes_per_second", ib)] == 12.5e9
        assert fab.blast(n=200, size=1000) > 0
        assert wait_until(lambda: scrape(url)[tx] - first[tx] >= 200 * 1000)
        second = scrape(url)
        rx = ("node_infiniband_port_packets_received_total", ib)
        assert second[rx] >= first[rx]
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_endpoint_has_every_ports_counters_with_treydocks_labels_moving(fab: Fabric) -> None:
    first = scrape(fab.url)
    guid = {h: "0x" + fab.file(h, "class/infiniband/ibemu0/node_guid").replace(":", "") for h in ("h0", "h1", "sw0")}
    h0_tx = ("infiniband_hca_port_transmit_data_bytes_total", (("guid", guid["h0"]), ("port", "1")))
    sw_rx = ("infiniband_switch_port_receive_data_bytes_total", (("guid", guid["sw0"]), ("port", "1")))
    sw_tx = ("infiniband_switch_port_transmit_packets_total", (("guid", guid["sw0"]), ("port", "2")))
    h1_rx = ("infiniband_hca_port_receive_packets_total", (("guid", guid["h1"]), ("port", "1")))
    got = fab.blast(n=300, size=1000)
    assert got > 0
    second = scrape(fab.url)
    assert second[h0_tx] - first[h0_tx] >= 300 * 1000  # bytes, read at scrape time
    assert second[sw_rx] - first[sw_rx] >= 300 * 1000
    assert second[sw_tx] - first[sw_tx] >= got and second[h1_rx] - first[h1_rx] >= got
    uplinks = {dict(k[1])["guid"]: dict(k[1]) for k in second if k[0] == "infiniband_hca_uplink_info"}
    assert uplinks[guid["h1"]]["uplink_guid"] == guid["sw0"] and uplinks[guid["h1"]]["uplink_port"] == "2"
    assert uplinks[guid["h1"]]["uplink_type"] == "SW"
    assert second[("ibemu_sm_sweeps_total", (("reason", "cold"),))] >= 1
    assert second[("ibemu_sm_subnet_up_seconds", ())] > 0


def test_a_cut_cable_shows_in_the_tree_and_the_endpoint(fab: Fabric) -> None:
    state = fab.run_dir / "sysfs/h1" / PORT / "state"
    downed = ("ibemu_carrier_changes_total", ())
    before = scrape(fab.url)[downed]
    t0 = time.monotonic()
    fab.link("down")
    try:
        assert wait_until(lambda: state.read_text() == "1: DOWN\n", 2.0)
        assert time.monotonic() - t0 < 1.5  # within a second or so of the cut
        assert fab.file("h1", f"{PORT}/phys_state") == "2: Polling"
        assert wait_until(lambda: ("ibemu_reroute_phase_seconds", (("origin", "fault"), ("phase", "programmed"),
                                                                   ("reroute", "0"))) in scrape(fab.url))
        after = scrape(fab.url)
        assert after[downed] > before and after[("ibemu_faults_total", (("action", "link_down"),))] == 1
        phases = {dict(k[1])["phase"]: v for k, v in after.items() if k[0] == "ibemu_reroute_phase_seconds"
                  and dict(k[1])["reroute"] == "0"}
        assert 0 < phases["detect"] <= phases["trap"] <= phases["routed"] <= phases["programmed"] < 2
        assert after[("ibemu_port_state", (("guid", "0x" + fab.file("h1", "class/infiniband/ibemu0/node_guid")
                                            .replace(":", "")), ("node", "h1"), ("port", "1")))] == 1
    finally:
        fab.link("up")
    assert wait_until(lambda: state.read_text() == "4: ACTIVE\n", 10.0)


def test_a_port_in_use_is_refused_before_anything_is_built(fab: Fabric, tmp_path: Path) -> None:
    """The port the live fabric serves on, for up and for run (the values themselves:
    tests/unit/test_sysfs_metrics.py)."""
    scen = tmp_path / "scen.yaml"
    scen.write_text(RUN_SCENARIO)
    for args, message in ((["up", "--topo", TOPO, "--metrics", f"localhost:{fab.metrics_port}"], "cannot listen there"),
                          (["run", str(scen), "--metrics", str(fab.metrics_port)], "cannot listen there")):
        bad = ibemu(fab.state, *args)
        assert bad.returncode == 2 and "--metrics: " in bad.stderr and message in bad.stderr, bad.stderr
    assert [r["run"] for r in json.loads(ibemu(fab.state, "status", "--json").stdout)] == [fab.run_id]


RUN_SCENARIO = """
name: pytest-metrics-run
topology: {generator: single-switch, hosts: 2}
sm: {impl: ibemu, host: h0}
traffic:
  - {name: probe, kind: stream, from: h0, to: h1, size: 1024, rate_pps: 2000}
faults:
  - {at_s: 1, action: link_down, link: "sw0:2"}
  - {at_s: 1.5, action: link_up, link: "sw0:2"}
duration_s: 3
"""


def test_ibemu_run_serves_metrics_while_its_flows_run(tmp_path: Path) -> None:
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2")
    scen = tmp_path / "scen.yaml"
    scen.write_text(RUN_SCENARIO)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = {**os.environ, "IBEMU_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--out", str(tmp_path / "out"),
                             "--no-plots", "--quiet", "--metrics", str(port), "--sysfs"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    scrapes: list[dict[Any, float]] = []
    trees_seen = False  # asked for with --sysfs (off by default under ibemu run)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                got = scrape(url)
            except OSError:
                got = {}
            if any(k[0] == "infiniband_hca_port_transmit_data_bytes_total" for k in got):
                scrapes.append(got)
                trees_seen = trees_seen or (tmp_path / "out/run/sysfs/h0/class/infiniband").is_dir()
            time.sleep(0.3)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert len(scrapes) >= 3, f"{len(scrapes)} scrapes while the fabric ran"
    tx = [max(v for k, v in s.items() if k[0] == "infiniband_hca_port_transmit_data_bytes_total") for s in scrapes]
    assert tx[-1] > tx[0] and tx == sorted(tx)  # counters: moving and never back
    last = scrapes[-1]
    assert ("ibemu_fidelity_valid", ()) in last
    frames = [s for s in scrapes if any(k[0] == "ibemu_flow_frames_received_total" for k in s)]
    assert len(frames) >= 2  # the flows' live watch, moving while they run
    seen = [sum(v for k, v in s.items() if k[0] == "ibemu_flow_frames_received_total") for s in frames]
    assert seen[-1] > seen[0]
    gaps = {k[1]: v for k, v in frames[-1].items() if k[0] == "ibemu_flow_longest_gap_seconds"}
    open_ = {k[1]: v for k, v in frames[-1].items() if k[0] == "ibemu_flow_silence_seconds"}
    # the probe's cable was down 0.5 s: its live blackout shows it (and no more than the run),
    # closed, or still open when the RC stream ran out of retries across the cut (its ~0.5 s
    # budget against the cut and the port's activation after it; seen in one run of the suite)
    probe = (("flow", "probe"),)
    assert 0.3 < max(gaps[probe], open_[probe]) < 4, (gaps, open_)
    assert last.get(("ibemu_faults_total", (("action", "link_down"),)), 0) == 1
    assert last[("ibemu_carrier_changes_total", ())] >= 2
    assert trees_seen
    assert not (tmp_path / "out" / "run" / "sysfs").exists()  # the tree went with the fabric
