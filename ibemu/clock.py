"""ibemu's emulated clock: the one clock every ibemu process stamps with and runs its timers on.

With a dilation factor ``N`` (>= 1) the emulated clock advances ``N`` times slower than real
time::

    emulated_ns = epoch_ns + (time.monotonic_ns() - epoch_ns) / N

The epoch is one real ``CLOCK_MONOTONIC`` instant shared by every process of a run (at the
epoch the two clocks agree), so one event stamped by two processes gets the same emulated
stamp. A process learns its run's clock from its environment (``IBEMU_DILATION``,
``IBEMU_CLOCK_EPOCH_NS``) when this module is imported; the process that starts the run sets
it with ``configure`` and starts every child with ``child_env()``. At ``N == 1`` (and with no
environment) ``now_ns`` *is* ``time.monotonic_ns``: no behaviour change and no cost.

Read the clock as ``clock.now_ns()`` (``from ibemu import clock``), not ``from ibemu.clock
import now_ns``: ``configure`` rebinds it. Kernel receive stamps (``CLOCK_MONOTONIC`` or
``CLOCK_REALTIME``) convert with ``to_emulated_ns`` / ``realtime_to_emulated_ns``; a real
deadline for a kernel timer (a timerfd) comes from ``to_real_ns``.

``trio_clock()`` is a ``trio.abc.Clock`` on this clock (``trio.run(..., clock=trio_clock())``):
``trio.current_time()`` is emulated seconds and every trio timer (``sleep``, ``move_on_after``,
``fail_after``) lasts its duration in emulated time, N times longer in real time. This module
imports only the standard library; trio is imported when a trio process asks for its clock.

Nothing here sleeps.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio

ENV_DILATION = "IBEMU_DILATION"
ENV_EPOCH = "IBEMU_CLOCK_EPOCH_NS"

_dilation: float = 1.0
_epoch_ns: int = 0

now_ns: Callable[[], int] = time.monotonic_ns
"""Emulated monotonic nanoseconds (``time.monotonic_ns`` itself at dilation 1)."""


def check_dilation(value: object) -> float:
    """``value`` as a dilation factor: a finite number >= 1 (``ValueError`` otherwise)."""
    if isinstance(value, bool):
        raise ValueError(f"dilation must be a number >= 1, not {value!r}")
    try:
        n = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"dilation must be a number >= 1, not {value!r}") from None
    if not math.isfinite(n) or n < 1:
        raise ValueError(f"dilation must be a number >= 1, not {value!r}")
    return n


def configure(dilation: float = 1.0, epoch_ns: int | None = None) -> None:
    """Run this process on dilation ``dilation`` from the real monotonic instant ``epoch_ns``
    (now if not given). Call before any trio run, agent or log reads the clock."""
    global _dilation, _epoch_ns, now_ns
    n = check_dilation(dilation)
    if n == 1:
        _dilation, _epoch_ns, now_ns = 1.0, 0, time.monotonic_ns
        return
    epoch = time.monotonic_ns() if epoch_ns is None else int(epoch_ns)
    mono = time.monotonic_ns
    if n.is_integer():
        k = int(n)

        def dilated_ns() -> int:
            return epoch + (mono() - epoch) // k
    else:
        def dilated_ns() -> int:
            return epoch + int((mono() - epoch) / n)
    _dilation, _epoch_ns, now_ns = n, epoch, dilated_ns


def monotonic() -> float:
    """Emulated monotonic seconds (``time.monotonic()`` at dilation 1): for deadlines of waits
    on the fabric; their polling sleeps stay real."""
    return now_ns() / 1e9


def dilation() -> float:
    """The dilation factor N (1.0: emulated time is real time)."""
    return _dilation


def epoch_ns() -> int:
    """The real monotonic instant at which emulated and real time agree (0 at dilation 1)."""
    return _epoch_ns


def to_emulated_ns(real_ns: int) -> int:
    """A real ``CLOCK_MONOTONIC`` stamp (a kernel's, ``time.monotonic_ns()``) on the emulated clock."""
    if _dilation == 1:
        return real_ns
    return _epoch_ns + int((real_ns - _epoch_ns) / _dilation)


def to_real_ns(emulated_ns: int) -> int:
    """The real ``CLOCK_MONOTONIC`` instant of an emulated one (a kernel timer's deadline)."""
    if _dilation == 1:
        return emulated_ns
    return _epoch_ns + math.ceil((emulated_ns - _epoch_ns) * _dilation)


def realtime_offset_ns() -> int:
    """``CLOCK_REALTIME`` minus ``CLOCK_MONOTONIC``, now (real time)."""
    return time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()


def realtime_to_emulated_ns(wall_ns: int, offset_ns: int | None = None) -> int:
    """A ``CLOCK_REALTIME`` stamp (``SO_TIMESTAMPNS``, a log's wall clock) on the emulated clock
    (``offset_ns``: ``realtime_offset_ns()``, taken once by a caller converting many)."""
    return to_emulated_ns(wall_ns - (realtime_offset_ns() if offset_ns is None else offset_ns))


def emulated_s(real_s: float) -> float:
    """A real duration in emulated seconds."""
    return real_s / _dilation


def loop_s(real_s: float) -> float:
    """A real duration in the running trio loop's seconds, for a sleep that must last
    ``real_s`` of real time (a poll, a refresh period): emulated seconds (``emulated_s``) on a
    ``trio_clock()`` loop, ``real_s`` itself on a loop on trio's own clock in a process whose
    emulated clock is dilated (the benchmarks' live fabric, dilated after it came up), where
    ``emulated_s`` would make a 50 ms poll 2.5 us at N = 20,000: a busy loop. Outside trio:
    ``emulated_s``."""
    if _dilation == 1.0:
        return real_s
    import trio

    try:
        running = trio.lowlevel.current_clock()
    except RuntimeError:  # not in a trio run
        return real_s / _dilation
    if _trio_clock_class is not None and isinstance(running, _trio_clock_class):
        return real_s / _dilation
    return real_s


def real_s(emulated_s: float) -> float:
    """An emulated duration in real seconds."""
    return emulated_s * _dilation


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process of this run (``base``: ``os.environ`` if not given)
    with this process's clock, which the child takes when it imports this module."""
    env = dict(os.environ if base is None else base)
    env[ENV_DILATION] = repr(_dilation) if not _dilation.is_integer() else str(int(_dilation))
    env[ENV_EPOCH] = str(_epoch_ns)
    return env


def configure_from_env(env: Mapping[str, str] | None = None) -> None:
    """Take the clock a parent passed in ``env`` (``os.environ``); none: dilation 1."""
    env = os.environ if env is None else env
    raw = env.get(ENV_DILATION)
    if raw is None or raw.strip() == "":
        configure(1.0)
        return
    try:
        n = check_dilation(raw.strip())
    except ValueError as exc:
        raise ValueError(f"{ENV_DILATION}={raw!r}: {exc}") from None
    epoch_raw = env.get(ENV_EPOCH, "").strip()
    configure(n, int(epoch_raw) if epoch_raw else None)


_trio_clock_class: type | None = None


def trio_clock() -> trio.abc.Clock:
    """A trio clock on the emulated clock: ``trio.run(main, clock=trio_clock())``."""
    global _trio_clock_class
    if _trio_clock_class is None:
        import trio

        class EmulatedClock(trio.abc.Clock):
            """``current_time()`` is emulated seconds; a sleep to an emulated deadline lasts N
            times its emulated length in real time. ``on_sleep``, when set, is told each real
            sleep trio is about to take (``ibemu.kernel.timerfd.run_trio`` arms a timerfd
            with it: epoll's own timeouts are whole milliseconds, rounded up)."""

            on_sleep: Callable[[float], None] | None = None

            def start_clock(self) -> None:
                pass

            def current_time(self) -> float:
                return now_ns() / 1e9

            def deadline_to_sleep_time(self, deadline: float) -> float:
                s = (deadline - now_ns() / 1e9) * _dilation
                if self.on_sleep is not None:
                    self.on_sleep(s)
                return s

        _trio_clock_class = EmulatedClock
    clock: trio.abc.Clock = _trio_clock_class()
    return clock


configure_from_env()
