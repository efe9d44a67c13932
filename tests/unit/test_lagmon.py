"""The lag monitor: its histogram's math, and a stalled event loop seen as lag."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu import lagmon
from ibemu.events import Kind, read_events
from ibemu.lagmon import FLOOR_US, NBUCKETS, LagStats, bucket_of, upper_us


def test_buckets_cover_each_lag_within_a_ninth() -> None:
    assert bucket_of(0.0) == 0 and bucket_of(0.0009) == 0 and upper_us(0) == 2.0**-10
    prev = 0
    # down to the ns: at dilation 20,000 the 2 ms real threshold is 0.1 us emulated
    for lag in [0.001, 0.0123, 0.1, 0.99, 1.0, 1.1, 1.9, 2.0, 3.3, 10.0, 999.0, 1000.0, 5e4, 1e6, 3.7e9]:
        i = bucket_of(lag)
        assert i >= prev
        prev = i
        assert upper_us(i - 1) <= lag < upper_us(i) or (i == 1 and lag < upper_us(1))
        assert upper_us(i) <= lag * 1.126
    assert bucket_of(1e30) == NBUCKETS - 1


def test_quantiles_of_a_known_distribution() -> None:
    s = LagStats()
    for _ in range(990):
        s.add(100.0)
    for _ in range(10):
        s.add(50_000.0)
    assert s.samples == 1000 and s.max_us == 50_000.0
    assert 100.0 <= s.quantile_us(0.5) <= 113.0
    assert 100.0 <= s.quantile_us(0.99) <= 113.0  # the 990th sample
    assert s.quantile_us(0.995) == 50_000.0  # capped at the exact maximum
    s.add(-3.0)  # never early
    assert s.samples == 1001 and s.counts[0] == 1
    summ = s.summary()
    assert summ["samples"] == 1001 and summ["max_us"] == 50_000.0


def test_buckets_round_trip_and_merge() -> None:
    a, b = LagStats(), LagStats()
    for v in (5.0, 7.0, 900.0):
        a.add(v)
    for v in (3000.0, 3100.0):
        b.add(v)
    back = LagStats.from_buckets(json.loads(json.dumps(a.buckets())), a.max_us)
    assert back.counts == a.counts and back.samples == 3 and back.max_us == 900.0
    back.merge(b)
    assert back.samples == 5 and back.max_us == 3100.0 and back.quantile_us(0.99) == 3100.0
    back.reset()
    assert back.samples == 0 and not back.buckets() and back.quantile_us(0.5) == 0.0


def _run_watch(body: Any, clock: trio.abc.Clock | None = None, **kw: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(lambda task_status: lagmon.watch("p", records.append, task_status=task_status, **kw))
            await body()
            n.cancel_scope.cancel()

    trio.run(main, clock=clock)
    return records


def test_a_quiet_loop_on_a_mock_clock_has_no_lag() -> None:
    async def body() -> None:
        await trio.sleep(2.5)

    recs = _run_watch(body, trio.testing.MockClock(autojump_threshold=0))
    assert [r["final"] for r in recs] == [False, False, True]
    assert all(r["kind"] == Kind.LAG and r["process"] == "p" for r in recs)
    assert sum(r["samples"] for r in recs) in (249, 250)
    assert max(r["max_us"] for r in recs) == 0.0


def test_a_jump_of_the_clock_is_lag_of_every_deadline_missed() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def body() -> None:
        await trio.sleep(0.105)
        clock.jump(0.05)  # the loop "blocked" 50 ms: the monitor wakes 45 ms late
        await trio.sleep(0.5)

    recs = _run_watch(body, clock)
    s = LagStats()
    for r in recs:
        s.merge(LagStats.from_buckets(r["buckets"], r["max_us"]))
    assert s.max_us == pytest.approx(45_000.0, abs=1.0)
    # 45, 35, 25, 15, 5 ms: five deadlines missed, each as late as it was
    big = sum(c for i, c in enumerate(s.counts) if upper_us(i) > 4_000.0)
    assert big == 5


def test_a_blocked_loop_on_the_real_clock_is_seen_as_lag() -> None:
    async def body() -> None:
        await trio.sleep(0.05)
        time.sleep(0.08)  # block the event loop
        await trio.sleep(0.05)

    recs = _run_watch(body)
    worst = max(r["max_us"] for r in recs)
    assert 60_000.0 <= worst <= 2_000_000.0
    assert recs[-1]["final"] and recs[-1]["period_us"] == 10_000


def test_the_busy_share_tells_a_loop_that_had_work_from_one_that_waited() -> None:
    """A loop that computes without sleeping (checkpoints between slices, as a worker carrying
    frames does: its monitor stays on time) is busy ~100% of the time; one that sleeps, ~0%."""
    async def working() -> None:
        end = time.perf_counter() + 0.4
        while time.perf_counter() < end:
            t = time.perf_counter() + 0.001
            while time.perf_counter() < t:
                pass
            await trio.lowlevel.checkpoint()

    async def idle() -> None:
        await trio.sleep(0.4)

    busy = _run_watch(working, period_s=0.01, report_s=0.1)
    lazy = _run_watch(idle, period_s=0.01, report_s=0.1)
    share = sum(r["busy"] * r["wall_s"] for r in busy) / sum(r["wall_s"] for r in busy)
    assert share > 0.9, busy
    assert max(r["max_us"] for r in busy) < 50_000  # its timers kept (nearly) on time all the same
    assert sum(r["busy"] * r["wall_s"] for r in lazy) / sum(r["wall_s"] for r in lazy) < 0.2, lazy
    assert all(0.0 <= r["busy"] <= 1.0 and r["wall_s"] > 0 for r in busy + lazy)


def test_watch_from_env_writes_the_run_log_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def one(name: str) -> None:
        async with trio.open_nursery() as n:
            await n.start(lagmon.watch_from_env, name)
            await trio.sleep(0.05)
            n.cancel_scope.cancel()

    monkeypatch.delenv(lagmon.ENV_LOG, raising=False)
    trio.run(one, "nobody")  # no log named: returns at once
    path = tmp_path / "lag.jsonl"
    monkeypatch.setenv(lagmon.ENV_LOG, str(path))
    trio.run(one, "sm")
    recs = read_events(path)
    assert len(recs) == 1 and recs[0]["process"] == "sm" and recs[0]["final"] and recs[0]["samples"] >= 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.floats(min_value=-5.0, max_value=1e13, allow_nan=False),
    st.sampled_from([0.0, FLOOR_US, upper_us(1), upper_us(17), upper_us(200), upper_us(NBUCKETS - 2), 1e300]),
    st.integers(min_value=0, max_value=10**9).map(lambda ns: ns / 1000.0)), max_size=400))
def test_add_all_is_add_of_each(lags: list[float]) -> None:
    """The one-pass histogram (a link fidelity record's) is the per-lag one, bucket edges included."""
    one, each = LagStats(), LagStats()
    one.add(3.0)
    each.add(3.0)  # (onto a histogram that holds something already)
    one.add_all(lags)
    for x in lags:
        each.add(x)
    assert one.counts == each.counts
    assert one.samples == each.samples and one.max_us == each.max_us
