"""Byte encoders for the fixed attributes (NodeInfo, SwitchInfo, Notice, ClassPortInfo,
SLtoVLMappingTable, VLArbitrationTable).

Layouts as in ../shared/ref/ib-wire.md; the tests check each against the scapy layers.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

NODE_TYPE_CA = 1
NODE_TYPE_SWITCH = 2

_NODE_INFO = struct.Struct("!BBBBQQQHHIB3s")
_SWITCH_INFO = struct.Struct("!HHHHBBBBHHBBH")
_NOTICE = struct.Struct("!B3sHHH")
PRODUCER_SWITCH = 2
NOTICE_URGENT = 1
NOTICE_SECURITY = 2
TRAP_BAD_M_KEY = 256
TRAP_BAD_P_KEY = 257
_NTC_256 = struct.Struct("!HHHBBHIQBB")
_NTC_257 = struct.Struct("!HHHIII16s16s")
"""Trap 257/258 DataDetails: reserved, LID1, LID2, key, SL (bits 31:28) + QP1, QP2, GID1, GID2."""


def node_info(*, node_type: int, num_ports: int, system_image_guid: int, node_guid: int,
              port_guid: int, partition_cap: int, device_id: int, revision: int,
              local_port_num: int, vendor_id: int) -> bytes:
    """64-byte NodeInfo (40 bytes of fields, then reserved zeros)."""
    return _NODE_INFO.pack(1, 1, node_type, num_ports, system_image_guid, node_guid, port_guid,
                           partition_cap, device_id, revision, local_port_num,
                           vendor_id.to_bytes(3, "big")).ljust(64, b"\0")


@dataclass(slots=True)
class SwitchInfoState:
    """The settable and reported SwitchInfo fields of one switch."""

    linear_fdb_cap: int = 49152
    random_fdb_cap: int = 0
    multicast_fdb_cap: int = 1024
    linear_fdb_top: int = 0
    default_port: int = 0
    default_mcast_primary_port: int = 0
    default_mcast_not_primary_port: int = 0
    life_time_value: int = 0x0F  # 4.096 us * 2^15 ~ 134 ms
    port_state_change: bool = False
    lids_per_port: int = 0
    partition_enforcement_cap: int = 32
    multicast_fdb_top: int = 0xC000 - 1  # no multicast LIDs in use

    def encode(self) -> bytes:
        return _SWITCH_INFO.pack(
            self.linear_fdb_cap, self.random_fdb_cap, self.multicast_fdb_cap, self.linear_fdb_top,
            self.default_port, self.default_mcast_primary_port, self.default_mcast_not_primary_port,
            (self.life_time_value << 3) | (int(self.port_state_change) << 2),
            self.lids_per_port, self.partition_enforcement_cap,
            0xF0,  # InboundEnf/OutboundEnf/FilterRawInbound/Outbound caps; EnhancedPort0: none
            0, self.multicast_fdb_top,
        ).ljust(64, b"\0")


def decode_switch_info(data: bytes | bytearray | memoryview) -> dict[str, int]:
    """The Set-relevant fields of a SwitchInfo data area."""
    (_cap, _rcap, _mcap, top, dport, dmp, dmnp, b11, _lpp, _pec, _b16, _b17,
     mtop) = _SWITCH_INFO.unpack_from(data, 0)
    return {"linear_fdb_top": top, "default_port": dport, "default_mcast_primary_port": dmp,
            "default_mcast_not_primary_port": dmnp, "life_time_value": b11 >> 3,
            "port_state_change": (b11 >> 2) & 1, "multicast_fdb_top": mtop}


def notice_trap128(*, issuer_lid: int, lidaddr: int) -> bytes:
    """Notice for trap 128 (link state change): generic, urgent, producer switch."""
    head = _NOTICE.pack((1 << 7) | NOTICE_URGENT, PRODUCER_SWITCH.to_bytes(3, "big"), 128,
                        issuer_lid, 0)
    return (head + struct.pack("!H", lidaddr)).ljust(64, b"\0")


def notice_trap256(*, producer: int, issuer_lid: int, lidaddr: int, dr_slid: int, method: int,
                   attr_id: int, attr_mod: int, m_key: int, dr_hop_count: int | None = None,
                   dr_return_path: bytes = b"") -> bytes:
    """Notice for trap 256 (Bad M_Key): generic, security, producer ``producer`` (the node
    type). DataDetails: the requester's LID (LIDADDR), its DrSLID, the method, attribute ID
    and modifier, the M_Key it carried; for a directed-route SMP the DR notice bit, the hop
    count (bits 5:0) and up to 30 bytes of its return path (the truncated bit when longer)."""
    head = _NOTICE.pack((1 << 7) | NOTICE_SECURITY, producer.to_bytes(3, "big"), TRAP_BAD_M_KEY,
                        issuer_lid, 0)
    flags = 0
    path = b""
    if dr_hop_count is not None:
        path = bytes(dr_return_path[: dr_hop_count + 1])
        flags = 0x80 | (0x40 if len(path) > 30 else 0) | (dr_hop_count & 0x3F)
        path = path[:30]
    details = _NTC_256.pack(0, lidaddr, dr_slid, method, 0, attr_id, attr_mod, m_key, 0, flags) + path
    return (head + details).ljust(64, b"\0")


def decode_trap256(data: bytes | bytearray | memoryview) -> dict[str, int]:
    """The DataDetails of a trap 256 Notice (``notice_trap256``)."""
    _pad, lidaddr, dr_slid, method, _p2, attr_id, attr_mod, m_key, _p3, flags = _NTC_256.unpack_from(data, 10)
    return {"lidaddr": lidaddr, "dr_slid": dr_slid, "method": method, "attr_id": attr_id,
            "attr_mod": attr_mod, "m_key": m_key, "dr_notice": flags >> 7, "dr_hop_count": flags & 0x3F}


def notice_trap257(*, producer: int, issuer_lid: int, lid1: int, lid2: int, pkey: int, sl: int,
                   qp1: int = 0, qp2: int = 0) -> bytes:
    """Notice for trap 257 (Bad P_Key): generic, security, producer ``producer``. DataDetails:
    the packet's SLID (LID1) and DLID (LID2), its P_Key, SL, source QP (QP1; 0 when the
    reporter does not know it) and destination QP (QP2); no GIDs."""
    head = _NOTICE.pack((1 << 7) | NOTICE_SECURITY, producer.to_bytes(3, "big"), TRAP_BAD_P_KEY,
                        issuer_lid, 0)
    details = _NTC_257.pack(0, lid1, lid2, pkey, ((sl & 0xF) << 28) | (qp1 & 0xFFFFFF), qp2 & 0xFFFFFF,
                            bytes(16), bytes(16))
    return (head + details).ljust(64, b"\0")


def decode_trap257(data: bytes | bytearray | memoryview) -> dict[str, int]:
    """The DataDetails of a trap 257 Notice (``notice_trap257``)."""
    _r, lid1, lid2, key, sl_qp1, qp2, _g1, _g2 = _NTC_257.unpack_from(data, 10)
    return {"lid1": lid1, "lid2": lid2, "pkey": key & 0xFFFF, "sl": sl_qp1 >> 28,
            "qp1": sl_qp1 & 0xFFFFFF, "qp2": qp2 & 0xFFFFFF}


def notice_fields(data: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(is_generic, trap_number, issuer_lid) of a Notice data area."""
    b0, _prod, trap, issuer, _tc = _NOTICE.unpack_from(data, 0)
    return b0 >> 7, trap, issuer


def class_port_info(*, capability_mask: int, resp_time_value: int = 18, capability_mask2: int = 0) -> bytes:
    """ClassPortInfo for a GSI agent without redirection (72 bytes in a 192-byte area);
    CapabilityMask2 (27 bits) shares its 32-bit word with RespTimeValue (the low 5 bits)."""
    word = ((capability_mask2 & 0x7FFFFFF) << 5) | (resp_time_value & 0x1F)
    return struct.pack("!BBHI", 1, 1, capability_mask, word).ljust(192, b"\0")


VL_ARB_BLOCK_ENTRIES = 32
"""Entries in one VLArbitrationTable block (the attribute modifier's portion picks the block)."""
VL_ARB_LOW_BLOCKS = (1, 2)
VL_ARB_HIGH_BLOCKS = (3, 4)


def sl2vl_table(vls: Sequence[int]) -> bytes:
    """SLtoVLMappingTable data area: 16 VLs (SL0..SL15), two to a byte, SL0 in the high nibble."""
    if len(vls) != 16 or any(not 0 <= v <= 15 for v in vls):
        raise ValueError(f"an SL to VL table has 16 VLs within 0..15, got {list(vls)!r}")
    return bytes((vls[2 * i] << 4) | vls[2 * i + 1] for i in range(8)).ljust(64, b"\0")


def decode_sl2vl(data: bytes | bytearray | memoryview) -> tuple[int, ...]:
    return tuple(v for b in bytes(data[:8]) for v in (b >> 4, b & 0x0F))


def vl_arb_block(entries: Sequence[tuple[int, int]]) -> bytes:
    """One VLArbitrationTable block: up to 32 (VL, weight) entries, the rest zero."""
    if len(entries) > VL_ARB_BLOCK_ENTRIES:
        raise ValueError(f"a VL arbitration block has at most {VL_ARB_BLOCK_ENTRIES} entries")
    out = bytearray(64)
    for i, (vl, weight) in enumerate(entries):
        if not 0 <= vl <= 15 or not 0 <= weight <= 255:
            raise ValueError(f"a VL arbitration entry is (VL 0..15, weight 0..255), got ({vl}, {weight})")
        out[2 * i], out[2 * i + 1] = vl, weight
    return bytes(out)


def decode_vl_arb_block(data: bytes | bytearray | memoryview) -> list[tuple[int, int]]:
    """The 32 (VL, weight) entries of a block (the reserved high nibble dropped)."""
    raw = bytes(data[:64])
    return [(raw[2 * i] & 0x0F, raw[2 * i + 1]) for i in range(VL_ARB_BLOCK_ENTRIES)]
