"""The result of ``ibemu run`` (schema ``ibemu.run/3``): typed structures and a validator.

The canonical form is a JSON object (what ``--json FILE`` writes); :class:`RunResult` and its
parts are the typed view of it, with ``to_dict()`` / ``from_dict()``. Every object is closed:
an unknown key is a problem, so a typo never passes silently and a new field means a new
schema version. The one open place is ``traffic[].extra``, where each traffic kind keeps its
own figures (latency percentiles, bus bandwidth...) as any JSON values. Every key is required;
the fields documented as nullable take ``null``. One key is optional: ``fabric.dilation``, the
run's time dilation factor (``ibemu.clock``; a number >= 1), present when it is not 1, so a run
at dilation 1 writes what it wrote before it existed.

``ibemu.run/2`` adds ``fidelity`` (required; null: not judged): whether every ibemu process kept up with the
emulated clock (``ibemu.scenario.fidelity``): ``{valid, dilation, threshold_us, worst_lag_us,
worst_process, processes: {name: {p50_us, p99_us, max_us, samples[, busy_pct]}}, worst_link, note}``
(``threshold_us`` and the lags in emulated us). Optional in it (``ibemu.run/3``, absent from
results written before): ``threshold_real_us`` (the threshold in real time, ``threshold_us`` x
the dilation), ``threshold_basis`` (what set it: the real-time rule, the run's smallest time
figure, or the scenario's ``time.lag_threshold_us``) and ``figure_us`` (that figure, emulated
us, null when the run had none).
An ``ibemu.run/1`` file (no ``fidelity``) still reads: its ``fidelity`` is ``None``
(unknown), and it is written back as it was.

``ibemu.run/3`` names units truly: a bandwidth flow's ``extra`` says ``peak_mibps`` and
``avg_mibps`` (MiB/s, perftest's unit) where ``ibemu.run/2`` and ``/1`` said ``peak_mbps``
and ``avg_mbps`` for the same MiB/s figures, and a fault's ``phases_ms`` may say
``local_failover`` (ms until a switch forwarded on alternate ports by itself). Nothing else changed: ``/2`` and ``/1`` files
still read and are written back as they were (``extra`` is open: their keys are kept).

Optional in ``ibemu.run/3`` (absent from results before it existed): ``link_load``, the
fabric's cables and what each carried over the run, read from the ports' PMA counters just
before teardown: ``{nodes: {name: "switch"|"ca"|"router"}, links: [{a, b, bytes}]}`` (``a``,
``b``: ``node:port``; ``bytes``: octets both directions, null where unknown). The HTML report
(``ibemu.report.html``) draws the topology and the load of each cable from it. ``credit_loops``:
the deadlocks the IB user datapath's link model found (``credit_loop`` events of the fabric
log), ``[{t_s, hops: [{switch, port, vl}], stalled_us}]``: when (seconds since traffic start),
the cycle of egress ports and VLs each waiting for credits the next one holds, and how long the
youngest had waited then; ``[]``: the run was watched for them and had none (absent: not
watched, e.g. the kernel datapath).

:func:`validate` reports every problem at once, located by key path
(``faults[0].phases_ms.trap: expected number or null, got str 'fast'``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ibemu.errors import IbemuError, did_you_mean

SCHEMA_VERSION = "ibemu.run/3"
READABLE_VERSIONS = ("ibemu.run/1", "ibemu.run/2", SCHEMA_VERSION)
"""What ``validate`` accepts: this version and the ones before it (``/1``: no ``fidelity``;
``/2``: bandwidth figures under the old key names)."""

FABRIC_KINDS = ("ib", "roce")
DATAPATHS = ("kernel", "user")
SM_IMPLS = ("ibemu", "opensm", "none")
PHASES = ("detect", "trap", "routed", "programmed")
"""Reroute phases in order, each in ms since the fault was injected."""
TAKEOVER_PHASES = ("sm_silent", "sm_noticed", "sm_master", "sm_swept")
"""A standby SM taking over (``sm_down``), in order, ms since the fault: its first poll the
master did not answer, it gave up on the master, it became master, its takeover sweep ended.
Optional: present when a standby took over."""


class ResultError(IbemuError):
    """A run result does not follow the schema; ``problems`` lists every located problem."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        head = f"{source}: " if source else ""
        super().__init__(f"{head}not a valid {SCHEMA_VERSION} result:\n  " + "\n  ".join(problems))


# --------------------------------------------------------------------------- typed structures


@dataclass
class ScenarioInfo:
    name: str
    file: str | None = None
    description: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "file": self.file, "description": self.description}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScenarioInfo:
        return cls(d["name"], d["file"], d["description"])


@dataclass
class FabricInfo:
    kind: str
    datapath: str
    nodes: int
    switches: int
    hosts: int
    links: int
    topology: str
    """How the topology was made: ``fat-tree k=4``, ``file small-cluster.ibnd``..."""
    dilation: float = 1.0
    """The run's time dilation factor (``ibemu.clock``); on disk only when not 1."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "datapath": self.datapath,
            "nodes": self.nodes,
            "switches": self.switches,
            "hosts": self.hosts,
            "links": self.links,
            "topology": self.topology,
        }
        if self.dilation != 1:
            d["dilation"] = self.dilation
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FabricInfo:
        return cls(
            d["kind"],
            d["datapath"],
            d["nodes"],
            d["switches"],
            d["hosts"],
            d["links"],
            d["topology"],
            d.get("dilation", 1.0),
        )


SM_CLOCKS = ("emulated", "libfaketime", "real")
"""The SM's clock on a dilated run: ibemu's SM reads the emulated clock, OpenSM runs on it
under libfaketime (``ibemu.kernel.faketime``); ``real`` would be an SM that did not follow it."""


@dataclass
class SMInfo:
    impl: str
    engine: str | None = None
    host: str | None = None
    clock: str | None = None
    """Which clock the SM ran on (``SM_CLOCKS``); on disk only on a dilated run."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"impl": self.impl, "engine": self.engine, "host": self.host}
        if self.clock is not None:
            d["clock"] = self.clock
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SMInfo:
        return cls(d["impl"], d["engine"], d["host"], d.get("clock"))


@dataclass
class Bringup:
    fabric_s: float
    sm_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"fabric_s": self.fabric_s, "sm_s": self.sm_s}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Bringup:
        return cls(d["fabric_s"], d["sm_s"])


@dataclass
class Phases:
    """Each phase in ms since the fault was injected; ``None``: did not happen / not applicable."""

    detect: float | None = None
    trap: float | None = None
    routed: float | None = None
    programmed: float | None = None
    local_failover: float | None = None
    """A switch forwarding on alternate ports, by itself (``sm.engine: ftree_ar|updn_ar`` on
    the kernel datapath): optional, present only when it happened."""
    takeover: dict[str, float | None] | None = None
    """``TAKEOVER_PHASES`` when a standby SM took over (optional)."""

    def to_dict(self) -> dict[str, Any]:
        d = {p: getattr(self, p) for p in PHASES}
        if self.local_failover is not None:
            d["local_failover"] = self.local_failover
        if self.takeover is not None:
            d.update({p: self.takeover.get(p) for p in TAKEOVER_PHASES})
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Phases:
        takeover = {p: d.get(p) for p in TAKEOVER_PHASES} if any(p in d for p in TAKEOVER_PHASES) else None
        return cls(d["detect"], d["trap"], d["routed"], d["programmed"], d.get("local_failover"), takeover)


@dataclass
class FlowImpact:
    """What one fault did to one flow."""

    flow: str
    blackout_ms: float | None = None
    resume_ms: float | None = None
    lost: int = 0
    retransmitted: int = 0
    training: dict[str, Any] | None = None
    """A training job's stall and slower steps (``ibemu.traffic.training.fault_impact``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "flow": self.flow,
            "blackout_ms": self.blackout_ms,
            "resume_ms": self.resume_ms,
            "lost": self.lost,
            "retransmitted": self.retransmitted,
            **({"training": self.training} if self.training is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FlowImpact:
        return cls(d["flow"], d["blackout_ms"], d["resume_ms"], d["lost"], d["retransmitted"], d.get("training"))


@dataclass
class FaultResult:
    at_s: float
    action: str
    target: str
    t_fault_s: float
    """Seconds since traffic start (the x axis of the plots)."""
    phases: Phases = field(default_factory=Phases)
    flows: list[FlowImpact] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "at_s": self.at_s,
            "action": self.action,
            "target": self.target,
            "t_fault_s": self.t_fault_s,
            "phases_ms": self.phases.to_dict(),
            "flows": [f.to_dict() for f in self.flows],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FaultResult:
        return cls(
            d["at_s"],
            d["action"],
            d["target"],
            d["t_fault_s"],
            Phases.from_dict(d["phases_ms"]),
            [FlowImpact.from_dict(f) for f in d["flows"]],
        )


@dataclass
class Timeline:
    """Throughput per bin: ``t_s[i]`` is the start of bin i (seconds since traffic start)."""

    t_s: list[float] = field(default_factory=list)
    gbps: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"t_s": list(self.t_s), "gbps": list(self.gbps)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Timeline:
        return cls(list(d["t_s"]), list(d["gbps"]))

    @property
    def bin_s(self) -> float | None:
        """Width of a bin, or ``None`` with fewer than two bins."""
        return self.t_s[1] - self.t_s[0] if len(self.t_s) > 1 else None


@dataclass
class TrafficResult:
    name: str
    kind: str
    src: str | list[str]
    """JSON key ``from``."""
    dst: str | list[str]
    """JSON key ``to``."""
    gbps: float
    packets: int
    bytes: int
    timeline: Timeline = field(default_factory=Timeline)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "from": self.src,
            "to": list(self.dst) if isinstance(self.dst, list) else self.dst,
            "gbps": self.gbps,
            "packets": self.packets,
            "bytes": self.bytes,
            "timeline": self.timeline.to_dict(),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrafficResult:
        to = d["to"]
        return cls(
            d["name"],
            d["kind"],
            d["from"],
            list(to) if isinstance(to, list) else to,
            d["gbps"],
            d["packets"],
            d["bytes"],
            Timeline.from_dict(d["timeline"]),
            dict(d["extra"]),
        )


@dataclass
class ProcessLag:
    """How late one process's lag monitor woke, in emulated microseconds."""

    p50_us: float
    p99_us: float
    max_us: float
    samples: int
    busy_pct: float | None = None
    """The share of the window's real time the process had work waiting (``lagmon.BusyMeter``);
    optional (None: not measured, or a result from before)."""

    def to_dict(self) -> dict[str, Any]:
        return {"p50_us": self.p50_us, "p99_us": self.p99_us, "max_us": self.max_us, "samples": self.samples,
                **({"busy_pct": self.busy_pct} if self.busy_pct is not None else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProcessLag:
        return cls(d["p50_us"], d["p99_us"], d["max_us"], d["samples"], d.get("busy_pct"))


@dataclass
class Fidelity:
    """Did the run keep up with its emulated clock (``ibemu.scenario.fidelity``)? ``valid``:
    every process's p99 lag under ``threshold_us``; when not, no figure is to scale."""

    valid: bool
    dilation: float = 1.0
    threshold_us: float = 0.0
    worst_lag_us: float | None = None
    """The highest p99 lag of any process (``worst_process``'s)."""
    worst_process: str | None = None
    processes: dict[str, ProcessLag] = field(default_factory=dict)
    worst_link: str | None = None
    """The cable direction (``switch:port``) furthest behind the link model, on the IB user
    datapath (null elsewhere: no link is timed); its figures are in ``note``."""
    note: str = ""
    threshold_real_us: float | None = None
    """``threshold_us`` in real time (x the dilation); optional (None: a result from before)."""
    threshold_basis: str | None = None
    """What set the threshold: the real-time rule, the run's smallest figure, or the scenario."""
    figure_us: float | None = None
    """The run's smallest time figure the threshold was bounded by (emulated us; None: none)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "dilation": self.dilation,
            "threshold_us": self.threshold_us,
            "worst_lag_us": self.worst_lag_us,
            "worst_process": self.worst_process,
            "processes": {k: v.to_dict() for k, v in self.processes.items()},
            "worst_link": self.worst_link,
            "note": self.note,
            **({"threshold_real_us": self.threshold_real_us} if self.threshold_real_us is not None else {}),
            **({"threshold_basis": self.threshold_basis} if self.threshold_basis is not None else {}),
            **({"figure_us": self.figure_us} if self.figure_us is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fidelity:
        return cls(
            d["valid"],
            d["dilation"],
            d["threshold_us"],
            d["worst_lag_us"],
            d["worst_process"],
            {k: ProcessLag.from_dict(v) for k, v in d["processes"].items()},
            d["worst_link"],
            d["note"],
            d.get("threshold_real_us"),
            d.get("threshold_basis"),
            d.get("figure_us"),
        )

    def behind(self) -> list[tuple[str, ProcessLag]]:
        """The processes whose p99 lag reached the threshold, worst first."""
        out = [(n, p) for n, p in self.processes.items() if p.p99_us >= self.threshold_us]
        return sorted(out, key=lambda np: -np[1].p99_us)


@dataclass
class CaptureFile:
    """What one capture (``--capture NODE:PORT``) holds when the run ended."""

    file: str
    files: list[str]
    """Its files on disk, newest first: ``file``, ``file.1``, ... (rotated at the size limit)."""
    frames: int
    bytes: int
    rotations: int = 0
    discarded: int = 0
    """Frames in rotated files deleted (beyond ``--capture-files``)."""
    dropped: int = 0
    """Frames the kernel dropped before the capture read them."""

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "files": list(self.files), "frames": self.frames, "bytes": self.bytes,
                "rotations": self.rotations, "discarded": self.discarded, "dropped": self.dropped}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaptureFile:
        return cls(d["file"], list(d["files"]), int(d["frames"]), int(d["bytes"]), int(d.get("rotations", 0)),
                   int(d.get("discarded", 0)), int(d.get("dropped", 0)))


@dataclass
class Files:
    events: str | None = None
    json: str | None = None
    plots: list[str] = field(default_factory=list)
    captures: list[str] = field(default_factory=list)
    capture_stats: list[CaptureFile] | None = None
    """Frames and bytes of each capture (optional: absent from results before it existed)."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "events": self.events,
            "json": self.json,
            "plots": list(self.plots),
            "captures": list(self.captures),
        }
        if self.capture_stats is not None:
            d["capture_stats"] = [c.to_dict() for c in self.capture_stats]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Files:
        stats = d.get("capture_stats")
        return cls(d["events"], d["json"], list(d["plots"]), list(d["captures"]),
                   None if stats is None else [CaptureFile.from_dict(c) for c in stats])


NODE_KINDS = ("switch", "ca", "router")


@dataclass
class LinkLoad:
    """One cable of the fabric and the octets it carried (both directions; None: unknown)."""

    a: str
    b: str
    bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LinkLoad:
        return cls(d["a"], d["b"], d["bytes"])


@dataclass
class FabricLoad:
    """The fabric's nodes (name -> kind) and cables with their load (``link_load``)."""

    nodes: dict[str, str] = field(default_factory=dict)
    links: list[LinkLoad] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": dict(self.nodes), "links": [lk.to_dict() for lk in self.links]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FabricLoad:
        return cls(dict(d["nodes"]), [LinkLoad.from_dict(x) for x in d["links"]])


@dataclass
class CreditLoopRecord:
    """A credit loop the link model found (``credit_loops``): a deadlock."""

    t_s: float
    hops: list[tuple[str, int, int]]
    """(switch, egress port, VL), each waiting on credits the next one holds."""
    stalled_us: float

    def to_dict(self) -> dict[str, Any]:
        return {"t_s": self.t_s, "hops": [{"switch": n, "port": p, "vl": vl} for n, p, vl in self.hops],
                "stalled_us": self.stalled_us}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CreditLoopRecord:
        return cls(d["t_s"], [(h["switch"], h["port"], h["vl"]) for h in d["hops"]], d["stalled_us"])

    def describe(self) -> str:
        path = " -> ".join(f"{n}:{p}/VL{vl}" for n, p, vl in self.hops)
        return f"{path} -> (back)"


@dataclass
class RunResult:
    """One ``ibemu run``: what was built, broken and measured."""

    scenario: ScenarioInfo
    started_at: str
    """ISO-8601 wall-clock time the run started (``datetime.now(UTC).isoformat()``)."""
    duration_s: float
    interrupted: bool
    fabric: FabricInfo
    sm: SMInfo
    bringup: Bringup
    faults: list[FaultResult] = field(default_factory=list)
    traffic: list[TrafficResult] = field(default_factory=list)
    files: Files = field(default_factory=Files)
    schema: str = SCHEMA_VERSION
    fidelity: Fidelity | None = None
    """``None``: not judged (an ``ibemu.run/1`` result, or one not made by a run): unknown."""
    link_load: FabricLoad | None = None
    """The cables and their load (optional; ``None``: not recorded)."""
    credit_loops: list[CreditLoopRecord] | None = None
    """Deadlocks the link model found (optional; ``None``: not watched)."""

    @property
    def invalid(self) -> bool:
        """The run fell behind its clock: its figures are not to scale."""
        return self.fidelity is not None and not self.fidelity.valid

    def to_dict(self) -> dict[str, Any]:
        d = {
            "schema": self.schema,
            "scenario": self.scenario.to_dict(),
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "interrupted": self.interrupted,
            "fabric": self.fabric.to_dict(),
            "sm": self.sm.to_dict(),
            "bringup": self.bringup.to_dict(),
            "faults": [f.to_dict() for f in self.faults],
            "traffic": [t.to_dict() for t in self.traffic],
        }
        if self.fidelity is not None or self.schema != READABLE_VERSIONS[0]:
            d["fidelity"] = None if self.fidelity is None else self.fidelity.to_dict()
        d["files"] = self.files.to_dict()
        if self.link_load is not None:
            d["link_load"] = self.link_load.to_dict()
        if self.credit_loops is not None:
            d["credit_loops"] = [c.to_dict() for c in self.credit_loops]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str | None = None) -> RunResult:
        """Build from a JSON-like dict; raises :class:`ResultError` listing every problem."""
        problems = validate(d)
        if problems:
            raise ResultError(problems, source)
        return cls(
            ScenarioInfo.from_dict(d["scenario"]),
            d["started_at"],
            d["duration_s"],
            d["interrupted"],
            FabricInfo.from_dict(d["fabric"]),
            SMInfo.from_dict(d["sm"]),
            Bringup.from_dict(d["bringup"]),
            [FaultResult.from_dict(f) for f in d["faults"]],
            [TrafficResult.from_dict(t) for t in d["traffic"]],
            Files.from_dict(d["files"]),
            d["schema"],
            Fidelity.from_dict(d["fidelity"]) if d.get("fidelity") is not None else None,
            FabricLoad.from_dict(d["link_load"]) if d.get("link_load") is not None else None,
            [CreditLoopRecord.from_dict(c) for c in d["credit_loops"]] if d.get("credit_loops") is not None else None,
        )


def as_result(result: RunResult | Mapping[str, Any]) -> RunResult:
    """Accept either form: a :class:`RunResult` as is, a dict validated and converted."""
    return result if isinstance(result, RunResult) else RunResult.from_dict(result)


# --------------------------------------------------------------------------- validation

Check = Callable[[Any, str, list[str]], None]


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, Mapping):
        return "object"
    if isinstance(v, list | tuple):
        return "list"
    return type(v).__name__


def _got(v: Any) -> str:
    text = repr(v)
    return f"got {_kind(v)} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _number(nullable: bool = False, minimum: float | None = 0.0) -> Check:
    what = "number or null" if nullable else "number"

    def check(v: Any, path: str, out: list[str]) -> None:
        if v is None and nullable:
            return
        if not _is_number(v):
            out.append(f"{path}: expected {what}, {_got(v)}")
        elif not math.isfinite(v):
            out.append(f"{path}: expected finite number, got {v!r}")
        elif minimum is not None and v < minimum:
            out.append(f"{path}: must be >= {minimum:g}, got {v!r}")

    return check


def _count(v: Any, path: str, out: list[str]) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        out.append(f"{path}: expected integer, {_got(v)}")
    elif v < 0:
        out.append(f"{path}: must be >= 0, got {v}")


def _boolean(v: Any, path: str, out: list[str]) -> None:
    if not isinstance(v, bool):
        out.append(f"{path}: expected true or false, {_got(v)}")


def _string(nullable: bool = False, choices: tuple[str, ...] | None = None) -> Check:
    what = "string or null" if nullable else "string"

    def check(v: Any, path: str, out: list[str]) -> None:
        if v is None and nullable:
            return
        if not isinstance(v, str):
            out.append(f"{path}: expected {what}, {_got(v)}")
        elif choices is not None and v not in choices:
            out.append(
                f"{path}: expected one of {', '.join(choices)}, got {v!r}{did_you_mean(v, choices)}"
            )
        elif choices is None and not nullable and not v:
            out.append(f"{path}: must not be empty")

    return check


def _timestamp(v: Any, path: str, out: list[str]) -> None:
    if not isinstance(v, str):
        out.append(f"{path}: expected ISO-8601 timestamp string, {_got(v)}")
        return
    try:
        datetime.fromisoformat(v)
    except ValueError:
        out.append(f"{path}: expected ISO-8601 timestamp, got {v!r}")


def _list(item: Check) -> Check:
    def check(v: Any, path: str, out: list[str]) -> None:
        if not isinstance(v, list | tuple):
            out.append(f"{path}: expected list, {_got(v)}")
            return
        for i, x in enumerate(v):
            item(x, f"{path}[{i}]", out)

    return check


def _dest(v: Any, path: str, out: list[str]) -> None:
    if isinstance(v, list | tuple):
        if not v:
            out.append(f"{path}: expected at least one host")
        _list(_string())(v, path, out)
    else:
        _string()(v, path, out)


def _json_value(v: Any, path: str, out: list[str]) -> None:
    if v is None or isinstance(v, bool | str):
        return
    if _is_number(v):
        if not math.isfinite(v):
            out.append(f"{path}: expected finite number, got {v!r}")
    elif isinstance(v, Mapping):
        for k, x in v.items():
            if not isinstance(k, str):
                out.append(f"{path}: keys must be strings, got {k!r}")
            else:
                _json_value(x, f"{path}.{k}", out)
    elif isinstance(v, list | tuple):
        for i, x in enumerate(v):
            _json_value(x, f"{path}[{i}]", out)
    else:
        out.append(f"{path}: not a JSON value, {_got(v)}")


def _free_object(v: Any, path: str, out: list[str]) -> None:
    if not isinstance(v, Mapping):
        out.append(f"{path}: expected object, {_got(v)}")
    else:
        _json_value(v, path, out)


def _object(
    fields: dict[str, Check],
    extra: Callable[[Mapping[str, Any], str, list[str]], None] | None = None,
    optional: dict[str, Check] | None = None,
) -> Check:
    optional = optional or {}
    def check(v: Any, path: str, out: list[str]) -> None:
        if not isinstance(v, Mapping):
            out.append(f"{path or 'result'}: expected object, {_got(v)}")
            return
        prefix = f"{path}." if path else ""
        for key, sub in fields.items():
            if key not in v:
                out.append(f"{prefix}{key}: missing")
            else:
                sub(v[key], prefix + key, out)
        for key in v:
            if key in optional:
                optional[key](v[key], prefix + key, out)
            elif key not in fields:
                out.append(f"{prefix}{key}: unknown key{did_you_mean(str(key), fields)}")
        if extra is not None:
            extra(v, path, out)

    return check


def _timeline_consistent(v: Mapping[str, Any], path: str, out: list[str]) -> None:
    t, g = v.get("t_s"), v.get("gbps")
    if not (isinstance(t, list) and isinstance(g, list)):
        return
    if len(t) != len(g):
        out.append(f"{path}: t_s has {len(t)} bins but gbps has {len(g)}")
    if len(t) < 2 or not all(_is_number(x) and math.isfinite(x) for x in t):
        return
    width = t[1] - t[0]
    if width <= 0:
        out.append(f"{path}.t_s: must increase, got {t[0]!r} then {t[1]!r}")
        return
    for i in range(2, len(t)):
        if not math.isclose(t[i] - t[i - 1], width, rel_tol=1e-3, abs_tol=1e-9):
            out.append(
                f"{path}.t_s[{i}]: bins must have equal width {width:g} s, got {t[i] - t[i - 1]:g} s"
            )
            return


def _fabric_consistent(v: Mapping[str, Any], path: str, out: list[str]) -> None:
    n, s, h = v.get("nodes"), v.get("switches"), v.get("hosts")
    if not (isinstance(n, int) and isinstance(s, int) and isinstance(h, int)):
        return
    if n < s + h:
        out.append(f"{path}.nodes: {n} is fewer than switches + hosts ({s} + {h})")


_NUM = _number()
_NUM_OR_NULL = _number(nullable=True)

_FLOW = _object(
    {
        "flow": _string(),
        "blackout_ms": _NUM_OR_NULL,
        "resume_ms": _NUM_OR_NULL,
        "lost": _count,
        "retransmitted": _count,
    },
    optional={"training": _free_object},  # a training job's (ibemu.traffic.training.fault_impact)
)
_FAULT = _object(
    {
        "at_s": _NUM,
        "action": _string(),
        "target": _string(),
        "t_fault_s": _number(minimum=None),
        "phases_ms": _object({p: _NUM_OR_NULL for p in PHASES},
                             optional={"local_failover": _NUM_OR_NULL, **{p: _NUM_OR_NULL for p in TAKEOVER_PHASES}}),
        "flows": _list(_FLOW),
    }
)
_TRAFFIC = _object(
    {
        "name": _string(),
        "kind": _string(),
        "from": _dest,
        "to": _dest,
        "gbps": _NUM,
        "packets": _count,
        "bytes": _count,
        "timeline": _object(
            {"t_s": _list(_number(minimum=None)), "gbps": _list(_NUM)}, _timeline_consistent
        ),
        "extra": _free_object,
    }
)


def _schema_version(v: Any, path: str, out: list[str]) -> None:
    if v not in READABLE_VERSIONS:
        older = " or ".join(repr(x) for x in READABLE_VERSIONS[:-1])
        out.append(f"{path}: expected {SCHEMA_VERSION!r} (or {older}), {_got(v)}")


def _fidelity_for_version(v: Mapping[str, Any], path: str, out: list[str]) -> None:
    """``fidelity`` is required from ibemu.run/2 on, and unknown to ibemu.run/1."""
    if v.get("schema") in READABLE_VERSIONS[1:] and "fidelity" not in v:
        out.append("fidelity: missing")
    elif v.get("schema") == READABLE_VERSIONS[0] and "fidelity" in v:
        out.append(f"fidelity: unknown key in an {READABLE_VERSIONS[0]} result")
    _unique_traffic_names(v, path, out)


def _fidelity_consistent(v: Mapping[str, Any], path: str, out: list[str]) -> None:
    worst, procs = v.get("worst_process"), v.get("processes")
    if isinstance(worst, str) and isinstance(procs, Mapping) and worst not in procs:
        out.append(f"{path}.worst_process: {worst!r} is not in processes")
    if v.get("valid") is True and not procs:
        out.append(f"{path}.valid: true with no process measured")


def _process_map(v: Any, path: str, out: list[str]) -> None:
    if not isinstance(v, Mapping):
        out.append(f"{path}: expected object, {_got(v)}")
        return
    for k, x in v.items():
        _PROCESS_LAG(x, f"{path}.{k}", out)


def _nullable(check: Check) -> Check:
    def nullable(v: Any, path: str, out: list[str]) -> None:
        if v is not None:
            check(v, path, out)

    return nullable


_PROCESS_LAG = _object({"p50_us": _NUM, "p99_us": _NUM, "max_us": _NUM, "samples": _count},
                       optional={"busy_pct": _NUM_OR_NULL})
_FIDELITY = _object(
    {
        "valid": _boolean,
        "dilation": _number(minimum=1.0),
        "threshold_us": _NUM,
        "worst_lag_us": _NUM_OR_NULL,
        "worst_process": _string(nullable=True),
        "processes": _process_map,
        "worst_link": _string(nullable=True),
        "note": _string(nullable=True),
    },
    _fidelity_consistent,
    optional={"threshold_real_us": _number(minimum=0.0), "threshold_basis": _string(nullable=True),
              "figure_us": _NUM_OR_NULL},
)


def _unique_traffic_names(v: Mapping[str, Any], path: str, out: list[str]) -> None:
    traffic = v.get("traffic")
    if not isinstance(traffic, list):
        return
    seen: dict[str, int] = {}
    for i, t in enumerate(traffic):
        name = t.get("name") if isinstance(t, Mapping) else None
        if isinstance(name, str):
            if name in seen:
                out.append(f"traffic[{i}].name: {name!r} already names traffic[{seen[name]}]")
            seen.setdefault(name, i)


_CAPTURE_FILE = _object(
    {
        "file": _string(),
        "files": _list(_string()),
        "frames": _count,
        "bytes": _count,
    },
    optional={"rotations": _count, "discarded": _count, "dropped": _count},
)

def _node_kinds(v: Any, path: str, out: list[str]) -> None:
    if not isinstance(v, Mapping):
        out.append(f"{path}: expected object, {_got(v)}")
        return
    for k, x in v.items():
        _string(choices=NODE_KINDS)(x, f"{path}.{k}", out)


def _endpoint(v: Any, path: str, out: list[str]) -> None:
    if not isinstance(v, str) or ":" not in v or not v.rsplit(":", 1)[1].isdigit():
        out.append(f"{path}: expected NODE:PORT, {_got(v)}")


def _links_known(v: Mapping[str, Any], path: str, out: list[str]) -> None:
    nodes, links = v.get("nodes"), v.get("links")
    if not (isinstance(nodes, Mapping) and isinstance(links, list)):
        return
    for i, lk in enumerate(links):
        for end in ("a", "b"):
            e = lk.get(end) if isinstance(lk, Mapping) else None
            if isinstance(e, str) and ":" in e and e.rsplit(":", 1)[0] not in nodes:
                out.append(f"{path}.links[{i}].{end}: node {e.rsplit(':', 1)[0]!r} is not in {path}.nodes")


_LINK_LOAD = _object(
    {
        "nodes": _node_kinds,
        "links": _list(_object({"a": _endpoint, "b": _endpoint, "bytes": _nullable(_count)})),
    },
    _links_known,
)

_CREDIT_LOOP = _object(
    {
        "t_s": _number(minimum=None),
        "hops": _list(_object({"switch": _string(), "port": _count, "vl": _count})),
        "stalled_us": _NUM,
    },
)

_RESULT = _object(
    {
        "schema": _schema_version,
        "scenario": _object(
            {
                "name": _string(),
                "file": _string(nullable=True),
                "description": _string(nullable=True),
            }
        ),
        "started_at": _timestamp,
        "duration_s": _NUM,
        "interrupted": _boolean,
        "fabric": _object(
            {
                "kind": _string(choices=FABRIC_KINDS),
                "datapath": _string(choices=DATAPATHS),
                "nodes": _count,
                "switches": _count,
                "hosts": _count,
                "links": _count,
                "topology": _string(),
            },
            _fabric_consistent,
            optional={"dilation": _number(minimum=1.0)},
        ),
        "sm": _object(
            {
                "impl": _string(choices=SM_IMPLS),
                "engine": _string(nullable=True),
                "host": _string(nullable=True),
            },
            optional={"clock": _string(choices=SM_CLOCKS)},
        ),
        "bringup": _object({"fabric_s": _NUM, "sm_s": _NUM_OR_NULL}),
        "faults": _list(_FAULT),
        "traffic": _list(_TRAFFIC),
        "files": _object(
            {
                "events": _string(nullable=True),
                "json": _string(nullable=True),
                "plots": _list(_string()),
                "captures": _list(_string()),
            },
            optional={"capture_stats": _list(_CAPTURE_FILE)},
        ),
    },
    _fidelity_for_version,
    optional={"fidelity": _nullable(_FIDELITY), "link_load": _nullable(_LINK_LOAD),
              "credit_loops": _list(_CREDIT_LOOP)},
)


def validate(result: Any) -> list[str]:
    """Every problem of ``result`` (a JSON-like dict) against ``ibemu.run/3`` (or an older
    ``ibemu.run/2`` or ``/1`` one); ``[]`` if valid."""
    out: list[str] = []
    _RESULT(result, "", out)
    return out
