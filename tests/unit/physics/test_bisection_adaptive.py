"""Adaptive routing in the packet-level simulator (``physics.bisection.simulate(groups=...)``):
on a k=4 fat-tree routed by ``ftree_ar``, a random permutation whose static ftree paths collide
gets more through when the switches choose the least-loaded port of each group per packet;
a contention-free shift loses nothing; flowlets of saturating senders never end (no gap), so
they keep their first port and nothing is reordered."""

from __future__ import annotations

import statistics

from ibemu.physics.bisection import evaluate, random_permutation, shift_permutation, simulate
from ibemu.testing.bisection import IbRouting
from ibemu.topo import generate

TOPO = generate("fat-tree", k=4)
R = IbRouting(TOPO, "ftree_ar")
ORDER = R.shift_order()


def _flows(perm: list[int]) -> list[tuple[str, str, tuple[tuple[str, int], ...]]]:
    return [(ORDER[i], ORDER[perm[i]], R.path(ORDER[i], ORDER[perm[i]], i)) for i in range(len(ORDER))]


def _groups(sw: str, dst: object) -> tuple[int, ...]:
    return R.group(sw, R.lids[str(dst)])


def test_adaptive_routing_beats_static_paths_on_a_colliding_permutation() -> None:
    flows = _flows(random_permutation(16, 0))
    analytic = evaluate([f[2] for f in flows]).effective
    static = simulate(TOPO, flows, warmup_ns=20_000, window_ns=30_000)
    ar = simulate(TOPO, flows, warmup_ns=20_000, window_ns=30_000, groups=_groups)
    s, a = statistics.fmean(static.rates), statistics.fmean(ar.rates)
    assert analytic < 0.8 and abs(s - analytic) < 0.05  # static: the collisions max-min predicts
    assert a > 1.3 * s and a > 0.9
    assert any(len(p) > 1 for p in ar.ports_used.values())
    assert sum(ar.reordered) > 0 and not any(static.reordered)  # spraying reorders; one path does not
    assert ar.drops == 0


def test_contention_free_shift_and_flowlets() -> None:
    flows = _flows(shift_permutation(16, 1))
    ar = simulate(TOPO, flows, warmup_ns=20_000, window_ns=30_000, groups=_groups)
    assert statistics.fmean(ar.rates) > 0.97
    flowlet = simulate(TOPO, _flows(random_permutation(16, 0)), warmup_ns=20_000, window_ns=30_000,
                       groups=_groups, flowlet_gap_ns=2_000)
    assert not any(flowlet.reordered)
    assert all(len(p) == 1 for p in flowlet.ports_used.values())
