"""Unmodified infiniband-diags and OpenSM manage ibemu's packet fabric (k=4 fat-tree).

Every MAD here leaves the tool through libumad2sim, enters the host's MAD socket, and crosses
the emulated switches as real frames on veth cables.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibemu.fabric.agents import make_agents
from ibemu.fabric.cable_capture import capture
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from ibemu.kernel import ownership
from ibemu.topo import generate
from ibemu.wire import read_pcap
from ibemu.wire.ib import LRH
from ibemu.wire.mad import SMP, Notice
from tests.integration.live import fabric_in_thread

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None, reason="libumad2sim.so missing (apt-get install ibsim-utils)"),
    pytest.mark.skipif(shutil.which("smpquery") is None, reason="smpquery missing (apt-get install infiniband-diags)"),
]


def _run(argv: list[str], cwd: Path, timeout: float = 30) -> str:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"{argv[-4:]} failed ({r.returncode}): {r.stderr[-500:]}"
    return r.stdout


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}:\.+(.*)$", text, re.M)
    assert m, f"no {name} in {text[:300]}"
    return m.group(1).strip()


class LiveFabric:
    """A k=4 fabric with agents and MAD sockets (run by ``fabric_in_thread``)."""

    def __init__(self, tmp: Path) -> None:
        self.topo = generate("fat-tree", k=4)
        self.state = ownership.RunState(ownership.new_run_id(), scenario="pytest-real-tools")
        self.rt = FabricRuntime(self.topo, make_agents=make_agents, state=self.state, run_dir=tmp)
        self.tmp = tmp

    def ns(self, node: str) -> str:
        return self.rt.plan.nodes[node].ns

    def tool(self, node: str, *argv: str, timeout: float = 30) -> str:
        return _run(tool_argv(self.ns(node), list(argv)), self.tmp, timeout)


@pytest.fixture
def live(state_dir: Path, tmp_path: Path) -> Iterator[LiveFabric]:
    fab = LiveFabric(tmp_path)
    with fabric_in_thread(fab.rt):
        yield fab


def test_smpquery_reads_the_local_ca_and_the_switches_along_a_path(live: LiveFabric) -> None:
    h0 = live.topo.node("h0")
    local = live.tool("h0", "smpquery", "-D", "nodeinfo", "0")
    assert _field(local, "NodeType") == "Channel Adapter"
    assert int(_field(local, "Guid"), 16) == h0.guid
    assert int(_field(local, "PortGuid"), 16) == h0.guid + 1
    edge = live.topo.peer("h0", 1)
    assert edge is not None
    one = live.tool("h0", "smpquery", "-D", "nodeinfo", "0,1")
    assert _field(one, "NodeType") == "Switch"
    assert int(_field(one, "Guid"), 16) == live.topo.node(edge.node).guid
    assert int(_field(one, "LocalPort")) == edge.port
    desc = live.tool("h0", "smpquery", "-D", "nodedesc", "0,1")
    assert live.topo.node(edge.node).desc in desc
    pi = live.tool("h0", "smpquery", "-D", "portinfo", "0,1", str(edge.port))
    assert _field(pi, "PhysLinkState") == "LinkUp" and _field(pi, "LinkState") == "Initialize"


def test_directed_route_walk_with_smpquery_reaches_every_node(live: LiveFabric) -> None:
    """BFS over directed routes, one unmodified smpquery per hop, until no new GUID appears."""
    seen: dict[int, str] = {}
    frontier = ["0"]
    while frontier:
        path = frontier.pop(0)
        out = live.tool("h0", "smpquery", "-D", "nodeinfo", path)
        guid = int(_field(out, "Guid"), 16)
        if guid in seen:
            continue
        seen[guid] = path
        if path == "0":
            frontier.append("0,1")  # out of our own CA's port 1
        elif _field(out, "NodeType") == "Switch":
            for port in range(1, int(_field(out, "NumPorts")) + 1):
                if port != int(_field(out, "LocalPort")):
                    frontier.append(f"{path},{port}")
    assert set(seen) == {n.guid for n in live.topo.nodes.values()}


@pytest.mark.skipif(shutil.which("opensm") is None, reason="opensm missing (apt-get install opensm)")
def test_opensm_brings_the_fabric_up_and_a_link_down_sends_trap_128(live: LiveFabric) -> None:
    d = live.tmp / "opensm"
    d.mkdir()
    log = d / "opensm.log"
    argv = tool_argv(live.ns("h0"), ["opensm", "-F", "/dev/null", "-f", str(log), "--dump_files_dir",
                                     str(d), "-d2", "-s", "0", "-R", "minhop"],
                     env={"OSM_TMP_DIR": str(d), "OSM_CACHE_DIR": str(d)})
    osm = subprocess.Popen(argv, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "SUBNET UP" not in (log.read_text() if log.exists() else ""):
            assert osm.poll() is None, f"opensm exited: {log.read_text()[-2000:] if log.exists() else ''}"
            assert time.monotonic() < deadline, "no SUBNET UP in 60 s"
            time.sleep(0.1)
        # Every port is Active now and LIDs are set: ibnetdiscover sees the whole fabric.
        disc = live.tool("h1", "ibnetdiscover")
        assert disc.count("\nSwitch") == 20 and disc.count("\nCa") == 16
        # Capture the SM's own cable, then unplug an aggregation-core link.
        pcap = live.tmp / "sm-link.pcap"
        h0 = live.rt.plan.nodes["h0"]
        link = next(lk for lk in live.topo.links if {lk.a.node[:3], lk.b.node[:3]} == {"agg", "cor"})
        agg = link.a if link.a.node.startswith("agg") else link.b
        agg_ns = live.ns(agg.node)

        async def cap_and_cut() -> None:
            async with trio.open_nursery() as n:
                await n.start(capture, h0.ns, h0.ports[1].ifname, pcap)
                await trio.to_thread.run_sync(live.rt.fabric.links.set_up, agg_ns,  # type: ignore[union-attr]
                                              live.topo.ifname(agg.node, agg.port), False)
                await trio.sleep(1.5)
                n.cancel_scope.cancel()

        trio.run(cap_and_cut)
        traps = []
        for rec in read_pcap(pcap):
            pkt = LRH(rec.data)
            if pkt.haslayer(SMP) and pkt[SMP].method == 0x05 and pkt.haslayer(Notice):
                traps.append(pkt)
        assert traps, "no trap on the SM's cable"
        issuers = {t[Notice].issuer_lid for t in traps}
        assert all(t[Notice].trap_number == 128 for t in traps) and len(issuers) >= 1
        if shutil.which("tshark"):
            out = subprocess.run(["tshark", "-n", "-r", str(pcap), "-Y", "infiniband.notice.trapnumberdeviceid == 128",
                                  "-T", "fields", "-e", "infiniband.trap.lidaddr"],
                                 capture_output=True, text=True, timeout=60).stdout.split()
            assert out and {int(x, 16) for x in out} == issuers
    finally:
        osm.terminate()
        try:
            osm.wait(10)
        except subprocess.TimeoutExpired:
            osm.kill()
            osm.wait(5)
