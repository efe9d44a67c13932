"""Carrier changes on a thread of their own: the kernel's forwarding state first, then the rest.

A switch of the kernel datapath fails over in its classifier as soon as its port map says a
port is down (``lft_map``, ``PORT_DOWN``). Who writes that bit decides how long frames go on
into a dead cable. The agent host's trio thread serves every agent of the fabric (SMPs,
traps, timers) and shares its process's GIL with whatever else runs there, so a carrier
event waiting in its netlink socket waited for all of that: 4-5 ms from the cut on k=4 under
a stream, of which the map write itself is ~50 us.

``CarrierThread`` reads the link notifications of every namespace (``linkevents``: one
RTM_NEWLINK socket per namespace, RTMGRP_LINK) from one thread that blocks in ``epoll_wait``
(the GIL released). On a carrier change it calls ``act`` at once, in this thread (the agent
host's: one ``bpf(BPF_MAP_UPDATE_ELEM)`` into the switch's port map, ``LftProgram.set_port_up``),
and only then hands the change over (``hand_over``: the agent host's trio loop, through
``TrioToken.run_sync_soon``), which does everything else: the log, the agent (its trap 128),
the kernel SMA's port state, the listeners. Each ``CarrierChange`` carries the stamps of its
steps: seen (the notification read), written (``act`` returned).

The thread keeps the carrier it last saw per (namespace key, ifindex), seeded by the caller
with the state it read at start, and passes on changes only (a namespace's RTM_NEWLINK
stream also carries flag and statistics updates). It leaves its CPU placement to ``cpus``
(the agent host's thread is pinned to one CPU: a thread it starts would inherit that CPU
and wait behind it).

Deviation from a switch ASIC: the kernel learns of the carrier loss at once (``veth_close``
calls ``netif_carrier_off`` on both ends), but the notification of the far end goes through
the kernel's linkwatch work (``linkwatch_do_dev``: ``dev_deactivate``, an RCU grace period,
then RTM_NEWLINK), and this thread needs the GIL once it has it: what is measured is that
path, not a line card's interrupt. (The two ends of a cable get different interface indexes
for linkwatch to treat the change as urgent: ``links.create_cables``.)

Early far-end writes: when one end of a veth is set down (a cut, a switch powered off),
``veth_close`` takes both ends' carrier down at once, but only the near end's notification
is sent at once; the far end's waits for the kernel's linkwatch work, which deactivates each
device with an RCU grace period of its own, one after the other (a k=4 spine's 4 far ends
were told 0.9-3.4 ms after the request). With ``peers`` (each end's other end) the thread
writes the far end's state on the near end's notification (an admin-down end without
carrier): the kernel already has the far end down, the map learns it a linkwatch run early.
The far end's own notification is handed over as usual (its ``t_written_ns`` the early
write's); should the near end come back first, the far end's map entry goes back to the
state last heard of it (linkwatch may coalesce a down and an up into no notification).

Loss of signal (``signal_lost``): a cable pulled, or a switch powered off, by ibemu's own fault
injector (``AgentHost.set_ports``). The kernel takes both ends' carrier down inside the netlink
request that sets an end down (``veth_close``), but says so only after its linkwatch work, an
RCU grace period per device: 0.2-81 ms on this machine, longest when it is *quiet* (an idle
machine ends a grace period later); a request for several devices closes them one after the
other, a grace period each. A switch's PHY sees loss of signal within microseconds and its
firmware acts on it then, so the injector, which knows the instant it cuts, reports the ends it
cuts to this object first: ``signal_lost`` writes their port maps (``act``), records them down
and hands the changes over as a notification would, from the caller's thread (under the lock
the thread takes per notification). The kernel's own notifications that follow change nothing
(the state is already down). Carrier changes no injector made (an ``ip link set ... down`` by
hand, a peer namespace deleted) go the notification path as before.

Stopping: ``close()`` wakes the thread through an eventfd in its epoll set and joins it; the
thread also ends when ``hand_over`` raises (the loop it hands to is gone). The monitor
sockets stay the caller's.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import socket
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ibemu import clock
from ibemu.kernel.linkevents import LinkEvent, parse

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

RECV_BYTES = 1 << 16
JOIN_TIMEOUT_S = 5.0
MSG_DONTWAIT = 0x40
RT_PRIORITY = 1
"""The thread's SCHED_FIFO priority (the lowest): woken by a notification it runs before the
fabric's other threads and processes, as a line card's link interrupt would."""

_libc_held = ctypes.PyDLL(None, use_errno=True)
"""``recv`` without releasing the GIL: the thread has just waited for it after ``epoll_wait``;
a socket read that released it again would queue for it a second time."""
_libc_held.recv.restype = ctypes.c_ssize_t
_libc_held.recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _recv(fd: int, buf: ctypes.Array[ctypes.c_char]) -> bytes | None:
    """One datagram from ``fd`` without blocking and with the GIL kept; None: nothing there."""
    n = _libc_held.recv(fd, buf, len(buf), MSG_DONTWAIT)
    if n < 0:
        err = ctypes.get_errno()
        if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
            return None
        raise OSError(err, os.strerror(err))
    return ctypes.string_at(buf, n)


@dataclass(frozen=True, slots=True)
class CarrierChange(Generic[K]):
    """One carrier change of one interface, with the stamps of the thread's steps
    (``clock.now_ns()``)."""

    key: K
    """The namespace's key (the caller's: the agent host's node name)."""
    ifindex: int
    carrier: bool
    t_seen_ns: int
    """The notification read from the netlink socket."""
    t_written_ns: int
    """``act`` returned (the kernel has the port's state); 0 when ``act`` wrote nothing."""


Act = Callable[[K, LinkEvent], bool]
"""Called in the carrier thread on a change: True when it wrote something (then
``t_written_ns`` is stamped). Must be safe to call off the caller's loop."""
HandOver = Callable[[list[CarrierChange[K]]], None]
"""Called in the carrier thread with the changes of one wake-up, after ``act``; raising
``Stop`` ends the thread quietly (the receiving loop is gone), anything else with a log."""


class Stop(Exception):
    """Raised by a ``HandOver`` whose receiver is gone: the thread ends."""


class CarrierThread(Generic[K]):
    """The carrier thread (module docstring) over ``monitors`` (key -> netlink socket,
    non-blocking, ``linkevents.open_link_monitor``)."""

    def __init__(self, monitors: Mapping[K, socket.socket], carrier: Mapping[tuple[K, int], bool], *,
                 act: Act[K], hand_over: HandOver[K], peers: Mapping[tuple[K, int], tuple[K, int]] | None = None,
                 cpus: set[int] | frozenset[int] | None = None, realtime: bool = True,
                 name: str = "ibemu-carrier") -> None:
        """``carrier``: (key, ifindex) -> the carrier as the caller read it at start (an
        interface missing is taken as down the first time it is seen). ``peers``: (key,
        ifindex) -> the other end of its veth (``Early far-end writes`` in the module
        docstring). ``realtime``: the thread asks for SCHED_FIFO (``RT_PRIORITY``; refused:
        it keeps its policy, said at debug level)."""
        self._monitors = dict(monitors)
        self._carrier: dict[tuple[K, int], bool] = dict(carrier)
        self._peers = dict(peers or {})
        self._early: dict[tuple[K, int], int] = {}
        """Far ends written down on their near end's notification, not yet on their own: when."""
        self._act = act
        self._hand_over = hand_over
        self._cpus = set(cpus) if cpus else None
        self._realtime = realtime
        self._buf = ctypes.create_string_buffer(RECV_BYTES)
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ep = select.epoll()
        self._by_fd: dict[int, tuple[K, socket.socket]] = {}
        self.changes = 0
        """Carrier changes handed over so far."""
        self.errors = 0
        """``act`` calls that raised (logged; the change is handed over all the same)."""
        try:
            self._ep.register(self._wake, select.EPOLLIN)
            for key, sock in self._monitors.items():
                self._by_fd[sock.fileno()] = (key, sock)
                self._ep.register(sock.fileno(), select.EPOLLIN)
        except BaseException:
            self._ep.close()
            os.close(self._wake)
            raise
        self._lock = threading.Lock()
        """Held per notification parsed and by ``signal_lost``: one writer of ``_carrier``."""
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and release its epoll set and eventfd (idempotent)."""
        if self._wake < 0:
            return
        self._stop = True
        os.eventfd_write(self._wake, 1)
        if self._thread.ident is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():  # never seen: it blocks in epoll_wait only
                log.error("the carrier thread did not stop within %.0f s", JOIN_TIMEOUT_S)
                return
        self._ep.close()
        os.close(self._wake)
        self._wake = -1

    def __enter__(self) -> CarrierThread[K]:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        if self._cpus:
            try:
                os.sched_setaffinity(0, self._cpus)  # 0: this thread
            except OSError as exc:
                log.debug("carrier thread: CPUs %s refused: %s", sorted(self._cpus), exc)
        if self._realtime:
            try:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))  # 0: this thread
            except OSError as exc:
                log.debug("carrier thread: SCHED_FIFO refused: %s", exc)
        try:
            while not self._stop:
                try:
                    ready = self._ep.poll()
                except InterruptedError:
                    continue
                if self._stop:
                    return
                out: list[CarrierChange[K]] = []
                for fd, _mask in ready:
                    entry = self._by_fd.get(fd)
                    if entry is not None:
                        self._drain(entry[0], entry[1], out)
                if out:
                    self.changes += len(out)
                    self._hand_over(out)
        except Stop:
            log.debug("carrier thread: the receiver is gone")
        except Exception:  # the loop it hands to is gone (or a bug): the thread ends, said
            if not self._stop:
                log.exception("the carrier thread stopped")

    def _drain(self, key: K, sock: socket.socket, out: list[CarrierChange[K]]) -> None:
        fd = sock.fileno()
        while True:
            try:
                data = _recv(fd, self._buf)
            except OSError as exc:  # ENOBUFS: notifications were lost; the next ones tell
                log.warning("carrier thread: %s: %s", key, exc)
                return
            if data is None:
                return
            t_seen = clock.now_ns()
            with self._lock:
                self._parsed(key, data, t_seen, out)

    def _parsed(self, key: K, data: bytes, t_seen: int, out: list[CarrierChange[K]]) -> None:
        """The carrier changes of one netlink datagram (under ``_lock``)."""
        for ev in parse(data):
            end = (key, ev.ifindex)
            if self._carrier.get(end) == ev.carrier:
                continue
            self._carrier[end] = ev.carrier
            t_written = self._call(key, ev)
            early = self._early.pop(end, 0)
            if early and not ev.carrier:  # the kernel has had it since the near end's notification
                t_written = early
            out.append(CarrierChange(key, ev.ifindex, ev.carrier, t_seen, t_written))
            peer = self._peers.get(end)
            if peer is None:
                continue
            if not ev.carrier and not ev.admin_up and self._carrier.get(peer) and peer not in self._early:
                # this end was set down: veth_close took the far end's carrier too
                t = self._call(peer[0], LinkEvent(peer[1], True, False))
                if t:
                    self._early[peer] = t
            elif ev.carrier and peer in self._early:  # back before the far end's own word came:
                del self._early[peer]  # its state as last heard (linkwatch may send nothing)
                self._call(peer[0], LinkEvent(peer[1], True, bool(self._carrier.get(peer))))

    # ------------------------------------------------------------------ loss of signal

    def signal_lost(self, ends: Iterable[tuple[K, int]]) -> list[CarrierChange[K]]:
        """Ends (key, ifindex) whose cable was just cut (``Loss of signal`` in the module
        docstring), from the injector's thread: those up as last known are written (``act``),
        recorded down and handed over, stamped seen when this call took them. Returns those
        changes (ends already down or unknown are left out)."""
        out: list[CarrierChange[K]] = []
        with self._lock:
            for end in ends:
                if not self._carrier.get(end):
                    continue
                t_seen = clock.now_ns()
                self._carrier[end] = False
                self._early.pop(end, None)
                t_written = self._call(end[0], LinkEvent(end[1], True, False))
                out.append(CarrierChange(end[0], end[1], False, t_seen, t_written))
        if out:
            self.changes += len(out)
            try:
                self._hand_over(out)
            except Stop:  # the receiving loop is gone: nothing to tell
                log.debug("carrier: loss of signal with no receiver")
        return out

    def _call(self, key: K, ev: LinkEvent) -> int:
        """``act``; when it wrote, the stamp (else 0)."""
        try:
            if self._act(key, ev):
                return clock.now_ns()
        except Exception:
            self.errors += 1
            log.exception("carrier thread: %s ifindex %d: acting on the change failed", key, ev.ifindex)
        return 0
