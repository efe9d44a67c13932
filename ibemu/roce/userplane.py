"""One user-datapath RoCE router (sans-IO): frames in, frames out, queues in between.

``RouterPlane.receive`` takes a frame from a port: a PFC frame pauses that port's egress
queues; an IPv4 frame is checked (length, version, header length, TTL), looked up in the
``Fib`` (longest prefix, ECMP among live ports), its TTL decremented (checksum fixed
incrementally), its Ethernet addresses rewritten (the egress port's MAC, its peer's MAC:
neighbours are static and planned) and queued on the egress port by priority (DSCP >> 3 unless mapped),
with ECN marking, drop tail or PFC backpressure (``ibemu.roce.queues``). ``service`` drains a
port's queues at its line rate and its cable's delay line, and sends XON when an ingress
port's waiting bytes fall low. Everything returns ``(ifindex, frame)`` to send; nothing
raises on a bad frame (counted in ``stats``). Cables toward hosts have their host -> router
direction delayed and lossy at the router's ingress, so every direction of every cable is.

The common case of a fabric without line rate is short-cut (``express``): a frame for an
idle port leaves with the call that brought it instead of waiting in the queue for the next
service; ``tests/unit/roce/test_userplane_express.py`` proves both ways send the same frames.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ibemu.kernel.fib import Fib, flow_key
from ibemu.roce.queues import EgressPort, PfcIngress, QueueConfig
from ibemu.wire import pfc

Send = tuple[int, bytes | bytearray]


@dataclass(slots=True)
class PortInfo:
    ifname: str
    mac: bytes
    peer_mac: bytes
    to_host: bool = False
    eth: bytes = b""
    ingress: deque[tuple[int, bytes]] = field(default_factory=deque)
    """Frames from a host, held for the cable's delay before they are forwarded."""

    def __post_init__(self) -> None:
        self.eth = self.peer_mac + self.mac


class RouterPlane:
    def __init__(self, name: str, ports: dict[int, PortInfo], cfg: QueueConfig, *, seed: int = 0,
                 local_ips: frozenset[bytes] = frozenset()) -> None:
        self.name = name
        self.ports = ports
        self.cfg = cfg
        self.fib = Fib(seed)
        self.egress = {i: EgressPort(cfg, seed=seed ^ i) for i in ports}
        self.pfc = PfcIngress(cfg)
        self.down: set[int] = set()
        self.local_ips = local_ips
        self.stats: Counter[str] = Counter()
        self.rng = random.Random(seed)
        self._delay_ns = round(cfg.delay_us * 1000)
        self._loss = cfg.loss_pct / 100
        self._prio = cfg.priorities()
        self.express = True
        """Frames for an idle port without line rate, delay or loss leave at once
        (``EgressPort.express``) instead of at the next service of the port: the same frames
        in the same order with the same counters, sooner. Off: always through the queue."""

    # -- in ------------------------------------------------------------------------------
    def receive(self, ifindex: int, frame: bytes, now: int) -> list[Send]:
        """A frame received on ``ifindex``: what to send at once (PFC frames)."""
        port = self.ports.get(ifindex)
        if port is None or ifindex in self.down:
            self.stats["rx_ignored"] += 1
            return []
        self.stats["rx_frames"] += 1
        if pfc.is_pause(frame):
            quanta = pfc.parse_pause(frame)
            if quanta is None:
                self.stats["malformed"] += 1
            else:
                self.egress[ifindex].on_pause(quanta, now)
            return []
        if port.to_host and (self._delay_ns or self._loss):
            if self._loss and self.rng.random() < self._loss:
                self.stats["lost_ingress"] += 1
                return []
            if self._delay_ns:
                port.ingress.append((now + self._delay_ns, frame))
                return []
        return self.forward(ifindex, frame, now)

    def receive_batch(self, ifindex: int, frames: Sequence[bytes], now: int,
                      out: dict[int, list[bytes | bytearray]]) -> None:
        """``receive`` for each of ``frames`` in order, what it sends appended to
        ``out[egress]``. The common frame of a fabric without line rate, delay or loss (IPv4,
        routed, for an idle port: ``EgressPort.express``) is handled inline, with the same
        checks and counts as ``receive``; any other frame is handed to ``receive`` whole,
        before anything was counted for it."""
        cfg = self.cfg
        port = self.ports.get(ifindex)
        if (port is None or ifindex in self.down or not self.express or cfg.line_gbps or self._delay_ns
                or self._loss):
            for frame in frames:
                for egress, data in self.receive(ifindex, frame, now):
                    out.setdefault(egress, []).append(data)
            return
        local, lookup, choose, down = self.local_ips, self.fib.lookup, self.fib.choose, self.down
        ports, egress_of, prio_of = self.ports, self.egress, self._prio
        done = 0
        for frame in frames:
            n = len(frame)
            sent = False
            if n >= 34 and frame[12] == 0x08 and frame[13] == 0x00 and frame[14] >> 4 == 4:
                ihl = (frame[14] & 0x0F) * 4
                total = (frame[16] << 8) | frame[17]
                dst = frame[30:34]
                if (ihl >= 20 and ihl <= total and 14 + total <= n and 14 + ihl + 4 <= n
                        and dst not in local and frame[22] > 1):
                    hops = lookup(int.from_bytes(dst, "big"))
                    if hops is not None:
                        eg_i = hops[0] if len(hops) == 1 and not down else choose(hops, flow_key(frame), down)
                        if eg_i is not None and eg_i != ifindex and eg_i in ports:
                            prio = prio_of[frame[15]]
                            if egress_of[eg_i].express(14 + total, prio, now):
                                buf = bytearray(frame) if 14 + total == n else bytearray(frame[:14 + total])
                                buf[0:12] = ports[eg_i].eth
                                buf[22] -= 1  # TTL; the checksum grows by 0x0100 (RFC 1141)
                                c = ((buf[24] << 8) | buf[25]) + 0x0100
                                c = (c & 0xFFFF) + (c >> 16)
                                buf[24], buf[25] = c >> 8, c & 0xFF
                                q = out.get(eg_i)
                                if q is None:
                                    out[eg_i] = [buf]
                                else:
                                    q.append(buf)
                                done += 1
                                sent = True
            if not sent:
                for egress, data in self.receive(ifindex, frame, now):
                    out.setdefault(egress, []).append(data)
        if done:
            self.stats["rx_frames"] += done
            self.stats["forwarded"] += done

    def forward(self, ifindex: int, frame: bytes, now: int) -> list[Send]:
        n = len(frame)
        if n < 34 or frame[12] != 0x08 or frame[13] != 0x00:
            self.stats["not_ipv4"] += 1
            return []
        ihl = (frame[14] & 0x0F) * 4
        total = (frame[16] << 8) | frame[17]
        if frame[14] >> 4 != 4 or ihl < 20 or total < ihl or 14 + total > n or 14 + ihl + 4 > n:
            self.stats["malformed"] += 1
            return []
        dst = frame[30:34]
        if dst in self.local_ips:
            self.stats["to_router"] += 1
            return []
        if frame[22] <= 1:
            self.stats["ttl_expired"] += 1
            return []
        hops = self.fib.lookup(int.from_bytes(dst, "big"))
        if hops is None:
            self.stats["no_route"] += 1
            return []
        down = self.down
        if len(hops) == 1 and not down:
            out: int | None = hops[0]  # no choice to make: no flow key
        else:
            out = self.fib.choose(hops, flow_key(frame), down)
        if out is None or out not in self.ports:
            self.stats["egress_down"] += 1
            return []
        if out == ifindex:
            self.stats["loop"] += 1
            return []
        buf = bytearray(frame) if 14 + total == n else bytearray(frame[:14 + total])  # one copy
        buf[0:12] = self.ports[out].eth
        buf[22] -= 1  # TTL; the checksum grows by 0x0100 (RFC 1141)
        s = ((buf[24] << 8) | buf[25]) + 0x0100
        s = (s & 0xFFFF) + (s >> 16)
        buf[24], buf[25] = s >> 8, s & 0xFF
        prio = self._prio[buf[15]]
        eg = self.egress[out]
        if self.express and eg.express(len(buf), prio, now):  # idle, no rate: straight out
            self.stats["forwarded"] += 1
            return [(out, buf)]
        sends = self._drain(out, now)
        if not eg.enqueue(buf, prio, ifindex, now):  # counted by the queue
            return sends
        self.stats["forwarded"] += 1
        q = self.pfc.add(ifindex, prio, len(buf), now)
        if q is not None:
            sends += self._pause(ifindex, prio, q, now)
        return sends

    def _pause(self, ifindex: int, prio: int, quanta: int, now: int) -> list[Send]:
        """A PFC frame out of ``ifindex``: ahead of its queues, behind what is on its cable."""
        self.egress[ifindex].counters[prio].pause_sent += 1
        self.stats["xoff_sent" if quanta else "xon_sent"] += 1
        frame = pfc.pause_frame(self.ports[ifindex].mac, {prio: quanta})
        if self._delay_ns:
            self.control(ifindex, frame, now)
            return []
        return [(ifindex, frame)]

    # -- out -----------------------------------------------------------------------------
    def _drain(self, ifindex: int, now: int) -> list[Send]:
        frames, left = self.egress[ifindex].service(now)
        sends: list[Send] = [(ifindex, f) for f in frames]
        for q in left:
            x = self.pfc.remove(q.ingress, q.prio, len(q.frame))
            if x is not None and q.ingress not in self.down:
                sends += self._pause(q.ingress, q.prio, x, now)
        return sends

    def service(self, now: int) -> list[Send]:
        """Everything due by ``now``: delayed host frames forwarded, queues drained, cables
        delivered, XOFF refreshed."""
        sends: list[Send] = []
        for i, port in self.ports.items():
            line = port.ingress
            while line and line[0][0] <= now:
                sends += self.forward(i, line.popleft()[1], now)
        for i in self.egress:
            sends += self._drain(i, now)
        for ingress, prio in self.pfc.due_refresh(now):
            if ingress not in self.down:
                sends += self._pause(ingress, prio, self.pfc.quanta, now)
        return sends

    def next_event(self, now: int) -> int | None:
        times = [t for t in (e.next_event(now) for e in self.egress.values()) if t is not None]
        times += [p.ingress[0][0] for p in self.ports.values() if p.ingress]
        r = self.pfc.next_refresh()
        if r is not None:
            times.append(r)
        return min(times) if times else None

    def set_link(self, ifindex: int, up: bool, now: int = 0) -> None:
        """Carrier of a port: a dead port's queued frames are lost; ECMP skips it."""
        if up:
            self.down.discard(ifindex)
            return
        self.down.add(ifindex)
        eg = self.egress.get(ifindex)
        if eg is not None:
            for q in eg.flush():
                self.pfc.remove(q.ingress, q.prio, len(q.frame))
            for prio in range(pfc.PRIORITIES):
                eg.resume(prio, max(now, eg.pause_start[prio] or 0))
        for key in [k for k in self.pfc.asserted if k[0] == ifindex]:
            del self.pfc.asserted[key]
        port = self.ports.get(ifindex)
        if port is not None:
            port.ingress.clear()

    def control(self, ifindex: int, frame: bytes, now: int) -> None:
        """Put a control frame on ``ifindex``'s cable (after what is already on it)."""
        wire = self.egress[ifindex].wire
        due = now + self._delay_ns
        bisect.insort(wire, (due, bytearray(frame)), key=lambda e: e[0])

    def counters(self, now: int) -> dict[str, object]:
        """Totals and per-port, per-priority counters (nonzero ones)."""
        ports: dict[str, dict[str, dict[str, int]]] = {}
        totals: Counter[str] = Counter()
        for i, eg in self.egress.items():
            for prio, c in enumerate(eg.counters):
                d = {"tx_frames": c.tx_frames, "dropped": c.dropped, "ecn_marked": c.ecn_marked, "lost": c.lost,
                     "pause_sent": c.pause_sent, "pause_received": c.pause_received,
                     "paused_us": eg.paused_ns(prio, now) // 1000}
                d = {k: v for k, v in d.items() if v}
                if d:
                    ports.setdefault(self.ports[i].ifname, {})[str(prio)] = d
                    totals.update(d)
        return {"totals": dict(totals), "stats": dict(self.stats), "ports": ports}
