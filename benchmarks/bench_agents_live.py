#!/usr/bin/env python3
"""Live agents (root): fabric up with every agent answering, memory, DR SMP round trips.

Targets (issue 4): k=8 fat-tree up (namespaces, links, agents answering) <= 3 s, teardown
<= 2 s, agents <= 2 GB RSS; k=16 runs on this machine; a DR SMP through 3 switches <= 1 ms
median with 64 SMPs in flight (issue 17: <= 0.5 ms, >= 100,000 SMPs/s). SMPs go through h0's
MAD socket exactly as an SM's would, then from h0's own packet socket as ibemu's SM sends them
(``sm.directport``: a process of its own, ``sendmmsg``), with and without the far end of h0's
cable steered to the other CPU (``kernel.steer``, as ibemu's SM does when it has a CPU to itself). Each management path gets a fabric of its own and the
figures are printed side by side: ``kernel`` (the eBPF SMA answers and relays,
``ibemu.kernel.sma``), ``python`` (the switch agents answer, the eBPF DR relay relays:
IBEMU_KERNEL_SMA=0), ``python-only`` (no eBPF at all: IBEMU_DR_RELAY=0).
Run: sudo .venv/bin/python benchmarks/bench_agents_live.py [--k 8] [--smps 5000] [--k16]
     [--paths kernel python]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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


def raw_dr_round_trips(ns: str, ifname: str, peer_mac: bytes, path: list[int], count: int,
                       window: int) -> tuple[list[float], float]:
    """DR SMPs from h0's own packet socket, as ``sm.directport`` sends them (the HCA's framing,
    TIDs tagged ``sockfilter.SM_OWN_TID_TAG``, each run of requests in one ``sendmmsg``),
    ``window`` in flight, by a client that does nothing else: frames built before the clock
    starts, responses read in batches (``recvmmsg``). What the device firmware and the
    kernel's cables sustain, without the SM's Python. Blocking: (round trips in ms, SMPs per
    second). Run in a process of its own (``own_port_client``), as an SM is."""
    import select

    from ibemu.agents import dr
    from ibemu.kernel import mmsg, sockfilter
    from ibemu.kernel.packet import ETH_P_IB, open_packet_socket
    from ibemu.kernel.ring import RxBatcher
    from ibemu.wire.madpacket import MAD_OFFSET, QP0_QKEY, frame_mad

    mad = bytearray(raw(DirectedRouteSMP(method=Method.GET, hop_count=len(path), initial_path=path, data=NodeInfo())))
    sock = open_packet_socket(ns, ifname, ETH_P_IB, bpf=sockfilter.SM_REPLIES)
    eth = peer_mac + bytes(sock.getsockname()[4]) + ETH_P_IB.to_bytes(2, "big")
    tag = sockfilter.SM_OWN_TID_TAG << 48
    frames = []
    for i in range(count):
        buf = bytearray(mad)
        buf[8:16] = (tag | i).to_bytes(8, "big")
        dr.on_originate(buf, 0, path[0])
        frames.append(eth + frame_mad(buf, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=QP0_QKEY, vl=15,
                                      psn=i & 0xFFFFFF))
    tid_at = 14 + MAD_OFFSET + 12
    rx = RxBatcher()
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    sent = [0] * count
    rtts: list[float] = []
    nxt = inflight = 0
    clock_ns = time.perf_counter_ns
    t0 = clock_ns()
    deadline = t0 + 60_000_000_000
    try:
        while len(rtts) < count and clock_ns() < deadline:
            room = min(window - inflight, count - nxt)
            if room > 0:
                now = clock_ns()
                try:
                    n = mmsg.send_many(sock, frames[nxt:nxt + room])
                except BlockingIOError:
                    n = 0
                for i in range(nxt, nxt + n):
                    sent[i] = now
                nxt += n
                inflight += n
            got = rx.recv_batch(sock)
            if not got:
                poller.poll(100)
                continue
            now = clock_ns()
            for frame in got:
                i = int.from_bytes(frame[tid_at:tid_at + 4], "big")
                if i < count and sent[i]:
                    rtts.append((now - sent[i]) / 1e6)
                    sent[i] = 0
                    inflight -= 1
    finally:
        sock.close()
    return rtts, len(rtts) / ((clock_ns() - t0) / 1e9)


def own_port_client(spec: str) -> None:
    """The child process of ``own_port_round_trips``: pinned to its CPU, runs
    ``raw_dr_round_trips`` and prints the result as JSON on stdout."""
    a = json.loads(spec)
    os.sched_setaffinity(0, {a["cpu"]})
    rtts, rate = raw_dr_round_trips(a["ns"], a["ifname"], bytes.fromhex(a["peer_mac"]), a["path"], a["count"],
                                    a["window"])
    sys.stdout.write(json.dumps({"rtts": rtts, "rate": rate}))


async def own_port_round_trips(ns: str, ifname: str, peer_mac: bytes, path: list[int], count: int, window: int,
                               steered: bool) -> tuple[list[float], float, str]:
    """``raw_dr_round_trips`` in a process of its own on one CPU, as ibemu's SM is a process of
    its own (a thread of this one would share the GIL with the agents of the fabric). With
    ``steered``, the far end of h0's cable receives on the other CPUs (RPS, ``kernel.steer``),
    as ibemu's SM steers its cable when it has CPUs to itself: the SM's ``send`` returns while
    another CPU carries the SMP through the switches. Returns (round trips, rate, how)."""
    from ibemu.kernel import steer

    cpu = min(os.sched_getaffinity(0))  # the fabric's runtime may have pinned this thread: the machine's others
    others = steer.other_cpus([cpu])
    how = f"client on CPU {cpu}"
    where = peer = None
    if steered:
        if not others:
            return [], 0.0, "one CPU: nothing to steer to"
        where, peer, _ = await trio.to_thread.run_sync(steer.steer_peer, ns, ifname, others)
        how += f", far end steered to CPU {','.join(map(str, others))}"
    spec = json.dumps({"ns": ns, "ifname": ifname, "peer_mac": peer_mac.hex(), "path": path, "count": count,
                       "window": window, "cpu": cpu})
    try:
        done = await trio.run_process([sys.executable, os.path.abspath(__file__), "--own-port-client", spec],
                                      capture_stdout=True)
    finally:
        if peer is not None:
            await trio.to_thread.run_sync(steer.set_rps, where, peer, [])
    out = json.loads(done.stdout)
    return out["rtts"], out["rate"], how


PATH_ENV = {"kernel": {}, "python": {"IBEMU_KERNEL_SMA": "0"},
            "python-only": {"IBEMU_KERNEL_SMA": "0", "IBEMU_DR_RELAY": "0"}}
RESULTS: dict[str, dict[int, tuple[float, float, float]]] = {}
"""path -> SMPs in flight -> (median ms, p99 ms, SMPs/s)"""


async def run(k: int, smps: int, window: int, path_name: str = "kernel") -> None:
    for var in ("IBEMU_KERNEL_SMA", "IBEMU_DR_RELAY"):
        os.environ.pop(var, None)
    os.environ.update(PATH_ENV[path_name])
    print(f"[{path_name} path]")
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
        if path_name == "kernel" and getattr(host, "kernel_sma", None) is None:
            print("  (the kernel SMA did not load: these are the Python agents' figures)")
        if smps:
            for w in (1, window):
                rtts = await dr_round_trips(client, path, smps, w)
                q = statistics.quantiles(rtts, n=100)
                rate = smps / (sum(rtts) / 1000 / w)
                RESULTS.setdefault(path_name, {})[w] = (statistics.median(rtts), q[98], rate)
                print(f"  DR SMP NodeInfo through 3 switches ({smps} SMPs, {w} in flight): median "
                      f"{statistics.median(rtts):.3f} ms, p99 {q[98]:.3f} ms, {rate:,.0f} SMPs/s")
        if smps and path_name == "kernel":
            pp = host.nodes["h0"].plan.ports[1]
            for w, steered in ((1, False), (window, False), (window, True)):
                rtts, rate, how = await own_port_round_trips(
                    host.nodes["h0"].plan.ns, pp.ifname, pp.peer_mac, path, smps * 4, w, steered)
                if len(rtts) < 100:
                    print(f"  own packet socket, {w} in flight ({how}): only {len(rtts)} answers")
                    continue
                q = statistics.quantiles(rtts, n=100)
                name = "kernel, own port" + (", steered" if steered else "")
                RESULTS.setdefault(name, {})[w] = (statistics.median(rtts), q[98], rate)
                print(f"  DR SMP NodeInfo through 3 switches from h0's own packet socket ({len(rtts)} SMPs, "
                      f"{w} in flight, a batched client process, {how}): median {statistics.median(rtts):.3f} ms, "
                      f"p99 {q[98]:.3f} ms, {rate:,.0f} SMPs/s")
        client.close()
        t_down = time.perf_counter()
    print(f"  teardown {time.perf_counter() - t_down:.2f} s")


def kernel_cost(repeat: int = 3000) -> None:
    """What one SMP costs the kernel SMA itself (BPF_PROG_TEST_RUN on a switch of 36 ports,
    no fabric): a NodeInfo answered at the last hop, an LFT Set, a relay, one handed up."""
    from ibemu.agents.switch import SwitchAgent
    from ibemu.kernel import bpf, lft_map, sma
    from ibemu.kernel.commands import KernelError
    from ibemu.wire import madcodec as mb
    from ibemu.wire.madpacket import frame_mad

    try:
        k = sma.KernelSma(lft_slots=1, attr_entries=4096)
    except (OSError, KernelError) as exc:
        print(f"kernel SMA unavailable: {exc}")
        return
    fwd = lft_map.LftProgram({})
    sw = SwitchAgent(node_guid=0x100, num_ports=36, link_up=[True] * 36)
    sw.lft.bind(k.lft_view(0))
    k.add_device(1, is_switch=True, num_ports=36, lft_slot=0, lft_blocks=sw.lft.blocks, fwd_map_fd=fwd.blocks.fd)
    for p in range(1, 37):
        k.add_port(1, p, 1, bytes([2, 0, 0, 0, 1, p]), bytes([6, 0, 0, 0, 1, p]), up=True)
    k.publish(1, sw.sma_images())
    eth = bytes([2, 0, 0, 0, 1, 3, 6, 0, 0, 0, 1, 3, 0x88, 0xB5])

    def dr(method: int, attr: int, mod: int, path: list[int], hp: int, data: bytes = b"") -> bytes:
        mad = bytearray(mb.dr_smp(method, attr, path=path, tid=1, modifier=mod))
        mad[6] = hp
        mad[64:64 + len(data)] = data
        return eth + frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15)

    cases = {"NodeInfo Get answered": dr(1, 0x11, 0, [1, 2, 3], 3),
             "LFT Set answered": dr(2, 0x19, 1, [1, 2, 3], 3, bytes(range(64))),
             "relayed (intermediate hop)": dr(1, 0x11, 0, [1, 2, 3], 1),
             "handed up (PortInfo Set)": dr(2, 0x15, 1, [1, 2, 3], 3)}
    for name, frame in cases.items():
        # one run per call: a run rewrites the frame (a repeat would see the response)
        verdict = bpf.test_run(k.prog_fd, frame, 1)[0]
        ns = statistics.median(bpf.test_run(k.prog_fd, frame, 1)[2] for _ in range(repeat))
        what = "redirected" if verdict == bpf.TC_ACT_REDIRECT else "to the agent"
        print(f"  kernel SMA, {name} ({what}): {ns / 1000:.2f} us per SMP "
              f"({1e9 / max(ns, 1):,.0f} SMPs/s per core)")
    fwd.close()
    k.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--smps", type=int, default=5000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--k16", action="store_true", help="also bring up a k=16 fat-tree (1,344 nodes)")
    ap.add_argument("--paths", nargs="+", choices=sorted(PATH_ENV), default=["kernel", "python"],
                    help="management paths to measure, each on a fabric of its own")
    ap.add_argument("--own-port-client", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.own_port_client:
        own_port_client(args.own_port_client)
        return
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, veth, tc): sudo")
    kernel_cost()
    for name in args.paths:
        trio.run(run, args.k, args.smps, args.window, name)
    if len(RESULTS) > 1:
        names = [n for n in RESULTS if n in args.paths or n not in PATH_ENV]
        print(f"DR SMP NodeInfo through 3 switches, k={args.k}: " + " | ".join(names))
        for w in (1, args.window):
            cells = []
            for name in names:
                got = RESULTS.get(name, {}).get(w)
                if got is None:
                    cells.append("not measured")
                    continue
                med, p99, rate = got
                cells.append(f"median {med:.3f} ms, p99 {p99:.3f} ms, {rate:,.0f}/s")
            print(f"  {w:>3} in flight: " + " | ".join(cells))
    if args.k16:
        trio.run(run, 16, 1000, args.window, args.paths[0])


if __name__ == "__main__":
    main()
