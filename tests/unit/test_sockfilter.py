"""The socket filters that split a host port's frames between its management agent and its transport."""

from __future__ import annotations

import pytest

from ibemu.kernel.sockfilter import (
    CA_MANAGEMENT,
    DATA_ONLY,
    MANAGEMENT_ONLY,
    SM_OWN_TID_TAG,
    matches,
    qp_range,
)
from ibemu.wire import fast
from ibemu.wire.madpacket import frame_mad

ETH = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)


def native(destqp: int, *, grh: bool = False) -> bytes:
    pkt = bytearray(fast.NativeTemplate(slid=1, dlid=2, destqp=destqp).packet(0x04, 0, b"x" * 16))
    if grh:  # LNH 3 and a 40-byte GRH between LRH and BTH
        pkt[1] = (pkt[1] & ~3) | 3
        pkt[8:8] = bytes(40)
    return ETH + bytes(pkt)


@pytest.mark.parametrize("grh", [False, True])
@pytest.mark.parametrize(("qp", "mad"), [(0, True), (1, True), (2, False), (0x11, False), (0xFFFFFF, False)])
def test_qp0_qp1_go_to_the_agent_and_the_rest_to_the_transport(qp: int, mad: bool, grh: bool) -> None:
    frame = native(qp, grh=grh)
    assert matches(MANAGEMENT_ONLY, frame) is mad
    assert matches(CA_MANAGEMENT, frame) is mad
    assert matches(DATA_ONLY, frame) is not mad


def test_raw_packets_go_to_the_agent_which_counts_them() -> None:
    frame = bytearray(native(0x11))
    frame[15] &= ~3  # LNH 0: raw
    assert matches(MANAGEMENT_ONLY, bytes(frame)) and not matches(DATA_ONLY, bytes(frame))
    assert matches(CA_MANAGEMENT, bytes(frame))


def test_runts_are_dropped_by_both() -> None:
    assert not matches(DATA_ONLY, ETH + b"\x00\x02")
    assert not matches(MANAGEMENT_ONLY, ETH + b"\x00\x02\x00")


@pytest.mark.parametrize(("qp", "inside"), [(0, False), (1, False), (0x0FFF, False), (0x1000, True),
                                            (0x1FFF, True), (0x2000, False), (0xFFFFFF, False)])
def test_a_qp_range_takes_only_its_own_qps(qp: int, inside: bool) -> None:
    prog = qp_range(0x1000, 0x2000)
    assert matches(prog, native(qp)) is inside
    assert matches(prog, native(qp, grh=True)) is inside


def test_qp_ranges_stay_clear_of_qp0_and_qp1() -> None:
    with pytest.raises(ValueError):
        qp_range(1, 10)


def smp(method: int, tid: int, *, qp: int = 0) -> bytes:
    mad = bytearray(256)
    mad[0], mad[1], mad[2], mad[3] = 1, 0x81, 1, method
    mad[8:16] = tid.to_bytes(8, "big")
    return ETH + frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=qp, sqp=0, qkey=0, vl=15)


@pytest.mark.parametrize(("method", "tid", "agent"), [
    (0x81, (SM_OWN_TID_TAG << 48) | 7, False),  # the SM's own port's response: its socket's only
    (0x81, 7, True),                            # a MAD-socket client's response
    (0x81, (0xFFFE << 48) | 7, True),
    (0x01, (SM_OWN_TID_TAG << 48) | 7, True),   # a request (the local SMA answers it)
    (0x05, (SM_OWN_TID_TAG << 48) | 7, True),   # a trap
])
def test_the_ca_agent_leaves_the_sm_own_port_responses_to_it(method: int, tid: int, agent: bool) -> None:
    frame = smp(method, tid)
    assert matches(MANAGEMENT_ONLY, frame)
    assert matches(CA_MANAGEMENT, frame) is agent
