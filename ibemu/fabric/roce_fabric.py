"""A live RoCE fabric: ibemu's namespaces and veth cables, configured as an IP network.

The kernel substrate is the IB fabric's (``ibemu.fabric.build`` with no tc forwarding plane:
namespaces recorded write-ahead in the run state, cables, ports up, carrier); on top of it
every switch becomes an IP router and every host gets its address, its first hop as a static
neighbour and one route (198.18.0.0/15 via that hop), plus the ingress guard that keeps its
kernel from answering RoCE frames. Routes between routers are the fabric manager's job
(``ibemu.roce.fabric_manager``, started by ``start_manager``). On the user datapath (``queues``)
the routers' kernels keep the FIB but do not forward, and ``ibemu.roce.userpath`` (started by
``start_userpath``, before the manager) forwards for all of them. ``teardown_roce`` — and
``ibemu clean`` after a crash — remove everything, through the run state.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibemu import clock
from ibemu.fabric import build as fabric_build
from ibemu.fabric.plan import FabricPlan, mac_text, plan_fabric
from ibemu.kernel import netconf, ownership
from ibemu.kernel.commands import KernelError
from ibemu.kernel.ecn import EcnMarker, EcnMarking
from ibemu.kernel.impair import Impairment, impair_ports
from ibemu.roce import physics as roce_physics
from ibemu.roce.addressing import AddressPlan, plan_addresses
from ibemu.roce.queues import QueueConfig
from ibemu.roce.routes import routers
from ibemu.topo import Topology
from ibemu.wire.roce import EMULATED_NET

if TYPE_CHECKING:
    from ibemu.hca.roce_port import RocePort

log = logging.getLogger(__name__)

PLAN_FILE = "roce.json"
USERPATH_FILE = "userpath.json"
USERPATH_COUNTERS = "userpath-counters.json"


@dataclass(frozen=True, slots=True)
class HostPort:
    """What a ``RocePort`` on a host's cable needs to open."""

    ns: str
    ifname: str
    gateway_mac: bytes
    lid: int
    ip: str


@dataclass
class RoceFabric:
    built: fabric_build.BuiltFabric
    addrs: AddressPlan
    routers: list[str]
    phases_s: dict[str, float] = field(default_factory=dict)
    queues: QueueConfig | None = None
    """The user datapath's queues (None: routers forward in the kernel)."""

    @property
    def plan(self) -> FabricPlan:
        return self.built.plan

    @property
    def state(self) -> ownership.RunState:
        return self.built.state

    @property
    def plan_path(self) -> Path:
        return self.state.run_dir / PLAN_FILE

    def host_port(self, host: str, port: int = 1) -> HostPort:
        node = self.plan.nodes[host]
        pp = node.ports[port]
        return HostPort(node.ns, pp.ifname, pp.peer_mac, self.addrs.lid(host, port), self.addrs.host_ip(host, port))

    def manifest(self) -> dict[str, Any]:
        """What the fabric manager reads (``roce.json`` in the run directory)."""
        return {"schema": "ibemu.roce-plan/1", "run_id": self.plan.run_id,
                "routers": {r: self.plan.nodes[r].ns for r in self.routers},
                "hosts": {h.name: h.ns for h in self.plan.cas()},
                "addresses": self.addrs.to_dict(),
                "peer_macs": {r: {pp.ifname: pp.peer_mac.hex() for pp in self.plan.nodes[r].ports.values()}
                              for r in self.routers}}

    def userpath_config(self) -> dict[str, Any]:
        """What the user datapath process reads (``userpath.json`` in the run directory):
        each router's ports, the queues, and ``physics``: every node and cable of the link
        model (``roce.physics.cables``: the topology's rates and delays)."""
        assert self.queues is not None
        hosts = {n.name for n in self.plan.cas()}
        topo = self.plan.topology
        return {"schema": "ibemu.roce-userpath-config/2", "queues": self.queues.to_dict(),
                "routers": {r: {"ns": self.plan.nodes[r].ns, "seed": netconf.multipath_seed(r),
                                "ports": [{"ifname": pp.ifname, "mac": pp.mac.hex(), "peer_mac": pp.peer_mac.hex(),
                                           "ip": self.addrs.port(r, pp.port).ip, "to_host": pp.peer_node in hosts,
                                           "port": pp.port}
                                          for pp in self.plan.nodes[r].ports.values()]}
                            for r in self.routers if self.plan.nodes[r].ports},
                "physics": {"nodes": {name: n.is_switch for name, n in topo.nodes.items()},
                            "cables": [c.to_list() for c in roce_physics.cables(topo, self.queues)]}}

    def host_gbps(self, host: str, port: int = 1) -> float:
        """The data rate of ``host``'s cable in the link model (the user datapath's)."""
        from ibemu.physics.link import data_gbps

        q = self.queues
        if q is not None and q.line_gbps:
            return q.line_gbps
        topo = self.plan.topology
        link = topo.link_at(host, port)
        return data_gbps(topo.rate_of(link) if link is not None else topo.defaults.rate)


def _router_lines(plan: FabricPlan, addrs: AddressPlan, name: str) -> list[str]:
    lines: list[str] = []
    for pp in plan.nodes[name].ports.values():
        pa = addrs.port(name, pp.port)
        lines += netconf.address_lines(pp.ifname, pa.ip, pa.peer_ip, mac_text(pp.peer_mac))
    return lines


def _host_lines(plan: FabricPlan, addrs: AddressPlan, name: str) -> list[str]:
    lines: list[str] = []
    for i, pp in enumerate(sorted(plan.nodes[name].ports.values(), key=lambda p: p.port)):
        pa = addrs.port(name, pp.port)
        lines += netconf.address_lines(pp.ifname, pa.ip, pa.peer_ip, mac_text(pp.peer_mac))
        if i == 0:  # one route to the range; a second port reaches its own cable only
            lines.append(netconf.host_route_line(pp.ifname, pa.peer_ip))
    return lines


def build_roce(topo: Topology, state: ownership.RunState, *, network: str = str(EMULATED_NET),
               impair: Impairment | None = None, ecn: EcnMarking | None = None,
               queues: QueueConfig | None = None) -> RoceFabric:
    """Build ``topo`` as a RoCE fabric owned by ``state`` (blocking). Nothing is left on failure.

    ``impair``: every cable end drops and delays frames (``ibemu.kernel.impair``); ``ecn``: every
    router port marks CE at its virtual queue (``ibemu.kernel.ecn``). ``queues``: the user
    datapath (``ibemu.roce.userpath``, started by ``start_userpath``) forwards instead of the
    routers' kernels, with these queues (loss, delay and ECN are then its business)."""
    if queues is not None and (impair or ecn):
        raise ValueError("the user datapath does its own loss, delay and ECN: pass them in its QueueConfig")
    plan = plan_fabric(topo, state.run_id)
    addrs = plan_addresses(topo, network)  # a bad plan fails before anything exists
    names = routers(topo)
    t0 = time.perf_counter()
    built = fabric_build.build(plan, state, datapath="user")
    fab = RoceFabric(built, addrs, names, queues=queues)
    t1 = time.perf_counter()
    try:
        hosts = [n.name for n in plan.cas() if n.ports]

        def router(name: str) -> None:
            ns = plan.nodes[name].ns
            netconf.router_sysctls(ns, netconf.multipath_seed(name), forward=queues is None)
            netconf.ip_lines(ns, _router_lines(plan, addrs, name))

        def host(name: str) -> None:
            ns = plan.nodes[name].ns
            netconf.host_sysctls(ns)
            netconf.ip_lines(ns, _host_lines(plan, addrs, name))

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(router, [r for r in names if plan.nodes[r].ports]))
            list(pool.map(host, hosts))
        t2 = time.perf_counter()
        guarded = [*hosts, *(names if queues is not None else [])]  # a user-datapath router's kernel answers nothing
        netconf.guard_hosts((plan.nodes[h].ns, pp.ifname) for h in guarded for pp in plan.nodes[h].ports.values())
        if ecn:
            marker = EcnMarker(ecn, [(plan.nodes[r].ns, pp.ifname) for r in names for pp in plan.nodes[r].ports.values()])
            try:
                marker.install()
            finally:
                marker.close()
        if impair:  # hosts have their clsact (the guard's), routers have one if they mark
            host_set = set(hosts)
            impair_ports(((plan.nodes[n].ns, pp.ifname, n in host_set or ecn is not None) for n in [*names, *hosts]
                          for pp in plan.nodes[n].ports.values()), impair)
        state.run_dir.mkdir(parents=True, exist_ok=True)
        fab.plan_path.write_text(json.dumps(fab.manifest()))
        if queues is not None:
            (state.run_dir / USERPATH_FILE).write_text(json.dumps(fab.userpath_config()))
        t3 = time.perf_counter()
    except BaseException:
        log.error("RoCE fabric build failed: tearing down what was built")
        fabric_build.teardown(built)
        raise
    fab.phases_s = {**built.phases_s, "substrate": t1 - t0, "ip": t2 - t1, "guard": t3 - t2, "total": t3 - t0}
    state.info["fabric"] = "roce"
    state.save()
    log.info("RoCE fabric %s built in %.2f s %s", plan.run_id, t3 - t0, fab.phases_s)
    return fab


def teardown_roce(fab: RoceFabric) -> list[str]:
    """Stop the run's processes (the manager), delete its namespaces; returns problems."""
    return fabric_build.teardown(fab.built)


# ------------------------------------------------------------------ the fabric manager

def start_manager(fab: RoceFabric, events: Path, *, extra: list[str] | None = None,
                  log_file: Path | None = None) -> subprocess.Popen[bytes]:
    """``python -m ibemu.roce.fabric_manager`` for this fabric, owned by its run."""
    argv = [sys.executable, "-m", "ibemu.roce.fabric_manager", "--plan", str(fab.plan_path), "--events", str(events),
            *(extra or [])]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT if log_file else None, env=clock.child_env())
    finally:
        if log_file:
            out.close()  # type: ignore[union-attr]
    fab.state.claim_process(proc.pid, "roce-manager")
    return proc


def wait_manager_up(proc: subprocess.Popen[bytes], events: Path, timeout_s: float = 30.0, *,
                    since_ns: int = 0) -> dict[str, Any]:
    """Until the manager logs ``fabric_up`` (every route programmed) at or after ``since_ns``
    (monotonic; a log that a previous manager appended to holds its ``fabric_up`` too)."""
    deadline = clock.monotonic() + timeout_s
    while clock.monotonic() < deadline:
        if events.exists():
            for line in events.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("kind") == "fabric_up" and rec.get("t_ns", 0) >= since_ns:
                    return dict(rec)
        if proc.poll() is not None:
            raise KernelError(f"the fabric manager exited with status {proc.returncode} before the fabric was up")
        time.sleep(0.02)
    raise KernelError(f"the fabric manager did not bring the fabric up within {timeout_s} s")


def start_userpath(fab: RoceFabric, *, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
    """``python -m ibemu.roce.userpath`` for this fabric, owned by its run; returns once every
    router's forwarder has its sockets and FIB (blocking)."""
    run_dir = fab.state.run_dir
    ready = run_dir / "userpath.ready"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "ibemu.roce.userpath", "--config", str(run_dir / USERPATH_FILE),
            "--counters", str(run_dir / USERPATH_COUNTERS), "--ready", str(ready), "--log-level", "INFO"]
    with open(run_dir / "userpath.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clock.child_env())
    fab.state.claim_process(proc.pid, "roce-userpath")
    deadline = clock.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None:
            raise KernelError(f"the RoCE user datapath exited with status {proc.returncode} before it forwarded "
                              f"(see {run_dir / 'userpath.log'})")
        if clock.monotonic() > deadline:
            stop_manager(proc)
            raise KernelError(f"the RoCE user datapath was not ready within {timeout_s} s")
        time.sleep(0.02)
    return proc


def read_userpath_counters(fab: RoceFabric) -> dict[str, Any]:
    """The user datapath's last counters (``{}`` before it wrote any)."""
    path = fab.state.run_dir / USERPATH_COUNTERS
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def stop_manager(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class RoceRun:
    """A RoCE fabric with its fabric manager running: ``up()``, use it, ``down()``."""

    fab: RoceFabric
    manager: subprocess.Popen[bytes] | None = None
    userpath: subprocess.Popen[bytes] | None = None
    counters: dict[str, Any] = field(default_factory=dict)
    """The user datapath's counters when it stopped (``down``)."""
    events: Path | None = None
    up_event: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def up(cls, topo: Topology, state: ownership.RunState, *, manager_args: list[str] | None = None,
           events: Path | None = None, timeout_s: float = 30.0, impair: Impairment | None = None,
           ecn: EcnMarking | None = None, queues: QueueConfig | None = None) -> RoceRun:
        """Build, start the manager, return once every route is programmed (blocking).

        ``events``: the manager's event log (default: in the run directory, which teardown
        removes); ``queues``: forward in the user datapath (started before the manager, so its
        FIB mirrors every route the manager writes)."""
        run = cls(build_roce(topo, state, impair=impair, ecn=ecn, queues=queues))
        try:
            if queues is not None:
                run.userpath = start_userpath(run.fab)
            run.events = events or state.run_dir / "fm.jsonl"
            run.restart_manager(manager_args, timeout_s=timeout_s)
        except BaseException:
            run.down()
            raise
        return run

    def restart_manager(self, args: list[str] | None = None, *, timeout_s: float = 30.0) -> None:
        """(Re)start the fabric manager with ``args``; returns once its routes are written."""
        assert self.events is not None
        if self.manager is not None:
            stop_manager(self.manager)
        t0 = clock.now_ns()
        self.manager = start_manager(self.fab, self.events, extra=args, log_file=self.state_dir_log())
        self.up_event = wait_manager_up(self.manager, self.events, timeout_s, since_ns=t0)

    def state_dir_log(self) -> Path:
        return self.fab.state.run_dir / "fm.log"

    def manager_events(self) -> list[dict[str, Any]]:
        if self.events is None or not self.events.exists():
            return []
        out = []
        for line in self.events.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def live_counters(self) -> dict[str, Any]:
        """The user datapath's counters now (it writes them every second; a signal-free read)."""
        return read_userpath_counters(self.fab)

    def open_port(self, host: str, *, dcqcn: bool = False) -> RocePort:
        """A RoCE port on ``host``'s cable, in this process. With PFC on the fabric it honours
        its first hop's pauses; ``dcqcn``: with ECN marking on the fabric it also sends ECT
        frames, answers CE with CNPs and slows down on CNPs, as a scenario run's does."""
        from ibemu.hca.dcqcn import DcqcnParams  # the traffic side, only for whoever opens a port
        from ibemu.hca.roce_port import RocePort

        hp = self.fab.host_port(host)
        port = RocePort.open(hp.ns, hp.ifname, hp.gateway_mac, hp.lid, ip=hp.ip, lid_ips=self.fab.addrs.lid_ips())
        q = self.fab.queues
        if q is not None and q.pfc:
            port.enable_pfc(self.fab.host_gbps(host))
        if dcqcn and q is not None and q.ecn_mark_kb:
            port.enable_dcqcn(DcqcnParams(line_gbps=self.fab.host_gbps(host)))
        return port

    def down(self) -> list[str]:
        if self.manager is not None:
            stop_manager(self.manager)
            self.manager = None
        problems: list[str] = []
        if self.userpath is not None:  # it writes its final counters on SIGTERM
            if self.userpath.poll() is not None:
                problems.append(f"the RoCE user datapath had exited (status {self.userpath.returncode}; "
                                f"see {self.fab.state.run_dir / 'userpath.log'})")
                log.error("%s", problems[-1])
            stop_manager(self.userpath)
            self.userpath = None
            self.counters = read_userpath_counters(self.fab)
        return problems + teardown_roce(self.fab)
