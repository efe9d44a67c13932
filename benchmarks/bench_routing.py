"""Routing figures: engine compute time on k=8 and k=16 fat-trees, checker time, incremental
reroute of one edge-agg link failure (time, LIDs, changed entries and LFT blocks).

Run: ``.venv/bin/python benchmarks/bench_routing.py``. Prints the best of several runs;
targets: routing k=16 <= 200 ms, reroute k=8 <= 2 ms and k=16 <= 10 ms.
"""

from __future__ import annotations

import sys
import time

from ibemu.sm.checker import check
from ibemu.sm.graph import SubnetGraph
from ibemu.sm.reroute import reroute
from ibemu.sm.routing import PROMISES, compute
from ibemu.sm.routing.fabric import bits
from ibemu.testing.fromtopo import graph_of, remove_link, restore_link
from ibemu.topo import generate


def edge_agg_link(g: SubnetGraph) -> tuple[int, int, int, int]:
    edge = next(n for n in g.switches() if n.desc == "ibemu edge1_1")
    for num, peer, pport in edge.neighbors():
        if g.nodes[peer].desc.startswith("ibemu agg"):
            return edge.guid, num, peer, pport
    raise AssertionError("no edge-agg link")


def cold(g: SubnetGraph, engine: str) -> float:
    """Seconds to compute ``engine``'s routes from scratch, nothing remembered from a run
    before (``bits`` keeps the set bits of masks it has seen)."""
    bits.cache_clear()
    return compute(g, engine).compute_s


def main() -> int:
    for k, runs in ((8, 5), (16, 3)):
        g = graph_of(generate("fat-tree", k=k))
        lids = len(g.lid_owners())
        print(f"fat-tree k={k}: {len(g.switches())} switches, {len(g.cas())} CAs, {lids} LIDs")
        for engine in ("ftree", "minhop", "updn"):
            best = min(cold(g, engine) for _ in range(runs))
            routes = compute(g, engine)
            minimal, free = PROMISES[engine]
            t0 = time.perf_counter()
            rep = check(g, routes, expect_minimal=minimal, expect_deadlock_free=free)
            t_check = time.perf_counter() - t0
            a, pa, b, pb = edge_agg_link(g)
            times = []
            res = None
            for _ in range(runs * 3):
                remove_link(g, a, pa)
                res = reroute(g, routes, ends=[(a, pa), (b, pb)])
                times.append(res.compute_s)
                restore_link(g, a, pa, (b, pb))
            assert res is not None
            remove_link(g, a, pa)
            ok = check(g, res.routes, expect_minimal=engine == "minhop", expect_deadlock_free=free).ok
            restore_link(g, a, pa, (b, pb))
            back = reroute(g, res.routes, ends=[(a, pa), (b, pb)])
            print(
                f"  {engine:6s} compute {best * 1e3:7.1f} ms | check {t_check * 1e3:6.0f} ms "
                f"{'ok' if rep.ok else 'FAILED'} | edge-agg failure reroute {min(times) * 1e3:5.2f} ms "
                f"({'full' if res.full else 'incremental'}, {len(res.affected_lids)} LIDs, "
                f"{res.changed_entries} entries, {res.changed_blocks} blocks, check {'ok' if ok else 'FAILED'}) "
                f"| restore {back.compute_s * 1e3:5.1f} ms ({back.changed_entries} entries, "
                f"{back.changed_blocks} blocks)"
            )
    for gen, params in (("torus", {"dims": (8, 8)}), ("mesh", {"dims": (8, 8)}), ("dragonfly", {})):
        g = graph_of(generate(gen, **params))
        line = []
        for engine in ("minhop", "updn", "dor"):
            if engine == "dor" and gen == "dragonfly":
                continue
            best = min(cold(g, engine) for _ in range(3))
            rep = check(g, compute(g, engine))
            line.append(f"{engine} {best * 1e3:.1f} ms (CDG {'cyclic' if rep.cdg_cycle else 'acyclic'})")
        print(f"{gen} {params}: {len(g.switches())} switches: " + ", ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
