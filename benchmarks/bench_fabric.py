#!/usr/bin/env python3
"""Fabric figures (root): build/teardown time, LFT update cost, kernel-datapath forwarding rate.

Targets (issue 4): k=8 fat-tree up <= 3 s, teardown <= 2 s; LFT update of 64 entries <= 5 ms;
>= 1,000,000 frame-hops/s aggregate across the fabric with several senders, 100% delivery.
The forwarding test programs min-hop LFTs directly (ibemu.testing.static_routes), no SM.
Run: sudo .venv/bin/python benchmarks/bench_fabric.py [--k 8] [--seconds 3] [--senders 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from ibemu.fabric.build import build, teardown
from ibemu.fabric.plan import plan_fabric
from ibemu.kernel import ownership
from ibemu.kernel.packet import open_packet_socket
from ibemu.testing.static_routes import assign_lids, minhop_lfts, path_switches
from ibemu.topo import generate
from ibemu.wire import fast


def bench_build(k: int) -> tuple[float, float, dict[str, float]]:
    topo = generate("fat-tree", k=k)
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-build")
    t0 = time.perf_counter()
    fabric = build(plan_fabric(topo, state.run_id), state)
    t1 = time.perf_counter()
    problems = teardown(fabric)
    t2 = time.perf_counter()
    if problems:
        raise SystemExit(f"teardown problems: {problems}")
    return t1 - t0, t2 - t1, fabric.phases_s


def _sender(sock_fd: int, frame: bytes, seconds: float, wfd: int) -> None:
    import socket

    sock = socket.socket(fileno=sock_fd)
    sock.setblocking(True)
    send = sock.send
    n = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(256):
            send(frame)
        n += 256
    os.write(wfd, str(n).encode())
    os._exit(0)


def bench_forwarding(seconds: float, senders: int, size: int) -> dict[str, float]:
    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-forwarding")
    plan = plan_fabric(topo, state.run_id)
    fabric = build(plan, state)
    try:
        lids = assign_lids(topo)
        lfts = minhop_lfts(topo, lids)
        t0 = time.perf_counter()
        for sw, table in lfts.items():
            fabric.lfts[sw].apply(table)
        program_s = time.perf_counter() - t0
        # 64-entry LFT update cost: rewrite one block of 64 LIDs back and forth on one switch.
        sw0 = fabric.lfts["edge0_0"]
        ports = sorted(sw0.ifnames)
        costs = []
        for i in range(100):
            changes = {lid: ports[(lid + i) % len(ports)] for lid in range(100, 164)}
            t = time.perf_counter()
            sw0.apply(changes)
            costs.append(time.perf_counter() - t)
        sw0.apply({lid: 0xFF for lid in range(100, 164)})
        hosts = [n.name for n in topo.cas()]
        pairs = [(hosts[i], hosts[-1 - i]) for i in range(senders)]  # cross-pod: 5 switch hops
        children = []
        for src, dst in pairs:
            sock = open_packet_socket(plan.nodes[src].ns, plan.nodes[src].ports[1].ifname)
            pp = plan.nodes[src].ports[1]
            eth = fast.ethernet_header(pp.peer_mac, pp.mac)
            frame = fast.NativeTemplate(slid=lids[src], dlid=lids[dst], destqp=0x11, eth=eth).packet(
                0x0A, 0, b"\0" * size, ext=fast.reth(0, 0, size))
            rfd, wfd = os.pipe()
            before = fabric.links.stats(plan.nodes[dst].ns, plan.nodes[dst].ports[1].ifname)["rx_packets"]
            pid = os.fork()
            if pid == 0:
                _sender(sock.fileno(), frame, seconds, wfd)
            sock.close()
            os.close(wfd)
            hops = len(path_switches(topo, lfts, src, lids[dst]))
            children.append((pid, rfd, dst, before, hops))
        sent = delivered = frame_hops = 0
        for pid, rfd, dst, before, hops in children:
            os.waitpid(pid, 0)
            n = int(os.read(rfd, 64) or b"0")
            os.close(rfd)
            time.sleep(0.05)
            got = fabric.links.stats(plan.nodes[dst].ns, plan.nodes[dst].ports[1].ifname)["rx_packets"] - before
            sent += n
            delivered += got
            frame_hops += got * hops
        return {
            "program_s": program_s, "lft64_ms_median": statistics.median(costs) * 1e3,
            "lft64_ms_p99": sorted(costs)[98] * 1e3, "sent": sent, "delivered": delivered,
            "frame_hops_per_s": frame_hops / seconds, "frames_per_s": delivered / seconds,
            "lft_entries": sum(len(t) for t in lfts.values()),
        }
    finally:
        teardown(fabric)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--size", type=int, default=256, help="payload bytes per frame")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, veth, tc): sudo")
    up, down, phases = bench_build(args.k)
    nodes = {4: 36, 8: 208, 16: 1344}.get(args.k, "?")
    print(f"k={args.k} fat-tree ({nodes} nodes): kernel objects up {up:.2f} s (target <= 3 s), "
          f"teardown {down:.2f} s (target <= 2 s)")
    print("  phases: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in phases.items()))
    f = bench_forwarding(args.seconds, args.senders, args.size)
    print(f"k=4 min-hop LFTs: {f['lft_entries']:.0f} entries programmed in {f['program_s'] * 1e3:.1f} ms")
    print(f"LFT update of 64 entries: median {f['lft64_ms_median']:.2f} ms, p99 {f['lft64_ms_p99']:.2f} ms "
          f"(target <= 5 ms)")
    pct = 100.0 * f["delivered"] / f["sent"] if f["sent"] else 0.0
    print(f"kernel datapath, {args.senders} senders x 5 switch hops, {args.size} B payload: "
          f"{f['frame_hops_per_s']:,.0f} frame-hops/s (target >= 1,000,000), "
          f"{f['frames_per_s']:,.0f} frames/s delivered, delivery {pct:.2f}% "
          f"({f['delivered']:,}/{f['sent']:,})")


if __name__ == "__main__":
    main()
