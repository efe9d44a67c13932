"""The userspace forwarding decision: routes, relay checks, counters, seeded impairments."""

from __future__ import annotations

import pytest

from ibemu.agents.forwarder import Reason
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.errors import CrcError
from ibemu.wire import fast
from ibemu.wire.checks import verify_native_crcs


def data_packet(dlid: int, vl: int = 0, payload: bytes = b"x" * 100) -> bytes:
    return fast.NativeTemplate(slid=9, dlid=dlid, destqp=0x42, vl=vl).packet(0x0A, 1, payload,
                                                                             ext=fast.reth(0, 0, len(payload)))


def active_switch(seed: int = 0) -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x77, num_ports=4, link_up=[True] * 4, forwarder_seed=seed)
    for n in (1, 2, 3, 4):
        sw.ports[n].state = PortState.ACTIVE
    sw.ports[0].lid = 20
    block = bytearray(b"\xff" * 64)
    block[5], block[6], block[7], block[20] = 2, 3, 1, 0
    sw.lft.set_block(0, block)
    sw.lft.set_top(63)
    return sw


def test_forward_by_lft_and_count() -> None:
    sw = active_switch()
    pkt = data_packet(5)
    v = sw.forwarder.decide(pkt, 1)
    assert v.port == 2 and v.packet == pkt and v.reason is None
    assert sw.counters(1).rcv_pkts == 1 and sw.counters(2).xmit_pkts == 1
    assert sw.counters(2).xmit_octets == len(pkt)


@pytest.mark.parametrize(("dlid", "ingress", "reason", "counter_port", "counter"), [
    (8, 1, Reason.NO_ROUTE, 1, "port_rcv_switch_relay_errors"),
    (64, 1, Reason.NO_ROUTE, 1, "port_rcv_switch_relay_errors"),  # above LinearFDBTop
    (7, 1, Reason.LOOP, 1, "port_rcv_switch_relay_errors"),
    (0xC001, 1, Reason.MULTICAST, 1, "port_rcv_switch_relay_errors"),
    (0xFFFF, 1, Reason.PERMISSIVE, 1, "port_rcv_switch_relay_errors"),
])
def test_relay_errors(dlid: int, ingress: int, reason: Reason, counter_port: int, counter: str) -> None:
    sw = active_switch()
    v = sw.forwarder.decide(data_packet(dlid), ingress)
    assert v.port == 0 and v.reason == reason
    assert getattr(sw.counters(counter_port), counter) == 1


def test_sma_traffic_is_handed_over() -> None:
    sw = active_switch()
    assert sw.forwarder.decide(data_packet(0xFFFF, vl=15), 1).reason == Reason.TO_SMA  # directed route
    assert sw.forwarder.decide(data_packet(20), 1).reason == Reason.TO_SMA  # the switch's own LID
    assert sw.forwarder.decide(data_packet(20, vl=15), 1).reason == Reason.TO_SMA


def test_lid_routed_smps_are_switched_even_from_init_ports() -> None:
    sw = active_switch()
    want = sw.lft.lookup(5)
    sw.ports[1].state = PortState.INIT  # data would be refused here; VL15 is not
    v = sw.forwarder.decide(data_packet(5, vl=15), 1)
    assert v.reason is None and v.port == want
    assert sw.forwarder.decide(data_packet(5), 1).reason == Reason.INGRESS_NOT_ACTIVE


def test_port_states_gate_data() -> None:
    sw = active_switch()
    sw.ports[3].state = PortState.INIT
    v = sw.forwarder.decide(data_packet(6), 1)
    assert v.reason == Reason.EGRESS_DOWN and sw.counters(3).port_xmit_discards == 1
    sw.ports[1].state = PortState.INIT
    assert sw.forwarder.decide(data_packet(5), 1).reason == Reason.INGRESS_NOT_ACTIVE
    sw.link_down(2)
    assert sw.forwarder.decide(data_packet(5), 4).reason == Reason.EGRESS_DOWN


def test_bad_vcrc_and_length() -> None:
    sw = active_switch()
    bad = bytearray(data_packet(5))
    bad[-1] ^= 1
    assert sw.forwarder.decide(bytes(bad), 1).reason == Reason.BAD_VCRC
    assert sw.forwarder.decide(data_packet(5)[:-4], 1).reason == Reason.MALFORMED
    assert sw.counters(1).port_rcv_errors == 2


def test_seeded_loss_and_corruption_are_reproducible() -> None:
    outcomes = []
    for _ in range(2):
        sw = active_switch(seed=1234)
        sw.forwarder.set_impairment(2, loss=0.3, corrupt=0.2)
        run = [sw.forwarder.decide(data_packet(5), 1) for _ in range(400)]
        outcomes.append([(v.port, v.packet) for v in run])
        lost = sum(v.reason == Reason.INJECTED_LOSS for v in run)
        assert 80 < lost < 160
        corrupted = [v.packet for v in run if v.port and v.packet != data_packet(5)]
        assert 30 < len(corrupted) < 90
        for pkt in corrupted:
            with pytest.raises(CrcError):
                verify_native_crcs(pkt)
    assert outcomes[0] == outcomes[1]
    sw.forwarder.set_impairment(2)
    assert sw.forwarder.decide(data_packet(5), 1).port == 2
    with pytest.raises(ValueError):
        sw.forwarder.set_impairment(2, loss=1.5)


def test_agent_forwards_transit_data_it_is_given() -> None:
    sw = active_switch()
    (send,) = sw.receive(1, data_packet(6))
    assert send.port == 3  # type: ignore[union-attr]
