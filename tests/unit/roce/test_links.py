"""The RoCE user datapath on the link model (``ibemu.roce.links``), without sockets: Ethernet
nodes in the live plane (drop tail, PFC, pauses handed to the peer), departures marked CE or
lost, pause frames put on the cables, counters per port and priority."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import pytest

from ibemu.kernel import linkio
from ibemu.physics import expect
from ibemu.physics.link import SWITCH_MODELS
from ibemu.physics.live import Departure, LivePlane
from ibemu.physics.model import EthConfig, Frame, Pause
from ibemu.physics.plan import build_nodes, nodes_from_cables
from ibemu.roce.links import RoceLinks, match_key
from ibemu.roce.physics import cables, eth_config, switch_model
from ibemu.roce.queues import QueueConfig, ip_checksum
from ibemu.topo import generate
from ibemu.wire import pfc

SIZE = 4096 + 78 + 4  # a RoCE WRITE of 4 KiB on the wire, FCS included
BUFFER = 64 * 1024


def incast(eth: EthConfig, frames: int = 100) -> tuple[LivePlane, list[Departure]]:
    """h0 and h1 (ports 1, 2 of sw0) each hand ``frames`` to their NIC at once, all for h2."""
    nodes = build_nodes(generate("single-switch", hosts=3), kind="eth", switch=SWITCH_MODELS["eth"], eth=eth)
    plane = LivePlane(nodes, tie_seed=1)
    for n in range(frames):
        for port in (1, 2):
            plane.arrive("sw0", port, Frame(SIZE, sl=3, dst=3, flow=(port, n), meta=port), 0)
    out: list[Departure] = []
    while (t := plane.next_deadline()) is not None:
        out += plane.run(t)
    return plane, out


def test_without_pfc_the_incast_drops_what_the_model_expects_and_the_nics_never_drop() -> None:
    plane, out = incast(EthConfig(buffer_bytes=BUFFER))
    assert plane.drops == expect.incast_drops(2, 100, SIZE, BUFFER) > 0
    assert plane.drop_reasons == {"buffer": plane.drops}
    assert all(n.node == "sw0" for n in plane.take_notes())  # the hosts' queues stand for their NICs
    assert len(out) == 200 - plane.drops


def test_with_pfc_nothing_drops_the_nics_are_paused_and_share_evenly() -> None:
    plane, out = incast(EthConfig(buffer_bytes=BUFFER, lossless=frozenset({3}), xoff_bytes=32 * 1024,
                                  xon_bytes=16 * 1024))
    assert plane.drops == 0 and len(out) == 200
    pauses = [n for n in plane.take_notes() if isinstance(n, Pause)]
    assert {(p.node, p.port) for p in pauses} == {("sw0", 1), ("sw0", 2)} and any(p.xoff for p in pauses)
    assert not pauses[-1].xoff or not pauses[-2].xoff  # the last word is XON
    for h in ("h0", "h1"):
        assert plane.nodes[h].ports[1].counters.paused_ns > 0 and not plane.nodes[h].ports[1].paused
    assert sorted(d.frame.meta for d in out[:100]).count(1) == pytest.approx(50, abs=3)


def roce_frame(tos: int = 26 << 2 | 2, n: int = 0) -> bytearray:
    total = 1000 - 14
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, total, 7, 0x4000, 64, 17, 0, socket.inet_aton("198.18.0.9"),
                     socket.inet_aton("198.18.0.5"))
    f = bytearray(bytes(12) + b"\x08\x00" + ip + struct.pack("!HHHH", 0xC001, 4791, total - 20, 0)
                  + bytes([0x0A, 0, 0xFF, 0xFF, 0, 0, 1, 0, 0, 0, 0, n]) + bytes(total - 40))
    ip_checksum(f)
    return f


class Tx:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, bytes]] = []

    def send(self, sock: Any, frames: Any, key: Any = None, head: bytes = b"") -> None:
        self.sent += [(sock, bytes(f)) for f in frames]


def links(cfg: QueueConfig, down: set[tuple[str, int]] | None = None) -> tuple[RoceLinks, Tx]:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    nodes = nodes_from_cables({n: v.is_switch for n, v in topo.nodes.items()}, cables(topo, cfg), kind="eth",
                              switch=switch_model(cfg), eth=eth_config(cfg))
    lk = RoceLinks(nodes, sockets=lambda n, p: (n, p), macs=lambda n, p: bytes([2, 0, 0, 0, 0, p]),  # type: ignore[arg-type,return-value]
                   down=lambda n, p: (n, p) in (down or set()), loss_pct=cfg.loss_pct, seed=3)
    tx = Tx()
    lk.tx = tx  # type: ignore[assignment]
    return lk, tx


def test_departures_carry_the_models_ce_mark_loss_and_dead_ports() -> None:
    lk, _ = links(QueueConfig())
    f = roce_frame()
    fr = Frame(len(f) + 4, sl=3, flow=match_key(f), ecn_capable=True, ce=True, meta=f, vl=3)
    out = lk.outgoing(Departure("leaf0", 2, fr, 0, 0, 0))
    assert out is f and f[15] & 3 == 3  # CE, checksum fixed
    assert sum((f[i] << 8) | f[i + 1] for i in range(14, 34, 2)) % 0xFFFF == 0
    assert lk.counts[("leaf0", 2, 3)].ecn_marked == 1 and lk.counts[("leaf0", 2, 3)].tx_frames == 1
    lost, _ = links(QueueConfig(loss_pct=100))
    assert lost.outgoing(Departure("leaf0", 2, fr, 0, 0, 0)) is None and lost.counts[("leaf0", 2, 3)].lost == 1
    dead, _ = links(QueueConfig(), down={("leaf0", 2)})
    assert dead.outgoing(Departure("leaf0", 2, fr, 0, 0, 0)) is None and dead.counts[("leaf0", 2, 3)].dropped == 1
    assert match_key(roce_frame(tos=0)) == match_key(roce_frame())  # what a router rewrites is not in it
    assert match_key(roce_frame(n=1)) != match_key(roce_frame())


def test_the_models_pauses_go_on_the_cable_and_are_counted_at_both_ends() -> None:
    lk, tx = links(QueueConfig(pfc=frozenset({3})))
    lk._notes([Pause("spine0", 1, 3, True, 1_000), Pause("leaf0", 1, 3, True, 1_000)])  # towards leaf0; h0
    lk._notes([Pause("spine0", 1, 3, False, 5_000)])
    frames = [f for _, f in tx.sent]
    assert [s for s, _ in tx.sent] == [("spine0", 1), ("leaf0", 1), ("spine0", 1)]
    assert [pfc.parse_pause(f) for f in frames] == [{3: pfc.MAX_QUANTA}, {3: pfc.MAX_QUANTA}, {3: 0}]
    assert frames[0][6:12] == bytes([2, 0, 0, 0, 0, 1])
    peer = lk.plane.peer("spine0", 1)
    assert peer is not None and peer[0] == "leaf0"
    c = lk.port_counters(10_000)
    assert c["spine0"][1][3]["pause_sent"] == 2 and c["leaf0"][1][3]["pause_sent"] == 1
    assert c[peer[0]][peer[1]][3] == {"pause_received": 2, "paused_us": 4}


def test_a_frame_through_two_routers_is_matched_and_timed_at_the_cables_rate() -> None:
    cfg = QueueConfig(line_gbps=1.0, delay_us=1.0)
    lk, _ = links(cfg)
    plane = lk.plane
    f = roce_frame()
    size = len(f) + 4
    plane.arrive("leaf0", 1, Frame(size, sl=3, dst=2, flow=match_key(f), meta=f), 0)
    (d,) = [d for t in iter(plane.next_deadline, None) for d in plane.run(t)][:1] or [None]
    assert d is not None and (d.switch, d.port) == ("leaf0", 2)
    ser = (size + 20) * 8  # ns at 1 Gb/s
    assert d.due_ns == 2 * (ser + 1000) + switch_model(cfg).latency_ns  # host cable, leaf0, its uplink
    plane.arrive("spine0", 1, Frame(size, sl=3, dst=2, flow=match_key(f), meta=f), d.due_ns + 50_000)
    assert plane.unmatched == 0  # the record of leaf0's departure matched: the model's time, not the real one


class Handover:
    """leaf0 -> spine0 -> leaf1 -> h1 with the hand-over in memory (``LiveLinks``): each
    router's "forwarding" sends every frame on towards h1, as the datapath's batch does."""

    ROUTE = {"leaf0": 2, "spine0": 2, "leaf1": 1}

    def __init__(self, down: set[tuple[str, int]] | None = None, loss_pct: float = 0.0) -> None:
        cfg = QueueConfig()
        topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
        nodes = nodes_from_cables({n: v.is_switch for n, v in topo.nodes.items()}, cables(topo, cfg), kind="eth",
                                  switch=switch_model(cfg), eth=eth_config(cfg))
        self.got: list[tuple[str, int, list[bytearray]]] = []
        self.prio = cfg.priorities()
        self.lk = RoceLinks(nodes, sockets=lambda n, p: (n, p), macs=lambda n, p: bytes(6),  # type: ignore[arg-type,return-value]
                            down=lambda n, p: (n, p) in (down or set()), loss_pct=loss_pct, seed=3,
                            deliver=self.deliver,
                            where=lambda n, p: (f"ns-{n}", f"port{p}"))
        self.sent: list[tuple[Any, Any]] = []
        self.lk.tx = self  # type: ignore[assignment]

    def send_groups(self, groups: Any) -> None:
        self.sent += [(sock, f) for sock, frames, _key, _head in groups for f in frames]

    def deliver(self, name: str, port: int, frames: list[bytearray]) -> None:
        self.got.append((name, port, frames))
        with self.lk.batch():
            self.lk.submit(name, port, {self.ROUTE[name]: frames}, self.prio)

    def run(self, frames: list[bytearray]) -> None:
        with self.lk.batch():
            self.lk.submit("leaf0", 1, {2: frames}, self.prio)
        for _ in range(50):
            time.sleep(0.001)
            self.lk.pump()
        self.lk.close()


def test_frames_between_routers_go_in_memory_unless_a_port_is_down_or_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Handover()
    frames = [roce_frame(n=i) for i in range(3)]
    rig.run(frames)
    assert [(n, p, len(f)) for n, p, f in rig.got] == [("spine0", 1, 3), ("leaf1", 2, 3)]
    assert all(a is b for a, b in zip(rig.got[1][2], frames, strict=True))  # the router's own bytearrays, in order
    assert [s for s, _ in rig.sent] == [("leaf1", 1)] * 3  # onto h1's cable: the veth
    assert rig.lk.handed == 6 and rig.lk.plane.unmatched == 0
    rig = Handover(down={("spine0", 1)})  # either end without carrier: the veth (the kernel drops them)
    rig.run([roce_frame(n=i) for i in range(3)])
    assert rig.got == [] and [s for s, _ in rig.sent] == [("leaf0", 2)] * 3
    # the routers' own ETH_P_ALL socket on each port is not a capture; a second one is
    monkeypatch.setattr(linkio, "packet_tap_counts", lambda ns: {"port2": 1})
    assert Handover().lk.captured == set()
    monkeypatch.setattr(linkio, "packet_tap_counts", lambda ns: {"port2": 2} if ns == "ns-leaf0" else {"port2": 1})
    rig = Handover()
    assert rig.lk.captured == {("leaf0", 2), ("spine0", 1)}
    rig.run([roce_frame(n=i) for i in range(3)])
    assert rig.got == [] and [s for s, _ in rig.sent] == [("leaf0", 2)] * 3


def test_departures_handed_over_are_counted_and_lost_as_those_sent() -> None:
    """The compiled hand-over loop does ``outgoing``'s work: counters per port and priority,
    cable loss (the next router's record settled at once)."""
    rig = Handover()
    rig.run([roce_frame(n=i) for i in range(3)])
    prio = rig.prio[26 << 2 | 2]
    c = rig.lk.port_counters(0)
    assert {(r, p): d[prio] for r, ports in c.items() for p, d in ports.items()} == {
        ("leaf0", 2): {"tx_frames": 3}, ("spine0", 2): {"tx_frames": 3}, ("leaf1", 1): {"tx_frames": 3}}
    assert all(set(d) == {prio} for ports in c.values() for d in ports.values())  # no other priority shows
    rig = Handover(loss_pct=100)
    rig.run([roce_frame(n=i) for i in range(3)])
    assert not any(f for _, _, f in rig.got) and rig.sent == [] and rig.lk.handed == 0
    assert rig.lk.port_counters(0) == {"leaf0": {2: {prio: {"lost": 3}}}}
    assert rig.lk.plane.unmatched == 0 and not rig.lk.plane.nodes["spine0"].ports[1].live_flight  # settled
    rig = Handover(down={("leaf1", 1)})  # h1's cable without carrier: dropped as it leaves
    rig.run([roce_frame(n=i) for i in range(3)])
    assert rig.sent == [] and rig.lk.port_counters(0)["leaf1"] == {1: {prio: {"dropped": 3}}}
