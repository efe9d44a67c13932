"""A live fabric whose trio loop runs in a background thread, for tests that drive it from outside."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import trio

from ibemu import clock
from ibemu.fabric.agenthost import AgentHost
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import netns

T = TypeVar("T")


class Running:
    """Handle on a fabric running in its own thread: the host and a way into its loop."""

    def __init__(self, rt: FabricRuntime) -> None:
        self.rt = rt
        self.host: AgentHost | None = None
        self.token: trio.lowlevel.TrioToken | None = None
        self.stop: trio.Event | None = None

    def on_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the fabric's trio thread (agents are not thread-safe)."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)


@contextmanager
def fabric_in_thread(rt: FabricRuntime, timeout_s: float = 60.0, *, emulated_clock: bool = False) -> Iterator[Running]:
    """Build and run ``rt`` in a thread; on exit stop it and check that it left nothing.
    ``emulated_clock``: the loop runs on ``ibemu.clock`` (as a run's agent host does)."""
    live = Running(rt)
    ready = threading.Event()
    errors: list[BaseException] = []

    async def main() -> None:
        live.stop = trio.Event()
        live.token = trio.lowlevel.current_trio_token()
        async with rt.running() as host:
            live.host = host
            ready.set()
            await live.stop.wait()

    def run() -> None:
        try:
            trio.run(main, clock=clock.trio_clock() if emulated_clock else None)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(timeout_s) and not errors, errors
    try:
        yield live
    finally:
        if live.token is not None and live.stop is not None:
            trio.from_thread.run_sync(live.stop.set, trio_token=live.token)
        thread.join(timeout_s)
        assert not errors, errors
        assert not any(netns.exists(n) for n in rt.plan.namespaces)


def drain_tap(tap: socket.socket, size: int = 9216) -> list[bytes]:
    """Every frame waiting on a non-blocking capture socket, then the socket closed."""
    frames: list[bytes] = []
    try:
        while True:
            try:
                frames.append(tap.recv(size))
            except BlockingIOError:
                return frames
    finally:
        tap.close()
