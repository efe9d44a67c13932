#!/usr/bin/env python3
"""Local failover in the switches against SM-only recovery, on the same live fabric (issue 20).

A k=4 fat-tree on the kernel datapath (agents, MAD sockets, the kernel SMA), ibemu's SM on
h0 with ``ftree_ar`` (LFTs plus alternate ports per LID, written with the AlternatePorts
vendor attribute) or ``ftree`` (LFTs only). Per run: a one-way stream of raw SEND frames
h1 -> h15 (``fabric.probe.send_and_count``, about 64 frames a ms), and 30 ms into it the
edge switch's up-port that carries h15's traffic is cut. Printed per engine, over ``--runs``
fresh fabrics (min / median / max):

- ``carrier -> failover``: the agent host saw the carrier go and marked the port down in the
  kernel; from then on the classifier forwards on the alternate (``local_failover`` event);
- ``cut -> failover``: from the cut's netlink request to that moment;
- ``cut -> SM routed`` and ``cut -> SM programmed``: the SM's trap-driven reroute;
- frames lost of the stream (one-way: no retransmission hides a loss).

With ``--cut far`` the stream runs h15 -> h1 and the cut is the last cable before h1's edge
switch, at the edge's end: the aggregation switch above it has no alternate down, so under
``ftree_ar`` its fault notice has to reach the cores and, through them, the aggregation and
edge switches of the other pods (``ibemu.agents.switch``, fault notices). Printed then:
``cut -> first notice move`` and ``cut -> last notice move`` (the first and last switch that
moved the LIDs on a neighbour's notice), the SM's reroute and the frames lost.

Every figure is ibemu's own time on this machine (the carrier event reaching the agent host's
thread, the agents' Python relaying each notice), real time at dilation 1, not a switch ASIC's.

With ``--datapath user --dilation N`` the same near cut on the IB user datapath (the
switches forward in the agent host, every cable timed by the link model) at dilation N, and
the figure is in emulated time: a probe stream h1 -> h15 of RDMA WRITE frames, one every
``--spacing-us`` emulated microseconds (default 1; N times that in real time), received on a
raw socket at h15 with kernel stamps put on the emulated clock. ``blackout`` is the silence at
the cut (emulated us): from the arrival before the first frame sent after the cut that arrived
to that frame, less the stream's spacing; ``longest silence`` the longest anywhere after the
cut (it includes the datapath's own stalls: an upper bound); ``first after cut`` when that
first frame arrived; ``frames lost`` the stream's frames that never arrived. Both engines are ibemu's SM:
``ftree_ar`` (the edge's forwarder fails over on the carrier loss) and ``ftree`` (the stream
waits for the SM's reroute). Deviations: the fabric comes up, and the SM brings it up, at
dilation 1; the clock is dilated (``clock.configure(N, epoch=now)``: the emulated clock goes
on from that instant, N times slower) once the subnet is up and carries a first stream, and
the SM stays on the real clock (under a clock dilated from the start its first sweep had
not finished after two minutes at dilation 2000; on the real clock against a fabric dilated
from the start, its own port's answers timed out). Its stamps are put on the emulated clock
(``clock.to_emulated_ns``), so ``cut -> SM programmed`` is emulated; the SM's lag is not
part of the run's fidelity (it is not on the run's clock). The agent host's loop runs on the
real clock (``harness.LiveFabric``, as in the other benchmarks), so its lag monitor measures
real lateness, which is divided by the factor before the run's threshold applies
(``judge_user``: ``scenario.fidelity.threshold``, 2 ms of real time, relaxed up to 5% of the
blackout at the cut); the links are judged as ``scenario.fidelity`` does, over the stream. Only
runs marked valid count in the figures, the others are listed; a run whose fabric came up
unfit (under load some of the SM's SMPs time out: ports left unactivated, groups unwritten)
is tried afresh, up to 3 times. The factor must be large: the agent host's Python handling
of the carrier loss holds its loop for 0.1-0.2 s of real time on this shared machine, which
the frames behind it wait for; at dilation 2000 that alone was a 55 us blackout with nothing
lost. To scale: the blackout with
local failover is the agent host's reaction to a carrier loss divided by N (a switch ASIC
reacts in hardware: ibemu's figure is an upper bound); SM-only is the SM's real CPU time
divided by N too, so it is N times shorter than the same SM on a real fabric would take: not
to scale (the kernel datapath's figures above are the real-time ones).

Run: sudo .venv/bin/python benchmarks/bench_local_failover.py [--runs 3] [--cut near|far]
     sudo .venv/bin/python benchmarks/bench_local_failover.py --datapath user --dilation 20000 [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio
from harness import LiveFabric

from ibemu import clock, lagmon
from ibemu.fabric.probe import send_and_count
from ibemu.kernel.packet import kernel_stamp, open_packet_socket, stamp_received
from ibemu.scenario.fidelity import judge_links, lag_text, merge, merge_links, threshold
from ibemu.topo import generate
from ibemu.wire import fast

REPO = Path(__file__).resolve().parents[1]
STREAM = 6400
"""Frames in the stream: about 100 ms of them."""


class Run:
    """One fresh fabric and ibemu's SM with one engine."""

    def __init__(self, fab: LiveFabric, tmp: Path, engine: str) -> None:
        self.fab, self.tmp, self.engine = fab, tmp, engine
        self.events = tmp / f"sm-{engine}.jsonl"
        self.sm = subprocess.Popen(
            [sys.executable, "-m", "ibemu.sm", "--ns", fab.ns("h0"), "--events", str(self.events),
             "--sweep-interval", "2", "--engine", engine],
            cwd=REPO, env={**{k: v for k, v in os.environ.items() if k != lagmon.ENV_LOG}, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"sm-{engine}.stderr", "wb"))  # noqa: SIM115

    def close(self) -> None:
        if self.sm.poll() is None:
            self.sm.terminate()
            self.sm.wait(10)

    def sm_events(self, kind: str) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        return [r for r in map(json.loads, self.events.read_text().splitlines()) if r.get("kind") == kind]

    def wait_sm(self, kind: str, count: int = 1, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.sm_events(kind)
            if len(got) >= count:
                return got
            if self.sm.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {kind} from the SM ({self.engine}): "
                                   f"{(self.tmp / f'sm-{self.engine}.stderr').read_text()[-2000:]}")
            time.sleep(0.01)

    def fabric_events(self, kind: str, t_min: int, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        path = self.tmp / "events.jsonl"  # the agent host's log (flushed every 50 ms)
        deadline = time.monotonic() + timeout_s
        while True:
            recs = [r for r in map(json.loads, path.read_text().splitlines())
                    if r.get("kind") == kind and r.get("t_ns", 0) >= t_min] if path.exists() else []
            if recs or time.monotonic() > deadline:
                return recs
            time.sleep(0.05)

    def lid(self, host: str) -> int:
        rt = self.fab.rt
        return int(trio.from_thread.run_sync(lambda: rt.host.nodes[host].agent.lid(1),  # type: ignore[union-attr]
                                             trio_token=self.fab.token))

    def blast(self, n: int, src: str = "h1", dst: str = "h15") -> int:
        return send_and_count(self.fab.rt.plan, src, dst, self.lid(src), self.lid(dst), n, size=200)

    def last_cable(self, src: str, dst: str) -> tuple[str, int]:
        """The edge switch's end of the last cable the kernel LFTs take from ``src`` to ``dst``."""
        topo, fabric = self.fab.topo, self.fab.rt.fabric
        assert fabric is not None
        dlid = self.lid(dst)
        far = topo.peer(src, 1)
        assert far is not None
        node, prev = far.node, ("", 0)
        while True:
            port = fabric.lfts[node].read(dlid)  # type: ignore[union-attr]
            nxt = topo.peer(node, port)
            assert nxt is not None
            if nxt.node == dst:
                end = topo.peer(*prev)
                assert end is not None
                return end.node, end.port
            prev, node = (node, port), nxt.node


def one(engine: str, tmp: Path, cut: str = "near") -> dict[str, float]:
    topo = generate("fat-tree", k=4)
    with LiveFabric(topo, tmp, scenario="bench-local-failover") as fab:
        run = Run(fab, tmp, engine)
        try:
            run.wait_sm("subnet_up")
            assert fab.rt.fabric is not None
            src, dst = ("h1", "h15") if cut == "near" else ("h15", "h1")
            if cut == "near":
                sw, port = "edge0_0", fab.rt.fabric.lfts["edge0_0"].read(run.lid("h15"))  # type: ignore[union-attr]
            else:
                sw, port = run.last_cable("h15", "h1")
            if run.blast(300, src, dst) != 300:
                raise RuntimeError("the fabric does not carry the stream before the cut")
            got: list[int] = []
            sender = threading.Thread(target=lambda: got.append(run.blast(STREAM, src, dst)))
            sender.start()
            time.sleep(0.03)
            t_cut = time.monotonic_ns()
            fab.rt.fabric.links.set_up(fab.ns(sw), topo.ifname(sw, port), False)
            sender.join(60)
            rr = run.wait_sm("reroute", timeout_s=20)[0]
            out = {"cut_to_sm_routed_ms": (rr["t_routed"] - t_cut) / 1e6,
                   "cut_to_sm_programmed_ms": (rr["t_programmed"] - t_cut) / 1e6,
                   "frames_lost": float(STREAM - got[0])}
            moves = run.fabric_events("local_failover", t_cut, timeout_s=0.5 if engine == "ftree" else 2.0)
            lf = [r for r in moves if r.get("node") == sw and r.get("via") != "notice"]
            by_notice = sorted(r["t_ns"] for r in moves if r.get("via") == "notice")
            if by_notice:
                out["cut_to_first_notice_move_ms"] = (by_notice[0] - t_cut) / 1e6
                out["cut_to_last_notice_move_ms"] = (by_notice[-1] - t_cut) / 1e6
            if lf:
                out["carrier_to_failover_ms"] = (lf[0]["t_ns"] - lf[0]["carrier_t_ns"]) / 1e6
                out["cut_to_failover_ms"] = (lf[0]["t_ns"] - t_cut) / 1e6
            return out
        finally:
            run.close()


def probe_stream(fab: LiveFabric, src_lid: int, dst_lid: int, n: int, spacing_us: float,
                 cut_at: int, cut: Any) -> tuple[list[tuple[int, int]], int]:
    """``n`` RDMA WRITE frames h1 -> h15, one every ``spacing_us`` emulated us, ``cut()`` called
    before frame ``cut_at``; (PSN, emulated arrival ns) of each frame received, and the
    emulated ns of the cut."""
    plan = fab.rt.plan
    sp, dp = plan.nodes["h1"], plan.nodes["h15"]
    tx = open_packet_socket(sp.ns, sp.ports[1].ifname, 0x0003)
    rx = open_packet_socket(dp.ns, dp.ports[1].ifname, 0x88B5, buffer_bytes=8 << 20)
    stamp_received(rx)
    tpl = fast.NativeTemplate(slid=src_lid, dlid=dst_lid, destqp=0x100,
                              eth=fast.ethernet_header(sp.ports[1].peer_mac, sp.ports[1].mac))
    got: list[tuple[int, int]] = []
    offset = clock.realtime_offset_ns()

    def drain() -> None:
        while True:
            try:
                data, anc, _, _ = rx.recvmsg(9216, 64)
            except BlockingIOError:
                return
            t = kernel_stamp(anc)
            if t is not None and len(data) > 100:
                got.append((fast.peek(data, 14).psn, clock.realtime_to_emulated_ns(t, offset)))

    t_cut = 0
    step = spacing_us * 1000  # emulated ns
    t0 = clock.now_ns()
    try:
        for i in range(n):
            due = t0 + i * step
            while clock.now_ns() < due:
                drain()
                time.sleep(max(0.0, min(0.002, (due - clock.now_ns()) * clock.dilation() / 1e9)))
            if i == cut_at:
                t_cut = clock.now_ns()
                cut()
            tx.send(tpl.packet(0x0A, i, bytes(256), ext=fast.reth(0, 0, 256)))
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            drain()
            time.sleep(0.01)
    finally:
        tx.close()
        rx.close()
    return got, t_cut


class NotReady(RuntimeError):
    """The fabric did not come up fit for the measurement (under load, some of the SM's SMPs
    timed out: ports left unactivated, groups not written); the run is tried afresh."""


def judge_user(recs: list[dict[str, Any]], dilation: float, lo: int, hi: int,
               blackout_us: float | None = None) -> dict[str, Any]:
    """The run's fidelity over the stream: the links as ``scenario.fidelity`` judges them, and
    the agent host's loop lag, which its monitor measured on the real clock here (this loop is
    not on the emulated one), put on the emulated clock (divided by the factor) before the
    threshold is applied: ``scenario.fidelity.threshold`` (2 ms of real time, bounded by the
    run's figure, the blackout at the cut, when it is one)."""
    figure = ("blackout_us", blackout_us) if blackout_us else None
    th = threshold(dilation, figure=figure)
    links = judge_links(merge_links(recs, lo, hi), threshold_us=th.us)
    procs = merge(recs, lo, hi)
    host = procs.get("agent-host")
    lag_us = host.quantile_us(0.99) / dilation if host is not None and host.samples else None
    valid = links["valid"] and lag_us is not None and lag_us < th.us
    note = (f"agent host p99 lag {'unknown' if lag_us is None else lag_text(lag_us, dilation)} "
            f"(threshold {lag_text(th.us, dilation)}: {th.basis}); "
            + ("every link kept to the model" if links["valid"] else
               "; ".join(f"link {n} fell behind: {why}" for n, why in sorted(links["behind"].items()))))
    return {"valid": valid, "note": note, "lag_us": lag_us, "threshold_us": th.us}


def one_user(engine: str, tmp: Path, dilation: float, spacing_us: float, frames: int) -> dict[str, Any]:
    """The near cut on the user datapath at ``dilation`` (module docstring); emulated figures."""
    topo = generate("fat-tree", k=4)
    lag = tmp / "lag.jsonl"
    os.environ[lagmon.ENV_LOG] = str(lag)
    try:
        with LiveFabric(topo, tmp, scenario="bench-local-failover-user", datapath="user") as fab:
            run = Run(fab, tmp, engine)
            try:
                run.wait_sm("subnet_up", timeout_s=120)
                assert fab.rt.fabric is not None
                dlid = run.lid("h15")

                def edge(fn: Any) -> Any:
                    return trio.from_thread.run_sync(lambda: fn(fab.rt.host.nodes["edge0_0"].agent),  # type: ignore[union-attr]
                                                     trio_token=fab.token)

                deadline = time.monotonic() + 90
                while engine.endswith("_ar") and not edge(lambda a: a.alternates_of(dlid)):
                    if time.monotonic() > deadline:  # the SM writes the alternates after the LFTs
                        raise NotReady("the SM wrote no alternates for h15 at edge0_0")
                    time.sleep(0.05)
                for _ in range(10):  # the SM's last passes (groups, FailoverConfig) may still be under way
                    got_n = run.blast(100)
                    if got_n == 100:
                        break
                    time.sleep(0.5)
                else:
                    raise NotReady(f"the fabric does not carry the stream before the cut ({got_n} of 100)")
                port = edge(lambda a: a.lft.lookup(dlid))
                if port not in (3, 4):  # an up-port of the edge (h15 is in another pod)
                    raise NotReady(f"edge0_0 routes h15 by port {port}")
                fabric = fab.rt.fabric
                # from here on the run's clock is dilated; the emulated clock goes on from this
                # instant (epoch = now: both clocks agree there), so the model's past stays put
                clock.configure(dilation, time.monotonic_ns())
                time.sleep(0.2)
                t_start = clock.now_ns()
                got, t_cut = probe_stream(fab, run.lid("h1"), dlid, frames, spacing_us, frames // 4,
                                          lambda: fabric.links.set_up(fab.ns("edge0_0"), topo.ifname("edge0_0", port), False))
                t_end = clock.now_ns()
                rr = run.wait_sm("reroute", timeout_s=60)[0]
                trio.from_thread.run_sync(lambda: fab.rt.host.links.report_links(final=True),  # type: ignore[union-attr]
                                          trio_token=fab.token)
                recs = [json.loads(x) for x in lag.read_text().splitlines()] if lag.exists() else []
                programmed = clock.to_emulated_ns(rr["t_programmed"])
                reroutes = [(clock.to_emulated_ns(r["t_programmed"]) - t_cut) / 1000 for r in run.sm_events("reroute")]
            finally:
                run.close()
                clock.configure(1)
    finally:
        os.environ.pop(lagmon.ENV_LOG, None)
    arrivals = sorted(t for _, t in got)
    after = [t for t in arrivals if t >= t_cut]
    before = [t for t in arrivals if t < t_cut]
    gaps = [b - a for a, b in zip(([before[-1]] if before else []) + after, after, strict=False)]
    longest = max(0.0, (max(gaps, default=0) - spacing_us * 1000) / 1000)
    # at the cut: the first frame sent after the cut that arrived, against the arrival before it
    cut_at = frames // 4
    first = min((t for p, t in got if p >= cut_at), default=None)
    prior = max((t for t in arrivals if first is not None and t < first), default=None)
    at_cut = None if first is None or prior is None else max(0.0, (first - prior - spacing_us * 1000) / 1000)
    fid = judge_user(recs, dilation, t_start, t_end, at_cut)
    return {"blackout_us": at_cut, "longest_silence_us": longest,
            "first_after_cut_us": None if first is None else (first - t_cut) / 1000,
            "reroutes_programmed_us": reroutes,
            "frames_lost": float(frames - len({p for p, _ in got})),
            "cut_to_sm_programmed_us": (programmed - t_cut) / 1000,
            "valid": fid["valid"], "note": fid["note"], "host_lag_us": fid["lag_us"],
            "threshold_us": fid["threshold_us"]}


def main_user(args: argparse.Namespace) -> None:
    rows: dict[str, list[dict[str, Any]]] = {"ftree_ar": [], "ftree": []}
    for i in range(args.runs):
        for engine in rows:
            for attempt in range(3):
                try:
                    with tempfile.TemporaryDirectory(prefix="bench-lfo-user-") as tmp:
                        r = one_user(engine, Path(tmp), args.dilation, args.spacing_us, args.frames)
                    break
                except NotReady as exc:
                    print(f"  run {i + 1} {engine}: not ready ({exc}), attempt {attempt + 1} of 3",
                          file=sys.stderr, flush=True)
            else:
                raise SystemExit(f"{engine}: the fabric never came up fit for the measurement")
            rows[engine].append(r)
            print(f"  run {i + 1} {engine}: {r}", file=sys.stderr, flush=True)
    print(f"Cable cut (the sender's edge uplink) under a probe stream h1 -> h15 (k=4 fat-tree, IB user datapath, "
          f"dilation {args.dilation:g}, a frame every {args.spacing_us:g} us emulated, {args.frames} frames; "
          f"load average {os.getloadavg()[0]:.1f}): min / median / max over the runs the fidelity monitor marked valid")
    print(f"  {'figure (emulated)':<28} {'ftree_ar (local failover)':>28} {'ftree (SM only)':>28}")
    for k in ("blackout_us", "longest_silence_us", "first_after_cut_us", "cut_to_sm_programmed_us", "frames_lost"):
        cells = []
        for engine in rows:
            vals = [r[k] for r in rows[engine] if r["valid"] and r[k] is not None]
            fmt = "{:.0f}" if k == "frames_lost" else "{:.1f}"
            cells.append("-" if not vals else " / ".join(fmt.format(v) for v in
                                                         (min(vals), statistics.median(vals), max(vals))))
        print(f"  {k:<28} {cells[0]:>28} {cells[1]:>28}")
    for engine in rows:
        bad = [r for r in rows[engine] if not r["valid"]]
        print(f"  {engine}: {len(rows[engine]) - len(bad)} of {len(rows[engine])} runs valid"
              + "".join(f"\n    invalid: {r['note']}" for r in bad))
    print("  (to scale: the local failover blackout, an upper bound of a switch's; not to scale: the SM's "
          "reroute, whose real CPU time dilation divides by N)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh fabrics per engine (default 3)")
    ap.add_argument("--cut", choices=("near", "far"), default="near",
                    help="near: the sender's edge uplink; far: the last cable before the receiver's edge")
    ap.add_argument("--datapath", choices=("kernel", "user"), default="kernel")
    ap.add_argument("--dilation", type=float, default=0.0, help="user datapath: the dilation factor (required)")
    ap.add_argument("--spacing-us", type=float, default=1.0, help="user datapath: the probe stream's spacing (emulated us)")
    ap.add_argument("--frames", type=int, default=400, help="user datapath: the probe stream's frames")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs >= 1")
    if args.datapath == "user":
        if args.dilation < 1 or args.cut != "near" or args.spacing_us <= 0 or args.frames < 8:
            ap.error("--datapath user needs --dilation N >= 1, --cut near, --spacing-us > 0, --frames >= 8")
        main_user(args)
        return
    if args.dilation:
        ap.error("--dilation applies to --datapath user")
    rows: dict[str, list[dict[str, float]]] = {"ftree_ar": [], "ftree": []}
    for i in range(args.runs):
        for engine in rows:
            with tempfile.TemporaryDirectory(prefix="bench-lfo-") as tmp:
                rows[engine].append(one(engine, Path(tmp), args.cut))
            print(f"  run {i + 1} {engine}: {rows[engine][-1]}", file=sys.stderr, flush=True)
    keys = ("carrier_to_failover_ms", "cut_to_failover_ms", "cut_to_first_notice_move_ms",
            "cut_to_last_notice_move_ms", "cut_to_sm_routed_ms", "cut_to_sm_programmed_ms", "frames_lost")
    what = ("the sender's edge uplink" if args.cut == "near"
            else "the last cable before the receiver's edge (fault notices)")
    flow = "h1 -> h15" if args.cut == "near" else "h15 -> h1"
    print(f"Cable cut ({what}) under a one-way stream {flow} (k=4 fat-tree, kernel datapath, {STREAM} frames, "
          f"{args.runs} runs each): min / median / max, ibemu's own real time at dilation 1")
    print(f"  {'figure':<28} {'ftree_ar (local failover)':>28} {'ftree (SM only)':>28}")
    for k in keys:
        cells = []
        for engine in rows:
            vals = [r[k] for r in rows[engine] if k in r]
            cells.append("-" if not vals else
                         f"{min(vals):.2f} / {statistics.median(vals):.2f} / {max(vals):.2f}" if k != "frames_lost"
                         else f"{min(vals):.0f} / {statistics.median(vals):.0f} / {max(vals):.0f}")
        print(f"  {k:<28} {cells[0]:>28} {cells[1]:>28}")


if __name__ == "__main__":
    main()
