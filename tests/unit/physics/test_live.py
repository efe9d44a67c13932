"""The live plane: the model driven by frames that arrive at real times (``ibemu.physics.live``)."""

from __future__ import annotations

import itertools

from ibemu.physics.link import SWITCH_MODELS
from ibemu.physics.live import LivePlane
from ibemu.physics.model import Frame
from ibemu.physics.plan import build_nodes
from ibemu.topo import generate

EDR = SWITCH_MODELS["ib-edr"]
SIZE = 4096 + 30  # an IB packet of 4 KiB payload (LRH .. VCRC, about)


def frame(out: int, n: int = 0) -> Frame:
    return Frame(SIZE, dst=out, flow=("k", n), meta=n)


def drain(plane: LivePlane, until: int) -> list[tuple[int, int, object]]:
    """Wake the plane at every deadline up to ``until``: (sent at, due, frame number)."""
    out = []
    while True:
        t = plane.next_deadline()
        if t is None or t > until:
            return out
        out += [(t, d.due_ns, d.frame.meta) for d in plane.run(t)]


def test_one_switch_line_rate_and_hop_latency() -> None:
    topo = generate("single-switch", hosts=2)
    nodes = build_nodes(topo, kind="ib", switch=EDR)
    plane = LivePlane(nodes)
    link = nodes["sw0"].ports[2].link
    ser = link.frame_ns(SIZE)
    for n in range(50):  # a host offering everything at once: its HCA queue holds them
        plane.arrive("sw0", 1, frame(2, n), 0)
    sent = drain(plane, 10**9)
    assert [m for _, _, m in sent] == list(range(50))
    # first frame: host cable serialization, the switch latency, the egress serialization
    assert sent[0][1] == ser + EDR.latency_ns + ser
    gaps = {b[1] - a[1] for a, b in itertools.pairwise(sent)}
    assert gaps == {ser}  # back to back at line rate, never faster
    assert all(t == due for t, due, _ in sent)  # woken at each deadline: nothing late
    st = plane.take_stats()[("sw0", 2)]
    assert st.frames == 50 and st.busy_ratio() == 1.0 and max(st.late_ns) == 0


def test_coalesced_wakeups_serve_every_frame_due_and_count_lateness() -> None:
    nodes = build_nodes(generate("single-switch", hosts=2), kind="ib", switch=EDR)
    plane = LivePlane(nodes)
    for n in range(20):
        plane.arrive("sw0", 1, frame(2, n), 0)
    ds = plane.run(100_000)  # one late wake-up: every frame due by then leaves
    assert len(ds) == 20
    st = plane.take_stats()[("sw0", 2)]
    assert min(st.late_ns) > 0
    r = st.busy_ratio()
    assert r is not None and r > 1.0  # late, then caught up in a burst: faster than the line meanwhile


def test_two_switches_credit_between_them_and_matched_arrivals() -> None:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    # three packets' worth of credits per VL: enough for line rate (a packet holds its buffer
    # for the switch latency and its own serialization there, store and forward), no more
    small = EDR.__class__("tiny", EDR.latency_ns, 3 * 4160)
    nodes = build_nodes(topo, kind="ib", switch=small)
    plane = LivePlane(nodes)
    ser = nodes["leaf0"].ports[2].link.frame_ns(SIZE)
    for n in range(10):
        plane.arrive("leaf0", 1, frame(2, n), 0)
    out: list[tuple[str, int, int]] = []
    # what leaf0 sends to the spine is received there (here: at once) and forwarded to port 2
    for _ in range(10_000):
        t = plane.next_deadline()
        if t is None:
            break
        for d in plane.run(t):
            out.append((d.switch, d.port, d.due_ns))
            if d.switch == "leaf0":
                plane.arrive("spine0", 1, Frame(SIZE, dst=2, flow=d.frame.flow, meta=d.frame.meta), t)
            elif d.switch == "spine0":
                plane.arrive("leaf1", 2, Frame(SIZE, dst=1, flow=d.frame.flow, meta=d.frame.meta), t)
    assert plane.unmatched == 0
    last = [due for sw, _, due in out if sw == "leaf1"]
    assert len(last) == 10
    hop = EDR.latency_ns + ser
    assert last[0] == ser + 3 * hop  # host cable, then three store-and-forward hops
    assert {b - a for a, b in itertools.pairwise(last)} == {ser}
    assert plane.drops == 0


def test_credits_stall_the_upstream_switch_and_count_xmit_wait() -> None:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    small = EDR.__class__("tiny", EDR.latency_ns, 2 * 4160)
    nodes = build_nodes(topo, kind="ib", switch=small)
    plane = LivePlane(nodes)
    for n in range(6):
        plane.arrive("leaf0", 1, frame(2, n), 0)
    # the spine never forwards (its frames are not handed on): leaf0 runs out of credits
    sent = drain(plane, 10**7)
    assert len([1 for *_, m in sent]) == 2
    p = nodes["leaf0"].ports[2]
    assert p.counters.credit_stalls >= 1 and p.total_bytes > 0


def test_a_lone_frame_from_a_switch_is_woken_for_without_other_traffic() -> None:
    """A frame received from a neighbour switch waits in the switch's pipeline: the plane
    must have a deadline for it even though the node returned no action yet."""
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    nodes = build_nodes(topo, kind="ib", switch=EDR)
    plane = LivePlane(nodes)
    ser = nodes["leaf0"].ports[2].link.frame_ns(SIZE)
    plane.arrive("leaf0", 1, frame(2, 0), 0)
    first = drain(plane, 10**9)
    assert len(first) == 1 and plane.next_deadline() is None
    t = first[0][0] + 5000  # the spine reads it 5 us after it was due (the veth's latency)
    plane.arrive("spine0", 1, Frame(SIZE, dst=2, flow=("k", 0)), t)
    nxt = plane.next_deadline()
    assert nxt is not None and nxt <= t  # due already (its deadline passed while on the veth)
    (d,) = plane.run(t)  # the driver's wake-up: sent at once
    # its model arrival was the matched one, so its departure is due a hop after leaf0's
    assert d.due_ns == first[0][1] + EDR.latency_ns + ser
    assert max(plane.take_stats()[("spine0", 2)].late_ns) == t - d.due_ns  # late, and counted so


def test_a_datapath_lagging_behind_the_model_loses_no_credit() -> None:
    """Every switch reads its frames 50 us after the model had them arrive (a datapath behind
    the clock): matched arrivals lie in the past of nodes that moved on; all frames still get
    through and every credit comes back (a node's time never goes back)."""
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    nodes = build_nodes(topo, kind="ib", switch=EDR)
    plane = LivePlane(nodes)
    n_frames, size = 1000, 238
    for n in range(n_frames):
        plane.arrive("leaf0", 1, Frame(size, dst=2, flow=n, meta=n), n * 100)
    pending: list[tuple[int, str, int, Frame]] = []
    now = delivered = 0
    nxt = {"leaf0": ("spine0", 1, 2), "spine0": ("leaf1", 2, 1)}
    while delivered < n_frames and now < 10**9:
        now += 1000
        for d in plane.run(now):
            if d.switch in nxt:
                sw, port, out = nxt[d.switch]
                pending.append((now + 50_000, sw, port, Frame(size, dst=out, flow=d.frame.flow, meta=d.frame.meta)))
            else:
                delivered += 1
        for item in [p for p in pending if p[0] <= now]:
            plane.arrive(item[1], item[2], item[3], now)
        pending = [p for p in pending if p[0] > now]
    assert delivered == n_frames and plane.unmatched == 0
    full = EDR.buffer_bytes // 64
    assert nodes["leaf0"].ports[2].credits[0] == full and nodes["h0"].ports[1].credits[0] == full
    assert nodes["spine0"].ports[2].credits[0] == full


def test_frames_a_switch_consumed_or_lost_give_their_credits_back() -> None:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    nodes = build_nodes(topo, kind="ib", switch=EDR)
    # the event loop alone: frame 2 then waits in the spine's pipeline until the model is next
    # played (the fast path plays its whole way through the spine at once: its credits too)
    plane = LivePlane(nodes, fast=False)
    for n in range(3):
        plane.arrive("leaf0", 1, frame(2, n), 0)
    sent = drain(plane, 10**6)
    assert len(sent) == 3
    full = EDR.buffer_bytes // 64
    assert nodes["leaf0"].ports[2].credits[0] == full - 3 * 65
    assert plane.consume("spine0", 1, ("k", 0), 10**6)  # the spine's SMA took it
    assert nodes["leaf0"].ports[2].credits[0] == full - 2 * 65
    plane.arrive("spine0", 1, frame(2, 2), 10**6)  # frame 1 was lost on the veth: skipped
    assert nodes["leaf0"].ports[2].credits[0] == full - 65
    assert plane.expire(10**6) == 0 and plane.unmatched == 0
    plane.run(10**6)
    assert nodes["leaf0"].ports[2].credits[0] == full  # frame 2 has left the spine since


def test_a_cable_that_went_down_gets_its_credits_back_at_link_up() -> None:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    nodes = build_nodes(topo, kind="ib", switch=EDR)
    plane = LivePlane(nodes)
    for n in range(5):
        plane.arrive("leaf0", 1, frame(2, n), 0)
    drain(plane, 10**6)  # five frames left leaf0 for the spine: lost on a cable that went down
    full = EDR.buffer_bytes // 64
    assert nodes["leaf0"].ports[2].credits[0] == full - 5 * 65
    plane.link_reset("spine0", 1, 2 * 10**6)  # the spine saw its port go down / come up
    assert nodes["leaf0"].ports[2].credits[0] == full
    plane.arrive("spine0", 1, frame(2, 0), 3 * 10**6)  # a late straggler: unmatched, enters now
    assert plane.unmatched == 1 and nodes["leaf0"].ports[2].credits[0] == full - 65  # debited then
    drain(plane, 10**8)
    assert nodes["leaf0"].ports[2].credits[0] == full  # and given back when it left: balanced


def _stuck_uplink() -> tuple[LivePlane, dict]:
    """h0 offers 30 frames to leaf0's uplink 3, whose cable then goes dead: the spine never
    receives what leaf0 sent it, so no credit comes back. leaf0's input buffer from h0 fills
    with frames for port 3, and h0's HCA queue holds the rest behind them."""
    topo = generate("leaf-spine", leaves=2, spines=2, hosts_per_leaf=2)
    nodes = build_nodes(topo, kind="ib", switch=EDR)
    plane = LivePlane(nodes)
    for n in range(30):
        plane.arrive("leaf0", 1, frame(3, n), 0)
    drain(plane, 10**6)
    return plane, nodes


def test_a_port_going_down_discards_its_queue_and_frees_the_flows_behind_it() -> None:
    plane, nodes = _stuck_uplink()
    leaf0 = nodes["leaf0"]
    per_frame = -(-SIZE // 64)
    assert leaf0.ports[3].credits[0] < per_frame and leaf0.ports[3].queues[0]  # stuck for credits
    plane.link_down("leaf0", 3, 10**6)  # the cable is cut (both ends)
    assert not leaf0.ports[3].up and not nodes["spine0"].ports[1].up
    assert not leaf0.ports[3].pending() and leaf0.ports[3].credits[0] == 0
    # the forwarder now picks uplink 4 (the SM rerouted): those frames leave at once, the frames
    # still in h0's queue that were decided for port 3 being discarded when they reach it
    for n in range(5):
        plane.arrive("leaf0", 1, frame(4, 100 + n), 10**6)
    sent = drain(plane, 2 * 10**6)
    assert [m for _, _, m in sent] == [100, 101, 102, 103, 104]
    assert sent[-1][1] < 10**6 + 50_000  # within the serialization of what h0 still had queued
    c = leaf0.ports[3].counters
    assert c.xmit_discards == 30 - c.xmit_frames  # everything not sent before the cut, counted
    assert plane.drop_reasons == {"port_down": c.xmit_discards}
    assert leaf0.ingress_blocks[(1, 0)] == 0  # h0's input buffer is free again
    assert nodes["h0"].ports[1].credits[0] == EDR.buffer_bytes // 64  # and h0 has its credits
    plane.arrive("spine0", 1, frame(2, 7), 2 * 10**6)  # a straggler the veth still delivered: lost
    assert plane.drop_reasons["port_down"] == c.xmit_discards + 1 and leaf0.ports[3].credits[0] == 0
    # the cable comes back: each end's credits are what the other's input buffer has free
    plane.link_up("spine0", 1, 3 * 10**6)
    assert leaf0.ports[3].up and leaf0.ports[3].credits[0] == EDR.buffer_bytes // 64
    plane.arrive("leaf0", 1, frame(3, 200), 3 * 10**6)
    assert [m for _, _, m in drain(plane, 4 * 10**6)] == [200]


def test_credits_resynchronized_alone_leave_the_flows_behind_a_dead_port_blocked() -> None:
    """What the plane did before ports went down in the model (``link_reset`` alone): the
    frames queued for the dead port kept h0's input buffer, and h0's traffic for the other
    uplink waited behind them (until the RC transport's timeouts, live)."""
    plane, _ = _stuck_uplink()
    plane.link_reset("leaf0", 3, 10**6)
    for n in range(5):
        plane.arrive("leaf0", 1, frame(4, 100 + n), 10**6)
    sent = drain(plane, 2 * 10**6)
    assert not [m for _, _, m in sent if isinstance(m, int) and m >= 100]


def test_frames_still_in_a_hosts_queue_take_the_new_route_when_their_port_went_down() -> None:
    """A real switch looks its LFT up when a frame reaches it: the frames still in h0's HCA
    queue at the cut are decided again (``redecide``: the datapath's forwarder, rerouted by
    now) instead of being discarded with what leaf0 already held for the dead port."""
    plane, nodes = _stuck_uplink()
    leaf0 = nodes["leaf0"]
    in_host = len(nodes["h0"].ports[1].queues[0])
    asked: list[tuple[str, int]] = []

    def redecide(switch: str, in_port: int, f: Frame) -> None:
        asked.append((switch, in_port))
        f.dst = 4  # the SM's new LFT: the other spine

    plane.redecide = redecide
    queued_at_leaf0 = len(leaf0.ports[3].queues[0])
    plane.link_down("leaf0", 3, 10**6)
    sent = drain(plane, 2 * 10**6)
    # h0's queue moves again (the discards freed its credits); spine1 receives nothing in this
    # test, so leaf0:4 sends what its credits allow and holds the rest
    out4 = leaf0.ports[4].counters.xmit_frames
    assert in_host > 0 and set(asked) == {("leaf0", 1)} and len(asked) == plane.redecided
    assert len(asked) == out4 + len(leaf0.ports[4].queues[0]) and out4 == EDR.buffer_bytes // 64 // -(-SIZE // 64)
    assert [m for _, _, m in sent] == sorted(m for _, _, m in sent) and len(sent) == out4  # in order
    assert leaf0.ports[3].counters.xmit_discards == queued_at_leaf0  # none of h0's queue discarded
