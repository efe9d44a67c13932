"""The carrier thread (``kernel.carrier``) on a real cable: the port map is written in the
thread before anyone else hears of the change, and the thread stops cleanly (close, an
exception such as Ctrl-C's, the loop it hands to gone) without leaving a thread or a file
descriptor behind."""

from __future__ import annotations

import os
import queue
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibemu import clock
from ibemu.fabric.agenthost import CarrierTiming
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import bpf, lft_map, netns, ownership, rtnl
from ibemu.kernel.carrier import CarrierChange, CarrierThread, Stop
from ibemu.kernel.commands import KernelError
from ibemu.kernel.linkevents import LinkEvent, open_link_monitor
from ibemu.kernel.links import Cable, LinkControl, create_cables
from ibemu.topo import generate

pytestmark = pytest.mark.root


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _carrier_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ibemu-carrier")]


def _cable(state: ownership.RunState) -> tuple[str, str, LinkControl]:
    a, b = (ownership.ns_name(state.run_id, n) for n in ("a", "b"))
    state.claim_namespaces([a, b])
    netns.create([a, b])
    create_cables([Cable(a, "p1", b, "p1", a_index=40, b_index=41)])
    links = LinkControl()
    links.all_up(a, ["p1"])
    links.all_up(b, ["p1"])
    links.wait_carrier({a: ["p1"], b: ["p1"]})
    return a, b, links


Rig = tuple[str, LinkControl, bpf.Map, dict[str, socket.socket]]


@pytest.fixture
def rig(run_state: ownership.RunState) -> Iterator[Rig]:
    """A cable a:p1 - b:p1, a port map of 4 slots and both namespaces' link monitors; closed
    after, and no carrier thread left."""
    a, b, links = _cable(run_state)
    ports = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, 4, 4, "ibemu_test_port")
    monitors = {"a": open_link_monitor(a), "b": open_link_monitor(b)}
    try:
        yield a, links, ports, monitors
    finally:
        for sock in monitors.values():
            sock.close()
        ports.close()
        links.close()
    assert not _carrier_threads()


def test_the_map_is_written_before_the_change_is_handed_over(rig: Rig) -> None:
    a, links, ports, monitors = rig
    got: queue.Queue[tuple[CarrierChange[str], int]] = queue.Queue()
    in_thread: list[bool] = []

    def act(key: str, ev: LinkEvent) -> bool:
        if key != "b":
            return False
        in_thread.append(threading.current_thread().name == "ibemu-carrier")
        ports.update(struct.pack("=I", 1), struct.pack("=I", ev.ifindex | (0 if ev.carrier else lft_map.PORT_DOWN)),
                     hold_gil=True)
        return True

    def hand_over(changes: list[CarrierChange[str]]) -> None:
        for ch in changes:  # what the map says when the change is handed over
            value = ports.lookup(struct.pack("=I", 1))
            got.put((ch, struct.unpack("=I", value)[0] if value else 0))

    with CarrierThread(monitors, {("a", 40): True, ("b", 41): True}, act=act, hand_over=hand_over):
        links.set_up(a, "p1", False)  # cut at a: b is the far end
        seen: dict[str, tuple[CarrierChange[str], int]] = {}
        deadline = time.monotonic() + 3
        while len(seen) < 2 and time.monotonic() < deadline:
            try:
                ch, word = got.get(timeout=0.1)
            except queue.Empty:
                continue
            seen[ch.key] = (ch, word)
        assert set(seen) == {"a", "b"}
        far, word = seen["b"]
        assert far.ifindex == 41 and not far.carrier
        assert word == 41 | lft_map.PORT_DOWN  # written before the hand-over
        assert 0 < far.t_seen_ns <= far.t_written_ns
        near, _ = seen["a"]
        assert near.ifindex == 40 and not near.carrier and near.t_written_ns == 0  # act wrote nothing
        assert in_thread == [True]
        links.set_up(a, "p1", True)  # and back: the map says up again
        ch, word = got.get(timeout=3)
        while ch.key != "b":
            ch, word = got.get(timeout=3)
        assert ch.carrier and word == 41
        time.sleep(0.05)
        assert got.empty()  # changes only, each once


def test_loss_of_signal_is_written_and_handed_over_at_once(rig: Rig) -> None:
    """``signal_lost`` from the cutting thread: both ends' maps written and the changes handed
    over when it returns; the kernel's own notifications of the cut that follow change
    nothing; ends already down are left out."""
    a, links, ports, monitors = rig
    got: queue.Queue[CarrierChange[str]] = queue.Queue()
    slot = {"a": 0, "b": 1}

    def act(key: str, ev: LinkEvent) -> bool:
        ports.update(struct.pack("=I", slot[key]),
                     struct.pack("=I", ev.ifindex | (0 if ev.carrier else lft_map.PORT_DOWN)), hold_gil=True)
        return True

    def word(key: str) -> int:
        value = ports.lookup(struct.pack("=I", slot[key]))
        return struct.unpack("=I", value)[0] if value else 0

    def hand_over(changes: list[CarrierChange[str]]) -> None:
        for ch in changes:
            got.put(ch)

    ends = [("a", 40), ("b", 41)]
    with CarrierThread(monitors, {("a", 40): True, ("b", 41): True}, act=act, hand_over=hand_over) as thread:
        t = clock.now_ns()
        lost = thread.signal_lost(ends)  # as AgentHost.set_ports: first the maps, then the cut
        assert word("a") == 40 | lft_map.PORT_DOWN and word("b") == 41 | lft_map.PORT_DOWN
        assert [(ch.key, ch.carrier) for ch in lost] == [("a", False), ("b", False)]
        assert all(t <= ch.t_seen_ns <= ch.t_written_ns for ch in lost)
        rtnl.set_up(a, ["p1"], False)
        assert [got.get_nowait() for _ in range(2)] == lost  # handed over from this thread
        assert thread.signal_lost(ends) == []  # already down
        time.sleep(0.5)  # the kernel's notifications of the same cut: no change
        assert got.empty() and thread.changes == 2
        links.set_up(a, "p1", True)  # back up: the kernel tells, both ends
        back = {got.get(timeout=3).key, got.get(timeout=3).key}
        assert back == {"a", "b"} and word("a") == 40 and word("b") == 41


def test_a_link_set_readied_changes_nothing_until_sent(run_state: ownership.RunState) -> None:
    """``rtnl.LinkSet`` (``AgentHost.set_ports`` readies it before the cut): the request is
    built and the socket opened with the interface still up; ``send`` takes it down; a name
    the namespace does not have is refused when readied, naming the namespace."""
    a, _b, links = _cable(run_state)
    with rtnl.LinkSet(a, ["p1"], False) as request:
        time.sleep(0.05)
        assert rtnl.carrier_down(a, ["p1"]) == []
        t = request.send()
        assert t <= clock.now_ns()
    deadline = time.monotonic() + 3
    while rtnl.carrier_down(a, ["p1"]) != ["p1"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rtnl.carrier_down(a, ["p1"]) == ["p1"]
    with pytest.raises(KernelError, match=a):
        rtnl.LinkSet(a, ["p1", "nosuch0"], True)
    links.set_up(a, "p1", True)


def test_it_stops_on_close_on_an_exception_and_when_the_loop_is_gone(run_state: ownership.RunState) -> None:
    a, _b, links = _cable(run_state)
    mon = open_link_monitor(a)
    try:
        links.index(a, "p1")  # its netlink socket open before the count
        before = _fds()
        # close(): joined, its epoll set and eventfd closed
        thread = CarrierThread({"a": mon}, {}, act=lambda k, ev: False, hand_over=lambda ch: None)
        thread.start()
        assert thread.alive
        thread.close()
        thread.close()  # idempotent
        assert not thread.alive and not _carrier_threads() and _fds() == before
        # Ctrl-C in the caller: the context manager stops it on the way out
        with pytest.raises(KeyboardInterrupt), CarrierThread({"a": mon}, {}, act=lambda k, ev: False,
                                                             hand_over=lambda ch: None) as thread:
            assert thread.alive
            raise KeyboardInterrupt
        assert not thread.alive and not _carrier_threads() and _fds() == before

        # the trio loop it hands to has finished: the thread ends by itself at the next change
        async def main() -> trio.lowlevel.TrioToken:
            return trio.lowlevel.current_trio_token()

        token = trio.run(main)

        def hand_over(changes: list[CarrierChange[str]]) -> None:
            try:
                token.run_sync_soon(lambda: None)
            except trio.RunFinishedError:  # as the agent host's hand-over says it
                raise Stop from None

        thread = CarrierThread({"a": mon}, {("a", 40): True}, act=lambda k, ev: False, hand_over=hand_over)
        thread.start()
        links.set_up(a, "p1", False)
        deadline = time.monotonic() + 3
        while thread.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not thread.alive
        thread.close()
        assert _fds() == before
    finally:
        mon.close()
        links.close()


def test_the_far_end_is_written_on_the_near_ends_word(run_state: ownership.RunState) -> None:
    """A cut at a takes b's carrier too (veth_close); b's own notification waits for linkwatch.
    With b's monitor left out, only the early write can mark b down, and a's return restores
    it (linkwatch may coalesce b's down and up into nothing)."""
    a, _b, links = _cable(run_state)
    ports = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, 4, 4, "ibemu_test_port")
    mon = open_link_monitor(a)
    written: queue.Queue[tuple[str, int, bool]] = queue.Queue()

    def act(key: str, ev: LinkEvent) -> bool:
        written.put((key, ev.ifindex, ev.carrier))
        if key != "b":
            return False
        ports.update(struct.pack("=I", 1), struct.pack("=I", ev.ifindex | (0 if ev.carrier else lft_map.PORT_DOWN)))
        return True

    def word() -> int:
        value = ports.lookup(struct.pack("=I", 1))
        return struct.unpack("=I", value)[0] if value else 0

    try:
        with CarrierThread({"a": mon}, {("a", 40): True, ("b", 41): True}, act=act, hand_over=lambda ch: None,
                           peers={("a", 40): ("b", 41), ("b", 41): ("a", 40)}):
            links.set_up(a, "p1", False)
            assert written.get(timeout=3) == ("a", 40, False)
            assert written.get(timeout=3) == ("b", 41, False)
            assert word() == 41 | lft_map.PORT_DOWN
            links.set_up(a, "p1", True)
            assert written.get(timeout=3) == ("a", 40, True)
            assert written.get(timeout=3) == ("b", 41, True)  # its state as last heard
            assert word() == 41
    finally:
        mon.close()
        ports.close()
        links.close()
    assert not _carrier_threads()


def test_the_agent_hosts_carrier_thread_and_ctrl_c(state_dir: object, tmp_path: Path) -> None:
    """On a live fabric: a cut host cable's switch port is marked down in the kernel's port map
    by the carrier thread, whose steps are in order (seen, written, then the loop notified and
    done); Ctrl-C inside the run stops the thread and leaves nothing."""
    topo = generate("single-switch", hosts=2)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-carrier")
    rt = FabricRuntime(topo, make_agents=make_agents, state=state, run_dir=tmp_path, mad_sockets=False)
    seen: list[CarrierTiming] = []

    async def main() -> None:
        async with rt.running() as host:
            assert host.carrier_thread is not None and host.carrier_thread.alive
            sw = rt.plan.switches()[0]
            lft = host.fabric.lfts[sw.name]
            assert isinstance(lft, lft_map.MapLft)
            port = next(p for p, pp in sw.ports.items() if pp.peer_node == "h0")
            ifname = rt.plan.nodes["h0"].ports[1].ifname
            await trio.to_thread.run_sync(rtnl.set_up, rt.plan.nodes["h0"].ns, [ifname], False)  # h0's end
            with trio.fail_after(5):
                while not [t for t in host.carrier_timings if t.node == sw.name and t.port == port and not t.up]:
                    await trio.sleep(0.01)
            seen.extend(t for t in host.carrier_timings if not t.up and t.node == sw.name)
            assert lft._prog is not None and port in lft._prog.down_ports
            signal.raise_signal(signal.SIGINT)  # Ctrl-C
            await trio.sleep(5)

    with pytest.raises(BaseException) as caught:
        trio.run(main)
    ki = caught.value
    if isinstance(ki, BaseExceptionGroup):
        assert ki.subgroup(KeyboardInterrupt) is not None, ki
    else:
        assert isinstance(ki, KeyboardInterrupt), ki
    (t,) = seen
    assert t.written > 0 and t.written <= t.notified <= t.done and t.seen <= t.notified
    assert not _carrier_threads()
    assert not any(netns.exists(n) for n in rt.plan.namespaces)
