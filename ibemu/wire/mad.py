"""Management datagrams: the MAD common header, SMPs (LID-routed and directed-route), PMA.

Every MAD is 256 bytes carried in a UD SEND Only to QP0 (SMPs) or QP1 (GSI classes).
``MAD(raw)`` dispatches on the management class: 0x01 -> ``SMP``, 0x81 ->
``DirectedRouteSMP``, 0x04 -> ``PMA``, anything else stays a generic ``MAD`` whose 232 data
bytes are Raw. SMP attributes live in the 64-byte ``data`` field, chosen by ``attribute_id``
(left as None it is taken from the attribute's class). Layout: ../shared/ref/ib-wire.md.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, ClassVar

from scapy.fields import (
    BitEnumField,
    BitField,
    ByteEnumField,
    ByteField,
    Field,
    FieldListField,
    IntField,
    ShortEnumField,
    ShortField,
    StrFixedLenField,
    X3BytesField,
    XBitField,
    XByteField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.packet import Packet, Raw

from ibemu.wire.ib import register_mad_class

SMP_DATA_OFFSET = 64
SMP_DATA_LEN = 64
PMA_DATA_OFFSET = 64
PMA_DATA_LEN = 192
GSI_QKEY = 0x80010000


class MgmtClass(IntEnum):
    SUBN_LID_ROUTED = 0x01
    SUBN_ADM = 0x03
    PERF_MGT = 0x04
    BM = 0x05
    DEV_MGT = 0x06
    COMM_MGT = 0x07
    SNMP = 0x08
    SUBN_DIRECTED_ROUTE = 0x81


class Method(IntEnum):
    GET = 0x01
    SET = 0x02
    SEND = 0x03
    TRAP = 0x05
    REPORT = 0x06
    TRAP_REPRESS = 0x07
    GET_TABLE = 0x12
    GET_RESP = 0x81
    REPORT_RESP = 0x86
    GET_TABLE_RESP = 0x92


class AttrId(IntEnum):
    CLASS_PORT_INFO = 0x0001
    NOTICE = 0x0002
    NODE_DESCRIPTION = 0x0010
    NODE_INFO = 0x0011
    SWITCH_INFO = 0x0012
    GUID_INFO = 0x0014
    PORT_INFO = 0x0015
    P_KEY_TABLE = 0x0016
    SL_TO_VL_MAPPING_TABLE = 0x0017
    VL_ARBITRATION_TABLE = 0x0018
    LINEAR_FORWARDING_TABLE = 0x0019
    RANDOM_FORWARDING_TABLE = 0x001A
    MULTICAST_FORWARDING_TABLE = 0x001B
    SM_INFO = 0x0020
    PORT_COUNTERS = 0x0012  # PMA class; same number as SwitchInfo in the SM class


class MadStatus(IntEnum):
    """MAD status codes (bits 4:2 invalid-field code; bit 0 busy, bit 1 redirect)."""

    OK = 0x0000
    BUSY = 0x0001
    REDIRECT = 0x0002
    BAD_VERSION = 0x0004
    UNSUPPORTED_METHOD = 0x0008
    UNSUPPORTED_METHOD_ATTR = 0x000C
    INVALID_VALUE = 0x001C


_METHOD_NAMES = {int(m): m.name for m in Method}
_CLASS_NAMES = {int(c): c.name for c in MgmtClass}

NODE_TYPE_NAMES = {1: "CA", 2: "switch", 3: "router"}
PORT_STATE_NAMES = {0: "no_change", 1: "down", 2: "init", 3: "armed", 4: "active"}
PHYS_STATE_NAMES = {0: "no_change", 1: "sleep", 2: "polling", 3: "disabled", 4: "training",
                    5: "linkup", 6: "error_recovery", 7: "phy_test"}
MTU_NAMES = {1: "256", 2: "512", 3: "1024", 4: "2048", 5: "4096"}
SM_STATE_NAMES = {0: "not_active", 1: "discovering", 2: "standby", 3: "master"}


def mtu_code(nbytes: int) -> int:
    """IBA MTU enum for a byte count (256 -> 1 .. 4096 -> 5)."""
    codes = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
    if nbytes not in codes:
        raise ValueError(f"IB MTU must be one of {sorted(codes)}, not {nbytes}")
    return codes[nbytes]


def mtu_bytes(code: int) -> int:
    return 128 << code if 1 <= code <= 5 else 0


# --------------------------------------------------------------------------- attributes


class Attribute(Packet):
    """Base of MAD attributes: ``attr_id`` tells which AttributeID selects the class."""

    attr_id: ClassVar[int] = -1

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        # The rest of the fixed-size data area is reserved: keep it so bytes round-trip.
        return b"", (s or None)


class NodeDescription(Attribute):
    name = "NodeDescription"
    attr_id = AttrId.NODE_DESCRIPTION
    fields_desc = [StrFixedLenField("node_string", b"", 64)]

    @property
    def text(self) -> str:
        return bytes(self.node_string).split(b"\0", 1)[0].decode("utf-8", "replace")


class NodeInfo(Attribute):
    name = "NodeInfo"
    attr_id = AttrId.NODE_INFO
    fields_desc = [
        ByteField("base_version", 1),
        ByteField("class_version", 1),
        ByteEnumField("node_type", 1, NODE_TYPE_NAMES),
        ByteField("num_ports", 1),
        XLongField("system_image_guid", 0),
        XLongField("node_guid", 0),
        XLongField("port_guid", 0),
        ShortField("partition_cap", 1),
        XShortField("device_id", 0),
        XIntField("revision", 0),
        ByteField("local_port_num", 1),
        X3BytesField("vendor_id", 0),
    ]


class SwitchInfo(Attribute):
    name = "SwitchInfo"
    attr_id = AttrId.SWITCH_INFO
    fields_desc = [
        ShortField("linear_fdb_cap", 0xC000),
        ShortField("random_fdb_cap", 0),
        ShortField("multicast_fdb_cap", 0),
        ShortField("linear_fdb_top", 0),
        ByteField("default_port", 0),
        ByteField("default_multicast_primary_port", 0),
        ByteField("default_multicast_not_primary_port", 0),
        BitField("life_time_value", 0, 5),
        BitField("port_state_change", 0, 1),
        BitField("optimized_sl_to_vl_mapping_programming", 0, 2),
        ShortField("lids_per_port", 0),
        ShortField("partition_enforcement_cap", 0),
        BitField("inbound_enforcement_cap", 0, 1),
        BitField("outbound_enforcement_cap", 0, 1),
        BitField("filter_raw_inbound_cap", 0, 1),
        BitField("filter_raw_outbound_cap", 0, 1),
        BitField("enhanced_port0", 0, 1),
        BitField("rsv3", 0, 3),
        ByteField("rsv8", 0),
        ShortField("multicast_fdb_top", 0),
    ]


class PortInfo(Attribute):
    name = "PortInfo"
    attr_id = AttrId.PORT_INFO
    fields_desc = [
        XLongField("m_key", 0),
        XLongField("gid_prefix", 0xFE80000000000000),
        XShortField("lid", 0),
        XShortField("master_sm_lid", 0),
        XIntField("capability_mask", 0),
        ShortField("diag_code", 0),
        ShortField("m_key_lease_period", 0),
        ByteField("local_port_num", 0),
        XByteField("link_width_enabled", 0),
        XByteField("link_width_supported", 0),
        XByteField("link_width_active", 0),
        BitField("link_speed_supported", 0, 4),
        BitEnumField("port_state", 1, 4, PORT_STATE_NAMES),
        BitEnumField("port_phys_state", 2, 4, PHYS_STATE_NAMES),
        BitField("link_down_default_state", 2, 4),
        BitField("m_key_protect_bits", 0, 2),
        BitField("rsv3", 0, 3),
        BitField("lmc", 0, 3),
        BitField("link_speed_active", 0, 4),
        BitField("link_speed_enabled", 0, 4),
        BitEnumField("neighbor_mtu", 5, 4, MTU_NAMES),
        BitField("master_sm_sl", 0, 4),
        BitField("vl_cap", 1, 4),
        BitField("init_type", 0, 4),
        ByteField("vl_high_limit", 0),
        ByteField("vl_arbitration_high_cap", 0),
        ByteField("vl_arbitration_low_cap", 0),
        BitField("init_type_reply", 0, 4),
        BitEnumField("mtu_cap", 5, 4, MTU_NAMES),
        BitField("vl_stall_count", 0, 3),
        BitField("hoq_life", 0, 5),
        BitField("operational_vls", 1, 4),
        BitField("partition_enforcement_inbound", 0, 1),
        BitField("partition_enforcement_outbound", 0, 1),
        BitField("filter_raw_inbound", 0, 1),
        BitField("filter_raw_outbound", 0, 1),
        ShortField("m_key_violations", 0),
        ShortField("p_key_violations", 0),
        ShortField("q_key_violations", 0),
        ByteField("guid_cap", 1),
        BitField("client_reregister", 0, 1),
        BitField("multicast_pkey_trap_suppression_enabled", 0, 1),
        BitField("rsv1", 0, 1),
        BitField("subnet_timeout", 0, 5),
        BitField("rsv3b", 0, 3),
        BitField("resp_time_value", 0, 5),
        BitField("local_phy_errors", 0, 4),
        BitField("overrun_errors", 0, 4),
        ShortField("max_credit_hint", 0),
        ByteField("rsv8", 0),
        BitField("link_round_trip_latency", 0, 24),
        XShortField("capability_mask2", 0),
        BitField("link_speed_ext_active", 0, 4),
        BitField("link_speed_ext_supported", 0, 4),
        BitField("rsv3c", 0, 3),
        BitField("link_speed_ext_enabled", 0, 5),
    ]


class PKeyTable(Attribute):
    """P_KeyTable block: 32 P_Keys (AttributeModifier = block number)."""

    name = "PKeyTable"
    attr_id = AttrId.P_KEY_TABLE
    fields_desc = [
        FieldListField("pkeys", [0xFFFF] + [0] * 31, XShortField("", 0), count_from=lambda p: 32)  # type: ignore[arg-type]
    ]


class SLtoVLMappingTable(Attribute):
    """SLtoVLMappingTable (IBA 14.2.5.8): 16 four-bit VLs, SL0 in the high nibble of byte 0.
    AttributeModifier (switch): input port [15:8], output port [7:0]; CA: reserved."""

    name = "SLtoVLMappingTable"
    attr_id = AttrId.SL_TO_VL_MAPPING_TABLE
    fields_desc = [BitField(f"sl{i}_to_vl", 0, 4) for i in range(16)]


class VLArbitrationTable(Attribute):
    """VLArbitrationTable block (IBA 14.2.5.9): 32 entries of reserved[7:4] VL[3:0], Weight.
    AttributeModifier: portion [31:16] (1, 2: low priority 0-31, 32-63; 3, 4: high priority),
    output port [15:0] (switch; CA: reserved)."""

    name = "VLArbitrationTable"
    attr_id = AttrId.VL_ARBITRATION_TABLE
    fields_desc = [f for i in range(32) for f in (BitField(f"rsv{i}", 0, 4), BitField(f"vl{i}", 0, 4),
                                                  ByteField(f"weight{i}", 0))]


class LinearForwardingTable(Attribute):
    """LFT block: egress port of LIDs block*64 .. block*64+63 (0xFF = no route)."""

    name = "LinearForwardingTable"
    attr_id = AttrId.LINEAR_FORWARDING_TABLE
    fields_desc = [
        FieldListField("ports", [0xFF] * 64, ByteField("", 0xFF), count_from=lambda p: 64)  # type: ignore[list-item]
    ]


class SMInfo(Attribute):
    name = "SMInfo"
    attr_id = AttrId.SM_INFO
    fields_desc = [
        XLongField("guid", 0),
        XLongField("sm_key", 0),
        IntField("act_count", 0),
        BitField("priority", 0, 4),
        BitEnumField("sm_state", 0, 4, SM_STATE_NAMES),
    ]


class Trap128Details(Packet):
    """Trap 128 (link state change) DataDetails: the reporting switch's LID."""

    name = "Trap128"
    fields_desc = [XShortField("lidaddr", 0)]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        return b"", (s or None)


class Trap144Details(Packet):
    """Trap 144 (CapabilityMask / NodeDescription changed) DataDetails."""

    name = "Trap144"
    fields_desc = [
        ShortField("rsv16", 0),
        XShortField("lidaddr", 0),
        BitField("rsv7", 0, 7),
        BitField("other_local_changes", 0, 1),
        XIntField("capability_mask", 0),
        ShortField("rsv16b", 0),
        XShortField("change_flags", 0),
        XShortField("capability_mask2", 0),
    ]

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        return b"", (s or None)


TRAP_DETAILS: dict[int, type[Packet]] = {128: Trap128Details, 144: Trap144Details}
NOTICE_DATA_DETAILS_LEN = 54


class _FixedPacketField(Field[Any, bytes]):
    """A fixed-size area holding a sub-packet whose class is chosen from the enclosing packet."""

    __slots__ = ["chooser", "length"]
    islist = 0
    holds_packets = 1

    def __init__(self, name: str, length: int, chooser: Any) -> None:
        self.length = length
        self.chooser = chooser
        super().__init__(name, None, fmt=f"{length}s")

    def m2i(self, pkt: Packet | None, m: bytes) -> Packet:
        cls = self.chooser(pkt) if pkt is not None else Raw
        return cls(m, _underlayer=pkt) if cls is not Raw else Raw(m)

    def i2m(self, pkt: Packet | None, x: Any) -> bytes:
        if x is None:
            return b"\0" * self.length
        data = bytes(x)
        if len(data) > self.length:
            raise ValueError(f"{self.name}: {len(data)} bytes do not fit in {self.length}")
        return data.ljust(self.length, b"\0")

    def addfield(self, pkt: Packet, s: bytes, val: Any) -> bytes:
        return s + self.i2m(pkt, val)

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, Packet]:
        return s[self.length :], self.m2i(pkt, s[: self.length])

    def i2repr(self, pkt: Packet | None, x: Any) -> str:
        return repr(x)

    def i2len(self, pkt: Packet, x: Any) -> int:
        return self.length

    def randval(self) -> Any:
        from scapy.volatile import RandBin

        return RandBin(self.length)


class Notice(Attribute):
    """Notice (trap) attribute; ``data_details`` by trap number (128, 144) or raw."""

    name = "Notice"
    attr_id = AttrId.NOTICE
    fields_desc = [
        BitField("is_generic", 1, 1),
        BitField("type", 1, 7),
        X3BytesField("producer_type", 2),
        ShortField("trap_number", 128),
        XShortField("issuer_lid", 0),
        BitField("notice_toggle", 0, 1),
        BitField("notice_count", 0, 15),
        _FixedPacketField(
            "data_details",
            NOTICE_DATA_DETAILS_LEN,
            lambda p: TRAP_DETAILS.get(p.trap_number, Raw) if p.is_generic else Raw,
        ),
    ]


class ClassPortInfo(Attribute):
    name = "ClassPortInfo"
    attr_id = AttrId.CLASS_PORT_INFO
    fields_desc = [
        ByteField("base_version", 1),
        ByteField("class_version", 1),
        XShortField("capability_mask", 0),
        XBitField("capability_mask2", 0, 27),
        BitField("resp_time_value", 0, 5),
        XBitField("redirect_gid", 0, 128),
        BitField("redirect_tc", 0, 8),
        BitField("redirect_sl", 0, 4),
        XBitField("redirect_fl", 0, 20),
        XShortField("redirect_lid", 0),
        XShortField("redirect_pkey", 0),
        ByteField("rsv8", 0),
        XBitField("redirect_qp", 0, 24),
        XIntField("redirect_qkey", 0),
        XBitField("trap_gid", 0, 128),
        BitField("trap_tc", 0, 8),
        BitField("trap_sl", 0, 4),
        XBitField("trap_fl", 0, 20),
        XShortField("trap_lid", 0),
        XShortField("trap_pkey", 0),
        ByteField("trap_hl", 0),
        XBitField("trap_qp", 0, 24),
        XIntField("trap_qkey", 0),
    ]


class PortCounters(Attribute):
    name = "PortCounters"
    attr_id = AttrId.PORT_COUNTERS
    fields_desc = [
        ByteField("rsv8", 0),
        ByteField("port_select", 0),
        XShortField("counter_select", 0),
        ShortField("symbol_error_counter", 0),
        ByteField("link_error_recovery_counter", 0),
        ByteField("link_downed_counter", 0),
        ShortField("port_rcv_errors", 0),
        ShortField("port_rcv_remote_physical_errors", 0),
        ShortField("port_rcv_switch_relay_errors", 0),
        ShortField("port_xmit_discards", 0),
        ByteField("port_xmit_constraint_errors", 0),
        ByteField("port_rcv_constraint_errors", 0),
        ByteField("counter_select2", 0),
        BitField("local_link_integrity_errors", 0, 4),
        BitField("excessive_buffer_overrun_errors", 0, 4),
        ShortField("qp1_dropped", 0),
        ShortField("vl15_dropped", 0),
        IntField("port_xmit_data", 0),
        IntField("port_rcv_data", 0),
        IntField("port_xmit_pkts", 0),
        IntField("port_rcv_pkts", 0),
        IntField("port_xmit_wait", 0),
    ]


SMP_ATTRIBUTES: dict[int, type[Attribute]] = {
    cls.attr_id: cls
    for cls in (NodeDescription, NodeInfo, SwitchInfo, PortInfo, PKeyTable, SLtoVLMappingTable,
                VLArbitrationTable, LinearForwardingTable, Notice, SMInfo)
}
PMA_ATTRIBUTES: dict[int, type[Attribute]] = {
    cls.attr_id: cls for cls in (ClassPortInfo, PortCounters)
}


# --------------------------------------------------------------------------- MAD classes


class _AttributeIdField(ShortEnumField):
    """AttributeID; None means: take it from the attribute in the ``data`` field."""

    def i2m(self, pkt: Packet | None, x: Any) -> int:
        if x is None and pkt is not None:
            data = pkt.getfieldval("data") if "data" in pkt.fields or "data" in pkt.default_fields else None
            return int(getattr(data, "attr_id", 0)) if data is not None else 0
        return int(super().i2m(pkt, x))


class _PathField(StrFixedLenField):
    """InitialPath / ReturnPath: 64 port numbers, index 0 unused.

    Accepts bytes (all 64) or a list of the hops 1..n (``[1, 3]`` -> port 1 then port 3).
    """

    def any2i(self, pkt: Packet | None, x: Any) -> Any:
        if isinstance(x, list | tuple):
            if len(x) > 63:
                raise ValueError("a directed route has at most 63 hops")
            x = bytes([0, *x]).ljust(64, b"\0")
        return super().any2i(pkt, x)

    def i2repr(self, pkt: Packet | None, x: Any) -> str:
        hops = int(pkt.hop_count) if pkt is not None and pkt.hop_count else 0
        return repr(list(bytes(x)[1 : hops + 1]))


def _mad_header_fields(mgmt_class: int) -> list[Field[Any, Any]]:
    return [
        ByteField("base_version", 1),
        ByteEnumField("mgmt_class", mgmt_class, _CLASS_NAMES),
        ByteField("class_version", 1),
        ByteEnumField("method", Method.GET, _METHOD_NAMES),  # R bit (0x80) included
    ]


class MAD(Packet):
    """A MAD: common header (24 bytes) and 232 bytes of class data (Raw).

    ``pkt[MAD]`` / ``pkt.haslayer(MAD)`` also find the class-specific MADs (SMP, ...).
    """

    name = "MAD"
    match_subclass = True
    fields_desc = [
        *_mad_header_fields(MgmtClass.SUBN_ADM),
        XShortField("status", 0),
        XShortField("class_specific", 0),
        XLongField("tid", 0),
        _AttributeIdField("attribute_id", 0, {}),
        ShortField("rsv16", 0),
        XIntField("attribute_modifier", 0),
    ]

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        if cls is MAD and _pkt is not None and len(_pkt) >= 2:
            return MAD_CLASSES.get(_pkt[1], MAD)
        return cls

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes | None]:
        return s, None

    @property
    def is_response(self) -> bool:
        """The R bit: set on GetResp, ReportResp, ..."""
        return bool(int(self.method) & 0x80)

    def mysummary(self) -> str:
        return self.sprintf(f"%{type(self).__name__}.mgmt_class% %{type(self).__name__}.method% "
                            f"attr=%{type(self).__name__}.attribute_id% tid=%{type(self).__name__}.tid%")


class SMP(MAD):
    """LID-routed SMP (class 0x01)."""

    name = "SMP"
    fields_desc = [
        *_mad_header_fields(MgmtClass.SUBN_LID_ROUTED),
        XShortField("status", 0),
        XShortField("class_specific", 0),
        XLongField("tid", 0),
        _AttributeIdField("attribute_id", None, {int(a): a.name for a in AttrId}),
        ShortField("rsv16", 0),
        XIntField("attribute_modifier", 0),
        XLongField("m_key", 0),
        StrFixedLenField("rsv256", b"\0" * 32, 32),
        _FixedPacketField("data", SMP_DATA_LEN, lambda p: SMP_ATTRIBUTES.get(p.attribute_id, Raw)),
        StrFixedLenField("rsv1024", b"\0" * 128, 128),
    ]


class DirectedRouteSMP(MAD):
    """Directed-route SMP (class 0x81): D bit, hop pointer and count, DrSLID/DrDLID, paths."""

    name = "DirectedRouteSMP"
    fields_desc = [
        *_mad_header_fields(MgmtClass.SUBN_DIRECTED_ROUTE),
        BitField("d", 0, 1),
        XBitField("status", 0, 15),
        ByteField("hop_pointer", 0),
        ByteField("hop_count", 0),
        XLongField("tid", 0),
        _AttributeIdField("attribute_id", None, {int(a): a.name for a in AttrId}),
        ShortField("rsv16", 0),
        XIntField("attribute_modifier", 0),
        XLongField("m_key", 0),
        XShortField("dr_slid", 0xFFFF),
        XShortField("dr_dlid", 0xFFFF),
        StrFixedLenField("rsv224", b"\0" * 28, 28),
        _FixedPacketField("data", SMP_DATA_LEN, lambda p: SMP_ATTRIBUTES.get(p.attribute_id, Raw)),
        _PathField("initial_path", b"\0" * 64, 64),
        _PathField("return_path", b"\0" * 64, 64),
    ]


class PMA(MAD):
    """Performance management MAD (class 0x04): 40 reserved bytes, 192 bytes of data."""

    name = "PMA"
    fields_desc = [
        *_mad_header_fields(MgmtClass.PERF_MGT),
        XShortField("status", 0),
        XShortField("class_specific", 0),
        XLongField("tid", 0),
        _AttributeIdField("attribute_id", None, {int(AttrId.CLASS_PORT_INFO): "CLASS_PORT_INFO",
                                                 int(AttrId.PORT_COUNTERS): "PORT_COUNTERS"}),
        ShortField("rsv16", 0),
        XIntField("attribute_modifier", 0),
        StrFixedLenField("rsv320", b"\0" * 40, 40),
        _FixedPacketField("data", PMA_DATA_LEN, lambda p: PMA_ATTRIBUTES.get(p.attribute_id, Raw)),
    ]


MAD_CLASSES: dict[int, type[MAD]] = {
    MgmtClass.SUBN_LID_ROUTED: SMP,
    MgmtClass.SUBN_DIRECTED_ROUTE: DirectedRouteSMP,
    MgmtClass.PERF_MGT: PMA,
}

register_mad_class(MAD)

