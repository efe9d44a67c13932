#!/usr/bin/env python3
"""RoCE fabric figures on a live k=4 fat-tree: build, routes, RDMA WRITE, reroute.

- build time of the RoCE fabric (namespaces, cables, addresses, neighbours, host guards) and
  the fabric manager's first route install (compute + netlink writes, from its events);
- RDMA WRITE throughput, one RC QP, MTU 4096, 64 KiB messages, server and client in two
  processes (as ``bench_traffic.py`` measures the IB kernel datapath: ~90-100k packets/s),
  3 routers apart (h0 -> h2) and 5 (h0 -> h15); then the same on an IB fat-tree (kernel
  datapath, min-hop LFTs written directly), measured now, on the same machine load;
- reroute: a one-QP WRITE flow h0 -> h15 (4 KiB messages, local ACK timeout 4.096 us x 2^12
  = 16.8 ms); the cable it uses is cut and the phases logged: detect (the manager reads the
  carrier change), routed, programmed (last netlink ack), and the flow's blackout (longest
  gap between frames arriving at h15). Two cables: an uplink (agg -> core, the aggregation
  router has another core: the kernel's local repair suffices) and a downlink (core -> agg of
  the destination pod: the core has no other way down, routers upstream must be told), each
  with the manager rerouting and with the manager only observing (``--no-reroute``).

Run: sudo .venv/bin/python benchmarks/bench_roce.py [--iters N]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import trio

from ibemu.fabric.build import build, teardown
from ibemu.fabric.plan import plan_fabric
from ibemu.fabric.roce_fabric import RoceRun
from ibemu.hca.nic import HcaPort
from ibemu.kernel import ownership, rtnl
from ibemu.testing.static_routes import assign_lids, minhop_lfts
from ibemu.topo import generate
from ibemu.traffic.blackout import analyse
from ibemu.traffic.perftest import PerfOptions, Side, bw_client

CORES = ("core0", "core1", "core2", "core3")


# ------------------------------------------------------------------ throughput, two processes

PortOpener = Callable[[str], HcaPort]


def _server(opener: PortOpener, host: str, opts: PerfOptions, conn: Connection) -> None:
    port = opener(host)

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(port.serve)
            side = Side.create(port, opts)
            conn.send(side.info())
            side.connect(conn.recv())
            conn.send("ready")
            await trio.to_thread.run_sync(conn.recv)  # "done"
            t = os.times()
            conn.send((t.user, t.system, port.rx_frames))
            n.cancel_scope.cancel()

    trio.run(main)


def throughput(opener: PortOpener, src: str, dst: str, iters: int) -> dict[str, float]:
    """One RC QP of 64 KiB WRITEs from ``src`` to ``dst``, the server in a forked process."""
    opts = PerfOptions(test="write_bw", size=65536, iterations=iters, qps=1)
    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_server, args=(opener, dst, opts, child))
    proc.start()
    port = opener(src)

    async def main() -> Any:
        async with trio.open_nursery() as n:
            await n.start(port.serve)
            side = Side.create(port, opts)
            side.connect(parent.recv())
            parent.send(side.info())
            assert parent.recv() == "ready"
            result = await bw_client(side)
            n.cancel_scope.cancel()
            return result

    try:
        r = trio.run(main)
        parent.send("done")
        s_user, s_sys, _ = parent.recv()
    finally:
        proc.join(30)
        port.close()
    pps = r.packets / r.seconds
    return {"pps": pps, "gbps": r.gbps, "retx": r.retransmitted,
            "client_user": r.cpu[0] / r.packets * 1e6, "client_sys": r.cpu[1] / r.packets * 1e6,
            "server_user": s_user / r.packets * 1e6, "server_sys": s_sys / r.packets * 1e6}


def ib_throughput(pairs: list[tuple[str, str, str]], iters: int) -> list[dict[str, float]]:
    """The same on the IB kernel datapath (tc u32 + mirred, min-hop LFTs written directly)."""
    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-roce-ib")
    fabric = build(plan_fabric(topo, state.run_id), state)
    try:
        lids = assign_lids(topo)
        for sw, table in minhop_lfts(topo, lids).items():
            fabric.lfts[sw].apply(table)

        def opener(host: str) -> HcaPort:
            node = fabric.plan.nodes[host]
            return HcaPort.open(node.ns, node.ports[1].ifname, node.ports[1].peer_mac, lids[host])

        return [throughput(opener, src, dst, iters) for src, dst, _ in pairs]
    finally:
        teardown(fabric)


def print_throughput(kind: str, label: str, t: dict[str, float]) -> None:
    print(f"  {kind:4s} {label:18s} {t['pps']:9,.0f}  {t['gbps']:6.2f}  {t['retx']:4.0f}  "
          f"{t['client_user']:6.1f} + {t['client_sys']:4.1f}  {t['server_user']:6.1f} + {t['server_sys']:4.1f}")


# ------------------------------------------------------------------ reroute

def core_tx(run: RoceRun) -> dict[str, int]:
    out = {}
    for core in CORES:
        stats = rtnl.link_stats(run.fab.plan.nodes[core].ns, [f"{core}-{p}" for p in range(1, 5)])
        out[core] = sum(s.tx_packets for s in stats.values())
    return out


def flow(run: RoceRun, seconds: float, cut: tuple[str, str] | None, at_s: float) -> tuple[list[int], int, Any]:
    """A one-QP WRITE flow h0 -> h15 for ``seconds``; ``cut`` = (ns, ifname) set down at ``at_s``."""
    a, b = run.open_port("h0"), run.open_port("h15")
    arrivals: list[int] = []
    b.on_frame.append(arrivals.append)
    t_fault = [0]
    opts = PerfOptions(test="write_bw", size=4096, duration_s=seconds, qps=1, timeout=12, tx_depth=32)

    def fault() -> None:
        time.sleep(at_s)
        assert cut is not None
        t_fault[0] = time.monotonic_ns()
        rtnl.set_up(cut[0], [cut[1]], False)

    async def main() -> Any:
        async with trio.open_nursery() as n:
            await n.start(a.serve)
            await n.start(b.serve)
            sa, sb = Side.create(a, opts), Side.create(b, opts)
            sa.connect(sb.info())
            sb.connect(sa.info())
            if cut is not None:
                n.start_soon(trio.to_thread.run_sync, fault)
            result = await bw_client(sa)
            n.cancel_scope.cancel()
            return result

    try:
        result = trio.run(main)
    except BaseException as exc:  # a QP in error (retries exhausted): the flow never resumed
        result = exc
    finally:
        a.close()
        b.close()
    return arrivals, t_fault[0], result


def reroute_case(run: RoceRun, which: str, manager_rerouting: bool) -> dict[str, Any]:
    before = core_tx(run)
    flow(run, 0.3, None, 0)
    delta = {c: core_tx(run)[c] - before[c] for c in CORES}
    core = max(delta, key=lambda c: delta[c])
    plan = run.fab.plan
    # The far end is set down, so the router that must cope sees carrier loss only.
    if which == "uplink":  # pod 0's aggregation router loses that core (it has another one)
        port = next(pp for pp in plan.nodes[core].ports.values() if pp.peer_node.startswith("agg0_"))
        node, ifname = core, port.ifname
    else:  # the core loses its only way down into pod 3
        port = next(pp for pp in plan.nodes[core].ports.values() if pp.peer_node.startswith("agg3_"))
        node, ifname = port.peer_node, f"{port.peer_node}-{port.peer_port}"
    ns = plan.nodes[node].ns
    try:
        arrivals, t_fault, result = flow(run, 1.5, (ns, ifname), 0.5)
        t_end = time.monotonic_ns()
    finally:
        rtnl.set_up(ns, [ifname], True)
        time.sleep(0.3)
    events = [e for e in run.manager_events() if e.get("t_ns", 0) >= t_fault or e.get("t_detect", 0) >= t_fault]
    rr = next((e for e in events if e["kind"] == "reroute" and e["reason"] == "link_down"), None)
    b = analyse(arrivals, t_fault, until_ns=t_end, window_ns=t_end - t_fault)
    # Frames still in flight may arrive after the cut; a flow that died stopped well before its end.
    alive = bool(arrivals) and arrivals[-1] > t_end - 100_000_000 and not isinstance(result, BaseException)
    ms = lambda t: None if t is None else (t - t_fault) / 1e6  # noqa: E731
    return {"cable": f"{node}:{ifname.rsplit('-', 1)[1]}", "core": core,
            "detect": ms(rr["t_detect"]) if rr else None, "routed": ms(rr["t_routed"]) if rr else None,
            "programmed": ms(rr["t_programmed"]) if rr else None,
            "covered": rr["local_covered"] if rr else None, "blackholed": rr["local_blackholed"] if rr else None,
            "changes": rr["changes"] if rr else None,
            "blackout": None if b.blackout_ns is None or not alive else b.blackout_ns / 1e6, "resumed": alive,
            "silent_after": (arrivals[-1] - t_fault) / 1e6 if arrivals and not alive else None,
            "error": None if not isinstance(result, BaseException) else "QP error: retries exhausted"}


def fmt(v: float | None, spec: str = "8.2f") -> str:
    return format(v, spec) if v is not None else "-".rjust(int(spec.split(".")[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=4000, help="64 KiB WRITEs per throughput run")
    args = ap.parse_args()
    ownership.STATE_DIR = Path(tempfile.mkdtemp(prefix="bench-roce-"))
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-roce")
    t0 = time.perf_counter()
    run = RoceRun.up(generate("fat-tree", k=4), state)
    up_s = time.perf_counter() - t0
    try:
        ph = run.fab.phases_s
        print("RoCE k=4 fat-tree (20 routers, 16 hosts, 48 cables)")
        print(f"  fabric build            {ph['total'] * 1e3:7.0f} ms (substrate {ph['substrate'] * 1e3:.0f} ms, "
              f"addresses/neighbours {ph['ip'] * 1e3:.0f} ms, host guards {ph['guard'] * 1e3:.0f} ms)")
        installed = next(e for e in run.manager_events() if e["kind"] == "routes_programmed")
        computed = next(e for e in run.manager_events() if e["kind"] == "routes_computed")
        print(f"  manager route install   {run.up_event['seconds'] * 1e3:7.1f} ms ({computed['routes']} ECMP routes: "
              f"computed {computed['seconds'] * 1e3:.1f} ms, written {installed['seconds'] * 1e3:.1f} ms "
              f"in {installed['messages']} netlink messages)")
        print(f"  up, manager included    {up_s * 1e3:7.0f} ms")
        print()
        print("RDMA WRITE, 1 RC QP, 64 KiB messages, MTU 4096, two processes (CPU us/packet: user + kernel)")
        print("  kind path               packets/s    Gb/s  retx  client         server")
        pairs = [("h0", "h2", "h0->h2 (3 hops)"), ("h0", "h15", "h0->h15 (5 hops)")]
        for src, dst, label in pairs:
            print_throughput("RoCE", label, throughput(lambda h: run.open_port(h), src, dst, args.iters))
        print()
        print("Reroute under a one-QP WRITE flow h0 -> h15 (ms after the cut)")
        print("  cable              manager     detect   routed  programmed  local ok/blackholed  changes  "
              "blackout  resumed")
        for which in ("uplink", "downlink"):
            for rerouting in (True, False):
                if not rerouting:
                    run.restart_manager(["--no-reroute"])
                r = reroute_case(run, which, rerouting)
                if not rerouting:
                    run.restart_manager([])
                local = f"{r['covered']}/{r['blackholed']}" if r["covered"] is not None else "-"
                print(f"  {which + ' ' + r['cable']:18s} {'reroutes' if rerouting else 'observes':9s} "
                      f"{fmt(r['detect'])} {fmt(r['routed'])} {fmt(r['programmed'], '11.2f')}  {local:>19s}  "
                      f"{r['changes'] if r['changes'] is not None else '-':>7}  {fmt(r['blackout'], '8.1f')}  "
                      + ("yes" if r["resumed"] else f"no: silent from {r['silent_after']:.1f} ms")
                      + (f" ({r['error']})" if r["error"] else ""))
    finally:
        problems = run.down()
        if problems:
            print("teardown:", problems)
    for (_, _, label), t in zip(pairs, ib_throughput(pairs, args.iters), strict=True):
        print_throughput("IB", label, t)


if __name__ == "__main__":
    main()
