"""An indexed, flat view of a SubnetGraph that the routing engines compute on.

Switches are numbered 0..n-1 (GUID order); sets of switches are Python ints used as bitsets,
which keeps the per-destination BFS at O(switches) big-int operations. A link is a pair of
ports that name each other as ``peer`` (discovery clears ``peer`` on a port that went down).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

from ibemu.sm.graph import NodeType, SubnetGraph

NO_PATH = 0xFF
"""LFT value of an unrouted LID (OpenSM's OSM_NO_PATH)."""


@functools.lru_cache(maxsize=1 << 16)
def bits(mask: int) -> tuple[int, ...]:
    """Indices of the set bits of ``mask``, lowest first. Remembered: the engines walk the
    same rings and port masks over and over (a k=16 fat-tree asked ~320,000 times, mostly
    for masks seen before); ``bits.cache_clear()`` forgets."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


@dataclass
class Fabric:
    guids: list[int]
    """Switch index -> node GUID."""
    index: dict[int, int]
    """Switch GUID -> index."""
    sw_lid: list[int]
    """Switch index -> its LID (0 if none)."""
    nbr_ports: list[dict[int, list[int]]]
    """Per switch: neighbour switch index -> local ports to it (parallel links), ascending."""
    port_peer: list[dict[int, int]]
    """Per switch: local port -> neighbour switch index (switch-to-switch links only)."""
    adj: list[int]
    """Per switch: bitset of neighbour switches."""
    ca_at: dict[int, tuple[int, int]]
    """Endpoint (CA/router port) LID -> (switch index, switch port) it is cabled to."""
    ca_lids: list[list[int]]
    """Per switch: endpoint LIDs cabled to it, ascending."""
    ca_guid: dict[int, int]
    """Endpoint LID -> node GUID of the CA."""

    @property
    def n(self) -> int:
        return len(self.guids)

    @classmethod
    def of(cls, graph: SubnetGraph) -> Fabric:
        sws = sorted((nd for nd in graph.nodes.values() if nd.is_switch), key=lambda nd: nd.guid)
        guids = [nd.guid for nd in sws]
        index = {g: i for i, g in enumerate(guids)}
        n = len(guids)
        nbr_ports: list[dict[int, list[int]]] = [{} for _ in range(n)]
        port_peer: list[dict[int, int]] = [{} for _ in range(n)]
        adj = [0] * n
        ca_at: dict[int, tuple[int, int]] = {}
        ca_lids: list[list[int]] = [[] for _ in range(n)]
        ca_guid: dict[int, int] = {}
        for i, nd in enumerate(sws):
            for num, p in sorted(nd.ports.items()):
                if num == 0 or p.peer is None:
                    continue
                far = graph.nodes.get(p.peer[0])
                if far is None:
                    continue
                back = far.ports.get(p.peer[1])
                if back is None or back.peer != (nd.guid, num):
                    continue  # a half-known cable: only links both ends agree on count
                if far.is_switch:
                    j = index[far.guid]
                    if j == i:
                        continue
                    nbr_ports[i].setdefault(j, []).append(num)
                    port_peer[i][num] = j
                    adj[i] |= 1 << j
                elif far.kind in (NodeType.CA, NodeType.ROUTER) and back.lid:
                    ca_at[back.lid] = (i, num)
                    ca_lids[i].append(back.lid)
                    ca_guid[back.lid] = far.guid
        for lids in ca_lids:
            lids.sort()
        sw_lid = [nd.lid for nd in sws]
        return cls(guids, index, sw_lid, nbr_ports, port_peer, adj, ca_at, ca_lids, ca_guid)

    def links(self) -> Iterator[tuple[int, int, int, int]]:
        """Every switch-to-switch link once: (switch i, port, switch j, port)."""
        seen: set[tuple[int, int]] = set()
        for i, pp in enumerate(self.port_peer):
            for port, j in pp.items():
                if (i, port) in seen:
                    continue
                back = self.peer_port(i, port)
                seen.add((i, port))
                if back is not None:
                    seen.add((j, back))
                yield i, port, j, back if back is not None else 0

    def peer_port(self, i: int, port: int) -> int | None:
        """The far port of switch ``i``'s ``port`` (by pairing parallel links in order)."""
        j = self.port_peer[i].get(port)
        if j is None:
            return None
        mine = self.nbr_ports[i][j]
        theirs = self.nbr_ports[j].get(i, [])
        k = mine.index(port)
        return theirs[k] if k < len(theirs) else None

    def lid_switch(self, lid: int) -> int | None:
        """Index of the switch a LID lives on or is cabled to."""
        at = self.ca_at.get(lid)
        if at is not None:
            return at[0]
        return self._sw_by_lid().get(lid)

    def _sw_by_lid(self) -> dict[int, int]:
        cache = getattr(self, "_lid_index", None)
        if cache is None:
            cache = {lid: i for i, lid in enumerate(self.sw_lid) if lid}
            object.__setattr__(self, "_lid_index", cache)
        return cache

    def components(self) -> list[int]:
        """Connected components of the switch graph, as bitsets."""
        left = (1 << self.n) - 1
        out = []
        while left:
            seed = left & -left
            comp = reach(self.adj, seed)
            out.append(comp)
            left &= ~comp
        return out

    def without_link(self, i: int, port: int, j: int, jport: int) -> Fabric:
        """A copy with the link i:port - j:jport removed (copies only what changes)."""
        nbr_ports = list(self.nbr_ports)
        port_peer = list(self.port_peer)
        adj = list(self.adj)
        for a, pa, b in ((i, port, j), (j, jport, i)):
            np_a = dict(nbr_ports[a])
            left = [p for p in np_a.get(b, []) if p != pa]
            if left:
                np_a[b] = left
            else:
                np_a.pop(b, None)
                adj[a] &= ~(1 << b)
            nbr_ports[a] = np_a
            pp = dict(port_peer[a])
            pp.pop(pa, None)
            port_peer[a] = pp
        return Fabric(
            self.guids, self.index, self.sw_lid, nbr_ports, port_peer, adj,
            self.ca_at, self.ca_lids, self.ca_guid,
        )


def reach(adj: list[int], seed: int) -> int:
    """Bitset of switches reachable from the bitset ``seed``."""
    seen = frontier = seed
    while frontier:
        nxt = 0
        for x in bits(frontier):
            nxt |= adj[x]
        frontier = nxt & ~seen
        seen |= frontier
    return seen


def rings(adj: list[int], w: int) -> list[int]:
    """BFS layers towards switch ``w``: ring k = switches exactly k hops away."""
    seen = frontier = 1 << w
    out = [frontier]
    while True:
        nxt = 0
        for x in bits(frontier):
            nxt |= adj[x]
        frontier = nxt & ~seen
        if not frontier:
            return out
        seen |= frontier
        out.append(frontier)


def hop_table(adj: list[int], w: int, n: int) -> list[int]:
    """Switch index -> hops to ``w`` (-1 when unreachable)."""
    dist = [-1] * n
    for k, ring in enumerate(rings(adj, w)):
        for v in bits(ring):
            dist[v] = k
    return dist
