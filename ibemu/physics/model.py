"""The sans-IO link and switch model: what a frame's journey through a node costs in time, and
what flow control allows.

One :class:`Node` is a switch or a host (CA / NIC), of either fabric kind (``ib``: lossless,
credit-based per VL; ``eth``: RoCEv2 on priorities with drop tail, PFC and ECN). The model
never sleeps and never touches a socket: every call takes the emulated time ``now`` (integer
ns) and returns :class:`Action` objects for the caller (a forwarding loop, or the reference
simulator in :mod:`ibemu.physics.sim`) to carry out at the times they carry:

===================================  ===============================================================
call                                 meaning
===================================  ===============================================================
``receive(in_port, frame, now, out)``  ``frame`` has fully arrived on ``in_port``; forward it on
                                     ``out`` (a switch; the forwarding decision is the caller's),
                                     or consume it (``out=None``: a host)
``inject(port, frame, now)``         a host's transport sends ``frame`` on ``port``
``credit_return(port, vl, n, now)``  ``n`` credits (64-byte blocks) for ``vl`` came back on
                                     ``port`` from its peer (IB)
``pause(port, prio, xoff, now)``     the peer of ``port`` paused / resumed ``prio`` (PFC)
``advance(now)``                     run everything due by ``now``; ``next_deadline()`` says when
``port_down(port, now)``             the cable at ``port`` went down (both ends are told)
``port_up(port, now, free)``         it came up again; ``free``: the peer's input buffer free per
                                     VL (IB), what link initialization advertises
===================================  ===============================================================

Actions: :class:`Transmit` (a frame starts on a port at ``start_ns``, has left at ``end_ns``,
reaches the peer at ``arrive_ns``: the caller calls the peer's ``receive`` then),
:class:`CreditReturn` (give credits to the peer of ``port`` at ``at_ns``), :class:`Pause`
(a PFC frame to the peer of ``port``, effective at ``at_ns``), :class:`Deliver` (a host
consumed a frame) and :class:`Drop`.

Where a frame is, and what it holds:

- Switch, store-and-forward: a frame that has arrived waits the switch latency, then joins its
  egress port's queue for its class (IB: the VL its SL maps to for this input/output port pair;
  Ethernet: its priority). It holds buffer at the input port it came in on until it has left
  the egress port (IB: the input port's VL buffer, whose credits its upstream port counts;
  Ethernet: the ingress counters PFC watches) and at the egress port (Ethernet drop tail).
- IB: an egress port sends on a data VL only when the peer's buffer for that VL has room for
  the whole packet (credits, in 64-byte blocks; the peer advertised its buffer at link up).
  Credits come back when the frame has left the peer, after the cable's propagation delay.
  Nothing is ever dropped for want of buffer; VL15 (SMPs) is not credited and goes first. A
  port whose queues hold data but may send none for want of credits counts PortXmitWait.
  An egress port's queue per class keeps a FIFO per input port and serves the input ports
  round robin, a packet at a time (a crossbar's output arbiter), so senders into one port share
  it evenly. Head-of-line blocking and congestion spreading follow: the head of a VL waiting
  for credits blocks every frame behind it on that port and VL, whatever their destination
  beyond, and an input buffer full of frames for a congested port leaves its upstream port no
  credits on that VL for any flow (the parking-lot effect of real IB fabrics).
- Ethernet: strict priority, highest first, skipping paused priorities. A frame that would
  push the egress port past its buffer is dropped unless its priority is lossless (PFC). An
  ECN-capable frame that finds more than ``ecn_mark_bytes`` queued in its priority is marked
  CE. Both at switches only: a host's egress queue stands for its NIC's send queue, which
  its transport's window bounds (it neither drops nor marks; it honours pauses). Per ingress
  port and priority, above ``xoff_bytes`` waiting the node sends XOFF, below
  ``xon_bytes`` XON (pause frames are not timed out in the model: XOFF holds until XON).

The RoCE user datapath runs on this (``ibemu.roce.links``, live through
``ibemu.physics.live``): ``ibemu.roce.physics`` maps its ``QueueConfig`` onto :class:`EthConfig`
(``buffer_kb`` -> ``buffer_bytes``, ``ecn_mark_kb`` -> ``ecn_mark_bytes``, ``pfc`` ->
``lossless``, ``xoff_kb``/``xon_kb`` -> the thresholds) and a switch model; its cables are the
topology's. Pause frames here are not aged: an XOFF holds until its XON.

A port whose link goes down (``port_down``) behaves as a switch port leaving LinkUp: every
frame queued for it is discarded and counted (PortXmitDiscards, a :class:`Drop` with reason
``port_down``), freeing the input buffer it held (its credits go back upstream at once, so
the upstream VL, and every flow behind it, is not left blocked by frames that will never
leave); a frame reaching the port while it is down (one that was already in the switch
pipeline, or decided before the forwarding tables changed) is discarded likewise; the frame on
the wire is lost (it still occupies the line until its last bit, then frees its buffer); a
frame arriving on a down port (in flight on the cable when it was cut) is lost, with no credit
returned; credit returns reaching a down port are lost too (flow control runs over the link).
While down the port has no credits; ``port_up`` restores them from what the peer's input
buffer has free (IBA's link initialization: the first flow-control packets carry absolute
counts, FCTBS / FCCL, so both ends resynchronize), or the buffer it advertised at ``connect``.
Ethernet ports flush alike (their PFC counts fall, their pauses are forgotten).

Deviations from IBA: no HOQLife / VLStallCount discards (a credit loop stays stuck instead of
draining by timeouts, which is what makes a deadlock visible; real switches would eventually
discard, slowly); credits return per frame after the propagation delay (real links send
flow-control packets every 65,536 symbol times at most, so returns bunch up slightly); and
the switch is store-and-forward (see :mod:`ibemu.physics.link`).

Where the state lives (for the compiled twin, ``ibemu.native``; the rules above are the same
either way): what the model keeps per port and per (port, VL) is on the port's
:class:`EgressPort`, in lists indexed by VL or port number: an input port's buffer use per VL
(``in_bytes``, ``in_blocks``), the SL -> VL map of each input port towards an output port
(``vl_maps``, kept by ``Node.set_sl2vl``), and a class queue's FIFOs (:class:`ClassQueue`: a
list per input port, not a dict of deques). ``Node.ingress_bytes`` / ``ingress_blocks`` show
the buffer use keyed by (input port, class) as before. Compiled, a list read is C, where a
dict lookup by a tuple made for it, or a deque's method, was a call into the interpreter's
objects several times per frame and hop (perf, issue 18). The internals (``_advance``,
``_start``, ``_release`` ...) append their actions to the caller's list instead of returning
lists to be concatenated.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ibemu.physics.link import LinkModel
from ibemu.physics.qos import CREDIT_BYTES, VL15, Arbiter, Sl2Vl, VlArb, blocks

heappop: Final = heapq.heappop
heappush: Final = heapq.heappush
"""(Bound once: compiled, a ``Final`` is a C static, where an imported name is looked up in the
module's globals at every call, several times per frame and hop.)"""

Kind = Literal["ib", "eth"]
PRIORITIES: Final = 8
NUM_VLS: Final = 16


@dataclass(slots=True, eq=False, init=False)
class Frame:
    """What the model needs to know of a frame; ``meta`` carries the caller's packet."""

    size: int
    """Bytes on the wire without framing (IB: LRH .. VCRC; Ethernet: MAC .. FCS)."""
    sl: int
    """IB: the service level (LRH). Ethernet: the priority (DSCP >> 3 or a map)."""
    dst: Hashable
    flow: Hashable
    ecn_capable: bool
    ce: bool
    vl15: bool
    meta: Any
    born_ns: int
    vl: int
    """The VL (or priority) it travels on over the current hop; the model sets it."""
    in_port: int
    in_class: int

    def __init__(self, size: int, sl: int = 0, dst: Hashable = None, flow: Hashable = None,
                 ecn_capable: bool = False, ce: bool = False, vl15: bool = False, meta: Any = None,
                 born_ns: int = 0, vl: int = 0, in_port: int = -1, in_class: int = -1) -> None:
        # (written out, not the dataclass's: compiled (``ibemu.physics.native``), a generated
        # ``__init__`` stays interpreted, and one is made per frame)
        self.size, self.sl, self.dst, self.flow = size, sl, dst, flow
        self.ecn_capable, self.ce, self.vl15, self.meta = ecn_capable, ce, vl15, meta
        self.born_ns, self.vl, self.in_port, self.in_class = born_ns, vl, in_port, in_class


# --- actions ------------------------------------------------------------------------------
# Plain (not frozen) slotted dataclasses, to be treated as immutable: several are made per
# frame and hop, and a frozen dataclass's constructor costs ~1.2 us more (it sets each field
# through object.__setattr__), a tenth of the live datapath's model work per hop. Their
# ``__init__`` is written out: compiled (``ibemu.physics.native``), a generated one stays
# interpreted (the dataclass still gives ``__eq__`` and ``__repr__``).


@dataclass(slots=True, init=False)
class Transmit:
    node: str
    port: int
    frame: Frame
    vl: int
    start_ns: int
    end_ns: int
    arrive_ns: int

    def __init__(self, node: str, port: int, frame: Frame, vl: int, start_ns: int, end_ns: int, arrive_ns: int) -> None:
        self.node = node
        self.port = port
        self.frame = frame
        self.vl = vl
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.arrive_ns = arrive_ns


@dataclass(slots=True, init=False)
class CreditReturn:
    """``blocks`` credits of ``vl`` from ``node`` to the peer of its ``port``, there at ``at_ns``."""

    node: str
    port: int
    vl: int
    blocks: int
    at_ns: int

    def __init__(self, node: str, port: int, vl: int, blocks: int, at_ns: int) -> None:
        self.node = node
        self.port = port
        self.vl = vl
        self.blocks = blocks
        self.at_ns = at_ns


@dataclass(slots=True, init=False)
class Pause:
    """A PFC frame from ``node`` out of ``port``: ``xoff`` (pause) or XON for ``priority``."""

    node: str
    port: int
    priority: int
    xoff: bool
    at_ns: int

    def __init__(self, node: str, port: int, priority: int, xoff: bool, at_ns: int) -> None:
        self.node = node
        self.port = port
        self.priority = priority
        self.xoff = xoff
        self.at_ns = at_ns


@dataclass(slots=True, init=False)
class Deliver:
    node: str
    port: int
    frame: Frame
    at_ns: int

    def __init__(self, node: str, port: int, frame: Frame, at_ns: int) -> None:
        self.node = node
        self.port = port
        self.frame = frame
        self.at_ns = at_ns


@dataclass(slots=True, init=False)
class Drop:
    node: str
    port: int
    frame: Frame
    reason: str
    at_ns: int

    def __init__(self, node: str, port: int, frame: Frame, reason: str, at_ns: int) -> None:
        self.node = node
        self.port = port
        self.frame = frame
        self.reason = reason
        self.at_ns = at_ns


Action = Transmit | CreditReturn | Pause | Deliver | Drop


# --- configuration ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IbPortConfig:
    """An IB port's QoS: data VLs operated, VL arbitration, and its input buffer per VL."""

    data_vls: int = 1
    vlarb: VlArb | None = None
    buffer_bytes: int = 32 * 1024
    """Receive buffer per data VL (what the peer's credits count)."""

    def __post_init__(self) -> None:
        if self.data_vls not in (1, 2, 4, 8, 15):
            raise ValueError(f"a port operates 1, 2, 4, 8 or 15 data VLs, not {self.data_vls}")
        if self.buffer_bytes < 64:
            raise ValueError("a VL buffer holds at least one 64-byte credit")


@dataclass(frozen=True, slots=True)
class EthConfig:
    """An Ethernet port's buffer, PFC and ECN (``ibemu.roce.queues.QueueConfig``'s figures)."""

    buffer_bytes: int = 1024 * 1024
    lossless: frozenset[int] = frozenset()
    xoff_bytes: int = 64 * 1024
    xon_bytes: int = 32 * 1024
    ecn_mark_bytes: int = 0

    def __post_init__(self) -> None:
        if self.buffer_bytes <= 0 or self.ecn_mark_bytes < 0:
            raise ValueError("buffer is positive, the ECN threshold not negative")
        if any(not 0 <= p < PRIORITIES for p in self.lossless):
            raise ValueError("PFC priorities lie within 0..7")
        if self.lossless and not 0 < self.xon_bytes <= self.xoff_bytes:
            raise ValueError("PFC needs 0 < xon <= xoff")


@dataclass(slots=True)
class PortCounters:
    """What a port counts (IB names where IB has one: PortXmitWait, PortXmitDiscards ...)."""

    xmit_frames: int = 0
    xmit_bytes: int = 0
    rcv_frames: int = 0
    rcv_bytes: int = 0
    xmit_wait_ns: int = 0
    """Time the port had data queued but could send none (no credits, or paused)."""
    xmit_discards: int = 0
    inactive_discards: int = 0
    """Of ``xmit_discards``: frames for a port whose link was down (PortInactiveDiscards)."""
    drops: int = 0
    """Ethernet: frames dropped at this egress for want of buffer."""
    ecn_marked: int = 0
    pause_sent: int = 0
    pause_received: int = 0
    paused_ns: int = 0
    credit_stalls: int = 0
    """Times the head of a VL had to wait for credits."""
    buffer_overruns: int = 0
    """IB: frames that arrived beyond the input buffer this port advertised (ExcessiveBufferOverrunErrors:
    never, while the peer keeps to its credits)."""
    max_queue_bytes: int = 0

    def xmit_wait_ticks(self, tick_ns: float) -> int:
        """PortXmitWait in ticks of ``tick_ns`` (the PMA's unit is the implementation's)."""
        return int(self.xmit_wait_ns // tick_ns)


# --- ports and nodes ----------------------------------------------------------------------


class ClassQueue:
    """One egress class's (VL's or priority's) frames: FIFO per input port, the input ports
    served round robin, a packet at a time (a crossbar's output arbiter). The head is the
    frame sent next.

    Lists indexed by input port number with a head index each, not a dict of deques: compiled
    (``ibemu.native``) a list is read and written in C, where a deque's methods and a dict's
    lookups are calls into the interpreter's objects (several per frame and hop). A FIFO's
    list drops what was taken from it when it empties, or when that is more than half of it."""

    __slots__ = ("_heads", "_n", "_ohead", "_order", "_seen", "_sub")

    def __init__(self) -> None:
        self._sub: list[list[Frame]] = []
        """Input port -> its FIFO, from ``_heads[port]`` on."""
        self._heads: list[int] = []
        self._order: list[int] = []
        """The input ports holding frames, from ``_ohead`` on, in the order they are served."""
        self._ohead = 0
        self._seen: list[int] = []
        """The input ports in the order they first queued a frame (iteration's order)."""
        self._n = 0

    def append(self, frame: Frame, in_port: int) -> None:
        sub = self._sub
        if in_port >= len(sub):
            if in_port < 0:
                raise ValueError(f"an input port number is not negative ({in_port})")
            while len(sub) <= in_port:
                sub.append([])
                self._heads.append(-1)  # (-1: never seen)
        h = self._heads[in_port]
        q = sub[in_port]
        if h < 0:
            h = self._heads[in_port] = 0
            self._seen.append(in_port)
        if len(q) == h:  # (empty)
            self._order.append(in_port)
        q.append(frame)
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __getitem__(self, i: int) -> Frame:
        if i != 0 or not self._n:
            raise IndexError("only the head of a class queue is visible")
        return self.head()

    def head(self) -> Frame:
        """The frame sent next (the queue is not empty)."""
        key = self._order[self._ohead]
        return self._sub[key][self._heads[key]]

    def popleft(self) -> Frame:
        order = self._order
        oh = self._ohead
        key = order[oh]
        oh += 1
        q = self._sub[key]
        h = self._heads[key]
        frame = q[h]
        h += 1
        if h == len(q):  # this input port's FIFO is empty: out of the rotation
            q.clear()
            h = 0
        else:
            if h > 32 and 2 * h > len(q):
                del q[:h]
                h = 0
            order.append(key)
        self._heads[key] = h
        if oh == len(order):
            order.clear()
            oh = 0
        elif oh > 32 and 2 * oh > len(order):
            del order[:oh]
            oh = 0
        self._ohead = oh
        self._n -= 1
        return frame

    def __iter__(self) -> Iterator[Frame]:
        for key in self._seen:
            yield from self._sub[key][self._heads[key]:]


@dataclass(slots=True)
class EgressPort:
    """The sending side of one port: queues per class, the line, credits or pauses."""

    num: int
    link: LinkModel
    kind: Kind
    classes: int
    queues: list[ClassQueue]
    queued_bytes: list[int]
    credits: list[int | None]
    """IB: 64-byte blocks free in the peer's buffer per VL (None: not credited, e.g. VL15)."""
    arbiter: Arbiter | None
    counters: PortCounters = field(default_factory=PortCounters)
    total_bytes: int = 0
    busy_until: int = 0
    in_flight: tuple[Frame, int, int] | None = None
    """(frame, its input port, its input class) while it is on the wire."""
    waiting_since: int | None = None
    blocked_since: dict[int, int] = field(default_factory=dict)
    """VL -> when its head started waiting for credits (cleared when it sends)."""
    last_credit_ns: dict[int, int] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)
    paused_since: dict[int, int] = field(default_factory=dict)
    peer: tuple[str, int] | None = None
    vls: int = VL15
    """IB: the data VLs the port operates (its queues beyond them stay empty)."""
    up: bool = True
    """False while the port's link is down (see ``Node.port_down``)."""
    advertised: list[int | None] = field(default_factory=list)
    """IB: the credits per VL the peer advertised at ``connect`` (what ``port_up`` restores by default)."""
    queued: int = 0
    """A bit per class whose queue holds frames (with eight VLs operated and one busy, the
    arbiter and the credit-wait bookkeeping skip the empty ones without looking)."""
    in_bytes: list[int] = field(default_factory=lambda: [0] * NUM_VLS)
    """As an input port: bytes held per class (IB: VL buffer use; Ethernet: PFC's count), what
    ``Node.ingress_bytes`` shows keyed by (this port, class)."""
    in_blocks: list[int] = field(default_factory=lambda: [0] * NUM_VLS)
    """As an input port, IB: credits' worth held per VL (64-byte blocks, each frame rounded
    up), what ``Node.ingress_blocks`` shows."""
    buffer_blocks: int = 0
    """As an input port, IB: its buffer per data VL in 64-byte blocks (its ``IbPortConfig``)."""
    vl_maps: list[tuple[int, ...] | None] = field(default_factory=list)
    """IB, as an output port: the SL -> VL map of frames from input port ``i`` at index ``i``
    (``Node.sl2vl``'s (i, this port), else its (0, this port); None: neither), kept by
    ``Node.set_sl2vl``; an input port beyond the list takes :attr:`vl_map0`."""
    vl_map0: tuple[int, ...] | None = None
    """``Node.sl2vl``'s (0, this port) map (None: none)."""
    live_peer: EgressPort | None = field(default=None, repr=False, compare=False)
    """``physics.live``: the port at the other end of the cable, where it is in the plane."""
    live_peer_node: Node | None = field(default=None, repr=False, compare=False)
    """``physics.live``: the node of :attr:`live_peer`."""
    live_flight: Any = field(default=None, repr=False, compare=False)
    """``physics.live``, as an input port: the records of the frames on the cable to it (its
    ``_Flight``, or None)."""
    live_key: tuple[str, int] = field(default=("", -1), repr=False, compare=False)
    """``physics.live``: (its node's name, its number)."""
    live_stats: Any = field(default=None, repr=False, compare=False)
    """``physics.live``: the ``LinkStats`` of this port's sending (a switch's), or None."""

    def pending(self) -> bool:
        return self.total_bytes > 0

    def _ready(self, c: int) -> bool:
        q = self.queues[c]
        if not q._n:  # (not ``len(q)``: a Python-level dunder call; this runs several times a frame)
            return False
        if self.kind == "eth":
            return c not in self.paused
        cr = self.credits[c]
        return cr is None or cr >= -(-q.head().size // CREDIT_BYTES)

    def pick(self) -> int | None:
        if self.kind == "eth":
            for c in range(self.classes - 1, -1, -1):
                if self._ready(c):
                    return c
            return None
        arb = self.arbiter
        assert arb is not None
        q = self.queued
        if q and not q & (q - 1) and not arb.arb.high and q != 1 << VL15:  # one data VL queued
            vl = q.bit_length() - 1
            return vl if arb.pick_only(vl, self._ready(vl)) else None
        return arb.pick(self._ready, q)


class Node:
    """A switch or a host of one fabric kind (see the module docstring)."""

    def __init__(self, name: str, kind: Kind, *, switch: bool, latency_ns: int = 0,
                 eth: EthConfig | None = None) -> None:
        if kind not in ("ib", "eth"):
            raise ValueError(f"a node's kind is ib or eth, not {kind!r}")
        self.name = name
        self.kind: Kind = kind
        self.switch = switch
        self.latency_ns = int(latency_ns)
        self.eth = eth or EthConfig()
        self.ports: dict[int, EgressPort] = {}
        self.ib_config: dict[int, IbPortConfig] = {}
        self.sl2vl: dict[tuple[int, int], Sl2Vl] = {}
        """(input port, output port) -> map; a host's ports use (0, port)."""
        self._pipeline: list[tuple[int, int, Frame, int]] = []
        self._seq = 0
        self._xoff_sent: set[tuple[int, int]] = set()
        self._busy: list[tuple[int, int]] = []  # (busy_until, port) of ports with a frame on the wire
        self._dirty: set[int] = set()  # ports whose eligibility may have changed since they last tried
        self.delivered = 0
        self.live_wake = -1
        """``physics.live``: the time of this node's wake-up among the plane's events (-1: none)."""
        self.live_last = 0
        """``physics.live``: the latest time the plane drove this node to (it never goes back)."""

    @property
    def ingress_bytes(self) -> dict[tuple[int, int], int]:
        """(input port, class) -> bytes held (IB: VL buffer use; Ethernet: PFC's count): a
        snapshot of the ports' ``in_bytes`` (where the model keeps them, a list per port)."""
        return {(num, c): n for num, p in self.ports.items() for c, n in enumerate(p.in_bytes)}

    @property
    def ingress_blocks(self) -> dict[tuple[int, int], int]:
        """IB: (input port, VL) -> credits' worth held (64-byte blocks, each frame rounded up):
        a snapshot of the ports' ``in_blocks``. Ethernet: empty."""
        if self.kind != "ib":
            return {}
        return {(num, c): n for num, p in self.ports.items() for c, n in enumerate(p.in_blocks)}

    # --- wiring ---------------------------------------------------------------------------

    def add_port(self, num: int, link: LinkModel, *, ib: IbPortConfig | None = None) -> EgressPort:
        """Add port ``num`` sending on ``link``. IB ports take their QoS (``ib``)."""
        if num in self.ports:
            raise ValueError(f"{self.name} has a port {num} already")
        if self.kind == "ib":
            cfg = ib or IbPortConfig()
            self.ib_config[num] = cfg
            classes = NUM_VLS
            arb: Arbiter | None = Arbiter(cfg.vlarb or VlArb.default(cfg.data_vls))
            credits: list[int | None] = [0] * NUM_VLS
            credits[VL15] = None
        else:
            classes, arb, credits = PRIORITIES, None, [None] * PRIORITIES
        port = EgressPort(num, link, self.kind, classes, [ClassQueue() for _ in range(classes)],
                          [0] * classes, credits, arb)
        if self.kind == "ib":
            port.vls = self.ib_config[num].data_vls
            port.buffer_blocks = self.ib_config[num].buffer_bytes // 64
        self.ports[num] = port
        for (i, o), table in list(self.sl2vl.items()):  # (maps set before the port was)
            if o == num:
                self.set_sl2vl(i, o, table)
        return port

    def connect(self, port: int, peer: tuple[str, int], peer_buffer_bytes: int | None,
                peer_vls: int | None = None) -> None:
        """Record ``port``'s peer and, IB, the credits its input buffer advertises per VL
        (``None``: a peer that never runs out, e.g. a host consuming at once)."""
        p = self.ports[port]
        p.peer = peer
        if self.kind == "ib":
            vls = min(self.ib_config[port].data_vls, peer_vls or NUM_VLS)
            for vl in range(VL15):
                if peer_buffer_bytes is None:
                    p.credits[vl] = None
                else:
                    p.credits[vl] = peer_buffer_bytes // 64 if vl < vls else 0
            p.advertised = list(p.credits)

    def set_sl2vl(self, in_port: int, out_port: int, table: Sl2Vl) -> None:
        self.sl2vl[(in_port, out_port)] = table
        p = self.ports.get(out_port)
        if p is None or in_port < 0:
            return
        maps = p.vl_maps
        while len(maps) <= in_port:  # (the ports without a map of their own take (0, out)'s)
            maps.append(p.vl_map0)
        maps[in_port] = table.vls
        if in_port == 0:
            p.vl_map0 = table.vls
            sl2vl = self.sl2vl
            for i in range(1, len(maps)):
                if (i, out_port) not in sl2vl:
                    maps[i] = table.vls

    def set_vlarb(self, port: int, arb: VlArb) -> None:
        p = self.ports[port]
        p.arbiter = Arbiter(arb)

    # --- events ---------------------------------------------------------------------------

    def receive(self, in_port: int, frame: Frame, now: int, out_port: int | None = None) -> list[Action]:
        """``frame`` has fully arrived on ``in_port`` at ``now``."""
        out: list[Action] = []
        p = self.ports.get(in_port)
        if p is not None:
            if not p.up:  # in flight on the cable when it went down: lost, no credit returned
                return [Drop(self.name, in_port, frame, "port_down", now)]
            p.counters.rcv_frames += 1
            p.counters.rcv_bytes += frame.size
        if out_port is None:  # consumed: its buffer frees at once
            self.delivered += 1
            out.append(Deliver(self.name, in_port, frame, now))
            if self.kind == "ib" and not frame.vl15 and p is not None:
                out.append(CreditReturn(self.name, in_port, frame.vl, blocks(frame.size),
                                        now + p.link.propagation))
            self._advance(now, out)
            return out
        frame.in_port, frame.in_class = in_port, frame.vl
        if not frame.vl15 and p is not None:
            vl = frame.vl
            p.in_bytes[vl] += frame.size
            if self.kind == "ib":
                held = p.in_blocks[vl] + blocks(frame.size)
                p.in_blocks[vl] = held
                if held > p.buffer_blocks:
                    p.counters.buffer_overruns += 1
            else:
                self._pfc_check(in_port, vl, now, out)
        seq = self._seq
        self._seq = seq + 1
        heappush(self._pipeline, (now + self.latency_ns, seq, frame, out_port))
        self._advance(now, out)
        return out

    def inject(self, port: int, frame: Frame, now: int) -> list[Action]:
        """A host's transport sends ``frame`` out of ``port`` (no input buffer held)."""
        frame.in_port, frame.in_class = -1, -1
        out: list[Action] = []
        self._enqueue(port, frame, now, 0, out)
        self._advance(now, out)
        return out

    def credit_return(self, port: int, vl: int, nblocks: int, now: int) -> list[Action]:
        p = self.ports[port]
        if not p.up:  # flow control runs over the link: lost (``port_up`` resynchronizes)
            return []
        cr = p.credits[vl]
        if cr is not None:
            p.credits[vl] = cr + nblocks
        p.last_credit_ns[vl] = now
        self._dirty.add(port)
        return self.advance(now)

    def pause(self, port: int, priority: int, xoff: bool, now: int) -> list[Action]:
        p = self.ports[port]
        if not p.up:  # a pause frame does not cross a dead link
            return []
        p.counters.pause_received += 1
        if xoff and priority not in p.paused:
            p.paused.add(priority)
            p.paused_since[priority] = now
        elif not xoff and priority in p.paused:
            p.paused.discard(priority)
            p.counters.paused_ns += now - p.paused_since.pop(priority, now)
            self._dirty.add(port)
        return self.advance(now)

    def port_down(self, port: int, now: int) -> list[Action]:
        """The link of ``port`` went down at ``now``: its queues are discarded (PortXmitDiscards),
        their input buffer freed (credits back upstream, PFC counts down), its credits gone."""
        p = self.ports[port]
        if not p.up:
            return []
        out = self.advance(now)
        p.up = False
        if p.waiting_since is not None:
            p.counters.xmit_wait_ns += now - p.waiting_since
            p.waiting_since = None
        p.blocked_since.clear()
        for c, q in enumerate(p.queues):
            while q._n:
                frame = q.popleft()
                p.counters.xmit_discards += 1
                p.counters.inactive_discards += 1
                out.append(Drop(self.name, port, frame, "port_down", now))
                self._release(frame, now, out)
            p.queued_bytes[c] = 0
        p.total_bytes = 0
        p.queued = 0
        if self.kind == "ib":
            p.credits = [None if cr is None else 0 for cr in p.credits]
        for prio in list(p.paused):  # pauses are not aged in the model: forget them
            p.counters.paused_ns += now - p.paused_since.pop(prio, now)
        p.paused.clear()
        self._advance(now, out)
        return out

    def port_up(self, port: int, now: int, free: dict[int, int] | None = None) -> list[Action]:
        """The link of ``port`` came up at ``now``. IB: its credits per data VL are ``free``
        (the peer's input buffer free now, in 64-byte blocks), else what the peer advertised
        at ``connect``."""
        p = self.ports[port]
        if p.up:
            return []
        p.up = True
        if self.kind == "ib":
            credits: list[int | None] = list(p.advertised) if p.advertised else [0] * NUM_VLS
            if free is not None:
                for vl, n in free.items():
                    if credits[vl] is not None:
                        credits[vl] = n
            credits[VL15] = None
            p.credits = credits
        self._dirty.add(port)
        return self.advance(now)

    def next_deadline(self) -> int | None:
        """When :meth:`advance` has something to do next (None: nothing until an event)."""
        t = self._busy[0][0] if self._busy else None
        if self._pipeline and (t is None or self._pipeline[0][0] < t):
            t = self._pipeline[0][0]
        return t

    def advance(self, now: int) -> list[Action]:
        """Run what is due by ``now``: frames leaving the wire, frames leaving the switch
        pipeline for their egress queue, ports starting their next frame."""
        out: list[Action] = []
        self._advance(now, out)
        return out

    # (The internals append their actions to the caller's list ``out``, in the order they
    # happen: compiled, a list made and concatenated per step was a good part of the work.)

    def _advance(self, now: int, out: list[Action]) -> None:
        busy, pipeline, dirty = self._busy, self._pipeline, self._dirty
        while busy or pipeline:  # next_deadline(), inlined: the busy port first on a tie
            if busy and (not pipeline or busy[0][0] <= pipeline[0][0]):
                t = busy[0][0]
                if t > now:
                    break
                _, num = heappop(busy)
                self._finish(self.ports[num], t, out)
                dirty.add(num)
            else:
                t = pipeline[0][0]
                if t > now:
                    break
                _, _, frame, out_port = heappop(pipeline)
                self._enqueue(out_port, frame, t, frame.in_port, out)
            if dirty:
                self._start_dirty(t, out)
        if dirty:
            self._start_dirty(now, out)

    def _start_dirty(self, now: int, out: list[Action]) -> None:
        dirty = self._dirty
        if not dirty:
            return
        ports = self.ports
        if len(dirty) == 1:
            p = ports[dirty.pop()]
            if p.in_flight is not None or now < p.busy_until or not p.total_bytes:
                return  # (``_start``'s own first test: nothing to start)
            self._start(p, now, out)
            return
        for num in sorted(dirty):
            self._start(ports[num], now, out)
        dirty.clear()

    # --- internals ------------------------------------------------------------------------

    def _class_of(self, frame: Frame, in_port: int, out_port: int) -> int | None:
        if self.kind == "eth":
            return frame.sl if 0 <= frame.sl < PRIORITIES else 0
        if frame.vl15:
            return VL15
        p = self.ports[out_port]
        maps = p.vl_maps  # (Node.sl2vl's (in_port, out_port), else its (0, out_port))
        table = maps[in_port] if 0 <= in_port < len(maps) else p.vl_map0
        vls = p.vls  # (its IbPortConfig's data_vls)
        vl = table[frame.sl] if table is not None else frame.sl % vls
        return vl if vl < vls else None

    def _enqueue(self, out_port: int, frame: Frame, now: int, in_port: int, out: list[Action]) -> None:
        p = self.ports[out_port]
        if not p.up:  # decided for a port whose link is down: discarded (PortXmitDiscards)
            p.counters.xmit_discards += 1
            p.counters.inactive_discards += 1
            out.append(Drop(self.name, out_port, frame, "port_down", now))
            self._release(frame, now, out)
            return
        c = self._class_of(frame, in_port, out_port)
        if c is None:  # SL mapped to VL15 or to a VL the port does not operate
            p.counters.xmit_discards += 1
            out.append(Drop(self.name, out_port, frame, "vl_mapping", now))
            self._release(frame, now, out)
            return
        if self.kind == "eth" and self.switch:  # a host's queue (its NIC's send queue) neither drops nor marks
            if c not in self.eth.lossless and p.total_bytes + frame.size > self.eth.buffer_bytes:
                p.counters.drops += 1
                out.append(Drop(self.name, out_port, frame, "buffer", now))
                self._release(frame, now, out)
                return
            if frame.ecn_capable and self.eth.ecn_mark_bytes and p.queued_bytes[c] > self.eth.ecn_mark_bytes:
                frame.ce = True
                p.counters.ecn_marked += 1
        frame.vl = c
        p.queues[c].append(frame, in_port)
        p.queued |= 1 << c
        p.queued_bytes[c] += frame.size
        p.total_bytes += frame.size
        p.counters.max_queue_bytes = max(p.counters.max_queue_bytes, p.total_bytes)
        self._dirty.add(out_port)

    def _start(self, p: EgressPort, now: int, out: list[Action]) -> None:
        if p.in_flight is not None or now < p.busy_until or not p.total_bytes:
            return
        c = p.pick()
        if c is None:
            if p.waiting_since is None:
                p.waiting_since = now
            if p.kind == "ib":
                for vl in range(p.vls):
                    if p.queues[vl] and vl not in p.blocked_since:
                        p.blocked_since[vl] = now
                        p.counters.credit_stalls += 1
            return
        if p.waiting_since is not None:
            p.counters.xmit_wait_ns += now - p.waiting_since
            p.waiting_since = None
        q = p.queues[c]
        frame = q.popleft()
        if not q._n:
            p.queued &= ~(1 << c)
        p.queued_bytes[c] -= frame.size
        p.total_bytes -= frame.size
        if p.blocked_since:
            p.blocked_since.pop(c, None)
        if p.kind == "ib":
            assert p.arbiter is not None
            p.arbiter.sent(c, frame.size)
            cr = p.credits[c]
            if cr is not None:
                p.credits[c] = cr - blocks(frame.size)
            # a VL still queued but short of credits keeps waiting
            blocked = p.blocked_since
            m = p.queued & ((1 << p.vls) - 1)  # the data VLs holding frames
            while m:
                vl = (m & -m).bit_length() - 1
                m &= m - 1
                if vl not in blocked and not p._ready(vl):
                    blocked[vl] = now
                    p.counters.credit_stalls += 1
        end = now + p.link.frame_ns(frame.size)
        p.busy_until = end
        p.in_flight = (frame, frame.in_port, frame.in_class)
        heappush(self._busy, (end, p.num))
        p.counters.xmit_frames += 1
        p.counters.xmit_bytes += frame.size
        out.append(Transmit(self.name, p.num, frame, c, now, end, end + p.link.propagation))

    def _finish(self, p: EgressPort, t: int, out: list[Action]) -> None:
        assert p.in_flight is not None
        frame, in_port, in_class = p.in_flight
        p.in_flight = None
        self._release(frame, t, out, in_port, in_class)

    def _release(self, frame: Frame, now: int, out: list[Action], in_port: int | None = None,
                 in_class: int | None = None) -> None:
        """``frame`` no longer holds its input buffer: credits back (IB) or PFC (Ethernet).
        (The frame object moves on: its input port here is passed in once it is on the wire.)"""
        in_port = frame.in_port if in_port is None else in_port
        in_class = frame.in_class if in_class is None else in_class
        if in_port < 0 or frame.vl15:
            return
        pin = self.ports[in_port]
        pin.in_bytes[in_class] -= frame.size
        if self.kind == "ib":
            nb = blocks(frame.size)
            pin.in_blocks[in_class] -= nb
            out.append(CreditReturn(self.name, in_port, in_class, nb, now + pin.link.propagation))
            return
        self._pfc_check(in_port, in_class, now, out)

    def _pfc_check(self, in_port: int, prio: int, now: int, out: list[Action]) -> None:
        if prio not in self.eth.lossless:
            return
        key = (in_port, prio)
        p = self.ports[in_port]
        held = p.in_bytes[prio]
        if key not in self._xoff_sent and held > self.eth.xoff_bytes:
            self._xoff_sent.add(key)
            p.counters.pause_sent += 1
            out.append(Pause(self.name, in_port, prio, True, now + p.link.propagation))
            return
        if key in self._xoff_sent and held < self.eth.xon_bytes:
            self._xoff_sent.discard(key)
            p.counters.pause_sent += 1
            out.append(Pause(self.name, in_port, prio, False, now + p.link.propagation))
