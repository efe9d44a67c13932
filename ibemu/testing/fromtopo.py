"""Turn an ``ibemu.topo`` Topology into the SubnetGraph discovery would build, LIDs assigned.

For tests and benchmarks of the routing engines (the SM itself discovers its graph). LIDs
are given in node GUID order (switches first: their GUIDs sort lower), one per switch and
one per CA port, from ``first_lid``; every cabled port is Active; switches keep their
coordinates (for dor).
"""

from __future__ import annotations

from ibemu.sm.graph import NodeType, SmNode, SmPort, SubnetGraph
from ibemu.topo.model import NodeKind, Topology

_KIND = {NodeKind.SWITCH: NodeType.SWITCH, NodeKind.CA: NodeType.CA, NodeKind.ROUTER: NodeType.ROUTER}


def graph_of(topo: Topology, first_lid: int = 1) -> SubnetGraph:
    g = SubnetGraph()
    by_name: dict[str, SmNode] = {}
    for node in sorted(topo.nodes.values(), key=lambda nd: nd.guid):
        sm = SmNode(node.guid, _KIND[node.kind], node.num_ports, node.desc, coords=node.coords)
        if node.is_switch:
            sm.ports[0] = SmPort(0, node.guid, state=4)
        for p in node.port_range:
            sm.ports[p] = SmPort(p, node.port_guid(p))
        g.add(sm)
        by_name[node.name] = sm
    for link in topo.links:
        a, b = by_name[link.a.node], by_name[link.b.node]
        if link.a.port in a.ports and link.b.port in b.ports:
            g.connect(a.guid, link.a.port, b.guid, link.b.port)
            a.ports[link.a.port].state = b.ports[link.b.port].state = 4
    lid = first_lid
    for sm in g.nodes.values():
        if sm.is_switch:
            sm.ports[0].lid = lid
            lid += 1
        else:
            for _, port in sorted(sm.ports.items()):
                port.lid = lid
                lid += 1
    cas = g.cas()
    g.sm_guid = cas[0].guid if cas else 0
    return g


def remove_link(graph: SubnetGraph, guid: int, port: int) -> tuple[int, int] | None:
    """Unplug ``guid:port`` as discovery would (peers cleared, ports Down); the far end."""
    p = graph.nodes[guid].ports[port]
    peer = p.peer
    p.peer, p.state = None, 1
    if peer is not None:
        far = graph.nodes[peer[0]].ports[peer[1]]
        far.peer, far.state = None, 1
    return peer


def restore_link(graph: SubnetGraph, guid: int, port: int, peer: tuple[int, int]) -> None:
    graph.connect(guid, port, peer[0], peer[1])
    graph.nodes[guid].ports[port].state = graph.nodes[peer[0]].ports[peer[1]].state = 4
