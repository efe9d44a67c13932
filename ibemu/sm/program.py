"""Programming the switches' LinearForwardingTables: Set only the blocks that changed.

``LftProgrammer`` remembers the 64-entry blocks last acknowledged per switch. A switch it
has never written gets every block up to the LID top (its contents are unknown); after
that only blocks whose bytes differ are sent, all in parallel within the transport's
window. Each ack is an ``lft_block_acked`` event; ``Programmed.t_last_ack_ns`` is the
reroute's ``t_programmed``. A block whose Set failed is forgotten, so the next pass
sends it again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import trio

from ibemu.device import madbuild as mb
from ibemu.sm.events import EventLog
from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.transport import Transport

log = logging.getLogger(__name__)

ATTR_LFT = 0x0019
BLOCK = 64
NO_ROUTE = 0xFF


def lft_blocks(lft: Mapping[int, int], top: int) -> dict[int, bytes]:
    """LID -> port as 64-byte blocks 0 .. top // 64 (0xFF where there is no route)."""
    count = top // BLOCK + 1
    blocks = [bytearray(b"\xff" * BLOCK) for _ in range(count)]
    for lid, port in lft.items():
        if 0 <= lid <= top:
            blocks[lid // BLOCK][lid % BLOCK] = port & 0xFF
    return {i: bytes(b) for i, b in enumerate(blocks)}


@dataclass
class Programmed:
    sent: int = 0
    acked: int = 0
    failed: int = 0
    switches: int = 0
    t_last_ack_ns: int = 0


@dataclass
class LftProgrammer:
    transport: Transport
    events: EventLog
    written: dict[int, dict[int, bytes]] = field(default_factory=dict)

    def forget(self, guid: int) -> None:
        """The switch is gone (or reset): write it in full next time."""
        self.written.pop(guid, None)

    def plan(self, routes: Routes, top: int) -> dict[int, dict[int, bytes]]:
        """Blocks to send per switch GUID."""
        out: dict[int, dict[int, bytes]] = {}
        for guid, lft in routes.lfts.items():
            have = self.written.get(guid)
            want = lft_blocks(lft, top)
            diff = {b: data for b, data in want.items() if have is None or have.get(b) != data}
            if diff:
                out[guid] = diff
        return out

    async def program(self, graph: SubnetGraph, routes: Routes, top: int) -> Programmed:
        plan = self.plan(routes, top)
        res = Programmed(switches=len(plan))

        async def one(guid: int, block: int, data: bytes) -> None:
            node = graph.nodes.get(guid)
            if node is None:
                return
            res.sent += 1
            r = await self.transport.request(mb.dr_smp(mb.SET, ATTR_LFT, path=list(node.dr_path),
                                                       modifier=block, data=data))
            if r is None or not r.ok:
                res.failed += 1
                self.written.get(guid, {}).pop(block, None)
                log.warning("LFT block %d of %#x not acked", block, guid)
                return
            self.written.setdefault(guid, {})[block] = data
            res.acked += 1
            rec = self.events.emit("lft_block_acked", switch=f"{guid:#018x}", block=block)
            res.t_last_ack_ns = max(res.t_last_ack_ns, rec["t_ns"])

        # farthest switches first: their round trips are the longest, so the last ack comes sooner
        order = sorted(plan, key=lambda g: -len(graph.nodes[g].dr_path) if g in graph.nodes else 0)
        async with trio.open_nursery() as n:
            for guid in order:
                if guid not in self.written:
                    self.written[guid] = {}
                for block, data in sorted(plan[guid].items()):
                    n.start_soon(one, guid, block, data)
        return res
