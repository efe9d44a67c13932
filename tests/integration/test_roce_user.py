"""A live k=4 RoCE fat-tree on the user datapath (``ibemu.roce.userpath``).

One fabric at 0.2 Gb/s with PFC for most tests (the routers timed by the link model, as IB's
user datapath: every cable, the hosts' included, at that rate; the datapath at dilation 1 is
no faster than these cables through five routers, so the RC transports' ACK timeout is 1 s
where a flow crosses the core, go-back-N storms are not what these tests are about), one with 1 ms cables for the delay: RDMA
WRITE crosses five user-space routers (TTL 64 -> 59) while the routers' kernels forward
nothing; 16 QPs spread over the four cores; a cut cable is rerouted; an incast makes the
routers send PFC pause frames (seen on a cable, decoded by tshark as PFC) that pause queues,
and a host paused by its router holds its frames; the 1 ms cables add their time to a round
trip.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ibemu.fabric.roce_fabric import RoceRun
from ibemu.hca.roce_port import ETH_P_ALL, RocePort
from ibemu.kernel import netns, rtnl
from ibemu.kernel.packet import open_packet_socket
from ibemu.roce.queues import QueueConfig
from ibemu.traffic.perftest import (
    BwResult,
    LatResult,
    PerfOptions,
    Side,
    bw_client,
    bw_server,
    run_local,
)
from ibemu.wire import PcapWriter, pfc
from tests.integration.live import drain_tap
from tests.integration.roce_live import (
    CORES,
    check_reroute,
    core_cable_of,
    core_tx,
    cut_later,
    roce_up,
    wait_link_up_reroute,
)

pytestmark = pytest.mark.root

LINE_GBPS = 0.2
DELAY_US = 1000.0


def _up(tmp: Path, queues: QueueConfig) -> Iterator[RoceRun]:
    run = yield from roce_up(tmp, "pytest-roce-user", queues)
    assert run.counters.get("schema") == "ibemu.roce-userpath/1"  # written as it stopped


@pytest.fixture(scope="module")
def roce(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoceRun]:
    yield from _up(tmp_path_factory.mktemp("roce-user"),
                   QueueConfig(line_gbps=LINE_GBPS, buffer_kb=512, pfc=frozenset({3}), xoff_kb=64, xon_kb=32,
                               ecn_mark_kb=32))


def counters(run: RoceRun) -> dict[str, Any]:
    """The user datapath's counters, fresh (it writes them every second)."""
    t = time.monotonic_ns()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        c = run.live_counters()
        if c.get("t_ns", 0) > t:
            return c
        time.sleep(0.1)
    raise AssertionError("the user datapath wrote no counters")


def write_bw(run: RoceRun, pairs: list[tuple[str, str]], opts: PerfOptions,
             *, during: Callable[[], None] | None = None) -> tuple[list[BwResult], dict[str, RocePort], list[int]]:
    """RDMA WRITE over each (src, dst) at once; arrival times at the first pair's destination."""
    ports = {h: run.open_port(h, dcqcn=True) for h in dict.fromkeys(h for p in pairs for h in p)}
    arrivals: list[int] = []
    ports[pairs[0][1]].on_frame.append(arrivals.append)

    async def main() -> list[BwResult]:
        results: list[BwResult] = []
        async with trio.open_nursery() as n:
            for p in ports.values():
                await n.start(p.serve)
            done = trio.Event()
            sides = []
            for src, dst in pairs:
                a, b = Side.create(ports[src], opts), Side.create(ports[dst], opts)
                a.connect(b.info())
                b.connect(a.info())
                sides.append(a)
                n.start_soon(bw_server, b, done)
            if during is not None:
                n.start_soon(trio.to_thread.run_sync, during)

            async def drive(side: Side) -> None:
                results.append(await bw_client(side))
            with trio.fail_after(60):
                async with trio.open_nursery() as clients:
                    for s in sides:
                        clients.start_soon(drive, s)
            done.set()
            n.cancel_scope.cancel()
        return results

    try:
        return trio.run(main), ports, arrivals
    finally:
        for p in ports.values():
            p.close()


def _snmp(ns: str, proto: str) -> dict[str, int]:
    """A namespace's /proc/net/snmp line for ``proto`` (Ip, Icmp)."""
    with netns.entered(ns):
        rows = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith(f"{proto}:")]
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:], strict=True)}


def test_write_crosses_five_user_routers_and_their_kernels_forward_nothing(roce: RoceRun) -> None:
    hp = roce.fab.host_port("h15")
    icmp_before = _snmp(hp.ns, "Icmp")["OutMsgs"]
    tap = open_packet_socket(hp.ns, hp.ifname, ETH_P_ALL)
    opts = PerfOptions(test="write_bw", size=65536, iterations=40, qps=1, timeout=18)
    (result,), ports, _ = write_bw(roce, [("h0", "h15")], opts)
    assert result.iterations == 40
    assert ports["h15"].roce_stats.rx_bad_icrc == ports["h15"].roce_stats.rx_malformed == 0
    frames = drain_tap(tap)
    data = [f for f in frames if len(f) > 1000 and f[12:14] == b"\x08\x00" and f[30:34] == socket.inet_aton(hp.ip)]
    assert len(data) >= 40 * 16
    assert {f[22] for f in data} == {64 - 5}  # five routers decremented the TTL
    assert {f[15] >> 2 for f in data} == {26}  # RoCE data at DSCP 26 (priority 3), ECN-capable
    assert {f[15] & 3 for f in data} <= {2, 3}
    # frames a router sends from a packet socket reach h15 with only their Ethernet header in
    # the skb's linear part: the host's guard must pull the rest in, or h15's kernel answers
    assert _snmp(hp.ns, "Icmp")["OutMsgs"] == icmp_before
    for name in ("edge0_0", "core0", "edge3_1"):
        ns = roce.fab.plan.nodes[name].ns
        with netns.entered(ns):
            assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"
        assert _snmp(ns, "Ip")["ForwDatagrams"] == 0, name  # the kernel forwarded nothing
        assert _snmp(ns, "Icmp")["OutMsgs"] == 0, name  # and answered nothing
    c = counters(roce)
    assert c["totals"]["forwarded"] >= 5 * 40 * 16


def test_ecmp_spreads_qps_over_the_cores(roce: RoceRun) -> None:
    before = core_tx(roce)
    opts = PerfOptions(test="write_bw", size=4096, iterations=800, qps=16, tx_depth=64, timeout=18)
    (result,), _, _ = write_bw(roce, [("h0", "h15")], opts)
    delta = {c: core_tx(roce)[c] - before[c] for c in CORES}
    assert result.iterations == 800 and sum(delta.values()) >= 800
    busy = [c for c, n in delta.items() if n >= 25]
    assert len(busy) >= 3, delta  # 16 QPs, 16 UDP source ports, hashed over 4 equal-cost paths


def quiet(run: RoceRun) -> None:
    """Until the routers forward nothing between two of the user datapath's counter writes.
    A test's new flow reuses QP numbers: frames, pauses and CNPs of the flows before it still
    on their way (16 QPs x 64 WRs at 0.2 Gb/s) sent its first QP into retry exhaustion in about
    one run of three."""
    last = None
    for _ in range(10):
        forwarded = counters(run)["totals"].get("forwarded")
        if forwarded == last:
            return
        last = forwarded
    raise AssertionError("the user datapath never went quiet")


def test_reroute_after_a_core_link_failure(roce: RoceRun) -> None:
    quiet(roce)
    ns, ifname = core_cable_of(roce, lambda: write_bw(
        roce, [("h0", "h15")], PerfOptions(test="write_bw", size=4096, iterations=100, qps=1, timeout=18, tx_depth=32)))
    t_fault: list[int] = []
    try:
        opts = PerfOptions(test="write_bw", size=4096, duration_s=1.5, qps=1, timeout=14, tx_depth=32)
        (result,), _, arrivals = write_bw(roce, [("h0", "h15")], opts, during=cut_later(ns, ifname, t_fault))
        assert t_fault and result.iterations > 0
        assert len([t for t in arrivals if t > t_fault[0]]) > 50, "the flow did not resume"
        check_reroute(roce, t_fault[0], arrivals)
    finally:
        rtnl.set_up(ns, [ifname], True)
    wait_link_up_reroute(roce)


def test_an_incast_sends_pfc_pauses_that_stop_queues(roce: RoceRun, tmp_path: Path) -> None:
    edge = roce.fab.plan.nodes["edge0_0"]
    # what edge0_0 sends up each of its uplinks (the flows' ECMP hashes choose which ones they
    # arrive by, and a pause goes up the uplinks that feed the congested queue)
    uplinks = [pp for pp in edge.ports.values() if pp.peer_node.startswith("agg")]
    taps = [open_packet_socket(roce.fab.plan.nodes[pp.peer_node].ns,
                               roce.fab.plan.nodes[pp.peer_node].ports[pp.peer_port].ifname, pfc.ETH_P_PAUSE)
            for pp in uplinks]
    before = counters(roce)["totals"]
    opts = PerfOptions(test="write_bw", size=65536, iterations=30, qps=2, timeout=18)
    results, ports, _ = write_bw(roce, [("h4", "h0"), ("h8", "h0"), ("h12", "h0")], opts)
    assert [r.iterations for r in results] == [30, 30, 30]  # lossless: every WRITE landed
    h0 = ports["h0"].roce_stats  # ECN: marked above 32 KiB queued, answered with CNPs
    assert h0.ce_received > 0 and h0.cnp_sent > 0
    assert sum(ports[h].roce_stats.cnp_received for h in ("h4", "h8", "h12")) > 0
    pauses = [f for tap in taps for f in drain_tap(tap, 256)]
    assert pauses, "no PFC frame on edge0_0's uplinks"
    quanta = [pfc.parse_pause(f) for f in pauses]
    assert all(q is not None and set(q) == {3} for q in quanta)
    assert any(q and q[3] == pfc.MAX_QUANTA for q in quanta) and any(q and q[3] == 0 for q in quanta)  # XOFF, XON
    assert {f[:6] for f in pauses} == {pfc.PFC_DST} and {f[6:12] for f in pauses} <= {pp.mac for pp in uplinks}
    after = counters(roce)
    t = {k: after["totals"].get(k, 0) - before.get(k, 0) for k in ("pause_sent", "pause_received", "paused_us",
                                                                  "dropped", "ecn_marked")}
    assert t["pause_sent"] > 0 and t["pause_received"] > 0 and t["paused_us"] > 0, t
    assert t["dropped"] == 0  # PFC: backpressure, not drops
    assert t["ecn_marked"] > 0
    edge_ports = after["routers"]["edge0_0"]["ports"]
    assert sum(edge_ports.get(pp.ifname, {}).get("3", {}).get("pause_sent", 0) for pp in uplinks) > 0
    cnp_class = [q for r in after["routers"].values() for p in r["ports"].values() for prio, q in p.items()
                 if prio == "6"]
    assert cnp_class and sum(q.get("tx_frames", 0) for q in cnp_class) > 0  # CNPs at DSCP 48: priority 6
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed")
    pcap = tmp_path / "pfc.pcap"
    with PcapWriter(pcap, "eth") as w:
        w.write(pauses[0])
    out = subprocess.run(["tshark", "-n", "-r", str(pcap), "-T", "fields", "-E", "separator=|", "-e", "eth.type",
                          "-e", "macc.opcode", "-e", "_ws.col.Info"],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("0x8808|0x0101|"), out
    assert "Class Based Flow Control" in out or "PFC" in out or "Pause" in out, out


def test_malformed_frames_are_counted_and_forwarding_goes_on(roce: RoceRun) -> None:
    edge = roce.fab.plan.nodes["edge0_0"]
    to_edge = roce.fab.plan.nodes["h0"].ports[1]
    wire = open_packet_socket(roce.fab.plan.nodes["h0"].ns, to_edge.ifname, ETH_P_ALL)  # as h0, to its router
    before = counters(roce)["totals"]
    eth = to_edge.peer_mac + to_edge.mac
    bad_ip = bytearray(eth + b"\x08\x00" + bytes(50))
    bad_ip[14] = 0x4F  # IHL 60 bytes, beyond the frame
    frames = [eth + b"\x08\x00\x45",  # a runt
              bytes(bad_ip),
              eth + b"\x88\x08\x00\x01" + bytes(50),  # MAC control, not PFC
              eth + b"\x86\xdd" + bytes(60)]  # IPv6: not ours
    try:
        for f in frames * 10:
            wire.send(f)
    finally:
        wire.close()
    after = counters(roce)["totals"]
    assert after.get("malformed", 0) - before.get("malformed", 0) >= 20
    assert roce.userpath is not None and roce.userpath.poll() is None  # still running
    (result,), _, _ = write_bw(roce, [("h0", "h1")], PerfOptions(test="write_bw", size=4096, iterations=20, timeout=18))
    assert result.iterations == 20 and edge.name == "edge0_0"


def test_a_paused_host_holds_its_frames(roce: RoceRun) -> None:
    edge = roce.fab.plan.nodes["edge0_1"]
    to_h2 = next(pp for pp in edge.ports.values() if pp.peer_node == "h2")
    wire = open_packet_socket(edge.ns, to_h2.ifname, ETH_P_ALL)  # as edge0_1 would, onto h2's cable
    ports = {h: roce.open_port(h, dcqcn=True) for h in ("h2", "h3")}
    arrivals: list[int] = []
    ports["h3"].on_frame.append(arrivals.append)
    opts = PerfOptions(test="write_bw", size=4096, iterations=20, qps=1)
    seen: dict[str, int] = {}

    async def main() -> None:
        async with trio.open_nursery() as n:
            for p in ports.values():
                await n.start(p.serve)
            a, b = Side.create(ports["h2"], opts), Side.create(ports["h3"], opts)
            a.connect(b.info())
            b.connect(a.info())
            done = trio.Event()
            n.start_soon(bw_server, b, done)
            wire.send(pfc.pause_frame(to_h2.mac, {3: pfc.MAX_QUANTA}))  # 167 ms at 0.2 Gb/s
            await trio.sleep(0.01)
            client = trio.Event()

            async def run_client() -> None:
                with trio.fail_after(30):
                    await bw_client(a)
                client.set()
            n.start_soon(run_client)
            await trio.sleep(0.05)
            seen["held"] = ports["h2"].roce_stats.pfc_held
            seen["arrived"] = len(arrivals)
            seen["t_xon"] = time.monotonic_ns()
            wire.send(pfc.pause_frame(to_h2.mac, {3: 0}))  # XON: go
            await client.wait()
            done.set()
            n.cancel_scope.cancel()

    try:
        trio.run(main)
        st = ports["h2"].roce_stats
        assert seen["held"] > 0 and seen["arrived"] == 0, seen  # held back, not sent, not dropped
        assert arrivals and arrivals[0] >= seen["t_xon"]  # released by the XON
        assert st.pfc_pause_received >= 2 and st.pfc_paused_us >= 40_000
    finally:
        wire.close()
        for p in ports.values():
            p.close()


def _lat_us(run: RoceRun) -> float:
    a, b = run.open_port("h0", dcqcn=True), run.open_port("h1", dcqcn=True)

    async def main() -> LatResult:
        async with trio.open_nursery() as n:
            await n.start(a.serve)
            await n.start(b.serve)
            with trio.fail_after(30):
                r = await run_local(a, b, PerfOptions(test="write_lat", size=64, iterations=20))
            n.cancel_scope.cancel()
        assert isinstance(r, LatResult)
        return r

    try:
        r = trio.run(main)
    finally:
        a.close()
        b.close()
    s = sorted(r.samples_ns)
    return s[len(s) // 2] / 1000


def test_cable_delay_adds_its_time(roce: RoceRun, tmp_path: Path) -> None:
    base = _lat_us(roce)
    delayed_run = _up(tmp_path / "state", QueueConfig(delay_us=DELAY_US))
    delayed = next(delayed_run)
    try:
        lat = _lat_us(delayed)
    finally:
        with pytest.raises(StopIteration):
            next(delayed_run)
    # h0 -> edge0_0 -> h1 is two cables each way, each held DELAY_US: no half round trip can be
    # shorter than 2 x DELAY_US, and the delay is what it adds (within the wake-ups' noise)
    assert lat >= 2 * DELAY_US, (base, lat)
    assert lat - base < 2 * DELAY_US + 5_000, (base, lat)


@pytest.mark.parametrize(("fabric", "expected"), [
    ("{kind: roce, datapath: kernel, pfc: true}", "bad.yaml:4 fabric.pfc: needs fabric.datapath: user"),
    ("{kind: ib, datapath: user, pfc: true}", "bad.yaml:4 fabric.pfc: cable impairments and ECN apply to a RoCE"),
    ("{kind: roce, datapath: user, line_gbps: -0.5}", "bad.yaml:4 fabric.line_gbps: expected a number > 0"),
])
def test_bad_inputs_exit_2_located(fabric: str, expected: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from ibemu.cli.main import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(f"topology: {{generator: fat-tree, k: 4}}\n\n\nfabric: {fabric}\n")
    assert main(["run", str(bad)]) == 2
    assert expected in capsys.readouterr().err
