"""The RoCE user datapath's link physics: its routers' egress ports timed by ``ibemu.physics``.

The same model and the same live adapter as the IB user datapath (``ibemu.physics.live``,
``ibemu.kernel.linkio``), with Ethernet nodes: every router's egress port serializes at its
cable's data rate (Ethernet framing: 20 bytes of preamble, SFD and gap per frame, the FCS
counted in the frame), the cable's propagation, the switch model's latency (store and
forward), eight strict priorities, drop tail beyond the port's buffer for lossy priorities,
ECN marking, PFC per ingress port and lossless priority. A frame's model size is its bytes on
the veth plus the 4-byte FCS the veth does not carry (at least 64). The two fabric kinds
differ only where real fabrics do (framing and headers, credits against pauses and drops).

What :class:`RoceLinks` adds to ``LiveLinks``:

- :meth:`RoceLinks.submit`: the forwarding decisions of a batch into the model, each frame
  with its priority (``QueueConfig.priorities``), whether it is ECN-capable (ECT(0) or
  ECT(1)) and its match key (:func:`match_key`: the IP ID and addresses and what follows up
  to the end of the BTH; a router rewrites MACs, TTL, checksum and ECN, none of which it
  covers).
- Departures (:meth:`RoceLinks.outgoing`): a frame the model marked CE gets CE in its IP
  header (checksum fixed); a frame for a port whose carrier is down is dropped; each cable
  direction from a router loses ``loss_pct`` of its frames (seeded; the record of the frame
  the next router will not receive is settled at once).
- Pauses: every XOFF / XON the model sends is also put on the cable as a real PFC frame
  (quanta 0xFFFF / 0, from the port's MAC): a host's RoCE port honours it (its transport
  stops), a neighbour router's datapath only counts it (the model already paused that port,
  at the time the frame's propagation says). A PFC frame a host sends pauses the router's port
  towards it in the model (XOFF until XON, quanta not aged).
- The hand-over in memory between routers (``LiveLinks``): a router port's carrier is its
  link state (``down``); a departure is touched (:meth:`RoceLinks.outgoing`) before it is
  handed over as before it is sent, and handed as the ``bytearray`` it is (the next router
  rewrites it in place). Both loops over the departures, with that touch, are compiled
  (``linkframes.hand_over``, ``linkframes.veth_groups``).
- Counters per router port and priority (``tx_frames``, ``dropped``, ``ecn_marked``,
  ``lost``, ``pause_sent``, ``pause_received``, ``paused_us``), as the user datapath reports
  them.

Deviations: a host's port resumes when the quanta of an XOFF run out (0xFFFF quanta: 335 us at
100 Gb/s) and XOFF frames are not refreshed; what the host sends meanwhile waits in the
model's queue standing for its NIC (unbounded, never dropped) until the XON, so the model
stays lossless for lossless priorities either way. PFC frames themselves take no time on the
model's cable.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Mapping

from ibemu import clock
from ibemu.kernel.linkio import LiveLinks
from ibemu.physics.live import Departure
from ibemu.physics.model import Drop, Node, Pause
from ibemu.roce import linkframes
from ibemu.roce.linkframes import FCS, MIN_FRAME, PrioCounters, hand_in, match_key
from ibemu.wire import pfc

__all__ = ["FCS", "MIN_FRAME", "PrioCounters", "RoceLinks", "match_key"]


class RoceLinks(LiveLinks):
    """Every router of a RoCE fabric (and every host's port) in the link model."""

    def __init__(self, nodes: Mapping[str, Node], *, sockets: Callable[[str, int], socket.socket | None],
                 macs: Callable[[str, int], bytes], down: Callable[[str, int], bool], loss_pct: float = 0.0,
                 seed: int = 0, deliver: Callable[[str, int, list[bytearray]], None] | None = None,
                 where: Callable[[str, int], tuple[str | None, str]] | None = None) -> None:
        """``deliver(router, port, frames)`` and ``where(router, port)`` (its namespace and
        device): the hand-over in memory between routers (``LiveLinks``; a port's carrier is
        ``not down``); the routers' ports each have one ETH_P_ALL socket of the datapath's."""
        super().__init__(nodes, sockets=sockets, tie_seed=seed, deliver=deliver, where=where,
                         carrier=(lambda r, p: not down(r, p)) if deliver is not None else None, own_taps=1)
        self._macs = macs
        self._down = down
        self._loss = loss_pct / 100
        self.rng = random.Random(seed)
        self.counts: dict[tuple[str, int, int], PrioCounters] = {}
        self._port_counts: dict[tuple[str, int], list[PrioCounters]] = {}
        """A port's counters of ``counts`` by priority (``linkframes.port_counts``)."""

    def count(self, router: str, port: int, prio: int) -> PrioCounters:
        key = (router, port, prio)
        c = self.counts.get(key)
        if c is None:
            c = self.counts[key] = PrioCounters()
        return c

    def port_counts(self, router: str, port: int) -> list[PrioCounters]:
        """``router:port``'s counters (those of :attr:`counts`), indexed by priority."""
        key = (router, port)
        cs = self._port_counts.get(key)
        if cs is None:
            cs = self._port_counts[key] = linkframes.port_counts(self.counts, router, port)
        return cs

    # --- in -------------------------------------------------------------------------------

    def submit(self, router: str, in_port: int, out: dict[int, list[bytes | bytearray]], prio: bytes) -> None:
        """A batch's forwarding decisions (egress port -> rewritten frames) of ``router``,
        received on ``in_port`` (ports are the topology's numbers): into the model; then what
        is due goes. ``prio``: priority by TOS byte."""
        hand_in(self.plane, router, in_port, out, clock.now_ns(), prio)  # (compiled)
        self.pump()

    def settle(self, router: str, in_port: int, frame: bytes | bytearray) -> None:
        """A frame from a neighbour router that ``router`` did not forward: its record goes."""
        self.plane.consume(router, in_port, match_key(frame), clock.now_ns())

    def host_pause(self, router: str, port: int, quanta: Mapping[int, int]) -> None:
        """The host on ``router:port`` sent a PFC frame: pause (or resume) that port's priorities."""
        now = clock.now_ns()
        for p, q in quanta.items():
            c = self.count(router, port, p)
            c.pause_received += 1
            if q and c.paused_since is None:
                c.paused_since = now
            elif not q and c.paused_since is not None:
                c.paused_ns += now - c.paused_since
                c.paused_since = None
            self.plane.pause_port(router, port, p, bool(q), now)
        self.pump()

    # --- out ------------------------------------------------------------------------------

    def outgoing(self, d: Departure) -> bytes | bytearray | None:
        """A departure onto a veth: dropped (its port down), lost, or CE-marked and counted
        (``linkframes.outgoing``, compiled)."""
        return linkframes.outgoing(d, self.port_counts(d.switch, d.port), self._down(d.switch, d.port), self._loss,
                                   self.rng, self.plane)

    def _veth_groups(self, due: list[Departure]) -> dict[tuple[str, int], list[bytes | bytearray]]:
        """The departures onto veths (towards hosts, captured or cut cables), each as
        :meth:`outgoing` makes it, grouped by port (``linkframes.veth_groups``, compiled)."""
        return linkframes.veth_groups(due, self.port_counts, self._down, self._loss, self.rng, self.plane)

    def _hand_over(self, due: list[Departure]) -> tuple[list[Departure], int]:
        """``LiveLinks._hand_over`` with :meth:`outgoing`'s work inline, compiled
        (``linkframes.hand_over``)."""
        return linkframes.hand_over(due, self.peers, self._local, self.captured, self._carrier, self._powered,
                                    self.port_counts, self._loss, self.rng, self.plane)

    def after_pump(self, now: int) -> None:
        notes = self.plane.take_notes()
        if notes:
            self._notes(notes)

    def _notes(self, notes: list[Pause | Drop]) -> None:
        nodes = self.plane.nodes
        tx = self.tx
        for a in notes:
            if isinstance(a, Drop):
                if nodes[a.node].switch:
                    self.count(a.node, a.port, a.frame.sl).dropped += 1
                continue
            if not nodes[a.node].switch:
                continue
            self.count(a.node, a.port, a.priority).pause_sent += 1
            peer = self.plane.peer(a.node, a.port)
            if peer is not None and nodes[peer[0]].switch:
                pc = self.count(peer[0], peer[1], a.priority)
                pc.pause_received += 1
                if a.xoff and pc.paused_since is None:
                    pc.paused_since = a.at_ns
                elif not a.xoff and pc.paused_since is not None:
                    pc.paused_ns += max(0, a.at_ns - pc.paused_since)
                    pc.paused_since = None
            sock = self._sockets(a.node, a.port)
            if tx is not None and sock is not None and not self._down(a.node, a.port):
                frame = pfc.pause_frame(self._macs(a.node, a.port), {a.priority: pfc.MAX_QUANTA if a.xoff else 0})
                tx.send(sock, (frame,), a.node)

    def port_counters(self, now: int) -> dict[str, dict[int, dict[int, dict[str, int]]]]:
        """router -> port -> priority -> its nonzero counters."""
        out: dict[str, dict[int, dict[int, dict[str, int]]]] = {}
        for (router, port, prio), c in sorted(self.counts.items()):
            d = c.as_dict(now)
            if d:
                out.setdefault(router, {}).setdefault(port, {})[prio] = d
        return out
