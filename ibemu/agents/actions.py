"""What a device agent asks its IO layer to do: the outputs of every sans-IO agent call.

Agents never touch sockets, clocks or the kernel. Each call (``receive``, ``link_up``,
``tick``, ``send_mad`` ...) returns a list of these actions, in the order they must happen:

- ``Send``: put a native IB packet (LRH .. VCRC, no Ethernet header) on a port.
- ``LftUpdate``: the switch's effective unicast forwarding changed (LID -> port, 0xFF = none).
- ``PortStateChange``: a port's logical/physical state changed (the datapath gates on it).
- ``LinkRequest``: the SM asked for a physical action on a link (disable, enable, retrain).
- ``DeliverMad``: a MAD for the local MAD-socket clients (CA only).
- ``Event``: a record for the JSON event log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ibemu.agents.port import PhysState, PortState


@dataclass(frozen=True, slots=True)
class Send:
    """Transmit ``packet`` (LRH .. VCRC) on physical ``port``; the IO layer adds the 0x88B5 header."""

    port: int
    packet: bytes


@dataclass(frozen=True, slots=True)
class PartitionUpdate:
    """A switch port's partition enforcement bits (PortInfo) or P_KeyTable changed: for a
    datapath that checks P_Keys itself (the kernel's LFT classifier)."""

    port: int
    flags: int
    pkeys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LftUpdate:
    """Effective unicast forwarding changes: LID -> egress port, 0xFF = no route (drop).

    "Effective" means LIDs above LinearFDBTop count as unrouted, so raising or lowering the
    top through SwitchInfo also produces an update. Only changed entries are listed.
    """

    changes: Mapping[int, int]
    local: bool = False
    """The switch changed these entries itself (a neighbour's fault notice), not an SM's Set:
    written to the datapath like any other, but not an SM programming step."""


@dataclass(frozen=True, slots=True)
class AltUpdate:
    """Alternate ports for local failover (the vendor attribute ``ATTR_ALTERNATES`` of
    ``ibemu.agents.switch``): ``entries`` holds 4 bytes per LID from ``first_lid``, up to 3
    ports preferred first, 0 after the last; the kernel datapath writes them beside the LFT
    (``ibemu.kernel.lft_map``)."""

    first_lid: int
    entries: bytes


@dataclass(frozen=True, slots=True)
class PortStateChange:
    """``port`` is now in ``state`` / ``phys_state``; data forwarding needs ACTIVE on both ends."""

    port: int
    state: PortState
    phys_state: PhysState


class LinkRequestKind(StrEnum):
    DISABLE = "disable"  # PortPhysicalState set to Disabled: take the link down (carrier off)
    ENABLE = "enable"  # PortPhysicalState set to Polling on a disabled port: bring it back
    RETRAIN = "retrain"  # PortState set to Down: the link retrains (the peer drops to Init)


@dataclass(frozen=True, slots=True)
class LinkRequest:
    """The SM asked for a physical link action on ``port``.

    The IO layer carries it out and reports the outcome to both ends with ``link_down`` /
    ``link_up`` (DISABLE/ENABLE) or ``link_retrained`` on the peer (RETRAIN); the local
    agent has already updated its own port.
    """

    port: int
    kind: LinkRequestKind


@dataclass(frozen=True, slots=True)
class DeliverMad:
    """A 256-byte MAD for the local MAD-socket clients of a CA port.

    Addresses are as received: ``slid``/``sqp`` are the sender's, ``dlid``/``dqp`` ours
    (0xFFFF for directed-route SMPs). ``status`` 0 = delivered; 110 (ETIMEDOUT) = a request
    of ours that could not be sent, returned as-is (``mad`` is the request, the addresses
    are the request's).
    """

    port: int
    mad: bytes
    slid: int
    dlid: int
    sqp: int
    dqp: int
    sl: int = 0
    pkey: int = 0xFFFF
    qkey: int = 0
    status: int = 0


STATUS_UNDELIVERABLE = 110


@dataclass(frozen=True, slots=True)
class MKeyChange:
    """The M_Key protection state of ``port`` (its key, protect bits, lease countdown)
    changed outside a PortInfo Set: a violation started the lease, a valid key stopped it,
    the lease expired. Whoever mirrors the agent's state (the kernel SMA) refreshes it."""

    port: int


@dataclass(frozen=True, slots=True)
class Event:
    """A JSON event-log record: ``kind`` (snake_case), monotonic time, the node, details."""

    kind: str
    t_ns: int
    node_guid: int
    fields: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (GUIDs as 0x-prefixed hex strings)."""
        return {"kind": self.kind, "t_ns": self.t_ns, "node_guid": f"{self.node_guid:#018x}",
                **self.fields}


Action = (Send | LftUpdate | AltUpdate | PortStateChange | LinkRequest | DeliverMad | MKeyChange | Event
          | PartitionUpdate)
