"""The SM's MAD transaction layer: window, TIDs, timeouts, retries, bad responses."""

from __future__ import annotations

import random

import trio

from ibemu.sm.transport import Request, Transport
from ibemu.testing.madport import InMemoryPort
from ibemu.wire import madcodec as mb
from ibemu.wire.umad import SimRequest
from tests.unit.devices.fabrics import chain
from tests.unit.sm.helpers import run

NODE_INFO = 0x11


class Wrapped:
    """A MadPort around an InMemoryPort that can drop, duplicate, delay or corrupt.

    ``start(nursery)`` runs the pump that moves what the inner port receives to ``recv``.
    """

    def __init__(self, inner: InMemoryPort) -> None:
        self.inner = inner
        self.drop_send = 0.0
        self.duplicate = False
        self.delay_s = 0.0
        self.bad_tid = False
        self.rng = random.Random(1)
        self._tx, self._rx = trio.open_memory_channel[SimRequest](10_000)
        self._nursery: trio.Nursery | None = None

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self._pump)

    async def send(self, req: SimRequest) -> None:
        if self.rng.random() < self.drop_send:
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        return await self._rx.receive()

    async def _pump(self) -> None:
        while True:
            got = await self.inner.recv()
            if self.bad_tid:
                self._tx.send_nowait(got.with_tid(got.tid ^ 0x5A5A0000))
            if self.delay_s:
                assert self._nursery is not None
                self._nursery.start_soon(self._later, got)
                continue
            self._tx.send_nowait(got)
            if self.duplicate:
                self._tx.send_nowait(got)

    async def _later(self, req: SimRequest) -> None:
        await trio.sleep(self.delay_s)
        self._tx.send_nowait(req)


def _setup() -> tuple[Wrapped, list[int]]:
    fab = chain(3)
    return Wrapped(InMemoryPort(fab, "sm")), [1, 3, 3]


def test_answers_come_back_in_order_and_the_window_bounds_what_is_in_flight() -> None:
    port, path = _setup()

    async def main() -> None:
        t = Transport(port, max_in_flight=4)
        max_pending = [0]
        real_send = port.send

        async def spy(req: SimRequest) -> None:
            max_pending[0] = max(max_pending[0], len(t._pending))
            await real_send(req)

        port.send = spy  # type: ignore[method-assign]
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            reqs = [Request(mb.dr_smp(mb.GET, NODE_INFO, path=path[:i % 4])) for i in range(40)]
            got = await t.request_all(reqs)
            assert all(r is not None and r.ok for r in got)
            guids = [mb.parse_node_info(r.data).node_guid for r in got if r]
            assert guids[0] == 0x0002C90000000100 and guids[1] == 0x0002C90000001001
            assert t.stats["sent"] == t.stats["answered"] == 40
            assert max_pending[0] <= 4
            n.cancel_scope.cancel()

    run(main)


def test_lost_requests_are_retried_and_counted() -> None:
    port, path = _setup()
    port.drop_send = 0.3

    async def main() -> None:
        t = Transport(port, max_in_flight=8, timeout_s=0.05, retries=5)
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            got = await t.request_all([mb.dr_smp(mb.GET, NODE_INFO, path=path) for _ in range(50)])
            assert all(r is not None for r in got)
            assert t.stats["retries"] > 5 and t.stats["timeouts"] == t.stats["retries"]
            assert sum(r.attempts for r in got if r) == t.stats["sent"]
            n.cancel_scope.cancel()

    run(main)


def test_every_request_lost_gives_none_after_the_retries() -> None:
    port, path = _setup()
    port.drop_send = 1.0

    async def main() -> None:
        t = Transport(port, timeout_s=0.05, retries=2)
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            assert await t.request(mb.dr_smp(mb.GET, NODE_INFO, path=path)) is None
            assert t.stats["sent"] == 3 and t.stats["failed"] == 1
            n.cancel_scope.cancel()

    run(main)


def test_duplicate_late_and_bad_tid_responses_are_dropped_and_counted() -> None:
    port, path = _setup()
    port.duplicate = True
    port.bad_tid = True

    async def main() -> None:
        t = Transport(port, timeout_s=0.05, retries=3)
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            got = await t.request_all([mb.dr_smp(mb.GET, NODE_INFO, path=path) for _ in range(10)])
            assert all(r is not None and r.attempts == 1 for r in got)
            await trio.sleep(0.01)
            assert t.stats["rx_duplicate"] == 10 and t.stats["rx_bad_tid"] == 10
            # late: every response arrives after its attempt timed out
            port.duplicate = port.bad_tid = False
            port.delay_s = 0.08
            r = await t.request(mb.dr_smp(mb.GET, NODE_INFO, path=path))
            assert r is None and t.stats["timeouts"] == 4
            await trio.sleep(0.2)
            assert t.stats["rx_late"] == 4 and t.stats["answered"] == 10
            n.cancel_scope.cancel()

    run(main)


def test_undeliverable_returns_none_at_once_and_unsolicited_goes_to_the_callback() -> None:
    fab = chain(2)
    port = InMemoryPort(fab, "sm")
    seen: list[SimRequest] = []

    async def main() -> None:
        t = Transport(port, timeout_s=1.0, on_unsolicited=seen.append)
        async with trio.open_nursery() as n:
            await n.start(t.serve)
            fab.link_down("sm", 1)
            t0 = trio.current_time()
            assert await t.request(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3])) is None
            assert trio.current_time() - t0 < 0.5 and t.stats["undeliverable"] == 1
            trap = bytearray(mb.lr_smp(mb.TRAP, 0x0002, tid=99))
            t.on_datagram(SimRequest(1, 2, 0, 0, bytes(trap)))
            assert len(seen) == 1 and seen[0].tid == 99
            n.cancel_scope.cancel()

    run(main)
