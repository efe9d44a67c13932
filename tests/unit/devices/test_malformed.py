"""Hostile input: agents never raise, count what they drop, answer what deserves an answer."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibemu.agents.actions import Event, Send
from ibemu.agents.ca import CaAgent
from ibemu.agents.device import DeviceAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.wire import madcodec as mb
from ibemu.wire.decode import decode_native
from ibemu.wire.madpacket import frame_mad


def agents() -> list[DeviceAgent]:
    sw = SwitchAgent(node_guid=0x11, num_ports=4, link_up=[True] * 4)
    sw.ports[0].lid = 7
    block = bytearray(b"\xff" * 64)
    block[3] = 1  # the requester of the tests, LID 3, behind port 1
    sw.lft.set_block(0, block)
    sw.lft.set_top(63)
    ca = CaAgent(node_guid=0x22, num_ports=2, link_up=[True, True])
    ca.ports[1].lid = 9
    ca.set_is_sm(1, True)
    return [sw, ca]


def smp_packet(mad: bytes, *, dlid: int = 0xFFFF, slid: int = 0xFFFF, vl: int = 15, dqp: int = 0) -> bytes:
    return frame_mad(mad, dlid=dlid, slid=slid, dqp=dqp, sqp=dqp, vl=vl,
                     qkey=0 if dqp == 0 else 0x80010000)


def hop1(mad: bytes) -> bytes:
    out = bytearray(mad)
    out[6] = 1
    return bytes(out)


GOOD = smp_packet(hop1(mb.dr_smp(mb.GET, 0x11, path=[1])))


def flip(pkt: bytes, at: int) -> bytes:
    out = bytearray(pkt)
    out[at] ^= 0x10
    return bytes(out)


def responses(actions: list) -> list[Send]:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, Send)]


@pytest.mark.parametrize(("name", "packet", "counter", "stat"), [
    ("empty", b"", "port_rcv_errors", "rx_malformed"),
    ("truncated", GOOD[:100], "port_rcv_errors", "rx_malformed"),
    ("truncated MAD", GOOD[:200] + GOOD[-6:], "port_rcv_errors", "rx_malformed"),
    ("bad ICRC", flip(GOOD, 285), "port_rcv_errors", "rx_malformed"),
    ("bad VCRC", flip(GOOD, 289), "port_rcv_errors", "rx_malformed"),
    ("payload bit flip", flip(GOOD, 100), "port_rcv_errors", "rx_malformed"),
    ("oversized", GOOD + bytes(5000), "port_rcv_errors", "rx_malformed"),
    ("unknown class on QP0", smp_packet(bytes([1, 0x42]) + bytes(254)), "vl15_dropped", "rx_vl15_not_smp"),
    ("GSI class on VL15", smp_packet(mb.pma(mb.GET, 0x12)), "vl15_dropped", "rx_vl15_not_smp"),
])
def test_malformed_table(name: str, packet: bytes, counter: str, stat: str) -> None:
    for agent in agents():
        acts = agent.receive(1, packet)
        assert responses(acts) == [], name
        assert getattr(agent.counters(1), counter) == 1, name
        assert agent.stats[stat] == 1, name
        assert any(isinstance(a, Event) for a in acts), name


@pytest.mark.parametrize(("name", "mad", "status"), [
    ("unknown attribute", mb.dr_smp(mb.GET, 0x7777, path=[1]), 0x000C),
    ("bad class version", bytes([1, 0x81, 9]) + mb.dr_smp(mb.GET, 0x11, path=[1])[3:], 0x0004),
    ("bad base version", bytes([3]) + mb.dr_smp(mb.GET, 0x11, path=[1])[1:], 0x0004),
    ("unsupported method", mb.dr_smp(0x15, 0x11, path=[1]), 0x0008),
    ("bad PortInfo modifier", mb.dr_smp(mb.GET, 0x15, path=[1], modifier=0x123), 0x001C),
])
def test_answered_with_a_status(name: str, mad: bytes, status: int) -> None:
    for agent in agents():
        (send,) = responses(agent.receive(1, smp_packet(hop1(mad))))
        assert mb.status(send.packet[28:284]) == status, name


def test_gsi_class_not_supported_by_a_switch() -> None:
    sw = agents()[0]
    sw.ports[1].state = sw.ports[1].state.ACTIVE
    sa = bytearray(mb.pma(mb.GET, 0x11))
    sa[1] = 0x03
    (send,) = responses(sw.receive(1, smp_packet(bytes(sa), dlid=7, slid=3, vl=0, dqp=1)))
    assert mb.status(send.packet[28:284]) == 0x0004
    bad_qkey = bytearray(smp_packet(mb.pma(mb.GET, 0x12), dlid=7, slid=3, vl=0, dqp=1))
    struct.pack_into("!I", bad_qkey, 20, 0x1234)
    assert responses(sw.receive(1, frame_mad(bad_qkey[28:284], dlid=7, slid=3, dqp=1, sqp=1,
                                             qkey=0x1234))) == []
    assert sw.stats["gsi_bad_qkey"] == 1 and sw.ports[1].q_key_violations == 1


def test_no_such_port() -> None:
    for agent in agents():
        for port in (0 if isinstance(agent, SwitchAgent) else 3, 99, -1):
            acts = agent.receive(port, GOOD)
            assert responses(acts) == [] and agent.stats["rx_bad_port"] >= 1


def test_responses_to_responses_are_never_sent() -> None:
    for agent in agents():
        resp = bytearray(hop1(mb.dr_smp(mb.GET_RESP, 0x11, path=[1])))
        if isinstance(agent, SwitchAgent):
            assert responses(agent.receive(1, smp_packet(bytes(resp)))) == []
        trap = smp_packet(mb.lr_smp(mb.TRAP, 0x0002), dlid=0xFFFF, slid=5)
        assert responses(agent.receive(1, trap)) == []


fast = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(st.binary(max_size=400), st.integers(0, 5))
def test_random_bytes_never_raise(data: bytes, port: int) -> None:
    for agent in agents():
        agent.receive(port, data)
        assert agent.stats["internal_error"] == 0


@fast
@given(st.binary(min_size=256, max_size=256), st.sampled_from([(15, 0), (0, 1), (0, 0), (3, 5)]),
       st.sampled_from([0xFFFF, 7, 9, 1234]))
def test_random_mads_in_valid_packets(mad: bytes, vl_qp: tuple[int, int], dlid: int) -> None:
    """Correct framing and CRCs around random MAD bytes: the deep parsing paths."""
    vl, qp = vl_qp
    pkt = frame_mad(mad, dlid=dlid, slid=3, dqp=qp, sqp=qp, vl=vl, qkey=0x80010000 if qp else 0)
    for agent in agents():
        for n in (1, 2):
            agent.ports[n].state = agent.ports[n].state.ACTIVE
        for act in agent.receive(1, pkt):
            if isinstance(act, Send):  # anything we send is a valid packet, and a response
                decode_native(act.packet)
                assert act.packet[28 + 3] & 0x80
        assert agent.stats["internal_error"] == 0


ATTRS = [0x01, 0x02, 0x10, 0x11, 0x12, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1B, 0x1D, 0x20, 0xFF90]


@fast
@given(st.sampled_from([0x01, 0x81, 0x04, 0x03]), st.sampled_from([1, 2, 3, 5, 6, 7, 0x12, 0x81]),
       st.sampled_from(ATTRS), st.integers(0, 2**32 - 1) | st.integers(0, 40),
       st.binary(min_size=232, max_size=232), st.integers(0, 3), st.sampled_from([0xFFFF, 7, 9]))
def test_structured_random_mads(mclass: int, method: int, attr: int, modifier: int, body: bytes,
                                hp: int, dlid: int) -> None:
    """Valid headers with random attribute data, modifiers, hop pointers: every answer is
    a well-formed response to the request (same TID, R bit set)."""
    mad = bytearray(24) + bytearray(body)
    struct.pack_into("!BBBBHHQHHI", mad, 0, 1, mclass, 1, method, 0, 0, 0xC0FFEE, attr, 0, modifier)
    if mclass == 0x81:
        mad[4] &= 0x80
        mad[6], mad[7] = hp, 1
    qp = 1 if mclass in (0x03, 0x04) else 0
    pkt = frame_mad(bytes(mad), dlid=dlid, slid=3, dqp=qp, sqp=qp, vl=0 if qp else 15,
                    qkey=0x80010000 if qp else 0)
    for agent in agents():
        for n in (1, 2):
            agent.ports[n].state = agent.ports[n].state.ACTIVE
        before = {n: p.encode(n) for n, p in agent.ports.items()}
        for act in agent.receive(1, pkt):
            if isinstance(act, Send):
                decode_native(act.packet)
                out = act.packet[28:284]
                if out[3] != method:  # not a relayed request
                    assert mb.tid(out) == 0xC0FFEE and out[3] & 0x80
        assert agent.stats["internal_error"] == 0
        assert set(before) == set(agent.ports)


@fast
@given(st.integers(0, 255), st.integers(0, 255), st.booleans(), st.binary(min_size=128, max_size=128))
def test_random_hop_fields_and_paths(hp: int, hc: int, d: bool, paths: bytes) -> None:
    mad = bytearray(mb.dr_smp(mb.GET, 0x11, path=[1]))
    mad[6], mad[7] = hp, hc
    mad[4] |= d << 7
    mad[128:256] = paths
    for agent in agents():
        acts = agent.receive(2, smp_packet(bytes(mad)))
        assert agent.stats["internal_error"] == 0
        if hc > 63:
            assert responses(acts) == []
        for s in responses(acts):
            assert 1 <= s.port <= agent.num_ports
