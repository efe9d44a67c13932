"""The SM's view of the subnet: what discovery found, keyed by GUID (pure data).

Discovery fills it from SMP answers; routing engines read it; it knows nothing of the
emulator's topology model (the SM must work on any fabric it can reach, as OpenSM does).
A switch has one LID (port 0); a CA port has its own LID.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class NodeType(IntEnum):
    CA = 1
    SWITCH = 2
    ROUTER = 3


@dataclass(slots=True)
class SmPort:
    num: int
    guid: int
    lid: int = 0
    state: int = 1  # PortState: 1 down, 2 init, 3 armed, 4 active
    peer: tuple[int, int] | None = None  # (node GUID, port number) at the far end
    dr_path: tuple[int, ...] = ()  # directed route from the SM's port to this node


@dataclass(slots=True)
class SmNode:
    guid: int
    kind: NodeType
    num_ports: int
    desc: str = ""
    ports: dict[int, SmPort] = field(default_factory=dict)
    dr_path: tuple[int, ...] = ()
    """Directed route (InitialPath hops 1..n) the SM reaches this node by."""
    system_guid: int = 0
    vendor_id: int = 0
    device_id: int = 0
    revision: int = 0
    """NodeInfo's identity fields, as discovery read them (only the dumps show them)."""
    coords: tuple[int, ...] | None = None
    """Position in a mesh/torus when known (set by the topology converter, not by discovery);
    the ``dor`` routing engine needs it."""

    @property
    def is_switch(self) -> bool:
        return self.kind is NodeType.SWITCH

    @property
    def lid(self) -> int:
        """Switch: port 0's LID; CA: its first port's."""
        if self.is_switch:
            p0 = self.ports.get(0)
            return p0.lid if p0 else 0
        return next((p.lid for _, p in sorted(self.ports.items()) if p.lid), 0)

    def neighbors(self) -> Iterator[tuple[int, int, int]]:
        """(local port, peer GUID, peer port) of every cabled port."""
        for num, p in sorted(self.ports.items()):
            if p.peer is not None:
                yield num, p.peer[0], p.peer[1]


@dataclass
class SubnetGraph:
    nodes: dict[int, SmNode] = field(default_factory=dict)
    sm_guid: int = 0  # the node the SM runs on

    def add(self, node: SmNode) -> SmNode:
        self.nodes[node.guid] = node
        return node

    def connect(self, a: int, pa: int, b: int, pb: int) -> None:
        self.nodes[a].ports[pa].peer = (b, pb)
        self.nodes[b].ports[pb].peer = (a, pa)

    def switches(self) -> list[SmNode]:
        return [n for n in self.nodes.values() if n.is_switch]

    def cas(self) -> list[SmNode]:
        return [n for n in self.nodes.values() if n.kind is NodeType.CA]

    def lid_owners(self) -> dict[int, tuple[int, int]]:
        """LID -> (node GUID, port): port 0 for a switch."""
        out: dict[int, tuple[int, int]] = {}
        for n in self.nodes.values():
            for num, p in n.ports.items():
                if p.lid and ((n.is_switch and num == 0) or not n.is_switch):
                    out[p.lid] = (n.guid, num)
        return out


@dataclass
class Routes:
    """What a routing engine decided: per switch GUID, LID -> egress port (0 = itself)."""

    engine: str
    lfts: dict[int, dict[int, int]] = field(default_factory=dict)
    compute_s: float = 0.0
    state: Any = None
    """Engine-private data (hop layers, fabric index) that lets ``ibemu.sm.reroute`` recompute
    only what a link change touches; None when unknown (reroute then recomputes)."""
    patches: dict[int, tuple[Mapping[int, int], Mapping[int, int]]] = field(default_factory=dict, repr=False,
                                                                             compare=False)
    """Switch GUID -> (its LFT in the routes these were derived from, {LID: new port}): what
    a reroute changed, so that programming patches the old table's blocks instead of
    rebuilding them. Only a hint: a table not found here is compared in full."""
    alternates: dict[int, dict[int, tuple[int, ...]]] | None = field(default=None, repr=False, compare=False)
    """An adaptive engine's alternate ports (``ArRoutes.alternates``) for the switches to
    fail over to locally; None: the routes carry none (the switches keep what they have)."""


@dataclass
class ArRoutes:
    """Routes with adaptive-routing groups: the primary LFTs and, per switch GUID and LID,
    the alternate egress ports a switch may take instead of the primary (primary excluded,
    most preferred first). Computed by ``ibemu.sm.routing.alternates``, validated by
    ``ibemu.sm.checker.check_alternates``."""

    engine: str
    primary: Routes
    alternates: dict[int, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    compute_s: float = 0.0
