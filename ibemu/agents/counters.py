"""PMA port counters: 64-bit accumulators, shown through the spec's saturating fields.

One ``PortCounters`` per port. Data counters accumulate octets (LRH .. VCRC); PortCounters
(0x12) reports octets/4 in 32-bit fields that saturate at 0xFFFFFFFF (never wrap), error
counters saturate at their field width; PortCountersExtended (0x1D) reports the same
accumulators as 64-bit values, and the error counters too, 64 bits wide from byte 72 (IBA
1.3's additional extended counters; cleared by CounterSelect2). The PMA does not advertise
those (see ``ibemu.agents.device.PMA_CAP2_ADDL_PORT_COUNTERS_EXT``: the tools' MAD shim cuts
them off), so tools read the errors from PortCounters. A Set with CounterSelect writes the selected counters (tools
write zeros: that is how counters are cleared); both views share the accumulators.

A port whose frames the kernel carries without the agent (tc forwarding, an HCA transport's
own socket) takes its packet and octet counters from the cable's interface statistics
(``follow_link``): everything that crossed the cable, since power-up or the last clear.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

ATTR_PORT_COUNTERS = 0x0012
ATTR_PORT_COUNTERS_EXT = 0x001D
ATTR_PORT_RCV_ERROR_DETAILS = 0x0015
ATTR_PORT_XMIT_DISCARD_DETAILS = 0x0016

DETAIL_FIELDS: dict[int, tuple[str | None, ...]] = {
    ATTR_PORT_RCV_ERROR_DETAILS: ("port_local_physical_errors", "port_malformed_packet_errors",
                                  None, None, None, None),  # BufferOverrun, DLIDMapping, VLMapping, Looping
    ATTR_PORT_XMIT_DISCARD_DETAILS: ("port_inactive_discards", None, None, None),  # NeighborMTU, SwLifetime, SwHOQ
}
"""PortRcvErrorDetails / PortXmitDiscardDetails: 16-bit counters from byte 4, bit i of
CounterSelect for the i-th. None: a cause ibemu never has (its switches keep no packet
lifetime, drop nothing for MTU, map every DLID their LFT has and loop nothing it programs),
always 0. What they break down: PortRcvErrors (a bad CRC: LocalPhysical, a bad length or
header: Malformed) and PortXmitDiscards (frames for a port whose link is down: Inactive)."""

# PortCounters (0x12) fields: (name, byte offset, width in bits, CounterSelect bit)
# Widths of 4 share byte 19 (LocalLinkIntegrityErrors high nibble, ExcessiveBufferOverrun low).
BASIC_FIELDS: tuple[tuple[str, int, int, int], ...] = (
    ("symbol_error_counter", 4, 16, 0),
    ("link_error_recovery_counter", 6, 8, 1),
    ("link_downed_counter", 7, 8, 2),
    ("port_rcv_errors", 8, 16, 3),
    ("port_rcv_remote_physical_errors", 10, 16, 4),
    ("port_rcv_switch_relay_errors", 12, 16, 5),
    ("port_xmit_discards", 14, 16, 6),
    ("port_xmit_constraint_errors", 16, 8, 7),
    ("port_rcv_constraint_errors", 17, 8, 8),
    ("local_link_integrity_errors", 19, 4, 9),
    ("excessive_buffer_overrun_errors", 19, 4, 10),
    ("qp1_dropped", 20, 16, -1),  # no CounterSelect bit: never cleared by a Set
    ("vl15_dropped", 22, 16, 11),
)
_DATA = struct.Struct("!IIIII")  # XmitData RcvData XmitPkts RcvPkts XmitWait at 24
_EXT = struct.Struct("!BBHIQQQQQQQQ")
EXT_ERROR_FIELDS: tuple[str, ...] = (
    "symbol_error_counter", "link_error_recovery_counter", "link_downed_counter", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "vl15_dropped", "port_xmit_wait", "qp1_dropped",
)
"""PortCountersExtended's additional counters, 64 bits each from byte 72, in order; bit i of
CounterSelect2 selects the i-th (QP1Dropped has none)."""
_EXT_ERRORS = struct.Struct(f"!{len(EXT_ERROR_FIELDS)}Q")
EXT_ERRORS_OFFSET = 72
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF

ERROR_COUNTERS = tuple(f[0] for f in BASIC_FIELDS)
LINK_COUNTERS = ("xmit_octets", "rcv_octets", "xmit_pkts", "rcv_pkts")
"""The counters ``follow_link`` takes from the kernel, in the order of its arguments."""
ETHERNET_OVERHEAD = 14
"""Bytes of Ethernet header per frame the kernel counts and the IB octet counters do not."""


class PortCounters:
    """Counters of one port; add with ``add_rx``/``add_tx``/``add``, read with ``encode_*``."""

    __slots__ = (
        "_link_base", "_link_now", "excessive_buffer_overrun_errors", "link_downed_counter", "link_error_recovery_counter",
        "local_link_integrity_errors", "multicast_rcv_pkts", "multicast_xmit_pkts",
        "port_inactive_discards", "port_local_physical_errors", "port_malformed_packet_errors",
        "port_rcv_constraint_errors", "port_rcv_errors", "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors", "port_xmit_constraint_errors", "port_xmit_discards",
        "port_xmit_wait", "qp1_dropped", "rcv_octets", "rcv_pkts", "symbol_error_counter",
        "vl15_dropped", "xmit_octets", "xmit_pkts",
    )
    NAMES: tuple[str, ...] = tuple(n for n in __slots__ if not n.startswith("_"))

    def __init__(self) -> None:
        self.excessive_buffer_overrun_errors: int = 0
        self.link_downed_counter: int = 0
        self.link_error_recovery_counter: int = 0
        self.local_link_integrity_errors: int = 0
        self.multicast_rcv_pkts: int = 0
        self.multicast_xmit_pkts: int = 0
        self.port_rcv_constraint_errors: int = 0
        self.port_rcv_errors: int = 0
        self.port_inactive_discards: int = 0
        self.port_local_physical_errors: int = 0
        self.port_malformed_packet_errors: int = 0
        self.port_rcv_remote_physical_errors: int = 0
        self.port_rcv_switch_relay_errors: int = 0
        self.port_xmit_constraint_errors: int = 0
        self.port_xmit_discards: int = 0
        self.port_xmit_wait: int = 0
        self.qp1_dropped: int = 0
        self.rcv_octets: int = 0
        self.rcv_pkts: int = 0
        self.symbol_error_counter: int = 0
        self.vl15_dropped: int = 0
        self.xmit_octets: int = 0
        self.xmit_pkts: int = 0
        self._link_now: list[int] | None = None
        self._link_base: list[int] = [0, 0, 0, 0]

    def follow_link(self, tx_bytes: int, rx_bytes: int, tx_packets: int, rx_packets: int) -> None:
        """Take the packet and octet counters from the cable's kernel totals (Ethernet header
        excluded). The first call keeps the counts so far (the kernel may have counted frames
        of a previous life of this port: a rebooted switch starts from what it had)."""
        now = [tx_bytes - ETHERNET_OVERHEAD * tx_packets, rx_bytes - ETHERNET_OVERHEAD * rx_packets,
               tx_packets, rx_packets]
        if self._link_now is None:
            self._link_base = [n - getattr(self, name) for n, name in zip(now, LINK_COUNTERS, strict=True)]
        self._link_now = now
        for i, name in enumerate(LINK_COUNTERS):
            setattr(self, name, max(0, now[i] - self._link_base[i]))

    def _written(self, name: str, value: int) -> None:
        """A Set wrote ``value`` to ``name``: a kernel-backed counter restarts from it."""
        setattr(self, name, value)
        if self._link_now is not None and name in LINK_COUNTERS:
            i = LINK_COUNTERS.index(name)
            self._link_base[i] = self._link_now[i] - value

    def add_rx(self, nbytes: int) -> None:
        self.rcv_pkts += 1
        self.rcv_octets += nbytes

    def add_tx(self, nbytes: int) -> None:
        self.xmit_pkts += 1
        self.xmit_octets += nbytes

    def add(self, **deltas: int) -> None:
        """Add to counters by name (``rcv_pkts=3, rcv_octets=4096, port_rcv_errors=1``)."""
        for name, value in deltas.items():
            if name not in self.NAMES:
                raise KeyError(f"no port counter named {name!r}")
            if value < 0:
                raise ValueError(f"counter deltas are non-negative, {name}={value}")
            setattr(self, name, min(getattr(self, name) + value, _U64_MAX))

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.NAMES}

    @classmethod
    def total(cls, many: Iterable[PortCounters]) -> PortCounters:
        """Sum of several ports' counters (PortSelect 0xFF on a switch)."""
        out = cls()
        for pc in many:
            for name in cls.NAMES:
                setattr(out, name, min(getattr(out, name) + getattr(pc, name), _U64_MAX))
        return out

    # ------------------------------------------------------------------ PortCounters (0x12)

    def encode_basic(self, port_select: int, counter_select: int = 0) -> bytes:
        """The 192-byte PMA data area of a PortCounters GetResp."""
        out = bytearray(192)
        out[1] = port_select & 0xFF
        struct.pack_into("!H", out, 2, counter_select & 0xFFFF)
        for name, off, width, _bit in BASIC_FIELDS:
            value = min(getattr(self, name), (1 << width) - 1)
            if width == 16:
                struct.pack_into("!H", out, off, value)
            elif width == 8:
                out[off] = value
            elif name == "local_link_integrity_errors":
                out[off] |= value << 4
            else:
                out[off] |= value
        _DATA.pack_into(out, 24, min(self.xmit_octets // 4, _U32_MAX),
                        min(self.rcv_octets // 4, _U32_MAX), min(self.xmit_pkts, _U32_MAX),
                        min(self.rcv_pkts, _U32_MAX), min(self.port_xmit_wait, _U32_MAX))
        return bytes(out)

    def set_basic(self, data: bytes | bytearray | memoryview) -> None:
        """Apply a PortCounters Set: each counter selected in CounterSelect takes the given value."""
        select = struct.unpack_from("!H", data, 2)[0]
        select2 = data[18]
        for name, off, width, bit in BASIC_FIELDS:
            if bit < 0 or not select & (1 << bit):
                continue
            if width == 16:
                value = struct.unpack_from("!H", data, off)[0]
            elif width == 8:
                value = data[off]
            elif name == "local_link_integrity_errors":
                value = data[off] >> 4
            else:
                value = data[off] & 0x0F
            setattr(self, name, value)
        xd, rd, xp, rp, xw = _DATA.unpack_from(data, 24)
        if select & (1 << 12):
            self._written("xmit_octets", xd * 4)
        if select & (1 << 13):
            self._written("rcv_octets", rd * 4)
        if select & (1 << 14):
            self._written("xmit_pkts", xp)
        if select & (1 << 15):
            self._written("rcv_pkts", rp)
        if select2 & 1:
            self.port_xmit_wait = xw

    # --------------------------------------- PortRcvErrorDetails, PortXmitDiscardDetails

    def encode_details(self, attr: int, port_select: int, counter_select: int = 0) -> bytes:
        out = bytearray(192)
        out[1] = port_select & 0xFF
        struct.pack_into("!H", out, 2, counter_select & 0xFFFF)
        for i, name in enumerate(DETAIL_FIELDS[attr]):
            if name is not None:
                struct.pack_into("!H", out, 4 + 2 * i, min(getattr(self, name), 0xFFFF))
        return bytes(out)

    def set_details(self, attr: int, data: bytes | bytearray | memoryview) -> None:
        select = struct.unpack_from("!H", data, 2)[0]
        for i, name in enumerate(DETAIL_FIELDS[attr]):
            if name is not None and select & (1 << i):
                setattr(self, name, struct.unpack_from("!H", data, 4 + 2 * i)[0])

    # ---------------------------------------------------------- PortCountersExtended (0x1D)

    def encode_extended(self, port_select: int, counter_select: int = 0, counter_select2: int = 0) -> bytes:
        out = bytearray(192)
        _EXT.pack_into(out, 0, 0, port_select & 0xFF, counter_select & 0xFFFF, counter_select2 & 0xFFFFFFFF,
                       self.xmit_octets // 4, self.rcv_octets // 4, self.xmit_pkts, self.rcv_pkts,
                       self.xmit_pkts - self.multicast_xmit_pkts,
                       self.rcv_pkts - self.multicast_rcv_pkts,
                       self.multicast_xmit_pkts, self.multicast_rcv_pkts)
        _EXT_ERRORS.pack_into(out, EXT_ERRORS_OFFSET, *(min(getattr(self, n), _U64_MAX) for n in EXT_ERROR_FIELDS))
        return bytes(out)

    def set_extended(self, data: bytes | bytearray | memoryview) -> None:
        _r, _ps, select, select2, xd, rd, xp, rp, _ux, _ur, mx, mr = _EXT.unpack_from(data, 0)
        values = _EXT_ERRORS.unpack_from(data, EXT_ERRORS_OFFSET)
        for bit, name in enumerate(EXT_ERROR_FIELDS[:-1]):  # QP1Dropped: no select bit
            if select2 & (1 << bit):
                setattr(self, name, values[bit])
        if select & 1:
            self._written("xmit_octets", xd * 4)
        if select & 2:
            self._written("rcv_octets", rd * 4)
        if select & 4:
            self._written("xmit_pkts", xp)
        if select & 8:
            self._written("rcv_pkts", rp)
        if select & 0x40:
            self.multicast_xmit_pkts = mx
        if select & 0x80:
            self.multicast_rcv_pkts = mr
