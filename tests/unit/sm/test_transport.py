"""The SM's MAD transaction layer: window, TIDs, timeouts, retries, bad responses."""

from __future__ import annotations

import functools
import random

import trio

from ibemu.sm.transport import Call, Reply, Request, Transport
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


class Nowait(Wrapped):
    """A ``Wrapped`` port that also sends without a checkpoint (``send_nowait``), as the SM's
    own packet socket does; ``full`` sends make it raise ``trio.WouldBlock`` first."""

    def __init__(self, inner: InMemoryPort) -> None:
        super().__init__(inner)
        self.sent_nowait: list[int] = []
        self.full = 0

    def send_nowait(self, req: SimRequest) -> None:
        if self.full:
            self.full -= 1
            raise trio.WouldBlock
        self.sent_nowait.append(req.tid)
        if self.rng.random() < self.drop_send:
            return
        inner = self.inner
        inner.fab.handle(inner.name, inner.agent.send_mad(inner.port, req.dlid, req.dqp, req.sqp, req.mad))  # type: ignore[attr-defined]
        inner.fab.run()
        inner.pump()


def test_submitted_calls_go_out_in_one_pass_within_the_window() -> None:
    """``submit`` sends as many calls as the window has room for before it returns (no task,
    no checkpoint between them); the rest follow as answers free slots; each ``on_done`` once."""
    fab = chain(3)
    port = Nowait(InMemoryPort(fab, "sm"))

    async def main() -> None:
        t = Transport(port, max_in_flight=8)
        got: dict[int, Reply | None] = {}
        attempts: list[tuple[int, int]] = []
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            calls = [Call(Request(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3, 3][:i % 4])),
                          functools.partial(got.__setitem__, i),
                          on_attempt=functools.partial(lambda i, a: attempts.append((i, a)), i))
                     for i in range(40)]
            t.submit(calls)
            assert len(port.sent_nowait) == 8 and not got  # one pass, nothing answered yet
            while len(got) < 40:
                await trio.sleep(0.001)
            assert len(port.sent_nowait) == 40 and len(set(port.sent_nowait)) == 40
            assert all(r is not None and r.ok and r.attempts == 1 for r in got.values())
            assert attempts == [(i, 1) for i in range(40)]
            assert mb.parse_node_info(got[1].data).node_guid == 0x0002C90000001001  # type: ignore[union-attr]
            assert t.stats["sent"] == t.stats["answered"] == 40 and not t._pending and not t._backlog
            assert t._window.value == 8
            n.cancel_scope.cancel()

    run(main)


def test_submitted_calls_retry_fall_back_to_the_send_task_and_can_be_cancelled() -> None:
    fab = chain(3)
    port = Nowait(InMemoryPort(fab, "sm"))
    port.drop_send = 0.3
    port.full = 3  # the first three find the socket full: the send task sends them, in order

    async def main() -> None:
        t = Transport(port, max_in_flight=4, timeout_s=0.05, retries=5)
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            got = await t.request_many([mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3, 3]) for _ in range(30)])
            assert all(r is not None for r in got)
            assert t.stats["retries"] > 3 and t.stats["timeouts"] == t.stats["retries"]
            assert sum(r.attempts for r in got if r) == t.stats["sent"]
            # a cancelled call never calls back; its slot goes to the next call waiting
            n.cancel_scope.cancel()
        port2 = Nowait(InMemoryPort(chain(2), "sm"))
        port2.drop_send = 1.0
        seen: list[Reply | None] = []
        t2 = Transport(port2, max_in_flight=1, timeout_s=0.05, retries=1)
        async with trio.open_nursery() as n:
            port2.start(n)
            await n.start(t2.serve)
            lost = Call(mb.dr_smp(mb.GET, NODE_INFO, path=[1]), seen.append)
            waiting = Call(mb.dr_smp(mb.GET, NODE_INFO, path=[1]), seen.append)
            t2.submit([lost, waiting])
            assert list(t2._backlog) == [waiting] and len(port2.sent_nowait) == 1
            port2.drop_send = 0.0
            assert t2.cancel(lost) and not t2.cancel(lost)
            await trio.sleep(0.01)
            assert seen and seen[0] is not None and seen[0].ok and len(seen) == 1
            assert t2.stats["cancelled"] == 1 and t2._window.value == 1
            # every attempt lost: None after the retries
            port2.drop_send = 1.0
            await t2.request_many([mb.dr_smp(mb.GET, NODE_INFO, path=[1])])
            assert t2.stats["failed"] == 1 and t2.stats["timeouts"] == 2
            n.cancel_scope.cancel()

    run(main)


class Batched(Nowait):
    """A ``Nowait`` port that also takes bursts (``send_many_nowait``), as the SM's own port
    does with ``sendmmsg``; ``take`` (when set) is how many of the next burst it accepts."""

    def __init__(self, inner: InMemoryPort) -> None:
        super().__init__(inner)
        self.bursts: list[int] = []
        self.take: int | None = None

    def send_many_nowait(self, reqs: list[SimRequest]) -> int:
        n = len(reqs) if self.take is None else min(self.take, len(reqs))
        self.take = None
        if not n:
            raise trio.WouldBlock
        self.bursts.append(n)
        for req in reqs[:n]:
            self.send_nowait(req)
        return n


def test_submitted_calls_go_out_in_bursts_and_what_a_burst_leaves_goes_one_by_one() -> None:
    fab = chain(3)
    port = Batched(InMemoryPort(fab, "sm"))

    async def main() -> None:
        t = Transport(port, max_in_flight=32)
        assert t.burst == 8
        got: dict[int, Reply | None] = {}
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            calls = [Call(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3, 3][:i % 4]), functools.partial(got.__setitem__, i))
                     for i in range(20)]
            t.submit(calls)
            assert port.bursts == [8, 8, 4] and len(port.sent_nowait) == 20 and not got
            while len(got) < 20:
                await trio.sleep(0.001)
            assert all(r is not None and r.ok for r in got.values()) and t.stats["send_batches"] == 3
            # a burst the port takes only part of: the rest go one by one, each once
            port.take = 3
            got.clear()
            t.submit([Call(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3]), functools.partial(got.__setitem__, i))
                      for i in range(8)])
            assert port.bursts[3:] == [3] and len(port.sent_nowait) == 28
            # none taken (a full socket) and the single sends find it full too: the send task
            port.take, port.full = 0, 2
            t.submit([Call(mb.dr_smp(mb.GET, NODE_INFO, path=[1, 3]), functools.partial(got.__setitem__, 8 + i))
                      for i in range(4)])
            while len(got) < 12:
                await trio.sleep(0.001)
            assert all(r is not None and r.ok and r.attempts == 1 for r in got.values())
            assert t.stats["sent"] == t.stats["answered"] == 32 and not t._pending and t._window.value == 32
            n.cancel_scope.cancel()

    run(main)


def test_a_slot_a_request_frees_goes_to_a_waiting_call() -> None:
    """A ``request`` ending hands its window slot to the calls waiting in the backlog (as a
    call's end does): given back to the semaphore alone, calls submitted while only requests
    were in flight waited forever, with nothing pending and no deadline (a cold sweep's stall)."""
    port, path = _setup()

    async def main() -> None:
        t = Transport(port, max_in_flight=2)
        port.delay_s = 0.01  # the requests are in flight when the calls are submitted
        async with trio.open_nursery() as n:
            port.start(n)
            await n.start(t.serve)
            got: list[Reply | None] = []

            async def one() -> None:
                got.append(await t.request(Request(mb.dr_smp(mb.GET, NODE_INFO, path=path))))

            n.start_soon(one)
            n.start_soon(one)
            await trio.sleep(0.001)
            assert len(t._pending) == 2  # the window is full of requests
            with trio.fail_after(5):
                many = await t.request_many([Request(mb.dr_smp(mb.GET, NODE_INFO, path=path)) for _ in range(3)])
            assert all(r is not None and r.ok for r in many) and len(got) == 2
            assert t.stats["answered"] == 5
            n.cancel_scope.cancel()

    run(main)
