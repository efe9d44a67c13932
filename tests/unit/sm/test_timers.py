"""The SM's timers under dilation (``ibemu.sm.timers``): guard timers bounded in real time,
the modelled SM's timers to scale, and the repair sweep's schedule."""

from __future__ import annotations

import itertools
import math

import pytest

from ibemu.sm.timers import GUARD_REAL_S, RESWEEP_S, SmTimers, guard_s, next_step_delay


@pytest.mark.parametrize("configured", [0.001, 0.05, 0.2, 1.0, 3.0])
def test_undilated_every_timer_is_as_configured(configured: float) -> None:
    assert guard_s(configured, 1) == configured


def test_the_smp_timeout_is_one_real_second_at_large_dilations_and_to_scale_at_small_ones() -> None:
    assert guard_s(0.2, 5) == pytest.approx(0.2)  # 1 s real: still 200 ms emulated
    assert guard_s(0.2, 2) == 0.2  # 0.4 s real
    assert guard_s(0.2, 100) == pytest.approx(0.01)  # 1 s real, not 20 s
    assert guard_s(0.2, 20_000) == pytest.approx(5e-5)  # 1 s real, not 4,000 s
    assert guard_s(0.2, 20_000) * 20_000 == pytest.approx(GUARD_REAL_S)


def test_a_guard_timer_is_never_shorter_in_real_time_than_configured_nor_longer_than_the_bound() -> None:
    for configured in (0.0005, 0.01, 0.2, 0.5, 1.0, 2.5):
        for n in (1, 1.5, 2, 3, 8, 100, 20_000, 300_000):
            emulated = guard_s(configured, n)
            real = emulated * n
            assert emulated <= configured + 1e-15
            assert configured * (1 - 1e-12) <= real <= max(configured, GUARD_REAL_S) * (1 + 1e-12)


def test_an_infinite_bound_keeps_every_timer_in_emulated_time_and_bad_input_is_refused() -> None:
    assert guard_s(0.2, 20_000, math.inf) == 0.2
    for bad in (0.5, math.inf, math.nan):
        with pytest.raises(ValueError):
            guard_s(0.2, bad)
    with pytest.raises(ValueError):
        guard_s(0.2, 10, 0)


def test_the_sweep_interval_stays_to_scale_and_the_resweep_is_a_guard() -> None:
    t = SmTimers.at(20_000, timeout_s=0.2, sweep_interval_s=10.0)
    assert t.sweep_interval_s == 10.0  # the modelled SM's: 200,000 s of real time
    assert t.real(t.timeout_s) == pytest.approx(1.0)
    assert t.real(t.resweep_s) == pytest.approx(1.0)  # not 20,000 s
    assert t.real(t.housekeeping_s) == pytest.approx(1.0) and t.real(t.poll_s) == pytest.approx(1.0)
    one = SmTimers.at(1, timeout_s=0.2, sweep_interval_s=10.0)
    assert (one.timeout_s, one.resweep_s, one.housekeeping_s, one.poll_s) == (0.2, RESWEEP_S, 0.5, 0.05)
    short = SmTimers.at(1, timeout_s=0.2, sweep_interval_s=0.05)
    assert short.resweep_s == 0.05  # never after the sweep interval


def test_a_repair_sweep_comes_soon_then_backs_off_to_the_sweep_interval() -> None:
    for n in (1, 100, 20_000):
        t = SmTimers.at(n, timeout_s=0.2, sweep_interval_s=10.0)
        assert next_step_delay(t) == next_step_delay(t, repairs=0) == 10.0
        delays = [next_step_delay(t, repairs=k) for k in range(1, 40)]
        assert delays[0] == t.resweep_s and delays[1] == 2 * t.resweep_s
        assert all(a <= b for a, b in itertools.pairwise(delays)) and delays[-1] == 10.0
    # at N = 20,000 the first repair is one real second after the unclean sweep (it was the
    # next periodic sweep: 10 s emulated, 55 hours of real time)
    t = SmTimers.at(20_000, timeout_s=0.2, sweep_interval_s=10.0)
    assert t.real(next_step_delay(t, repairs=1)) == pytest.approx(1.0)
