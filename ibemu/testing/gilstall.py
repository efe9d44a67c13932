"""This process held for a while, again and again: the answers of a fabric running in it come
late, as on a loaded machine (``tests/integration/test_sm_gateway_live.py``,
``benchmarks/bench_local_failover.py --stall-ms``).

A ``sorted`` of a list of ints runs in C and keeps the GIL throughout, so every other thread
of the process (the agent host's trio thread, its carrier thread) waits for it; between two
holds the others get ``gap_s``. The list is sized at construction (doubling until one sort
takes at least 0.7 x ``hold_s``: a hold is 0.7-1.4 x ``hold_s`` on the machine as loaded then).
"""

from __future__ import annotations

import random
import threading
import time

GAP_S = 0.005


class GilStall:
    """Hold this process ``hold_s`` at a time, ``gap_s`` apart, for ``seconds`` from ``start()``."""

    def __init__(self, hold_s: float, seconds: float, gap_s: float = GAP_S) -> None:
        self.seconds, self.gap_s = seconds, gap_s
        n = 50_000
        while True:
            self.data = random.Random(n).sample(range(10 * n), n)
            t0 = time.perf_counter()
            sorted(self.data)
            if time.perf_counter() - t0 >= hold_s * 0.7 or n > 20_000_000:
                break
            n *= 2
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _hold(self) -> None:
        end = time.monotonic() + self.seconds
        while time.monotonic() < end and not self._stop.is_set():
            sorted(self.data)  # the GIL held throughout
            time.sleep(self.gap_s)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._hold, name="gil-stall", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the holds to end (``stop()`` first to end them early)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        self._stop.set()
