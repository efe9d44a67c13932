"""Strict decoding: hostile bytes only ever raise ibemu's DecodeError; bad CRCs are named."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import raw

from ibemu.errors import CrcError, DecodeError
from ibemu.wire import decode_frame, decode_native, fast
from ibemu.wire.ib import BTH, DETH, LRH, RETH
from ibemu.wire.mad import PMA, DirectedRouteSMP, NodeInfo, PortCounters
from ibemu.wire.roce import RoceBTH, roce_packet

SMP = raw(LRH(vl=15, dlid=0xFFFF, slid=0xFFFF) / BTH(opcode=0x64, destqp=0) / DETH()
          / DirectedRouteSMP(tid=5, hop_count=1, initial_path=[1], data=NodeInfo()))
PMA_PKT = raw(LRH(dlid=3, slid=1) / BTH(opcode=0x64, destqp=1) / DETH(qkey=0x80010000, srcqp=1)
              / PMA(method=1, data=PortCounters(port_select=1)))
WRITE = fast.NativeTemplate(slid=1, dlid=2, destqp=7).packet(0x0A, 3, b"x" * 33, ext=fast.reth(0, 1, 33))
ETH = fast.ethernet_header(b"\x02" * 6, b"\x04" * 6)
ROCE = raw(roce_packet("198.18.0.1", "198.18.0.2", RoceBTH(opcode=0x0A, dqpn=9), RETH(dmalen=3), payload=b"abc"))
VALID = [SMP, PMA_PKT, WRITE]


def _only_decode_errors(fn: Callable[[bytes], object], data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        fn(data)


def test_valid_packets_decode() -> None:
    assert decode_native(SMP)[DirectedRouteSMP].tid == 5
    assert decode_native(PMA_PKT)[PortCounters].port_select == 1
    assert decode_frame(ETH + WRITE)[LRH].dlid == 2
    assert decode_frame(ROCE)[RoceBTH].dqpn == 9


@pytest.mark.parametrize("pkt", VALID, ids=["smp", "pma", "write"])
def test_every_truncation_is_a_decode_error(pkt: bytes) -> None:
    for n in range(len(pkt)):
        with pytest.raises(DecodeError):
            decode_native(pkt[:n])


@pytest.mark.parametrize("pkt", VALID, ids=["smp", "pma", "write"])
def test_oversized_is_a_decode_error(pkt: bytes) -> None:
    with pytest.raises(DecodeError, match="oversized"):
        decode_native(pkt + b"\0")
    with pytest.raises(DecodeError, match="oversized"):
        decode_native(pkt + b"\0" * 5000)


@pytest.mark.parametrize("pkt", VALID, ids=["smp", "pma", "write"])
def test_single_bit_flips_are_crc_errors(pkt: bytes) -> None:
    # Flip bits in the transport headers and payload (not LRH length bytes): CRC must catch it.
    for pos in list(range(8, len(pkt) - 6, max(1, len(pkt) // 40))):
        bad = bytearray(pkt)
        bad[pos] ^= 0x04
        with pytest.raises(DecodeError):
            decode_native(bytes(bad))


def test_wrong_crcs_are_reported_by_name() -> None:
    bad_icrc = bytearray(WRITE)
    bad_icrc[-3] ^= 0xFF
    with pytest.raises(CrcError, match="ICRC mismatch"):
        decode_native(bytes(bad_icrc))
    bad_vcrc = bytearray(WRITE)
    bad_vcrc[-1] ^= 0xFF
    with pytest.raises(CrcError, match="VCRC mismatch"):
        decode_native(bytes(bad_vcrc))
    bad_roce = bytearray(ROCE)
    bad_roce[-10] ^= 1
    with pytest.raises(CrcError, match="RoCEv2 ICRC"):
        decode_frame(bytes(bad_roce))
    assert decode_native(bytes(bad_vcrc), verify_crc=False)[LRH].dlid == 2


def test_mad_of_wrong_size_is_rejected() -> None:
    short_mad = fast.NativeTemplate(slid=1, dlid=2, destqp=0).packet(0x64, 0, b"\x01" * 100, ext=fast.deth(0, 0))
    with pytest.raises(DecodeError, match="MAD"):
        decode_native(short_mad)


def test_foreign_frames_are_rejected() -> None:
    with pytest.raises(DecodeError, match="neither IPv4 nor IPv6"):
        decode_frame(b"\xff" * 12 + b"\x08\x06" + b"\0" * 28)
    with pytest.raises(DecodeError, match="Ethernet"):
        decode_frame(b"\x00" * 5)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_decode_error(data: bytes) -> None:
    _only_decode_errors(decode_native, data)
    _only_decode_errors(decode_frame, data)
    _only_decode_errors(decode_frame, ETH + data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VALID), st.integers(0, 400), st.binary(min_size=1, max_size=8))
def test_spliced_garbage_raises_only_decode_error(pkt: bytes, pos: int, junk: bytes) -> None:
    pos = min(pos, len(pkt))
    _only_decode_errors(decode_native, pkt[:pos] + junk + pkt[pos + len(junk):])
    _only_decode_errors(decode_native, pkt[:pos] + junk + pkt[pos:])
    _only_decode_errors(decode_frame, ETH + pkt[:pos] + junk + pkt[pos + len(junk):])


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=20, max_size=300))
def test_random_packets_with_valid_crcs_raise_only_decode_error(body: bytes) -> None:
    # Random headers sealed with correct CRCs and a consistent PktLen reach the dissector.
    b = bytearray(body[: len(body) - (len(body) % 4)])
    if len(b) < 20:
        return
    b[1] = (b[1] & 0xFC) | (2 if b[1] & 1 else 3)
    words = (len(b) + 4) // 4
    b[4] = (b[4] & 0xF8) | (words >> 8)
    b[5] = words & 0xFF
    from ibemu.wire.crc import seal_native

    try:
        sealed = seal_native(bytes(b))
    except DecodeError:
        return
    _only_decode_errors(decode_native, sealed)
