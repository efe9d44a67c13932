"""Egress queues of a user-datapath RoCE router port (sans-IO): priorities, line rate, ECN,
drop tail, PFC, cable delay and loss.

Each port has eight priority queues (a frame's priority is its DSCP's class selector,
``DSCP >> 3``: RoCE data at DSCP 26 is priority 3, CNPs at DSCP 48 priority 6, unless
``dscp_priority`` maps a DSCP elsewhere), served in
strict priority order, highest first, skipping priorities the peer paused. The port drains at
``line_gbps`` on a byte clock: a frame starts when the previous one has been serialised
(``busy_until``), whenever the caller gets round to asking, so late wake-ups send a burst
but never more than the line rate over time. An ECN-capable frame that finds more than
``ecn_mark_kb`` in its queue gets CE (checksum fixed); a frame that would push the port past
``buffer_kb`` is dropped, unless its priority is lossless (PFC on). A frame that has left the
queue crosses the cable: held ``delay_us`` (the wire is FIFO), lost with ``loss_pct`` (seeded).

``PfcIngress`` counts the bytes each ingress port has waiting in the router's queues per
priority and says when to send XOFF (above ``xoff_kb``; refreshed before it expires) and XON
(below ``xon_kb``).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ibemu.wire import pfc

PRIORITIES = pfc.PRIORITIES


@dataclass(frozen=True, slots=True)
class QueueConfig:
    line_gbps: float = 0.0
    """The ports' line rate; 0: no rate (a frame leaves as soon as it is queued)."""
    buffer_kb: float = 1024.0
    """Bytes a port may hold in all its queues (drop tail beyond, lossy priorities only)."""
    ecn_mark_kb: float = 0.0
    """CE on an ECT frame that finds more than this in its queue (0: no marking)."""
    pfc: frozenset[int] = frozenset()
    """Lossless priorities: PFC pauses instead of drops."""
    xoff_kb: float = 64.0
    xon_kb: float = 32.0
    delay_us: float = 0.0
    loss_pct: float = 0.0
    dscp_priority: tuple[tuple[int, int], ...] = ()
    """(DSCP, priority) pairs overriding the default ``DSCP >> 3``."""

    def __post_init__(self) -> None:
        if self.line_gbps < 0 or self.buffer_kb <= 0 or self.ecn_mark_kb < 0 or self.delay_us < 0:
            raise ValueError("line rate, buffer, marking threshold and delay are positive")
        if not 0 <= self.loss_pct <= 100:
            raise ValueError("loss_pct lies within 0..100")
        if any(not 0 <= p < PRIORITIES for p in self.pfc):
            raise ValueError("PFC priorities lie within 0..7")
        if self.pfc and not self.line_gbps:
            raise ValueError("PFC needs a line rate (pause quanta are bit times)")
        if self.pfc and not 0 < self.xon_kb <= self.xoff_kb:
            raise ValueError("PFC needs 0 < xon_kb <= xoff_kb")
        if any(not (0 <= d < 64 and 0 <= p < PRIORITIES) for d, p in self.dscp_priority):
            raise ValueError("DSCP lies within 0..63, priorities within 0..7")

    def priorities(self) -> bytes:
        """Priority by TOS byte (256 entries: DSCP >> 3 unless ``dscp_priority`` says otherwise)."""
        by_dscp = [d >> 3 for d in range(64)]
        for d, p in self.dscp_priority:
            by_dscp[d] = p
        return bytes(by_dscp[tos >> 2] for tos in range(256))

    def to_dict(self) -> dict[str, object]:
        return {"line_gbps": self.line_gbps, "buffer_kb": self.buffer_kb, "ecn_mark_kb": self.ecn_mark_kb,
                "pfc": sorted(self.pfc), "xoff_kb": self.xoff_kb, "xon_kb": self.xon_kb,
                "delay_us": self.delay_us, "loss_pct": self.loss_pct,
                "dscp_priority": [list(x) for x in self.dscp_priority]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QueueConfig:
        return cls(**{**d, "pfc": frozenset(int(p) for p in d.get("pfc", ())),
                      "dscp_priority": tuple((int(a), int(b)) for a, b in d.get("dscp_priority", ()))})


def priority(frame: bytes | bytearray) -> int:
    """The default priority of an IPv4 frame: DSCP >> 3 (the TOS byte's top three bits)."""
    return frame[15] >> 5


def ip_checksum(frame: bytearray) -> None:
    """Recompute the IPv4 header checksum of ``frame`` (Ethernet at 0) in place."""
    ihl = (frame[14] & 0x0F) * 4
    frame[24] = frame[25] = 0
    s = 0
    for i in range(14, 14 + ihl, 2):
        s += (frame[i] << 8) | frame[i + 1]
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    s = ~s & 0xFFFF
    frame[24], frame[25] = s >> 8, s & 0xFF


@dataclass(slots=True)
class PrioCounters:
    tx_frames: int = 0
    tx_bytes: int = 0
    dropped: int = 0
    ecn_marked: int = 0
    lost: int = 0
    pause_sent: int = 0
    pause_received: int = 0
    paused_ns: int = 0


@dataclass(slots=True)
class Queued:
    frame: bytearray
    ingress: int
    prio: int


class EgressPort:
    """The queues and the cable of one port."""

    def __init__(self, cfg: QueueConfig, *, seed: int = 0) -> None:
        self.cfg = cfg
        self.queues: list[deque[Queued]] = [deque() for _ in range(PRIORITIES)]
        self.qbytes = [0] * PRIORITIES
        self.total = 0
        self.busy_until = 0
        self.wire: deque[tuple[int, bytearray]] = deque()
        self.pause_start: list[int | None] = [None] * PRIORITIES
        self.pause_until = [0] * PRIORITIES
        self.counters = [PrioCounters() for _ in range(PRIORITIES)]
        self.rng = random.Random(seed)
        self.up = True
        self._stalled = False
        self._ns_per_byte = 8 / cfg.line_gbps if cfg.line_gbps else 0.0
        self._delay_ns = round(cfg.delay_us * 1000)
        self._loss = cfg.loss_pct / 100
        self._buffer = round(cfg.buffer_kb * 1024)
        self._mark = round(cfg.ecn_mark_kb * 1024) if cfg.ecn_mark_kb else None

    # -- in ------------------------------------------------------------------------------
    def enqueue(self, frame: bytearray, prio: int, ingress: int, now: int) -> bool:
        """Queue ``frame`` (call ``service(now)`` first: the queue is then what it is now).
        False: dropped (buffer full, counted)."""
        c = self.counters[prio]
        n = len(frame)
        if self.total + n > self._buffer and prio not in self.cfg.pfc:
            c.dropped += 1
            return False
        if self._mark is not None and self.qbytes[prio] > self._mark and frame[15] & 3 in (1, 2):
            frame[15] |= 3
            ip_checksum(frame)
            c.ecn_marked += 1
        if not self.total and self.busy_until < now:  # an idle port: this frame starts now
            self.busy_until = now
        self.queues[prio].append(Queued(frame, ingress, prio))
        self.qbytes[prio] += n
        self.total += n
        return True

    def express(self, n: int, prio: int, now: int) -> bool:
        """Send an ``n``-byte frame of ``prio`` past the queue, at once, when that is what
        queueing it and serving the port at ``now`` would do: no line rate, no cable delay or
        loss, nothing queued or on the cable, the priority not paused, the frame within the
        buffer (an empty queue marks nothing). Counts it as ``service`` would; False: queue it.
        """
        if (self._ns_per_byte or self._delay_ns or self._loss or self.total or self.wire
                or self.pause_start[prio] is not None or n > self._buffer):
            return False
        if self.busy_until < now:
            self.busy_until = now
        self._stalled = True  # what ``service`` leaves after emptying the queue
        c = self.counters[prio]
        c.tx_frames += 1
        c.tx_bytes += n
        return True

    def on_pause(self, quanta: dict[int, int], now: int) -> None:
        """A PFC frame received on this port: stop (or restart) its queues."""
        for prio, q in quanta.items():
            self.counters[prio].pause_received += 1
            self._expire(prio, now)
            if q:
                if self.pause_start[prio] is None:
                    self.pause_start[prio] = now
                self.pause_until[prio] = now + pfc.quanta_ns(q, self.cfg.line_gbps or 100.0)
            else:
                self.resume(prio, now)

    def _expire(self, prio: int, now: int) -> None:
        if self.pause_start[prio] is not None and self.pause_until[prio] <= now:
            self.resume(prio, self.pause_until[prio])

    def resume(self, prio: int, at: int) -> None:
        start = self.pause_start[prio]
        if start is not None:
            self.counters[prio].paused_ns += max(0, at - start)
        self.pause_start[prio] = None
        self.pause_until[prio] = 0

    def paused(self, prio: int, now: int) -> bool:
        self._expire(prio, now)
        return self.pause_start[prio] is not None

    def paused_ns(self, prio: int, now: int) -> int:
        """Time ``prio`` has been paused, the current pause included."""
        self._expire(prio, now)
        start = self.pause_start[prio]
        return self.counters[prio].paused_ns + (now - start if start is not None else 0)

    # -- out -----------------------------------------------------------------------------
    def _next(self, now: int) -> Queued | None:
        for prio in range(PRIORITIES - 1, -1, -1):
            if self.queues[prio] and not self.paused(prio, now):
                return self.queues[prio].popleft()
        return None

    def service(self, now: int) -> tuple[list[bytearray], list[Queued]]:
        """Frames to put on the cable now, and the queue entries that left their queue
        (for the ingress accounting of PFC)."""
        left: list[Queued] = []
        if self.total:
            if self._stalled and self.busy_until < now:  # every queue was paused: restart now
                self.busy_until = now
            self._stalled = False
            while self.busy_until <= now:
                q = self._next(now)
                if q is None:
                    self._stalled = True
                    break
                n = len(q.frame)
                self.qbytes[q.prio] -= n
                self.total -= n
                self.busy_until += round(n * self._ns_per_byte)
                left.append(q)
                c = self.counters[q.prio]
                if self._loss and self.rng.random() < self._loss:
                    c.lost += 1
                    continue
                c.tx_frames += 1
                c.tx_bytes += n
                self.wire.append((self.busy_until + self._delay_ns, q.frame))
        out: list[bytearray] = []
        wire = self.wire
        while wire and wire[0][0] <= now:
            out.append(wire.popleft()[1])
        return out, left

    def next_event(self, now: int) -> int | None:
        """When ``service`` has something to do next (None: nothing pending)."""
        t: int | None = self.wire[0][0] if self.wire else None
        if self.total:
            ready = [p for p in range(PRIORITIES) if self.queues[p]]
            if any(not self.paused(p, now) for p in ready):
                cand = max(self.busy_until, now)
            else:
                cand = min(self.pause_until[p] for p in ready)
            t = cand if t is None else min(t, cand)
        return t

    def flush(self) -> list[Queued]:
        """The link went down: everything queued or on the wire is lost (counted as drops)."""
        gone: list[Queued] = []
        for dq in self.queues:
            for q in dq:
                self.counters[q.prio].dropped += 1
            gone.extend(dq)
            dq.clear()
        self.qbytes = [0] * PRIORITIES
        self.total = 0
        self.wire.clear()
        return gone


@dataclass(slots=True)
class PfcIngress:
    """Bytes each ingress port has queued per lossless priority, and the XOFF it asserts."""

    cfg: QueueConfig
    waiting: dict[tuple[int, int], int] = field(default_factory=dict)
    asserted: dict[tuple[int, int], int] = field(default_factory=dict)
    """(ingress, prio) -> when the last XOFF went out."""

    @property
    def quanta(self) -> int:
        return pfc.MAX_QUANTA

    def refresh_ns(self) -> int:
        return pfc.quanta_ns(self.quanta, self.cfg.line_gbps) // 2

    def add(self, ingress: int, prio: int, n: int, now: int) -> int | None:
        """``n`` bytes from ``ingress`` queued: the quanta to send it (XOFF), or None."""
        if prio not in self.cfg.pfc:
            return None
        key = (ingress, prio)
        b = self.waiting[key] = self.waiting.get(key, 0) + n
        if b > self.cfg.xoff_kb * 1024 and key not in self.asserted:
            self.asserted[key] = now
            return self.quanta
        return None

    def remove(self, ingress: int, prio: int, n: int) -> int | None:
        """``n`` bytes from ``ingress`` left: 0 (XON) if its pause is over, else None."""
        if prio not in self.cfg.pfc:
            return None
        key = (ingress, prio)
        b = self.waiting[key] = max(0, self.waiting.get(key, 0) - n)
        if key in self.asserted and b < self.cfg.xon_kb * 1024:
            del self.asserted[key]
            return 0
        return None

    def due_refresh(self, now: int) -> list[tuple[int, int]]:
        """(ingress, prio) whose XOFF must be sent again before it expires."""
        if not self.asserted:
            return []
        every = self.refresh_ns()
        due = [k for k, t in self.asserted.items() if now - t >= every]
        for k in due:
            self.asserted[k] = now
        return due

    def next_refresh(self) -> int | None:
        return min(self.asserted.values()) + self.refresh_ns() if self.asserted else None
