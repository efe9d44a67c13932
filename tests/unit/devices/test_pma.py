"""PMA: ClassPortInfo, PortCounters Get/Set, extended counters, saturation."""

from __future__ import annotations

import struct

from ibemu.agents.counters import PortCounters
from ibemu.wire import madcodec as mb
from ibemu.wire.mad import ClassPortInfo
from ibemu.wire.mad import PortCounters as ScapyPortCounters
from ibemu.wire.madpacket import PACKET_LEN, frame_mad

from .fabrics import chain
from .minism import MiniSm


def setup():  # type: ignore[no-untyped-def]
    fab = chain(2)
    nodes = MiniSm(fab, "sm").bring_up()
    return fab, {n.description: n.lid for n in nodes.values()}


def pma_get(fab, lid: int, attr: int, port_select: int = 1, method: int = mb.GET,
            counter_select: int = 0) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    mad = mb.pma(method, attr, tid=0x99, data=mb.port_counters_select(port_select, counter_select))
    got = fab.send_mad("sm", 1, lid, 1, 1, mad)
    (resp,) = got
    assert resp.sqp == 1 and resp.dqp == 1 and resp.qkey == 0x80010000 and resp.slid == lid
    return mb.status(resp.mad), mb.pma_data(resp.mad)


def test_class_port_info() -> None:
    fab, lid = setup()
    status, data = pma_get(fab, lid["s2"], 0x01)
    cpi = ClassPortInfo(data)
    assert status == 0 and cpi.base_version == 1 and cpi.class_version == 1
    assert cpi.capability_mask & 0x0100 and cpi.capability_mask & 0x0200  # AllPortSelect, ExtWidth
    status, data = pma_get(fab, lid["h"], 0x01)
    assert not ClassPortInfo(data).capability_mask & 0x0100


def test_port_counters_move_and_clear() -> None:
    fab, lid = setup()
    s2 = fab.agents["s2"]
    status, data = pma_get(fab, lid["s2"], 0x12, port_select=1)
    before = ScapyPortCounters(data)
    assert status == 0 and before.port_select == 1 and before.port_rcv_pkts > 0
    for _ in range(5):
        fab.send_mad("sm", 1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x11, path=[1, 3]))
    after = ScapyPortCounters(pma_get(fab, lid["s2"], 0x12, port_select=1)[1])
    assert after.port_rcv_pkts - before.port_rcv_pkts == 6  # 5 SMPs + the PMA Get itself
    assert after.port_xmit_pkts - before.port_xmit_pkts == 6
    assert after.port_rcv_data - before.port_rcv_data == 6 * PACKET_LEN // 4  # octets / 4
    s2.add_counts(1, port_rcv_errors=3, symbol_error_counter=2)
    c = ScapyPortCounters(pma_get(fab, lid["s2"], 0x12, port_select=1)[1])
    assert c.port_rcv_errors == 3 and c.symbol_error_counter == 2
    status, data = pma_get(fab, lid["s2"], 0x12, port_select=1, method=mb.SET, counter_select=0xFFFF)
    cleared = ScapyPortCounters(data)
    assert status == 0 and cleared.port_rcv_errors == 0 and cleared.port_rcv_pkts == 0
    assert s2.counters(1).rcv_pkts == 0


def test_all_port_select_sums_the_ports() -> None:
    fab, lid = setup()
    s1 = fab.agents["s1"]
    expected = sum(s1.counters(p).xmit_pkts for p in s1.ports)
    data = pma_get(fab, lid["s1"], 0x12, port_select=0xFF)[1]
    assert ScapyPortCounters(data).port_xmit_pkts >= expected
    assert pma_get(fab, lid["s1"], 0x12, port_select=9)[0] == 0x1C
    assert pma_get(fab, lid["h"], 0x12, port_select=0xFF)[0] == 0x1C


def test_extended_counters_are_64_bit() -> None:
    fab, lid = setup()
    fab.agents["s2"].add_counts(3, xmit_octets=(1 << 40), xmit_pkts=(1 << 33))
    data = pma_get(fab, lid["s2"], 0x1D, port_select=3)[1]
    xd, _rd, xp = struct.unpack_from("!QQQ", data, 8)
    assert xd >= (1 << 38) and xp >= (1 << 33)
    basic = ScapyPortCounters(pma_get(fab, lid["s2"], 0x12, port_select=3)[1])
    assert basic.port_xmit_data == 0xFFFFFFFF and basic.port_xmit_pkts == 0xFFFFFFFF  # saturated


def test_counter_widths_saturate() -> None:
    pc = PortCounters()
    pc.add(port_rcv_errors=70000, link_downed_counter=300, local_link_integrity_errors=20,
           excessive_buffer_overrun_errors=17, vl15_dropped=1 << 20, rcv_octets=(1 << 36))
    c = ScapyPortCounters(pc.encode_basic(1))
    assert c.port_rcv_errors == 0xFFFF and c.link_downed_counter == 0xFF
    assert c.local_link_integrity_errors == 0xF and c.excessive_buffer_overrun_errors == 0xF
    assert c.vl15_dropped == 0xFFFF and c.port_rcv_data == 0xFFFFFFFF


def test_unknown_pma_attribute_and_method() -> None:
    fab, lid = setup()
    assert pma_get(fab, lid["s2"], 0x0055)[0] == 0x0C
    mad = bytearray(mb.pma(mb.GET, 0x12, data=mb.port_counters_select(1)))
    mad[3] = 0x14  # GetMulti
    (resp,) = fab.send_mad("sm", 1, lid["s2"], 1, 1, bytes(mad))
    assert mb.status(resp.mad) == 0x08 and resp.mad[3] == 0x94


def test_link_backed_counters_follow_the_kernel_and_clear_from_where_it_was() -> None:
    pc = PortCounters()
    pc.add_rx(100)  # what the agent counted before the kernel was followed
    pc.follow_link(tx_bytes=0, rx_bytes=1000 + 14 * 10, tx_packets=0, rx_packets=10)
    assert pc.rcv_pkts == 1 and pc.rcv_octets == 100  # the first call keeps the counts so far
    pc.follow_link(tx_bytes=5000 + 14 * 5, rx_bytes=9000 + 14 * 20, tx_packets=5, rx_packets=20)
    assert (pc.rcv_pkts, pc.rcv_octets, pc.xmit_pkts, pc.xmit_octets) == (11, 8100, 5, 5000)
    pc.set_basic(mb.port_counters_select(1, 0xFFFF))  # a PortCounters Set with zeros clears
    assert pc.rcv_pkts == 0 and pc.xmit_octets == 0
    pc.follow_link(tx_bytes=5000 + 14 * 5 + 514, rx_bytes=9000 + 14 * 20 + 257 * 2, tx_packets=6, rx_packets=22)
    assert (pc.rcv_pkts, pc.rcv_octets, pc.xmit_pkts, pc.xmit_octets) == (2, 486, 1, 500)
    assert "_link_now" not in pc.snapshot() and PortCounters.total([pc, pc]).rcv_pkts == 4


def test_the_pma_asks_for_fresh_counts_before_answering() -> None:
    fab, lid = setup()
    s2 = fab.agents["s2"]
    asked: list[list[int]] = []
    kernel_tx = [0]

    def refresh(ports: list[int]) -> None:  # the kernel carried 1000 more frames each time
        asked.append(list(ports))
        kernel_tx[0] += 1000
        s2.counters(ports[0]).follow_link(4110 * kernel_tx[0], 0, kernel_tx[0], 0)

    s2.link_counters = refresh
    first = ScapyPortCounters(pma_get(fab, lid["s2"], 0x12, port_select=1)[1])
    second = ScapyPortCounters(pma_get(fab, lid["s2"], 0x12, port_select=1)[1])
    assert asked == [[1], [1]]
    assert second.port_xmit_pkts - first.port_xmit_pkts == 1000
    assert second.port_xmit_data - first.port_xmit_data == 1000 * 4096 // 4


def test_extended_counters_carry_the_error_counters_and_clear_them_by_counter_select2() -> None:
    fab, lid = setup()
    cpi = pma_get(fab, lid["s2"], 0x01)[1]
    # not advertised (the tools' libumad2sim would cut the last three off), but answered
    assert not (struct.unpack_from("!I", cpi, 4)[0] >> 5) & 0x2 and cpi[7] & 0x1F == 18
    s2 = fab.agents["s2"]
    s2.add_counts(3, symbol_error_counter=70000, link_downed_counter=2, port_xmit_discards=5, port_xmit_wait=9,
                  vl15_dropped=1, xmit_pkts=7)
    data = pma_get(fab, lid["s2"], 0x1D, port_select=3)[1]
    ext = dict(zip(("sym", "recov", "downed", "rcv_err", "remote", "relay", "discards", "xconstr", "rconstr",
                    "lli", "ebo", "vl15", "wait", "qp1"), struct.unpack_from("!14Q", data, 72), strict=True))
    assert ext["sym"] == 70000 and ext["downed"] == 2 and ext["discards"] == 5 and ext["wait"] == 9
    assert ext["vl15"] == 1 and ext["rcv_err"] == 0  # 64 bits: not saturated at the 16-bit field
    # a Set with CounterSelect2 (bits 0..12: the error counters, then XmitWait) writes zeros
    req = bytearray(mb.port_counters_select(3))
    struct.pack_into("!I", req, 4, 0x1FFF)
    mad = mb.pma(mb.SET, 0x1D, tid=0x9A, data=bytes(req))
    (resp,) = fab.send_mad("sm", 1, lid["s2"], 1, 1, mad)
    assert mb.status(resp.mad) == 0
    c = s2.counters(3)
    assert c.symbol_error_counter == c.link_downed_counter == c.port_xmit_wait == c.port_xmit_discards == 0
    assert c.xmit_pkts >= 7  # CounterSelect (data counters) was 0: left alone


def test_rcv_error_and_xmit_discard_details_break_the_errors_down_and_clear() -> None:
    fab, lid = setup()
    s2 = fab.agents["s2"]
    s2.add_counts(3, port_rcv_errors=5, port_local_physical_errors=3, port_malformed_packet_errors=2,
                  port_xmit_discards=4, port_inactive_discards=4)
    status, rcv = pma_get(fab, lid["s2"], 0x15, port_select=3)
    assert status == 0 and rcv[1] == 3 and struct.unpack_from("!6H", rcv, 4) == (3, 2, 0, 0, 0, 0)
    status, xmit = pma_get(fab, lid["s2"], 0x16, port_select=3)
    assert status == 0 and struct.unpack_from("!4H", xmit, 4) == (4, 0, 0, 0)
    status, _ = pma_get(fab, lid["s2"], 0x15, port_select=3, method=mb.SET, counter_select=0x3F)
    assert status == 0 and s2.counters(3).port_local_physical_errors == s2.counters(3).port_malformed_packet_errors == 0
    assert s2.counters(3).port_inactive_discards == 4  # the other attribute's counters stay


def test_a_frame_with_a_bad_crc_is_a_local_physical_error() -> None:
    fab, _lid = setup()
    s2 = fab.agents["s2"]
    frame = bytearray(frame_mad(mb.dr_smp(mb.GET, 0x11, path=[]), dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0,
                                   qkey=0, vl=15))
    frame[-1] ^= 0xFF  # VCRC
    s2.receive(1, bytes(frame))
    c = s2.counters(1)
    assert c.port_rcv_errors >= 1 and c.port_local_physical_errors >= 1 and c.port_malformed_packet_errors == 0
