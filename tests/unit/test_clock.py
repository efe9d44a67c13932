"""The emulated clock (``ibemu.clock``) and the trio clock on it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import trio

from ibemu import clock


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    clock.configure(1)


def test_dilation_one_is_the_monotonic_clock() -> None:
    clock.configure(1)
    assert clock.now_ns is time.monotonic_ns
    assert clock.dilation() == 1.0
    a = time.monotonic_ns()
    b = clock.now_ns()
    assert 0 <= b - a < 50_000  # a few us
    assert clock.to_emulated_ns(123) == 123 and clock.to_real_ns(123) == 123


def test_monotonic_and_slower_at_ten() -> None:
    clock.configure(10)
    stamps = [clock.now_ns() for _ in range(1000)]
    assert stamps == sorted(stamps)
    r0, e0 = time.monotonic_ns(), clock.now_ns()
    time.sleep(0.1)
    r1, e1 = time.monotonic_ns(), clock.now_ns()
    ratio = (r1 - r0) / (e1 - e0)
    assert 9.0 < ratio < 11.0


def test_emulated_behind_real_after_the_epoch() -> None:
    epoch = time.monotonic_ns() - 10_000_000_000  # 10 s ago
    clock.configure(4, epoch)
    now = clock.now_ns()
    assert clock.epoch_ns() == epoch
    assert abs((now - epoch) - 2_500_000_000) < 50_000_000


def test_conversions_round_trip() -> None:
    clock.configure(3, 1_000_000_000)
    for real in (1_000_000_000, 1_000_000_003, 4_000_000_000, 987_654_321_123):
        emu = clock.to_emulated_ns(real)
        assert emu == 1_000_000_000 + (real - 1_000_000_000) // 3
        assert abs(clock.to_real_ns(emu) - real) <= 3
    assert clock.to_emulated_ns(time.monotonic_ns()) - clock.now_ns() <= 0
    assert clock.emulated_s(3.0) == 1.0 and clock.real_s(1.0) == 3.0


def test_realtime_stamps_convert() -> None:
    clock.configure(2)
    wall = time.clock_gettime_ns(time.CLOCK_REALTIME)
    assert abs(clock.realtime_to_emulated_ns(wall) - clock.now_ns()) < 1_000_000


def test_fractional_dilation() -> None:
    clock.configure(2.5, 0)
    assert clock.to_emulated_ns(5_000) == 2_000
    assert clock.dilation() == 2.5


@pytest.mark.parametrize("bad", [0, 0.5, -1, "x", None, True, float("nan"), float("inf"), "auto"])
def test_bad_dilations_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="dilation must be a number >= 1"):
        clock.configure(bad)  # type: ignore[arg-type]


def test_env_round_trip() -> None:
    clock.configure(7, 123_456_789)
    env = clock.child_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", clock.ENV_DILATION: "7", clock.ENV_EPOCH: "123456789"}
    clock.configure(1)
    clock.configure_from_env(env)
    assert clock.dilation() == 7.0 and clock.epoch_ns() == 123_456_789
    clock.configure(2.5, 5)
    assert clock.child_env({})[clock.ENV_DILATION] == "2.5"
    clock.configure_from_env({})
    assert clock.dilation() == 1.0 and clock.now_ns is time.monotonic_ns
    with pytest.raises(ValueError, match=clock.ENV_DILATION):
        clock.configure_from_env({clock.ENV_DILATION: "0.3"})


def test_a_child_process_takes_the_clock_from_its_environment() -> None:
    clock.configure(5)
    code = ("import time; from ibemu import clock; "
            "print(clock.dilation(), clock.epoch_ns(), time.monotonic_ns(), clock.now_ns())")
    out = subprocess.run([sys.executable, "-c", code], env=clock.child_env(), capture_output=True, text=True,
                         check=True).stdout.split()
    assert float(out[0]) == 5.0 and int(out[1]) == clock.epoch_ns()
    real, emu = int(out[2]), int(out[3])
    assert abs(emu - clock.to_emulated_ns(real)) < 20_000  # the same clock, both sides


def test_trio_clock_at_one_is_real_time() -> None:
    async def main() -> tuple[float, float]:
        t0, r0 = trio.current_time(), time.monotonic()
        await trio.sleep(0.05)
        return trio.current_time() - t0, time.monotonic() - r0

    emu, real = trio.run(main, clock=clock.trio_clock())
    assert 0.05 <= emu < 0.5 and 0.05 <= real < 0.5


def test_trio_sleep_dilated() -> None:
    clock.configure(4)

    async def main() -> tuple[float, float, int]:
        t0, r0, e0 = trio.current_time(), time.monotonic(), clock.now_ns()
        await trio.sleep(0.05)
        assert abs(trio.current_time() * 1e9 - clock.now_ns()) < 1e6
        return trio.current_time() - t0, time.monotonic() - r0, clock.now_ns() - e0

    emu, real, emu_ns = trio.run(main, clock=clock.trio_clock())
    assert 0.05 <= emu < 0.15
    assert emu_ns >= 50_000_000
    assert 0.19 <= real < 0.6  # 0.05 s x 4, loosely


def test_trio_timeouts_dilated() -> None:
    clock.configure(3)

    async def main() -> float:
        r0 = time.monotonic()
        with trio.move_on_after(0.04):
            await trio.sleep_forever()
        return time.monotonic() - r0

    real = trio.run(main, clock=clock.trio_clock())
    assert 0.115 <= real < 0.5


def test_a_real_time_poll_lasts_its_real_time_on_either_loop() -> None:
    """``loop_s``: a poll of 20 ms of real time sleeps 20 ms of real time on a loop on trio's own
    clock in a process whose emulated clock is dilated (the benchmarks' live fabric, dilated
    after it came up), where ``emulated_s`` slept 1 us at N = 20,000 and the sysfs refresh spun
    (a third of the agent host's loop); and 20 ms of real time on a ``trio_clock()`` loop."""
    clock.configure(20_000)

    async def poll(n: int) -> tuple[float, float]:
        t0 = time.monotonic()
        for _ in range(n):
            await trio.sleep(clock.loop_s(0.02))
        return clock.loop_s(0.02), (time.monotonic() - t0) / n

    dur, real = trio.run(poll, 3)  # trio's own clock
    assert dur == 0.02 and 0.019 < real < 0.2
    dur, real = trio.run(poll, 3, clock=clock.trio_clock())
    assert dur == pytest.approx(0.02 / 20_000) and 0.019 < real < 0.2
    assert clock.loop_s(0.02) == pytest.approx(0.02 / 20_000)  # outside trio: emulated_s
    clock.configure(1)
    assert trio.run(poll, 1)[0] == 0.02
