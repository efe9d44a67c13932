"""SM election and takeover (IBA 14.4, SMInfo), sans-IO.

``Election`` is the state machine of one subnet manager among others on the subnet. It does
no IO: the SM (``ibemu.sm.manager``) feeds it what it saw and carries out what it returns.

States (``SmState``, the SMInfo SMState values): NOT_ACTIVE (0), DISCOVERING (1), STANDBY (2),
MASTER (3). An SM starts DISCOVERING. Inputs:

- ``discovered(peers)``: the SMInfo of every other SM port found in a sweep (a CA port whose
  PortInfo CapabilityMask has IsSM; ``None`` for one that did not answer). A MASTER among them
  makes this SM STANDBY, whatever the priorities (an SM does not take a working subnet from
  its master); otherwise a DISCOVERING or STANDBY peer that outranks this SM (higher priority,
  then lower GUID: ``outranks``) makes it STANDBY too, polling that peer until it becomes
  master; else this SM becomes MASTER. A MASTER that finds a STANDBY outranking it hands the
  subnet over (``SendSet(HANDOVER)``) and waits for its ACKNOWLEDGE.
- ``poll_due(now_ns)`` / ``poll_result(info, now_ns)``: a STANDBY polls its master with a
  SubnGet(SMInfo) every ``poll_interval_ns``. A poll fails when it is not answered, when the
  answer is not MASTER, or when ActCount did not move since the last answer (the spec's
  heartbeat: the master counts the SMPs it sends, the answer to the previous poll among them).
  After ``poll_retries`` failed polls in a row the master is lost: ``Takeover`` (the SM goes
  DISCOVERING, sweeps the subnet, and becomes master unless that sweep finds another one).
- ``on_get()``: the SMInfo this SM answers a SubnGet(SMInfo) with (its GUID, priority, state,
  ActCount as the adapter counts it).
- ``on_set(modifier, sender)``: SubnSet(SMInfo) with AttributeModifier HANDOVER (a STANDBY
  becomes MASTER and ACKNOWLEDGEs), ACKNOWLEDGE (a MASTER that handed over goes STANDBY),
  DISABLE (-> NOT_ACTIVE), STANDBY (a DISCOVERING SM goes STANDBY), DISCOVER (NOT_ACTIVE ->
  DISCOVERING).

Outputs are ``Action`` objects; every state change is a ``StateChange`` (for the event log).

Deviations from OpenSM (3.3.23): OpenSM's standby counts a poll as answered whenever the
master says MASTER (its ActCount is not compared); ibemu's also wants ActCount to move, as
the spec intends. OpenSM declares the master lost once more than ``polling_retry_number``
polls went unanswered (retries + 2 intervals after the last answer); ibemu after
``poll_retries`` failed polls (retries intervals). SM_Key: one for the subnet (ibemu's SM
answers with OpenSM's default, 1; a peer answering with another key is ignored, as OpenSM
ignores it); no trap 144 on a priority change.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

ATTR_SM_INFO = 0x0020
SM_INFO_LEN = 21
"""GUID (8), SM_Key (8), ActCount (4), Priority and SMState (1): the SMInfo attribute's bytes."""


class SmState(IntEnum):
    NOT_ACTIVE = 0
    DISCOVERING = 1
    STANDBY = 2
    MASTER = 3


class SmInfoMod(IntEnum):
    """SubnSet(SMInfo) AttributeModifier values (IBA table 155)."""

    HANDOVER = 1
    ACKNOWLEDGE = 2
    DISABLE = 3
    STANDBY = 4
    DISCOVER = 5


@dataclass(frozen=True, slots=True)
class SmInfo:
    guid: int
    priority: int
    state: SmState
    act_count: int = 0
    sm_key: int = 0

    def pack(self) -> bytes:
        return struct.pack("!QQIB", self.guid, self.sm_key, self.act_count & 0xFFFFFFFF,
                           (self.priority & 0xF) << 4 | int(self.state) & 0xF)

    @classmethod
    def unpack(cls, data: bytes) -> SmInfo:
        """From an SMP's data (at least ``SM_INFO_LEN`` bytes); ValueError when shorter or the
        state is not one of the four."""
        if len(data) < SM_INFO_LEN:
            raise ValueError(f"SMInfo is {SM_INFO_LEN} bytes, got {len(data)}")
        guid, key, act, ps = struct.unpack_from("!QQIB", data)
        try:
            state = SmState(ps & 0xF)
        except ValueError:
            raise ValueError(f"SMState {ps & 0xF} is not 0-3") from None
        return cls(guid, ps >> 4, state, act, key)


def outranks(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """SM ``a`` = (priority, GUID) is elected before ``b``: higher priority, then lower GUID."""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


# ---------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class StateChange:
    old: SmState
    new: SmState
    reason: str
    master: int = 0
    """The GUID of the master this SM follows (STANDBY) or 0."""


@dataclass(frozen=True, slots=True)
class Poll:
    """SubnGet(SMInfo) to ``guid`` (the master a STANDBY follows)."""

    guid: int


@dataclass(frozen=True, slots=True)
class SendSet:
    """SubnSet(SMInfo) with ``modifier`` to the SM ``guid``."""

    guid: int
    modifier: SmInfoMod


@dataclass(frozen=True, slots=True)
class MasterLost:
    """A STANDBY gave up on its master: ``first_failed_ns`` is when its first failed poll was
    answered (or timed out), ``failed`` how many failed in a row."""

    guid: int
    first_failed_ns: int
    failed: int


@dataclass(frozen=True, slots=True)
class Takeover:
    """Sweep the subnet as a candidate master (after ``MasterLost`` or a HANDOVER)."""

    reason: str


Action = StateChange | Poll | SendSet | MasterLost | Takeover


# ---------------------------------------------------------------------- the machine


@dataclass
class Election:
    guid: int
    priority: int = 0
    poll_interval_ns: int = 1_000_000_000
    poll_retries: int = 3
    state: SmState = SmState.DISCOVERING
    master: int = 0
    """The SM a STANDBY follows (or a MASTER that handed over waits for), 0: none."""
    failed: int = 0
    first_failed_ns: int = 0
    last_act: int | None = None
    next_poll_ns: int = 0
    handover_to: int = 0
    """A MASTER that sent HANDOVER: to whom (its ACKNOWLEDGE makes this SM STANDBY)."""
    history: list[StateChange] = field(default_factory=list)
    sm_key: int = 0
    """SMInfo SM_Key this SM answers with (the adapter ignores peers whose key differs)."""

    def __post_init__(self) -> None:
        if not 0 <= self.priority <= 15:
            raise ValueError(f"SM priority {self.priority}: expected 0-15")
        if self.poll_retries < 1 or self.poll_interval_ns <= 0:
            raise ValueError("poll_retries >= 1 and poll_interval_ns > 0")

    # ------------------------------------------------------------------ helpers

    @property
    def rank(self) -> tuple[int, int]:
        return (self.priority, self.guid)

    def _go(self, new: SmState, reason: str, master: int = 0) -> list[Action]:
        old, self.state, self.master = self.state, new, master
        if new is not SmState.STANDBY:
            self.failed, self.first_failed_ns, self.last_act = 0, 0, None
        change = StateChange(old, new, reason, master)
        self.history.append(change)
        return [change]

    def _standby(self, master: int, reason: str, now_ns: int) -> list[Action]:
        self.failed, self.first_failed_ns, self.last_act = 0, 0, None
        self.next_poll_ns = now_ns + self.poll_interval_ns
        return self._go(SmState.STANDBY, reason, master)

    # ------------------------------------------------------------------ inputs

    def discovered(self, peers: list[SmInfo | None], now_ns: int = 0) -> list[Action]:
        """After a sweep: the SMInfo of the other SMs found (``None``: did not answer)."""
        live = [p for p in peers if p is not None and p.guid != self.guid]
        masters = [p for p in live if p.state is SmState.MASTER]
        if self.state is SmState.NOT_ACTIVE:
            return []
        if self.state is SmState.MASTER:
            higher = [p for p in live if p.state is SmState.STANDBY and outranks((p.priority, p.guid), self.rank)]
            if masters:  # two masters: the lower one steps down (OpenSM: a heavy sweep, then handover)
                top = max(masters, key=lambda p: (p.priority, -p.guid))
                if outranks((top.priority, top.guid), self.rank):
                    return self._standby(top.guid, "higher master found", now_ns)
                return []
            if higher and not self.handover_to:
                best = max(higher, key=lambda p: (p.priority, -p.guid))
                self.handover_to = best.guid
                return [SendSet(best.guid, SmInfoMod.HANDOVER)]
            return []
        if masters:
            top = max(masters, key=lambda p: (p.priority, -p.guid))
            return self._standby(top.guid, "master found", now_ns)
        higher = [p for p in live if p.state in (SmState.DISCOVERING, SmState.STANDBY)
                  and outranks((p.priority, p.guid), self.rank)]
        if higher:
            best = max(higher, key=lambda p: (p.priority, -p.guid))
            return self._standby(best.guid, "higher SM found", now_ns)
        return self._go(SmState.MASTER, "elected" if live else "no other SM")

    def poll_due(self, now_ns: int) -> list[Action]:
        """A STANDBY's poll timer: the next SubnGet(SMInfo) to its master when it is due."""
        if self.state is not SmState.STANDBY or not self.master or now_ns < self.next_poll_ns:
            return []
        self.next_poll_ns = now_ns + self.poll_interval_ns
        return [Poll(self.master)]

    def poll_result(self, info: SmInfo | None, now_ns: int) -> list[Action]:
        """The answer to a poll (``None``: unanswered or an error status)."""
        if self.state is not SmState.STANDBY:
            return []
        alive = False
        if info is not None and info.guid == self.master:
            if info.state is SmState.MASTER:
                alive = self.last_act is None or info.act_count != self.last_act
            elif info.state is SmState.STANDBY or info.state is SmState.DISCOVERING:
                # a higher SM we wait for, not master yet: alive while it outranks us
                alive = outranks((info.priority, info.guid), self.rank)
            self.last_act = info.act_count
        if alive:
            self.failed, self.first_failed_ns = 0, 0
            return []
        if not self.failed:
            self.first_failed_ns = now_ns
        self.failed += 1
        if self.failed < self.poll_retries:
            return []
        lost = MasterLost(self.master, self.first_failed_ns, self.failed)
        return [lost, *self._go(SmState.DISCOVERING, "master lost"), Takeover("master lost")]

    def on_get(self, act_count: int) -> SmInfo:
        """What this SM answers a SubnGet(SMInfo) with."""
        return SmInfo(self.guid, self.priority, self.state, act_count, self.sm_key)

    def on_set(self, modifier: int, sender: int, now_ns: int = 0) -> list[Action]:
        """A SubnSet(SMInfo) from the SM ``sender``; unknown modifiers change nothing."""
        if modifier == SmInfoMod.HANDOVER and self.state is SmState.STANDBY:
            return [*self._go(SmState.MASTER, "handover"), SendSet(sender, SmInfoMod.ACKNOWLEDGE),
                    Takeover("handover")]
        if modifier == SmInfoMod.ACKNOWLEDGE and self.state is SmState.MASTER and sender == self.handover_to:
            self.handover_to = 0
            return self._standby(sender, "handed over", now_ns)
        if modifier == SmInfoMod.DISABLE and self.state is not SmState.NOT_ACTIVE:
            return self._go(SmState.NOT_ACTIVE, "disabled")
        if modifier == SmInfoMod.STANDBY and self.state is SmState.DISCOVERING:
            return self._standby(sender, "told to stand by", now_ns)
        if modifier == SmInfoMod.DISCOVER and self.state is SmState.NOT_ACTIVE:
            return [*self._go(SmState.DISCOVERING, "told to discover"), Takeover("discover")]
        return []

    def handover_failed(self) -> None:
        """The HANDOVER went unanswered: the next sweep may try again."""
        self.handover_to = 0
