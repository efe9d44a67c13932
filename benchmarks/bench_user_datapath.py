#!/usr/bin/env python3
"""User datapath forwarding rate (frame-hops/s, 1 KiB frames, 4 senders, k=4), before and after.

The figure of issue 18: how many frames all the switches of a k=4 fat-tree forward per second
in user space, for both user datapaths:

- IB: the switches' forwarders in the agent host (``fabric/agenthost.py``), min-hop LFTs
  written straight into the switch agents (``ibemu.testing.static_routes``; no SM, every
  cabled switch port Active), the agent host's trio loop in a thread of this process; every
  frame is timed through the link model (``fabric/linkplane.py``, 4x EDR cables), as the IB
  user datapath always does. ``--no-link-model`` measures the forwarding alone (what this
  figure was before the model): the model's work per hop is the difference;
- RoCE: ``python -m ibemu.roce.userpath`` for the 20 routers, routes by the fabric manager,
  no line rate (frames leave as soon as they are queued).

Senders: four hosts (h0 -> h15, h1 -> h14, h2 -> h13, h3 -> h12: every frame crosses five
switches) send prebuilt valid frames (IB: RDMA WRITE with 1 KiB payload and correct ICRC/VCRC;
RoCE: RoCEv2 1 KiB frames over 64 UDP source ports) from their namespaces' raw sockets, paced
at ``--offered`` frames/s each in 1 ms bursts, all four from one small blaster process
(``--blast``): no transport, no agent, so the senders are cheap and not what is measured.
What is counted is what the switches forwarded (IB: the forwarders' ``forwarded``; RoCE: the
routers' ``forwarded``) over the sending window, divided by its length: frame-hops/s. Offer
more than the datapath carries to measure its ceiling; the excess is dropped at the first
switch's socket (its receive buffer) and does not cost the datapath process, but it costs the
kernel CPU time in the blaster (~3 us a dropped frame) that the two CPUs share: the default,
15,000 frames/s a sender, offers 300,000 frame-hops/s, 20% above the target, not more.

"Before" is the same measurement on another commit's ``ibemu`` (``--before REF``, default the
commit before the fast datapath: the tree is exported with ``git archive`` to a temporary
directory and this script runs again with it first on ``PYTHONPATH``). Each figure is a range
over ``--repeat`` runs; the 2 cores are shared, so the load average is printed too, and the CPU
time the forwarding process (all its threads) spent per frame-hop, which depends much less on
what else runs than the rate does. ``--profile DIR`` records the forwarding process with
py-spy during each window (collapsed stacks: what the README's profile findings come from).

Run: sudo .venv/bin/python benchmarks/bench_user_datapath.py [--kind ib|roce|both] [--repeat 3]
     [--seconds 3] [--offered 15000] [--before REF | --no-before] [--no-link-model]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEFORE_REF = "fb28488"
"""The commit before the link model's fast path and the in-memory hand-over between switches
(``be6644b``: the last one with the one-frame-per-recv user datapaths)."""
PAIRS = [("h0", "h15"), ("h1", "h14"), ("h2", "h13"), ("h3", "h12")]
SIZE = 1024
HOPS = 5


def native_status() -> str:
    """Whether this tree's link model runs compiled (``ibemu.native``; IBEMU_NATIVE=0: the sources)."""
    try:
        from ibemu.native import status
    except ImportError:  # (a tree from before the compiled twins)
        return "hot path interpreted"
    return status()


# ------------------------------------------------------------------ the blaster

def blast(spec_path: str) -> None:
    """Child process: send the frames of ``spec`` paced at its rate; print how many went."""
    from ibemu.kernel.packet import open_packet_socket

    spec = json.loads(Path(spec_path).read_text())
    senders = []
    for s in spec["senders"]:
        sock = open_packet_socket(s["ns"], s["ifname"], 0x0003, buffer_bytes=1 << 20)
        sock.setblocking(False)
        senders.append((sock.send, [bytes.fromhex(f) for f in s["frames"]]))
    per_ms = max(1, int(spec["offered"] / 1000))
    sent = failed = 0
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()  # go
    t0 = time.perf_counter()
    end = t0 + spec["seconds"]
    tick = t0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        for send, frames in senders:
            nf = len(frames)
            for i in range(per_ms):
                try:
                    send(frames[(sent + i) % nf])
                except OSError:
                    failed += 1
            sent += per_ms
        tick += 0.001
        delay = tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.05:
            tick = time.perf_counter()  # fell behind: do not burst to catch up
    elapsed = time.perf_counter() - t0
    sys.stdout.write(json.dumps({"sent": sent - failed, "failed": failed, "elapsed": elapsed}) + "\n")
    sys.stdout.flush()


def cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds process ``pid`` has used (all its threads), or its thread ``tid``."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PROFILE: Path | None = None
"""``--profile DIR``: py-spy records the forwarding process during each window (a flame graph)."""


def profiler(pid: int, seconds: float, name: str) -> subprocess.Popen[bytes] | None:
    if PROFILE is None:
        return None
    PROFILE.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():  # (installed outside the venv: on PATH)
        spy = Path(shutil.which("py-spy") or spy)
    out = PROFILE / f"{name}-{int(time.time())}.txt"  # collapsed stacks (flamegraph.pl, speedscope)
    return subprocess.Popen([str(spy), "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "250", "--nonblocking", "-f", "raw",
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_blaster(senders: list[dict[str, Any]], offered: float, seconds: float,
                tmp: Path, profile_pid: int | None = None, name: str = "") -> tuple[dict[str, Any], float, float]:
    """Run the blaster; returns its report and the monotonic start and end of the window."""
    spec = tmp / "blast.json"
    spec.write_text(json.dumps({"senders": senders, "offered": offered, "seconds": seconds}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, __file__, "--blast", str(spec)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    spy = None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("the blaster did not start")
        spy = profiler(profile_pid, seconds, name) if profile_pid else None
        t0 = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        report = json.loads(proc.stdout.readline())
        t1 = time.monotonic()
    finally:
        proc.wait(10)
        if spy is not None:
            spy.wait(30)
    return report, t0, t1


# ------------------------------------------------------------------ IB

LINK_MODEL = True
"""``--no-link-model``: the IB forwarding alone (see ``measure_ib``)."""
HANDOVER = True
"""``--no-handover``: frames between switches (routers) cross their veths (see ``measure_ib``,
``measure_roce``)."""


def measure_ib(seconds: float, offered: float, tmp: Path) -> dict[str, float]:
    import trio

    from ibemu.fabric import agenthost

    if not LINK_MODEL:
        # The IB user datapath always times its frames through the link model
        # (``fabric.linkplane``); to measure the forwarding alone (what this figure was before
        # the model), this process's agent host is made without it. The benchmark only.
        init = agenthost.AgentHost.__init__

        def init_without_model(self: Any, *a: Any, **k: Any) -> None:
            init(self, *a, **k)
            self.physics_on = False

        agenthost.AgentHost.__init__ = init_without_model  # type: ignore[method-assign]

    from ibemu.agents.port import PortState
    from ibemu.fabric.agents import make_agents
    from ibemu.fabric.runtime import FabricRuntime
    from ibemu.kernel import ownership
    from ibemu.testing.static_routes import assign_lids, minhop_lfts
    from ibemu.topo import generate
    from ibemu.wire import fast

    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-user-datapath")
    rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp,
                       mad_sockets=False)
    rt.sysfs = False  # as ``ibemu run`` has it: rewriting 36 trees' counters is not forwarding
    lids = assign_lids(topo)
    lfts = minhop_lfts(topo, lids)
    box: dict[str, Any] = {}
    ready, done = threading.Event(), threading.Event()

    def program(host: Any) -> None:
        for name, table in lfts.items():
            agent = host.nodes[name].agent
            agent.ports[0].lid = lids[name]
            top = max(lids.values())
            blocks: dict[int, bytearray] = {}
            for lid, port in table.items():
                blocks.setdefault(lid // 64, bytearray(agent.lft.get_block(lid // 64)))[lid % 64] = port
            for b, data in blocks.items():
                agent.lft.set_block(b, bytes(data))
            agent.lft.set_top(top)
            for num, p in agent.ports.items():
                if num and p.link_is_up:
                    p.state = PortState.ACTIVE

    def forwarded(host: Any) -> int:
        return sum(int(host.nodes[n].agent.forwarder.stats["forwarded"]) for n in lfts)

    def model_backlog(host: Any) -> tuple[int, int]:
        """Frames waiting in the model's queues (hosts' and switches'), and the arrivals from a
        switch that found no record of their frame (lost or reordered on the way)."""
        links = host.links
        if links is None:
            return 0, 0
        queued = sum(len(q) for n in links.plane.nodes.values() for p in n.ports.values() for q in p.queues)
        return queued, links.plane.unmatched

    def model_counts(host: Any) -> tuple[int, int, int, int]:
        """Frames into the link model, of them played by its fast path, handed over in memory
        between switches (0 for a tree without them), and frames the model let leave."""
        links = host.links
        if links is None:
            return 0, 0, 0, 0
        return (links.plane.frames_in, getattr(links.plane, "fast_hops", 0), getattr(links, "handed", 0), links.sent)

    async def main() -> None:
        stop = trio.Event()
        box["stop"], box["token"] = stop, trio.lowlevel.current_trio_token()
        async with rt.running() as host:
            box["host"] = host
            await trio.sleep(0.5)  # every carrier seen: ports Init
            program(host)
            if not HANDOVER and host.links is not None:
                host.links._deliver = None  # every frame through its veth (the benchmark only)
            ready.set()
            await stop.wait()

    def thread_main() -> None:
        box["tid"] = threading.get_native_id()
        try:
            trio.run(main)
        except BaseException as exc:
            box["error"] = exc
        finally:
            ready.set()
            done.set()

    th = threading.Thread(target=thread_main, daemon=True)
    th.start()
    try:
        if not ready.wait(120) or "error" in box:
            raise SystemExit(f"IB fabric did not come up: {box.get('error')}")
        host, token = box["host"], box["token"]

        def on_loop(fn: Any, *a: Any) -> Any:
            return trio.from_thread.run_sync(fn, *a, trio_token=token)

        senders = []
        for src, dst in PAIRS:
            pp = rt.plan.nodes[src].ports[1]
            eth = fast.ethernet_header(pp.peer_mac, pp.mac)
            frames = [fast.NativeTemplate(slid=lids[src], dlid=lids[dst], destqp=0x100 + q, eth=eth).packet(
                0x0A, q, bytes(SIZE), ext=fast.reth(0, 0, SIZE)).hex() for q in range(4)]
            senders.append({"ns": rt.plan.nodes[src].ns, "ifname": pp.ifname, "frames": frames})
        before = on_loop(forwarded, host)
        m0 = on_loop(model_counts, host)
        c0, f0 = cpu_s(os.getpid()), cpu_s(os.getpid(), box["tid"])
        report, t0, t1 = run_blaster(senders, offered, seconds, tmp, os.getpid(), "ib")
        time.sleep(0.3)
        after = on_loop(forwarded, host)
        c1, f1 = cpu_s(os.getpid()), cpu_s(os.getpid(), box["tid"])
        m1 = on_loop(model_counts, host)
        backlog, unmatched = on_loop(model_backlog, host)
        into = max(1, m1[0] - m0[0])
        return {"hops_per_s": (after - before) / (t1 - t0), "offered_per_s": report["sent"] / (t1 - t0),
                "cpu_us_per_hop": (c1 - c0) * 1e6 / max(1, after - before),
                "loop_us_per_hop": (f1 - f0) * 1e6 / max(1, after - before),
                "fast_share": (m1[1] - m0[1]) / into, "handed_share": (m1[2] - m0[2]) / max(1, m1[3] - m0[3]),
                "left_per_s": (m1[3] - m0[3]) / (t1 - t0), "backlog": backlog, "unmatched": unmatched}
    finally:
        if "stop" in box:
            trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
        done.wait(60)


# ------------------------------------------------------------------ the link model alone

def measure_model(fast: bool | None, frames: int = 20_000, gap_ns: int = 1000, delay_ns: int = 20_000) -> dict[str, float]:
    """``--model-only``: the IB link model (``physics.live.LivePlane``) alone, as the datapath
    drives it, without sockets or forwarders: the four flows of the benchmark (h0 -> h15 ...,
    1 KiB frames, 8 data VLs as the ports start), a frame every ``gap_ns`` of emulated time
    in turn from each sender, each departure towards a switch arriving there ``delay_ns``
    later (a veth's real latency); CPU seconds of this process per departure."""
    import heapq

    from ibemu.physics.link import SWITCH_MODELS
    from ibemu.physics.live import LivePlane
    from ibemu.physics.model import Frame
    from ibemu.physics.plan import build_nodes
    from ibemu.physics.qos import Sl2Vl, VlArb
    from ibemu.testing.static_routes import assign_lids, minhop_lfts
    from ibemu.topo import generate

    topo = generate("fat-tree", k=4)
    nodes = build_nodes(topo, kind="ib", switch=SWITCH_MODELS["ib-edr"])
    plane = LivePlane(nodes, fast=fast) if fast is not None else LivePlane(nodes)  # None: a tree without it
    for name, node in nodes.items():
        for port in node.ports:
            ins = list(node.ports) if node.switch else [0]
            plane.set_qos(name, port, data_vls=8, vlarb=VlArb.default(8),
                          sl2vl={i: Sl2Vl.default(8) for i in ins if i != port})
    lids = assign_lids(topo)
    lfts = minhop_lfts(topo, lids)
    attach = {p.peer[0]: (name, num) for name, node in nodes.items() if node.switch
              for num, p in node.ports.items() if p.peer and not nodes[p.peer[0]].switch}
    pending: list[tuple[int, int, str, int, int, int]] = []
    left = seq = t = 0
    c0 = time.process_time()
    for i in range(frames):
        t += gap_ns
        while pending and pending[0][0] <= t:
            pt, _, sw, inp, key, dl = heapq.heappop(pending)
            plane.arrive(sw, inp, Frame(SIZE + 30, dst=lfts[sw][dl], flow=key, meta=(key, dl)), pt)
        src, dst = PAIRS[i % len(PAIRS)]
        sw, inp = attach[src]
        plane.arrive(sw, inp, Frame(SIZE + 30, dst=lfts[sw][lids[dst]], flow=i, meta=(i, lids[dst])), t)
        for d in plane.run(t):
            left += 1
            peer = nodes[d.switch].ports[d.port].peer
            if peer and nodes[peer[0]].switch:
                seq += 1
                heapq.heappush(pending, (t + delay_ns, seq, peer[0], peer[1], *d.frame.meta))
    return {"cpu_us_per_departure": (time.process_time() - c0) * 1e6 / max(1, left), "departures": left,
            "fast_share": getattr(plane, "fast_hops", 0) / max(1, plane.frames_in), "load": os.getloadavg()[0]}


def model_only(args: argparse.Namespace) -> None:
    if args.json:  # (the 'before' tree's runs)
        print(json.dumps([measure_model(None) for _ in range(args.repeat)]))
        return
    rows: dict[str, list[dict[str, float]]] = {}
    if not args.no_before:
        with tempfile.TemporaryDirectory(prefix="bench-udp-before-") as tmp:
            tree = before_tree(args.before, Path(tmp))
            out = subprocess.run([sys.executable, __file__, "--model-only", "--json", "--repeat", str(args.repeat)],
                                 env={**os.environ, "PYTHONPATH": str(tree)}, check=True, capture_output=True,
                                 text=True, cwd=tmp).stdout
            rows[f"before ({args.before})"] = json.loads(out.strip().splitlines()[-1])
    rows["event loop only"] = [measure_model(False) for _ in range(args.repeat)]
    rows["fast path"] = [measure_model(True) for _ in range(args.repeat)]
    print(f"The IB link model alone (physics.live), the benchmark's four flows of 1 KiB frames over 5 switches, "
          f"8 data VLs, {args.repeat} runs each (CPU time of this process: the model and this driver); "
          f"this tree: {native_status()}")
    for name, r in rows.items():
        loads = ", ".join(f"{x['load']:.1f}" for x in r)
        print(f"  {name:20} CPU us per departure {fmt(r, 'cpu_us_per_departure', 1):>12}"
              f"   fast path {fmt(r, 'fast_share', 2)} of the frames   load avg {loads}")


# ------------------------------------------------------------------ RoCE

def measure_roce(seconds: float, offered: float, tmp: Path) -> dict[str, float]:
    from ibemu.fabric.roce_fabric import RoceRun
    from ibemu.kernel import ownership
    from ibemu.roce.queues import QueueConfig
    from ibemu.topo import generate
    from ibemu.wire import fast

    state = ownership.RunState(ownership.new_run_id(), scenario="bench-user-datapath")
    state.save()
    if not HANDOVER:  # every frame through its veth: the datapath's "handover" key (the benchmark only)
        from ibemu.fabric.roce_fabric import RoceFabric
        config = RoceFabric.userpath_config
        RoceFabric.userpath_config = lambda self: {**config(self), "handover": False}  # type: ignore[method-assign]
    run = RoceRun.up(generate("fat-tree", k=4), state, queues=QueueConfig())
    try:
        senders = []
        for src, dst in PAIRS:
            port = run.open_port(src)
            lid = run.fab.host_port(dst).lid
            frames = [port.codec.encapsulate(fast.NativeTemplate(slid=port.hca.lid, dlid=lid, destqp=0x100 + q)
                                             .packet(0x04, q, bytes(SIZE))) for q in range(64)]
            hp = run.fab.host_port(src)
            senders.append({"ns": hp.ns, "ifname": hp.ifname, "frames": [f.hex() for f in frames if f is not None]})
            port.close()

        def counters(after_ns: int) -> dict[str, Any]:
            deadline = time.monotonic() + 5
            while True:
                c = run.live_counters()
                if c.get("t_ns", 0) > after_ns or time.monotonic() > deadline:
                    return c.get("totals", {})
                time.sleep(0.05)

        from ibemu import clock
        before = counters(clock.now_ns())
        pid = run.userpath.pid if run.userpath else os.getpid()
        c0 = cpu_s(pid)
        report, t0, t1 = run_blaster(senders, offered, seconds, tmp, run.userpath.pid if run.userpath else None, "roce")
        time.sleep(0.3)
        c1 = cpu_s(pid)
        after = counters(clock.now_ns())
        hops = after.get("forwarded", 0) - before.get("forwarded", 0)
        return {"hops_per_s": hops / (t1 - t0), "offered_per_s": report["sent"] / (t1 - t0),
                "cpu_us_per_hop": (c1 - c0) * 1e6 / max(1, hops)}
    finally:
        run.down()


# ------------------------------------------------------------------ driver

def measure(kind: str, args: argparse.Namespace) -> list[dict[str, float]]:
    from ibemu.kernel import ownership

    out = []
    with tempfile.TemporaryDirectory(prefix="bench-udp-") as tmp:
        ownership.STATE_DIR = Path(tmp) / "state"
        for i in range(args.repeat):
            d = Path(tmp) / f"{kind}{i}"
            d.mkdir()
            fn = measure_ib if kind == "ib" else measure_roce
            r = fn(args.seconds, args.offered, d)
            r["load"] = os.getloadavg()[0]
            out.append(r)
    return out


def before_tree(ref: str, tmp: Path) -> Path:
    """``ref``'s tree, exported to ``tmp``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "ibemu"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    return tmp


def measure_before(kind: str, args: argparse.Namespace) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="bench-udp-before-") as tmp:
        tree = before_tree(args.before, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        argv = [sys.executable, __file__, "--json", "--no-before", "--kind", kind, "--repeat", str(args.repeat),
                "--seconds", str(args.seconds), "--offered", str(args.offered)]
        if args.no_link_model:
            argv.append("--no-link-model")
        if args.no_handover:
            argv.append("--no-handover")
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, cwd=tmp).stdout
        return list(json.loads(out.strip().splitlines()[-1])[kind])


def fmt(rows: list[dict[str, float]], key: str = "hops_per_s", digits: int = 0) -> str:
    if not rows:
        return "-"
    v = sorted(r[key] for r in rows if key in r)
    if not v:
        return "-"
    return f"{v[0]:,.{digits}f}-{v[-1]:,.{digits}f}" if len(v) > 1 else f"{v[0]:,.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("ib", "roce", "both"), default="both")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--offered", type=float, default=15000.0,
                    help="frames/s per sender (x4 senders, x5 hops; default: 300,000 hops/s offered)")
    ap.add_argument("--before", default=BEFORE_REF, help="the commit to measure as 'before'")
    ap.add_argument("--no-before", action="store_true", help="measure this tree only")
    ap.add_argument("--json", action="store_true", help="print the runs as JSON (used for 'before')")
    ap.add_argument("--profile", type=Path, help="py-spy flame graphs of the forwarding process into this folder")
    ap.add_argument("--no-link-model", action="store_true",
                    help="IB: forward without the link model (the forwarding alone; the datapath always has it)")
    ap.add_argument("--no-handover", action="store_true",
                    help="frames between switches (IB) or routers (RoCE) cross their veths (no hand-over in memory)")
    ap.add_argument("--model-only", action="store_true",
                    help="IB: the link model alone (no fabric), with its fast path and without")
    ap.add_argument("--blast", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global PROFILE, LINK_MODEL, HANDOVER
    PROFILE = args.profile
    LINK_MODEL = not args.no_link_model
    HANDOVER = not args.no_handover
    if args.blast:
        blast(args.blast)
        return 0
    if args.model_only:
        model_only(args)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (namespaces, veth, packet sockets): sudo")
    logging.basicConfig(level=logging.WARNING)
    kinds = ["ib", "roce"] if args.kind == "both" else [args.kind]
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for kind in kinds:
        results[kind] = {"after": measure(kind, args)}
        if not args.no_before:
            results[kind]["before"] = measure_before(kind, args)
    if args.json:
        print(json.dumps({k: v["after"] for k, v in results.items()}))
        return 0
    print(f"User datapath forwarding rate, k=4 fat-tree, 1 KiB frames, 4 senders x 5 hops, offered "
          f"{args.offered * 4:,.0f} frames/s ({args.offered * 4 * HOPS:,.0f} frame-hops/s), "
          f"{args.repeat} runs of {args.seconds:g} s, {os.cpu_count()} CPUs")
    print(f"  {'datapath':8} {'before (' + args.before + ')':>22} {'after':>18}   "
          f"{'CPU us/hop before':>18} {'after':>10}   load avg (before; after)")
    for kind in kinds:
        r = results[kind]
        b, a = r.get("before", []), r["after"]
        loads = ", ".join(f"{x['load']:.1f}" for x in b) + "; " + ", ".join(f"{x['load']:.1f}" for x in a)
        print(f"  {kind:8} {fmt(b):>22} {fmt(a):>18}   {fmt(b, 'cpu_us_per_hop', 1):>18} "
              f"{fmt(a, 'cpu_us_per_hop', 1):>10}   {loads}")
    for kind in kinds:
        a = results[kind]["after"]
        if any("fast_share" in x for x in a):
            print(f"  {kind} after: link model's fast path {fmt(a, 'fast_share', 2)} of the frames into the model, "
                  f"handed over in memory {fmt(a, 'handed_share', 2)} of the frames that left")
            b = results[kind].get("before", [])
            print(f"  {kind} frames the link model let leave switch ports, per second: before {fmt(b, 'left_per_s')}, "
                  f"after {fmt(a, 'left_per_s')}; left queued in the model at the end: before {fmt(b, 'backlog')}, "
                  f"after {fmt(a, 'backlog')}; arrivals without a record: before {fmt(b, 'unmatched')}, "
                  f"after {fmt(a, 'unmatched')}")
        if any("loop_us_per_hop" in x for x in a):
            b = results[kind].get("before", [])
            print(f"  {kind} CPU us per frame-hop of the forwarding thread alone (the agent host's trio loop): "
                  f"before {fmt(b, 'loop_us_per_hop', 1)}, after {fmt(a, 'loop_us_per_hop', 1)}")
    print(f"  this tree: {native_status()}; before: the commit's sources as they are (not built)")
    print("  frame-hops/s: frames forwarded by all switches per second (target >= 250,000 each);")
    print("  CPU us/hop: CPU time of the forwarding process (all its threads) per frame-hop")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
