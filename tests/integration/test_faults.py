"""Faults on a live, OpenSM-managed k=4 fabric: cables, a whole switch, flapping, SMP loss."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibemu.fabric import opensm
from ibemu.fabric.agents import make_agent
from ibemu.fabric.faults import FaultInjector
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from tests.integration.test_datapaths import Managed, managed_fabric

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None, reason="libumad2sim.so missing (apt-get install ibsim-utils)"),
    pytest.mark.skipif(not opensm.opensm_available(), reason="opensm missing (apt-get install opensm)"),
]


@pytest.fixture
def fab(state_dir: Path, tmp_path: Path) -> Iterator[tuple[Managed, FaultInjector]]:
    for m in managed_fabric("kernel", tmp_path, opensm_args=["--sweep", "1"]):
        assert m.host is not None
        yield m, FaultInjector(m.host, lambda name, m=m: make_agent(m.rt.plan, m.topo.node(name)))


def _path(m: Managed, src: str, dst: str) -> list[str]:
    out = subprocess.run(tool_argv(m.rt.plan.nodes[src].ns, ["ibtracert", str(m.lid(src)), str(m.lid(dst))]),
                         cwd=m.tmp, capture_output=True, text=True, timeout=30, check=False).stdout
    return re.findall(r'"ibemu (\w+)"', out)


def _wait_delivery(m: Managed, src: str, dst: str, n: int = 200, timeout_s: float = 15.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if m.blast(src, dst, n) == n:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"{src} -> {dst} not restored within {timeout_s} s")


def test_cut_cable_is_rerouted_and_stamped(fab: tuple[Managed, FaultInjector]) -> None:
    m, inj = fab
    path = _path(m, "h1", "h15")
    agg, core = path[1], path[2]
    link = next(lk for lk in m.topo.links if {lk.a.node, lk.b.node} == {agg, core})
    inj.link(link, up=False)
    _wait_delivery(m, "h1", "h15")
    assert _path(m, "h1", "h15")[2] != core
    events = [json.loads(x) for x in (m.tmp / "events.jsonl").read_text().splitlines()]
    fault = next(e for e in events if e["kind"] == "fault")
    carriers = [e for e in events if e["kind"] == "carrier" and not e["up"] and e["t_ns"] >= fault["t_ns"]]
    assert {e["node"] for e in carriers} >= {agg, core}  # t_detect on both ends
    assert any(e["kind"] == "trap_sent" for e in events)
    inj.link(link, up=True)
    _wait_delivery(m, "h1", "h15")


def test_a_dead_switch_is_routed_around_and_comes_back_fresh(fab: tuple[Managed, FaultInjector]) -> None:
    m, inj = fab
    core = _path(m, "h1", "h15")[2]
    inj.switch(core, up=False)
    _wait_delivery(m, "h1", "h15")
    assert core not in _path(m, "h1", "h15")
    inj.switch(core, up=True)
    deadline = time.monotonic() + 20
    while True:  # OpenSM's periodic sweep finds the rebooted switch and brings it back up
        disc = subprocess.run(tool_argv(m.rt.plan.nodes["h3"].ns, ["ibnetdiscover"]), cwd=m.tmp,
                              capture_output=True, text=True, timeout=30).stdout
        lid = int(m.on_loop(lambda: m.host.nodes[core].agent.ports[0].lid))  # type: ignore[union-attr]
        if disc.count("\nSwitch") == 20 and lid:
            break
        assert time.monotonic() < deadline, "the rebooted switch never came back into the subnet"
        time.sleep(0.5)
    _wait_delivery(m, "h1", "h15")


def test_port_flap_and_smp_loss_leave_a_working_fabric(fab: tuple[Managed, FaultInjector]) -> None:
    m, inj = fab
    link = next(lk for lk in m.topo.links if lk.a.node.startswith("agg") or lk.b.node.startswith("agg"))
    trio.run(inj.port_flap, link, 0.4, 3)
    assert sum(1 for f in inj.injected if f["action"] in ("link_down", "link_up")) == 6
    inj.smp_loss(20.0)
    try:
        nodes = subprocess.run(tool_argv(m.rt.plan.nodes["h2"].ns, ["smpquery", "-D", "nodeinfo", "0,1"]),
                               cwd=m.tmp, capture_output=True, text=True, timeout=60)
        assert nodes.returncode in (0, 255)  # a query may time out under 20% loss ...
    finally:
        inj.smp_loss(0.0)
    dropped = sum(int(m.on_loop(lambda n=n: m.host.nodes[n].vl15_dropped)) for n in m.rt.plan.nodes)  # type: ignore[union-attr]
    assert dropped > 0 or nodes.returncode == 0
    _wait_delivery(m, "h1", "h15")  # ... but the fabric is whole afterwards
