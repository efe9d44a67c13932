"""``--metrics [ADDR:]PORT`` and ``--metrics-public`` of ``ibemu up`` and ``ibemu run``.

The value is checked, and the port tried, before anything is built (``ibemu.fabric.metrics``).
"""

from __future__ import annotations

import argparse

from ibemu.errors import ConfigError
from ibemu.fabric.metrics import check_free, parse_listen


def add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics", metavar="[ADDR:]PORT",
                   help="serve Prometheus metrics (PMA counters of every port, SM sweeps, reroute phases) "
                        "at http://ADDR:PORT/metrics; ADDR 127.0.0.1 unless given")
    p.add_argument("--metrics-public", action="store_true",
                   help="allow a --metrics address that is not local (it shows the whole fabric)")


def metrics_listen(args: argparse.Namespace, kind: str) -> tuple[str, int] | None:
    """(address, port) of ``--metrics``, free now; None without it. ConfigError (located) if bad."""
    text = getattr(args, "metrics", None)
    if text is None:
        if getattr(args, "metrics_public", False):
            raise ConfigError("--metrics-public needs --metrics [ADDR:]PORT", "--metrics-public")
        return None
    listen = parse_listen(text, public=bool(getattr(args, "metrics_public", False)))
    if kind == "roce":
        raise ConfigError("a RoCE fabric has no PMA counters to export (IB fabrics only)", "--metrics")
    check_free(*listen)
    return listen
