"""Discovery by directed-route SMPs: fill a ``SubnetGraph`` from the SM's port outwards.

Breadth-first and parallel: every NodeInfo answer immediately starts, in parallel, the new
node's NodeDescription, SwitchInfo, PortInfo of each port and (CAs) P_KeyTable block 0 (one
batch of ``Transport.request_many``, sent in one pass; a switch that answers none of its
PortInfo Gets died after its NodeInfo answer and is left out, as if that had gone unanswered);
every switch port found LinkUp starts the NodeInfo probe of its far end (whose
LocalPortNum names the peer port). The transport's window bounds what is in flight.

``refresh(guids)`` is the targeted re-discovery after a trap or a light sweep: PortInfo of
every port of those switches, links that went down removed, links that came up probed (and
whatever lies behind them discovered). Directed routes are re-derived from the graph
(``recompute_paths``) so no SMP is sent along a cable known to be dead; ``verify_paths``
checks the cables a route crosses before a switch behind them is asked.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from ibemu.sm.graph import NodeType, SmNode, SmPort, SubnetGraph
from ibemu.sm.transport import Call, Reply, Transport
from ibemu.wire import madcodec as mb

log = logging.getLogger(__name__)

ATTR_NODE_DESC = 0x0010
ATTR_NODE_INFO = 0x0011
ATTR_SWITCH_INFO = 0x0012
ATTR_PORT_INFO = 0x0015
ATTR_PKEY_TABLE = 0x0016
PHYS_LINK_UP = 5
STATE_DOWN, STATE_INIT, STATE_ARMED, STATE_ACTIVE = 1, 2, 3, 4
MAX_HOPS = 63

End = tuple[int, int]  # (node GUID, port)


@functools.lru_cache(maxsize=1 << 13)
def get_smp(attr: int, path: tuple[int, ...], modifier: int = 0) -> bytes:
    """A directed-route SubnGet of ``attr`` along ``path``, made once per route, attribute and
    modifier (the transport gives each attempt its own TID): a trap's rediscovery asks the
    same ones every time."""
    return mb.dr_smp(mb.GET, attr, path=path, modifier=modifier)


@dataclass(frozen=True, slots=True)
class Change:
    """What a refresh found on one port: ``kind`` down | up | reinit."""

    kind: str
    guid: int
    port: int
    peer: End | None = None


@dataclass
class Discovery:
    """Discovery state kept across sweeps: the graph plus the raw attributes an SM writes back."""

    transport: Transport
    graph: SubnetGraph = field(default_factory=SubnetGraph)
    port_info: dict[End, bytes] = field(default_factory=dict)
    switch_info: dict[int, bytes] = field(default_factory=dict)
    pkeys: dict[End, bytes] = field(default_factory=dict)
    unresponsive: set[End] = field(default_factory=set)
    """Ports LinkUp whose far end did not answer NodeInfo (a dead or dying node)."""
    avoid: set[int] = field(default_factory=set)
    """Switches directed routes go through only when there is no other way (suspected dead:
    an SMP relayed by one would be lost; the SM shares its programmer's ``suspects``)."""
    sm_port: int = 0
    answered: set[int] = field(default_factory=set)
    """Switches that answered PortInfo in the last ``refresh`` (alive, their cables read)."""
    read_all: set[int] = field(default_factory=set)
    """Of those, the switches whose every port's PortInfo was answered in it."""

    # ------------------------------------------------------------------ helpers

    def phys(self, end: End) -> int:
        pi = self.port_info.get(end)
        return pi[33] >> 4 if pi else 0

    def state(self, end: End) -> int:
        pi = self.port_info.get(end)
        return pi[32] & 0x0F if pi else 0

    async def _get(self, path: tuple[int, ...], attr: int, mod: int = 0) -> Reply | None:
        r = await self.transport.request(get_smp(attr, tuple(path), mod))
        if r is not None and not r.ok:
            log.debug("path %s attr %#x mod %#x: status %#x", path, attr, mod, r.status)
            return None
        return r

    async def set_attr(self, what: str, path: list[int], attr: int, mod: int, data: bytes, *,
                  end: tuple[int, int] | None = None) -> Reply | None:
        """A directed-route SubnSet of ``what`` (for the log); None, logged, when it timed out
        or failed. ``end``: the (GUID, port) whose PortInfo the answer is, stored."""
        r = await self.transport.request(mb.dr_smp(mb.SET, attr, path=path, modifier=mod, data=data))
        if r is None or not r.ok:
            log.warning("%s Set %s modifier %#x failed (%s)", what, path, mod,
                        "timeout" if r is None else f"status {r.status:#x}")
            return None
        if end is not None:
            self.store_port_info(self.graph.nodes[end[0]], end[1], r.data)
        return r

    def store_port_info(self, node: SmNode, num: int, data: bytes) -> None:
        self.port_info[(node.guid, num)] = data
        p = node.ports[num]
        p.state = data[32] & 0x0F
        if not node.is_switch or num == 0:
            p.lid = struct.unpack_from("!H", data, 16)[0]

    # ------------------------------------------------------------------ cold

    async def discover(self) -> SubnetGraph:
        """Everything reachable from the SM's port (the graph is rebuilt from scratch)."""
        self.graph = SubnetGraph()
        self.port_info.clear()
        self.switch_info.clear()
        self.pkeys.clear()
        self.unresponsive.clear()
        async with trio.open_nursery() as nursery:
            await self._visit((), None, nursery)
        return self.graph

    async def _visit(self, path: tuple[int, ...], came_from: End | None, nursery: trio.Nursery,
                     reread: bool = False) -> None:
        """NodeInfo at ``path``; a new node is read in full and its live ports probed.

        ``reread``: a known node's entry port is read again (a cable that came back).
        """
        r = await self._get(path, ATTR_NODE_INFO)
        if r is None:
            if came_from is not None:
                self.unresponsive.add(came_from)
            return
        ni = mb.parse_node_info(r.data)
        g = self.graph
        node = g.nodes.get(ni.node_guid)
        new = node is None
        if node is None:
            kind = NodeType(ni.node_type) if ni.node_type in (1, 2, 3) else NodeType.CA
            node = g.add(SmNode(ni.node_guid, kind, ni.num_ports, dr_path=path, system_guid=ni.system_image_guid,
                                vendor_id=ni.vendor_id, device_id=ni.device_id,
                                revision=struct.unpack_from("!I", r.data, 32)[0]))
            if kind is NodeType.SWITCH:
                for num in range(ni.num_ports + 1):
                    node.ports[num] = SmPort(num, ni.node_guid, dr_path=path)
            if not path:
                g.sm_guid = ni.node_guid
                self.sm_port = ni.local_port_num
        here = ni.local_port_num
        new_port = False
        if not node.is_switch and here not in node.ports:
            node.ports[here] = SmPort(here, ni.port_guid, dr_path=path)
            new_port = True
        if came_from is not None and came_from[0] in g.nodes:
            g.connect(came_from[0], came_from[1], node.guid, here)
            self.unresponsive.discard(came_from)
        if node.is_switch and not new and reread:
            r = await self._get(path, ATTR_PORT_INFO, here)
            if r is not None:
                self.store_port_info(node, here, r.data)
        if node.is_switch and new:
            if not await self._read_switch(node):  # dead since its NodeInfo: as if that went unanswered
                self.remove({node.guid})
                if came_from is not None:
                    self.unresponsive.add(came_from)
                return
            for num in range(1, node.num_ports + 1):
                if self.phys((node.guid, num)) == PHYS_LINK_UP and node.ports[num].peer is None \
                        and len(path) < MAX_HOPS:
                    nursery.start_soon(self._visit, (*path, num), (node.guid, num), nursery)
        elif not node.is_switch and (new_port or reread):
            await self._read_ca_port(node, here, path, new)
            if not path and self.phys((node.guid, here)) == PHYS_LINK_UP:
                nursery.start_soon(self._visit, (here,), (node.guid, here), nursery)

    async def _gets(self, path: tuple[int, ...], attrs: list[tuple[int, int]]) -> list[bytes | None]:
        """The (attribute, modifier) Gets at ``path`` as one batch (``Transport.request_many``:
        sent in one pass, no task each); each answer's data, or None (no answer, bad status)."""
        hops = list(path)
        replies = await self.transport.request_many(
            [get_smp(attr, tuple(hops), mod) for attr, mod in attrs])
        return [r.data if r is not None and r.ok else None for r in replies]

    async def _read_switch(self, node: SmNode) -> bool:
        """NodeDescription, SwitchInfo and every PortInfo of a new switch; False when not one
        PortInfo was answered (it died after its NodeInfo answer)."""
        mods = list(range(node.num_ports + 1))
        desc, si, *pis = await self._gets(node.dr_path, [(ATTR_NODE_DESC, 0), (ATTR_SWITCH_INFO, 0),
                                                         *((ATTR_PORT_INFO, num) for num in mods)])
        if desc is not None:
            node.desc = _text(desc)
        if si is not None:
            self.switch_info[node.guid] = si
        for num, data in zip(mods, pis, strict=True):
            if data is not None:
                self.store_port_info(node, num, data)
        return any(data is not None for data in pis)

    async def _read_ca_port(self, node: SmNode, num: int, path: tuple[int, ...], new: bool) -> None:
        attrs = [(ATTR_PORT_INFO, num), (ATTR_PKEY_TABLE, 0)] + ([(ATTR_NODE_DESC, 0)] if new else [])
        pi, pk, *desc = await self._gets(path, attrs)
        if pi is not None:
            self.store_port_info(node, num, pi)
        if pk is not None:
            self.pkeys[(node.guid, num)] = pk
        if desc and desc[0] is not None:
            node.desc = _text(desc[0])

    # ------------------------------------------------------------------ paths

    def recompute_paths(self, avoid: set[int] | None = None) -> set[int]:
        """Shortest directed routes over live links from the SM's port; returns the GUIDs
        of nodes no longer reachable (left in the graph for the caller to deal with).
        Routes go through ``self.avoid`` and ``avoid`` only where there is no other way."""
        shun = self.avoid | avoid if avoid else self.avoid
        g = self.graph
        sm = g.nodes.get(g.sm_guid)
        if sm is None:
            return set(g.nodes)
        seen: set[int] = {sm.guid}
        seen_ports: set[End] = {(sm.guid, self.sm_port)}
        sm.dr_path = ()
        queue: deque[SmNode] = deque()
        p = sm.ports.get(self.sm_port)
        if p is not None:
            p.dr_path = ()
            if p.peer is not None:
                self._reach(g.nodes[p.peer[0]], (self.sm_port,), p.peer[1], seen, seen_ports, queue)
        deferred: deque[SmNode] = deque()  # suspects: expanded only when nothing else is left
        while queue or deferred:
            node = queue.popleft() if queue else deferred.popleft()
            if len(node.dr_path) >= MAX_HOPS:
                continue
            if queue and node.guid in shun:
                deferred.append(node)
                continue
            for num, peer_guid, peer_port in node.neighbors():
                self._reach(g.nodes[peer_guid], (*node.dr_path, num), peer_port, seen, seen_ports, queue)
        return set(g.nodes) - seen

    def paths_hold(self, cut: Iterable[tuple[End, End]], avoid: set[int]) -> bool:
        """Whether the directed routes stay as they are after the ``cut`` cables (both ends)
        went down between switches: none of them is an edge of the routes' tree (so every
        route still crosses live cables only, and nobody is cut off), and no switch in
        ``avoid`` leads to anyone (routing around it would change nothing). Then
        ``recompute_paths`` would find the routes it found before, and need not run."""
        nodes = self.graph.nodes
        for (a, pa), (b, pb) in cut:
            na, nb = nodes.get(a), nodes.get(b)
            if na is None or nb is None or not na.is_switch or not nb.is_switch:
                return False
            if nb.dr_path == (*na.dr_path, pa) or na.dr_path == (*nb.dr_path, pb):
                return False
        for guid in avoid:
            node = nodes.get(guid)
            if node is None:
                return False
            if any(nodes[peer].dr_path == (*node.dr_path, num) for num, peer, _ in node.neighbors()):
                return False
        return True

    @staticmethod
    def _reach(node: SmNode, path: tuple[int, ...], port: int, seen: set[int], seen_ports: set[End],
               queue: deque[SmNode]) -> None:
        if not node.is_switch and (node.guid, port) not in seen_ports:
            seen_ports.add((node.guid, port))
            node.ports[port].dr_path = path
        if node.guid in seen:
            return
        seen.add(node.guid)
        node.dr_path = path
        if node.is_switch:
            for sp in node.ports.values():
                sp.dr_path = path
            queue.append(node)

    def unlink(self, guid: int, port: int) -> End | None:
        """Forget the cable at ``guid:port`` (both ends); returns the far end it had."""
        node = self.graph.nodes.get(guid)
        if node is None or port not in node.ports:
            return None
        p = node.ports[port]
        peer = p.peer
        p.peer = None
        p.state = STATE_DOWN
        if peer is not None:
            far = self.graph.nodes.get(peer[0])
            if far is not None and peer[1] in far.ports:
                far.ports[peer[1]].peer = None
                far.ports[peer[1]].state = STATE_DOWN
        return peer

    def remove(self, guids: set[int]) -> list[SmNode]:
        """Drop nodes (unreachable ones) and their attributes from the graph."""
        out = []
        for guid in guids:
            node = self.graph.nodes.pop(guid, None)
            if node is None:
                continue
            out.append(node)
            for num, peer_guid, peer_port in list(node.neighbors()):
                far = self.graph.nodes.get(peer_guid)
                if far is not None and peer_port in far.ports:
                    far.ports[peer_port].peer = None
                self.port_info.pop((guid, num), None)
            for key in [k for k in self.port_info if k[0] == guid]:
                del self.port_info[key]
            self.switch_info.pop(guid, None)
        return out

    async def verify_paths(self, guids: set[int]) -> list[Change]:
        """Check the cables the directed routes to ``guids`` cross (one PortInfo per hop);
        dead ones are unlinked and the routes re-derived, until the routes hold."""
        changes: list[Change] = []
        for _ in range(8):
            hops: set[End] = set()
            for guid in guids:
                node = self.graph.nodes.get(guid)
                if node is None:
                    continue
                hops |= self._hops(node.dr_path)
            if not hops:
                return changes
            found = await self._check_ports(sorted(hops))
            if not found:
                return changes
            changes += found
            self.recompute_paths()
        return changes

    def _hops(self, path: tuple[int, ...]) -> set[End]:
        """(switch, egress port) of every switch a route passes through."""
        out: set[End] = set()
        g = self.graph
        sm = g.nodes.get(g.sm_guid)
        if sm is None or not path:
            return out
        cur = sm.ports.get(path[0])
        node_guid = cur.peer[0] if cur is not None and cur.peer else None
        for i in range(1, len(path)):
            if node_guid is None:
                break
            node = g.nodes.get(node_guid)
            if node is None or not node.is_switch:
                break
            out.add((node.guid, path[i]))
            p = node.ports.get(path[i])
            node_guid = p.peer[0] if p is not None and p.peer else None
        return out

    async def _check_ports(self, ends: list[End], *, until_first: bool = False) -> list[Change]:
        """PortInfo of ``ends``; those no longer LinkUp are unlinked and returned.
        ``until_first``: stop at the first one found down, even if already unlinked (the
        others, maybe a dead switch's ports that would time out, are not waited for)."""
        changes: list[Change] = []

        async def one(end: End) -> None:
            node = self.graph.nodes.get(end[0])
            if node is None:
                return
            r = await self._get(node.dr_path, ATTR_PORT_INFO, end[1])
            if r is None:
                return
            self.store_port_info(node, end[1], r.data)
            if r.data[33] >> 4 != PHYS_LINK_UP:
                if node.ports[end[1]].peer is not None:  # (another pass may have unlinked it)
                    peer = self.unlink(*end)
                    changes.append(Change("down", end[0], end[1], peer))
                if until_first:
                    n.cancel_scope.cancel()

        async with trio.open_nursery() as n:
            for end in ends:
                n.start_soon(one, end)
        return changes

    # ------------------------------------------------------------------ targeted

    async def refresh(self, guids: set[int], *, verify: bool = False) -> list[Change]:
        """PortInfo of every port of the switches ``guids``; apply and return what changed.

        ``verify``: also check, at the same time, the cables each switch's directed route
        crosses; a dead one is unlinked, the route re-derived and that switch read again (its
        first read cannot have been answered: the route was cut, so nothing of it applied).

        The first read of every switch and the check of every cable their routes cross (each
        once: the routes share their first hops) go as one batch (``_read_checked``); a
        switch whose read did not complete (a cable on the way found down) is read again on
        its own, after its route is re-derived.
        """
        changes: list[Change] = []
        probes: list[tuple[SmNode, int]] = []
        self.answered = set()
        self.read_all = set()

        def finish(node: SmNode, got: dict[int, bytes]) -> None:
            if got:
                self.answered.add(node.guid)
            if len(got) == node.num_ports:
                self.read_all.add(node.guid)
            self._apply_ports(node, got, changes, probes)

        def switch(guid: int) -> SmNode | None:
            node = self.graph.nodes.get(guid)
            return node if node is not None and node.is_switch else None

        async def read(guid: int) -> None:
            for _ in range(8):
                node = switch(guid)
                if node is None:
                    return
                got: dict[int, bytes] = {}
                hops = sorted(self._hops(node.dr_path)) if verify else []
                dead, complete = await self._read_checked([(node, hops, got)])
                changes.extend(dead)
                if guid in complete:
                    finish(node, got)
                    return
                if all(self.phys(h) == PHYS_LINK_UP for h in hops):
                    return  # (not reached: a read that is not cut off completes)
                self.recompute_paths()  # the route was cut (now, or by another pass)

        reads: list[tuple[SmNode, list[End], dict[int, bytes]]] = [
            (node, sorted(self._hops(node.dr_path)) if verify else [], {})
            for node in (switch(g) for g in sorted(guids)) if node is not None]
        dead, complete = await self._read_checked(reads)
        changes.extend(dead)
        again = [node.guid for node, _hops, _got in reads if node.guid not in complete]
        for node, _hops, got in reads:
            if node.guid in complete:
                finish(node, got)
        if again:
            if any(self.phys(h) != PHYS_LINK_UP for _node, hops, _got in reads for h in hops):
                self.recompute_paths()  # a route was cut (now, or by another pass)
            async with trio.open_nursery() as n:
                for guid in again:
                    n.start_soon(read, guid)
        if probes:
            async with trio.open_nursery() as n:
                for node, num in probes:
                    n.start_soon(self._visit, (*node.dr_path, num), (node.guid, num), n, True)
            for node, num in probes:
                peer = node.ports[num].peer
                if peer is not None:
                    changes.append(Change("up", node.guid, num, peer))
        return changes

    async def _read_checked(self, reads: list[tuple[SmNode, list[End], dict[int, bytes]]]
                            ) -> tuple[list[Change], set[int]]:
        """For each (switch, the cables its route crosses, ``got``): the check of those cables
        (PortInfo of each; those no longer LinkUp unlinked and returned) and the read of every
        port of the switch into ``got``, all at once: one batch of calls, the cables first,
        each once (``Transport.submit``). Once a cable is found down, what is still out is
        cancelled (the reads behind a dead cable would only time out; the caller re-derives
        the routes and reads again). Returns the changes and the switches whose read
        completed (every port answered or given up on, every cable of its route LinkUp).

        Was a task per cable, each sent alone, beside a batch of the port reads per switch:
        the cables went out last, after every port read of the pass had been framed and
        sent, and the reads already answered waited for them (~0.4 ms of a k=8 cut's
        rediscovery, hand-timed)."""
        dead: list[Change] = []
        finished = trio.Event()
        calls: list[Call] = []
        left = 0
        complete: set[int] = set()
        ports_left: dict[int, int] = {}

        def one_less() -> None:
            nonlocal left
            left -= 1
            if not left:
                finished.set()

        def hop_done(end: End, r: Reply | None) -> None:
            hop = self.graph.nodes.get(end[0])
            if r is not None and r.ok and hop is not None:
                self.store_port_info(hop, end[1], r.data)
                if r.data[33] >> 4 != PHYS_LINK_UP:
                    if hop.ports[end[1]].peer is not None:  # (another pass may have unlinked it)
                        dead.append(Change("down", end[0], end[1], self.unlink(*end)))
                    stop()
                    return
            one_less()

        def port_done(guid: int, got: dict[int, bytes], num: int, r: Reply | None) -> None:
            if r is not None and r.ok:
                got[num] = r.data
            ports_left[guid] -= 1
            if not ports_left[guid]:
                complete.add(guid)
            one_less()

        def stop() -> None:
            for call in calls:
                self.transport.cancel(call)
            finished.set()

        for end in sorted({h for _node, hops, _got in reads for h in hops}):
            hop = self.graph.nodes.get(end[0])
            if hop is not None:
                calls.append(Call(get_smp(ATTR_PORT_INFO, hop.dr_path, end[1]), functools.partial(hop_done, end)))
        for node, _hops, got in reads:
            ports_left[node.guid] = node.num_ports
            if not node.num_ports:
                complete.add(node.guid)
            calls += [Call(get_smp(ATTR_PORT_INFO, node.dr_path, num), functools.partial(port_done, node.guid, got, num))
                      for num in range(1, node.num_ports + 1)]
        left = len(calls)
        if calls:
            self.transport.submit(calls)
            try:
                await finished.wait()
            finally:
                for call in calls:  # cancelled (or stopped): nothing of it is waited for
                    self.transport.cancel(call)
        for node, hops, got in reads:
            if any(self.phys(h) != PHYS_LINK_UP for h in hops):
                got.clear()  # a route cut on the way: nothing read through it is taken
                complete.discard(node.guid)
        return dead, complete

    def _apply_ports(self, node: SmNode, got: dict[int, bytes], changes: list[Change],
                     probes: list[tuple[SmNode, int]]) -> None:
        for num, data in sorted(got.items()):
            old_state = self.state((node.guid, num))
            self.store_port_info(node, num, data)
            up = data[33] >> 4 == PHYS_LINK_UP
            port = node.ports[num]
            if port.peer is not None and not up:
                peer = self.unlink(node.guid, num)
                changes.append(Change("down", node.guid, num, peer))
            elif port.peer is None and up:
                probes.append((node, num))
            elif port.peer is not None and up and (data[32] & 0x0F) == STATE_INIT \
                    and old_state in (STATE_ARMED, STATE_ACTIVE):
                changes.append(Change("reinit", node.guid, num, port.peer))

    async def read_ends(self, ends: list[End]) -> None:
        """PortInfo of the given ports again (the far ends of ports that retrained)."""
        async def one(end: End) -> None:
            node = self.graph.nodes.get(end[0])
            if node is None or end[1] not in node.ports:
                return
            path = node.dr_path if node.is_switch else node.ports[end[1]].dr_path
            r = await self._get(path, ATTR_PORT_INFO, end[1])
            if r is not None:
                self.store_port_info(node, end[1], r.data)

        async with trio.open_nursery() as n:
            for end in ends:
                n.start_soon(one, end)

    async def read_port0(self, guid: int) -> None:
        """PortInfo of a switch's port 0 again (its LID, after a reset)."""
        node = self.graph.nodes.get(guid)
        if node is None or not node.is_switch:
            return
        r = await self._get(node.dr_path, ATTR_PORT_INFO, 0)
        if r is not None:
            self.store_port_info(node, 0, r.data)

    async def read_switch_info(self, guids: list[int]) -> dict[int, bytes]:
        """SwitchInfo of the given switches (the light sweep looks at PortStateChange)."""
        out: dict[int, bytes] = {}

        async def one(guid: int) -> None:
            node = self.graph.nodes.get(guid)
            if node is None:
                return
            r = await self._get(node.dr_path, ATTR_SWITCH_INFO)
            if r is not None:
                out[guid] = r.data
                self.switch_info[guid] = r.data

        async with trio.open_nursery() as n:
            for guid in guids:
                n.start_soon(one, guid)
        return out


def _text(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode("utf-8", "replace")
