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
    sm                         {impl: ibemu|opensm, engine: minhop|updn|ftree|dor, host, sweep_interval_s, lmc,
                                m_key, m_key_protect, m_key_lease_s}
    partitions                 [{name, pkey: 0x0001-0x7ffe, members: [host | {host, membership: full|limited}]
                                 | ALL, membership (of ALL; default full), enforce: both|in|out|off}]
                               (IB; ibemu's SM programs them, ``ibemu.sm.partitions``;
                               OpenSM gets them as partitions.conf and part_enforce)
    traffic                    [{name, kind, from, to | hosts, size, qps, start_s, stop_s, ...}]
    faults                     [{at_s, action, link | switch, period_s, count, percent, duration_s}]
    duration_s                 run length in seconds
    gpus                       {model, per_server, nvlink, rails, tflops, nvlink_gbs, nvlink_us,
                                net_latency_us}: the CAs as GPU servers (training jobs)
    time                       {dilation: N | auto, lag_threshold_real_us: R | lag_threshold_us: T}: run
                                on a clock N times slower than real time (N >= 1, default 1; ``auto``:
                                chosen from the offered load and this machine's calibration,
                                ``ibemu.scenario.autodilation``); the run is valid while every process's
                                p99 lag stays under R real us (R / N emulated; default 2000,
                                ``ibemu.scenario.fidelity.DEFAULT_REAL_THRESHOLD_US``; relaxed up to 5% of
                                the run's smallest time figure, never above R emulated), or under T
                                emulated us at any dilation when T is given (not both)
    record                     {capture: [links] | all, json: PATH, plots: bool}

The ``*_FIELDS`` tables below are the schema: every key, and what its value may be (type,
bounds, choices); :mod:`ibemu.scenario.loader` enforces them (the key lists ``*_KEYS`` are
their keys) and :mod:`ibemu.scenario.jsonschema` generates the JSON Schema editors read from
them (``ibemu schema``, ``docs/scenario.schema.json``). The names of
the extension points, and the keys each takes, come from their one registry each: routing
engines from ``ibemu.sm.routing.ENGINES``, traffic kinds from ``ibemu.traffic.flows.TRAFFIC_KINDS``,
fault actions from ``ibemu.fabric.faults.FAULT_ACTIONS`` (where ``FaultSpec`` lives too).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ibemu.agents.forwarder import AdaptiveRouting
from ibemu.fabric.faults import FAULT_ACTIONS, FaultSpec
from ibemu.physics.link import MAX_CABLE_M, SWITCH_MODELS, SwitchModel, default_switch_model
from ibemu.sm.routing import ENGINES
from ibemu.topo.generators import ALIASES, GENERATORS
from ibemu.topo.model import Link, LinkDefaults, NodeKind, Topology
from ibemu.topo.names import MAX_PORT
from ibemu.topo.rates import LinkRate
from ibemu.traffic.flows import TRAFFIC_KINDS
from ibemu.traffic.training import (
    EMULATED_ALGORITHMS,
    GPUS,
    MODELS,
    NVLINKS,
    PLACEMENTS,
    GpuPool,
    JobPlan,
)


@dataclass(frozen=True, slots=True)
class Field:
    """What one key's value may be. The ``*_FIELDS`` tables below are the one declaration of the
    scenario format: the loader takes its key lists (``*_KEYS``) and bounds from them, and
    :mod:`ibemu.scenario.jsonschema` generates the JSON Schema from them."""

    type: str
    """``number``, ``integer``, ``choice`` (one of ``choices``), ``object`` (keys: ``fields``), or
    a value of its own the JSON Schema generator knows: ``string`` (non-empty), ``text``,
    ``bool``, ``rate``, ``mtu``, ``size``, ``host``, ``hosts``, ``link``, ``links``,
    ``endpoints``, ``nodes``, ``topology``, ``traffic``, ``faults``, ``dilation``, ``pfc``,
    ``dscp_priority``, ``sl2vl``, ``vlarb``, ``capture``."""
    help: str = ""
    lo: float | None = None
    hi: float | None = None
    """Bounds (None: open); the loader may narrow them further from other keys (``at_s`` < ``duration_s``)."""
    lo_open: bool = False
    """``lo`` itself is excluded."""
    choices: tuple[Any, ...] = ()
    fields: Mapping[str, Field] | None = None
    required: bool = False
    """The key must be given (in its mapping; for an entry of a list, in every entry)."""

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.fields or ())


def required(fields: Mapping[str, Field]) -> tuple[str, ...]:
    """The keys of ``fields`` that must be given."""
    return tuple(k for k, f in fields.items() if f.required)


def _must(f: Field) -> Field:
    return replace(f, required=True)


def _num(help: str, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> Field:
    return Field("number", help, lo, hi, lo_open)


def _int(help: str, lo: int | None = None, hi: int | None = None) -> Field:
    return Field("integer", help, lo, hi)


def _choice(help: str, choices: Iterable[Any]) -> Field:
    return Field("choice", help, choices=tuple(choices))


def _obj(help: str, fields: Mapping[str, Field]) -> Field:
    return Field("object", help, fields=fields)


MAX_LINK_DELAY_US = 10_000_000.0
LINK_PROPS: dict[str, Field] = {
    "rate": Field("rate", "link rate, like '4x EDR', 'HDR' or '100G' (timed on the user datapath only)"),
    "mtu": Field("mtu", "IB MTU in bytes"),
    "delay_us": _num("one-way propagation delay (us; user datapath)", 0, MAX_LINK_DELAY_US),
    "cable_m": _num("cable length (m), the propagation delay derived from it (user datapath)", 0, MAX_CABLE_M),
    "loss_pct": _num("share of frames lost, percent (user datapath)", 0, 100),
}
"""What a link may say of itself, and ``defaults`` of every link."""
DEFAULTS_FIELDS = LINK_PROPS
LINK_FIELDS: dict[str, Field] = {
    "endpoints": _must(Field("endpoints", "the two ends, ['node:port', 'node:port']")),
    **LINK_PROPS,
}
NODE_KINDS = tuple(k.value for k in NodeKind)
NODE_FIELDS: dict[str, Field] = {
    "kind": _must(_choice("node kind", NODE_KINDS)),
    "ports": _int("port count (a CA: 1 or 2)", 1, MAX_PORT),
    "guid": _int("node GUID", 1, 2**64 - 1),
    "desc": Field("string", "NodeDescription"),
}
TOPOLOGY_FORMATS = ("ibnetdiscover",)
TOPOLOGY_FILE_FIELDS: dict[str, Field] = {
    "file": _must(Field("string", "a topology file (relative paths start at the scenario's folder)")),
    "format": _choice("the file's format", TOPOLOGY_FORMATS),
    "name": Field("string", "the topology's name"),
}
TOPOLOGY_EXPLICIT_FIELDS: dict[str, Field] = {
    "nodes": _must(Field("nodes", "{name: kind} or {name: {kind, ports, guid, desc}}")),
    "links": Field("links", "cables: [a:port, b:port] or {endpoints, rate, mtu, ...}"),
    "name": Field("string", "the topology's name"),
}
TOPOLOGY_GENERATOR_FIELDS: dict[str, Field] = {
    "generator": _must(_choice("a topology generator (ibemu.topo.generators); its parameters beside it",
                               (*GENERATORS, *ALIASES))),
    "name": Field("string", "the topology's name"),
}
"""A generated topology: these keys, and the generator's own parameters."""
TOPOLOGY_SOURCES = (*required(TOPOLOGY_GENERATOR_FIELDS), *required(TOPOLOGY_FILE_FIELDS),
                    *required(TOPOLOGY_EXPLICIT_FIELDS))
"""The key that says which form a topology takes (one of them, and only one)."""

MAX_SWITCH_LATENCY_NS = 100_000
MAX_SWITCH_BUFFER_KB = 1 << 16
SWITCH_FIELDS: dict[str, Field] = {
    "model": _choice("switch model (default by the fabric's kind and rate)", SWITCH_MODELS),
    "latency_ns": _int("port-to-port latency (ns)", 0, MAX_SWITCH_LATENCY_NS),
    "buffer_kb": _num("buffer (KiB: IB per input port and VL; Ethernet per egress port)", 0,
                      MAX_SWITCH_BUFFER_KB, lo_open=True),
}
"""``fabric.switch``: the switches' model (``ibemu.physics.link.SWITCH_MODELS``: ib-edr, ib-hdr,
ib-ndr, eth-spectrum, eth; default by the fabric's kind and rate), and overrides of its
port-to-port latency (ns) and buffer (KiB: IB, each input port's buffer per VL; Ethernet, each
egress port's). User datapath only: the kernel forwards without either."""
QOS_VLS = (1, 2, 4, 8)
VLARB_CAP = 8
MAX_DATA_VL = 14
"""VL15 carries subnet management only."""
MAX_SL = 15
MAX_VLARB_WEIGHT = 255
MAX_DSCP = 63
MAX_PRIORITY = 7
QOS_FIELDS: dict[str, Field] = {
    "vls": _choice("data VLs every port operates", QOS_VLS),
    "sl2vl": Field("sl2vl", "SL -> VL: a list of 16 VLs, or {SL: VL} (unnamed SLs: SL mod vls)"),
    "vlarb_high": Field("vlarb", "high-priority VL arbitration: [[VL, weight], ...] (weight in 64-byte units)"),
    "vlarb_low": Field("vlarb", "low-priority VL arbitration: [[VL, weight], ...] (weight in 64-byte units)"),
    "vl_high_limit": _int("VLHighLimit (255: no limit)", 0, MAX_VLARB_WEIGHT),
}
"""``fabric.qos`` (IB): the data VLs every port operates (1, 2, 4 or 8: the emulated ports'
VLCap is VL0-VL7), the SL -> VL map (a list of 16 VLs, or {SL: VL}; unnamed SLs: SL mod vls),
the VL arbitration tables (lists of [VL, weight], weight in 64-byte units, at most
``VLARB_CAP`` entries each: the ports' VLArbitrationHighCap/LowCap) and VLHighLimit (0..255;
255 no limit). The SM programs them into every port after bring-up (SLtoVLMappingTable,
VLArbitrationTable, PortInfo.OperationalVLs/VLHighLimit): ibemu's SM itself, OpenSM through its
own options (``qos TRUE``, ``max_op_vls``, ``qos_sl2vl``, ``qos_vlarb_high/low``,
``qos_high_limit``: ``ibemu.fabric.opensm.qos_options``)."""
MAX_LINE_GBPS = 1000.0
ROCE_DATA_DSCP = 26
"""The DSCP of RoCE data: ``pfc: true`` makes its priority lossless (26 >> 3 = 3 by default)."""
MAX_BUFFER_KB = 1 << 20
MAX_FABRIC_LOSS_PCT = 50.0
MAX_FABRIC_DELAY_US = 100_000.0
MAX_FLOWLET_GAP_US = 1_000_000.0
MAX_ECN_MARK_KB = 65536.0
MAX_ECN_LINE_GBPS = 1000.0
FABRIC_KINDS = ("ib", "roce")
DATAPATHS = ("kernel", "user")
FABRIC_FIELDS: dict[str, Field] = {
    "kind": _choice("InfiniBand or RoCEv2", FABRIC_KINDS),
    "datapath": _choice("forwarding in the kernel (tc) or in ibemu's user datapath (timed)", DATAPATHS),
    "loss_pct": _num("RoCE: frames each cable drops, percent", 0, MAX_FABRIC_LOSS_PCT),
    "delay_us": _num("RoCE: one-way delay each cable adds (us)", 0, MAX_FABRIC_DELAY_US),
    "ecn_mark_kb": _num("RoCE: mark CE beyond this many KiB queued", 0, MAX_ECN_MARK_KB, lo_open=True),
    "ecn_line_gbps": _num("RoCE kernel datapath: the ECN virtual queues' rate (Gb/s)", 0, MAX_ECN_LINE_GBPS,
                          lo_open=True),
    "line_gbps": _num("RoCE user datapath: every cable's data rate (Gb/s)", 0, MAX_LINE_GBPS, lo_open=True),
    "buffer_kb": _num("RoCE user datapath: each port's buffer (KiB)", 0, MAX_BUFFER_KB, lo_open=True),
    "pfc": Field("pfc", "RoCE user datapath: PFC (true: RoCE data's priority; or a list of priorities)"),
    "pfc_xoff_kb": _num("RoCE user datapath: PFC XOFF threshold (KiB)", 0, MAX_BUFFER_KB, lo_open=True),
    "pfc_xon_kb": _num("RoCE user datapath: PFC XON threshold (KiB)", 0, MAX_BUFFER_KB, lo_open=True),
    "dscp_priority": Field("dscp_priority", "RoCE user datapath: {DSCP: priority} overrides of DSCP >> 3"),
    "switch": _obj("user datapath: the switches' model, latency and buffer", SWITCH_FIELDS),
    "qos": _obj("IB: VLs, SL -> VL and VL arbitration the SM programs", QOS_FIELDS),
    "local_failover": Field("bool", "IB, sm.engine ftree_ar|updn_ar: switches fail over to alternates by "
                            "themselves and notify their neighbours (default true with those engines)"),
    "adaptive_routing": Field("adaptive_routing", "IB user datapath, sm.engine ftree_ar|updn_ar: switches "
                              "send each packet (or flowlet) by the least-loaded port of its group"),
}
AR_FIELDS: dict[str, Field] = {
    "mode": _choice("choose a port per packet, or per flowlet (a flow's burst keeps its port)", ("packet", "flowlet")),
    "flowlet_gap_us": _num("flowlet mode: emulated silence (us) after which a flow may change port", 0,
                           MAX_FLOWLET_GAP_US),
}
"""``fabric.adaptive_routing``: ``true`` (per packet), or ``{mode, flowlet_gap_us}``."""
FABRIC_USER_KEYS = ("line_gbps", "buffer_kb", "pfc", "pfc_xoff_kb", "pfc_xon_kb", "dscp_priority")
"""RoCE user datapath only (``ibemu.roce.userpath``, timed by the link model as IB's user
datapath is: each cable's rate and delay are the topology's, ``defaults``/links ``rate``,
``delay_us``/``cable_m``; the switches' latency and buffer ``fabric.switch``): ``line_gbps``
overrides every cable's data rate (Gb/s: a slow fabric a run at dilation 1 can keep), the
ports' buffer (KiB, drop tail; ``fabric.switch.buffer_kb`` wins when both are given), PFC (true: the priority of RoCE data; or a list of priorities), the
XOFF/XON thresholds (KiB from one ingress port waiting in the router's queues) and DSCP ->
priority overrides ({DSCP: priority}; default DSCP >> 3: RoCE data 26 -> 3, CNPs 48 -> 6)."""
FABRIC_IMPAIRMENTS = ("loss_pct", "delay_us")
"""RoCE cable impairments: frames each cable drops (percent, each direction) and the one-way
delay each cable adds (microseconds). An IB fabric is lossless: they apply to kind roce only."""
FABRIC_ECN = ("ecn_mark_kb", "ecn_line_gbps")
"""RoCE congestion control: each router port marks CE on ECN-capable frames that find more
than ecn_mark_kb KiB in a virtual queue drained at ecn_line_gbps; the hosts answer with CNPs
and slow down (DCQCN, with ecn_line_gbps as their line rate). Both or neither."""
SM_IMPLS = ("ibemu", "opensm")
SM_STANDBY_FIELDS: dict[str, Field] = {
    "host": _must(Field("host", "the CA that runs the standby SM (not the master's)")),
    "priority": _int("its SMInfo priority (0-15; the master's is sm.priority)", 0, 15),
    "impl": _choice("the standby: ibemu's SM or OpenSM (default: sm.impl)", ("ibemu", "opensm")),
}
SM_FIELDS: dict[str, Field] = {
    "impl": _choice("the subnet manager: ibemu's or OpenSM", SM_IMPLS),
    "engine": _choice("routing engine (ibemu.sm.routing.ENGINES)", ENGINES),
    "host": Field("host", "the CA that runs the SM (default: the first CA)"),
    "sweep_interval_s": _num("seconds between light sweeps", 0, 3600),
    "lmc": _int("LID mask control: 2^lmc LIDs per port", 0, 7),
    "m_key": _int("M_Key the SM gives every port and puts in every SMP (a 64-bit value; 0: none)", 0, 2**64 - 1),
    "m_key_protect": _int("M_KeyProtectBits written with m_key: 0 Sets need the key, 1 also hides it from "
                          "Gets, 2-3 Gets need it too (OpenSM: at most 2)", 0, 3),
    "m_key_lease_s": _int("M_KeyLeasePeriod written with m_key: seconds after a bad key with no valid "
                          "one before the protection lapses (0: never)", 0, 65535),
    "priority": _int("SMInfo priority of the SM in the election: higher wins, then the lower port GUID", 0, 15),
    "standby": _obj("a standby SM on another host: it polls the master and takes over when it stops "
                    "answering (faults sm_down / sm_up)", SM_STANDBY_FIELDS),
    "poll_interval_ms": _int("a standby polls its master's SMInfo this often (OpenSM: sminfo_polling_timeout)",
                             10, 600_000),
    "poll_retries": _int("failed polls in a row before a standby takes over (OpenSM: polling_retry_number)",
                         1, 100),
}
RECORD_FIELDS: dict[str, Field] = {
    "capture": Field("capture", "links to capture: a list of links, or all"),
    "json": Field("string", "write the results as JSON to this path"),
    "plots": Field("bool", "draw plots"),
}
MAX_LAG_THRESHOLD_US = 60_000_000.0
TIME_FIELDS: dict[str, Field] = {
    "dilation": Field("dilation", "run N >= 1 times slower than real time, or auto", lo=1),
    "lag_threshold_us": _num("the p99 lag (emulated us, at any dilation) under which a process keeps up "
                             "(default: lag_threshold_real_us / N, see ibemu.scenario.fidelity)", 0,
                             MAX_LAG_THRESHOLD_US, lo_open=True),
    "lag_threshold_real_us": _num("the p99 lag in real us under which a process keeps up (default 2000; "
                                  "emulated: this / N, bounded by the run's figures)", 0,
                                  MAX_LAG_THRESHOLD_US, lo_open=True),
}

DEFAULT_SIZE = 65536
"""Message size of a traffic entry without one, unless its kind has its own default."""
MAX_SIZE = 2**31
TRAFFIC_FIELDS: dict[str, Field] = {
    "name": Field("string", "the flow's name (default: kind and index)"),
    "kind": _must(_choice("traffic kind (ibemu.traffic.flows.TRAFFIC_KINDS)", TRAFFIC_KINDS)),
    "start_s": _num("start (s; before duration_s)", 0),
    "stop_s": _num("stop (s; at most duration_s)", 0, lo_open=True),
    "sl": _int("service level", 0, MAX_SL),
    "size": Field("size", "message size: bytes, or like '64KiB', '1MiB'", 1, MAX_SIZE),
    "qps": _int("queue pairs", 1, 1024),
    "bidirectional": Field("bool", "both ways"),
    "rate_pps": _int("messages per second (a stream: 10,000 by default)", 1, 10_000_000),
    "transport": _choice("rc (losses retransmitted) or ud (losses stay lost)", ("rc", "ud")),
    "seed": _int("random seed", 0, 2**32 - 1),
    "model": _choice("training: the model (ibemu.traffic.training.MODELS)", MODELS),
    "tokens_per_step": _num("training: tokens per step over all GPUs (default: the model's)", 0, 1e15,
                            lo_open=True),
    "mfu": _num("training: model FLOPs utilization (default 0.4)", 0, 1, lo_open=True),
    "algorithm": _choice("training: the gradient allreduce (ring, tree: double binary tree, hierarchical)", EMULATED_ALGORITHMS),
    "overlap": _num("training: share of the backward pass the allreduce overlaps (0..1, default 0)", 0, 1),
    "scale": _num("training: each step's gradient bytes and compute time divided by this", 1, 1e15),
    "train_tokens": _num("training: tokens to train on (default: the model's)", 0, 1e18, lo_open=True),
    "servers": _int("training: servers the pool places the job on (instead of hosts)", 1, 1 << 16),
    "tensor": _int("training: tensor-parallel degree T, inside a server over NVLink (divides gpus.per_server; "
                   "default 1)", 1, 1 << 10),
    "pipeline": _int("training: pipeline stages P, each servers / P servers (divides the job's servers; "
                     "default 1)", 1, 1 << 16),
    "microbatches": _int("training: microbatches a step is cut into (default 4 x pipeline; 1 without one; at "
                         "most 256, the receives each transfer's QP keeps posted)", 1, 256),
    "rc_timeout": _int("collectives and training: the RC local ACK timeout, 4.096 us x 2^N (default 14: "
                       "67 ms; NCCL_IB_TIMEOUT, whose default is 20: 4.3 s)", 1, 31),
    "rc_retry_cnt": _int("collectives and training: RC retries before a QP gives up (default 7; "
                         "NCCL_IB_RETRY_CNT)", 0, 7),
}
"""Every key of a traffic entry but the hosts it names (``TRAFFIC_HOSTS``); which a kind takes:
``TRAFFIC_COMMON`` and its ``keys`` in ``ibemu.traffic.flows.TRAFFIC_KINDS``."""
TRAFFIC_HOSTS: dict[str, dict[str, Field]] = {
    "pair": {"from": _must(Field("host", "the sending host")), "to": _must(Field("host", "the receiving host"))},
    "fan_in": {"from": Field("hosts", "the sending hosts (default: all but to)"),
               "to": _must(Field("host", "the receiving host"))},
    "group": {"hosts": Field("hosts", "the hosts taking part (default: all)")},
}
"""The hosts an entry names, by its kind's ``hosts`` (the ones without a default are required)."""
TRAFFIC_REQUIRED = required(TRAFFIC_FIELDS)
#: Keys every traffic entry takes (the kinds add theirs: ``ibemu.traffic.flows.TRAFFIC_KINDS``).
TRAFFIC_COMMON = ("name", "kind", "start_s", "stop_s", "sl")
STREAM_TRANSPORTS = TRAFFIC_FIELDS["transport"].choices

DEFAULT_DURATION_S = 30.0
MAX_DURATION_S = 86400.0
FAULT_FIELDS: dict[str, Field] = {
    "at_s": _must(_num("when (s; before duration_s)", 0)),
    "action": _must(_choice("fault action (ibemu.fabric.faults.FAULT_ACTIONS)", FAULT_ACTIONS)),
    "link": Field("link", "a link: 'sw:port', 'a:port-b:port' or 'a-b'"),
    "switch": Field("string", "a switch name"),
    "period_s": _num("flap period (s)", 0, 3600, lo_open=True),
    "count": _int("flaps", 1, 100_000),
    "percent": _num("share affected, percent", 0, 100, lo_open=True),
    "duration_s": _num("how long (s)", 0, MAX_DURATION_S, lo_open=True),
}
"""Every key of a fault entry; which an action takes: ``FAULT_COMMON`` and its ``keys`` in
``ibemu.fabric.faults.FAULT_ACTIONS`` (``at_s`` and the action's ``required`` must be given)."""
#: Keys every fault entry takes (the actions add theirs: ``ibemu.fabric.faults.FAULT_ACTIONS``).
FAULT_COMMON = ("at_s", "action")
FAULT_REQUIRED = required(FAULT_FIELDS)
"""Keys every fault entry must give (the actions' own: ``FaultAction.required``)."""

MEMBERSHIPS = ("full", "limited")
PARTITION_ENFORCE = ("both", "in", "out", "off")
MAX_PKEY = 0x7FFE
"""Partition keys 0x0001..0x7FFE: 0x7FFF is the default partition's (every port a full member)."""
SWITCH_PKEY_CAP = 32
"""P_Key entries of a switch port facing a CA: the default key and 31 partitions per host."""
PARTITION_MEMBER_FIELDS: dict[str, Field] = {
    "host": _must(Field("host", "a member host (CA)")),
    "membership": _choice("full (talks to every member) or limited (to full members only)", MEMBERSHIPS),
}
PARTITION_FIELDS: dict[str, Field] = {
    "name": _must(Field("string", "the partition's name (unique)")),
    "pkey": _must(_int("its P_Key, 0x0001-0x7ffe (bit 15, the membership, is added per member)", 1, MAX_PKEY)),
    "members": _must(Field("members", "hosts (names, or {host, membership}), or ALL")),
    "membership": _choice("membership of members given without one (default full)", MEMBERSHIPS),
    "enforce": _choice("switch ports facing the members check P_Keys: both (default), in, out or off "
                       "(OpenSM's part_enforce)", PARTITION_ENFORCE),
}

MAX_GPUS_PER_SERVER = 64
GPUS_FIELDS: dict[str, Field] = {
    "model": _choice("the GPU (ibemu.traffic.training.GPUS)", GPUS),
    "per_server": _int("GPUs per server (default 8)", 1, MAX_GPUS_PER_SERVER),
    "nvlink": _choice("NVLink generation (default: the GPU's)", NVLINKS),
    "rails": _int("HCA ports per server, each a CA of the topology (divides per_server; default 1)", 1,
                  MAX_GPUS_PER_SERVER),
    "tflops": _num("overrides the GPU's dense BF16 TFLOP/s", 0, 1e6, lo_open=True),
    "nvlink_gbs": _num("overrides NVLink's GB/s per GPU and direction", 0, 1e5, lo_open=True),
    "nvlink_us": _num("NVLink latency per ring step (us)", 0, 1e6),
    "net_latency_us": _num("network latency per ring step in the model (us)", 0, 1e6),
    "placement": _choice("where jobs asking for a number of servers go (default topology)", PLACEMENTS),
}
"""``gpus``: every CA of the topology is a GPU server's HCA port, ``rails`` consecutive CAs a
server (``ibemu.traffic.training.GpuPool``); the training traffic kind runs jobs on them."""

TOP_FIELDS: dict[str, Field] = {
    "name": Field("string", "the scenario's name (default: the file name)"),
    "description": Field("string", "free text"),
    "topology": _must(Field("topology", "{generator: NAME, <params>} | {file: X.ibnd} | {nodes: ..., links: ...}")),
    "defaults": _obj("defaults of every link that does not say its own", DEFAULTS_FIELDS),
    "fabric": _obj("the fabric: IB or RoCE, kernel or user datapath, and their options", FABRIC_FIELDS),
    "sm": _obj("the subnet manager (IB)", SM_FIELDS),
    "partitions": Field("partitions", "IB partitions: [{name, pkey, members, membership, enforce}]"),
    "traffic": Field("traffic", "traffic generators"),
    "faults": Field("faults", "scheduled faults"),
    "duration_s": _num("run length (s)", 0, MAX_DURATION_S, lo_open=True),
    "record": _obj("what to record", RECORD_FIELDS),
    "time": _obj("the run's clock: dilation and the lag threshold", TIME_FIELDS),
    "gpus": _obj("GPU servers: the topology's CAs, rails at a time (training jobs)", GPUS_FIELDS),
}
TOP_REQUIRED = required(TOP_FIELDS)

TOP_KEYS = tuple(TOP_FIELDS)
TOPOLOGY_FILE_KEYS = tuple(TOPOLOGY_FILE_FIELDS)
TOPOLOGY_EXPLICIT_KEYS = tuple(TOPOLOGY_EXPLICIT_FIELDS)
NODE_KEYS = tuple(NODE_FIELDS)
LINK_KEYS = tuple(LINK_FIELDS)
DEFAULTS_KEYS = tuple(DEFAULTS_FIELDS)
FABRIC_KEYS = tuple(FABRIC_FIELDS)
SWITCH_KEYS = tuple(SWITCH_FIELDS)
QOS_KEYS = tuple(QOS_FIELDS)
SM_KEYS = tuple(SM_FIELDS)
SM_STANDBY_KEYS = tuple(SM_STANDBY_FIELDS)
PARTITION_KEYS = tuple(PARTITION_FIELDS)
PARTITION_REQUIRED = required(PARTITION_FIELDS)
PARTITION_MEMBER_KEYS = tuple(PARTITION_MEMBER_FIELDS)
RECORD_KEYS = tuple(RECORD_FIELDS)
TIME_KEYS = tuple(TIME_FIELDS)
GPUS_KEYS = tuple(GPUS_FIELDS)
NODE_REQUIRED = required(NODE_FIELDS)
LINK_REQUIRED = required(LINK_FIELDS)


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
    local_failover: bool | None = None
    """IB: switches fail over by themselves (alternates and fault notices from ibemu's SM with
    an ``_ar`` engine); None: on exactly when the engine is adaptive."""
    adaptive_routing: AdaptiveRouting | None = None
    """IB user datapath: adaptive routing over the SM's groups (``Forwarder.adapt``); None: off."""

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
class StandbySpec:
    """``sm.standby``: a second SM that stands by (``ibemu.sm.election``)."""

    host: str
    priority: int = 0
    impl: str = "ibemu"


@dataclass(frozen=True, slots=True)
class SMSpec:
    impl: str = "ibemu"
    engine: str = "minhop"
    host: str = ""
    """CA that runs the SM (default: the first CA of the topology)."""
    sweep_interval_s: float = 10.0
    lmc: int = 0
    m_key: int = 0
    """The M_Key the SM writes into every port and uses in every SMP (0: none)."""
    m_key_protect: int = 0
    m_key_lease_s: int = 0
    priority: int = 0
    """SMInfo priority of the master in the election (``ibemu.sm.election``)."""
    standby: StandbySpec | None = None
    poll_interval_ms: int = 1000
    poll_retries: int = 3

    def election(self) -> dict[str, Any]:
        """The election settings as the fabric request carries them (``FabricRequest.sm_election``)."""
        out: dict[str, Any] = {"priority": self.priority, "poll_interval_ms": self.poll_interval_ms,
                               "poll_retries": self.poll_retries}
        if self.standby is not None:
            out["standby"] = {"host": self.standby.host, "priority": self.standby.priority,
                              "impl": self.standby.impl}
        return out

    def keys(self) -> dict[str, int]:
        """The SM's M_Key settings as the fabric request carries them (empty: no key)."""
        if not self.m_key:
            return {}
        return {"m_key": self.m_key, "m_key_protect": self.m_key_protect, "m_key_lease_s": self.m_key_lease_s}


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """One partition of ``partitions:``."""

    name: str
    pkey: int
    members: tuple[tuple[str, bool], ...] = ()
    """(host, full member); empty with ``everyone``."""
    everyone: bool = False
    everyone_full: bool = True
    enforce: str = "both"


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
    training: JobPlan | None = None
    """A training job: its model, servers and scale (``hosts`` are its servers' CAs, rail by rail)."""
    rc_timeout: int | None = None
    """Collectives and training: the RC local ACK timeout exponent (None: the transport's 14)."""
    rc_retry_cnt: int | None = None
    """Collectives and training: RC retries (None: 7)."""


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """The run's clock (``ibemu.clock``): ``dilation`` N >= 1, emulated time advancing N times
    slower than real time; ``where`` locates it in its file."""

    dilation: float = 1.0
    where: str = ""
    lag_threshold_us: float | None = None
    """The p99 lag (emulated us, at any dilation) under which a process keeps up (None: the
    real-time rule, ``lag_threshold_real_us``)."""
    lag_threshold_real_us: float | None = None
    """The real-time part of the rule (real us; None: ``fidelity.DEFAULT_REAL_THRESHOLD_US``)."""
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
    partitions: tuple[PartitionSpec, ...] = ()
    traffic: tuple[TrafficSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    duration_s: float = DEFAULT_DURATION_S
    record: RecordSpec = field(default_factory=RecordSpec)
    time: TimeSpec = field(default_factory=TimeSpec)
    gpus: GpuPool | None = None
    """The GPU servers (``gpus:``), if the scenario declares them."""
    warnings: tuple[str, ...] = ()
    """Located warnings: things the scenario says that will not do what it may think
    (``ibemu validate`` prints them; the runner logs them)."""
