"""``--dilation N`` (``run``, ``up``, ``compare``, ``cli``): the run's clock, over the scenario's
``time.dilation``; a bad value is a located ``ConfigError`` (exit 2) before anything is built."""

from __future__ import annotations

import argparse

from ibemu import clock
from ibemu.errors import ConfigError
from ibemu.scenario.schema import DILATION_AUTO_UNAVAILABLE, TimeSpec


def add_dilation_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dilation", metavar="N",
                   help="run on a clock N times slower than real time (N >= 1; default: the scenario's "
                        "time.dilation, else 1)")


def resolve_dilation(arg: str | None, spec: TimeSpec | None = None) -> float:
    """The dilation factor: ``--dilation`` (checked), else the scenario's, else 1."""
    if arg is None:
        return spec.dilation if spec is not None else 1.0
    if arg.strip() == "auto":
        raise ConfigError(DILATION_AUTO_UNAVAILABLE, "--dilation")
    try:
        return clock.check_dilation(arg.strip())
    except ValueError:
        raise ConfigError(f"expected a number >= 1, got {arg!r}", "--dilation") from None
