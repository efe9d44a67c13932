"""The management agent shared by switches and CAs: receive path, SMA attributes, PMA.

``DeviceAgent`` is sans-IO: ``receive(port, packet)``, ``link_up(port)``,
``link_down(port)``, ``link_retrained(port)`` and ``tick()`` return lists of actions
(``ibemu.agents.actions``) and never raise for anything a packet contains. Every packet
received gets the strict check (PktLen, headers, ICRC, VCRC); failures count in the
ingress port's PortRcvErrors and produce an ``rx_error`` Event. Responses are built from
the request's bytes (patched and resealed), not with scapy.

Every SubnGet/SubnSet/SubnTrapRepress, directed route or LID-routed, passes the M_Key check
of ``ibemu.agents.port`` (the module docstring has the levels) before its handler: a refused
one gets no response, counts in M_KeyViolations, sends trap 256 (``_raise_trap``: traps of
every node repeat per ``TrapPolicy`` until repressed) and returns ``MKeyChange`` for whoever
mirrors the M_Key state (the kernel SMA's ``mkey_guard`` image). The lease countdown runs in
``tick``. Relayed SMPs are not checked: only the SMA they are addressed to checks its key.

Subclasses (``SwitchAgent``, ``CaAgent``) provide routing of LID-routed packets, their
node type specific attributes and what to do with MADs for local clients.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar

from ibemu import clock as _clock
from ibemu.agents import dr
from ibemu.agents.actions import Action, Event, MKeyChange, PortStateChange, Send
from ibemu.agents.counters import (
    ATTR_PORT_COUNTERS,
    ATTR_PORT_COUNTERS_EXT,
    ATTR_PORT_RCV_ERROR_DETAILS,
    ATTR_PORT_XMIT_DISCARD_DETAILS,
    PortCounters,
)
from ibemu.agents.port import VL_ARB_HIGH_CAP, VL_ARB_LOW_CAP, Port, PortState
from ibemu.agents.traps import PendingTrap, TrapPolicy, TrapQueue
from ibemu.errors import CrcError, DecodeError
from ibemu.physics.qos import Sl2Vl, VlArb, vls_of_code
from ibemu.wire.madattrs import (
    TRAP_BAD_M_KEY,
    VL_ARB_BLOCK_ENTRIES,
    VL_ARB_HIGH_BLOCKS,
    VL_ARB_LOW_BLOCKS,
    class_port_info,
    decode_sl2vl,
    decode_vl_arb_block,
    node_info,
    notice_fields,
    notice_trap256,
    vl_arb_block,
)
from ibemu.wire.madpacket import (
    GSI_QKEY,
    M_ATTR_ID,
    M_ATTR_MOD,
    M_BASE_VERSION,
    M_CLASS,
    M_CLASS_VERSION,
    M_METHOD,
    M_STATUS,
    M_TID,
    MAD_LEN,
    MAD_OFFSET,
    PERMISSIVE_LID,
    PMA_DATA,
    QP0_QKEY,
    SMP_DATA,
    UD_SEND_ONLY,
    VL15,
    check,
    frame_mad,
    reseal,
    response_method,
    set_lrh,
    set_qps,
)

logger = logging.getLogger(__name__)

Clock = Callable[[], int]

CLASS_SMP_LR = 0x01
CLASS_SMP_DR = 0x81
CLASS_PMA = 0x04
GET, SET, TRAP, TRAP_REPRESS = 0x01, 0x02, 0x05, 0x07
NO_RESPONSE_METHODS = frozenset({0x03, TRAP, TRAP_REPRESS})  # Send, Trap, TrapRepress

ST_OK = 0x0000
ST_BAD_VERSION = 0x0004
ST_BAD_METHOD = 0x0008
ST_BAD_METHOD_ATTR = 0x000C
ST_INVALID = 0x001C

ATTR_NODE_DESCRIPTION = 0x0010
ATTR_NODE_INFO = 0x0011
ATTR_GUID_INFO = 0x0014
ATTR_PORT_INFO = 0x0015
ATTR_PKEY_TABLE = 0x0016
ATTR_SL2VL = 0x0017
ATTR_VL_ARB = 0x0018
ATTR_CLASS_PORT_INFO = 0x0001
ATTR_MLNX_EXT_PORT_INFO = 0xFF90  # Mellanox vendor attribute OpenSM reads on 0x02C9 devices
ATTR_NOTICE = 0x0002
ATTR_MKEY_GUARD = 0x10000 | ATTR_PORT_INFO
"""Not an attribute (attribute IDs are 16 bits): the key under which ``sma_images`` gives the
kernel SMA the M_Key state of a port that holds one (``mkey_guard``)."""
SMP_M_KEY = 24
"""Offset of the M_Key in an SMP's header."""

PMA_CAP_ALL_PORT_SELECT = 0x0100
PMA_CAP_EXT_WIDTH = 0x0200
PMA_CAP_XMIT_WAIT = 0x1000
PMA_CAP2_ADDL_PORT_COUNTERS_EXT = 0x0002
"""ClassPortInfo CapabilityMask2 bit: PortCountersExtended carries the error counters too (IBA
1.3). Not advertised (``PMA_CAP2``): Debian's libumad2sim (ibsim 0.10), through which the
unmodified tools reach the emulated HCA, hands a tool only the first 224 bytes of a MAD, so
perfquery -x and ibqueryerrors would read VL15Dropped, PortXmitWait and QP1Dropped (bytes 160+
of the data) from stale memory: ibqueryerrors then reports bogus errors on every port. Without
the bit they take the error counters from PortCounters, as on HCAs before ConnectX-4. The
counters are in PortCountersExtended all the same, for a client that reads whole MADs."""
PMA_CAP2 = 0

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_TRAP_HEAD = struct.Struct("!BBBBHHQHHI")
_DEFAULT_SL2VL = bytes.fromhex("01234567") + bytes.fromhex("89abcde7")

# handler(method, modifier, buf, data_offset, ingress) -> MAD status
SmpHandler = Callable[[int, int, bytearray, int, int], int]


class DeviceAgent:
    """Common management agent of an emulated IB device (see the module docstring)."""

    NODE_TYPE: ClassVar[int] = 0
    IS_SWITCH: ClassVar[bool] = False

    def __init__(
        self,
        *,
        node_guid: int,
        ports: dict[int, Port],
        num_ports: int,
        description: str,
        vendor_id: int,
        device_id: int,
        revision: int,
        system_image_guid: int | None,
        partition_cap: int,
        clock: Clock | None,
        count_own_traffic: bool,
        trap_policy: TrapPolicy | None = None,
    ) -> None:
        if not 0 < node_guid < 1 << 64:
            raise ValueError(f"node GUID {node_guid:#x} is not a non-zero 64-bit value")
        raw = description.encode("utf-8")
        if len(raw) > 64:
            raise ValueError(f"NodeDescription is at most 64 bytes, {description!r} has {len(raw)}")
        self.node_guid = node_guid
        self.num_ports = num_ports
        self.ports = ports
        self.description = description
        self.vendor_id = vendor_id
        self.device_id = device_id
        self.revision = revision
        self.system_image_guid = system_image_guid if system_image_guid is not None else node_guid
        self.partition_cap = partition_cap
        self.clock: Clock = clock or _clock.now_ns
        self.count_own_traffic = count_own_traffic
        self.stats: Counter[str] = Counter()
        self._node_description = raw.ljust(64, b"\0")
        self._node_info_cache: dict[int, bytes] = {}
        self._sl2vl: dict[tuple[int, int], bytes] = {}
        self._vlarb: dict[tuple[int, int], bytes] = {}
        self._qos_sets = 0
        self._psn = 0
        self._smp_handlers: dict[int, SmpHandler] = {
            ATTR_NODE_DESCRIPTION: self._attr_node_description,
            ATTR_NODE_INFO: self._attr_node_info,
            ATTR_GUID_INFO: self._attr_guid_info,
            ATTR_PORT_INFO: self._attr_port_info,
            ATTR_PKEY_TABLE: self._attr_pkey_table,
            ATTR_SL2VL: self._attr_sl2vl,
            ATTR_VL_ARB: self._attr_vl_arb,
            ATTR_MLNX_EXT_PORT_INFO: self._attr_mlnx_ext_port_info,
        }
        self._mlnx_ext: dict[int, bytes] = {}
        self.traps = TrapQueue(trap_policy or TrapPolicy())
        self._trap_tid = 0
        self._leases: set[int] = set()
        """Ports whose M_Key lease countdown runs."""
        self._pending_actions: list[Action] = []
        """What the subclasses' ``receive`` returns after an SMP's response (its consequences)."""
        self.link_counters: Callable[[Sequence[int]], None] | None = None
        """Set by whoever runs the agent when the kernel carries frames the agent never sees:
        called with port numbers before the PMA reads or writes their counters, to bring
        them up to date (``PortCounters.follow_link``)."""

    # ================================================================== public API

    def receive(self, port: int, packet: bytes | bytearray | memoryview) -> list[Action]:
        """A packet (LRH .. VCRC) arrived on physical ``port``; never raises for its contents."""
        p = self.ports.get(port)
        if p is None or (self.IS_SWITCH and port == 0):
            self.stats["rx_bad_port"] += 1
            return [self._event("rx_bad_port", port=port)]
        pkt = bytes(packet)
        try:
            check(pkt)
        except DecodeError as exc:
            p.counters.port_rcv_errors += 1
            if isinstance(exc, CrcError):
                p.counters.port_local_physical_errors += 1
            else:
                p.counters.port_malformed_packet_errors += 1
            self.stats["rx_malformed"] += 1
            return [self._event("rx_error", port=port, error=str(exc), length=len(pkt))]
        try:
            return self._dispatch(port, p, pkt)
        except Exception as exc:  # a bug, not the packet's fault: count it, keep running
            logger.exception("node %#x: internal error on a packet from port %d", self.node_guid, port)
            self.stats["internal_error"] += 1
            return [self._event("internal_error", port=port, error=repr(exc))]

    def link_up(self, port: int) -> list[Action]:
        """The physical link of ``port`` trained (carrier up): LinkUp, Down -> Init."""
        p = self._external_port(port)
        if not p.physical_up():
            return []
        return self._port_changed(port, p, "link_up")

    def link_down(self, port: int) -> list[Action]:
        """The physical link of ``port`` went away (carrier down, peer gone): Down."""
        p = self._external_port(port)
        if not p.physical_down():
            return []
        return self._port_changed(port, p, "link_down")

    def link_retrained(self, port: int) -> list[Action]:
        """The peer of ``port`` retrained the link (its SM set it Down): Armed/Active -> Init."""
        p = self._external_port(port)
        if not p.retrained():
            return []
        return self._port_changed(port, p, "link_retrained")

    def tick(self, now_ns: int | None = None) -> list[Action]:
        """Timer work (trap repeats, M_Key leases); call at ``next_deadline()`` or periodically."""
        now = self.clock() if now_ns is None else now_ns
        actions: list[Action] = []
        for num in sorted(self._leases):
            p = self.ports[num]
            if p.m_key_lease_deadline <= now:
                actions += self._lease_expired(num, p)
        for trap in self.traps.due(now):
            actions += self._send_trap(trap, now, repeat=True)
        return actions

    def next_deadline(self) -> int | None:
        """Monotonic ns at which ``tick`` has work, or None."""
        leases = [self.ports[num].m_key_lease_deadline for num in self._leases]
        trap = self.traps.next_deadline()
        if trap is not None:
            leases.append(trap)
        return min(leases, default=None)

    def add_counts(self, port: int, **deltas: int) -> None:
        """Add traffic/error counts measured by the IO layer or datapath to ``port``'s PMA.

        Names as in ``PortCounters``: ``rcv_pkts``, ``rcv_octets``, ``xmit_pkts``,
        ``xmit_octets``, ``port_rcv_errors``, ``port_xmit_discards``, ``vl15_dropped``,
        ``port_xmit_wait``, ``symbol_error_counter`` ... Octets are bytes LRH .. VCRC.
        """
        if port not in self.ports:
            raise ValueError(f"node {self.node_guid:#x} has no port {port}")
        self.ports[port].counters.add(**deltas)

    def counters(self, port: int) -> PortCounters:
        return self.ports[port].counters

    def port_guid(self, port: int) -> int:
        return self.node_guid

    def node_info(self, port: int) -> bytes:
        """64-byte NodeInfo as seen through ``port`` (LocalPortNum = ``port``)."""
        cached = self._node_info_cache.get(port)
        if cached is None:
            cached = node_info(node_type=self.NODE_TYPE, num_ports=self.num_ports,
                               system_image_guid=self.system_image_guid, node_guid=self.node_guid,
                               port_guid=self.port_guid(port), partition_cap=self.partition_cap,
                               device_id=self.device_id, revision=self.revision,
                               local_port_num=port, vendor_id=self.vendor_id)
            self._node_info_cache[port] = cached
        return cached

    def port_info(self, port: int, local_port: int | None = None) -> bytes:
        """64-byte PortInfo of ``port`` (LocalPortNum = ``local_port``, default ``port``)."""
        return self.ports[port].encode(port if local_port is None else local_port)

    SMA_ATTRS: ClassVar[frozenset[int]] = frozenset(
        {ATTR_NODE_DESCRIPTION, ATTR_NODE_INFO, 0x0012, ATTR_PORT_INFO, ATTR_PKEY_TABLE})
    """The attributes whose Get the kernel SMA answers from published images (LFT aside:
    its table is shared memory, ``Lft.bind``)."""

    def sma_images(self, *, attrs: Iterable[int] | None = None,
                   ports: Iterable[int] | None = None) -> dict[tuple[int, int], bytes]:
        """The 64-byte Get answers of the kernel SMA (``ibemu.kernel.sma``), produced by this
        agent's own handlers, keyed ``(attribute, key)`` as the kernel looks them up:
        NodeDescription and SwitchInfo key 0; NodeInfo the ingress port; PortInfo the port
        (LocalPortNum is the kernel's to patch); P_KeyTable ``port << 16 | block``.
        ``attrs``/``ports`` narrow it down (a republish after a change)."""
        want = self.SMA_ATTRS if attrs is None else self.SMA_ATTRS & set(attrs)
        external = sorted(n for n in self.ports if n or not self.IS_SWITCH)
        nums = sorted(self.ports) if ports is None else sorted(set(ports) & set(self.ports))
        if not external:
            return {}
        anyp = external[0]
        out: dict[tuple[int, int], bytes] = {}

        def image(attr: int, mod: int, ingress: int, key: int) -> None:
            handler = self._smp_handlers.get(attr)
            if handler is None:
                return
            buf = bytearray(64)
            if handler(GET, mod, buf, 0, ingress) == ST_OK:
                out[(attr, key)] = bytes(buf)

        if ATTR_NODE_DESCRIPTION in want:
            image(ATTR_NODE_DESCRIPTION, 0, anyp, 0)
        if 0x0012 in want:
            image(0x0012, 0, anyp, 0)
        for num in nums:
            if ATTR_NODE_INFO in want and num in external:
                image(ATTR_NODE_INFO, 0, num, num)
            if ATTR_PORT_INFO in want:
                image(ATTR_PORT_INFO, num, num or anyp, num)
                if (num == 0) == self.IS_SWITCH:
                    out[(ATTR_MKEY_GUARD, num)] = self.mkey_guard(num)
            if ATTR_PKEY_TABLE in want:
                for block in range(self._pkey_blocks(num)):
                    if self.IS_SWITCH:
                        image(ATTR_PKEY_TABLE, num << 16 | block, anyp, num << 16 | block)
                    elif num in external:
                        image(ATTR_PKEY_TABLE, block, num, num << 16 | block)
        return out

    def mkey_guard(self, num: int) -> bytes:
        """The kernel SMA's view of port ``num``'s M_Key state (64 bytes): M_Key (8 bytes,
        big-endian), protect bits, and 1 when every SMP must go to this agent (a lease
        countdown runs: only the agent can stop it on a valid key)."""
        p = self.ports[num]
        return (_U64.pack(p.m_key) + bytes((p.m_key_protect, 1 if p.m_key_lease_deadline else 0))).ljust(64, b"\0")

    def _pkey_blocks(self, num: int) -> int:
        _p, cap = self._pkey_port_and_cap(num << 16, num)
        return (cap + 31) // 32

    # ================================================================== hooks

    def _route_lid(self, dlid: int, ingress: int, *, vl15: bool) -> int:
        """Egress port for a LID-routed packet we send (0 = none; counted by the callee)."""
        raise NotImplementedError

    def _local_lid(self, dlid: int, ingress: int) -> bool:
        """Is ``dlid`` addressed to this node (through ``ingress``)?"""
        raise NotImplementedError

    def _my_lid(self, ingress: int) -> int:
        """The SLID to put on packets we send through ``ingress``'s side."""
        raise NotImplementedError

    def _transit(self, port: int, pkt: bytes, dlid: int, vl15: bool) -> list[Action]:
        """A LID-routed packet not for us (a switch forwards it; a CA drops it)."""
        self.stats["rx_not_for_us"] += 1
        return []

    def _client_mad(self, port: int, pkt: bytes, mad: bytes | bytearray) -> list[Action]:
        """A MAD for local clients: responses, traps, requests the SMA does not serve.

        This node has none: a GSI Get/Set of a class it lacks is answered with status
        0x0004 (class not supported); anything else is dropped and counted.
        """
        mclass, method = pkt[MAD_OFFSET + M_CLASS], pkt[MAD_OFFSET + M_METHOD]
        if mclass not in (CLASS_SMP_LR, CLASS_SMP_DR) and method in (GET, SET):
            return self._gsi_respond(bytearray(pkt), MAD_OFFSET, port, ST_BAD_VERSION)
        self.stats["rx_no_client"] += 1
        return []

    def _trap_repress(self, mad: bytearray) -> list[Action]:
        m = MAD_OFFSET
        attr = (mad[m + M_ATTR_ID] << 8) | mad[m + M_ATTR_ID + 1]
        tid = struct.unpack_from("!Q", mad, m + M_TID)[0]
        trap = self.traps.repress(tid) if attr == ATTR_NOTICE else None
        if trap is None:
            self.stats["trap_repress_unmatched"] += 1
            return []
        self.stats["trap_repressed"] += 1
        return [self._event("trap_repressed", tid=tid, trap_number=trap.trap_number, sends=trap.sends)]

    def _client_smp_request(self, attr: int) -> bool:
        """True when a request for ``attr`` goes to local clients (the SM) instead of the SMA."""
        return False

    def _port_changed(self, port: int, p: Port, why: str) -> list[Action]:
        return [PortStateChange(port, p.state, p.phys),
                self._event("port_state", port=port, why=why, state=p.state.name.lower(),
                            phys_state=p.phys.name.lower())]

    # ================================================================== receive path

    def _dispatch(self, port: int, p: Port, pkt: bytes) -> list[Action]:
        if pkt[1] & 3 != 2:
            return self._transit_or_drop(port, p, pkt, "rx_grh_or_raw")
        vl = pkt[0] >> 4
        dlid = (pkt[2] << 8) | pkt[3]
        opcode = pkt[8]
        dqp = ((pkt[13] << 16) | (pkt[14] << 8) | pkt[15])
        if vl == VL15:
            if self.count_own_traffic:
                p.counters.add_rx(len(pkt))
            if not p.link_is_up:
                self.stats["rx_link_down"] += 1
                return []
            mclass = pkt[MAD_OFFSET + M_CLASS]
            if opcode != UD_SEND_ONLY or dqp != 0 or mclass not in (CLASS_SMP_DR, CLASS_SMP_LR):
                p.counters.vl15_dropped += 1
                self.stats["rx_vl15_not_smp"] += 1
                return [self._event("rx_drop", port=port, reason="vl15_not_smp")]
            if mclass == CLASS_SMP_DR:
                return self._rx_dr(port, pkt, dlid)
            return self._rx_lr_smp(port, p, pkt, dlid)
        if dqp == 0:
            self.stats["rx_qp0_not_vl15"] += 1
            return []
        if dqp == 1 and opcode == UD_SEND_ONLY and self._local_lid(dlid, port):
            if self.count_own_traffic:
                p.counters.add_rx(len(pkt))
            return self._rx_gsi(port, p, pkt)
        return self._transit_or_drop(port, p, pkt, "rx_not_mad")

    def _transit_or_drop(self, port: int, p: Port, pkt: bytes, stat: str) -> list[Action]:
        dlid = (pkt[2] << 8) | pkt[3]
        if self.IS_SWITCH and not self._local_lid(dlid, port):
            return self._transit(port, pkt, dlid, False)
        self.stats[stat] += 1
        return []

    # ------------------------------------------------------------------ directed route

    def _rx_dr(self, port: int, pkt: bytes, dlid: int) -> list[Action]:
        lid_routed = dlid != PERMISSIVE_LID
        if lid_routed and not self._local_lid(dlid, port):
            return self._transit(port, pkt, dlid, True)
        buf = bytearray(pkt)
        m = MAD_OFFSET
        kind, val = dr.on_receive(buf, m, port, is_switch=self.IS_SWITCH,
                                  num_ports=self.num_ports, lid_routed=lid_routed)
        if kind == dr.PORT:
            return self._send_dr(buf, int(val))
        if kind == dr.LID:
            return self._send_lid_routed(buf, int(val), port)
        if kind == dr.DISCARD:
            self.stats[f"dr_discard_{val}"] += 1
            return [self._event("smp_discard", port=port, reason=val)]
        # CONSUME
        if buf[m + M_STATUS] & 0x80:  # a response for the local SM
            return self._client_mad(port, pkt, buf[m : m + MAD_LEN])
        actions = self._answer_smp(buf, m, port, dr_route=True)
        if actions is not None:
            return actions
        st = (buf[m + M_STATUS] << 8 | buf[m + M_STATUS + 1]) & 0x7FFF
        _U16.pack_into(buf, m + M_STATUS, 0x8000 | st)
        kind, val = dr.on_respond(buf, m, num_ports=self.num_ports,
                                  request_lid_routed=lid_routed, request_slid=(pkt[6] << 8) | pkt[7])
        if kind == dr.PORT:
            return self._send_dr(buf, int(val))
        if kind == dr.LID:
            return self._send_lid_routed(buf, int(val), port)
        self.stats[f"dr_discard_{val}"] += 1
        return [self._event("smp_discard", port=port, reason=val)]

    def _send_dr(self, buf: bytearray, egress: int) -> list[Action]:
        """Send a DR SMP (LRH DLID/SLID permissive) on ``egress`` if its link is up."""
        pe = self.ports[egress]
        if not pe.link_is_up:
            pe.counters.port_xmit_discards += 1
            self.stats["dr_discard_egress_down"] += 1
            return [self._event("smp_discard", port=egress, reason="egress_down")]
        set_lrh(buf, dlid=PERMISSIVE_LID, slid=PERMISSIVE_LID)
        out = reseal(buf)
        if self.count_own_traffic:
            pe.counters.add_tx(len(out))
        return [Send(egress, out)]

    def _send_lid_routed(self, buf: bytearray, dlid: int, ingress: int) -> list[Action]:
        """LID-route a (DR or LID-routed) SMP we generate or relay: SLID = our LID."""
        if self._local_lid(dlid, ingress):
            self.stats["smp_to_self"] += 1
            return []
        egress = self._route_lid(dlid, ingress, vl15=True)
        if not egress:
            self.stats["smp_no_route"] += 1
            return [self._event("smp_discard", port=ingress, reason="no_route", dlid=dlid)]
        set_lrh(buf, dlid=dlid, slid=self._my_lid(egress))
        out = reseal(buf)
        if self.count_own_traffic:
            self.ports[egress].counters.add_tx(len(out))
        return [Send(egress, out)]

    # ------------------------------------------------------------------ LID-routed SMPs

    def _rx_lr_smp(self, port: int, p: Port, pkt: bytes, dlid: int) -> list[Action]:
        if dlid != PERMISSIVE_LID and not self._local_lid(dlid, port):
            return self._transit(port, pkt, dlid, True)
        m = MAD_OFFSET
        method = pkt[m + M_METHOD]
        if method & 0x80 or method == TRAP:
            return self._client_mad(port, pkt, pkt[m : m + MAD_LEN])
        buf = bytearray(pkt)
        if method == TRAP_REPRESS:
            refused, _hide, key_actions = self._mkey_check(buf, m, port, dr_route=False)
            if refused:
                return key_actions
            return key_actions + self._trap_repress(buf)
        actions = self._answer_smp(buf, m, port, dr_route=False)
        if actions is not None:
            return actions
        slid = (pkt[6] << 8) | pkt[7]
        if slid == PERMISSIVE_LID or slid == 0:
            self.stats["smp_no_return_lid"] += 1
            return []
        return self._send_lid_routed(buf, slid, port)

    # ------------------------------------------------------------------ SMA

    def _answer_smp(self, buf: bytearray, m: int, ingress: int, *, dr_route: bool) -> list[Action] | None:
        """Process an SMP request in ``buf``; None = ``buf`` now holds the response MAD."""
        method = buf[m + M_METHOD]
        attr = (buf[m + M_ATTR_ID] << 8) | buf[m + M_ATTR_ID + 1]
        if method in NO_RESPONSE_METHODS:
            self.stats["smp_unsolicited_dropped"] += 1
            return []
        if method & 0x80:  # a response travelling as a request (D=0): never answer it
            self.stats["smp_response_as_request"] += 1
            return [self._event("smp_discard", port=ingress, reason="response_as_request")]
        if self._client_smp_request(attr):
            return self._client_mad(ingress, bytes(buf), buf[m : m + MAD_LEN])
        key_actions: list[Action] = []
        hide = False
        if method in (GET, SET):
            refused, hide, key_actions = self._mkey_check(buf, m, ingress, dr_route=dr_route)
            if refused:
                return key_actions
            if key_actions:
                self._key_actions(key_actions)
        if buf[m + M_BASE_VERSION] != 1 or buf[m + M_CLASS_VERSION] != 1:
            status = ST_BAD_VERSION
        elif method not in (GET, SET):
            status = ST_BAD_METHOD
        else:
            handler = self._smp_handlers.get(attr)
            if handler is None:
                status = ST_BAD_METHOD_ATTR
            else:
                mod = _U32.unpack_from(buf, m + M_ATTR_MOD)[0]
                status = handler(method, mod, buf, m + SMP_DATA, ingress)
                if hide and attr == ATTR_PORT_INFO:
                    buf[m + SMP_DATA : m + SMP_DATA + 8] = bytes(8)
        if status:
            self.stats[f"smp_status_{status:#06x}"] += 1
        self.stats["smp_answered"] += 1
        buf[m + M_METHOD] = response_method(method)
        _U16.pack_into(buf, m + M_STATUS, (buf[m + M_STATUS] & 0x80) << 8 | status if dr_route else status)
        return None

    # ------------------------------------------------------------------ M_Key

    def _mkey_port(self, ingress: int) -> Port:
        """The port whose M_Key guards an SMP arriving on ``ingress``: a switch has one M_Key,
        in port 0's PortInfo; a CA port has its own."""
        return self.ports[0] if self.IS_SWITCH else self.ports[ingress]

    def _mkey_check(self, buf: bytearray, m: int, ingress: int, *,
                    dr_route: bool) -> tuple[bool, bool, list[Action]]:
        """The M_Key check of a SubnGet/SubnSet/SubnTrapRepress in ``buf`` (module docstring of
        ``ibemu.agents.port``): (refused, hide the M_Key in a PortInfo answer, actions)."""
        num = 0 if self.IS_SWITCH else ingress
        p = self.ports[num]
        if not p.m_key and not p.m_key_lease_deadline:
            return False, False, []  # no key: every SMP passes (the default, at no cost)
        actions: list[Action] = []
        now = self.clock()
        if p.m_key_lease_deadline and p.m_key_lease_deadline <= now:
            actions += self._lease_expired(num, p)
        method = buf[m + M_METHOD]
        key = _U64.unpack_from(buf, m + SMP_M_KEY)[0]
        if not p.m_key or key == p.m_key:
            if p.m_key_lease_deadline:  # the key's holder is alive: the lease stops
                p.m_key_lease_deadline = 0
                self._leases.discard(num)
                self.stats["mkey_lease_stopped"] += 1
                actions += [MKeyChange(num), self._event("mkey_lease_stopped", port=num)]
            return False, False, actions
        if method == GET and p.m_key_protect < 2:
            self.stats["mkey_get_open"] += 1
            return False, p.m_key_protect == 1, actions
        return True, False, actions + self._mkey_violation(num, p, buf, m, ingress, key, dr_route, now)

    def _mkey_violation(self, num: int, p: Port, buf: bytearray, m: int, ingress: int, key: int,
                        dr_route: bool, now: int) -> list[Action]:
        """A request failed the M_Key check: no response; M_KeyViolations counts it, the lease
        countdown starts (if a lease period is set and none runs), trap 256 goes to the SM."""
        p.m_key_violations = min(p.m_key_violations + 1, 0xFFFF)
        self.stats["mkey_violations"] += 1
        if p.m_key_lease_period and not p.m_key_lease_deadline:
            p.m_key_lease_deadline = now + p.m_key_lease_period * 1_000_000_000
            self._leases.add(num)
        method = buf[m + M_METHOD]
        attr = (buf[m + M_ATTR_ID] << 8) | buf[m + M_ATTR_ID + 1]
        mod = _U32.unpack_from(buf, m + M_ATTR_MOD)[0]
        slid = (buf[6] << 8) | buf[7]
        actions: list[Action] = [
            MKeyChange(num),
            self._event("mkey_violation", port=ingress, method=method, attr=attr, modifier=mod,
                        slid=slid, m_key=f"{key:#x}", protect=p.m_key_protect,
                        violations=p.m_key_violations, lease_s=p.m_key_lease_period)]
        if not p.lid or not p.master_sm_lid:
            self.stats["trap_not_configured"] += 1
            return actions
        hops = buf[m + 7] if dr_route else None
        notice = notice_trap256(
            producer=self.NODE_TYPE, issuer_lid=p.lid, lidaddr=slid,
            dr_slid=_U16.unpack_from(buf, m + 32)[0] if dr_route else 0, method=method,
            attr_id=attr, attr_mod=mod, m_key=key, dr_hop_count=hops,
            dr_return_path=bytes(buf[m + 192 : m + 256]) if dr_route else b"")
        return actions + self._raise_trap(TRAP_BAD_M_KEY, notice, num, port=ingress, why="bad_m_key")

    def _lease_expired(self, num: int, p: Port) -> list[Action]:
        """The lease ran out with no valid key seen: the protect bits go to 0 (the M_Key stays)."""
        p.m_key_lease_deadline = 0
        self._leases.discard(num)
        before, p.m_key_protect = p.m_key_protect, 0
        self.stats["mkey_lease_expired"] += 1
        return [MKeyChange(num), self._event("mkey_lease_expired", port=num, protect_before=before)]

    def _key_actions(self, actions: list[Action]) -> None:
        """Actions of a passed M_Key check (a lease stopped or expired) while the SMP goes on
        to its handler: queued with the handler's, after the response."""
        self._pending_actions += actions

    # ------------------------------------------------------------------ traps

    def _raise_trap(self, number: int, notice: bytes, num: int, *, port: int, why: str) -> list[Action]:
        """Send a trap from port ``num``'s LID to its MasterSMLID, repeated until repressed."""
        self._trap_tid += 1
        # low 32 bits unique per node (a TrapRepress may carry only those)
        tid = (self.node_guid & 0xFFFF) << 32 | (self._trap_tid & 0xFFFFFFFF)
        now = self.clock()
        trap = self.traps.add(tid, number, notice, now, port=num)
        return self._send_trap(trap, now, repeat=False, port=port, why=why)

    def _send_trap(self, trap: PendingTrap, now: int, *, repeat: bool, port: int | None = None,
                   why: str = "") -> list[Action]:
        src = self.ports[trap.port]
        self.traps.sent(trap, now)
        sm_lid = src.master_sm_lid
        egress = self._route_lid(sm_lid, trap.port, vl15=True) if src.lid and sm_lid else 0
        if not egress:
            self.stats["trap_no_route"] += 1
            return [self._event("trap_unroutable", tid=trap.tid, trap_number=trap.trap_number, sm_lid=sm_lid)]
        mad = bytearray(256)
        _TRAP_HEAD.pack_into(mad, 0, 1, CLASS_SMP_LR, 1, TRAP, 0, 0, trap.tid, ATTR_NOTICE, 0, 0)
        _U64.pack_into(mad, SMP_M_KEY, src.m_key)
        mad[SMP_DATA : SMP_DATA + 64] = trap.notice
        pkt = self._build(mad, dlid=sm_lid, slid=src.lid, dqp=0, sqp=0, vl=VL15)
        if self.count_own_traffic:
            self.ports[egress].counters.add_tx(len(pkt))
        self.stats["trap_repeats" if repeat else "traps_sent"] += 1
        _g, number, issuer = notice_fields(trap.notice)
        fields: dict[str, object] = {"tid": trap.tid, "trap_number": number, "issuer_lid": issuer,
                                     "sm_lid": sm_lid, "egress": egress, "repeat": repeat}
        if port is not None:
            fields.update(port=port, why=why)
        return [Send(egress, pkt), self._event("trap_sent", **fields)]

    def _attr_node_description(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        if method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self._node_description
        return ST_OK

    def _attr_node_info(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        if method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self.node_info(ingress)
        return ST_OK

    def _attr_guid_info(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        if method != GET:
            return ST_BAD_METHOD_ATTR
        if mod != 0:
            return ST_INVALID
        buf[d : d + 64] = self.port_guid(ingress).to_bytes(8, "big").ljust(64, b"\0")
        return ST_OK

    def _pi_port(self, mod: int, ingress: int) -> int | None:
        """The port a PortInfo-style modifier names (None if invalid)."""
        mod &= 0x7FFFFFFF  # bit 31 is not a port number (ibsim masks it too)
        num = mod if mod <= 0xFF else -1
        if not self.IS_SWITCH and num == 0:
            num = ingress
        return num if num in self.ports else None

    def _attr_port_info(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        num = self._pi_port(mod, ingress)
        if num is None:
            return ST_INVALID
        p = self.ports[num]
        status = ST_OK
        if method == SET:
            if not self.IS_SWITCH and num != ingress:
                return ST_INVALID
            outcome = p.apply_set(buf[d : d + 64])
            status = outcome.status
            if not status:
                self._after_port_set(num, p, outcome)
        buf[d : d + 64] = p.encode(ingress)
        return status

    def _after_port_set(self, num: int, p: Port, outcome: object) -> None:
        """Subclasses queue the consequences of a PortInfo Set (state changes, requests)."""

    def _pkey_port_and_cap(self, mod: int, ingress: int) -> tuple[Port | None, int]:
        port = self.ports.get(ingress)
        return port, self.partition_cap

    def _attr_pkey_table(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        p, cap = self._pkey_port_and_cap(mod, ingress)
        block = mod & 0xFFFF
        if p is None or block * 32 >= cap:
            return ST_INVALID
        if not p.pkeys:
            p.pkeys = [0xFFFF] + [0] * (cap - 1)
        base = block * 32
        n = min(32, cap - base)
        if method == SET:
            p.pkeys[base : base + n] = list(struct.unpack_from(f"!{n}H", buf, d))
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        struct.pack_into(f"!{n}H", buf, d, *p.pkeys[base : base + n])
        buf[d + 2 * n : d + 64] = bytes(64 - 2 * n)
        return ST_OK

    def pkeys(self, port: int) -> list[int]:
        """The P_Key table of ``port`` (entry 0 = 0xFFFF by default)."""
        p, cap = self._pkey_port_and_cap(port << 16, port)
        if p is None:
            raise ValueError(f"no port {port}")
        if not p.pkeys:
            p.pkeys = [0xFFFF] + [0] * (cap - 1)
        return list(p.pkeys)

    def pkey_block(self, port: int, block: int = 0) -> bytes:
        """One P_Key block of ``port`` as 64 wire bytes (the MAD socket's GET_PKEYS)."""
        keys = self.pkeys(port)[block * 32 : block * 32 + 32]
        return struct.pack(f"!{len(keys)}H", *keys).ljust(64, b"\0")

    def _attr_sl2vl(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        """SLtoVLMappingTable: per (input port [15:8], output port [7:0]) on a switch, per port on
        a CA (the port the SMP came in on; the modifier is reserved). Stored as set; a VL at or
        beyond OperationalVLs (or VL15) is legal and means: packets of that SL are dropped there."""
        if self.IS_SWITCH:
            key = ((mod >> 8) & 0xFF, mod & 0xFF)
            if key[0] not in self.ports or key[1] not in self.ports:
                return ST_INVALID
        else:
            key = (ingress, 0)
        if method == SET:
            self._sl2vl[key] = bytes(buf[d : d + 8])
            self._qos_sets += 1
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self._sl2vl.get(key, _DEFAULT_SL2VL).ljust(64, b"\0")
        return ST_OK

    def _attr_vl_arb(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        """VLArbitrationTable: portion [31:16] (1, 2 low priority; 3, 4 high), output port
        [15:0] on a switch (a CA: the ingress port). A portion beyond the port's VLArbitrationLowCap
        / HighCap is invalid; entries beyond the cap read back as zero, the reserved nibble too."""
        block = mod >> 16
        num = (mod & 0xFFFF) if self.IS_SWITCH else ingress
        if not 1 <= block <= 4 or num not in self.ports:
            return ST_INVALID
        cap = VL_ARB_HIGH_CAP if block in VL_ARB_HIGH_BLOCKS else VL_ARB_LOW_CAP
        first = ((block - 1) % 2) * VL_ARB_BLOCK_ENTRIES
        if first >= cap:
            return ST_INVALID
        key = (num, block)
        if method == SET:
            entries = decode_vl_arb_block(buf[d : d + 64])[: cap - first]
            self._vlarb[key] = vl_arb_block(entries)
            self._qos_sets += 1
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self._vlarb.get(key, bytes(64))
        return ST_OK

    # ------------------------------------------------------------------ QoS for the datapath

    def sl2vl_map(self, in_port: int, out_port: int) -> Sl2Vl:
        """The SL -> VL map packets from ``in_port`` out of ``out_port`` take (a CA: ``out_port``'s;
        ``in_port`` is ignored), as the SM left it (the default table if never set)."""
        key = (in_port, out_port) if self.IS_SWITCH else (out_port, 0)
        return Sl2Vl(decode_sl2vl(self._sl2vl.get(key, _DEFAULT_SL2VL)))

    def vl_arbitration(self, port: int) -> VlArb:
        """The VL arbitration of ``port``'s transmitter as the SM set it: its high and low tables
        (entries of weight 0 and VL15 entries left out: the arbiter skips them) and its
        VLHighLimit. Tables never set give the link model's default, packet-by-packet round
        robin over OperationalVLs (reset contents are the vendor's choice; this is ibemu's)."""
        p = self.ports[port]
        if not any((port, b) in self._vlarb for b in (*VL_ARB_LOW_BLOCKS, *VL_ARB_HIGH_BLOCKS)):
            return VlArb.default(vls_of_code(p.operational_vls or 1))
        tables = []
        for blocks_ in (VL_ARB_HIGH_BLOCKS, VL_ARB_LOW_BLOCKS):
            entries = [e for b in blocks_ for e in decode_vl_arb_block(self._vlarb.get((port, b), bytes(64)))]
            tables.append(tuple((vl, w) for vl, w in entries if vl < 15 and w > 0))
        return VlArb(high=tables[0], low=tables[1], high_limit=p.vl_high_limit)

    def qos_version(self) -> tuple[int, ...]:
        """Changes whenever the SM changes what ``sl2vl_map``, ``vl_arbitration`` or
        ``data_vls`` return (the datapath's link model re-reads them then)."""
        return (self._qos_sets, *(p.operational_vls for p in self.ports.values()),
                *(p.vl_high_limit for p in self.ports.values()))

    def data_vls(self, port: int) -> int:
        """Data VLs ``port`` operates (PortInfo.OperationalVLs: 1, 2, 4, 8 or 15)."""
        return vls_of_code(self.ports[port].operational_vls or 1)

    def _attr_mlnx_ext_port_info(self, method: int, mod: int, buf: bytearray, d: int, ingress: int) -> int:
        """MLNXExtendedPortInfo: stored as written, all zeros (no FDR10) until then."""
        num = self._pi_port(mod, ingress)
        if num is None:
            return ST_INVALID
        if method == SET:
            self._mlnx_ext[num] = bytes(buf[d : d + 64])
        elif method != GET:
            return ST_BAD_METHOD_ATTR
        buf[d : d + 64] = self._mlnx_ext.get(num, bytes(64))
        return ST_OK

    # ------------------------------------------------------------------ GSI / PMA

    def _rx_gsi(self, port: int, p: Port, pkt: bytes) -> list[Action]:
        m = MAD_OFFSET
        if p.state not in (PortState.ARMED, PortState.ACTIVE):
            self.stats["gsi_port_not_active"] += 1
            return []
        if _U32.unpack_from(pkt, 20)[0] != GSI_QKEY:
            p.q_key_violations = min(p.q_key_violations + 1, 0xFFFF)
            self.stats["gsi_bad_qkey"] += 1
            return [self._event("rx_drop", port=port, reason="bad_qkey")]
        mclass = pkt[m + M_CLASS]
        method = pkt[m + M_METHOD]
        if method & 0x80 or mclass != CLASS_PMA:
            return self._client_mad(port, pkt, pkt[m : m + MAD_LEN])
        if method in NO_RESPONSE_METHODS:
            self.stats["gsi_unsolicited_dropped"] += 1
            return []
        buf = bytearray(pkt)
        status = self._pma(buf, m, port)
        return self._gsi_respond(buf, m, port, status)

    def _gsi_respond(self, buf: bytearray, m: int, port: int, status: int) -> list[Action]:
        """Turn the GSI request in ``buf`` into its response and route it to the requester."""
        method = buf[m + M_METHOD]
        buf[m + M_METHOD] = response_method(method)
        _U16.pack_into(buf, m + M_STATUS, status)
        slid = (buf[6] << 8) | buf[7]
        sqp = _U32.unpack_from(buf, 24)[0] & 0xFFFFFF
        egress = self._route_lid(slid, port, vl15=False)
        if not egress:
            self.stats["gsi_no_route"] += 1
            return []
        set_lrh(buf, dlid=slid, slid=self._my_lid(egress), vl=0)
        set_qps(buf, dqp=sqp, sqp=1, qkey=GSI_QKEY)
        out = reseal(buf)
        if self.count_own_traffic:
            self.ports[egress].counters.add_tx(len(out))
        return [Send(egress, out)]

    def _pma_ports(self, select: int, ingress: int) -> list[int] | None:
        """Ports a PortSelect names (None = invalid)."""
        if select == 0 and not self.IS_SWITCH:
            return [ingress]
        if select == 0xFF and self.IS_SWITCH:
            return sorted(self.ports)
        return [select] if select in self.ports else None

    def _pma(self, buf: bytearray, m: int, ingress: int) -> int:
        if buf[m + M_BASE_VERSION] != 1 or buf[m + M_CLASS_VERSION] != 1:
            return ST_BAD_VERSION
        method = buf[m + M_METHOD]
        if method not in (GET, SET):
            return ST_BAD_METHOD
        attr = (buf[m + M_ATTR_ID] << 8) | buf[m + M_ATTR_ID + 1]
        d = m + PMA_DATA
        if attr == ATTR_CLASS_PORT_INFO:
            if method != GET:
                return ST_BAD_METHOD_ATTR
            cap = PMA_CAP_EXT_WIDTH | PMA_CAP_XMIT_WAIT
            if self.IS_SWITCH:
                cap |= PMA_CAP_ALL_PORT_SELECT
            buf[d : d + 192] = class_port_info(capability_mask=cap, capability_mask2=PMA_CAP2)
            return ST_OK
        if attr not in (ATTR_PORT_COUNTERS, ATTR_PORT_COUNTERS_EXT, ATTR_PORT_RCV_ERROR_DETAILS,
                        ATTR_PORT_XMIT_DISCARD_DETAILS):
            return ST_BAD_METHOD_ATTR
        select = buf[d + 1]
        nums = self._pma_ports(select, ingress)
        if nums is None:
            return ST_INVALID
        data = bytes(buf[d : d + 192])
        counter_select = _U16.unpack_from(data, 2)[0]
        if self.link_counters is not None:
            self.link_counters(nums)
        if method == SET:
            for num in nums:
                pc = self.ports[num].counters
                if attr == ATTR_PORT_COUNTERS:
                    pc.set_basic(data)
                elif attr == ATTR_PORT_COUNTERS_EXT:
                    pc.set_extended(data)
                else:
                    pc.set_details(attr, data)
        pcs = [self.ports[num].counters for num in nums]
        view = pcs[0] if len(pcs) == 1 else PortCounters.total(pcs)
        if attr == ATTR_PORT_COUNTERS:
            buf[d : d + 192] = view.encode_basic(select, counter_select)
        elif attr == ATTR_PORT_COUNTERS_EXT:
            buf[d : d + 192] = view.encode_extended(select, counter_select, int.from_bytes(data[4:8], "big"))
        else:
            buf[d : d + 192] = view.encode_details(attr, select, counter_select)
        return ST_OK

    # ================================================================== helpers

    def _external_port(self, port: int) -> Port:
        p = self.ports.get(port)
        if p is None or (self.IS_SWITCH and port == 0):
            raise ValueError(f"node {self.node_guid:#x} has no physical port {port}")
        return p

    def _event(self, kind: str, **fields: object) -> Event:
        return Event(kind, self.clock(), self.node_guid, fields)

    def _next_psn(self) -> int:
        self._psn = (self._psn + 1) & 0xFFFFFF
        return self._psn

    def _build(self, mad: bytes | bytearray, *, dlid: int, slid: int, dqp: int, sqp: int,
               vl: int, sl: int = 0, pkey: int = 0xFFFF, qkey: int | None = None) -> bytes:
        if qkey is None:
            qkey = QP0_QKEY if dqp == 0 else GSI_QKEY
        return frame_mad(mad, dlid=dlid, slid=slid, dqp=dqp, sqp=sqp, qkey=qkey, vl=vl, sl=sl,
                         pkey=pkey, psn=self._next_psn())


def make_ports(count: int, first: int, *, is_switch: bool, link_up: Sequence[bool] | None,
               width: int, speed: str, mtu: int, capability_mask: int) -> dict[int, Port]:
    """Ports ``first`` .. ``first+count-1``, physically up where ``link_up`` says so."""
    ports: dict[int, Port] = {}
    ups = list(link_up) if link_up is not None else [False] * count
    if len(ups) != count:
        raise ValueError(f"link_up lists {len(ups)} ports, the device has {count}")
    for i in range(count):
        p = Port(first + i, is_switch=is_switch, width=width, speed=speed, mtu=mtu,
                 capability_mask=capability_mask)
        if ups[i]:
            p.physical_up()
        ports[first + i] = p
    return ports
