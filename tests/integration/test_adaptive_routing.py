"""Adaptive routing on the IB user datapath, live (``fabric.adaptive_routing``): a k=4
fat-tree at dilation 100, the LFTs and alternates ``ftree_ar`` gives (written straight into
the switch agents, as ibemu's SM writes them with LFT and AlternatePorts SMPs), and bursts of
2 KiB RDMA WRITE frames h1 -> h15 from a raw socket, PSNs in order. Per packet, the edge and
aggregation switches spread the bursts over their groups' up-ports by the link model's queues
(``Forwarder.adapt``), and h15 counts the frames that arrive behind a later PSN (reordering).
Per flowlet, a burst (back to back, far within the gap) keeps one port: nothing reordered;
static routing likewise (every frame by the LFT's port). Dilation 20000: the bursts' frames (2 KiB, 4x EDR: 170 ns each) are
3.4 ms apart in real time, so the datapath keeps up and the order the receiver sees is the
model's (at dilation 100 the real order was the agent host's processing order).

Where per-packet reordering likely comes from here (not isolated): the two paths are equally long, but they
converge on the last edge switch's port to h15, fed at its line rate, whose arbiter serves
its input ports round robin (``physics.model``): once a frame from each path waits there,
the arbiter's turn, not the PSN, decides which leaves first."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ibemu import clock
from ibemu.agents.forwarder import AdaptiveRouting
from ibemu.agents.port import PortState
from ibemu.fabric.agents import make_agents
from ibemu.fabric.probe import send_bursts
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import ownership
from ibemu.sm.program import alt_blocks
from ibemu.testing.bisection import IbRouting
from ibemu.topo import generate
from tests.integration.live import fabric_in_thread

pytestmark = pytest.mark.root

DILATION = 20000
EDGE, AGG = "edge0_0", "agg0_0"
BURSTS, BURST = 8, 16


def program(host: Any, r: IbRouting) -> None:
    lids = {**r.lids, **r.switch_lids}
    top = max(lids.values())
    for name, table in r.lfts.items():
        agent = host.nodes[name].agent
        agent.ports[0].lid = r.switch_lids[name]
        block = bytearray(agent.lft.get_block(0))
        for lid, port in table.items():
            block[lid] = port
        agent.lft.set_block(0, bytes(block))
        agent.lft.set_top(top)
        agent.alternates.update(alt_blocks(r.alternates[name], top))
        for num, p in agent.ports.items():
            if num and p.link_is_up:
                p.state = PortState.ACTIVE


def _xmit(host: Any, name: str) -> dict[int, int]:
    return {n: p.counters.xmit_pkts for n, p in host.nodes[name].agent.ports.items() if n}


def test_adaptive_routing_spreads_bursts_over_the_group_and_counts_reordering(state_dir: Path,
                                                                               tmp_path: Path) -> None:
    topo = generate("fat-tree", k=4)
    r = IbRouting(topo, "ftree_ar")
    dlid = r.lids["h15"]
    group = r.group(EDGE, dlid)
    assert len(group) == 2  # the edge's two up-ports
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-adaptive-routing")
    clock.configure(DILATION)
    try:
        rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp_path,
                           mad_sockets=False, adaptive=AdaptiveRouting("packet"))
        with fabric_in_thread(rt, emulated_clock=True) as live:
            time.sleep(0.5)  # every carrier seen
            live.on_loop(program, live.host, r)

            def run() -> tuple[dict[str, int], dict[int, int], dict[str, int]]:
                before = live.on_loop(_xmit, live.host, EDGE)
                got = send_bursts(rt.plan, "h1", "h15", r.lids["h1"], dlid, BURSTS, BURST, size=2048, gap_s=0.05)
                after = live.on_loop(_xmit, live.host, EDGE)
                stats = dict(live.on_loop(lambda: live.host.nodes[EDGE].agent.forwarder.stats))  # type: ignore[union-attr]
                return got, {p: after[p] - before[p] for p in group}, stats

            got, split, stats = run()
            print("adaptive routing per packet, edge0_0 up-ports:", split, "arrivals:", got)
            n = BURSTS * BURST
            assert got["received"] == n  # lossless
            assert sum(split.values()) == n and min(split.values()) >= n // 4  # both ports carried the bursts
            assert stats["ar_moved"] >= n // 4 and stats["ar_decisions"] >= n
            agg_moved = live.on_loop(lambda: live.host.nodes[AGG].agent.forwarder.stats["ar_moved"]  # type: ignore[union-attr]
                                     + live.host.nodes["agg0_1"].agent.forwarder.stats["ar_moved"])  # type: ignore[union-attr]
            assert agg_moved > 0  # the aggregation switches spread over their cores too
            # per flowlet: each burst is one flowlet, which stays on one port, in order
            live.on_loop(setattr, live.host, "adaptive", AdaptiveRouting("flowlet", 2_000))
            got, split, _ = run()
            print("adaptive routing per flowlet, edge0_0 up-ports:", split, "arrivals:", got)
            assert got["received"] == n and got["out_of_order"] == 0
            assert sum(split.values()) == n  # each burst on the port its first frame chose (idle ones in turn)
            # static (adaptive routing off): the LFT's port, in order
            live.on_loop(setattr, live.host, "adaptive", None)
            got, split, _ = run()
            assert got == {"received": n, "out_of_order": 0} and split[r.lfts[EDGE][dlid]] == n
    finally:
        clock.configure(1)
