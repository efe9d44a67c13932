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

A datapath in another process (the RoCE user datapath) gets the fabric as :class:`Cable` s
(``cables_of``: plain data, JSON-able) and builds the same nodes with :func:`nodes_from_cables`;
``build_nodes`` is ``nodes_from_cables(cables_of(topo))``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ibemu.physics.link import ETH_FRAMING_BYTES, IB_FRAMING_BYTES, LinkModel, SwitchModel
from ibemu.physics.model import EthConfig, IbPortConfig, Kind, Node
from ibemu.physics.qos import Sl2Vl, VlArb
from ibemu.topo.model import Topology


def link_model(topo: Topology, link_index: int, *, ethernet: bool) -> LinkModel:
    link = topo.links[link_index]
    return LinkModel.of(topo.rate_of(link), delay_us=link.delay_us, ethernet=ethernet)


@dataclass(frozen=True, slots=True)
class Cable:
    """One cable of the fabric as the model takes it: its two ends, data rate, propagation."""

    a: tuple[str, int]
    b: tuple[str, int]
    gbps: float
    propagation_ns: float = 0.0

    def to_list(self) -> list[object]:
        return [self.a[0], self.a[1], self.b[0], self.b[1], self.gbps, self.propagation_ns]

    @classmethod
    def from_list(cls, x: Sequence[object]) -> Cable:
        a0, a1, b0, b1, g, p = (str(v) for v in x)
        return cls((a0, int(a1)), (b0, int(b1)), float(g), float(p))


def cables_of(topo: Topology, *, gbps: float = 0.0, extra_delay_us: float = 0.0) -> list[Cable]:
    """``topo``'s cables: each link's data rate (``gbps``, when given, for every cable) and its
    propagation (``extra_delay_us`` added to each)."""
    out = []
    for i, link in enumerate(topo.links):
        lm = link_model(topo, i, ethernet=False)
        out.append(Cable((link.a.node, link.a.port), (link.b.node, link.b.port), gbps or lm.gbps,
                         lm.propagation_ns + extra_delay_us * 1000.0))
    return out


def build_nodes(topo: Topology, *, kind: Kind, switch: SwitchModel, eth: EthConfig | None = None,
                data_vls: int = 1, sl2vl: Sl2Vl | None = None, vlarb: VlArb | None = None) -> dict[str, Node]:
    """Every node of ``topo`` as a model node, cabled (see the module docstring)."""
    return nodes_from_cables({name: n.is_switch for name, n in topo.nodes.items()}, cables_of(topo), kind=kind,
                             switch=switch, eth=eth, data_vls=data_vls, sl2vl=sl2vl, vlarb=vlarb)


def nodes_from_cables(switches: Mapping[str, bool], cables: Sequence[Cable], *, kind: Kind, switch: SwitchModel,
                      eth: EthConfig | None = None, data_vls: int = 1, sl2vl: Sl2Vl | None = None,
                      vlarb: VlArb | None = None) -> dict[str, Node]:
    """A model node per name of ``switches`` (name -> is a switch), cabled by ``cables``."""
    if switch.ethernet != (kind == "eth"):
        raise ValueError(f"switch model {switch.name} is not for a {kind} fabric")
    if kind == "eth" and eth is None:
        eth = EthConfig(buffer_bytes=switch.buffer_bytes)
    nodes: dict[str, Node] = {}
    for name, is_switch in switches.items():
        nodes[name] = Node(name, kind, switch=is_switch, latency_ns=switch.latency_ns if is_switch else 0, eth=eth)
    ib = IbPortConfig(data_vls=data_vls, vlarb=vlarb, buffer_bytes=switch.buffer_bytes) if kind == "ib" else None
    framing = ETH_FRAMING_BYTES if kind == "eth" else IB_FRAMING_BYTES
    for c in cables:
        lm = LinkModel(gbps=c.gbps, propagation_ns=c.propagation_ns, framing_bytes=framing)
        a, b = nodes[c.a[0]], nodes[c.b[0]]
        a.add_port(c.a[1], lm, ib=ib)
        b.add_port(c.b[1], lm, ib=ib)
    for c in cables:
        a, b = nodes[c.a[0]], nodes[c.b[0]]
        a.connect(c.a[1], (b.name, c.b[1]), switch.buffer_bytes if b.switch else None, data_vls)
        b.connect(c.b[1], (a.name, c.a[1]), switch.buffer_bytes if a.switch else None, data_vls)
    if kind == "ib" and sl2vl is not None:
        for node in nodes.values():
            outs = list(node.ports)
            ins = [0, *outs] if node.switch else [0]
            for o in outs:
                for i in ins:
                    node.set_sl2vl(i, o, sl2vl)
    return nodes
