"""The model driven by a live datapath: frames that really arrive go in, the times at which the
real frames must leave come out.

:mod:`ibemu.physics.sim` plays a whole fabric in pure emulated time. A live datapath cannot:
frames arrive when the hosts send them and must leave at real instants. :class:`LivePlane` is
the same event loop, sans-IO, with those two edges opened up. The caller (the IB user
datapath, ``ibemu.fabric.agenthost``) does three things, each with the emulated time ``now``:

- ``arrive(switch, in_port, frame, now)`` for every frame a switch port received, after the
  forwarder decided its egress port (``frame.dst``) and, with ``frame.meta``, the bytes to send;
- ``run(now)`` at every wake-up: every event of the model due by ``now`` is played, in time
  order, and the :class:`Departure` s due by ``now`` come back, to be sent at once;
- ``next_deadline()``: when to wake up next (one timer for the whole plane: every frame due
  at a wake-up is served by it, none gets a timer of its own).

What is modelled where (all the switches of the fabric live in this one plane):

- Switch egress ports run the model's :class:`~ibemu.physics.model.Node` s: serialization at
  the cable's data rate, propagation, switch latency, VL arbitration, credits per VL. Between
  two switches the credits are the model's own state (a :class:`~ibemu.physics.model.CreditReturn`
  is handed to the peer node in process: no flow-control packets cross the veth).
- A frame's real send time is when the model says its last bit reaches the far end of the
  cable (``Transmit.arrive_ns``: start + serialization + propagation). The veth then adds its
  own real latency, which the fidelity figures count as lateness of the next hop, not of this
  one.
- Between two switches, the real frame crosses the veth and is received (and forwarded) by the
  peer switch's forwarder for real; the plane matches it to the ``Transmit`` it recorded
  (:meth:`arrive` looks for the frame's ``key`` among the cable's frames in flight) and gives
  the peer node the model's arrival time, not the real one. Frames lost on the veth (a cable
  pulled, a full socket) leave their records behind: at most :data:`MATCH_WINDOW` are skipped
  per arrival (their credits given back), older ones expire (:meth:`expire`), and an arrival
  with no match enters at ``now`` (its sender's credits debited then, so they stay balanced).
  A frame the peer switch does not forward (its SMA takes
  it, its forwarder drops it) frees its buffer at once (:meth:`consume`).
- Host -> switch. The HCA cannot be back-pressured: there is no link-level flow-control
  protocol on the veth. The host's port is modelled at the switch's ingress instead: a frame
  received from a host enters the host node's egress queue (what stands for the HCA's send
  queue: unbounded, nothing dropped) and leaves it at the host cable's rate and only with
  credits from the switch's input buffer, as an HCA would. Deviation: the host's own transport
  is not slowed by that queue (a host offering more than the line rate builds it up; its
  transport's window bounds it).
- Switch -> host: serialization at the host cable's rate; the HCA always has credits (it
  consumes at once: ``plan.build_nodes`` wires no credit limit towards a host).
- A cable that goes down (:meth:`link_down`, from the datapath's carrier events): both of its
  ports leave LinkUp in the model (``Node.port_down``): what they had queued is discarded and
  counted (PortXmitDiscards), the input buffer it held is freed at once (credits back
  upstream), the frames on the cable and the departures not yet out are lost. Without this,
  frames queued for the dead port before the forwarders stopped choosing it kept their input
  buffer (and so their upstream VL's credits) until their records expired
  (:data:`MATCH_STALE_NS`), blocking every flow behind them (in compare-physics, the hosts'
  own queues: no traffic after the cut, a QP out of retries). :meth:`link_up` brings both ports back with the credits
  the other end's input buffer really has free. (:meth:`link_reset` only resynchronizes
  credits, for a caller that does not say which way the link went.)
- The forwarding decision is the datapath's, taken when the real frame is read, which for a
  frame from a host is before the model's HCA queue, not when the frame reaches the switch
  (where a real switch looks its LFT up). Where that matters, at a cut, a frame from a host
  whose decided egress port is down by the time it reaches the switch in the model is decided
  again (:attr:`LivePlane.redecide`, the datapath's forwarder, with the LFTs of that moment):
  once the SM has rerouted, the frames still in the HCA's queue take the new route, as they
  would on a real fabric, and draw a NAK from the destination for the ones lost at the cut
  (without this every frame of the sender's window was lost and only the RC transport's ACK
  timeout, 268 ms on the user datapath, recovered it). Frames already in a switch when its
  port goes down are discarded (above).

Ethernet (the RoCE user datapath, ``ibemu.roce.links``): the same plane with ``eth`` nodes.
No credits; an egress port's queue drops tail beyond its buffer (a lossy priority), marks ECN
and, per ingress port and lossless priority, sends XOFF / XON. A :class:`~ibemu.physics.model.Pause`
is handed to the peer node in process at its ``at_ns`` (between two switches, as credits are;
towards a host, the host node's egress queue, which stands for its NIC's send queue, stops
for that priority). Every pause and every drop is also noted (:attr:`LivePlane.notes`, taken
with :meth:`take_notes`) for the IO side: it puts real PFC frames on the cables and counts.
A frame the datapath loses on a cable (``loss_pct``) leaves its record to :meth:`consume`.

Ties: two frames from two hosts whose queues are paced alike reach a switch in the same ns;
taken in the order they were scheduled, the same sender would always win the last slot of a
drop-tail buffer (a phase effect real fabrics, with their jitter, do not show). An Ethernet
plane therefore runs events due at the same ns in a seeded random order (``tie_seed``), as the
reference simulator does; IB (lossless, credits) keeps the scheduled order.

Adaptive routing (:attr:`LivePlane.adapt`): when set, every data frame reaching a switch in
the model (from a host when it has crossed the host's cable, from a switch at its matched
arrival) is offered to the datapath's adaptive choice just before the switch takes it, with
the emulated time and :func:`egress_load` of the switch's ports, so the choice sees the
queues of that instant, as a switch's adaptive routing does on arrival; it may change
``frame.dst`` (``Forwarder.adapt``).

The fast path (``fast``, on unless ties are seeded): a frame from a neighbour switch whose
way through the switch is already over by the time the model has been played to (its matched
arrival plus the switch latency, on a live datapath microseconds in the past) and whose egress
port is idle, with nothing queued and credits for it, leaves at arrival + latency + the
serialization, due + the propagation, and that is computed at once in :meth:`arrive` (and for a
frame from a host when its ``_RECEIVE`` event is the next one due), with every counter,
credit, arbitration state, statistic and record the event loop leaves: it plays exactly what
the event loop would play next (the frame's wake-ups would be the first events of the next
:meth:`run_events`, nothing else being due by then) without pushing and popping them. Its
end on the wire (input buffer freed, credits back upstream) is played at once too when that
is in the past and the upstream port has nothing to start, else left to the event loop, as is
every frame that finds its port busy, a queue, or credits short. A frame from a host onto its
idle port with credits is put on the host's cable in closed form too (``Node.inject`` and the
dispatch of its transmission, which the event loop does at once anyway). So that "what the event loop
plays next" is the same whoever calls next, :meth:`run_events` plays what is due by the time
the model has been played to even when called with an earlier time, and :meth:`set_qos`,
:meth:`set_propagation` and :meth:`credit_loops` first play what is due. The departures are
the same, in the same order: ``tests/unit/physics/test_live_fastpath.py`` plays random traces
(light and congested; one, four and eight VLs; a cable cut; tables changed) both ways and
compares every departure and the whole state after. Between calls the state may differ from
the event loop's only in being played further: a frame the event loop leaves in a switch's
pipeline until the next call is through it already.

Fidelity: per egress port (a cable, one direction), :class:`LinkStats` counts the frames
and bytes, how late each departure really left (``now`` at the ``run`` that returned it,
less its due time) and, over back-to-back frames (a busy link), the model's time against the
real one: ``busy_ratio`` is the achieved rate over the configured rate while busy (below 1:
the link fell behind). ``take_stats`` hands them over and starts afresh.

Records, for the compiled twin (``ibemu.native``): the plane's events (:class:`_Event`) and
departures are native records its heaps order by (time, order) and (due, seq) themselves,
not tuples (whose times are objects made per entry); a cable's other end, the records of its
frames in flight (:class:`_Flight`: a list and its head, not a deque) and the statistics of
a port's sending hang on the model's port (``EgressPort.live_peer``, ``live_flight``,
``live_stats``), found once when the plane is made, not looked up by (switch, port) per
frame. ``_flight`` shows the records by (switch, port) as before.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ibemu.physics.deadlock import CreditLoop, find_credit_loops
from ibemu.physics.model import Action, CreditReturn, Drop, EgressPort, Frame, Node, Pause, Transmit
from ibemu.physics.qos import CREDIT_BYTES, VL15, Sl2Vl, VlArb, blocks

log = logging.getLogger(__name__)
heapify: Final = heapq.heapify
heappop: Final = heapq.heappop
heappush: Final = heapq.heappush
"""(Bound once: compiled, a ``Final`` is a C static, where an imported name is looked up in the
module's globals at every call, several times per frame and hop.)"""

MATCH_WINDOW: Final = 16
"""Records of frames in flight on a cable skipped at most to match an arrival (lost frames)."""
MATCH_STALE_NS: Final = 1_000_000_000
"""A record older than this (emulated ns) is dropped (its frame was lost): long, because a
datapath that falls behind the clock receives frames long after the model's arrival."""

Port = tuple[str, int]
_WAKE: Final = 0
_RECEIVE: Final = 1
_CREDIT: Final = 2
_PAUSE: Final = 3
"""What an event of the plane does: advance a node, a node receives a frame, a node gets credits."""


Record = tuple[Hashable, int, int, int]
"""A frame on a cable: (key, model arrival, VL, credits)."""


class _Flight:
    """The records of the frames on one cable, oldest first: a list and the index of its head
    (compiled: list reads and appends in C, where a deque's are method calls). The list
    drops what was taken from it when it empties, or when that is more than half of it."""

    __slots__ = ("head", "recs")

    def __init__(self) -> None:
        self.recs: list[Record] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.recs) - self.head

    def __bool__(self) -> bool:
        return len(self.recs) > self.head

    def __iter__(self) -> Iterator[Record]:
        return iter(self.recs[self.head:])

    def first(self) -> Record:
        return self.recs[self.head]

    def window(self, n: int) -> list[Record]:
        """The first ``n`` records (fewer if there are not as many)."""
        return self.recs[self.head:self.head + n]

    def append(self, rec: Record) -> None:
        self.recs.append(rec)

    def popleft(self) -> Record:
        recs = self.recs
        h = self.head
        rec = recs[h]
        h += 1
        if h == len(recs):
            recs.clear()
            h = 0
        elif h > 32 and 2 * h > len(recs):
            del recs[:h]
            h = 0
        self.head = h
        return rec

    def remove(self, i: int) -> None:
        """Take out the ``i``-th record from the head."""
        del self.recs[self.head + i]


class _Event:
    """One event of the plane: at ``t``, ``what`` (_WAKE, _RECEIVE, _CREDIT, _PAUSE) to
    ``node`` with ``a``, ``b``, ``c``; ``order`` among those due at the same ns. A record of its
    own, ordered by (t, order), not a tuple: compiled, its times are C values in it (a tuple
    holds an object made for each) and two of them compare in one native call."""

    __slots__ = ("a", "b", "c", "node", "order", "t", "what")

    def __init__(self, t: int, order: float, what: int, node: Node, a: Any, b: Any, c: Any) -> None:
        self.t = t
        self.order = order
        self.what = what
        self.node = node
        self.a = a
        self.b = b
        self.c = c

    def __lt__(self, other: _Event) -> bool:
        return self.t < other.t or (self.t == other.t and self.order < other.order)


@dataclass(slots=True, init=False)
class Departure:
    """A frame to send on ``switch:port`` now: ``frame.meta`` is its bytes. (Not frozen, to be
    treated as immutable: one is made per frame and hop; see ``model``'s actions.)"""

    switch: str
    port: int
    frame: Frame
    due_ns: int
    """When the model has its last bit at the far end (the real send time)."""
    start_ns: int
    end_ns: int
    eport: EgressPort | None = field(repr=False, compare=False)
    """The model's port it leaves (its statistics: ``EgressPort.live_stats``)."""
    seq: int = field(repr=False, compare=False)
    """Its place among the departures due at the same ns (the order they were timed in)."""

    def __init__(self, switch: str, port: int, frame: Frame, due_ns: int, start_ns: int, end_ns: int,
                 eport: EgressPort | None = None, seq: int = 0) -> None:
        self.switch, self.port, self.frame = switch, port, frame
        self.due_ns, self.start_ns, self.end_ns = due_ns, start_ns, end_ns
        self.eport = eport
        self.seq = seq

    def __lt__(self, other: Departure) -> bool:
        """(due_ns, seq): the plane's heap of departures orders them so, without a tuple each."""
        return self.due_ns < other.due_ns or (self.due_ns == other.due_ns and self.seq < other.seq)


@dataclass(slots=True)
class LinkStats:
    """One egress port's fidelity over an interval (see the module docstring)."""

    gbps: float
    frames: int = 0
    bytes: int = 0
    late_ns: list[int] = field(default_factory=list)
    """How late each departure left (>= 0), in emulated ns."""
    busy_model_ns: int = 0
    busy_real_ns: int = 0
    last_due: int = -1
    last_end: int = -1
    last_sent: int = -1
    """The last departure's due time, end on the wire and real send time (-1: none yet; ints,
    not None: compiled, an optional int is an object made per departure)."""

    def busy_ratio(self) -> float | None:
        """Achieved over configured rate while busy (None: never two frames back to back)."""
        if self.busy_model_ns <= 0:
            return None
        return self.busy_model_ns / max(self.busy_real_ns, 1)

    def late_us(self) -> list[float]:
        """``late_ns`` in microseconds (for the link's fidelity record, ``kernel.linkio``)."""
        return [ns / 1000.0 for ns in self.late_ns]

    def fresh(self) -> LinkStats:
        """An empty interval that carries on the back-to-back bookkeeping."""
        return LinkStats(self.gbps, last_due=self.last_due, last_end=self.last_end, last_sent=self.last_sent)


def _wait_unserved(p: EgressPort, frame: Frame, in_port: int, c: int, size: int, t: int) -> None:
    """A frame the egress port's VL arbitration tables never serve waits in its queue, as in
    ``Node._start`` (the fast paths' way out when the arbiter will not pick its VL)."""
    p.queues[c].append(frame, in_port)
    p.queued |= 1 << c
    p.queued_bytes[c] += size
    p.total_bytes += size
    if p.waiting_since is None:
        p.waiting_since = t
    for v in range(p.vls):
        if p.queues[v] and v not in p.blocked_since:
            p.blocked_since[v] = t
            p.counters.credit_stalls += 1


class LivePlane:
    """Every node of a fabric's model (``plan.build_nodes``), driven by live frames."""

    def __init__(self, nodes: Mapping[str, Node], *, tie_seed: int | None = None, fast: bool = True) -> None:
        """``tie_seed``: events due at the same ns run in a seeded random order (as in
        ``physics.sim``) instead of the order they were scheduled in. ``fast``: the fast
        path for frames between switches (module docstring; off: the event loop alone, the
        same departures)."""
        self.nodes: dict[str, Node] = dict(nodes)
        self._tie = random.Random(tie_seed).random if tie_seed is not None else None
        self.fast = fast and tie_seed is None
        """The fast path (not with seeded ties: it skips wake-ups, and each would draw)."""
        self.fast_hops = 0
        self.now = 0
        """The latest time the model has been played to."""
        self._events: list[_Event] = []
        """A heap of (time, order, what, node, a, b, c) (:class:`_Event`): _WAKE (node),
        _RECEIVE (node, its port, frame), _CREDIT (node, its port, VL, blocks), _PAUSE (node,
        its port, priority, XOFF); the :class:`Node` itself, not its name (no lookup per
        event). Records, not closures: several per frame and hop. ``order``: the sequence
        they were scheduled in, or a seeded random draw (``tie_seed``)."""
        self._seq = 0
        """The next sequence number (events' order without seeded ties, departures')."""
        for node in self.nodes.values():  # (its wake-up among the events, the latest time driven to)
            node.live_wake, node.live_last = -1, 0
        self._due: list[Departure] = []
        """A heap of the departures timed, by (due_ns, seq)."""
        self.stats: dict[Port, LinkStats] = {}
        self._flight_ports: dict[Port, EgressPort] = {}
        """The receiving ports with records (``EgressPort.live_flight``), in the order made."""
        self.frames_in = 0
        self.unmatched = 0
        self.drops = 0
        self.drop_reasons: dict[str, int] = {}
        self.notes: list[Pause | Drop] = []
        """Pauses sent and frames dropped since the last :meth:`take_notes` (Ethernet)."""
        self.keep_notes = any(n.kind == "eth" for n in self.nodes.values())
        self.redecide: Callable[[str, int, Frame], None] | None = None
        """The datapath's forwarding decision taken again (it may change ``frame.dst`` and
        ``frame.meta``) for a frame from a host whose decided egress port went down while
        it waited in the host's queue (see the module docstring)."""
        self.redecided = 0
        self.adapt: Callable[[str, int, Frame, int], None] | None = None
        """Adaptive routing (module docstring): ``adapt(switch, in_port, frame, now)`` may
        change ``frame.dst`` to another port of the frame's group."""
        for node in self.nodes.values():
            for num, p in node.ports.items():
                # the cable's other end, the frames on it and the port's statistics, on the
                # port itself (no lookup per frame by name and number)
                peer = p.peer
                pnode = self.nodes.get(peer[0]) if peer is not None else None
                p.live_peer_node = pnode
                p.live_peer = pnode.ports.get(peer[1]) if pnode is not None and peer is not None else None
                p.live_flight = None
                p.live_key = (node.name, num)
                if node.switch:
                    p.live_stats = self.stats[(node.name, num)] = LinkStats(p.link.gbps)

    @property
    def _flight(self) -> dict[Port, list[Record]]:
        """(switch, port) receiving: (key, model arrival, VL, credits) of the frames on the
        cable to it (a view: the records live on the receiving port, ``EgressPort.live_flight``),
        in the order the cables first had one."""
        return {k: list(p.live_flight) for k, p in self._flight_ports.items() if p.live_flight is not None}

    def _new_flight(self, rx: EgressPort) -> _Flight:
        """The records of the cable into ``rx``, made (it had none)."""
        q = _Flight()
        rx.live_flight = q
        self._flight_ports[rx.live_key] = rx
        return q

    def _drop_flight(self, key: Port) -> None:
        """Forget the records of the cable into ``key`` (``dict.pop`` of the view)."""
        rx = self._flight_ports.pop(key, None)
        if rx is not None:
            rx.live_flight = None

    # --- input ----------------------------------------------------------------------------

    def peer(self, switch: str, port: int) -> Port | None:
        p = self.nodes[switch].ports.get(port)
        return None if p is None else p.peer

    def arrive(self, switch: str, in_port: int, frame: Frame, now: int) -> None:
        """``frame`` was received on ``switch:in_port`` at ``now``; it leaves by ``frame.dst``
        (an egress port of ``switch``). From a host it first crosses the host's cable in the
        model; from a switch it arrives when the model said (its record matched by
        ``frame.flow``, a key the caller derives from the frame's bytes the same way at both
        ends, e.g. its LRH and BTH)."""
        ev = self._events
        if ev and (ev[0].t <= now or ev[0].t <= self.now):  # (run_events' own first test)
            self.run_events(now)
        elif now > self.now:
            self.now = now
        self.frames_in += 1
        node = self.nodes[switch]
        port = node.ports.get(in_port)
        if port is not None and not port.up:  # a straggler on a cable the model has down: lost
            self.drops += 1
            self.drop_reasons["port_down"] = self.drop_reasons.get("port_down", 0) + 1
            return
        peer = None if port is None else port.peer
        src = None if port is None else port.live_peer_node
        if src is not None and not src.switch and peer is not None:
            t0 = self._clamp(src, self.now)
            if not (self.fast and self._fast_inject(src, peer[1], frame, t0)):
                self._dispatch(src.inject(peer[1], frame, t0))
            self._schedule_wake(src)
            return
        # The model's arrival, earlier than now by the veth's and the reading's real latency:
        # the node takes a frame back in time (it cannot start a port that was busy since, and
        # what it starts late is sent at once and counted late), so the next hop does not
        # inherit this one's real latency.
        t, vl = self._match(switch, in_port, frame.flow, now, port)
        t = min(t, now)
        if vl is None:  # no record: as if just sent, on the VL its SL maps to by default
            vl = self._debit(peer, frame)
        frame.vl = vl  # the VL it crossed the cable on: whose input buffer (and credits) it takes
        t = self._clamp(node, t)
        if self.fast and self.adapt is None:
            ev = self._events
            horizon = self.now if not ev or ev[0].t > self.now else ev[0].t - 1
            if self._fast_hop(node, in_port, frame, t, vl, horizon):
                return
        if self.adapt is not None and not frame.vl15:
            self.adapt(switch, in_port, frame, t)
        self._dispatch(node.receive(in_port, frame, t, frame.dst))  # type: ignore[arg-type]
        self._schedule_wake(node)  # a frame in the switch's pipeline is an action to come

    def _fast_hop(self, node: Node, in_port: int, frame: Frame, t: int, vl: int, horizon: int) -> bool:
        """The fast path (module docstring): ``frame``, from a neighbour switch, taken by
        ``node`` at ``t`` on ``vl``, played through the switch at once in closed form, when
        the event loop would play exactly that next: its time in the switch's pipeline is
        over by the time the model has been played to (so its wake-up would be the first
        event of the next :meth:`run_events`, nothing else being due by then), and its egress
        port is idle with nothing queued and credits for it (so it leaves when it reaches the
        port: start ``t`` + latency, end start + serialization, due end + propagation). Every
        counter, credit, statistic and record is what the event loop leaves; the wake-ups the
        event loop would push and pop at once are skipped, and the frame's end on the wire
        (its input buffer freed, credits back upstream) is played at once too when it is in
        the past, else left to the event loop. False (nothing changed): not that case; the
        caller takes the event loop's way."""
        start = t + node.latency_ns
        if start > horizon or start == t or frame.vl15 or node.kind != "ib" or not node.switch:
            return False
        out_port: int = frame.dst  # type: ignore[assignment]  # (the datapath's egress port)
        p = node.ports.get(out_port)
        pin = node.ports.get(in_port)
        if p is None or pin is None or not pin.up or not p.up or p.in_flight is not None or p.total_bytes \
                or p.queued or p.busy_until > start:
            return False
        busy, pipeline = node._busy, node._pipeline
        if (busy and busy[0][0] <= horizon) or (pipeline and pipeline[0][0] <= horizon):
            return False  # (never: the node's next deadline has its wake-up among the events)
        maps = p.vl_maps  # Node._class_of
        table = maps[in_port] if 0 <= in_port < len(maps) else p.vl_map0
        vls = p.vls
        c = table[frame.sl] if table is not None else frame.sl % vls
        if c >= vls:
            return False  # discarded (PortXmitDiscards): the event loop's way
        size = frame.size
        nblocks = -(-size // CREDIT_BYTES)
        cr = p.credits[c]
        if cr is not None and cr < nblocks:
            return False
        # --- receive (Node.receive without the pipeline)
        pc = pin.counters
        pc.rcv_frames += 1
        pc.rcv_bytes += size
        frame.in_port, frame.in_class = in_port, vl
        in_bytes, in_blocks = pin.in_bytes, pin.in_blocks
        in_bytes[vl] += size
        held = in_blocks[vl] + nblocks
        in_blocks[vl] = held
        if held > pin.buffer_blocks:
            pc.buffer_overruns += 1
        # --- the wake-up at ``start``: into the egress queue (Node._enqueue), picked (Node._start)
        frame.vl = c
        counters = p.counters
        if size > counters.max_queue_bytes:
            counters.max_queue_bytes = size
        arb = p.arbiter
        assert arb is not None
        if (arb.pick(_ready, 1 << c) is None if arb.arb.high else not arb.pick_only(c, True)):
            _wait_unserved(p, frame, in_port, c, size, start)  # the tables never serve it
            node.live_last = start
            self.fast_hops += 1
            return True
        if p.waiting_since is not None:
            counters.xmit_wait_ns += start - p.waiting_since
            p.waiting_since = None
        if p.blocked_since:
            p.blocked_since.pop(c, None)
        if arb._last == "low":  # Arbiter.sent, as the arbiter's last choice was its low table's
            arb._low.remaining -= nblocks
            arb._high_bytes = arb._high_pkts = 0
            arb._last = None
        else:
            arb.sent(c, size)
        if cr is not None:
            p.credits[c] = cr - nblocks
        link = p.link
        end = start + link.frame_ns(size)
        due = end + link.propagation
        p.busy_until = end
        counters.xmit_frames += 1
        counters.xmit_bytes += size
        name = node.name
        if end > horizon:  # its end is the event loop's (Node._finish at a wake-up)
            p.in_flight = (frame, in_port, vl)
            heappush(busy, (end, out_port))
            node.live_last = start
            self._schedule_wake(node)
        # --- the departure (as _dispatch records a Transmit)
        heappush(self._due, Departure(name, out_port, frame, due, start, end, p, self._next()))
        pnode = p.live_peer_node
        rx = p.live_peer
        if pnode is not None and pnode.switch and rx is not None:
            q: _Flight | None = rx.live_flight
            if q is None:
                q = self._new_flight(rx)
            q.append((frame.flow, due, c, nblocks))
        self.fast_hops += 1
        if end > horizon:
            return True
        # --- its end on the wire, in the past too (Node._finish, Node._release): the input
        # buffer freed, the credits on their way back upstream
        node.live_last = end
        in_bytes[vl] -= size
        in_blocks[vl] -= nblocks
        up = pin.peer
        unode = pin.live_peer_node
        uport = pin.live_peer
        if up is None or unode is None or uport is None:
            return True
        at = end + pin.link.propagation
        if at > horizon:
            self._at(at, _CREDIT, unode, up[1], vl, nblocks)
            return True
        tu = self._clamp(unode, at)
        ubusy, upipe = unode._busy, unode._pipeline
        if uport.up and not uport.total_bytes and not (ubusy and ubusy[0][0] <= tu) \
                and not (upipe and upipe[0][0] <= tu):
            ucr = uport.credits[vl]  # Node.credit_return with nothing to start
            if ucr is not None:
                uport.credits[vl] = ucr + nblocks
            uport.last_credit_ns[vl] = tu
            return True
        out = unode.credit_return(up[1], vl, nblocks, tu)
        self._schedule_wake(unode)
        self._dispatch(out)
        return True

    def _fast_inject(self, host: Node, port: int, frame: Frame, now: int) -> bool:
        """``Node.inject`` of ``frame`` at ``now`` onto ``host``'s idle ``port`` with nothing
        queued and credits for it, and the Transmit's dispatch, in closed form: the same
        state, its arrival at the switch an event as before. False (nothing changed): not that
        case."""
        p = host.ports.get(port)
        if p is None or host.kind != "ib" or frame.vl15 or not p.up or p.in_flight is not None \
                or p.total_bytes or p.queued or p.busy_until > now or p.peer is None:
            return False
        arb = p.arbiter
        if arb is None or arb.arb.high:
            return False
        busy = host._busy
        if (busy and busy[0][0] <= now) or host._pipeline:
            return False
        table = p.vl_map0  # Node._class_of (a host's input port is 0)
        vls = p.vls
        c = table[frame.sl] if table is not None else frame.sl % vls
        if c >= vls:
            return False
        size = frame.size
        nblocks = -(-size // CREDIT_BYTES)
        cr = p.credits[c]
        if cr is not None and cr < nblocks:
            return False
        frame.in_port, frame.in_class = -1, -1
        frame.vl = c
        counters = p.counters
        if size > counters.max_queue_bytes:
            counters.max_queue_bytes = size
        if not arb.pick_only(c, True):  # the tables never serve it
            _wait_unserved(p, frame, 0, c, size, now)
            return True
        if p.waiting_since is not None:
            counters.xmit_wait_ns += now - p.waiting_since
            p.waiting_since = None
        if p.blocked_since:
            p.blocked_since.pop(c, None)
        arb._low.remaining -= nblocks  # Arbiter.sent after a choice from the low table
        arb._high_bytes = arb._high_pkts = 0
        arb._last = None
        if cr is not None:
            p.credits[c] = cr - nblocks
        link = p.link
        end = now + link.frame_ns(size)
        p.busy_until = end
        p.in_flight = (frame, -1, -1)
        heappush(busy, (end, port))
        counters.xmit_frames += 1
        counters.xmit_bytes += size
        pnode = p.live_peer_node
        if pnode is None:
            pnode = self.nodes[p.peer[0]]
        self._at(end + link.propagation, _RECEIVE, pnode, p.peer[1], frame)
        return True

    def _match(self, switch: str, in_port: int, key: Hashable, now: int,
               rx: EgressPort | None) -> tuple[int, int | None]:
        """The model's arrival time and VL of the frame ``key`` on the cable into
        ``switch:in_port`` (``rx``; now and None when there is no record of it)."""
        q: _Flight | None = None if rx is None else rx.live_flight
        if q and key is not None:
            rec = q.first()
            if rec[0] == key:  # (the usual case: the frame at the head of the cable)
                q.popleft()
                return rec[1], rec[2]
            for i, rec in enumerate(q.window(MATCH_WINDOW)):
                if rec[0] == key:
                    for _ in range(i):  # lost on the way: their credits come back
                        self._lost(switch, in_port, q.popleft(), now)
                    q.popleft()
                    return rec[1], rec[2]
        self.unmatched += 1
        return now, None

    def _debit(self, peer: Port | None, frame: Frame) -> int:
        """An unmatched frame from ``peer`` (a record lost, a frame altered on the way) takes
        the credits it will return when it leaves: its sender's are debited now, so the
        credits stay balanced. Its VL: its SL modulo the sender port's data VLs."""
        if frame.vl15:
            return VL15
        if peer is None or peer[0] not in self.nodes:
            return 0
        if self.nodes[peer[0]].kind == "eth":
            return frame.sl  # its priority; nothing is credited
        p = self.nodes[peer[0]].ports[peer[1]]
        vl = frame.sl % max(1, p.vls)
        cr = p.credits[vl]
        if cr is not None:
            p.credits[vl] = cr - blocks(frame.size)
        return vl

    def consume(self, switch: str, in_port: int, key: Hashable, now: int) -> bool:
        """A frame from a neighbour switch that ``switch`` did not forward (its SMA took it,
        or its forwarder dropped it): its buffer is free at once and its credits go back to
        the sender, as a real port frees what it consumed or discarded. False: no record."""
        node = self.nodes.get(switch)
        rx = None if node is None else node.ports.get(in_port)
        q: _Flight | None = None if rx is None else rx.live_flight
        if not q:
            return False
        for i, rec in enumerate(q.window(MATCH_WINDOW)):
            if rec[0] == key:
                q.remove(i)
                self._lost(switch, in_port, rec, now)
                return True
        return False

    def expire(self, now: int, port: Port | None = None) -> int:
        """Forget the records of frames in flight for longer than :data:`MATCH_STALE_NS`
        (lost on the veth: a cable pulled, a full socket), their credits given back, as the
        periodic flow-control packets of a real link resynchronize them. How many."""
        n = 0
        for key in [port] if port is not None else list(self._flight_ports):
            rx = self._flight_ports.get(key)
            q: _Flight | None = None if rx is None else rx.live_flight
            while q and q.first()[1] < now - MATCH_STALE_NS:
                self._lost(key[0], key[1], q.popleft(), now)
                n += 1
        return n

    def _lost(self, switch: str, in_port: int, rec: tuple[Hashable, int, int, int], now: int) -> None:
        peer = self.peer(switch, in_port)
        if peer is None or not rec[3]:
            return
        self.run_events(now)
        node = self.nodes[peer[0]]
        self._dispatch(node.credit_return(peer[1], rec[2], rec[3], self._clamp(node, now)))
        self._schedule_wake(node)

    # --- time -----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The next time :meth:`run` has something to do (None: nothing until a frame)."""
        t = self._events[0].t if self._events else None
        if self._due and (t is None or self._due[0].due_ns < t):
            t = self._due[0].due_ns
        return t

    def run_events(self, now: int) -> None:
        """Play the model's events due by ``now`` (not the departures), or by the time the
        model has been played to if that is later (events a frame taken back in time put
        there since: :meth:`arrive`)."""
        if now < self.now:
            now = self.now
        ev = self._events
        fast = self.fast and self.adapt is None
        while ev and ev[0].t <= now:
            e = heappop(ev)
            t, what, node, a, b, c = e.t, e.what, e.node, e.a, e.b, e.c
            if t > self.now:
                self.now = t
            if what == _WAKE:
                if node.live_wake == t:
                    node.live_wake = -1
                out = node.advance(self._clamp(node, t))
            elif what == _RECEIVE:
                fr: Frame = b  # (typed: compiled, its fields are read natively)
                if self.redecide is not None and fr.dst is not None and not node.ports[fr.dst].up:  # type: ignore[index]
                    self.redecide(node.name, a, fr)  # from a host: the switch looks its LFT up now
                    self.redecided += 1
                tn = self._clamp(node, t)
                if fast and self._fast_hop(node, a, fr, tn, fr.vl,
                                           now if not ev or ev[0].t > now else ev[0].t - 1):
                    continue
                if self.adapt is not None and not fr.vl15:
                    self.adapt(node.name, a, fr, tn)
                out = node.receive(a, fr, tn, fr.dst)  # type: ignore[arg-type]
            elif what == _CREDIT:
                out = node.credit_return(a, b, c, self._clamp(node, t))
            else:
                out = node.pause(a, b, c, self._clamp(node, t))
            self._schedule_wake(node)
            self._dispatch(out)
        if now > self.now:
            self.now = now

    def run(self, now: int) -> list[Departure]:
        """Play everything due by ``now``; the departures due by then, in due order, counted
        as sent at ``now``."""
        self.run_events(now)
        out: list[Departure] = []
        due = self._due
        while due and due[0].due_ns <= now:
            d = heappop(due)
            self._account(d, now)
            out.append(d)
        return out

    def _account(self, d: Departure, sent: int) -> None:
        ep = d.eport
        st: LinkStats | None = ep.live_stats if ep is not None else self.stats.get((d.switch, d.port))
        if st is None:
            return
        st.frames += 1
        st.bytes += d.frame.size
        st.late_ns.append(max(0, sent - d.due_ns))
        if d.start_ns == st.last_end and st.last_end >= 0:
            st.busy_model_ns += d.due_ns - st.last_due
            st.busy_real_ns += sent - st.last_sent
        st.last_due, st.last_end, st.last_sent = d.due_ns, d.end_ns, sent

    def take_notes(self) -> list[Pause | Drop]:
        """The pauses and drops noted since the last call (Ethernet)."""
        out, self.notes = self.notes, []
        return out

    def take_stats(self) -> dict[Port, LinkStats]:
        """Each egress port's stats since the last call (ports that sent nothing left out)."""
        out = {k: s for k, s in self.stats.items() if s.frames}
        for k in out:
            st = self.stats[k] = out[k].fresh()
            node = self.nodes.get(k[0])
            if node is not None and k[1] in node.ports:
                node.ports[k[1]].live_stats = st
        return out

    def credit_loops(self, stall_ns: int) -> list[CreditLoop]:
        """Credit loops among the switches now (``deadlock.find_credit_loops``)."""
        self.run_events(self.now)
        return find_credit_loops({n: node for n, node in self.nodes.items() if node.switch}, self.now, stall_ns)

    def _ends(self, name: str, port: int) -> list[Port]:
        """Both ends of the cable at ``name:port`` that are in the plane."""
        node = self.nodes.get(name)
        if node is None or port not in node.ports:
            return []
        peer = node.ports[port].peer
        return [(name, port)] + ([peer] if peer is not None and peer[0] in self.nodes else [])

    def _cable_change(self, name: str, port: int, now: int) -> list[Port]:
        """A cable's ends in the plane, the model brought up to ``now`` and the frames on the
        cable dropped (down: lost with it; up: none can be, the cable was down)."""
        ends = self._ends(name, port)
        if ends:
            self.run_events(now)
            for a in ends:
                self._drop_flight(a)
        return ends

    def link_down(self, name: str, port: int, now: int) -> None:
        """The cable at ``name:port`` went down (either end may report it; a second report is
        a no-op): both of its ports leave LinkUp (``Node.port_down``: their queues discarded
        and counted, the input buffer those frames held freed at once, their credits gone),
        the frames on the cable are lost (their records dropped) and so are the departures
        the model had timed on it that are not out yet."""
        ends = self._cable_change(name, port, now)
        dead = set(ends)
        if any((d.switch, d.port) in dead for d in self._due):
            self._due = [d for d in self._due if (d.switch, d.port) not in dead]
            heapify(self._due)
        for a in ends:
            node = self.nodes[a[0]]
            out = node.port_down(a[1], self._clamp(node, now))
            lost = sum(1 for x in out if type(x) is Drop)
            if lost:
                log.info("%s:%d down: %d frames queued for it discarded", a[0], a[1], lost)
            self._dispatch(out)
            self._schedule_wake(node)

    def link_up(self, name: str, port: int, now: int) -> None:
        """The cable at ``name:port`` came up: both ports are LinkUp again, each with the
        credits the other end's input buffer really has free (link initialization)."""
        for a in self._cable_change(name, port, now):
            node = self.nodes[a[0]]
            src = node.ports[a[1]]
            free: dict[int, int] | None = None
            b = src.peer
            dst = self.nodes.get(b[0]) if b is not None else None
            if node.kind == "ib" and b is not None and dst is not None and dst.switch:
                cfg = dst.ib_config[b[1]]
                held = dst.ports[b[1]].in_blocks
                free = {vl: cfg.buffer_bytes // 64 - held[vl] for vl in range(min(cfg.data_vls, src.vls))}
            self._dispatch(node.port_up(a[1], self._clamp(node, now), free))
            self._schedule_wake(node)

    def link_reset(self, name: str, port: int, now: int) -> None:
        """The cable at ``name:port`` went down or came up: link training re-initializes flow
        control, so the records of frames in flight on it are dropped and each end's credits
        are what the other end's input buffer really has free (frames lost on the dead cable
        no longer hold any)."""
        node = self.nodes.get(name)
        if node is None or port not in node.ports:
            return
        self.run_events(now)
        peer = node.ports[port].peer
        ends = [(name, port)] + ([peer] if peer is not None and peer[0] in self.nodes else [])
        for a in ends:
            self._drop_flight(a)
        if node.kind == "eth":
            return  # no credits to resynchronize
        for a in ends:
            src = self.nodes[a[0]].ports[a[1]]
            b = src.peer
            dst = self.nodes.get(b[0]) if b is not None else None
            if b is None or dst is None or not dst.switch:
                continue  # towards a host: never short of credits
            cfg = dst.ib_config[b[1]]
            held = dst.ports[b[1]].in_blocks
            for vl in range(min(cfg.data_vls, src.vls)):
                src.credits[vl] = cfg.buffer_bytes // 64 - held[vl]
            self.nodes[a[0]]._dirty.add(a[1])
            self._dispatch(self.nodes[a[0]].advance(self._clamp(self.nodes[a[0]], now)))
            self._schedule_wake(self.nodes[a[0]])

    def set_qos(self, name: str, port: int, *, data_vls: int, vlarb: VlArb,
                sl2vl: Mapping[int, Sl2Vl]) -> None:
        """Take the QoS the SM programmed into node ``name``'s ``port``: the data VLs it
        operates, its VL arbitration, the SL -> VL map of each input port towards it (a host:
        input port 0). Credits of a VL newly operated at both ends of the cable start full;
        VLs no longer operated get none (what they still hold drains by their credits)."""
        self.run_events(self.now)  # what was due before the change is played with the old tables
        node = self.nodes[name]
        p = node.ports[port]
        cfg = node.ib_config[port]
        if data_vls != cfg.data_vls:
            node.ib_config[port] = replace(cfg, data_vls=data_vls)
            p.vls = data_vls
            peer = p.peer
            pnode = self.nodes.get(peer[0]) if peer is not None else None
            if peer is not None and pnode is not None:
                pp = pnode.ports[peer[1]]
                both = min(data_vls, pnode.ib_config[peer[1]].data_vls)
                for vl in range(VL15):  # each end's credits for the other's input buffer
                    for src, dst_node, dst_port in ((p, pnode, peer[1]), (pp, node, port)):
                        if not dst_node.switch:
                            continue  # a host never runs out (None stays None)
                        if vl >= both:
                            src.credits[vl] = 0
                        elif src.credits[vl] == 0 and not src.queues[vl]:
                            src.credits[vl] = dst_node.ib_config[dst_port].buffer_bytes // 64
        node.set_vlarb(port, vlarb)
        for in_port, table in sl2vl.items():
            node.set_sl2vl(in_port, port, table)

    def set_propagation(self, switch: str, port: int, propagation_ns: float) -> None:
        """Change the delay of the cable ``switch:port`` sends on (a fault's injected delay)."""
        self.run_events(self.now)
        p = self.nodes[switch].ports[port]
        p.link = replace(p.link, propagation_ns=float(propagation_ns))

    # --- actions --------------------------------------------------------------------------

    def _clamp(self, node: Node, t: int) -> int:
        """``t``, or the latest time node ``name`` was driven to if later: a node's own time
        never goes back (a frame matched to its model arrival may be older than what the node
        did since; it is then taken as arriving now, for that node)."""
        last = node.live_last
        if t < last:
            return last
        node.live_last = t
        return t

    def _order(self) -> float:
        """An event's place among those due at the same ns: the sequence or a seeded draw."""
        return self._tie() if self._tie is not None else self._next()

    def _next(self) -> int:
        """``next`` of a counter, without the call into an iterator (compiled: plain C)."""
        n = self._seq
        self._seq = n + 1
        return n

    def _at(self, t: int, what: int, node: Node, a: Any = None, b: Any = None, c: Any = None) -> None:
        heappush(self._events, _Event(t, self._order(), what, node, a, b, c))

    def _dispatch(self, actions: list[Action]) -> None:
        if not actions:
            return
        nodes = self.nodes
        first = actions[0].node
        fnode = nodes[first]  # (looked up once: usually every action is the first node's)
        touched: set[str] | None = None  # the nodes other than the first (rare: usually one acts)
        for a in actions:
            anode = fnode
            if a.node != first:
                if touched is None:
                    touched = {first}
                touched.add(a.node)
                anode = nodes[a.node]
            if type(a) is Transmit:
                node = anode
                ep = node.ports[a.port]
                peer = ep.peer
                if not node.switch:  # the host's cable, modelled here: the switch receives it
                    if peer is not None:
                        self._at(a.arrive_ns, _RECEIVE, nodes[peer[0]], peer[1], a.frame)
                    continue
                heappush(self._due, Departure(a.node, a.port, a.frame, a.arrive_ns, a.start_ns, a.end_ns, ep,
                                              self._next()))
                pnode = ep.live_peer_node
                rx = ep.live_peer
                if pnode is not None and pnode.switch and rx is not None:
                    credited = 0 if a.frame.vl15 else blocks(a.frame.size)
                    fq: _Flight | None = rx.live_flight
                    if fq is None:
                        fq = self._new_flight(rx)
                    fq.append((a.frame.flow, a.arrive_ns, a.vl, credited))
            elif type(a) is CreditReturn:
                cp = anode.ports[a.port]
                peer = cp.peer
                pn = cp.live_peer_node
                if pn is not None and peer is not None:
                    self._at(a.at_ns, _CREDIT, pn, peer[1], a.vl, a.blocks)
            elif type(a) is Pause:
                peer = nodes[a.node].ports[a.port].peer
                pn = nodes.get(peer[0]) if peer is not None else None
                if pn is not None and peer is not None:
                    self._at(a.at_ns, _PAUSE, pn, peer[1], a.priority, a.xoff)
                if self.keep_notes:
                    self.notes.append(a)
            elif type(a) is Drop:
                self.drops += 1
                self.drop_reasons[a.reason] = self.drop_reasons.get(a.reason, 0) + 1
                if self.keep_notes:
                    self.notes.append(a)
        if touched is None:
            self._schedule_wake(fnode)
        else:
            for name in touched:
                self._schedule_wake(nodes[name])


    def pause_port(self, name: str, port: int, priority: int, xoff: bool, now: int) -> None:
        """The peer of ``name:port`` paused (or resumed) ``priority`` from outside the model
        (a host's own PFC frame)."""
        self.run_events(now)
        node = self.nodes[name]
        self._dispatch(node.pause(port, priority, xoff, self._clamp(node, now)))
        self._schedule_wake(node)

    def _schedule_wake(self, node: Node) -> None:
        busy, pipeline = node._busy, node._pipeline  # node.next_deadline(), inlined
        if busy:
            t = busy[0][0]
            if pipeline and pipeline[0][0] < t:
                t = pipeline[0][0]
        elif pipeline:
            t = pipeline[0][0]
        else:
            return
        if node.live_wake == t:
            return
        node.live_wake = t
        heappush(self._events, _Event(t, self._order(), _WAKE, node, None, None, None))


def _ready(vl: int) -> bool:
    """``EgressPort._ready`` for the fast path's one queued frame, whose credits it checked."""
    return True


def egress_load(node: Node, port: int) -> int:
    """How loaded ``node``'s egress ``port`` is now, in bytes, for adaptive routing: queued,
    on the wire, in the switch's pipeline for it, and (IB) held in the next switch's input
    buffer (credits in use: congestion one hop on); a port that is down or unknown: -1 is
    never returned, a large figure is."""
    p = node.ports.get(port)
    if p is None or not p.up:
        return 1 << 62
    load = p.total_bytes
    if p.in_flight is not None:
        load += p.in_flight[0].size
    for _, _, f, out in node._pipeline:
        if out == port:
            load += f.size
    for vl, adv in enumerate(p.advertised):
        cr = p.credits[vl] if vl < len(p.credits) else None
        if adv is not None and cr is not None and vl != VL15:
            load += max(0, adv - cr) * 64
    return load
