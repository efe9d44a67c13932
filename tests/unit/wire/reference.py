"""Independent, deliberately naive implementations of the IB CRC rules (bit loops).

Written from ../shared/ref/ib-wire.md alone, sharing no code with ibemu.wire, so that tests
check ibemu's fast CRCs against a second reading of the spec.
"""

from __future__ import annotations


def crc32_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def crc16_vcrc_bitwise(data: bytes) -> int:
    """CRC-16, poly 0x100B reflected (0xD008), init 0xFFFF, xorout 0xFFFF."""
    crc = 0xFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xD008 if crc & 1 else 0)
    return crc ^ 0xFFFF


def native_icrc(packet_without_crcs: bytes) -> int:
    """ICRC per the table: mask VL (LNH=2) or the whole LRH + GRH variant fields (LNH=3)."""
    p = bytearray(packet_without_crcs)
    lnh = p[1] & 3
    if lnh == 2:
        p[0] |= 0xF0
        p[8 + 4] = 0xFF
    elif lnh == 3:
        for i in range(8):
            p[i] = 0xFF
        # GRH word 0: IPVer(4) TClass(8) FlowLabel(20): all but IPVer to ones
        p[8] |= 0x0F
        p[9] = p[10] = p[11] = 0xFF
        p[8 + 7] = 0xFF  # HopLmt
        p[48 + 4] = 0xFF
    else:
        raise ValueError("raw packets carry no ICRC")
    return crc32_bitwise(bytes(p))


def roce_ipv4_icrc(ip_to_pad: bytes) -> int:
    p = bytearray(b"\xff" * 8 + ip_to_pad)
    ip = 8
    ihl = (p[ip] & 0x0F) * 4
    p[ip + 1] = 0xFF  # TOS
    p[ip + 8] = 0xFF  # TTL
    p[ip + 10] = p[ip + 11] = 0xFF  # checksum
    udp = ip + ihl
    p[udp + 6] = p[udp + 7] = 0xFF
    p[udp + 8 + 4] = 0xFF
    return crc32_bitwise(bytes(p))
