"""The RoCE user datapath's sans-IO parts: PFC frames, the FIB mirror (netlink parsing, LPM,
ECMP) and one router's forwarding (its queues are the link model's: ``tests/unit/roce/test_links.py``)."""

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
from ibemu.roce.queues import QueueConfig, ip_checksum
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
    fib.apply(RouteMsg(False, ip("198.18.0.6"), 32, (12,)))  # a longer prefix than the one remembered
    assert fib.lookup(ip("198.18.0.6")) == (12,) and fib.lookup(ip("198.18.0.5")) == (13,)
    fib.clear()
    assert fib.lookup(ip("198.18.0.6")) is None


# ------------------------------------------------------------------ one router

def plane(cfg: QueueConfig) -> RouterPlane:
    ports = {i: PortInfo(f"r-{i}", bytes.fromhex(f"02000000000{i}"), bytes.fromhex(f"02000000010{i}"),
                         to_host=i == 1) for i in (1, 2, 3)}
    p = RouterPlane("r", ports, cfg, seed=1, local_ips=frozenset({socket.inet_aton("198.18.1.0")}))
    p.fib.apply(RouteMsg(False, int.from_bytes(socket.inet_aton("198.18.0.5"), "big"), 32, (2, 3)))
    return p


def test_forwarding_rewrites_ttl_checksum_and_macs() -> None:
    r = plane(QueueConfig())
    out = r.receive(1, bytes(ip_frame()), 0)
    assert len(out) == 1
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


def test_a_frame_handed_over_by_the_router_before_is_forwarded_as_one_read_from_a_socket() -> None:
    """Between two routers the frame arrives as the first one's bytearray (``LiveLinks``'s
    hand-over), not as bytes: the same forwarding, compiled or not, local addresses included."""
    r = plane(QueueConfig())
    first, = r.receive(1, bytes(ip_frame()), 0)
    again, = r.receive(2, first[1], 0)
    out: dict[int, list[bytes | bytearray]] = {}
    assert r.receive_batch(2, [bytearray(ip_frame()), bytearray(ip_frame(dst="198.18.1.0"))], 0, out) == 1
    assert again[0] == 3 and Ether(bytes(again[1]))[IP].ttl == 62 and checksum_ok(again[1])
    assert again[1] is first[1]  # the router's own copy, rewritten in place (no copy a hop)
    read = bytes(ip_frame())
    assert r.receive(1, read, 0)[0][1] is not read and read == bytes(ip_frame())  # what it read: copied
    assert [len(q) for q in out.values()] == [1] and r.stats["to_router"] == 1


def test_the_planes_ecmp_choice_is_the_fibs_on_the_kernels_flow_key() -> None:
    """The plane reads the 5-tuple from its own header copy: the same key as ``flow_key``
    (what ``testing.bisection`` predicts paths with), so the same next hop."""
    r = plane(QueueConfig())
    frames = [ip_frame(sport=0xC000 + i) for i in range(32)]
    got = [r.receive(1, bytes(f), 0)[0][0] for f in frames]
    assert got == [r.fib.choose((2, 3), flow_key(f)) for f in frames] and set(got) == {2, 3}


def test_dscp_maps_to_priorities() -> None:
    default = QueueConfig().priorities()
    assert default[26 << 2 | 2] == 3 and default[48 << 2] == 6 and default[0] == 0
    mapped = QueueConfig(dscp_priority=((26, 5),)).priorities()
    assert mapped[26 << 2 | 3] == 5 and mapped[48 << 2] == 6
    r = plane(QueueConfig(dscp_priority=((26, 5),)))
    (_, frame), = r.receive(1, bytes(ip_frame()), 0)
    assert r.prio[frame[15]] == 5  # what the link model queues it at: priority 5, not 3
    with pytest.raises(ValueError):
        QueueConfig(dscp_priority=((64, 1),))


def test_pfc_frames_from_a_host_are_for_the_model_from_a_router_only_counted() -> None:
    r = plane(QueueConfig())
    assert r.receive(1, pfc.pause_frame(bytes(6), {3: 0xFFFF}), 0) == []  # port 1: a host's
    assert r.receive(2, pfc.pause_frame(bytes(6), {3: 0}), 0) == []  # a neighbour router's
    assert r.host_pauses == [(1, {3: 0xFFFF})] and r.stats["pfc_in_model"] == 1
    r2 = plane(QueueConfig(loss_pct=100))
    assert r2.receive(1, bytes(ip_frame()), 0) == [] and r2.stats["lost_ingress"] == 1  # from the host: lost here
    assert len(r2.receive(2, bytes(ip_frame(dst="198.18.0.5")), 0)) == 1  # from a router: lost as it leaves
