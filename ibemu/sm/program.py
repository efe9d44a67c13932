"""Programming the switches' LinearForwardingTables: Set only the blocks that changed.

``LftProgrammer`` remembers the 64-entry blocks last acknowledged per switch. A switch it
has never written gets every block up to the LID top (its contents are unknown); after
that only blocks whose bytes differ are sent, all in parallel within the transport's
window: ``transport.Call``s, framed and sent in one pass with no task per Set, a burst at a
time as each is decided (LID-routed or not: the first are on their way while the next
switches are decided; no answer is taken before the last is sent) (a LID-routed Set that goes unanswered is followed by its directed-route Set from its
callback; the watcher below cancels calls). Each ack is an ``lft_block_acked`` event; ``Programmed.t_last_ack_ns`` is the
reroute's ``t_programmed``. A block whose Set failed is forgotten, so the next pass
sends it again.

Unresponsive switches are not waited for (a switch that died still sits in the graph until
the SM has seen all of its cables go): a switch whose Set times out once becomes a *suspect*
(``suspects``, ``on_suspect`` tells the SM, which checks it at once). When the pass is given
an ``urgent`` event (set when a trap, or a suspicion, is waiting for the next reroute), then
once it is set the pass stops waiting for blocks to suspects; and it never waits for a block
longer than ``overdue_s`` after a block sent later was acked (the agents answer a window in
about the order it went out, so a long queue is not taken for a dead switch); those are
*abandoned*: counted in ``failed`` and ``abandoned``, forgotten (the next pass plans them
again), and their switches become suspects. A block to a switch already suspected when the
pass reaches it, with ``urgent`` set, is abandoned unsent. Overtaken Sets are abandoned even
with no trap waiting. Suspects get one attempt per pass. A switch that acks is no longer a
suspect. So ``t_last_ack_ns`` is the last ack of the switches that answered.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import trio

from ibemu.events import EventLog, Kind
from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.transport import Call, Reply, Request, Transport
from ibemu.wire import madcodec as mb

log = logging.getLogger(__name__)

ATTR_LFT = 0x0019
ATTR_ALTERNATES = 0xFF30
"""ibemu's vendor-specific AlternatePorts (``ibemu.agents.switch``): modifier = LID >> 4,
data = 16 LIDs x 4 bytes (up to 3 alternate ports, preferred first, 0 after the last)."""
ATTR_FAILOVER_CONFIG = 0xFF31
"""ibemu's vendor-specific fault-notice configuration (``ibemu.agents.switch``): byte 0 bit 0
= notices on, bytes 4..7 = the SM's generation (a new one clears the switch's local repairs),
bytes 32..63 = a bit per port facing a switch."""
ALT_LIDS = 16
ALT_SLOT = 4
BLOCK = 64
NO_ROUTE = 0xFF


def alt_blocks(alternates: Mapping[int, tuple[int, ...]], top: int) -> dict[int, bytes]:
    """LID -> alternate ports as AlternatePorts blocks 0 .. top // 16, only the blocks that
    name any (a switch starts with none)."""
    out: dict[int, bytearray] = {}
    for lid, ports in alternates.items():
        if 0 < lid <= top and ports:
            block = out.setdefault(lid // ALT_LIDS, bytearray(ALT_LIDS * ALT_SLOT))
            at = (lid % ALT_LIDS) * ALT_SLOT
            block[at:at + min(len(ports), ALT_SLOT - 1)] = bytes(p & 0xFF for p in ports[:ALT_SLOT - 1])
    return {b: bytes(data) for b, data in out.items()}


def failover_config(graph: SubnetGraph, guid: int, *, notices: bool = True, generation: int = 0) -> bytes:
    """The FailoverConfig a switch gets with its alternates: notices on (or off), the SM's
    generation (its programming pass: a new one tells the switch that the SM's routes have
    replaced what it repaired by itself) and the ports whose cable leads to a switch (where
    its fault notices go)."""
    data = bytearray(64)
    data[0] = int(notices)
    struct.pack_into("!I", data, 4, generation & 0xFFFFFFFF)
    mask = 0
    for num, peer, _pp in graph.nodes[guid].neighbors():
        node = graph.nodes.get(peer)
        if node is not None and node.is_switch and 0 < num < 256:
            mask |= 1 << num
    data[32:64] = mask.to_bytes(32, "little")
    return bytes(data)


@functools.lru_cache(maxsize=1024)
def _lft_set_head(block: int) -> bytes:
    """The first 64 bytes of a LID-routed SubnSet(LinearForwardingTable) of ``block``."""
    return mb.lr_smp(mb.SET, ATTR_LFT, modifier=block)[:64]


_LFT_SET_TAIL = bytes(256 - 128)


def lft_set(block: int, data: bytes) -> bytes:
    """``mb.lr_smp(mb.SET, ATTR_LFT, modifier=block, data=data)`` for a 64-byte block, from a
    header made once per block (0.17 us instead of 0.8, timeit; a reroute makes ~45)."""
    if len(data) != BLOCK:
        return mb.lr_smp(mb.SET, ATTR_LFT, modifier=block, data=data)
    return _lft_set_head(block) + data + _LFT_SET_TAIL


def lft_blocks(lft: Mapping[int, int], top: int) -> dict[int, bytes]:
    """LID -> port as 64-byte blocks 0 .. top // 64 (0xFF where there is no route)."""
    count = top // BLOCK + 1
    table = bytearray(b"\xff") * (count * BLOCK)
    for lid, port in lft.items():
        if 0 <= lid <= top:
            table[lid] = port & 0xFF
    return {i: bytes(table[i * BLOCK : (i + 1) * BLOCK]) for i in range(count)}


@dataclass
class Programmed:
    sent: int = 0
    acked: int = 0
    failed: int = 0
    switches: int = 0
    abandoned: int = 0
    """Blocks not waited for (unresponsive switch, superseded by a waiting trap); in ``failed``."""
    suspects: list[int] = field(default_factory=list)
    """Switches that became suspects during this pass."""
    t_planned_ns: int = 0
    """When the blocks to write were known (and whether each goes LID-routed)."""
    t_last_ack_ns: int = 0
    repaired: list[int] = field(default_factory=list)
    """Switches whose FailoverConfig answer counted LFT entries they had repaired themselves."""

    def after(self, first: Programmed) -> Programmed:
        """This pass and an earlier one (``first``) as one: counts summed, planned at the first."""
        return Programmed(self.sent + first.sent, self.acked + first.acked, self.failed + first.failed,
                          self.switches + first.switches, self.abandoned + first.abandoned,
                          first.suspects + self.suspects, first.t_planned_ns,
                          max(self.t_last_ack_ns, first.t_last_ack_ns))


@dataclass
class LftProgrammer:
    """Writes LFT blocks; LID-routed where the installed tables carry the SMP both ways.

    A LID-routed SMP is switched by the LFTs (in the kernel datapath, without waking any SMA
    on the way), so it costs far less than a directed-route one, which every switch on the
    path relays in software. It is used only when the tables this programmer last wrote
    lead from the SM to the switch and back over cables that are still up — after a link
    failure the entries for those LIDs are untouched by the reroute, so the path holds
    while the new blocks go out — and, with ``fdb_top``, when every switch on the way has a
    LinearFDBTop that covers the LID it forwards (a switch routes no LID above its top: in a
    cold sweep the LFTs are written before the SwitchInfo Sets that raise the tops, so the
    alternates' LID-routed Sets that followed them were dropped on the way back to the SM
    and each waited out its timeout, 0.2 s emulated, 4,000 s of real time at dilation
    20,000) — and when no entry on the way there or back is one the pass itself changes:
    the Sets of a pass are answered in any order, and a switch answers by its new table (a
    cable coming back: leaf1's new route to the SM led through spine0, whose Set had not
    arrived yet, and leaf1's answer was lost; one timeout, then directed route). Anything
    else goes directed route.
    """

    transport: Transport
    events: EventLog
    written: dict[int, dict[int, bytes]] = field(default_factory=dict)
    sm_guid: int = 0
    sm_port: int = 0
    sm_lid: int = 0
    suspects: set[int] = field(default_factory=set)
    """Switches whose Sets went unanswered (timed out, or abandoned) since they last acked."""
    overdue_s: float = 0.02
    """A Set still unanswered this long after one sent later was acked is abandoned (see the
    module docstring)."""
    alt_written: dict[int, dict[int, bytes]] = field(default_factory=dict)
    """Switch GUID -> AlternatePorts blocks acknowledged (absent block: all zero)."""
    cfg_written: dict[int, bytes] = field(default_factory=dict)
    """FailoverConfig as each switch acked it (``failover_config``)."""
    fdb_top: Callable[[int], int] | None = None
    """A switch's LinearFDBTop as last read or set (switch GUID -> top); None: not checked."""
    _blocks: dict[int, tuple[Mapping[int, int], int, dict[int, bytes]]] = field(default_factory=dict)
    """Switch GUID -> (the LFT mapping, top, its blocks): an incremental reroute hands the
    unchanged switches' LFTs over as the same objects (it copies the ones it changes), so
    their blocks are not rebuilt (80 switches x ~50 us on k=8, in every reroute)."""

    def _lookup(self, guid: int, lid: int) -> int | None:
        block = self.written.get(guid, {}).get(lid // BLOCK)
        return None if block is None else block[lid % BLOCK]

    def _walk(self, graph: SubnetGraph, start: tuple[int, int], lid: int, goal: int,
              plan: Mapping[int, Mapping[int, bytes]] | None = None, memo: dict[int, bool] | None = None) -> bool:
        """Does a packet entering at ``start`` (node, port) reach ``goal`` by our tables, and
        (with ``plan``, the blocks a pass is about to write) by entries the pass leaves as
        they are? ``memo``: node -> the answer from there, for walks of one ``lid``, ``goal``
        and ``plan`` (filled with every node this walk passes; a walk that reaches one stops)."""
        if memo is None:
            return self._walk_from(graph, start[0], lid, goal, plan)
        seen: list[int] = []
        ok = self._walk_from(graph, start[0], lid, goal, plan, memo, seen)
        for guid in seen:
            memo[guid] = ok
        return ok

    def _walk_from(self, graph: SubnetGraph, node_guid: int, lid: int, goal: int,
                   plan: Mapping[int, Mapping[int, bytes]] | None,
                   memo: dict[int, bool] | None = None, seen: list[int] | None = None) -> bool:
        for _ in range(64):
            if memo is not None and seen is not None:
                known = memo.get(node_guid)
                if known is not None:
                    return known
                seen.append(node_guid)
            node = graph.nodes.get(node_guid)
            if node is None:
                return False
            if node_guid == goal:
                return True
            if not node.is_switch:
                return False
            if self.fdb_top is not None and lid > self.fdb_top(node_guid):
                return False  # above its LinearFDBTop: the switch drops it
            port = self._lookup(node_guid, lid)
            if port is None or port in (0, NO_ROUTE):
                return False
            if plan is not None:
                new = plan.get(node_guid, {}).get(lid // BLOCK)
                if new is not None and new[lid % BLOCK] != port:
                    return False  # this pass moves the entry: old or new route, depending on order
            p = node.ports.get(port)
            if p is None or p.peer is None or p.state < 2:
                return False  # the cable is down (or not yet known): not through here
            node_guid = p.peer[0]
        return False

    def lid_routed_all(self, graph: SubnetGraph, guids: Iterable[int],
                       plan: Mapping[int, Mapping[int, bytes]] | None = None) -> dict[int, bool]:
        """``lid_routed_ok`` of each of ``guids``, the walks back to the SM (all for the SM's
        LID) sharing what they found: a k=8 reroute's 36 switches walked back over the same
        few switches, 72 walks where 36 and a handful do (~0.37 ms of a live k=8 cut,
        hand-timed)."""
        back: dict[int, bool] = {}
        return {guid: self.lid_routed_ok(graph, guid, plan, back) for guid in guids}

    def lid_routed_ok(self, graph: SubnetGraph, guid: int,
                      plan: Mapping[int, Mapping[int, bytes]] | None = None,
                      back: dict[int, bool] | None = None) -> bool:
        """Whether an LFT Set to switch ``guid`` can go LID-routed (see the class docstring);
        ``plan``: the blocks of the pass the Set is part of; ``back``: the walks back to the
        SM of other switches for this ``plan`` (``_walk``'s memo)."""
        node = graph.nodes.get(guid)
        sm = graph.nodes.get(self.sm_guid)
        if node is None or sm is None or not self.sm_lid or not node.lid or guid not in self.written:
            return False
        sm_p = sm.ports.get(self.sm_port)
        if sm_p is None or sm_p.peer is None:
            return False
        return (self._walk(graph, sm_p.peer, node.lid, guid, plan)
                and self._walk(graph, (guid, 0), self.sm_lid, self.sm_guid, plan, back))

    def forget(self, guid: int) -> None:
        """The switch is gone (or reset): write it in full next time."""
        self.written.pop(guid, None)
        self.alt_written.pop(guid, None)
        self.cfg_written.pop(guid, None)
        self._blocks.pop(guid, None)
        self.suspects.discard(guid)

    def plan(self, routes: Routes, top: int) -> dict[int, dict[int, bytes]]:
        """Blocks to send per switch GUID."""
        out: dict[int, dict[int, bytes]] = {}
        for guid, lft in routes.lfts.items():
            have = self.written.get(guid)
            cached = self._blocks.get(guid)
            if cached is not None and cached[0] is lft and cached[1] == top:
                want = cached[2]
            else:
                want = self._patched(guid, routes, top, cached) or lft_blocks(lft, top)
                self._blocks[guid] = (lft, top, want)
            diff = {b: data for b, data in want.items() if have is None or have.get(b) != data}
            if diff:
                out[guid] = diff
        return out

    @staticmethod
    def _patched(guid: int, routes: Routes, top: int,
                 cached: tuple[Mapping[int, int], int, dict[int, bytes]] | None) -> dict[int, bytes] | None:
        """The blocks of ``guid``'s new table from those of the table it was derived from
        (``Routes.patches``), or None when they are not at hand."""
        patch = routes.patches.get(guid)
        if patch is None or cached is None or cached[0] is not patch[0] or cached[1] != top:
            return None
        want = dict(cached[2])
        edits: dict[int, bytearray] = {}
        for lid, port in patch[1].items():
            if 0 <= lid <= top:
                block = edits.get(lid // BLOCK)
                if block is None:
                    block = edits[lid // BLOCK] = bytearray(want[lid // BLOCK])
                block[lid % BLOCK] = port & 0xFF
        want.update((b, bytes(data)) for b, data in edits.items())
        return want

    async def program(self, graph: SubnetGraph, routes: Routes, top: int, *,
                      urgent: trio.Event | None = None,
                      on_suspect: Callable[[int], None] | None = None) -> Programmed:
        """Write the blocks that differ from what the switches have. ``urgent``: see the
        module docstring (None: wait for every block, all its retries)."""
        plan = self.plan(routes, top)
        res = Programmed(switches=len(plan))
        tr = self.transport
        calls: dict[tuple[int, int], Call] = {}  # blocks in flight: the call of each
        sent_seq: dict[tuple[int, int], int] = {}  # the order the current attempts went out in
        overtaken: dict[tuple[int, int], float] = {}  # when a Set sent after it was acked
        in_order: deque[tuple[int, tuple[int, int]]] = deque()  # (seq, key) as attempts went out
        acked_seq = 0  # the latest-sent attempt answered so far
        seq = 0
        news = trio.Event()  # a new suspect: the watcher looks again
        all_done = trio.Event()

        def suspect(guid: int) -> None:
            if guid in self.suspects:
                return
            self.suspects.add(guid)
            res.suspects.append(guid)
            news.set()
            if on_suspect is not None:
                on_suspect(guid)

        def abandon(guid: int, block: int) -> None:
            res.failed += 1
            res.abandoned += 1
            self.written.get(guid, {}).pop(block, None)

        def attempt(key: tuple[int, int], n: int) -> None:
            nonlocal seq
            seq += 1
            sent_seq[key] = seq
            in_order.append((seq, key))
            overtaken.pop(key, None)
            if n > 1:  # the attempt before timed out
                suspect(key[0])

        def directed(key: tuple[int, int], data: bytes) -> Call:
            guid, block = key
            retries = 0 if urgent is not None and guid in self.suspects else None
            return Call(mb.dr_smp(mb.SET, ATTR_LFT, path=list(graph.nodes[guid].dr_path), modifier=block, data=data),
                        functools.partial(done, key, data), retries=retries,
                        on_attempt=functools.partial(attempt, key))

        def lid_routed_done(key: tuple[int, int], data: bytes, r: Reply | None) -> None:
            if r is None:  # then by directed route
                tr.stats["lid_routed_fallback"] += 1
                call = calls[key] = directed(key, data)
                tr.submit((call,))
                return
            done(key, data, r)

        def ended(key: tuple[int, int]) -> tuple[int, int]:
            """The block's call is over: (its guid, block); the pass ends with its last block."""
            del calls[key]
            if not calls:
                all_done.set()
            return key

        def done(key: tuple[int, int], data: bytes, r: Reply | None) -> None:
            nonlocal acked_seq
            guid, block = ended(key)
            my_seq = sent_seq.pop(key, None)
            overtaken.pop(key, None)
            if r is not None and my_seq is not None and my_seq > acked_seq:
                # answered: every Set sent before it is overtaken (each attempt once: in order)
                acked_seq = my_seq
                now = trio.current_time()
                while in_order and in_order[0][0] < my_seq:
                    q, other = in_order.popleft()
                    if sent_seq.get(other) == q:  # still that attempt, unanswered
                        overtaken.setdefault(other, now)
            if r is None or not r.ok:
                if r is None:
                    suspect(guid)
                res.failed += 1
                self.written.get(guid, {}).pop(block, None)
                log.warning("LFT block %d of %#x not acked", block, guid)
                return
            self.suspects.discard(guid)
            self.written.setdefault(guid, {})[block] = data
            res.acked += 1
            rec = self.events.emit(Kind.LFT_BLOCK_ACKED, switch=f"{guid:#018x}", block=block)
            res.t_last_ack_ns = max(res.t_last_ack_ns, rec["t_ns"])

        def give_up(key: tuple[int, int]) -> None:
            """Abandon a block in flight (the watcher)."""
            tr.cancel(calls[key])
            guid, block = ended(key)
            sent_seq.pop(key, None)
            overtaken.pop(key, None)
            abandon(guid, block)

        async def watch(urgent: trio.Event) -> None:
            """Abandon blocks overdue (their switches become suspects) and, once ``urgent``
            is set, blocks to suspects."""
            nonlocal news
            overdue = self.overdue_s
            while True:
                now = trio.current_time()
                due = now + overdue / 4  # Sets not yet overtaken (or not yet sent): look again
                for key in list(calls):
                    # Overdue counts from when a Set sent after it was answered: the agents
                    # answer a window in about the order it went out, so a long queue (a k=16
                    # reroute writes ~190 blocks) is not taken for a dead switch.
                    t = overtaken.get(key)
                    if (urgent.is_set() and key[0] in self.suspects) or (t is not None and now - t >= overdue):
                        if key[0] not in self.suspects:
                            suspect(key[0])
                        if key in calls:
                            give_up(key)
                    elif t is not None:
                        due = min(due, t + overdue)
                news = trio.Event()
                with trio.move_on_at(due):
                    async with trio.open_nursery() as n:
                        async def first(ev: trio.Event) -> None:
                            await ev.wait()
                            n.cancel_scope.cancel()
                        n.start_soon(first, news)
                        if not urgent.is_set():
                            n.start_soon(first, urgent)

        res.t_planned_ns = self.events.now()
        # farthest switches first: their round trips are the longest, so the last ack comes sooner
        order = sorted(plan, key=lambda g: -len(graph.nodes[g].dr_path) if g in graph.nodes else 0)
        batch: list[Call] = []
        back: dict[int, bool] = {}  # ``lid_routed_all``'s shared walks back to the SM
        for guid in order:
            if guid not in self.written:
                self.written[guid] = {}
            node = graph.nodes.get(guid)
            if node is None:
                continue
            if len(batch) >= tr.burst:
                # on their way while the next switches are decided: the kernel carries them
                # (on another CPU, ``kernel.steer``) meanwhile; no reply is looked at before
                # the last is sent (no checkpoint here), so every switch is decided against
                # the tables as they were before this pass
                tr.submit(batch)
                batch = []
            # LID-routed or directed route, against the tables as they are before this pass
            lid_routed = self.lid_routed_ok(graph, guid, plan, back)
            for block, data in sorted(plan[guid].items()):
                res.sent += 1
                if urgent is not None and urgent.is_set() and guid in self.suspects:
                    abandon(guid, block)  # suspected before this pass reached it: not even sent
                    continue
                key = (guid, block)
                if lid_routed:
                    tr.stats["lid_routed_sets"] += 1
                    call = Call(Request(lft_set(block, data), dlid=node.lid),
                                functools.partial(lid_routed_done, key, data), retries=0,
                                on_attempt=functools.partial(attempt, key), fallback=True)
                else:
                    call = directed(key, data)
                calls[key] = call
                batch.append(call)
        # in one pass: every Set the window has room for is framed and sent before any reply
        # is looked at (a task per Set, each through ``request``: ~140 us between sends on k=8)
        if batch:
            tr.submit(batch)
        if not calls:
            return res
        try:
            async with trio.open_nursery() as outer:
                if urgent is not None:
                    outer.start_soon(watch, urgent)
                await all_done.wait()
                outer.cancel_scope.cancel()
        finally:
            for call in calls.values():  # cancelled: the Sets still in flight are forgotten
                tr.cancel(call)
        return res

    async def program_alternates(self, graph: SubnetGraph, alternates: Mapping[int, Mapping[int, tuple[int, ...]]],
                                 top: int, *, notices: bool = True, generation: int = 0) -> Programmed:
        """Write the AlternatePorts blocks (``ATTR_ALTERNATES``) that differ from what each
        switch has (blocks it has that name alternates no longer are cleared), and each
        switch's FailoverConfig (fault notices on or off, the ports facing switches, the SM's
        ``generation``: a new one each programming pass) where it changed: LID-routed where the tables allow, else directed route; all in parallel
        within the window."""
        plan: dict[int, dict[int, bytes]] = {}
        for guid in set(alternates) | set(self.alt_written):
            if guid not in graph.nodes:
                continue
            want = alt_blocks(alternates.get(guid, {}), top)
            have = self.alt_written.get(guid, {})
            zero = bytes(ALT_LIDS * ALT_SLOT)
            diff = {b: d for b, d in want.items() if have.get(b, zero) != d}
            diff.update((b, zero) for b in have if b not in want and have[b] != zero)
            if diff:
                plan[guid] = diff
        # every switch, those without alternates too: a core must pass notices on
        configs = {guid: cfg for guid, node in graph.nodes.items() if node.is_switch
                   and self.cfg_written.get(guid) != (cfg := failover_config(graph, guid, notices=notices, generation=generation))}
        res = Programmed(switches=len(set(plan) | set(configs)), t_planned_ns=self.events.now())
        lid_routed = self.lid_routed_all(graph, set(plan) | set(configs))

        async def one(guid: int, attr: int, block: int, data: bytes) -> None:
            node = graph.nodes[guid]
            res.sent += 1
            r = None
            if lid_routed.get(guid):
                r = await self.transport.request(
                    Request(mb.lr_smp(mb.SET, attr, modifier=block, data=data), dlid=node.lid), retries=0,
                    fallback=True)
            if r is None:
                r = await self.transport.request(
                    mb.dr_smp(mb.SET, attr, path=list(node.dr_path), modifier=block, data=data))
            if r is None or not r.ok:
                res.failed += 1
                if attr == ATTR_ALTERNATES:
                    self.alt_written.get(guid, {}).pop(block, None)
                else:
                    self.cfg_written.pop(guid, None)
                log.warning("%s block %d of %#x not acked",
                            "AlternatePorts" if attr == ATTR_ALTERNATES else "FailoverConfig", block, guid)
                return
            if attr == ATTR_ALTERNATES:
                self.alt_written.setdefault(guid, {})[block] = data
            else:
                self.cfg_written[guid] = data
                if struct.unpack_from("!I", r.data, 8)[0]:  # it had repaired entries itself
                    res.repaired.append(guid)
            res.acked += 1
            res.t_last_ack_ns = max(res.t_last_ack_ns, self.events.now())

        async with trio.open_nursery() as n:
            for guid in sorted(plan):
                for block, data in sorted(plan[guid].items()):
                    n.start_soon(one, guid, ATTR_ALTERNATES, block, data)
            for guid, cfg in sorted(configs.items()):
                n.start_soon(one, guid, ATTR_FAILOVER_CONFIG, 0, cfg)
        return res
