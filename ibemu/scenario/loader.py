"""Load and check a scenario file: YAML -> located checks -> resolved topology -> Scenario.

Everything is checked before anything is built: types, ranges, enums, unknown keys (with a
"did you mean"), and cross-references (hosts, switches and links that faults, traffic, the
SM and captures name must exist in the resolved topology). All problems are reported at
once, each as ``file:line key.path: what was expected``, in a :class:`ScenarioError`.
"""

from __future__ import annotations

import importlib.resources
import logging
from pathlib import Path
from typing import Any

import yaml

from ibemu.agents.forwarder import DEFAULT_FLOWLET_GAP_NS, AdaptiveRouting
from ibemu.errors import ConfigError
from ibemu.fabric.faults import FAULT_ACTIONS, FaultSpec
from ibemu.physics.link import SWITCH_MODELS, propagation_ns
from ibemu.physics.qos import VlArb
from ibemu.scenario import gpus
from ibemu.scenario.schema import (
    AR_FIELDS,
    DEFAULT_DURATION_S,
    DEFAULT_SIZE,
    DEFAULTS_FIELDS,
    DEFAULTS_KEYS,
    FABRIC_FIELDS,
    FABRIC_KEYS,
    FABRIC_USER_KEYS,
    FAULT_COMMON,
    FAULT_FIELDS,
    FAULT_REQUIRED,
    LINK_FIELDS,
    LINK_KEYS,
    LINK_REQUIRED,
    MAX_DATA_VL,
    MAX_DSCP,
    MAX_PRIORITY,
    MAX_SIZE,
    MAX_SL,
    MAX_VLARB_WEIGHT,
    NODE_FIELDS,
    NODE_KEYS,
    NODE_REQUIRED,
    PARTITION_FIELDS,
    PARTITION_KEYS,
    PARTITION_MEMBER_KEYS,
    PARTITION_REQUIRED,
    QOS_FIELDS,
    QOS_KEYS,
    QOS_VLS,
    RECORD_KEYS,
    ROCE_DATA_DSCP,
    SM_FIELDS,
    SM_KEYS,
    SM_STANDBY_FIELDS,
    SM_STANDBY_KEYS,
    SWITCH_FIELDS,
    SWITCH_KEYS,
    SWITCH_PKEY_CAP,
    TIME_FIELDS,
    TIME_KEYS,
    TOP_FIELDS,
    TOP_KEYS,
    TOP_REQUIRED,
    TOPOLOGY_EXPLICIT_KEYS,
    TOPOLOGY_FILE_KEYS,
    TOPOLOGY_FORMATS,
    TOPOLOGY_GENERATOR_FIELDS,
    TOPOLOGY_SOURCES,
    TRAFFIC_COMMON,
    TRAFFIC_FIELDS,
    VLARB_CAP,
    FabricSpec,
    Field,
    PartitionSpec,
    QosSpec,
    RecordSpec,
    Scenario,
    SMSpec,
    StandbySpec,
    SwitchSpec,
    TimeSpec,
    TopologySpec,
    TrafficSpec,
)
from ibemu.scenario.yamlnodes import (
    Reader,
    ScenarioError,
    compose,
    describe,
    did_you_mean,
    line_of,
    read_text,
    scalar,
)
from ibemu.topo import analysis, ibnetdiscover, refs
from ibemu.topo.generators import ParamError, generate, lookup
from ibemu.topo.model import Endpoint, Link, LinkDefaults, NodeKind, Topology
from ibemu.topo.names import name_problem
from ibemu.topo.rates import check_mtu, parse_rate
from ibemu.traffic.flows import TRAFFIC_KINDS
from ibemu.traffic.training import GpuPool

log = logging.getLogger(__name__)

Pairs = dict[str, tuple[yaml.Node, yaml.Node]]
_RATE_EXPECTED = "a rate like '4x EDR', 'HDR' or '100G'"
_NEEDS_USER = "needs fabric.datapath: user (the kernel datapath forwards in tc, without delay, loss or corruption)"
RATES_USER_ONLY = ("rates apply on the user datapath only (fabric.datapath: user): the kernel datapath forwards "
                   "as fast as the machine can, the rate sets PortInfo's link width and speed")
_ONE_PROPAGATION = "give the propagation as delay_us or as cable_m, not both"
MAX_HEADERS = 126
"""The longest IB packet beyond its payload: LRH 8 + GRH 40 + BTH 12 + RETH 16 + ImmDt 4 + ... + ICRC 4 + VCRC 2,
rounded up to what a VL buffer must hold besides one MTU of payload."""


def _peek(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                return v
    return None


class _Loader(Reader):
    def __init__(self, source: str, base_dir: Path | None) -> None:
        super().__init__(source)
        self.base_dir = base_dir
        self.extra: list[str] = []  # problems located in other files (an imported .ibnd)
        self.lines: dict[str, int] = {}  # origin "file:line path" of explicit nodes/links -> line
        self.datapath = "kernel"
        self.warnings: list[tuple[int, str]] = []
        self.rate_nodes: list[tuple[yaml.Node, str]] = []  # where the scenario states a rate
        self.stated: dict[str, set[str]] = {}  # explicit link origin -> the keys it states
        self.gpu_pool: GpuPool | None = None  # gpus: the GPU servers (training jobs)
        self.gpu_taken: set[int] = set()  # servers the jobs so far run on

    def warn(self, node: yaml.Node | int, path: str, message: str) -> None:
        line = node if isinstance(node, int) else line_of(node)
        where = f"{self.source}:{line} {path}" if path else f"{self.source}:{line}"
        self.warnings.append((line, f"{where}: warning: {message}"))

    def value(self, node: yaml.Node, path: str, f: Field, hi: float | None = None) -> Any:
        """A number or integer within the bounds the schema declares (``hi``: a tighter upper
        bound known from elsewhere in the file, like ``duration_s``)."""
        top = f.hi if hi is None else hi
        if f.type == "integer":
            return self.integer(node, path, None if f.lo is None else int(f.lo), None if top is None else int(top))
        return self.number(node, path, f.lo, top, f.lo_open)

    def fail(self) -> ScenarioError:
        return ScenarioError(self.sorted_problems() + self.extra)

    # --- top level ------------------------------------------------------------------------

    def load(self, text: str) -> Scenario:
        root = compose(text, self.source)
        if root is None:
            self.error(1, "", "empty scenario: expected a mapping with at least a 'topology' key")
            raise self.fail()
        top = self.mapping(root, "", TOP_KEYS, required=TOP_REQUIRED)
        if top is None:
            raise self.fail()

        def opt(key: str) -> yaml.Node | None:
            return top[key][1] if key in top else None

        name = Path(self.source).stem
        if (n := opt("name")) is not None:
            name = self.string(n, "name") or name
        description = ""
        if (n := opt("description")) is not None:
            description = self.string(n, "description", "free text") or ""
        duration = DEFAULT_DURATION_S
        if (n := opt("duration_s")) is not None:
            duration = self.value(n, "duration_s", TOP_FIELDS["duration_s"]) or duration
        fabric = self.fabric(opt("fabric"))
        self.datapath = fabric.datapath
        defaults = self.defaults(opt("defaults"))
        topo, spec = self.topology(top["topology"][1]) if "topology" in top else (None, None)
        if topo is not None:
            topo.defaults = defaults
            self.apply_defaults(topo, defaults)
        sm = self.sm(opt("sm"), topo)
        if fabric.local_failover and (fn := opt("fabric")) is not None and (
                sm.impl == "opensm" or not sm.engine.endswith("_ar")):
            self.error(_mapping_pairs(fn)["local_failover"][1], "fabric.local_failover",
                       f"needs ibemu's SM with an adaptive engine (sm.engine: ftree_ar or updn_ar), "
                       f"not {sm.impl} {sm.engine}")
        if fabric.adaptive_routing and (fn := opt("fabric")) is not None and (
                sm.impl == "opensm" or not sm.engine.endswith("_ar") or fabric.local_failover is False):
            why = ("fabric.local_failover: false (the SM then writes no groups)" if fabric.local_failover is False
                   else f"{sm.impl} {sm.engine}")
            self.error(_mapping_pairs(fn)["adaptive_routing"][1], "fabric.adaptive_routing",
                       f"needs ibemu's SM with an adaptive engine (sm.engine: ftree_ar or updn_ar), "
                       f"which writes the groups, not {why}")
        partitions = self.partitions(opt("partitions"), topo, fabric, sm)
        self.gpu_pool = gpus.read_gpus(self, opt("gpus"), topo, fabric)
        traffic = self.traffic(opt("traffic"), topo, duration)
        self.physics_checks(fabric, topo, traffic, opt("fabric"))
        faults = self.faults(opt("faults"), topo, duration)
        record = self.record(opt("record"), topo)
        time_spec = self.time(opt("time"))
        if self.problems or self.extra or topo is None or spec is None:
            raise self.fail()
        return Scenario(
            name=name,
            topology=topo,
            topology_spec=spec,
            description=description,
            path=Path(self.source),
            defaults=defaults,
            fabric=fabric,
            sm=sm,
            partitions=partitions,
            traffic=traffic,
            faults=faults,
            duration_s=duration,
            record=record,
            time=time_spec,
            gpus=self.gpu_pool,
            warnings=tuple(msg for _, msg in sorted(self.warnings, key=lambda w: w[0])),
        )

    def apply_defaults(self, topo: Topology, d: LinkDefaults) -> None:
        """Links that state no delay (or cable length) or loss of their own get the defaults'."""
        for link in topo.links:
            own = self.stated.get(link.origin or "", set())
            if not own & {"delay_us", "cable_m"}:
                link.delay_us, link.cable_m = d.delay_us, d.cable_m
            if "loss_pct" not in own:
                link.loss_pct = d.loss_pct

    def physics_checks(self, fabric: FabricSpec, topo: Topology | None,
                       traffic: tuple[TrafficSpec, ...], fnode: yaml.Node | None) -> None:
        """Rates on the kernel datapath (one line: they apply on the user datapath only); a
        switch buffer that cannot hold one packet; arbitration that starves a VL in use."""
        if fabric.datapath == "kernel":
            for node, path in self.rate_nodes[:1]:
                self.warn(node, path, RATES_USER_ONLY)
        if topo is None or fnode is None:
            return
        fm = _mapping_pairs(fnode)
        sw = fabric.switch
        if sw is not None and sw.buffer_kb is not None and "switch" in fm:
            mtu = max((topo.mtu_of(lk) for lk in topo.links), default=topo.defaults.mtu)
            need = mtu + (MAX_HEADERS if fabric.kind == "ib" else 100)
            if sw.buffer_kb * 1024 < need:
                bnode = _peek(fm["switch"][1], "buffer_kb") or fm["switch"][1]
                self.error(bnode, "fabric.switch.buffer_kb",
                           f"{sw.buffer_kb:g} KiB cannot hold one {mtu}-byte-MTU packet ({need} bytes): "
                           f"nothing would pass; give at least {-(-need // 1024)} KiB")
        q = fabric.qos
        if q is None or "qos" not in fm:
            return
        qnode = fm["qos"][1]
        if fabric.datapath == "kernel":
            self.warn(qnode, "fabric.qos", "the SM programs SL->VL and VL arbitration into the agents, but "
                      "VLs and arbitration shape traffic on the user datapath only (fabric.datapath: user)")
        sl2vl = q.sl_to_vl()
        used = {0: "SL0 (management and traffic without an sl)"}
        for t in traffic:
            used.setdefault(sl2vl[t.sl], f"traffic {t.name!r} (sl {t.sl})")
        arb = (VlArb.default(q.vls) if not q.vlarb_high and not q.vlarb_low
               else VlArb(high=q.vlarb_high, low=q.vlarb_low, high_limit=q.vl_high_limit))
        for vl in arb.starved(sorted({sl2vl[t.sl] for t in traffic} | {sl2vl[0]})):
            who = next(w for v, w in used.items() if v == vl)
            self.warn(qnode, "fabric.qos", f"VL{vl} gets no arbitration weight: {who} rides it and its packets "
                      f"would never leave (give VL{vl} a weight in vlarb_high or vlarb_low)")
        hi_vls = {vl for vl, w in q.vlarb_high if w > 0}
        lo_vls = {vl for vl, w in q.vlarb_low if w > 0} - hi_vls
        if q.vl_high_limit == 255 and hi_vls & set(used) and lo_vls & set(used):
            self.warn(qnode, "fabric.qos.vl_high_limit", "255 (no limit): busy high-priority VLs "
                      f"{sorted(hi_vls & set(used))} can starve the low-priority ones {sorted(lo_vls & set(used))}")

    # --- sections -------------------------------------------------------------------------

    def defaults(self, node: yaml.Node | None) -> LinkDefaults:
        if node is None:
            return LinkDefaults()
        m = self.mapping(node, "defaults", DEFAULTS_KEYS)
        if m is None:
            return LinkDefaults()
        d = LinkDefaults()
        rate, mtu, delay, loss, cable = d.rate, d.mtu, d.delay_us, d.loss_pct, d.cable_m
        if "rate" in m:
            rate = self.convert(m["rate"][1], "defaults.rate", parse_rate, _RATE_EXPECTED) or rate
            self.rate_nodes.append((m["rate"][1], "defaults.rate"))
        if "mtu" in m:
            mtu = self.mtu(m["mtu"][1], "defaults.mtu") or mtu
        if "delay_us" in m:
            delay = self.value(m["delay_us"][1], "defaults.delay_us", DEFAULTS_FIELDS["delay_us"]) or 0.0
        if "cable_m" in m:
            cable = self.value(m["cable_m"][1], "defaults.cable_m", DEFAULTS_FIELDS["cable_m"]) or 0.0
            if "delay_us" in m:
                self.error(m["cable_m"][1], "defaults.cable_m", _ONE_PROPAGATION)
            else:
                delay = propagation_ns(cable_m=cable) / 1000
        if "loss_pct" in m:
            loss = self.value(m["loss_pct"][1], "defaults.loss_pct", DEFAULTS_FIELDS["loss_pct"]) or 0.0
        for key, value in (("delay_us", delay), ("cable_m", cable), ("loss_pct", loss)):
            if value and key in m and self.datapath != "user":
                self.error(m[key][1], f"defaults.{key}", _NEEDS_USER)
        return LinkDefaults(rate=rate, mtu=mtu, delay_us=delay, loss_pct=loss, cable_m=cable)

    def mtu(self, node: yaml.Node, path: str) -> int | None:
        return self.convert(node, path, check_mtu, "an IB MTU (256, 512, 1024, 2048 or 4096)")

    def fabric(self, node: yaml.Node | None) -> FabricSpec:
        if node is None:
            return FabricSpec()
        m = self.mapping(node, "fabric", FABRIC_KEYS)
        if m is None:
            return FabricSpec()
        kind = self.choice(m["kind"][1], "fabric.kind", FABRIC_FIELDS["kind"].choices) if "kind" in m else "ib"
        dp = (
            self.choice(m["datapath"][1], "fabric.datapath", FABRIC_FIELDS["datapath"].choices)
            if "datapath" in m
            else "kernel"
        )
        loss = delay = 0.0
        where = ""
        if "loss_pct" in m:
            loss = self.value(m["loss_pct"][1], "fabric.loss_pct", FABRIC_FIELDS["loss_pct"]) or 0.0
        if "delay_us" in m:
            delay = self.value(m["delay_us"][1], "fabric.delay_us", FABRIC_FIELDS["delay_us"]) or 0.0
            if delay:
                where = f"{self.source}:{line_of(m['delay_us'][1])} fabric.delay_us"
        mark = line = 0.0
        if "ecn_mark_kb" in m:
            mark = self.value(m["ecn_mark_kb"][1], "fabric.ecn_mark_kb", FABRIC_FIELDS["ecn_mark_kb"]) or 0.0
        if "ecn_line_gbps" in m:
            line = self.value(m["ecn_line_gbps"][1], "fabric.ecn_line_gbps", FABRIC_FIELDS["ecn_line_gbps"]) or 0.0
        user = (kind or "ib") == "roce" and dp == "user"
        if user:  # real queues: ECN marks at ecn_mark_kb of a queue drained at line_gbps
            if "ecn_line_gbps" in m:
                self.error(m["ecn_line_gbps"][1], "fabric.ecn_line_gbps",
                           "the user datapath has real queues: give their rate as fabric.line_gbps")
        else:
            for have, other in (("ecn_mark_kb", "ecn_line_gbps"), ("ecn_line_gbps", "ecn_mark_kb")):
                if have in m and other not in m:
                    self.error(m[have][1], f"fabric.{have}", f"ECN marking needs fabric.{other} too")
        for key in ("loss_pct", "delay_us", "ecn_mark_kb", "ecn_line_gbps", *FABRIC_USER_KEYS):
            if key in m and (kind or "ib") != "roce":
                self.error(m[key][1], f"fabric.{key}",
                           "cable impairments and ECN apply to a RoCE fabric only (kind: roce), line rates and PFC "
                           "too; an IB fabric is lossless (per-link loss and delay: defaults.loss_pct/delay_us, datapath user)")
            elif key in m and key in FABRIC_USER_KEYS and not user:
                self.error(m[key][1], f"fabric.{key}",
                           "needs fabric.datapath: user (the routers' kernels have no line rate, queues or PFC)")
        line_gbps = buffer_kb = 0.0
        pfc: tuple[int, ...] = ()
        xoff, xon = 64.0, 32.0
        dscp_prio: tuple[tuple[int, int], ...] = ()
        if user:
            if "dscp_priority" in m:
                dscp_prio = self._dscp_priority(m["dscp_priority"][1])
            if "line_gbps" in m:
                line_gbps = self.value(m["line_gbps"][1], "fabric.line_gbps", FABRIC_FIELDS["line_gbps"]) or 0.0
                line = line_gbps
            if "buffer_kb" in m:
                buffer_kb = self.value(m["buffer_kb"][1], "fabric.buffer_kb", FABRIC_FIELDS["buffer_kb"]) or 0.0
            if "pfc" in m:
                pfc = self._pfc(m["pfc"][1], dict(dscp_prio).get(ROCE_DATA_DSCP, ROCE_DATA_DSCP >> 3))
            if "pfc_xoff_kb" in m:
                xoff = self.value(m["pfc_xoff_kb"][1], "fabric.pfc_xoff_kb", FABRIC_FIELDS["pfc_xoff_kb"]) or xoff
            if "pfc_xon_kb" in m:
                xon = self.value(m["pfc_xon_kb"][1], "fabric.pfc_xon_kb", FABRIC_FIELDS["pfc_xon_kb"]) or xon
                if xon > xoff:
                    self.error(m["pfc_xon_kb"][1], "fabric.pfc_xon_kb", f"must not exceed pfc_xoff_kb ({xoff:g})")
            elif xon > xoff:
                xon = xoff / 2
            where = ""  # the user datapath delays frames itself
        switch = self._switch(m["switch"][1], kind or "ib", dp or "kernel") if "switch" in m else None
        qos = None
        if "qos" in m:
            if (kind or "ib") != "ib":
                self.error(m["qos"][1], "fabric.qos", "VLs, SL->VL maps and VL arbitration are InfiniBand's; "
                           "a RoCE fabric's priorities are fabric.pfc and fabric.dscp_priority")
            else:
                qos = self._qos(m["qos"][1])
        adaptive = self._adaptive(m["adaptive_routing"][1], kind or "ib", dp or "kernel") \
            if "adaptive_routing" in m else None
        local_failover = None
        if "local_failover" in m:
            local_failover = self.boolean(m["local_failover"][1], "fabric.local_failover")
            if (kind or "ib") != "ib":
                self.error(m["local_failover"][1], "fabric.local_failover",
                           "local failover is the IB switches' (alternates from ibemu's SM)")
        return FabricSpec(kind=kind or "ib", datapath=dp or "kernel", loss_pct=loss, delay_us=delay,
                          ecn_mark_kb=mark, ecn_line_gbps=line, line_gbps=line_gbps,
                          buffer_kb=buffer_kb or 1024.0, pfc=pfc, pfc_xoff_kb=xoff, pfc_xon_kb=xon,
                          dscp_priority=dscp_prio, where=where, switch=switch, qos=qos,
                          local_failover=local_failover, adaptive_routing=adaptive)

    def _adaptive(self, node: yaml.Node, kind: str, datapath: str) -> AdaptiveRouting | None:
        """``fabric.adaptive_routing: true|false|{mode: packet|flowlet, flowlet_gap_us}``."""
        path = "fabric.adaptive_routing"
        if isinstance(node, yaml.MappingNode):
            m = self.mapping(node, path, tuple(AR_FIELDS))
            if m is None:
                return None
            mode = self.choice(m["mode"][1], f"{path}.mode", AR_FIELDS["mode"].choices) if "mode" in m else "packet"
            gap_us = DEFAULT_FLOWLET_GAP_NS / 1000
            if "flowlet_gap_us" in m:
                gap = self.value(m["flowlet_gap_us"][1], f"{path}.flowlet_gap_us", AR_FIELDS["flowlet_gap_us"])
                gap_us = gap if gap is not None else gap_us
                if mode != "flowlet":
                    self.error(m["flowlet_gap_us"][1], f"{path}.flowlet_gap_us", "applies to mode: flowlet only")
            ar: AdaptiveRouting | None = AdaptiveRouting(mode or "packet", round(gap_us * 1000))
        else:
            ar = AdaptiveRouting() if self.boolean(node, path) else None
        if ar is not None and kind != "ib":
            self.error(node, path, "adaptive routing is the IB switches' (groups from ibemu's SM); "
                       "a RoCE fabric's routers hash flows over ECMP next hops")
        elif ar is not None and datapath != "user":
            self.error(node, path, "needs fabric.datapath: user (the switches choose by the link model's "
                       "queues; the kernel datapath has none)")
        return ar

    def _switch(self, node: yaml.Node, kind: str, datapath: str) -> SwitchSpec | None:
        """``fabric.switch: {model, latency_ns, buffer_kb}`` (user datapath)."""
        m = self.mapping(node, "fabric.switch", SWITCH_KEYS)
        if m is None:
            return None
        if datapath != "user":
            self.error(node, "fabric.switch", "switch latency and buffers need fabric.datapath: user "
                       "(the kernel datapath forwards without either)")
            return None
        model = ""
        if "model" in m:
            ethernet = kind == "roce"
            fits = [n for n, sm in SWITCH_MODELS.items() if sm.ethernet == ethernet]
            model = self.choice(m["model"][1], "fabric.switch.model", fits) or ""
        latency = buffer = None
        if "latency_ns" in m:
            latency = self.value(m["latency_ns"][1], "fabric.switch.latency_ns", SWITCH_FIELDS["latency_ns"])
        if "buffer_kb" in m:
            buffer = self.value(m["buffer_kb"][1], "fabric.switch.buffer_kb", SWITCH_FIELDS["buffer_kb"])
        return SwitchSpec(model=model, latency_ns=latency, buffer_kb=buffer)

    def _qos(self, node: yaml.Node) -> QosSpec | None:
        """``fabric.qos: {vls, sl2vl, vlarb_high, vlarb_low, vl_high_limit}`` (IB)."""
        m = self.mapping(node, "fabric.qos", QOS_KEYS)
        if m is None:
            return None
        vls = 1
        if "vls" in m:
            v = self.integer(m["vls"][1], "fabric.qos.vls", 1, 15)
            if v is not None and v not in QOS_VLS:
                self.error(m["vls"][1], "fabric.qos.vls", f"a port operates 1, 2, 4 or 8 data VLs (the emulated "
                           f"ports' VLCap is VL0-VL7), got {v}")
            elif v is not None:
                vls = v
        sl2vl: tuple[int, ...] = ()
        if "sl2vl" in m:
            sl2vl = self._sl2vl(m["sl2vl"][1], vls)
        high = self._vlarb(m["vlarb_high"][1], "fabric.qos.vlarb_high", vls) if "vlarb_high" in m else ()
        low = self._vlarb(m["vlarb_low"][1], "fabric.qos.vlarb_low", vls) if "vlarb_low" in m else ()
        limit = 0
        if "vl_high_limit" in m:
            limit = self.value(m["vl_high_limit"][1], "fabric.qos.vl_high_limit", QOS_FIELDS["vl_high_limit"]) or 0
            if not high:
                self.warn(m["vl_high_limit"][1], "fabric.qos.vl_high_limit",
                          "no vlarb_high table: the limit of high priority has nothing to limit")
        return QosSpec(vls=vls, sl2vl=sl2vl, vlarb_high=high, vlarb_low=low, vl_high_limit=limit,
                       where=f"{self.source}:{line_of(node)} fabric.qos")

    def _sl2vl(self, node: yaml.Node, vls: int) -> tuple[int, ...]:
        """A list of 16 VLs, or ``{SL: VL}`` (the other SLs: SL mod vls)."""
        out = [sl % vls for sl in range(16)]
        pairs: list[tuple[int | None, yaml.Node, str]] = []
        if isinstance(node, yaml.SequenceNode):
            if len(node.value) != 16:
                self.error(node, "fabric.qos.sl2vl", f"expected 16 VLs (SL0..SL15), got {len(node.value)}; "
                           "or a mapping {SL: VL}")
                return ()
            pairs = [(i, n, f"fabric.qos.sl2vl[{i}]") for i, n in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            for knode, vnode in node.value:
                sl = self.integer(knode, "fabric.qos.sl2vl", 0, MAX_SL)
                pairs.append((sl, vnode, f"fabric.qos.sl2vl.{scalar(knode)}"))
        else:
            self.error(node, "fabric.qos.sl2vl", "expected a list of 16 VLs or a mapping {SL: VL}")
            return ()
        for sl, vnode, path in pairs:
            vl = self.integer(vnode, path, 0, 15)
            if sl is None or vl is None:
                continue
            if vl == 15:
                self.error(vnode, path, "VL15 carries subnet management packets only: data on it is dropped")
            elif vl >= vls:
                self.error(vnode, path, f"VL{vl} is not operated: fabric.qos.vls is {vls} (VL0-VL{vls - 1})")
            else:
                out[sl] = vl
        return tuple(out)

    def _vlarb(self, node: yaml.Node, path: str, vls: int) -> tuple[tuple[int, int], ...]:
        """A list of [VL, weight] (weight 0..255, in 64-byte units), at most VLARB_CAP entries."""
        seq = self.sequence(node, path)
        if seq is None:
            return ()
        if len(seq) > VLARB_CAP:
            self.error(node, path, f"at most {VLARB_CAP} entries (the ports' VLArbitrationHighCap/LowCap), "
                       f"got {len(seq)}")
            return ()
        out = []
        for i, item in enumerate(seq):
            ipath = f"{path}[{i}]"
            if not isinstance(item, yaml.SequenceNode) or len(item.value) != 2:
                self.error(item, ipath, "expected [VL, weight], like [0, 64]")
                continue
            vl = self.integer(item.value[0], f"{ipath}.vl", 0, MAX_DATA_VL)
            w = self.integer(item.value[1], f"{ipath}.weight", 0, MAX_VLARB_WEIGHT)
            if vl is None or w is None:
                continue
            if vl >= vls:
                self.error(item.value[0], f"{ipath}.vl", f"VL{vl} is not operated: fabric.qos.vls is {vls}")
                continue
            out.append((vl, w))
        return tuple(out)

    def _dscp_priority(self, node: yaml.Node) -> tuple[tuple[int, int], ...]:
        """``{DSCP: priority}`` (0..63 -> 0..7)."""
        if not isinstance(node, yaml.MappingNode):
            self.error(node, "fabric.dscp_priority", "expected a mapping DSCP: priority, like {26: 3, 48: 6}")
            return ()
        out: dict[int, int] = {}
        for knode, vnode in node.value:
            d = self.integer(knode, "fabric.dscp_priority", 0, MAX_DSCP)
            p = self.integer(vnode, f"fabric.dscp_priority.{scalar(knode)}", 0, MAX_PRIORITY)
            if d is not None and p is not None:
                out[d] = p
        return tuple(sorted(out.items()))

    def _pfc(self, node: yaml.Node, data_priority: int) -> tuple[int, ...]:
        """``pfc: true`` (the priority of RoCE data), ``false``, or a list of priorities 0..7."""
        if isinstance(node, yaml.SequenceNode):
            prios = [self.integer(n, "fabric.pfc[]", 0, MAX_PRIORITY) for n in node.value]
            if not prios:
                self.error(node, "fabric.pfc", "an empty list of priorities: say pfc: false")
            return tuple(sorted({p for p in prios if p is not None}))
        on = self.boolean(node, "fabric.pfc")
        return (data_priority,) if on else ()

    def topology(self, node: yaml.Node) -> tuple[Topology | None, TopologySpec | None]:
        path = "topology"
        if not isinstance(node, yaml.MappingNode):
            self.error(node, path, "expected a mapping with one of: generator, file, nodes")
            return None, None
        present = [k for k in TOPOLOGY_SOURCES if _peek(node, k) is not None]
        if not present:
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            hint = ""
            for k in keys:
                h = did_you_mean(str(k), TOPOLOGY_SOURCES)
                if h:
                    hint = f"; {k!r}{h}"
                    break
            self.error(node, path, f"expected one of: generator, file, nodes{hint}")
            return None, None
        if len(present) > 1:
            self.error(
                node, path, f"give only one of generator, file or nodes (got {', '.join(present)})"
            )
            return None, None
        if present[0] == "generator":
            return self.generated(node)
        if present[0] == "file":
            return self.from_file(node)
        return self.explicit(node)

    def generated(self, node: yaml.Node) -> tuple[Topology | None, TopologySpec | None]:
        gnode = _peek(node, "generator")
        assert gnode is not None
        gname = self.string(gnode, "topology.generator", "a generator name")
        if gname is None:
            return None, None
        try:
            gen = lookup(gname)
        except ConfigError as exc:
            self.error(gnode, "topology.generator", str(exc))
            return None, None
        allowed = [*TOPOLOGY_GENERATOR_FIELDS, *(p.name for p in gen.params)]
        m = self.mapping(node, "topology", allowed)
        if m is None:
            return None, None
        params: dict[str, Any] = {}
        bad = False
        for key, (_, vnode) in m.items():
            if key in TOPOLOGY_GENERATOR_FIELDS:
                continue
            value = self._plain(vnode)
            param = gen.param(key)
            assert param is not None
            try:
                params[key] = param.convert(gen.name, value)
            except ParamError as exc:
                self.error(vnode, f"topology.{key}", exc.detail.removeprefix(f"{key}: "))
                bad = True
        if bad:
            return None, None
        try:
            topo = generate(gen.name, params)
        except ParamError as exc:
            at = m.get(exc.param)
            self.error(
                at[1] if at else node, f"topology.{exc.param}" if at else "topology", exc.detail
            )
            return None, None
        if "name" in m:
            topo.name = self.string(m["name"][1], "topology.name") or topo.name
        return topo, TopologySpec("generator", generator=gen.name, params=dict(topo.params))

    def _plain(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.SequenceNode):
            return [self._plain(v) for v in node.value]
        if isinstance(node, yaml.ScalarNode):
            return scalar(node)
        return {}

    def from_file(self, node: yaml.Node) -> tuple[Topology | None, TopologySpec | None]:
        m = self.mapping(node, "topology", TOPOLOGY_FILE_KEYS)
        if m is None:
            return None, None
        if "format" in m:
            self.choice(m["format"][1], "topology.format", TOPOLOGY_FORMATS)
        fnode = m["file"][1]
        fname = self.string(fnode, "topology.file", "a file name")
        if fname is None:
            return None, None
        path = Path(fname)
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        if not path.is_file():
            self.error(
                fnode,
                "topology.file",
                f"no such file: {fname} (a relative path starts at the scenario's folder)",
            )
            return None, None
        try:
            topo = ibnetdiscover.load(path)
        except ibnetdiscover.IbndError as exc:
            self.error(
                fnode,
                "topology.file",
                f"cannot import {fname}: {len(exc.problems)} problem(s) below",
            )
            self.extra.extend(exc.problems)
            return None, None
        except ConfigError as exc:
            self.error(fnode, "topology.file", str(exc))
            return None, None
        if "name" in m:
            topo.name = self.string(m["name"][1], "topology.name") or topo.name
        return topo, TopologySpec("file", file=path)

    def explicit(self, node: yaml.Node) -> tuple[Topology | None, TopologySpec | None]:
        m = self.mapping(node, "topology", TOPOLOGY_EXPLICIT_KEYS)
        if m is None:
            return None, None
        nodes = self.mapping(m["nodes"][1], "topology.nodes", self._keys(m["nodes"][1]))
        links_node = m["links"][1] if "links" in m else None
        items = self.sequence(links_node, "topology.links") if links_node is not None else []
        if nodes is None or items is None:
            return None, None
        # Links first: a switch without "ports" gets as many as its highest cabled port.
        links: list[tuple[Endpoint, Endpoint, dict[str, Any], str]] = []
        ok = True
        for i, item in enumerate(items):
            parsed = self.link_item(item, f"topology.links[{i}]")
            if parsed:
                links.append(parsed)
            else:
                ok = False
        highest: dict[str, int] = {}
        for a, b, _, _ in links:
            for e in (a, b):
                highest[e.node] = max(highest.get(e.node, 0), e.port)
        topo = Topology(str(scalar(m["name"][1])) if "name" in m else Path(self.source).stem)
        for name, (knode, vnode) in nodes.items():
            ok = self.node_item(topo, name, knode, vnode, highest) and ok
        if not ok:
            return None, None
        for a, b, props, origin in links:
            topo.add_link(a, b, origin=origin, **props)
        errors = [p for p in topo.validate() if p.severity == "error"]
        for prob in errors:
            self.problems.append((self.lines.get(prob.where, 1), str(prob)))
        if errors:
            return None, None
        return topo, TopologySpec("explicit")

    @staticmethod
    def _keys(node: yaml.Node) -> list[str]:
        """Node names are user-chosen: every key is allowed here (checked as a name later)."""
        if isinstance(node, yaml.MappingNode):
            return [str(k.value) for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
        return []

    def node_item(
        self, topo: Topology, name: str, knode: yaml.Node, vnode: yaml.Node, highest: dict[str, int]
    ) -> bool:
        path = f"topology.nodes.{name}"
        problem = name_problem(name)
        if problem:
            self.error(knode, path, problem)
            return False
        kinds = NODE_FIELDS["kind"].choices
        if isinstance(vnode, yaml.ScalarNode):
            kind = self.choice(vnode, path, kinds)
            spec: Pairs = {}
        else:
            spec_ = self.mapping(vnode, path, NODE_KEYS, required=NODE_REQUIRED)
            if spec_ is None or "kind" not in spec_:
                return False
            spec = spec_
            kind = self.choice(spec["kind"][1], f"{path}.kind", kinds)
        if kind is None:
            return False
        nk = NodeKind(kind)
        ports: int | None
        if "ports" in spec:
            hi = 2 if nk is NodeKind.CA else int(NODE_FIELDS["ports"].hi or 0)
            ports = self.integer(spec["ports"][1], f"{path}.ports", int(NODE_FIELDS["ports"].lo or 1), hi)
            if ports is None:
                return False
        else:
            ports = 1 if nk is NodeKind.CA else max(1, highest.get(name, 1))
        kw: dict[str, Any] = {}
        if "guid" in spec:
            guid = self.value(spec["guid"][1], f"{path}.guid", NODE_FIELDS["guid"])
            if guid is None:
                return False
            kw["guid"] = guid
        if "desc" in spec:
            desc = self.string(spec["desc"][1], f"{path}.desc", "a NodeDescription")
            if desc is None:
                return False
            kw["desc"] = desc
        origin = f"{self.source}:{line_of(knode)} {path}"
        self.lines[origin] = line_of(knode)
        topo.add_node(name, nk, ports, origin=origin, **kw)
        return True

    def link_item(
        self, item: yaml.Node, path: str
    ) -> tuple[Endpoint, Endpoint, dict[str, Any], str] | None:
        props: dict[str, Any] = {}
        if isinstance(item, yaml.MappingNode):
            m = self.mapping(item, path, LINK_KEYS, required=LINK_REQUIRED)
            if m is None or "endpoints" not in m:
                return None
            ends_node = m["endpoints"][1]
            epath = f"{path}.endpoints"
            if "rate" in m:
                props["rate"] = self.convert(
                    m["rate"][1], f"{path}.rate", parse_rate, _RATE_EXPECTED
                )
            if "mtu" in m:
                props["mtu"] = self.mtu(m["mtu"][1], f"{path}.mtu")
            if "rate" in m:
                self.rate_nodes.append((m["rate"][1], f"{path}.rate"))
            if "delay_us" in m:
                props["delay_us"] = self.value(m["delay_us"][1], f"{path}.delay_us", LINK_FIELDS["delay_us"])
            if "cable_m" in m:
                props["cable_m"] = self.value(m["cable_m"][1], f"{path}.cable_m", LINK_FIELDS["cable_m"])
                if "delay_us" in m:
                    self.error(m["cable_m"][1], f"{path}.cable_m", _ONE_PROPAGATION)
                    return None
                if props["cable_m"] is not None:
                    props["delay_us"] = propagation_ns(cable_m=props["cable_m"]) / 1000
            if "loss_pct" in m:
                props["loss_pct"] = self.value(m["loss_pct"][1], f"{path}.loss_pct", LINK_FIELDS["loss_pct"])
            if any(v is None for v in props.values()):
                return None
            for key in ("delay_us", "cable_m", "loss_pct"):
                if key in m and props.get(key) and self.datapath != "user":
                    self.error(m[key][1], f"{path}.{key}", _NEEDS_USER)
        else:
            ends_node, epath = item, path
        seq = self.sequence(ends_node, epath)
        if seq is None:
            return None
        if len(seq) != 2:
            self.error(
                ends_node,
                epath,
                f"expected two endpoints ['node:port', 'node:port'], got {len(seq)}",
            )
            return None
        ends = []
        for j, e in enumerate(seq):
            ep = self.convert(e, f"{epath}[{j}]", Endpoint.parse, "an endpoint 'node:port'")
            if ep is None:
                return None
            ends.append(ep)
        origin = f"{self.source}:{line_of(item)} {path}"
        self.lines[origin] = line_of(item)
        self.stated[origin] = {k for k in ("delay_us", "cable_m", "loss_pct") if k in props}
        return ends[0], ends[1], props, origin

    def sm(self, node: yaml.Node | None, topo: Topology | None) -> SMSpec:
        m: Pairs = {}
        if node is not None:
            m = self.mapping(node, "sm", SM_KEYS) or {}
        impl = (self.choice(m["impl"][1], "sm.impl", SM_FIELDS["impl"].choices) if "impl" in m else None) or "ibemu"
        engine = (
            self.choice(m["engine"][1], "sm.engine", SM_FIELDS["engine"].choices) if "engine" in m else None
        ) or "minhop"
        sweep = 10.0
        if "sweep_interval_s" in m:
            v = self.value(m["sweep_interval_s"][1], "sm.sweep_interval_s", SM_FIELDS["sweep_interval_s"])
            sweep = 10.0 if v is None else v
        lmc = 0
        if "lmc" in m:
            lmc = self.value(m["lmc"][1], "sm.lmc", SM_FIELDS["lmc"]) or 0
        keys: dict[str, int] = {}
        if "m_key" in m:
            v = self.integer(m["m_key"][1], "sm.m_key")
            if v is not None and not 0 <= v < 1 << 64:
                self.error(m["m_key"][1], "sm.m_key", f"expected a 64-bit value (0 to 0xffffffffffffffff), got {v:#x}"
                           if v >= 0 else f"expected a 64-bit value (0 to 0xffffffffffffffff), got {v}")
                v = None
            keys["m_key"] = v or 0
        for k in ("m_key_protect", "m_key_lease_s"):
            if k in m:
                keys[k] = self.value(m[k][1], f"sm.{k}", SM_FIELDS[k]) or 0
        if not keys.get("m_key"):
            for k in ("m_key_protect", "m_key_lease_s"):
                if keys.get(k):
                    self.error(m[k][1], f"sm.{k}", f"{k} protects an M_Key: give sm.m_key (a non-zero 64-bit value)")
        if impl == "opensm" and keys.get("m_key_protect", 0) > 2:
            self.error(m["m_key_protect"][1], "sm.m_key_protect",
                       "OpenSM sets protect bits 0-2 (it would use 2 instead of 3); use 2, or impl: ibemu")
        host = ""
        if topo is not None:
            cas = topo.cas()
            if "host" in m:
                hnode = m["host"][1]
                name = self.string(hnode, "sm.host", "a host (CA) name")
                if name is not None:
                    try:
                        host = refs.host(topo, name)
                    except refs.RefError as exc:
                        self.error(hnode, "sm.host", str(exc))
            elif cas:
                host = cas[0].name
            else:
                self.error(
                    node or 1, "sm", f"topology {topo.name} has no CA to run the subnet manager on"
                )
            if engine == "ftree" and "engine" in m and not _tree_like(topo):
                self.error(
                    m["engine"][1],
                    "sm.engine",
                    f"ftree routes fat-trees, and {topo.name} is not layered like one; use minhop, updn or dor",
                )
        election = self.sm_election(m, impl, host, topo)
        return SMSpec(impl=impl, engine=engine, host=host, sweep_interval_s=sweep, lmc=lmc, **keys,  # type: ignore[arg-type]
                      **election)

    def sm_election(self, m: Pairs, impl: str, host: str, topo: Topology | None) -> dict[str, Any]:
        """``sm.priority``, ``sm.poll_interval_ms``, ``sm.poll_retries`` and ``sm.standby``
        (``ibemu.sm.election``): a standby on a known CA other than the master's."""
        out: dict[str, Any] = {}
        for k in ("priority", "poll_interval_ms", "poll_retries"):
            if k in m:
                v = self.value(m[k][1], f"sm.{k}", SM_FIELDS[k])
                if v is not None:
                    out[k] = v
        if "standby" not in m:
            return out
        snode = m["standby"][1]
        sm_ = self.mapping(snode, "sm.standby", SM_STANDBY_KEYS)
        if sm_ is None:
            return out
        if "host" not in sm_:
            self.error(snode, "sm.standby", "give the standby's host (a CA other than the master's)")
            return out
        s_impl = impl
        if "impl" in sm_:
            s_impl = self.choice(sm_["impl"][1], "sm.standby.impl", SM_STANDBY_FIELDS["impl"].choices) or impl
        prio = 0
        if "priority" in sm_:
            prio = self.value(sm_["priority"][1], "sm.standby.priority", SM_STANDBY_FIELDS["priority"]) or 0
        s_host = ""
        hnode = sm_["host"][1]
        name = self.string(hnode, "sm.standby.host", "a host (CA) name")
        if name is not None and topo is not None:
            try:
                s_host = refs.host(topo, name)
            except refs.RefError as exc:
                self.error(hnode, "sm.standby.host", str(exc))
            else:
                if s_host == host:
                    self.error(hnode, "sm.standby.host",
                               f"{s_host} runs the master SM; a standby runs on another host (one SM per port)")
        out["standby"] = StandbySpec(host=s_host, priority=prio, impl=s_impl)
        return out

    # --- partitions -----------------------------------------------------------------------

    def partitions(self, node: yaml.Node | None, topo: Topology | None, fabric: FabricSpec,
                   sm: SMSpec) -> tuple[PartitionSpec, ...]:
        """``partitions:``: names and keys unique, members known hosts named once each, and
        no host in more partitions than a switch port's P_Key table holds."""
        if node is None:
            return ()
        items = self.sequence(node, "partitions")
        if items is None:
            return ()
        if fabric.kind != "ib":
            self.error(node, "partitions", "partitions are an IB feature (fabric.kind: ib)")
            return ()
        out: list[PartitionSpec] = []
        names: dict[str, int] = {}
        keys: dict[int, int] = {}
        per_host: dict[str, list[str]] = {}
        for i, item in enumerate(items):
            path = f"partitions[{i}]"
            m = self.mapping(item, path, PARTITION_KEYS, required=PARTITION_REQUIRED)
            if m is None or any(k not in m for k in PARTITION_REQUIRED):
                continue
            name = self.string(m["name"][1], f"{path}.name", "a partition name")
            pkey = self.integer(m["pkey"][1], f"{path}.pkey")
            if name is not None:
                if name in names:
                    self.error(m["name"][1], f"{path}.name", f"partition {name!r} is named twice (first at line "
                               f"{names[name]})")
                names.setdefault(name, line_of(m["name"][1]))
            if pkey is not None:
                f = PARTITION_FIELDS["pkey"]
                if pkey == 0x7FFF or pkey == 0xFFFF:
                    self.error(m["pkey"][1], f"{path}.pkey", "0x7fff is the default partition's key (every port "
                               "is a full member of it); give 0x0001-0x7ffe")
                    pkey = None
                elif not f.lo <= pkey <= f.hi:  # type: ignore[operator]
                    self.error(m["pkey"][1], f"{path}.pkey", f"expected a P_Key 0x0001-0x7ffe (bit 15, the "
                               f"membership, is given per member), got {pkey:#x}" if pkey >= 0 else
                               f"expected a P_Key 0x0001-0x7ffe, got {pkey}")
                    pkey = None
                elif pkey in keys:
                    self.error(m["pkey"][1], f"{path}.pkey", f"P_Key {pkey:#06x} is used twice (first at line "
                               f"{keys[pkey]})")
                else:
                    keys[pkey] = line_of(m["pkey"][1])
            default_full = True
            if "membership" in m:
                default_full = self.choice(m["membership"][1], f"{path}.membership",
                                           PARTITION_FIELDS["membership"].choices) != "limited"
            enforce = "both"
            if "enforce" in m:
                enforce = self.choice(m["enforce"][1], f"{path}.enforce",
                                      PARTITION_FIELDS["enforce"].choices) or "both"
            members, everyone = self._members(m["members"][1], f"{path}.members", topo, default_full)
            if name is None or pkey is None or members is None:
                continue
            hosts = [c.name for c in topo.cas()] if everyone and topo is not None else [h for h, _ in members]
            for h in hosts:
                per_host.setdefault(h, []).append(name)
            out.append(PartitionSpec(name, pkey, members, everyone, default_full, enforce))
        modes = {p.enforce for p in out}
        if sm.impl == "opensm" and len(modes) > 1:
            self.error(node, "partitions", f"OpenSM enforces partitions one way for the subnet (part_enforce); "
                       f"these ask for {', '.join(sorted(modes))}: give every partition the same enforce, or "
                       "use sm.impl: ibemu")
        for host, parts in per_host.items():
            if len(parts) + 1 > SWITCH_PKEY_CAP:
                self.error(node, "partitions", f"P_Key table overflow: host {host} is in {len(parts)} partitions; "
                           f"a switch port facing it holds {SWITCH_PKEY_CAP} P_Keys, the default one included")
        return tuple(out)

    def _members(self, node: yaml.Node, path: str, topo: Topology | None,
                 default_full: bool) -> tuple[tuple[tuple[str, bool], ...] | None, bool]:
        """(members, every CA) of one partition; (None, False) after an error."""
        if isinstance(node, yaml.ScalarNode):
            if scalar(node) in ("ALL", "all"):
                return (), True
            self.error(node, path, f"expected a list of hosts or ALL, got {describe(node)}")
            return None, False
        items = self.sequence(node, path)
        if items is None:
            return None, False
        if not items:
            self.error(node, path, "a partition needs members (a list of hosts, or ALL)")
            return None, False
        out: list[tuple[str, bool]] = []
        seen: dict[str, int] = {}
        ok = True
        for j, item in enumerate(items):
            ipath = f"{path}[{j}]"
            full = default_full
            hnode: yaml.Node = item
            if isinstance(item, yaml.MappingNode):
                mm = self.mapping(item, ipath, PARTITION_MEMBER_KEYS, required=("host",))
                if mm is None or "host" not in mm:
                    ok = False
                    continue
                hnode = mm["host"][1]
                if "membership" in mm:
                    full = self.choice(mm["membership"][1], f"{ipath}.membership",
                                       PARTITION_FIELDS["membership"].choices) != "limited"
            name = self.string(hnode, f"{ipath}.host" if hnode is not item else ipath, "a host (CA) name")
            if name is None:
                ok = False
                continue
            if topo is not None:
                try:
                    name = refs.host(topo, name)
                except refs.RefError as exc:
                    self.error(hnode, ipath, str(exc))
                    ok = False
                    continue
            if name in seen:
                self.error(hnode, ipath, f"member {name} is named twice (first at line {seen[name]})")
                ok = False
                continue
            seen[name] = line_of(hnode)
            out.append((name, full))
        return (tuple(out) if ok else None), False

    # --- traffic --------------------------------------------------------------------------

    def traffic(
        self, node: yaml.Node | None, topo: Topology | None, duration: float
    ) -> tuple[TrafficSpec, ...]:
        if node is None:
            return ()
        items = self.sequence(node, "traffic")
        if items is None:
            return ()
        out: list[TrafficSpec] = []
        names: dict[str, int] = {}
        for i, item in enumerate(items):
            spec = self.traffic_item(i, item, topo, duration)
            if spec is None:
                continue
            if spec.name in names:
                self.error(
                    item,
                    f"traffic[{i}].name",
                    f"duplicate traffic name {spec.name!r} (first at traffic[{names[spec.name]}])",
                )
                continue
            names[spec.name] = i
            out.append(spec)
        return tuple(out)

    def traffic_item(
        self, i: int, item: yaml.Node, topo: Topology | None, duration: float
    ) -> TrafficSpec | None:
        path = f"traffic[{i}]"
        if not isinstance(item, yaml.MappingNode):
            self.error(item, path, f"expected a mapping with a 'kind' ({', '.join(TRAFFIC_KINDS)})")
            return None
        knode = _peek(item, "kind")
        if knode is None:
            self.error(
                item, path, f"missing required key 'kind' (one of {', '.join(TRAFFIC_KINDS)})"
            )
            return None
        kind = self.choice(knode, f"{path}.kind", TRAFFIC_FIELDS["kind"].choices)
        if kind is None:
            return None
        entry = TRAFFIC_KINDS[kind]
        allowed = TRAFFIC_COMMON + entry.keys
        m = self._kind_mapping(item, path, allowed, f"kind {kind}")
        if m is None:
            return None
        ok = True

        def num(key: str, default: float, hi: float) -> float:
            nonlocal ok
            if key not in m:
                return default
            v = self.value(m[key][1], f"{path}.{key}", TRAFFIC_FIELDS[key], hi)
            ok = ok and v is not None
            return default if v is None else v

        def integer(key: str, default: int) -> int:
            nonlocal ok
            if key not in m:
                return default
            v = self.value(m[key][1], f"{path}.{key}", TRAFFIC_FIELDS[key])
            ok = ok and v is not None
            return default if v is None else v

        name = f"{kind}{i}"
        if "name" in m:
            name = self.string(m["name"][1], f"{path}.name") or name
        start = num("start_s", 0.0, duration)
        stop = num("stop_s", duration, duration)
        if ok and stop <= start:
            self.error(
                m["stop_s"][1] if "stop_s" in m else item,
                f"{path}.stop_s",
                f"must be after start_s ({start:g}), got {stop:g}",
            )
            ok = False
        sl = integer("sl", 0)
        qps = integer("qps", 1)
        seed = integer("seed", 0)
        rc_timeout = integer("rc_timeout", 14) if "rc_timeout" in m else None
        rc_retry_cnt = integer("rc_retry_cnt", 7) if "rc_retry_cnt" in m else None
        # a stream is always paced (10,000 msg/s unless said); a bandwidth flow only when it says so
        rate_pps = (integer("rate_pps", 10_000)
                    if "rate_pps" in entry.keys and (kind == "stream" or "rate_pps" in m) else None)
        transport = "rc"
        if "transport" in m:
            transport = self.choice(m["transport"][1], f"{path}.transport", TRAFFIC_FIELDS["transport"].choices) or "rc"
        size = entry.size or DEFAULT_SIZE
        if "size" in m:
            v = self.size(m["size"][1], f"{path}.size", int(TRAFFIC_FIELDS["size"].lo or 1), int(TRAFFIC_FIELDS["size"].hi or MAX_SIZE))
            ok = ok and v is not None
            size = v or size
        bidir = False
        if "bidirectional" in m:
            b = self.boolean(m["bidirectional"][1], f"{path}.bidirectional")
            ok = ok and b is not None
            bidir = bool(b)
        src = dst = None
        hosts: tuple[str, ...] = ()
        if topo is not None:
            if entry.hosts == "pair":
                for key in ("from", "to"):
                    if key not in m:
                        self.error(
                            item, path, f"missing required key {key!r} (a host) for kind {kind}"
                        )
                        ok = False
                src = self.host_ref(m, "from", path, topo) if "from" in m else None
                dst = self.host_ref(m, "to", path, topo) if "to" in m else None
                if src and dst and src == dst:
                    self.error(
                        m["to"][1],
                        f"{path}.to",
                        f"from and to are both {src}; traffic needs two hosts",
                    )
                    ok = False
                hosts = tuple(h for h in (src, dst) if h)
                ok = ok and bool(src) and bool(dst)
            elif entry.hosts == "fan_in":
                if "to" not in m:
                    self.error(
                        item, path, f"missing required key 'to' (the receiving host) for kind {kind}"
                    )
                    return None
                dst = self.host_ref(m, "to", path, topo)
                if dst is None:
                    return None
                senders = self.host_list(m, "from", path, topo, exclude=dst)
                if senders is None:
                    return None
                if dst in senders:
                    self.error(
                        m["from"][1], f"{path}.from", f"{dst} is the receiver; it cannot also send"
                    )
                    return None
                hosts = (*senders, dst)
            else:
                group = self.host_list(m, "hosts", path, topo)
                if group is None:
                    return None
                hosts = group
        if not ok:
            return None
        job = None
        if kind == "training":
            job, hosts = gpus.read_job(self, m, item, path, hosts, self.gpu_pool, self.gpu_taken)
            if job is None:
                return None
        return TrafficSpec(
            name=name, kind=kind, hosts=hosts, training=job, src=src, dst=dst, size=size, qps=qps,
            start_s=start, stop_s=stop, sl=sl, bidirectional=bidir, seed=seed,
            rate_pps=rate_pps, transport=transport, where=f"{self.source}:{line_of(item)} {path}",
            rc_timeout=rc_timeout, rc_retry_cnt=rc_retry_cnt,
        )  # fmt: skip

    def _kind_mapping(
        self, item: yaml.Node, path: str, allowed: tuple[str, ...], what: str
    ) -> Pairs | None:
        """Like mapping(), but says which kind/action the unknown key does not belong to."""
        before = len(self.problems)
        m = self.mapping(item, path, allowed)
        for n in range(before, len(self.problems)):
            line, msg = self.problems[n]
            self.problems[n] = (line, msg.replace(": unknown key", f": not a key of {what}", 1))
        return m

    def host_ref(self, m: Pairs, key: str, path: str, topo: Topology) -> str | None:
        vnode = m[key][1]
        name = self.string(vnode, f"{path}.{key}", "a host (CA) name")
        if name is None:
            return None
        try:
            return refs.host(topo, name)
        except refs.RefError as exc:
            self.error(vnode, f"{path}.{key}", str(exc))
            return None

    def host_list(
        self, m: Pairs, key: str, path: str, topo: Topology, exclude: str | None = None
    ) -> tuple[str, ...] | None:
        """A list of hosts, or ``all`` (the default): every CA, except ``exclude``."""
        everyone = tuple(n.name for n in topo.cas() if n.name != exclude)
        if key not in m:
            hosts = everyone
            where: yaml.Node | None = None
        else:
            where = m[key][1]
            kpath = f"{path}.{key}"
            if isinstance(where, yaml.ScalarNode) and scalar(where) == "all":
                hosts = everyone
            else:
                seq = self.sequence(where, kpath)
                if seq is None:
                    return None
                out: list[str] = []
                for j, h in enumerate(seq):
                    name = self.string(h, f"{kpath}[{j}]", "a host (CA) name")
                    if name is None:
                        return None
                    try:
                        refs.host(topo, name)
                    except refs.RefError as exc:
                        self.error(h, f"{kpath}[{j}]", str(exc))
                        return None
                    if name in out:
                        self.error(h, f"{kpath}[{j}]", f"{name} is listed twice")
                        return None
                    out.append(name)
                hosts = tuple(out)
        if len(hosts) < (1 if exclude else 2):
            self.error(
                where or 1,
                f"{path}.{key}",
                f"needs at least {1 if exclude else 2} hosts, got {len(hosts)}",
            )
            return None
        return hosts

    # --- faults ---------------------------------------------------------------------------

    def faults(
        self, node: yaml.Node | None, topo: Topology | None, duration: float
    ) -> tuple[FaultSpec, ...]:
        if node is None:
            return ()
        items = self.sequence(node, "faults")
        if items is None:
            return ()
        out: list[tuple[int, yaml.Node, FaultSpec]] = []
        for i, item in enumerate(items):
            spec = self.fault_item(i, item, topo, duration)
            if spec is not None:
                out.append((i, item, spec))
        self.fault_sequence(out)
        return tuple(f for _, _, f in out)

    def fault_item(
        self, i: int, item: yaml.Node, topo: Topology | None, duration: float
    ) -> FaultSpec | None:
        path = f"faults[{i}]"
        if not isinstance(item, yaml.MappingNode):
            self.error(
                item,
                path,
                f"expected a mapping with 'at_s' and 'action' ({', '.join(FAULT_ACTIONS)})",
            )
            return None
        anode = _peek(item, "action")
        if anode is None:
            self.error(
                item, path, f"missing required key 'action' (one of {', '.join(FAULT_ACTIONS)})"
            )
            return None
        action = self.choice(anode, f"{path}.action", FAULT_FIELDS["action"].choices)
        if action is None:
            return None
        entry = FAULT_ACTIONS[action]
        m = self._kind_mapping(item, path, FAULT_COMMON + entry.keys, f"action {action}")
        if m is None:
            return None
        ok = True
        for key in (*FAULT_REQUIRED, *entry.required):
            if key not in m:
                self.error(item, path, f"missing required key {key!r} for action {action}")
                ok = False
        at = 0.0
        if "at_s" in m:
            v = self.value(m["at_s"][1], f"{path}.at_s", FAULT_FIELDS["at_s"])
            if v is not None and v >= duration:
                self.error(
                    m["at_s"][1],
                    f"{path}.at_s",
                    f"{v:g} s is not before the end of the run (duration_s: {duration:g})",
                )
                v = None
            ok = ok and v is not None
            at = v or 0.0
        kw: dict[str, Any] = {}
        if "period_s" in m:
            kw["period_s"] = self.value(m["period_s"][1], f"{path}.period_s", FAULT_FIELDS["period_s"])
        if "count" in m:
            kw["count"] = self.value(m["count"][1], f"{path}.count", FAULT_FIELDS["count"])
        if "percent" in m:
            kw["percent"] = self.value(m["percent"][1], f"{path}.percent", FAULT_FIELDS["percent"])
        if "duration_s" in m:
            kw["duration_s"] = self.value(m["duration_s"][1], f"{path}.duration_s", FAULT_FIELDS["duration_s"])
        ok = ok and all(v is not None for v in kw.values())
        if self.datapath not in entry.datapaths:  # the kernel datapath has no delay, loss or corruption
            self.error(anode, f"{path}.action", f"{action} {_NEEDS_USER}")
            ok = False
        if topo is not None:
            if "link" in m:
                vnode = m["link"][1]
                text = scalar(vnode) if isinstance(vnode, yaml.ScalarNode) else None
                try:
                    kw["link"] = refs.link(topo, text)
                except refs.RefError as exc:
                    self.error(vnode, f"{path}.link", str(exc))
                    ok = False
            if "switch" in m:
                vnode = m["switch"][1]
                name = self.string(vnode, f"{path}.switch", "a switch name")
                try:
                    kw["switch"] = refs.switch(topo, name or "")
                except refs.RefError as exc:
                    if name is not None:
                        self.error(vnode, f"{path}.switch", str(exc))
                    ok = False
        if not ok or topo is None:
            return None
        return FaultSpec(
            at_s=at, action=action, where=f"{self.source}:{line_of(item)} {path}", **kw
        )

    def fault_sequence(self, faults: list[tuple[int, yaml.Node, FaultSpec]]) -> None:
        """Down/up must alternate per link and switch (in time order)."""
        state: dict[object, tuple[bool, int, float]] = {}  # target -> (down?, index, at)
        for i, item, f in sorted(faults, key=lambda x: (x[2].at_s, x[0])):
            sets = FAULT_ACTIONS[f.action].sets
            target: object = getattr(f, sets[0]) if sets else None
            if sets is None or target is None:
                continue
            what = f"{sets[0]} {target}"
            down = not sets[1]
            prev = state.get(target)
            if down and prev and prev[0]:
                self.error(
                    item,
                    f"faults[{i}]",
                    f"{what} is already down at {f.at_s:g} s (faults[{prev[1]}] at {prev[2]:g} s)",
                )
            elif not down and not (prev and prev[0]):
                self.error(
                    item, f"faults[{i}]", f"{what} is not down at {f.at_s:g} s; bring it down first"
                )
            state[target] = (down, i, f.at_s)

    # --- time -----------------------------------------------------------------------------

    def time(self, node: yaml.Node | None) -> TimeSpec:
        if node is None:
            return TimeSpec()
        m = self.mapping(node, "time", TIME_KEYS)
        if m is None:
            return TimeSpec()
        limits: dict[str, float | None] = {"lag_threshold_us": None, "lag_threshold_real_us": None}
        for key in limits:
            if key in m:
                limits[key] = self.value(m[key][1], f"time.{key}", TIME_FIELDS[key])
        if "lag_threshold_us" in m and "lag_threshold_real_us" in m:
            self.error(m["lag_threshold_real_us"][0], "time.lag_threshold_real_us",
                       "give the lag threshold in emulated time (lag_threshold_us) or in real time "
                       "(lag_threshold_real_us), not both")
            limits["lag_threshold_real_us"] = None
        emulated, real = limits["lag_threshold_us"], limits["lag_threshold_real_us"]
        if "dilation" not in m:
            return TimeSpec(lag_threshold_us=emulated, lag_threshold_real_us=real)
        vnode = m["dilation"][1]
        where = f"{self.source}:{line_of(vnode)} time.dilation"
        if isinstance(vnode, yaml.ScalarNode) and scalar(vnode) == "auto":
            return TimeSpec(where=where, auto=True, lag_threshold_us=emulated, lag_threshold_real_us=real)
        n = self.number(vnode, "time.dilation", TIME_FIELDS["dilation"].lo)
        if n is None:
            return TimeSpec(lag_threshold_us=emulated, lag_threshold_real_us=real)
        return TimeSpec(dilation=float(n), where=where, lag_threshold_us=emulated, lag_threshold_real_us=real)

    # --- record ---------------------------------------------------------------------------

    def record(self, node: yaml.Node | None, topo: Topology | None) -> RecordSpec:
        if node is None:
            return RecordSpec()
        m = self.mapping(node, "record", RECORD_KEYS)
        if m is None:
            return RecordSpec()
        capture: list[Link] = []
        if "capture" in m and topo is not None:
            cnode = m["capture"][1]
            if isinstance(cnode, yaml.ScalarNode) and scalar(cnode) == "all":
                capture = list(topo.links)
            else:
                seq = self.sequence(cnode, "record.capture") or []
                for j, item in enumerate(seq):
                    text = scalar(item) if isinstance(item, yaml.ScalarNode) else None
                    try:
                        capture.append(refs.link(topo, text))
                    except refs.RefError as exc:
                        self.error(item, f"record.capture[{j}]", str(exc))
        json_path = None
        if "json" in m:
            s = self.string(m["json"][1], "record.json", "a file path")
            json_path = Path(s) if s else None
        plots = False
        if "plots" in m:
            plots = bool(self.boolean(m["plots"][1], "record.plots"))
        return RecordSpec(capture=tuple(capture), json=json_path, plots=plots)


def _mapping_pairs(node: yaml.Node) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}


def _tree_like(topo: Topology) -> bool:
    levels = analysis.infer_levels(topo)
    return all(levels[lk.a.node] != levels[lk.b.node] for lk in topo.iter_switch_links())


# --- entry points -----------------------------------------------------------------------------


def loads_scenario(text: str, source: str = "<string>", base_dir: Path | None = None) -> Scenario:
    """Parse and check scenario text; ScenarioError lists every located problem."""
    return _Loader(source, base_dir).load(text)


def load_scenario(path: str | Path) -> Scenario:
    """Load the scenario file at ``path`` (relative topology files start at its folder)."""
    path = Path(path)
    return loads_scenario(read_text(path), str(path), path.parent)


def builtin_names() -> list[str]:
    root = importlib.resources.files("ibemu.scenario") / "builtin"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def builtin_text(name: str = "default") -> str:
    """The text of a scenario shipped inside the package (``default`` is ``ibemu run``'s)."""
    res = importlib.resources.files("ibemu.scenario") / "builtin" / f"{name}.yaml"
    if not res.is_file():
        raise ConfigError(f"no built-in scenario {name!r}; there are: {', '.join(builtin_names())}")
    return res.read_text()


def load_builtin(name: str = "default") -> Scenario:
    return loads_scenario(builtin_text(name), f"<builtin>/{name}.yaml")
