"""Golden bytes for every layer, written by hand from the spec tables, built both ways."""

from __future__ import annotations

import pytest
from scapy.packet import Packet, Raw, raw

from ibemu.wire import fast
from ibemu.wire.ib import (
    AETH,
    BTH,
    DETH,
    GRH,
    IETH,
    LRH,
    RDETH,
    RETH,
    AtomicAckETH,
    AtomicETH,
    ImmDt,
)
from ibemu.wire.mad import (
    MAD,
    PMA,
    SMP,
    ClassPortInfo,
    DirectedRouteSMP,
    LinearForwardingTable,
    NodeDescription,
    NodeInfo,
    Notice,
    PKeyTable,
    PortCounters,
    PortInfo,
    SMInfo,
    SwitchInfo,
    Trap128Details,
    Trap144Details,
)
from tests.unit.wire import reference

H = bytes.fromhex


# (scapy layer, golden hex, fast-path packer or None)
HEADERS: list[tuple[Packet, str, bytes | None]] = [
    (RETH(va=0x0102030405060708, rkey=0xA0B0C0D0, dmalen=4096), "0102030405060708 a0b0c0d0 00001000",
     fast.reth(0x0102030405060708, 0xA0B0C0D0, 4096)),
    (AETH(syndrome=0x60, msn=0x123456), "60 123456", fast.aeth(0x60, 0x123456)),
    (DETH(qkey=0x80010000, srcqp=0x000001), "80010000 00 000001", fast.deth(0x80010000, 1)),
    (ImmDt(immediate_data=0xDEADBEEF), "deadbeef", fast.immdt(0xDEADBEEF)),
    (IETH(rkey=0x11223344), "11223344", fast.ieth(0x11223344)),
    (AtomicETH(va=0x1000, rkey=0x77, swap_add_data=5, compare_data=9),
     "0000000000001000 00000077 0000000000000005 0000000000000009", fast.atomic_eth(0x1000, 0x77, 5, 9)),
    (AtomicAckETH(orig_rem_dt=0xFFFF0000FFFF0000), "ffff0000ffff0000", fast.atomic_ack_eth(0xFFFF0000FFFF0000)),
    (RDETH(eecnxt=0xABCDEF), "00 abcdef", None),
    (GRH(tclass=0xA5, flowlabel=0x12345, paylen=100, hoplmt=64, sgid=1, dgid=2),
     "6a512345 0064 1b 40" + "00" * 15 + "01" + "00" * 15 + "02", None),
]


@pytest.mark.parametrize(("layer", "golden", "fast_bytes"), HEADERS, ids=lambda v: type(v).__name__)
def test_header_golden_bytes(layer: Packet, golden: str, fast_bytes: bytes | None) -> None:
    assert raw(layer) == H(golden)
    if fast_bytes is not None:
        assert fast_bytes == H(golden)
    assert raw(type(layer)(H(golden))) == H(golden)


def _seal(body_hex: str) -> bytes:
    body = H(body_hex)
    icrc = reference.native_icrc(body).to_bytes(4, "little")
    return body + icrc + reference.crc16_vcrc_bitwise(body + icrc).to_bytes(2, "little")


# LRH: VL=3 LVer=0 | SL=5 LNH=2 | DLID 0x0010 | PktLen | SLID 0x0020
# BTH: OpCode 0x0A | SE=1 M=0 PadCnt=3 | P_Key 0xFFFF | 00 | DestQP 0x000abc | A=1 | PSN 0x000102
WRITE_ONLY = _seal(
    "30 52 0010 000c 0020"
    "0a b0 ffff 00 000abc 80 000102"
    "0000000000002000 00001234 00000005"
    "6869212121 000000"
)


def test_rc_write_only_golden_both_ways() -> None:
    assert len(WRITE_ONLY) == 4 * 0x0C + 2
    scapy_built = raw(
        LRH(vl=3, sl=5, dlid=0x10, slid=0x20)
        / BTH(opcode=0x0A, se=1, destqp=0xABC, ackreq=1, psn=0x102)
        / RETH(va=0x2000, rkey=0x1234, dmalen=5)
        / Raw(b"hi!!!")
    )
    assert scapy_built == WRITE_ONLY
    tmpl = fast.NativeTemplate(slid=0x20, dlid=0x10, destqp=0xABC, sl=5, vl=3)
    assert tmpl.packet(0x0A, 0x102, b"hi!!!", ackreq=True, se=True, ext=fast.reth(0x2000, 0x1234, 5)) == WRITE_ONLY
    back = LRH(WRITE_ONLY)
    assert back[BTH].padcnt == 3 and back[Raw].load == b"hi!!!" and raw(back) == WRITE_ONLY


NAK = _seal("00 02 0004 0007 0001  11 00 ffff 00 870408 00 d40a55  60 000001")


def test_nak_psn_sequence_error_golden() -> None:
    assert raw(LRH(dlid=4, slid=1) / BTH(opcode=0x11, destqp=0x870408, psn=0xD40A55)
               / AETH(syndrome=0x60, msn=1)) == NAK
    tmpl = fast.NativeTemplate(slid=1, dlid=4, destqp=0x870408)
    assert tmpl.packet(0x11, 0xD40A55, ext=fast.aeth(0x60, 1)) == NAK


GRH_SEND = _seal(
    "00 03 0004 0011 0001"  # LNH=3; PktLen = (8+40+12+4+4)/4 = 17
    "60000000 0014 1b 01" + "fe80" + "00" * 13 + "01" + "fe80" + "00" * 13 + "02"
    + "04 00 8001 00 000033 00 000007" + "41424344"
)


def test_grh_send_only_golden() -> None:
    pkt = (LRH(lnh=3, dlid=4, slid=1)
           / GRH(hoplmt=1, sgid=(0xFE80 << 112) | 1, dgid=(0xFE80 << 112) | 2)
           / BTH(opcode=0x04, pkey=0x8001, destqp=0x33, psn=7) / Raw(b"ABCD"))
    assert raw(pkt) == GRH_SEND
    assert LRH(GRH_SEND)[GRH].paylen == 0x14


def _mad_header(mclass: str, method: str, tid: str, attr: str, modifier: str = "00000000",
                status: str = "0000", class_specific: str = "0000") -> str:
    return f"01 {mclass} 01 {method} {status} {class_specific} {tid} {attr} 0000 {modifier}"


NODE_INFO = H(
    "01 01 02 24 0002c90300001111 0002c90300002222 0002c90300002222 0008 c738 000000a1 00 0002c9"
).ljust(64, b"\0")


def test_node_info_golden() -> None:
    ni = NodeInfo(node_type=2, num_ports=36, system_image_guid=0x0002C90300001111,
                  node_guid=0x0002C90300002222, port_guid=0x0002C90300002222, partition_cap=8,
                  device_id=0xC738, revision=0xA1, local_port_num=0, vendor_id=0x0002C9)
    assert raw(ni) == NODE_INFO[:40]
    assert raw(NodeInfo(NODE_INFO)) == NODE_INFO


def test_directed_route_smp_golden() -> None:
    golden = H(
        _mad_header("81", "01", "00000000000000aa", "0011", class_specific="0003")
        + "0000000000000000 ffff ffff" + "00" * 28
    ) + NODE_INFO + H("00 01 05 07").ljust(64, b"\0") + b"\0" * 64
    smp = DirectedRouteSMP(method=1, hop_pointer=0, hop_count=3, tid=0xAA, initial_path=[1, 5, 7],
                           data=NodeInfo(NODE_INFO))
    assert raw(smp) == golden
    back = MAD(golden)
    assert isinstance(back, DirectedRouteSMP) and back[NodeInfo].num_ports == 36


def test_lid_routed_smp_with_port_info_offsets() -> None:
    pi = PortInfo(lid=0x0012, master_sm_lid=0x0001, capability_mask=0x02514868, local_port_num=3,
                  link_speed_supported=1, port_state=4, port_phys_state=5, neighbor_mtu=5,
                  mtu_cap=5, operational_vls=4, lmc=0)
    b = raw(pi)
    assert len(b) == 64
    assert b[16:18] == H("0012") and b[18:20] == H("0001") and b[20:24] == H("02514868")
    assert b[28] == 3
    assert b[32] == 0x14 and b[33] >> 4 == 5 and b[36] >> 4 == 5 and b[41] & 0x0F == 5
    assert b[43] >> 4 == 4
    smp = SMP(method=2, tid=1, attribute_modifier=3, data=pi)
    full = raw(smp)
    assert len(full) == 256 and full[1] == 0x01 and full[3] == 0x02 and full[16:18] == H("0015")
    assert full[64:128] == b and full[20:24] == H("00000003")


def test_switch_info_golden() -> None:
    si = SwitchInfo(linear_fdb_cap=0xC000, linear_fdb_top=0x0040, default_port=0,
                    life_time_value=18, port_state_change=1, lids_per_port=0,
                    partition_enforcement_cap=32, enhanced_port0=1)
    assert raw(si) == H("c000 0000 0000 0040 00 00 00 94 0000 0020 08 00 0000")


def test_node_description_pkey_lft_sminfo_golden() -> None:
    assert raw(NodeDescription(node_string=b"ibemu edge0_0")) == b"ibemu edge0_0".ljust(64, b"\0")
    assert NodeDescription(b"ibemu edge0_0".ljust(64, b"\0")).text == "ibemu edge0_0"
    assert raw(PKeyTable()) == H("ffff") + b"\0" * 62
    lft = LinearForwardingTable(ports=[0] + [1, 2, 3] + [0xFF] * 60)
    assert raw(lft) == H("00010203") + b"\xff" * 60
    assert raw(SMInfo(guid=0x0002C9020020B4DD, sm_key=0, act_count=37434, priority=1, sm_state=3)) == H(
        "0002c9020020b4dd 0000000000000000 0000923a 13")


def test_notice_trap_128_and_144_golden() -> None:
    trap = Notice(is_generic=1, type=1, producer_type=2, trap_number=128, issuer_lid=0x0005,
                  data_details=Trap128Details(lidaddr=0x0005))
    assert raw(trap) == H("81 000002 0080 0005 0000 0005").ljust(64, b"\0")
    t144 = Notice(is_generic=1, type=4, producer_type=1, trap_number=144, issuer_lid=7,
                  data_details=Trap144Details(lidaddr=7, capability_mask=0x02510868, change_flags=1))
    assert raw(t144) == H("84 000001 0090 0007 0000 0000 0007 00 02510868 0000 0001 0000").ljust(64, b"\0")
    parsed = Notice(raw(t144))
    assert isinstance(parsed.data_details, Trap144Details) and parsed.data_details.capability_mask == 0x02510868
    smp = SMP(method=0x05, tid=9, data=trap)
    assert raw(smp)[16:18] == H("0002") and raw(smp)[3] == 0x05


def test_pma_port_counters_offsets() -> None:
    pc = PortCounters(port_select=3, counter_select=0xFFFF, symbol_error_counter=0x0102,
                      link_downed_counter=7, port_rcv_errors=0x0304, port_xmit_discards=0x0506,
                      port_xmit_constraint_errors=8, port_rcv_constraint_errors=9,
                      port_xmit_data=0x11111111, port_rcv_data=0x22222222, port_xmit_pkts=0x33333333,
                      port_rcv_pkts=0x44444444, port_xmit_wait=0x55555555)
    mad = raw(PMA(method=0x81, tid=0x42, attribute_modifier=0, data=pc))
    d = mad[64:]
    assert len(mad) == 256 and mad[1] == 0x04 and mad[16:18] == H("0012")
    assert d[1] == 3 and d[2:4] == H("ffff") and d[4:6] == H("0102") and d[7] == 7
    assert d[8:10] == H("0304") and d[14:16] == H("0506") and d[16] == 8 and d[17] == 9
    assert d[24:28] == H("11111111") and d[28:32] == H("22222222") and d[32:36] == H("33333333")
    assert d[36:40] == H("44444444") and d[40:44] == H("55555555")


def test_pma_class_port_info_layout() -> None:
    cpi = ClassPortInfo(capability_mask=0x0200, resp_time_value=18, trap_lid=1, trap_qp=1,
                        trap_qkey=0x80010000, redirect_pkey=0xFFFF)
    b = raw(cpi)
    assert len(b) == 72 and b[:4] == H("01 01 0200") and b[4:8] == H("00000012")
    assert b[60:62] == H("0001") and b[65:68] == H("000001") and b[68:72] == H("80010000")
    assert b[30:32] == H("ffff")
    assert raw(PMA(attribute_id=1, data=cpi))[16:18] == H("0001")


def test_mad_lookup_finds_class_specific_mads() -> None:
    from ibemu.wire.ib import BTH, DETH, LRH

    pkt = LRH(raw(LRH(vl=15) / BTH(opcode=0x64) / DETH() / DirectedRouteSMP(tid=3, data=NodeInfo())))
    assert pkt.haslayer(MAD) and pkt[MAD].tid == 3 and isinstance(pkt[MAD], DirectedRouteSMP)
    assert not pkt.haslayer(PMA)
