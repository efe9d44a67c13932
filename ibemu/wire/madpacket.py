"""MAD packets on the wire: LRH + BTH + DETH + 256-byte MAD + ICRC + VCRC, built from bytes.

Every management packet here is a UD SEND Only without GRH, 290 bytes: the MAD starts at
byte 28. Building and resealing use ``struct`` and chained CRCs (no scapy), fast enough for
tens of thousands of SMPs per second. ``check`` is the strict receive check (lengths, then
ICRC and VCRC) from ``ibemu.wire.checks``; it raises ``DecodeError``/``CrcError``.
"""

from __future__ import annotations

import struct
import zlib

from ibemu.wire import crc as _crc
from ibemu.wire.checks import MAD_LEN, check_native_length, verify_native_crcs

MAD_OFFSET = 28
PACKET_LEN = MAD_OFFSET + MAD_LEN + 4 + 2  # 290
PKTLEN_WORDS = (PACKET_LEN - 2) // 4  # 72
UD_SEND_ONLY = 0x64
QP0_QKEY = 0
GSI_QKEY = 0x80010000
PERMISSIVE_LID = 0xFFFF
VL15 = 15

# offsets inside the MAD
M_BASE_VERSION = 0
M_CLASS = 1
M_CLASS_VERSION = 2
M_METHOD = 3
M_STATUS = 4
M_HOP_POINTER = 6
M_HOP_COUNT = 7
M_TID = 8
M_ATTR_ID = 16
M_ATTR_MOD = 20
M_DR_SLID = 32
M_DR_DLID = 34
SMP_DATA = 64
SMP_DATA_LEN = 64
INITIAL_PATH = 128
RETURN_PATH = 192
PMA_DATA = 64
PMA_DATA_LEN = 192

_HDR = struct.Struct("!BBHHHBBHIIII")  # LRH(8) BTH(12) DETH(8)
_ICRC = struct.Struct("<I")
_VCRC = struct.Struct("<H")
_crc32 = zlib.crc32
_vcrc = _crc.vcrc_calc
_ICRC_AT = MAD_OFFSET + MAD_LEN  # 284
_VCRC_AT = _ICRC_AT + 4  # 288


def check(packet: bytes | bytearray | memoryview) -> None:
    """Strict receive check: PktLen matches, headers fit, a MAD is 256 bytes, CRCs verify.

    A packet shaped like every management packet (290 bytes, LRH + BTH, PktLen 72, UD SEND
    Only without pad) needs only its two CRCs checked: its lengths hold by construction.
    Anything else, or a CRC that fails, takes the general path (and its error messages).
    """
    if (len(packet) == PACKET_LEN and packet[1] & 3 == 2 and packet[5] == PKTLEN_WORDS
            and not packet[4] & 0x07 and packet[8] == UD_SEND_ONLY and not packet[9] & 0x30):
        mv = memoryview(packet)
        masked = bytes((packet[0] | 0xF0,)) + bytes(mv[1:12]) + b"\xff"
        if (_crc32(mv[13:_ICRC_AT], _crc32(masked)) == _ICRC.unpack_from(mv, _ICRC_AT)[0]
                and _vcrc(mv[:_VCRC_AT]) == _VCRC.unpack_from(mv, _VCRC_AT)[0]):
            return
    check_native_length(packet)
    verify_native_crcs(packet)


def frame_mad(mad: bytes | bytearray | memoryview, *, dlid: int, slid: int, dqp: int, sqp: int,
              qkey: int, vl: int = 0, sl: int = 0, pkey: int = 0xFFFF, psn: int = 0) -> bytes:
    """A whole packet (LRH .. VCRC) carrying ``mad`` as a UD SEND Only."""
    if len(mad) != MAD_LEN:
        raise ValueError(f"a MAD is {MAD_LEN} bytes, not {len(mad)}")
    buf = bytearray(PACKET_LEN)
    _HDR.pack_into(buf, 0, (vl << 4), (sl << 4) | 2, dlid, PKTLEN_WORDS, slid, UD_SEND_ONLY, 0,
                   pkey, dqp & 0xFFFFFF, psn & 0xFFFFFF, qkey, sqp & 0xFFFFFF)
    buf[MAD_OFFSET:_ICRC_AT] = mad
    return reseal(buf)


def reseal(buf: bytearray) -> bytes:
    """Recompute ICRC and VCRC of a 290-byte MAD packet in place; returns the packet bytes."""
    reseal_at(buf, 0)
    return bytes(buf)


def reseal_at(buf: bytearray, at: int) -> None:
    """Recompute ICRC and VCRC, in place, of the 290-byte MAD packet at ``buf[at:]`` (after
    an Ethernet header, say)."""
    with memoryview(buf) as whole:
        mv = whole[at:at + PACKET_LEN]
        masked = bytes((buf[at] | 0xF0,)) + bytes(mv[1:12]) + b"\xff"
        _ICRC.pack_into(mv, _ICRC_AT, _crc32(mv[13:_ICRC_AT], _crc32(masked)))
        _VCRC.pack_into(mv, _VCRC_AT, _vcrc(mv[:_VCRC_AT]))
        mv.release()


def set_lrh(buf: bytearray, *, dlid: int, slid: int, vl: int | None = None, sl: int | None = None) -> None:
    """Patch the LRH addresses (and optionally VL/SL) of a MAD packet in place."""
    struct.pack_into("!H", buf, 2, dlid)
    struct.pack_into("!H", buf, 6, slid)
    if vl is not None:
        buf[0] = (vl << 4) | (buf[0] & 0x0F)
    if sl is not None:
        buf[1] = (sl << 4) | (buf[1] & 0x0F)


def set_qps(buf: bytearray, *, dqp: int, sqp: int, qkey: int) -> None:
    """Patch BTH DestQP, DETH Q_Key and SrcQP in place."""
    struct.pack_into("!I", buf, 12, (buf[12] << 24) | (dqp & 0xFFFFFF))
    struct.pack_into("!II", buf, 20, qkey, sqp & 0xFFFFFF)


def response_method(method: int) -> int:
    """Method of the response to a request (GetResp answers Get and Set)."""
    return 0x81 if method in (0x01, 0x02) else method | 0x80
