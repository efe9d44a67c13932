"""A reference discrete-event simulator driving the model: the forwarding loop, without IO.

It is what a live datapath does with the model's actions, in pure emulated time: deliver a
:class:`~ibemu.physics.model.Transmit` to the peer's ``receive`` at ``arrive_ns`` (asking
``route`` for the egress port at a switch), a credit return or pause to the peer at ``at_ns``,
and wake every node at its ``next_deadline``. Tests and ``benchmarks/bench_physics.py`` use it
to check the model against its analytic expectations. Events due at the same ns run in a
seeded random order (``seed``): a fixed order would let one of two senders whose frames
arrive in the same ns always win the last slot of a drop-tail buffer (a phase effect no real
fabric, with its jitter, shows); its figures are the model's, not the live
datapath's.

Traffic: :class:`Flow` s of fixed-size frames from a host to a destination, started at
``start_ns``; a flow keeps ``backlog`` frames queued at its host's port (a saturating sender
whose transport has a window of that many frames; the host port then sends at line rate when
the fabric lets it), ``frames`` in all (None: until the run ends).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from functools import partial

from ibemu.physics.deadlock import CreditLoop, find_credit_loops
from ibemu.physics.link import LinkModel
from ibemu.physics.model import (
    Action,
    CreditReturn,
    Deliver,
    Drop,
    EthConfig,
    Frame,
    IbPortConfig,
    Kind,
    Node,
    Pause,
    Transmit,
)

Route = Callable[[str, Frame], int]
"""(switch name, frame) -> egress port."""


@dataclass(slots=True)
class Flow:
    src: str
    dst: Hashable
    """What ``route`` keys on (a LID, a host name ...)."""
    size: int = 4096
    sl: int = 0
    frames: int | None = None
    backlog: int = 4
    start_ns: int = 0
    ecn_capable: bool = False
    name: str = ""
    port: int = 1
    sent: int = 0
    queued: int = 0
    """Frames waiting at the host's port (not yet started on the wire)."""
    delivered: int = 0
    delivered_bytes: int = 0
    dropped: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    latencies: list[int] = field(default_factory=list)
    reordered: int = 0
    """Frames delivered after a later frame of the flow (``meta``, the frame's number, lower
    than the highest delivered): what a receiver of the flow sees as out of order."""
    top: int = -1

    def rate_gbps(self) -> float:
        """Delivered frame bytes over the time from the flow's start to its last delivery."""
        if self.last_ns is None or self.last_ns <= self.start_ns:
            return 0.0
        return self.delivered_bytes * 8 / (self.last_ns - self.start_ns)


class Simulator:
    """Nodes, cables and a clock; :meth:`run` plays the events in time order."""

    def __init__(self, kind: Kind, route: Route, *, seed: int = 0) -> None:
        self.kind: Kind = kind
        self.route = route
        self.nodes: dict[str, Node] = {}
        self.host_of: dict[Hashable, str] = {}
        self.flows: list[Flow] = []
        self.now = 0
        self._events: list[tuple[int, float, int, Callable[[], list[Action]]]] = []
        self._rng = random.Random(seed)
        self._seq = itertools.count()
        self._wake: dict[str, int] = {}
        self._inflight: dict[int, Flow] = {}
        self.drops = 0
        self.pauses = 0
        self.events = 0
        self._touched: set[str] = set()

    # --- building -------------------------------------------------------------------------

    def add_switch(self, name: str, *, latency_ns: int, eth: EthConfig | None = None) -> Node:
        n = Node(name, self.kind, switch=True, latency_ns=latency_ns, eth=eth)
        self.nodes[name] = n
        return n

    def add_host(self, name: str, *, address: Hashable = None, eth: EthConfig | None = None) -> Node:
        n = Node(name, self.kind, switch=False, eth=eth)
        self.nodes[name] = n
        self.host_of[address if address is not None else name] = name
        return n

    def cable(self, a: str, pa: int, b: str, pb: int, link: LinkModel, *,
              ib_a: IbPortConfig | None = None, ib_b: IbPortConfig | None = None) -> None:
        """A cable between ``a:pa`` and ``b:pb``, the same model each way. IB: each end
        advertises its input buffer per VL (a host's is never full: it consumes at once)."""
        na, nb = self.nodes[a], self.nodes[b]
        na.add_port(pa, link, ib=ib_a)
        nb.add_port(pb, link, ib=ib_b)
        ca = na.ib_config.get(pa)
        cb = nb.ib_config.get(pb)
        na.connect(pa, (b, pb), (cb.buffer_bytes if cb else None) if nb.switch else None,
                   cb.data_vls if cb else None)
        nb.connect(pb, (a, pa), (ca.buffer_bytes if ca else None) if na.switch else None,
                   ca.data_vls if ca else None)

    def adopt(self, nodes: dict[str, Node], addresses: dict[str, Hashable] | None = None) -> None:
        """Take already cabled nodes (``ibemu.physics.plan.build_nodes``); ``addresses``: what
        flows name each host by (default: its name)."""
        for name, node in nodes.items():
            self.nodes[name] = node
            if not node.switch:
                self.host_of[(addresses or {}).get(name, name)] = name

    def add_flow(self, flow: Flow) -> Flow:
        self.flows.append(flow)
        self._at(flow.start_ns, partial(self._refill, flow, flow.start_ns))
        return flow

    # --- running --------------------------------------------------------------------------

    def _at(self, t: int, fn: Callable[[], list[Action]]) -> None:
        heapq.heappush(self._events, (t, self._rng.random(), next(self._seq), fn))

    def _refill(self, flow: Flow, now: int) -> list[Action]:
        host = self.nodes[flow.src]
        out: list[Action] = []
        while flow.queued < flow.backlog and (flow.frames is None or flow.sent < flow.frames):
            f = Frame(flow.size, sl=flow.sl, dst=flow.dst, flow=flow, ecn_capable=flow.ecn_capable,
                      born_ns=now, meta=flow.sent)  # meta: the frame's number within its flow
            flow.sent += 1
            flow.queued += 1
            out += host.inject(flow.port, f, now)
        self._touched.add(flow.src)
        return out

    def _dispatch(self, actions: Iterable[Action]) -> None:
        for a in actions:
            if isinstance(a, Transmit):
                peer = self.nodes[a.node].ports[a.port].peer
                assert peer is not None
                fl = a.frame.flow
                if isinstance(fl, Flow) and a.node == fl.src:
                    fl.queued -= 1
                    self._at(a.start_ns, partial(self._refill, fl, a.start_ns))
                self._at(a.arrive_ns, partial(self._arrive, a, peer))
            elif isinstance(a, CreditReturn):
                peer = self.nodes[a.node].ports[a.port].peer
                assert peer is not None
                self._at(a.at_ns, partial(self.nodes[peer[0]].credit_return, peer[1], a.vl, a.blocks, a.at_ns))
                self._touched.add(peer[0])
            elif isinstance(a, Pause):
                self.pauses += 1
                peer = self.nodes[a.node].ports[a.port].peer
                assert peer is not None
                self._at(a.at_ns, partial(self._pause, peer, a))
            elif isinstance(a, Deliver):
                fl = a.frame.flow
                if isinstance(fl, Flow):
                    fl.delivered += 1
                    fl.delivered_bytes += a.frame.size
                    fl.first_ns = fl.first_ns if fl.first_ns is not None else a.at_ns
                    fl.last_ns = a.at_ns
                    fl.latencies.append(a.at_ns - a.frame.born_ns)
                    n = a.frame.meta
                    if isinstance(n, int):
                        if n < fl.top:
                            fl.reordered += 1
                        else:
                            fl.top = n
            elif isinstance(a, Drop):
                self.drops += 1
                fl = a.frame.flow
                if isinstance(fl, Flow):
                    fl.dropped += 1
        for name in {a.node for a in actions} | self._touched:
            self._schedule_wake(name)
        self._touched.clear()

    def _pause(self, peer: tuple[str, int], a: Pause) -> list[Action]:
        self._touched.add(peer[0])
        return self.nodes[peer[0]].pause(peer[1], a.priority, a.xoff, a.at_ns)

    def _arrive(self, a: Transmit, peer: tuple[str, int]) -> list[Action]:
        node = self.nodes[peer[0]]
        out_port = self.route(node.name, a.frame) if node.switch else None
        self._touched.add(node.name)
        return node.receive(peer[1], a.frame, a.arrive_ns, out_port)

    def _schedule_wake(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        t = node.next_deadline()
        if t is None:
            return
        if self._wake.get(name) == t:
            return
        self._wake[name] = t
        self._at(t, partial(self._wakeup, name, t))

    def _wakeup(self, name: str, t: int) -> list[Action]:
        if self._wake.get(name) == t:
            del self._wake[name]
        self._touched.add(name)
        return self.nodes[name].advance(t)

    def run(self, until_ns: int, *, check_deadlock_ns: int | None = None,
            stall_ns: int = 100_000) -> list[CreditLoop]:
        """Play events up to ``until_ns``. With ``check_deadlock_ns``, look for credit loops
        that often (IB) and stop at the first found; return the loops found."""
        next_check = check_deadlock_ns
        while self._events and self._events[0][0] <= until_ns:
            t, _, _, fn = heapq.heappop(self._events)
            if next_check is not None and check_deadlock_ns is not None and t >= next_check:
                loops = find_credit_loops(self.nodes, next_check, stall_ns)
                if loops:
                    self.now = next_check
                    return loops
                next_check += check_deadlock_ns
            self.now = t
            self.events += 1
            self._dispatch(fn())
        self.now = max(self.now, until_ns) if not self._events else until_ns
        if check_deadlock_ns is not None:
            return find_credit_loops(self.nodes, self.now, stall_ns)
        return []
