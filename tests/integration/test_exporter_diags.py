"""The public IB Prometheus exporters' diag command lines, golden-tested on a live fabric.

treydock/infiniband_exporter runs ``ibnetdiscover --ports`` and, per node it lists,
``perfquery -l -x -G <guid> <port,port,...>`` (it multiplies the *Data counters by 4: they
are 4-octet words); guilbaults/infiniband-exporter runs ``ibqueryerrors --verbose --details
--suppress-common --data --report-port --switch --ca``. Each runs here unmodified on a k=4
fat-tree brought up by the real OpenSM, on both datapaths (one fabric each, reused by every
test), through a host's MAD socket; the output is parsed the way those exporters read it
(their formats, this test's own parsers). Traffic of known size between two hosts must move
PortXmitData/PortRcvData by its octets / 4 on the CA ports and on every switch it crosses;
a cable taken down and up must show in ibqueryerrors as LinkDownedCounter on both its ends.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ibemu.agents.port import PortState
from ibemu.fabric import opensm
from ibemu.fabric.agents import make_agents
from ibemu.fabric.probe import send_and_count
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from ibemu.kernel import ownership
from ibemu.topo import generate
from tests.integration.live import Running, fabric_in_thread

TOOLS = ("ibnetdiscover", "perfquery", "ibqueryerrors")
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None or not opensm.opensm_available()
                       or any(shutil.which(t) is None for t in TOOLS),
                       reason="needs opensm, ibsim-utils and infiniband-diags (scripts/setup.sh installs them)"),
]

IBQUERYERRORS = ("ibqueryerrors", "--verbose", "--details", "--suppress-common", "--data", "--report-port",
                 "--switch", "--ca")
SEND_OVERHEAD = 8 + 12 + 4 + 2  # LRH, BTH, ICRC, VCRC of a SEND Only without GRH: counted octets
MAD_OCTETS = 290  # a MAD frame (the tools' own PMA queries cross the same ports)
DATA = re.compile(r"Port(Unicast|Multicast)?(Xmit|Rcv)(Data|Pkts)$")
RATES = {"SDR": 2.5, "DDR": 5, "QDR": 10, "FDR10": 10, "FDR": 14, "EDR": 25, "HDR": 50, "NDR": 100}


# ---------------------------------------------------------------------- the exporters' formats

@dataclass
class Device:
    kind: str  # SW | CA
    lid: int
    guid: str
    rate_gbps: float
    name: str
    uplinks: dict[int, tuple[str, int, int, str, str]] = field(default_factory=dict)
    """local port -> (type, LID, port, GUID, name) of the far end."""


def parse_ibnetdiscover_ports(out: str) -> dict[str, Device]:
    """``ibnetdiscover --ports``: one line per cabled port, the way the exporter splits it
    (fields by whitespace: type, LID, port, GUID, width, rate, '-', far type, LID, port, GUID,
    then ``( 'name' - 'far name' )``)."""
    devices: dict[str, Device] = {}
    for line in out.splitlines():
        items = line.split()
        if len(items) < 11 or items[5] == "???":
            continue
        names = re.search(r"\( '(.+)' - '(.+)' \)", line)
        assert names, f"no names in {line!r}"
        width = re.search(r"\d+", items[4])
        assert width and items[5] in RATES, f"unknown width/rate in {line!r}"
        dev = devices.setdefault(items[3], Device(items[0], int(items[1]), items[3],
                                                  int(width.group()) * RATES[items[5]], names[1]))
        dev.uplinks[int(items[2])] = (items[7], int(items[8]), int(items[9]), items[10], names[2])
    return devices


def parse_perfquery(out: str) -> dict[int, dict[str, float]]:
    """``perfquery -l -x`` output: port -> counter -> value, *Data in octets (x 4), as the
    exporter reads it (``Name:....value`` lines; PortSelect starts a port)."""
    ports: dict[int, dict[str, float]] = {}
    port = -1
    for line in out.splitlines():
        items = line.split(":")
        if len(items) != 2:
            continue
        name, value = items[0], items[1].replace(".", "")
        if name == "PortSelect":
            port = int(value)
        if name.startswith("#") or name in ("PortSelect", "CounterSelect", "CounterSelect2"):
            continue
        ports.setdefault(port, {})[name] = float(value) * (4 if name.endswith("Data") else 1)
    return ports


@dataclass
class ErrPort:
    guid: str
    port: int
    counters: dict[str, int]
    link: re.Match[str] | None


def parse_ibqueryerrors(out: str) -> tuple[dict[str, list[ErrPort]], re.Match[str]]:
    """Node name -> its reported ports, and the summary, from ibqueryerrors' report: chunks
    headed ``Errors for [0xGUID ]"name"``; a switch's first line is its ``port ALL`` sum; then
    per port a ``GUID ... port N: [Counter == n] ...`` line and (``--report-port``) its
    ``Link info`` line."""
    chunks = re.split(r'^Errors for (?:0x[\da-f]+ )?"(.*)"$', out, flags=re.M)
    assert chunks[0].strip() == "" or chunks[0].lstrip().startswith("## Summary"), chunks[0][:300]
    summary = re.search(r"## Summary: (\d+) nodes checked, (\d+) bad nodes found\n"
                        r"##\s+(\d+) ports checked, (\d+) ports have errors beyond threshold", out)
    assert summary, out[-500:]
    nodes: dict[str, list[ErrPort]] = {}
    for name, body in zip(chunks[1::2], chunks[2::2], strict=True):
        lines = [x for x in body.split("\n## Summary")[0].strip("\n").splitlines() if x.strip()]
        if re.fullmatch(r"\s*GUID 0x[\da-f]+ port ALL: (?:\[.*\])+", lines[0]):
            lines = lines[1:]
        ports = []
        for head, link in zip(lines[0::2], lines[1::2], strict=True):
            m = re.match(r"\s*GUID (0x\S+) port (\d+):(.*)", head)
            assert m, head
            assert re.match(r"\s*Link info:\s+(\d+)\s+(\d+)\[\s+\] ==\(", link), link
            active = re.match(r"\s*Link info:\s+(?P<lid>\d+)\s+(?P<port>\d+).*(?P<width>\d)X\s+(?P<speed>[\d.]*) Gbps"
                              r".* Active/  LinkUp.*(?P<remote_guid>0x\w+)\s+(?P<remote_lid>\d+)\s+"
                              r"(?P<remote_port>\d+).*\"(?P<name>.*)\"", link)
            counters = {c: int(v) for c, v in re.findall(r"\[(\w+) == (\d+)", m.group(3))}
            ports.append(ErrPort(m.group(1), int(m.group(2)), counters, active))
        nodes[name] = ports
    return nodes, summary


# ---------------------------------------------------------------------- the fabric

class Fabric:
    def __init__(self, datapath: str, tmp: Path) -> None:
        self.datapath = datapath
        self.tmp = tmp
        self.topo = generate("fat-tree", k=4)
        self.state = ownership.RunState(ownership.new_run_id(), scenario=f"pytest-exporters-{datapath}")
        self.rt = FabricRuntime(self.topo, make_agents=make_agents, datapath=datapath, state=self.state,
                                run_dir=tmp, sm="opensm", sm_engine="minhop")
        self.live: Running | None = None

    def run(self, host: str, *argv: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(tool_argv(self.rt.plan.nodes[host].ns, list(argv)), cwd=self.tmp, capture_output=True,
                           text=True, timeout=60, check=False)
        if r.returncode < 0:  # the tool itself died of a signal (seen once with ibqueryerrors): once more
            r = subprocess.run(tool_argv(self.rt.plan.nodes[host].ns, list(argv)), cwd=self.tmp,
                               capture_output=True, text=True, timeout=60, check=False)
        return r

    def tool(self, host: str, *argv: str) -> str:
        r = self.run(host, *argv)
        assert r.returncode == 0, f"{argv}: exit {r.returncode}: {r.stderr[-1500:]}"
        return r.stdout

    def lid(self, host: str) -> int:
        assert self.live is not None and self.live.host is not None
        return int(self.live.on_loop(lambda: self.live.host.nodes[host].agent.lid(1)))  # type: ignore[union-attr]

    def port_state(self, node: str, port: int) -> PortState:
        assert self.live is not None and self.live.host is not None
        return PortState(self.live.on_loop(lambda: self.live.host.nodes[node].agent.ports[port].state))  # type: ignore[union-attr]

    def perfquery_all(self, devices: dict[str, Device]) -> dict[str, dict[int, dict[str, float]]]:
        """Every node as the exporter queries it: one perfquery per node, all its cabled ports
        (several at a time, as its ``--perfquery.max-concurrent`` allows)."""
        def one(dev: Device) -> dict[int, dict[str, float]]:
            return parse_perfquery(self.tool("h5", "perfquery", "-l", "-x", "-G", dev.guid,
                                             ",".join(str(p) for p in sorted(dev.uplinks))))

        with ThreadPoolExecutor(max_workers=6) as pool:
            return dict(zip(devices, pool.map(one, devices.values()), strict=True))


@pytest.fixture(scope="module", params=["kernel", "user"])
def fabric(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    tmp = tmp_path_factory.mktemp(f"exporters-{request.param}")
    fab = Fabric(request.param, tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ownership, "STATE_DIR", tmp / "state")
        with fabric_in_thread(fab.rt) as live:
            fab.live = live
            yield fab


# ---------------------------------------------------------------------- tests

def test_ibnetdiscover_ports_lists_every_cable_with_its_rate(fabric: Fabric) -> None:
    devices = parse_ibnetdiscover_ports(fabric.tool("h5", "ibnetdiscover", "--ports"))
    switches = {d.name: d for d in devices.values() if d.kind == "SW"}
    cas = {d.name: d for d in devices.values() if d.kind == "CA"}
    assert len(switches) == 20 and len(cas) == 16
    for node in fabric.topo.nodes.values():
        dev = switches[node.desc] if node.is_switch else cas[node.desc]
        assert int(dev.guid, 16) == (node.guid if node.is_switch else node.guid + 1)  # a CA: its port GUID
        assert dev.rate_gbps == 4 * 25 and dev.lid > 0
        for port in range(1, node.num_ports + 1):
            peer = fabric.topo.peer(node.name, port)
            if peer is None:
                continue
            far = fabric.topo.node(peer.node)
            kind, _lid, far_port, far_guid, far_name = dev.uplinks[port]
            assert (kind, far_port, far_name) == ("SW" if far.is_switch else "CA", peer.port, far.desc)
            assert int(far_guid, 16) == (far.guid if far.is_switch else far.guid + 1)
        assert len(dev.uplinks) == sum(1 for p in range(1, node.num_ports + 1) if fabric.topo.peer(node.name, p))


def test_perfquery_extended_data_counters_count_the_bytes_sent_in_4_octet_words(fabric: Fabric) -> None:
    devices = parse_ibnetdiscover_ports(fabric.tool("h5", "ibnetdiscover", "--ports"))
    before = fabric.perfquery_all(devices)
    for guid, dev in devices.items():  # every node answers for every cabled port, 64-bit counters
        assert set(before[guid]) == set(dev.uplinks), (dev.name, before[guid].keys())
        for counters in before[guid].values():
            assert {"PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts", "PortUnicastXmitPkts",
                    "PortUnicastRcvPkts", "PortMulticastXmitPkts", "PortMulticastRcvPkts"} <= set(counters)
    n, size = 1000, 1000
    assert send_and_count(fabric.rt.plan, "h1", "h15", fabric.lid("h1"), fabric.lid("h15"), n, size=size) == n
    watched = {g: d for g, d in devices.items() if d.kind == "SW" or d.name in ("h1 HCA-1", "h15 HCA-1", "h7 HCA-1")}
    after = fabric.perfquery_all(watched)
    sent = n * (size + SEND_OVERHEAD)
    slack = 40 * MAD_OCTETS  # management traffic in between: the SM, these very queries

    def delta(guid: str, port: int, name: str) -> float:
        return after[guid][port][name] - before[guid][port][name]

    by_name = {d.name: d for d in devices.values()}
    h1, h15 = by_name["h1 HCA-1"], by_name["h15 HCA-1"]
    assert sent <= delta(h1.guid, 1, "PortXmitData") <= sent + slack
    assert sent <= delta(h15.guid, 1, "PortRcvData") <= sent + slack
    assert n <= delta(h1.guid, 1, "PortXmitPkts") <= n + 40 and n <= delta(h15.guid, 1, "PortRcvPkts") <= n + 40
    # h1's edge switch received it on h1's cable; across the fat-tree it crossed 5 switches
    _k, _lid, edge_port, edge_guid, _name = h1.uplinks[1]
    assert sent <= delta(edge_guid, edge_port, "PortRcvData") <= sent + slack
    # exactly 5 switch ports sent it on (edge, agg, core, agg, edge), 5 received it: the others
    # carried management MADs only (SM sweeps, these very queries: some tens of KB)
    sw_ports = [(g, p) for g, d in watched.items() if d.kind == "SW" for p in d.uplinks]
    top6 = {}
    for name in ("PortXmitData", "PortRcvData"):
        moved = sorted((delta(g, p, name) for g, p in sw_ports), reverse=True)
        assert all(sent <= x <= sent + 10 * slack for x in moved[:5]), (name, moved[:6])
        assert moved[5] < sent / 4, (name, moved[:6])
        top6[name] = [int(x) for x in moved[:6]]
    idle = by_name["h7 HCA-1"]  # a host away from the path saw no data
    assert delta(idle.guid, 1, "PortRcvData") < slack
    print(f"{fabric.datapath}: {sent} octets sent; PortXmitData h1 +{delta(h1.guid, 1, 'PortXmitData'):.0f}, "
          f"PortRcvData h15 +{delta(h15.guid, 1, 'PortRcvData'):.0f}; busiest switch ports {top6}")


def reported(nodes: dict[str, list[ErrPort]]) -> int:
    return sum(len(ports) for ports in nodes.values())


def test_ibqueryerrors_clean_then_a_flapped_cable_shows_on_both_ends(fabric: Fabric) -> None:
    clean = fabric.run("h9", *IBQUERYERRORS)
    nodes, summary = parse_ibqueryerrors(clean.stdout)
    # every node and every cabled port checked; no error, only (on the user datapath, whose
    # switches queue: after the traffic above) PortXmitWait, which ibqueryerrors reports too
    assert summary.groups()[0::2] == ("36", "96") and int(summary[4]) == reported(nodes)
    assert clean.returncode == (1 if nodes else 0), clean.stderr[-1000:]
    assert {c for ports in nodes.values() for p in ports for c in p.counters if not DATA.match(c)} <= {"PortXmitWait"}
    assert fabric.datapath == "user" or nodes == {}, clean.stdout[-2000:]
    assert "Suppressed: PortRcvSwitchRelayErrors" in clean.stdout
    # a cable down and up: its two ends count LinkDownedCounter, OpenSM brings them back Active
    assert fabric.rt.fabric is not None
    edge, agg = fabric.topo.node("edge0_1"), fabric.topo.peer("edge0_1", 3)
    assert agg is not None
    ns, ifname = fabric.rt.plan.nodes["edge0_1"].ns, fabric.topo.ifname("edge0_1", 3)
    fabric.rt.fabric.links.set_up(ns, ifname, False)
    time.sleep(0.3)
    fabric.rt.fabric.links.set_up(ns, ifname, True)
    deadline = time.monotonic() + 20
    while fabric.port_state("edge0_1", 3) != PortState.ACTIVE or fabric.port_state(agg.node, agg.port) != PortState.ACTIVE:
        assert time.monotonic() < deadline, "OpenSM did not bring the cable back to Active"
        time.sleep(0.05)
    r = fabric.run("h9", *IBQUERYERRORS)
    assert r.returncode == 1, r.stderr[-1000:]  # ibqueryerrors exits 1 when it found errors
    assert "query failed" not in r.stderr, r.stderr[-1000:]
    nodes, summary = parse_ibqueryerrors(r.stdout)
    assert summary.groups()[0::2] == ("36", "96") and int(summary[4]) == reported(nodes), r.stdout[-500:]
    far = fabric.topo.node(agg.node)
    downed = {(name, p.port) for name, ports in nodes.items() for p in ports if "LinkDownedCounter" in p.counters}
    assert downed == {(edge.desc, 3), (far.desc, agg.port)}, r.stdout
    for node, port, peer, peer_port in ((edge, 3, far, agg.port), (far, agg.port, edge, 3)):
        (rep,) = [p for p in nodes[node.desc] if p.port == port]
        assert int(rep.guid, 16) == node.guid and rep.port == port
        assert rep.counters["LinkDownedCounter"] == 1
        assert rep.counters["PortXmitData"] > 0 and rep.counters["PortRcvPkts"] > 0  # --data
        assert rep.link is not None, "the Link info line is not that of an Active 4X link"
        assert int(rep.link["remote_guid"], 16) == peer.guid and int(rep.link["remote_port"]) == peer_port
        assert rep.link["name"] == peer.desc and rep.link["width"] == "4"
