"""What a fabric will be in the kernel, decided before anything is created (pure).

One namespace per node (``ibemu-<run>-<node>``), one veth pair per link whose ends are named
after their node and port (``edge0_0-3``), deterministic MAC addresses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ibemu.kernel.links import Cable
from ibemu.kernel.ownership import ns_name
from ibemu.topo import Topology
from ibemu.topo.model import NodeKind


def mac_for(index: int, port: int) -> bytes:
    """Locally administered MAC of port ``port`` of the ``index``-th node."""
    return bytes([0x02, 0x1B, (index >> 8) & 0xFF, index & 0xFF, port & 0xFF, 0x00])


def mac_text(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


@dataclass(frozen=True, slots=True)
class PortPlan:
    port: int
    ifname: str
    mac: bytes
    peer_node: str
    peer_port: int
    peer_mac: bytes


@dataclass(slots=True)
class NodePlan:
    name: str
    kind: NodeKind
    ns: str
    index: int
    ports: dict[int, PortPlan] = field(default_factory=dict)

    @property
    def is_switch(self) -> bool:
        return self.kind is NodeKind.SWITCH


@dataclass(slots=True)
class FabricPlan:
    run_id: str
    topology: Topology
    nodes: dict[str, NodePlan]
    cables: list[Cable]

    @property
    def namespaces(self) -> list[str]:
        return [n.ns for n in self.nodes.values()]

    def switches(self) -> list[NodePlan]:
        return [n for n in self.nodes.values() if n.is_switch]

    def cas(self) -> list[NodePlan]:
        return [n for n in self.nodes.values() if n.kind is NodeKind.CA]


FIRST_IFINDEX = 16
"""Interface indexes of cable ends: 16, 17, ... in link order, every end of a fabric apart, so
the two ends of a cable never share one (``kernel.links.create_cables``: the far end of a cut
cable then learns of it at once)."""


def plan_fabric(topo: Topology, run_id: str) -> FabricPlan:
    """Namespaces, cables and addresses for ``topo`` (validated first)."""
    topo.check()
    index = {name: i for i, name in enumerate(topo.nodes)}
    nodes = {
        name: NodePlan(name, node.kind, ns_name(run_id, name), index[name])
        for name, node in topo.nodes.items()
    }
    cables: list[Cable] = []
    for i, link in enumerate(topo.links):
        a, b = link.a, link.b
        a_if, b_if = topo.ifname(a.node, a.port), topo.ifname(b.node, b.port)
        a_mac, b_mac = mac_for(index[a.node], a.port), mac_for(index[b.node], b.port)
        nodes[a.node].ports[a.port] = PortPlan(a.port, a_if, a_mac, b.node, b.port, b_mac)
        nodes[b.node].ports[b.port] = PortPlan(b.port, b_if, b_mac, a.node, a.port, a_mac)
        cables.append(Cable(nodes[a.node].ns, a_if, nodes[b.node].ns, b_if,
                            a_mac=mac_text(a_mac), b_mac=mac_text(b_mac),
                            a_index=FIRST_IFINDEX + 2 * i, b_index=FIRST_IFINDEX + 2 * i + 1))
    return FabricPlan(run_id, topo, nodes, cables)
