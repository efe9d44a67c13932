"""Sans-IO pieces shared by the device agents: actions, ports, counters, DR rules, MAD framing.

``ibemu.switch.sma.SwitchAgent`` and ``ibemu.hca.sma.CaAgent`` build on ``DeviceAgent``
(``ibemu.device.agent``); ``ibemu.device.wiring.InMemoryFabric`` wires agents together in
memory for tests and benchmarks.
"""

from ibemu.device.actions import (
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
from ibemu.device.port import PhysState, PortState
from ibemu.device.traps import TrapPolicy

__all__ = [
    "STATUS_UNDELIVERABLE", "Action", "DeliverMad", "Event", "LftUpdate", "LinkRequest",
    "LinkRequestKind", "PhysState", "PortState", "PortStateChange", "Send", "TrapPolicy",
]
