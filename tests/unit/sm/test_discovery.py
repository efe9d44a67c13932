"""Discovery by directed route over real device agents (k=4 fat-tree in memory)."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from ibemu.sm.discovery import Discovery
from ibemu.sm.graph import SubnetGraph
from ibemu.sm.transport import Transport
from ibemu.testing.madport import InMemoryPort
from ibemu.testing.wiring import InMemoryFabric
from ibemu.wire import madcodec as mb
from ibemu.wire.umad import SimRequest
from tests.unit.sm.helpers import fat_tree, run


@asynccontextmanager
async def discovered(fab: InMemoryFabric, **transport: Any) -> AsyncIterator[tuple[Transport, Discovery, SubnetGraph]]:
    """A cold discovery from h0 (the transport runs until the block ends)."""
    t = Transport(InMemoryPort(fab, "h0"), max_in_flight=16, **transport)
    d = Discovery(t)
    async with trio.open_nursery() as n:
        await n.start(t.serve)
        g = await d.discover()
        yield t, d, g
        n.cancel_scope.cancel()


def test_cold_discovery_finds_every_node_and_every_cable_with_its_ports() -> None:
    topo, fab = fat_tree(4)

    async def main() -> None:
        async with discovered(fab) as (t, d, g):
            assert len(g.switches()) == 20 and len(g.cas()) == 16
            assert g.sm_guid == topo.node("h0").guid and d.sm_port == 1
            want = {frozenset({(topo.node(lk.a.node).guid, lk.a.port), (topo.node(lk.b.node).guid, lk.b.port)})
                    for lk in topo.links}
            got = {frozenset({(n.guid, p), (peer, pp)}) for n in g.nodes.values() for p, peer, pp in n.neighbors()}
            assert got == want
            edge = g.nodes[topo.node("edge3_1").guid]
            assert edge.desc == topo.node("edge3_1").desc
            assert all(d.switch_info.get(s.guid) for s in g.switches())
            assert t.stats["timeouts"] == 0
            # every directed route leads where the graph says
            unreachable = d.recompute_paths()
            assert not unreachable
            assert len(g.nodes[topo.node("edge0_1").guid].dr_path) == 3  # h0 -> edge0_0 -> agg -> edge0_1
            assert len(edge.dr_path) == 5  # ... -> agg -> core -> agg -> edge3_1

    run(main)


def test_refresh_finds_a_cable_gone_and_back_and_routes_avoid_it() -> None:
    topo, fab = fat_tree(4)

    async def main() -> None:
        async with discovered(fab) as (_t, d, g):
            d.recompute_paths()
            e00, a00 = topo.node("edge0_0").guid, topo.node("agg0_0").guid
            fab.link_down("edge0_0", 3)  # edge0_0:3 - agg0_0:1
            changes = await d.verify_paths({a00})
            changes += await d.refresh({e00, a00})
            assert {(c.kind, c.guid, c.port) for c in changes} >= {("down", e00, 3)}
            assert g.nodes[e00].ports[3].peer is None and g.nodes[a00].ports[1].peer is None
            assert 3 not in g.nodes[a00].dr_path[1:2]  # no longer through the dead cable
            fab.link_up("edge0_0", 3)
            changes = await d.refresh({e00})
            assert [(c.kind, c.port) for c in changes] == [("up", 3)]
            assert g.nodes[e00].ports[3].peer == (a00, 1)

    run(main)


def test_refresh_with_verify_reads_a_switch_behind_a_dead_cable_without_a_timeout() -> None:
    topo, fab = fat_tree(4)

    async def main() -> None:
        async with discovered(fab, timeout_s=5.0) as (t, d, g):
            d.recompute_paths()
            e00, a00 = topo.node("edge0_0").guid, topo.node("agg0_0").guid
            assert g.nodes[a00].dr_path == (1, 3)  # through edge0_0:3
            fab.link_down("edge0_0", 3)
            t0 = trio.current_time()
            changes = await d.refresh({a00}, verify=True)
            assert trio.current_time() - t0 < 1.0  # no 5 s timeout: the read was cancelled
            assert ("down", e00, 3) in {(c.kind, c.guid, c.port) for c in changes}
            assert g.nodes[a00].dr_path[1] != 3 and g.nodes[a00].ports[1].peer is None
            assert t.stats["timeouts"] == 0 and t.stats["cancelled"] >= 1 and not t._pending

    run(main)


def test_refresh_with_verify_sends_the_hop_checks_and_the_port_reads_as_one_batch_hops_first() -> None:
    """The cables a switch's route crosses and every port of the switch: one batch of calls
    (sent in one pass), the hops first, so the reads answered first never wait for hop
    checks sent after them (a task per hop used to send them last)."""
    topo, fab = fat_tree(4)

    async def main() -> None:
        async with discovered(fab) as (t, d, g):
            d.recompute_paths()
            far = topo.node("edge3_1").guid  # three switches away from h0
            node = g.nodes[far]
            hops = sorted(d._hops(node.dr_path))
            assert len(hops) >= 2
            batches: list[list[bytes]] = []
            submit = t.submit

            def recorded(calls: Any) -> None:
                calls = list(calls)
                batches.append([c.req.mad for c in calls])
                submit(calls)

            t.submit = recorded  # type: ignore[method-assign]
            sent = t.stats["sent"]
            changes = await d.refresh({far}, verify=True)
            assert not changes and far in d.read_all
            assert len(batches) == 1 and t.stats["sent"] - sent == len(hops) + node.num_ports
            mods = [struct.unpack_from("!I", mad, 20)[0] for mad in batches[0]]
            paths = [tuple(mad[128 + 1:128 + 1 + mad[7]]) for mad in batches[0]]
            assert [(p, m) for p, m in zip(paths, mods, strict=True)][:len(hops)] == [
                (g.nodes[guid].dr_path, port) for guid, port in hops]
            assert set(paths[len(hops):]) == {node.dr_path}

    run(main)


def test_two_switches_are_read_in_one_batch_their_shared_hops_checked_once() -> None:
    """Two trapping switches: their routes' cables, each once, then both switches' ports, in
    one batch."""
    topo, fab = fat_tree(4)

    async def main() -> None:
        async with discovered(fab) as (t, d, g):
            d.recompute_paths()
            a, b = topo.node("edge3_1").guid, topo.node("agg3_0").guid
            hops = d._hops(g.nodes[a].dr_path) | d._hops(g.nodes[b].dr_path)
            shared = d._hops(g.nodes[a].dr_path) & d._hops(g.nodes[b].dr_path)
            assert shared
            batches: list[int] = []
            submit = t.submit

            def recorded(calls: Any) -> None:
                calls = list(calls)
                batches.append(len(calls))
                submit(calls)

            t.submit = recorded  # type: ignore[method-assign]
            sent = t.stats["sent"]
            assert not await d.refresh({a, b}, verify=True)
            assert d.read_all == {a, b}
            assert batches == [len(hops) + g.nodes[a].num_ports + g.nodes[b].num_ports]
            assert t.stats["sent"] - sent == batches[0]

    run(main)


def test_a_switch_read_with_another_behind_a_dead_cable_is_read_all_the_same() -> None:
    """One of two switches lies behind a cable found down: the batch stops, each is read
    again on its own (the cut one by its new route), nothing waits for a timeout."""
    topo, fab = fat_tree(4)

    async def main() -> None:
        async with discovered(fab, timeout_s=5.0) as (t, d, g):
            d.recompute_paths()
            e00, a00, e31 = topo.node("edge0_0").guid, topo.node("agg0_0").guid, topo.node("edge3_1").guid
            assert g.nodes[a00].dr_path == (1, 3)  # through edge0_0:3
            fab.link_down("edge0_0", 3)
            t0 = trio.current_time()
            changes = await d.refresh({a00, e31}, verify=True)
            assert trio.current_time() - t0 < 1.0  # no 5 s timeout
            assert ("down", e00, 3) in {(c.kind, c.guid, c.port) for c in changes}
            assert {a00, e31} <= d.answered and g.nodes[a00].dr_path[1] != 3
            assert t.stats["timeouts"] == 0 and not t._pending

    run(main)


def test_paths_hold_exactly_when_a_recompute_would_find_the_same_routes() -> None:
    """``paths_hold`` (which lets a reroute skip the BFS) against the BFS itself, for every
    switch-to-switch cable of k=4 cut alone, with and without its far end avoided."""
    _topo, fab = fat_tree(4)

    async def main() -> None:
        async with discovered(fab) as (_t, d, g):
            pass  # the graph as discovered; what follows needs no SMPs
        d.recompute_paths()
        cables = sorted({tuple(sorted([(s.guid, p), (peer, pp)])) for s in g.switches()
                         for p, peer, pp in s.neighbors() if g.nodes[peer].is_switch})
        held = 0
        for end_a, end_b in cables:
            for avoid in (set(), {end_b[0]}):
                before = {guid: node.dr_path for guid, node in g.nodes.items()}
                d.unlink(*end_a)
                hold = d.paths_hold([(end_a, end_b)], avoid)
                lost = d.recompute_paths(avoid)
                after = {guid: node.dr_path for guid, node in g.nodes.items()}
                if hold or not avoid:  # sound; and exact when nothing is avoided
                    assert hold == (after == before), (end_a, end_b, avoid)
                assert not lost
                held += hold
                g.connect(*end_a, *end_b)
                g.nodes[end_a[0]].ports[end_a[1]].state = g.nodes[end_b[0]].ports[end_b[1]].state = 4
                d.recompute_paths()
                assert {guid: node.dr_path for guid, node in g.nodes.items()} == before
        assert 0 < held < 2 * len(cables)

    run(main)


class DiesAfterNodeInfo:
    """A port that unplugs every cable of switch ``name`` as its first NodeInfo answer arrives."""

    def __init__(self, inner: InMemoryPort, fab: InMemoryFabric, name: str, guid: int) -> None:
        self.inner, self.fab, self.name, self.guid, self.dead = inner, fab, name, guid, False

    async def send(self, req: SimRequest) -> None:
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        got = await self.inner.recv()
        mad = got.mad
        if (not self.dead and mad[3] == 0x81 and int.from_bytes(mad[16:18], "big") == 0x0011
                and mb.parse_node_info(mb.smp_data(mad)).node_guid == self.guid):
            self.dead = True
            for num in range(1, 5):
                if self.fab.peer(self.name, num) is not None:
                    self.fab.link_down(self.name, num)
        return got


def test_a_switch_dead_right_after_its_node_info_answer_is_left_out() -> None:
    """Its other Gets (one batch) all go unanswered: it is not kept with no ports read."""
    topo, fab = fat_tree(4)
    agg = topo.node("agg1_0").guid

    async def main() -> None:
        t = Transport(DiesAfterNodeInfo(InMemoryPort(fab, "h0"), fab, "agg1_0", agg),
                      max_in_flight=16, timeout_s=0.05, retries=1)
        d = Discovery(t)
        async with trio.open_nursery() as n:
            await n.start(t.serve)
            g = await d.discover()
            assert agg not in g.nodes and len(g.nodes) == 35
            assert t.stats["timeouts"] >= 2 * 7  # its batch: NodeDescription, SwitchInfo, 5 PortInfo
            assert all(peer != agg for node in g.nodes.values() for _num, peer, _pp in node.neighbors())
            assert d.unresponsive and all(end[0] in g.nodes for end in d.unresponsive)
            assert not d.recompute_paths()
            n.cancel_scope.cancel()

    run(main)


def test_a_get_made_once_per_route_is_the_one_made_afresh() -> None:
    from ibemu.sm.discovery import get_smp

    for path in [(), (1,), (1, 3, 2), tuple(range(1, 64))]:
        for attr, mod in [(0x0011, 0), (0x0015, 7), (0x0012, 0)]:
            assert get_smp(attr, path, mod) == mb.dr_smp(mb.GET, attr, path=path, modifier=mod)
            assert get_smp(attr, path, mod) is get_smp(attr, path, mod)
