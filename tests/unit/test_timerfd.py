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


def test_a_real_time_loop_wakes_on_time_while_the_emulated_clock_is_dilated() -> None:
    """``run_trio(..., real=True)``: trio's clock is real seconds though the process's emulated
    clock is dilated, and a sleep to a deadline 9.1 ms away wakes within ``PRECISION_S`` of it,
    not at the next whole millisecond (plain ``trio.run``: 0.9 ms late every time)."""
    import statistics

    import trio

    from ibemu import clock
    from ibemu.kernel.timerfd import PRECISION_S, run_trio

    async def late() -> tuple[list[float], float]:
        out = []
        for _ in range(10):
            deadline = trio.current_time() + 0.0091
            await trio.sleep_until(deadline)
            out.append(trio.current_time() - deadline)
        return out, clock.loop_s(0.05)

    clock.configure(20_000)
    try:
        t0 = time.monotonic()
        lates, poll = run_trio(late, real=True)
        real = time.monotonic() - t0
    finally:
        clock.configure(1)
    assert 0.09 < real < 1.0  # ten sleeps of 9.1 ms of real time
    assert poll == 0.05  # a real-time poll on this loop is real seconds
    assert statistics.median(lates) < PRECISION_S + 0.0003
