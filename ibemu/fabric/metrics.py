"""A Prometheus endpoint on a live fabric: every port's PMA counters, port states, and ibemu's own.

``ibemu up|run --metrics [ADDR:]PORT`` serves ``http://ADDR:PORT/metrics`` from the process
that holds the agents (the fabric daemon, or ``ibemu run``'s own), through prometheus_client's
HTTP server thread and one custom collector (``FabricCollector``) that reads the fabric at
scrape time: the agents' state is copied on their own trio thread
(``trio.from_thread.run_sync``; the agents are not thread-safe), after the kernel-carried
ports' counters are brought up to date as a PMA query would (``sysfs.refresh_link_counters``).
It serves read-only data: the handler answers GETs of the registry and nothing reaches the
fabric.

Port counters follow treydock/infiniband_exporter's names and labels (it runs
``perfquery -l -x`` per node): ``infiniband_switch_port_*`` for switch ports and
``infiniband_hca_port_*`` for CA ports, labels ``guid`` (the node GUID, "0x%016x") and
``port``; data counters in bytes (PortXmitData/PortRcvData words x 4, as that exporter
reports them); ``infiniband_{switch,hca}_info{guid,switch|hca,lid}``,
``infiniband_{switch,hca}_rate_bytes_per_second{guid}`` and
``infiniband_{switch,hca}_uplink_info{guid,port,switch|hca,uplink,uplink_guid,uplink_type,
uplink_port,uplink_lid}`` carry names and neighbours (join on guid and port).

ibemu's own (``ibemu_*``), read from the run's event logs (``ibemu.events``), incrementally:
port state and physical state per port; faults injected (by action), carrier changes, local
failovers; the SM's sweeps (by reason; the last one's seconds), traps, reroutes, SUBNET UP;
the phases of the last ``LAST_REROUTES`` reroutes (``ibemu_reroute_phase_seconds``: each of
the SM's reroute stamps, and the first carrier change, counted from the last fault before the
reroute, or from its trap when no fault precedes it); the clock's dilation and each
monitored process's lag (``ibemu_lag_*``, where the run has a lag log: ``ibemu run``); and,
under ``ibemu run``, each flow's live blackout from its traffic worker's watch
(``flows-N.live.json``, ``ibemu.traffic.blackout.LiveGaps``): frames received, the longest
silence between two of them so far (``ibemu_flow_longest_gap_seconds``) and the silence
still open (``ibemu_flow_silence_seconds``). A caller adds what its layer knows with
``extras`` (``ibemu run``: fidelity's verdict).

Deviations: the exporter's ``collect_errors``/``collect_timeouts`` and PortRcvErrorDetails
(``-E``) metrics are absent (nothing here times out). The live blackout is the longest gap
between any frames the flow's worker received (data, and ACKs at a sender), written every
0.25 s; the result's per-fault blackout (``traffic.blackout.analyse``, against the flow's
own pace around each fault) is computed at the end of the run and stays in the result.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from ibemu import clock
from ibemu.errors import ConfigError, IbemuError
from ibemu.events import Kind, LogTail
from ibemu.fabric.sysfs import CHUNK, rate_gbps, refresh_link_counters

if TYPE_CHECKING:
    from ibemu.fabric.agenthost import AgentHost

log = logging.getLogger(__name__)

DEFAULT_ADDR = "127.0.0.1"
LAST_REROUTES = 3
SCRAPE_TIMEOUT_S = 10.0
Extra = Callable[[], Iterable[Metric]]

# (treydock suffix, help name, PortCounters attribute or a function of the snapshot)
PORT_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("transmit_data_bytes", "PortXmitData", "xmit_data"),
    ("receive_data_bytes", "PortRcvData", "rcv_data"),
    ("transmit_packets", "PortXmitPkts", "xmit_pkts"),
    ("receive_packets", "PortRcvPkts", "rcv_pkts"),
    ("unicast_transmit_packets", "PortUnicastXmitPkts", "unicast_xmit"),
    ("unicast_receive_packets", "PortUnicastRcvPkts", "unicast_rcv"),
    ("multicast_transmit_packets", "PortMulticastXmitPkts", "multicast_xmit_pkts"),
    ("multicast_receive_packets", "PortMulticastRcvPkts", "multicast_rcv_pkts"),
    ("symbol_error", "SymbolErrorCounter", "symbol_error_counter"),
    ("link_error_recovery", "LinkErrorRecoveryCounter", "link_error_recovery_counter"),
    ("link_downed", "LinkDownedCounter", "link_downed_counter"),
    ("receive_errors", "PortRcvErrors", "port_rcv_errors"),
    ("receive_remote_physical_errors", "PortRcvRemotePhysicalErrors", "port_rcv_remote_physical_errors"),
    ("receive_switch_relay_errors", "PortRcvSwitchRelayErrors", "port_rcv_switch_relay_errors"),
    ("transmit_discards", "PortXmitDiscards", "port_xmit_discards"),
    ("transmit_constraint_errors", "PortXmitConstraintErrors", "port_xmit_constraint_errors"),
    ("receive_constraint_errors", "PortRcvConstraintErrors", "port_rcv_constraint_errors"),
    ("local_link_integrity_errors", "LocalLinkIntegrityErrors", "local_link_integrity_errors"),
    ("excessive_buffer_overrun_errors", "ExcessiveBufferOverrunErrors", "excessive_buffer_overrun_errors"),
    ("vl15_dropped", "VL15Dropped", "vl15_dropped"),
    ("transmit_wait", "PortXmitWait", "port_xmit_wait"),
    ("qp1_dropped", "QP1Dropped", "qp1_dropped"),
)


# ------------------------------------------------------------------ the --metrics value

def parse_listen(text: str, *, public: bool = False, where: str = "--metrics") -> tuple[str, int]:
    """``[ADDR:]PORT`` -> (address, port); ADDR an IP address (IPv6 in brackets) or
    ``localhost``, 127.0.0.1 when omitted; one that is not loopback only with ``public``."""
    raw = text.strip()
    addr, sep, port_text = raw.rpartition(":")
    if not sep:
        addr, port_text = "", raw
    if addr.startswith("[") and addr.endswith("]"):
        addr = addr[1:-1]
    elif ":" in addr:
        raise ConfigError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:9400", where)
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{text!r}: expected [ADDR:]PORT, e.g. 9400 or 127.0.0.1:9400", where) from None
    if not 1 <= port <= 65535:
        raise ConfigError(f"{text!r}: the port must be 1 to 65535", where)
    addr = addr or DEFAULT_ADDR
    if addr == "localhost":
        addr = DEFAULT_ADDR
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        raise ConfigError(f"{text!r}: {addr!r} is not an IP address", where) from None
    if not ip.is_loopback and not public:
        raise ConfigError(f"{text!r}: {addr} is not a local address; the endpoint shows the whole fabric, "
                          "pass --metrics-public to serve it there", where)
    return str(ip), port


def check_free(addr: str, port: int, where: str = "--metrics") -> None:
    """ConfigError unless ``addr:port`` can be bound now (said before anything is built)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as exc:
            raise ConfigError(f"{addr}:{port}: cannot listen there ({exc.strerror or exc})", where) from None


def listen_text(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


# ------------------------------------------------------------------ the fabric at scrape time

@dataclass(frozen=True)
class PortRow:
    """One port as a scrape sees it."""

    kind: str  # "switch" | "hca"
    node: str
    guid: int
    desc: str
    lid: int
    port: int
    state: int
    phys: int
    counters: dict[str, int]
    remote_guid: int | None = None
    remote_port: int | None = None
    remote_desc: str = ""
    remote_type: str = ""
    remote_lid: int = 0


@dataclass(frozen=True)
class Snapshot:
    ports: list[PortRow]
    rates_gbps: dict[int, float] = field(default_factory=dict)
    """Node GUID -> its first cabled port's rate."""


def _lid_of(agent: Any) -> int:
    p = agent.ports.get(0) if agent.IS_SWITCH else agent.ports.get(1)
    return int(p.lid) if p is not None else 0


async def snapshot(host: AgentHost) -> Snapshot:
    """Every cabled port of every node, read now (on the agents' thread; a checkpoint every
    ``sysfs.CHUNK`` nodes, whose kernel-carried counters are refreshed first)."""
    rows: list[PortRow] = []
    rates: dict[int, float] = {}
    nodes = list(host.nodes.items())
    for i, (name, rt) in enumerate(nodes):
        if i % CHUNK == 0:
            await trio.lowlevel.checkpoint()
            refresh_link_counters(host, [n for n, _rt in nodes[i:i + CHUNK]])
        agent: Any = rt.agent
        if not hasattr(agent, "ports"):
            continue
        kind = "switch" if agent.IS_SWITCH else "hca"
        lid = _lid_of(agent)
        for num, pp in sorted(rt.plan.ports.items()):
            p = agent.ports.get(num)
            if p is None:
                continue
            rates.setdefault(agent.node_guid, rate_gbps(p.width, p.speed))
            pc = p.counters.snapshot()
            pc["xmit_data"] = pc["xmit_octets"] // 4 * 4  # the PMA's words, in bytes
            pc["rcv_data"] = pc["rcv_octets"] // 4 * 4
            pc["unicast_xmit"] = pc["xmit_pkts"] - pc["multicast_xmit_pkts"]
            pc["unicast_rcv"] = pc["rcv_pkts"] - pc["multicast_rcv_pkts"]
            peer = host.nodes.get(pp.peer_node)
            peer_agent: Any = peer.agent if peer is not None else None
            rows.append(PortRow(
                kind, name, agent.node_guid, agent.description, lid, num, int(p.state), int(p.phys), pc,
                remote_guid=getattr(peer_agent, "node_guid", None), remote_port=pp.peer_port,
                remote_desc=getattr(peer_agent, "description", pp.peer_node),
                remote_type=("SW" if peer_agent.IS_SWITCH else "CA") if peer_agent is not None else "",
                remote_lid=_lid_of(peer_agent) if peer_agent is not None else 0))
    return Snapshot(rows, rates)


def guid_label(guid: int | None) -> str:
    return "" if guid is None else f"0x{guid:016x}"


def port_families(snap: Snapshot) -> Iterator[Metric]:
    """The treydock/infiniband_exporter families of ``snap``, and ibemu's port states."""
    for kind, what in (("switch", "switch"), ("hca", "HCA")):
        rows = [r for r in snap.ports if r.kind == kind]
        for suffix, help_name, attr in PORT_COUNTERS:
            fam = CounterMetricFamily(f"infiniband_{kind}_port_{suffix}", f"Infiniband {what} port {help_name}",
                                      labels=["guid", "port"])
            for r in rows:
                fam.add_metric([guid_label(r.guid), str(r.port)], r.counters[attr])
            yield fam
        rate = GaugeMetricFamily(f"infiniband_{kind}_rate_bytes_per_second", f"Infiniband {what} rate",
                                 labels=["guid"])
        info = GaugeMetricFamily(f"infiniband_{kind}_info", f"Infiniband {what} information",
                                 labels=["guid", kind, "lid"])
        uplink = GaugeMetricFamily(f"infiniband_{kind}_uplink_info", f"Infiniband {what} uplink information",
                                   labels=["guid", "port", kind, "uplink", "uplink_guid", "uplink_type",
                                           "uplink_port", "uplink_lid"])
        seen: set[int] = set()
        for r in rows:
            if r.guid not in seen:
                seen.add(r.guid)
                rate.add_metric([guid_label(r.guid)], snap.rates_gbps.get(r.guid, 0.0) * 1e9 / 8)
                info.add_metric([guid_label(r.guid), r.desc, str(r.lid)], 1)
            if r.remote_guid is not None:
                uplink.add_metric([guid_label(r.guid), str(r.port), r.desc, r.remote_desc,
                                   guid_label(r.remote_guid), r.remote_type, str(r.remote_port),
                                   str(r.remote_lid)], 1)
        yield from (rate, info, uplink)
    state = GaugeMetricFamily("ibemu_port_state", "Logical PortState (1 Down .. 4 Active)",
                              labels=["node", "guid", "port"])
    phys = GaugeMetricFamily("ibemu_port_phys_state", "PortPhysicalState (2 Polling, 3 Disabled, 5 LinkUp)",
                             labels=["node", "guid", "port"])
    for r in snap.ports:
        state.add_metric([r.node, guid_label(r.guid), str(r.port)], r.state)
        phys.add_metric([r.node, guid_label(r.guid), str(r.port)], r.phys)
    yield state
    yield phys


# ------------------------------------------------------------------ the run's event logs

@dataclass
class RunEvents:
    """What ibemu's metrics need of a run's logs, folded in as the logs grow."""

    run_dir: Path
    faults: Counter[str] = field(default_factory=Counter)
    fault_times: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    carrier_times: deque[int] = field(default_factory=lambda: deque(maxlen=256))
    carriers: int = 0
    local_failovers: int = 0
    sweeps: Counter[str] = field(default_factory=Counter)
    last_sweep_s: float | None = None
    traps: int = 0
    reroutes: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=LAST_REROUTES))
    reroute_count: int = 0
    subnet_up_s: float | None = None
    lag: dict[str, dict[str, float]] = field(default_factory=dict)
    flows: dict[str, dict[str, int]] = field(default_factory=dict)
    """Flow name -> the live watch of its traffic worker (``flows-N.live.json``, ``ibemu run``)."""
    _tails: dict[str, LogTail] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _tail(self, rel: str) -> LogTail:
        if rel not in self._tails:
            self._tails[rel] = LogTail(self.run_dir / rel)
        return self._tails[rel]

    def update(self) -> None:
        with self._lock:
            for rec in self._tail("events.jsonl").new():
                self._fabric(rec)
            for sm in ("ibemu", "opensm"):
                for rec in self._tail(f"{sm}/events.jsonl").new():
                    self._sm(rec)
            for live in sorted(self.run_dir.glob("flows-*.live.json")):
                try:
                    watch = json.loads(live.read_text())
                except (OSError, ValueError):  # being replaced, or gone with the run
                    continue
                for name in watch.get("flows") or ():
                    self.flows[str(name)] = {k: int(v) for k, v in watch.items()
                                             if k != "flows" and isinstance(v, int)}
            for rec in self._tail("lag.jsonl").new():
                if rec.get("kind") == Kind.LAG and isinstance(rec.get("process"), str):
                    worst = self.lag.setdefault(rec["process"], {"max_us": 0.0, "p99_us": 0.0})
                    worst["max_us"] = max(worst["max_us"], float(rec.get("max_us") or 0.0))
                    worst["p99_us"] = float(rec.get("p99_us") or 0.0)

    def _fabric(self, rec: dict[str, Any]) -> None:
        kind, t = rec.get("kind"), rec.get("t_ns")
        if kind == Kind.FAULT:
            self.faults[str(rec.get("action", "?"))] += 1
            if isinstance(t, int):
                self.fault_times.append(t)
        elif kind == Kind.CARRIER:
            self.carriers += 1
            if isinstance(t, int):
                self.carrier_times.append(t)
        elif kind == Kind.LOCAL_FAILOVER:
            self.local_failovers += 1

    def _sm(self, rec: dict[str, Any]) -> None:
        kind = rec.get("kind")
        if kind == Kind.SWEEP_END:
            self.sweeps[str(rec.get("reason", "?"))] += 1
            if isinstance(rec.get("seconds"), int | float):
                self.last_sweep_s = float(rec["seconds"])
        elif kind == Kind.TRAP:
            self.traps += 1
        elif kind == Kind.REROUTE:
            self.reroute_count += 1
            self.reroutes.append(rec)
        elif kind == Kind.SUBNET_UP and isinstance(rec.get("seconds"), int | float):
            self.subnet_up_s = float(rec["seconds"])

    def reroute_phases(self) -> list[tuple[str, str, dict[str, float]]]:
        """The last reroutes, newest first: (index, origin "fault"|"trap", phase -> seconds)."""
        out = []
        for i, rec in enumerate(reversed(self.reroutes)):
            t_trap = rec.get("t_trap") if isinstance(rec.get("t_trap"), int) else rec.get("t_ns")
            if not isinstance(t_trap, int):
                continue
            faults = [t for t in self.fault_times if t <= t_trap]
            origin, t0 = ("fault", max(faults)) if faults else ("trap", t_trap)
            phases: dict[str, float] = {}
            detect = min((t for t in self.carrier_times if t0 <= t <= t_trap), default=None)
            if origin == "fault" and detect is not None:
                phases["detect"] = (detect - t0) / 1e9
            for key in ("t_trap", "t_rediscovered", "t_route_start", "t_routed", "t_planned", "t_programmed"):
                if isinstance(rec.get(key), int):
                    phases[key[2:]] = (rec[key] - t0) / 1e9
            out.append((str(i), origin, phases))
        return out

    def families(self) -> Iterator[Metric]:
        with self._lock:
            faults = CounterMetricFamily("ibemu_faults", "Faults injected (scheduled or on demand)",
                                         labels=["action"])
            for action, n in sorted(self.faults.items()):
                faults.add_metric([action], n)
            yield faults
            yield CounterMetricFamily("ibemu_carrier_changes", "Cable ends that lost or regained carrier",
                                      value=self.carriers)
            yield CounterMetricFamily("ibemu_local_failovers", "Switch ports whose LIDs the kernel moved to "
                                      "their alternates", value=self.local_failovers)
            sweeps = CounterMetricFamily("ibemu_sm_sweeps", "SM sweeps ended", labels=["reason"])
            for reason, n in sorted(self.sweeps.items()):
                sweeps.add_metric([reason], n)
            yield sweeps
            if self.last_sweep_s is not None:
                yield GaugeMetricFamily("ibemu_sm_last_sweep_seconds", "How long the SM's last sweep took",
                                        value=self.last_sweep_s)
            if self.subnet_up_s is not None:
                yield GaugeMetricFamily("ibemu_sm_subnet_up_seconds", "The SM's cold sweep to SUBNET UP",
                                        value=self.subnet_up_s)
            yield CounterMetricFamily("ibemu_sm_traps", "Traps the SM received", value=self.traps)
            yield CounterMetricFamily("ibemu_sm_reroutes", "Reroutes by the SM", value=self.reroute_count)
            phases = GaugeMetricFamily(
                "ibemu_reroute_phase_seconds",
                "Phases of the last reroutes (reroute 0 = the latest), from the fault before it (else its trap)",
                labels=["reroute", "origin", "phase"])
            for index, origin, ph in self.reroute_phases():
                for phase, s in ph.items():
                    phases.add_metric([index, origin, phase], s)
            yield phases
            if self.flows:
                frames = CounterMetricFamily("ibemu_flow_frames_received", "Frames the ports of a flow's "
                                             "traffic worker received since the flows' time zero", labels=["flow"])
                gap = GaugeMetricFamily("ibemu_flow_longest_gap_seconds", "A flow's longest silence between two "
                                        "received frames so far: its blackout, live", labels=["flow"])
                silence = GaugeMetricFamily("ibemu_flow_silence_seconds", "Since a flow last received a frame "
                                            "(when last written: a blackout still open grows)", labels=["flow"])
                for name, w in sorted(self.flows.items()):
                    frames.add_metric([name], w.get("frames", 0))
                    gap.add_metric([name], w.get("longest_gap_ns", 0) / 1e9)
                    silence.add_metric([name], w.get("silence_ns", 0) / 1e9)
                yield frames
                yield gap
                yield silence
            yield GaugeMetricFamily("ibemu_dilation", "The clock's dilation factor N: real seconds per "
                                    "emulated second (1: real time)", value=clock.dilation())
            if self.lag:
                worst = GaugeMetricFamily("ibemu_lag_worst_seconds", "A process's worst lag behind the "
                                          "emulated clock so far", labels=["process"])
                p99 = GaugeMetricFamily("ibemu_lag_p99_seconds", "A process's p99 lag over its last interval",
                                        labels=["process"])
                for proc, v in sorted(self.lag.items()):
                    worst.add_metric([proc], v["max_us"] / 1e6)
                    p99.add_metric([proc], v["p99_us"] / 1e6)
                yield worst
                yield p99


# ------------------------------------------------------------------ the collector and server

class FabricCollector(Collector):
    """Reads the fabric (``read``: a ``Snapshot``, None while it is not up) and the run's logs
    at each scrape."""

    def __init__(self, read: Callable[[], Snapshot | None], run_dir: Path | None,
                 extras: Iterable[Extra] = ()) -> None:
        self.read = read
        self.events = RunEvents(run_dir) if run_dir is not None else None
        self.extras = list(extras)

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        snap = self.read()
        if snap is not None:
            yield from port_families(snap)
        if self.events is not None:
            self.events.update()
            yield from self.events.families()
        for extra in self.extras:
            try:
                yield from extra()
            except Exception as exc:  # one source failing must not lose the scrape
                log.warning("metrics source %s failed: %s", getattr(extra, "__name__", extra), exc)
        yield GaugeMetricFamily("ibemu_scrape_duration_seconds", "This scrape so far: the fabric read and "
                                "the exposition of every family before this one", value=time.perf_counter() - t0)


class MetricsServer:
    """prometheus_client's HTTP server on ``addr:port`` with one ``FabricCollector``."""

    def __init__(self, addr: str, port: int, collector: FabricCollector) -> None:
        self.addr, self.port = addr, port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        try:
            self._httpd, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise IbemuError(f"--metrics {listen_text(addr, port)}: cannot listen there "
                             f"({exc.strerror or exc})") from None
        log.info("metrics on http://%s/metrics", listen_text(addr, port))

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


@contextlib.asynccontextmanager
async def serve(listen: tuple[str, int] | None, host: Callable[[], AgentHost | None], run_dir: Path | None,
                extras: Iterable[Extra] = ()) -> AsyncIterator[MetricsServer | None]:
    """Serve metrics while the context is open (nothing when ``listen`` is None). ``host``:
    the agent host once it serves, else None; it is read on this trio thread."""
    if listen is None:
        yield None
        return
    token = trio.lowlevel.current_trio_token()

    async def on_loop() -> Snapshot | None:
        h = host()
        return await snapshot(h) if h is not None else None

    def read() -> Snapshot | None:
        try:
            return trio.from_thread.run(on_loop, trio_token=token)
        except trio.RunFinishedError:
            return None

    server = MetricsServer(listen[0], listen[1], FabricCollector(read, run_dir, extras))
    try:
        yield server
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(server.close)
