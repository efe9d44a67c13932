"""CPU placement of the agent host, the SM and traffic workers (``ibemu.kernel.cpus``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ibemu.kernel import cpus


def test_one_cpu_pins_nothing() -> None:
    assert cpus.placement([3]) == cpus.Placement()


def test_two_cpus_give_the_agents_and_the_sm_one_each_and_leave_the_rest_everywhere() -> None:
    p = cpus.placement([5, 2])
    assert p.agents == {2} and p.sm == {5} and p.others == {2, 5} and p.all == {2, 5}


def test_more_cpus_keep_traffic_off_the_agents_and_the_sm() -> None:
    p = cpus.placement([0, 1, 2, 3])
    assert p.agents == {0} and p.sm == {1} and p.others == {2, 3}


def test_placement_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpus.ENV, "0")
    assert cpus.placement([0, 1, 2]) == cpus.Placement()


def test_a_pinned_thread_gets_its_cpus_back() -> None:
    mine = os.sched_getaffinity(0)
    seen: dict[str, set[int]] = {}

    def body() -> None:
        before = cpus.pin_thread(frozenset({min(mine)}))
        seen["pinned"] = os.sched_getaffinity(0)
        cpus.unpin_thread(before)
        seen["after"] = os.sched_getaffinity(0)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == {"pinned": {min(mine)}, "after": mine}
    assert os.sched_getaffinity(0) == mine  # only the calling thread was pinned
    assert cpus.pin_thread(None) is None


def test_threads_started_by_a_pinned_thread_are_released() -> None:
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("one CPU: nothing is pinned")
    placement = cpus.placement(sorted(mine))
    assert placement.agents is not None
    started = threading.Event()
    stop = threading.Event()
    seen: dict[str, set[int]] = {}

    def child() -> None:
        seen["inherited"] = os.sched_getaffinity(0)
        started.set()
        stop.wait(5)
        seen["released"] = os.sched_getaffinity(0)

    def pinned() -> None:
        before = cpus.pin_thread(placement.agents)
        t = threading.Thread(target=child)
        t.start()
        started.wait(5)
        cpus.unpin_thread(before)
        seen["released_count"] = {cpus.release_threads(placement)}
        stop.set()
        t.join()

    p = threading.Thread(target=pinned)
    p.start()
    p.join()
    assert seen["inherited"] == placement.agents  # what Linux does
    assert seen["released"] == placement.all and seen["released_count"] == {1}


def test_realtime_raises_the_thread_for_the_block_and_gives_its_policy_back() -> None:
    before = os.sched_getscheduler(0)
    result: list[tuple[bool, int, int]] = []

    def body() -> None:  # a thread of its own: the test runner's policy is not touched
        with cpus.realtime() as granted:
            result.append((granted, os.sched_getscheduler(0), os.sched_getparam(0).sched_priority))
        result.append((True, os.sched_getscheduler(0), 0))

    t = threading.Thread(target=body)
    t.start()
    t.join(5)
    (granted, inside, prio), (_, after, _) = result
    if os.geteuid() == 0:
        assert granted and inside == os.SCHED_FIFO and prio == 1
    else:
        assert not granted and inside == before
    assert after == before and os.sched_getscheduler(0) == before


def test_awake_holds_a_zero_latency_request_while_the_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PM QoS request is 0 us inside the block and gone after it; ``IBEMU_CPU_IDLE=1``
    makes none; without the device the block runs all the same."""
    monkeypatch.delenv(cpus.IDLE_ENV, raising=False)
    before = cpus.idle_latency_us()
    if before is None or os.geteuid() != 0:
        pytest.skip("no readable /dev/cpu_dma_latency here")
    with cpus.awake() as held:
        assert held and cpus.idle_latency_us() == 0
    assert cpus.idle_latency_us() == before
    monkeypatch.setenv(cpus.IDLE_ENV, "1")
    with cpus.awake() as held:
        assert not held and cpus.idle_latency_us() == before
    monkeypatch.delenv(cpus.IDLE_ENV)
    with cpus.awake(str(tmp_path / "absent")) as held:
        assert not held
