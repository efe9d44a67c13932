"""Activation as batches of calls (``ibemu.sm.activate``): LIDs, P_Keys, SwitchInfo and port
states on a k=4 fat-tree in memory, with the LID-routed fallback and a dead switch."""

from __future__ import annotations

import pytest
import trio

from ibemu.sm import activate as act
from ibemu.sm.discovery import STATE_ACTIVE, STATE_INIT, Discovery
from ibemu.sm.lids import LidTable
from ibemu.sm.transport import Transport
from ibemu.testing.madport import InMemoryPort
from ibemu.wire.madpacket import INITIAL_PATH
from ibemu.wire.umad import SimRequest
from tests.unit.sm.helpers import fat_tree, run


class Lossy:
    """An ``InMemoryPort`` that sends without a checkpoint and loses every LID-routed SMP
    (``drop_lid_routed``) and every directed-route SMP whose path starts with ``dead``."""

    def __init__(self, inner: InMemoryPort) -> None:
        self.inner = inner
        self.drop_lid_routed = False
        self.dead: tuple[int, ...] | None = None
        self.sent = {"lid_routed": 0, "directed": 0}
        self.tasks_seen: set[object] = set()
        self.transport: Transport | None = None
        self.most_pending = 0

    def send_nowait(self, req: SimRequest) -> None:
        self.tasks_seen.add(trio.lowlevel.current_task())
        if self.transport is not None:
            self.most_pending = max(self.most_pending, len(self.transport._pending))
        kind = "lid_routed" if req.mad[1] == 0x01 else "directed"
        self.sent[kind] += 1
        if kind == "lid_routed" and self.drop_lid_routed:
            return
        if self.dead is not None and req.mad[INITIAL_PATH + 1:INITIAL_PATH + 1 + len(self.dead)] == bytes(self.dead):
            return
        inner = self.inner
        inner.fab.handle(inner.name, inner.agent.send_mad(inner.port, req.dlid, req.dqp, req.sqp, req.mad))  # type: ignore[attr-defined]
        inner.fab.run()
        inner.pump()

    async def send(self, req: SimRequest) -> None:
        self.send_nowait(req)
        await trio.lowlevel.checkpoint()

    async def recv(self) -> SimRequest:
        return await self.inner.recv()


def test_activation_goes_in_batches_falls_back_to_directed_route_and_counts_what_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    topo, fab = fat_tree(4)
    port = Lossy(InMemoryPort(fab, "h0"))
    monkeypatch.setattr(act, "AGENT_WINDOW", 5)

    async def main() -> None:
        t = Transport(port, max_in_flight=32, timeout_s=0.05, retries=1)
        d = Discovery(t)
        async with trio.open_nursery() as n:
            await n.start(t.serve)
            g = await d.discover()
            d.recompute_paths()
            lids = LidTable()
            lids.assign(g)
            sm_lid = g.nodes[g.sm_guid].ports[d.sm_port].lid
            ends = act.lid_ends(d)
            port.transport, port.most_pending = t, 0  # the agents answer these: 5 at a time
            assert await act.set_lids(d, sm_lid) == len(ends) == 20 + 16
            assert await act.set_lids(d, sm_lid) == 0  # nothing left to write
            assert all(d.port_info[e][16:18] != b"\0\0" for e in ends)
            assert await act.set_switch_info(d, [s.guid for s in g.switches()], top=lids.top) == 20
            assert all(act.fdb_top(d, s.guid) == lids.top for s in g.switches())
            links = act.link_ends(d)
            # a dead switch (a leaf away from the SM): its ports' Sets fail, the rest go on
            dead = g.nodes[topo.node("edge3_1").guid]
            port.dead = dead.dr_path
            port.drop_lid_routed = True  # every LID-routed Set unanswered: directed route
            port.tasks_seen.clear()
            before = dict(port.sent)
            done = await act.activate(d, lid_routed=True)
            dead_ends = [e for e in links if e[0] == dead.guid
                         or (not g.nodes[e[0]].is_switch and g.nodes[e[0]].ports[e[1]].dr_path[:len(dead.dr_path)] == dead.dr_path)]
            assert len(dead_ends) == 4 + 2  # its four cables' near ends, its two hosts
            live = [e for e in links if e not in dead_ends]
            assert done == 2 * len(live)  # Armed, then Active, for every port the dead switch does not hold
            assert all(d.port_info[e][32] & 0x0F == STATE_ACTIVE for e in live)
            assert all(d.port_info[e][32] & 0x0F == STATE_INIT for e in dead_ends if e[0] == dead.guid)
            # each LID-routed Set tried twice (retries=1), then once by directed route
            fallbacks = t.stats["lid_routed_fallback"]
            assert fallbacks > 0 and 2 * fallbacks == port.sent["lid_routed"] - before["lid_routed"]
            # sent from the caller's task and the receive task (fallbacks), not a task per Set
            assert len(port.tasks_seen) <= 3
            assert port.most_pending == 5
            n.cancel_scope.cancel()

    run(main)
