"""MAD transactions for the SM: a window of SMPs in flight, TIDs, timeouts, retries.

``Transport`` runs over any ``MadPort`` (send / receive ``SimRequest`` datagrams):

- ``UmadPort``: a live host's MAD socket through ``UmadClient`` (the SM process);
- ``ibemu.testing.madport.InMemoryPort``: a CA of an ``InMemoryFabric`` (unit tests; run under
  trio's ``MockClock(autojump_threshold=0)`` so timeouts cost no wall time).

Both pass ``ibemu.testing.madport.check_mad_port``, the conformance checks of a ``MadPort``.

At most ``max_in_flight`` requests are outstanding; each gets a fresh TID (low 32 bits; the
MAD socket owns bits 48-63) per attempt, ``timeout_s`` per attempt and ``retries`` more
attempts. A response is matched on its TID's low 32 bits; a late one (its attempt timed
out), a duplicate (already answered) or one with an unknown TID is dropped and counted in
``stats``. A request unanswered after every attempt is ``failed`` in ``stats`` (the SM sweeps
again for it), unless the caller sends it another way then (``fallback``: a LID-routed SMP
followed by its directed-route one), which is ``fell_back``. Under time dilation the SM gives
the transport a timeout bounded in real time (``ibemu.sm.timers``). Requests sent to us (traps, SMInfo) go to ``on_unsolicited``, which must not block.

M_Key: with ``m_key`` set, every SMP that leaves (requests, TrapRepress, responses) carries it
in its M_Key field (bytes 24-31), whatever the caller built: the SM's key is a property of the
SM, not of each request. 0 (the default) leaves the MADs as built.

Cost: a waiting attempt is parked with ``trio.lowlevel.wait_task_rescheduled`` and woken by
its reply or by the one deadline task (``serve``), and ``request_all`` runs a window's worth
of worker tasks rather than one task per request: 33-41 us of this process's CPU per request,
against 99-117 us with an Event, a cancel scope and a task each (``benchmarks/bench_sm_transport.py``).

Calls (``Call``, ``submit``, ``cancel``, ``request_many``) go further for bulk work (a pass's
LFT Sets, a switch's PortInfo Gets): no task waits for a call; ``submit`` frames and sends as
many as the window has room for in one pass with no checkpoint between them (through the
port's ``send_nowait``: the SM's own packet socket, the MAD socket), and each call's
``on_done`` runs from the receive task as its answer is matched, or from the timer task when
its last attempt times out (retries, TIDs, the window and ``stats`` as for ``request``). A
k=8 reroute's LFT Sets cost 38-41 us of CPU each this way against 83-90 us as a task each
through ``request`` (``benchmarks/bench_sm_reroute_cpu.py``, load ~9). A port that also has
``send_many_nowait`` (the SM's own port: one ``sendmmsg`` per call, ``kernel.mmsg``) is handed
what ``submit`` frames ``burst`` (8) datagrams at a time: a system call per burst instead of
one per SMP, and the first Sets are on their way while the rest are framed.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import outcome
import trio

from ibemu.hca.umad_client import UmadClient
from ibemu.wire import madcodec as mb
from ibemu.wire.umad import STATUS_OK, SimRequest, set_mad_tid

log = logging.getLogger(__name__)

PERMISSIVE_LID = 0xFFFF
LOW32 = 0xFFFFFFFF
DEFAULT_MAX_IN_FLIGHT = 128  # measured: benchmarks/bench_sm.py (k=8 bring-up 1.2-1.6 s at 64-256, 2.0-2.4 s at 16-32; a reroute sends all its blocks at once)
DEFAULT_TIMEOUT_S = 0.2
DEFAULT_RETRIES = 3
BURST = 8  # a reroute's first Sets go out before the rest are framed (see ``submit``)
_MEMORY = 8192  # finished TIDs remembered, to tell late and duplicate responses apart


class MadPort(Protocol):
    """Where the SM's MADs go in and out. A port may also offer ``async recv_many() ->
    list[SimRequest]`` (everything waiting, at least one), which the transport then uses;
    or ``attach(deliver)``, which makes the port call ``deliver(datagram)`` itself, from the
    task that read it, for every datagram from then on (``None``: back to ``recv``): no
    hand-over between tasks; and ``send_nowait(req)`` (send now, without a checkpoint, or
    raise ``trio.WouldBlock``), which lets ``submit`` send a batch in one pass."""

    async def send(self, req: SimRequest) -> None: ...

    async def recv(self) -> SimRequest: ...


class UmadPort:
    """A ``MadPort`` over a connected ``UmadClient`` (a live host's MAD socket)."""

    def __init__(self, client: UmadClient) -> None:
        self.client = client
        self._blocked = trio.Lock()  # one task at a time may wait for the socket to drain

    async def send(self, req: SimRequest) -> None:
        raw = req.pack()
        try:
            self.client.data.send(raw)
            return
        except BlockingIOError:
            pass
        async with self._blocked:
            while True:
                try:
                    self.client.data.send(raw)
                    return
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.client.data)

    def send_nowait(self, req: SimRequest) -> None:
        """Send without waiting; ``trio.WouldBlock`` when the socket is full."""
        try:
            self.client.data.send(req.pack())
        except BlockingIOError:
            raise trio.WouldBlock from None

    async def recv(self) -> SimRequest:
        return await self.client.recv()


@dataclass(frozen=True, slots=True)
class Reply:
    """An answered request: the response MAD, its status, and how many attempts it took."""

    mad: bytes
    attempts: int

    @property
    def status(self) -> int:
        return mb.status(self.mad)

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def data(self) -> bytes:
        return mb.smp_data(self.mad)


@dataclass(frozen=True, slots=True)
class Request:
    """One request to make: a MAD (its TID is replaced) and where it goes."""

    mad: bytes
    dlid: int = PERMISSIVE_LID
    dqp: int = 0
    sqp: int = 0


class Call:
    """One request of ``Transport.submit``: no task waits for it; ``on_done(reply)`` is called
    once, with the ``Reply`` or None (every attempt timed out, or undeliverable), from the
    transport's receive or timer task (it must not block), unless ``Transport.cancel`` ended
    the call first. ``on_attempt(n)`` and ``fallback`` as for ``Transport.request``."""

    __slots__ = ("attempt", "attempts", "done", "fallback", "on_attempt", "on_done", "req", "tid", "timeout")

    def __init__(self, req: Request | bytes, on_done: Callable[[Reply | None], None], *,
                 timeout_s: float | None = None, retries: int | None = None,
                 on_attempt: Callable[[int], None] | None = None, fallback: bool = False) -> None:
        self.req = Request(req) if isinstance(req, bytes) else req
        self.fallback = fallback
        self.on_done = on_done
        self.on_attempt = on_attempt
        self.timeout = timeout_s
        self.attempts = -1 if retries is None else 1 + retries  # -1: the transport's default
        self.attempt = 0
        self.tid = 0
        """The TID of the attempt in flight (0: not sent yet)."""
        self.done = False


class _Pending:
    """One attempt in flight: the task (or ``Call``) waiting for it, until a reply or its deadline."""

    __slots__ = ("call", "deadline", "reply", "sent", "task")

    def __init__(self, call: Call | None = None) -> None:
        self.task: trio.lowlevel.Task | None = None
        """Set only while the task waits in ``wait_task_rescheduled`` for this attempt."""
        self.call = call
        self.deadline = math.inf
        self.reply: SimRequest | None = None
        self.sent = True
        """False when the send failed (its deadline is then the pause before the next attempt)."""


Unsolicited = Callable[[SimRequest], None]


class Transport:
    """MAD transactions over a ``MadPort``; start ``run`` in a nursery first."""

    def __init__(self, port: MadPort, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = DEFAULT_RETRIES,
                 on_unsolicited: Unsolicited | None = None, m_key: int = 0) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.port = port
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.retries = retries
        self.on_unsolicited = on_unsolicited
        self.m_key = m_key
        self.stats: Counter[str] = Counter()
        self._window = trio.Semaphore(max_in_flight)
        self._pending: dict[int, _Pending] = {}
        self._finished: OrderedDict[int, str] = OrderedDict()
        self._tid = 0
        self._deadlines: list[tuple[float, int, int]] = []  # (deadline, seq, tid), a heap
        self._seq = 0
        self._timer: trio.CancelScope | None = None
        self._backlog: deque[Call] = deque()  # submitted calls waiting for a window slot
        self._outbox: deque[tuple[int, SimRequest]] = deque()  # (tid, datagram) for the send task
        self._outbox_ready = trio.Event()
        self._send_nowait: Callable[[SimRequest], None] | None = getattr(port, "send_nowait", None)
        self._send_many: Callable[[list[SimRequest]], int] | None = getattr(port, "send_many_nowait", None)
        self._burst: list[tuple[int, _Pending, SimRequest]] | None = None  # within ``submit``
        self.burst = BURST
        """``submit`` hands a port with ``send_many_nowait`` this many datagrams at a time."""

    # ------------------------------------------------------------------ receive side

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Receive loop: match responses, hand requests to ``on_unsolicited``; and the one
        timer that ends every attempt whose deadline passed."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire_loop)
            nursery.start_soon(self._send_loop)
            attach = getattr(self.port, "attach", None)
            if attach is not None:  # a port that calls ``on_datagram`` itself (``DirectPort``)
                attach(self.on_datagram)
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    attach(None)
            task_status.started()
            recv_many = getattr(self.port, "recv_many", None)
            if recv_many is not None:  # a port that hands over bursts
                while True:
                    for req in await recv_many():
                        self.on_datagram(req)
            while True:
                req = await self.port.recv()
                self.on_datagram(req)

    async def _expire_loop(self) -> None:
        """Wake at the earliest deadline of an attempt still waiting; end the overdue ones.

        Attempts are not given a cancel scope each (trio's per-scope and per-Event costs were
        most of the ~70 us an SMP cost this process): they wait in ``wait_task_rescheduled``
        and this task, or the reply, reschedules them. Answered attempts leave stale heap
        entries, dropped as they reach the top."""
        heap = self._deadlines
        while True:
            while heap and self._stale(heap[0][2], heap[0][0]):
                heapq.heappop(heap)
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as scope:
                self._timer = scope
                await trio.sleep_forever()
            self._timer = None
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, _, tid = heapq.heappop(heap)
                pending = self._pending.get(tid)
                if pending is None or pending.deadline > now:
                    continue
                if pending.task is not None:
                    task, pending.task = pending.task, None
                    trio.lowlevel.reschedule(task, outcome.Value(None))
                elif pending.call is not None:
                    self._call_expired(tid, pending, pending.call)

    def _stale(self, tid: int, deadline: float) -> bool:
        pending = self._pending.get(tid)
        return (pending is None or (pending.task is None and pending.call is None)
                or pending.deadline != deadline)

    def _arm(self, tid: int, deadline: float) -> None:
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, tid))
        timer = self._timer
        if timer is not None and deadline < timer.deadline:
            timer.deadline = deadline

    def on_datagram(self, req: SimRequest) -> None:
        if len(req.mad) < 24 or req.mad[0] != 1:
            self.stats["rx_malformed"] += 1
            return
        if not req.is_response and req.status == STATUS_OK:
            self.stats["rx_unsolicited"] += 1
            if self.on_unsolicited is not None:
                try:
                    self.on_unsolicited(req)
                except Exception:
                    log.exception("unsolicited MAD handler failed")
                    self.stats["unsolicited_handler_error"] += 1
            return
        low = req.tid & LOW32
        pending = self._pending.get(low)
        if pending is None or pending.reply is not None:
            why = self._finished.get(low)
            key = {"answered": "rx_duplicate", "timed_out": "rx_late"}.get(why or "", "rx_bad_tid")
            if pending is not None:
                key = "rx_duplicate"
            self.stats[key] += 1
            return
        pending.reply = req
        if pending.call is not None:
            self._call_answered(low, req, pending.call)
            return
        task, pending.task = pending.task, None
        if task is not None:
            trio.lowlevel.reschedule(task, outcome.Value(req))

    # ------------------------------------------------------------------ requests

    def _next_tid(self) -> int:
        while True:
            self._tid = (self._tid + 1) & LOW32
            if self._tid and self._tid not in self._pending:
                return self._tid

    def _finish(self, tid: int, how: str) -> None:
        self._pending.pop(tid, None)
        self._finished[tid] = how
        self._finished.move_to_end(tid)
        while len(self._finished) > _MEMORY:
            self._finished.popitem(last=False)

    async def request(self, req: Request | bytes, *, timeout_s: float | None = None,
                      retries: int | None = None,
                      on_attempt: Callable[[int], None] | None = None, fallback: bool = False) -> Reply | None:
        """Send and wait for the response; None when every attempt timed out or the MAD
        was returned undeliverable (status 110). ``on_attempt(n)`` is called as attempt
        ``n`` (1, 2, ...) goes out (past the window): n > 1 means the one before timed out.
        ``fallback``: the caller sends the request another way if this one goes unanswered
        (a LID-routed SMP, then by directed route), so that is counted in ``stats`` as
        ``fell_back``, not ``failed`` (which the SM reads as an SMP unanswered for good)."""
        if isinstance(req, bytes):
            req = Request(req)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        attempts = 1 + (self.retries if retries is None else retries)
        # A free slot is taken without yielding, so a task sends in its first step: a
        # reroute's 48 Sets, each in a task of its own, went out only after every task had
        # run (and yielded) once (~2 ms on k=8).
        try:
            self._window.acquire_nowait()
        except trio.WouldBlock:
            await self._window.acquire()
        try:
            return await self._attempts(req, timeout, attempts, on_attempt, fallback)
        finally:
            # to the next waiting call first, as a call's own slot goes (``_release``): given
            # back to the window alone, a slot freed while calls waited in ``_backlog`` and no
            # call was in flight left them there for good (a k=8 cold sweep with ``ftree_ar``
            # stalled so, every SMP answered and none pending, about 1 in 12)
            self._release()

    async def _attempts(self, req: Request, timeout: float, attempts: int,
                        on_attempt: Callable[[int], None] | None, fallback: bool = False) -> Reply | None:
        """``request`` within its window slot: every attempt, each with its timeout."""
        for attempt in range(1, attempts + 1):
            tid = self._next_tid()
            pending = _Pending()
            self._pending[tid] = pending
            if attempt > 1:
                self.stats["retries"] += 1
            self.stats["sent"] += 1
            if on_attempt is not None:
                on_attempt(attempt)
            try:
                await self.port.send(SimRequest(req.dlid, 0, req.dqp, req.sqp,
                                                self._keyed(set_mad_tid(req.mad, tid))))
            except OSError as exc:
                self.stats["send_error"] += 1
                log.warning("send failed: %s", exc)
                self._finish(tid, "timed_out")
                await trio.sleep(min(timeout, 0.01))
                continue
            except BaseException:
                self._finish(tid, "timed_out")
                self.stats["cancelled"] += 1
                raise
            got: SimRequest | None
            if pending.reply is not None:  # answered while the send yielded
                got = pending.reply
            else:
                pending.task = trio.lowlevel.current_task()
                pending.deadline = trio.current_time() + timeout
                self._arm(tid, pending.deadline)

                def abort(_raise_cancel: object, pending: _Pending = pending) -> trio.lowlevel.Abort:
                    pending.task = None
                    return trio.lowlevel.Abort.SUCCEEDED

                try:
                    got = await trio.lowlevel.wait_task_rescheduled(abort)
                except BaseException:  # cancelled by the caller: forget this TID
                    self._finish(tid, "timed_out")
                    self.stats["cancelled"] += 1
                    raise
            if got is None:
                self._finish(tid, "timed_out")
                self.stats["timeouts"] += 1
                continue
            self._finish(tid, "answered")
            if got.status != STATUS_OK:
                self.stats["undeliverable"] += 1
                return None
            self.stats["answered"] += 1
            return Reply(got.mad, attempt)
        self.stats["fell_back" if fallback else "failed"] += 1
        return None

    def _keyed(self, mad: bytes) -> bytes:
        """``mad`` with the SM's M_Key if it is an SMP and a key is set."""
        if not self.m_key or len(mad) < 32 or mad[1] not in (0x01, 0x81):
            return mad
        return mad[:24] + self.m_key.to_bytes(8, "big") + mad[32:]

    # ------------------------------------------------------------------ calls (no task each)

    def submit(self, calls: Iterable[Call]) -> None:
        """Start ``calls`` in order, without waiting: as many as the window has room for are
        framed and sent in this one pass, with no checkpoint between them (with a port that
        has ``send_nowait``; else the send task sends them in order); the rest go out as
        slots free. Retries, timeouts and matching are those of ``request``; a call's slot
        goes to the next waiting call when it ends.

        A port with ``send_many_nowait`` (``DirectPort``: one ``sendmmsg``) is handed the
        datagrams ``burst`` at a time: one system call per burst, and the first Sets are on
        their way while the next are framed."""
        batched = self._send_many is not None and self._burst is None
        if batched:
            self._burst = []
        try:
            for call in calls:
                if call.attempts < 0:
                    call.attempts = 1 + self.retries
                if call.timeout is None:
                    call.timeout = self.timeout_s
                if self._backlog:
                    self._backlog.append(call)
                    continue
                try:
                    self._window.acquire_nowait()
                except trio.WouldBlock:
                    self._backlog.append(call)
                    continue
                self._launch(call)
                if batched and len(self._burst or ()) >= self.burst:
                    self._flush()
        finally:
            if batched:
                self._flush()
                self._burst = None

    def cancel(self, call: Call) -> bool:
        """End ``call`` without calling its ``on_done`` (False: it had ended already)."""
        if call.done:
            return False
        call.done = True
        if call.tid:
            self._finish(call.tid, "timed_out")
            self.stats["cancelled"] += 1
            self._release()
        else:
            with contextlib.suppress(ValueError):
                self._backlog.remove(call)
        return True

    def _launch(self, call: Call) -> None:
        """Send ``call``'s next attempt (it holds a window slot)."""
        call.attempt += 1
        tid = call.tid = self._next_tid()
        pending = _Pending(call)
        self._pending[tid] = pending
        if call.attempt > 1:
            self.stats["retries"] += 1
        self.stats["sent"] += 1
        if call.on_attempt is not None:
            try:
                call.on_attempt(call.attempt)
            except Exception:
                log.exception("on_attempt failed")
        req = call.req
        dgram = SimRequest(req.dlid, 0, req.dqp, req.sqp, self._keyed(set_mad_tid(req.mad, tid)))
        if self._burst is not None and not self._outbox:
            self._burst.append((tid, pending, dgram))
            return
        self._send_one(tid, pending, dgram)

    def _flush(self) -> None:
        """Send the burst ``submit`` gathered: in one ``send_many_nowait``; what it did not
        take goes out one by one, as ``_launch`` sends (which says why, or queues it)."""
        burst, self._burst = self._burst or [], []
        if not burst:
            return
        assert self._send_many is not None
        try:
            n = self._send_many([dgram for _, _, dgram in burst])
        except (trio.WouldBlock, OSError):
            n = 0
        self.stats["send_batches"] += 1
        for i, (tid, pending, dgram) in enumerate(burst):
            if self._pending.get(tid) is not pending:
                continue  # ended meanwhile (an ``on_attempt`` that cancelled)
            if i < n:
                self._call_sent(tid, pending)
            else:
                self._send_one(tid, pending, dgram)

    def _send_one(self, tid: int, pending: _Pending, dgram: SimRequest) -> None:
        send = self._send_nowait
        if send is None or self._outbox:
            self._outbox.append((tid, dgram))
            self._outbox_ready.set()
            return
        try:
            send(dgram)
        except trio.WouldBlock:
            self._outbox.append((tid, dgram))
            self._outbox_ready.set()
            return
        except OSError as exc:
            self._send_failed(tid, pending, exc)
            return
        self._call_sent(tid, pending)

    def _call_sent(self, tid: int, pending: _Pending) -> None:
        assert pending.call is not None and pending.call.timeout is not None
        pending.deadline = trio.current_time() + pending.call.timeout
        self._arm(tid, pending.deadline)

    def _send_failed(self, tid: int, pending: _Pending, exc: OSError) -> None:
        """As ``request``: counted, and the next attempt after a pause (min(timeout, 10 ms))."""
        assert pending.call is not None and pending.call.timeout is not None
        self.stats["send_error"] += 1
        log.warning("send failed: %s", exc)
        pending.sent = False
        pending.deadline = trio.current_time() + min(pending.call.timeout, 0.01)
        self._arm(tid, pending.deadline)

    async def _send_loop(self) -> None:
        """Sends what ``_launch`` could not send at once (a port without ``send_nowait``, or
        a full socket), in order."""
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready = trio.Event()
            while self._outbox:
                tid, dgram = self._outbox.popleft()
                pending = self._pending.get(tid)
                if pending is None or pending.call is None or pending.call.done:
                    continue  # cancelled before it went out
                try:
                    await self.port.send(dgram)
                except OSError as exc:
                    self._send_failed(tid, pending, exc)
                    continue
                if self._pending.get(tid) is pending and pending.reply is None:
                    self._call_sent(tid, pending)

    def _call_expired(self, tid: int, pending: _Pending, call: Call) -> None:
        self._finish(tid, "timed_out")
        call.tid = 0
        if pending.sent:
            self.stats["timeouts"] += 1
        if call.attempt < call.attempts:
            self._launch(call)
            return
        self.stats["fell_back" if call.fallback else "failed"] += 1
        self._call_end(call, None)

    def _call_answered(self, tid: int, got: SimRequest, call: Call) -> None:
        self._finish(tid, "answered")
        call.tid = 0
        if got.status != STATUS_OK:
            self.stats["undeliverable"] += 1
            self._call_end(call, None)
            return
        self.stats["answered"] += 1
        self._call_end(call, Reply(got.mad, call.attempt))

    def _call_end(self, call: Call, reply: Reply | None) -> None:
        call.done = True
        self._release()
        try:
            call.on_done(reply)
        except Exception:
            log.exception("request callback failed")
            self.stats["callback_error"] += 1

    def _release(self) -> None:
        """A call's window slot is free: to the next waiting call, else back to the window."""
        while self._backlog:
            nxt = self._backlog.popleft()
            if not nxt.done:
                self._launch(nxt)
                return
        self._window.release()

    async def request_many(self, reqs: Sequence[Request | bytes], *, timeout_s: float | None = None,
                           retries: int | None = None) -> list[Reply | None]:
        """Like ``request_all``, as calls: one task waits for the whole batch, sent in order in
        one pass. ``timeout_s``, ``retries``: as for ``request`` (default: the transport's)."""
        out: list[Reply | None] = [None] * len(reqs)
        left = len(reqs)
        all_done = trio.Event()

        def done(i: int, reply: Reply | None) -> None:
            nonlocal left
            out[i] = reply
            left -= 1
            if not left:
                all_done.set()

        calls = [Call(r, functools.partial(done, i), timeout_s=timeout_s, retries=retries)
                 for i, r in enumerate(reqs)]
        if not calls:
            return out
        self.submit(calls)
        try:
            await all_done.wait()
        finally:
            for call in calls:
                self.cancel(call)
        return out

    async def request_all(self, reqs: Sequence[Request | bytes]) -> list[Reply | None]:
        """Many requests in parallel (the window bounds what is in flight); results in order."""
        out: list[Reply | None] = [None] * len(reqs)
        todo = iter(range(len(reqs)))

        async def worker() -> None:  # a window's worth of tasks, not one per request
            for i in todo:
                out[i] = await self.request(reqs[i])

        async with trio.open_nursery() as nursery:
            for _ in range(min(len(reqs), self.max_in_flight)):
                nursery.start_soon(worker)
        return out

    async def send_only(self, mad: bytes, *, dlid: int, dqp: int = 0, sqp: int = 0) -> None:
        """Send a MAD that gets no response (TrapRepress, a GetResp to a request of ours)."""
        self.stats["sent_unacked"] += 1
        try:
            await self.port.send(SimRequest(dlid, 0, dqp, sqp, self._keyed(mad)))
        except OSError as exc:
            self.stats["send_error"] += 1
            log.warning("send failed: %s", exc)
