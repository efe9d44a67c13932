"""How far a trio process falls behind the emulated clock: a lag monitor and its distribution.

Every long-running ibemu trio process of a run (the agent host, ibemu's SM, the traffic
workers, the RoCE user datapath and fabric manager) runs ``watch_from_env(name)``: a task
that sleeps to a fixed schedule of deadlines ``PERIOD_S`` of real time apart (on trio's
clock, ``PERIOD_S / N`` emulated) and records, at each wake-up, how late it woke in emulated time (``lag = now - deadline``). A process whose loop was
busy (or descheduled) for 50 ms wakes 50 ms late; the deadlines it missed meanwhile count too,
each as late as it was (40, 30, 20, 10 ms), so the distribution is of the time the process
spent behind, not of its wake-ups. Lag is measured on trio's clock, which in an ibemu process
is the emulated clock (``ibemu.clock.trio_clock``): at dilation N, a real stall of X is X/N.

``LagStats`` is the distribution: a fixed log-scale histogram (``SUB`` buckets per octave of
microseconds, ~9% resolution), a count and an exact maximum; adding a sample updates two
integers and a float, no allocation. Every ``REPORT_S`` (and once at the end, ``final``) the
task writes a ``Kind.LAG`` record of the interval since its last one to the run's lag log
(``Log.LAG``, ``RUN_DIR/lag.jsonl``, every process appending to it), stamped with
``clock.now_ns()``: ``process``, ``pid``, ``since_ns``, ``period_us``, ``samples``,
``p50_us``, ``p99_us``, ``max_us`` and the non-empty ``buckets`` ({index: count}), from which
the runner merges a process's intervals over any window (``LagStats.from_buckets``,
``merge``). The log's path comes from the environment (``ENV_LOG``), which the runner sets and
every child inherits (``clock.child_env()`` copies it): without it the task returns at once
(``ibemu up``, tests), costing nothing.

**Busy share.** A process can keep its timers on time and still be the bottleneck: a traffic
worker that spends all its CPU carrying frames wakes its monitor a few ms late (trio runs the
monitor between batches) while every frame it handles waits for it, so a throughput figure
is its CPU's, not the fabric's. ``BusyMeter`` (a trio instrument) adds up the real time the
loop waited for IO with something to wait for (``before_io_wait`` with a timeout: no task
runnable); each record carries ``busy``, the share of the interval's real time (``wall_s``)
the process was not idle (running, or runnable and waiting for a CPU). The fidelity judge
(``ibemu.scenario.fidelity``) merges it per process.

Cost: one wake-up per period (100 per second), one file append per ``REPORT_S``; two clock
reads per idle wait of the loop.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import trio

from ibemu import clock
from ibemu.events import Kind, append

ENV_LOG = "IBEMU_LAG_LOG"
"""The run's lag log (``RUN_DIR/lag.jsonl``); unset: no monitor."""
LOG_NAME = "lag.jsonl"
PERIOD_S = 0.01
"""The monitor's schedule: one wake-up every 10 ms of real time (``watch_from_env``: 10 ms / N
of emulated time at dilation N)."""
REPORT_S = 1.0
"""A record of the interval's distribution every real second (and at the end)."""
SUB = 8
"""Histogram buckets per octave of microseconds."""
FLOOR_OCTAVES = 10
"""Octaves below 1 us the histogram resolves: from 2^-10 us (~1 ns). Under dilation N a real
lag of X is X/N emulated, so at N = 20,000 the 2 ms of real time the fidelity judge allows are
0.1 us emulated: a histogram starting at 1 us (20 ms real there) could not tell them apart."""
OCTAVES = 40
NBUCKETS = 1 + SUB * (FLOOR_OCTAVES + OCTAVES)
"""Bucket 0: under 2^-10 us; then ``SUB`` per octave up to 2^40 us (12 days)."""
FLOOR_US = 2.0**-FLOOR_OCTAVES

Sink = Callable[[dict[str, Any]], None]


def bucket_of(lag_us: float) -> int:
    """The histogram bucket of a lag in microseconds."""
    if lag_us < FLOOR_US:
        return 0
    m, e = math.frexp(lag_us)  # lag = m * 2**e, 0.5 <= m < 1, e >= 1 - FLOOR_OCTAVES
    return min(1 + (e - 1 + FLOOR_OCTAVES) * SUB + int((2.0 * m - 1.0) * SUB), NBUCKETS - 1)


def upper_us(index: int) -> float:
    """The upper edge of bucket ``index`` in microseconds."""
    if index <= 0:
        return FLOOR_US
    octave, sub = divmod(index - 1, SUB)
    return 2.0 ** (octave - FLOOR_OCTAVES) * (1.0 + (sub + 1) / SUB)


class LagStats:
    """A lag distribution: a log-scale histogram, the count and the exact maximum (us)."""

    __slots__ = ("counts", "max_us", "samples")

    def __init__(self) -> None:
        self.counts = [0] * NBUCKETS
        self.samples = 0
        self.max_us = 0.0

    def add(self, lag_us: float) -> None:
        if lag_us < 0.0:  # a wake-up is never early; rounding of the clocks may say so
            lag_us = 0.0
        self.counts[bucket_of(lag_us)] += 1
        self.samples += 1
        if lag_us > self.max_us:
            self.max_us = lag_us

    def add_all(self, lags_us: Iterable[float]) -> None:
        """:meth:`add` of every lag, the same histogram, but bucketed in one pass over them
        sorted: a bucket's run found by bisection, ``bucket_of`` once per bucket, not per
        lag (a cable's fidelity record has thousands of lags a second; ``add`` each cost
        ~0.7 us of the IB user datapath's ~8 us per frame-hop, py-spy)."""
        xs = sorted(lags_us)
        n = len(xs)
        if not n:
            return
        counts = self.counts
        i = bisect.bisect_right(xs, 0.0)  # (negative ones taken as 0, as ``add`` does)
        if i:
            counts[0] += i
        while i < n:
            b = bucket_of(xs[i])
            j = n if b == NBUCKETS - 1 else bisect.bisect_left(xs, upper_us(b), i + 1)
            while j < n and bucket_of(xs[j]) == b:  # (an edge rounded either way)
                j += 1
            while j > i + 1 and bucket_of(xs[j - 1]) != b:
                j -= 1
            counts[b] += j - i
            i = j
        self.samples += n
        if xs[-1] > self.max_us:
            self.max_us = xs[-1]

    def reset(self) -> None:
        for i, c in enumerate(self.counts):
            if c:
                self.counts[i] = 0
        self.samples = 0
        self.max_us = 0.0

    def quantile_us(self, q: float) -> float:
        """The ``q`` quantile (0 < q <= 1): the upper edge of its bucket, at most the maximum."""
        if self.samples == 0:
            return 0.0
        rank = max(1, math.ceil(q * self.samples))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return min(upper_us(i), self.max_us)
        return self.max_us

    def buckets(self) -> dict[str, int]:
        """The non-empty buckets, ``{str(index): count}`` (JSON keys are strings)."""
        return {str(i): c for i, c in enumerate(self.counts) if c}

    def merge(self, other: LagStats) -> None:
        for i, c in enumerate(other.counts):
            if c:
                self.counts[i] += c
        self.samples += other.samples
        self.max_us = max(self.max_us, other.max_us)

    @classmethod
    def from_buckets(cls, buckets: Mapping[str, int], max_us: float) -> LagStats:
        s = cls()
        for k, c in buckets.items():
            i = min(max(int(k), 0), NBUCKETS - 1)
            s.counts[i] += int(c)
            s.samples += int(c)
        s.max_us = float(max_us)
        return s

    def summary(self) -> dict[str, Any]:
        """``samples``, ``p50_us``, ``p99_us``, ``max_us`` (to 3 significant digits, at least
        0.1 us: under a high dilation a process's lags are fractions of an emulated us)."""
        return {"samples": self.samples, "p50_us": round_us(self.quantile_us(0.5)),
                "p99_us": round_us(self.quantile_us(0.99)), "max_us": round_us(self.max_us)}


def round_us(us: float) -> float:
    """``us`` to 0.1 us, or to 3 significant digits below 100 us (0.000123 us stays visible)."""
    if us <= 0.0 or us >= 100.0:
        return round(us, 1)
    return round(us, max(1, 2 - math.floor(math.log10(us))))


class BusyMeter(trio.abc.Instrument):
    """The real time a trio loop spends idle, waiting for IO with no task runnable (module
    docstring: busy share)."""

    def __init__(self) -> None:
        self.idle_s = 0.0
        self._waiting: float | None = None
        self._since = time.perf_counter()

    def before_io_wait(self, timeout: float) -> None:
        if timeout > 0:  # 0: tasks are runnable, the loop only polls
            self._waiting = time.perf_counter()

    def after_io_wait(self, timeout: float) -> None:
        if self._waiting is not None:
            self.idle_s += time.perf_counter() - self._waiting
            self._waiting = None

    def take(self) -> tuple[float, float]:
        """(busy share, real seconds) of the interval since the last ``take``; a new one starts."""
        now = time.perf_counter()
        wall, idle = now - self._since, self.idle_s
        self._since, self.idle_s = now, 0.0
        return (min(1.0, max(0.0, 1.0 - idle / wall)) if wall > 0 else 0.0), wall


def record(name: str, stats: LagStats, since_ns: int, *, period_s: float, final: bool,
           busy: tuple[float, float] | None = None) -> dict[str, Any]:
    """The ``Kind.LAG`` record of one interval (stamped now); ``busy``: ``BusyMeter.take()``."""
    extra = {} if busy is None else {"busy": round(busy[0], 4), "wall_s": round(busy[1], 4)}
    return {"kind": Kind.LAG, "t_ns": clock.now_ns(), "process": name, "pid": os.getpid(),
            "since_ns": since_ns, "period_us": round(period_s * 1e6), **stats.summary(),
            "buckets": stats.buckets(), "final": final, **extra}


async def watch(name: str, sink: Sink, *, period_s: float = PERIOD_S, report_s: float = REPORT_S,
                task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Sleep to deadlines ``period_s`` apart on trio's clock, count how late each wake-up was,
    hand ``sink`` a record every ``report_s`` and one (``final``) when cancelled; each with the
    loop's busy share over its interval (``BusyMeter``)."""
    stats = LagStats()
    since = clock.now_ns()
    deadline = trio.current_time() + period_s
    next_report = deadline - period_s + report_s
    meter = BusyMeter()
    trio.lowlevel.add_instrument(meter)
    task_status.started()
    try:
        while True:
            await trio.sleep_until(deadline)
            now = trio.current_time()
            while deadline <= now:  # this wake-up, and every deadline missed meanwhile
                stats.add((now - deadline) * 1e6)
                deadline += period_s
            if now >= next_report:
                sink(record(name, stats, since, period_s=period_s, final=False, busy=meter.take()))
                stats.reset()
                since = clock.now_ns()
                next_report = now + report_s
    finally:
        with contextlib.suppress(KeyError):
            trio.lowlevel.remove_instrument(meter)
        with contextlib.suppress(OSError):  # the run directory is gone: nothing to report to
            sink(record(name, stats, since, period_s=period_s, final=True, busy=meter.take()))


def file_sink(path: Path | str) -> Sink:
    """Append each record to the lag log at ``path`` (opened for each record: one a second)."""
    p = Path(path)

    def sink(rec: dict[str, Any]) -> None:
        append(p, rec)

    return sink


def log_path() -> str | None:
    """The run's lag log, from the environment (None: no monitor in this process)."""
    return os.environ.get(ENV_LOG) or None


async def watch_from_env(name: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """``watch`` into the run's lag log if the environment names one; otherwise return at once."""
    path = log_path()
    if path is None:
        task_status.started()
        return
    # the schedule in real time (10 ms, a record a second) at any dilation: at N = 20,000 an
    # emulated 10 ms period would be 200 s of real time, and a run would end unsampled
    await watch(name, file_sink(path), period_s=clock.loop_s(PERIOD_S), report_s=clock.loop_s(REPORT_S),
                task_status=task_status)
