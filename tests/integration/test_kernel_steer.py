"""Receive steering of a cable's far end (``kernel.steer``) and batched sends (``kernel.mmsg``)
on real veths in namespaces."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from ibemu.kernel import mmsg, netns, ownership, steer
from ibemu.kernel.commands import KernelError
from ibemu.kernel.links import Cable, LinkControl, create_cables
from ibemu.kernel.packet import open_packet_socket
from ibemu.wire import fast

pytestmark = pytest.mark.root


def _pair(state: ownership.RunState) -> tuple[str, str, LinkControl]:
    a, b = (ownership.ns_name(state.run_id, n) for n in ("sa", "sb"))
    state.claim_namespaces([a, b])
    netns.create([a, b])
    create_cables([Cable(a, "p1", b, "q7")])
    links = LinkControl()
    links.all_up(a, ["p1"])
    links.all_up(b, ["q7"])
    links.wait_carrier({a: ["p1"], b: ["q7"]})
    return a, b, links


def _rps(ns: str, ifname: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", ns, "sh", "-c",
                          f"cat /sys/class/net/{ifname}/queues/rx-*/rps_cpus"],
                         capture_output=True, text=True, check=True).stdout
    return [line.strip().lstrip("0,") or "0" for line in out.splitlines()]


def test_the_far_end_is_found_and_steered(run_state: ownership.RunState) -> None:
    a, b, links = _pair(run_state)
    try:
        assert steer.peer_of(a, "p1") == (b, "q7")
        assert steer.peer_of(b, "q7") == (a, "p1")
        where, peer, queues = steer.steer_peer(a, "p1", [0])
        assert (where, peer) == (b, "q7") and queues >= 1
        assert set(_rps(b, "q7")) == {"1"}
        assert set(_rps(a, "p1")) == {"0"}  # the near end is left alone
        assert steer.set_rps(b, "q7", []) == queues
        assert set(_rps(b, "q7")) == {"0"}
        with pytest.raises(KernelError, match="p9"):
            steer.peer_of(a, "p9")
        with pytest.raises(KernelError, match="not a veth"):
            steer.peer_of(a, "lo")
    finally:
        links.close()


def test_mask_and_other_cpus() -> None:
    assert steer.mask([0]) == "1" and steer.mask([1, 3]) == "a" and steer.mask([]) == "0"
    with pytest.raises(ValueError):
        steer.mask([-1])
    online = steer.other_cpus(own=[])
    assert online and 0 in online
    assert steer.other_cpus(own=online) == []
    assert steer.other_cpus(own=[online[0]]) == online[1:]


def test_send_many_sends_every_frame_in_order_in_one_call(run_state: ownership.RunState) -> None:
    a, b, links = _pair(run_state)
    tx = open_packet_socket(a, "p1")
    rx = open_packet_socket(b, "q7")
    try:
        eth = fast.ethernet_header(b"\xff" * 6, b"\x02" * 6)
        frames = [eth + bytes([i]) * (60 + i) for i in range(40)]
        assert mmsg.send_many(tx, frames) == 40
        got: list[bytes] = []
        deadline = time.monotonic() + 2
        while len(got) < 40 and time.monotonic() < deadline:
            try:
                got.append(rx.recv(9000))
            except BlockingIOError:
                time.sleep(0.005)
        assert got == frames
        assert mmsg.send_many(tx, []) == 0
        links.set_up(a, "p1", False)  # the interface down: the first frame is refused
        with pytest.raises(OSError):
            mmsg.send_many(tx, frames[:3])
    finally:
        for s in (tx, rx):
            s.close()
        links.close()


def test_send_many_refuses_what_is_not_a_socket() -> None:
    with pytest.raises(TypeError):
        mmsg.send_many(object(), [b"x"])  # type: ignore[arg-type]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.close()
    with pytest.raises(OSError):
        mmsg.send_many(s, [b"x"])


def test_rps_control_changes_the_steering_at_once_until_closed(run_state: ownership.RunState) -> None:
    _a, b, links = _pair(run_state)
    ctl = steer.RpsControl(b, "q7")
    try:
        t0 = time.monotonic()
        for _ in range(5):
            assert ctl.set([0]) >= 1
            assert ctl.set([]) >= 1
        assert time.monotonic() - t0 < 1.0
        assert ctl.set([0]) >= 1 and ctl.cpus == (0,)
        assert set(_rps(b, "q7")) == {"1"}
        ctl.set([])
        assert set(_rps(b, "q7")) == {"0"}
        ctl.close()
        with pytest.raises(KernelError, match="gone"):
            ctl.set([0])
        bad = steer.RpsControl(b, "nosuch0")
        with pytest.raises(KernelError, match="no receive queue"):
            bad.set([0])
        bad.close()
    finally:
        ctl.close()
        links.close()
