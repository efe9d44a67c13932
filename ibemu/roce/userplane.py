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
from typing import Final

from ibemu.kernel.fib import Fib
from ibemu.roce.queues import QueueConfig
from ibemu.wire import pfc

Send = tuple[int, bytes | bytearray]
HEADERS: Final = 14 + 60 + 4
"""Bytes of a frame its forwarding reads: Ethernet, the longest IPv4 header, UDP's ports."""


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
        out: dict[int, list[bytes | bytearray]] = {}
        self.receive_batch(ifindex, [frame], now, out)
        return [(egress, data) for egress, q in out.items() for data in q]

    def receive_batch(self, ifindex: int, frames: Sequence[bytes | bytearray], now: int,
                      out: dict[int, list[bytes | bytearray]]) -> int:
        """Each of ``frames`` received on ``ifindex``, in order: a PFC frame noted, an IPv4
        frame forwarded (:meth:`forward`) and appended to ``out[egress]``; how many were not
        forwarded. (One loop for the batch, its counts added at the end: compiled, a frame
        costs no call, list or counter update of its own.)"""
        port = self.ports.get(ifindex)
        if port is None or ifindex in self.down:
            self.stats["rx_ignored"] += len(frames)
            return len(frames)
        to_host = port.to_host
        lossy = to_host and self._loss > 0
        forwarded = 0
        for frame in frames:
            if len(frame) >= 14 and frame[12] == 0x88 and frame[13] == 0x08:  # pfc.is_pause
                quanta = pfc.parse_pause(frame)
                if quanta is None:
                    self.stats["malformed"] += 1
                elif to_host:
                    self.host_pauses.append((ifindex, quanta))
                else:
                    self.stats["pfc_in_model"] += 1
                continue
            if lossy and self.rng.random() < self._loss:
                self.stats["lost_ingress"] += 1
                continue
            h = bytes(frame[:HEADERS])
            egress = self._forward(ifindex, frame, h)
            if egress is not None:
                buf = self._rewritten(egress, frame, h)
                q = out.get(egress)
                if q is None:
                    out[egress] = [buf]
                else:
                    q.append(buf)
                forwarded += 1
        n = len(frames)
        stats = self.stats
        stats["rx_frames"] += n
        if forwarded:
            stats["forwarded"] += forwarded
        return n - forwarded

    def forward(self, ifindex: int, frame: bytes | bytearray, now: int) -> list[Send]:
        """An IPv4 frame received on ``ifindex``, forwarded: (egress, the rewritten frame),
        or none (counted why)."""
        h = bytes(frame[:HEADERS])
        egress = self._forward(ifindex, frame, h)
        if egress is None:
            return []
        self.stats["forwarded"] += 1
        return [(egress, self._rewritten(egress, frame, h))]

    def _forward(self, ifindex: int, frame: bytes | bytearray, h: bytes) -> int | None:
        """The egress port of an IPv4 frame received on ``ifindex``; None (counted why) where
        it goes nowhere. Its headers are read from ``h``, a ``bytes`` copy of its first
        :data:`HEADERS` bytes (compiled, a ``bytes`` index is a C read, a ``bytes | bytearray``
        one a generic call), made once for this and :meth:`_rewritten`."""
        n = len(frame)
        if n < 34 or h[12] != 0x08 or h[13] != 0x00:
            self.stats["not_ipv4"] += 1
            return None
        ihl = (h[14] & 0x0F) * 4
        total = (h[16] << 8) | h[17]
        if h[14] >> 4 != 4 or ihl < 20 or total < ihl or 14 + total > n or 14 + ihl + 4 > n:
            self.stats["malformed"] += 1
            return None
        dst = (h[30] << 24) | (h[31] << 16) | (h[32] << 8) | h[33]
        if dst in self._local:
            self.stats["to_router"] += 1
            return None
        if h[22] <= 1:
            self.stats["ttl_expired"] += 1
            return None
        hops = self.fib.lookup(dst)
        if hops is None:
            self.stats["no_route"] += 1
            return None
        down = self.down
        if len(hops) == 1 and not down:
            out: int | None = hops[0]  # no choice to make: no flow key
        else:
            l4 = 14 + ihl  # kernel.fib.flow_key, from the header copy
            out = self.fib.choose(hops, h[26:34] + h[23:24] + h[l4:l4 + 4], down)
        if out is None or out not in self.ports:
            self.stats["egress_down"] += 1
            return None
        if out == ifindex:
            self.stats["loop"] += 1
            return None
        return out

    def _rewritten(self, egress: int, frame: bytes | bytearray, h: bytes) -> bytearray:
        """``frame`` (checked by :meth:`_forward`; ``h`` its headers' copy) as it leaves on
        ``egress``: up to the IP total length, the egress port's MACs, TTL - 1 with the
        checksum fixed. A copy, except for a ``bytearray`` of that length: a frame the router
        before handed over in memory (``LiveLinks``), which nothing else holds, is rewritten in
        place."""
        end = 14 + ((h[16] << 8) | h[17])
        if isinstance(frame, bytearray) and end == len(frame):
            buf = frame
        else:
            buf = bytearray(frame) if end == len(frame) else bytearray(frame[:end])  # one copy
        buf[0:12] = self.ports[egress].eth
        buf[22] = h[22] - 1  # TTL; the checksum grows by 0x0100 (RFC 1141)
        s = ((h[24] << 8) | h[25]) + 0x0100
        s = (s & 0xFFFF) + (s >> 16)
        buf[24] = s >> 8
        buf[25] = s & 0xFF
        return buf

    def set_link(self, ifindex: int, up: bool, now: int = 0) -> None:
        """Carrier of a port: ECMP skips a dead one (what the model still has queued for it
        is lost as it leaves, ``links``)."""
        if up:
            self.down.discard(ifindex)
        else:
            self.down.add(ifindex)

    def counters(self, now: int) -> dict[str, object]:
        return {"stats": dict(self.stats)}
