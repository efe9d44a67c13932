"""The switch management agent (SMA + PMA + trap sender) of an emulated IB switch.

Construct from plain parameters; feed it packets and link events; carry out the actions::

    sw = SwitchAgent(node_guid=0x0002C90000000100, num_ports=36, description="leaf1")
    actions = sw.link_up(3)                 # PortStateChange, Event
    actions = sw.receive(3, packet)         # Send(...) on the response's port, ...
    actions = sw.tick()                     # trap repeats, at sw.next_deadline()

What it answers (SubnGet/SubnSet, directed route or LID-routed to the switch LID):
NodeInfo (NodeType 2, LocalPortNum = ingress port), NodeDescription, SwitchInfo (Set:
LinearFDBTop, DefaultPorts, LifeTimeValue, MulticastFDBTop; PortStateChange cleared by
writing 1), GUIDInfo, PortInfo per port (modifier = port; port 0 carries LID, LMC,
MasterSMLID, CapabilityMask), P_KeyTable (modifier = port << 16 | block), SLtoVL,
VLArbitration, LinearForwardingTable (modifier = block; a Set emits ``LftUpdate`` with
only the effective entries that changed), MulticastForwardingTable (stored, not used),
and the vendor-specific AlternatePorts (``ATTR_ALTERNATES`` = 0xFF30, ibemu's own: the
alternate egress ports of local failover; modifier = LID >> 4, a block of 16 LIDs; data =
16 entries of 4 bytes, per LID up to 3 ports preferred first, 0 after the last, the fourth
byte 0; a Set with a port beyond the switch's gets status 0x001C; a Set that changed the
block emits ``AltUpdate``). OpenSM never sends it.

Fault notices between neighbours (PFRN-like, ibemu's own vendor attributes; OpenSM never
sends them, so a fabric under OpenSM never notifies): ``ATTR_FAILOVER_CONFIG`` = 0xFF31
(Get/Set by the SM; byte 0 bit 0 = notices on; bytes 4..7 = the SM's generation; bytes
8..11, read-only = the LFT entries this switch had repaired when the last new generation
ended its repairs; bytes 32..63 = a bit per port, LSB first, of the ports that face a
switch) and
``ATTR_FAULT_NOTICE`` = 0xFF32 (method Trap, directed route one hop: sent only to a
neighbour; modifier = LID >> 9, data = a bitmap of 512 LIDs, LSB first, that the sender can
no longer reach). When a port goes down, the LIDs routed to it that have no alternate up
are announced on every other up port facing a switch. A switch receiving a notice on port q
remembers q as a dead end for each listed LID that q is one of its ways to (the port in use
or an alternate), moves each LID it routes to q now onto its first way that is up and not a
dead end (an ``LftUpdate(local=True)`` and a ``local_failover`` event), and announces
onwards the LIDs it cannot move: the notice travels upstream as far as needed, each LID
announced once per switch. LIDs q is no way to are ignored (counted); a notice that is not
a one-hop directed route, arrives on a port that does not face a switch, or reaches a
switch with notices off is counted and ignored. A FailoverConfig with a new generation
(the SM sends one after each programming pass and trap sweep, with the alternates) ends the
repairs: dead ends and announcements are forgotten, the repaired entries stay and are
counted in the answer, and the SM rewrites the whole table of a switch that had any (the
switch cannot tell which entries the SM has set since: the kernel SMA answers LFT Sets); an
LFT Set the agent answers itself ends them for its block.
(NVIDIA's SHIELD/PFRN has its own wire format; this one is ibemu's.)
SMInfo and anything else: GetResp with status 0x000C. PMA (GSI class 0x04 on QP1, to
the switch LID): ClassPortInfo, PortCounters, PortCountersExtended (PortSelect 0xFF =
all ports). SubnTrapRepress stops a trap's repeats.

Traps: a port whose link goes down or comes up (or is disabled/retrained by the SM) sets
SwitchInfo.PortStateChange and, once the SM has given port 0 a LID and a MasterSMLID,
sends trap 128 (LID-routed SubnTrap(Notice) from the switch LID to MasterSMLID through
the LFT), repeated per ``TrapPolicy`` until repressed. An SMP failing the M_Key check sends
trap 256 the same way (``DeviceAgent``; the switch's M_Key is port 0's).

LID-routed packets that are not for the switch (VL15 or data, if the IO layer hands them
over) are forwarded through the LFT by ``self.forwarder``; the IO layer of a userspace
datapath can call ``sw.forwarder.decide(packet, port)`` directly for data packets and
pass only ``Reason.TO_SMA`` ones to ``receive``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from ibemu.agents.actions import (
    Action,
    AltUpdate,
    Event,
    LftUpdate,
    LinkRequest,
    LinkRequestKind,
    PartitionUpdate,
    PortStateChange,
    Send,
)
from ibemu.agents.device import (
    GET,
    SET,
    ST_BAD_METHOD_ATTR,
    ST_INVALID,
    ST_OK,
    Clock,
    DeviceAgent,
    make_ports,
)
from ibemu.agents.forwarder import ALT_LIDS, ALT_SLOT, MAX_ALTERNATES, Forwarder
from ibemu.agents.lft import Lft, Mft
from ibemu.agents.port import SWITCH_PORT0_CAPS, PhysState, Port, PortState, SetOutcome
from ibemu.agents.traps import TrapPolicy
from ibemu.wire.madattrs import (
    NODE_TYPE_SWITCH,
    TRAP_BAD_P_KEY,
    SwitchInfoState,
    decode_switch_info,
    notice_trap128,
    notice_trap257,
)
from ibemu.wire.madpacket import (
    INITIAL_PATH,
    M_ATTR_ID,
    M_ATTR_MOD,
    M_DR_SLID,
    M_HOP_COUNT,
    M_METHOD,
    PERMISSIVE_LID,
    SMP_DATA,
    VL15,
)

_SMP_HEAD = struct.Struct("!BBBBHHQHHI")
"""An SMP's common header: versions, class, method, status, class-specific, TID, attribute,
reserved, modifier."""

ATTR_NOTICE = 0x0002
ATTR_SWITCH_INFO = 0x0012
ATTR_LFT = 0x0019
ATTR_MFT = 0x001B
ATTR_ALTERNATES = 0xFF30
"""Vendor-specific (0xFF00-0xFFFF): alternate ports per LID, 16 LIDs a block (module docstring)."""
ATTR_FAILOVER_CONFIG = 0xFF31
"""Vendor-specific: fault notices on/off and the ports facing switches (module docstring)."""
ATTR_FAULT_NOTICE = 0xFF32
"""Vendor-specific, method Trap, one-hop directed route: LIDs the sender cannot reach."""
NOTICE_LIDS = 512
"""LIDs per fault notice block: a 64-byte bitmap."""
ATTR_SM_INFO = 0x0020
TRAP_LINK_STATE_CHANGE = 128
PKEY_TRAP_INTERVAL_NS = 1_000_000_000
"""Trap 257 rate limit: at most one per port and direction in this time (the drops between
are counted, ``pkey_traps_suppressed``)."""
TRAP = 0x05



class SwitchAgent(DeviceAgent):
    """SMA of one switch with ``num_ports`` external ports (1..N) and management port 0."""

    NODE_TYPE = NODE_TYPE_SWITCH
    IS_SWITCH = True

    def __init__(
        self,
        *,
        node_guid: int,
        num_ports: int,
        description: str = "",
        linear_fdb_cap: int = 49152,
        vendor_id: int = 0x0002C9,
        device_id: int = 0xCB20,
        revision: int = 0,
        system_image_guid: int | None = None,
        link_up: Sequence[bool] | None = None,
        width: int = 4,
        speed: str = "EDR",
        mtu: int = 4096,
        partition_cap: int = 32,
        trap_policy: TrapPolicy | None = None,
        clock: Clock | None = None,
        count_own_traffic: bool = True,
        forwarder_seed: int = 0,
    ) -> None:
        if not 1 <= num_ports <= 254:
            raise ValueError(f"a switch has 1..254 ports, not {num_ports}")
        ports = make_ports(num_ports, 1, is_switch=True, link_up=link_up, width=width,
                           speed=speed, mtu=mtu, capability_mask=0)
        port0 = Port(0, is_switch=True, width=width, speed=speed, mtu=mtu,
                     capability_mask=SWITCH_PORT0_CAPS, state=PortState.ACTIVE,
                     phys=PhysState.LINK_UP)
        ports = {0: port0, **ports}
        super().__init__(node_guid=node_guid, ports=ports, num_ports=num_ports,
                         description=description or f"switch {node_guid:#018x}",
                         vendor_id=vendor_id, device_id=device_id, revision=revision,
                         system_image_guid=system_image_guid, partition_cap=partition_cap,
                         clock=clock, count_own_traffic=count_own_traffic, trap_policy=trap_policy)
        self.switch_info = SwitchInfoState(linear_fdb_cap=linear_fdb_cap,
                                           partition_enforcement_cap=partition_cap)
        # links that came up at power-on are state changes the SM has not seen yet
        self.switch_info.port_state_change = any(p.link_is_up for n, p in ports.items() if n)
        self.lft = Lft(linear_fdb_cap)
        self.mft = Mft(self.switch_info.multicast_fdb_cap, num_ports)
        self.alternates: dict[int, bytes] = {}
        """AlternatePorts blocks (modifier -> 64 bytes) as last Set; absent = no alternates.
        The forwarder reads this dict (local failover on the user datapath)."""
        self.forwarder = Forwarder(self.lft, self.ports, seed=forwarder_seed, alternates=self.alternates)
        self._smp_handlers.update({
            ATTR_SWITCH_INFO: self._attr_switch_info,
            ATTR_LFT: self._attr_lft,
            ATTR_MFT: self._attr_mft,
            ATTR_ALTERNATES: self._attr_alternates,
            ATTR_FAILOVER_CONFIG: self._attr_failover_config,
        })
        self.notices = False
        """Fault notices on (``ATTR_FAILOVER_CONFIG``)."""
        self.switch_ports: frozenset[int] = frozenset()
        """Ports facing a switch, as the SM said: where notices go and come from."""
        self._dead_ends: dict[int, set[int]] = {}
        """LID -> ports a neighbour's notice said lead nowhere for it."""
        self._announced: set[int] = set()
        """LIDs this switch announced it cannot reach (each once, until the SM's next
        generation: the kernel SMA answers most LFT Sets without this agent)."""
        self._repaired: dict[int, tuple[int, int]] = {}
        """LID -> (the SM's entry, the entry this switch wrote instead on a notice)."""
        self._notice_tid = 0
        self._generation = 0
        self._repairs_ended = 0
        """LFT entries the last new generation found repaired by this switch (bytes 8..11)."""
        self._pkey_trap_at: dict[tuple[int, bool], int] = {}
        """(port, inbound) -> when its last trap 257 went out (the rate limit)."""
        self._partitions_out: dict[int, tuple[int, tuple[int, ...]]] = {}
        """Port -> (partition bits, P_KeyTable) last announced by ``PartitionUpdate``."""

    # ================================================================== public

    @property
    def lid(self) -> int:
        """The switch LID (port 0), 0 until the SM assigns one."""
        return self.ports[0].lid

    def tick(self, now_ns: int | None = None) -> list[Action]:
        """Timer work, and trap 257 for the partition enforcement drops since the last tick."""
        actions = super().tick(now_ns)
        if self.forwarder.pkey_drops:
            actions += self._pkey_traps(self.clock() if now_ns is None else now_ns)
        return actions

    def next_deadline(self) -> int | None:
        if self.forwarder.pkey_drops:
            return self.clock()
        return super().next_deadline()

    def _pkey_traps(self, now: int) -> list[Action]:
        """Trap 257 (Bad P_Key) from the switch LID to the SM for the drops queued by the
        forwarder, one per port and direction per ``PKEY_TRAP_INTERVAL_NS``."""
        drops = self.forwarder.pkey_drops
        actions: list[Action] = []
        while drops:
            d = drops.popleft()
            key = (d.port, d.inbound)
            last = self._pkey_trap_at.get(key)
            if last is not None and now - last < PKEY_TRAP_INTERVAL_NS:
                self.stats["pkey_traps_suppressed"] += 1
                continue
            self._pkey_trap_at[key] = now
            actions.append(self._event("pkey_violation", port=d.port, inbound=d.inbound, pkey=d.pkey,
                                       slid=d.slid, dlid=d.dlid, sl=d.sl, qp=d.dest_qp))
            p0 = self.ports[0]
            if not p0.lid or not p0.master_sm_lid:
                self.stats["trap_not_configured"] += 1
                continue
            notice = notice_trap257(producer=self.NODE_TYPE, issuer_lid=p0.lid, lid1=d.slid, lid2=d.dlid,
                                    pkey=d.pkey, sl=d.sl, qp2=d.dest_qp)
            actions += self._raise_trap(TRAP_BAD_P_KEY, notice, 0, port=d.port, why="bad_p_key")
        return actions

    def receive(self, port: int, packet: bytes | bytearray | memoryview) -> list[Action]:
        actions = super().receive(port, packet)
        if self._pending_actions:
            actions = [*actions, *self._pending_actions]  # after the response that caused them
            self._pending_actions = []
        return actions

    def link_down(self, port: int) -> list[Action]:
        actions = super().link_down(port)
        if self.notices and actions:
            actions += self._announce(self._lost_through(port), exclude=port)
        return actions

    SMA_ATTRS: ClassVar[frozenset[int]] = DeviceAgent.SMA_ATTRS | {ATTR_FAILOVER_CONFIG}
    """As a device's, and FailoverConfig: the kernel's notice program reads it
    (``ibemu.kernel.notice``)."""

    def sma_images(self, *, attrs: Iterable[int] | None = None,
                   ports: Iterable[int] | None = None) -> dict[tuple[int, int], bytes]:
        attrs = None if attrs is None else set(attrs)
        out = super().sma_images(attrs=attrs, ports=ports)
        if attrs is None or ATTR_FAILOVER_CONFIG in attrs:
            buf = bytearray(64)
            self._attr_failover_config(GET, 0, buf, 0, 0)
            out[(ATTR_FAILOVER_CONFIG, 0)] = bytes(buf)
        return out

    @property
    def generation(self) -> int:
        """The SM's generation of the last FailoverConfig Set."""
        return self._generation

    def notice_in_kernel(self, port: int, lids: Sequence[int], moved: Mapping[int, tuple[int, int]],
                         noted: Sequence[int], lost: Sequence[int], fresh: Sequence[int], sent: int,
                         t_ns: int) -> list[Action]:
        """A fault notice the kernel handled on ``port`` (``ibemu.kernel.notice``: the LIDs
        of its bitmap, those moved (entry before, after), noted, lost and announced now,
        notices sent, the kernel's time): this agent's state, counters and events become
        what ``_rx_fault_notice`` would have made them, and nothing is done a second time
        (the kernel wrote the LFT entries and sent the notices). Events carry ``t_ns``."""
        self.stats["notices_received"] += 1
        for lid in (*moved, *noted, *lost):
            self._dead_ends.setdefault(lid, set()).add(port)
        self.stats["notice_lids_ignored"] += len(lids) - len(moved) - len(noted) - len(lost)
        self.stats["notice_lids_noted"] += len(noted)
        actions: list[Action] = []
        if moved:
            for lid, (prev, now) in moved.items():
                self._repaired[lid] = (self._repaired.get(lid, (prev, 0))[0], now)
            self.stats["notice_lids_moved"] += len(moved)
            actions.append(Event("local_failover", t_ns, self.node_guid,
                                 {"port": port, "lids": len(moved), "via": "notice", "kernel": True,
                                  "moved_lids": sorted(moved)}))
        if fresh:
            actions += self.lost_in_kernel(port, fresh, sent, t_ns)
        return actions

    def mark_announced(self, lids: Iterable[int]) -> None:
        """LIDs the kernel has just announced for a port that lost its signal
        (``ibemu.kernel.notice.announce_loss``, in the agent host's cutting thread), before
        its record comes: ``link_down`` must not announce them again. (Beside the agent
        host's loop under the GIL, as ``announce_port_lost``.)"""
        self._announced.update(lids)

    def lost_in_kernel(self, port: int, fresh: Sequence[int], sent: int, t_ns: int) -> list[Action]:
        """LIDs the kernel announced on the switch's other ports, ``port`` left out (its
        record of a loss of signal on ``port``, ``announce_loss``, or of a neighbour's notice
        there, ``notice_in_kernel``): what ``_announce`` leaves (the LIDs announced, the
        counter, the event, stamped with the kernel's time); nothing is sent a second time."""
        self._announced.update(fresh)
        self.stats["notices_sent"] += sent
        return [Event("fault_notice_sent", t_ns, self.node_guid,
                      {"lids": len(fresh), "ports": sent, "exclude": port, "kernel": True})]

    def notice_state(self) -> tuple[dict[int, frozenset[int]], dict[int, tuple[int, int]], frozenset[int]]:
        """(dead ends, repairs, LIDs announced): what a notice leaves behind (for tests that
        compare the kernel's state with this agent's)."""
        return ({lid: frozenset(ports) for lid, ports in self._dead_ends.items() if ports},
                dict(self._repaired), frozenset(self._announced))

    def announce_port_lost(self, port: int) -> list[Action]:
        """The fault notices ``link_down`` sends, at the instant the port loses its signal
        (called by the agent host's carrier thread, before this agent has taken the port
        down: the port is left out of the ways here): the LIDs routed to ``port`` with no
        other way up, on every other up port facing a switch. ``link_down`` later finds them
        announced and sends nothing more. Reads the tables, updates only the announcements
        and counters (safe beside the agent host's loop under the GIL: at worst a LID is
        announced twice)."""
        if not self.notices:
            return []
        return self._announce(self._lost_through(port), exclude=port)

    def alternates_of(self, lid: int) -> tuple[int, ...]:
        """The alternate ports the SM gave ``lid`` (preferred first)."""
        return self.forwarder.alternates_of(lid)

    def failover_lids(self, port: int) -> int:
        """LIDs the LFT sends to ``port`` that the forwarder now sends to an alternate (what
        a failure of ``port`` moved at once, on the user datapath): those with an alternate
        whose link is up and Active."""
        if not self.alternates:
            return 0
        moved = 0
        for block in self.alternates:
            for lid in range(block * ALT_LIDS, block * ALT_LIDS + ALT_LIDS):
                if lid and lid <= self.lft.top and self.lft.raw(lid) == port and any(
                        (q := self.ports.get(alt)) is not None and q.link_is_up and q.state == PortState.ACTIVE
                        for alt in self.alternates_of(lid)):
                    moved += 1
        return moved

    # ================================================================== fault notices

    def _egress_candidates(self, lid: int, *, lost: int = 0) -> list[int]:
        """Ports that may carry ``lid`` now: the primary, then its alternates, each with its
        link up and not announced dead-ended by a neighbour; ``lost``: a port taken as down
        whatever its state says (its signal lost, the agent not told yet)."""
        dead = self._dead_ends.get(lid, ())
        repaired = self._repaired.get(lid)
        out: list[int] = []
        for p in (self.lft.raw(lid), *(repaired[:1] if repaired else ()), *self.alternates_of(lid)):
            port = self.ports.get(p)
            if p and p != lost and port is not None and port.link_is_up and p not in dead and p not in out:
                out.append(p)
        return out

    def _lost_through(self, port: int) -> list[int]:
        """The LIDs the LFT sends to ``port`` that have no other way once it is down."""
        return [lid for lid in self.lft.lids_to(port) if not self._egress_candidates(lid, lost=port)]

    def _announce(self, lids: Sequence[int], *, exclude: int) -> list[Action]:
        """Fault notices for ``lids`` (those not announced yet) on every up port facing a
        switch but ``exclude``."""
        fresh = sorted(set(lids) - self._announced)
        if not fresh:
            return []
        self._announced.update(fresh)
        blocks: dict[int, bytearray] = {}
        for lid in fresh:
            bitmap = blocks.setdefault(lid // NOTICE_LIDS, bytearray(64))
            off = lid % NOTICE_LIDS
            bitmap[off >> 3] |= 1 << (off & 7)
        actions: list[Action] = []
        sent = 0
        for port in sorted(self.switch_ports):
            if port == exclude or not self.ports[port].link_is_up:
                continue
            for block, bitmap in sorted(blocks.items()):
                self._notice_tid = (self._notice_tid + 1) & 0xFFFFFFFF
                mad = bytearray(256)
                tid = (self.node_guid & 0xFFFF) << 48 | 1 << 47 | self._notice_tid
                # DR SMP on its first link: HopPointer 1, HopCount 1, InitialPath[1] = port
                _SMP_HEAD.pack_into(mad, 0, 1, 0x81, 1, TRAP, 0, 0x0101, tid, ATTR_FAULT_NOTICE, 0, block)
                struct.pack_into("!HH", mad, M_DR_SLID, PERMISSIVE_LID, PERMISSIVE_LID)
                mad[INITIAL_PATH + 1] = port
                mad[SMP_DATA : SMP_DATA + 64] = bitmap
                pkt = bytearray(self._build(mad, dlid=PERMISSIVE_LID, slid=PERMISSIVE_LID, dqp=0, sqp=0, vl=VL15))
                actions += self._send_dr(pkt, port)
                sent += 1
        self.stats["notices_sent"] += sent
        actions.append(self._event("fault_notice_sent", lids=len(fresh), ports=sent, exclude=exclude))
        return actions

    def _rx_fault_notice(self, buf: bytearray, m: int, ingress: int, dr_route: bool) -> list[Action]:
        """A neighbour's fault notice (module docstring); never answered."""
        if not dr_route or buf[m + M_HOP_COUNT] != 1:
            self.stats["notice_not_neighbour"] += 1
            return []
        if not self.notices or ingress not in self.switch_ports:
            self.stats["notice_ignored"] += 1
            return []
        self.stats["notices_received"] += 1
        block = struct.unpack_from("!I", buf, m + M_ATTR_MOD)[0]
        bitmap = bytes(buf[m + SMP_DATA : m + SMP_DATA + 64])
        base = block * NOTICE_LIDS
        top = self.lft.top
        moves: dict[int, int] = {}
        lost: list[int] = []
        ignored = noted = 0
        for i, byte in enumerate(bitmap):
            while byte:
                bit = (byte & -byte).bit_length() - 1
                byte &= byte - 1
                lid = base + i * 8 + bit
                ways = self._egress_candidates(lid) if 0 < lid <= top else []
                if ingress not in ways:
                    ignored += 1  # the notifying neighbour is no way of ours to it
                    continue
                self._dead_ends.setdefault(lid, set()).add(ingress)
                if ways[0] != ingress:  # an alternate, not the way in use: remembered only
                    noted += 1
                    continue
                rest = self._egress_candidates(lid)
                if rest:
                    moves[lid] = rest[0]
                else:
                    lost.append(lid)
        self.stats["notice_lids_ignored"] += ignored
        self.stats["notice_lids_noted"] += noted
        actions: list[Action] = []
        if moves:
            for lid, port in moves.items():
                self._repaired[lid] = (self._repaired.get(lid, (self.lft.raw(lid), 0))[0], port)
            changes = self._write_entries(moves)
            self.stats["notice_lids_moved"] += len(moves)
            actions += [LftUpdate(changes, local=True),
                        self._event("local_failover", port=ingress, lids=len(moves), via="notice",
                                    moved_lids=sorted(moves))]
        return actions + self._announce(lost, exclude=ingress)

    def _write_entries(self, entries: dict[int, int]) -> dict[int, int]:
        """Set LFT entries by the switch itself (block by block, as a Set would)."""
        changes: dict[int, int] = {}
        by_block: dict[int, dict[int, int]] = {}
        for lid, port in entries.items():
            by_block.setdefault(lid // 64, {})[lid] = port
        for block, items in by_block.items():
            data = bytearray(self.lft.get_block(block))
            for lid, port in items.items():
                data[lid % 64] = port
            changes.update(self.lft.set_block(block, data))
        return changes

    def _forget_repairs(self, lids: range | None = None) -> list[Action]:
        """The SM has programmed (``lids`` by an LFT Set this agent answered, or everything
        at a new generation): the local repairs end. The entries stay as they are: the
        switch cannot tell which the SM has rewritten since (the kernel SMA answers its LFT
        Sets), so it reports how many it repaired (FailoverConfig bytes 8..11) and the SM
        rewrites that switch's whole table."""
        if lids is None:
            ended = len(self._repaired)
            self._repaired.clear()
            self._dead_ends.clear()
            self._announced.clear()
            self._repairs_ended = ended
            return [self._event("repairs_ended", lids=ended)] if ended else []
        for lid in lids:
            self._repaired.pop(lid, None)
            self._dead_ends.pop(lid, None)
            self._announced.discard(lid)
        return []

    # ================================================================== hooks

    def _local_lid(self, dlid: int, ingress: int) -> bool:
        return self.ports[0].owns_lid(dlid)

    def _my_lid(self, ingress: int) -> int:
        return self.ports[0].lid or 0xFFFF

    def _route_lid(self, dlid: int, ingress: int, *, vl15: bool) -> int:
        # packets the SMA sends originate at port 0: going back out of the port a request
        # came in on is normal, not a relay loop
        egress, _reason = self.forwarder.route(dlid, 0, vl15=vl15)
        return egress

    def _transit(self, port: int, pkt: bytes, dlid: int, vl15: bool) -> list[Action]:
        if vl15:
            egress, reason = self.forwarder.route(dlid, port, vl15=True)
            if reason is not None:
                self.stats[f"fwd_{reason}"] += 1
                return []
            if self.count_own_traffic:
                self.ports[egress].counters.add_tx(len(pkt))
            return [Send(egress, pkt)]
        verdict = self.forwarder.decide(pkt, port, count_traffic=self.count_own_traffic)
        if verdict.port:
            return [Send(verdict.port, verdict.packet)]
        self.stats[f"fwd_{verdict.reason}"] += 1
        return []

    def _answer_smp(self, buf: bytearray, m: int, ingress: int, *, dr_route: bool) -> list[Action] | None:
        if (buf[m + M_ATTR_ID] << 8 | buf[m + M_ATTR_ID + 1]) == ATTR_FAULT_NOTICE and buf[m + M_METHOD] == TRAP:
            return self._rx_fault_notice(buf, m, ingress, dr_route)
        return super()._answer_smp(buf, m, ingress, dr_route=dr_route)

    def _port_changed(self, port: int, p: Port, why: str) -> list[Action]:
        actions = super()._port_changed(port, p, why)
        self.switch_info.port_state_change = True
        return actions + self._trap128(why, port)

    def _partition_changed(self, num: int) -> None:
        """Announce port ``num``'s partition bits and P_KeyTable if they changed (what a
        datapath checking P_Keys in the kernel must know: ``PartitionUpdate``)."""
        p = self.ports.get(num)
        if p is None or num == 0:
            return
        now = (p.partition_flags, tuple(p.pkeys))
        if self._partitions_out.get(num, (0, ())) != now:
            self._partitions_out[num] = now
            self._pending_actions.append(PartitionUpdate(num, now[0], now[1]))

    def _attr_pkey_table(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        status = super()._attr_pkey_table(method, mod, buf, d, ingress)
        if method == SET and status == ST_OK:
            self._partition_changed(mod >> 16)
        return status

    def _after_port_set(self, num: int, p: Port, outcome: object) -> None:
        assert isinstance(outcome, SetOutcome)
        self._partition_changed(num)
        if num == 0:
            if outcome.lid_changed:
                self._pending_actions.append(self._event("lid_assigned", lid=p.lid, sm_lid=p.master_sm_lid))
            return
        if outcome.link_request is not None:
            self._pending_actions.append(LinkRequest(num, LinkRequestKind(outcome.link_request)))
        if outcome.state_before != p.state or outcome.phys_before != p.phys:
            if outcome.retrained or outcome.link_request == "disable":
                self._pending_actions += self._port_changed(num, p, f"sm_{outcome.link_request}")
            else:
                self._pending_actions += [
                    PortStateChange(num, p.state, p.phys),
                    self._event("port_state", port=num, why="sm_set", state=p.state.name.lower(),
                                phys_state=p.phys.name.lower())]

    # ================================================================== attributes

    def _pkey_port_and_cap(self, mod: int, ingress: int) -> tuple[Port | None, int]:
        num = mod >> 16
        cap = self.partition_cap if num == 0 else self.switch_info.partition_enforcement_cap
        return self.ports.get(num), cap

    def _attr_switch_info(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        si = self.switch_info
        status = ST_OK
        if method == SET:
            f = decode_switch_info(buf[d : d + 64])
            top = f["linear_fdb_top"]
            if top >= si.linear_fdb_cap:
                status = ST_INVALID
            else:
                changes = self.lft.set_top(top)
                si.linear_fdb_top = top
                si.default_port = f["default_port"]
                si.default_mcast_primary_port = f["default_mcast_primary_port"]
                si.default_mcast_not_primary_port = f["default_mcast_not_primary_port"]
                si.life_time_value = f["life_time_value"]
                si.multicast_fdb_top = f["multicast_fdb_top"]
                if f["port_state_change"]:
                    si.port_state_change = False
                if changes:
                    self._pending_actions += [LftUpdate(changes),
                                              self._event("lft_top", top=top, changed=len(changes))]
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = si.encode()
        return status

    def _attr_lft(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        if not 0 <= mod < self.lft.blocks:
            return ST_INVALID
        if method == SET:
            if self._dead_ends or self._announced or self._repaired:
                self._forget_repairs(range(mod * 64, mod * 64 + 64))
            changes = self.lft.set_block(mod, buf[d : d + 64])
            if changes:
                self._pending_actions += [LftUpdate(changes),
                                          self._event("lft_set", block=mod, changed=len(changes))]
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self.lft.get_block(mod)
        return ST_OK

    def _attr_alternates(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        if not 0 <= mod < (self.lft.blocks * 64) // ALT_LIDS:
            return ST_INVALID
        if method == SET:
            data = bytes(buf[d : d + 64])
            norm = bytearray(64)
            for i in range(0, 64, ALT_SLOT):
                ports = data[i : i + MAX_ALTERNATES]
                end = ports.find(0)
                ports = ports[:end] if end >= 0 else ports
                if any(p > self.num_ports for p in ports):
                    return ST_INVALID
                norm[i : i + len(ports)] = ports
            old = self.alternates.get(mod, bytes(64))
            if bytes(norm) != old:
                if any(norm):
                    self.alternates[mod] = bytes(norm)
                else:
                    self.alternates.pop(mod, None)
                self._pending_actions += [AltUpdate(mod * ALT_LIDS, bytes(norm)),
                                          self._event("alt_set", block=mod)]
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self.alternates.get(mod, bytes(64))
        return ST_OK

    def _attr_failover_config(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        if mod != 0:
            return ST_INVALID
        if method == SET:
            data = bytes(buf[d : d + 64])
            mask = int.from_bytes(data[32:64], "little")
            ports = frozenset(p for p in range(1, 256) if mask >> p & 1)
            if mask & 1 or any(p > self.num_ports for p in ports):
                return ST_INVALID
            self.notices = bool(data[0] & 1)
            self.switch_ports = ports
            generation = struct.unpack_from("!I", data, 4)[0]
            if generation != self._generation:
                self._generation = generation
                self._pending_actions += self._forget_repairs()
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        out = bytearray(64)
        out[0] = int(self.notices)
        struct.pack_into("!II", out, 4, self._generation, self._repairs_ended)
        out[32:64] = sum(1 << p for p in self.switch_ports).to_bytes(32, "little")
        buf[d : d + 64] = out
        return ST_OK

    def _attr_mft(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        position, block = mod >> 28, mod & 0x1FF
        if not self.mft.valid(position, block):
            return ST_INVALID
        if method == SET:
            self.mft.set(position, block, buf[d : d + 64])
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self.mft.get(position, block)
        return ST_OK

    # ================================================================== traps

    def _trap128(self, why: str, port: int) -> list[Action]:
        p0 = self.ports[0]
        if not p0.lid or not p0.master_sm_lid:
            self.stats["trap_not_configured"] += 1
            return []
        notice = notice_trap128(issuer_lid=p0.lid, lidaddr=p0.lid)
        return self._raise_trap(TRAP_LINK_STATE_CHANGE, notice, 0, port=port, why=why)


__all__ = ["ATTR_ALTERNATES", "ATTR_FAILOVER_CONFIG", "ATTR_FAULT_NOTICE", "ATTR_SM_INFO", "GET", "SET", "SwitchAgent", "TrapPolicy"]
