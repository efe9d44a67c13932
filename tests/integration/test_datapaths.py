"""Both forwarding planes carry data on the LFTs the real OpenSM programmed (k=4 fat-tree).

Kernel: tc u32 + mirred; user: the switches' sans-IO forwarders in the agent process, with
injected loss and corruption counted like real port errors. perfquery reads the counters.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibemu.fabric import opensm
from ibemu.fabric.agenthost import AgentHost
from ibemu.fabric.agents import make_agents
from ibemu.fabric.probe import send_and_count
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from ibemu.hca.transport import Hca
from ibemu.kernel import ownership, sockfilter
from ibemu.kernel.packet import open_packet_socket
from ibemu.topo import generate
from ibemu.wire import fast
from tests.integration.live import fabric_in_thread

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None, reason="libumad2sim.so missing (apt-get install ibsim-utils)"),
    pytest.mark.skipif(not opensm.opensm_available(), reason="opensm missing (apt-get install opensm)"),
]


class Managed:
    """A fabric brought up by OpenSM, its trio loop in a thread; helpers to send and count."""

    def __init__(self, datapath: str, tmp: Path) -> None:
        self.topo = generate("fat-tree", k=4)
        self.state = ownership.RunState(ownership.new_run_id(), scenario=f"pytest-{datapath}")
        self.rt = FabricRuntime(self.topo, make_agents=make_agents, datapath=datapath, state=self.state,
                                run_dir=tmp)
        self.tmp = tmp
        self.host: AgentHost | None = None
        self.token: trio.lowlevel.TrioToken | None = None

    def on_loop(self, fn, *args):  # type: ignore[no-untyped-def]
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def lid(self, host: str) -> int:
        return int(self.on_loop(lambda: self.host.nodes[host].agent.lid(1)))  # type: ignore[union-attr]

    def blast(self, src: str, dst: str, n: int, size: int = 200) -> int:
        """Send ``n`` frames from ``src`` to ``dst`` on raw sockets; how many arrive."""
        return send_and_count(self.rt.plan, src, dst, self.lid(src), self.lid(dst), n, size=size)


@pytest.fixture(params=["kernel", "user"])
def managed(request: pytest.FixtureRequest, state_dir: Path, tmp_path: Path) -> Iterator[Managed]:
    yield from managed_fabric(request.param, tmp_path)


def managed_fabric(datapath: str, tmp_path: Path, opensm_args: list[str] | None = None) -> Iterator[Managed]:
    """A k=4 fabric running in a thread, brought up by the real OpenSM on h0."""
    m = Managed(datapath, tmp_path)
    with fabric_in_thread(m.rt) as live:
        m.host, m.token = live.host, live.token
        osm = opensm.start(m.rt.plan.nodes["h0"].ns, tmp_path / "opensm", extra=opensm_args)
        try:
            opensm.wait_subnet_up(osm, tmp_path / "opensm")
            yield m
        finally:
            opensm.stop(osm)


def test_data_crosses_five_switches_on_opensm_lfts(managed: Managed) -> None:
    assert managed.blast("h1", "h15", 1000) == 1000  # inter-pod: edge, agg, core, agg, edge
    assert managed.blast("h2", "h3", 500) == 500  # same edge switch


@pytest.mark.skipif(shutil.which("perfquery") is None, reason="perfquery missing (infiniband-diags)")
def test_perfquery_counters_move_with_the_traffic(managed: Managed) -> None:
    """Switch and CA PortCounters count the data frames too, on both datapaths (the kernel
    datapath's ports read them from their interfaces, as tc forwards without the agent)."""
    edge = managed.topo.peer("h1", 1)
    assert edge is not None
    edge_lid = int(managed.on_loop(lambda: managed.host.nodes[edge.node].agent.ports[0].lid))  # type: ignore[union-attr]
    ns = managed.rt.plan.nodes["h0"].ns

    def counter(lid: int, port: int, name: str) -> int:
        out = subprocess.run(tool_argv(ns, ["perfquery", str(lid), str(port)]), cwd=managed.tmp,
                             capture_output=True, text=True, timeout=30, check=True).stdout
        m = re.search(rf"^{name}:\.+(\d+)", out, re.M)
        assert m, out
        return int(m.group(1))

    before = (counter(edge_lid, edge.port, "PortRcvPkts"), counter(managed.lid("h1"), 1, "PortXmitPkts"),
              counter(managed.lid("h15"), 1, "PortRcvPkts"), counter(managed.lid("h15"), 1, "PortRcvData"))
    assert managed.blast("h1", "h15", 300, size=400) == 300
    after = (counter(edge_lid, edge.port, "PortRcvPkts"), counter(managed.lid("h1"), 1, "PortXmitPkts"),
             counter(managed.lid("h15"), 1, "PortRcvPkts"), counter(managed.lid("h15"), 1, "PortRcvData"))
    assert after[0] - before[0] >= 300  # every frame the edge switch took in from h1
    assert after[1] - before[1] >= 300 and after[2] - before[2] >= 300  # the two CAs' ports
    assert after[3] - before[3] >= 300 * 400 // 4  # octets / 4
    # A clear (perfquery -R) restarts the kernel-backed counters from zero.
    subprocess.run(tool_argv(ns, ["perfquery", "-R", str(managed.lid("h15")), "1"]), cwd=managed.tmp,
                   capture_output=True, timeout=30, check=True)
    assert counter(managed.lid("h15"), 1, "PortRcvPkts") < 300


def test_injected_loss_and_corruption_on_the_user_datapath(managed: Managed) -> None:
    if managed.rt.datapath != "user":
        with pytest.raises(ValueError, match="user datapath"):
            managed.on_loop(lambda: managed.host.impair("edge0_0", 1, loss_pct=50))  # type: ignore[union-attr]
        return
    edge = managed.topo.peer("h2", 1)  # h2's edge switch, and the port towards h2
    assert edge is not None
    host = managed.host
    assert host is not None
    managed.on_loop(lambda: host.impair(edge.node, edge.port, loss_pct=50))
    got = managed.blast("h3", "h2", 1000)
    assert 350 <= got <= 650, got  # binomial(1000, 0.5): far outside 6 sigma otherwise
    managed.on_loop(lambda: host.impair(edge.node, edge.port, corrupt_pct=100))
    # Data frames belong to h2's transport (the CA's agent only hears QP0/QP1): it checks them.
    h2 = managed.rt.plan.nodes["h2"]
    transport_side = open_packet_socket(h2.ns, h2.ports[1].ifname, bpf=sockfilter.DATA_ONLY)
    try:
        assert managed.blast("h3", "h2", 200) == 200  # corrupted frames still arrive on the wire ...
        hca = Hca(lid=managed.lid("h2"))
        with contextlib.suppress(BlockingIOError):
            while True:
                hca.receive(memoryview(transport_side.recv(9216))[14:])
    finally:
        transport_side.close()
    st = hca.stats  # ... each counted: a bad CRC, or a bad length when the flip hit PktLen/LNH
    assert st.rx_packets == 200 and st.crc_errors + st.malformed == 200 and st.crc_errors > 150
    managed.on_loop(lambda: host.impair(edge.node, edge.port))
    assert managed.blast("h3", "h2", 300) == 300


def test_malformed_frames_never_crash_a_live_agent(managed: Managed) -> None:
    """Garbage on h1's cable reaches the edge switch's agent; it counts it and keeps working."""
    import random

    from scapy.packet import raw as scapy_raw

    from ibemu.wire.ib import BTH, DETH, LRH
    from ibemu.wire.mad import SMP, DirectedRouteSMP, NodeInfo

    edge = managed.topo.peer("h1", 1)
    assert edge is not None and managed.host is not None
    host = managed.host
    rng = random.Random(7)
    good_dr = scapy_raw(LRH(vl=15, dlid=0xFFFF, slid=0xFFFF) / BTH(opcode=0x64) / DETH()
                        / DirectedRouteSMP(hop_count=1, hop_pointer=1, initial_path=[1], data=NodeInfo()))
    bad_crc = bytearray(good_dr)
    bad_crc[100] ^= 0xFF
    frames: list[bytes] = [bytes(bad_crc)] * 50
    frames += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(200)]
    frames += [scapy_raw(LRH(vl=15, dlid=0xFFFF, slid=0xFFFF) / BTH(opcode=0x64) / DETH()
                         / DirectedRouteSMP(hop_count=hc, hop_pointer=hp, initial_path=[1] * min(hc, 63),
                                            data=NodeInfo())) for hc, hp in ((64, 1), (2, 9), (1, 0))]
    frames += [scapy_raw(LRH(vl=15, dlid=0xFFFF, slid=0xFFFF) / BTH(opcode=0x64) / DETH()
                         / SMP(attribute_id=0x7777, method=1))] * 10
    vl15 = [f for f in frames if len(f) > 0]
    before = int(managed.on_loop(lambda: host.nodes[edge.node].agent.counters(edge.port).port_rcv_errors))
    sp = managed.rt.plan.nodes["h1"]
    sock = open_packet_socket(sp.ns, sp.ports[1].ifname)
    try:
        eth = fast.ethernet_header(sp.ports[1].peer_mac, sp.ports[1].mac)
        for f in vl15:
            sock.send(eth + (f if f[0] >> 4 == 15 else bytes([0xF0 | (f[0] & 0x0F)]) + f[1:]))  # all reach the SMA
    finally:
        sock.close()
    time.sleep(0.5)
    after = int(managed.on_loop(lambda: host.nodes[edge.node].agent.counters(edge.port).port_rcv_errors))
    assert after - before >= 50 + 200 - 5  # the bad CRCs and (nearly all) random frames counted
    # Still alive and correct: management and data both work.
    out = subprocess.run(tool_argv(managed.rt.plan.nodes["h1"].ns, ["smpquery", "-D", "nodeinfo", "0,1"]),
                         cwd=managed.tmp, capture_output=True, text=True, timeout=30, check=True).stdout
    assert "Switch" in out
    assert managed.blast("h1", "h15", 200) == 200


def test_injected_delay_on_the_user_datapath(managed: Managed) -> None:
    if managed.rt.datapath != "user":
        pytest.skip("delay injection is a user-datapath feature (no netem here)")
    edge = managed.topo.peer("h2", 1)
    assert edge is not None and managed.host is not None
    host = managed.host

    def one_way_ms() -> float:
        sp, dp = managed.rt.plan.nodes["h3"], managed.rt.plan.nodes["h2"]
        out = open_packet_socket(sp.ns, sp.ports[1].ifname)
        inp = open_packet_socket(dp.ns, dp.ports[1].ifname)
        try:
            tmpl = fast.NativeTemplate(slid=managed.lid("h3"), dlid=managed.lid("h2"), destqp=0x42,
                                       eth=fast.ethernet_header(sp.ports[1].peer_mac, sp.ports[1].mac))
            t0 = time.monotonic()
            out.send(tmpl.packet(0x04, 1, b"x" * 64))
            while time.monotonic() - t0 < 2:
                try:
                    inp.recv(9000)
                    return (time.monotonic() - t0) * 1000
                except BlockingIOError:
                    time.sleep(0.0005)
            raise AssertionError("frame never arrived")
        finally:
            out.close()
            inp.close()

    assert one_way_ms() < 20
    managed.on_loop(lambda: host.impair(edge.node, edge.port, delay_us=40_000))
    assert one_way_ms() >= 38
    managed.on_loop(lambda: host.impair(edge.node, edge.port, delay_us=0))
    assert one_way_ms() < 20
