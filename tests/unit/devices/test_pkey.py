"""Partition enforcement at a switch's external ports (IBA 10.9) and trap 257.

Membership rules, inbound and outbound enforcement by the PortInfo bits, raw packet filters,
the exemption of VL15, the constraint counters and P_KeyViolations, and trap 257 (Bad P_Key)
to the SM, rate-limited per port and direction.
"""

from __future__ import annotations

import pytest

from ibemu.agents.actions import Send
from ibemu.agents.forwarder import (
    ENFORCE_IN,
    ENFORCE_OUT,
    FILTER_RAW_IN,
    Reason,
    packet_pkey,
    pkey_matches,
    table_admits,
)
from ibemu.agents.port import PortState
from ibemu.agents.switch import PKEY_TRAP_INTERVAL_NS, SwitchAgent
from ibemu.wire import fast
from ibemu.wire.crc import vcrc_calc
from ibemu.wire.madattrs import decode_trap257, notice_fields

SM_LID = 5


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000_000

    def __call__(self) -> int:
        return self.t


def switch(clock: Clock | None = None) -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x99, num_ports=4, link_up=[True] * 4, clock=clock)
    for n in range(1, 5):
        sw.ports[n].state = PortState.ACTIVE
    sw.ports[0].lid = 20
    sw.ports[0].master_sm_lid = SM_LID
    block = bytearray(b"\xff" * 64)
    block[SM_LID], block[7], block[8] = 4, 2, 3  # SM behind port 4; LID 7 on port 2, LID 8 on port 3
    sw.lft.set_block(0, bytes(block))
    sw.lft.set_top(63)
    return sw


def data(pkey: int, dlid: int = 7, *, vl: int = 0, slid: int = 9) -> bytes:
    return fast.NativeTemplate(slid=slid, dlid=dlid, destqp=0x42, vl=vl, pkey=pkey).packet(0x04, 1, b"x" * 16)


def raw(dlid: int = 7) -> bytes:
    """A raw packet (LNH 0): LRH, 8 bytes of payload, VCRC."""
    body = bytes([0, 0x00, 0, dlid, 0, 4, 0, 9]) + b"r" * 8
    return body + vcrc_calc(body).to_bytes(2, "little")


@pytest.mark.parametrize(("entry", "pkey", "ok"), [
    (0xFFFF, 0xFFFF, True), (0xFFFF, 0x7FFF, True), (0x7FFF, 0xFFFF, True), (0x7FFF, 0x7FFF, False),
    (0x8001, 0x0001, True), (0x0001, 0x8001, True), (0x0001, 0x0001, False), (0x8001, 0x8002, False),
    (0x8000, 0x8000, False), (0x0000, 0x0000, False),
])
def test_membership_rules(entry: int, pkey: int, ok: bool) -> None:
    assert pkey_matches(entry, pkey) is ok
    assert table_admits([0x8005, entry], pkey) is ok  # another partition's entry changes nothing


@pytest.mark.parametrize(("entry", "pkey", "ok"), [
    (0xFFFF, 0xFFFF, True), (0xFFFF, 0x7FFF, True), (0x7FFF, 0xFFFF, False), (0x7FFF, 0x7FFF, True),
    (0x8001, 0x0001, True), (0x0001, 0x8001, False), (0x0001, 0x0001, True), (0x8001, 0x8002, False),
    (0x8000, 0x8000, False),
])
def test_inbound_a_claim_must_not_exceed_the_membership(entry: int, pkey: int, ok: bool) -> None:
    assert table_admits([0x8005, entry], pkey, inbound=True) is ok


def test_an_empty_table_is_the_default_partition() -> None:
    assert table_admits([], 0xFFFF) and table_admits([], 0x7FFF) and not table_admits([], 0x8001)
    assert packet_pkey(data(0x8001)) == 0x8001 and packet_pkey(raw()) is None


def test_inbound_enforcement_drops_counts_and_leaves_other_ports_alone() -> None:
    sw = switch()
    f = sw.forwarder
    p1 = sw.ports[1]
    p1.pkeys = [0x7FFF, 0x8001, 0x0002]
    assert f.decide(data(0x8003), 1).port == 2  # not enforced yet: anything passes
    p1.partition_flags = ENFORCE_IN
    assert f.decide(data(0x8001), 1).port == 2
    assert f.decide(data(0x0001), 1).port == 2  # limited packet, full entry
    assert f.decide(data(0x0002), 1).port == 2  # limited packet, limited entry: its own claim
    assert f.decide(data(0x7FFF), 1).port == 2
    for bad in (0x8002, 0x8003, 0xFFFF, 0x0000):
        v = f.decide(data(bad), 1)
        assert (v.port, v.reason) == (0, Reason.PKEY_INBOUND), hex(bad)
    assert p1.counters.port_rcv_constraint_errors == 4 and p1.p_key_violations == 4
    assert sw.ports[2].counters.port_xmit_constraint_errors == 0
    assert f.decide(data(0x8003, dlid=8), 2).port == 3  # port 2 does not enforce
    assert f.decide(data(0x8003, vl=15), 1).port == 2  # VL15 is exempt
    assert f.decide(data(0x8003, dlid=20), 1).reason is Reason.TO_SMA  # for the switch itself
    assert f.decide(raw(), 1).port == 2  # raw packets pass unless filtered
    p1.partition_flags = ENFORCE_IN | FILTER_RAW_IN
    assert f.decide(raw(), 1).reason is Reason.PKEY_INBOUND
    assert p1.counters.port_rcv_constraint_errors == 5
    assert [d.pkey for d in f.pkey_drops] == [0x8002, 0x8003, 0xFFFF, 0x0000, 0]
    assert f.pkey_drops[0].slid == 9 and f.pkey_drops[0].dlid == 7 and f.pkey_drops[0].dest_qp == 0x42


def test_outbound_enforcement_counts_on_the_egress_port() -> None:
    sw = switch()
    p2 = sw.ports[2]
    p2.pkeys = [0x8001, 0x0003]
    p2.partition_flags = ENFORCE_OUT
    assert sw.forwarder.decide(data(0x0001), 1).port == 2
    assert sw.forwarder.decide(data(0x8003), 1).port == 2
    v = sw.forwarder.decide(data(0x0003), 1)  # limited to limited
    assert (v.port, v.reason) == (0, Reason.PKEY_OUTBOUND)
    v = sw.forwarder.decide(data(0x8002), 1)
    assert (v.port, v.reason) == (0, Reason.PKEY_OUTBOUND)
    assert p2.counters.port_xmit_constraint_errors == 2 and p2.counters.xmit_pkts == 2
    assert sw.ports[1].counters.port_rcv_constraint_errors == 0
    assert sw.forwarder.decide(data(0x8002, dlid=8), 1).port == 3


def test_forward_run_leaves_enforced_drops_to_decide() -> None:
    sw = switch()
    sw.ports[1].pkeys = [0x8001]
    sw.ports[1].partition_flags = ENFORCE_IN
    eth = bytes(14)
    good, bad = eth + data(0x8001), eth + data(0x8002)
    out: dict[int, list[bytes]] = {}
    assert sw.forwarder.forward_run([good, good, bad, good], 0, 1, 14, out) == 2
    assert out[2] == [good, good] and sw.ports[1].counters.port_rcv_constraint_errors == 0


def test_trap_257_goes_to_the_sm_rate_limited() -> None:
    clock = Clock()
    sw = switch(clock)
    sw.ports[1].pkeys = [0x8001]
    sw.ports[1].partition_flags = ENFORCE_IN
    for _ in range(5):
        sw.forwarder.decide(data(0x8002), 1)
    assert sw.next_deadline() == clock.t
    actions = sw.tick()
    sends = [a for a in actions if isinstance(a, Send)]
    assert len(sends) == 1 and sends[0].port == 4
    pkt = sends[0].packet
    assert pkt[0] >> 4 == 15 and (pkt[2] << 8 | pkt[3]) == SM_LID
    mad = pkt[8 + 12 + 8:]
    notice = mad[64:128]
    assert notice_fields(notice) == (1, 257, 20)
    d = decode_trap257(notice)
    assert (d["lid1"], d["lid2"], d["pkey"], d["qp2"]) == (9, 7, 0x8002, 0x42)
    assert sw.stats["pkey_traps_suppressed"] == 4
    assert sw.ports[1].counters.port_rcv_constraint_errors == 5
    sw.forwarder.decide(data(0x8002), 1)
    sw.tick()
    assert sw.stats["traps_sent"] == 1 and sw.stats["pkey_traps_suppressed"] == 5  # within the interval
    clock.t += PKEY_TRAP_INTERVAL_NS
    sw.forwarder.decide(data(0x8002), 1)
    new = [a for a in sw.tick() if isinstance(a, Send)]
    assert len(new) >= 1
    assert sw.stats["traps_sent"] == 2


def test_switch_info_announces_the_enforcement_caps() -> None:
    sw = switch()
    assert sw.switch_info.encode()[16] & 0xF0 == 0xF0


def test_counter_saturates_in_the_pma_encoding() -> None:
    sw = switch()
    sw.ports[1].pkeys = [0x8001]
    sw.ports[1].partition_flags = ENFORCE_IN | ENFORCE_OUT
    for _ in range(300):
        sw.forwarder.decide(data(0x8002), 1)
    assert sw.ports[1].counters.port_rcv_constraint_errors == 300
    area = sw.ports[1].counters.encode_basic(1)
    assert area[17] == 255  # PortRcvConstraintErrors: an 8-bit field that saturates
    assert sw.ports[1].counters.port_xmit_constraint_errors == 0  # outbound bits act on leaving packets


def test_the_switch_announces_partition_changes_for_the_kernel_datapath() -> None:
    """A P_KeyTable Set or a PortInfo Set that changes a port's enforcement bits gives a
    ``PartitionUpdate`` (the agent host writes it into the kernel classifier's map); a Set
    that changes nothing gives none."""
    import struct

    from ibemu.agents.actions import PartitionUpdate
    from ibemu.wire import madcodec as mb

    sw = switch()

    def smp(attr: int, mod: int, data: bytes) -> list[object]:
        req = mb.lr_smp(mb.SET, attr, modifier=mod, data=data)
        pkt = sw._build(req, dlid=20, slid=SM_LID, dqp=0, sqp=0, vl=15)
        return [a for a in sw.receive(4, pkt) if isinstance(a, PartitionUpdate)]

    table = struct.pack("!32H", 0xFFFF, 0x8001, *([0] * 30))
    assert smp(0x16, 2 << 16, table) == [PartitionUpdate(2, 0, (0xFFFF, 0x8001, *([0] * 30)))]
    assert smp(0x16, 2 << 16, table) == []
    get = mb.lr_smp(mb.GET, 0x15, modifier=2)
    resp = [a for a in sw.receive(4, sw._build(get, dlid=20, slid=SM_LID, dqp=0, sqp=0, vl=15))
            if isinstance(a, Send)]
    pi = mb.smp_data(resp[0].packet[8 + 12 + 8:-6])
    ups = smp(0x15, 2, mb.port_info_set(pi, partition_flags=ENFORCE_IN | ENFORCE_OUT))
    assert ups == [PartitionUpdate(2, 12, (0xFFFF, 0x8001, *([0] * 30)))]
    assert sw.ports[2].partition_flags == 12
