"""Shared by the benchmark scripts (run as ``python benchmarks/bench_x.py``: this folder is on sys.path)."""

from __future__ import annotations

import time
from collections.abc import Callable


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn``: calibrated, then the best of three runs of ~seconds/3."""
    n = 100
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt > 0.05:
            break
        n *= 4
    per_run = max(1, int(n * (seconds / 3) / dt))
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(per_run):
            fn()
        best = max(best, per_run / (time.perf_counter() - t0))
    return best
