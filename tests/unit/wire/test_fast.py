"""The fast path agrees with the scapy layers byte for byte (hypothesis)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Packet, Raw, raw

from ibemu.errors import DecodeError
from ibemu.wire import fast
from ibemu.wire.ib import AETH, BTH, DETH, IETH, LRH, RETH, AtomicAckETH, AtomicETH, ImmDt
from ibemu.wire.mad import DirectedRouteSMP, NodeInfo
from ibemu.wire.opcodes import OPCODE_NAMES, header_chain

u16 = st.integers(0, 0xFFFF)
u24 = st.integers(0, 0xFFFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)

# Native opcodes (CNP is RoCE-only; RD has RDETH which the fast path does not template).
NATIVE_OPCODES = sorted(op for op in OPCODE_NAMES if op != 0x81 and op & 0xE0 != 0x40)


@st.composite
def ext_headers(draw: st.DrawFn, opcode: int) -> tuple[list[Packet], bytes]:
    layers: list[Packet] = []
    packed = b""
    for name in header_chain(opcode):
        if name == "RETH":
            va, rkey, n = draw(u64), draw(u32), draw(u32)
            layers.append(RETH(va=va, rkey=rkey, dmalen=n))
            packed += fast.reth(va, rkey, n)
        elif name == "AETH":
            s, msn = draw(st.integers(0, 255)), draw(u24)
            layers.append(AETH(syndrome=s, msn=msn))
            packed += fast.aeth(s, msn)
        elif name == "DETH":
            q, sqp = draw(u32), draw(u24)
            layers.append(DETH(qkey=q, srcqp=sqp))
            packed += fast.deth(q, sqp)
        elif name == "ImmDt":
            v = draw(u32)
            layers.append(ImmDt(immediate_data=v))
            packed += fast.immdt(v)
        elif name == "IETH":
            v = draw(u32)
            layers.append(IETH(rkey=v))
            packed += fast.ieth(v)
        elif name == "AtomicETH":
            va, rkey, a, b = draw(u64), draw(u32), draw(u64), draw(u64)
            layers.append(AtomicETH(va=va, rkey=rkey, swap_add_data=a, compare_data=b))
            packed += fast.atomic_eth(va, rkey, a, b)
        elif name == "AtomicAckETH":
            v = draw(u64)
            layers.append(AtomicAckETH(orig_rem_dt=v))
            packed += fast.atomic_ack_eth(v)
    return layers, packed


@settings(max_examples=300, deadline=None)
@given(data=st.data(), opcode=st.sampled_from(NATIVE_OPCODES), slid=u16, dlid=u16,
       destqp=st.integers(2, 0xFFFFFF), pkey=u16, sl=st.integers(0, 15), vl=st.integers(0, 15),
       psn=u24, ackreq=st.booleans(), se=st.booleans(), m=st.booleans(),
       payload=st.binary(max_size=300))
def test_template_equals_scapy(data: st.DataObject, opcode: int, slid: int, dlid: int, destqp: int,
                               pkey: int, sl: int, vl: int, psn: int, ackreq: bool, se: bool, m: bool,
                               payload: bytes) -> None:
    layers, packed = data.draw(ext_headers(opcode))
    pkt: Packet = LRH(vl=vl, sl=sl, dlid=dlid, slid=slid) / BTH(
        opcode=opcode, se=int(se), m=int(m), pkey=pkey, destqp=destqp, ackreq=int(ackreq), psn=psn)
    for layer in layers:
        pkt = pkt / layer
    if payload:
        pkt = pkt / Raw(payload)
    expected = raw(pkt)
    tmpl = fast.NativeTemplate(slid=slid, dlid=dlid, destqp=destqp, pkey=pkey, sl=sl, vl=vl)
    got = tmpl.packet(opcode, psn, payload, ackreq=ackreq, se=se, m=m, ext=packed)
    assert got == expected
    p = fast.peek(got)
    assert (p.vl, p.sl, p.dlid, p.slid, p.opcode, p.pkey, p.destqp, p.psn, p.ackreq) == (
        vl, sl, dlid, slid, opcode, pkey, destqp, psn, int(ackreq))
    assert p.pktlen * 4 + 2 == len(got)
    assert fast.dlid_vl(got) == (dlid, vl)


@given(tid=u64, hop_count=st.integers(1, 8), qp=st.sampled_from([0, 1]))
def test_peek_and_mad_tid_on_scapy_smp(tid: int, hop_count: int, qp: int) -> None:
    smp = raw(LRH(vl=15, dlid=0xFFFF, slid=0xFFFF) / BTH(opcode=0x64, destqp=qp) / DETH()
              / DirectedRouteSMP(tid=tid, hop_count=hop_count, initial_path=[1] * hop_count,
                                 data=NodeInfo()))
    p = fast.peek(smp)
    assert (p.vl, p.dlid, p.opcode, p.destqp) == (15, 0xFFFF, 0x64, qp)
    assert fast.mad_tid(smp, p) == tid


def test_mad_tid_none_for_data_packets() -> None:
    pkt = fast.NativeTemplate(slid=1, dlid=2, destqp=5).packet(0x64, 0, b"x" * 8, ext=fast.deth(0, 1))
    assert fast.mad_tid(pkt, fast.peek(pkt)) is None


def test_ethernet_wrapped_template_and_restamp() -> None:
    eth = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)
    frame = fast.NativeTemplate(slid=1, dlid=2, destqp=9, eth=eth).packet(0x04, 1, b"abcd")
    inner = bytearray(fast.frame_payload(frame))
    assert fast.peek(inner).dlid == 2
    inner[0] = (inner[0] & 0x0F) | 0x50  # a switch moves it to VL5
    fast.restamp_vcrc(inner)
    assert LRH(bytes(inner)).vl == 5
    from ibemu.wire import decode_native
    decode_native(bytes(inner))  # both CRCs still verify: VL is not covered by the ICRC


def test_template_rejects_wrong_ext_length_and_bad_fields() -> None:
    tmpl = fast.NativeTemplate(slid=1, dlid=2, destqp=3)
    with pytest.raises(ValueError, match="RETH"):
        tmpl.packet(0x0A, 0, b"x")
    with pytest.raises(ValueError, match="destqp"):
        fast.NativeTemplate(slid=1, dlid=2, destqp=1 << 24)


@given(st.binary(max_size=60))
def test_peek_raises_only_decode_error(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        fast.peek(data)
    with contextlib.suppress(DecodeError):
        fast.dlid_vl(data)
