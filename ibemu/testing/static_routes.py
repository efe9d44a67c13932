"""SM-less programming for datapath tests and benchmarks: LIDs in topology order, min-hop LFTs.

This is not a subnet manager (that is ``ibemu.sm``, which discovers the fabric with SMPs):
it computes from the model what a trivial SM would write, so the kernel datapath can be
exercised and measured on its own. Ties between equal-length next hops are spread by LID.
"""

from __future__ import annotations

from collections import deque

from ibemu.topo import Topology


def assign_lids(topo: Topology) -> dict[str, int]:
    """LID 1, 2, ... for every node in topology order (one LID per switch and per CA port 1)."""
    return {name: i + 1 for i, name in enumerate(topo.nodes)}


def minhop_lfts(topo: Topology, lids: dict[str, int]) -> dict[str, dict[int, int]]:
    """switch name -> {LID: egress port}: shortest paths, equal choices spread by LID."""
    switches = [n.name for n in topo.switches()]
    lfts: dict[str, dict[int, int]] = {s: {} for s in switches}
    for dest, lid in lids.items():
        # BFS from the destination over switches; a CA destination is reached through its port 1.
        dist: dict[str, int] = {}
        frontier: deque[str] = deque()
        if topo.node(dest).is_switch:
            dist[dest] = 0
            frontier.append(dest)
        else:
            peer = topo.peer(dest, 1)
            if peer is None:
                continue
            dist[peer.node] = 1
            lfts[peer.node][lid] = peer.port
            frontier.append(peer.node)
        while frontier:
            node = frontier.popleft()
            for _port, far in topo.neighbors(node):
                if topo.node(far.node).is_switch and far.node not in dist:
                    dist[far.node] = dist[node] + 1
                    frontier.append(far.node)
        for sw in switches:
            if sw == dest or sw not in dist or lid in lfts[sw]:
                continue
            choices = sorted(port for port, far in topo.neighbors(sw)
                             if far.node in dist and dist[far.node] == dist[sw] - 1)
            if choices:
                lfts[sw][lid] = choices[lid % len(choices)]
    return lfts


def path_switches(topo: Topology, lfts: dict[str, dict[int, int]], src: str, dst_lid: int) -> list[str]:
    """The switches a packet from CA ``src`` to ``dst_lid`` crosses under ``lfts``."""
    hop = topo.peer(src, 1)
    path: list[str] = []
    while hop is not None and topo.node(hop.node).is_switch and len(path) < 64:
        path.append(hop.node)
        port = lfts[hop.node].get(dst_lid)
        if port is None:
            break
        hop = topo.peer(hop.node, port)
    return path
