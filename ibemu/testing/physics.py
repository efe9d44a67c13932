"""A reference simulation of a whole topology on the link model, routed by the SM's engines.

``fabric_sim(topo, engine)`` turns an ``ibemu.topo`` Topology into an
``ibemu.physics.sim.Simulator``: the model's nodes from ``ibemu.physics.plan.build_nodes``
(rates, delays from the topology and its defaults), LFTs from ``ibemu.sm.routing.compute`` on
the graph discovery would build (``ibemu.testing.fromtopo``). Flows are addressed by the
destination host's LID. For tests and ``benchmarks/bench_physics.py``.
"""

from __future__ import annotations

import dataclasses

from ibemu.physics.link import default_switch_model
from ibemu.physics.model import EthConfig, Frame, Kind
from ibemu.physics.plan import build_nodes
from ibemu.physics.sim import Simulator
from ibemu.sm.routing import compute
from ibemu.testing.fromtopo import graph_of
from ibemu.topo.model import Topology


def fabric_sim(topo: Topology, engine: str = "minhop", *, kind: Kind = "ib",
               buffer_bytes: int | None = None, latency_ns: int | None = None,
               eth: EthConfig | None = None, seed: int = 0, **opts: object) -> tuple[Simulator, dict[str, int]]:
    """The simulator and each host's LID (what flows name as ``dst``)."""
    graph = graph_of(topo)
    routes = compute(graph, engine, **opts)
    lfts = {n: routes.lfts[node.guid] for n, node in topo.nodes.items() if node.is_switch}
    lids = {n: graph.nodes[node.guid].lid for n, node in topo.nodes.items() if not node.is_switch}

    def route(switch: str, frame: Frame) -> int:
        assert isinstance(frame.dst, int)
        return lfts[switch][frame.dst]

    model = default_switch_model(topo.defaults.rate, ethernet=kind == "eth")
    if buffer_bytes is not None:
        model = dataclasses.replace(model, buffer_bytes=buffer_bytes)
    if latency_ns is not None:
        model = dataclasses.replace(model, latency_ns=latency_ns)
    sim = Simulator(kind, route, seed=seed)
    sim.adopt(build_nodes(topo, kind=kind, switch=model, eth=eth), dict(lids))
    return sim, lids
