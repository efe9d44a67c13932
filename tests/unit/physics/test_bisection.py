"""Effective bisection: max-min fairness by hand, ftree's contention-free shifts, ECMP collisions."""

from __future__ import annotations

import itertools

import pytest

from ibemu.physics.bisection import (
    RoutingLoop,
    congestion_rates,
    evaluate,
    max_min_rates,
    random_permutation,
    shift_permutation,
    simulate,
    trace,
)
from ibemu.testing.bisection import EcmpRouting, IbRouting, qpn_of_flow
from ibemu.topo import generate
from ibemu.wire import fast
from ibemu.wire.rocecodec import RoceCodec


def test_one_link_shared_evenly() -> None:
    assert max_min_rates([["a"], ["a"], ["a"]]) == pytest.approx([1 / 3] * 3)


def test_max_min_gives_what_the_bottlenecked_leave() -> None:
    # f0 crosses A and B; f1 only A; f2, f3 only B. B is the bottleneck of f0, f2, f3 (1/3
    # each); f1 takes what is left of A (2/3), where 1/load gives it only 1/2.
    paths = [["A", "B"], ["A"], ["B"], ["B"]]
    assert max_min_rates(paths) == pytest.approx([1 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert congestion_rates(paths) == pytest.approx([1 / 3, 1 / 2, 1 / 3, 1 / 3])


def test_max_min_on_a_parking_lot() -> None:
    # a line of links 1-2-3: one long flow over all three, one short flow on each link
    paths = [[1, 2, 3], [1], [2], [3]]
    assert max_min_rates(paths) == pytest.approx([0.5] * 4)
    # link 2 twice as fast: the long flow is still held to 1/2 by links 1 and 3; the short
    # flow on 2 takes the rest
    assert max_min_rates(paths, {1: 1.0, 2: 2.0, 3: 1.0}) == pytest.approx([0.5, 0.5, 1.5, 0.5])


def test_flow_without_links_is_unbounded_and_others_unaffected() -> None:
    rates = max_min_rates([[], ["x"], ["x"]])
    assert rates[0] == float("inf") and rates[1:] == pytest.approx([0.5, 0.5])


def test_evaluate_effective_and_line_rate() -> None:
    b = evaluate([(("h0", 1), ("s", 2)), (("h1", 1), ("s", 2))], line=100.0)
    assert b.rates == pytest.approx([0.5, 0.5]) and b.effective == pytest.approx(0.5)
    assert b.max_load == 2 and not b.contention_free


def test_permutations() -> None:
    for seed in range(20):
        p = random_permutation(16, seed)
        assert sorted(p) == list(range(16)) and all(d != s for s, d in enumerate(p))
    assert random_permutation(16, 3) == random_permutation(16, 3)
    assert random_permutation(16, 3) != random_permutation(16, 4)
    assert shift_permutation(4, 1) == [1, 2, 3, 0]
    with pytest.raises(ValueError):
        shift_permutation(4, 8)


def test_trace_detects_a_loop() -> None:
    topo = generate("fat-tree", k=4)
    with pytest.raises(RoutingLoop):
        trace(topo, "h0", "h15", lambda sw: 3 if sw.startswith("edge") else 1)  # edge up, agg down: forever


@pytest.fixture(scope="module")
def k4() -> tuple[IbRouting, EcmpRouting]:
    topo = generate("fat-tree", k=4)
    return IbRouting(topo, "ftree"), EcmpRouting(topo)


def test_ftree_shift_permutations_are_contention_free_on_k4(k4: tuple[IbRouting, EcmpRouting]) -> None:
    ib, _ = k4
    order = ib.shift_order()
    assert order == [f"h{i}" for i in range(16)]  # ftree indexes the hosts leaf by leaf, pod by pod
    for s in range(1, 16):
        perm = shift_permutation(16, s)
        b = evaluate([ib.path(order[i], order[perm[i]]) for i in range(16)])
        assert b.contention_free, s
        assert b.rates == pytest.approx([1.0] * 16), s


def test_ftree_shift_contention_free_in_the_packet_model(k4: tuple[IbRouting, EcmpRouting]) -> None:
    ib, _ = k4
    order = ib.shift_order()
    perm = shift_permutation(16, 6)
    flows = [(order[i], order[perm[i]], ib.path(order[i], order[perm[i]])) for i in range(16)]
    got = simulate(ib.topo, flows, warmup_ns=20_000, window_ns=40_000)
    assert min(got.rates) > 0.97 and max(got.rates) < 1.01


def test_minhop_shifts_are_not_all_contention_free(k4: tuple[IbRouting, EcmpRouting]) -> None:
    """The shift test can fail: routing not built for shifts (minhop) collides on some."""
    ib, _ = k4
    mh = IbRouting(ib.topo, "minhop")
    order = ib.shift_order()
    worst = min(evaluate([mh.path(order[i], order[(i + s) % 16]) for i in range(16)]).effective
                for s in range(1, 16))
    assert worst < 1.0


def test_random_permutation_matches_the_packet_model(k4: tuple[IbRouting, EcmpRouting]) -> None:
    ib, _ = k4
    order = ib.shift_order()
    perm = random_permutation(16, 0)
    paths = [ib.path(order[i], order[perm[i]]) for i in range(16)]
    want = evaluate(paths)
    assert want.effective < 0.9  # contended: the comparison means something
    got = simulate(ib.topo, [(order[i], order[perm[i]], paths[i]) for i in range(16)],
                   warmup_ns=30_000, window_ns=60_000)
    assert got.rates == pytest.approx(want.rates, abs=0.03)


def test_ecmp_hash_is_the_datapaths(k4: tuple[IbRouting, EcmpRouting]) -> None:
    """The 5-tuple hashed is the one a RoCE port's frame carries (addresses, UDP, source port
    from the destination QP, 4791), read the datapath's way."""
    from ibemu.kernel.fib import flow_key

    _, ecmp = k4
    addrs = ecmp.addrs
    lid_ips = addrs.lid_ips()
    src, dst, index = "h0", "h9", 5
    codec = RoceCodec(lid=addrs.lid(src), ip=addrs.host_ip(src), lid_ips=lid_ips, mac=bytes(6), peer_mac=bytes(6))
    pkt = fast.NativeTemplate(slid=addrs.lid(src), dlid=addrs.lid(dst), destqp=qpn_of_flow(index)).packet(0x04, 1, b"x" * 64)
    frame = codec.encapsulate(pkt)
    assert frame is not None
    assert flow_key(frame) == ecmp.flow_key(src, dst, index)
    assert ecmp.flow_key(src, dst, index) != ecmp.flow_key(src, dst, index + 1)


def test_ecmp_collision_halves_two_flows(k4: tuple[IbRouting, EcmpRouting]) -> None:
    """Two flows leaving one edge switch for other pods: when the hash sends both up the same
    port they share it (half each), else each has its own (full rate)."""
    _, ecmp = k4
    outcomes: dict[bool, list[float]] = {}
    for i, j in itertools.combinations(range(8), 2):
        p0 = ecmp.path("h0", "h8", i)   # h0, h1 on edge0_0; h8, h12 in pods 2 and 3
        p1 = ecmp.path("h1", "h12", j)
        shared = set(p0) & set(p1)
        outcomes.setdefault(bool(shared), evaluate([p0, p1]).rates)
        if len(outcomes) == 2:
            break
    assert outcomes[True] == pytest.approx([0.5, 0.5])
    assert outcomes[False] == pytest.approx([1.0, 1.0])


def test_ecmp_loses_bisection_where_ftree_does_not(k4: tuple[IbRouting, EcmpRouting]) -> None:
    ib, ecmp = k4
    order = ib.shift_order()
    ftree = [evaluate([ib.path(order[i], order[(i + s) % 16]) for i in range(16)]).effective for s in range(1, 16)]
    hashed = [evaluate([ecmp.path(order[i], order[(i + s) % 16], i) for i in range(16)]).effective
              for s in range(1, 16)]
    assert min(ftree) == pytest.approx(1.0)
    assert min(hashed) < 1.0
