"""The live plane on a seeded fat-tree trace: every departure (where, when due, when it
started and ended on the wire, which frame, when it was sent), the links' statistics and
every port's counters and credits, digested, against the digest the plane gave before its
per-frame work was made cheaper (commit 0981fff): the optimized event loop takes the same
decisions at the same times.

The trace drives ``LivePlane`` as the IB user datapath does: frames from hosts enter at the
host's switch; each departure towards another switch comes back as an arrival there (its
record matched by the frame's key) after a random real delay, some lost on the way (their
records skipped), some consumed by the peer (its SMA took them), 2% VL15; with and without
four data VLs and their own arbitration tables. A deliberate change to the model changes the
digest: record the new one with the change, saying why."""

from __future__ import annotations

import hashlib
import random

import pytest

from ibemu.physics.link import SWITCH_MODELS
from ibemu.physics.live import LivePlane
from ibemu.physics.model import Frame
from ibemu.physics.plan import build_nodes
from ibemu.physics.qos import Sl2Vl, VlArb
from ibemu.testing.static_routes import assign_lids, minhop_lfts
from ibemu.topo import generate

Pending = tuple[int, str, int, tuple[int, int, int, bool, tuple[str, int]]]


def trace(seed: int, *, qos: bool, nframes: int = 1500) -> tuple[str, int]:
    rng = random.Random(seed)
    topo = generate("fat-tree", k=4)
    nodes = build_nodes(topo, kind="ib", switch=SWITCH_MODELS["ib-edr"])
    plane = LivePlane(nodes)
    if qos:
        for name, node in nodes.items():
            for port in node.ports:
                ins = list(node.ports) if node.switch else [0]
                plane.set_qos(name, port, data_vls=4,
                              vlarb=VlArb(high=((1, 4), (2, 1)), low=((0, 2), (3, 1)), high_limit=2),
                              sl2vl={i: Sl2Vl(tuple(sl % 4 for sl in range(16))) for i in ins if i != port})
    lids = assign_lids(topo)
    lfts = minhop_lfts(topo, lids)
    hosts = sorted(n for n in nodes if not nodes[n].switch)
    attach = {p.peer[0]: (name, num) for name, node in nodes.items() if node.switch
              for num, p in node.ports.items() if p.peer and p.peer[0] in hosts}
    h = hashlib.sha256()
    pending: list[Pending] = []
    departures = 0

    def feed(sw: str, inp: int, args: tuple[int, int, int, bool, tuple[str, int]], now: int) -> None:
        dst_lid, size, sl, vl15, key = args
        egress = lfts[sw].get(dst_lid)
        if egress is None or egress == inp:
            return
        plane.arrive(sw, inp, Frame(size, sl=sl, dst=egress, flow=key, vl15=vl15, meta=(key, dst_lid)), now)

    def send(now: int, delay: int | None) -> None:
        nonlocal departures
        for d in plane.run(now):
            rec = (d.switch, d.port, d.due_ns, d.start_ns, d.end_ns, d.frame.flow, now)
            h.update(repr(rec).encode())
            departures += 1
            p = plane.nodes[d.switch].ports[d.port].peer
            if p and plane.nodes[p[0]].switch:
                key, dl = d.frame.meta
                wait = rng.randrange(1000, 30000) if delay is None else delay
                pending.append((now + wait, p[0], p[1], (dl, d.frame.size, d.frame.sl, d.frame.vl15, key)))

    t = 0
    for i in range(nframes):
        t += rng.choice((0, 0, 50, 300, 2000, 20000))
        src, dst = rng.sample(hosts, 2)
        sw, inp = attach[src]
        size = rng.choice((60, 300, 1054, 2078, 4126))
        sl = rng.randrange(4) if qos else 0
        vl15 = rng.random() < 0.02
        pending.sort(key=lambda x: x[0])
        while pending and pending[0][0] <= t:
            pt, psw, pin, args = pending.pop(0)
            if rng.random() < 0.01:
                continue  # lost on the veth
            if rng.random() < 0.01:
                plane.consume(psw, pin, args[4], pt)
                continue
            feed(psw, pin, args, pt)
        feed(sw, inp, (lids[dst], size, sl, vl15, ("f", i + 1)), t)
        send(t, None)
        if i % 500 == 0:
            plane.expire(t)
    while True:
        nd = plane.next_deadline()
        if nd is None and not pending:
            break
        now = min(x for x in (nd, min((p[0] for p in pending), default=None)) if x is not None)
        pending.sort(key=lambda x: x[0])
        while pending and pending[0][0] <= now:
            pt, psw, pin, args = pending.pop(0)
            feed(psw, pin, args, pt)
        send(now, 5000)
    st = plane.take_stats()
    h.update(repr(sorted((k, v.frames, v.bytes, v.busy_model_ns, v.busy_real_ns, sum(v.late_ns))
                         for k, v in st.items())).encode())
    for name in sorted(plane.nodes):
        n = plane.nodes[name]
        for num in sorted(n.ports):
            c = n.ports[num].counters
            h.update(repr((name, num, c.xmit_frames, c.xmit_bytes, c.rcv_frames, c.xmit_wait_ns, c.credit_stalls,
                           c.max_queue_bytes, n.ports[num].credits)).encode())
    h.update(repr((plane.frames_in, plane.unmatched, plane.drops)).encode())
    return h.hexdigest()[:16], departures


BEFORE = {  # (seed, qos): (digest, departures), as commit 0981fff's plane gave them
    (1, False): ("21792cd1547c39de", 6456),
    (1, True): ("f9ba84fe821e3f2d", 6462),
    (2, False): ("d9c9568f4809b67a", 6453),
    (2, True): ("9d2b35290e03b2c0", 6434),
}


@pytest.mark.parametrize("seed, qos", sorted(BEFORE))
def test_the_plane_departs_as_before_it_was_made_cheaper(seed: int, qos: bool) -> None:
    assert trace(seed, qos=qos) == BEFORE[(seed, qos)]
