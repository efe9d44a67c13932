"""The IO side of the live link model, shared by both user datapaths.

``ibemu.physics.live.LivePlane`` (sans-IO) says which frame leaves which switch port when, on
the emulated clock. :class:`LiveLinks` carries that out: the departures due at a wake-up go
out at once through a ``TxBatcher`` (grouped per port, in due order), one timerfd is armed for
the plane's next deadline (``clock.to_real_ns``: at dilation N an emulated interval lasts N
times as long), and a wake-up serves every frame due by then: no frame has a timer of its own.
``report_links`` turns the plane's per-port :class:`~ibemu.physics.live.LinkStats` into
``link_fidelity`` records (:func:`link_record`) written to the run's lag log, where
``ibemu.scenario.fidelity`` judges the links with the processes; they carry the frames each
port's socket dropped because the datapath did not read them in time (``PACKET_STATISTICS``).

The IB user datapath (``ibemu.fabric.linkplane``: the agent host's switches) and the RoCE user
datapath (``ibemu.roce.links``: the routers of ``ibemu.roce.userpath``) each add what is theirs:
how a received frame becomes a model frame, and, per kind, credits and PMA counters, or pause
frames, ECN marks and cable loss. A datapath whose departures need a last touch (the RoCE CE
mark, a lost frame) overrides :meth:`LiveLinks.outgoing` (and, to compile those loops,
``_send`` and ``_veth_groups``).

Hand-over in memory (both datapaths): every switch or router lives in the one process, so a
frame onto a cable between two of them goes to the other one's forwarding (``deliver``, as if
read on its socket; with the Ethernet header the veth would carry, ``heads``) instead of through
the veth: a kernel send and receive fewer per hop, and no frame lost in a full socket buffer
(whose model record would only go when it expires, 1 s later). What is due for switches is
collected while a batch is forwarded and handed over after it (:meth:`LiveLinks.drain`, from
the timer's wake-up, the end of the datapath's wake-up, or a pump outside a batch), one
switch's batch at a time, so no switch's forwarding is entered inside another's. A cable keeps
its veth while either end has no carrier as the datapath last saw it (a cut: the kernel drops
what is sent on it; the carrier event comes within a millisecond of the cut, and frames handed
over in between are not lost as on the veth) and while a capture listens on either end: an
ETH_P_ALL packet socket on the port's device beyond the datapath's own ones there
(``own_taps``), or on every device of its namespace (``tcpdump``, ``ibemu run --capture``),
looked for every :data:`CAPTURE_CHECK_S` (``kernel.ring.packet_tap_counts``); a capture
started sees the cable's frames from its next check on. Deviation: the veths between switches
carry no data frames (their kernel counters, ``ip -s link``, show only what else is sent on
them: SMPs, PFC frames), and nothing of the hand-over is timed: the model's times are what the
frames get either way.

This lives in ``ibemu.kernel`` because it is what stands between the pure model and the
sockets (timerfd, sendmmsg), below both datapaths' packages (fabric and roce may not import
each other).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import trio

from ibemu import clock, lagmon
from ibemu.events import Kind, append_all
from ibemu.kernel.packet import take_drops
from ibemu.kernel.ring import TxBatcher, packet_tap_counts
from ibemu.kernel.timerfd import TimerFd
from ibemu.physics.live import Departure, LinkStats, LivePlane
from ibemu.physics.model import Node

log = logging.getLogger(__name__)

REPORT_CHUNK = 16
"""Ports per piece of a link report (``LiveLinks.report_parts``)."""
CAPTURE_CHECK_S = 0.2
"""How often (real seconds) the switch ports' namespaces are looked at for captures."""


def cable_way(end: tuple[str, int], peers: Mapping[tuple[str, int], tuple[str, int]],
              captured: set[tuple[str, int]], carrier: Callable[[str, int], bool],
              powered: Callable[[str], bool]) -> tuple[str, int] | bool:
    """Where the frames a switch sends on its port ``end`` go in a hand-over (``LiveLinks``):
    the far end (switch, port) to hand them to in memory, for a cable between two switches of
    the plane (``peers``) with carrier at both ends and no capture on it (``captured``); True:
    onto the veth (such a cable it is not); False: nowhere (the sending switch is off)."""
    peer = peers.get(end)
    if peer is None or end in captured or not carrier(end[0], end[1]) or not carrier(peer[0], peer[1]):
        return True
    return peer if powered(end[0]) else False


class LiveLinks:
    """Every switch of a fabric in the link model, and the IO that carries it out.

    ``sockets(switch, port)``: the port's packet socket (None: not open); ``heads(switch,
    port)``: the Ethernet header to put on its frames (``b""``: leave them as they are);
    ``powered(switch)``: False drops what it would send.

    The hand-over in memory between two switches of the plane (module docstring) needs all
    three of: ``deliver(switch, port, frames)``, the datapath's reading of ``frames`` (with
    their Ethernet headers) on ``switch:port``; ``carrier(switch, port)``, the port's carrier
    as the datapath last saw it; ``where(switch, port)``, the port's namespace and device (for
    captures on it). ``own_taps``: the ETH_P_ALL sockets the datapath itself has on each
    port's device (not captures)."""

    def __init__(self, nodes: Mapping[str, Node], *, sockets: Callable[[str, int], socket.socket | None],
                 heads: Callable[[str, int], bytes] | None = None,
                 powered: Callable[[str], bool] | None = None, tie_seed: int | None = None,
                 deliver: Callable[[str, int, list[Any]], None] | None = None,
                 carrier: Callable[[str, int], bool] | None = None,
                 where: Callable[[str, int], tuple[str | None, str]] | None = None,
                 own_taps: int = 0) -> None:
        self.plane = LivePlane(nodes, tie_seed=tie_seed)
        self._sockets = sockets
        self._heads = heads or (lambda s, p: b"")
        self._powered = powered or (lambda s: True)
        self.tx: TxBatcher | None = None
        self.timer = TimerFd()
        self._armed: int | None = None
        self._since_ns = clock.now_ns()
        self.sent = 0
        self.lag_log = lagmon.log_path()
        self._deliver = deliver if carrier is not None and where is not None else None
        self._carrier = carrier or (lambda s, p: False)
        self._where = where
        self._own_taps = own_taps
        self.peers: dict[tuple[str, int], tuple[str, int]] = {
            (name, num): p.peer for name, node in nodes.items() if node.switch
            for num, p in node.ports.items() if p.peer is not None and p.peer[0] in nodes
            and nodes[p.peer[0]].switch}
        """Switch port -> the switch port at the other end of its cable (both in the plane)."""
        self.captured: set[tuple[str, int]] = set()
        """Switch ports a capture listens on (``kernel.ring.packet_tap_counts``): their
        cables' frames cross the veth (so the capture sees them), in both directions."""
        self.handed = 0
        """Frames handed over in memory."""
        self._local: dict[tuple[str, int], list[Any]] = {}
        self._depth = 0
        self._draining = False
        self._held: list[Departure] = []
        """Departures for the veths while a drain goes on (sent together at its end)."""
        if self._deliver is not None:
            self.check_captures()

    # --- departures -----------------------------------------------------------------------

    def pump(self) -> None:
        """Send every frame due now; arm the timer for the next deadline. Then, outside a
        batch of the datapath's (:meth:`batch`), the frames due for a switch of the plane go to
        it (:meth:`drain`); inside one, the timer is armed to fire at once, so they go as soon
        as the batch is done (a switch's forwarding is not entered again while it forwards)."""
        now = clock.now_ns()
        if self._draining:  # within drain: the timer is armed once it is done
            due = self.plane.run(now)
            if due:
                self._send(due)
            self.after_pump(now)
            return
        due = self.plane.run(now)
        if due:
            self._send(due)
        self.after_pump(now)
        if self._local:
            if self._depth:
                if self._armed != -1:
                    self.timer.arm(1)  # (an instant long past: at once)
                    self._armed = -1
            else:
                self.drain()
            return
        self._arm()

    def _arm(self) -> None:
        nxt = self.plane.next_deadline()
        if nxt != self._armed:
            self._armed = nxt
            if nxt is None:
                self.timer.disarm()
            else:
                self.timer.arm(clock.to_real_ns(nxt))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """A datapath's forwarding of one batch (or of every port served at a wake-up):
        pumps inside it leave the hand-over for its end, where it is drained (the timer is
        armed to do it at once if an exception ends the batch)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and self._local and not self._draining:
            self.drain()

    def after_pump(self, now: int) -> None:
        """What a datapath does after each pump (the RoCE one: its pause frames)."""

    def outgoing(self, d: Departure) -> bytes | bytearray | None:
        """The bytes to send for departure ``d`` (None: none, e.g. lost on the cable)."""
        meta: bytes | bytearray | None = d.frame.meta
        return meta

    def _send(self, due: list[Departure]) -> None:
        """The frames of ``due`` onto their cables: those :meth:`_hand_over` takes go to the
        other switch in memory; the rest to the sending thread (:meth:`_send_veth`), at the
        end of a drain if one goes on."""
        if self._deliver is None or self.tx is None:
            self._send_veth(due)
            return
        rest, handed = self._hand_over(due)
        self.sent += handed
        if rest:
            if self._draining:  # sent once the drain is done: one hand-over to the sending thread
                self._held += rest
            else:
                self._send_veth(rest)

    def _hand_over(self, due: list[Departure]) -> tuple[list[Departure], int]:
        """A frame onto a cable between two switches of the plane whose carrier is up at both
        ends and that no capture listens on goes into ``_local`` for the other switch, as
        :meth:`outgoing` makes it, with the Ethernet header the veth would carry; a frame of a
        switch that is off goes nowhere (each port's way: :func:`cable_way`). Returns the
        departures left for the veths and how many were handed over. Each datapath has its
        compiled loop (``fabric.linkframes.hand_over``, ``roce.linkframes.hand_over``)."""
        raise NotImplementedError

    def _veth_groups(self, due: list[Departure]) -> dict[tuple[str, int], list[bytes | bytearray]]:
        """What to send of each departure of ``due`` (:meth:`outgoing`), grouped by port."""
        groups: dict[tuple[str, int], list[bytes | bytearray]] = {}
        for d in due:
            data = self.outgoing(d)
            if data is not None:
                groups.setdefault((d.switch, d.port), []).append(data)
        return groups

    def _send_veth(self, due: list[Departure]) -> None:
        tx = self.tx
        if tx is None:
            return
        groups = self._veth_groups(due)
        out = []
        for (switch, port), frames in groups.items():
            sock = self._sockets(switch, port)
            if sock is None or not self._powered(switch):
                continue
            self.sent += len(frames)
            out.append((sock, frames, switch, self._heads(switch, port)))
        tx.send_groups(out)  # every port's frames due now in one hand-over to the sending thread

    def drain(self) -> None:
        """Hand the frames due for switches of the plane to them, in order per port, until
        none is left (what they forward onwards comes back here); what is due for the veths
        meanwhile (towards hosts, captured cables) goes to the sending thread at the end, in
        one hand-over (one per pump cost a thread switch each)."""
        self._draining = True
        try:
            while self._local:
                groups, self._local = self._local, {}
                for (switch, port), frames in groups.items():
                    self.handed += len(frames)
                    if self._deliver is not None:
                        self._deliver(switch, port, frames)
        finally:
            self._draining = False
        if self._held:
            held, self._held = self._held, []
            self._send_veth(held)
        self._armed = None  # armed afresh: a pump inside may have armed it for at once
        self._arm()

    def check_captures(self) -> None:
        """Which switch ports a capture listens on (an ETH_P_ALL socket on the port's device
        beyond the datapath's own, or on every device of its namespace): both ends of such a
        cable send on the veth."""
        if self._where is None:
            return
        taps: dict[str | None, dict[str, int]] = {}
        captured = set()
        for end, peer in self.peers.items():
            for sw, port in (end, peer):
                ns, ifname = self._where(sw, port)
                if ns not in taps:
                    taps[ns] = packet_tap_counts(ns)
                t = taps[ns]
                if t and (t.get("", 0) or t.get(ifname, 0) > self._own_taps):
                    captured.add(end)
        if captured != self.captured:
            log.info("cables handed over through their veth (captured): %s",
                     ", ".join(f"{s}:{p}" for s, p in sorted(captured)) or "none")
        self.captured = captured

    async def serve(self) -> None:
        """Wake at each deadline the timer was armed for and pump."""
        fd = self.timer.fd
        while True:
            await trio.lowlevel.wait_readable(fd)
            self.timer.clear()
            self._armed = None
            self.pump()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # outside trio nothing can be waiting on it
            trio.lowlevel.notify_closing(self.timer.fd)  # a task waiting on it wakes with an error
        self.timer.close()

    # --- fidelity -------------------------------------------------------------------------

    def report_links(self, *, final: bool = False) -> list[dict[str, Any]]:
        """The ``link_fidelity`` records of the interval since the last call (written to the
        lag log when there is one): per switch port that sent frames or whose socket dropped
        some it was sent (the kernel's count: the datapath did not read them in time)."""
        return [rec for part in self.report_parts(final=final) for rec in part()]

    def report_parts(self, *, final: bool = False, chunk: int = REPORT_CHUNK) -> list[Callable[[], list[dict[str, Any]]]]:
        """``report_links`` in pieces, for a caller that yields its loop between them: the
        interval ends now (the stats are taken at once), and each piece reads the socket drops,
        builds and writes the records of ``chunk`` ports. A k=4 fat-tree's report in one piece
        held the agent host's loop 2.3-3.4 ms once a second (timed by hand), one late
        wake-up a second: 1% of the lag monitor's samples, its p99."""
        stats = self.plane.take_stats()
        since, self._since_ns = self._since_ns, clock.now_ns()
        keys = sorted(set(self.plane.stats) | set(stats))
        return [lambda part=keys[i:i + chunk]: self._report(part, stats, since, final)  # type: ignore[misc]
                for i in range(0, len(keys), chunk)]

    def _report(self, keys: list[tuple[str, int]], stats: dict[tuple[str, int], LinkStats], since: int,
                final: bool) -> list[dict[str, Any]]:
        recs = []
        for key in keys:
            sock = self._sockets(*key)
            n = take_drops(sock) if sock is not None else 0
            st = stats.get(key)
            if st is None:
                if not n:
                    continue
                st = LinkStats(self.plane.stats[key].gbps)
            recs.append(link_record(f"{key[0]}:{key[1]}", st, since, final=final, rx_drops=n))
        if self.lag_log and recs:
            with contextlib.suppress(OSError):
                append_all(Path(self.lag_log), recs)
        return recs


def link_record(link: str, st: LinkStats, since_ns: int, *, final: bool = False, rx_drops: int = 0) -> dict[str, Any]:
    """The ``Kind.LINK_FIDELITY`` record of one cable direction over an interval (``rx_drops``:
    frames lost arriving at this port, its socket full)."""
    late = lagmon.LagStats()
    late.add_all(st.late_us())  # (compiled with the model)
    return {"kind": Kind.LINK_FIDELITY, "t_ns": clock.now_ns(), "since_ns": since_ns, "link": link,
            "gbps": st.gbps, "frames": st.frames, "bytes": st.bytes, "busy_model_ns": st.busy_model_ns,
            "busy_real_ns": st.busy_real_ns, "rx_drops": rx_drops, **late.summary(), "buckets": late.buckets(), "final": final}
