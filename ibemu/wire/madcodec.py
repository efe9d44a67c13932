"""Build and read 256-byte MADs as a client (an SM, a diagnostic tool, a test) would.

    mad = dr_smp(GET, ATTR_NODE_INFO, path=[1, 3], tid=7)   # via port 1, then switch port 3
    actions = ca.send_mad(1, 0xFFFF, 0, 0, mad)
    node = parse_node_info(smp_data(delivered.mad))

No scapy: the tests cross-check these bytes against the scapy layers of ``ibemu.wire``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ibemu.wire.madpacket import (
    INITIAL_PATH,
    M_HOP_COUNT,
    M_HOP_POINTER,
    M_STATUS,
    M_TID,
    PMA_DATA,
    RETURN_PATH,
    SMP_DATA,
)

GET = 0x01
SET = 0x02
TRAP = 0x05
TRAP_REPRESS = 0x07
GET_RESP = 0x81

_HDR = struct.Struct("!BBBBHHQHHI")


def _header(mgmt_class: int, method: int, attr_id: int, modifier: int, tid: int,
            status: int = 0, class_specific: int = 0) -> bytearray:
    mad = bytearray(256)
    _HDR.pack_into(mad, 0, 1, mgmt_class, 1, method, status, class_specific, tid & (2**64 - 1),
                   attr_id, 0, modifier & 0xFFFFFFFF)
    return mad


def dr_smp(method: int, attr_id: int, *, path: list[int] | tuple[int, ...], modifier: int = 0,
           tid: int = 1, data: bytes = b"", dr_slid: int = 0xFFFF, dr_dlid: int = 0xFFFF,
           m_key: int = 0) -> bytes:
    """A directed-route SMP along ``path`` (InitialPath[1..n]; [] = the local port)."""
    if len(path) > 63:
        raise ValueError("a directed route has at most 63 hops")
    mad = _header(0x81, method, attr_id, modifier, tid)
    mad[M_HOP_COUNT] = len(path)
    struct.pack_into("!QHH", mad, 24, m_key, dr_slid, dr_dlid)
    mad[SMP_DATA : SMP_DATA + len(data)] = data[:64]
    mad[INITIAL_PATH + 1 : INITIAL_PATH + 1 + len(path)] = bytes(path)
    return bytes(mad)


def lr_smp(method: int, attr_id: int, *, modifier: int = 0, tid: int = 1, data: bytes = b"",
           m_key: int = 0) -> bytes:
    """A LID-routed SMP (class 0x01)."""
    mad = _header(0x01, method, attr_id, modifier, tid)
    struct.pack_into("!Q", mad, 24, m_key)
    mad[SMP_DATA : SMP_DATA + len(data)] = data[:64]
    return bytes(mad)


def pma(method: int, attr_id: int, *, tid: int = 1, data: bytes = b"", modifier: int = 0) -> bytes:
    """A performance-management MAD (class 0x04); ``data`` fills the 192-byte area at 64."""
    mad = _header(0x04, method, attr_id, modifier, tid)
    mad[PMA_DATA : PMA_DATA + len(data)] = data[:192]
    return bytes(mad)


def port_counters_select(port_select: int, counter_select: int = 0, counter_select2: int = 0) -> bytes:
    """PortCounters data with PortSelect / CounterSelect filled (zeros elsewhere)."""
    data = bytearray(44)
    data[1] = port_select
    struct.pack_into("!H", data, 2, counter_select)
    data[18] = counter_select2
    return bytes(data)


# ---------------------------------------------------------------- reading responses


def tid(mad: bytes) -> int:
    return int(struct.unpack_from("!Q", mad, M_TID)[0])


def status(mad: bytes) -> int:
    """MAD status (for DR SMPs without the D bit)."""
    value = int(struct.unpack_from("!H", mad, M_STATUS)[0])
    return value & 0x7FFF if mad[1] == 0x81 else value


def hop_pointer(mad: bytes) -> int:
    return mad[M_HOP_POINTER]


def return_path(mad: bytes) -> list[int]:
    return list(mad[RETURN_PATH + 1 : RETURN_PATH + 1 + mad[M_HOP_COUNT]])


def smp_data(mad: bytes) -> bytes:
    return bytes(mad[SMP_DATA : SMP_DATA + 64])


def pma_data(mad: bytes) -> bytes:
    return bytes(mad[PMA_DATA : PMA_DATA + 192])


@dataclass(frozen=True, slots=True)
class NodeInfoView:
    node_type: int
    num_ports: int
    system_image_guid: int
    node_guid: int
    port_guid: int
    partition_cap: int
    device_id: int
    local_port_num: int
    vendor_id: int


def parse_node_info(data: bytes) -> NodeInfoView:
    _bv, _cv, nt, np_, sig, ng, pg, pc, dev, _rev, lpn = struct.unpack_from("!BBBBQQQHHIB", data)
    return NodeInfoView(nt, np_, sig, ng, pg, pc, dev, lpn, int.from_bytes(data[37:40], "big"))


@dataclass(frozen=True, slots=True)
class PortInfoView:
    lid: int
    master_sm_lid: int
    capability_mask: int
    local_port_num: int
    port_state: int
    phys_state: int
    lmc: int
    neighbor_mtu: int
    operational_vls: int
    link_width_active: int
    link_speed_ext_active: int


def parse_port_info(data: bytes) -> PortInfoView:
    lid, sm_lid, cap = struct.unpack_from("!HHI", data, 16)
    return PortInfoView(lid, sm_lid, cap, data[28], data[32] & 0x0F, data[33] >> 4, data[34] & 7,
                        data[36] >> 4, data[43] >> 4, data[31], data[62] >> 4)


def port_info_set(pi: bytes, *, lid: int | None = None, sm_lid: int | None = None,
                  port_state: int | None = None, phys_state: int | None = None,
                  lmc: int | None = None, operational_vls: int | None = None,
                  vl_high_limit: int | None = None, m_key: int | None = None,
                  m_key_protect: int | None = None, m_key_lease_s: int | None = None,
                  partition_flags: int | None = None) -> bytes:
    """PortInfo data for a Set: a Get's contents with some fields replaced.

    As an SM does, the state fields default to "no change" (0) unless given; so does
    OperationalVLs (byte 43 [7:4], a VLCap code: 1 = VL0 .. 4 = VL0-7), VLHighLimit is byte 38.
    M_Key is bytes 0-7, M_KeyLeasePeriod bytes 26-27, M_KeyProtectBits byte 34 [7:6];
    PartitionEnforcementInbound/Outbound and FilterRawInbound/Outbound byte 43 [3:0].
    """
    out = bytearray(pi[:64])
    if m_key is not None:
        struct.pack_into("!Q", out, 0, m_key)
    if m_key_lease_s is not None:
        struct.pack_into("!H", out, 26, m_key_lease_s)
    if m_key_protect is not None:
        out[34] = (out[34] & 0x3F) | ((m_key_protect & 3) << 6)
    out[43] = (out[43] & 0x0F) | ((operational_vls or 0) << 4)
    if partition_flags is not None:
        out[43] = (out[43] & 0xF0) | (partition_flags & 0x0F)
    if vl_high_limit is not None:
        out[38] = vl_high_limit
    if lid is not None:
        struct.pack_into("!H", out, 16, lid)
    if sm_lid is not None:
        struct.pack_into("!H", out, 18, sm_lid)
    out[32] = (out[32] & 0xF0) | (port_state or 0)
    out[33] = (out[33] & 0x0F) | ((phys_state or 0) << 4)
    if lmc is not None:
        out[34] = (out[34] & 0xF8) | lmc
    return bytes(out)


def switch_info_set(si: bytes, *, linear_fdb_top: int | None = None,
                    clear_port_state_change: bool = False) -> bytes:
    out = bytearray(si[:64])
    if linear_fdb_top is not None:
        struct.pack_into("!H", out, 6, linear_fdb_top)
    out[11] = (out[11] & ~0x04 & 0xFF) | (0x04 if clear_port_state_change else 0)
    return bytes(out)
