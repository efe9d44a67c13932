"""Congestion control of RoCE ports, sans-IO: ECT frames, CNPs on the wire, DCQCN's rate rules."""

from __future__ import annotations

from scapy.contrib.roce import BTH as ScapyRoceBTH
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from ibemu.hca.dcqcn import DcqcnParams, DcqcnState, Pacer
from ibemu.hca.roce_port import CNP_OPCODE, CNP_PAYLOAD
from ibemu.roce.queues import ip_checksum
from ibemu.wire import fast
from ibemu.wire.roce import verify_roce_icrc
from ibemu.wire.rocecodec import HDR_LEN, RoceCodec

MAC_A, MAC_R = bytes.fromhex("021b00000100"), bytes.fromhex("021b00140100")
LIDS = {1: "198.18.0.65", 2: "198.18.0.95"}
P = DcqcnParams(line_gbps=4.0, min_gbps=0.2)


def test_ect_frames_and_a_cnp_on_the_wire() -> None:
    a = RoceCodec(lid=1, ip=LIDS[1], lid_ips=LIDS, mac=MAC_A, peer_mac=MAC_R)
    b = RoceCodec(lid=2, ip=LIDS[2], lid_ips=LIDS, mac=bytes.fromhex("021b00230100"), peer_mac=MAC_R)
    write = fast.NativeTemplate(slid=1, dlid=2, destqp=0x123).packet(0x0A, 5, b"x" * 64,
                                                                    ext=fast.reth(0x7000, 0xBEEF, 64))
    assert Ether(a.encapsulate(write))[IP].tos == 0  # not ECN-capable until asked
    a.set_ect()
    frame = a.encapsulate(write)
    assert frame is not None and Ether(frame)[IP].tos == 0x02  # ECT(0)
    verify_roce_icrc(frame)
    ip = Ether(frame)[IP]
    del ip.chksum
    assert Ether(bytes(Ether(frame)))[IP].chksum == Ether(frame)[IP].chksum
    ce = bytearray(frame)
    ce[15] |= 3  # a router set CE (the ICRC does not cover the TOS byte) and fixed the IP checksum
    ip_checksum(ce)
    assert b.decapsulate(bytes(ce)) == write
    # b's answer: a CNP to the QP that sent it (what RocePort._on_ce builds)
    cnp = b.encapsulate(fast.NativeTemplate(slid=2, dlid=1, destqp=0x45).packet(CNP_OPCODE, 0, CNP_PAYLOAD))
    assert cnp is not None and cnp[HDR_LEN] == CNP_OPCODE
    verify_roce_icrc(cnp)
    bth = Ether(cnp)[ScapyRoceBTH]
    assert bth.opcode == 0x81 and bth.dqpn == 0x45
    assert a.decapsulate(cnp) is not None


def test_a_cnp_cuts_and_the_rate_recovers() -> None:
    s = DcqcnState(P)
    assert s.rc == s.rt == 4.0 and not s.limited
    s.on_cnp(1_000_000)
    assert s.rt == 4.0 and s.rc == 2.0 and s.limited  # alpha = 1: halved
    s.on_cnp(1_010_000)  # within the cut interval: counted, no second cut
    assert s.rc == 2.0 and (s.cnps, s.cuts) == (2, 1)
    s.on_cnp(1_100_000)
    assert s.rt == 2.0 and s.rc < 1.01  # alpha stays close to 1 right after a cut
    low = s.rc
    assert s.rate_gbps(1_100_000 + P.increase_period_ns) == (2.0 + low) / 2  # fast recovery
    assert s.rate_gbps(1_100_000 + 50 * P.increase_period_ns) > 1.9
    assert s.rate_gbps(10**10) == 4.0 and not s.limited  # back at line rate with time


def test_alpha_decays_without_cnps_and_cuts_less() -> None:
    s = DcqcnState(P)
    s.on_cnp(0)
    a1 = s.alpha
    s.advance(100 * P.alpha_period_ns)
    assert s.alpha < a1 * 0.7
    before, alpha = s.rc, s.alpha
    s.on_cnp(100 * P.alpha_period_ns)
    assert abs(s.rc - before * (1 - alpha / 2)) < 1e-9 and s.rc > before * 0.6  # a gentler cut than 1/2
    for t in range(200):
        s.on_cnp(10**9 + t * P.cut_interval_ns)
    assert s.rc == P.min_gbps


def test_pacer_spaces_frames_at_the_rate() -> None:
    s = DcqcnState(P)
    s.on_cnp(0)  # 2 Gb/s: a 4,000-byte frame every 16 us
    pacer = Pacer(s)
    dues = [pacer.due(0, 4000) for _ in range(4)]
    assert dues == [0, 16_000, 32_000, 48_000]
