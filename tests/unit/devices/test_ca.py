"""The CA agent as the origin and destination of its clients' MADs."""

from __future__ import annotations

from ibemu.agents.actions import DeliverMad, Send
from ibemu.agents.ca import CaAgent
from ibemu.wire import madcodec as mb
from ibemu.wire.decode import decode_native
from ibemu.wire.ib import BTH, DETH, LRH
from ibemu.wire.madpacket import frame_mad

from .fabrics import chain
from .minism import MiniSm


def only(actions: list, kind: type):  # type: ignore[no-untyped-def]
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def test_hop_count_zero_is_answered_locally() -> None:
    ca = CaAgent(node_guid=0x1000, num_ports=2, link_up=[False, True])
    d = only(ca.send_mad(2, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x15, path=[], tid=3)), DeliverMad)
    assert d.port == 2 and d.status == 0 and mb.tid(d.mad) == 3 and d.mad[4] >> 7 == 1
    pi = mb.parse_port_info(mb.smp_data(d.mad))
    assert pi.local_port_num == 2 and pi.phys_state == 5 and pi.port_state == 2
    d = only(ca.send_mad(1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x11, path=[])), DeliverMad)
    ni = mb.parse_node_info(mb.smp_data(d.mad))
    assert ni.port_guid == 0x1001 and ni.local_port_num == 1  # a down port answers locally too


def test_set_is_sm_shows_in_capability_mask_and_local_lid_set() -> None:
    ca = CaAgent(node_guid=0x1000, link_up=[True])
    ca.set_is_sm(1, True)
    d = only(ca.send_mad(1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x15, path=[])), DeliverMad)
    pi = mb.smp_data(d.mad)
    assert mb.parse_port_info(pi).capability_mask & 0x2
    d = only(ca.send_mad(1, 0xFFFF, 0, 0, mb.dr_smp(mb.SET, 0x15, path=[],
                                                    data=mb.port_info_set(pi, lid=1, sm_lid=1))), DeliverMad)
    assert mb.status(d.mad) == 0 and ca.lid(1) == 1
    ca.set_is_sm(1, False)
    assert not mb.parse_port_info(ca.port_info(1)).capability_mask & 0x2


def test_outgoing_packet_headers() -> None:
    ca = CaAgent(node_guid=0x1000, link_up=[True])
    send = only(ca.send_mad(1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x11, path=[1, 4])), Send)
    pkt = decode_native(send.packet)
    assert (pkt[LRH].vl, pkt[LRH].dlid, pkt[LRH].slid) == (15, 0xFFFF, 0xFFFF)
    assert (pkt[BTH].opcode, pkt[BTH].destqp, pkt[DETH].srcqp, pkt[DETH].qkey) == (0x64, 0, 0, 0)
    assert send.packet[28 + 6] == 1  # hop pointer 0 -> 1 at the source


def test_undeliverable_requests_come_back_with_status_110() -> None:
    ca = CaAgent(node_guid=0x1000, num_ports=2, link_up=[True, False])
    cases = [
        (2, 0xFFFF, 0, mb.dr_smp(mb.GET, 0x11, path=[2, 1])),  # link down
        (1, 0xFFFF, 0, mb.dr_smp(mb.GET, 0x11, path=[2, 1])),  # InitialPath[1] is not port 1
        (1, 7, 1, mb.pma(mb.GET, 0x12)),  # no LID yet
        (1, 0xFFFF, 0, mb.dr_smp(mb.GET, 0x11, path=[1] * 63)[:7] + b"\x40" + bytes(248)),  # 64 hops
    ]
    for port, dlid, qp, mad in cases:
        d = only(ca.send_mad(port, dlid, qp, qp, mad), DeliverMad)
        assert d.status == 110 and d.mad == mad


def test_gsi_needs_an_active_port() -> None:
    fab = chain(1)
    sm = MiniSm(fab, "sm")
    sm.discover()
    sm.assign_lids()
    sm.route()
    got = fab.send_mad("sm", 1, 3, 1, 1, mb.pma(mb.GET, 0x12, data=mb.port_counters_select(1)))
    assert len(got) == 1 and got[0].status == 110  # SM port still Init


def test_sminfo_goes_to_the_sm_client_and_its_response_goes_back() -> None:
    fab = chain(1)
    other = CaAgent(node_guid=0x9000, clock=fab.clock)
    fab.add("sm2", other)
    fab.connect("sm2", 1, "s1", 2)
    # sm2 asks the SM's CA for SMInfo through s1
    (req,) = [a for a in other.send_mad(1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x20, path=[1, 6], tid=0x55))
              if isinstance(a, Send)]
    fab.handle("sm2", [req])
    fab.run()
    (at_sm,) = fab.delivered["sm"]
    assert mb.tid(at_sm.mad) == 0x55 and at_sm.mad[3] == 0x01 and at_sm.mad[6] == 3  # hp = n + 1
    resp = bytearray(at_sm.mad)
    resp[3] = 0x81
    resp[4] |= 0x80
    fab.send_mad("sm", 1, 0xFFFF, 0, 0, bytes(resp))
    (back,) = fab.delivered["sm2"]
    assert mb.tid(back.mad) == 0x55 and back.mad[3] == 0x81 and back.mad[6] == 0


def test_sminfo_without_sm_is_unsupported() -> None:
    fab = chain(1)
    got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x20, path=[1, 5]))
    assert len(got) == 1 and mb.status(got[0].mad) == 0x0C


def test_gsi_classes_registered_or_not() -> None:
    fab = chain(1)
    nodes = MiniSm(fab, "sm").bring_up()
    lid = {n.description: n.lid for n in nodes.values()}
    sa_get = bytearray(mb.pma(mb.GET, 0x0011, tid=0x77))
    sa_get[1], sa_get[2] = 0x03, 2  # SA class, version 2
    got = fab.send_mad("h", 1, lid["sm"], 1, 1, bytes(sa_get))
    assert len(got) == 1 and mb.status(got[0].mad) == 0x04  # nobody serves SA yet
    fab.agents["sm"].register_class(0x03)  # type: ignore[attr-defined]
    assert fab.send_mad("h", 1, lid["sm"], 1, 1, bytes(sa_get)) == []
    (req,) = fab.delivered["sm"][-1:]
    assert req.mad == bytes(sa_get) and req.slid == lid["h"] and req.sqp == 1 and req.qkey == 0x80010000


def test_lid_routed_loopback_to_own_lid() -> None:
    fab = chain(1)
    nodes = MiniSm(fab, "sm").bring_up()
    lid = {n.description: n.lid for n in nodes.values()}
    got = fab.send_mad("sm", 1, lid["sm"], 0, 0, mb.lr_smp(mb.GET, 0x11, tid=9))
    assert len(got) == 1 and mb.parse_node_info(mb.smp_data(got[0].mad)).node_type == 1
    got = fab.send_mad("sm", 1, lid["sm"], 1, 1, mb.pma(mb.GET, 0x12, data=mb.port_counters_select(1)))
    assert len(got) == 1 and mb.status(got[0].mad) == 0


def test_traps_without_an_sm_are_dropped() -> None:
    ca = CaAgent(node_guid=0x1000, link_up=[True])
    trap = bytearray(mb.lr_smp(mb.TRAP, 0x0002))
    pkt = frame_mad(trap, dlid=0xFFFF, slid=5, dqp=0, sqp=0, qkey=0, vl=15)
    assert not [a for a in ca.receive(1, pkt) if isinstance(a, DeliverMad)]
    ca.set_is_sm(1, True)
    assert [a for a in ca.receive(1, pkt) if isinstance(a, DeliverMad)]


def test_gsi_loopback_to_a_registered_class() -> None:
    ca = CaAgent(node_guid=0x1000, link_up=[True])
    d = only(ca.send_mad(1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, 0x15, path=[])), DeliverMad)
    only(ca.send_mad(1, 0xFFFF, 0, 0, mb.dr_smp(mb.SET, 0x15, path=[],
                                                data=mb.port_info_set(mb.smp_data(d.mad), lid=4))), DeliverMad)
    sa = bytearray(mb.pma(mb.GET, 0x0011, tid=0x78))
    sa[1] = 0x03
    assert not [a for a in ca.send_mad(1, 4, 1, 1, bytes(sa)) if isinstance(a, DeliverMad)]
    ca.register_class(0x03)
    d = only(ca.send_mad(1, 4, 1, 1, bytes(sa)), DeliverMad)
    assert d.mad == bytes(sa) and d.slid == 4 and d.dlid == 4
