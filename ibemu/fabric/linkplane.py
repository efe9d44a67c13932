"""The IB user datapath's link physics: the thin IO adapter around ``ibemu.physics.live``.

The IO both user datapaths share (departures, the timerfd, link fidelity records) is
``ibemu.kernel.linkio.LiveLinks``; this adds IB's: frames matched by LRH and BTH, credits
settled for frames a switch consumed, QoS tables from the agents, PMA counters, credit loops.

The agent host's forwarding loop (``AgentHost._forward_batch``) decides each frame's egress
port and hands every egress port's list to :meth:`LinkPlane.submit` instead of sending it.
The plane (sans-IO, :class:`~ibemu.physics.live.LivePlane`) times every frame through the link
model on the emulated clock (``ibemu.clock``): serialization at each cable's data rate,
propagation, switch latency, VL arbitration and per-VL credits between switch ports (all the
switches live in this process, so credits between two of them are the model's own state: no
flow-control packets cross the veths); VL15 is not credited. What is due goes out at once
(``TxBatcher``) and one timerfd is armed for the next deadline (``clock.to_real_ns``: at
dilation N an emulated interval lasts N times as long): a wake-up serves every frame due by
then, no frame has a timer of its own. Between wake-ups, frames received are timed at the
emulated instant the batch was read.

Host ports (see ``ibemu.physics.live`` for the model): a switch -> host cable serializes at
the host cable's rate and the HCA always has credits (it consumes at once); a host -> switch
cable cannot back-pressure the host's transport (no link-level flow control on a veth), so
the host's egress is modelled at the switch's ingress: its frames wait in an unbounded queue
standing for the HCA's send queue (never dropped) and leave it at the host cable's rate, with
the switch input buffer's credits.

Every :data:`REPORT_S` (real seconds, from the agent host's ticker, :meth:`tick`):

- the model's congestion counters go into the switch agents' PMA counters: ``port_xmit_wait``
  (time an egress port had data queued and could send none, in ticks of one 4-byte symbol time
  of the cable: a 4x link moves 4 bytes per symbol time; IBA leaves the unit to the
  implementation), ``port_xmit_discards`` (an SL mapped to a VL the port does not operate;
  what was queued for a port when its link went down, and what reached it while down:
  ``Node.port_down``; those also as ``port_inactive_discards``, PortXmitDiscardDetails),
  ``excessive_buffer_overrun_errors`` (never, while credits are kept);
- credit loops (``physics.deadlock.find_credit_loops``, no credit returned on a cycle of
  (switch, port, VL) for :data:`LOOP_STALL_NS` of emulated time) are logged once each as a
  ``credit_loop`` event in the fabric log naming the ports and VLs;
- per cable direction, a ``link_fidelity`` record (frames, bytes, lateness of the real
  departures against the model's, the busy ratio, and the frames the port's socket dropped
  because the datapath did not read them in time: ``PACKET_STATISTICS``) goes to the run's
  lag log when there is one (``lagmon.log_path``), where ``scenario.fidelity`` judges the
  links with the processes.

QoS: the model starts with one data VL and the default tables; every ``REPORT_S``
(``sync_qos``) it re-reads the SL -> VL maps, VL arbitration tables and OperationalVLs of the
agents whose tables changed (``DeviceAgent.qos_version``), CAs' included: at the first report
the agents' own (their ports start at OperationalVLs = VLCap, eight VLs, SL n on VL n), then
what the SM set.

Adaptive routing (``fabric.adaptive_routing``): with ``adapt`` given, the plane offers each
data frame reaching a switch in the model to it (``LivePlane.adapt``) with the load of that
switch's egress ports (``physics.live.egress_load``); ``adapt`` is the switch's
``Forwarder.adapt``, which picks the group's least-loaded port.

Hand-over in memory (``LiveLinks``, shared with the RoCE user datapath): a frame onto a cable
between two switches goes to the other switch's forwarding (``deliver``) with the Ethernet
header the veth would carry, instead of through the veth, unless either end has no carrier or a
capture listens on it (``ibemu.kernel.linkio``'s docstring).

Deviations: VL15 frames the SMAs send themselves (``Send`` actions, answers
and traps) leave at once, outside the model: only the SMPs the forwarders relay are timed.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ibemu import clock
from ibemu.events import FabricLog, Kind
from ibemu.fabric.linkframes import ETH_LEN, hand_in, hand_over
from ibemu.kernel.linkio import CAPTURE_CHECK_S, LiveLinks, link_record
from ibemu.physics.link import SwitchModel
from ibemu.physics.live import Departure, egress_load
from ibemu.physics.model import Frame, Node

log = logging.getLogger(__name__)

__all__ = ["CAPTURE_CHECK_S", "LinkPlane", "link_record", "match_key"]

REPORT_S = 1.0
"""How often (real seconds) counters, credit loops and link fidelity are reported."""
LOOP_STALL_NS = 1_000_000
"""A cycle of ports with no credit returned for 1 ms of emulated time is a credit loop."""
SYMBOL_BYTES = 4
"""PortXmitWait's tick: the time a cable takes for this many bytes (one symbol on each of 4 lanes)."""


def match_key(frame: bytes | bytearray | memoryview) -> bytes:
    """What identifies a frame on a cable at both ends: its LRH from the DLID on and its BTH
    (``frame`` with its Ethernet header). The VL nibble, which a switch may rewrite, is left out."""
    return bytes(frame[ETH_LEN + 2:ETH_LEN + 20])


class LinkPlane(LiveLinks):
    """The model of every switch of the fabric, and the IO that carries it out."""

    def __init__(self, nodes: Mapping[str, Node], model: SwitchModel, *,
                 sockets: Callable[[str, int], socket.socket | None],
                 heads: Callable[[str, int], bytes], powered: Callable[[str], bool],
                 events: FabricLog, counts: Callable[[str, int, dict[str, int]], None],
                 decide: Callable[[str, int, bytes], tuple[int, bytes] | None] | None = None,
                 adapt: Callable[[str, int, bytes, int, int, Callable[[int], int]], int] | None = None,
                 deliver: Callable[[str, int, list[bytes]], None] | None = None,
                 carrier: Callable[[str, int], bool] | None = None,
                 where: Callable[[str, int], tuple[str | None, str]] | None = None) -> None:
        """``decide(switch, in_port, frame)``: the switch's forwarding decision for ``frame``
        (with its Ethernet header) now: (egress port, the frame to send), None where it sends
        it nowhere; taken again for a frame from a host whose egress port went down while the
        frame waited in the HCA's queue (``LivePlane.redecide``).

        The hand-over in memory between two switches of the plane (module docstring) needs
        all three of: ``deliver(switch, port, frames)``, the datapath's reading of ``frames``
        (with their Ethernet headers) on ``switch:port``; ``carrier(switch, port)``, the port's
        carrier as the datapath last saw it; ``where(switch, port)``, the port's namespace
        and device (for captures on it)."""
        super().__init__(nodes, sockets=sockets, heads=heads, powered=powered, deliver=deliver, carrier=carrier,
                         where=where)
        self._decide = decide
        if decide is not None:
            self.plane.redecide = self._redecide
        self._adapt = adapt
        if adapt is not None:
            self.plane.adapt = self._adapt_frame
        self.model = model
        self._counts = counts
        self.events = events
        self._pushed: dict[tuple[str, int], tuple[int, int, int, int]] = {}
        self._loops_seen: set[frozenset[tuple[str, int, int]]] = set()
        self._last_report = clock.monotonic()
        self._last_capture = clock.monotonic()
        self._qos_seen: dict[str, tuple[int, ...]] = {}
        self._batch: list[dict[int, list[bytes]]] = []
        """What was submitted since ``begin`` (what a batch forwarded: :meth:`settle`)."""
        self._batch_n = 0
        """How many frames that is."""

    # --- the forwarding loop's side -------------------------------------------------------

    def submit(self, switch: str, in_port: int, out: dict[int, list[bytes]]) -> None:
        """The frames ``switch`` received on ``in_port`` and decided to send (egress port ->
        frames with their old Ethernet header): into the model; then what is due goes."""
        self._batch_n += hand_in(self.plane, switch, in_port, out, clock.now_ns())  # (compiled)
        self._batch.append(out)
        self._depth += 1
        try:
            self.pump()
        finally:
            self._depth -= 1

    def _hand_over(self, due: list[Departure]) -> tuple[list[Departure], int]:
        """``LiveLinks._hand_over``, compiled (``linkframes.hand_over``): an IB frame is handed
        over as it stands (no ``outgoing`` of its own, unlike a RoCE router's)."""
        return hand_over(due, self.peers, self._local, self.captured, self._carrier, self._powered, self._heads)

    def _redecide(self, switch: str, in_port: int, frame: Frame) -> None:
        assert self._decide is not None
        verdict = self._decide(switch, in_port, frame.meta)
        if verdict is not None:  # else it stays on its dead port, where the model discards it
            frame.dst, frame.meta = verdict

    def _adapt_frame(self, switch: str, in_port: int, frame: Frame, now: int) -> None:
        """``adapt(switch, in_port, frame bytes, decided port, now, load)``: the port it takes."""
        assert self._adapt is not None
        node = self.plane.nodes[switch]
        frame.dst = self._adapt(switch, in_port, frame.meta, frame.dst, now,  # type: ignore[arg-type]
                                lambda port: egress_load(node, port))

    def begin(self) -> None:
        """A batch of frames received on one port starts (see :meth:`settle`)."""
        self._batch.clear()
        self._batch_n = 0

    def settle(self, switch: str, in_port: int, frames: list[bytes]) -> None:
        self._depth += 1
        try:
            self._settle(switch, in_port, frames)
        finally:
            self._depth -= 1

    def _settle(self, switch: str, in_port: int, frames: list[bytes]) -> None:
        """The frames of a batch from a neighbour switch that were not forwarded (the SMA took
        them, the forwarder dropped them) free their buffer: credits back to the sender.
        (A frame the forwarder corrupted leaves as a new object: its original is settled here
        and the copy enters the model anew, unmatched, its sender's credits debited for it.)"""
        if self._batch_n >= len(frames):
            return
        batch = {id(f) for out in self._batch for fs in out.values() for f in fs}
        now = clock.now_ns()
        for f in frames:
            if id(f) not in batch and len(f) > ETH_LEN + 20:
                self.plane.consume(switch, in_port, match_key(f), now)
        self.pump()

    # --- reports --------------------------------------------------------------------------

    def tick(self, agents: Mapping[str, Any] | None = None) -> None:
        """From the agent host's ticker: every ``REPORT_S``, the agents' QoS tables in,
        counters, credit loops and fidelity out (all at once: :meth:`tick_steps`)."""
        for _ in self.tick_steps(agents):
            pass

    def tick_steps(self, agents: Mapping[str, Any] | None = None) -> Iterator[None]:
        """:meth:`tick` in steps, yielding between them so that the ticker can give the loop
        a checkpoint: the QoS tables, the counters, the credit loops, then the link report
        in pieces (``LiveLinks.report_parts``). In one step the report alone held the agent
        host's loop 2.3-3.4 ms once a second on a k=4 fat-tree (timed by hand): a late
        wake-up a second, the lag monitor's p99."""
        self.plane.expire(clock.now_ns())
        mono = clock.monotonic()
        if mono - self._last_capture >= CAPTURE_CHECK_S and self._deliver is not None:
            self._last_capture = mono
            self.check_captures()
        if mono - self._last_report < clock.emulated_s(REPORT_S):
            return
        self._last_report = mono
        if agents is not None:
            self.sync_qos(agents)
            yield
        self.push_counters()
        yield
        self.check_loops()
        for part in self.report_parts():
            yield
            part()

    def sync_qos(self, agents: Mapping[str, Any]) -> int:
        """Re-read the QoS tables of the agents whose tables changed since the last call
        (``DeviceAgent.qos_version``: the SM set SLtoVLMappingTable, VLArbitrationTable or
        OperationalVLs) into the model; how many nodes changed. From the ticker."""
        changed = 0
        for name, node in self.plane.nodes.items():
            agent = agents.get(name)
            version = getattr(agent, "qos_version", None)
            if agent is None or version is None:
                continue
            v = version()
            if self._qos_seen.get(name) == v:
                continue
            self._qos_seen[name] = v
            changed += 1
            ins = [i for i in node.ports] if node.switch else [0]
            for port in node.ports:
                try:
                    self.plane.set_qos(name, port, data_vls=agent.data_vls(port), vlarb=agent.vl_arbitration(port),
                                       sl2vl={i: agent.sl2vl_map(i, port) for i in ins if i != port})
                except (KeyError, ValueError) as exc:  # a port the agent does not have, a table the model refuses
                    log.warning("%s port %d: QoS not taken into the link model: %s", name, port, exc)
        return changed

    def push_counters(self) -> None:
        for node in self.plane.nodes.values():
            if not node.switch:
                continue
            for num, p in node.ports.items():
                c = p.counters
                tick_ns = SYMBOL_BYTES * p.link.byte_ns()
                now = (c.xmit_wait_ticks(tick_ns), c.xmit_discards, c.buffer_overruns, c.inactive_discards)
                was = self._pushed.get((node.name, num), (0, 0, 0, 0))
                if now != was:
                    self._pushed[(node.name, num)] = now
                    deltas = {"port_xmit_wait": now[0] - was[0], "port_xmit_discards": now[1] - was[1],
                              "excessive_buffer_overrun_errors": now[2] - was[2],
                              "port_inactive_discards": now[3] - was[3]}
                    self._counts(node.name, num, {k: v for k, v in deltas.items() if v})

    def check_loops(self) -> None:
        for loop in self.plane.credit_loops(LOOP_STALL_NS):
            key = frozenset(loop.hops)
            if key in self._loops_seen:
                continue
            self._loops_seen.add(key)
            log.warning("%s", loop.describe())
            self.events.write(loop.hops[0][0], {
                "kind": Kind.CREDIT_LOOP, "t_ns": clock.now_ns(),
                "hops": [{"switch": n, "port": p, "vl": vl} for n, p, vl in loop.hops],
                "stalled_us": loop.stalled_ns // 1000})
