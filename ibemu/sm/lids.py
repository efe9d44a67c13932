"""LID assignment, stable by port GUID across sweeps (LMC 0).

A switch gets one LID (port 0, port GUID = node GUID), a CA one per port. A GUID keeps its
LID for the life of the table, also while its node is gone; a port that already carries a
unicast LID no one else holds keeps it (an SM restart does not renumber the fabric).

Fresh LIDs go to a switch and then to the CA ports cabled to it, as one group that does not
straddle a 64-LID LinearForwardingTable block (it starts a new block when it would). A link
failure moves the routes to a leaf switch and its CAs together on most switches of the
fabric; with the group in one block each of those switches needs one LFT Set, not two
(k=8 fat-tree, one edge-aggregation cable: 40-70 blocks to write with LIDs in GUID order,
36-37 with groups — see ``benchmarks/bench_routing.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ibemu.sm.graph import SmPort, SubnetGraph

MAX_UNICAST_LID = 0xBFFF
BLOCK = 64


@dataclass
class LidTable:
    first: int = 1
    by_guid: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._owner = {lid: guid for guid, lid in self.by_guid.items()}
        self._next = self.first

    def lid_of(self, port_guid: int) -> int:
        return self.by_guid.get(port_guid, 0)

    def owner(self, lid: int) -> int | None:
        return self._owner.get(lid)

    @property
    def top(self) -> int:
        return max(self.by_guid.values(), default=0)

    def _take(self, guid: int, lid: int) -> None:
        self.by_guid[guid] = lid
        self._owner[lid] = guid

    def _fresh(self) -> int:
        while self._next in self._owner:
            self._next += 1
        if self._next > MAX_UNICAST_LID:
            raise RuntimeError("out of unicast LIDs")
        return self._next

    def _fresh_run(self, count: int) -> None:
        """Move ``_next`` so that ``count`` fresh LIDs from it stay in one 64-LID block
        when they can (the LIDs skipped stay free)."""
        lid = self._fresh()
        if count <= 1 or count > BLOCK:
            return
        while True:
            start = lid
            free = 0
            while free < count and (lid // BLOCK) == (start // BLOCK):
                if lid not in self._owner:
                    free += 1
                lid += 1
            if free >= count:
                self._next = start
                return
            lid = (start // BLOCK + 1) * BLOCK
            while lid in self._owner:
                lid += 1
            if lid > MAX_UNICAST_LID:
                return

    def _all_known(self, graph: SubnetGraph) -> bool:
        """Every port already has its LID here (the common case after a link failure): write
        them into the graph and skip the grouping."""
        by_guid = self.by_guid
        for node in graph.nodes.values():
            for num, port in node.ports.items():
                if node.is_switch and num:
                    continue
                lid = by_guid.get(port.guid)
                if lid is None:
                    return False
                port.lid = lid
        return True

    def assign(self, graph: SubnetGraph) -> dict[int, int]:
        """Give every port in ``graph`` its LID (written into the graph); returns the new ones
        (port GUID -> LID). The SM's own port comes first; then, in GUID order, each switch
        with the CA ports cabled to it (one group, see the module docstring); then CAs cabled
        to no switch."""
        if self._all_known(graph):
            return {}
        groups: list[list[SmPort]] = []
        sm = graph.nodes.get(graph.sm_guid)
        placed: set[int] = set()
        if sm is not None:
            groups.append([p for _, p in sorted(sm.ports.items())])
            placed.add(sm.guid)
        for node in sorted(graph.nodes.values(), key=lambda n: n.guid):
            if not node.is_switch or node.guid in placed:
                continue
            group = [node.ports[0]] if 0 in node.ports else []
            placed.add(node.guid)
            for _num, peer, _pport in node.neighbors():
                far = graph.nodes.get(peer)
                if far is not None and not far.is_switch and far.guid not in placed:
                    placed.add(far.guid)
                    group += [p for _, p in sorted(far.ports.items())]
            groups.append(group)
        for node in sorted(graph.nodes.values(), key=lambda n: n.guid):
            if node.guid not in placed:
                groups.append([p for _, p in sorted(node.ports.items()) if node.is_switch is False or p.num == 0])
        new: dict[int, int] = {}
        for group in groups:
            fresh = [p for p in group if p.guid not in self.by_guid
                     and not (0 < p.lid <= MAX_UNICAST_LID and p.lid not in self._owner)]
            if len(fresh) > 1:
                self._fresh_run(len(fresh))
            for port in group:
                lid = self.by_guid.get(port.guid)
                if lid is None:
                    cur = port.lid
                    lid = cur if 0 < cur <= MAX_UNICAST_LID and cur not in self._owner else self._fresh()
                    self._take(port.guid, lid)
                    new[port.guid] = lid
                port.lid = lid
        return new
