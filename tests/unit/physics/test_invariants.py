"""Properties of the IB model on random line fabrics and traffic: nothing dropped, no input
buffer ever holds more than it advertised, every frame delivered in order per flow, every
credit back where it started once the fabric is idle."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu.physics.link import LinkModel
from ibemu.physics.model import Frame, IbPortConfig
from ibemu.physics.qos import Sl2Vl, VlArb
from ibemu.physics.sim import Flow, Simulator
from ibemu.topo.rates import parse_rate

MAX_PKT = 4222


@st.composite
def fabrics(draw: st.DrawFn) -> dict:
    switches = draw(st.integers(1, 3))
    hosts = draw(st.integers(1, 3))
    vls = draw(st.sampled_from([1, 2, 4]))
    n = switches * hosts
    flows = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(30, MAX_PKT),
                                    st.integers(0, 15), st.integers(1, 40), st.integers(1, 4)),
                          min_size=1, max_size=6))
    return {
        "switches": switches, "hosts": hosts, "vls": vls,
        "buffer": draw(st.integers(-(-MAX_PKT // 64) * 64, 32 * 1024)),  # one largest packet in credits
        "weights": draw(st.lists(st.integers(1, 64), min_size=vls, max_size=vls)),
        "high": draw(st.booleans()),
        "rate": draw(st.sampled_from(["4x EDR", "4x HDR", "NDR", "4x QDR"])),
        "cable_m": draw(st.integers(0, 200)),
        "latency": draw(st.integers(0, 500)),
        "flows": [f for f in flows if f[0] != f[1]] or [(0, n - 1 if n > 1 else 0, 100, 0, 1, 1)],
    }


@given(fabrics())
@settings(max_examples=40, deadline=None)
def test_lossless_bounded_in_order_and_credits_restored(fx: dict) -> None:
    s, h, vls = fx["switches"], fx["hosts"], fx["vls"]

    def route(sw: str, f: Frame) -> int:
        i, d = int(sw[1:]), int(str(f.dst)[1:])
        if d // h == i:
            return d % h + 1
        return h + 2 if d // h > i else h + 1

    link = LinkModel.of(parse_rate(fx["rate"]), cable_m=fx["cable_m"])
    table = tuple((vl, w) for vl, w in enumerate(fx["weights"]))
    arb = VlArb(high=table[:1], low=table[1:] or table, high_limit=1) if fx["high"] else VlArb(low=table)
    cfg = IbPortConfig(data_vls=vls, buffer_bytes=fx["buffer"], vlarb=arb)
    sim = Simulator("ib", route)
    for i in range(s):
        sim.add_switch(f"s{i}", latency_ns=fx["latency"])
    for j in range(s * h):
        sim.add_host(f"h{j}")
        sim.cable(f"h{j}", 1, f"s{j // h}", j % h + 1, link, ib_a=cfg, ib_b=cfg)
    for i in range(s - 1):
        sim.cable(f"s{i}", h + 2, f"s{i + 1}", h + 1, link, ib_a=cfg, ib_b=cfg)
    sl_map = Sl2Vl.default(vls)
    for node in sim.nodes.values():
        for o in node.ports:
            for i in [0, *node.ports]:
                node.set_sl2vl(i, o, sl_map)
    flows = []
    for k, (src, dst, size, sl, frames, backlog) in enumerate(fx["flows"]):
        flows.append(sim.add_flow(Flow(f"h{src}", f"h{dst}", size=size, sl=sl, frames=frames, backlog=backlog,
                                       name=str(k), start_ns=k * 37)))
    initial = {(n.name, p.num): list(p.credits) for n in sim.nodes.values() for p in n.ports.values()}
    order: dict[str, list[int]] = {}
    orig = sim._dispatch

    def spy(actions: list) -> None:
        for a in actions:
            if type(a).__name__ == "Deliver":
                order.setdefault(a.frame.flow.name, []).append(a.frame.meta)
        orig(actions)

    sim._dispatch = spy  # type: ignore[method-assign]
    sim.run(10**10)
    assert sim.drops == 0
    for f in flows:
        assert f.delivered == f.sent == f.frames
        assert order[f.name] == list(range(f.frames))  # per flow, delivered in order
    for n in sim.nodes.values():
        assert all(v == 0 for v in n.ingress_bytes.values())
        assert all(v == 0 for v in n.ingress_blocks.values())
        for p in n.ports.values():
            assert p.counters.buffer_overruns == 0
            assert p.credits == initial[(n.name, p.num)]
            assert not p.pending() and p.in_flight is None
