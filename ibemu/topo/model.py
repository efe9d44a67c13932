"""The fabric model: nodes, ports, links and the Topology that holds them.

Pure data, built before anything touches the kernel. A Topology is permissive while it is
being built (an importer may add a link to a port number a node does not have) and says
what is wrong through :meth:`Topology.validate`; only things it cannot represent at all
(two nodes with one name, an invalid name) raise at once.

GUIDs follow the IB rules ibsim uses: a switch's ports share the node GUID; a CA's or
router's port N has GUID ``node_guid + N``. Generated GUIDs are deterministic:
``GUID_BASE | kind << 32 | index << 4`` with ``index`` counting nodes of that kind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, NamedTuple

from ibemu.errors import ConfigError
from ibemu.topo.names import MAX_PORT, check_name
from ibemu.topo.names import ifname as _ifname
from ibemu.topo.rates import DEFAULT_MTU, DEFAULT_RATE, LinkRate

log = logging.getLogger(__name__)

#: 0a:1b:e0 is a locally administered company id (bit 1 of the first octet set).
GUID_BASE = 0x0A1BE0 << 40
IBEMU_VENDOR_ID = 0x0A1BE0
DEVICE_IDS = {"switch": 0xB001, "ca": 0xB002, "router": 0xB003}
#: NodeDescription is 64 bytes on the wire.
NODE_DESC_MAX = 64


class NodeKind(StrEnum):
    SWITCH = "switch"
    CA = "ca"
    ROUTER = "router"


_KIND_CODE = {NodeKind.SWITCH: 1, NodeKind.CA: 2, NodeKind.ROUTER: 3}
#: Port count limits by kind (port 0 of a switch is its management port, not counted).
PORT_LIMITS = {NodeKind.SWITCH: (1, MAX_PORT), NodeKind.CA: (1, 2), NodeKind.ROUTER: (1, MAX_PORT)}


def make_guid(kind: NodeKind, index: int) -> int:
    """Deterministic node GUID of the ``index``-th node of ``kind``."""
    return GUID_BASE | _KIND_CODE[kind] << 32 | index << 4


def default_desc(name: str, kind: NodeKind) -> str:
    """NodeDescription in the style real nodes report (``ibemu edge0_0``, ``h3 HCA-1``)."""
    return f"{name} HCA-1" if kind is NodeKind.CA else f"ibemu {name}"


class Endpoint(NamedTuple):
    """One end of a cable: a node name and a port number (``"edge0_0:3"``)."""

    node: str
    port: int

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"

    @classmethod
    def parse(cls, text: str, where: str | None = None) -> Endpoint:
        node, sep, port = str(text).strip().rpartition(":")
        if not sep or not node or not port.strip().isdigit():
            raise ConfigError(f"expected an endpoint 'node:port', got {text!r}", where)
        return cls(node.strip(), int(port))


EndpointLike = Endpoint | str | tuple[str, int]


def as_endpoint(value: EndpointLike) -> Endpoint:
    if isinstance(value, Endpoint):
        return value
    if isinstance(value, str):
        return Endpoint.parse(value)
    return Endpoint(value[0], int(value[1]))


@dataclass(slots=True, eq=False)
class Node:
    """A switch, channel adapter (host) or router."""

    name: str
    kind: NodeKind
    num_ports: int
    guid: int
    desc: str
    vendor_id: int = IBEMU_VENDOR_ID
    device_id: int = 0
    sys_guid: int = 0
    """System image GUID; 0 means "same as the node GUID"."""
    port_guids: dict[int, int] | None = None
    """Per-port GUIDs that differ from the ``guid + port`` rule (imported CAs)."""
    enhanced_port0: bool = True
    level: int | None = None
    """Tier in a tree (hosts 0, edge/leaf 1, ...), for drawing and tree routing."""
    group: int | None = None
    """Pod of a fat-tree, group of a dragonfly."""
    coords: tuple[int, ...] | None = None
    """Position in a torus or mesh."""
    origin: str | None = None
    """Where the node was defined (``file:line``), for located errors."""

    @property
    def is_switch(self) -> bool:
        return self.kind is NodeKind.SWITCH

    @property
    def is_ca(self) -> bool:
        return self.kind is NodeKind.CA

    @property
    def port_range(self) -> range:
        """Cable-able ports (1..num_ports)."""
        return range(1, self.num_ports + 1)

    @property
    def system_guid(self) -> int:
        return self.sys_guid or self.guid

    def port_guid(self, port: int) -> int:
        if self.kind is NodeKind.SWITCH:
            return self.guid
        if self.port_guids and port in self.port_guids:
            return self.port_guids[port]
        return self.guid + port

    def ports_text(self) -> str:
        """``ports 1-4`` style description for error hints."""
        return "port 1" if self.num_ports == 1 else f"ports 1-{self.num_ports}"


@dataclass(slots=True, eq=False)
class Link:
    """A cable between two ports. ``None`` rate/MTU means the topology's defaults."""

    a: Endpoint
    b: Endpoint
    rate: LinkRate | None = None
    mtu: int | None = None
    delay_us: float = 0.0
    """One-way delay (user datapath only)."""
    loss_pct: float = 0.0
    """Random frame loss in percent (user datapath only)."""
    origin: str | None = None
    cable_m: float = 0.0
    """Cable length in metres as the scenario stated it (its propagation is in ``delay_us``)."""

    @property
    def ends(self) -> tuple[Endpoint, Endpoint]:
        return (self.a, self.b)

    def other(self, end: Endpoint | str) -> Endpoint:
        """The far end as seen from endpoint (or node name) ``end``."""
        if end == self.a or end == self.a.node:
            return self.b
        if end == self.b or end == self.b.node:
            return self.a
        raise ValueError(f"{end} is not an end of link {self}")

    def key(self) -> tuple[Endpoint, Endpoint]:
        """Orientation-free identity of the cable."""
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)

    def __str__(self) -> str:
        return f"{self.a}-{self.b}"

    def __repr__(self) -> str:
        return f"Link({self})"


@dataclass(frozen=True, slots=True)
class Port:
    """A view of one port: its GUID and, when cabled, its link and the far end."""

    node: str
    num: int
    guid: int
    link: Link | None
    peer: Endpoint | None

    @property
    def ifname(self) -> str:
        return _ifname(self.node, self.num)


@dataclass(frozen=True, slots=True)
class LinkDefaults:
    """What a link without its own value gets."""

    rate: LinkRate = DEFAULT_RATE
    mtu: int = DEFAULT_MTU
    delay_us: float = 0.0
    loss_pct: float = 0.0
    cable_m: float = 0.0


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a topology, located (``file:line`` or the object concerned)."""

    where: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(frozen=True, slots=True)
class Counts:
    nodes: int
    switches: int
    cas: int
    routers: int
    links: int
    ports: int
    cabled_ports: int
    switch_links: int
    """Links between two switches (the fabric's core, as opposed to host links)."""


class Topology:
    """A fabric: named nodes and the links between their ports."""

    def __init__(
        self,
        name: str = "fabric",
        defaults: LinkDefaults | None = None,
        generator: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.defaults = defaults or LinkDefaults()
        self.generator = generator
        """Generator that built this topology (None when imported or explicit)."""
        self.params: dict[str, Any] = dict(params or {})
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []
        self._at: dict[tuple[str, int], Link] = {}
        self._extra: list[tuple[Endpoint, Link]] = []  # links on an already cabled port
        self._kind_count = {k: 0 for k in NodeKind}
        self._guid_index: dict[int, Node] | None = None

    # --- building -------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        kind: NodeKind | str,
        num_ports: int,
        *,
        guid: int | None = None,
        desc: str | None = None,
        where: str | None = None,
        **attrs: Any,
    ) -> Node:
        """Add a node; GUID and NodeDescription default to the deterministic ibemu ones."""
        kind = NodeKind(kind)
        where = where or attrs.get("origin")
        check_name(name, where)
        if name in self.nodes:
            other = self.nodes[name].origin
            raise ConfigError(
                f"duplicate node name {name!r}" + (f" (first at {other})" if other else ""), where
            )
        lo, hi = PORT_LIMITS[kind]
        if (
            isinstance(num_ports, bool)
            or not isinstance(num_ports, int)
            or not lo <= num_ports <= hi
        ):
            raise ConfigError(
                f"{kind.value} {name} has {num_ports!r} ports, expected {lo}..{hi}", where
            )
        index = self._kind_count[kind]
        self._kind_count[kind] = index + 1
        node = Node(
            name=name,
            kind=kind,
            num_ports=num_ports,
            guid=make_guid(kind, index) if guid is None else guid,
            desc=default_desc(name, kind) if desc is None else desc,
            device_id=attrs.pop("device_id", DEVICE_IDS[kind.value]),
            **attrs,
        )
        if where and node.origin is None:
            node.origin = where
        self.nodes[name] = node
        self._guid_index = None
        return node

    def add_switch(self, name: str, num_ports: int, **kw: Any) -> Node:
        return self.add_node(name, NodeKind.SWITCH, num_ports, **kw)

    def add_ca(self, name: str, num_ports: int = 1, **kw: Any) -> Node:
        return self.add_node(name, NodeKind.CA, num_ports, **kw)

    def add_link(
        self,
        a: EndpointLike,
        b: EndpointLike,
        *,
        rate: LinkRate | None = None,
        mtu: int | None = None,
        delay_us: float = 0.0,
        loss_pct: float = 0.0,
        origin: str | None = None,
        cable_m: float = 0.0,
    ) -> Link:
        """Cable two ports. Not checked here beyond bookkeeping: see :meth:`validate`."""
        ea, eb = as_endpoint(a), as_endpoint(b)
        link = Link(ea, eb, rate=rate, mtu=mtu, delay_us=delay_us, loss_pct=loss_pct, origin=origin,
                    cable_m=cable_m)
        self.links.append(link)
        at = self._at
        for end in (ea, eb) if ea != eb else (ea,):
            key = (end.node, end.port)
            if key in at:
                self._extra.append((end, link))
            else:
                at[key] = link
        return link

    def connect(self, a_node: str, a_port: int, b_node: str, b_port: int, **kw: Any) -> Link:
        return self.add_link(Endpoint(a_node, a_port), Endpoint(b_node, b_port), **kw)

    # --- lookup ---------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Node:
        """The node called ``name`` (KeyError if none)."""
        return self.nodes[name]

    def by_guid(self, guid: int) -> Node | None:
        """The node with this node GUID or port GUID."""
        if self._guid_index is None:
            index: dict[int, Node] = {}
            for node in self.nodes.values():
                index.setdefault(node.guid, node)
                if node.kind is not NodeKind.SWITCH:
                    for p in node.port_range:
                        index.setdefault(node.port_guid(p), node)
            self._guid_index = index
        return self._guid_index.get(guid)

    def link_at(self, node: str, port: int) -> Link | None:
        """The link cabled to ``node``'s ``port``, or None."""
        return self._at.get((node, port))

    def peer(self, node: str, port: int) -> Endpoint | None:
        """The far end of the cable at ``node:port``, or None."""
        link = self._at.get((node, port))
        return None if link is None else link.other(Endpoint(node, port))

    def neighbors(self, node: str) -> list[tuple[int, Endpoint]]:
        """``(local port, far end)`` for each cabled port of ``node``, in port order."""
        n = self.nodes[node]
        out = []
        for p in n.port_range:
            link = self._at.get((node, p))
            if link is not None:
                out.append((p, link.other(Endpoint(node, p))))
        return out

    def neighbor_names(self, node: str) -> list[str]:
        """Distinct neighbouring node names, in port order."""
        return list(dict.fromkeys(end.node for _, end in self.neighbors(node)))

    def ports(self, node: str) -> list[Port]:
        """Every port 1..num_ports of ``node``, cabled or not."""
        n = self.nodes[node]
        out = []
        for p in n.port_range:
            link = self._at.get((node, p))
            peer = None if link is None else link.other(Endpoint(node, p))
            out.append(Port(node, p, n.port_guid(p), link, peer))
        return out

    def links_between(self, a: str, b: str) -> list[Link]:
        return [lk for lk in self.links if {lk.a.node, lk.b.node} == {a, b} and a != b]

    def of_kind(self, kind: NodeKind) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind is kind]

    def switches(self) -> list[Node]:
        return self.of_kind(NodeKind.SWITCH)

    def cas(self) -> list[Node]:
        return self.of_kind(NodeKind.CA)

    hosts = cas

    def routers(self) -> list[Node]:
        return self.of_kind(NodeKind.ROUTER)

    def ifname(self, node: str, port: int) -> str:
        """Interface name of a port of this fabric (<= 15 characters, unique per fabric)."""
        n = self.nodes.get(node)
        if n is None:
            raise ConfigError(f"no node {node!r}")
        if port not in n.port_range:
            raise ConfigError(f"{node} has {n.ports_text()}, not port {port}")
        return _ifname(node, port)

    def rate_of(self, link: Link) -> LinkRate:
        return link.rate or self.defaults.rate

    def mtu_of(self, link: Link) -> int:
        return link.mtu or self.defaults.mtu

    def counts(self) -> Counts:
        kinds = {k: 0 for k in NodeKind}
        ports = 0
        for n in self.nodes.values():
            kinds[n.kind] += 1
            ports += n.num_ports
        nodes = self.nodes
        switch_links = sum(
            1
            for lk in self.links
            if (na := nodes.get(lk.a.node)) is not None
            and na.kind is NodeKind.SWITCH
            and (nb := nodes.get(lk.b.node)) is not None
            and nb.kind is NodeKind.SWITCH
        )
        return Counts(
            nodes=len(self.nodes),
            switches=kinds[NodeKind.SWITCH],
            cas=kinds[NodeKind.CA],
            routers=kinds[NodeKind.ROUTER],
            links=len(self.links),
            ports=ports,
            cabled_ports=len(self._at),
            switch_links=switch_links,
        )

    # --- checking -------------------------------------------------------------------------

    def validate(self) -> list[Problem]:
        """Everything wrong with the graph: errors first, then warnings.

        Errors: links to unknown nodes (dangling), ports outside 1..num_ports, self-links,
        two links on one port, duplicate GUIDs, NodeDescriptions over 64 bytes.
        Warnings: nodes without any link, a fabric in several disconnected parts.
        """
        errors: list[Problem] = []
        nodes = self.nodes
        for link in self.links:
            where = link.origin or f"link {link}"
            bad = False
            for end in link.ends:
                n = nodes.get(end.node)
                if n is None:
                    errors.append(
                        Problem(where, f"dangling port: {end} refers to no node {end.node!r}")
                    )
                    bad = True
                elif not 1 <= end.port <= n.num_ports:
                    what = (
                        "port 0 is the management port"
                        if end.port == 0 and n.is_switch
                        else f"no port {end.port}"
                    )
                    errors.append(Problem(where, f"{end}: {what}; {n.name} has {n.ports_text()}"))
                    bad = True
            if not bad and link.a.node == link.b.node:
                errors.append(
                    Problem(where, f"self-link {link}: a node cannot be cabled to itself")
                )
        for end, link in self._extra:
            first = self._at[(end.node, end.port)]
            errors.append(
                Problem(
                    link.origin or f"link {link}",
                    f"port {end} is used twice: by {link} and by {first}"
                    + (f" ({first.origin})" if first.origin else ""),
                )
            )
        errors.extend(self._guid_problems())
        for n in nodes.values():
            if len(n.desc.encode()) > NODE_DESC_MAX:
                errors.append(
                    Problem(
                        n.origin or f"node {n.name}",
                        f"NodeDescription is over {NODE_DESC_MAX} bytes",
                    )
                )
        return errors + self._warnings()

    def _guid_problems(self) -> list[Problem]:
        seen: dict[int, str] = {}
        out: list[Problem] = []

        def claim(guid: int, owner: str, node: Node) -> None:
            prev = seen.get(guid)
            if prev is None:
                seen[guid] = owner
            elif prev != owner:
                out.append(
                    Problem(
                        node.origin or f"node {node.name}",
                        f"duplicate GUID 0x{guid:016x}: {owner} and {prev}",
                    )
                )

        for n in self.nodes.values():
            claim(n.guid, f"node {n.name}", n)
            if n.kind is not NodeKind.SWITCH:
                for p in n.port_range:
                    claim(
                        n.port_guid(p),
                        f"port {n.name}:{p}" if n.port_guid(p) != n.guid else f"node {n.name}",
                        n,
                    )
        return out

    def _warnings(self) -> list[Problem]:
        out: list[Problem] = []
        parts = self.components()
        linked = {e.node for lk in self.links for e in lk.ends}
        for n in self.nodes.values():
            if n.name not in linked:
                out.append(
                    Problem(
                        n.origin or f"node {n.name}",
                        f"{n.kind.value} {n.name} has no link",
                        "warning",
                    )
                )
        big = [p for p in parts if len(p) > 1]
        if len(big) > 1:
            desc = "; ".join(f"{len(p)} nodes around {min(p)}" for p in big)
            out.append(
                Problem(
                    "topology",
                    f"fabric is split into {len(big)} disconnected parts: {desc}",
                    "warning",
                )
            )
        return out

    def errors(self) -> list[Problem]:
        return [p for p in self.validate() if p.severity == "error"]

    def check(self) -> Topology:
        """Raise ConfigError listing every error problem; return self when there is none."""
        errs = self.errors()
        if errs:
            raise ConfigError("\n".join(str(p) for p in errs))
        return self

    def components(self) -> list[set[str]]:
        """Connected parts of the fabric (links to unknown nodes ignored)."""
        parent = {name: name for name in self.nodes}

        def find(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for lk in self.links:
            if lk.a.node in parent and lk.b.node in parent:
                ra, rb = find(lk.a.node), find(lk.b.node)
                if ra != rb:
                    parent[ra] = rb
        groups: dict[str, set[str]] = {}
        for name in self.nodes:
            groups.setdefault(find(name), set()).add(name)
        return sorted(groups.values(), key=lambda s: (-len(s), min(s)))

    def is_connected(self) -> bool:
        return len(self.components()) <= 1

    # --- conversion -----------------------------------------------------------------------

    def graph_key(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """A comparable summary of the graph: nodes with GUIDs and links with their effective rates.

        Two topologies with equal keys describe the same fabric (order does not matter).
        """
        nodes = tuple(
            sorted(
                (
                    n.name,
                    n.kind.value,
                    n.num_ports,
                    n.guid,
                    n.desc,
                    tuple(n.port_guid(p) for p in n.port_range),
                )
                for n in self.nodes.values()
            )
        )
        links = tuple(sorted((*lk.key(), str(self.rate_of(lk))) for lk in self.links))
        return nodes, links

    def to_networkx(self) -> Any:
        """A ``networkx.MultiGraph``: node attributes from Node, one edge per link."""
        import networkx as nx

        g = nx.MultiGraph(name=self.name)
        for n in self.nodes.values():
            g.add_node(
                n.name,
                kind=n.kind.value,
                level=n.level,
                group=n.group,
                coords=n.coords,
                guid=n.guid,
            )
        for lk in self.links:
            g.add_edge(
                lk.a.node,
                lk.b.node,
                ports=(lk.a.port, lk.b.port),
                gbps=self.rate_of(lk).gbps,
                link=lk,
            )
        return g

    def iter_switch_links(self) -> Iterator[Link]:
        nodes = self.nodes
        for lk in self.links:
            na, nb = nodes.get(lk.a.node), nodes.get(lk.b.node)
            if na is not None and nb is not None and na.is_switch and nb.is_switch:
                yield lk

    def __repr__(self) -> str:
        c = self.counts()
        return f"<Topology {self.name}: {c.switches} switches, {c.cas} CAs, {c.links} links>"


__all__ = [
    "GUID_BASE",
    "Counts",
    "Endpoint",
    "Link",
    "LinkDefaults",
    "Node",
    "NodeKind",
    "Port",
    "Problem",
    "Topology",
    "default_desc",
    "make_guid",
]
