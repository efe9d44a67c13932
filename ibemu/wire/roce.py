"""RoCEv2 frames: Ethernet / IPv4|IPv6 / UDP 4791 / BTH ... / ICRC.

scapy.contrib.roce owns the BTH (with its ICRC) and the UDP 4791 binding; ibemu adds the
extended headers and MADs on top (``ibemu.wire.ib`` binds them), pad handling, and a fast,
copy-free ICRC (``ibemu.wire.crc``) that equals scapy's for every packet.

Emulated addresses come from 198.18.0.0/15 only: ``roce_packet`` refuses any other.
"""

from __future__ import annotations

import ipaddress

from scapy.contrib.roce import BTH as RoceBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from ibemu.errors import CrcError, DecodeError
from ibemu.wire import crc as _crc
from ibemu.wire import scapy_setup  # noqa: F401 - no ARP when building frames

ROCEV2_UDP_PORT = 4791
EMULATED_NET = ipaddress.ip_network("198.18.0.0/15")
EMULATED_NET6 = ipaddress.ip_network("fd00:1b::/64")  # ULA range for IPv6 GIDs of the emulator


def check_emulated_address(addr: str) -> None:
    """Raise ValueError unless ``addr`` is inside the emulator's own address ranges."""
    ip = ipaddress.ip_address(addr)
    net = EMULATED_NET if ip.version == 4 else EMULATED_NET6
    if ip not in net:
        raise ValueError(f"{addr} is outside {net}: ibemu only uses its own address range")


def roce_packet(
    src: str,
    dst: str,
    bth: Packet,
    *layers: Packet,
    payload: bytes = b"",
    sport: int = 49152,
    src_mac: str = "02:00:00:00:00:01",
    dst_mac: str = "02:00:00:00:00:02",
    tos: int = 0,
) -> Packet:
    """Ether / IP(v6) / UDP(sport, 4791) / BTH / layers... / payload+pad, ICRC by scapy.

    ``bth`` is a ``scapy.contrib.roce.BTH``; its ``padcount`` is filled in when left at 0
    and the payload needs padding.
    """
    check_emulated_address(src)
    check_emulated_address(dst)
    if not isinstance(bth, RoceBTH):
        raise TypeError("RoCEv2 uses scapy.contrib.roce.BTH")
    pad = -len(payload) % 4
    if pad and not bth.padcount:
        bth.padcount = pad
    net: Packet = IP(src=src, dst=dst, tos=tos, flags="DF") if ":" not in src else IPv6(src=src, dst=dst, tc=tos)
    pkt = Ether(src=src_mac, dst=dst_mac) / net / UDP(sport=sport, dport=ROCEV2_UDP_PORT, chksum=0) / bth
    for layer in layers:
        pkt = pkt / layer
    if payload or pad:
        pkt = pkt / Raw(payload + b"\0" * pad)
    return pkt


def roce_icrc(frame: bytes | bytearray | memoryview) -> int:
    """ICRC that a RoCEv2 Ethernet frame should carry (computed over IP .. pad)."""
    ip_start, ip_version = ip_offset(frame)
    body = memoryview(frame)[ip_start : len(frame) - _crc.ICRC_LEN]
    return _crc.icrc_roce_ipv4(body) if ip_version == 4 else _crc.icrc_roce_ipv6(body)


def verify_roce_icrc(frame: bytes | bytearray | memoryview) -> None:
    """Raise CrcError if the frame's ICRC is wrong (DecodeError if it is not RoCEv2)."""
    want = roce_icrc(frame)
    got = int.from_bytes(bytes(frame[-4:]), "little")
    if want != got:
        raise CrcError(f"RoCEv2 ICRC mismatch: frame carries {got:#010x}, contents give {want:#010x}")


def ip_offset(frame: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(offset of the IP header, IP version) of a RoCEv2 frame; DecodeError otherwise."""
    if len(frame) < 14:
        raise DecodeError(f"frame of {len(frame)} bytes has no Ethernet header")
    ethertype = (frame[12] << 8) | frame[13]
    off = 14
    if ethertype == 0x8100:  # one VLAN tag
        if len(frame) < 18:
            raise DecodeError("truncated VLAN tag")
        ethertype = (frame[16] << 8) | frame[17]
        off = 18
    if ethertype == 0x0800:
        if len(frame) < off + 20:
            raise DecodeError("truncated IPv4 header")
        ihl = (frame[off] & 0x0F) * 4
        if frame[off + 9] != 17:
            raise DecodeError("IPv4 packet is not UDP")
        udp = off + ihl
        version = 4
    elif ethertype == 0x86DD:
        if len(frame) < off + 40:
            raise DecodeError("truncated IPv6 header")
        if frame[off + 6] != 17:
            raise DecodeError("IPv6 packet is not UDP (extension headers are not supported)")
        udp = off + 40
        version = 6
    else:
        raise DecodeError(f"ethertype {ethertype:#06x} is neither IPv4 nor IPv6")
    if len(frame) < udp + 8 + _crc.BTH_LEN + _crc.ICRC_LEN:
        raise DecodeError("frame too short for UDP + BTH + ICRC")
    if (frame[udp + 2] << 8) | frame[udp + 3] != ROCEV2_UDP_PORT:
        raise DecodeError("UDP destination port is not 4791 (RoCEv2)")
    return off, version


__all__ = [
    "EMULATED_NET",
    "IP",
    "ROCEV2_UDP_PORT",
    "UDP",
    "Ether",
    "IPv6",
    "RoceBTH",
    "check_emulated_address",
    "ip_offset",
    "roce_icrc",
    "roce_packet",
    "verify_roce_icrc",
]
