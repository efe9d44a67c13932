"""What a scenario file may say, and the typed objects later layers consume.

A scenario file is YAML with these top-level keys (only ``topology`` is required)::

    name, description          free text (name defaults to the file name)
    topology                   {generator: NAME, <params>} | {file: X.ibnd} | {nodes: ..., links: ...}
    defaults                   {rate, mtu, delay_us | cable_m, loss_pct} for links without their own
    fabric                     {kind: ib|roce, datapath: kernel|user,
                                switch: {model, latency_ns, buffer_kb} (user datapath),
                                qos: {vls, sl2vl, vlarb_high, vlarb_low, vl_high_limit} (ib),
                                roce only: loss_pct, delay_us, ecn_mark_kb, ecn_line_gbps;
                                roce with datapath user: line_gbps, buffer_kb, pfc,
                                pfc_xoff_kb, pfc_xon_kb}
    sm                         {impl: ibemu|opensm, engine: minhop|updn|ftree|dor, host, sweep_interval_s, lmc}
    traffic                    [{name, kind, from, to | hosts, size, qps, start_s, stop_s, ...}]
    faults                     [{at_s, action, link | switch, period_s, count, percent, duration_s}]
    duration_s                 run length in seconds
    time                       {dilation: N | auto, lag_threshold_us: T}: run on a clock N times slower
                                than real time (N >= 1, default 1; ``auto``: chosen from the offered
                                load and this machine's calibration, ``ibemu.scenario.autodilation``); the run
                                is valid while every process's p99 lag stays under T emulated us
                                (default ``ibemu.scenario.fidelity.DEFAULT_THRESHOLD_US``)
    record                     {capture: [links] | all, json: PATH, plots: bool}

The key sets below are the schema; :mod:`ibemu.scenario.loader` enforces them. The names of
the extension points, and the keys each takes, come from their one registry each: routing
engines from ``ibemu.sm.routing.ENGINES``, traffic kinds from ``ibemu.traffic.flows.TRAFFIC_KINDS``,
fault actions from ``ibemu.fabric.faults.FAULT_ACTIONS`` (where ``FaultSpec`` lives too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ibemu.fabric.faults import FaultSpec
from ibemu.physics.link import SWITCH_MODELS, SwitchModel, default_switch_model
from ibemu.topo.model import Link, LinkDefaults, Topology
from ibemu.topo.rates import LinkRate

TOP_KEYS = (
    "name",
    "description",
    "topology",
    "defaults",
    "fabric",
    "sm",
    "traffic",
    "faults",
    "duration_s",
    "record",
    "time",
)
TOPOLOGY_SOURCES = ("generator", "file", "nodes")
TOPOLOGY_FILE_KEYS = ("file", "format", "name")
TOPOLOGY_EXPLICIT_KEYS = ("nodes", "links", "name")
NODE_KEYS = ("kind", "ports", "guid", "desc")
LINK_KEYS = ("endpoints", "rate", "mtu", "delay_us", "cable_m", "loss_pct")
DEFAULTS_KEYS = ("rate", "mtu", "delay_us", "cable_m", "loss_pct")
MAX_LINK_DELAY_US = 10_000_000.0
FABRIC_KEYS = ("kind", "datapath", "loss_pct", "delay_us", "ecn_mark_kb", "ecn_line_gbps", "line_gbps", "buffer_kb",
               "pfc", "pfc_xoff_kb", "pfc_xon_kb", "dscp_priority", "switch", "qos")
SWITCH_KEYS = ("model", "latency_ns", "buffer_kb")
"""``fabric.switch``: the switches' model (``ibemu.physics.link.SWITCH_MODELS``: ib-edr, ib-hdr,
ib-ndr, eth-spectrum, eth; default by the fabric's kind and rate), and overrides of its
port-to-port latency (ns) and buffer (KiB: IB, each input port's buffer per VL; Ethernet, each
egress port's). User datapath only: the kernel forwards without either."""
MAX_SWITCH_LATENCY_NS = 100_000
MAX_SWITCH_BUFFER_KB = 1 << 16
QOS_KEYS = ("vls", "sl2vl", "vlarb_high", "vlarb_low", "vl_high_limit")
"""``fabric.qos`` (IB): the data VLs every port operates (1, 2, 4 or 8: the emulated ports'
VLCap is VL0-VL7), the SL -> VL map (a list of 16 VLs, or {SL: VL}; unnamed SLs: SL mod vls),
the VL arbitration tables (lists of [VL, weight], weight in 64-byte units, at most
``VLARB_CAP`` entries each: the ports' VLArbitrationHighCap/LowCap) and VLHighLimit (0..255;
255 no limit). The SM programs them into every port after bring-up (SLtoVLMappingTable,
VLArbitrationTable, PortInfo.OperationalVLs/VLHighLimit)."""
QOS_VLS = (1, 2, 4, 8)
VLARB_CAP = 8
FABRIC_USER_KEYS = ("line_gbps", "buffer_kb", "pfc", "pfc_xoff_kb", "pfc_xon_kb", "dscp_priority")
"""RoCE user datapath only (``ibemu.roce.userpath``, timed by the link model as IB's user
datapath is: each cable's rate and delay are the topology's, ``defaults``/links ``rate``,
``delay_us``/``cable_m``; the switches' latency and buffer ``fabric.switch``): ``line_gbps``
overrides every cable's data rate (Gb/s: a slow fabric a run at dilation 1 can keep), the
ports' buffer (KiB, drop tail; ``fabric.switch.buffer_kb`` wins when both are given), PFC (true: the priority of RoCE data; or a list of priorities), the
XOFF/XON thresholds (KiB from one ingress port waiting in the router's queues) and DSCP ->
priority overrides ({DSCP: priority}; default DSCP >> 3: RoCE data 26 -> 3, CNPs 48 -> 6)."""
MAX_LINE_GBPS = 1000.0
ROCE_DATA_DSCP = 26
"""The DSCP of RoCE data: ``pfc: true`` makes its priority lossless (26 >> 3 = 3 by default)."""
MAX_BUFFER_KB = 1 << 20
FABRIC_IMPAIRMENTS = ("loss_pct", "delay_us")
"""RoCE cable impairments: frames each cable drops (percent, each direction) and the one-way
delay each cable adds (microseconds). An IB fabric is lossless: they apply to kind roce only."""
MAX_FABRIC_LOSS_PCT = 50.0
MAX_FABRIC_DELAY_US = 100_000.0
FABRIC_ECN = ("ecn_mark_kb", "ecn_line_gbps")
"""RoCE congestion control: each router port marks CE on ECN-capable frames that find more
than ecn_mark_kb KiB in a virtual queue drained at ecn_line_gbps; the hosts answer with CNPs
and slow down (DCQCN, with ecn_line_gbps as their line rate). Both or neither."""
MAX_ECN_MARK_KB = 65536.0
MAX_ECN_LINE_GBPS = 1000.0
FABRIC_KINDS = ("ib", "roce")
DATAPATHS = ("kernel", "user")
SM_KEYS = ("impl", "engine", "host", "sweep_interval_s", "lmc")
SM_IMPLS = ("ibemu", "opensm")
RECORD_KEYS = ("capture", "json", "plots")
TIME_KEYS = ("dilation", "lag_threshold_us")
MAX_LAG_THRESHOLD_US = 60_000_000.0

#: Keys every traffic entry takes (the kinds add theirs: ``ibemu.traffic.flows.TRAFFIC_KINDS``).
TRAFFIC_COMMON = ("name", "kind", "start_s", "stop_s", "sl")
DEFAULT_SIZE = 65536
"""Message size of a traffic entry without one, unless its kind has its own default."""

#: Keys every fault entry takes (the actions add theirs: ``ibemu.fabric.faults.FAULT_ACTIONS``).
FAULT_COMMON = ("at_s", "action")

STREAM_TRANSPORTS = ("rc", "ud")
DEFAULT_DURATION_S = 30.0
MAX_DURATION_S = 86400.0


@dataclass(frozen=True, slots=True)
class TopologySpec:
    """How the topology was given: a generator with params, a file, or explicit nodes/links."""

    source: Literal["generator", "file", "explicit"]
    generator: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    file: Path | None = None


@dataclass(frozen=True, slots=True)
class SwitchSpec:
    """``fabric.switch``: the switch model and its overrides (None: the model's figure)."""

    model: str = ""
    latency_ns: int | None = None
    buffer_kb: float | None = None

    def resolve(self, rate: LinkRate, *, ethernet: bool) -> SwitchModel:
        """The switch model the link model takes: named, or the default by kind and rate, with
        the overrides applied."""
        base = SWITCH_MODELS[self.model] if self.model else default_switch_model(rate, ethernet=ethernet)
        return SwitchModel(base.name, base.latency_ns if self.latency_ns is None else self.latency_ns,
                           base.buffer_bytes if self.buffer_kb is None else int(self.buffer_kb * 1024),
                           ethernet=base.ethernet)


@dataclass(frozen=True, slots=True)
class QosSpec:
    """``fabric.qos``: VLs, SL -> VL, VL arbitration (see ``QOS_KEYS``)."""

    vls: int = 1
    sl2vl: tuple[int, ...] = ()
    """16 VLs (SL 0..15); empty: SL mod vls."""
    vlarb_high: tuple[tuple[int, int], ...] = ()
    vlarb_low: tuple[tuple[int, int], ...] = ()
    vl_high_limit: int = 0
    where: str = ""

    def sl_to_vl(self) -> tuple[int, ...]:
        return self.sl2vl or tuple(sl % self.vls for sl in range(16))

    def sm_json(self) -> str:
        """What ibemu's SM takes (``python -m ibemu.sm --qos``: ``ibemu.sm.qos.SmQos``)."""
        return json.dumps({"vls": self.vls, "sl2vl": list(self.sl_to_vl()),
                           "vlarb_high": [list(e) for e in self.vlarb_high],
                           "vlarb_low": [list(e) for e in self.vlarb_low], "vl_high_limit": self.vl_high_limit})


@dataclass(frozen=True, slots=True)
class FabricSpec:
    kind: str = "ib"
    datapath: str = "kernel"
    loss_pct: float = 0.0
    """RoCE only: share of the frames each cable drops, each direction (eBPF on every cable end)."""
    delay_us: float = 0.0
    """RoCE only: one-way delay each cable adds (EDT under sch_fq, where the kernel has it)."""
    ecn_mark_kb: float = 0.0
    """RoCE only: a router port marks CE beyond this many KiB in its virtual queue (0: no ECN)."""
    ecn_line_gbps: float = 0.0
    """RoCE only: the rate the virtual queues drain at, and the hosts' DCQCN line rate."""
    line_gbps: float = 0.0
    """RoCE user datapath: every cable's data rate, overriding the topology's (0: the topology's)."""
    buffer_kb: float = 1024.0
    """RoCE user datapath: bytes a router port may hold (KiB)."""
    pfc: tuple[int, ...] = ()
    """RoCE user datapath: lossless priorities (PFC)."""
    pfc_xoff_kb: float = 64.0
    pfc_xon_kb: float = 32.0
    dscp_priority: tuple[tuple[int, int], ...] = ()
    """RoCE user datapath: (DSCP, priority) overrides of DSCP >> 3."""
    where: str = ""
    switch: SwitchSpec | None = None
    """User datapath: the switches' model, latency and buffer (None: defaults by kind and rate)."""
    qos: QosSpec | None = None
    """IB: VLs, SL -> VL and VL arbitration the SM programs (None: one VL, the agents' defaults)."""

    @property
    def ecn(self) -> bool:
        """ECN marking: on the user datapath at ``ecn_mark_kb`` of the model's queues (at the
        cables' rates); on the kernel one in a virtual queue drained at ``ecn_line_gbps``."""
        return bool(self.ecn_mark_kb and (self.ecn_line_gbps or self.roce_user))

    @property
    def impaired(self) -> bool:
        return bool(self.loss_pct or self.delay_us)

    @property
    def roce_user(self) -> bool:
        """A RoCE fabric forwarding in the user datapath."""
        return self.kind == "roce" and self.datapath == "user"


@dataclass(frozen=True, slots=True)
class SMSpec:
    impl: str = "ibemu"
    engine: str = "minhop"
    host: str = ""
    """CA that runs the SM (default: the first CA of the topology)."""
    sweep_interval_s: float = 10.0
    lmc: int = 0


@dataclass(frozen=True, slots=True)
class TrafficSpec:
    """One traffic generator (implemented elsewhere; parameters checked here)."""

    name: str
    kind: str
    hosts: tuple[str, ...]
    """Every CA taking part (for point-to-point kinds: ``(src, dst)``)."""
    src: str | None = None
    dst: str | None = None
    size: int = DEFAULT_SIZE
    qps: int = 1
    start_s: float = 0.0
    stop_s: float = DEFAULT_DURATION_S
    sl: int = 0
    bidirectional: bool = False
    seed: int = 0
    rate_pps: int | None = None
    transport: str = "rc"
    """Streams: rc (losses retransmitted) or ud (losses stay lost)."""
    where: str = ""


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """The run's clock (``ibemu.clock``): ``dilation`` N >= 1, emulated time advancing N times
    slower than real time; ``where`` locates it in its file."""

    dilation: float = 1.0
    where: str = ""
    lag_threshold_us: float | None = None
    """The p99 lag (emulated us) under which a process keeps up (None: the default)."""
    auto: bool = False
    """``dilation: auto``: the CLI chooses ``dilation`` before the run (``ibemu.cli.dilation``)."""


@dataclass(frozen=True, slots=True)
class RecordSpec:
    capture: tuple[Link, ...] = ()
    json: Path | None = None
    plots: bool = False


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    topology: Topology
    topology_spec: TopologySpec
    description: str = ""
    path: Path | None = None
    defaults: LinkDefaults = field(default_factory=LinkDefaults)
    fabric: FabricSpec = field(default_factory=FabricSpec)
    sm: SMSpec = field(default_factory=SMSpec)
    traffic: tuple[TrafficSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    duration_s: float = DEFAULT_DURATION_S
    record: RecordSpec = field(default_factory=RecordSpec)
    time: TimeSpec = field(default_factory=TimeSpec)
    warnings: tuple[str, ...] = ()
    """Located warnings: things the scenario says that will not do what it may think
    (``ibemu validate`` prints them; the runner logs them)."""
