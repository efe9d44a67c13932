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
mark, a lost frame) overrides :meth:`LiveLinks.outgoing`.

This lives in ``ibemu.kernel`` because it is what stands between the pure model and the
sockets (timerfd, sendmmsg), below both datapaths' packages (fabric and roce may not import
each other).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from ibemu import clock, lagmon
from ibemu.events import Kind, append_all
from ibemu.kernel.packet import take_drops
from ibemu.kernel.ring import TxBatcher
from ibemu.kernel.timerfd import TimerFd
from ibemu.physics.live import Departure, LinkStats, LivePlane
from ibemu.physics.model import Node

REPORT_CHUNK = 16
"""Ports per piece of a link report (``LiveLinks.report_parts``)."""


class LiveLinks:
    """Every switch of a fabric in the link model, and the IO that carries it out.

    ``sockets(switch, port)``: the port's packet socket (None: not open); ``heads(switch,
    port)``: the Ethernet header to put on its frames (``b""``: leave them as they are);
    ``powered(switch)``: False drops what it would send."""

    def __init__(self, nodes: Mapping[str, Node], *, sockets: Callable[[str, int], socket.socket | None],
                 heads: Callable[[str, int], bytes] | None = None,
                 powered: Callable[[str], bool] | None = None, tie_seed: int | None = None) -> None:
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

    # --- departures -----------------------------------------------------------------------

    def pump(self) -> None:
        """Send every frame due now; arm the timer for the next deadline."""
        now = clock.now_ns()
        due = self.plane.run(now)
        if due:
            self._send(due)
        self.after_pump(now)
        nxt = self.plane.next_deadline()
        if nxt != self._armed:
            self._armed = nxt
            if nxt is None:
                self.timer.disarm()
            else:
                self.timer.arm(clock.to_real_ns(nxt))

    def after_pump(self, now: int) -> None:
        """What a datapath does after each pump (the RoCE one: its pause frames)."""

    def outgoing(self, d: Departure) -> bytes | bytearray | None:
        """The bytes to send for departure ``d`` (None: none, e.g. lost on the cable)."""
        meta: bytes | bytearray | None = d.frame.meta
        return meta

    def _send(self, due: list[Departure]) -> None:
        tx = self.tx
        if tx is None:
            return
        groups: dict[tuple[str, int], list[bytes | bytearray]] = {}
        for d in due:
            data = self.outgoing(d)
            if data is not None:
                groups.setdefault((d.switch, d.port), []).append(data)
        out = []
        for (switch, port), frames in groups.items():
            sock = self._sockets(switch, port)
            if sock is None or not self._powered(switch):
                continue
            self.sent += len(frames)
            out.append((sock, frames, switch, self._heads(switch, port)))
        tx.send_groups(out)  # every port's frames due now in one hand-over to the sending thread

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
