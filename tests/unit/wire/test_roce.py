"""RoCEv2: ibemu's ICRC equals scapy.contrib.roce's; ibemu headers ride on scapy's BTH."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.contrib.roce import BTH as RoceBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw, raw

from ibemu.wire.ib import AETH, DETH, RETH, ImmDt
from ibemu.wire.mad import PMA, PortCounters
from ibemu.wire.roce import roce_icrc, roce_packet, verify_roce_icrc
from tests.unit.wire import reference

emu_host = st.integers(1, 0x1FFFE).map(lambda i: f"198.{18 + (i >> 16)}.{(i >> 8) & 0xFF}.{i & 0xFF}")


@settings(max_examples=200, deadline=None)
@given(src=emu_host, dst=emu_host, sport=st.integers(1024, 65535), tos=st.integers(0, 255),
       ttl=st.integers(1, 255), opcode=st.sampled_from([0x04, 0x0A, 0x06, 0x11, 0x0C]),
       qp=st.integers(0, 0xFFFFFF), psn=st.integers(0, 0xFFFFFF), fecn=st.integers(0, 1),
       becn=st.integers(0, 1), payload=st.binary(max_size=200))
def test_icrc_equals_scapy_ipv4(src: str, dst: str, sport: int, tos: int, ttl: int, opcode: int,
                                qp: int, psn: int, fecn: int, becn: int, payload: bytes) -> None:
    pkt = Ether() / IP(src=src, dst=dst, tos=tos, ttl=ttl) / UDP(sport=sport, dport=4791) / RoceBTH(
        opcode=opcode, dqpn=qp, psn=psn, fecn=fecn, becn=becn) / Raw(payload + b"\0" * (-len(payload) % 4))
    frame = raw(pkt)  # scapy computes its ICRC in post_build
    assert roce_icrc(frame) == int.from_bytes(frame[-4:], "little")
    assert reference.roce_ipv4_icrc(frame[14:-4]) == roce_icrc(frame)
    verify_roce_icrc(frame)


@settings(max_examples=100, deadline=None)
@given(tc=st.integers(0, 255), fl=st.integers(0, 0xFFFFF), hlim=st.integers(1, 255),
       payload=st.binary(max_size=100))
def test_icrc_equals_scapy_ipv6(tc: int, fl: int, hlim: int, payload: bytes) -> None:
    pkt = Ether() / IPv6(src="fd00:1b::1", dst="fd00:1b::2", tc=tc, fl=fl, hlim=hlim) / UDP(
        sport=5000, dport=4791) / RoceBTH(opcode=0x04, dqpn=3) / Raw(payload + b"\0" * (-len(payload) % 4))
    frame = raw(pkt)
    assert roce_icrc(frame) == int.from_bytes(frame[-4:], "little")


def test_ibemu_ext_headers_ride_on_scapy_bth() -> None:
    frame = raw(roce_packet("198.18.0.1", "198.18.0.2", RoceBTH(opcode=0x0B, dqpn=5, psn=1),
                            RETH(va=0x10, rkey=0x20, dmalen=4), ImmDt(immediate_data=0xAB), payload=b"data"))
    back = Ether(frame)
    assert back[RETH].rkey == 0x20 and back[ImmDt].immediate_data == 0xAB and back[Raw].load == b"data"
    ack = Ether(raw(roce_packet("198.18.0.2", "198.18.0.1", RoceBTH(opcode=0x11, dqpn=5), AETH(syndrome=0x1F, msn=2))))
    assert isinstance(ack[RoceBTH].payload, AETH) and ack[AETH].msn == 2
    mad = Ether(raw(roce_packet("198.18.0.2", "198.18.0.1", RoceBTH(opcode=0x64, dqpn=1), DETH(qkey=0x80010000),
                                PMA(data=PortCounters(port_select=2)))))
    assert mad[PortCounters].port_select == 2


def test_padding_and_padcount() -> None:
    frame = raw(roce_packet("198.18.0.1", "198.18.0.2", RoceBTH(opcode=0x04, dqpn=5), payload=b"abcde"))
    back = Ether(frame)
    assert back[RoceBTH].padcount == 3 and back[Raw].load == b"abcde\0\0\0"
    verify_roce_icrc(frame)


def test_only_emulated_addresses() -> None:
    with pytest.raises(ValueError, match=r"198\.18\.0\.0/15"):
        roce_packet("10.0.0.1", "198.18.0.2", RoceBTH())
    with pytest.raises(ValueError, match="outside"):
        roce_packet("198.18.0.1", "8.8.8.8", RoceBTH())


def test_building_frames_never_resolves_addresses() -> None:
    from scapy.config import conf

    assert not conf.neighbor.resolvers  # ibemu.wire.scapy_setup cleared them: no ARP/ND ever
    frame = raw(Ether() / IP(src="198.18.0.1", dst="198.18.0.9") / UDP(dport=4791) / RoceBTH())
    assert frame[:6] == b"\xff" * 6
