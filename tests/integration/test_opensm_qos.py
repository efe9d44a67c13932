"""The unmodified OpenSM programs a scenario's ``fabric.qos`` through the agents, and the real
infiniband-diags read it back: ``smpquery sl2vl`` and ``smpquery vlarb`` on switch ports and on
CA ports show the scenario's SL -> VL map and VL arbitration tables, and the user datapath's
link model takes them.

OpenSM gets the keys as its own options (``opensm.qos_options``); it masks every entry by the
OperationalVLs it last read from the port, in its first sweep, before its own PortInfo Sets:
the ports start at VLCap (VL0-VL7), as real ports and ibsim's do, or the switch ports would
read back zeros (``ibemu.agents.port``).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from ibemu.fabric import opensm
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from ibemu.kernel import ownership
from ibemu.physics.qos import Sl2Vl
from ibemu.sm.qos import SmQos
from ibemu.topo import generate
from tests.integration.live import fabric_in_thread

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not opensm.opensm_available() or umad2sim_path() is None,
                       reason="needs opensm, ibsim-utils and infiniband-diags (scripts/setup.sh installs them)"),
]

QOS = SmQos(vls=4, sl2vl=(0, 1, 2, 3, 3, 2, 1, 0, 0, 0, 1, 1, 2, 2, 3, 3),
            vlarb_high=((3, 32),), vlarb_low=((0, 16), (1, 8), (2, 4)), vl_high_limit=2)


def _sl2vl_rows(text: str) -> dict[tuple[int, int], tuple[int, ...]]:
    """smpquery sl2vl's rows: (in port, out port) -> 16 VLs (a CA's one row: (0, 0))."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^ports: in\s+(\d+), out\s+(\d+):\s*\|(.*)\|\s*$", line)
        if m:
            rows[(int(m.group(1)), int(m.group(2)))] = tuple(int(v) for v in m.group(3).split("|"))
        elif re.match(r"^\s*\|\s*\d+\s*\|", line):  # a CA: one row without the ports column
            rows[(0, 0)] = tuple(int(v) for v in line.strip().strip("|").split("|"))
    return rows


def _vlarb(text: str) -> dict[str, list[tuple[int, int]]]:
    """smpquery vlarb's tables: 'low' / 'high' -> [(VL, weight)] of positive weight."""
    out: dict[str, list[tuple[int, int]]] = {}
    which = None
    vls: list[int] = []
    for line in text.splitlines():
        if "Low priority" in line:
            which = "low"
        elif "High priority" in line:
            which = "high"
        elif which and line.startswith("VL"):
            vls = [int(v, 0) for v in line.split(":", 1)[1].strip().strip("|").split("|")]
        elif which and line.startswith("WEIGHT"):
            ws = [int(v, 0) for v in line.split(":", 1)[1].strip().strip("|").split("|")]
            out.setdefault(which, []).extend((vl, w) for vl, w in zip(vls, ws, strict=True) if w)
    return out


def test_opensm_programs_the_scenarios_qos_into_switch_and_ca_ports(state_dir: Path, tmp_path: Path) -> None:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-opensm-qos")
    rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp_path,
                       sm="opensm", sm_host="h0", sm_engine="minhop", sm_qos=QOS.to_json())
    with fabric_in_thread(rt, 90) as live:
        assert "qos TRUE" in (tmp_path / "opensm" / "opensm.conf").read_text()
        assert live.host is not None
        agents = {name: n.agent for name, n in live.host.nodes.items()}
        leaf = topo.peer("h1", 1)
        assert leaf is not None
        uplink = next(p for p, far in topo.neighbors(leaf.node) if topo.node(far.node).is_switch)
        lid = live.on_loop(lambda: agents[leaf.node].lid)
        ns = rt.plan.nodes["h1"].ns

        def tool(*argv: str) -> str:
            r = subprocess.run(tool_argv(ns, list(argv)), capture_output=True, text=True, timeout=30, check=False,
                               cwd=tmp_path)
            assert r.returncode == 0, r.stderr[-1000:]
            return r.stdout

        want_map = QOS.sl_to_vl()
        deadline = time.monotonic() + 10  # OpenSM may still be writing after SUBNET UP
        while time.monotonic() < deadline and live.on_loop(
                lambda: agents[leaf.node].sl2vl_map(leaf.port, uplink)) != Sl2Vl(want_map):
            time.sleep(0.2)
        # a switch: every input port towards the uplink, and towards the host
        for out in (uplink, leaf.port):
            rows = _sl2vl_rows(tool("smpquery", "sl2vl", str(lid), str(out)))
            ins = [i for i in rows if i[1] == out and i[0] and i[0] != out]
            assert ins and all(rows[i] == want_map for i in ins), rows
            arb = _vlarb(tool("smpquery", "vlarb", str(lid), str(out)))
            assert arb == {"low": list(QOS.vlarb_low), "high": list(QOS.vlarb_high)}, arb
        # a CA port: its own (one) map and tables
        ca = _sl2vl_rows(tool("smpquery", "-D", "sl2vl", "0", "1"))
        assert list(ca.values()) == [want_map], ca
        assert _vlarb(tool("smpquery", "-D", "vlarb", "0", "1")) == {"low": list(QOS.vlarb_low),
                                                                     "high": list(QOS.vlarb_high)}
        pi = tool("smpquery", "portinfo", str(lid), str(uplink))
        assert re.search(r"^OperVLs:\.+VL0-3$", pi, re.M) and re.search(r"^VLHighLimit:\.+2$", pi, re.M), pi
        # the link model took them (re-read every second of the agent host's ticker)
        links = live.host.links
        assert links is not None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and live.on_loop(
                lambda: links.plane.nodes[leaf.node].ib_config[uplink].data_vls) != 4:
            time.sleep(0.2)
        node = links.plane.nodes[leaf.node]
        assert live.on_loop(lambda: (node.ib_config[uplink].data_vls, node.sl2vl[(leaf.port, uplink)])) == (
            4, Sl2Vl(want_map))
