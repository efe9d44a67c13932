"""A live k=4 RoCE fat-tree: routers in namespaces, the fabric manager's ECMP routes, RocePorts.

One fabric for the module (built once, ~1 s); every test leaves it as it found it. RDMA WRITE
crosses five routers (TTL 64 -> 59 on arrival), tshark decodes a captured frame as RRoCE and
ibemu checks its ICRC, 16 QPs spread over the four core routers, a cut cable under traffic is
rerouted by the manager and the flow resumes, and malformed frames are counted, not raised,
with the host kernel answering none of them.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibemu.fabric.roce_fabric import RoceRun
from ibemu.hca.roce_port import ETH_P_ALL
from ibemu.kernel import netns, rtnl
from ibemu.kernel.packet import open_packet_socket
from ibemu.roce.queues import ip_checksum
from ibemu.traffic.perftest import PerfOptions, Side, bw_client
from ibemu.wire import PcapWriter, fast
from ibemu.wire.roce import verify_roce_icrc
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



@pytest.fixture(scope="module")
def roce(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoceRun]:
    yield from roce_up(tmp_path_factory.mktemp("roce-state"), "pytest-roce")



def write_bw(run: RoceRun, src: str, dst: str, opts: PerfOptions, *, during=None):  # type: ignore[no-untyped-def]
    """RDMA WRITE from ``src`` to ``dst``; ``during(t_start)`` runs in a thread alongside."""
    a, b = run.open_port(src), run.open_port(dst)
    arrivals: list[int] = []
    b.on_frame.append(arrivals.append)

    async def main():  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as n:
            await n.start(a.serve)
            await n.start(b.serve)
            sa, sb = Side.create(a, opts), Side.create(b, opts)
            sa.connect(sb.info())
            sb.connect(sa.info())
            if during is not None:
                n.start_soon(trio.to_thread.run_sync, during)
            with trio.fail_after(60):
                result = await bw_client(sa)
            n.cancel_scope.cancel()
            return result, sa, sb

    try:
        result, sa, sb = trio.run(main)
    finally:
        a.close()
        b.close()
    return result, sa, sb, a, b, arrivals


def test_write_crosses_five_routers_and_tshark_reads_rrocev2(roce: RoceRun, tmp_path: Path) -> None:
    hp = roce.fab.host_port("h15")
    tap = open_packet_socket(hp.ns, hp.ifname, ETH_P_ALL)  # a second reader on h15's cable
    opts = PerfOptions(test="write_bw", size=65536, iterations=200, qps=1)
    result, sa, sb, a, b, _ = write_bw(roce, "h0", "h15", opts)
    assert result.iterations == 200 and result.retransmitted == 0
    assert sb.mrs[0].buf == sa.mrs[0].buf  # every WRITE landed
    for port in (a, b):
        assert port.roce_stats.rx_bad_icrc == port.roce_stats.rx_malformed == 0
        assert port.hca.stats.crc_errors == port.hca.stats.malformed == 0
    frames = drain_tap(tap)
    data = [f for f in frames if len(f) > 1000 and f[12:14] == b"\x08\x00" and f[30:34] == socket.inet_aton(hp.ip)]
    assert len(data) >= 100
    assert {f[22] for f in data} == {64 - 5}  # TTL: five routers on the way (edge, agg, core, agg, edge)
    for f in data[:20]:
        verify_roce_icrc(f)
    if shutil.which("tshark") is None:
        pytest.skip("tshark not installed")
    pcap = tmp_path / "roce.pcap"
    with PcapWriter(pcap, "eth") as w:
        w.write(data[0])
    out = subprocess.run(["tshark", "-n", "-r", str(pcap), "-T", "fields", "-E", "separator=|", "-e", "udp.dstport",
                          "-e", "infiniband.bth.opcode", "-e", "infiniband.invariant.crc", "-e", "_ws.col.Protocol"],
                         check=True, capture_output=True, text=True, timeout=60).stdout.split("|")
    assert out[0] == "4791" and out[3].strip() == "RRoCE"
    assert int(out[2], 16) == int.from_bytes(data[0][-4:], "big")


def test_ecmp_spreads_qps_over_the_core(roce: RoceRun) -> None:
    before = core_tx(roce)
    opts = PerfOptions(test="write_bw", size=4096, iterations=1600, qps=16, tx_depth=64)
    result, *_ = write_bw(roce, "h0", "h15", opts)
    delta = {c: core_tx(roce)[c] - before[c] for c in CORES}
    assert result.iterations == 1600
    assert sum(delta.values()) >= 1600
    busy = [c for c, n in delta.items() if n >= 50]
    assert len(busy) >= 3, delta  # 16 QPs, 16 UDP source ports, hashed over 4 equal-cost paths


def test_reroute_after_a_core_link_failure(roce: RoceRun) -> None:
    # Find the core the flow's one QP hashes to, then cut that core's cable into pod 3.
    ns, ifname = core_cable_of(roce, lambda: write_bw(
        roce, "h0", "h15", PerfOptions(test="write_bw", size=4096, iterations=200, qps=1, timeout=12)))
    t_fault: list[int] = []
    try:
        opts = PerfOptions(test="write_bw", size=4096, duration_s=1.5, qps=1, timeout=12, tx_depth=32)
        result, _sa, _sb, _a, b, arrivals = write_bw(roce, "h0", "h15", opts, during=cut_later(ns, ifname, t_fault))
        assert t_fault and result.iterations > 0
        after = [t for t in arrivals if t > t_fault[0]]
        assert len(after) > 100, "the flow did not resume"
        check_reroute(roce, t_fault[0], arrivals)
        assert b.roce_stats.rx_bad_icrc == 0
    finally:
        rtnl.set_up(ns, [ifname], True)
    wait_link_up_reroute(roce)


def _icmp_out(ns: str) -> int:
    """ICMP messages the namespace's kernel sent (/proc/net/snmp, Icmp OutMsgs)."""
    with netns.entered(ns):
        lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith("Icmp:")]
    return int(lines[1][lines[0].index("OutMsgs")])


def test_malformed_frames_are_counted_and_never_answered(roce: RoceRun) -> None:
    h15 = roce.fab.host_port("h15")
    leaf = roce.fab.addrs.gateway("h15")
    sender = roce.open_port("h0")  # a frame as h0 sends it to h15
    pkt = fast.NativeTemplate(slid=sender.hca.lid, dlid=h15.lid, destqp=0x999).packet(0x04, 1, b"x" * 64)
    frame = sender.codec.encapsulate(pkt)
    sender.close()
    assert frame is not None
    icmp_before = _icmp_out(h15.ns)
    # Sent from the leaf router's interface straight onto h15's cable, to h15's MAC.
    rx = roce.open_port("h15")
    dst_mac = roce.fab.plan.nodes["h15"].ports[1].mac
    wire = open_packet_socket(roce.fab.plan.nodes[leaf.node].ns, leaf.ifname, ETH_P_ALL)
    bad_icrc = bytearray(frame)
    bad_icrc[-1] ^= 0xFF
    unknown_src = bytearray(frame)
    unknown_src[26:30] = socket.inet_aton("198.19.255.1")
    ip_checksum(unknown_src)  # a well-formed frame from an address nobody has
    truncated = bytes(frame[:50])
    frames = [bytes(bad_icrc), bytes(unknown_src), truncated, bytes(frame)]
    try:
        for f in frames:
            wire.send(dst_mac + bytes(f[6:]))

        async def drain() -> None:
            with trio.move_on_after(0.5):
                await rx.serve()

        trio.run(drain)
        st = rx.roce_stats
        assert st.rx_bad_icrc == 1 and st.rx_unknown_source == 1 and st.rx_malformed == 1
        assert rx.hca.stats.unknown_qp == 1  # the good frame reached the transport (no QP 0x999)
        assert _icmp_out(h15.ns) == icmp_before  # the host kernel answered nothing
    finally:
        wire.close()
        rx.close()
