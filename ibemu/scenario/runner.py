"""``ibemu run``: one scenario end to end — build, SM bring-up, traffic, faults, measure, report.

Phases: ``build`` (namespaces, cables, agents), ``sm`` (to SUBNET UP), ``warm-up`` (the
traffic worker opens the hosts' ports), ``traffic`` (flows run; faults are injected on
schedule, each stamped at the source), ``drain`` (flows finish, the worker writes what it
measured), ``teardown``. Ctrl-C at any point tears everything down and still returns what was
measured (``interrupted: true``). The result follows ``ibemu.report.result`` (ibemu.run/3).

Fidelity: the run names its lag log (``RUN_DIR/lag.jsonl``) in the environment
(``ibemu.lagmon.ENV_LOG``) for its own lifetime, so every process it starts (the SM, the
traffic workers, the RoCE user datapath and fabric manager) and the agent host in this one
report how far they fell behind the emulated clock; ``ibemu.scenario.fidelity`` judges the run
from it (the result's ``fidelity`` block).

Processes: this one runs the fabric's agents (and the SM's MAD socket); the SM and the
traffic worker are processes of their own, owned by the run. A RoCE run whose user datapath
or fabric manager exits stops at once with an error (no frame would move again).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.core import GaugeMetricFamily, Metric

from ibemu import clock, lagmon
from ibemu.errors import ConfigError, IbemuError, did_you_mean
from ibemu.fabric import opensm
from ibemu.fabric.agenthost import AgentHost
from ibemu.fabric.agents import make_agent
from ibemu.fabric.cable_capture import capture
from ibemu.fabric.faults import FAULT_ACTIONS, FaultInjector, actions_on
from ibemu.fabric.observe import cable_loads
from ibemu.fabric.roce_fabric import RoceRun
from ibemu.fabric.roce_runtime import RoceFaultInjector, RoceRuntime
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.session import FabricRequest, open_runtime
from ibemu.kernel import cpus, faketime, ownership
from ibemu.scenario.fidelity import fidelity, figure_scale
from ibemu.scenario.measure import fault_phases, flow_impact, read_events, traffic_entry
from ibemu.scenario.schema import Scenario, TrafficSpec
from ibemu.sm.partitions import Partition, SmPartitions
from ibemu.topo.model import Topology
from ibemu.traffic.endpoints import host_address
from ibemu.traffic.flows import TRAFFIC_KINDS, FlowOutput
from ibemu.wire.capture import CaptureBounds, CaptureStats

if TYPE_CHECKING:
    from ibemu.roce.queues import QueueConfig

log = logging.getLogger(__name__)

WARMUP_S = 1.0
"""Real seconds from writing the flows' time zero to it (the workers read it and get ready)."""
READY_TIMEOUT_S = 60.0
"""How long traffic workers get to open their ports before time zero is set regardless."""
TRAFFIC_NICE = 10
"""Traffic workers run at this nice level: they emulate the hosts' CPUs, while the agents
and the SM emulate switch firmware and an SM node, separate hardware on a real fabric. On
a machine with few cores the management plane must not queue behind saturating flows."""
DRAIN_S = 30.0
QPN_BASE = 0x100
QPNS_PER_FLOW = 0x10000
"""Each flow's worker numbers its QPs in its own range (workers may share a host port)."""
TIMELINE_BIN_S = 0.05

Progress = Callable[[str, str], None]


def _quiet(phase: str, text: str) -> None:
    log.info("[%s] %s", phase, text)


_FABRIC_NAMES = {"ib": "an IB", "roce": "a RoCE"}


def check_runnable(scen: Scenario) -> None:
    """What this runner cannot run, said before anything is built."""
    if scen.fabric.kind not in ("ib", "roce"):
        raise ConfigError(f"fabric kind {scen.fabric.kind!r}: ib or roce",
                          f"{scen.path or scen.name}: fabric.kind")
    for t in scen.traffic:
        if t.kind not in TRAFFIC_KINDS:
            raise ConfigError(f"traffic kind {t.kind!r} is not implemented", t.where)
    for f in scen.faults:  # the fabric kinds each action applies to: faults.FAULT_ACTIONS
        if f.action not in actions_on(scen.fabric.kind):
            raise ConfigError(f"fault {f.action!r} does not apply to {_FABRIC_NAMES[scen.fabric.kind]} fabric "
                              f"(it has: {', '.join(actions_on(scen.fabric.kind))})", f.where)
    if scen.fabric.kind == "roce":  # IP routers (kernel or ibemu.roce.userpath) and a fabric manager, no SM
        if scen.fabric.delay_us and not scen.fabric.roce_user:  # the kernel must be able to hold frames back
            from ibemu.kernel.impair import Impairment, check_supported

            check_supported(Impairment(scen.fabric.loss_pct, scen.fabric.delay_us),
                            scen.fabric.where or f"{scen.path or scen.name}: fabric.delay_us")
        return
    if scen.fabric.impaired or scen.fabric.ecn:
        raise ConfigError("cable loss, delay and ECN apply to a RoCE fabric only (an IB fabric is lossless)",
                          f"{scen.path or scen.name}: fabric")
    if scen.traffic and scen.sm.impl not in ("ibemu", "opensm"):
        raise ConfigError("traffic needs a subnet manager (sm.impl: ibemu or opensm)", "sm.impl")
    if scen.sm.impl == "opensm" and scen.time.dilation != 1 and faketime.library_path() is None:
        raise ConfigError(f"OpenSM at dilation {scen.time.dilation:g} runs on the dilated clock under "
                          f"libfaketime, which is not installed: {faketime.INSTALL_HINT}",
                          scen.time.where or f"{scen.path or scen.name}: time.dilation")
    needs_user = [f for f in scen.faults if scen.fabric.datapath not in FAULT_ACTIONS[f.action].datapaths]
    if needs_user:
        raise ConfigError(f"{needs_user[0].action} faults need the user datapath (fabric: {{datapath: user}})",
                          needs_user[0].where)


def flow_dict(t: TrafficSpec, scen: Scenario) -> dict[str, Any]:
    """A ``traffic:`` entry as the worker takes it (with the fabric's datapath, and under
    adaptive routing the RC responders' reorder window, ``RC_REORDER_WINDOW``)."""
    duration_s = scen.duration_s
    ar = scen.fabric.adaptive_routing is not None and scen.fabric.datapath == "user"
    return {"name": t.name, "kind": t.kind, "hosts": list(t.hosts), "src": t.src, "dst": t.dst,
            "size": t.size, "qps": t.qps, "start_s": t.start_s, "stop_s": min(t.stop_s, duration_s),
            "bidirectional": t.bidirectional, "seed": t.seed, "rate_pps": t.rate_pps, "sl": t.sl,
            "transport": t.transport, "datapath": scen.fabric.datapath,
            **({"training": t.training.to_json(), "mtu": scen.defaults.mtu or 4096} if t.training else {}),
            **({"reorder_window": RC_REORDER_WINDOW} if ar else {}),
            **({"rc_timeout": t.rc_timeout} if t.rc_timeout is not None else {}),
            **({"rc_retry_cnt": t.rc_retry_cnt} if t.rc_retry_cnt is not None else {})}


RC_REORDER_WINDOW = 512
"""Under ``fabric.adaptive_routing`` the RC QPs of bandwidth and stream flows hold requests up
to this many PSNs ahead (``hca.transport.rc_responder``): a user-datapath window's worth."""


DATA_DSCP = 26
"""RoCE data's DSCP (``ibemu.hca.roce_port.DATA_DSCP``)."""
ROUTER_COUNTERS = ("forwarded", "dropped", "lost", "ecn_marked", "pause_sent", "pause_received", "paused_us")
"""What a RoCE user-datapath run adds to every flow's extra (``router_*``: all routers' ports together)."""


def fabric_request(scen: Scenario) -> FabricRequest:
    """The fabric ``scen`` asks for, as ``ibemu up`` would build it (``ibemu.fabric.session``)."""
    f = scen.fabric
    roce = {"loss_pct": f.loss_pct, "delay_us": f.delay_us, "ecn_mark_kb": f.ecn_mark_kb if f.ecn else 0.0,
            "ecn_line_gbps": f.ecn_line_gbps if f.ecn else 0.0}
    sm_qos = f.qos.sm_json() if f.qos else ""
    switch: dict[str, Any] = {}
    if f.switch is not None and f.kind == "ib":
        m = f.switch.resolve(scen.topology.defaults.rate, ethernet=False)
        switch = {"name": m.name, "latency_ns": m.latency_ns, "buffer_bytes": m.buffer_bytes}
    return FabricRequest(scen.topology, scen.name, kind=f.kind, datapath=f.datapath, sm=scen.sm.impl,
                         sm_host=scen.sm.host, sm_engine=scen.sm.engine, roce=roce, sm_qos=sm_qos,
                         sm_local_failover=f.local_failover is not False,
                         adaptive_routing=f.adaptive_routing.to_json() if f.adaptive_routing else {},
                         switch=switch, sm_keys=scen.sm.keys(), sm_partitions=sm_partitions(scen),
                         sm_election=scen.sm.election())


def sm_partitions(scen: Scenario) -> str:
    """The scenario's partitions as ibemu's SM takes them (``SmPartitions`` JSON, members by
    node GUID; empty: none)."""
    if not scen.partitions:
        return ""
    topo = scen.topology
    parts = tuple(Partition(p.name, p.pkey, tuple((topo.node(h).guid, full) for h, full in p.members),
                            p.everyone, p.everyone_full, p.enforce) for p in scen.partitions)
    return SmPartitions(parts).to_json()


def _queues(scen: Scenario) -> QueueConfig | None:
    """A RoCE user datapath's router queues (they carry its delay, loss, ECN and PFC)."""
    f = scen.fabric
    if f.kind != "roce" or not f.roce_user:
        return None
    from ibemu.roce.queues import QueueConfig

    sw = f.switch.resolve(scen.topology.defaults.rate, ethernet=True) if f.switch is not None else None
    buffer_kb = sw.buffer_bytes / 1024 if sw is not None and f.switch and f.switch.buffer_kb else f.buffer_kb
    return QueueConfig(line_gbps=f.line_gbps, buffer_kb=buffer_kb, ecn_mark_kb=f.ecn_mark_kb, pfc=frozenset(f.pfc),
                       xoff_kb=f.pfc_xoff_kb, xon_kb=f.pfc_xon_kb, delay_us=f.delay_us, loss_pct=f.loss_pct,
                       dscp_priority=f.dscp_priority, switch=sw.name if sw is not None else "",
                       latency_ns=sw.latency_ns if sw is not None else None)


def capture_end(topo: Topology, text: str) -> tuple[str, int]:
    """The cable end ``text`` (``NODE:PORT``) names in ``topo``; ConfigError (one line) if none."""
    node, sep, port = text.partition(":")
    if not sep or not node or not port.isdigit():
        raise ConfigError(f"{text}: expected a cable end NODE:PORT, e.g. leaf0:1", where="--capture")
    n = topo.nodes.get(node)
    if n is None:
        raise ConfigError(f"{text}: no node {node!r}{did_you_mean(node, topo.nodes)}", where="--capture")
    if int(port) not in n.port_range:
        raise ConfigError(f"{text}: {node} has {n.ports_text()}", where="--capture")
    if topo.link_at(node, int(port)) is None:
        raise ConfigError(f"{text}: port {port} of {node} is not cabled", where="--capture")
    return node, int(port)


class ScenarioRun:
    """Runs ``scen`` once; ``await run()`` returns the result dict."""

    def __init__(self, scen: Scenario, out_dir: Path, *, captures: list[str] | None = None,
                 capture_bounds: CaptureBounds | None = None, progress: Progress = _quiet,
                 metrics: tuple[str, int] | None = None, sysfs: bool = False) -> None:
        """``metrics``: where the fabric serves its Prometheus endpoint (``fabric.metrics``;
        IB fabrics), with this run's fidelity so far beside it. ``sysfs``: keep the nodes'
        sysfs trees (``fabric.sysfs``) during the run; off by default, because rewriting them
        twice a second took the agent host's loop and CPU from the measurement (the default
        scenario's agent host at 8-10 ms p99 lag, INVALID, against 0.8-1.0 ms without)."""
        check_runnable(scen)
        # checked before anything is built; one capture a cable end (one file each): the
        # command line's and the scenario's ``record.capture`` links (each at its first end,
        # which sees both directions of the cable)
        ends = [capture_end(scen.topology, c) for c in captures or []]
        ends += [(lk.a.node, lk.a.port) for lk in scen.record.capture]
        self.capture_ends = list(dict.fromkeys(ends))
        self.capture_bounds = capture_bounds or CaptureBounds()
        self.scen = scen
        self.out_dir = out_dir.resolve()  # the SM and the workers run in other directories
        self.progress = progress
        self.captures = captures or []
        self.state = ownership.RunState(ownership.new_run_id(), scenario=scen.name)
        self.run_dir = self.out_dir / "run"
        self.roce = scen.fabric.kind == "roce"
        self.rt: FabricRuntime | RoceRuntime = open_runtime(fabric_request(scen), self.state, self.run_dir,
                                                              queues=_queues(scen))
        self.metrics = metrics if isinstance(self.rt, FabricRuntime) else None
        if isinstance(self.rt, FabricRuntime):
            self.rt.sysfs = sysfs
        if metrics is not None and isinstance(self.rt, FabricRuntime):
            self.rt.metrics = metrics
            self.rt.metrics_extras.append(self._fidelity_metrics)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.outputs: list[FlowOutput] = []
        self.t0_ns = 0
        self.t_end_ns = 0
        self.t_done_ns = 0
        """When the flows were drained: the end of the window fidelity is judged on."""
        self.lag_threshold_us = scen.time.lag_threshold_us
        """The scenario's lag thresholds (None: the defaults; ``scenario.fidelity.threshold``)."""
        self.lag_threshold_real_us = scen.time.lag_threshold_real_us
        self.faults_injected: list[dict[str, Any]] = []
        self.interrupted = False
        self.failed = ""
        """Why the run stopped on its own (a process it needs exited): raised after the teardown."""
        self.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.capture_files: list[str] = []
        self.link_load: dict[str, Any] | None = None
        """The cables and the octets each carried (``ibemu.fabric.observe.cable_loads``)."""
        self.capture_stats: dict[str, CaptureStats] = {}
        """Each capture's files and frames when it stopped, by its file."""

    # ------------------------------------------------------------------ the run

    async def run(self) -> dict[str, Any]:
        """The whole run; SIGINT/SIGTERM end it early, torn down, with what was measured."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.run_dir.exists():  # a previous run's logs there must not mix with this one's
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True)
        lag_env = os.environ.get(lagmon.ENV_LOG)
        os.environ[lagmon.ENV_LOG] = str(self.run_dir / lagmon.LOG_NAME)  # for this run's processes
        try:
            return await self._run()
        finally:
            if lag_env is None:
                os.environ.pop(lagmon.ENV_LOG, None)
            else:
                os.environ[lagmon.ENV_LOG] = lag_env

    async def _run(self) -> dict[str, Any]:
        scen = self.scen
        t_start = time.perf_counter()
        for warning in scen.warnings:  # e.g. rates on the kernel datapath: one line each, before the build
            log.warning("%s", warning)
            self.progress("note", warning)
        self.progress("build", f"{scen.topology.name or scen.name}: {len(scen.topology.nodes)} nodes, "
                               f"{len(scen.topology.links)} links ("
                               + ("RoCEv2, IP routers" if self.roce else f"{scen.fabric.datapath} datapath") + ")")
        bringup: dict[str, Any] = {"fabric_s": None, "sm_s": None}
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                with trio.CancelScope() as work:
                    nursery.start_soon(self._interrupt_on, signals, work)
                    if isinstance(self.rt, RoceRuntime):  # no agent host: this process's own lag
                        nursery.start_soon(lagmon.watch_from_env, "runner")
                        async with self.rt.running() as fabric:
                            bringup = {"fabric_s": round(self.rt.timings_s.get("total", 0.0), 3),
                                       "sm_s": None if self.rt.sm_up_s is None else round(self.rt.sm_up_s, 3)}
                            self.progress("manager", f"fabric manager: routes programmed in "
                                                     f"{(self.rt.sm_up_s or 0.0) * 1e3:.1f} ms")
                            async with trio.open_nursery() as watch:  # not during the teardown
                                watch.start_soon(self._watch_roce, fabric, work)
                                await self._traffic_and_faults(fabric)
                                watch.cancel_scope.cancel()
                    else:
                        async with self.rt.running() as host:
                            bringup = {"fabric_s": round(sum(self.rt.timings_s.get(k, 0.0)
                                                             for k in ("build", "agents")), 3),
                                       "sm_s": None if self.rt.sm_up_s is None else round(self.rt.sm_up_s, 3)}
                            self.progress("sm", f"{scen.sm.impl} SM on {self.rt.sm_host}: SUBNET UP in "
                                                f"{bringup['sm_s']} s")
                            await self._traffic_and_faults(host)
                            self._record_loads(host)
                nursery.cancel_scope.cancel()
        self.progress("teardown", ("interrupted: " if self.interrupted else "")
                      + f"torn down; {time.perf_counter() - t_start:.1f} s in all")
        if self.failed:
            raise IbemuError(self.failed)
        return self._result(bringup, self.outputs, time.perf_counter() - t_start)

    async def _watch_roce(self, fabric: RoceRun, work: trio.CancelScope) -> None:
        """Stop the run when a process the RoCE fabric cannot do without (its user datapath,
        its fabric manager) exits: without it no frame moves, and the flows would wait for
        their ready and drain timeouts (a minute) before the run ended."""
        while True:
            for what, proc in (("the RoCE user datapath", fabric.userpath), ("the fabric manager", fabric.manager)):
                if proc is not None and proc.poll() is not None:
                    self.failed = f"{what} exited (status {proc.returncode}) during the run"
                    self.progress("error", f"{self.failed}: stopping")
                    work.cancel()
                    return
            await trio.sleep(clock.emulated_s(0.1))

    def _record_loads(self, host: AgentHost) -> None:
        """The cables and what each carried (the result's ``link_load``), read from the ports'
        counters before the fabric goes; a failure to read them costs only that field."""
        try:
            self.link_load = cable_loads(host, self.scen.topology)
        except Exception as exc:  # the figures the run measured matter more than this one
            log.warning("link loads not recorded: %s", exc)

    async def _interrupt_on(self, signals: Any, work: trio.CancelScope) -> None:
        async for sig in signals:
            self.interrupted = True
            self.progress("interrupt", f"{signal.Signals(sig).name}: stopping, keeping what was measured")
            work.cancel()
            return

    async def _traffic_and_faults(self, host: AgentHost | RoceRun) -> None:
        scen = self.scen
        spec = self._worker_spec(host)
        self.progress("warm-up", f"{len(scen.traffic)} flows on {len(spec['hosts'])} hosts, "
                                 f"{len(scen.faults)} faults, {scen.duration_s:g} s")
        injector: FaultInjector | RoceFaultInjector
        if isinstance(host, RoceRun):
            injector = RoceFaultInjector(host, self.run_dir / "faults.jsonl")
        else:
            injector = FaultInjector(host, lambda name: make_agent(self.rt.plan, scen.topology.node(name)),
                                     sm_power=self.rt.sm_power if isinstance(self.rt, FabricRuntime) else None)
        finished = False
        try:
            for i, flow in enumerate(spec["flows"]):
                self._start_worker(i, {**spec, "flows": [flow],
                                       "hosts": {h: spec["hosts"][h] for h in flow["hosts"]},
                                       "qpns": [QPN_BASE + i * QPNS_PER_FLOW, QPN_BASE + (i + 1) * QPNS_PER_FLOW],
                                       "timestamps": TRAFFIC_KINDS[flow["kind"]].timestamps,
                                       "ready": str(self.run_dir / f"ready-{i}"), "go": str(self._go_path)})
            await self._wait_ready()
            # Time zero once every worker has its ports open: on a busy machine starting the
            # workers takes seconds, and a flow that starts after a fault has no blackout.
            # (real seconds: the workers' start-up is this machine's time, not the fabric's)
            self.t0_ns = clock.now_ns() + int(clock.emulated_s(WARMUP_S) * 1e9)
            tmp = self._go_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"t0_ns": self.t0_ns}))
            tmp.replace(self._go_path)
            async with trio.open_nursery() as nursery:
                for node, port in self.capture_ends:
                    await nursery.start(self._capture, node, port)
                # The flows' time zero on trio's clock, for the fault schedule.
                t0_trio = trio.current_time() + (self.t0_ns - clock.now_ns()) / 1e9
                await nursery.start(functools.partial(injector.serve, list(scen.faults), t0=t0_trio))
                await trio.sleep_until(t0_trio)
                self.progress("traffic", "flows started" + (", faults scheduled" if scen.faults else ""))
                await trio.sleep_until(t0_trio + scen.duration_s)
                self.t_end_ns = clock.now_ns()
                self.progress("drain", "waiting for the flows to finish")
                await self._wait_workers()
                nursery.cancel_scope.cancel()
            finished = True
        finally:
            self.t_end_ns = self.t_end_ns or clock.now_ns()
            self.faults_injected = list(injector.injected)
            with trio.CancelScope(shield=True):
                if not finished:  # interrupted or failed: the workers write what they have
                    await self._wait_workers(signal_first=True)
            self.t_done_ns = clock.now_ns()
            self.outputs = self._read_workers()

    def _fidelity_metrics(self) -> list[Metric]:
        """The run's fidelity so far, judged as the result will be (from the flows' time zero)."""
        # no figure yet: the real-time rule alone (the result's verdict may be bounded by its figures)
        fid = fidelity(read_events(self.run_dir / lagmon.LOG_NAME), dilation=clock.dilation(),
                       threshold_us=self.lag_threshold_us, threshold_real_us=self.lag_threshold_real_us,
                       lo_ns=self.t0_ns or None)
        out: list[Metric] = [GaugeMetricFamily("ibemu_fidelity_valid", "1 when every process (and link) kept up "
                                               "with the emulated clock so far", value=int(bool(fid["valid"])))]
        if fid["worst_lag_us"] is not None:
            out.append(GaugeMetricFamily("ibemu_fidelity_worst_lag_seconds", "The highest p99 lag of any process",
                                         value=fid["worst_lag_us"] / 1e6))
        return out

    @property
    def _go_path(self) -> Path:
        return self.run_dir / "go.json"

    def _start_worker(self, index: int, spec: dict[str, Any]) -> None:
        spec_path = self.run_dir / f"traffic-{index}.json"
        spec_path.write_text(json.dumps(spec))
        with open(self.run_dir / f"traffic-{index}.log", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ibemu.traffic.worker", str(spec_path),
                 str(self.run_dir / f"flows-{index}.json")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=clock.child_env())
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, TRAFFIC_NICE)
        except OSError as exc:  # it already exited: its failure is read later
            log.debug("traffic worker %d: setpriority: %s", proc.pid, exc)
        if isinstance(self.rt, FabricRuntime):  # off the agents' CPU (ibemu.kernel.cpus)
            cpus.pin_process(proc.pid, self.rt.placement.others)
        self.workers.append(proc)
        self.state.claim_process(proc.pid, f"traffic-worker-{index}")

    async def _wait_ready(self) -> None:
        """Until every worker has its ports open (or exited: its failure is read later)."""
        deadline = trio.current_time() + clock.emulated_s(READY_TIMEOUT_S)  # real seconds, as the polls
        while trio.current_time() < deadline:
            if all(p.poll() is not None or (self.run_dir / f"ready-{i}").exists()
                   for i, p in enumerate(self.workers)):
                return
            await trio.sleep(clock.emulated_s(0.02))
        log.warning("traffic workers not ready after %.0f s: starting anyway", READY_TIMEOUT_S)

    def _worker_spec(self, host: AgentHost | RoceRun) -> dict[str, Any]:
        scen = self.scen
        names = sorted({h for t in scen.traffic for h in t.hosts})
        extra: dict[str, Any] = {}
        if isinstance(host, RoceRun):  # LIDs from the address plan; each host's address too
            addrs = host.fab.addrs
            hosts = {name: dataclasses.replace(host_address(self.rt.plan, name, addrs.lid(name)),
                                               ip=addrs.host_ip(name)).to_json() for name in names}
            extra["roce"] = {"lid_ips": addrs.lid_ips()}
            # the user datapath's hosts: their cable's rate in the link model (one for all: the first's)
            line = host.fab.host_gbps(names[0]) if scen.fabric.roce_user and names else scen.fabric.ecn_line_gbps
            if scen.fabric.ecn:  # the hosts answer CE with CNPs and react with DCQCN
                extra["roce"]["dcqcn"] = {"line_gbps": line}
            if scen.fabric.roce_user and scen.fabric.pfc:  # the hosts honour their first hop's pauses
                data_prio = dict(scen.fabric.dscp_priority).get(DATA_DSCP, DATA_DSCP >> 3)
                extra["roce"]["pfc"] = {"line_gbps": line, "priority": data_prio}
        else:
            hosts = {name: host_address(self.rt.plan, name, host.nodes[name].agent.lid(1)).to_json()  # type: ignore[attr-defined]
                     for name in names}
        mtu = scen.defaults.mtu or 4096
        if self.metrics is not None:  # the workers keep a live watch of their frames for it
            extra["live"] = True
        return {"hosts": hosts, "mtu": mtu,
                "flows": [flow_dict(t, scen) for t in scen.traffic], **extra}

    async def _capture(self, node: str, port: int, *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        plan = self.rt.plan.nodes[node]
        path = self.out_dir / f"capture-{node}-{port}.pcap"
        if isinstance(self.rt, FabricRuntime) and self.rt.host is not None:
            self.rt.host.keep_on_wire(node, port)  # every SMP relayed over it crosses it as a frame
        self.capture_files.append(str(path))
        b = self.capture_bounds
        # a RoCE fabric's cables carry Ethernet frames (RoCEv2 in IPv4/UDP): kept whole, not
        # filtered down to native IB's 0x88B5
        await capture(plan.ns, plan.ports[port].ifname, path, kind="eth" if self.roce else "ib",
                      snaplen=b.snaplen, limit_bytes=b.limit_bytes, files=b.files,
                      on_stats=lambda st: self.capture_stats.__setitem__(str(path), st), task_status=task_status)

    async def _wait_workers(self, *, signal_first: bool = False) -> None:
        if signal_first:
            self._signal_workers()
        # the drain is the fabric's time (retransmissions, the last packets), bounded in real
        # time too; the polls and the grace after a signal are real time at any dilation
        t_drain = trio.current_time()
        deadline = t_drain + (clock.emulated_s(5.0) if signal_first
                                          else min(DRAIN_S, clock.emulated_s(DRAIN_S * 4)))
        await self._until_exited(deadline)
        if not signal_first and self._signal_workers(f"still running {deadline - t_drain:.0f} s after the flows' end"):
            # told to stop, they write what they measured (their flows marked interrupted)
            # rather than nothing
            await self._until_exited(trio.current_time() + clock.emulated_s(5.0))
        for proc in self.workers:
            if proc.poll() is None:
                log.warning("traffic worker %d still running: killing it", proc.pid)
                proc.kill()
                await trio.to_thread.run_sync(proc.wait)

    def _signal_workers(self, why: str = "") -> bool:
        """SIGTERM to every worker still running (``why``: logged); whether there was one."""
        running = [p for p in self.workers if p.poll() is None]
        for proc in running:
            if why:
                log.warning("traffic worker %d %s: stopping it", proc.pid, why)
            proc.send_signal(signal.SIGTERM)
        return bool(running)

    async def _until_exited(self, deadline: float) -> None:
        while any(p.poll() is None for p in self.workers) and trio.current_time() < deadline:
            await trio.sleep(clock.emulated_s(0.05))

    def _read_workers(self) -> list[FlowOutput]:
        outputs: list[FlowOutput] = []
        for i, proc in enumerate(self.workers):
            path = self.run_dir / f"flows-{i}.json"
            if not path.exists():
                t = self.scen.traffic[i]
                why = f"traffic worker failed (exit {proc.poll()}); see {self.run_dir / f'traffic-{i}.log'}"
                log.error("flow %s: %s", t.name, why)
                outputs.append(FlowOutput(t.name, t.kind, t.src or list(t.hosts), t.dst or list(t.hosts),
                                          error=why))
                continue
            data = json.loads(path.read_text())
            flows = [FlowOutput.from_dict(d) for d in data["flows"]]
            keys = ["ce_received", "cnp_sent", "cnp_received", "tx_paced"] if self.scen.fabric.ecn else []
            if self.scen.fabric.roce_user and self.scen.fabric.pfc:
                keys += ["pfc_pause_received", "pfc_held", "pfc_paused_us"]
            if keys:  # congestion control, counted by the flow's ports
                for key in keys:
                    total = sum(int(c.get(f"roce_{key}", 0)) for c in data.get("ports", {}).values())
                    for o in flows:
                        o.extra[key] = total
            outputs.extend(flows)
        return outputs

    # ------------------------------------------------------------------ the result

    def _sm_clock(self) -> dict[str, str]:
        """The SM's clock in the result, on a dilated run: ``emulated`` (ibemu's SM reads
        ``ibemu.clock``), ``libfaketime`` (OpenSM on the run's clock) or ``real`` (OpenSM that
        was not: never on a run that completed)."""
        if clock.dilation() == 1 or self.scen.sm.impl == "none":
            return {}
        if self.scen.sm.impl == "opensm":
            return {"clock": opensm.clock_name(self.run_dir / "opensm")}
        return {"clock": "emulated"}

    def _result(self, bringup: dict[str, Any], outputs: list[FlowOutput], wall_s: float) -> dict[str, Any]:
        scen = self.scen
        topo = scen.topology
        if self.roce:  # the fabric manager's log has the carrier changes and its reroutes
            fabric_events = sm_events = read_events(self.run_dir / "fm.jsonl")
        else:
            fabric_events = read_events(self.run_dir / "events.jsonl")
            sm_events = read_events(self.run_dir / scen.sm.impl / "events.jsonl")
            if scen.sm.standby is not None:  # the standby's: its polls, takeover, and what it did as master
                sm_events = sorted([*sm_events, *read_events(self.run_dir / f"{scen.sm.standby.impl}-standby"
                                                             / "events.jsonl")],
                                   key=lambda r: r["t_ns"] if isinstance(r.get("t_ns"), int) else 0)
        t_end = self.t_end_ns or clock.now_ns()
        order = {t.name: i for i, t in enumerate(scen.traffic)}
        outputs.sort(key=lambda o: order.get(o.name, 1 << 30))
        if isinstance(self.rt, RoceRuntime) and self.rt.counters:  # the user datapath's routers, in all
            totals = self.rt.counters.get("totals", {})
            for o in outputs:
                o.extra.update({f"router_{k}": int(totals.get(k, 0)) for k in ROUTER_COUNTERS})
        fault_records = sorted(self.faults_injected, key=lambda f: f["t_ns"])
        faults = []
        last_event = max((r["t_ns"] for r in (*fabric_events, *sm_events) if isinstance(r.get("t_ns"), int)),
                         default=t_end)
        for i, f in enumerate(fault_records):
            t_f = int(f["t_ns"])
            # The fabric settles after the traffic stopped too: phases look up to the next fault.
            window_end = int(fault_records[i + 1]["t_ns"]) if i + 1 < len(fault_records) else last_event + 1
            faults.append({
                "at_s": round((t_f - self.t0_ns) / 1e9, 3), "action": f["action"], "target": f["target"],
                "t_fault_s": round((t_f - self.t0_ns) / 1e9, 6),
                "phases_ms": fault_phases(t_f, window_end, fabric_events, sm_events),
                "flows": [flow_impact(o, t_f, window_end, t_end) for o in outputs if o.t_ns],
            })
        # Interrupted before the flows' time zero (warm-up): no timeline, rather than one from
        # the clock's epoch (hours of 0.1 s bins, and a minute of CPU before the exit).
        traffic = [traffic_entry(o, self.t0_ns or t_end, t_end, TIMELINE_BIN_S) for o in outputs]
        # Judged where the figures are measured: from the flows' time zero to the drain's end.
        # The threshold is bounded by the run's smallest time figure (``fidelity.figure_scale``).
        fid = fidelity(read_events(self.run_dir / lagmon.LOG_NAME), dilation=clock.dilation(),
                       threshold_us=self.lag_threshold_us, threshold_real_us=self.lag_threshold_real_us,
                       figure=figure_scale(traffic), lo_ns=self.t0_ns or None, hi_ns=self.t_done_ns or None)
        return {
            "schema": "ibemu.run/3",
            "scenario": {"name": scen.name, "file": str(scen.path) if scen.path else None,
                         "description": scen.description or None},
            "started_at": self.started_at,
            "duration_s": round(wall_s, 3),
            "interrupted": self.interrupted,
            "fabric": {"kind": scen.fabric.kind, "datapath": scen.fabric.datapath,
                       "nodes": len(topo.nodes), "switches": len(topo.switches()),
                       "hosts": len(topo.cas()), "links": len(topo.links),
                       "topology": _describe_topology(scen),
                       **({"dilation": clock.dilation()} if clock.dilation() != 1 else {})},
            "sm": ({"impl": "none", "engine": None, "host": None} if self.roce  # the fabric manager instead
                   else {"impl": scen.sm.impl, "engine": scen.sm.engine, "host": self.rt.sm_host or None,
                         **self._sm_clock()}),
            "bringup": bringup,
            "faults": faults,
            "traffic": traffic,
            "fidelity": fid,
            "files": {"events": str(self.run_dir / ("fm.jsonl" if self.roce else "events.jsonl")), "json": None,
                      "plots": [],
                      "captures": self.capture_files,
                      **({"capture_stats": [self.capture_stats[f].to_dict() for f in self.capture_files
                                            if f in self.capture_stats]} if self.capture_files else {})},
            **({"link_load": self.link_load} if self.link_load is not None else {}),
            **({"credit_loops": credit_loops(fabric_events, self.t0_ns)}
               if not self.roce and scen.fabric.datapath == "user" else {}),
        }


def credit_loops(events: list[dict[str, Any]], t0_ns: int) -> list[dict[str, Any]]:
    """The result's ``credit_loops``: the IB user datapath's ``credit_loop`` events (its link
    model's deadlock detection, ``fabric.linkplane``), seconds since traffic start."""
    return [{"t_s": round((int(e["t_ns"]) - t0_ns) / 1e9, 6),
             "hops": [{"switch": str(h["switch"]), "port": int(h["port"]), "vl": int(h["vl"])} for h in e["hops"]],
             "stalled_us": float(e.get("stalled_us", 0))}
            for e in events if e.get("kind") == "credit_loop" and isinstance(e.get("t_ns"), int)]


def _describe_topology(scen: Scenario) -> str:
    spec = scen.topology_spec
    if spec.source == "generator":
        params = ",".join(f"{k}={v}" for k, v in spec.params.items())
        return f"{spec.generator}{',' + params if params else ''}"
    if spec.source == "file":
        return str(spec.file)
    return "explicit"
