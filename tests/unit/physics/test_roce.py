"""RoCE on the same model: drop tail without PFC, pauses and no drop with it, ECN marks."""

from __future__ import annotations

import pytest

from ibemu.physics import expect
from ibemu.physics.link import LinkModel
from ibemu.physics.model import EthConfig, Frame, Node, Transmit
from ibemu.physics.sim import Flow, Simulator
from ibemu.topo.rates import parse_rate

ETH = LinkModel.of(parse_rate("100G"), cable_m=2, ethernet=True)


def _incast(eth: EthConfig, *, frames: int = 3000, ecn: bool = False) -> tuple[Simulator, list[Flow]]:
    sim = Simulator("eth", lambda sw, f: 3)
    sim.add_switch("s", latency_ns=500, eth=eth)
    for i in range(3):
        sim.add_host(f"h{i}", eth=eth)
        sim.cable(f"h{i}", 1, "s", i + 1, ETH)
    flows = [sim.add_flow(Flow(f"h{i}", "h2", size=1024, sl=3, frames=frames, ecn_capable=ecn))
             for i in range(2)]
    sim.run(10**9)
    return sim, flows


def test_without_pfc_the_incast_drops() -> None:
    sim, flows = _incast(EthConfig(buffer_bytes=64 * 1024))
    assert sim.drops == pytest.approx(expect.incast_drops(2, 3000, 1024, 64 * 1024), abs=3)
    assert sim.nodes["s"].ports[3].counters.drops == sim.drops
    assert sim.pauses == 0
    a, b = flows
    assert a.delivered + a.dropped == a.sent
    assert a.delivered / (a.delivered + b.delivered) == pytest.approx(0.5, abs=0.03)
    assert sim.nodes["s"].ports[3].counters.max_queue_bytes <= 64 * 1024


def test_with_pfc_nothing_drops_and_pauses_are_counted() -> None:
    eth = EthConfig(buffer_bytes=64 * 1024, lossless=frozenset({3}), xoff_bytes=16 * 1024, xon_bytes=8 * 1024)
    sim, flows = _incast(eth)
    assert sim.drops == 0
    assert all(f.delivered == 3000 for f in flows)
    s = sim.nodes["s"]
    assert s.ports[1].counters.pause_sent > 0 and s.ports[2].counters.pause_sent > 0
    h0 = sim.nodes["h0"].ports[1].counters
    assert h0.pause_received > 0 and h0.paused_ns > 0
    # the shares stay even and the port stays busy
    a, b = flows
    assert a.last_ns == pytest.approx(b.last_ns, rel=0.03)
    busy = 6000 * ETH.frame_ns(1024)
    assert busy / max(a.last_ns or 0, b.last_ns or 0) > 0.97


def test_ecn_marks_beyond_the_threshold() -> None:
    eth = EthConfig(buffer_bytes=1024 * 1024, ecn_mark_bytes=20 * 1024)
    sim, _flows = _incast(eth, frames=500, ecn=True)
    assert sim.nodes["s"].ports[3].counters.ecn_marked > 0
    none, _ = _incast(EthConfig(buffer_bytes=1024 * 1024), frames=500, ecn=True)
    assert none.nodes["s"].ports[3].counters.ecn_marked == 0


def test_strict_priority_and_pause_per_priority() -> None:
    n = Node("s", "eth", switch=True)
    n.add_port(1, ETH)
    n.add_port(2, ETH)
    n.connect(2, ("x", 1), None)
    n.pause(2, 3, True, 0)
    acts = n.receive(1, Frame(100, sl=3), 0, out_port=2) + n.receive(1, Frame(100, sl=1), 0, out_port=2)
    assert [a.vl for a in acts if isinstance(a, Transmit)] == [1]
    acts = n.advance(10_000) + n.pause(2, 3, False, 10_000)
    assert [a.vl for a in acts if isinstance(a, Transmit)] == [3]
    assert n.ports[2].counters.paused_ns == 10_000


def test_eth_config_checks() -> None:
    with pytest.raises(ValueError):
        EthConfig(lossless=frozenset({8}))
    with pytest.raises(ValueError):
        EthConfig(lossless=frozenset({3}), xoff_bytes=10, xon_bytes=20)
