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

Run: sudo .venv/bin/python benchmarks/bench_local_failover.py [--runs 3] [--cut near|far]
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

from ibemu.fabric.probe import send_and_count
from ibemu.topo import generate

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
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh fabrics per engine (default 3)")
    ap.add_argument("--cut", choices=("near", "far"), default="near",
                    help="near: the sender's edge uplink; far: the last cable before the receiver's edge")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs >= 1")
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
