"""Strict decoding: untrusted bytes in, a dissected packet or an ibemu DecodeError out.

scapy is lenient (it dissects anything into something); agents need the opposite. These
functions check lengths and CRCs first, then dissect, and turn any failure into
``DecodeError`` (``CrcError`` for a wrong ICRC/VCRC), so a malformed packet is counted by the
caller, never a crash.
"""

from __future__ import annotations

from scapy.layers.l2 import Ether
from scapy.packet import Packet

from ibemu.errors import DecodeError
from ibemu.wire.checks import check_native_length, verify_native_crcs
from ibemu.wire.ib import ETHERTYPE_IB, LRH
from ibemu.wire.roce import ROCEV2_UDP_PORT, ip_offset, verify_roce_icrc


def decode_native(pkt: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> LRH:
    """Dissect a native packet (LRH .. VCRC) after checking its lengths and CRCs."""
    data = bytes(pkt)
    check_native_length(data)
    if verify_crc:
        verify_native_crcs(data)
    try:
        return LRH(data)
    except Exception as exc:  # scapy raises all sorts on hostile input
        raise DecodeError(f"malformed native packet: {exc}") from exc


def decode_frame(frame: bytes | bytearray | memoryview, *, verify_crc: bool = True) -> Packet:
    """Dissect an Ethernet frame carrying native IB (0x88B5) or RoCEv2 (UDP 4791)."""
    data = bytes(frame)
    if len(data) < 14:
        raise DecodeError(f"truncated: {len(data)} bytes is not an Ethernet frame")
    ethertype = (data[12] << 8) | data[13]
    if ethertype == ETHERTYPE_IB:
        check_native_length(data[14:])
        if verify_crc:
            verify_native_crcs(data[14:])
    else:
        # Raises DecodeError for anything that is not UDP 4791 over IPv4/IPv6.
        if verify_crc:
            verify_roce_icrc(data)
        else:
            ip_offset(data)
    try:
        return Ether(data)
    except Exception as exc:
        raise DecodeError(f"malformed frame: {exc}") from exc


__all__ = [
    "ROCEV2_UDP_PORT",
    "check_native_length",
    "decode_frame",
    "decode_native",
    "verify_native_crcs",
]
