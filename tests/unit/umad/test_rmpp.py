"""Single-segment RMPP through MAD sockets: the sender's length reaches the receiving client."""

from __future__ import annotations

from ibemu.wire.umad import MAD_LEN, rmpp_length, rmpp_seal


def sa_response(records: int, *, active: bool = True) -> bytes:
    """An SA GetTableResp as OpenSM hands it to umad_send: RMPP Active, the rest left to the
    kernel (version, type, segment and PayloadLength zero)."""
    mad = bytearray(MAD_LEN)
    mad[0], mad[1], mad[2], mad[3] = 1, 0x03, 2, 0x92
    mad[26] = (0x1F << 3) | (1 if active else 0)  # RRespTime 0x1F, Active
    mad[44:46] = (64 // 8).to_bytes(2, "big")  # AttributeOffset: 64-byte records
    for i in range(records):
        mad[56 + 64 * i] = 0xA0 + i
    return bytes(mad)


def test_a_single_segment_is_sealed_and_its_length_comes_back() -> None:
    length = 56 + 64  # what OpenSM passes for one PortInfoRecord
    sealed = rmpp_seal(sa_response(1), length)
    assert sealed[24:28] == bytes([1, 1, (0x1F << 3) | 0x07, 0])  # v1, DATA, First|Last|Active
    assert int.from_bytes(sealed[28:32], "big") == 1
    assert int.from_bytes(sealed[32:36], "big") == length - 36  # the SA header and the record
    assert rmpp_length(sealed) == length  # saquery counts (length - 56) / 64 = 1 record
    assert sealed[36:] == sa_response(1)[36:]


def test_a_transfer_longer_than_a_mad_is_cut_to_it() -> None:
    sealed = rmpp_seal(sa_response(3), 56 + 36 * 112)
    assert rmpp_length(sealed) == MAD_LEN


def test_mads_without_rmpp_or_already_sealed_are_left_alone() -> None:
    plain = sa_response(1, active=False)
    assert rmpp_seal(plain, 120) == plain and rmpp_length(plain) == MAD_LEN
    sealed = rmpp_seal(sa_response(1), 120)
    assert rmpp_seal(sealed, 200) == sealed  # a client that filled the header in itself
    smp = bytearray(sa_response(1))
    smp[1] = 0x81  # a directed-route SMP: bytes 24-35 are its M_Key and DrSLID/DrDLID
    assert rmpp_seal(bytes(smp), 120) == bytes(smp)
    smp[25], smp[26], smp[32:36] = 1, 0x07, (20).to_bytes(4, "big")
    assert rmpp_length(bytes(smp)) == MAD_LEN
