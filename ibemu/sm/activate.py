"""Writing the SM's decisions into ports and switches: LIDs, P_Keys, SwitchInfo, port states.

All SubnSets go directly routed (port states LID-routed when the LFTs are known good), in
parallel within the transport's window, starting from the attribute as last read
(``Discovery.port_info`` / ``switch_info``), which the response then replaces. Port states
move one step per Set: every port to Armed first, then every port to Active, so both ends of
a link are within one step of each other.

Each step is one batch of calls (``Transport.submit``): no task per SMP, ``AGENT_WINDOW`` of
them in flight (the agents answer these Sets one at a time), each answer starting the next. A LID-routed PortInfo Set that goes unanswered after its
retries is sent again by directed route from its callback, at once, as the task per Set
did before (k=8: the 0.5-0.85 s of activation in a cold bring-up were mostly that task per
SMP; ``benchmarks/bench_sm.py``).
"""

from __future__ import annotations

import functools
import logging
import struct
from collections import deque
from collections.abc import Callable, Iterable
from typing import NamedTuple

import trio

from ibemu.sm.discovery import (
    ATTR_PKEY_TABLE,
    ATTR_PORT_INFO,
    ATTR_SWITCH_INFO,
    PHYS_LINK_UP,
    STATE_ACTIVE,
    STATE_ARMED,
    STATE_INIT,
    Discovery,
    End,
)
from ibemu.sm.graph import SmNode
from ibemu.sm.transport import Call, Reply, Request, Transport
from ibemu.wire import madcodec as mb

log = logging.getLogger(__name__)

DEFAULT_PKEY = 0xFFFF  # the default partition, full member


AGENT_WINDOW = 32
"""Sets of one batch in flight at once. The agents answer PortInfo, SwitchInfo and P_Key Sets
one at a time (~250 us each on the agent host's CPU, the kernel SMA passes them up): more in
flight only queue there, and with the transport's whole window (128) the last of them waited
for 127 others, past its timeout once the machine was loaded (k=8 bring-ups with 450-1,040
retries at load ~10, ``benchmarks/bench_sm.py``)."""


class _Batch:
    """Calls submitted together (``Transport.submit``, ``limit`` in flight at a time, each
    that ends starting the next) and waited for by one task; a call's ``on_done`` may
    ``start`` more (a fallback), which the same wait covers."""

    def __init__(self, transport: Transport, limit: int | None = None) -> None:
        self.transport = transport
        self.calls: list[Call] = []
        self.limit = max(1, AGENT_WINDOW if limit is None else limit)
        self._queue: deque[Call] = deque()
        self._in_flight = 0
        self._left = 0
        self._done = trio.Event()

    def call(self, req: Request | bytes, on_done: Callable[[Reply | None], None], *,
             fallback: bool = False) -> Call:
        """A call whose end this batch counts (``start`` it, or give it to ``run``);
        ``fallback`` as for ``Transport.request``."""
        c = Call(req, functools.partial(self._ended, on_done), fallback=fallback)
        self.calls.append(c)
        self._left += 1
        return c

    def start(self, calls: Iterable[Call], *, first: bool = False) -> None:
        """Send ``calls`` as the batch's limit allows (the rest as earlier ones end);
        ``first``: before those still waiting (a fallback goes at once)."""
        if first:
            self._queue.extendleft(reversed(list(calls)))
        else:
            self._queue.extend(calls)
        room: list[Call] = []
        while self._queue and self._in_flight < self.limit:
            room.append(self._queue.popleft())
            self._in_flight += 1
        if room:
            self.transport.submit(room)

    def _ended(self, on_done: Callable[[Reply | None], None], reply: Reply | None) -> None:
        self._in_flight -= 1
        try:
            on_done(reply)
        finally:
            self._left -= 1
            if not self._left:
                self._done.set()
            elif self._queue:
                self.start(())

    async def run(self, first: list[Call]) -> None:
        """Start ``first`` and wait for every call of the batch; cancelled, the calls still in
        flight or queued are forgotten."""
        if not self._left:
            return
        self.start(first)
        try:
            await self._done.wait()
        finally:
            self._queue.clear()
            for c in self.calls:
                self.transport.cancel(c)


async def _request_many(transport: Transport, mads: list[bytes]) -> list[Reply | None]:
    """``Transport.request_many`` with at most ``AGENT_WINDOW`` in flight: Sets the agents answer."""
    out: list[Reply | None] = [None] * len(mads)
    batch = _Batch(transport)
    await batch.run([batch.call(m, functools.partial(out.__setitem__, i)) for i, m in enumerate(mads)])
    return out


async def _set_ports(disc: Discovery, todo: list[tuple[End, bytes]], *, lid_routed: bool = False) -> int:
    """PortInfo Set of each ``(end, data)``, one batch; returns Sets done. ``lid_routed``:
    to the node's LID through the LFTs first (cheaper per hop than directed route), by
    directed route if that goes unanswered (from its callback, ahead of the Sets still
    waiting for room in the batch)."""
    tr = disc.transport
    batch = _Batch(tr)
    ok = 0

    def finish(node: SmNode, end: End, r: Reply | None) -> None:
        nonlocal ok
        if r is None or not r.ok:
            log.warning("PortInfo Set %#x:%d failed (%s)", end[0], end[1],
                        "timeout" if r is None else f"status {r.status:#x}")
            return
        disc.store_port_info(node, end[1], r.data)
        ok += 1

    def directed(node: SmNode, end: End, data: bytes) -> Call:
        path = node.dr_path if node.is_switch else node.ports[end[1]].dr_path
        return batch.call(mb.dr_smp(mb.SET, ATTR_PORT_INFO, path=list(path), modifier=end[1], data=data),
                          functools.partial(finish, node, end))

    def lr_done(node: SmNode, end: End, data: bytes, r: Reply | None) -> None:
        if r is not None:
            finish(node, end, r)
            return
        tr.stats["lid_routed_fallback"] += 1
        batch.start((directed(node, end, data),), first=True)

    first: list[Call] = []
    for end, data in todo:
        node = disc.graph.nodes.get(end[0])
        if node is None:
            continue
        lid = node.ports[0].lid if node.is_switch else node.ports[end[1]].lid
        if lid_routed and lid:
            first.append(batch.call(Request(mb.lr_smp(mb.SET, ATTR_PORT_INFO, modifier=end[1], data=data), dlid=lid),
                                    functools.partial(lr_done, node, end, data), fallback=True))
        else:
            first.append(directed(node, end, data))
    await batch.run(first)
    return ok


def lid_ends(disc: Discovery) -> list[End]:
    """Ports that carry a LID: switch port 0 and every CA port."""
    out: list[End] = []
    for node in disc.graph.nodes.values():
        if node.is_switch:
            out.append((node.guid, 0))
        else:
            out += [(node.guid, num) for num in node.ports]
    return out


class MKeys(NamedTuple):
    """The M_Key state the SM gives every port that holds one."""

    m_key: int
    protect: int
    lease_s: int

    def held_by(self, pi: bytes) -> bool:
        """Does PortInfo ``pi`` (read with the key) already say so?"""
        return (struct.unpack_from("!Q", pi, 0)[0] == self.m_key and pi[34] >> 6 == self.protect
                and struct.unpack_from("!H", pi, 26)[0] == self.lease_s)


async def set_lids(disc: Discovery, sm_lid: int, ends: Iterable[End] | None = None, *,
                   keys: MKeys | None = None) -> int:
    """PortInfo Set LID / MasterSMLID (and ``keys``) where the port does not have them yet;
    returns Sets done."""
    todo: list[tuple[End, bytes]] = []
    for end in lid_ends(disc) if ends is None else ends:
        node = disc.graph.nodes.get(end[0])
        pi = disc.port_info.get(end)
        if node is None or pi is None or end[1] not in node.ports:
            continue
        want = node.ports[end[1]].lid
        have_lid, have_sm = struct.unpack_from("!HH", pi, 16)
        if want and (have_lid != want or have_sm != sm_lid or (keys is not None and not keys.held_by(pi))):
            if keys is None:
                todo.append((end, mb.port_info_set(pi, lid=want, sm_lid=sm_lid)))
            else:
                todo.append((end, mb.port_info_set(pi, lid=want, sm_lid=sm_lid, m_key=keys.m_key,
                                                   m_key_protect=keys.protect, m_key_lease_s=keys.lease_s)))
    return await _set_ports(disc, todo)


def link_ends(disc: Discovery) -> list[End]:
    """Ports of live links (both ends of every cable the graph knows)."""
    out: list[End] = []
    for node in disc.graph.nodes.values():
        for num, p in node.ports.items():
            if p.peer is not None and (num or not node.is_switch):
                out.append((node.guid, num))
    return out


async def set_state(disc: Discovery, state: int, ends: Iterable[End] | None = None, *,
                    lid_routed: bool = False) -> int:
    """Move each port one step towards ``state`` (Armed or Active); returns Sets done.

    A port already there, not LinkUp, or (for Active) not yet Armed is left alone.
    """
    todo: list[tuple[End, bytes]] = []
    for end in link_ends(disc) if ends is None else ends:
        pi = disc.port_info.get(end)
        if pi is None or pi[33] >> 4 != PHYS_LINK_UP:
            continue
        cur = pi[32] & 0x0F
        if cur >= state:
            continue
        if state == STATE_ARMED and cur != STATE_INIT:
            continue
        if state == STATE_ACTIVE and cur != STATE_ARMED:
            continue
        todo.append((end, mb.port_info_set(pi, port_state=state)))
    return await _set_ports(disc, todo, lid_routed=lid_routed)


async def activate(disc: Discovery, ends: Iterable[End] | None = None, *, lid_routed: bool = False) -> int:
    """Init -> Armed -> Active for ``ends`` (default: every live link); returns Sets done.

    ``lid_routed``: the LFTs are known good (just programmed, nothing failed since).
    """
    chosen = list(link_ends(disc) if ends is None else ends)
    n = await set_state(disc, STATE_ARMED, chosen, lid_routed=lid_routed)
    return n + await set_state(disc, STATE_ACTIVE, chosen, lid_routed=lid_routed)


async def set_switch_info(disc: Discovery, guids: Iterable[int], *, top: int | None,
                          clear_change: bool = True) -> int:
    """SwitchInfo Set: LinearFDBTop (None = keep) and clear PortStateChange (write 1); one
    batch. Returns Sets done."""
    todo: list[tuple[int, bytes]] = []
    for guid in guids:
        node = disc.graph.nodes.get(guid)
        si = disc.switch_info.get(guid)
        if node is None or si is None:
            continue
        data = mb.switch_info_set(si, linear_fdb_top=top, clear_port_state_change=clear_change)
        todo.append((guid, mb.dr_smp(mb.SET, ATTR_SWITCH_INFO, path=list(node.dr_path), data=data)))
    done = 0
    for (guid, _), r in zip(todo, await _request_many(disc.transport, [m for _, m in todo]), strict=True):
        if r is not None and r.ok:
            disc.switch_info[guid] = r.data
            done += 1
        else:
            log.warning("SwitchInfo Set %#x failed", guid)
    return done


def fdb_top(disc: Discovery, guid: int) -> int:
    si = disc.switch_info.get(guid)
    return struct.unpack_from("!H", si, 6)[0] if si else 0


async def set_pkeys(disc: Discovery) -> int:
    """Put the default partition (0xFFFF) in entry 0 of every CA port that lacks it (one
    batch); returns Sets done."""
    todo: list[tuple[End, bytes]] = []
    for end, block in list(disc.pkeys.items()):
        node = disc.graph.nodes.get(end[0])
        if node is None or struct.unpack_from("!H", block, 0)[0] == DEFAULT_PKEY:
            continue
        data = struct.pack("!H", DEFAULT_PKEY) + block[2:64]
        todo.append((end, mb.dr_smp(mb.SET, ATTR_PKEY_TABLE, path=list(node.ports[end[1]].dr_path),
                                    modifier=0, data=data)))
    done = 0
    for (end, _), r in zip(todo, await _request_many(disc.transport, [m for _, m in todo]), strict=True):
        if r is not None and r.ok:
            disc.pkeys[end] = r.data
            done += 1
    return done
