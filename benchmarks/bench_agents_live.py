#!/usr/bin/env python3
"""Live agents (root): fabric up with every agent answering, memory, DR SMP round trips.

Targets (issue 4): k=8 fat-tree up (namespaces, links, agents answering) <= 3 s, teardown
<= 2 s, agents <= 2 GB RSS; k=16 runs on this machine; a DR SMP through 3 switches <= 1 ms
median with 64 SMPs in flight. SMPs go through h0's MAD socket exactly as an SM's would.
Run: sudo .venv/bin/python benchmarks/bench_agents_live.py [--k 8] [--smps 5000] [--k16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import trio
from scapy.packet import raw

from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.hca.umad_client import UmadClient
from ibemu.topo import Topology, generate
from ibemu.wire.mad import DirectedRouteSMP, Method, NodeInfo
from ibemu.wire.umad import SimRequest, set_mad_tid


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def up_path(topo: Topology, host: str, hops: int) -> list[int]:
    """Directed route from ``host`` going up ``hops`` switches (ports from the model)."""
    path = [1]
    node = topo.peer(host, 1)
    assert node is not None
    current = node.node
    for _ in range(hops - 1):
        level = topo.node(current).level or 0
        port, far = next((p, e) for p, e in topo.neighbors(current) if (topo.node(e.node).level or 0) > level)
        path.append(port)
        current = far.node
    return path


async def dr_round_trips(client: UmadClient, path: list[int], count: int, window: int) -> list[float]:
    mad = raw(DirectedRouteSMP(method=Method.GET, hop_count=len(path), initial_path=path, data=NodeInfo()))
    sent: dict[int, int] = {}
    rtts: list[float] = []
    next_tid = 1

    def send_one() -> None:
        nonlocal next_tid
        tid = next_tid
        next_tid += 1
        sent[tid] = time.perf_counter_ns()
        client.send(SimRequest(dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, mad=set_mad_tid(mad, tid)))

    for _ in range(min(window, count)):
        send_one()
    with trio.fail_after(120):
        while len(rtts) < count:
            resp = await client.recv()
            tid = int.from_bytes(resp.mad[8:16], "big") & 0xFFFFFFFF
            t = sent.pop(tid, None)
            if t is None or resp.status:
                continue
            rtts.append((time.perf_counter_ns() - t) / 1e6)
            if next_tid <= count:
                send_one()
    return rtts


async def run(k: int, smps: int, window: int) -> None:
    topo = generate("fat-tree", k=k)
    rss0 = rss_mb()
    rt = FabricRuntime(topo, make_agents=make_agents)
    t0 = time.perf_counter()
    async with rt.running() as host:
        client = await UmadClient.connect(host.nodes["h0"].plan.ns)
        path = up_path(topo, "h0", 3)
        first = await dr_round_trips(client, path, 1, 1)
        t_up = time.perf_counter() - t0
        rss = rss_mb()
        print(f"k={k} fat-tree ({len(topo.nodes)} nodes, {len(topo.links)} links): up with agents and "
              f"MAD sockets answering in {t_up:.2f} s (first DR SMP {first[0]:.2f} ms)")
        print("  phases: " + ", ".join(f"{n} {v * 1000:.0f} ms" for n, v in rt.timings_s.items()))
        print(f"  process RSS {rss:.0f} MB ({rss - rss0:.0f} MB for the fabric's agents and sockets)")
        if smps:
            for w in (1, window):
                rtts = await dr_round_trips(client, path, smps, w)
                q = statistics.quantiles(rtts, n=100)
                print(f"  DR SMP NodeInfo through 3 switches ({smps} SMPs, {w} in flight): median "
                      f"{statistics.median(rtts):.3f} ms, p99 {q[98]:.3f} ms, "
                      f"{smps / (sum(rtts) / 1000 / w):,.0f} SMPs/s")
        client.close()
        t_down = time.perf_counter()
    print(f"  teardown {time.perf_counter() - t_down:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--smps", type=int, default=5000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--k16", action="store_true", help="also bring up a k=16 fat-tree (1,344 nodes)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, veth, tc): sudo")
    trio.run(run, args.k, args.smps, args.window)
    if args.k16:
        trio.run(run, 16, 1000, args.window)


if __name__ == "__main__":
    main()
