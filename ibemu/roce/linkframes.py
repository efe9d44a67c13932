"""The RoCE user datapath's frames into the link model and out of it, one loop per batch, compiled.

``RoceLinks.submit``'s per-frame work (a :class:`~ibemu.physics.model.Frame` from the frame's
bytes, then ``LivePlane.arrive``) and ``RoceLinks._hand_over``'s (each departure touched, counted
and handed to the next router in memory, or kept for the veth: :func:`hand_over`, with
:func:`outgoing`'s loss, CE mark and counters inline) as functions of their own, so that they
are compiled with the model (``ibemu.native``: one mypyc group, so the call into ``arrive`` is
a C call and the loops run no bytecode), as the IB user datapath's ``fabric.linkframes`` are;
the per-port, per-priority counters (:class:`PrioCounters`) are native objects here, found
once per port and call (a list by priority), not by ``(router, port, priority)`` per frame.
``RoceLinks`` itself stays interpreted (its base class, the IO shared with IB, is). Without the
compiled twins this runs as it reads.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from ibemu.kernel.linkio import cable_way
from ibemu.physics.live import Departure, LivePlane
from ibemu.physics.model import Frame
from ibemu.roce.queues import ip_checksum

FCS: Final = 4
"""The Ethernet FCS, which the veth does not carry and the cable does."""
MIN_FRAME: Final = 64


def match_key(frame: bytes | bytearray) -> bytes:
    """What identifies a RoCE frame on a cable at both ends: IP ID, addresses, UDP header and
    BTH (``frame`` with its Ethernet header); what a router rewrites is left out."""
    return bytes(frame[18:20]) + bytes(frame[26:54])


def hand_in(plane: LivePlane, router: str, in_port: int, out: dict[int, list[bytes | bytearray]], now: int,
            prio: bytes) -> None:
    """Every frame of ``out`` (egress port -> rewritten frames), received on
    ``router:in_port``, into ``plane`` at ``now``. A frame's model size is its bytes plus the
    FCS (at least 64), its priority ``prio[TOS]``, ECN-capable for ECT(0) and ECT(1), its key on
    the cable :func:`match_key`, its ``meta`` the frame itself."""
    for egress, frames in out.items():
        for f in frames:
            h = bytes(f[:54])  # (one copy of the headers read: a ``bytes`` index and slice are C's)
            tos = h[15]
            ecn = tos & 3
            n = len(f) + FCS
            fr = Frame(n if n > MIN_FRAME else MIN_FRAME, prio[tos], egress, h[18:20] + h[26:54],
                       ecn == 1 or ecn == 2, False, False, f)
            plane.arrive(router, in_port, fr, now)


PRIOS: Final = 8
"""Priorities per port (PFC's eight): a port's counters are a list indexed by priority."""


class PrioCounters:
    """One router port's counters of one priority (``RoceLinks.counts``)."""

    tx_frames: int
    dropped: int
    ecn_marked: int
    lost: int
    pause_sent: int
    pause_received: int
    paused_ns: int
    paused_since: int | None

    def __init__(self) -> None:
        # (written out, not a dataclass: compiled, its fields are C slots the departures'
        # loop adds to directly)
        self.tx_frames = self.dropped = self.ecn_marked = self.lost = 0
        self.pause_sent = self.pause_received = self.paused_ns = 0
        self.paused_since = None

    def as_dict(self, now: int) -> dict[str, int]:
        since = self.paused_since
        paused = self.paused_ns + (max(0, now - since) if since is not None else 0)
        d = {"tx_frames": self.tx_frames, "dropped": self.dropped, "ecn_marked": self.ecn_marked, "lost": self.lost,
             "pause_sent": self.pause_sent, "pause_received": self.pause_received, "paused_us": paused // 1000}
        return {k: v for k, v in d.items() if v}


def port_counts(counts: dict[tuple[str, int, int], PrioCounters], router: str, port: int) -> list[PrioCounters]:
    """The counters of ``router:port``'s priorities, indexed by priority (those of ``counts``,
    made there where missing: all-zero ones show nowhere)."""
    out: list[PrioCounters] = []
    for prio in range(PRIOS):
        key = (router, port, prio)
        c = counts.get(key)
        if c is None:
            c = counts[key] = PrioCounters()
        out.append(c)
    return out


def mark_ce(f: bytearray, c: PrioCounters) -> None:
    """A departure the model marked CE: CE in its IP header (if ECN-capable), checksum fixed."""
    if f[15] & 3 in (1, 2):
        f[15] |= 3
        ip_checksum(f)
        c.ecn_marked += 1


def outgoing(d: Departure, cs: list[PrioCounters], down: bool, loss: float, rng: random.Random,
             plane: LivePlane) -> bytes | bytearray | None:
    """``RoceLinks.outgoing``: the bytes to send for ``d`` (None: dropped, its port ``down``,
    or lost on the cable: ``loss`` of the frames, by ``rng``; a lost frame's record at the
    peer router goes at once); ``cs``: its port's counters by priority (``port_counts``)."""
    fr = d.frame
    c = cs[fr.vl]
    if down:
        c.dropped += 1
        return None
    if loss > 0.0 and rng.random() < loss:
        c.lost += 1
        peer = plane.peer(d.switch, d.port)
        if peer is not None and plane.nodes[peer[0]].switch:
            plane.consume(peer[0], peer[1], fr.flow, d.due_ns)
        return None
    f = fr.meta
    if fr.ce:
        mark_ce(f, c)
    c.tx_frames += 1
    data: bytes | bytearray = f
    return data


class _Way:
    """Where a port's departures go within one ``hand_over`` call."""

    def __init__(self, kind: int, frames: list[bytes | bytearray] | None = None,
                 cs: list[PrioCounters] | None = None, peer: tuple[str, int] = ("", 0)) -> None:
        self.kind = kind
        """VETH, OFF or HAND."""
        self.frames: list[bytes | bytearray] = frames if frames is not None else []
        self.cs: list[PrioCounters] = cs if cs is not None else []
        self.peer = peer


VETH: Final = 0
OFF: Final = 1
HAND: Final = 2


def hand_over(due: list[Departure], peers: dict[tuple[str, int], tuple[str, int]],
              local: dict[tuple[str, int], list[bytes | bytearray]], captured: set[tuple[str, int]],
              carrier: Callable[[str, int], bool], powered: Callable[[str], bool],
              counts: Callable[[str, int], list[PrioCounters]], loss: float, rng: random.Random,
              plane: LivePlane) -> tuple[list[Departure], int]:
    """``RoceLinks._hand_over`` (``LiveLinks._hand_over`` with :func:`outgoing` inline): each
    departure of ``due`` onto a cable between two routers of the plane (``peers``) whose
    carrier is up at both ends and that no capture listens on (``captured``) is touched as
    :func:`outgoing` does (its port is up: its carrier was just seen) and goes into ``local``
    (the peer router port -> frames, the ``bytearray`` as it is), or nowhere when it is lost
    or its router is off (``powered``); the others come back, for the veth. ``counts(router,
    port)``: the port's counters by priority. Also: how many were handed over."""
    rest: list[Departure] = []
    handed = 0
    ways: dict[tuple[str, int], _Way] = {}
    for d in due:
        end = (d.switch, d.port)
        way = ways.get(end)
        if way is None:
            to = cable_way(end, peers, captured, carrier, powered)
            if isinstance(to, bool):
                way = _Way(VETH if to else OFF)
            else:
                frames = local.get(to)
                if frames is None:
                    frames = local[to] = []
                way = _Way(HAND, frames, counts(d.switch, d.port), to)
            ways[end] = way
        kind = way.kind
        if kind == VETH:
            rest.append(d)
        elif kind == HAND:
            fr = d.frame
            c = way.cs[fr.vl]
            if loss > 0.0 and rng.random() < loss:
                c.lost += 1
                plane.consume(way.peer[0], way.peer[1], fr.flow, d.due_ns)
                continue
            f = fr.meta
            if fr.ce:
                mark_ce(f, c)
            c.tx_frames += 1
            way.frames.append(f)
            handed += 1
    return rest, handed


def veth_groups(due: list[Departure], counts: Callable[[str, int], list[PrioCounters]],
                down: Callable[[str, int], bool], loss: float, rng: random.Random,
                plane: LivePlane) -> dict[tuple[str, int], list[bytes | bytearray]]:
    """``RoceLinks._veth_groups``: the bytes to send of each departure of ``due`` (each as
    :func:`outgoing` makes them; a port's counters and whether it is ``down`` found once per
    call), grouped by port in the order the ports first come."""
    groups: dict[tuple[str, int], list[bytes | bytearray]] = {}
    ways: dict[tuple[str, int], _Way] = {}
    for d in due:
        end = (d.switch, d.port)
        way = ways.get(end)
        if way is None:
            way = ways[end] = _Way(OFF if down(d.switch, d.port) else VETH, None, counts(d.switch, d.port))
        data = outgoing(d, way.cs, way.kind == OFF, loss, rng, plane)
        if data is not None:
            frames = groups.get(end)
            if frames is None:
                groups[end] = [data]
            else:
                frames.append(data)
    return groups
