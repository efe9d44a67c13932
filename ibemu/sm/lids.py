"""LID assignment, stable by port GUID across sweeps (LMC 0).

A switch gets one LID (port 0, port GUID = node GUID), a CA one per port. A GUID keeps its
LID for the life of the table, also while its node is gone; a port that already carries a
unicast LID no one else holds keeps it (an SM restart does not renumber the fabric).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ibemu.sm.graph import SubnetGraph

MAX_UNICAST_LID = 0xBFFF


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

    def assign(self, graph: SubnetGraph) -> dict[int, int]:
        """Give every port in ``graph`` its LID (written into the graph); returns the new ones
        (port GUID -> LID). The SM's own port comes first; then switches and CA ports in GUID
        order."""
        ends = []
        sm = graph.nodes.get(graph.sm_guid)
        if sm is not None:
            ends += [p for _, p in sorted(sm.ports.items())]
        for node in sorted(graph.nodes.values(), key=lambda n: n.guid):
            if node is sm:
                continue
            if node.is_switch:
                if 0 in node.ports:
                    ends.append(node.ports[0])
            else:
                ends += [p for _, p in sorted(node.ports.items())]
        new: dict[int, int] = {}
        for port in ends:
            lid = self.by_guid.get(port.guid)
            if lid is None:
                cur = port.lid
                lid = cur if 0 < cur <= MAX_UNICAST_LID and cur not in self._owner else self._fresh()
                self._take(port.guid, lid)
                new[port.guid] = lid
            port.lid = lid
        return new
