"""``--dilation N|auto`` (``run``, ``up``, ``compare``, ``cli``): the run's clock, over the
scenario's ``time.dilation``; a bad value is a located ``ConfigError`` (exit 2) before anything
is built.

``auto`` (on the command line or as ``time: {dilation: auto}``) chooses N from the scenario's
offered load (``ibemu.scenario.autodilation``) and this machine's calibrated user datapath
(``ibemu.fabric.calibrate``, measured once and cached), and prints one line saying so.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ibemu import clock
from ibemu.errors import ConfigError
from ibemu.scenario.schema import Scenario, TimeSpec


def add_dilation_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dilation", metavar="N|auto",
                   help="run on a clock N times slower than real time (N >= 1, or auto: chosen from the "
                        "scenario's offered load and this machine's calibration; default: the scenario's "
                        "time.dilation, else 1)")


def _say(line: str) -> None:
    print(line, flush=True)


def resolve_dilation(arg: str | None, spec: TimeSpec | None = None, scen: Scenario | None = None, *,
                     say: Callable[[str], None] = _say) -> float:
    """The dilation factor: ``--dilation`` (checked), else the scenario's, else 1; ``auto``
    (either) chosen for ``scen`` and said with ``say``."""
    if arg is None:
        if spec is not None and spec.auto:
            return float(auto_dilation(scen, spec.where or "time.dilation", say))
        return spec.dilation if spec is not None else 1.0
    if arg.strip() == "auto":
        return float(auto_dilation(scen, "--dilation", say))
    try:
        return clock.check_dilation(arg.strip())
    except ValueError:
        raise ConfigError(f"expected a number >= 1 or auto, got {arg!r}", "--dilation") from None


def auto_dilation(scen: Scenario | None, where: str, say: Callable[[str], None] = _say) -> int:
    """N for ``scen`` on this machine (1 without a scenario or traffic), said in one line."""
    from ibemu.scenario import autodilation

    if scen is None or not scen.traffic:
        choice = autodilation.choose(0.0, 1.0)
        say(choice.line("no flows: nothing to calibrate against"))
        return choice.dilation
    try:
        load = autodilation.offered_load(scen)
    except ValueError as exc:
        raise ConfigError(f"auto: cannot work out the offered load: {exc}", where) from None
    from ibemu.fabric import calibrate

    try:
        fab = scen.fabric  # the IB user datapath's switches run the link model: its cost counts
        cal = calibrate.calibration(load.frame_bytes or 1024, physics=fab.kind == "ib" and fab.datapath == "user")
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"auto: cannot calibrate this machine's user datapath ({exc}): give a number >= 1",
                          where) from None
    try:
        choice = autodilation.choose(load.frame_hops_per_s, cal.frame_hops_per_s, worker=load.worker)
    except ValueError as exc:
        raise ConfigError(f"auto: {exc}", where) from None
    say(choice.line(cal.note()))
    for f in load.flows:
        say(f"  {f.name}: {f.frames_per_s:,.0f} frames/s ({f.how}) x {f.hops} hops = "
            f"{f.frame_hops_per_s:,.0f} frame-hops/s, {f.start_s:g}..{f.stop_s:g} s")
    for note in load.notes:
        say(f"  {note}")
    say(f"  {autodilation.judged(choice.dilation, scen.time)}")
    return choice.dilation
