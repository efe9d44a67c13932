"""Golden bytes for the ibsim client protocol, written by hand from ref/umad-socket.md."""

from __future__ import annotations

import pytest

from ibemu.errors import DecodeError
from ibemu.wire.umad import (
    CTL_LEN,
    SIM_REQUEST_LEN,
    ClientInfo,
    CtlMessage,
    CtlType,
    SimRequest,
    Vendor,
    error_reply_for,
    is_response_like,
    mad_tid,
    pack_port,
    set_mad_tid,
    unpack_port,
)


def h(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


def test_ctl_types_are_ibsims_enum() -> None:
    assert [t.name for t in CtlType] == [
        "ERROR", "CONNECT", "DISCONNECT", "GET_PORT", "GET_VENDOR", "GET_GID", "GET_GUID",
        "GET_NODEINFO", "GET_PORTINFO", "SET_ISSM", "GET_PKEYS"]
    assert [int(t) for t in CtlType] == list(range(11))


def test_connect_message_golden() -> None:
    info = ClientInfo(id=1234, qp=0, issm=1, nodeid="h1")
    msg = CtlMessage(CtlType.CONNECT, clientid=0, data=info.pack(), length=44)
    expected = h("""
        efbeadde 00000000 01000000 2c000000
        d2040000 00000000 01000000 6831""") + bytes(30) + bytes(20)
    assert msg.pack() == expected
    assert len(expected) == CTL_LEN
    back = CtlMessage.unpack(expected)
    assert (back.magic, back.clientid, back.type, back.length) == (0xDEADBEEF, 0, 1, 44)
    assert ClientInfo.unpack(back.data) == info


def test_client_info_nodeid_is_31_chars_and_nul_terminated() -> None:
    info = ClientInfo(7, nodeid="x" * 40)
    raw = info.pack()
    assert len(raw) == 44 and raw[12:43] == b"x" * 31 and raw[43] == 0
    assert ClientInfo.unpack(raw).nodeid == "x" * 31
    assert ClientInfo.unpack(b"").id == 0  # short data is zero-filled, never raises


def test_reply_overwrites_start_of_data_and_keeps_the_rest() -> None:
    msg = CtlMessage(CtlType.GET_PORTINFO, clientid=3, data=b"\x02" + b"\xee" * 63, length=64)
    reply = msg.reply(b"\x11\x22")
    assert reply.data == b"\x11\x22" + b"\xee" * 62
    assert (reply.type, reply.clientid, reply.length) == (CtlType.GET_PORTINFO, 3, 64)
    assert msg.error().type == CtlType.ERROR and msg.error().data == msg.data


@pytest.mark.parametrize("size", [0, 1, 79, 81, 288])
def test_ctl_wrong_size_is_a_decode_error(size: int) -> None:
    with pytest.raises(DecodeError):
        CtlMessage.unpack(bytes(size))


def test_ctl_data_too_long_refused() -> None:
    with pytest.raises(ValueError):
        CtlMessage(CtlType.GET_PORT, data=bytes(65)).pack()


def test_error_reply_for_garbage() -> None:
    assert error_reply_for(b"") == h("efbeadde 00000000 00000000") + bytes(68)
    # clientid survives, type becomes 0, the rest is echoed and padded to 80
    raw = h("00000000 05000000 07000000 aabb")
    assert error_reply_for(raw) == h("efbeadde 05000000 00000000 aabb") + bytes(66)
    assert len(error_reply_for(bytes(500))) == CTL_LEN


def test_vendor_golden() -> None:
    v = Vendor(vendor_id=0x02C9, vendor_part_id=0x1017, hw_ver=0xA0, fw_ver=1)
    assert v.pack() == h("c9020000 17100000 a0000000 00000000 01000000 00000000")
    assert Vendor.unpack(v.pack() + bytes(40)) == v


def test_port_golden() -> None:
    assert pack_port(0x17, 4) == h("1700 04 00")
    assert unpack_port(h("3412 02 00")) == (0x1234, 2)


def test_sim_request_golden() -> None:
    mad = bytes(range(256))
    req = SimRequest(dlid=0xFFFF, slid=0x0017, dqp=0, sqp=1, mad=mad, status=110,
                     length=256, pad=h("aabbccdd"))
    expected = h("""
        ffff0000 00170000 00000000 00000001
        0000006e aabbccdd 00000000 00000100""") + mad
    assert req.pack() == expected
    assert len(expected) == SIM_REQUEST_LEN
    assert SimRequest.unpack(expected) == req


def test_sim_request_ignores_high_bytes_of_lid_fields_and_pads_short_mads() -> None:
    raw = bytearray(SimRequest(1, 2, 3, 4, b"\x01\x81").pack())
    raw[2:4] = b"\xff\xff"  # not ours to interpret: only the big-endian u16 counts
    req = SimRequest.unpack(bytes(raw))
    assert (req.dlid, req.slid, req.dqp, req.sqp) == (1, 2, 3, 4)
    assert req.mad == b"\x01\x81" + bytes(254)


@pytest.mark.parametrize("size", [0, 32, 287, 289, 512])
def test_sim_request_wrong_size_is_a_decode_error(size: int) -> None:
    with pytest.raises(DecodeError):
        SimRequest.unpack(bytes(size))


def test_sim_request_mad_too_long_refused() -> None:
    with pytest.raises(ValueError):
        SimRequest(0, 0, 0, 0, bytes(257)).pack()


def test_tid_helpers() -> None:
    mad = bytes(8) + h("0123456789abcdef") + bytes(240)
    assert mad_tid(mad) == 0x0123456789ABCDEF
    new = set_mad_tid(mad, 0x0005_4567_89AB_CDEF)
    assert new[8:16] == h("00054567 89abcdef") and len(new) == 256
    req = SimRequest(0, 0, 0, 0, mad)
    assert req.tid == 0x0123456789ABCDEF and req.with_tid(1).tid == 1 and req.tid == 0x0123456789ABCDEF
    assert mad_tid(b"short") == 0


@pytest.mark.parametrize(("method", "expected"), [
    (0x01, False), (0x02, False), (0x05, False),  # Get, Set, Trap
    (0x07, True),  # TrapRepress answers a Trap
    (0x81, True), (0x86, True), (0x92, True),  # GetResp, ReportResp, GetTableResp
])
def test_response_like(method: int, expected: bool) -> None:
    mad = bytes([1, 0x81, 1, method]) + bytes(252)
    assert is_response_like(mad) is expected
    assert SimRequest(0, 0, 0, 0, mad).is_response is expected
