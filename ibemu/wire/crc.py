"""The two InfiniBand CRCs: ICRC (invariant, end to end) and VCRC (variant, per hop).

ICRC is CRC-32 (``zlib.crc32``) over the packet with its variant fields forced to ones; VCRC
is CRC-16 (poly 0x100B, reflected, init/xorout 0xFFFF) over LRH .. ICRC. Both are written on
the wire least-significant byte first. Rules: ../shared/ref/ib-wire.md ("CRCs").

Only the first bytes of a packet (up to BTH byte 4) are masked, so the ICRC is computed by
chaining: ``crc32(rest, crc32(masked_prefix))`` — no copy of the payload is ever made.
"""

from __future__ import annotations

import struct
import zlib

import anycrc

from ibemu.errors import DecodeError

LRH_LEN = 8
GRH_LEN = 40
BTH_LEN = 12
ICRC_LEN = 4
VCRC_LEN = 2

LNH_RAW = 0
LNH_IP_NONIBA = 1
LNH_IBA_LOCAL = 2  # BTH follows the LRH
LNH_IBA_GLOBAL = 3  # GRH follows the LRH

_VCRC = anycrc.CRC(width=16, poly=0x100B, init=0xFFFF, refin=True, refout=True, xorout=0xFFFF)
vcrc_calc = _VCRC.calc
"""The raw anycrc VCRC call, ``vcrc_calc(data[, previous])`` -> int: for hot paths, where the
wrapper's extra call costs (~0.1 us)."""
_vcrc_calc = vcrc_calc
_crc32 = zlib.crc32

_FF8 = b"\xff" * 8
_ICRC_STRUCT = struct.Struct("<I")
_VCRC_STRUCT = struct.Struct("<H")


def vcrc(data: bytes | bytearray | memoryview) -> int:
    """VCRC of ``data`` (LRH .. ICRC of a native packet)."""
    return int(_vcrc_calc(data))


def vcrc_continue(data: bytes | bytearray | memoryview, previous: int) -> int:
    """Continue a VCRC computed over earlier bytes (``previous`` is that result)."""
    return int(_vcrc_calc(data, previous))


def pack_icrc(value: int) -> bytes:
    return _ICRC_STRUCT.pack(value)


def pack_vcrc(value: int) -> bytes:
    return _VCRC_STRUCT.pack(value)


def _masked_native_prefix(pkt: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """The masked copy of the variant-field region of a native packet and its length."""
    if len(pkt) < LRH_LEN + BTH_LEN:
        raise DecodeError(f"native packet of {len(pkt)} bytes is shorter than LRH + BTH")
    lnh = pkt[1] & 0x03
    if lnh == LNH_IBA_LOCAL:
        end = LRH_LEN + 5
        prefix = bytearray(pkt[:end])
        prefix[0] |= 0xF0  # VL
        prefix[LRH_LEN + 4] = 0xFF  # BTH resv8a / FECN / BECN
        return bytes(prefix), end
    if lnh == LNH_IBA_GLOBAL:
        end = LRH_LEN + GRH_LEN + 5
        if len(pkt) < end:
            raise DecodeError(f"native GRH packet of {len(pkt)} bytes is shorter than LRH + GRH + BTH")
        prefix = bytearray(pkt[:end])
        prefix[0:LRH_LEN] = _FF8
        g = LRH_LEN
        prefix[g] |= 0x0F  # TClass high nibble lives in byte 0 low nibble
        prefix[g + 1] = 0xFF  # TClass low nibble + FlowLabel high nibble
        prefix[g + 2] = 0xFF
        prefix[g + 3] = 0xFF
        prefix[g + 7] = 0xFF  # HopLmt
        prefix[LRH_LEN + GRH_LEN + 4] = 0xFF
        return bytes(prefix), end
    raise DecodeError(f"LNH={lnh}: not an IBA transport packet, it has no ICRC")


def icrc_native(pkt: bytes | bytearray | memoryview) -> int:
    """ICRC of a native packet; ``pkt`` runs from the LRH to the end of the pad (no CRCs)."""
    prefix, end = _masked_native_prefix(pkt)
    mv = memoryview(pkt)
    return _crc32(mv[end:], _crc32(prefix))


def native_icrc_seed(prefix_pkt: bytes | bytearray | memoryview) -> tuple[int, int]:
    """CRC-32 state after the masked prefix, and the prefix length (for per-flow templates)."""
    prefix, end = _masked_native_prefix(prefix_pkt)
    return _crc32(prefix), end


def icrc_roce_ipv4(ip_to_pad: bytes | bytearray | memoryview) -> int:
    """ICRC of a RoCEv2/IPv4 packet; ``ip_to_pad`` runs from the IP header to the end of the pad."""
    if len(ip_to_pad) < 20 + 8 + BTH_LEN:
        raise DecodeError(f"RoCEv2 packet of {len(ip_to_pad)} bytes is shorter than IPv4 + UDP + BTH")
    ihl = (ip_to_pad[0] & 0x0F) * 4
    if ihl < 20 or len(ip_to_pad) < ihl + 8 + BTH_LEN:
        raise DecodeError(f"bad IPv4 header length {ihl}")
    end = ihl + 8 + 5
    prefix = bytearray(ip_to_pad[:end])
    prefix[1] = 0xFF  # TOS
    prefix[8] = 0xFF  # TTL
    prefix[10:12] = b"\xff\xff"  # header checksum
    prefix[ihl + 6 : ihl + 8] = b"\xff\xff"  # UDP checksum
    prefix[ihl + 8 + 4] = 0xFF  # BTH byte 4
    return _crc32(memoryview(ip_to_pad)[end:], _crc32(bytes(prefix), _crc32(_FF8)))


def icrc_roce_ipv6(ip_to_pad: bytes | bytearray | memoryview) -> int:
    """ICRC of a RoCEv2/IPv6 packet; ``ip_to_pad`` runs from the IPv6 header to the end of the pad."""
    if len(ip_to_pad) < 40 + 8 + BTH_LEN:
        raise DecodeError(f"RoCEv2 packet of {len(ip_to_pad)} bytes is shorter than IPv6 + UDP + BTH")
    end = 40 + 8 + 5
    prefix = bytearray(ip_to_pad[:end])
    prefix[0] |= 0x0F  # TClass high nibble
    prefix[1:4] = b"\xff\xff\xff"  # TClass low nibble, FlowLabel
    prefix[7] = 0xFF  # HopLimit
    prefix[46:48] = b"\xff\xff"  # UDP checksum
    prefix[48 + 4] = 0xFF
    return _crc32(memoryview(ip_to_pad)[end:], _crc32(bytes(prefix), _crc32(_FF8)))


def seal_native(pkt_to_pad: bytes | bytearray) -> bytes:
    """Append ICRC and VCRC to a native packet that runs from the LRH to the end of the pad."""
    body = bytes(pkt_to_pad) + pack_icrc(icrc_native(pkt_to_pad))
    return body + pack_vcrc(vcrc(body))


def check_native(pkt: bytes | bytearray | memoryview) -> tuple[bool, bool]:
    """Check a whole native packet (LRH .. VCRC): returns (icrc_ok, vcrc_ok).

    Raw (LNH 0/1) packets have no ICRC; their ``icrc_ok`` is True when the VCRC checks.
    """
    n = len(pkt)
    if n < LRH_LEN + VCRC_LEN:
        raise DecodeError(f"native packet of {n} bytes is too short")
    mv = memoryview(pkt)
    vcrc_ok = vcrc(mv[: n - VCRC_LEN]) == _VCRC_STRUCT.unpack_from(mv, n - VCRC_LEN)[0]
    if pkt[1] & 0x03 in (LNH_RAW, LNH_IP_NONIBA):
        return True, vcrc_ok
    body_end = n - VCRC_LEN - ICRC_LEN
    icrc_ok = icrc_native(mv[:body_end]) == _ICRC_STRUCT.unpack_from(mv, body_end)[0]
    return icrc_ok, vcrc_ok
