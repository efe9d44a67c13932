"""Test helpers for the SM: in-memory fabrics from generated topologies, a minhop router,
an LFT walker, and a trio runner on a mock clock."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing

from ibemu.agents.ca import CaAgent
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.agents.traps import TrapPolicy
from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.testing.wiring import InMemoryFabric
from ibemu.topo import Topology, generate


def fabric_from_topology(topo: Topology, *, sm: str = "h0", trap_policy: TrapPolicy | None = None,
                         record_wire: bool = False) -> InMemoryFabric:
    """Every node of ``topo`` as a device agent named like the node; every link trained."""
    fab = InMemoryFabric(record_wire=record_wire)
    for node in topo.nodes.values():
        if node.is_switch:
            fab.add(node.name, SwitchAgent(node_guid=node.guid, num_ports=node.num_ports,
                                           description=node.desc, clock=fab.clock,
                                           trap_policy=trap_policy))
        else:
            fab.add(node.name, CaAgent(node_guid=node.guid, num_ports=node.num_ports,
                                       description=node.desc, clock=fab.clock))
    for link in topo.links:
        fab.connect(link.a.node, link.a.port, link.b.node, link.b.port)
    sm_agent = fab.agents[sm]
    assert isinstance(sm_agent, CaAgent)
    sm_agent.set_is_sm(1, True)
    return fab


def fat_tree(k: int = 4, **kw: Any) -> tuple[Topology, InMemoryFabric]:
    topo = generate("fat-tree", k=k)
    return topo, fabric_from_topology(topo, **kw)


def minhop(graph: SubnetGraph, engine: str = "minhop") -> Routes:
    """Shortest paths by BFS from every destination LID over live links (test-only)."""
    routes = Routes(engine=engine)
    nodes = graph.nodes
    dests: list[tuple[int, int, int]] = []  # (lid, node guid, port)
    for n in nodes.values():
        for num, p in n.ports.items():
            if p.lid and ((n.is_switch and num == 0) or not n.is_switch):
                dests.append((p.lid, n.guid, num))
    for sw in graph.switches():
        routes.lfts[sw.guid] = {}
    for lid, guid, num in dests:
        node = nodes[guid]
        dist: dict[int, int] = {}
        queue: deque[int] = deque()
        if node.is_switch:
            routes.lfts[guid][lid] = 0
            dist[guid] = 0
            queue.append(guid)
        else:
            p = node.ports[num]
            if p.peer is None or p.peer[0] not in nodes:
                continue
            sw_guid, sw_port = p.peer
            if not nodes[sw_guid].is_switch:
                continue
            routes.lfts[sw_guid][lid] = sw_port
            dist[sw_guid] = 1
            queue.append(sw_guid)
        while queue:
            cur = queue.popleft()
            for _lp, peer, peer_port in nodes[cur].neighbors():
                pn = nodes.get(peer)
                if pn is None or not pn.is_switch or peer in dist:
                    continue
                dist[peer] = dist[cur] + 1
                routes.lfts[peer][lid] = peer_port
                queue.append(peer)
    return routes


def ca_ports(fab: InMemoryFabric) -> list[tuple[str, int]]:
    return [(name, num) for name, a in fab.agents.items() if isinstance(a, CaAgent)
            for num in a.ports if fab.peer(name, num) is not None]


def reaches(fab: InMemoryFabric, src: tuple[str, int], dst_lid: int, max_hops: int = 64) -> bool:
    """Follow the switches' effective LFTs from ``src`` to ``dst_lid`` over Active ports."""
    name, port = src
    for _ in range(max_hops):
        agent = fab.agents[name]
        if agent.ports[port].state != PortState.ACTIVE:
            return False
        peer = fab.peer(name, port)
        if peer is None:
            return False
        name, in_port = peer
        agent = fab.agents[name]
        if agent.ports[in_port].state != PortState.ACTIVE:
            return False
        if isinstance(agent, CaAgent):
            return agent.ports[in_port].lid == dst_lid
        assert isinstance(agent, SwitchAgent)
        if agent.lid == dst_lid:
            return True
        port = agent.lft.lookup(dst_lid)
        if port in (0, 0xFF) or port not in agent.ports:
            return False
    return False


def unreachable_pairs(fab: InMemoryFabric) -> list[tuple[str, str]]:
    ports = ca_ports(fab)
    bad = []
    for src in ports:
        for dst in ports:
            if src == dst:
                continue
            lid = fab.agents[dst[0]].ports[dst[1]].lid
            if not lid or not reaches(fab, src, lid):
                bad.append((f"{src[0]}:{src[1]}", f"{dst[0]}:{dst[1]}"))
    return bad


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    """trio.run on a mock clock that jumps whenever everything waits (timeouts are free)."""
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))
