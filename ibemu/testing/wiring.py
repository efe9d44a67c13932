"""An in-memory fabric of device agents: cables as dict entries, no kernel, no sockets.

Moves every ``Send`` to the peer agent's ``receive`` (breadth-first, deterministic),
carries out ``LinkRequest``s on both ends, and records what happened: every packet on
every link (``wire``), ``DeliverMad``s per CA, ``LftUpdate``s and ``PortStateChange``s per
agent, and all ``Event``s. Time is a ``ManualClock`` shared by the agents; ``advance``
moves it and ticks every agent. Used by the device tests and the benchmarks, and usable by
an SM's tests::

    fab = InMemoryFabric()
    sm = fab.add("sm", CaAgent(node_guid=0x10, clock=fab.clock))
    sw = fab.add("sw", SwitchAgent(node_guid=0x20, num_ports=4, clock=fab.clock))
    fab.connect("sm", 1, "sw", 1)
    got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, dr_smp(GET, 0x11, path=[1, 1]))
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ibemu.agents.actions import (
    Action,
    AltUpdate,
    DeliverMad,
    Event,
    LftUpdate,
    LinkRequest,
    LinkRequestKind,
    PortStateChange,
    Send,
)
from ibemu.agents.device import DeviceAgent


class ManualClock:
    """A monotonic ns clock that only moves when told to (callable like time.monotonic_ns)."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> int:
        if ns < 0:
            raise ValueError("time does not go backwards")
        self.now_ns += ns
        return self.now_ns


@dataclass(frozen=True, slots=True)
class WireRecord:
    """One packet that crossed a link (``dst`` None: the port had no cable)."""

    seq: int
    src: str
    src_port: int
    dst: str | None
    dst_port: int | None
    packet: bytes


Endpoint = tuple[str, int]
# impair(record) -> the packet to deliver (possibly modified) or None to lose it
Impairment = Callable[[WireRecord], bytes | None]


@dataclass
class InMemoryFabric:
    clock: ManualClock = field(default_factory=ManualClock)
    strict: bool = True  # raise if an agent reports an internal error
    record_wire: bool = True
    max_steps: int = 1_000_000
    agents: dict[str, DeviceAgent] = field(default_factory=dict)
    links: dict[Endpoint, Endpoint] = field(default_factory=dict)
    wire: list[WireRecord] = field(default_factory=list)
    delivered: dict[str, list[DeliverMad]] = field(default_factory=dict)
    lft_updates: dict[str, list[LftUpdate]] = field(default_factory=dict)
    alt_updates: dict[str, list[AltUpdate]] = field(default_factory=dict)
    state_changes: dict[str, list[PortStateChange]] = field(default_factory=dict)
    link_requests: dict[str, list[LinkRequest]] = field(default_factory=dict)
    events: list[tuple[str, Event]] = field(default_factory=list)
    impair: Impairment | None = None
    _queue: deque[tuple[str, int, bytes]] = field(default_factory=deque)
    _seq: int = 0
    _disabled: set[Endpoint] = field(default_factory=set)

    # ------------------------------------------------------------------ building

    def add(self, name: str, agent: DeviceAgent) -> DeviceAgent:
        if name in self.agents:
            raise ValueError(f"an agent named {name!r} exists")
        self.agents[name] = agent
        for book in (self.delivered, self.lft_updates, self.alt_updates, self.state_changes, self.link_requests):
            book[name] = []
        return agent

    def connect(self, a: str, pa: int, b: str, pb: int, *, up: bool = True) -> None:
        """Cable ``a:pa`` to ``b:pb`` and (by default) train the link."""
        for end in ((a, pa), (b, pb)):
            if end[0] not in self.agents:
                raise ValueError(f"no agent {end[0]!r}")
            if end in self.links:
                raise ValueError(f"{end[0]}:{end[1]} is already cabled")
        self.links[(a, pa)] = (b, pb)
        self.links[(b, pb)] = (a, pa)
        if up:
            self.link_up(a, pa)

    def peer(self, name: str, port: int) -> Endpoint | None:
        return self.links.get((name, port))

    # ------------------------------------------------------------------ link events

    def link_up(self, name: str, port: int) -> None:
        """Train the cable at ``name:port`` (both ends come up unless one is disabled)."""
        other = self.links.get((name, port))
        if other is None:
            raise ValueError(f"{name}:{port} has no cable")
        if (name, port) in self._disabled or other in self._disabled:
            return
        self.handle(name, self.agents[name].link_up(port))
        self.handle(other[0], self.agents[other[0]].link_up(other[1]))
        self.run()

    def link_down(self, name: str, port: int) -> None:
        """Break the cable at ``name:port``: both ends see the link go down."""
        other = self.links.get((name, port))
        self.handle(name, self.agents[name].link_down(port))
        if other is not None:
            self.handle(other[0], self.agents[other[0]].link_down(other[1]))
        self.run()

    def disconnect(self, name: str, port: int) -> None:
        """Unplug the cable: link down on both ends, and it is gone."""
        self.link_down(name, port)
        other = self.links.pop((name, port), None)
        if other is not None:
            self.links.pop(other, None)

    # ------------------------------------------------------------------ traffic

    def send_mad(self, name: str, port: int, dlid: int, dqp: int, sqp: int, mad: bytes,
                 **kwargs: int) -> list[DeliverMad]:
        """A client MAD from CA ``name``; runs the fabric; returns the MADs ``name`` got."""
        agent = self.agents[name]
        send = getattr(agent, "send_mad", None)
        if send is None:
            raise TypeError(f"{name!r} is not a CA")
        before = len(self.delivered[name])
        self.handle(name, send(port, dlid, dqp, sqp, mad, **kwargs))
        self.run()
        return self.delivered[name][before:]

    def inject(self, name: str, port: int, packet: bytes) -> None:
        """Hand ``packet`` to ``name`` as if it arrived on ``port`` (then run)."""
        self._queue.append((name, port, packet))
        self.run()

    def advance(self, ns: int) -> None:
        """Move the clock forward by ``ns``, stopping at every agent deadline on the way
        (so a 10 s advance delivers every 2 s trap repeat in order)."""
        target = self.clock.now_ns + ns
        if ns < 0:
            raise ValueError("time does not go backwards")
        while True:
            deadlines = [(d, name) for name, a in self.agents.items()
                         if (d := a.next_deadline()) is not None and d <= target]
            if not deadlines:
                break
            when = max(min(deadlines)[0], self.clock.now_ns)
            self.clock.now_ns = when
            for name, agent in self.agents.items():
                deadline = agent.next_deadline()
                if deadline is not None and deadline <= when:
                    self.handle(name, agent.tick(when))
            self.run()
        self.clock.now_ns = target

    # ------------------------------------------------------------------ engine

    def handle(self, name: str, actions: list[Action]) -> None:
        """Carry out ``actions`` produced by agent ``name`` (Sends are queued)."""
        for action in actions:
            if isinstance(action, Send):
                self._transmit(name, action.port, action.packet)
            elif isinstance(action, DeliverMad):
                self.delivered[name].append(action)
            elif isinstance(action, LftUpdate):
                self.lft_updates[name].append(action)
            elif isinstance(action, AltUpdate):
                self.alt_updates[name].append(action)
            elif isinstance(action, PortStateChange):
                self.state_changes[name].append(action)
            elif isinstance(action, LinkRequest):
                self.link_requests[name].append(action)
                self._link_request(name, action)
            elif isinstance(action, Event):
                self.events.append((name, action))
                if self.strict and action.kind == "internal_error":
                    raise AssertionError(f"{name}: internal error: {action.fields}")

    def run(self) -> int:
        """Deliver queued packets until the fabric is quiet; returns the number delivered."""
        steps = 0
        while self._queue:
            steps += 1
            if steps > self.max_steps:
                raise RuntimeError(f"fabric did not go quiet after {self.max_steps} packets")
            name, port, packet = self._queue.popleft()
            self.handle(name, self.agents[name].receive(port, packet))
        return steps

    def _transmit(self, name: str, port: int, packet: bytes) -> None:
        peer = self.links.get((name, port))
        self._seq += 1
        record = WireRecord(self._seq, name, port, peer[0] if peer else None,
                            peer[1] if peer else None, packet)
        if self.record_wire:
            self.wire.append(record)
        if peer is None:
            return
        if self.impair is not None:
            out = self.impair(record)
            if out is None:
                return
            packet = out
        self._queue.append((peer[0], peer[1], packet))

    def _link_request(self, name: str, req: LinkRequest) -> None:
        end = (name, req.port)
        other = self.links.get(end)
        if req.kind == LinkRequestKind.DISABLE:
            self._disabled.add(end)
            if other is not None:
                self.handle(other[0], self.agents[other[0]].link_down(other[1]))
        elif req.kind == LinkRequestKind.ENABLE:
            self._disabled.discard(end)
            if other is not None and other not in self._disabled:
                self.handle(name, self.agents[name].link_up(req.port))
                self.handle(other[0], self.agents[other[0]].link_up(other[1]))
        elif other is not None:
            self.handle(other[0], self.agents[other[0]].link_retrained(other[1]))

    # ------------------------------------------------------------------ queries

    def events_of(self, kind: str, name: str | None = None) -> list[Event]:
        return [e for n, e in self.events if e.kind == kind and (name is None or n == name)]

    def on_link(self, a: str, pa: int) -> list[WireRecord]:
        """Packets that crossed the cable at ``a:pa``, both directions, in order."""
        peer = self.links.get((a, pa))
        return [r for r in self.wire
                if (r.src, r.src_port) == (a, pa) or (peer and (r.src, r.src_port) == peer)]
