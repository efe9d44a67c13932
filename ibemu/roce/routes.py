"""Shortest-path ECMP routes of a RoCE fabric (pure): what the fabric manager installs.

Every switch is an IP router. For each CA port (a /32 destination) and each router that is
not the CA's own first hop, the route lists *every* neighbour one hop closer to that first
hop (equal-cost multipath; parallel cables count once each). The first hop reaches its CAs
through the connected /31 of their cable. Routes are computed over the cables that are up;
``diff`` says what to replace and delete to go from one set to the next.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from ibemu.roce.addressing import AddressPlan
from ibemu.topo import Topology
from ibemu.topo.model import NodeKind


@dataclass(frozen=True, slots=True, order=True)
class NextHop:
    ifname: str
    gateway: str


NextHops = tuple[NextHop, ...]
Routes = dict[str, dict[str, NextHops]]
"""router -> destination prefix (``198.18.0.3/32``) -> next hops (sorted)."""


def routers(topo: Topology) -> list[str]:
    """The nodes that route IP: every node but the CAs."""
    return [n.name for n in topo.nodes.values() if n.kind is not NodeKind.CA]


def compute(addrs: AddressPlan, router_names: Collection[str], down: Collection[int] = ()) -> Routes:
    """Routes of every router with the cables whose index is in ``down`` cut."""
    is_router = set(router_names)
    adj: dict[str, list[tuple[str, NextHop]]] = {r: [] for r in sorted(is_router)}
    leaves: dict[str, list[str]] = {}
    for pa in addrs.ports.values():
        if pa.cable in down:
            continue
        if pa.node in is_router and pa.peer.node in is_router:
            adj[pa.node].append((pa.peer.node, NextHop(pa.ifname, pa.peer_ip)))
        elif pa.node not in is_router and pa.peer.node in is_router:
            leaves.setdefault(pa.peer.node, []).append(f"{pa.ip}/32")
    routes: Routes = {r: {} for r in adj}
    for leaf, prefixes in leaves.items():
        dist = _distances(adj, leaf)
        for r, d in dist.items():
            if r == leaf:
                continue
            hops = tuple(sorted({nh for n, nh in adj[r] if dist.get(n) == d - 1}))
            for prefix in prefixes:
                routes[r][prefix] = hops
    return routes


def _distances(adj: dict[str, list[tuple[str, NextHop]]], src: str) -> dict[str, int]:
    dist = {src: 0}
    queue = deque([src])
    while queue:
        r = queue.popleft()
        for n, _ in adj[r]:
            if n not in dist:
                dist[n] = dist[r] + 1
                queue.append(n)
    return dist


@dataclass(slots=True)
class RouteChanges:
    """Per router: routes to write (replace) and destinations to delete."""

    put: dict[str, dict[str, NextHops]]
    delete: dict[str, list[str]]

    @property
    def count(self) -> int:
        return sum(map(len, self.put.values())) + sum(map(len, self.delete.values()))

    @property
    def routers(self) -> list[str]:
        return sorted(set(self.put) | set(self.delete))


def diff(old: Routes, new: Routes) -> RouteChanges:
    """What changes from ``old`` to ``new`` (only routers and prefixes that differ)."""
    put: dict[str, dict[str, NextHops]] = {}
    delete: dict[str, list[str]] = {}
    for r in sorted(set(old) | set(new)):
        before, after = old.get(r, {}), new.get(r, {})
        changed = {p: hops for p, hops in after.items() if before.get(p) != hops}
        gone = sorted(p for p in before if p not in after)
        if changed:
            put[r] = changed
        if gone:
            delete[r] = gone
    return RouteChanges(put, delete)


def local_repair(routes: Routes, dead: Collection[NextHop], at: str) -> tuple[int, int]:
    """What router ``at``'s kernel repairs alone when next hops ``dead`` lose carrier.

    Returns ``(covered, blackholed)``: routes left with a live next hop (the kernel ignores the
    dead ones at once, ``ignore_routes_with_linkdown``) and routes with none left (they need
    the manager: a router upstream must stop sending that way).
    """
    covered = blackholed = 0
    dead_set = set(dead)
    for hops in routes.get(at, {}).values():
        if dead_set.intersection(hops):
            if set(hops) - dead_set:
                covered += 1
            else:
                blackholed += 1
    return covered, blackholed
