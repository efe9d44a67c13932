"""Shared by the benchmark scripts (run as ``python benchmarks/bench_x.py``: this folder is on sys.path)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, Self

import trio

from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import ownership
from ibemu.kernel.timerfd import run_trio
from ibemu.topo import Topology


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


class LiveFabric:
    """A live fabric (``FabricRuntime``) on a trio loop in a background thread, for a benchmark
    that drives it from its own thread; torn down on the way out, also on Ctrl-C. ``runtime``:
    more ``FabricRuntime`` arguments (``sm="opensm"``, ``datapath``, ...)."""

    def __init__(self, topo: Topology, tmp: Path, *, scenario: str, ready_s: float = 120.0,
                 **runtime: Any) -> None:
        self.topo = topo
        self.state = ownership.RunState(ownership.new_run_id(), scenario=scenario)
        self.rt = FabricRuntime(topo, make_agents=make_agents, state=self.state, run_dir=tmp, **runtime)
        self.ready_s = ready_s
        self.build_s = 0.0
        self.token: trio.lowlevel.TrioToken | None = None
        self.stop: trio.Event | None = None
        self.errors: list[BaseException] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self.stop = trio.Event()
            self.token = trio.lowlevel.current_trio_token()
            async with self.rt.running():
                self._ready.set()
                await self.stop.wait()

        try:
            # real time with precise timers: trio's own round each sleep up to the millisecond,
            # which the agent host's lag monitor counted as lateness (0-1 ms of the 2 allowed)
            run_trio(main, real=True)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self._ready.set()

    def __enter__(self) -> Self:
        t0 = time.monotonic()
        self._thread.start()
        try:
            if not self._ready.wait(self.ready_s) or self.errors:
                raise RuntimeError(f"fabric did not come up: {self.errors}")
        except BaseException:
            self.__exit__()
            raise
        self.build_s = time.monotonic() - t0
        # as a long-running fabric would: startup objects (and the last run's garbage) are
        # not walked by the collector in the middle of a measurement
        gc.collect()
        gc.freeze()
        return self

    def __exit__(self, *exc: object) -> None:
        while self._thread.is_alive() and self.token is None and not self.errors:
            time.sleep(0.05)  # still building: the runtime tears down once it has started
        if self.token is not None and self.stop is not None:
            with suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self.stop.set, trio_token=self.token)
        self._thread.join(120)
        gc.unfreeze()

    def ns(self, node: str) -> str:
        return self.rt.plan.nodes[node].ns

    @property
    def agents_tid(self) -> int:
        """The thread id of the fabric's trio loop: the agent host's thread."""
        tid = self._thread.native_id
        assert tid is not None
        return tid
