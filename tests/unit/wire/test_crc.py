"""ibemu's fast CRCs against the bit-loop reference and known answers."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from ibemu.wire import crc
from tests.unit.wire import reference

# Frame 11 of the hardware capture (RC ACK): LRH..AETH, ICRC, VCRC (../shared/fixtures/README.md)
ACK_BODY = bytes.fromhex("00020004000700011140ffff0087040800d40a551f000001")
ACK_ICRC = bytes.fromhex("a8035550")
ACK_VCRC = bytes.fromhex("3081")


def test_known_answer_vector_from_hardware() -> None:
    assert crc.pack_icrc(crc.icrc_native(ACK_BODY)) == ACK_ICRC
    assert crc.pack_vcrc(crc.vcrc(ACK_BODY + ACK_ICRC)) == ACK_VCRC
    assert crc.seal_native(ACK_BODY) == ACK_BODY + ACK_ICRC + ACK_VCRC


def test_reference_agrees_with_known_answer() -> None:
    assert reference.native_icrc(ACK_BODY).to_bytes(4, "little") == ACK_ICRC
    assert reference.crc16_vcrc_bitwise(ACK_BODY + ACK_ICRC).to_bytes(2, "little") == ACK_VCRC


def test_check_native_reports_each_crc() -> None:
    good = ACK_BODY + ACK_ICRC + ACK_VCRC
    assert crc.check_native(good) == (True, True)
    bad_payload = bytearray(good)
    bad_payload[20] ^= 0x01  # inside the AETH: both CRCs break
    assert crc.check_native(bytes(bad_payload)) == (False, False)
    bad_vl = bytearray(good)
    bad_vl[0] ^= 0x10  # VL is variant: only the VCRC notices
    assert crc.check_native(bytes(bad_vl)) == (True, False)


@given(st.binary(min_size=0, max_size=5000))
def test_vcrc_matches_bitwise_reference(data: bytes) -> None:
    assert crc.vcrc(data) == reference.crc16_vcrc_bitwise(data)


@given(st.binary(min_size=1, max_size=600), st.integers(0, 600))
def test_vcrc_chaining_equals_one_pass(data: bytes, cut: int) -> None:
    cut = min(cut, len(data))
    assert crc.vcrc_continue(data[cut:], crc.vcrc(data[:cut])) == crc.vcrc(data)


def test_crc32_reference_is_zlib() -> None:
    assert reference.crc32_bitwise(b"123456789") == 0xCBF43926 == zlib.crc32(b"123456789")


@given(
    st.integers(0, 15), st.integers(0, 15), st.sampled_from([2, 3]),
    st.binary(min_size=60, max_size=400),
)
def test_native_icrc_matches_reference(vl: int, sl: int, lnh: int, tail: bytes) -> None:
    pkt = bytearray(tail)
    pkt[0] = (vl << 4) | (pkt[0] & 0x0F)
    pkt[1] = (sl << 4) | lnh
    assert crc.icrc_native(bytes(pkt)) == reference.native_icrc(bytes(pkt))


@given(st.binary(min_size=60, max_size=300), st.integers(0, 15), st.integers(0, 255))
def test_native_icrc_ignores_variant_fields(tail: bytes, new_vl: int, new_byte4: int) -> None:
    pkt = bytearray(tail)
    pkt[1] = (pkt[1] & 0xFC) | 2
    other = bytearray(pkt)
    other[0] = (new_vl << 4) | (other[0] & 0x0F)
    other[12] = new_byte4
    assert crc.icrc_native(bytes(pkt)) == crc.icrc_native(bytes(other))
