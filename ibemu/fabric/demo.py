"""A live fabric end to end, for `ibemu demo` (needs root, OpenSM, ibsim-utils, infiniband-diags).

Builds the built-in default scenario's k=4 fat-tree, lets the unmodified OpenSM bring it up
through a host's MAD socket, asks ibnetdiscover and ibtracert what they see, sends frames
across five switches, cuts an aggregation-core cable and shows the trap 128 and the reroute,
then tears everything down.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import trio

from ibemu import clock
from ibemu.fabric.agenthost import AgentHost
from ibemu.fabric.agents import make_agents
from ibemu.fabric.probe import send_and_count
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import run_tool
from ibemu.kernel.timerfd import run_trio
from ibemu.topo import Topology

log = logging.getLogger(__name__)

Say = Callable[[str], None]


def _tool(rt: FabricRuntime, node: str, argv: list[str], cwd: Path) -> str:
    r = run_tool(rt.plan.nodes[node].ns, argv, state=rt.state, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    return r.stdout


def _lid(rt: FabricRuntime, node: str, cwd: Path) -> int:
    m = re.search(r"^Lid:\.+(\d+)", _tool(rt, node, ["smpquery", "-D", "portinfo", "0"], cwd), re.M)
    return int(m.group(1)) if m else 0


def run_live_demo(topo: Topology, workdir: Path, say: Say) -> None:
    rt = FabricRuntime(topo, make_agents=make_agents, run_dir=workdir, sm="opensm", sm_host="h0")

    async def main() -> None:
        t0 = time.perf_counter()
        async with rt.running() as host:
            counts = topo.counts()
            say(f"  fabric up in {time.perf_counter() - t0:.2f} s: {counts.switches} switches, {counts.cas} hosts, "
                f"{counts.links} veth cables; OpenSM on h0 reached SUBNET UP in {rt.sm_up_s:.2f} s")
            await trio.to_thread.run_sync(_after_up, rt, host, workdir, say)

    run_trio(main)
    say("  torn down: every namespace, cable and process of the run removed")


def _after_up(rt: FabricRuntime, host: AgentHost, workdir: Path, say: Say) -> None:
    disc = _tool(rt, "h5", ["ibnetdiscover"], workdir)
    say(f"  ibnetdiscover on h5: {disc.count(chr(10) + 'Switch')} switches, {disc.count(chr(10) + 'Ca')} CAs")
    l1, l15 = _lid(rt, "h1", workdir), _lid(rt, "h15", workdir)
    trace = _tool(rt, "h1", ["ibtracert", str(l1), str(l15)], workdir)
    hops = re.findall(r'"ibemu (\w+)"', trace)
    say(f"  ibtracert h1 (LID {l1}) -> h15 (LID {l15}): {' -> '.join(hops)}")
    got = send_and_count(rt.plan, "h1", "h15", l1, l15, 1000, size=1024, rdma_write=True)
    say(f"  1000 RDMA WRITE frames h1 -> h15 through the kernel datapath: {got} delivered")
    agg, core = hops[1], hops[2]
    port = next(p for p, far in rt.topo.neighbors(agg) if far.node == core)
    t_cut = clock.now_ns()
    assert rt.fabric is not None
    rt.fabric.links.set_up(rt.plan.nodes[agg].ns, rt.topo.ifname(agg, port), False)
    log_path = workdir / "opensm" / "opensm.log"
    deadline = clock.monotonic() + 10
    while clock.monotonic() < deadline:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if text.count("SUBNET UP") >= 2:
            break
        time.sleep(0.02)
    rerouted_ms = (clock.now_ns() - t_cut) / 1e6
    trace2 = _tool(rt, "h1", ["ibtracert", str(l1), str(l15)], workdir)
    hops2 = re.findall(r'"ibemu (\w+)"', trace2)
    say(f"  cut {agg}:{port} - {core}: trap 128 -> OpenSM re-sweep -> SUBNET UP again within {rerouted_ms:.0f} ms")
    say(f"  ibtracert now: {' -> '.join(hops2)}")
    got = send_and_count(rt.plan, "h1", "h15", l1, l15, 1000, size=1024, rdma_write=True)
    say(f"  1000 frames h1 -> h15 after the reroute: {got} delivered")


def live_demo_available() -> str | None:
    """None when the live demo can run here, else why not."""
    import os
    import shutil

    from ibemu.fabric.umad2sim import umad2sim_path

    if os.geteuid() != 0:
        return "not root"
    missing = [t for t in ("opensm", "ibnetdiscover", "ibtracert", "smpquery") if shutil.which(t) is None]
    if umad2sim_path() is None:
        missing.append("libumad2sim.so")
    return f"missing {', '.join(missing)}" if missing else None
