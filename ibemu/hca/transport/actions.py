"""What the transport asks its IO layer to do.

``Send`` has the shape of ``ibemu.agents.actions.Send`` (``port``, ``packet``: LRH .. VCRC,
the IO layer adds the 0x88B5 Ethernet header) but is a plain slotted dataclass: a frozen
one costs ~0.3 us more to build, on every data packet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Send:
    """Transmit ``packet`` (LRH .. VCRC) on physical ``port``."""

    port: int
    packet: bytes


Action = Send
