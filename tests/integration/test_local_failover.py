"""Local failover on the kernel datapath, end to end: ibemu's SM (``ftree_ar``) writes the
alternates (vendor attribute AlternatePorts), a cable cut under a stream of frames, and the
edge switch's classifier forwards on the alternate as soon as its port lost carrier, before
the SM has rerouted; the same cut with ``ftree`` (no alternates) blackholes the stream
until the SM's reroute.

The stream: raw SEND frames h1 -> h15 (``send_and_count``, 64 frames a ms), one way, so the
loss counts the frames the cut cost (no RC retransmission hides it)."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest

from ibemu.kernel.lft_map import MapLft
from tests.integration.test_sm_live import Live, live_fixture  # noqa: F401 (the fixture ``live``)

pytestmark = pytest.mark.root

STREAM = 6400  # ~100 ms of frames at the pacing of send_and_count


def _edge_lft(live: Live) -> MapLft:
    assert live.rt.fabric is not None
    lft = live.rt.fabric.lfts["edge0_0"]
    assert isinstance(lft, MapLft)
    return lft


def _fabric_events(live: Live, kind: str, t_min: int, timeout_s: float = 2.0) -> list[dict[str, Any]]:
    """The agent host's records of ``kind`` after ``t_min`` (its log is flushed every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while True:
        path = live.tmp / "events.jsonl"
        recs = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == kind
                and r.get("t_ns", 0) >= t_min] if path.exists() else []
        if recs or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)


def _cut_under_stream(live: Live, port: int) -> tuple[int, int]:
    """Cut edge0_0:``port`` 30 ms into a stream h1 -> h15; (t_fault, frames lost)."""
    assert live.rt.fabric is not None
    got: list[int] = []
    sender = threading.Thread(target=lambda: got.append(live.blast("h1", "h15", STREAM)))
    sender.start()
    time.sleep(0.03)
    t_fault = time.monotonic_ns()
    live.rt.fabric.links.set_up(live.ns("edge0_0"), live.topo.ifname("edge0_0", port), False)
    sender.join(30)
    assert got
    return t_fault, STREAM - got[0]


def _last_cable(live: Live, src: str, dst: str) -> tuple[str, int]:
    """The cable the kernel LFTs take last on the way ``src`` -> ``dst``, as (switch, port) at
    the far end: a cut there leaves the switch before it with no way down."""
    assert live.rt.fabric is not None
    dlid = live.lid(dst)
    peer = live.topo.peer(src, 1)
    assert peer is not None
    hops: list[tuple[str, int]] = []
    node = peer.node
    while node != dst:
        port = live.rt.fabric.lfts[node].read(dlid)
        nxt = live.topo.peer(node, port)
        assert nxt is not None
        hops.append((node, port))
        node = nxt.node
    assert len(hops) >= 3
    prev, port = hops[-2]
    far = live.topo.peer(prev, port)
    assert far is not None
    return far.node, far.port


def _groups(live: Live) -> int:
    """The SM's groups passes so far (alternates and a new FailoverConfig generation)."""
    return len([r for r in live.records() if r["kind"] == "groups_programmed"])


def _restore(live: Live, node: str, port: int, *, groups_since: int | None) -> None:
    """Cable ``node:port`` back up (the SM running); wait for every port Active, settled,
    and (an adaptive engine) a groups pass of the SM since ``groups_since`` passes, taken
    before the fault: the switches' own repairs of it have ended."""
    assert live.rt.fabric is not None
    live.rt.fabric.links.set_up(live.ns(node), live.topo.ifname(node, port), True)
    time.sleep(0.3)
    deadline = time.monotonic() + 10
    while live.ports_not_active() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    while live.ports_not_active() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live.ports_not_active() == []
    if groups_since is not None:
        live.wait_for("groups_programmed", count=groups_since + 1, timeout_s=20)


def _up(live: Live, engine: str) -> tuple[MapLft, int, int]:
    live.start_sm("--engine", engine)
    live.wait_for("subnet_up")
    assert live.ports_not_active() == []
    lft = _edge_lft(live)
    dlid = live.lid("h15")
    primary = lft.read(dlid)
    assert primary in (3, 4)  # an up-port of the edge switch (h15 is in another pod)
    assert live.blast("h1", "h15", 300) == 300
    return lft, dlid, primary


def test_ftree_ar_fails_over_in_the_kernel_before_the_sm_reroutes(live: Live) -> None:
    lft, dlid, primary = _up(live, "ftree_ar")
    alternate = 7 - primary
    assert lft.alternates(dlid) == (alternate,)  # ftree_ar: the other up-port, written by the SM
    # 1. the cut under a stream, the SM running: the kernel fails over at once, then the SM reroutes
    groups = _groups(live)
    t_fault, lost = _cut_under_stream(live, primary)
    rr = live.wait_for("reroute", timeout_s=20)[0]
    (lf,) = [r for r in _fabric_events(live, "local_failover", t_fault) if r["node"] == "edge0_0"]
    assert lf["port"] == primary and lf["lids"] > 0 and t_fault <= lf["carrier_t_ns"] <= lf["t_ns"]
    assert lf["t_ns"] < rr["t_trap"] <= rr["t_routed"] <= rr["t_programmed"]
    assert lft.counters()["failover"] > 0 and lft.read(dlid) == alternate  # rerouted since
    figures = {"local_failover_ms": (lf["t_ns"] - t_fault) / 1e6,
               "carrier_to_failover_us": (lf["t_ns"] - lf["carrier_t_ns"]) / 1e3,
               "sm_routed_ms": (rr["t_routed"] - t_fault) / 1e6,
               "sm_programmed_ms": (rr["t_programmed"] - t_fault) / 1e6, "frames_lost": lost}
    print("local failover (ftree_ar):", figures)
    assert lost < 64 * (rr["t_programmed"] - t_fault) / 1e6  # shorter than the SM's reroute
    # 2. restored; then the SM stopped: the kernel alone keeps the stream going on the alternate
    _restore(live, "edge0_0", primary, groups_since=groups)
    now = lft.read(dlid)
    alts = lft.alternates(dlid)
    assert alts and now in (3, 4)
    assert live.sm is not None
    groups = _groups(live)
    live.sm.send_signal(signal.SIGSTOP)
    try:
        before = lft.counters()["failover"]
        # cut by the injector's way (``AgentHost.set_ports``): both ends' port maps say down
        # when it returns (loss of signal), not a kernel notification later
        host = live.rt.host
        assert host is not None and host.loss_of_signal
        far = live.topo.peer("edge0_0", now)
        assert far is not None
        far_lft = live.rt.fabric.lfts[far.node]  # type: ignore[union-attr]
        assert isinstance(far_lft, MapLft)
        host.set_ports("edge0_0", [now], False)
        assert now in lft.down_ports and far.port in far_lft.down_ports
        assert lft.read(dlid) == now  # no SM: the LFT still says the dead port
        assert live.blast("h1", "h15", 300) == 300
        assert lft.counters()["failover"] - before >= 300
    finally:
        live.sm.send_signal(signal.SIGCONT)
    # 3. restored, the SM stopped again: a cut whose near side has no alternate (the last
    # switch before h1's edge): its fault notice moves the switches upstream
    _restore(live, "edge0_0", now, groups_since=groups)
    live.sm.send_signal(signal.SIGSTOP)
    try:
        sw, port = _last_cable(live, "h15", "h1")
        assert live.blast("h15", "h1", 300) == 300
        t_cut = time.monotonic_ns()
        live.rt.fabric.links.set_up(live.ns(sw), live.topo.ifname(sw, port), False)  # type: ignore[union-attr]
        far = live.topo.peer(sw, port)
        assert far is not None
        deadline = time.monotonic() + 2
        sent: list[dict[str, Any]] = []
        moved: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not (moved and far.node in {r["node"] for r in sent}):
            time.sleep(0.05)
            sent = _fabric_events(live, "fault_notice_sent", t_cut, 0)
            moved = [r for r in _fabric_events(live, "local_failover", t_cut, 0) if r.get("via") == "notice"]
        assert far.node in {r["node"] for r in sent}, "the far side of the cut sent no notice"
        assert moved, "no switch moved on a fault notice"
        sma = live.rt.host.kernel_sma if live.rt.host is not None else None
        if sma is not None and sma.notices is not None:  # the kernel moved them (kernel.notice)
            assert all(r.get("kernel") for r in moved), moved
        deadline = time.monotonic() + 1  # the notices travel 3 switches (a few ms)
        while live.blast("h15", "h1", 20) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live.blast("h15", "h1", 300) == 300
    finally:
        live.sm.send_signal(signal.SIGCONT)


def test_without_alternates_the_cut_blackholes_until_the_sm_reroutes(live: Live) -> None:
    lft, dlid, primary = _up(live, "ftree")
    assert lft.alternates(dlid) == ()
    t_fault, lost = _cut_under_stream(live, primary)
    rr = live.wait_for("reroute", timeout_s=20)[0]
    assert not [r for r in _fabric_events(live, "local_failover", t_fault, timeout_s=0.2)]
    print("SM reroute only (ftree):", {"sm_routed_ms": (rr["t_routed"] - t_fault) / 1e6,
                                       "sm_programmed_ms": (rr["t_programmed"] - t_fault) / 1e6,
                                       "frames_lost": lost})
    assert lost > 0 and lft.counters()["failover"] == 0
    assert live.blast("h1", "h15", 300) == 300
    # the SM stopped: nothing gets through the dead port
    live.rt.fabric.links.set_up(live.ns("edge0_0"), live.topo.ifname("edge0_0", primary), True)  # type: ignore[union-attr]
    live.wait_for("reroute", count=2, timeout_s=20)
    time.sleep(0.5)
    now = lft.read(dlid)
    assert live.sm is not None
    live.sm.send_signal(signal.SIGSTOP)
    try:
        live.rt.fabric.links.set_up(live.ns("edge0_0"), live.topo.ifname("edge0_0", now), False)  # type: ignore[union-attr]
        time.sleep(0.05)
        assert live.blast("h1", "h15", 300) == 0
    finally:
        live.sm.send_signal(signal.SIGCONT)
    _restore(live, "edge0_0", now, groups_since=None)
    live.sm.send_signal(signal.SIGSTOP)
    try:
        sw, port = _last_cable(live, "h15", "h1")  # and no notices: the far side blackholes
        live.rt.fabric.links.set_up(live.ns(sw), live.topo.ifname(sw, port), False)  # type: ignore[union-attr]
        time.sleep(0.05)
        assert live.blast("h15", "h1", 300) == 0
    finally:
        live.sm.send_signal(signal.SIGCONT)

