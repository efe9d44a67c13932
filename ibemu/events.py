"""ibemu's event logs: the one JSON-lines writer, its readers, and the one event vocabulary.

Every ibemu process logs what it did as JSON lines, one record per event, each with its
``kind`` and a ``t_ns`` stamp from ``ibemu.clock.now_ns()`` (the one emulated clock every ibemu process
reads), so the logs of a run merge on ``t_ns``. The logs (``Log``) of a run
directory ``RUN_DIR``:

- ``Log.FABRIC``, ``RUN_DIR/events.jsonl``: the agent host (``ibemu.fabric.agenthost``), what
  the device agents and the kernel saw; every record starts with the ``node`` that logged it
  (the IB fault injector is node ``fault-injector``; the RoCE one under ``ibemu up``'s daemon
  appends its ``fault`` records here with ``source``);
- ``Log.SM``, ``RUN_DIR/ibemu/events.jsonl``: ibemu's subnet manager (``ibemu.sm``);
- ``Log.OPENSM``, ``RUN_DIR/opensm/events.jsonl``: OpenSM's log in the SM's vocabulary
  (``ibemu.fabric.opensm_log``);
- ``Log.FM``, ``RUN_DIR/fm.jsonl``: the RoCE fabric manager (``ibemu.roce.fabric_manager``);
- ``Log.FAULTS``, ``RUN_DIR/faults.jsonl``: the RoCE fault injector of ``ibemu run``;
- ``Log.LAG``, ``RUN_DIR/lag.jsonl``: every monitored process of an ``ibemu run`` appends its
  lag behind the emulated clock here (``ibemu.lagmon``).

``Kind`` names every event kind once and ``VOCABULARY`` says, per kind, what it means and
which fields it carries in each log that has it (beyond ``kind``, ``t_ns`` and the fabric
log's ``node``); writers and readers use ``Kind`` rather than string literals (the device
agents of ``ibemu.agents`` still name their kinds as strings; a test holds them to ``Kind``).

Writing: ``EventLog`` (``emit`` a kind with fields, or ``write`` a ready record); records of
a log's ``LAZY`` kinds (one per SMP, in the middle of a reroute) are kept as they are, not
even encoded, until the next other record, ``flush`` (the agent host's ticker, every 50 ms)
or ``close``, and so is a record emitted ``lazy`` (the SM's records in the middle of a
reroute, which a record that closes the pass always follows: ``ibemu.sm.manager``); every
other record is written and flushed at once, with those before it.
``FabricLog`` is the agent host's. ``append`` and ``write_all`` write records to a log
without keeping it open (a fault injector of its own; OpenSM's translated log). Reading:
``read_events`` (a torn last line is skipped).

Where this differs from the two logs it replaces (the agent host's and ``ibemu.sm.events``):
the SM's lazy records (``lft_block_acked``) used to be encoded into the file's buffer at once;
they are now kept unencoded like the fabric's, and reach the file at the same point (the
``lft_programmed`` that closes a pass; at most ``LAZY_LIMIT`` of them wait). The bytes on disk,
the stamps and the flush points are the same.
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from ibemu import clock as _clock

Clock = Callable[[], int]


class Log(StrEnum):
    """The event logs of a run (see the module docstring for their files)."""

    FABRIC = "fabric"
    SM = "sm"
    OPENSM = "opensm"
    FM = "fm"
    FAULTS = "faults"
    LAG = "lag"


class Kind(StrEnum):
    """Every event kind ibemu writes (the value is the ``kind`` on disk)."""

    # the fabric: carrier and port state, what the device agents did, the LFTs in tc
    CARRIER = "carrier"
    PORT_STATE = "port_state"
    LID_ASSIGNED = "lid_assigned"
    LFT_SET = "lft_set"
    LFT_TOP = "lft_top"
    LFT_PROGRAMMED = "lft_programmed"
    GROUPS_PROGRAMMED = "groups_programmed"
    LFT_ERROR = "lft_error"
    ALT_SET = "alt_set"
    LOCAL_FAILOVER = "local_failover"
    FAULT_NOTICE_SENT = "fault_notice_sent"
    REPAIRS_ENDED = "repairs_ended"
    TRAP_SENT = "trap_sent"
    TRAP_REPRESSED = "trap_repressed"
    TRAP_UNROUTABLE = "trap_unroutable"
    MKEY_VIOLATION = "mkey_violation"
    PKEY_VIOLATION = "pkey_violation"
    PARTITIONS_PROGRAMMED = "partitions_programmed"
    MKEY_LEASE_STOPPED = "mkey_lease_stopped"
    MKEY_LEASE_EXPIRED = "mkey_lease_expired"
    SMP_DISCARD = "smp_discard"
    MAD_UNDELIVERABLE = "mad_undeliverable"
    RX_BAD_PORT = "rx_bad_port"
    RX_ERROR = "rx_error"
    RX_DROP = "rx_drop"
    INTERNAL_ERROR = "internal_error"
    FAULT = "fault"
    CREDIT_LOOP = "credit_loop"
    # a subnet manager (ibemu's, OpenSM's translated)
    SM_START = "sm_start"
    SM_STOP = "sm_stop"
    SWEEP_START = "sweep_start"
    SWEEP_END = "sweep_end"
    DISCOVERED = "discovered"
    LIDS_ASSIGNED = "lids_assigned"
    ROUTES_COMPUTED = "routes_computed"
    ROUTING_FALLBACK = "routing_fallback"
    LFT_BLOCK_ACKED = "lft_block_acked"
    PORTS_ACTIVE = "ports_active"
    SUBNET_UP = "subnet_up"
    TRAP = "trap"
    LINK_DOWN = "link_down"
    LINK_UP = "link_up"
    LINK_REINIT = "link_reinit"
    PARTITION = "partition"
    PARTITION_HEALED = "partition_healed"
    REROUTE = "reroute"
    SUSPECT = "suspect"
    SWITCH_DROPPED = "switch_dropped"
    SM_INFO = "sm_info"
    SM_STATE = "sm_state"
    SM_FOUND = "sm_found"
    SM_POLL_FAILED = "sm_poll_failed"
    SM_MASTER_LOST = "sm_master_lost"
    SM_HANDOVER = "sm_handover"
    DUMPS_WRITTEN = "dumps_written"
    ERROR = "error"
    # the RoCE fabric manager
    FM_START = "fm_start"
    FM_STOP = "fm_stop"
    ROUTES_PROGRAMMED = "routes_programmed"
    FABRIC_UP = "fabric_up"
    # every monitored process of a run
    LAG = "lag"
    LINK_FIDELITY = "link_fidelity"


@dataclass(frozen=True)
class KindInfo:
    """What a kind means and, per log that has it, the fields it may carry (beyond ``kind``,
    ``t_ns`` and the fabric log's ``node``)."""

    meaning: str
    fields: Mapping[Log, tuple[str, ...]]


_AGENT = "node_guid"  # every record a device agent logs names its node's GUID

VOCABULARY: dict[Kind, KindInfo] = {
    Kind.CARRIER: KindInfo(
        "a port's carrier changed (RoCE: administratively up and running): t_detect",
        {Log.FABRIC: ("port", "up"), Log.FM: ("node", "port", "ifname", "up")}),
    Kind.PORT_STATE: KindInfo(
        "a port's logical/physical state changed (an agent's, or the host's PortStateChange)",
        {Log.FABRIC: (_AGENT, "port", "why", "state", "phys_state", "phys")}),
    Kind.LID_ASSIGNED: KindInfo(
        "the SM set a port's LID (a CA's port, a switch's port 0)",
        {Log.FABRIC: (_AGENT, "port", "lid", "sm_lid")}),
    Kind.LFT_SET: KindInfo(
        "a switch's SMA accepted an LFT block Set",
        {Log.FABRIC: (_AGENT, "block", "changed")}),
    Kind.LFT_TOP: KindInfo(
        "a switch's SMA accepted a new LinearFDBTop",
        {Log.FABRIC: (_AGENT, "top", "changed")}),
    Kind.LFT_PROGRAMMED: KindInfo(
        "fabric: a switch's accepted LFT changes are in tc; SM: a programming pass ended",
        {Log.FABRIC: ("entries", "ops", "apply_us", "queued_us"),
         Log.SM: ("blocks", "failed", "abandoned", "switches", "seconds")}),
    Kind.GROUPS_PROGRAMMED: KindInfo(
        "ibemu's SM wrote an adaptive engine's alternates and every switch's FailoverConfig of a "
        "new generation (the switches' own repairs end; the tables of those that had any rewritten)",
        {Log.SM: ("generation", "blocks", "failed", "switches", "tables_rewritten")}),
    Kind.LFT_ERROR: KindInfo(
        "writing a switch's LFT changes to tc failed",
        {Log.FABRIC: ("entries", "error")}),
    Kind.ALT_SET: KindInfo(
        "a switch's SMA accepted an AlternatePorts block Set (vendor attribute 0xFF30: 16 LIDs)",
        {Log.FABRIC: (_AGENT, "block")}),
    Kind.LOCAL_FAILOVER: KindInfo(
        "a switch forwards LIDs on alternates by itself from t_ns: a port lost carrier (the kernel's "
        "failover), or a neighbour's fault notice arrived on port (via notice; moved_lids: which "
        "LIDs it moved)",
        {Log.FABRIC: ("port", "lids", "carrier_t_ns", "via", "moved_lids")}),
    Kind.FAULT_NOTICE_SENT: KindInfo(
        "a switch told its switch neighbours which LIDs it can no longer reach (vendor attribute 0xFF32)",
        {Log.FABRIC: (_AGENT, "lids", "ports", "exclude")}),
    Kind.REPAIRS_ENDED: KindInfo(
        "the SM's new generation reached a switch that had moved LFT entries on fault notices: "
        "its repairs end (the SM rewrites its table)",
        {Log.FABRIC: (_AGENT, "lids")}),
    Kind.TRAP_SENT: KindInfo(
        "a switch or CA sent (or repeated) a trap to the SM (128: link state, 256: bad M_Key, 257: bad P_Key)",
        {Log.FABRIC: (_AGENT, "tid", "trap_number", "issuer_lid", "sm_lid", "egress", "repeat", "port", "why")}),
    Kind.TRAP_REPRESSED: KindInfo(
        "the SM's TrapRepress reached the switch or CA: the trap is no longer repeated",
        {Log.FABRIC: (_AGENT, "tid", "trap_number", "sends")}),
    Kind.TRAP_UNROUTABLE: KindInfo(
        "a switch or CA had a trap to send but no route to the SM",
        {Log.FABRIC: (_AGENT, "tid", "trap_number", "sm_lid")}),
    Kind.MKEY_VIOLATION: KindInfo(
        "an SMP failed an SMA's M_Key check and was dropped (agent); a trap 256 reached the SM (SM)",
        {Log.FABRIC: (_AGENT, "port", "method", "attr", "modifier", "slid", "m_key", "protect", "violations",
                      "lease_s"),
         Log.SM: ("issuer_lid", "lidaddr", "dr_slid", "method", "attr", "modifier", "m_key")}),
    Kind.PKEY_VIOLATION: KindInfo(
        "a switch port's partition enforcement dropped a packet (agent, rate-limited as trap 257); "
        "a trap 257 reached the SM (SM)",
        {Log.FABRIC: (_AGENT, "port", "inbound", "pkey", "slid", "dlid", "sl", "qp"),
         Log.SM: ("issuer_lid", "lid1", "lid2", "pkey", "sl", "qp2")}),
    Kind.PARTITIONS_PROGRAMMED: KindInfo(
        "ibemu's SM wrote the partitions' P_KeyTables and enforcement bits",
        {Log.SM: ("tables", "ports", "failed")}),
    Kind.MKEY_LEASE_STOPPED: KindInfo(
        "an SMP with the valid M_Key stopped a port's M_Key lease countdown",
        {Log.FABRIC: (_AGENT, "port")}),
    Kind.MKEY_LEASE_EXPIRED: KindInfo(
        "a port's M_Key lease ran out: its protect bits are 0 (the M_Key stays)",
        {Log.FABRIC: (_AGENT, "port", "protect_before")}),
    Kind.SMP_DISCARD: KindInfo(
        "an SMA discarded an SMP (directed-route checks, egress down, no route)",
        {Log.FABRIC: (_AGENT, "port", "reason", "dlid")}),
    Kind.MAD_UNDELIVERABLE: KindInfo(
        "a CA had a MAD for its host but nobody to hand it to",
        {Log.FABRIC: (_AGENT, "port", "reason", "dlid", "mgmt_class", "attr")}),
    Kind.RX_BAD_PORT: KindInfo(
        "a frame arrived on a port the agent does not have",
        {Log.FABRIC: (_AGENT, "port")}),
    Kind.RX_ERROR: KindInfo(
        "a frame failed the agent's checks (CRCs, lengths)",
        {Log.FABRIC: (_AGENT, "port", "error", "length")}),
    Kind.RX_DROP: KindInfo(
        "a frame was dropped by rule (VL15 but not an SMP, a bad Q_Key)",
        {Log.FABRIC: (_AGENT, "port", "reason")}),
    Kind.INTERNAL_ERROR: KindInfo(
        "an agent raised on a frame (a bug, counted; the agent keeps running)",
        {Log.FABRIC: (_AGENT, "port", "error")}),
    Kind.FAULT: KindInfo(
        "a fault was injected (action link_down|link_up|switch_down|switch_up|smp_loss|corrupt): t_fault",
        {Log.FABRIC: ("action", "target", "end", "percent", "source"),
         Log.FAULTS: ("action", "target", "end", "source")}),
    Kind.CREDIT_LOOP: KindInfo(
        "the user datapath's link model found a credit loop: a cycle of (switch, port, VL) egress "
        "queues, each waiting for credits the next one holds, none returned for a while (a deadlock)",
        {Log.FABRIC: ("hops", "stalled_us")}),
    Kind.SM_START: KindInfo(
        "the SM started; its SMP timeout in emulated and real seconds at the run's dilation (``ibemu.sm.timers``)",
        {Log.SM: ("engine", "max_in_flight", "priority", "dilation", "timeout_s", "timeout_real_s")}),
    Kind.SM_STOP: KindInfo(
        "the SM stopped",
        {Log.SM: ("sweeps", "smps", "stats", "port")}),
    Kind.SWEEP_START: KindInfo(
        "a sweep began (reason cold|heavy|recover|light|trap)",
        {Log.SM: ("sweep", "reason")}),
    Kind.SWEEP_END: KindInfo(
        "a sweep ended, with the SMPs it took (sent, answered, timeouts, retries, ...)",
        {Log.SM: ("sweep", "reason", "seconds", "nodes", "smps", "ok", "changed", "deferred", "state")}),
    Kind.DISCOVERED: KindInfo(
        "a full discovery ended",
        {Log.SM: ("switches", "cas", "links", "seconds")}),
    Kind.LIDS_ASSIGNED: KindInfo(
        "the SM assigned LIDs",
        {Log.SM: ("new", "total", "sm_lid")}),
    Kind.ROUTES_COMPUTED: KindInfo(
        "routes computed (OpenSM: its tables configured on all switches)",
        {Log.SM: ("engine", "seconds", "switches"), Log.OPENSM: ("engine",),
         Log.FM: ("seconds", "routes", "routers", "cables_down")}),
    Kind.ROUTING_FALLBACK: KindInfo(
        "OpenSM's routing engine could not route and fell back (to minhop)",
        {Log.OPENSM: ("engine", "what")}),
    Kind.LFT_BLOCK_ACKED: KindInfo(
        "a switch acknowledged one LFT block Set",
        {Log.SM: ("switch", "block")}),
    Kind.PORTS_ACTIVE: KindInfo(
        "the SM moved ports to Active",
        {Log.SM: ("sets", "ports")}),
    Kind.SUBNET_UP: KindInfo(
        "the subnet is up: the SM's \"SUBNET UP\" (seconds of the cold sweep)",
        {Log.SM: ("seconds", "nodes", "ports", "reason"), Log.OPENSM: ()}),
    Kind.TRAP: KindInfo(
        "the SM received a trap (its TrapRepress goes out at once): t_trap; t_port_ns: when the "
        "kernel received it at the SM's port (its own packet socket), before the SM process took it",
        {Log.SM: ("issuer_lid", "trap_number", "tid", "slid", "t_port_ns"),
         Log.OPENSM: ("trap_number", "issuer_lid", "tid")}),
    Kind.LINK_DOWN: KindInfo(
        "the SM found a cable gone (peer \"guid:port\")",
        {Log.SM: ("guid", "port", "peer")}),
    Kind.LINK_UP: KindInfo(
        "the SM found a new cable",
        {Log.SM: ("guid", "port", "peer")}),
    Kind.LINK_REINIT: KindInfo(
        "the SM found a port that retrained (its far end may have rebooted)",
        {Log.SM: ("guid", "port", "peer")}),
    Kind.PARTITION: KindInfo(
        "the SM can no longer reach some nodes (peers_lost: reachable CA -> lost CAs)",
        {Log.SM: ("lost", "lost_switches", "peers_lost")}),
    Kind.PARTITION_HEALED: KindInfo(
        "nodes lost to a partition are back",
        {Log.SM: ("nodes", "still_lost")}),
    Kind.REROUTE: KindInfo(
        "a reroute after a trap or sweep (FM: a cable change): t_trap/t_detect -> t_routed -> t_programmed",
        {Log.SM: ("t_trap", "t_rediscovered", "t_route_start", "t_routed", "t_planned", "t_programmed",
                  "blocks", "blocks_failed", "blocks_abandoned", "suspects", "issuers", "changes", "reset",
                  "reason", "cpu_ms"),
         Log.OPENSM: ("t_trap", "t_routed", "t_programmed", "t_subnet_up", "engine", "reason"),
         Log.FM: ("t_trap", "t_detect", "t_routed", "t_programmed", "reason", "cables", "changes", "routers",
                  "messages", "local_covered", "local_blackholed", "reprogrammed")}),
    Kind.SUSPECT: KindInfo(
        "a switch left a Set unanswered or lost its cables: the next pass checks it",
        {Log.SM: ("guid", "desc", "why")}),
    Kind.SWITCH_DROPPED: KindInfo(
        "a suspect did not answer: taken out of the subnet as if all its cables were down",
        {Log.SM: ("guid", "desc")}),
    Kind.SM_INFO: KindInfo(
        "another SM sent this one a SubnGet/SubnSet(SMInfo), answered with its state",
        {Log.SM: ("from_lid", "answered", "method", "modifier", "state", "dr")}),
    Kind.SM_STATE: KindInfo(
        "the SM's SMInfo state changed (election, takeover, handover; ibemu.sm.election)",
        {Log.SM: ("old", "new", "reason", "master"), Log.OPENSM: ("new",)}),
    Kind.SM_FOUND: KindInfo(
        "a sweep found another SM's port (CapabilityMask IsSM) and read its SMInfo",
        {Log.SM: ("guid", "priority", "state", "act_count", "answered")}),
    Kind.SM_POLL_FAILED: KindInfo(
        "a standby's poll of its master failed (unanswered, not master, or ActCount still)",
        {Log.SM: ("master", "failed", "why")}),
    Kind.SM_MASTER_LOST: KindInfo(
        "a standby gave up on its master after poll_retries failed polls: t_first_failed",
        {Log.SM: ("master", "failed", "t_first_failed")}),
    Kind.SM_HANDOVER: KindInfo(
        "SubnSet(SMInfo) HANDOVER or ACKNOWLEDGE sent to another SM",
        {Log.SM: ("to", "modifier", "answered")}),
    Kind.DUMPS_WRITTEN: KindInfo(
        "OpenSM-format dump files (opensm-subnet.lst, opensm-lfts.dump, guid2lid) rewritten",
        {Log.SM: ("dir", "sweep")}),
    Kind.ERROR: KindInfo(
        "the SM could not go on with a step",
        {Log.SM: ("what",)}),
    Kind.FM_START: KindInfo(
        "the fabric manager started",
        {Log.FM: ("routers", "reroute")}),
    Kind.FM_STOP: KindInfo(
        "the fabric manager stopped",
        {Log.FM: ("reroutes",)}),
    Kind.ROUTES_PROGRAMMED: KindInfo(
        "the fabric manager wrote its routes into the routers",
        {Log.FM: ("seconds", "messages", "routers")}),
    Kind.FABRIC_UP: KindInfo(
        "every route of the RoCE fabric is programmed",
        {Log.FM: ("seconds", "routes")}),
    Kind.LAG: KindInfo(
        "how late a process's monitor woke, in emulated time, over an interval (ibemu.lagmon)",
        {Log.LAG: ("process", "pid", "since_ns", "period_us", "samples", "p50_us", "p99_us", "max_us",
                   "buckets", "final")}),
    Kind.LINK_FIDELITY: KindInfo(
        "one cable direction of the IB user datapath over an interval: frames, bytes, how late the "
        "real departures left against the link model's times, model vs real time while busy",
        {Log.LAG: ("link", "since_ns", "gbps", "frames", "bytes", "busy_model_ns", "busy_real_ns",
                   "rx_drops", "samples", "p50_us", "p99_us", "max_us", "buckets", "final")}),
}

LAZY: dict[Log, frozenset[str]] = {
    Log.FABRIC: frozenset({Kind.LFT_SET, Kind.LFT_TOP, Kind.LFT_PROGRAMMED, Kind.LID_ASSIGNED,
                           Kind.PORT_STATE}),
    Log.SM: frozenset({Kind.LFT_BLOCK_ACKED}),
}
"""Per log, the kinds written late: one or more per SMP an SM sends (encoding and writing
each cost the agents ~30 us per LFT Set, the SM ~10 us per block, in the middle of a
reroute; two ``port_state`` records per PortInfo Set of an activation were 15% of the agent
host's time in a bring-up). The fabric's go out with the agent host's ticker (every 50 ms) or any other record;
the SM's with the ``lft_programmed`` that closes each pass."""
LAZY_LIMIT = 4096
"""Lazy records kept at most (a bring-up's burst is written out in pieces)."""

LINK_CHANGE: dict[str, Kind] = {"down": Kind.LINK_DOWN, "up": Kind.LINK_UP, "reinit": Kind.LINK_REINIT}
"""The SM's event for each kind of port change its discovery finds."""


def encode(record: Mapping[str, Any]) -> str:
    """One record as a JSON line (sets sorted into lists, anything else not JSON as ``str``):
    ``json.dumps(record, default=...)``'s bytes, from one encoder made once (``dumps`` makes
    one per call, a third of its time on these small records)."""
    return _ENCODER.encode(record) + "\n"


def _jsonable(value: object) -> object:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    return str(value)


_ENCODER = json.JSONEncoder(default=_jsonable)


class EventLog:
    """Writes events as JSON lines to ``path`` (None: memory only) for ``log`` (which kinds
    are lazy: ``LAZY``); keeps the last ``keep`` records in ``records`` and counts each kind.
    Every record but the lazy ones is written and flushed at once, with those before it
    (``inline_max``: when they are not too many); lazy ones are kept as they are (not even
    encoded) until then, ``flush`` or ``close``."""

    def __init__(self, path: Path | str | None = None, *, log: Log = Log.SM, clock: Clock | None = None,
                 keep: int = 100_000) -> None:
        self.log = log
        self.clock: Clock = clock or _clock.now_ns
        self.lazy = LAZY.get(log, frozenset())
        self.counts: Counter[str] = Counter()
        self.records: deque[Mapping[str, Any]] = deque(maxlen=keep)
        self._keep = keep > 0
        self._lazy: list[tuple[str | None, Mapping[str, Any]]] = []
        self._lazy_since = 0
        """``time.monotonic_ns()`` when the oldest lazy record waiting was kept."""
        self.inline_max: int | None = None
        """At most this many lazy records are written ahead of another record (None: all of
        them); a longer backlog is left to ``flush`` (see ``FabricLog``)."""
        self._f: IO[str] | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._f = open(path, "a")  # noqa: SIM115

    def now(self) -> int:
        return self.clock()

    def emit(self, kind: str, *, t_ns: int | None = None, lazy: bool = False, **fields: Any) -> dict[str, Any]:
        """Log a ``kind`` record stamped ``t_ns`` (default: now); returns it. ``lazy``: written
        with the next record that is not (or ``flush``), as the log's ``LAZY`` kinds are: for a
        caller that is sure one follows soon."""
        rec = {"kind": kind, "t_ns": self.clock() if t_ns is None else t_ns, **fields}
        self.write(None, rec, lazy=lazy)
        return rec

    def write(self, node: str | None, record: Mapping[str, Any], *, lazy: bool = False) -> None:
        """Log ``record`` (with ``kind`` and ``t_ns``), led by ``"node": node`` unless None.
        Not to be changed afterwards: a lazy one is encoded later."""
        kind = str(record.get("kind", "?"))
        self.counts[kind] += 1
        if self._keep:
            self.records.append(record if node is None else {"node": node, **record})
        if self._f is None:
            return
        if lazy or kind in self.lazy:
            if not self._lazy:
                self._lazy_since = time.monotonic_ns()
            self._lazy.append((node, record))
            if len(self._lazy) >= LAZY_LIMIT:
                self.flush()
            return
        if self._lazy and self.inline_max is not None and len(self._lazy) > self.inline_max:
            self._f.write(_line(node, record))  # now; the backlog goes out later (``flush``)
        else:
            self._f.write(self._encoded() + _line(node, record))
        self._f.flush()

    def _encoded(self) -> str:
        lazy, self._lazy = self._lazy, []
        return "".join(_line(node, rec) for node, rec in lazy)

    def of(self, kind: str) -> list[Mapping[str, Any]]:
        """The kept records of ``kind``."""
        return [r for r in self.records if r["kind"] == kind]

    def flush(self, *, waited_s: float = 0.0, at_most: int | None = None) -> None:
        """Write out the lazy records kept so far; with ``waited_s``, only once the oldest
        of them has waited that long (real time); with ``at_most``, only that many of the
        oldest (the rest go with the next flush: a busy writer's pause stays short)."""
        if self._f is not None and self._lazy:
            if waited_s and time.monotonic_ns() - self._lazy_since < waited_s * 1e9:
                return
            if at_most is not None and len(self._lazy) > at_most:
                head, self._lazy = self._lazy[:at_most], self._lazy[at_most:]
                self._f.write("".join(_line(node, rec) for node, rec in head))
            else:
                self._f.write(self._encoded())
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self.flush()
            self._f.close()
            self._f = None


class FabricLog(EventLog):
    """The agent host's log (``Log.FABRIC``): records come stamped and are written with the
    node that logged them; nothing is kept in memory but the counts.

    A record that is not lazy goes out at once, with the lazy ones before it when they are
    at most ``INLINE_MAX``; a longer backlog (a burst's: a k=8 bring-up leaves ~3,000 lazy
    records, which the agent host's ticker writes in pieces over the next ~0.6 s) stays for
    ``flush``. Written ahead of it, the first fault of a run paid for the whole backlog in
    the middle of its carrier change: 27 ms (hand-timed, load ~1.5) between a cut switch
    port going down and the far end's trap, in ``benchmarks/bench_sm.py``'s first cut. So
    this log is in time order except while such a backlog drains: records written then
    come before the older lazy ones; each has its ``t_ns``."""

    INLINE_MAX = 64

    def __init__(self, path: Path | None) -> None:
        super().__init__(path, log=Log.FABRIC, keep=0)
        self.inline_max = self.INLINE_MAX


def _line(node: str | None, record: Mapping[str, Any]) -> str:
    return encode(record if node is None else {"node": node, **record})


def append(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record to the log at ``path``, opened for it alone."""
    with open(path, "a") as f:
        f.write(encode(record))


def append_all(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append the records to the log at ``path``, opened once for them."""
    with open(path, "a") as f:
        f.writelines(encode(r) for r in records)


def write_all(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write the log at ``path`` anew with ``records``."""
    with open(path, "w") as f:
        f.writelines(encode(r) for r in records)


def read_events(path: Path | None) -> list[dict[str, Any]]:
    """The records of a JSON-lines event log (a torn last line is skipped)."""
    if path is None or not path.exists():
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class LogTail:
    """A JSON-lines log read incrementally: each ``new()`` returns the whole records added
    since the last (a torn last line waits for its end; a missing file has none yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out
