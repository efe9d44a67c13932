"""A reference simulation of a whole topology on the link model, routed by the SM's engines.

``fabric_sim(topo, engine)`` turns an ``ibemu.topo`` Topology into an
``ibemu.physics.sim.Simulator``: one node per switch and host, one cable per link (rate, delay
or length from the topology and its defaults), LFTs from ``ibemu.sm.routing.compute`` on the
graph discovery would build (``ibemu.testing.fromtopo``). Flows are addressed by the
destination host's LID. For tests and ``benchmarks/bench_physics.py``.
"""

from __future__ import annotations

from ibemu.physics.link import LinkModel, default_switch_model
from ibemu.physics.model import EthConfig, Frame, IbPortConfig, Kind
from ibemu.physics.sim import Simulator
from ibemu.sm.routing import compute
from ibemu.testing.fromtopo import graph_of
from ibemu.topo.model import Topology


def fabric_sim(topo: Topology, engine: str = "minhop", *, kind: Kind = "ib",
               buffer_bytes: int | None = None, latency_ns: int | None = None,
               eth: EthConfig | None = None, **opts: object) -> tuple[Simulator, dict[str, int]]:
    """The simulator and each host's LID (what flows name as ``dst``)."""
    graph = graph_of(topo)
    routes = compute(graph, engine, **opts)
    lfts = {topo.nodes[n].name: routes.lfts[topo.nodes[n].guid] for n in topo.nodes if topo.nodes[n].is_switch}
    lids: dict[str, int] = {}
    for n, node in topo.nodes.items():
        if not node.is_switch:
            lids[n] = graph.nodes[node.guid].lid

    def route(switch: str, frame: Frame) -> int:
        assert isinstance(frame.dst, int)
        return lfts[switch][frame.dst]

    sim = Simulator(kind, route)
    rate = topo.defaults.rate
    model = default_switch_model(rate, ethernet=kind == "eth")
    buf = buffer_bytes or model.buffer_bytes
    for n, node in topo.nodes.items():
        if node.is_switch:
            sim.add_switch(n, latency_ns=model.latency_ns if latency_ns is None else latency_ns, eth=eth)
        else:
            sim.add_host(n, address=lids[n], eth=eth)
    for link in topo.links:
        lm = LinkModel.of(topo.rate_of(link), delay_us=link.delay_us, ethernet=kind == "eth")
        cfg = IbPortConfig(buffer_bytes=buf) if kind == "ib" else None
        sim.cable(link.a.node, link.a.port, link.b.node, link.b.port, lm, ib_a=cfg, ib_b=cfg)
    return sim, lids
