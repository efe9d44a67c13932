"""The IPv4 plan of a RoCE fabric (pure): a /31 per cable, one address per CA port, LIDs.

Every cable gets the ``i``-th /31 of the plan's network (198.18.0.0/15 unless told otherwise,
always inside it): its switch (router) end takes the even address, the other end the odd
one, so a host's address is the odd half of its cable and its gateway the even half. The
transport still speaks LIDs; each cabled CA port gets a LID (1, 2, ... in node order) that
``lid_ips`` maps to its address. Everything is a function of the topology: deterministic.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from ibemu.errors import ConfigError
from ibemu.topo import Topology
from ibemu.topo.model import Endpoint, NodeKind
from ibemu.wire.roce import EMULATED_NET, check_emulated_address

PREFIX_LEN = 31


@dataclass(frozen=True, slots=True)
class PortAddress:
    """One cable end: its interface, address, and the far end's address."""

    node: str
    port: int
    ifname: str
    ip: str
    peer: Endpoint
    peer_ip: str
    cable: int
    """Index of the cable (its /31 is the ``cable``-th of the plan)."""


@dataclass(slots=True)
class AddressPlan:
    network: str
    ports: dict[Endpoint, PortAddress] = field(default_factory=dict)
    lids: dict[Endpoint, int] = field(default_factory=dict)
    """LID of each cabled CA port (what the transport addresses)."""

    def port(self, node: str, port: int = 1) -> PortAddress:
        try:
            return self.ports[Endpoint(node, port)]
        except KeyError:
            raise ConfigError(f"{node}:{port} is not a cabled port of the fabric") from None

    def host_ip(self, node: str, port: int = 1) -> str:
        return self.port(node, port).ip

    def gateway(self, node: str, port: int = 1) -> PortAddress:
        """The far end of a host port's cable (its first-hop router)."""
        pa = self.port(node, port)
        return self.ports[pa.peer]

    def lid(self, node: str, port: int = 1) -> int:
        try:
            return self.lids[Endpoint(node, port)]
        except KeyError:
            raise ConfigError(f"{node}:{port} is not a cabled CA port") from None

    def lid_ips(self) -> dict[int, str]:
        """LID -> IPv4 address of every CA port (the RoCE port's translation table)."""
        return {lid: self.ports[ep].ip for ep, lid in self.lids.items()}

    def node_ports(self, node: str) -> list[PortAddress]:
        return sorted((p for p in self.ports.values() if p.node == node), key=lambda p: p.port)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what the fabric manager process reads)."""
        return {"network": self.network,
                "ports": [[p.node, p.port, p.ifname, p.ip, p.peer.node, p.peer.port, p.peer_ip, p.cable]
                          for p in self.ports.values()],
                "lids": [[ep.node, ep.port, lid] for ep, lid in self.lids.items()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AddressPlan:
        plan = cls(str(data["network"]))
        for node, port, ifname, ip, pnode, pport, pip, cable in data["ports"]:
            check_emulated_address(ip)
            check_emulated_address(pip)
            plan.ports[Endpoint(node, int(port))] = PortAddress(
                node, int(port), ifname, ip, Endpoint(pnode, int(pport)), pip, int(cable))
        plan.lids = {Endpoint(node, int(port)): int(lid) for node, port, lid in data["lids"]}
        return plan


def _is_host(topo: Topology, node: str) -> bool:
    return topo.node(node).kind is NodeKind.CA


def plan_addresses(topo: Topology, network: str = str(EMULATED_NET)) -> AddressPlan:
    """Addresses of every cable end of ``topo`` from ``network`` (inside 198.18.0.0/15)."""
    try:
        net = ipaddress.ip_network(network)
    except ValueError as exc:
        raise ConfigError(f"bad RoCE network {network!r}: {exc}") from None
    if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(ipaddress.IPv4Network(EMULATED_NET)):
        raise ConfigError(f"RoCE network {network} is outside {EMULATED_NET}: ibemu only uses its own range")
    capacity = net.num_addresses // 2
    if len(topo.links) > capacity:
        raise ConfigError(f"{len(topo.links)} cables need {len(topo.links)} /31 networks; {network} has {capacity}")
    plan = AddressPlan(str(net))
    base = int(net.network_address)
    for i, link in enumerate(topo.links):
        a, b = link.a, link.b
        # The router end takes the even address (a host's gateway); between equals, end a.
        if _is_host(topo, a.node) and not _is_host(topo, b.node):
            a, b = b, a
        even = str(ipaddress.IPv4Address(base + 2 * i))
        odd = str(ipaddress.IPv4Address(base + 2 * i + 1))
        check_emulated_address(even)
        check_emulated_address(odd)
        plan.ports[a] = PortAddress(a.node, a.port, topo.ifname(a.node, a.port), even, b, odd, i)
        plan.ports[b] = PortAddress(b.node, b.port, topo.ifname(b.node, b.port), odd, a, even, i)
    lid = 1
    for node in topo.cas():
        for port in node.port_range:
            ep = Endpoint(node.name, port)
            if ep in plan.ports:
                plan.lids[ep] = lid
                lid += 1
    if lid > 0xBFFF:
        raise ConfigError(f"{lid - 1} CA ports exceed the unicast LID range")
    return plan
