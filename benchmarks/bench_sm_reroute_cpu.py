#!/usr/bin/env python3
"""The SM's own CPU per reroute on k=8, phase by phase, with no fabric: what a loaded machine
cannot blur.

A k=8 fat-tree's subnet graph (``testing.fromtopo``), ftree routes, every table taken as
written; then edge-aggregation cables are cut and restored one at a time, as
``benchmarks/bench_sm.py`` does on the live fabric, and each reroute's steps are timed in
CPU seconds of this process (``time.process_time``, which other processes do not inflate;
the figures are this process's cost, not latencies on a fabric):

- **routing**: ``sm.manager.default_reroute_fn`` (the incremental reroute and its diff);
- **planning**: the blocks that changed and, per switch, LID-routed or directed route (what
  ``LftProgrammer.program`` does before its first Set; done here first, so inside ``program``
  the blocks come from its cache);
- **programming**: ``LftProgrammer.program`` over a port that answers each Set at once (its
  GetResp queued as the Set is sent): framing-free, so this is the SM's per-Set Python cost
  (the transport, trio, the events), without the kernel's round trip.

The ibemu imported is the one on PYTHONPATH, so the same script measures another checkout.
Run: .venv/bin/python benchmarks/bench_sm_reroute_cpu.py [--cuts 16] [--runs 3] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import time

import trio

from ibemu.events import EventLog
from ibemu.sm.graph import SubnetGraph
from ibemu.sm.manager import default_reroute_fn
from ibemu.sm.program import LftProgrammer
from ibemu.sm.routing import compute
from ibemu.sm.transport import Transport
from ibemu.testing.fromtopo import graph_of, remove_link, restore_link
from ibemu.testing.madport import EchoPort
from ibemu.topo import generate


def edge_agg_cables(g: SubnetGraph, count: int) -> list[tuple[int, int, int, int]]:
    out = []
    for edge in sorted(g.switches(), key=lambda n: n.desc):
        if not edge.desc.startswith("ibemu edge"):
            continue
        for num, peer, pport in edge.neighbors():
            if g.nodes[peer].desc.startswith("ibemu agg"):
                out.append((edge.guid, num, peer, pport))
    return out[::max(1, len(out) // count)][:count]


async def one_run(cuts: int, prof: cProfile.Profile | None) -> dict[str, list[float]]:
    g = graph_of(generate("fat-tree", k=8))
    for node in g.switches():
        node.dr_path = (1, 5, 3)[: 1 + node.guid % 3]  # a directed route's length; the echo ignores it
    routes = compute(g, "ftree")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    port = EchoPort()
    transport = Transport(port)
    prog = LftProgrammer(transport=transport, events=EventLog())
    sm = next(n for n in g.cas())
    prog.sm_guid, prog.sm_port, prog.sm_lid = sm.guid, 1, sm.lid
    out: dict[str, list[float]] = {"blocks": []}
    for what in ("routing", "planning", "programming"):
        for step in ("cut", "restore"):
            out[f"{what} {step}"] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(transport.serve)
        await prog.program(g, routes, top)  # the bring-up's tables
        for a, pa, b, pb in edge_agg_cables(g, cuts):
            for step in ("cut", "restore"):
                if step == "cut":
                    peer = remove_link(g, a, pa)
                    assert peer == (b, pb)
                else:
                    restore_link(g, a, pa, (b, pb))
                if prof is not None:
                    prof.enable()
                c0 = time.process_time()
                new = default_reroute_fn(g, routes, [(a, pa), (b, pb)])
                c1 = time.process_time()
                plan = prog.plan(new, top)
                for guid in plan:
                    prog.lid_routed_ok(g, guid)
                c2 = time.process_time()
                res = await prog.program(g, new, top)
                c3 = time.process_time()
                if prof is not None:
                    prof.disable()
                assert res.failed == 0 and res.acked == sum(len(b) for b in plan.values())
                routes = new
                out[f"routing {step}"].append(c1 - c0)
                out[f"planning {step}"].append(c2 - c1)
                out[f"programming {step}"].append(c3 - c2)
                out["blocks"].append(res.acked)
                out.setdefault(f"blocks {step}", []).append(res.acked)
        nursery.cancel_scope.cancel()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuts", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", metavar="FILE", help="write a cProfile of the reroutes (pstats) here")
    args = ap.parse_args()
    prof = cProfile.Profile() if args.profile else None
    merged: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for k, v in trio.run(one_run, args.cuts, prof).items():
            merged.setdefault(k, []).extend(v)
    if prof is not None:
        prof.dump_stats(args.profile)
    blocks = merged.pop("blocks")
    blocks_cut, blocks_restore = merged.pop("blocks cut"), merged.pop("blocks restore")
    print(f"k=8 fat-tree, ftree: {len(blocks)} reroutes (edge-agg cuts and restores), "
          f"LFT blocks per cut {statistics.median(blocks_cut):.0f}, per restore "
          f"{statistics.median(blocks_restore):.0f} (medians); CPU ms of this process:")
    for k, v in merged.items():
        ms = sorted(x * 1e3 for x in v)
        print(f"  {k:19s} median {statistics.median(ms):6.2f} ms (p10 {ms[len(ms) // 10]:.2f}, "
              f"p90 {ms[len(ms) * 9 // 10]:.2f})")
    per = sorted(p / b * 1e6 for p, b in zip([x for pair in zip(merged["programming cut"], merged["programming restore"],
                                                                    strict=True) for x in pair], blocks, strict=True) if b)
    print(f"  programming per LFT Set: median {statistics.median(per):.1f} us")


if __name__ == "__main__":
    main()
