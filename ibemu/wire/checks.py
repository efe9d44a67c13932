"""Checks of untrusted native packets (lengths, CRCs) without scapy: the agents' fast path.

``ibemu.wire.decode`` dissects after these checks; device agents use them on their own.
"""

from __future__ import annotations

import struct

from ibemu.errors import CrcError, DecodeError
from ibemu.wire import crc as _crc
from ibemu.wire.opcodes import ext_headers_len, is_known, is_ud

MAD_LEN = 256
MAX_NATIVE_PACKET = 8 + 40 + 12 + 28 + 4096 + 3 + 4 + 2  # LRH+GRH+BTH+ext+MTU+pad+CRCs


def check_native_length(pkt: bytes | bytearray | memoryview) -> None:
    """Raise DecodeError unless the packet's PktLen and headers fit its byte count exactly."""
    n = len(pkt)
    if n < _crc.LRH_LEN + _crc.VCRC_LEN:
        raise DecodeError(f"truncated: {n} bytes, a native packet has at least LRH + VCRC (10)")
    if n > MAX_NATIVE_PACKET:
        raise DecodeError(f"oversized: {n} bytes, more than the largest native packet ({MAX_NATIVE_PACKET})")
    lnh = pkt[1] & 3
    pktlen = ((pkt[4] & 0x07) << 8) | pkt[5]
    want = pktlen * 4 + _crc.VCRC_LEN
    if want != n:
        what = "truncated" if n < want else "oversized"
        raise DecodeError(f"{what}: PktLen {pktlen} says {want} bytes with VCRC, packet has {n}")
    if lnh < 2:
        return
    bth = _crc.LRH_LEN + (_crc.GRH_LEN if lnh == 3 else 0)
    minimum = bth + _crc.BTH_LEN + _crc.ICRC_LEN + _crc.VCRC_LEN
    if n < minimum:
        raise DecodeError(f"truncated: {n} bytes, LNH={lnh} needs at least {minimum}")
    if lnh == 3 and pkt[_crc.LRH_LEN + 6] != 0x1B:
        raise DecodeError(f"GRH NxtHdr {pkt[_crc.LRH_LEN + 6]:#04x} is not BTH (0x1b)")
    opcode = pkt[bth]
    if not is_known(opcode):
        raise DecodeError(f"unknown BTH OpCode {opcode:#04x}")
    padcnt = (pkt[bth + 1] >> 4) & 3
    payload = n - bth - _crc.BTH_LEN - ext_headers_len(opcode) - padcnt - _crc.ICRC_LEN - _crc.VCRC_LEN
    if payload < 0:
        raise DecodeError(f"truncated: OpCode {opcode:#04x} headers and pad do not fit in {n} bytes")
    if is_ud(opcode) and struct.unpack_from("!I", pkt, bth + 4)[0] & 0xFFFFFF in (0, 1) and payload != MAD_LEN:
        raise DecodeError(f"a MAD to QP0/QP1 is {MAD_LEN} bytes, this one {payload}")


def verify_native_crcs(pkt: bytes | bytearray | memoryview) -> None:
    """Raise CrcError naming the CRC that does not match."""
    icrc_ok, vcrc_ok = _crc.check_native(pkt)
    if not icrc_ok:
        n = len(pkt) - _crc.VCRC_LEN
        got = int.from_bytes(bytes(pkt[n - 4 : n]), "little")
        want = _crc.icrc_native(memoryview(pkt)[: n - 4])
        raise CrcError(f"ICRC mismatch: packet carries {got:#010x}, contents give {want:#010x}")
    if not vcrc_ok:
        n = len(pkt) - _crc.VCRC_LEN
        got = int.from_bytes(bytes(pkt[n:]), "little")
        want = _crc.vcrc(memoryview(pkt)[:n])
        raise CrcError(f"VCRC mismatch: packet carries {got:#06x}, contents give {want:#06x}")
