"""The RoCE user datapath's queue settings (``QueueConfig``) and frame helpers.

The queues themselves are the link model's (``ibemu.physics.model``, Ethernet nodes, timed
live by ``ibemu.roce.links``), the IB user datapath's model: eight priorities per egress port
(a frame's priority is its DSCP's class selector, ``DSCP >> 3``: RoCE data at DSCP 26 is
priority 3, CNPs at DSCP 48 priority 6, unless ``dscp_priority`` maps a DSCP elsewhere)
served in strict priority order, skipping paused ones; drop tail beyond ``buffer_kb`` for
lossy priorities; CE on an ECN-capable frame finding more than ``ecn_mark_kb`` queued in its
priority; XOFF / XON per ingress port and lossless priority at ``xoff_kb`` / ``xon_kb``.
``ibemu.roce.physics`` maps this config onto the model's ``EthConfig`` and ``SwitchModel``.

Rates and delays come from the topology, as IB's do (each link's ``rate``, ``delay_us`` /
``cable_m``, the ``defaults``); ``line_gbps``, when set, overrides every cable's data rate
(``fabric.line_gbps``: a slow fabric the datapath can keep at dilation 1) and ``delay_us`` is
added to every cable's propagation (``fabric.delay_us``). ``loss_pct`` stays the datapath's:
each cable direction loses that share of its frames (seeded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ibemu.wire import pfc

PRIORITIES = pfc.PRIORITIES


@dataclass(frozen=True, slots=True)
class QueueConfig:
    line_gbps: float = 0.0
    """Every cable's data rate, overriding the topology's (0: the topology's)."""
    buffer_kb: float = 1024.0
    """Bytes a port may hold in all its queues (drop tail beyond, lossy priorities only)."""
    switch: str = ""
    """The routers' switch model (``ibemu.physics.link.SWITCH_MODELS``, Ethernet; empty: ``eth``)."""
    latency_ns: int | None = None
    """Port-to-port latency overriding the switch model's."""
    ecn_mark_kb: float = 0.0
    """CE on an ECT frame that finds more than this in its queue (0: no marking)."""
    pfc: frozenset[int] = frozenset()
    """Lossless priorities: PFC pauses instead of drops."""
    xoff_kb: float = 64.0
    xon_kb: float = 32.0
    delay_us: float = 0.0
    """Added to every cable's propagation."""
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
                "delay_us": self.delay_us, "loss_pct": self.loss_pct, "switch": self.switch,
                "latency_ns": self.latency_ns,
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
