"""The management agents of switches and CAs, sans-IO: SMA, PMA, port state, LFT, forwarding decision.

Agents take packets and port events and return actions (``actions``); they never touch a
socket, a clock or the kernel: ``ibemu.fabric.agenthost`` carries the actions out on real
sockets. The MAD bytes they read and write are ``ibemu.wire``'s.

``ibemu.agents.switch.SwitchAgent`` and ``ibemu.agents.ca.CaAgent`` build on ``DeviceAgent``
(``ibemu.agents.device``); ``ibemu.testing.wiring.InMemoryFabric`` wires agents together in
memory for tests and benchmarks.
"""

from ibemu.agents.actions import (
    STATUS_UNDELIVERABLE,
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
from ibemu.agents.port import PhysState, PortState
from ibemu.agents.traps import TrapPolicy

__all__ = [
    "STATUS_UNDELIVERABLE", "Action", "AltUpdate", "DeliverMad", "Event", "LftUpdate", "LinkRequest",
    "LinkRequestKind", "PhysState", "PortState", "PortStateChange", "Send", "TrapPolicy",
]
