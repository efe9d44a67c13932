"""Trap bookkeeping: each trap sent is repeated on a timer until the SM represses it.

Policy (configurable per agent): send at once, then every ``period_ns`` (default 2 s) until
a SubnTrapRepress with the trap's TID (or its low 32 bits) arrives, at most ``max_repeats`` times (default 15,
i.e. 30 s; None = forever). The repeat carries a new send time but the same TID, as the
spec asks, so the SM can match it. Time comes from the agent's clock; ``due()`` returns the
traps to resend now and ``next_deadline()`` when to tick next.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrapPolicy:
    period_ns: int = 2_000_000_000
    max_repeats: int | None = 15


@dataclass(slots=True)
class PendingTrap:
    tid: int
    trap_number: int
    notice: bytes  # the 64-byte Notice data
    created_ns: int
    next_due_ns: int
    sends: int = 0  # how many times it went out (or was due and could not be routed)
    port: int = 0  # the port whose LID and MasterSMLID it goes from/to (a switch: 0)


class TrapQueue:
    """Traps waiting for a repress."""

    def __init__(self, policy: TrapPolicy) -> None:
        self.policy = policy
        self._pending: dict[int, PendingTrap] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, tid: int, trap_number: int, notice: bytes, now_ns: int, port: int = 0) -> PendingTrap:
        trap = PendingTrap(tid, trap_number, notice, now_ns, now_ns, port=port)
        self._pending[tid] = trap
        return trap

    def sent(self, trap: PendingTrap, now_ns: int) -> None:
        """Record a send attempt; drops the trap once it has used its repeats."""
        trap.sends += 1
        trap.next_due_ns = now_ns + self.policy.period_ns
        limit = self.policy.max_repeats
        if limit is not None and trap.sends > limit:
            self._pending.pop(trap.tid, None)

    def repress(self, tid: int) -> PendingTrap | None:
        """Stop the trap with this TID; also matches on the low 32 bits alone, since OpenSM
        (through umad) answers with only the low 32 bits of the trap's TID."""
        trap = self._pending.pop(tid, None)
        if trap is None:
            low = tid & 0xFFFFFFFF
            match = [t for t in self._pending.values() if t.tid & 0xFFFFFFFF == low]
            if len(match) == 1:
                trap = self._pending.pop(match[0].tid)
        return trap

    def due(self, now_ns: int) -> list[PendingTrap]:
        return [t for t in self._pending.values() if t.next_due_ns <= now_ns]

    def next_deadline(self) -> int | None:
        return min((t.next_due_ns for t in self._pending.values()), default=None)

    def pending(self) -> list[PendingTrap]:
        return list(self._pending.values())
