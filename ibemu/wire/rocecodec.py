"""RoCEv2 <-> native IB packet conversion (sans-IO): what ``RocePort`` does to every packet.

Native packets are what the transport speaks: LRH .. ICRC .. VCRC, addressed by LID. A RoCEv2
frame is Ethernet / IPv4 / UDP 4791 / BTH .. pad / ICRC. ``encapsulate`` maps the DLID to an
address (the LID table), takes the UDP source port from the destination QP (ECMP entropy)
and recomputes the ICRC over the RoCEv2 invariant fields (IBA annex A16.4.1: eight bytes of
ones for the absent LRH, IPv4 with TOS, TTL and checksum masked, UDP with its checksum
masked, BTH byte 4 masked). ``decapsulate`` checks a received frame (IPv4 without options and with a good header
checksum, UDP 4791, consistent lengths, addressed to this port, known source, ICRC) and
rebuilds the native packet (LRH from the table, fresh ICRC and VCRC). Refused frames are counted in
``stats``; nothing raises.
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from ibemu.wire import crc as _crc
from ibemu.wire.roce import check_emulated_address

ETH_LEN, IP_LEN, UDP_LEN, BTH_LEN, ICRC_LEN = 14, 20, 8, 12, 4
HDR_LEN = ETH_LEN + IP_LEN + UDP_LEN
MIN_FRAME = HDR_LEN + BTH_LEN + ICRC_LEN
TTL = 64
SPORT_BASE = 0xC000

_crc32 = zlib.crc32
_vcrc = _crc.vcrc_calc
_FF8_CRC = zlib.crc32(b"\xff" * 8)
_U16 = struct.Struct("!H")
_ICRC = struct.Struct("<I")
_VCRC = struct.Struct("<H")
_LRH = struct.Struct("!BBHHH")
_ZEROS = memoryview(bytes(1 << 14))


def udp_sport(qpn: int) -> int:
    """The UDP source port of packets to QP ``qpn`` (0xC000-0xFFFF; a mix of the QPN's bits)."""
    return SPORT_BASE | ((((qpn ^ (qpn >> 12)) * 0x9E3779B1) >> 16) & 0x3FFF)


@dataclass(slots=True)
class RoceStats:
    """Frames the RoCE layer refused (before the transport saw them) and packets it could not send."""

    rx_malformed: int = 0
    rx_bad_icrc: int = 0
    rx_unknown_source: int = 0
    rx_not_ours: int = 0
    tx_unknown_dlid: int = 0
    # congestion control (ECN, CNP, DCQCN): counted, not refused
    ce_received: int = 0
    cnp_sent: int = 0
    cnp_received: int = 0
    tx_paced: int = 0


def _ip_sum(frame: bytes) -> int:
    """The one's complement sum of the IPv4 header (20 bytes after Ethernet): 0xFFFF when its
    checksum holds."""
    s = sum(struct.unpack_from("!10H", frame, ETH_LEN))
    s = (s & 0xFFFF) + (s >> 16)
    return (s & 0xFFFF) + (s >> 16)


class RoceCodec:
    """One port's conversions: its MACs, address, LID and the LID <-> address table."""

    def __init__(self, *, lid: int, ip: str, lid_ips: Mapping[int, str], mac: bytes, peer_mac: bytes) -> None:
        check_emulated_address(ip)
        for addr in lid_ips.values():
            check_emulated_address(addr)
        if len(mac) != 6 or len(peer_mac) != 6:
            raise ValueError("MAC addresses are 6 bytes")
        self.lid = lid
        self.ip = ip
        self._src = socket.inet_aton(ip)
        self._lid_ip = {int(k): socket.inet_aton(a) for k, a in lid_ips.items()}
        self._ip_lid = {v: k for k, v in self._lid_ip.items()}
        self.eth = bytes(peer_mac) + bytes(mac) + b"\x08\x00"
        self.stats = RoceStats()
        self.tos = 0
        """IPv4 TOS byte of every frame (``set_ect``: ECN-capable, ECT(0))."""
        self._ip_sum: dict[int, tuple[bytes, int]] = {}
        self._hdrs: dict[tuple[int, int, int], tuple[bytes, int]] = {}
        self._rx_hdrs: dict[bytes, tuple[int, int, int]] = {}
        self._shifts: dict[tuple[int, int], int] = {}

    # -- native -> RoCEv2 ----------------------------------------------------------------
    def _ip_prefix(self, dlid: int) -> tuple[bytes, int] | None:
        """(source + destination address, their part of the IP checksum) for ``dlid``."""
        got = self._ip_sum.get(dlid)
        if got is None:
            dst = self._lid_ip.get(dlid)
            if dst is None:
                return None
            addrs = self._src + dst
            fixed = (0x4500 | self.tos) + 0x4000 + (TTL << 8 | socket.IPPROTO_UDP)
            fixed += sum(struct.unpack("!4H", addrs))
            got = self._ip_sum[dlid] = (addrs, fixed)
        return got

    def _headers(self, dlid: int, dqp: int, total: int) -> tuple[bytes, int] | None:
        """Ethernet + IPv4 + UDP headers of a frame, and the ICRC state after their masked
        copy (cached: a flow repeats them)."""
        key = (dlid, dqp, total)
        got = self._hdrs.get(key)
        if got is None:
            prefix = self._ip_prefix(dlid)
            if prefix is None:
                return None
            addrs, fixed = prefix
            sport = _U16.pack(udp_sport(dqp))
            s = fixed + total
            s = (s & 0xFFFF) + (s >> 16)
            s = (s & 0xFFFF) + (s >> 16)
            ln, udp_ln = _U16.pack(total), _U16.pack(total - IP_LEN)
            hdr = b"".join((self.eth, bytes((0x45, self.tos)), ln, b"\x00\x00\x40\x00", bytes((TTL, socket.IPPROTO_UDP)),
                            _U16.pack(~s & 0xFFFF), addrs, sport, b"\x12\xb7", udp_ln, b"\x00\x00"))
            seed = _crc32(b"\x45\xff" + ln + b"\x00\x00\x40\x00\xff\x11\xff\xff" + addrs + sport + b"\x12\xb7"
                          + udp_ln + b"\xff\xff", _FF8_CRC)
            if len(self._hdrs) > 4096:
                self._hdrs.clear()
            got = self._hdrs[key] = (hdr, seed)
        return got

    def set_ect(self, on: bool = True) -> None:
        """Mark every frame ECN-capable (ECT(0)), so routers can set CE instead of dropping."""
        self.tos = 0x02 if on else 0x00
        self._ip_sum.clear()
        self._hdrs.clear()

    def encapsulate(self, pkt: bytes) -> bytes | None:
        """The RoCEv2 frame of native packet ``pkt`` (LRH .. VCRC); None if its DLID is unknown."""
        n = len(pkt)
        got = self._headers((pkt[2] << 8) | pkt[3], (pkt[13] << 16) | (pkt[14] << 8) | pkt[15], n + 18)
        if got is None or n < 8 + BTH_LEN + 6:
            self.stats.tx_unknown_dlid += 1
            return None
        hdr, seed = got
        bth4 = pkt[8:12] + b"\xff"
        seed = _crc32(bth4, seed)
        native_seed = _crc32(bytes((pkt[0] | 0xF0,)) + pkt[1:8] + bth4)  # the native ICRC's masked LRH + BTH
        # The transport's ICRC covers the same bytes from BTH byte 5 on: move it to the new seed.
        crc = _ICRC.unpack_from(pkt, n - 6)[0] ^ self._shift(n - 19, native_seed ^ seed)
        return b"".join((hdr, memoryview(pkt)[8:n - 6], _ICRC.pack(crc)))

    # -- RoCEv2 -> native ----------------------------------------------------------------
    def decapsulate(self, frame: bytes | bytearray | memoryview) -> bytearray | None:
        """The native packet the transport expects, or None (counted) for a frame it must not see."""
        if type(frame) is not bytes:
            frame = bytes(frame)
        key = frame[12:HDR_LEN]  # ethertype, IPv4, UDP: the same for every frame of a flow
        got = self._rx_hdrs.get(key)
        if got is None:
            got = self._check_headers(frame)
            if got is None:
                return None
            if len(self._rx_hdrs) > 4096:
                self._rx_hdrs.clear()
            self._rx_hdrs[key] = got
        slid, seed, end = got
        if end > len(frame):
            self.stats.rx_malformed += 1
            return None
        seed = _crc32(frame[HDR_LEN:HDR_LEN + 4] + b"\xff", seed)
        mv = memoryview(frame)
        crc = _crc32(mv[HDR_LEN + 5:end - ICRC_LEN], seed)
        if crc != _ICRC.unpack_from(frame, end - 4)[0]:
            self.stats.rx_bad_icrc += 1
            return None
        body_len = end - HDR_LEN - ICRC_LEN
        lrh = _LRH.pack(0x00, 0x02, self.lid, (8 + body_len + ICRC_LEN) >> 2, slid)
        native_seed = _crc32(b"\xf0" + lrh[1:] + frame[HDR_LEN:HDR_LEN + 4] + b"\xff")
        pkt = bytearray().join((lrh, mv[HDR_LEN:end - ICRC_LEN],
                                _ICRC.pack(crc ^ self._shift(body_len - 5, seed ^ native_seed)), b"\0\0"))
        end = len(pkt) - 2
        _VCRC.pack_into(pkt, end, _vcrc(memoryview(pkt)[:end]))
        return pkt

    def _check_headers(self, frame: bytes) -> tuple[int, int, int] | None:
        """(source LID, ICRC state after the masked IPv4 + UDP headers, frame end) of a valid
        frame's headers; None (counted) otherwise."""
        st = self.stats
        n = len(frame)
        if (n < MIN_FRAME or frame[12:15] != b"\x08\x00\x45" or frame[23] != socket.IPPROTO_UDP
                or frame[36:38] != b"\x12\xb7"):
            st.rx_malformed += 1  # not IPv4 without options / UDP 4791, or too short
            return None
        total = (frame[16] << 8) | frame[17]
        end = ETH_LEN + total
        body_len = total - IP_LEN - UDP_LEN - ICRC_LEN
        if (end > n or body_len < BTH_LEN or body_len % 4 or ((frame[38] << 8) | frame[39]) != total - IP_LEN
                or (frame[20] & 0x3F) or frame[21]):  # fragments are not RoCE
            st.rx_malformed += 1
            return None
        if _ip_sum(frame) != 0xFFFF:  # a NIC drops an IPv4 header whose checksum fails
            st.rx_malformed += 1
            return None
        if frame[30:34] != self._src:
            st.rx_not_ours += 1
            return None
        slid = self._ip_lid.get(frame[26:30])
        if slid is None:
            st.rx_unknown_source += 1
            return None
        masked = bytearray(frame[14:HDR_LEN])
        masked[1] = masked[8] = 0xFF        # TOS, TTL
        masked[10] = masked[11] = 0xFF      # IP checksum
        masked[26] = masked[27] = 0xFF      # UDP checksum
        return slid, _crc32(masked, _FF8_CRC), end

    def _shift(self, length: int, delta: int) -> int:
        """``crc32(data, a) ^ crc32(data, b)`` for any ``length`` bytes of data, ``delta = a ^ b``.

        CRC-32 is affine in its initial value, so the ICRC over the bytes both headers share
        moves from one header's seed to the other's without reading the payload again; the
        correction depends only on the length and the seeds (cached: a flow repeats them).
        """
        key = (length, delta)
        corr = self._shifts.get(key)
        if corr is None:
            if len(self._shifts) > 4096:
                self._shifts.clear()
            zeros = _ZEROS[:length]
            corr = self._shifts[key] = _crc32(zeros, delta) ^ _crc32(zeros, 0)
        return corr

