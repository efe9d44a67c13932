"""The IB model: credits per VL, no drops, PortXmitWait, head-of-line blocking and congestion
spreading, SL -> VL maps, VL arbitration; one flow and one hop against the analytic figures."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu.physics import expect
from ibemu.physics.link import LinkModel
from ibemu.physics.model import (
    CreditReturn,
    Deliver,
    Drop,
    Frame,
    IbPortConfig,
    Node,
    Transmit,
)
from ibemu.physics.qos import Arbiter, Sl2Vl, VlArb, blocks, code_of_vls, vls_of_code
from ibemu.physics.sim import Flow, Simulator
from ibemu.topo.rates import parse_rate

EDR = LinkModel.of(parse_rate("4x EDR"), cable_m=2)


def _single_switch(hosts: int, *, buffer: int = 16 * 1024, vls: int = 1,
                   link: LinkModel = EDR) -> Simulator:
    """Hosts h0..h{n-1} on switch s port i+1; flows address hosts by name."""
    sim = Simulator("ib", lambda sw, f: int(str(f.dst)[1:]) + 1)
    sim.add_switch("s", latency_ns=90)
    for i in range(hosts):
        sim.add_host(f"h{i}")
        cfg = IbPortConfig(data_vls=vls, buffer_bytes=buffer)
        sim.cable(f"h{i}", 1, "s", i + 1, link, ib_a=cfg, ib_b=cfg)
    return sim


@pytest.mark.parametrize("rate", ["4x EDR", "NDR"])
def test_one_flow_at_line_rate(rate: str) -> None:
    link = LinkModel.of(parse_rate(rate), cable_m=2)
    sim = _single_switch(2, link=link, buffer=32 * 1024)
    fl = sim.add_flow(Flow("h0", "h1", size=4126, frames=500))
    sim.run(10**9)
    assert fl.delivered == 500
    path = expect.path_latency_ns(4126, [link, link], [90])
    assert fl.latencies[0] == path
    want = expect.flow_rate_gbps(4126, 500, link, path)
    assert fl.rate_gbps() == pytest.approx(want, rel=1e-3)
    assert 0.97 <= fl.rate_gbps() / link.gbps <= 1.005


@pytest.mark.parametrize(("buffer", "size"), [(16 * 1024, 4126), (8 * 1024, 2078), (4 * 1024, 1054)])
def test_a_small_buffer_limits_a_flow_as_the_credit_loop_says(buffer: int, size: int) -> None:
    link = LinkModel.of(parse_rate("NDR"), cable_m=2)
    sim = _single_switch(2, link=link, buffer=buffer)
    fl = sim.add_flow(Flow("h0", "h1", size=size, frames=2000))
    sim.run(10**9)
    want = expect.credit_limited_gbps(size, buffer, link, 90)
    assert want < 0.95 * link.gbps
    assert fl.rate_gbps() == pytest.approx(want, rel=0.02)
    assert sim.drops == 0


def test_credits_bound_what_is_in_flight_and_nothing_drops() -> None:
    """2:1 incast: each sender half of the port, no drop, credits never negative, senders wait."""
    sim = _single_switch(3, buffer=8 * 1024)
    a = sim.add_flow(Flow("h0", "h2", size=2048, frames=400))
    b = sim.add_flow(Flow("h1", "h2", size=2048, frames=400))
    seen_min = []
    orig = sim._dispatch

    def spy(actions: Any) -> None:  # (on the simulator: a compiled Node's methods cannot be replaced)
        orig(actions)
        seen_min.append(sim.nodes["h0"].ports[1].credits[0])

    sim._dispatch = spy  # type: ignore[method-assign]
    sim.run(10**9)
    assert sim.drops == 0
    assert a.delivered == b.delivered == 400
    assert min(c for c in seen_min if c is not None) >= 0
    # while both send, the shares are equal: compare deliveries halfway
    assert a.last_ns is not None and b.last_ns is not None
    assert abs(a.last_ns - b.last_ns) / max(a.last_ns, b.last_ns) < 0.03
    h0 = sim.nodes["h0"].ports[1].counters
    assert h0.xmit_wait_ns > 0 and h0.credit_stalls > 0
    # the switch port's buffer never held more than it advertised
    sw = sim.nodes["s"]
    assert all(v == 0 for v in sw.ingress_bytes.values())


def _hol_fabric(victim_sl: int, vls: int) -> tuple[Simulator, Flow, list[Flow]]:
    """s1 (h0, h1) -- s2 (h2 hotspot, h3, h4, h5): h0, h4, h5 -> h2 (3:1), victim h1 -> h3
    shares the s1 -> s2 cable with h0 -> h2."""
    ports = {"s1": {"h2": 3, "h3": 3}, "s2": {"h2": 1, "h3": 2, "h4": 3, "h5": 4}}

    def route(sw: str, f: Frame) -> int:
        return ports[sw].get(str(f.dst), 0)

    sim = Simulator("ib", route)
    sim.add_switch("s1", latency_ns=90)
    sim.add_switch("s2", latency_ns=90)
    cfg = IbPortConfig(data_vls=vls, buffer_bytes=8 * 1024)
    for h, sw, p in (("h0", "s1", 1), ("h1", "s1", 2), ("h2", "s2", 1), ("h3", "s2", 2),
                     ("h4", "s2", 3), ("h5", "s2", 4)):
        sim.add_host(h)
        sim.cable(h, 1, sw, p, EDR, ib_a=cfg, ib_b=cfg)
    sim.cable("s1", 3, "s2", 5, EDR, ib_a=cfg, ib_b=cfg)
    hot = [sim.add_flow(Flow(h, "h2", size=2048)) for h in ("h0", "h4", "h5")]
    victim = sim.add_flow(Flow("h1", "h3", size=2048, sl=victim_sl))
    sim.run(300_000)
    return sim, victim, hot


def test_head_of_line_blocking_and_congestion_spreading() -> None:
    sim, victim, hot = _hol_fabric(victim_sl=0, vls=1)
    share = victim.rate_gbps() / EDR.gbps
    # alone on its path the victim would get 2/3 of the s1 -> s2 cable; behind h0's frames in
    # the same VL's FIFO it gets about what h0 gets: a third
    assert share < 0.42
    assert hot[0].rate_gbps() / EDR.gbps == pytest.approx(1 / 3, abs=0.05)
    assert sim.nodes["s1"].ports[3].counters.xmit_wait_ns > 0  # the spreading: s1 waits on s2
    assert sim.drops == 0


def test_a_second_vl_frees_the_victim() -> None:
    sim, victim, hot = _hol_fabric(victim_sl=1, vls=2)
    assert victim.rate_gbps() / EDR.gbps > 0.6
    assert hot[0].rate_gbps() / EDR.gbps == pytest.approx(1 / 3, abs=0.05)
    assert sim.drops == 0


def test_vl15_is_uncredited_and_first() -> None:
    n = Node("s", "ib", switch=True)
    n.add_port(1, EDR)
    n.add_port(2, EDR)
    n.connect(2, ("x", 1), 64)  # one credit per VL
    big = Frame(4096)
    smp = Frame(256, vl15=True)
    acts = n.receive(1, big, 0, out_port=2)
    assert not any(isinstance(a, Transmit) for a in acts)  # 64 credits needed, one given
    acts = n.receive(1, smp, 0, out_port=2)
    tx = [a for a in acts if isinstance(a, Transmit)]
    assert [t.frame for t in tx] == [smp] and tx[0].vl == 15
    assert n.ports[2].counters.credit_stalls >= 1


def test_credit_return_lets_the_head_go_and_returns_upstream() -> None:
    n = Node("s", "ib", switch=True, latency_ns=100)
    n.add_port(1, EDR)
    n.add_port(2, EDR)
    n.connect(1, ("up", 1), 32 * 1024)
    n.connect(2, ("down", 1), 1024)
    f = Frame(2048, sl=0)
    assert n.receive(1, f, 0, out_port=2) == []
    assert n.next_deadline() == 100
    assert n.advance(100) == []  # 32 credits needed, 16 there
    acts = n.credit_return(2, 0, 16, 500)
    tx = [a for a in acts if isinstance(a, Transmit)]
    assert tx and tx[0].start_ns == 500 and tx[0].end_ns == 500 + EDR.frame_ns(2048)
    assert n.ports[2].counters.xmit_wait_ns == 400
    acts = n.advance(tx[0].end_ns)
    cr = [a for a in acts if isinstance(a, CreditReturn)]
    assert cr == [CreditReturn("s", 1, 0, blocks(2048), tx[0].end_ns + EDR.propagation)]


def test_a_port_going_down_discards_its_queue_and_returns_the_credits_upstream() -> None:
    """IBA: a port leaving LinkUp discards what it had queued (PortXmitDiscards); the input
    buffer those frames held is free again, so the upstream port gets its credits back."""
    n = Node("s", "ib", switch=True, latency_ns=100)
    n.add_port(1, EDR)
    n.add_port(2, EDR)
    n.connect(1, ("up", 1), 32 * 1024)
    n.connect(2, ("down", 1), 1024)  # room for no 2 KiB frame: the head waits for credits
    for i in range(3):
        n.receive(1, Frame(2048, sl=0, meta=i), 0, out_port=2)
    n.advance(100)
    assert n.ports[2].total_bytes == 3 * 2048 and n.ingress_blocks[(1, 0)] == 3 * 32
    acts = n.port_down(2, 1000)
    drops = [a for a in acts if isinstance(a, Drop)]
    assert [(d.frame.meta, d.reason) for d in drops] == [(0, "port_down"), (1, "port_down"), (2, "port_down")]
    cr = [a for a in acts if isinstance(a, CreditReturn)]
    assert sum(a.blocks for a in cr) == 3 * 32 and all(a.port == 1 for a in cr)
    p = n.ports[2]
    assert p.counters.xmit_discards == 3 and not p.pending() and n.ingress_blocks[(1, 0)] == 0
    assert p.counters.xmit_wait_ns == 900 and p.credits[0] == 0
    # while down: a frame decided for it is discarded, one arriving on it is lost, credits too
    acts = n.receive(1, Frame(64, meta="late"), 1100, out_port=2)
    acts += n.advance(1200)
    assert [a.reason for a in acts if isinstance(a, Drop)] == ["port_down"] and p.counters.xmit_discards == 4
    assert [a for a in n.receive(2, Frame(64), 1300, out_port=1) if isinstance(a, Transmit)] == []
    assert n.credit_return(2, 0, 16, 1400) == [] and p.credits[0] == 0
    # up again: the credits the peer advertised (or what it says it has free)
    n.port_up(2, 2000)
    assert p.up and p.credits[0] == 1024 // 64
    n.port_down(2, 3000)
    n.port_up(2, 4000, {0: 5})
    assert p.credits[0] == 5


def test_host_consumes_and_returns_credit() -> None:
    h = Node("h", "ib", switch=False)
    h.add_port(1, EDR)
    f = Frame(100)
    f.vl = 3
    acts = h.receive(1, f, 7)
    assert isinstance(acts[0], Deliver)
    assert acts[1] == CreditReturn("h", 1, 3, 2, 7 + EDR.propagation)


def test_sl2vl_maps_and_drops_beyond_operational_vls() -> None:
    n = Node("s", "ib", switch=True)
    n.add_port(1, EDR, ib=IbPortConfig(data_vls=2))
    n.add_port(2, EDR, ib=IbPortConfig(data_vls=2))
    n.connect(2, ("x", 1), None)
    n.set_sl2vl(1, 2, Sl2Vl((1, 0, 7) + (0,) * 13))
    a = n.receive(1, Frame(100, sl=0), 0, out_port=2)
    assert [x.vl for x in a if isinstance(x, Transmit)] == [1]
    later = n.advance(10**6)
    assert not any(isinstance(x, Transmit) for x in later)
    a = n.receive(1, Frame(100, sl=2), 10**6, out_port=2)
    assert any(getattr(x, "reason", "") == "vl_mapping" for x in a)
    assert n.ports[2].counters.xmit_discards == 1
    assert Sl2Vl((15,) + (0,) * 15).problems(2)[0].startswith("SL0 -> VL15")
    assert Sl2Vl((3,) + (0,) * 15).problems(2)


def test_vl_codes() -> None:
    assert [vls_of_code(c) for c in range(1, 6)] == [1, 2, 4, 8, 15]
    assert code_of_vls(8) == 4
    with pytest.raises(ValueError):
        code_of_vls(3)


def _arbitrate(arb: VlArb, vls: list[int], rounds: int, size: int = 64) -> dict[int, int]:
    a = Arbiter(arb)
    sent = {vl: 0 for vl in vls}
    for _ in range(rounds):
        vl = a.pick(lambda v: v in vls)
        assert vl is not None
        a.sent(vl, size)
        sent[vl] += 1
    return sent


def test_arbitration_weights() -> None:
    sent = _arbitrate(VlArb(low=((0, 3), (1, 1))), [0, 1], 400)
    assert sent[0] == 3 * sent[1]


@given(st.lists(st.integers(1, 20), min_size=2, max_size=4))
@settings(max_examples=30, deadline=None)
def test_arbitration_shares_follow_weights(weights: list[int]) -> None:
    table = tuple(enumerate(weights))
    total = sum(weights)
    sent = _arbitrate(VlArb(low=table), list(range(len(weights))), total * 10)
    for vl, w in table:
        assert sent[vl] == 10 * w


def test_high_priority_and_its_limit() -> None:
    # unlimited high priority starves low while high has data
    sent = _arbitrate(VlArb(high=((1, 1),), low=((0, 1),), high_limit=255), [0, 1], 50)
    assert sent == {0: 0, 1: 50}
    # limit 0: one high packet, then low gets its chance
    sent = _arbitrate(VlArb(high=((1, 1),), low=((0, 1),), high_limit=0), [0, 1], 50)
    assert sent == {0: 25, 1: 25}
    # limit 1 (4 KiB) with 1 KiB packets: four high, then one low
    sent = _arbitrate(VlArb(high=((1, 255),), low=((0, 1),), high_limit=1), [0, 1], 50, size=1024)
    assert sent == {0: 10, 1: 40}


def test_starved_vls() -> None:
    assert VlArb(low=((0, 1), (1, 0))).starved([0, 1, 2]) == [1, 2]
    assert VlArb.default(4).starved([0, 1, 2, 3]) == []
    with pytest.raises(ValueError):
        VlArb(low=((15, 1),))
