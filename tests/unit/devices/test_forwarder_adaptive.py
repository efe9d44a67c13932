"""``Forwarder.adapt``: adaptive routing's choice among a DLID's group (the LFT's port and its
alternates), sans-IO, with the load of each port given."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ibemu.agents.forwarder import AdaptiveRouting
from ibemu.agents.port import PhysState, PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.wire import fast

DLID = 33


def switch(mode: str = "packet", gap_ns: int = 1000) -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x77, num_ports=6, link_up=[True] * 6)
    for n in range(1, 7):
        sw.ports[n].state = PortState.ACTIVE
    sw.ports[0].lid = 20
    sw.lft.set_block(0, bytes([0] * DLID + [3] + [0] * (63 - DLID)))  # DLID -> port 3 only
    sw.lft.set_top(63)
    block = bytearray(64)
    block[(DLID % 16) * 4:(DLID % 16) * 4 + 2] = bytes([4, 5])  # alternates 4, 5
    sw.alternates[DLID // 16] = bytes(block)
    sw.forwarder.adaptive = AdaptiveRouting(mode, gap_ns)
    return sw


def pkt(*, dlid: int = DLID, qp: int = 0x42, slid: int = 9, vl: int = 0) -> bytes:
    return fast.NativeTemplate(slid=slid, dlid=dlid, destqp=qp, vl=vl).packet(0x04, 0, b"x" * 64)


def loads(**by_port: int) -> Callable[[int], int]:
    return lambda p: by_port.get(f"p{p}", 0)


def test_least_loaded_port_of_the_group_ties_round_robin() -> None:
    sw = switch()
    f = sw.forwarder
    p = pkt()
    f.ports[3].counters.add_tx(len(p))  # what forward_run counted on the decided port
    assert f.adapt(p, 0, 1, 3, 0, loads(p3=5000, p4=100, p5=100)) == 4  # least loaded; tie: 4 looked at first
    assert f.ports[3].counters.xmit_pkts == 0 and f.ports[4].counters.xmit_pkts == 1  # the count moved
    assert f.adapt(p, 0, 1, 3, 0, loads(p3=5000, p4=200, p5=100)) == 5
    assert [f.adapt(p, 0, 1, 3, 0, loads()) for _ in range(6)] == [5, 3, 4, 5, 3, 4]  # all idle: in turn (third decision)
    assert f.stats["ar_decisions"] == 8 and f.stats["ar_moved"] == 6


def test_ingress_and_ports_that_cannot_carry_are_passed_over() -> None:
    sw = switch()
    f = sw.forwarder
    p = pkt()
    assert f.adapt(p, 0, 4, 3, 0, loads(p3=5000, p4=0, p5=100)) == 5  # 4 is the ingress
    sw.ports[5].phys = PhysState.DISABLED
    assert f.adapt(p, 0, 4, 3, 0, loads(p3=0, p4=0, p5=0)) == 3  # the only one left
    sw.ports[3].state = PortState.INIT
    assert f.adapt(p, 0, 4, 3, 0, loads()) == 3  # none can carry it: left where it was decided


@pytest.mark.parametrize("what", ["off", "vl15", "no-group", "not-in-group"])
def test_left_alone(what: str) -> None:
    sw = switch()
    f = sw.forwarder
    p, egress = pkt(), 3
    if what == "off":
        f.adaptive = None
    elif what == "vl15":
        p = pkt(vl=15)
    elif what == "no-group":
        p = pkt(dlid=34)
    else:
        egress = 6
    assert f.adapt(p, 0, 1, egress, 0, loads(p3=9999, p6=9999)) == egress
    assert not f.stats["ar_decisions"]


def test_flowlets_keep_their_port_within_the_gap() -> None:
    sw = switch("flowlet", gap_ns=1000)
    f = sw.forwarder
    a, b = pkt(qp=0x42), pkt(qp=0x43)
    assert f.adapt(a, 0, 1, 3, 0, loads(p3=100)) == 4
    assert f.adapt(a, 0, 1, 3, 900, loads(p4=500)) == 4  # same flowlet: stays, though 4 is loaded now
    assert f.adapt(b, 0, 1, 3, 900, loads(p4=500, p5=500)) == 3  # another QP: a flow of its own
    assert f.adapt(a, 0, 1, 3, 1800, loads(p4=500)) == 4  # 900 ns after its last packet: still one flowlet
    assert f.adapt(a, 0, 1, 3, 2900, loads(p4=500, p5=500)) == 3  # a gap of 1100 ns: a new flowlet chooses again
    sw.ports[3].phys = PhysState.DISABLED
    assert f.adapt(a, 0, 1, 4, 3000, loads(p4=500)) == 5  # its port cannot carry: chooses again (5 idle)
    assert f.stats["ar_decisions"] == 4  # the two packets kept by their flowlet chose nothing


def test_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="packet, flowlet"):
        AdaptiveRouting("spray")
    assert AdaptiveRouting.from_json(AdaptiveRouting("flowlet", 5).to_json()) == AdaptiveRouting("flowlet", 5)
