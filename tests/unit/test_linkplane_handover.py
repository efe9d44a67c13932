"""The IB user datapath's hand-over in memory between two switches (``fabric.linkplane``),
without the agent host: a frame from h0 crosses leaf0 -> spine0 -> leaf1 -> h1, each switch's
"forwarding" a stand-in that sends every frame on towards h1 as the agent host's batch does
(``begin``, ``submit``, ``settle``). Between switches the frames go in memory, with the
Ethernet header the veth would carry, one switch's batch at a time (never a switch's forwarding
inside another's); onto a host's cable, a cut cable (either end without carrier), a captured
one (either end), they go to the sending thread as before, and nothing goes from or to a switch
that is off. ``kernel.ring.packet_taps`` is checked on a real namespace."""

from __future__ import annotations

import subprocess
import time
import uuid
from typing import Any

import pytest

from ibemu.fabric.linkplane import ETH_LEN, LinkPlane
from ibemu.kernel import linkio
from ibemu.kernel.packet import open_packet_socket
from ibemu.kernel.ring import packet_tap_counts, packet_taps
from ibemu.physics.link import SWITCH_MODELS
from ibemu.physics.plan import build_nodes
from ibemu.topo import generate

ROUTE = {"leaf0": 2, "spine0": 2, "leaf1": 1}  # every frame towards h1


class Tx:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def send_groups(self, groups: Any) -> None:
        for sock, frames, _key, head in groups:
            self.sent += [(sock, head + f[len(head):]) for f in frames]


class Rig:
    def __init__(self) -> None:
        nodes = build_nodes(generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1), kind="ib",
                            switch=SWITCH_MODELS["ib-edr"])
        self.carrier: dict[tuple[str, int], bool] = {(n, p): True for n in ROUTE for p in (1, 2)}
        self.powered = dict.fromkeys(ROUTE, True)
        self.got: list[tuple[str, int, list[bytes]]] = []
        self.inside: str | None = None
        self.lp = LinkPlane(nodes, SWITCH_MODELS["ib-edr"], sockets=lambda n, p: f"{n}:{p}",  # type: ignore[arg-type,return-value]
                            heads=lambda n, p: bytes([len(n), p]) * 7, powered=lambda n: self.powered[n],
                            events=None, counts=lambda n, p, d: None,  # type: ignore[arg-type]
                            deliver=self.deliver, carrier=lambda n, p: self.carrier[(n, p)],
                            where=lambda n, p: (f"ns-{n}", f"port{p}"))
        self.tx = Tx()
        self.lp.tx = self.tx  # type: ignore[assignment]

    def deliver(self, name: str, port: int, frames: list[bytes]) -> None:
        assert self.inside is None, f"{name}'s forwarding entered inside {self.inside}'s"
        self.got.append((name, port, frames))
        self.forward(name, port, frames)

    def forward(self, name: str, port: int, frames: list[bytes]) -> None:
        self.inside = name
        try:
            self.lp.begin()
            self.lp.submit(name, port, {ROUTE[name]: list(frames)})
            self.lp.settle(name, port, frames)
        finally:
            self.inside = None

    def run(self, n: int = 3) -> None:
        """h0 sends ``n`` frames to leaf0; the model is pumped until they are all out."""
        frames = [bytes(14) + bytes([0x00, 0x00]) + bytes([i]) * 18 + bytes(1000) for i in range(n)]
        self.lp.submit("leaf0", 1, {2: frames})
        for _ in range(50):
            time.sleep(0.001)
            self.lp.pump()
        self.lp.close()


def test_frames_between_switches_go_in_memory_one_batch_at_a_time() -> None:
    rig = Rig()
    rig.run()
    assert [(n, p, len(f)) for n, p, f in rig.got] == [("spine0", 1, 3), ("leaf1", 2, 3)]
    spine_frames = rig.got[0][2]
    assert all(f[:ETH_LEN] == bytes([len("leaf0"), 2]) * 7 for f in spine_frames)  # leaf0:2's header
    assert [f[ETH_LEN + 2] for f in spine_frames] == [0, 1, 2]  # in order
    assert [s for s, _ in rig.tx.sent] == ["leaf1:1"] * 3  # onto h1's cable: the veth
    assert rig.lp.handed == 6 and rig.lp.plane.unmatched == 0


@pytest.mark.parametrize("end", [("leaf0", 2), ("spine0", 1)])
def test_a_cut_or_captured_cable_carries_its_frames_on_the_veth(end: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig()
    rig.carrier[end] = False  # either end without carrier: the veth (where the kernel drops them)
    rig.run()
    assert rig.got == [] and [s for s, _ in rig.tx.sent] == ["leaf0:2"] * 3
    monkeypatch.setattr(linkio, "packet_tap_counts", lambda ns: {f"port{end[1]}": 1} if ns == f"ns-{end[0]}" else {})
    rig = Rig()  # a capture on either end of leaf0 -- spine0: that cable's frames cross its veth
    assert rig.lp.captured == {("leaf0", 2), ("spine0", 1)}
    rig.run()
    assert rig.got == [] and [s for s, _ in rig.tx.sent] == ["leaf0:2"] * 3
    monkeypatch.setattr(linkio, "packet_tap_counts", lambda ns: {})
    rig = Rig()
    rig.lp.captured = {("x", 1)}
    rig.lp.check_captures()  # the capture has stopped
    assert rig.lp.captured == set()


def test_nothing_goes_from_a_switch_that_is_off() -> None:
    rig = Rig()
    rig.powered["leaf0"] = False
    rig.run()
    assert rig.got == [] and rig.tx.sent == []


def test_packet_taps_sees_a_capture_on_a_port_or_on_every_port() -> None:
    ns = f"ibemu-t{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"], check=True)
        for dev in ("pa", "pb"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        own = open_packet_socket(ns, "pa", 0x88B5)  # a datapath's own socket: not a capture
        assert packet_taps(ns) == set()
        cap = open_packet_socket(ns, "pb", 0x0003)
        assert packet_taps(ns) == {"pb"} and packet_tap_counts(ns) == {"pb": 1}
        cap2 = open_packet_socket(ns, "pb", 0x0003)  # (a datapath's ETH_P_ALL socket and a capture)
        assert packet_tap_counts(ns) == {"pb": 2}
        cap2.close()
        cap.close()
        own.close()
        assert packet_taps(ns) == set()
        assert packet_taps("ibemu-no-such-namespace") == set()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)
