"""A whole fabric's model from a topology: one :class:`~ibemu.physics.model.Node` per switch and
host, one :class:`~ibemu.physics.link.LinkModel` per cable, peers and credits wired.

This is what a datapath (or the reference simulator) starts from::

    nodes = build_nodes(topo, kind="ib", switch=SWITCH_MODELS["ib-edr"])
    nodes["sw0"].receive(in_port, Frame(size, sl=sl, meta=pkt), now, out_port)  # ... and so on

Each cable takes its rate from the topology (``Topology.rate_of``: the link's, else the
defaults'), its propagation from ``delay_us`` (the scenario loader turns ``cable_m`` into it).
IB: every port operates ``data_vls`` VLs with its input buffer per VL the switch model's
``buffer_bytes`` (a host's input buffer never fills: it consumes at once, so its peer is not
credit-limited by it); ``sl2vl`` and ``vlarb`` apply to every switch port pair / port (the
agents' tables, per port, can be set afterwards with ``Node.set_sl2vl`` / ``set_vlarb``).
Ethernet: every node takes ``eth`` (buffer, PFC, ECN); hosts honour pauses.
"""

from __future__ import annotations

from ibemu.physics.link import LinkModel, SwitchModel
from ibemu.physics.model import EthConfig, IbPortConfig, Kind, Node
from ibemu.physics.qos import Sl2Vl, VlArb
from ibemu.topo.model import Topology


def link_model(topo: Topology, link_index: int, *, ethernet: bool) -> LinkModel:
    link = topo.links[link_index]
    return LinkModel.of(topo.rate_of(link), delay_us=link.delay_us, ethernet=ethernet)


def build_nodes(topo: Topology, *, kind: Kind, switch: SwitchModel, eth: EthConfig | None = None,
                data_vls: int = 1, sl2vl: Sl2Vl | None = None, vlarb: VlArb | None = None) -> dict[str, Node]:
    """Every node of ``topo`` as a model node, cabled (see the module docstring)."""
    if switch.ethernet != (kind == "eth"):
        raise ValueError(f"switch model {switch.name} is not for a {kind} fabric")
    if kind == "eth" and eth is None:
        eth = EthConfig(buffer_bytes=switch.buffer_bytes)
    nodes: dict[str, Node] = {}
    for name, n in topo.nodes.items():
        nodes[name] = Node(name, kind, switch=n.is_switch, latency_ns=switch.latency_ns if n.is_switch else 0,
                           eth=eth)
    ib = IbPortConfig(data_vls=data_vls, vlarb=vlarb, buffer_bytes=switch.buffer_bytes) if kind == "ib" else None
    for i, link in enumerate(topo.links):
        lm = link_model(topo, i, ethernet=kind == "eth")
        a, b = nodes[link.a.node], nodes[link.b.node]
        a.add_port(link.a.port, lm, ib=ib)
        b.add_port(link.b.port, lm, ib=ib)
    for link in topo.links:
        a, b = nodes[link.a.node], nodes[link.b.node]
        a.connect(link.a.port, (b.name, link.b.port), switch.buffer_bytes if b.switch else None, data_vls)
        b.connect(link.b.port, (a.name, link.a.port), switch.buffer_bytes if a.switch else None, data_vls)
    if kind == "ib" and sl2vl is not None:
        for node in nodes.values():
            outs = list(node.ports)
            ins = [0, *outs] if node.switch else [0]
            for o in outs:
                for i in ins:
                    node.set_sl2vl(i, o, sl2vl)
    return nodes
