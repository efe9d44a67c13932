"""Sans-IO pieces shared by the device agents: actions, ports, counters, DR rules, MAD framing.

``ibemu.agents.switch.SwitchAgent`` and ``ibemu.agents.ca.CaAgent`` build on ``DeviceAgent``
(``ibemu.agents.device``); ``ibemu.testing.wiring.InMemoryFabric`` wires agents together in
memory for tests and benchmarks.
"""

from ibemu.agents.actions import (
    STATUS_UNDELIVERABLE,
    Action,
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
    "STATUS_UNDELIVERABLE", "Action", "DeliverMad", "Event", "LftUpdate", "LinkRequest",
    "LinkRequestKind", "PhysState", "PortState", "PortStateChange", "Send", "TrapPolicy",
]
