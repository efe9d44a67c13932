"""The live plane's fast path against its event loop: the same seeded random traces, played
once with the fast path and once without, give the same departures (every one: where, when
due, when it started and ended on the wire, which frame, when it was sent, in the same order),
the same link statistics, and leave every port, node and the plane in the same state
(counters, credits, input buffers, arbitration tables, waits, records of frames in flight).

Traces: a k=4 fat-tree, frames from hosts to hosts, each departure towards a switch coming back
as an arrival there after a random real delay (some lost on the way, some consumed by the
switch), the datapath's pattern; light (frames far apart: every hop between switches finds
its port idle) and congested (bursts, frames of up to 4 KiB, back-to-back incast: queues,
credit waits), with one data VL, eight (the ports' default), four with a high-priority table,
and two of which one VL no table serves (its frames wait for ever); a cable between two
switches cut and brought back, and the QoS tables changed, in the middle of some."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ibemu.physics.link import SWITCH_MODELS
from ibemu.physics.live import LivePlane
from ibemu.physics.model import Frame
from ibemu.physics.plan import build_nodes
from ibemu.physics.qos import Arbiter, Sl2Vl, VlArb
from ibemu.testing.static_routes import assign_lids, minhop_lfts
from ibemu.topo import generate

QOS = {
    "one": None,
    "eight": (8, VlArb.default(8)),
    "high": (4, VlArb(high=((1, 4), (2, 1)), low=((0, 2), (3, 1)), high_limit=2)),
    "starved": (2, VlArb(low=((0, 1),))),
}


def _set_qos(plane: LivePlane, vls: int, arb: VlArb) -> None:
    for name, node in plane.nodes.items():
        for port in node.ports:
            ins = list(node.ports) if node.switch else [0]
            plane.set_qos(name, port, data_vls=vls, vlarb=arb,
                          sl2vl={i: Sl2Vl(tuple(sl % vls for sl in range(16))) for i in ins if i != port})


def _state(plane: LivePlane) -> Any:
    """Everything of the plane a later frame or a report could see."""
    out: list[Any] = [plane.frames_in, plane.unmatched, plane.drops, sorted(plane.drop_reasons.items()),
                      {k: list(q) for k, q in plane._flight.items() if q}]
    for name in sorted(plane.nodes):
        n = plane.nodes[name]
        out.append((name, sorted(n.ingress_bytes.items()), sorted(n.ingress_blocks.items()), n.delivered,
                    sorted(n._busy), [(t, f.flow, o) for t, _, f, o in sorted(n._pipeline, key=lambda x: x[:2])]))
        for num in sorted(n.ports):
            p = n.ports[num]
            arb = p.arbiter
            out.append((num, repr(p.counters), list(p.credits), p.total_bytes, p.queued, list(p.queued_bytes),
                        [[f.flow for f in q] for q in p.queues], p.busy_until, p.waiting_since,
                        sorted(p.blocked_since.items()), sorted(p.last_credit_ns.items()), p.up,
                        None if p.in_flight is None else (p.in_flight[0].flow, p.in_flight[1:]),
                        None if arb is None else (repr(arb._high), repr(arb._low), arb._high_bytes, arb._high_pkts)))
    return out


def trace(seed: int, *, fast: bool, qos: str, congested: bool, faults: bool,
          nframes: int = 700) -> tuple[list[tuple[Any, ...]], Any, Any, int]:
    rng = random.Random(seed)
    topo = generate("fat-tree", k=4)
    nodes = build_nodes(topo, kind="ib", switch=SWITCH_MODELS["ib-edr"])
    plane = LivePlane(nodes, fast=fast)
    if QOS[qos] is not None:
        _set_qos(plane, *QOS[qos])  # type: ignore[misc]
    lids = assign_lids(topo)
    lfts = minhop_lfts(topo, lids)
    hosts = sorted(n for n in nodes if not nodes[n].switch)
    attach = {p.peer[0]: (name, num) for name, node in nodes.items() if node.switch
              for num, p in node.ports.items() if p.peer and p.peer[0] in hosts}
    trunks = sorted((name, num) for name, node in nodes.items() if node.switch
                    for num, p in node.ports.items() if p.peer and nodes[p.peer[0]].switch)
    departures: list[tuple[Any, ...]] = []
    pending: list[tuple[int, int, str, int, tuple[Any, ...]]] = []
    order = 0

    def feed(sw: str, inp: int, args: tuple[Any, ...], now: int) -> None:
        dst_lid, size, sl, vl15, key = args
        egress = lfts[sw].get(dst_lid)
        if egress is None or egress == inp:
            return
        plane.arrive(sw, inp, Frame(size, sl=sl, dst=egress, flow=key, vl15=vl15, meta=(key, dst_lid)), now)

    def send(now: int) -> None:
        nonlocal order
        for d in plane.run(now):
            departures.append((d.switch, d.port, d.due_ns, d.start_ns, d.end_ns, d.frame.flow, now))
            p = plane.nodes[d.switch].ports[d.port].peer
            if p and plane.nodes[p[0]].switch:
                key, dl = d.frame.meta
                order += 1
                lo, hi = (200, 3000) if congested else (1000, 30000)
                pending.append((now + rng.randrange(lo, hi), order, p[0], p[1],
                                (dl, d.frame.size, d.frame.sl, d.frame.vl15, key)))

    def deliver_until(t: int) -> None:
        pending.sort()
        while pending and pending[0][0] <= t:
            pt, _, psw, pin, args = pending.pop(0)
            r = rng.random()
            if r < 0.01:
                continue  # lost on the veth
            if r < 0.02:
                plane.consume(psw, pin, args[4], pt)
                continue
            feed(psw, pin, args, pt)

    gaps = (0, 0, 0, 20, 100, 600) if congested else (2000, 5000, 20000)
    sizes = (60, 300, 1054, 2078, 4126) if congested else (60, 1054)
    sls = 4 if qos in ("high", "eight") else 2 if qos == "starved" else 1
    dsts = hosts[:3] if congested else hosts
    cut: tuple[str, int] | None = None
    t = 0
    for i in range(nframes):
        t += rng.choice(gaps)
        deliver_until(t)
        src, dst = rng.sample(hosts, 2)
        if congested and rng.random() < 0.7:
            dst = rng.choice(dsts)
            if dst == src:
                continue
        sw, inp = attach[src]
        feed(sw, inp, (lids[dst], rng.choice(sizes), rng.randrange(sls), rng.random() < 0.02, ("f", i)), t)
        send(t)
        if faults and i == nframes // 3:
            cut = rng.choice(trunks)
            plane.link_down(*cut, t)
            send(t)
        if faults and cut is not None and i == nframes // 2:
            plane.link_up(*cut, t)
            send(t)
            if QOS[qos] is not None:
                vls, arb = QOS[qos]  # type: ignore[misc]
                _set_qos(plane, vls, VlArb(low=tuple(reversed(arb.low)), high=arb.high, high_limit=arb.high_limit))
        if i % 200 == 0:
            plane.expire(t)
    while True:
        nd = plane.next_deadline()
        if nd is None and not pending:
            break
        t = min(x for x in (nd, min((p[0] for p in pending), default=None)) if x is not None)
        if t > 10**10:
            break  # frames on a VL no table serves wait for ever
        deliver_until(t)
        send(t)
    stats = sorted((k, v.frames, v.bytes, v.busy_model_ns, v.busy_real_ns, v.late_ns, v.last_due, v.last_end,
                    v.last_sent) for k, v in plane.take_stats().items())
    return departures, stats, _state(plane), plane.fast_hops


@pytest.mark.parametrize("congested", [False, True], ids=["light", "congested"])
@pytest.mark.parametrize("qos", sorted(QOS))
def test_the_fast_path_departs_as_the_event_loop(qos: str, congested: bool) -> None:
    for seed in (1, 2):
        faults = seed == 2
        d_slow, s_slow, st_slow, none = trace(seed, fast=False, qos=qos, congested=congested, faults=faults)
        d_fast, s_fast, st_fast, hops = trace(seed, fast=True, qos=qos, congested=congested, faults=faults)
        assert none == 0
        assert hops > 0.2 * len(d_fast)  # the fast path took a good share of the hops
        assert len(d_fast) == len(d_slow)
        for i, (a, b) in enumerate(zip(d_fast, d_slow, strict=True)):
            assert a == b, f"departure {i} of {len(d_slow)}"
        assert s_fast == s_slow
        assert st_fast == st_slow


def test_the_arbiters_choice_for_one_queued_vl_is_its_scans() -> None:
    """``Arbiter.pick_only`` (one data VL queued, no high table: the closed form both paths
    use) against ``Arbiter.pick``'s scan of the table: the same choice and the same state, on
    random tables (weights 0 included, VLs missing) from random states, VL ready or not."""
    rng = random.Random(5)
    cases = 0
    for _ in range(400):
        n = rng.choice((1, 2, 3, 8, 9))
        table = tuple((rng.randrange(4), rng.choice((0, 1, 2, 5))) for _ in range(n))
        scan, closed = Arbiter(VlArb(low=table)), Arbiter(VlArb(low=table))
        for _ in range(12):
            vl, ready = rng.randrange(4), rng.random() < 0.8
            got = closed.pick_only(vl, ready)
            want = scan.pick(lambda v, vl=vl, ready=ready: v == vl and ready, 1 << vl)
            assert got == (want is not None) and (want is None or want == vl)
            if want is not None:
                nbytes = rng.choice((60, 1054, 4126))
                scan.sent(vl, nbytes)
                closed.sent(vl, nbytes)
            assert repr(closed) == repr(scan)
            cases += want is not None
    assert cases > 1000
