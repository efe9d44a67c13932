"""LFT programming plans: blocks patched from a reroute's diff equal blocks built afresh."""

from __future__ import annotations

from typing import Any, cast

import trio

from ibemu.events import EventLog
from ibemu.sm.graph import Routes, SmNode, SubnetGraph
from ibemu.sm.manager import default_reroute_fn
from ibemu.sm.program import NO_ROUTE, LftProgrammer, lft_blocks
from ibemu.sm.routing import compute
from ibemu.sm.transport import Transport
from ibemu.testing.fromtopo import graph_of, remove_link, restore_link
from ibemu.testing.madport import EchoPort
from ibemu.topo import Topology, generate
from ibemu.wire.madpacket import INITIAL_PATH
from ibemu.wire.umad import SimRequest
from tests.unit.sm.helpers import run
from tests.unit.sm.test_reroute import switch_links


def programmer() -> LftProgrammer:
    return LftProgrammer(transport=cast(Transport, None), events=EventLog())


def written_as_planned(prog: LftProgrammer, routes: Routes, top: int) -> dict[int, dict[int, bytes]]:
    """Plan, and take every planned block as acknowledged (what ``program`` records)."""
    plan = prog.plan(routes, top)
    for guid, blocks in plan.items():
        prog.written.setdefault(guid, {}).update(blocks)
    return plan


def test_patched_blocks_match_fresh_ones_through_failures_and_a_restore() -> None:
    g = graph_of(generate("fat-tree", k=8))
    routes = compute(g, "ftree")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    prog, fresh = programmer(), programmer()
    written_as_planned(prog, routes, top)
    written_as_planned(fresh, routes, top)
    links = switch_links(g)
    cut = links[::29][:5]
    steps: list[tuple[str, Any]] = [("down", c) for c in cut] + [("up", cut[0])]
    patched_tables = 0
    for what, (a, pa, b, pb) in steps:
        if what == "down":
            remove_link(g, a, pa)
        else:
            restore_link(g, a, pa, (b, pb))
        new = default_reroute_fn(g, routes, [(a, pa), (b, pb)])
        assert new.patches, "a reroute that changed tables hands its diff over"
        patched_tables += len(new.patches)
        plan = written_as_planned(prog, new, top)
        # the same blocks as a programmer that builds every changed table from scratch
        unhinted = Routes(new.engine, new.lfts, state=new.state)
        assert plan == written_as_planned(fresh, unhinted, top)
        for guid, lft in new.lfts.items():
            assert prog._blocks[guid][2] == lft_blocks(lft, top), guid
        routes = new
    assert patched_tables >= 10


def test_lid_routed_for_a_whole_pass_is_each_switchs_own_answer_through_cuts_and_restores() -> None:
    """``lid_routed_all`` shares the walks back to the SM between a pass's switches; its
    answer for each is the one ``lid_routed_ok`` gives alone, on k=8 ftree through cuts
    (before and after their blocks are written) and restores, with and without the
    LinearFDBTops checked, over switches that answer both ways."""
    g = graph_of(generate("fat-tree", k=8))
    routes = compute(g, "ftree")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    prog = programmer()
    sm = next(iter(g.cas()))
    prog.sm_guid, prog.sm_port, prog.sm_lid = sm.guid, 1, sm.lid
    written_as_planned(prog, routes, top)
    tops = {s.guid: top for s in g.switches()}
    tops[max(tops)] = 0  # one switch routes nothing: walks through it fail
    answers: set[bool] = set()
    for a, pa, b, pb in switch_links(g)[::23][:6]:
        for what in ("down", "up"):
            if what == "down":
                remove_link(g, a, pa)
            else:
                restore_link(g, a, pa, (b, pb))
            new = default_reroute_fn(g, routes, [(a, pa), (b, pb)])
            plan = prog.plan(new, top)
            for fdb_top in (None, tops.__getitem__):
                prog.fdb_top = fdb_top
                for p in (plan, None):
                    alone = {guid: prog.lid_routed_ok(g, guid, p) for guid in g.nodes if g.nodes[guid].is_switch}
                    assert prog.lid_routed_all(g, list(alone), p) == alone
                    answers |= set(alone.values())
            prog.fdb_top = None
            written_as_planned(prog, new, top)
            routes = new
    assert answers == {True, False}


def test_a_stale_hint_is_ignored() -> None:
    """A patch whose base table is not the one the blocks were built from is not applied."""
    g = graph_of(generate("fat-tree", k=4))
    routes = compute(g, "minhop")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    prog = programmer()
    written_as_planned(prog, routes, top)
    guid = next(iter(routes.lfts))
    lft = dict(routes.lfts[guid])
    lid = next(iter(lft))
    lft[lid] = 0 if lft[lid] != 0 else 1
    other = Routes(routes.engine, {**routes.lfts, guid: lft},
                   patches={guid: ({}, {lid: 7})})  # based on a table never planned
    plan = prog.plan(other, top)
    assert plan[guid][lid // 64][lid % 64] == lft[lid]


class Answering(EchoPort):
    """An ``EchoPort`` that leaves LID-routed SMPs and those to ``dead`` (directed routes
    whose path starts with it) unanswered; counts what it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.lid_routed = self.directed = 0
        self.dead_path: tuple[int, ...] | None = None

    def send_nowait(self, req: SimRequest) -> None:
        mad = req.mad
        if mad[1] == 0x01:
            self.lid_routed += 1
            return
        self.directed += 1
        if self.dead_path is not None and tuple(mad[INITIAL_PATH + 1:INITIAL_PATH + 1 + len(self.dead_path)]) == self.dead_path:
            return
        super().send_nowait(req)


def test_unanswered_lid_routed_sets_fall_back_to_directed_route_and_a_dead_switch_is_suspected() -> None:
    g = graph_of(generate("fat-tree", k=4))
    for i, node in enumerate(sorted(g.switches(), key=lambda n: n.guid)):
        node.dr_path = (1, 2 + i % 3, 1 + i)  # distinct: the port tells them apart
    routes = compute(g, "ftree")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    port = Answering()

    async def main() -> None:
        t = Transport(port, timeout_s=0.05, retries=1)
        events = EventLog()
        prog = LftProgrammer(transport=t, events=events)
        sm = g.cas()[0]
        prog.sm_guid, prog.sm_port, prog.sm_lid = sm.guid, 1, sm.lid
        async with trio.open_nursery() as n:
            await n.start(t.serve)
            first = await prog.program(g, routes, top)  # never written: directed route
            assert first.failed == 0 and first.acked == first.sent == port.directed > 0
            assert port.lid_routed == 0 and events.counts["lft_block_acked"] == first.acked
            # a cable cut: the changed blocks go LID-routed where the tables allow (never
            # answered here), then by directed route; one switch answers nothing at all
            a, pa, _b, _pb = switch_links(g)[0]
            peer = remove_link(g, a, pa)
            assert peer is not None
            new = default_reroute_fn(g, routes, [(a, pa), peer])
            plan = prog.plan(new, top)
            dead = max(plan, key=lambda guid: (len(plan[guid]), guid))
            blocks_dead = len(plan[dead])
            port.dead_path = g.nodes[dead].dr_path
            port.directed = 0
            res = await prog.program(g, new, top)
            assert res.sent == sum(len(b) for b in plan.values())
            assert port.lid_routed == t.stats["lid_routed_sets"] == t.stats["lid_routed_fallback"] > 0
            assert res.failed == blocks_dead and res.acked == res.sent - blocks_dead
            assert res.suspects == [dead] and prog.suspects == {dead}
            assert port.directed == res.sent + blocks_dead  # the dead switch's Sets: two attempts each
            assert all(prog.written[guid] == prog._blocks[guid][2] for guid in new.lfts if guid != dead)
            assert all(b not in prog.written[dead] for b in plan[dead])
            n.cancel_scope.cancel()

    run(main)


def _planned(topo: Topology) -> tuple[SubnetGraph, int, LftProgrammer, SmNode]:
    """The top LID of ftree's routes on ``topo``, a programmer that has them as planned
    (every table written), and the SM on the first CA's port 1."""
    g = graph_of(topo)
    routes = compute(g, "ftree")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    prog = programmer()
    sm = g.cas()[0]
    prog.sm_guid, prog.sm_port, prog.sm_lid = sm.guid, 1, sm.lid
    written_as_planned(prog, routes, top)
    return g, top, prog, sm


def test_no_lid_routed_set_through_a_switch_whose_linear_fdb_top_is_below_the_lid() -> None:
    """A switch routes no LID above its LinearFDBTop: with ``fdb_top`` the programmer sends
    LID-routed only where every switch on the way (and back to the SM) has a top that
    covers the LID. In a cold sweep the tables are written before the tops are raised."""
    g, top, prog, sm = _planned(generate("fat-tree", k=4))
    switches = [s.guid for s in g.switches()]
    assert all(prog.lid_routed_ok(g, guid) for guid in switches)  # without tops: the LFTs alone
    tops = dict.fromkeys(switches, 0)
    prog.fdb_top = tops.__getitem__
    assert not any(prog.lid_routed_ok(g, guid) for guid in switches)  # tops still 0
    tops.update(dict.fromkeys(switches, top))
    assert all(prog.lid_routed_ok(g, guid) for guid in switches)
    # the SM's own leaf with a top below the SM's LID: no answer gets back through it
    leaf = sm.ports[1].peer[0]
    tops[leaf] = sm.lid - 1
    assert not any(prog.lid_routed_ok(g, guid) for guid in switches)


def test_a_lid_routed_set_answered_by_directed_route_is_not_counted_unanswered() -> None:
    """The LID-routed attempts that fell back to directed route are ``fell_back`` in the
    transport's stats, not ``failed`` (which makes the SM sweep again: a cold sweep is not
    SUBNET UP with SMPs failed)."""
    g = graph_of(generate("fat-tree", k=4))
    for i, node in enumerate(sorted(g.switches(), key=lambda n: n.guid)):
        node.dr_path = (1, 2 + i % 3, 1 + i)
    routes = compute(g, "ftree")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    port = Answering()  # never answers a LID-routed SMP

    async def main() -> None:
        t = Transport(port, timeout_s=0.05, retries=1)
        prog = LftProgrammer(transport=t, events=EventLog())
        sm = g.cas()[0]
        prog.sm_guid, prog.sm_port, prog.sm_lid = sm.guid, 1, sm.lid
        async with trio.open_nursery() as n:
            await n.start(t.serve)
            await prog.program(g, routes, top)
            a, pa, _b, _pb = switch_links(g)[0]
            peer = remove_link(g, a, pa)
            assert peer is not None
            res = await prog.program(g, default_reroute_fn(g, routes, [(a, pa), peer]), top)
            assert res.failed == 0 and port.lid_routed > 0
            assert t.stats["fell_back"] == port.lid_routed and not t.stats["failed"]
            n.cancel_scope.cancel()

    run(main)


def test_no_lid_routed_set_over_an_entry_its_own_pass_changes() -> None:
    """The Sets of a pass are answered in any order and a switch answers by its new table:
    a Set goes LID-routed only when no entry on its way there or back (the target's own
    entry for the SM's LID included) is one the pass changes (a cable coming back, live:
    leaf1's new route to the SM led through spine0, whose Set had not arrived yet)."""
    g, _top, prog, sm = _planned(generate("leaf-spine", leaves=2, spines=2, hosts_per_leaf=2))
    leaf = sm.ports[1].peer[0]
    far = next(s.guid for s in g.switches() if s.guid != leaf and s.desc.endswith("leaf1"))
    assert prog.lid_routed_ok(g, far) and prog.lid_routed_ok(g, far, {})
    # the far leaf's own route back to the SM moves to its other spine
    old = prog._lookup(far, sm.lid)
    other = next(num for num, peer, _pp in g.nodes[far].neighbors() if g.nodes[peer].is_switch and num != old)
    block = bytearray(prog.written[far][sm.lid // 64])
    block[sm.lid % 64] = other
    assert not prog.lid_routed_ok(g, far, {far: {sm.lid // 64: bytes(block)}})
    # a change to an entry no path uses (a LID of the far leaf's own hosts, at the SM's leaf) is no reason
    lid = next(n.lid for n in g.cas() if n.ports[1].peer is not None and n.ports[1].peer[0] == far)
    block = bytearray(prog.written[leaf][lid // 64])
    block[lid % 64] = NO_ROUTE
    assert prog.lid_routed_ok(g, far, {leaf: {lid // 64: bytes(block)}})
    # the SM's leaf's entry for the far leaf's LID moves: not by the LFTs either
    block = bytearray(prog.written[leaf][g.nodes[far].lid // 64])
    block[g.nodes[far].lid % 64] = NO_ROUTE
    assert not prog.lid_routed_ok(g, far, {leaf: {g.nodes[far].lid // 64: bytes(block)}})


def test_a_passs_first_sets_leave_while_the_later_switches_are_decided_each_as_before_the_pass() -> None:
    """``program`` sends each burst of Sets as soon as it has one, before deciding how the
    next switches' Sets go (the kernel carries the first meanwhile); every switch is still
    decided against the tables as they were before the pass (no answer is taken in between),
    so the LID-routed ones are those ``lid_routed_all`` names beforehand."""
    g = graph_of(generate("fat-tree", k=8))
    routes = compute(g, "ftree")
    top = max(lid for lft in routes.lfts.values() for lid in lft)
    port = EchoPort()
    tr = Transport(port)  # type: ignore[arg-type]
    prog = LftProgrammer(transport=tr, events=EventLog())
    sm = next(iter(g.cas()))
    prog.sm_guid, prog.sm_port, prog.sm_lid = sm.guid, 1, sm.lid
    written_as_planned(prog, routes, top)
    a, pa, b, pb = next(link for link in switch_links(g)  # an edge-aggregation cable: ~45 Sets
                        if {g.nodes[link[0]].desc.split()[-1][:3], g.nodes[link[2]].desc.split()[-1][:3]} == {"edg", "agg"})
    remove_link(g, a, pa)
    new = default_reroute_fn(g, routes, [(a, pa), (b, pb)])
    plan = prog.plan(new, top)
    before = prog.lid_routed_all(g, plan, plan)
    assert True in before.values() and sum(len(b) for b in plan.values()) > 2 * tr.burst
    decided: dict[int, tuple[bool, int]] = {}
    alone = prog.lid_routed_ok

    def recorded(graph: SubnetGraph, guid: int, plan: Any = None, back: Any = None) -> bool:
        ok = alone(graph, guid, plan, back)
        decided[guid] = (ok, port.sent)
        return ok

    prog.lid_routed_ok = recorded  # type: ignore[method-assign]

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(tr.serve)
            res = await prog.program(g, new, top)
            assert res.failed == 0 and res.acked == sum(len(b) for b in plan.values())
            n.cancel_scope.cancel()

    run(main)
    assert {guid: ok for guid, (ok, _) in decided.items()} == before
    assert max(sent for _, sent in decided.values()) >= tr.burst  # later switches decided after sends
    assert tr.stats["lid_routed_sets"] == sum(len(plan[guid]) for guid, ok in before.items() if ok)
    for guid, blocks in plan.items():
        assert all(prog.written[guid][blk] == data for blk, data in blocks.items())


def test_an_lft_set_from_its_blocks_header_is_the_one_made_afresh() -> None:
    from ibemu.sm.program import ATTR_LFT, lft_set
    from ibemu.wire import madcodec as mb

    for block in (0, 1, 3, 767):
        for data in (bytes(64), bytes(range(64)), b"\xff" * 64):
            assert lft_set(block, data) == mb.lr_smp(mb.SET, ATTR_LFT, modifier=block, data=data)
    assert lft_set(2, b"\x01\x02") == mb.lr_smp(mb.SET, ATTR_LFT, modifier=2, data=b"\x01\x02")  # short: made afresh
