"""Partitions on a live fabric (user and kernel datapaths, ibemu's SM; user, OpenSM): members of one partition reach
each other, cross-partition frames are dropped at the switch ports facing the hosts (0
delivered), the constraint counters move in the PMA (read by the real ``perfquery`` when
installed) and trap 257 reaches the SM.

h0 and h1 hang off leaf0, h2 and h3 off leaf1. Partition a (0x0001): h1 and h2, full;
partition b (0x0002): h0 and h3, full. Frames are sent on raw sockets on the hosts' cables,
beside their agents, with chosen P_Keys, as a misbehaving host would.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ibemu.agents.switch import SwitchAgent
from ibemu.fabric import opensm
from ibemu.fabric.agents import make_agents
from ibemu.fabric.probe import send_and_count
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from ibemu.kernel import ownership
from ibemu.sm.partitions import Partition, SmPartitions
from ibemu.topo import generate
from tests.integration.live import Running, fabric_in_thread

pytestmark = [pytest.mark.root]

N = 40


@pytest.fixture(scope="module", params=["user", "kernel"])
def parted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp(f"pkey-{request.param}")
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2)
    g = {n.name: n.guid for n in topo.cas()}
    parts = SmPartitions((Partition("a", 0x0001, ((g["h1"], True), (g["h2"], True))),
                          Partition("b", 0x0002, ((g["h0"], True), (g["h3"], True)))))
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-pkey")
    rt = FabricRuntime(topo, make_agents=make_agents, datapath=request.param, state=state, run_dir=tmp,
                       sm="ibemu", sm_host="h0", sm_partitions=parts.to_json())
    with fabric_in_thread(rt, 90) as running:
        yield running


def _agents(live: Running) -> dict[str, Any]:
    assert live.host is not None
    return {name: rt.agent for name, rt in live.host.nodes.items()}


def _facing(live: Running, host: str) -> tuple[str, int]:
    link = live.rt.topo.link_at(host, 1)
    far = link.b if link.a.node == host else link.a
    return far.node, far.port


def _blast(live: Running, src: str, dst: str, pkey: int, n: int = N) -> int:
    """Send ``n`` data frames with ``pkey`` from ``src`` to ``dst``; how many arrive."""
    agents = _agents(live)
    slid, dlid = live.on_loop(lambda: (agents[src].lid(1), agents[dst].lid(1)))
    return send_and_count(live.rt.plan, src, dst, slid, dlid, n, size=64, wait_s=1.0, pkey=pkey)


def _counters(live: Running, host: str) -> tuple[int, int]:
    sw, port = _facing(live, host)
    agent = _agents(live)[sw]
    return live.on_loop(lambda: (agent.counters(port).port_rcv_constraint_errors,
                                 agent.counters(port).port_xmit_constraint_errors))


def test_partitions_isolate_hosts(parted: Running) -> None:
    live = parted
    agents = _agents(live)
    sw, port = _facing(live, "h1")
    assert live.on_loop(lambda: (agents["h1"].pkeys(1)[:2], agents[sw].pkeys(port)[:2],
                                 agents[sw].ports[port].partition_flags)) == ([0xFFFF, 0x8001], [0xFFFF, 0x8001], 12)
    # members of a partition, and the default partition, pass
    assert _blast(live, "h1", "h2", 0x8001) == N
    assert _blast(live, "h0", "h3", 0x8002) == N
    assert _blast(live, "h1", "h3", 0xFFFF) == N
    assert _counters(live, "h1") == (0, 0) and _counters(live, "h3") == (0, 0)
    # h1 claims b's key: dropped where it enters the fabric
    assert _blast(live, "h1", "h3", 0x8002) == 0
    assert _counters(live, "h1") == (N, 0)
    # a's key towards h3 (not in a) from h2 (in a): in, across the spine, and dropped leaving to h3
    assert _blast(live, "h2", "h3", 0x8001) == 0
    assert _counters(live, "h2") == (0, 0) and _counters(live, "h3") == (0, N)
    # trap 257 reached the SM (rate-limited: at least one per port and direction)
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        path = live.rt.run_dir / "ibemu" / "events.jsonl"  # type: ignore[operator]
        events = [e for e in (json.loads(x) for x in path.read_text().splitlines() if x.strip())
                  if e["kind"] == "pkey_violation"]
        if {e["pkey"] for e in events} >= {0x8001, 0x8002}:
            break
        time.sleep(0.2)
    lids = live.on_loop(lambda: {n: a.lid if isinstance(a, SwitchAgent) else a.lid(1) for n, a in agents.items()})
    assert {(e["pkey"], e["lid1"], e["lid2"]) for e in events} == {(0x8002, lids["h1"], lids["h3"]),
                                                                   (0x8001, lids["h2"], lids["h3"])}, events
    assert len(events) <= 4  # rate-limited, not one per frame
    # the PMA reports them to the real perfquery
    if umad2sim_path() is None or shutil.which("perfquery") is None:
        return
    sw3, port3 = _facing(live, "h3")
    ns = live.rt.plan.nodes["h0"].ns
    r = subprocess.run(tool_argv(ns, ["perfquery", str(lids[sw3]), str(port3)]), capture_output=True, text=True,
                       timeout=30, check=False, cwd=Path(live.rt.run_dir or "."))
    assert r.returncode == 0, r.stderr
    m = re.search(r"^PortXmitConstraintErrors:\.+(\d+)", r.stdout, re.M)
    assert m and int(m.group(1)) == N, r.stdout


@pytest.mark.skipif(not opensm.opensm_available() or umad2sim_path() is None,
                    reason="needs opensm and ibsim-utils (scripts/setup.sh installs them)")
def test_opensm_programs_the_same_partitions(tmp_path: Path) -> None:
    """The unmodified OpenSM, given ibemu's partitions.conf and part_enforce, programs the
    same isolation through the agents."""
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2)
    g = {n.name: n.guid for n in topo.cas()}
    parts = SmPartitions((Partition("a", 0x0001, ((g["h1"], True), (g["h2"], True))),
                          Partition("b", 0x0002, ((g["h0"], True), (g["h3"], True)))))
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-pkey-opensm")
    rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp_path, sm="opensm",
                       sm_host="h0", sm_partitions=parts.to_json())
    with fabric_in_thread(rt, 90) as live:
        assert "a=0x0001" in (tmp_path / "opensm" / "partitions.conf").read_text()
        agents = _agents(live)
        sw, port = _facing(live, "h1")
        deadline = time.monotonic() + 10  # OpenSM writes P_Keys after SUBNET UP's sweep may end
        while time.monotonic() < deadline and live.on_loop(lambda: agents[sw].ports[port].partition_flags) != 12:
            time.sleep(0.2)
        assert live.on_loop(lambda: agents[sw].ports[port].partition_flags) == 12
        assert 0x8001 in live.on_loop(lambda: agents["h1"].pkeys(1))
        assert _blast(live, "h1", "h2", 0x8001) == N
        assert _blast(live, "h1", "h3", 0x8002) == 0
        assert _counters(live, "h1")[0] == N
