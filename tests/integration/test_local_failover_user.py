"""Local failover on the IB user datapath, end to end: ibemu's SM (``ftree_ar``) writes the
alternates (vendor attribute AlternatePorts) into the switch agents, the SM is stopped
(SIGSTOP) once the subnet is up, and the edge switch's up-port is cut under a stream of
frames: the switch's forwarder (``Forwarder.decide`` and its fast twin) sends the stream on
the alternate with no SM to reroute it. The same cut with ``ftree`` (no alternates)
blackholes the stream.

The stream: raw SEND frames h1 -> h15 (``send_and_count``, 64 frames a ms), one way, so the
loss counts the frames the cut cost. The user datapath runs without dilation, as the other
user-datapath tests under an SM do (``test_datapaths``)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ibemu.agents.forwarder import Reason
from ibemu.fabric.probe import send_and_count
from tests.integration.test_local_failover import _fabric_events
from tests.integration.test_sm_live import Live, live_fabric

pytestmark = pytest.mark.root

STREAM = 3200  # ~50 ms of frames at the pacing of send_and_count
EDGE = "edge0_0"


@pytest.fixture(name="live")
def user_live_fixture(state_dir: Path, tmp_path: Path) -> Iterator[Live]:
    yield from live_fabric(tmp_path, "user")


def _edge(live: Live, fn: Any) -> Any:
    """``fn(agent)`` on the fabric's loop, for the edge switch of h1."""
    return live.on_loop(lambda: fn(live.host.nodes[EDGE].agent))  # type: ignore[union-attr]


def _stats(live: Live) -> dict[str, int]:
    return dict(_edge(live, lambda a: a.forwarder.stats))


def _count(live: Live, src: str, dst: str, n: int, wait_s: float = 3.0) -> int:
    return send_and_count(live.rt.plan, src, dst, live.lid(src), live.lid(dst), n, wait_s=wait_s)


def _up_and_stopped(live: Live, engine: str) -> tuple[int, int, tuple[int, ...]]:
    """The SM up with ``engine``, then stopped; (DLID of h15, the edge's LFT port, alternates)."""
    live.start_sm("--engine", engine)
    live.wait_for("subnet_up")
    assert live.ports_not_active() == []
    dlid = live.lid("h15")
    primary = _edge(live, lambda a: a.lft.lookup(dlid))
    assert primary in (3, 4)  # an up-port of the edge switch (h15 is in another pod)
    alts: tuple[int, ...] = ()
    deadline = time.monotonic() + 5
    while engine.endswith("_ar") and not alts and time.monotonic() < deadline:
        alts = _edge(live, lambda a: a.alternates_of(dlid))
        time.sleep(0.05)
    assert live.blast("h1", "h15", 300) == 300
    assert live.sm is not None
    live.sm.send_signal(signal.SIGSTOP)  # the fixture resumes and ends it
    return dlid, primary, alts


def _cut_under_stream(live: Live, port: int) -> tuple[int, int]:
    """Cut the edge's ``port`` 20 ms into a stream h1 -> h15; (t_fault, frames that arrived
    within 3 s: the user datapath drains its queues behind the stream)."""
    assert live.rt.fabric is not None
    got: list[int] = []
    sender = threading.Thread(target=lambda: got.append(_count(live, "h1", "h15", STREAM)))
    sender.start()
    time.sleep(0.02)
    t_fault = time.monotonic_ns()
    live.rt.fabric.links.set_up(live.ns(EDGE), live.topo.ifname(EDGE, port), False)
    sender.join(30)
    assert got
    return t_fault, got[0]


def test_ftree_ar_keeps_the_stream_on_the_alternate_with_the_sm_stopped(live: Live) -> None:
    dlid, primary, alts = _up_and_stopped(live, "ftree_ar")
    assert alts == (7 - primary,)  # ftree_ar: the other up-port, written by the SM
    before = _stats(live)
    t_fault, arrived = _cut_under_stream(live, primary)
    after = _stats(live)
    (lf,) = [r for r in _fabric_events(live, "local_failover", t_fault) if r["node"] == EDGE]
    assert lf["port"] == primary and lf["lids"] > 0 and t_fault <= lf["carrier_t_ns"] <= lf["t_ns"]
    failovers = after.get("local_failover", 0) - before.get("local_failover", 0)
    lost = STREAM - arrived
    print("user datapath local failover (ftree_ar, SM stopped):",
          {"carrier_to_failover_us": (lf["t_ns"] - lf["carrier_t_ns"]) / 1e3,
           "frames_lost": lost, "frames_failed_over": failovers})
    # the frames after the cut went on the alternate; only those on or queued for the dead
    # cable, or sent before the carrier loss reached the agent host, are lost (128-256 here;
    # ``ftree`` below loses every frame after the cut)
    assert failovers > STREAM // 4 and lost < STREAM // 4
    assert _edge(live, lambda a: a.lft.lookup(dlid)) == primary  # no SM: the LFT still says the dead port
    assert live.blast("h1", "h15", 300) == 300
    assert _stats(live)["local_failover"] - after["local_failover"] >= 300
    # every alternate down too: not forwarded, counted
    live.rt.fabric.links.set_up(live.ns(EDGE), live.topo.ifname(EDGE, alts[0]), False)  # type: ignore[union-attr]
    time.sleep(0.05)
    assert _count(live, "h1", "h15", 100, wait_s=0.3) == 0
    assert _stats(live).get(Reason.ALTERNATES_DOWN, 0) >= 100


def test_ftree_without_alternates_blackholes_the_stream(live: Live) -> None:
    dlid, primary, alts = _up_and_stopped(live, "ftree")
    assert alts == () and _edge(live, lambda a: a.alternates) == {}
    before = _stats(live)
    t_fault, arrived = _cut_under_stream(live, primary)
    after = _stats(live)
    assert not [r for r in _fabric_events(live, "local_failover", t_fault, timeout_s=0.2)]
    print("user datapath, no alternates (ftree, SM stopped):", {"frames_lost": STREAM - arrived})
    assert arrived < STREAM * 3 // 4  # the ~30 ms after the cut are gone
    assert after.get("local_failover", 0) == 0
    assert after.get(Reason.EGRESS_DOWN, 0) - before.get(Reason.EGRESS_DOWN, 0) > STREAM // 4
    assert _edge(live, lambda a: a.lft.lookup(dlid)) == primary
    assert _count(live, "h1", "h15", 300, wait_s=0.3) == 0
