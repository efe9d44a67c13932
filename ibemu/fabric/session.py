"""A live fabric as a library object: ``Session`` (up, attach, down, status, exec, diag, fault).

``ibemu up | down | status | exec | diag``, the console (``ibemu cli``), ``ibemu perf`` and
``ibemu sm`` (which fabric), and the Mininet adapter are clients of this object: none of them
drives ibemu's own command line to get work done.

- ``FabricRequest``: what to build (topology, fabric kind, datapath, SM, RoCE settings), decided
  before anything is created; ``ibemu up`` makes one from a scenario or ``--topo``, the Mininet
  adapter from a Mininet topology.
- ``Session.up(request)`` records the run (``ibemu.kernel.ownership``), starts the fabric daemon
  (``python -m ibemu.fabric.daemon RUN_DIR``: the process that owns the namespaces and agents,
  so the fabric outlives the caller) and returns once the run is ``up``; a daemon that dies or
  does not come up in time has everything torn down and raises with its log's tail. With
  ``web=(addr, port)`` it binds the live page's socket first (``ibemu.fabric.web``: a port in
  use fails before anything exists) and the daemon serves the page on it.
- ``Session.attach(run_id)`` finds a fabric already up (the only one, when no id is given).
- ``command``/``exec`` run a program in a node's namespace, ``diag_command`` a libibumad tool
  attached to a host's MAD socket, ``fault`` (and ``link``/``switch``) ask the daemon's control
  channel (``ibemu.fabric.control``), stamped in the run's event log like a scheduled fault.

``open_runtime(request, ...)`` is the in-process fabric of a request: the daemon serves it, and
``ibemu run`` (``ibemu.scenario.runner``) drives it in its own process, where its traffic and
fault schedule share one trio clock with the agents; both inject faults through
``ibemu.fabric.faults``' injectors.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibemu import clock
from ibemu.errors import ConfigError, IbemuError
from ibemu.fabric import control
from ibemu.kernel import netns, ownership
from ibemu.physics.link import SwitchModel
from ibemu.topo import Topology, dumps_ibnetdiscover, loads_ibnetdiscover, refs

if TYPE_CHECKING:
    from ibemu.fabric.roce_runtime import RoceRuntime
    from ibemu.fabric.runtime import FabricRuntime
    from ibemu.kernel.faketime import SharedStart
    from ibemu.roce.queues import QueueConfig

UP_TIMEOUT_S = 120.0
CONTROL_WAIT_S = 5.0
SPEC_FILE = "fabric.json"
LIVE = ("building", "built", "up")


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ConfigError(f"ibemu {what} needs root (network namespaces, veth, tc): use sudo")


@dataclass(frozen=True)
class FabricRequest:
    """What ``Session.up`` builds. ``name``: what it was made from (a scenario, ``--topo``)."""

    topology: Topology
    name: str
    kind: str = "ib"
    datapath: str = "kernel"
    sm: str = "none"
    sm_host: str = ""
    sm_engine: str = "minhop"
    roce: Mapping[str, float] = field(default_factory=dict)
    """A RoCE fabric's cable loss/delay and ECN settings (``FabricSpec``'s fields)."""
    dilation: float = 1.0
    """The fabric's clock (``ibemu.clock``): ``Session.up`` runs this process and the daemon on it."""
    sm_qos: str = ""
    """QoS for the SM (``ibemu.sm.qos.SmQos`` as JSON; ibemu's SM programs it, OpenSM gets its own QoS
    options; empty: none)."""
    sm_local_failover: bool = True
    """ibemu's SM with an ``_ar`` engine writes alternates and fault-notice settings."""
    switch: Mapping[str, Any] = field(default_factory=dict)
    """IB user datapath: the switches' model (``name``, ``latency_ns``, ``buffer_bytes``; empty:
    the default by the fabric's rate, ``physics.link.default_switch_model``)."""
    metrics: str = ""
    """The daemon's Prometheus endpoint, ``ADDR:PORT`` (``ibemu.fabric.metrics``; empty: none)."""
    sm_keys: Mapping[str, int] = field(default_factory=dict)
    """The SM's M_Key settings (``m_key``, ``m_key_protect``, ``m_key_lease_s``; empty: none)."""
    sm_partitions: str = ""
    """Partitions for the SM to program (``ibemu.sm.partitions.SmPartitions`` as JSON; empty: none)."""
    sm_election: Mapping[str, Any] = field(default_factory=dict)
    """The SM's election settings (``SMSpec.election``: priority, poll_interval_ms, poll_retries,
    standby {host, priority, impl}; empty: one SM at priority 0)."""


def write_spec(run_dir: Path, run_id: str, request: FabricRequest) -> None:
    """``RUN_DIR/fabric.json``: the request as the daemon reads it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SPEC_FILE).write_text(json.dumps({
        "run_id": run_id, "fabric": request.kind, "datapath": request.datapath, "scenario": request.name,
        "topology": dumps_ibnetdiscover(request.topology), "sm": request.sm, "sm_host": request.sm_host,
        "sm_engine": request.sm_engine, "roce": dict(request.roce), "sm_qos": request.sm_qos,
        "switch": dict(request.switch), "sm_keys": dict(request.sm_keys),
        "sm_partitions": request.sm_partitions, "sm_election": dict(request.sm_election),
        "sm_local_failover": request.sm_local_failover,
        "clock": {"dilation": clock.dilation(), "epoch_ns": clock.epoch_ns()},
        "metrics": request.metrics,
    }))


def adopt_clock(run_dir: Path) -> None:
    """Run this process on the clock of the fabric in ``run_dir`` (its spec's ``clock``; a
    fabric without one runs at dilation 1)."""
    try:
        spec = read_spec(run_dir)
    except (OSError, ValueError):
        return
    c = spec.get("clock") or {}
    clock.configure(c.get("dilation", 1), c.get("epoch_ns") or None)


def read_spec(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((Path(run_dir) / SPEC_FILE).read_text()))


def request_from_spec(spec: Mapping[str, Any]) -> FabricRequest:
    """The request a daemon's ``fabric.json`` holds (``write_spec``'s inverse)."""
    return FabricRequest(loads_ibnetdiscover(spec["topology"]), spec.get("scenario") or "", kind=spec.get("fabric", "ib"),
                         datapath=spec.get("datapath", "kernel"), sm=spec.get("sm", "none"),
                         sm_host=spec.get("sm_host") or "", sm_engine=spec.get("sm_engine") or "minhop",
                         roce=dict(spec.get("roce") or {}), sm_qos=spec.get("sm_qos") or "",
                         switch=dict(spec.get("switch") or {}), metrics=spec.get("metrics") or "",
                         sm_keys=dict(spec.get("sm_keys") or {}), sm_partitions=spec.get("sm_partitions") or "",
                         sm_local_failover=bool(spec.get("sm_local_failover", True)),
                         sm_election=dict(spec.get("sm_election") or {}))


def open_runtime(request: FabricRequest, state: ownership.RunState, run_dir: Path, *,
                 queues: QueueConfig | None = None) -> FabricRuntime | RoceRuntime:
    """The in-process fabric of ``request``: what the daemon serves and ``ibemu run`` drives.

    A RoCE fabric gets its cable loss/delay and ECN marking from ``request.roce`` on the
    kernel datapath, or the user datapath's ``queues`` (which carry their own)."""
    from ibemu.fabric.agents import make_agents
    from ibemu.fabric.roce_runtime import RoceRuntime
    from ibemu.fabric.runtime import FabricRuntime

    topo = request.topology
    if request.kind == "roce":
        if queues is not None:
            return RoceRuntime(topo, state=state, run_dir=run_dir, queues=queues)
        from ibemu.kernel.ecn import EcnMarking
        from ibemu.kernel.impair import Impairment

        r = request.roce
        loss, delay = float(r.get("loss_pct", 0.0)), float(r.get("delay_us", 0.0))
        mark, line = float(r.get("ecn_mark_kb", 0.0)), float(r.get("ecn_line_gbps", 0.0))
        return RoceRuntime(topo, state=state, run_dir=run_dir, impair=Impairment(loss, delay),
                           ecn=EcnMarking(mark, line) if mark and line else None)
    rt = FabricRuntime(topo, make_agents=make_agents, datapath=request.datapath, state=state, run_dir=run_dir,
                       sm=request.sm, sm_host=request.sm_host or None, sm_engine=request.sm_engine,
                       sm_qos=request.sm_qos, switch_model=switch_model_of(request.switch),
                       sm_keys=request.sm_keys, sm_local_failover=request.sm_local_failover,
                       sm_partitions=request.sm_partitions, sm_election=request.sm_election)
    if request.metrics:
        from ibemu.fabric.metrics import parse_listen

        rt.metrics = parse_listen(request.metrics, public=True)  # checked when it was asked for
    return rt


def switch_model_of(spec: Mapping[str, Any]) -> SwitchModel | None:
    """A request's ``switch`` as a ``physics.link.SwitchModel`` (None: the default)."""
    if not spec:
        return None
    return SwitchModel(str(spec["name"]), int(spec["latency_ns"]), int(spec["buffer_bytes"]))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:]) + "\n"
    except FileNotFoundError:
        return ""


def _up_down(word: str, usage: str) -> bool:
    if word not in ("up", "down"):
        raise ConfigError(f"usage: {usage} (the last word is up or down, not {word!r})")
    return word == "up"


def link_request(topo: Topology, args: Sequence[str]) -> dict[str, Any]:
    """``edge0_0 agg0_0 down`` / ``agg0_0:4 down`` / ``edge0_0:3-agg0_0:1 up`` -> a control request.

    The end named first is the one taken down (both ends lose carrier either way).
    """
    usage = "link NODE1 NODE2 up|down  or  link NODE:PORT up|down"
    if len(args) not in (2, 3):
        raise ConfigError(f"usage: {usage}")
    up = _up_down(args[-1], usage)
    text = "-".join(args[:-1])
    try:
        link = refs.link(topo, text)
    except refs.RefError as exc:
        raise ConfigError(str(exc)) from None
    head = args[0].split("-")[0].strip()  # the end named first: a node or node:port
    end = link.a if (str(link.a) == head if ":" in head else link.a.node == head) else link.b
    return {"fault": "link_up" if up else "link_down", "link": str(link), "end": str(end)}


def switch_request(topo: Topology, args: Sequence[str]) -> dict[str, Any]:
    """``agg1_0 down`` -> a control request."""
    usage = "switch SWITCH up|down"
    if len(args) != 2:
        raise ConfigError(f"usage: {usage}")
    up = _up_down(args[1], usage)
    try:
        refs.switch(topo, args[0])
    except refs.RefError as exc:
        raise ConfigError(str(exc)) from None
    return {"fault": "switch_up" if up else "switch_down", "switch": args[0]}


class Session:
    """One fabric left running by its daemon (see the module docstring)."""

    def __init__(self, state: ownership.RunState, topology: Topology | None = None) -> None:
        self.state = state
        self._topology = topology
        if clock.dilation() == 1:  # a client of a dilated fabric stamps on its clock
            adopt_clock(state.run_dir)
        self.up_s: float | None = None
        """How long ``up`` took, when this session started the fabric."""
        self.web_url: str | None = None
        """Where the live page is, when this session started the fabric with one."""

    # -------------------------------------------------------------- finding fabrics

    @staticmethod
    def live_runs() -> list[ownership.RunState]:
        return [r for r in ownership.list_runs() if r.status in LIVE]

    @classmethod
    def attach(cls, run_id: str | None = None) -> Session:
        """The fabric ``run_id``, or the only one running; a clear error otherwise."""
        runs = cls.live_runs()
        if run_id:
            for r in runs:
                if r.run_id == run_id:
                    return cls(r)
            raise ConfigError(f"no running fabric {run_id} (running: {', '.join(r.run_id for r in runs) or 'none'})")
        if not runs:
            raise ConfigError("no fabric is running: start one with `sudo ibemu up`")
        if len(runs) > 1:
            raise ConfigError(f"{len(runs)} fabrics are running ({', '.join(r.run_id for r in runs)}): pass --run")
        return cls(runs[0])

    @staticmethod
    def status() -> list[dict[str, Any]]:
        """Every ibemu run on this machine: status, namespaces present, processes alive."""
        rows: list[dict[str, Any]] = []
        for r in ownership.list_runs():
            present = sum(netns.exists(n) for n in r.namespaces)
            alive = [p.role for p in r.processes if p.alive()]
            rows.append({"run": r.run_id, "status": r.status, "scenario": r.scenario,
                         "namespaces": present, "recorded_namespaces": len(r.namespaces),
                         "processes": alive, "age_s": round(time.time() - r.created, 1)})
        return rows

    # -------------------------------------------------------------- life cycle

    @classmethod
    def up(cls, request: FabricRequest, *, timeout_s: float = UP_TIMEOUT_S,
           web: tuple[str, int] | None = None) -> Session:
        """Build ``request`` in a fabric daemon; return once it is up (nothing left if not).

        ``web``: (address, port) for the live page (``ibemu.fabric.web``), bound here before
        anything is built (a port in use is an error with nothing started) and served by the
        daemon, which inherits the socket; ``web_url`` says where."""
        require_root("up")
        sock = None
        if web is not None:
            from ibemu.fabric.web import listen

            if request.kind != "ib":
                raise ConfigError("--web: the live page shows IB fabrics (a RoCE fabric's routers have no PMA)")
            sock = listen(*web)
        try:
            return cls._up(request, timeout_s, sock)
        finally:
            if sock is not None:
                sock.close()  # the daemon has its own copy

    @classmethod
    def _up(cls, request: FabricRequest, timeout_s: float, sock: socket.socket | None) -> Session:
        clock.configure(request.dilation)  # the daemon and every child take it from here
        state = ownership.RunState(ownership.new_run_id(), scenario=request.name)
        run_dir = state.run_dir
        state.save()
        write_spec(run_dir, state.run_id, request)
        t0 = clock.monotonic()
        web_args = [] if sock is None else ["--web-fd", str(sock.fileno())]
        with open(run_dir / "daemon.err", "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "ibemu.fabric.daemon", str(run_dir), *web_args],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True, env=clock.child_env(),
                                    pass_fds=() if sock is None else (sock.fileno(),))
        while True:
            time.sleep(0.05)
            current = ownership.RunState.load(state.path) if state.path.exists() else state
            if current.status == "up":
                break
            if proc.poll() is not None or clock.monotonic() - t0 > timeout_s:
                reason = "exited" if proc.poll() is not None else f"not up after {timeout_s:.0f} s"
                log_tail = _tail(run_dir / "daemon.log") + _tail(run_dir / "daemon.err")
                ownership.teardown(current)
                raise IbemuError(f"fabric daemon {reason}; nothing is left running.\n{log_tail}")
        session = cls(current, request.topology)
        session.up_s = clock.monotonic() - t0
        if sock is not None:
            from ibemu.fabric.web import url_of

            session.web_url = url_of(sock)
        return session

    def down(self) -> list[str]:
        """Tear the fabric down; what could not be removed (empty when all went)."""
        require_root("down")
        state = ownership.RunState.load(self.state.path) if self.state.path.exists() else self.state
        return ownership.teardown(state)

    # -------------------------------------------------------------- what it is

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def run_dir(self) -> Path:
        return Path(self.state.run_dir)

    @property
    def spec(self) -> dict[str, Any]:
        """The daemon's ``fabric.json`` (kind, datapath, SM, topology text)."""
        return read_spec(self.run_dir)

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = loads_ibnetdiscover(self.spec["topology"])
        return self._topology

    def namespace(self, node: str) -> str:
        ns = ownership.ns_name(self.run_id, node)
        if ns not in self.state.namespaces:
            raise ConfigError(f"no node {node!r} in fabric {self.run_id}")
        return ns

    # -------------------------------------------------------------- doing things

    def command(self, node: str, argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """(argv, env) that run ``argv`` in ``node``'s namespace; the env tells ibemu commands
        inside which run and node they are (``ibemu perf`` reads it)."""
        env = {**clock.child_env(), "IBEMU_RUN": self.run_id, "IBEMU_NODE": node}
        return netns.exec_argv(self.namespace(node), argv), env

    def exec(self, node: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in ``node``'s namespace (``subprocess.run`` keywords pass through)."""
        cmd, env = self.command(node, argv)
        return subprocess.run(cmd, env=env, check=False, **kw)

    def diag_command(self, node: str, argv: Sequence[str],
                     faketime: SharedStart | None = None) -> tuple[list[str], Path]:
        """(argv, working directory) that run a libibumad tool (infiniband-diags, OpenSM) on
        ``node``'s HCA port, through its MAD socket (on ``faketime``'s clock when given: a
        dilated fabric's, ``umad2sim.dilated_clock()``)."""
        from ibemu.fabric.umad2sim import scratch_dir, tool_argv

        return tool_argv(self.namespace(node), list(argv), faketime=faketime), scratch_dir(self.run_dir, node)

    def fault(self, request: dict[str, Any]) -> dict[str, Any]:
        """One control request (``ibemu.fabric.control``); waits briefly for the daemon's
        socket, which opens just after the run is marked up."""
        path = control.socket_path(self.run_dir)
        deadline = clock.monotonic() + CONTROL_WAIT_S
        while True:
            try:
                return control.request(path, request)
            except (FileNotFoundError, ConnectionRefusedError):
                if clock.monotonic() > deadline:
                    raise ConfigError(f"the fabric daemon's control socket {path} does not answer") from None
                time.sleep(0.05)

    def link(self, words: Sequence[str]) -> dict[str, Any]:
        """A cable down or up: ``["edge0_0", "agg0_0", "down"]`` (see ``link_request``)."""
        return self.fault(link_request(self.topology, words))

    def switch(self, words: Sequence[str]) -> dict[str, Any]:
        """A switch down or up: ``["agg1_0", "down"]`` (see ``switch_request``)."""
        return self.fault(switch_request(self.topology, words))
