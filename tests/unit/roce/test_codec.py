"""RoCEv2 <-> native conversion: golden checks against scapy's RoCE layers and the ICRC rules."""

from __future__ import annotations

import pytest
from scapy.contrib.roce import BTH as ScapyRoceBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from ibemu.hca.roce_port import socket_filter
from ibemu.kernel import sockfilter
from ibemu.roce.queues import ip_checksum
from ibemu.wire import fast
from ibemu.wire.roce import verify_roce_icrc
from ibemu.wire.rocecodec import RoceCodec, udp_sport

MAC_A, MAC_R = bytes.fromhex("021b00000100"), bytes.fromhex("021b00140100")
LIDS = {1: "198.18.0.65", 2: "198.18.0.95"}


def codecs() -> tuple[RoceCodec, RoceCodec]:
    a = RoceCodec(lid=1, ip=LIDS[1], lid_ips=LIDS, mac=MAC_A, peer_mac=MAC_R)
    b = RoceCodec(lid=2, ip=LIDS[2], lid_ips=LIDS, mac=bytes.fromhex("021b00230100"), peer_mac=MAC_R)
    return a, b


WRITE = fast.NativeTemplate(slid=1, dlid=2, destqp=0x123).packet(
    0x0A, 77, b"z" * 1001, ackreq=True, ext=fast.reth(0x7000, 0xBEEF, 1001))
ACK = fast.NativeTemplate(slid=2, dlid=1, destqp=0x45).packet(0x11, 77, ext=fast.aeth(0x1F, 1))


def test_frame_is_rocev2_with_valid_icrc() -> None:
    a, _ = codecs()
    frame = a.encapsulate(WRITE)
    assert frame is not None
    verify_roce_icrc(frame)
    pkt = Ether(frame)
    assert pkt[Ether].dst == "02:1b:00:14:01:00" and pkt[Ether].type == 0x0800
    assert pkt[IP].src == LIDS[1] and pkt[IP].dst == LIDS[2] and pkt[IP].ttl == 64 and pkt[IP].flags == "DF"
    assert pkt[IP].len == len(frame) - 14
    del pkt[IP].chksum
    assert Ether(bytes(pkt))[IP].chksum == Ether(frame)[IP].chksum  # scapy agrees on the checksum
    assert pkt[UDP].dport == 4791 and pkt[UDP].sport == udp_sport(0x123) and pkt[UDP].chksum == 0
    bth = pkt[ScapyRoceBTH]
    assert bth.opcode == 0x0A and bth.dqpn == 0x123 and bth.psn == 77
    # scapy computes the same ICRC from the same fields
    assert ScapyRoceBTH(bytes(bth)).icrc == int.from_bytes(frame[-4:], "big")


def test_round_trip_restores_the_native_packet() -> None:
    a, b = codecs()
    for pkt, tx, rx in ((WRITE, a, b), (ACK, b, a)):
        frame = tx.encapsulate(pkt)
        assert frame is not None
        assert rx.decapsulate(frame) == pkt
        assert rx.decapsulate(bytearray(frame) + b"\0" * 10) == pkt  # Ethernet padding ignored


def test_sport_spreads_qps() -> None:
    ports = {udp_sport(q) for q in range(0x11, 0x11 + 64)}
    assert len(ports) >= 60 and all(0xC000 <= p <= 0xFFFF for p in ports)


def test_bad_frames_are_counted_not_raised() -> None:
    a, b = codecs()
    frame = bytearray(a.encapsulate(WRITE) or b"")
    bad_icrc = bytearray(frame)
    bad_icrc[200] ^= 1
    not_ours = bytearray(frame)
    not_ours[33] ^= 1
    ip_checksum(not_ours)  # another address, a good header: not a malformed frame
    unknown = bytearray(frame)
    unknown[29] ^= 1
    ip_checksum(unknown)
    cases = [b"", b"\x00" * 13, bytes(frame[:50]), bytes(frame[:-1]), b"\xff" * 200,
             bytes(frame[:12]) + b"\x86\xdd" + bytes(frame[14:]), bytes(frame[:14]) + b"\x46" + bytes(frame[15:])]
    for c in cases:
        assert b.decapsulate(c) is None
    assert b.stats.rx_malformed == len(cases)
    assert b.decapsulate(bad_icrc) is None and b.stats.rx_bad_icrc == 1
    assert b.decapsulate(not_ours) is None and b.stats.rx_not_ours == 1
    assert b.decapsulate(unknown) is None and b.stats.rx_unknown_source == 1
    assert a.encapsulate(fast.NativeTemplate(slid=1, dlid=9, destqp=5).packet(0x04, 1, b"x")) is None
    assert a.stats.tx_unknown_dlid == 1


def test_addresses_outside_the_range_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        RoceCodec(lid=1, ip="10.0.0.1", lid_ips=LIDS, mac=MAC_A, peer_mac=MAC_R)
    with pytest.raises(ValueError, match="outside"):
        RoceCodec(lid=1, ip=LIDS[1], lid_ips={2: "8.8.8.8"}, mac=MAC_A, peer_mac=MAC_R)


def run_filter(prog: list[sockfilter.Insn], frame: bytes) -> bool:
    """The classic BPF subset the RoCE filter uses, run as the kernel would."""
    a = x = pc = 0
    while True:
        op, jt, jf, k = prog[pc]
        if op == 0x06:
            return k != 0
        at = {0x28: k, 0x30: k, 0x48: x + k, 0x40: x + k, 0xB1: k}.get(op)
        size = {0x28: 2, 0x30: 1, 0x48: 2, 0x40: 4, 0xB1: 1}.get(op)
        if at is not None and size is not None:
            if at + size > len(frame):
                return False
            v = int.from_bytes(frame[at:at + size], "big")
            if op == 0xB1:
                x = 4 * (v & 0xF)
            else:
                a = v
        elif op == 0x54:
            a &= k
        elif op == 0x15:
            pc += jt if a == k else jf
        elif op == 0x35:
            pc += jt if a >= k else jf
        else:
            raise AssertionError(f"opcode {op:#x}")
        pc += 1


def test_socket_filter() -> None:
    a, _ = codecs()
    frame = a.encapsulate(WRITE) or b""
    assert run_filter(socket_filter(), frame)
    assert not run_filter(socket_filter(), bytes(frame[:36]) + b"\x00\x35" + bytes(frame[38:]))
    assert not run_filter(socket_filter(), b"\x00" * 12 + b"\x88\xb5" + b"\x00" * 60)
    assert not run_filter(socket_filter(), bytes(frame[:23]) + b"\x06" + bytes(frame[24:]))
    assert run_filter(socket_filter((0x100, 0x200)), frame)
    assert not run_filter(socket_filter((0x11, 0x100)), frame)
    assert not run_filter(socket_filter((0x124, 0x200)), frame)
    with pytest.raises(ValueError):
        socket_filter((5, 5))
