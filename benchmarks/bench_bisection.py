"""Effective bisection of fat-trees: IB with ibemu's ftree LFTs against RoCE with ECMP.

Run: ``.venv/bin/python benchmarks/bench_bisection.py [--seeds 10] [--quick]``.

Each flow's path is the one the emulator would give it (``ibemu.testing.bisection``: the
ftree engine's LFTs, as ibemu's SM programs them; the RoCE user datapath's ECMP hash over the
flow's 5-tuple, the UDP source port from the destination QP as a run numbers it), and its rate
the max-min fair share of the links on its path (``ibemu.physics.bisection``: the analytic
expectation). Effective bisection = mean flow rate / line rate. Beside it: Hoefler's simpler
figure (each flow 1 / load of its most loaded link), and the published references: 38% of
full bisection for random permutations on a statically routed 512-node Clos (P. Geoffray,
T. Hoefler, "Adaptive Routing Strategies for Modern High Performance Networks", HOTI 2008),
100% for shift permutations under ftree (OpenSM's ftree promises them contention-free; target
100 +- 3%). Random permutations are seeded derangements of the hosts; shifts are ``i -> i + s``
in ftree's host order (leaf by leaf, pod by pod: the topology's order too).

Then a cross-check of the analytic figure against the model's packet-level reference
simulator (``physics/sim.py``) on the same paths: 4 KiB frames from saturating senders, rates
over 100 us after a 50 us warm-up, as a share of what one flow alone gets. IB: credits per VL;
RoCE: PFC on the flows' priority (lossless, so the comparison is of paths, not of drops).
``--quick`` skips k=16 and the k=8 simulations. The simulated figures are the model's, in
emulated time; none comes from the live datapath.

Last, adaptive routing against static routing in the packet-level simulator (issue 20): the
same random permutations, once on ftree's static paths and once with every switch choosing,
per packet, the least-loaded port of the destination's group (``ftree_ar``'s LFT port and
alternates, the choice ``Forwarder.adapt`` makes on the live datapath: ``physics.bisection``
``simulate(groups=...)``), with the analytic max-min figure of the static paths beside them
and the ratio AR / static (target >= 1.5x on k=8). Also printed: the frames delivered out of
order (per flow, behind a later frame of the flow) under adaptive routing. The fluid bound
for a full fat-tree whose flows split evenly over every shortest path is 100% for any
permutation. ``--ar-seeds N`` (default 3) permutations on k=8 (~1 min each on this machine);
``--quick`` runs them on k=4 instead.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from ibemu.physics.bisection import (
    Bisection,
    Path,
    evaluate,
    random_permutation,
    shift_permutation,
    simulate,
)
from ibemu.physics.link import data_gbps
from ibemu.physics.model import EthConfig
from ibemu.testing.bisection import EcmpRouting, IbRouting
from ibemu.topo import generate
from ibemu.topo.model import Topology

PUBLISHED_RANDOM = 0.38
IB_SIZE = 4122  # a 4 KiB RC SEND: LRH 8 + BTH 12 + 4096 + ICRC 4 + VCRC 2
ROCE_SIZE = 4158  # the same as RoCEv2: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + 4096 + ICRC 4 + FCS 4

PathOf = Callable[[str, str, int], Path]


def paths_for(path: PathOf, order: Sequence[str], perm: Sequence[int]) -> list[Path]:
    """Flow ``i``: host ``order[i]`` to ``order[perm[i]]`` (flow ``i`` of the run)."""
    return [path(order[i], order[perm[i]], i) for i in range(len(order))]


def pct_range(xs: Sequence[float]) -> str:
    return f"{min(xs):6.1%} - {max(xs):6.1%} (mean {statistics.fmean(xs):.1%})"


def row(name: str, analytic: str, hoefler: str, ref: str) -> None:
    print(f"  {name:<44} {analytic:<32} {hoefler:<20} {ref}")


def patterns(path: PathOf, order: Sequence[str], perms: Sequence[Sequence[int]]) -> list[Bisection]:
    return [evaluate(paths_for(path, order, p)) for p in perms]


def fabric(k: int, seeds: int, shifts: Sequence[int] | None) -> tuple[Topology, IbRouting, EcmpRouting]:
    t0 = time.perf_counter()
    topo = generate("fat-tree", k=k)
    ib, ecmp = IbRouting(topo, "ftree"), EcmpRouting(topo)
    order = ib.shift_order()
    n = len(order)
    c = topo.counts()
    print(f"k={k} fat-tree: {n} hosts, {c.switches} switches, every link {topo.defaults.rate} "
          f"({data_gbps(topo.defaults.rate):g} Gb/s data); hosts in ftree's order "
          f"{'= the topology order' if order == [h.name for h in topo.cas()] else '(differs from the topology order)'}")
    row("figure", "analytic: max-min effective", "1/load (Hoefler)", "reference")
    rand = [random_permutation(n, s) for s in range(seeds)]
    shift_list = list(range(1, n)) if shifts is None else [s for s in shifts if s % n]
    shift = [shift_permutation(n, s) for s in shift_list]
    which = f"all {len(shift_list)}" if shifts is None else f"{len(shift_list)} of {n - 1}"
    for label, routing in (("IB ftree", ib), ("RoCE ECMP", ecmp)):
        res = patterns(routing.path, order, rand)
        row(f"{label}, random permutations ({seeds} seeds)", pct_range([b.effective for b in res]),
            f"{min(b.effective_congestion for b in res):.1%} - {max(b.effective_congestion for b in res):.1%}",
            f"{PUBLISHED_RANDOM:.0%} published (512-node Clos, static routing)")
    for label, routing in (("IB ftree", ib), ("RoCE ECMP", ecmp)):
        res = patterns(routing.path, order, shift)
        free = sum(b.contention_free for b in res)
        ref = "100 +- 3% (ftree: contention-free)" if routing is ib else "no promise (per-flow hashing)"
        row(f"{label}, shift permutations ({which})", pct_range([b.effective for b in res]),
            f"{free} contention-free", ref)
        if routing is ecmp:
            worst = min(res, key=lambda b: b.effective)
            print(f"    ECMP's worst shift: a link carries {worst.max_load} flows; "
                  f"flows below line rate {sum(r < 1 - 1e-9 for r in worst.rates)} of {n}")
    print(f"  ({time.perf_counter() - t0:.1f} s on this machine)")
    return topo, ib, ecmp


def cross_check(topo: Topology, ib: IbRouting, ecmp: EcmpRouting, cases: Sequence[tuple[str, str, list[int]]]) -> None:
    order = ib.shift_order()
    for routing, label, perm in cases:
        t0 = time.perf_counter()
        r = ib if routing == "ftree" else ecmp
        paths = paths_for(r.path, order, perm)
        want = evaluate(paths)
        flows = [(order[i], order[perm[i]], paths[i]) for i in range(len(order))]
        if routing == "ftree":
            got = simulate(topo, flows, kind="ib", size=IB_SIZE, warmup_ns=50_000, window_ns=100_000)
        else:
            got = simulate(topo, flows, kind="eth", size=ROCE_SIZE, eth=EthConfig(lossless=frozenset({0})),
                           warmup_ns=50_000, window_ns=100_000)
        err = [abs(a - b) for a, b in zip(got.rates, want.rates, strict=True)]
        within = sum(e <= 0.03 for e in err)
        print(f"  {routing:5s} {label:<22} sim {statistics.fmean(got.rates):6.1%}   max-min {want.effective:6.1%}   "
              f"per flow: max |diff| {max(err):5.1%}, {within}/{len(err)} within 3 points; drops {got.drops} "
              f"({time.perf_counter() - t0:.1f} s)")


def adaptive(k: int, seeds: int) -> None:
    """Adaptive routing (per packet) against static ftree in the packet-level simulator."""
    topo = generate("fat-tree", k=k)
    r = IbRouting(topo, "ftree_ar")
    order = r.shift_order()
    n = len(order)
    print(f" k={k} fat-tree ({n} hosts), random permutations, 4 KiB frames, 100 us after 50 us:")
    ratios: list[float] = []
    for seed in range(seeds):
        t0 = time.perf_counter()
        perm = random_permutation(n, seed)
        paths = paths_for(r.path, order, perm)
        flows = [(order[i], order[perm[i]], paths[i]) for i in range(n)]
        analytic = evaluate(paths).effective
        static = simulate(topo, flows, kind="ib", size=IB_SIZE, warmup_ns=50_000, window_ns=100_000)
        ar = simulate(topo, flows, kind="ib", size=IB_SIZE, warmup_ns=50_000, window_ns=100_000,
                      groups=lambda sw, dst: r.group(sw, r.lids[dst]))
        s_eff, a_eff = statistics.fmean(static.rates), statistics.fmean(ar.rates)
        ratios.append(a_eff / s_eff)
        spread = sum(len(p) > 1 for p in ar.ports_used.values())
        print(f"  seed {seed}: static ftree: max-min {analytic:6.1%}, sim {s_eff:6.1%}   adaptive per packet: sim "
              f"{a_eff:6.1%} (x{a_eff / s_eff:.2f}; worst flow {min(ar.rates):5.1%}); out of order "
              f"{sum(ar.reordered) / max(1, sum(ar.delivered)):5.1%} of {sum(ar.delivered)} frames; "
              f"{spread} (switch, destination) pairs used 2+ ports; drops {ar.drops} "
              f"({time.perf_counter() - t0:.1f} s)")
    print(f"  adaptive / static: x{min(ratios):.2f} - x{max(ratios):.2f} (target >= x1.5 on k=8); "
          f"fluid bound (flows split over every shortest path): 100%; load average "
          f"{os.getloadavg()[0]:.1f} (the figures are the model's, in emulated time: load changes only the run time)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="random permutations per routing (k=8)")
    ap.add_argument("--quick", action="store_true", help="k=8 only, no k=8 simulation")
    ap.add_argument("--ar-seeds", type=int, default=3, help="random permutations for adaptive routing (k=8)")
    ap.add_argument("--ar-only", action="store_true", help="only the adaptive routing comparison")
    args = ap.parse_args()
    print("Effective bisection under permutation traffic: mean flow rate / line rate, flows on the")
    print("paths ibemu's tables give them, max-min fair on the links (analytic); then the packet-level")
    print("model (physics/sim.py) on the same paths. Not measured on the live datapath.")
    if args.ar_only:
        print("Adaptive routing against static ftree (packet-level model, emulated time):")
        adaptive(4 if args.quick else 8, args.ar_seeds)
        return 0
    k8 = fabric(8, args.seeds, None)
    if not args.quick:
        fabric(16, max(3, args.seeds // 3), [1, 2, 3, 4, 8, 16, 31, 32, 64, 100, 128, 256, 257, 511, 512, 777, 1023])
    print("Cross-check: packet-level simulation (4 KiB frames, 100 us after 50 us) against max-min, same paths:")
    topo4 = generate("fat-tree", k=4)
    ib4, ecmp4 = IbRouting(topo4), EcmpRouting(topo4)
    print(" k=4 fat-tree (16 hosts):")
    cross_check(topo4, ib4, ecmp4, [
        ("ftree", "shift 1", shift_permutation(16, 1)), ("ftree", "shift 5", shift_permutation(16, 5)),
        *[("ftree", f"random seed {s}", random_permutation(16, s)) for s in range(3)],
        *[("ecmp", f"random seed {s}", random_permutation(16, s)) for s in range(3)],
    ])
    if not args.quick:
        print(" k=8 fat-tree (128 hosts):")
        cross_check(*k8, [("ftree", "shift 1", shift_permutation(128, 1)),
                          ("ftree", "random seed 0", random_permutation(128, 0)),
                          ("ecmp", "random seed 0", random_permutation(128, 0))])
    print("Adaptive routing against static ftree (packet-level model, emulated time):")
    adaptive(4 if args.quick else 8, args.ar_seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
