"""ibemu's own SM (``python -m ibemu.sm``, a separate process) manages a live k=4 fabric.

Its SMPs leave through h0's MAD socket and cross the emulated switches as real frames; the
LFTs it writes are what tc forwards data on. A cut edge-aggregation cable is rerouted and
the phases are in its event log.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ibemu.agents.port import PhysState, PortState
from ibemu.fabric.agenthost import AgentHost
from ibemu.fabric.agents import make_agents
from ibemu.fabric.probe import send_and_count
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from ibemu.kernel import ownership, steer
from ibemu.topo import generate
from tests.integration.live import fabric_in_thread

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]


class Live:
    """A k=4 fabric (agents + MAD sockets) on a trio loop in a thread, and ibemu's SM."""

    def __init__(self, tmp: Path, datapath: str = "kernel") -> None:
        self.topo = generate("fat-tree", k=4)
        self.state = ownership.RunState(ownership.new_run_id(), scenario="pytest-sm-live")
        self.rt = FabricRuntime(self.topo, make_agents=make_agents, state=self.state, run_dir=tmp,
                                datapath=datapath)
        self.tmp = tmp
        self.host: AgentHost | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.sm: subprocess.Popen[bytes] | None = None
        self.events = tmp / "sm-events.jsonl"
        self._offset = 0
        self._records: list[dict[str, Any]] = []

    def ns(self, node: str) -> str:
        return self.rt.plan.nodes[node].ns

    def on_loop(self, fn, *args):
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def start_sm(self, *extra: str) -> None:
        argv = [sys.executable, "-m", "ibemu.sm", "--ns", self.ns("h0"), "--events", str(self.events),
                "--sweep-interval", "2", *extra]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.sm = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                   stderr=open(self.tmp / "sm.stderr", "wb"))  # noqa: SIM115

    def records(self) -> list[dict[str, Any]]:
        """The SM's events so far, read incrementally (the fabric shares this process's GIL)."""
        if self.events.exists():
            with open(self.events, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self._offset += end
            self._records += [json.loads(x) for x in chunk[:end].splitlines() if x.strip()]
        return self._records

    def wait_for(self, kind: str, count: int = 1, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            got = [r for r in self.records() if r["kind"] == kind]
            if len(got) >= count:
                return got
            assert self.sm is not None
            if self.sm.poll() is not None:
                raise AssertionError(f"SM exited ({self.sm.returncode}): "
                                     f"{(self.tmp / 'sm.stderr').read_text()[-3000:]}")
            assert time.monotonic() < deadline, f"no {kind} in {timeout_s} s"
            time.sleep(0.01)

    def lid(self, host: str) -> int:
        return int(self.on_loop(lambda: self.host.nodes[host].agent.lid(1)))  # type: ignore[union-attr]

    def ports_not_active(self) -> list[str]:
        def scan() -> list[str]:
            assert self.host is not None
            bad = []
            for name, rt in self.host.nodes.items():
                for num, p in rt.agent.ports.items():  # type: ignore[attr-defined]
                    if num and p.phys == PhysState.LINK_UP and p.state != PortState.ACTIVE:
                        bad.append(f"{name}:{num}")
            return bad

        return list(self.on_loop(scan))

    def blast(self, src: str, dst: str, n: int, size: int = 200) -> int:
        """Send ``n`` frames from ``src`` to ``dst`` on raw sockets; how many arrive."""
        return send_and_count(self.rt.plan, src, dst, self.lid(src), self.lid(dst), n, size=size)


@pytest.fixture(name="live")
def live_fixture(state_dir: Path, tmp_path: Path) -> Iterator[Live]:
    """A ``Live`` fabric for the test, its SM (stopped or not) ended and everything torn down
    after it (``test_local_failover`` takes it too)."""
    yield from live_fabric(tmp_path)


def live_fabric(tmp_path: Path, datapath: str = "kernel") -> Iterator[Live]:
    """``live_fixture``'s body, on either datapath (``test_local_failover_user``)."""
    fab = Live(tmp_path, datapath)
    with fabric_in_thread(fab.rt) as running:
        fab.host, fab.token = running.host, running.token
        try:
            yield fab
        finally:
            if fab.sm is not None and fab.sm.poll() is None:
                fab.sm.send_signal(signal.SIGCONT)  # a test may have stopped it
                fab.sm.terminate()
                try:
                    fab.sm.wait(10)
                except subprocess.TimeoutExpired:
                    fab.sm.kill()
                    fab.sm.wait(5)


@pytest.mark.parametrize("direct", [False, True], ids=["mad-socket", "own-port"])
def test_ibemu_sm_brings_the_fabric_up_data_flows_and_a_cut_cable_is_rerouted(live: Live, direct: bool) -> None:
    live.start_sm(*(live.rt.sm_direct_args() if direct else []))
    cpus = sorted(os.sched_getaffinity(0))
    steered = direct and len(cpus) >= 2
    if steered:  # on a CPU of its own, as ``ibemu run`` places it: its cable's far end is steered
        assert live.sm is not None
        os.sched_setaffinity(live.sm.pid, {cpus[-1]})
    up = live.wait_for("subnet_up")[0]
    assert up["nodes"] == 36
    assert live.ports_not_active() == []
    lids = {h: live.lid(h) for h in ("h0", "h1", "h15")}
    assert lids["h0"] == 1 and len(set(lids.values())) == 3
    assert live.blast("h1", "h15", 500) == 500  # edge, agg, core, agg, edge
    assert live.blast("h2", "h3", 200) == 200
    if umad2sim_path() is not None and shutil.which("ibnetdiscover"):
        out = subprocess.run(tool_argv(live.ns("h5"), ["ibnetdiscover"]), cwd=live.tmp, capture_output=True,
                             text=True, timeout=60, check=True).stdout
        assert out.count("\nSwitch") == 20 and out.count("\nCa") == 16
    # cut h1's edge switch's first uplink (edge0_0:3 - agg0_0:1): the SM reroutes
    ns, ifname = live.ns("edge0_0"), live.topo.ifname("edge0_0", 3)
    assert live.rt.fabric is not None
    t_fault = time.monotonic_ns()
    live.rt.fabric.links.set_up(ns, ifname, False)
    rr = live.wait_for("reroute", timeout_s=20)[0]
    assert t_fault <= rr["t_trap"] <= rr["t_rediscovered"] <= rr["t_routed"] <= rr["t_programmed"]
    assert rr["blocks"] > 0 and rr["blocks_failed"] == 0
    # t_detect: the switch saw its port go down (the agents' event log of the run)
    detect = [r["t_ns"] for r in map(json.loads, (live.tmp / "events.jsonl").read_text().splitlines())
              if r.get("node") == "edge0_0" and r.get("why") == "link_down" and r["t_ns"] >= t_fault]
    assert detect and t_fault <= detect[0] <= rr["t_trap"]
    phases = {"t_detect": (detect[0] - t_fault) / 1e6,
              **{k: (rr[k] - t_fault) / 1e6 for k in ("t_trap", "t_rediscovered", "t_routed", "t_programmed")}}
    print("reroute phases (ms after the fault):", phases)
    assert live.blast("h1", "h15", 300) == 300
    assert live.blast("h0", "h7", 300) == 300
    # restoration: the cable comes back, the SM activates it again
    live.rt.fabric.links.set_up(ns, ifname, True)
    live.wait_for("reroute", count=2, timeout_s=20)
    deadline = time.monotonic() + 10
    while live.ports_not_active() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live.ports_not_active() == []
    assert live.blast("h1", "h15", 300) == 300
    assert live.sm is not None and live.sm.poll() is None
    live.sm.terminate()
    live.sm.wait(10)
    port = live.wait_for("sm_stop")[0]["port"]
    if direct:  # the SMPs that leave the host went by the SM's own packet socket, both ways
        assert port["tx_direct"] > 300 and port["rx_direct"] >= port["tx_direct"] - 5
        assert port.get("rx_bad_packet", 0) == 0 and port["rx_umad"] < 50
        assert port["tx_sendmmsg"] > 0  # submitted batches went out in bursts
        if steered:  # steered at SUBNET UP (the reroutes too), taken back at the exit
            assert port["steer_changes"] >= 1 and port["steer_cpu_mask"] == sum(1 << c for c in cpus[:-1])
            far_ns, far_if = steer.peer_of(live.ns("h0"), live.topo.ifname("h0", 1))
            assert far_ns == live.ns("edge0_0")
            shown = subprocess.run(["ip", "netns", "exec", far_ns, "sh", "-c",
                                    f"cat /sys/class/net/{far_if}/queues/rx-*/rps_cpus"],
                                   capture_output=True, text=True, check=True).stdout.split()
            assert shown and all(int(m.replace(",", ""), 16) == 0 for m in shown)
    else:
        assert port == {}
