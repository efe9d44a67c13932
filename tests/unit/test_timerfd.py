"""The user datapath's timerfd (``ibemu.kernel.timerfd``): armed at an absolute monotonic
time, readable once it has fired, quiet again once cleared (no root needed)."""

from __future__ import annotations

import select
import time

from ibemu.kernel.timerfd import TimerFd


def test_fires_at_the_armed_time_and_clears() -> None:
    timer = TimerFd()
    try:
        assert select.select([timer.fd], [], [], 0)[0] == []  # not armed: never readable
        at = time.monotonic_ns() + 2_000_000
        timer.arm(at)
        assert select.select([timer.fd], [], [], 10)[0] == [timer.fd]
        assert time.monotonic_ns() >= at
        timer.clear()
        assert select.select([timer.fd], [], [], 0)[0] == []
        timer.clear()  # nothing pending: no error
        timer.arm(0)  # in the past (clamped to 1 ns): fires at once
        assert select.select([timer.fd], [], [], 10)[0] == [timer.fd]
    finally:
        timer.close()
