#!/usr/bin/env python3
"""ibemu's SM and the unmodified OpenSM side by side on the same emulated fabrics (root).

For each fabric (k=4 and k=8 fat-trees, a 4x4 torus) and each SM, one scenario run through
the scenario runner (``ibemu run``'s code): a fresh fabric, the SM started from nothing on
h0, RC probe streams (2,000 msg/s each) between host pairs that have a shortest path over
one edge-aggregation cable (a torus: an x-link), both directions, the cable cut at 4 s and
restored at 6.5 s (late enough for every flow to be running on a busy machine). Printed per run:

- bring-up: SM process start -> SUBNET UP (both SMs' ``subnet_up`` on the monotonic clock;
  OpenSM's from its flushed log);
- the cut's reroute phases in ms since the cut (detect, trap, routed, programmed; for
  OpenSM also trap -> SUBNET UP, its own figure for a heavy sweep);
- the flows the cut hit (blackout > 5 ms, ten times their pace) and their blackouts;
- the LFTs both SMs programmed before the cut, compared in hop count per (switch,
  destination CA): LIDs differ between the SMs, paths are followed through each
  switch agent's LFT and the topology's cables.

Run: sudo .venv/bin/python benchmarks/bench_opensm.py [--fabrics k4 k8 torus] [--flows 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import trio

from ibemu.events import read_events
from ibemu.fabric import opensm
from ibemu.scenario.loader import loads_scenario
from ibemu.scenario.runner import ScenarioRun
from ibemu.topo import Topology

FABRICS: dict[str, tuple[str, str, str]] = {
    # name: (topology YAML, engine, the cut cable's two switches)
    "k4": ("generator: fat-tree\n  k: 4", "ftree", "edge0_0 agg0_0"),
    "k8": ("generator: fat-tree\n  k: 8", "ftree", "edge0_0 agg0_0"),
    "torus": ("generator: torus\n  dims: [4, 4]\n  hosts_per_switch: 1", "dor", "sw1_1 sw2_1"),
}
CUT_AT_S, RESTORE_AT_S, DURATION_S = 4.0, 6.5, 8.0
HIT_MS = 5.0
"""A flow the cut hit stopped longer than this (ten times its 0.5 ms pace)."""


def distances(topo: Topology, start: str) -> dict[str, int]:
    """Hops from ``start`` to every node, over the topology's cables."""
    dist, todo = {start: 0}, deque([start])
    while todo:
        node = todo.popleft()
        for port in topo.node(node).port_range:
            peer = topo.peer(node, port)
            if peer is not None and peer.node not in dist:
                dist[peer.node] = dist[node] + 1
                todo.append(peer.node)
    return dist


def crossing_pairs(topo: Topology, a: str, b: str, n: int) -> list[tuple[str, str]]:
    """Up to ``n`` host pairs with a shortest path over the cable a-b, half each way, spread
    over as many distinct hosts as possible."""
    hosts = [c.name for c in topo.cas()]
    dist = {h: distances(topo, h) for h in hosts}
    out: list[tuple[str, str]] = []
    used: dict[str, int] = {}
    for near, far in ((a, b), (b, a)):
        cands = [(s, d) for s in hosts for d in hosts if s != d
                 and dist[s][near] + 1 + dist[d][far] == dist[s][d]]
        picked: list[tuple[str, str]] = []
        while cands and len(picked) < n // 2:
            cands.sort(key=lambda p: (used.get(p[0], 0) + used.get(p[1], 0), -dist[p[0]][p[1]], p))
            s, d = cands.pop(0)
            picked.append((s, d))
            used[s] = used.get(s, 0) + 1
            used[d] = used.get(d, 0) + 1
        out += picked
    return out


def scenario_text(fabric: str, flows: int) -> tuple[str, str]:
    """The scenario YAML of ``fabric`` (ibemu's SM) and the cut cable's switch-side end."""
    topo_yaml, engine, cut = FABRICS[fabric]
    scen = loads_scenario(f"name: side-by-side-{fabric}\ntopology:\n  {topo_yaml}\n", f"<{fabric}>", Path("."))
    topo = scen.topology
    a, b = cut.split()
    link = topo.links_between(a, b)[0]
    end = link.a if link.a.node == a else link.b
    lines = [f"name: side-by-side-{fabric}", "topology:", f"  {topo_yaml}", "defaults:", "  mtu: 4096",
             "sm:", "  impl: ibemu", f"  engine: {engine}", "  host: h0", "  sweep_interval_s: 30", "traffic:"]
    for s, d in crossing_pairs(topo, a, b, flows):
        lines += [f"  - name: {s}-{d}", "    kind: stream", f"    from: {s}", f"    to: {d}",
                  "    size: 256", "    rate_pps: 2000"]
    lines += ["faults:", f"  - at_s: {CUT_AT_S}", "    action: link_down", f"    link: {end.node}:{end.port}",
              f"  - at_s: {RESTORE_AT_S}", "    action: link_up", f"    link: {end.node}:{end.port}",
              f"duration_s: {DURATION_S}"]
    return "\n".join(lines) + "\n", f"{end.node}:{end.port}"


def lft_hops(run: ScenarioRun) -> dict[tuple[str, str], int | None]:
    """Hop count from every switch to every CA along the LFTs in the switch agents (None: the
    walk reached no CA: a hole or a loop)."""
    host = run.rt.host
    assert host is not None
    topo = run.scen.topology
    lids = {ca.name: host.nodes[ca.name].agent.lid(1) for ca in topo.cas()}  # type: ignore[attr-defined]
    out: dict[tuple[str, str], int | None] = {}
    for sw in topo.switches():
        for ca, lid in lids.items():
            node, hops = sw.name, 0
            while hops < 64:
                port = host.nodes[node].agent.lft.lookup(lid)  # type: ignore[attr-defined]
                peer = topo.peer(node, port)
                hops += 1
                if peer is None:
                    hops = 64
                    break
                if peer.node == ca:
                    break
                node = peer.node
            out[(sw.name, ca)] = hops if hops < 64 else None
    return out


async def run_once(text: str, impl: str, out_dir: Path) -> tuple[ScenarioRun, dict[str, Any], dict[tuple[str, str], int | None]]:
    scen = loads_scenario(text, "<bench>", Path("."))
    scen = dataclasses.replace(scen, sm=dataclasses.replace(scen.sm, impl=impl))
    run = ScenarioRun(scen, out_dir)
    snapshot: dict[tuple[str, str], int | None] = {}

    async def take_snapshot() -> None:
        while not run.t0_ns:  # set once the SM is up and the flows are about to start
            await trio.sleep(0.05)
        await trio.sleep(max(0.0, (run.t0_ns - time.monotonic_ns()) / 1e9 + CUT_AT_S / 2))
        snapshot.update(lft_hops(run))

    result: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_snapshot)
        result = await run.run()
        nursery.cancel_scope.cancel()
    return run, result, snapshot


def summarize(run: ScenarioRun, result: dict[str, Any], impl: str) -> dict[str, Any]:
    events = read_events(run.run_dir / impl / "events.jsonl")
    up = next((e["t_ns"] for e in events if e["kind"] == "subnet_up"), None)
    bringup = None if up is None or run.rt.sm_started_ns is None else (up - run.rt.sm_started_ns) / 1e9
    cut = next(f for f in result["faults"] if f["action"] == "link_down")
    hit = [f["blackout_ms"] for f in cut["flows"] if (f.get("blackout_ms") or 0) > HIT_MS]
    late = sum(1 for f in cut["flows"] if f.get("blackout_ms") is None)  # not running before the cut
    errors = [t["name"] for t in result["traffic"] if "error" in t["extra"]]
    t_cut = run.t0_ns + int(cut["t_fault_s"] * 1e9)
    reroutes = [e for e in events if e["kind"] == "reroute" and isinstance(e.get("t_trap"), int)
                and e["t_trap"] >= t_cut]
    subnet_up_ms = None
    if impl == "opensm" and reroutes and reroutes[0].get("t_subnet_up"):
        subnet_up_ms = round((reroutes[0]["t_subnet_up"] - t_cut) / 1e6, 1)
    fallback = any(e["kind"] == "routing_fallback" for e in events)
    return {"bringup_s": bringup, "phases": cut["phases_ms"], "subnet_up_ms": subnet_up_ms,
            "flows": len(cut["flows"]), "hit": hit, "late": late, "errors": errors, "fallback": fallback}


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fabrics", nargs="+", default=list(FABRICS), choices=list(FABRICS))
    ap.add_argument("--flows", type=int, default=8, help="probe streams per run (half each way)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not opensm.opensm_available():
        print("opensm is not installed (scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-opensm-") as tmp:
        for fabric in args.fabrics:
            text, cut = scenario_text(fabric, args.flows)
            hops: dict[str, dict[tuple[str, str], int | None]] = {}
            for impl in ("ibemu", "opensm"):
                run, result, hops[impl] = trio.run(run_once, text, impl, Path(tmp) / f"{fabric}-{impl}")
                s = summarize(run, result, impl)
                rows.append({"fabric": fabric, "sm": impl, "engine": run.scen.sm.engine, "cut": cut, **s})
                print(f"{fabric} {impl}: done ({result['duration_s']:.1f} s)", file=sys.stderr, flush=True)
            keys = set(hops["ibemu"]) & set(hops["opensm"])
            same = sum(1 for k in keys if hops["ibemu"][k] == hops["opensm"][k] and hops["ibemu"][k] is not None)
            holes = {impl: sum(1 for v in h.values() if v is None) for impl, h in hops.items()}
            for r in rows[-2:]:
                r["lft"] = {"pairs": len(keys), "same_hops": same, "holes": holes[r["sm"]]}
    print()
    print("| fabric | SM (engine) | bring-up s | detect | trap | routed | programmed | OpenSM trap->SUBNET UP "
          "| flows hit / run | blackout median / max ms | LFT hops agree (switch, CA) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, lft = r["phases"], r["lft"]
        engine = r["engine"] + (" -> minhop after the cut" if r["fallback"] else "")
        blackout = f"{fmt(statistics.median(r['hit']))} / {fmt(max(r['hit']))}" if r["hit"] else "-"
        trap_up = "-" if r["subnet_up_ms"] is None or p["trap"] is None else fmt(r["subnet_up_ms"] - p["trap"])
        print(f"| {r['fabric']} ({r['cut']}) | {r['sm']} ({engine}) | {fmt(r['bringup_s'], 2)} | "
              f"{fmt(p['detect'])} | {fmt(p['trap'])} | {fmt(p['routed'])} | {fmt(p['programmed'])} | {trap_up} | "
              f"{len(r['hit'])} / {r['flows']}{' (' + str(len(r['errors'])) + ' gave up)' if r['errors'] else ''}"
              f"{' (' + str(r['late']) + ' not started)' if r['late'] else ''} | "
              f"{blackout} | {lft['same_hops']}/{lft['pairs']}"
              f"{'' if not lft['holes'] else ', ' + str(lft['holes']) + ' unreachable'} |")
    print("\nphases: ms since the cut; detect = first carrier change, trap = the SM received it, routed = "
          "new routes computed, programmed = last LFT block acked (OpenSM: last LFT Set a switch took).")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
