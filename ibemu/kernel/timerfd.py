"""A CLOCK_MONOTONIC timerfd: a descriptor trio can wait on that fires at a nanosecond deadline.

trio's own timers round to milliseconds; the user datapaths (``ibemu.kernel.linkio``) wake on
one of these when their next frame is due. Python 3.11 has no ``os.timerfd_*``, so the calls
go through libc.

``run_trio(fn, *args)`` is ``trio.run`` on the emulated clock (``ibemu.clock.trio_clock``)
with timers that wake within ``PRECISION_S`` of their deadline instead of up to 1 ms late:
trio blocks in ``epoll_wait``, whose timeout Python rounds *up* to whole milliseconds, so a
process sleeping to a deadline 9.1 ms away wakes at 10 ms, and a loop that wakes 0.9 ms
late every time stays 0.9 ms late (what the lag monitor saw of every idle ibemu process: a
p50 lag of 0.8-0.9 ms at dilation 1, half the fidelity threshold gone before any real work).
Each time trio is about to block with a deadline whose millisecond rounding would overshoot
it by more than ``PRECISION_S``, the clock's ``on_sleep`` hook arms one timerfd at the
deadline (never sooner than ``PRECISION_S`` from now, so timers closer than that still
coalesce), and a system task drains it: the epoll wakes on the descriptor, on time. Cost:
one ``timerfd_settime`` a blocking wait (about a microsecond). Without a timerfd (a kernel
without one) the run goes on with trio's millisecond timers, said in one log line.
``run_trio(..., real=True)`` is the same on real time (``RealClock``): the benchmarks' live
fabric (``harness.LiveFabric``) runs the agent host so, whose lag monitor otherwise counted the
rounding too (0-1 ms of each late wake-up, against the 2 ms of real time the fidelity judge
allows at any dilation).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from ibemu import clock

log = logging.getLogger(__name__)
T = TypeVar("T")
_ITIMERSPEC = struct.Struct("=qqqq")
"""struct itimerspec: it_interval (0: one shot), it_value."""
PRECISION_S = 0.0002
"""How late a timer of a ``run_trio`` process may wake (and how close timers coalesce)."""


class TimerFd:
    """A CLOCK_MONOTONIC timerfd (through libc: Python 3.11 has no os.timerfd_*)."""

    CLOCK_MONOTONIC, TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        fd = self.libc.timerfd_create(self.CLOCK_MONOTONIC, self.TFD_NONBLOCK | self.TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self.fd = fd
        # one itimerspec, rewritten in place: ``arm`` runs at every blocking wait of a
        # ``run_trio`` process and at every frame departure of the user datapaths
        self._spec = ctypes.create_string_buffer(_ITIMERSPEC.size)

    def _settime(self, flags: int, at_ns: int) -> None:
        _ITIMERSPEC.pack_into(self._spec, 0, 0, 0, at_ns // 1_000_000_000, at_ns % 1_000_000_000)
        if self.libc.timerfd_settime(self.fd, flags, self._spec, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def arm(self, at_ns: int) -> None:
        """Fire at ``at_ns`` on the monotonic clock (``time.monotonic_ns``)."""
        self._settime(self.TFD_TIMER_ABSTIME, max(at_ns, 1))

    def disarm(self) -> None:
        """Never fire (until armed again)."""
        self._settime(0, 0)

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)



class RealClock(trio.abc.Clock):
    """trio's clock in real seconds (``time.monotonic``), with the ``on_sleep`` hook of the
    emulated clock (``clock.trio_clock``): ``run_trio(..., real=True)``, for a loop that must
    stay on real time while the process's emulated clock may be dilated under it (the
    benchmarks' live fabric, dilated once the subnet is up)."""

    on_sleep: Callable[[float], None] | None = None

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return time.monotonic()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        s = deadline - time.monotonic()
        if self.on_sleep is not None:
            self.on_sleep(s)
        return s


def run_trio(fn: Callable[..., Awaitable[T]], *args: Any, real: bool = False) -> T:
    """``trio.run(fn, *args)`` on the emulated clock (``real``: on real time, ``RealClock``)
    with precise timers (see the module docstring)."""
    c: trio.abc.Clock = RealClock() if real else clock.trio_clock()
    try:
        tfd = TimerFd()
    except (OSError, AttributeError) as exc:
        log.warning("no timerfd (%s): trio's timers wake up to 1 ms late", exc)
        return trio.run(fn, *args, clock=c)
    armed = False

    def on_sleep(s: float) -> None:
        nonlocal armed
        if 0.0 < s < 3600.0 and math.ceil(s * 1000.0) / 1000.0 - s > PRECISION_S:
            tfd.arm(time.monotonic_ns() + int(max(s, PRECISION_S) * 1e9) + 1000)
            armed = True
        elif armed:
            tfd.disarm()
            armed = False

    async def drain() -> None:
        while True:
            await trio.lowlevel.wait_readable(tfd.fd)
            tfd.clear()

    async def main() -> T:
        trio.lowlevel.spawn_system_task(drain, name="ibemu.kernel.timerfd.drain")
        c.on_sleep = on_sleep  # type: ignore[attr-defined]
        return await fn(*args)

    try:
        return trio.run(main, clock=c)
    finally:
        c.on_sleep = None  # type: ignore[attr-defined]
        tfd.close()
