"""scapy layers for native InfiniBand packets: LRH, GRH, BTH and the extended transport headers.

Field names are the IBA spec's names in snake_case (``PktLen`` -> ``pktlen``, ``DestQP`` ->
``destqp``). A whole native packet dissects from its LRH::

    pkt = LRH(raw_bytes)             # LRH / [GRH] / BTH / [ext headers] / payload
    raw(LRH(dlid=4, slid=1) / BTH(opcode=0x0A, destqp=0x12) / RETH(dmalen=4) / Raw(b"data"))

Building fills ``pktlen`` (LRH), ``padcnt`` (BTH, with the pad bytes), ``paylen`` (GRH), the
ICRC and the VCRC, unless they are set explicitly. The two CRCs are trailer fields of the
LRH: on the wire they follow the payload and pad. Layout: ../shared/ref/ib-wire.md.
"""

from __future__ import annotations

import struct
from typing import Any

from scapy.contrib import roce as scapy_roce
from scapy.fields import (
    BitEnumField,
    BitField,
    ByteEnumField,
    Field,
    IntField,
    ShortField,
    XBitField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers, split_layers

from ibemu.wire import crc as _crc
from ibemu.wire import scapy_setup  # noqa: F401 - before any frame is built
from ibemu.wire.opcodes import (
    CNP_OPCODE,
    OPCODE_NAMES,
    header_chain,
    is_ud,
)

ETHERTYPE_IB = 0x88B5
"""IEEE 802 local experimental ethertype carrying a whole native IB packet (LRH .. VCRC)."""

LNH_NAMES = {0: "raw", 1: "ip_non_iba", 2: "iba_local", 3: "iba_global"}
GRH_NXTHDR_BTH = 0x1B


class LETrailerField(Field[int | None, int]):
    """A CRC written least-significant byte first; the LRH moves it behind the payload."""

    def __init__(self, name: str, default: int | None, size: int) -> None:
        super().__init__(name, default, "<I" if size == 4 else "<H")

    def i2repr(self, pkt: Packet | None, x: Any) -> str:
        return "None" if x is None else f"{x:#0{2 + 2 * self.sz}x}"


class LRH(Packet):
    """Local Route Header; also holds the packet's ICRC and VCRC (its trailer)."""

    name = "LRH"
    fields_desc = [
        BitField("vl", 0, 4),
        BitField("lver", 0, 4),
        BitField("sl", 0, 4),
        BitField("rsv2", 0, 2),
        BitEnumField("lnh", 2, 2, LNH_NAMES),
        XShortField("dlid", 0),
        BitField("rsv5", 0, 5),
        BitField("pktlen", None, 11),
        XShortField("slid", 0),
        LETrailerField("icrc", None, 4),
        LETrailerField("vcrc", None, 2),
    ]

    # Dissection reorders the bytes as header | ICRC | VCRC | body | extra so the fields above
    # read in order; post_build puts them back where the wire has them.
    def pre_dissect(self, s: bytes) -> bytes:
        if len(s) < _crc.LRH_LEN:
            return s
        pktlen = struct.unpack_from("!H", s, 4)[0] & 0x7FF
        end = pktlen * 4
        lnh = s[1] & 0x03
        trailer_len = _crc.VCRC_LEN + (0 if lnh < 2 else _crc.ICRC_LEN)
        if end < _crc.LRH_LEN + trailer_len - _crc.VCRC_LEN or end + _crc.VCRC_LEN > len(s):
            end = len(s) - _crc.VCRC_LEN  # inconsistent PktLen: take the CRCs from the end
            if end < _crc.LRH_LEN + trailer_len - _crc.VCRC_LEN:
                return s
        body_end = end - (trailer_len - _crc.VCRC_LEN)
        icrc = s[body_end:end] if lnh >= 2 else b"\0\0\0\0"
        self._ib_no_icrc = lnh < 2
        self._ib_body_len = body_end - _crc.LRH_LEN
        return s[: _crc.LRH_LEN] + icrc + s[end : end + _crc.VCRC_LEN] + s[_crc.LRH_LEN : body_end] + s[end + 2 :]

    def post_dissect(self, s: bytes) -> bytes:
        self.raw_packet_cache = None  # the trailer must be rebuilt by post_build
        if getattr(self, "_ib_no_icrc", False):
            self.icrc = None
        return s

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        n = getattr(self, "_ib_body_len", None)
        if n is None:
            return s, None
        return s[:n], (s[n:] or None)

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        hdr = bytearray(p[: _crc.LRH_LEN])
        lnh = hdr[1] & 0x03
        has_icrc = lnh >= 2
        body = bytes(hdr) + pay
        if self.pktlen is None:
            words = (len(body) + (_crc.ICRC_LEN if has_icrc else 0)) // 4
            hdr[4] = (hdr[4] & 0xF8) | ((words >> 8) & 0x07)
            hdr[5] = words & 0xFF
            body = bytes(hdr) + pay
        if has_icrc:
            icrc = self.icrc if self.icrc is not None else _crc.icrc_native(body)
            body += _crc.pack_icrc(icrc)
        vcrc = self.vcrc if self.vcrc is not None else _crc.vcrc(body)
        return body + _crc.pack_vcrc(vcrc)

    def mysummary(self) -> str:
        return self.sprintf("LRH %LRH.slid% > %LRH.dlid% VL%LRH.vl% SL%LRH.sl%")


class GRH(Packet):
    """Global Route Header (40 bytes, IPv6-like)."""

    name = "GRH"
    fields_desc = [
        BitField("ipver", 6, 4),
        BitField("tclass", 0, 8),
        XBitField("flowlabel", 0, 20),
        ShortField("paylen", None),
        ByteEnumField("nxthdr", GRH_NXTHDR_BTH, {GRH_NXTHDR_BTH: "BTH"}),
        BitField("hoplmt", 0, 8),
        XBitField("sgid", 0, 128),
        XBitField("dgid", 0, 128),
    ]

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        if self.paylen is None:
            under = self.underlayer
            icrc = _crc.ICRC_LEN if isinstance(under, LRH) else 0
            p = p[:4] + struct.pack("!H", len(pay) + icrc) + p[6:]
        return p + pay


class BTH(Packet):
    """Base Transport Header of a native packet (RoCEv2 uses scapy.contrib.roce.BTH)."""

    name = "BTH"
    fields_desc = [
        ByteEnumField("opcode", 0, OPCODE_NAMES),
        BitField("se", 0, 1),
        BitField("m", 0, 1),
        BitField("padcnt", None, 2),
        BitField("tver", 0, 4),
        XShortField("pkey", 0xFFFF),
        BitField("fecn", 0, 1),
        BitField("becn", 0, 1),
        BitField("resv6", 0, 6),
        XBitField("destqp", 0, 24),
        BitField("ackreq", 0, 1),
        BitField("resv7", 0, 7),
        BitField("psn", 0, 24),
    ]

    def post_dissect(self, s: bytes) -> bytes:
        self.raw_packet_cache = None  # rebuild re-adds the pad bytes in post_build
        return s

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        n = self.padcnt or 0
        if 0 < n <= len(s):
            self._ib_pad = s[-n:]
            return s[:-n], None
        return s, None

    def post_build(self, p: bytes, pay: bytes) -> bytes:
        if self.padcnt is None:
            n = -len(pay) % 4
            p = p[:1] + bytes([(p[1] & 0xCF) | (n << 4)]) + p[2:]
            return p + pay + b"\0" * n
        n = self.padcnt
        pad = getattr(self, "_ib_pad", b"")
        return p + pay + (pad if len(pad) == n else b"\0" * n)

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return next_header(self, type(self))

    def mysummary(self) -> str:
        return self.sprintf("BTH %BTH.opcode% QP=%BTH.destqp% PSN=%BTH.psn%")


_BTH_TYPES: tuple[type[Packet], ...] = (BTH, scapy_roce.BTH)


def _enclosing_bth(layer: Packet) -> Packet | None:
    p: Packet | None = layer
    while p is not None and not isinstance(p, _BTH_TYPES):
        p = p.underlayer
    return p


def next_header(layer: Packet, current: type[Packet]) -> type[Packet]:
    """The class of the header after ``current`` in the chain its BTH opcode prescribes."""
    bth = _enclosing_bth(layer)
    if bth is None:
        return Raw
    opcode = bth.opcode
    chain = header_chain(opcode)
    classes = [EXT_HEADERS[name] for name in chain]
    if current in _BTH_TYPES:
        idx = 0
    else:
        try:
            idx = classes.index(current) + 1
        except ValueError:
            return Raw
    if idx < len(classes):
        return classes[idx]
    destqp = getattr(bth, "destqp", getattr(bth, "dqpn", None))
    if is_ud(opcode) and destqp in (0, 1) and _mad_class is not None:
        return _mad_class
    return Raw


class _ExtHeader(Packet):
    """An extended transport header: its successor is decided by the BTH opcode."""

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return next_header(self, type(self))

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        return s, None


class RDETH(_ExtHeader):
    """Reliable Datagram Extended Transport Header."""

    name = "RDETH"
    fields_desc = [BitField("rsv8", 0, 8), XBitField("eecnxt", 0, 24)]


class DETH(_ExtHeader):
    """Datagram Extended Transport Header (UD: Q_Key, source QP)."""

    name = "DETH"
    fields_desc = [XIntField("qkey", 0), BitField("rsv8", 0, 8), XBitField("srcqp", 0, 24)]


class RETH(_ExtHeader):
    """RDMA Extended Transport Header."""

    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dmalen", 0)]


class AETH(_ExtHeader):
    """ACK Extended Transport Header (syndrome, MSN)."""

    name = "AETH"
    fields_desc = [XBitField("syndrome", 0, 8), BitField("msn", 0, 24)]


class AtomicETH(_ExtHeader):
    """Atomic Extended Transport Header (CmpSwap / FetchAdd)."""

    name = "AtomicETH"
    fields_desc = [
        XLongField("va", 0),
        XIntField("rkey", 0),
        XLongField("swap_add_data", 0),
        XLongField("compare_data", 0),
    ]


class AtomicAckETH(_ExtHeader):
    """Atomic ACK Extended Transport Header (original remote data)."""

    name = "AtomicAckETH"
    fields_desc = [XLongField("orig_rem_dt", 0)]


class ImmDt(_ExtHeader):
    """Immediate Data Extended Transport Header."""

    name = "ImmDt"
    fields_desc = [XIntField("immediate_data", 0)]


class IETH(_ExtHeader):
    """Invalidate Extended Transport Header (R_Key to invalidate)."""

    name = "IETH"
    fields_desc = [XIntField("rkey", 0)]


EXT_HEADERS: dict[str, type[Packet]] = {
    "RDETH": RDETH,
    "DETH": DETH,
    "RETH": RETH,
    "AETH": AETH,
    "AtomicETH": AtomicETH,
    "AtomicAckETH": AtomicAckETH,
    "ImmDt": ImmDt,
    "IETH": IETH,
}

# The MAD layer registers itself here (ibemu.wire.mad) to keep this module free of MAD details.
_mad_class: type[Packet] | None = None


def register_mad_class(cls: type[Packet]) -> None:
    """Called by ibemu.wire.mad: UD payloads to QP0/QP1 dissect as that class."""
    global _mad_class
    _mad_class = cls


bind_layers(Ether, LRH, type=ETHERTYPE_IB)
bind_layers(LRH, BTH, lnh=2)
bind_layers(LRH, GRH, lnh=3)
bind_layers(GRH, BTH, nxthdr=GRH_NXTHDR_BTH)

# RoCEv2: scapy.contrib.roce owns UDP 4791, its BTH (with the ICRC) and the CNP body. Its
# AETH binding covers ACKs only; replace it with the full set of extended headers.
split_layers(scapy_roce.BTH, scapy_roce.AETH)
for _opcode in OPCODE_NAMES:
    _chain = header_chain(_opcode)
    if _chain and _opcode != CNP_OPCODE:
        bind_layers(scapy_roce.BTH, EXT_HEADERS[_chain[0]], opcode=_opcode)
