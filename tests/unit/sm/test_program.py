"""LFT programming plans: blocks patched from a reroute's diff equal blocks built afresh."""

from __future__ import annotations

from typing import Any, cast

from ibemu.events import EventLog
from ibemu.sm.graph import Routes
from ibemu.sm.manager import default_reroute_fn
from ibemu.sm.program import LftProgrammer, lft_blocks
from ibemu.sm.routing import compute
from ibemu.sm.transport import Transport
from ibemu.testing.fromtopo import graph_of, remove_link, restore_link
from ibemu.topo import generate
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
