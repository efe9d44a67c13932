"""The SM's JSON-lines event log: one record per step, stamped with ``time.monotonic_ns()``.

The same clock the fabric's agents stamp with, so SM and fabric logs merge on ``t_ns``.

Kinds (fields beyond ``kind`` and ``t_ns``):

- ``sm_start`` (engine, max_in_flight) · ``sm_stop`` (sweeps, smps, stats)
- ``sweep_start`` (sweep, reason: cold|heavy|recover|light|trap) · ``sweep_end`` (sweep,
  reason, seconds, nodes, smps: {sent, answered, timeouts, retries, failed, undeliverable,
  rx_late, rx_duplicate, rx_bad_tid, ...} during that sweep, and per reason: ok, changed,
  unanswered, reset)
- ``discovered`` (switches, cas, links, seconds) · ``lids_assigned`` (new, total, sm_lid)
- ``routes_computed`` (engine, seconds, switches) · ``lft_block_acked`` (switch, block) ·
  ``lft_programmed`` (blocks, failed, switches, seconds) · ``ports_active`` (sets, ports)
- ``subnet_up`` (seconds of the cold sweep, nodes, ports) — the SM's "SUBNET UP"
- ``trap`` (issuer_lid, trap_number, tid, slid); the TrapRepress goes out at once
- ``link_down`` / ``link_up`` / ``link_reinit`` (guid, port, peer "guid:port")
- ``partition`` (lost: CA names the SM can no longer reach, lost_switches, peers_lost:
  {reachable CA: [lost CAs]}) · ``partition_healed`` (nodes, still_lost)
- ``reroute`` (t_trap (None for a light sweep), t_rediscovered, t_route_start, t_routed,
  t_planned, t_programmed = last LFT block acked by a switch that answers, blocks,
  blocks_failed (including blocks_abandoned: Sets to a switch that stopped answering, not
  waited for), suspects, issuers, changes, reset, reason)
- ``suspect`` (guid, desc, why): a switch left a Set unanswered or lost its cables; the next
  pass reads its cables from its neighbours and probes it once · ``switch_dropped`` (guid,
  desc): a suspect that did not answer, taken out of the subnet as if all its cables were down
- ``sm_info`` (from_lid, answered) · ``error`` (what)
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

Clock = Callable[[], int]


LAZY_KINDS = frozenset({"lft_block_acked"})
"""Kinds written without a flush of their own (one per SMP: a write system call each cost the
SM ~10 us per block in a reroute); the ``lft_programmed`` that closes each pass flushes them."""


class EventLog:
    """Writes events as JSON lines to ``path`` (None: memory only); keeps the last ``keep``.
    Every record but the ``LAZY_KINDS`` is flushed at once, with those before it."""

    def __init__(self, path: Path | str | None = None, *, clock: Clock = time.monotonic_ns,
                 keep: int = 100_000) -> None:
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.records: deque[dict[str, Any]] = deque(maxlen=keep)
        self._f: IO[str] | None = open(path, "a") if path else None  # noqa: SIM115

    def now(self) -> int:
        return self.clock()

    def emit(self, kind: str, *, t_ns: int | None = None, **fields: Any) -> dict[str, Any]:
        rec = {"kind": kind, "t_ns": self.clock() if t_ns is None else t_ns, **fields}
        self.counts[kind] += 1
        self.records.append(rec)
        if self._f is not None:
            self._f.write(json.dumps(rec, default=_jsonable) + "\n")
            if kind not in LAZY_KINDS:
                self._f.flush()
        return rec

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _jsonable(value: object) -> object:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    return str(value)
