"""Helpers shared by the RoCE integration tests (kernel and user datapaths): k=4 core counters,
cutting the cable a flow crosses, the manager's reroute records, and a fabric's whole life."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from ibemu.fabric.roce_fabric import RoceRun
from ibemu.kernel import netns, ownership, rtnl
from ibemu.roce.queues import QueueConfig
from ibemu.topo import generate

CORES = ("core0", "core1", "core2", "core3")


def user_counters(run: RoceRun) -> dict[str, Any]:
    """The user datapath's counters, fresh (it writes them every second)."""
    t = time.monotonic_ns()
    deadline = time.monotonic() + 5
    c: dict[str, Any] = {}
    while time.monotonic() < deadline:
        c = run.live_counters()
        if c.get("t_ns", 0) > t:
            return c
        time.sleep(0.1)
    return c


def core_tx(run: RoceRun) -> dict[str, int]:
    """Frames each core router of a k=4 fat-tree has sent, over its four ports: the kernel's
    counts of their veths, or on the user datapath its own (frames between two routers go in
    memory there, not through their veth)."""
    if run.userpath is not None:
        routers = user_counters(run).get("routers", {})
        return {core: int(routers.get(core, {}).get("totals", {}).get("tx_frames", 0)) for core in CORES}
    out = {}
    for core in CORES:
        stats = rtnl.link_stats(run.fab.plan.nodes[core].ns, [f"{core}-{p}" for p in range(1, 5)])
        out[core] = sum(s.tx_packets for s in stats.values())
    return out


def core_cable_of(run: RoceRun, carry: Callable[[], object]) -> tuple[str, str]:
    """(namespace, interface) of the cable into pod 3 of the core that a one-QP flow hashes
    to: the core that sent the most while ``carry`` ran the flow."""
    before = core_tx(run)
    carry()
    after = core_tx(run)
    core = max(CORES, key=lambda c: after[c] - before[c])
    port = next(p for p, pp in run.fab.plan.nodes[core].ports.items() if pp.peer_node.startswith("agg3_"))
    return run.fab.plan.nodes[core].ns, f"{core}-{port}"


def cut_later(ns: str, ifname: str, t_fault: list[int], delay_s: float = 0.5) -> Callable[[], None]:
    """A blocking step (for a flow's ``during``) that takes the cable down after ``delay_s``
    and appends when to ``t_fault``."""

    def cut() -> None:
        time.sleep(delay_s)
        t_fault.append(time.monotonic_ns())
        rtnl.set_up(ns, [ifname], False)

    return cut


def check_reroute(run: RoceRun, t_fault: int, arrivals: list[int]) -> None:
    """The fabric manager rerouted the cut (its phases in order, the core's only way down
    lost) and the flow never stopped for a second."""
    reroutes = [e for e in run.manager_events() if e["kind"] == "reroute" and e["t_detect"] >= t_fault]
    assert reroutes, "the manager logged no reroute"
    r = reroutes[0]
    assert r["reason"] == "link_down" and r["changes"] > 0
    assert t_fault <= r["t_detect"] <= r["t_routed"] <= r["t_programmed"]
    assert r["local_blackholed"] > 0  # the core had no other way down: the manager had to act
    gaps = [t2 - t1 for t1, t2 in itertools.pairwise(arrivals) if t2 > t_fault]
    assert max(gaps) < 1_000_000_000


def wait_link_up_reroute(run: RoceRun, timeout_s: float = 5.0) -> None:
    """The manager rerouted when the cable came back."""
    deadline = time.monotonic() + timeout_s
    ups: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not ups:
        ups = [e for e in run.manager_events() if e["kind"] == "reroute" and e["reason"] == "link_up"]
        time.sleep(0.05)
    assert ups, "the manager did not reroute when the cable came back"


def roce_up(state_dir: Path, scenario: str, queues: QueueConfig | None = None) -> Generator[RoceRun, None, RoceRun]:
    """A k=4 RoCE fabric owned by a run recorded in ``state_dir`` (a fixture's body): up,
    yielded, then down with nothing left behind. Returns the run once it is down."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ownership, "STATE_DIR", state_dir)
        state = ownership.RunState(ownership.new_run_id(), scenario=scenario)
        state.save()
        run = RoceRun.up(generate("fat-tree", k=4), state, queues=queues)
        try:
            yield run
        finally:
            problems = run.down()
            assert not problems, problems
            assert not any(netns.exists(n) for n in run.fab.plan.namespaces)
            assert not state.path.exists()
    return run
