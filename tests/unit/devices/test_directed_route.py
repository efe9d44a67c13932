"""Directed-route SMPs through chains and trees of agents: hop pointers on every link."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.agents import dr
from ibemu.agents.actions import DeliverMad, Send
from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.wire import madcodec as mb
from ibemu.wire import read_pcap
from ibemu.wire.madpacket import MAD_OFFSET, frame_mad

from .fabrics import chain, tree
from .minism import MiniSm

NODE_INFO = 0x11
M = MAD_OFFSET


def hp_hc_d(packet: bytes) -> tuple[int, int, int]:
    return packet[M + 6], packet[M + 7], packet[M + 4] >> 7


def test_hop_pointer_on_each_link_of_a_three_switch_chain() -> None:
    fab = chain(3)
    fab.wire.clear()
    path = [1, 3, 3, 5]  # sm port 1, s1 port 3, s2 port 3, s3 port 5 -> h
    got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, NODE_INFO, path=path, tid=42))
    links = [("sm", 1), ("s1", 3), ("s2", 3), ("s3", 5)]
    out = [(r.src, r.src_port) for r in fab.wire[:4]]
    back = [(r.dst, r.dst_port) for r in fab.wire[4:]]
    assert out == links and back == links[::-1], "request out and response back on the same links"
    for k, rec in enumerate(fab.wire[:4], start=1):  # request on link k: hp = k
        assert hp_hc_d(rec.packet) == (k, 4, 0), f"request on link {k}"
    for k, rec in zip((4, 3, 2, 1), fab.wire[4:], strict=True):  # response on link k: hp = k
        assert hp_hc_d(rec.packet) == (k, 4, 1), f"response on link {k}"
    for rec in fab.wire:
        assert rec.packet[2:4] == b"\xff\xff" and rec.packet[6:8] == b"\xff\xff"  # LRH permissive
        assert rec.packet[0] >> 4 == 15
    assert len(got) == 1
    resp = got[0].mad
    assert mb.hop_pointer(resp) == 0 and resp[4] >> 7 == 1 and resp[3] == 0x81
    assert mb.return_path(resp) == [6, 1, 1, 1]  # ingress port at s1, s2, s3, h
    ni = mb.parse_node_info(mb.smp_data(resp))
    assert ni.node_guid == 0x0002C90000000200 and ni.node_type == 1 and ni.local_port_num == 1


def test_every_node_of_a_tree_is_reachable_by_directed_route() -> None:
    fab = tree()
    nodes = MiniSm(fab, "sm").discover()
    assert {n.guid for n in nodes.values()} == {a.node_guid for a in fab.agents.values()}
    leaf2 = next(n for n in nodes.values() if n.description == "leaf2")
    assert leaf2.node_type == 2 and leaf2.num_ports == 8 and len(leaf2.path) == 3
    assert set(leaf2.links) == {1, 2, 5, 6, 7}


def test_hardware_capture_subnget_is_relayed_and_its_response_delivered(hw_capture: Path) -> None:
    """Frame 1 (SubnGet SMInfo, hp 1/hc 2, InitialPath [2, 3]) as it reached the first
    switch on port 6; frame 2 (the GetResp, hp 1/hc 2, ReturnPath [6, 1]) at the SM's CA."""
    frames = [r.data for r in read_pcap(hw_capture)]
    sw = SwitchAgent(node_guid=0x0002C90000001111, num_ports=8, link_up=[True] * 8)
    acts = sw.receive(6, frames[0])
    sends = [a for a in acts if isinstance(a, Send)]
    assert len(sends) == 1 and sends[0].port == 3
    out = sends[0].packet
    assert hp_hc_d(out) == (2, 2, 0) and out[M + 192 + 1] == 6
    ca = CaAgent(node_guid=0x0002C9020020B4DC, num_ports=2, link_up=[True, True])
    ca.set_is_sm(2, True)
    acts = ca.receive(2, frames[1])
    delivered = [a for a in acts if isinstance(a, DeliverMad)]
    assert len(delivered) == 1 and delivered[0].port == 2
    assert mb.hop_pointer(delivered[0].mad) == 0 and delivered[0].slid == 0xFFFF
    assert mb.return_path(delivered[0].mad) == [6, 1]


def test_our_request_on_the_first_link_matches_the_capture(hw_capture: Path) -> None:
    frames = [r.data for r in read_pcap(hw_capture)]
    ca = CaAgent(node_guid=0x0002C9020020B4DC, num_ports=2, link_up=[True, True])
    mad = bytearray(frames[0][M : M + 256])
    mad[6] = 0  # what the SM hands to its MAD layer
    acts = ca.send_mad(2, 0xFFFF, 0, 0, bytes(mad))
    (send,) = [a for a in acts if isinstance(a, Send)]
    assert send.port == 2
    assert send.packet[M : M + 256] == frames[0][M : M + 256]  # byte-identical MAD
    assert send.packet[:12] == frames[0][:12]  # LRH and BTH up to the P_Key


def test_lid_routed_head_and_tail_of_a_directed_route() -> None:
    """DrSLID = SM LID (LID-routed to s1, directed s1 -> s2 -> s3), DrDLID = h's LID."""
    fab = chain(3)
    sm = MiniSm(fab, "sm")
    nodes = sm.bring_up()
    lid = {n.description: n.lid for n in nodes.values()}
    mad = mb.dr_smp(mb.GET, NODE_INFO, path=[3, 3], dr_slid=lid["sm"], dr_dlid=lid["h"], tid=77)
    fab.wire.clear()
    got = fab.send_mad("sm", 1, lid["s1"], 0, 0, mad)
    assert len(got) == 1 and mb.status(got[0].mad) == 0
    assert mb.parse_node_info(mb.smp_data(got[0].mad)).node_guid == fab.agents["h"].node_guid
    hops = [(r.src, hp_hc_d(r.packet), int.from_bytes(r.packet[2:4], "big")) for r in fab.wire]
    assert hops == [
        ("sm", (0, 2, 0), lid["s1"]),  # LID-routed head
        ("s1", (1, 2, 0), 0xFFFF),  # directed part
        ("s2", (2, 2, 0), 0xFFFF),
        ("s3", (3, 2, 0), lid["h"]),  # LID-routed tail
        ("h", (3, 2, 1), lid["s3"]),  # response LID-routed back to the end of the DR part
        ("s3", (2, 2, 1), 0xFFFF),
        ("s2", (1, 2, 1), 0xFFFF),
        ("s1", (0, 2, 1), lid["sm"]),  # LID-routed to DrSLID
    ]


@pytest.mark.parametrize(("hp", "hc", "d", "reason"), [
    (5, 2, 0, "hop_pointer"),  # beyond n+1
    (0, 2, 0, "hop_pointer"),  # sender did not increment
    (1, 64, 0, "hop_count"),
    (1, 200, 0, "hop_count"),
    (0, 0, 0, "hop_count_zero_on_wire"),
    (7, 3, 1, "hop_pointer"),
])
def test_unreasonable_hop_pointers_are_discarded_and_counted(hp: int, hc: int, d: int, reason: str) -> None:
    sw = SwitchAgent(node_guid=0x55, num_ports=4, link_up=[True] * 4)
    mad = bytearray(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 2, 3][: min(hc, 3)], tid=1))
    mad[6], mad[7] = hp, hc
    mad[4] |= d << 7
    acts = sw.receive(2, frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15))
    assert not [a for a in acts if isinstance(a, Send)]
    assert sw.stats[f"dr_discard_{reason}"] == 1


def test_relay_to_port_zero_or_beyond_num_ports_is_discarded() -> None:
    sw = SwitchAgent(node_guid=0x55, num_ports=4, link_up=[True] * 4)
    for bad in (0, 5, 255):
        mad = bytearray(mb.dr_smp(mb.GET, NODE_INFO, path=[1, bad, 1], tid=1))
        mad[6] = 1
        acts = sw.receive(1, frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15))
        assert not [a for a in acts if isinstance(a, Send)]
    assert sw.stats["dr_discard_bad_port"] == 3


def test_a_ca_never_relays() -> None:
    ca = CaAgent(node_guid=0x77, num_ports=2, link_up=[True, True])
    mad = bytearray(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 2, 1], tid=1))
    mad[6] = 1
    acts = ca.receive(1, frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15))
    assert not [a for a in acts if isinstance(a, Send)] and ca.stats["dr_discard_ca_relay"] == 1


def test_relay_on_a_down_port_is_dropped_and_counted() -> None:
    fab = chain(2)
    fab.link_down("s2", 5)
    got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3, 5]))
    assert got == []
    s2 = fab.agents["s2"]
    assert s2.stats["dr_discard_egress_down"] == 1 and s2.counters(5).port_xmit_discards == 1


def test_dr_rules_module_on_a_bare_buffer() -> None:
    """The rules without agents: n = 2, a switch at hop 1 relays to InitialPath[2]."""
    buf = bytearray(M) + bytearray(mb.dr_smp(mb.GET, NODE_INFO, path=[4, 7])) + bytearray(6)
    buf[M + 6] = 1
    assert dr.on_receive(buf, M, 8, is_switch=True, num_ports=8, lid_routed=False) == (dr.PORT, 7)
    assert buf[M + 6] == 2 and buf[M + 192 + 1] == 8
    assert dr.on_receive(buf, M, 1, is_switch=False, num_ports=1, lid_routed=False) == (dr.CONSUME, 0)
    assert buf[M + 6] == 3 and buf[M + 192 + 2] == 1
    assert dr.on_respond(buf, M, num_ports=1, request_lid_routed=False, request_slid=0) == (dr.PORT, 1)
    assert buf[M + 6] == 2 and buf[M + 4] >> 7 == 1
    assert dr.on_receive(buf, M, 7, is_switch=True, num_ports=8, lid_routed=False) == (dr.PORT, 8)
    assert buf[M + 6] == 1
    assert dr.on_receive(buf, M, 4, is_switch=False, num_ports=1, lid_routed=False) == (dr.CONSUME, 0)
    assert buf[M + 6] == 0
