"""The SM's timers under time dilation: the modelled SM's, and those that wait on this machine.

Under dilation ``N`` (``ibemu.clock``) trio's clock in the SM process is emulated time, so every
timer of the SM lasts N times its duration in real time. That is right for the timers that
are parameters of the SM being modelled and that shape what the emulated fabric shows: the
periodic light sweep (``sweep_interval_s``, OpenSM's ``sweep_interval``: when a lost trap is
caught), a standby's polling of its master, the reroute's rules for not waiting on a dead
switch (``overdue_s``, ``suspect_probe_s``). They stay in emulated time, to
scale. (So at N = 20,000 a switch that stops answering with cables of it still up holds a
reroute for its probe, 50 ms emulated: 1,000 s of real time. Not bounded yet.)

Other timers wait on *this machine*: an SMP's answer comes from ibemu's agents, its kernel
datapath or its user datapath, whose work takes real time (0.03-0.5 ms an SMP here, up to
hundreds of ms at a window's end on a loaded machine), N times less in emulated time; the SM
waits for it, and when it does not come, it tries again. Taken as emulated time these waits
became absurd: at N = 20,000 the SMP transaction timeout (200 ms) is 4,000 s of real time,
the pause before the cold sweep is repeated (1 s) 20,000 s, the state snapshot's period
(0.5 s) 10,000 s. One SMP unanswered by the first sweep then held the fabric without routes
for hours (``scenarios/gpu-cluster-ib.yaml`` with ``ftree_ar``: no LinearFDBTop written in
10 minutes), and at N = 100 a sweep with 6 SMPs unanswered cost 20 s of timeout and 100 s of
real time before the next sweep. (Those SMPs were lost by the SM's own order of Sets, fixed in
``ibemu.sm.program.LftProgrammer``; but any SMP lost for whatever reason cost that much.)

Such a *guard* timer (``guard_s``) lasts its configured value in emulated time, but never
more than ``max(configured, cap)`` of real time, ``cap`` = ``GUARD_REAL_S`` (1 s)::

    real duration = min(configured x N, max(configured, cap))
    emulated      = min(configured, max(configured, cap) / N)

- Never shorter in real time than the configured value, which is what the SM waits
  undilated (N = 1: unchanged): the real time an answer is given here did not change with
  N. The default SMP timeout (200 ms, OpenSM's ``transaction_timeout``) is already overrun by
  k=8 bring-ups on this 2-core machine under load (450-1,040 retries at load ~10: ``README``,
  "The SM's own cost"); the cap gives it 5 times that.
- Never longer than 1 s of real time (when the configured value is below it): a lost answer
  costs a second, not an hour.
- At small N it is the configured value in emulated time (to scale): 200 ms is 200 ms
  emulated up to N = 5.

The guard timers: the SMP transaction timeout (``Transport.timeout_s``, and with it the
10 ms pause after a failed send, ``min(timeout, 10 ms)``), the reads of a dying switch's far
ends, the pause before a cold sweep that left SMPs unanswered is repeated, the repair sweep
after a heavy sweep that left SMPs unanswered, and the snapshot and dump writers' polls.

The repair sweep (``next_step_delay``): after SUBNET UP, a heavy sweep whose SMPs went
unanswered after every retry used to make the *next periodic* sweep a heavy one, i.e.
``sweep_interval_s`` later (10 s emulated: 55 hours of real time at N = 20,000). It now comes
after the cold sweep's pause (``resweep_s``: 1 s, or the sweep interval if shorter, as a
guard timer), whatever N, and each repair that leaves SMPs unanswered again doubles the
pause before the next, up to the sweep interval (a switch that never answers is not swept
for every second). OpenSM, after a sweep with errors, makes its next sweep heavy
(``subnet_initialization_error`` -> ``force_heavy_sweep``) but waits for its sweep interval;
ibemu's SM repairs sooner because what it missed (a node undiscovered, a port left in Init)
is often this machine's lost answer, which a second attempt finds, and a fabric left
incomplete for a sweep interval under dilation is a run wasted.

Pure functions (no trio, no clock read): the SM gives them ``clock.dilation()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GUARD_REAL_S = 1.0
"""The real time a guard timer is bounded by (when its configured value is shorter)."""

RESWEEP_S = 1.0
"""The pause before a cold sweep that left SMPs unanswered is repeated, and before a repair
sweep (at most the sweep interval), emulated seconds at N = 1."""


def guard_s(configured_s: float, dilation: float, cap_real_s: float = GUARD_REAL_S) -> float:
    """Emulated seconds a timer waiting on this machine's processes lasts at ``dilation``:
    ``configured_s``, but at most ``max(configured_s, cap_real_s)`` of real time (see the
    module docstring). ``cap_real_s = inf`` turns the bound off (every timer emulated)."""
    if dilation < 1 or not math.isfinite(dilation):
        raise ValueError(f"dilation must be a finite number >= 1, not {dilation!r}")
    if cap_real_s <= 0:
        raise ValueError(f"cap_real_s must be > 0, not {cap_real_s!r}")
    if configured_s <= 0 or math.isinf(cap_real_s):
        return configured_s
    return min(configured_s, max(configured_s, cap_real_s) / dilation)


@dataclass(frozen=True, slots=True)
class SmTimers:
    """The SM's timers at one dilation, emulated seconds (what trio's clock counts)."""

    dilation: float
    timeout_s: float
    """An SMP attempt's timeout (guard)."""
    resweep_s: float
    """A cold sweep with SMPs unanswered -> the next cold sweep; a heavy sweep with SMPs
    unanswered after SUBNET UP -> the repair sweep (guard)."""
    sweep_interval_s: float
    """The periodic light sweep (to scale: the modelled SM's)."""
    housekeeping_s: float
    """The state snapshot's period (guard of 0.5 s)."""
    poll_s: float
    """How often the dump writer looks whether a pass has ended (guard of 50 ms)."""

    @classmethod
    def at(cls, dilation: float, *, timeout_s: float, sweep_interval_s: float,
           cap_real_s: float = GUARD_REAL_S) -> SmTimers:
        def g(v: float) -> float:
            return guard_s(v, dilation, cap_real_s)

        return cls(dilation=dilation, timeout_s=g(timeout_s),
                   resweep_s=g(min(RESWEEP_S, sweep_interval_s)), sweep_interval_s=sweep_interval_s,
                   housekeeping_s=g(0.5), poll_s=g(0.05))

    def real(self, emulated_s: float) -> float:
        """``emulated_s`` in real seconds."""
        return emulated_s * self.dilation


def next_step_delay(timers: SmTimers, *, repairs: int = 0) -> float:
    """How long the master waits (for a trap) before its next periodic step. ``repairs``:
    heavy sweeps in a row that left SMPs unanswered (0: none, the light sweep's interval).
    The first repair comes after ``resweep_s``, each further one after twice the pause
    before it (a switch that never answers is not swept for every second), never later
    than the sweep interval."""
    if repairs <= 0:
        return timers.sweep_interval_s
    return min(timers.resweep_s * 2.0 ** min(repairs - 1, 60), timers.sweep_interval_s)
