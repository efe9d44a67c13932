"""The RoCE user datapath's sans-IO parts: PFC frames, egress queues (line rate, ECN, drop
tail, pauses, delay, loss), PFC ingress accounting, the FIB mirror (netlink parsing, LPM,
ECMP) and one router's forwarding."""

from __future__ import annotations

import socket
import struct

import pytest
from scapy.contrib.mac_control import MACControlClassBasedFlowControl
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

from ibemu.kernel import netlink
from ibemu.kernel.fib import Fib, RouteMsg, flow_key, parse_routes
from ibemu.kernel.netconf import RTM_DELROUTE, RTM_NEWROUTE, RouteWriter
from ibemu.roce.queues import EgressPort, PfcIngress, QueueConfig, ip_checksum, priority
from ibemu.roce.routes import NextHop
from ibemu.roce.userplane import PortInfo, RouterPlane
from ibemu.wire import pfc

MAC = bytes.fromhex("021b00000101")
US = 1000


def ip_frame(size: int = 1000, *, tos: int = 26 << 2 | 2, ttl: int = 64, dst: str = "198.18.0.5",
             src: str = "198.18.0.9", sport: int = 0xC001) -> bytearray:
    """Ethernet / IPv4 / UDP 4791 of ``size`` bytes, with a valid header checksum."""
    total = size - 14
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, total, 0, 0x4000, ttl, 17, 0, socket.inet_aton(src),
                     socket.inet_aton(dst))
    udp = struct.pack("!HHHH", sport, 4791, total - 20, 0)
    f = bytearray(bytes(12) + b"\x08\x00" + ip + udp + bytes(total - 28))
    ip_checksum(f)
    return f


def checksum_ok(frame: bytes | bytearray) -> bool:
    s = sum((frame[i] << 8) | frame[i + 1] for i in range(14, 34, 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s == 0xFFFF


# ------------------------------------------------------------------ PFC frames

def test_pfc_frame_golden_bytes_and_scapy_decodes_it() -> None:
    f = pfc.pause_frame(MAC, {3: 0xFFFF, 6: 0})
    assert len(f) == 60
    assert f[:24].hex() == "0180c2000001" "021b00000101" "8808" "0101" "0048" "0000" "0000" "0000"
    assert f[24:34].hex() == "ffff" "0000" "0000" "0000" "0000"
    assert pfc.parse_pause(f) == {3: 0xFFFF, 6: 0}
    layer = Ether(f)[MACControlClassBasedFlowControl]
    assert layer.c3_enabled == 1 and layer.c3_pause_time == 0xFFFF and layer.c6_enabled == 1 and layer.c0_enabled == 0
    assert pfc.parse_pause(f[:20]) is None and pfc.parse_pause(bytes(ip_frame(60))) is None
    assert pfc.quanta_ns(0xFFFF, 100.0) == round(0xFFFF * 512 / 100)  # 335.5 us at 100 Gb/s
    with pytest.raises(ValueError):
        pfc.pause_frame(MAC, {8: 1})


# ------------------------------------------------------------------ egress queues

def test_line_rate_is_a_byte_clock() -> None:
    port = EgressPort(QueueConfig(line_gbps=1.0))  # 1000 bytes = 8 us
    for _ in range(10):
        assert port.enqueue(ip_frame(), 3, 1, 0)
    out, left = port.service(40 * US)
    assert len(left) == 6  # frames start at 0, 8, .. 40 us
    assert len(out) == 5  # and are on the wire once serialised: 8, 16, .. 40 us
    assert port.next_event(40 * US) == 48 * US
    out, left = port.service(10_000 * US)  # a late wake-up: the rest at once, at their times
    assert len(out) == 5 and len(left) == 4 and port.busy_until == 80 * US


def test_ecn_marks_above_the_threshold_and_fixes_the_checksum() -> None:
    port = EgressPort(QueueConfig(line_gbps=1.0, ecn_mark_kb=2))
    marks = []
    for _ in range(5):
        f = ip_frame()
        port.enqueue(f, 3, 1, 0)
        marks.append(f[15] & 3 == 3)
        assert checksum_ok(f)
    assert marks == [False, False, False, True, True]  # more than 2048 bytes queued before it
    assert port.counters[3].ecn_marked == 2
    not_ect = ip_frame(tos=26 << 2)
    port.enqueue(not_ect, 3, 1, 0)
    assert not_ect[15] & 3 == 0  # Not-ECT is never marked


def test_drop_tail_unless_lossless() -> None:
    lossy = EgressPort(QueueConfig(line_gbps=1.0, buffer_kb=4))
    assert [lossy.enqueue(ip_frame(), 3, 1, 0) for _ in range(6)] == [True] * 4 + [False] * 2
    assert lossy.counters[3].dropped == 2
    lossless = EgressPort(QueueConfig(line_gbps=1.0, buffer_kb=4, pfc=frozenset({3})))
    assert all(lossless.enqueue(ip_frame(), 3, 1, 0) for _ in range(6))
    assert not lossless.enqueue(ip_frame(), 0, 1, 0)  # priority 0 stays lossy


def test_a_pause_stops_one_priority_until_its_quanta_expire_or_xon() -> None:
    port = EgressPort(QueueConfig(line_gbps=1.0, pfc=frozenset({3})))
    port.on_pause({3: 100}, 0)  # 100 x 512 bits at 1 Gb/s = 51.2 us
    port.enqueue(ip_frame(), 3, 1, 0)
    port.enqueue(ip_frame(tos=48 << 2), 6, 1, 0)
    out, _ = port.service(8 * US)
    assert len(out) == 1 and priority(out[0]) == 6  # the CNP class is not paused
    assert port.next_event(8 * US) == 51_200
    out, _ = port.service(51_199)
    assert out == []
    port.service(51_200)
    out, _ = port.service(60 * US)
    assert len(out) == 1 and priority(out[0]) == 3
    assert port.paused_ns(3, 60 * US) == 51_200 and port.counters[3].pause_received == 1
    port.on_pause({3: 0xFFFF}, 100 * US)
    assert port.paused(3, 120 * US)
    port.on_pause({3: 0}, 130 * US)  # XON
    assert not port.paused(3, 130 * US) and port.paused_ns(3, 200 * US) == 51_200 + 30 * US


def test_delay_holds_frames_fifo_and_loss_is_seeded() -> None:
    port = EgressPort(QueueConfig(line_gbps=1.0, delay_us=100))
    for i in range(3):
        f = ip_frame()
        f[-1] = i
        port.enqueue(f, 3, 1, 0)
    out, _ = port.service(50 * US)
    assert out == [] and port.next_event(50 * US) == 108 * US
    out, _ = port.service(124 * US)
    assert [f[-1] for f in out] == [0, 1, 2]  # left at 8, 16, 24 us, each 100 us later, in order
    runs = []
    for _ in range(2):
        lossy = EgressPort(QueueConfig(loss_pct=30), seed=7)
        kept = []
        for i in range(200):
            f = ip_frame()
            f[-1] = i & 0xFF
            lossy.enqueue(f, 0, 1, 0)
            out, _ = lossy.service(0)
            kept += [f[-1] for f in out]
        runs.append(kept)
    assert runs[0] == runs[1] and 100 < len(runs[0]) < 180
    assert lossy.counters[0].lost == 200 - len(runs[0])


def test_pfc_ingress_xoff_xon_and_refresh() -> None:
    ing = PfcIngress(QueueConfig(line_gbps=1.0, pfc=frozenset({3}), xoff_kb=4, xon_kb=2))
    sent = [ing.add(1, 3, 1000, 0) for _ in range(5)]
    assert sent == [None, None, None, None, 0xFFFF]  # above 4096 bytes: XOFF once
    assert ing.add(1, 3, 1000, 0) is None
    assert ing.add(2, 0, 10_000, 0) is None  # a lossy priority never pauses
    every = ing.refresh_ns()
    assert every == pfc.quanta_ns(0xFFFF, 1.0) // 2 and ing.next_refresh() == every
    assert ing.due_refresh(every - 1) == [] and ing.due_refresh(every) == [(1, 3)]
    assert [ing.remove(1, 3, 1000) for _ in range(4)] == [None, None, None, 0]  # below 2048: XON
    assert ing.next_refresh() is None


# ------------------------------------------------------------------ the FIB mirror

def _route_messages() -> bytes:
    writer = object.__new__(RouteWriter)
    writer.ifindex = {"e-1": 11, "e-2": 12, "e-3": 13}
    multi = writer._message(RTM_NEWROUTE, 0, 1, "198.18.0.5/32", (NextHop("e-1", "198.18.1.1"),
                                                                   NextHop("e-2", "198.18.1.3")))
    single = writer._message(RTM_NEWROUTE, 0, 2, "198.18.0.0/15", (NextHop("e-3", "198.18.1.5"),))
    gone = writer._message(RTM_DELROUTE, 0, 3, "198.18.0.7/32", ())
    return multi + single + gone


def test_route_messages_parse_as_the_manager_writes_them() -> None:
    msgs = list(parse_routes(_route_messages()))
    five, net = int.from_bytes(socket.inet_aton("198.18.0.5"), "big"), int.from_bytes(socket.inet_aton("198.18.0.0"), "big")
    assert msgs[0] == RouteMsg(False, five, 32, (11, 12))
    assert msgs[1] == RouteMsg(False, net, 15, (13,))
    assert msgs[2].deleted and msgs[2].length == 32
    assert list(parse_routes(b"\x10\x00")) == [] and list(parse_routes(bytes(64))) == []
    local = netlink.message(RTM_NEWROUTE, 0, 1, struct.pack("=BBBBBBBBI", socket.AF_INET, 32, 0, 0, 255, 2, 254, 2, 0))
    assert list(parse_routes(local)) == []  # the local table is not forwarding state


def test_lpm_and_ecmp_spreading() -> None:
    fib = Fib(seed=0x1234)
    for m in parse_routes(_route_messages()):
        fib.apply(m)
    ip = lambda s: int.from_bytes(socket.inet_aton(s), "big")  # noqa: E731
    assert fib.lookup(ip("198.18.0.5")) == (11, 12)
    assert fib.lookup(ip("198.18.0.6")) == (13,)  # the /15
    assert fib.lookup(ip("10.0.0.1")) is None
    picks = {fib.choose((11, 12), flow_key(ip_frame(sport=0xC000 + i))) for i in range(32)}
    assert picks == {11, 12}  # different UDP source ports (QPs) spread
    one = flow_key(ip_frame(sport=0xC005))
    assert len({fib.choose((11, 12), one) for _ in range(10)}) == 1  # one flow, one path
    assert {fib.choose((11, 12), flow_key(ip_frame(sport=0xC000 + i)), {11}) for i in range(32)} == {12}
    assert fib.choose((11,), one, {11}) is None
    fib.apply(RouteMsg(True, ip("198.18.0.5"), 32, ()))
    assert fib.lookup(ip("198.18.0.5")) == (13,)


# ------------------------------------------------------------------ one router

def plane(cfg: QueueConfig) -> RouterPlane:
    ports = {i: PortInfo(f"r-{i}", bytes.fromhex(f"02000000000{i}"), bytes.fromhex(f"02000000010{i}"),
                         to_host=i == 1) for i in (1, 2, 3)}
    p = RouterPlane("r", ports, cfg, seed=1, local_ips=frozenset({socket.inet_aton("198.18.1.0")}))
    p.fib.apply(RouteMsg(False, int.from_bytes(socket.inet_aton("198.18.0.5"), "big"), 32, (2, 3)))
    return p


def test_forwarding_rewrites_ttl_checksum_and_macs() -> None:
    r = plane(QueueConfig())
    r.express = False
    assert r.receive(1, bytes(ip_frame()), 0) == []  # queued: leaves when served
    out = r.service(0)
    assert len(out) == 1
    r.express = True
    assert r.receive(1, bytes(ip_frame()), 0) == [out[0]]  # an idle port without rate: at once
    egress, frame = out[0]
    assert egress in (2, 3) and frame[:12] == r.ports[egress].peer_mac + r.ports[egress].mac
    pkt = Ether(bytes(frame))[IP]
    assert pkt.ttl == 63 and checksum_ok(frame)
    for bad, why in ((b"\x00" * 20, "not_ipv4"), (bytes(ip_frame())[:30], "not_ipv4"),
                     (bytes(ip_frame(ttl=1)), "ttl_expired"), (bytes(ip_frame(dst="198.18.0.99")), "no_route"),
                     (bytes(ip_frame(dst="198.18.1.0")), "to_router")):
        r.receive(1, bad, 0)
        assert r.stats[why] >= 1, why
    broken = ip_frame()
    broken[16:18] = b"\xff\xff"  # IP total length beyond the frame
    r.receive(1, bytes(broken), 0)
    assert r.stats["malformed"] == 1
    r.set_link(2, False)
    r.set_link(3, False)
    r.receive(1, bytes(ip_frame()), 0)
    assert r.stats["egress_down"] == 1


def test_dscp_maps_to_priorities() -> None:
    default = QueueConfig().priorities()
    assert default[26 << 2 | 2] == 3 and default[48 << 2] == 6 and default[0] == 0
    mapped = QueueConfig(dscp_priority=((26, 5),)).priorities()
    assert mapped[26 << 2 | 3] == 5 and mapped[48 << 2] == 6
    r = plane(QueueConfig(dscp_priority=((26, 5),)))
    r.express = False
    r.receive(1, bytes(ip_frame()), 0)
    assert sum(e.qbytes[5] for e in r.egress.values()) > 0  # queued at priority 5, not 3
    with pytest.raises(ValueError):
        QueueConfig(dscp_priority=((64, 1),))


def test_a_congested_egress_pauses_its_ingress_and_honours_pauses() -> None:
    cfg = QueueConfig(line_gbps=1.0, pfc=frozenset({3}), xoff_kb=4, xon_kb=2)
    r = plane(cfg)
    sent = []
    for _ in range(6):
        sent += r.receive(1, bytes(ip_frame()), 0)
    assert len(sent) == 1 and sent[0][0] == 1  # XOFF back out of the ingress port
    assert pfc.parse_pause(sent[0][1]) == {3: 0xFFFF} and sent[0][1][6:12] == r.ports[1].mac
    later = r.service(1_000 * US)  # everything drained: XON
    xon = [f for i, f in later if pfc.is_pause(f)]
    assert len(xon) == 1 and pfc.parse_pause(xon[0]) == {3: 0}
    assert r.egress[1].counters[3].pause_sent == 2
    egress = next(i for i, f in later if not pfc.is_pause(f))
    r.receive(egress, pfc.pause_frame(bytes(6), {3: 1000}), 2_000 * US)  # the next hop pauses us
    r.receive(1, bytes(ip_frame()), 2_000 * US)
    held = [f for i, f in r.service(2_100 * US) if i == egress]
    assert held == [] and r.egress[egress].paused(3, 2_100 * US)
