"""One user-datapath RoCE router's forwarding (sans-IO): frames in, forwarding decisions out.

``RouterPlane.receive`` takes a frame from a port: a PFC frame is noted (one a host sent is
for the link model to honour, ``host_pauses``; one from a neighbour router was already played
in the model, which put it on the cable, and is only counted); an IPv4 frame is checked
(length, version, header length, TTL), looked up in the ``Fib`` (longest prefix, ECMP among
live ports), its TTL decremented (checksum fixed incrementally) and its Ethernet addresses
rewritten (the egress port's MAC, its peer's MAC: neighbours are static and planned). It
returns ``(egress ifindex, frame)`` to send; *when* it leaves is the link model's business
(``ibemu.roce.links``: every router's egress queues, line rate, switch latency, drop tail,
ECN and PFC in ``ibemu.physics``, the IB user datapath's model). Nothing raises on a bad frame
(counted in ``stats``). A cable from a host loses ``loss_pct`` of its frames here, at the
router's ingress (seeded); the other directions lose theirs as they leave (``links``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ibemu.kernel.fib import Fib, flow_key
from ibemu.roce.queues import QueueConfig
from ibemu.wire import pfc

Send = tuple[int, bytes | bytearray]


@dataclass(slots=True)
class PortInfo:
    ifname: str
    mac: bytes
    peer_mac: bytes
    to_host: bool = False
    port: int = 0
    """The port's number in the topology (the link model's)."""
    eth: bytes = field(default=b"")

    def __post_init__(self) -> None:
        self.eth = self.peer_mac + self.mac


class RouterPlane:
    def __init__(self, name: str, ports: dict[int, PortInfo], cfg: QueueConfig, *, seed: int = 0,
                 local_ips: frozenset[bytes] = frozenset()) -> None:
        self.name = name
        self.ports = ports
        self.cfg = cfg
        self.fib = Fib(seed)
        self.down: set[int] = set()
        self.local_ips = local_ips
        self._local = frozenset(int.from_bytes(ip, "big") for ip in local_ips)
        self.stats: Counter[str] = Counter()
        self.rng = random.Random(seed)
        self._loss = cfg.loss_pct / 100
        self.prio = cfg.priorities()
        """Priority by TOS byte."""
        self.host_pauses: list[tuple[int, dict[int, int]]] = []
        """(ifindex, quanta by priority) of the PFC frames hosts sent (taken by the datapath)."""

    def receive(self, ifindex: int, frame: bytes | bytearray, now: int) -> list[Send]:
        """A frame received on ``ifindex``: where it goes (none, one)."""
        port = self.ports.get(ifindex)
        if port is None or ifindex in self.down:
            self.stats["rx_ignored"] += 1
            return []
        self.stats["rx_frames"] += 1
        if pfc.is_pause(frame):
            quanta = pfc.parse_pause(frame)
            if quanta is None:
                self.stats["malformed"] += 1
            elif port.to_host:
                self.host_pauses.append((ifindex, quanta))
            else:
                self.stats["pfc_in_model"] += 1
            return []
        if port.to_host and self._loss and self.rng.random() < self._loss:
            self.stats["lost_ingress"] += 1
            return []
        return self.forward(ifindex, frame, now)

    def receive_batch(self, ifindex: int, frames: Sequence[bytes | bytearray], now: int,
                      out: dict[int, list[bytes | bytearray]]) -> int:
        """``receive`` for each of ``frames`` in order, what it sends appended to
        ``out[egress]``; how many were not forwarded."""
        dropped = 0
        for frame in frames:
            sends = self.receive(ifindex, frame, now)
            if not sends:
                dropped += 1
            for egress, data in sends:
                q = out.get(egress)
                if q is None:
                    out[egress] = [data]
                else:
                    q.append(data)
        return dropped

    def forward(self, ifindex: int, frame: bytes | bytearray, now: int) -> list[Send]:
        n = len(frame)
        if n < 34 or frame[12] != 0x08 or frame[13] != 0x00:
            self.stats["not_ipv4"] += 1
            return []
        ihl = (frame[14] & 0x0F) * 4
        total = (frame[16] << 8) | frame[17]
        if frame[14] >> 4 != 4 or ihl < 20 or total < ihl or 14 + total > n or 14 + ihl + 4 > n:
            self.stats["malformed"] += 1
            return []
        dst = int.from_bytes(frame[30:34], "big")  # (a frame handed over is a bytearray)
        if dst in self._local:
            self.stats["to_router"] += 1
            return []
        if frame[22] <= 1:
            self.stats["ttl_expired"] += 1
            return []
        hops = self.fib.lookup(dst)
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
        self.stats["forwarded"] += 1
        return [(out, buf)]

    def set_link(self, ifindex: int, up: bool, now: int = 0) -> None:
        """Carrier of a port: ECMP skips a dead one (what the model still has queued for it
        is lost as it leaves, ``links``)."""
        if up:
            self.down.discard(ifindex)
        else:
            self.down.add(ifindex)

    def counters(self, now: int) -> dict[str, object]:
        return {"stats": dict(self.stats)}
