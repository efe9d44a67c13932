"""Graph analysis the subnet manager and reports need: hops, diameter, oversubscription, bisection.

Hop counts are switch hops as IB counts them: a CA does not forward, so paths never pass
through one; a host's distance to its own switch is 1.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict, deque
from dataclasses import dataclass

from ibemu.topo.model import NodeKind, Topology

log = logging.getLogger(__name__)


def _adjacency(topo: Topology) -> dict[str, list[str]]:
    adj: dict[str, list[str]] = {name: [] for name in topo.nodes}
    for lk in topo.links:
        a, b = lk.a.node, lk.b.node
        if a in adj and b in adj and a != b:
            adj[a].append(b)
            adj[b].append(a)
    return adj


def hop_distances(
    topo: Topology, source: str, adj: dict[str, list[str]] | None = None
) -> dict[str, int]:
    """Hops from ``source`` to every reachable node, forwarding only through switches."""
    adj = adj or _adjacency(topo)
    nodes = topo.nodes
    dist = {source: 0}
    queue = deque([source])
    while queue:
        cur = queue.popleft()
        if cur != source and nodes[cur].kind is not NodeKind.SWITCH:
            continue  # a CA or router ends a path
        d = dist[cur] + 1
        for nxt in adj[cur]:
            if nxt not in dist:
                dist[nxt] = d
                queue.append(nxt)
    return dist


def switch_hops(topo: Topology) -> dict[str, dict[str, int]]:
    """All-pairs hop counts between switches (the min-hop table an SM starts from)."""
    adj = _adjacency(topo)
    switches = {n.name for n in topo.switches()}
    sadj = {s: [t for t in adj[s] if t in switches] for s in switches}
    out: dict[str, dict[str, int]] = {}
    for s in switches:
        dist = {s: 0}
        queue = deque([s])
        while queue:
            cur = queue.popleft()
            for nxt in sadj[cur]:
                if nxt not in dist:
                    dist[nxt] = dist[cur] + 1
                    queue.append(nxt)
        out[s] = dist
    return out


def host_diameter(topo: Topology) -> int | None:
    """Largest hop count between two CAs (None when some pair is unreachable or < 2 CAs)."""
    adj = _adjacency(topo)
    nodes = topo.nodes
    attach: dict[str, set[str]] = {}
    for ca in topo.cas():
        attach[ca.name] = {n for n in adj[ca.name] if nodes[n].kind is NodeKind.SWITCH}
    if len(attach) < 2:
        return None
    used = set().union(*attach.values())
    hops = switch_hops(topo)
    worst = 0
    # A host pair's distance is 2 + the switch distance between their (best) switches.
    best: dict[tuple[str, str], int] = {}
    for s in used:
        for t in used:
            d = hops[s].get(t)
            if d is None:
                return None
            best[(s, t)] = d
    groups = Counter(frozenset(v) for v in attach.values())
    if any(not g for g in groups):
        return None
    keys = list(groups)
    for i, ga in enumerate(keys):
        for gb in keys[i:]:
            if ga is gb and groups[ga] < 2:
                continue
            d = min(best[(s, t)] for s in ga for t in gb)
            worst = max(worst, d + 2)
    return worst


@dataclass(frozen=True, slots=True)
class TierLoad:
    """Capacity of one tier of a layered fabric (tiers by ``Node.level``)."""

    level: int
    switches: int
    down_gbps: float
    up_gbps: float

    @property
    def oversubscription(self) -> float | None:
        """down:up ratio of the tier's worst switch (None for the top tier)."""
        return None if self.up_gbps == 0 else self.down_gbps / self.up_gbps


def tier_loads(topo: Topology) -> list[TierLoad]:
    """Per tier: the worst switch's down/up capacity. Empty unless every node has a level."""
    nodes = topo.nodes
    if not nodes or any(n.level is None for n in nodes.values()):
        return []
    down: dict[str, float] = defaultdict(float)
    up: dict[str, float] = defaultdict(float)
    for lk in topo.links:
        na, nb = nodes.get(lk.a.node), nodes.get(lk.b.node)
        if na is None or nb is None or na.level == nb.level:
            continue
        lo, hi = (na, nb) if (na.level or 0) < (nb.level or 0) else (nb, na)
        g = topo.rate_of(lk).gbps
        up[lo.name] += g
        down[hi.name] += g
    tiers: dict[int, list[str]] = {}
    for n in nodes.values():
        if n.kind is NodeKind.SWITCH and n.level is not None:
            tiers.setdefault(n.level, []).append(n.name)
    out = []
    for level in sorted(tiers):
        names = tiers[level]

        def ratio(name: str) -> float:
            return down[name] / up[name] if up[name] else 0.0

        worst = max(names, key=ratio)
        out.append(TierLoad(level, len(names), down[worst], up[worst]))
    return out


def oversubscription(topo: Topology) -> float | None:
    """Worst down:up ratio over all tiers of a layered fabric (1.0 = non-blocking)."""
    ratios = [t.oversubscription for t in tier_loads(topo) if t.oversubscription is not None]
    return max(ratios) if ratios else None


def bisection_gbps(topo: Topology) -> float:
    """Bandwidth across the cut between the first and second half of the CAs (by order).

    For the generated Clos fabrics the halves are the first and last half of the pods or
    leaves, which is the usual bisection; for other shapes it is one balanced cut.
    """
    import networkx as nx

    cas = [n.name for n in topo.cas()]
    if len(cas) < 2:
        return 0.0
    half = len(cas) // 2
    g = nx.DiGraph()
    for lk in topo.links:
        a, b = lk.a.node, lk.b.node
        if a == b or a not in topo.nodes or b not in topo.nodes:
            continue
        cap = topo.rate_of(lk).gbps
        for u, v in ((a, b), (b, a)):
            if g.has_edge(u, v):
                g[u][v]["capacity"] += cap
            else:
                g.add_edge(u, v, capacity=cap)
    src, dst = "\0src", "\0dst"
    for name in cas[:half]:
        g.add_edge(src, name)  # no capacity attribute: unbounded
    for name in cas[half:]:
        g.add_edge(name, dst)
    value, _ = nx.maximum_flow(g, src, dst)
    return float(value)


@dataclass(frozen=True, slots=True)
class Summary:
    nodes: int
    switches: int
    cas: int
    routers: int
    links: int
    switch_links: int
    ports: int
    cabled_ports: int
    radix: dict[int, int]
    rates: dict[str, int]
    parts: int
    diameter: int | None
    tiers: list[TierLoad]


def summarize(topo: Topology) -> Summary:
    """Counts and shape of a topology, for ``ibemu topo info`` and reports."""
    c = topo.counts()
    radix = Counter(n.num_ports for n in topo.switches())
    rates = Counter(str(topo.rate_of(lk)) for lk in topo.links)
    return Summary(
        nodes=c.nodes,
        switches=c.switches,
        cas=c.cas,
        routers=c.routers,
        links=c.links,
        switch_links=c.switch_links,
        ports=c.ports,
        cabled_ports=c.cabled_ports,
        radix=dict(sorted(radix.items())),
        rates=dict(rates.most_common()),
        parts=len([p for p in topo.components() if len(p) > 1 or len(topo.nodes) == 1]),
        diameter=host_diameter(topo),
        tiers=tier_loads(topo),
    )


def infer_levels(topo: Topology) -> dict[str, int]:
    """Tiers for a topology without ``level`` (an import): CAs 0, switches 1 + hops to a CA."""
    if all(n.level is not None for n in topo.nodes.values()):
        return {n.name: n.level or 0 for n in topo.nodes.values()}
    adj = _adjacency(topo)
    level = {n.name: 0 for n in topo.nodes.values() if n.kind is not NodeKind.SWITCH}
    queue = deque(level)
    while queue:
        cur = queue.popleft()
        for nxt in adj[cur]:
            if nxt not in level:
                level[nxt] = level[cur] + 1
                queue.append(nxt)
    for name in topo.nodes:
        level.setdefault(name, 1)
    return level
