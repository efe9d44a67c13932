"""The MAD socket of an emulated HCA port: ibsim's client protocol served with trio.

Binds ``<base>:ctl`` and ``<base>:out0`` .. ``out9`` (abstract AF_UNIX datagram sockets) in
the host's network namespace, answers control messages from the port backend, hands client
MADs to ``backend.send_mad`` and writes MADs given to ``UmadServer.deliver`` to the right
client. Protocol logic lives in ``ibemu.wire.umad`` (sans-IO).

    server = await nursery.start(serve, backend, ns)
    backend.deliver = server.deliver      # the fabric's responses and traps come back here

A killed client sends no DISCONNECT: its slot is freed when a send to it fails, when a
CONNECT finds all slots taken, or by the periodic check (``reap_interval``), which asks the
kernel whether the client's ``in<pid>`` socket still exists (a connect(), no data sent).

A slot's hot path may be handed to another process (``takeover``, set by the port backend:
``fabric.mad_socket`` gives OpenSM's slot to ``kernel.madtwin``). That process reads the
slot's data socket itself and forwards what it does not handle over a socket of its own
(``Handover.fwd``), which this server then reads as the slot's data; this server keeps
writing its replies, traps and bounces to its own descriptor of the slot's data socket, which
the client's socket is connected to. When the client goes (or the process ends), the slot's
data socket is read here again.
"""

from __future__ import annotations

import collections
import errno
import logging
import socket
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import trio

from ibemu.kernel.unix import open_abstract_dgram
from ibemu.wire.umad import (
    CTL_LEN,
    DEFAULT_SOCKNAME,
    MAX_CLIENTS,
    Client,
    Delivery,
    SimRequest,
    UmadPortBackend,
    UmadSession,
)

log = logging.getLogger(__name__)

RECV_BUF = 4096  # larger than any valid datagram, so oversized ones are seen as such
_DEAD = frozenset({errno.ECONNREFUSED, errno.ENOTCONN, errno.ECONNRESET, errno.EPIPE})
_FAIRNESS = 256  # datagrams handled per socket before yielding to other tasks (a whole SM window)


class Handover(Protocol):
    """A process serving a slot's hot path (``kernel.madtwin.Twin``)."""

    @property
    def fwd(self) -> socket.socket:
        """Where it forwards the client's datagrams it does not handle (end of file: it ended)."""
        ...

    def stop(self) -> dict[str, int]:
        """End it; returns its last counters."""
        ...


Takeover = Callable[[int, Client, socket.socket], Handover | None]
"""(slot, client, the slot's data socket) -> a process now serving it, or None (blocking:
called in a worker thread)."""


class UmadServer:
    """One MAD socket; ``run`` serves it, ``deliver`` sends MADs to its clients."""

    def __init__(self, backend: UmadPortBackend, ns: str | None, sockname: str = DEFAULT_SOCKNAME,
                 *, restore_tid: bool = True, reap_interval: float | None = 1.0,
                 backlog: int = 256, stall_timeout: float = 5.0) -> None:
        self.backend = backend
        self.ns = ns
        self.sockname = sockname
        self.session = UmadSession(backend, sockname, restore_tid=restore_tid)
        self.reap_interval = reap_interval
        self.backlog_limit = backlog
        self.stall_timeout = stall_timeout
        self._ctl: socket.socket | None = None
        # Slot i's data socket is bound on the first CONNECT that gets slot i (a port that no
        # client ever uses costs one descriptor, not eleven).
        self._out: list[socket.socket | None] = [None] * MAX_CLIENTS
        self._backlog: list[collections.deque[bytes]] = [collections.deque() for _ in range(MAX_CLIENTS)]
        self._flushing = [False] * MAX_CLIENTS
        self._nursery: trio.Nursery | None = None
        self.takeover: Takeover | None = None
        """Asked once per attached client whether another process takes its slot's hot path."""
        self.handovers: list[Handover | None] = [None] * MAX_CLIENTS
        self.last_handover_counters: dict[str, int] = {}
        self._readers: list[trio.CancelScope | None] = [None] * MAX_CLIENTS
        self._slot_clients: list[Client | None] = [None] * MAX_CLIENTS

    @property
    def stats(self) -> Counter[str]:
        return self.session.stats

    # ----------------------------------------------------------------- lifecycle

    def _open_sockets(self) -> None:
        self._ctl = open_abstract_dgram(self.ns, f"{self.sockname}:ctl")

    def _data_socket(self, slot: int) -> socket.socket:
        """Slot ``slot``'s ``<base>:out<slot>``, bound (and served) on first use.

        Binding enters the namespace from the trio thread for a few microseconds, in one
        synchronous step: no other task runs meanwhile.
        """
        sock = self._out[slot]
        if sock is None:
            sock = open_abstract_dgram(self.ns, f"{self.sockname}:out{slot}")
            self._out[slot] = sock
            self._read_slot(slot, sock)
        return sock

    def _read_slot(self, slot: int, sock: socket.socket, handover: Handover | None = None) -> None:
        """Read slot ``slot``'s client datagrams from ``sock`` from now on (the slot's data
        socket, or a handover's ``fwd``), no longer from where they were read before."""
        old = self._readers[slot]
        if old is not None:
            old.cancel()
        self._readers[slot] = None
        if self._nursery is None:
            return
        scope = trio.CancelScope()
        self._readers[slot] = scope
        self._nursery.start_soon(self._reader, slot, sock, scope, handover)

    async def _reader(self, slot: int, sock: socket.socket, scope: trio.CancelScope,
                      handover: Handover | None) -> None:
        with scope:
            await self._data_loop(slot, sock, forwarded=handover is not None)
            if handover is not None and self.handovers[slot] is handover:  # it ended by itself
                log.warning("slot %d: the process serving it ended; this server reads it again", slot)
                self._end_handover(slot)

    # ----------------------------------------------------------------- handovers

    def _check_slots(self) -> None:
        """Notice clients that attached or left since the last look (any control message,
        a failed send, the reaper) and hand their slots over or take them back."""
        for slot in range(len(self._slot_clients)):
            client = self.session.clients.get(slot)
            if client is self._slot_clients[slot]:
                continue
            self._slot_clients[slot] = client
            if self.handovers[slot] is not None:
                self._end_handover(slot)
            if client is not None and self.takeover is not None and self._nursery is not None:
                self._nursery.start_soon(self._hand_over, slot, client)

    async def _hand_over(self, slot: int, client: Client) -> None:
        sock = self._out[slot]
        takeover = self.takeover
        if sock is None or takeover is None:
            return
        try:
            handover = await trio.to_thread.run_sync(takeover, slot, client, sock)
        except Exception:
            self.stats["handover_failed"] += 1
            log.exception("slot %d: the hand-over failed; this server keeps serving it", slot)
            return
        if handover is None:
            return
        if self._slot_clients[slot] is not client or self._nursery is None:  # gone meanwhile
            self.last_handover_counters = handover.stop()
            return
        self.handovers[slot] = handover
        self.stats["handover"] += 1
        self._read_slot(slot, handover.fwd, handover)

    def _end_handover(self, slot: int) -> None:
        handover, self.handovers[slot] = self.handovers[slot], None
        if handover is None:
            return
        self.last_handover_counters = handover.stop()
        log.debug("slot %d: hand-over ended", slot)
        sock = self._out[slot]
        if sock is not None:
            self._read_slot(slot, sock)

    async def serve(self, *, task_status: trio.TaskStatus[UmadServer] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the sockets and serve until cancelled; ``task_status.started(self)``."""
        # Entering a namespace must happen off the trio thread.
        await trio.to_thread.run_sync(self._open_sockets)
        assert self._ctl is not None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._ctl_loop, self._ctl)
                if self.reap_interval:
                    nursery.start_soon(self._reap_loop, self.reap_interval)
                log.info("MAD socket %r serving in %s", self.sockname, self.ns or "this namespace")
                task_status.started(self)
        finally:
            self._nursery = None
            for slot in range(len(self.handovers)):
                self._end_handover(slot)
            for s in [self._ctl, *self._out]:
                if s is not None:
                    s.close()
            self._ctl, self._out = None, [None] * MAX_CLIENTS

    # ----------------------------------------------------------------- receiving

    async def _ctl_loop(self, sock: socket.socket) -> None:
        budget = _FAIRNESS
        while True:
            try:
                data, addr = sock.recvfrom(RECV_BUF)
            except BlockingIOError:
                budget = _FAIRNESS
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:  # e.g. a reply to an earlier sender bounced
                self.stats["ctl_recv_error"] += 1
                log.debug("control socket: %s", exc)
                await trio.lowlevel.checkpoint()
                continue
            try:
                self._handle_ctl(sock, data, addr)
                self._check_slots()
            except Exception:  # a bug must not take the port's MAD socket down
                self.stats["internal_error"] += 1
                log.exception("control message from %r", addr)
            budget -= 1
            if not budget:
                budget = _FAIRNESS
                await trio.lowlevel.checkpoint()

    def _handle_ctl(self, sock: socket.socket, data: bytes, addr: object) -> None:
        if len(data) == CTL_LEN and data[8] == 1 and (self.session.clients.full()
                                                       or self.session.clients.sm_client() is not None):
            # a CONNECT while full, or while an SM is attached (a new SM after one was killed):
            # make room from dead clients first
            self.reap()
        outcome = self.session.on_ctl(data, addr)
        reply = outcome.reply
        attach = outcome.attach
        if attach is not None:
            self._backlog[attach.slot].clear()
            try:
                self._data_socket(attach.slot).connect(attach.address)
            except OSError as exc:
                log.warning("slot %d: cannot connect to the client's data socket %r: %s",
                            attach.slot, attach.address, exc)
                self.stats["connect_no_data_socket"] += 1
                self.session.client_gone(attach.slot)
                reply, attach = attach.error_reply, None
        if reply is None:
            return
        try:
            sock.sendto(reply, addr)  # type: ignore[call-overload]
        except OSError as exc:
            self.stats["ctl_reply_failed"] += 1
            log.warning("control reply to %r failed: %s", addr, exc)
            if attach is not None:
                self.session.client_gone(attach.slot)

    async def _data_loop(self, slot: int, sock: socket.socket, *, forwarded: bool = False) -> None:
        """Handle slot ``slot``'s datagrams read from ``sock``; ``forwarded``: a handover's
        socket, whose end of file ends the loop."""
        budget = _FAIRNESS
        while True:
            try:
                data = sock.recv(RECV_BUF)
                if forwarded and not data:
                    return
            except BlockingIOError:
                budget = _FAIRNESS
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as exc:
                if forwarded:
                    return
                self.stats["data_recv_error"] += 1
                log.debug("slot %d data socket: %s", slot, exc)
                await trio.lowlevel.checkpoint()
                continue
            try:
                bounce = self.session.on_data(slot, data)
                if bounce is not None:
                    self._send(slot, bounce)
            except Exception:  # a bug must not take the port's MAD socket down
                self.stats["internal_error"] += 1
                log.exception("MAD from slot %d", slot)
            budget -= 1
            if not budget:
                budget = _FAIRNESS
                await trio.lowlevel.checkpoint()

    # ----------------------------------------------------------------- sending

    def deliver(self, req: SimRequest) -> Delivery:
        """Send a MAD from the fabric to the client it belongs to (trio thread only).

        Responses and undeliverable requests (status 110) go to the slot in TID bits 48-63;
        unsolicited MADs (traps) to the SM client. Never blocks: a client whose receive queue
        is full gets the MAD later (QUEUED) or, past ``backlog`` MADs, not at all (DROPPED).
        """
        if self._ctl is None:
            self.stats["deliver_not_running"] += 1
            return Delivery.DROPPED
        routed = self.session.route(req)
        if isinstance(routed, Delivery):
            return routed
        slot, payload = routed
        return self._send(slot, payload)

    def _send(self, slot: int, payload: bytes) -> Delivery:
        queue = self._backlog[slot]
        if queue:
            return self._enqueue(slot, payload)
        sock = self._out[slot]
        if sock is None:
            self.stats["deliver_no_socket"] += 1
            return Delivery.DROPPED
        try:
            sock.send(payload)
        except BlockingIOError:
            return self._enqueue(slot, payload)
        except OSError as exc:
            return self._send_failed(slot, exc)
        self.stats["delivered"] += 1
        return Delivery.DELIVERED

    def _send_failed(self, slot: int, exc: OSError) -> Delivery:
        self._backlog[slot].clear()
        if exc.errno in _DEAD:
            log.info("slot %d: client seems dead (%s)", slot, exc)
            self.session.client_gone(slot)
            self._check_slots()
            return Delivery.CLIENT_GONE
        self.stats["send_error"] += 1
        log.warning("slot %d: send failed: %s", slot, exc)
        return Delivery.DROPPED

    def _enqueue(self, slot: int, payload: bytes) -> Delivery:
        queue = self._backlog[slot]
        if len(queue) >= self.backlog_limit or self._nursery is None:
            self.stats["backlog_dropped"] += 1
            return Delivery.DROPPED
        queue.append(payload)
        self.stats["queued"] += 1
        if not self._flushing[slot]:
            client = self.session.clients.get(slot)
            if client is not None:
                self._flushing[slot] = True
                self._nursery.start_soon(self._flush, slot, client)
        return Delivery.QUEUED

    async def _flush(self, slot: int, client: Client) -> None:
        """Drain a slot's backlog as its client reads; drop a MAD the client will not take."""
        queue, sock = self._backlog[slot], self._out[slot]
        if sock is None:
            self._flushing[slot] = False
            queue.clear()
            return
        try:
            while queue and self.session.clients.get(slot) is client:
                try:
                    sock.send(queue[0])
                except BlockingIOError:
                    with trio.move_on_after(self.stall_timeout) as scope:
                        await trio.lowlevel.wait_writable(sock)
                    if scope.cancelled_caught:
                        queue.popleft()
                        self.stats["stall_dropped"] += 1
                        log.warning("slot %d: client not reading for %.1f s: MAD dropped",
                                    slot, self.stall_timeout)
                    continue
                except OSError as exc:
                    self._send_failed(slot, exc)
                    return
                queue.popleft()
                self.stats["delivered"] += 1
            if self.session.clients.get(slot) is not client:
                queue.clear()
        finally:
            self._flushing[slot] = False

    # ----------------------------------------------------------------- liveness

    def reap(self) -> list[int]:
        """Free the slots whose client's data socket is gone; returns them."""
        gone = []
        for client in list(self.session.clients):
            sock = self._out[client.slot]
            if sock is None:
                continue
            try:
                # Re-connecting to the same live peer is a no-op; a vanished name refuses.
                sock.connect(client.data_addr)
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    gone.append(client.slot)
                    self._backlog[client.slot].clear()
                    self.session.client_gone(client.slot)
                else:
                    log.debug("slot %d liveness check: %s", client.slot, exc)
        if gone:
            self._check_slots()
        return gone

    async def _reap_loop(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            self.reap()


async def serve(port_backend: UmadPortBackend, ns: str | None, sockname: str = DEFAULT_SOCKNAME, *,
                restore_tid: bool = True, reap_interval: float | None = 1.0,
                task_status: trio.TaskStatus[UmadServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the MAD socket of ``port_backend`` in namespace ``ns`` until cancelled.

    ``ns=None`` binds in the caller's own namespace. ``task_status.started(server)`` hands
    over the ``UmadServer``: give its ``deliver`` to the backend so responses and traps
    reach the clients.
    """
    server = UmadServer(port_backend, ns, sockname, restore_tid=restore_tid,
                        reap_interval=reap_interval)
    await server.serve(task_status=task_status)
