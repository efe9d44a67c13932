"""Credit-loop detection: the ports and VLs of a deadlocked InfiniBand fabric.

A credit loop is a cycle of egress queues, each waiting for credits that only the next one can
free: egress (A, p, VLx) has a packet at its head and no credits for it from its peer's input
buffer (B, q, VLx); that buffer is full of packets queued at B's egress ports (B, r, VLy),
which are waiting in turn, and so on back to (A, p, VLx). With the model's lossless links (and
no HOQLife discards) nothing in the cycle ever moves again.

:func:`find_credit_loops` builds that wait-for graph from the nodes' state: a vertex per
(node, port, VL) whose head has waited for credits for at least ``stall_ns`` and has seen no
credit returned for as long; an edge to every vertex holding packets that came in through the
peer's input buffer it waits on. Every cycle of the graph (one per strongly connected
component, found with Tarjan's algorithm and a walk inside the component) is reported as a
:class:`CreditLoop`: the (node, port, VL) hops in order and how long the youngest has been
stuck.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ibemu.physics.model import Node
from ibemu.physics.qos import VL15

Vertex = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class CreditLoop:
    hops: tuple[Vertex, ...]
    """(node, egress port, VL), each waiting on credits the next one holds."""
    stalled_ns: int
    """How long every hop has been waiting at least (no credit returned meanwhile)."""

    def describe(self) -> str:
        path = " -> ".join(f"{n}:{p}/VL{vl}" for n, p, vl in self.hops)
        return f"credit loop over {len(self.hops)} ports, stuck {self.stalled_ns / 1000:.1f} us: {path} -> (back)"


def _stuck_since(node: Node, port: int, vl: int) -> int | None:
    p = node.ports[port]
    since = p.blocked_since.get(vl)
    if since is None or not p.queues[vl]:
        return None
    return max(since, p.last_credit_ns.get(vl, since))


def wait_for_graph(nodes: Mapping[str, Node], now: int, stall_ns: int) -> tuple[dict[Vertex, list[Vertex]], dict[Vertex, int]]:
    """The wait-for graph of the (node, port, VL)s stuck for ``stall_ns`` (see the module
    docstring), and how long each has been stuck."""
    stuck: dict[Vertex, int] = {}
    for node in nodes.values():
        if node.kind != "ib":
            continue
        for num in node.ports:
            for vl in range(VL15):
                since = _stuck_since(node, num, vl)
                if since is not None and now - since >= stall_ns:
                    stuck[(node.name, num, vl)] = now - since
    # where the frames from each input buffer (node, in_port, in_vl) wait
    holders: dict[tuple[str, int, int], set[Vertex]] = {}
    for node in nodes.values():
        for num, p in node.ports.items():
            for vl in range(VL15):
                for f in p.queues[vl]:
                    if f.in_port >= 0:
                        holders.setdefault((node.name, f.in_port, f.in_class), set()).add((node.name, num, vl))
    graph: dict[Vertex, list[Vertex]] = {}
    for v in stuck:
        name, port, vl = v
        peer = nodes[name].ports[port].peer
        if peer is None:
            graph[v] = []
            continue
        graph[v] = sorted(w for w in holders.get((peer[0], peer[1], vl), ()) if w in stuck)
    return graph, stuck


def _sccs(graph: dict[Vertex, list[Vertex]]) -> list[list[Vertex]]:
    index: dict[Vertex, int] = {}
    low: dict[Vertex, int] = {}
    on: set[Vertex] = set()
    stack: list[Vertex] = []
    out: list[list[Vertex]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[Vertex, int]] = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            succ = graph.get(v, [])
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def _cycle_in(comp: list[Vertex], graph: dict[Vertex, list[Vertex]]) -> tuple[Vertex, ...]:
    members = set(comp)
    start = min(comp)
    path = [start]
    seen = {start: 0}
    v = start
    while True:
        nxt = next(w for w in graph[v] if w in members)
        if nxt in seen:
            return tuple(path[seen[nxt]:])
        seen[nxt] = len(path)
        path.append(nxt)
        v = nxt


def find_credit_loops(nodes: Mapping[str, Node], now: int, stall_ns: int = 100_000) -> list[CreditLoop]:
    """Every credit loop among ``nodes`` whose ports have waited ``stall_ns`` without a credit."""
    graph, stuck = wait_for_graph(nodes, now, stall_ns)
    loops = []
    for comp in _sccs(graph):
        if len(comp) == 1 and comp[0] not in graph[comp[0]]:
            continue
        hops = _cycle_in(comp, graph)
        loops.append(CreditLoop(hops, min(stuck[h] for h in hops)))
    return loops
