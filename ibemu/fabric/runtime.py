"""A live fabric for one run: plan, build, start the agents, serve, and always tear down.

``FabricRuntime`` is what ``ibemu up`` (through the daemon process) and ``ibemu run`` use.
It owns the run state; leaving its ``running()`` context — normally, on Ctrl-C, on an
exception or on an agent crash — removes every namespace it created.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import resource
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ibemu import clock, lagmon
from ibemu.agents.forwarder import AdaptiveRouting
from ibemu.events import FabricLog
from ibemu.fabric import ibemusm, metrics, opensm, opensm_log, sysfs
from ibemu.fabric.agenthost import Agent, AgentHost
from ibemu.fabric.build import BuiltFabric, build, teardown
from ibemu.fabric.mad_socket import CaMadPort, serve_mad_port
from ibemu.fabric.plan import FabricPlan, plan_fabric
from ibemu.kernel import cpus, limits, madtwin, ownership
from ibemu.physics.link import SwitchModel
from ibemu.sm.partitions import SmPartitions
from ibemu.sm.qos import SmQos
from ibemu.topo import Topology

log = logging.getLogger(__name__)

AgentFactory = Callable[[FabricPlan], Mapping[str, Agent]]
MAD_SOCKET_LIMIT = 4096
SM_IMPLS = ("none", "opensm", "ibemu")


def raise_fd_limit(want: int = 1 << 18) -> None:
    """One process holds every socket of the fabric (a k=16 fat-tree: ~25,000 descriptors).

    Root may raise the hard limit too (up to fs.nr_open).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = limits.nr_open()
    if cap is not None:
        want = min(want, cap)
    for limit in ((max(want, hard), max(want, hard)), (hard, hard)):
        try:
            if limit[0] > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            return
        except (ValueError, OSError):
            continue


class FabricRuntime:
    def __init__(self, topo: Topology, *, make_agents: AgentFactory, datapath: str = "kernel",
                 state: ownership.RunState | None = None, run_dir: Path | None = None,
                 mad_sockets: bool | Iterable[str] = True, sm: str = "none",
                 sm_host: str | None = None, sm_engine: str = "minhop", sm_qos: str = "",
                 sm_local_failover: bool = True,
                 switch_model: SwitchModel | None = None, sm_keys: Mapping[str, int] | None = None,
                 sm_partitions: str = "", sm_election: Mapping[str, Any] | None = None,
                 adaptive: AdaptiveRouting | None = None) -> None:
        """``mad_sockets``: hosts that serve a MAD socket (ibsim's protocol) on port 1.

        True = every host, except that beyond ``MAD_SOCKET_LIMIT`` hosts only the first
        ``MAD_SOCKET_LIMIT`` get one: this process holds every descriptor of the fabric (one
        per MAD socket, plus one per attached client).
        """
        if sm not in SM_IMPLS:
            raise ValueError(f"sm must be one of {', '.join(SM_IMPLS)}, not {sm!r}")
        self.topo = topo
        self.mad_sockets = mad_sockets
        self.sm = sm
        self.sm_host = sm_host or next((n.name for n in topo.cas()), "")
        self.sm_engine = sm_engine
        self.sm_qos = sm_qos
        self.sm_keys = dict(sm_keys or {})
        self.sm_partitions = sm_partitions
        """Partitions (``ibemu.sm.partitions.SmPartitions`` JSON) for the SM; empty: none."""
        """The SM's M_Key settings (``m_key``, ``m_key_protect``, ``m_key_lease_s``; empty: none)."""
        self.sm_local_failover = sm_local_failover
        self.sm_election = dict(sm_election or {})
        """Election settings (``SMSpec.election``): priority, poll_interval_ms, poll_retries, standby."""
        self._standby_proc: subprocess.Popen[bytes] | None = None
        """ibemu's SM with an ``_ar`` engine writes alternates and fault-notice settings
        (False: ``--no-local-failover``, the base engine's routes only)."""
        self.switch_model = switch_model
        self.adaptive = adaptive
        """IB user datapath: adaptive routing over the SM's groups (``Forwarder.adapt``)."""
        """IB user datapath: the switches' latency and buffers (None: by the fabric's rate)."""
        """QoS (``ibemu.sm.qos.SmQos`` JSON) for the SM: ibemu's programs it, OpenSM gets it as its own
        QoS options (``opensm.qos_options``); empty: none."""
        self.sm_up_s: float | None = None
        self.mad_ports: dict[str, CaMadPort] = {}
        self.make_agents = make_agents
        self.datapath = datapath
        self.state = state or ownership.RunState(ownership.new_run_id())
        self.run_dir = run_dir
        self.plan = plan_fabric(topo, self.state.run_id)
        self.fabric: BuiltFabric | None = None
        self.host: AgentHost | None = None
        self.timings_s: dict[str, float] = {}
        self._sm_proc: subprocess.Popen[bytes] | None = None
        self.placement = cpus.placement()
        """Which CPUs the agent host, the SM and traffic workers run on (``ibemu.kernel.cpus``)."""
        self.sm_started_ns: int | None = None
        """Monotonic stamp taken just before the SM process was started."""
        self.metrics: tuple[str, int] | None = None
        self.sysfs = True
        """Keep per-node sysfs trees in ``RUN/sysfs`` (``fabric.sysfs``): on for a fabric left up;
        ``ibemu run`` turns them off unless asked (``--sysfs``): writing them costs this
        process's loop and the CPUs the measurement runs on."""
        """Where ``running`` serves its Prometheus endpoint (``fabric.metrics``); None: nowhere."""
        self.metrics_extras: list[metrics.Extra] = []
        """Metric sources of the layers above (``ibemu run``: fidelity)."""
        self._serving = False

    def sm_role(self, role: str) -> tuple[str, str, int, Path]:
        """(impl, host, priority, workdir) of the ``master`` SM or the ``standby``
        (``sm_election``); the standby's files are in ``RUN/<impl>-standby``."""
        run_dir = self.run_dir or self.state.run_dir
        if role == "master":
            return self.sm, self.sm_host, int(self.sm_election.get("priority", 0)), run_dir / self.sm
        sb = self.sm_election.get("standby") or {}
        if not sb:
            raise ValueError("no standby SM configured (sm.standby)")
        impl = str(sb.get("impl") or self.sm)
        return impl, str(sb["host"]), int(sb.get("priority", 0)), run_dir / f"{impl}-standby"

    def _launch_sm(self, role: str, *, restart: bool = False) -> subprocess.Popen[bytes]:
        """Start the SM of ``role`` (blocking: call in a thread), owned by the run."""
        impl_name, host, priority, workdir = self.sm_role(role)
        if host not in self.mad_ports:
            raise ValueError(f"the SM host {host!r} has no MAD socket")
        impl = opensm if impl_name == "opensm" else ibemusm
        ns = self.plan.nodes[host].ns
        poll_ms = int(self.sm_election.get("poll_interval_ms", 1000))
        retries = int(self.sm_election.get("poll_retries", 3))
        if impl is ibemusm:
            extra = [*self.sm_direct_args(host), *(["--qos", self.sm_qos] if self.sm_qos else []),
                     *(["--partitions", self.sm_partitions] if self.sm_partitions else []),
                     *ibemusm.key_args(self.sm_keys),
                     *([] if self.sm_local_failover else ["--no-local-failover"]),
                     *ibemusm.election_args(priority, poll_ms, retries)]
            proc = ibemusm.start(ns, workdir, engine=self.sm_engine, extra=extra, keep_events=restart)
        else:
            owner: dict[str, Any] = {"state": self.state, "keys": self.sm_keys}
            if self.sm_partitions:
                cas = {n.guid: [n.port_guid(p) for p in range(1, n.num_ports + 1)] for n in self.topo.cas()}
                owner["partitions"] = (SmPartitions.from_json(self.sm_partitions), cas)
            if self.sm_election:
                owner["election"] = {"priority": priority, "poll_interval_ms": poll_ms, "poll_retries": retries}
            if self.sm_qos:
                owner["qos"] = SmQos.from_json(self.sm_qos)
            proc = opensm.start(ns, workdir, engine=self.sm_engine, **owner)
        cpus.pin_process(proc.pid, self.placement.sm)
        self.state.claim_process(proc.pid, f"sm-{impl_name}" + ("-standby" if role == "standby" else ""))
        return proc

    async def _start_sm(self) -> None:
        """The SM (the real OpenSM or ibemu's) on the SM host, owned by the run, to SUBNET UP;
        then the standby (``sm.standby``), to its STANDBY state."""
        workdir = self.sm_role("master")[3]
        self.sm_started_ns = clock.now_ns()
        proc = await trio.to_thread.run_sync(self._launch_sm, "master")
        self._sm_proc = proc
        # Abandoned on cancel (Ctrl-C, SIGTERM during the bring-up): the teardown stops the SM,
        # which ends the thread's polling; waiting for it would hold the exit up to its timeout.
        if self.sm == "opensm":
            self.sm_up_s = await trio.to_thread.run_sync(
                functools.partial(opensm.wait_subnet_up, proc, workdir, started_ns=self.sm_started_ns),
                abandon_on_cancel=True)
        else:
            self.sm_up_s = await trio.to_thread.run_sync(ibemusm.wait_subnet_up, proc, workdir,
                                                         abandon_on_cancel=True)
        log.info("%s SM on %s: SUBNET UP in %.2f s", self.sm, self.sm_host, self.sm_up_s)
        if self.sm_election.get("standby"):
            impl, host, _prio, sworkdir = self.sm_role("standby")
            self._standby_proc = await trio.to_thread.run_sync(self._launch_sm, "standby")
            wait = opensm.wait_state if impl == "opensm" else ibemusm.wait_state
            await trio.to_thread.run_sync(wait, self._standby_proc, sworkdir, "standby")
            log.info("%s standby SM on %s", impl, host)

    def sm_power(self, up: bool) -> int:
        """Fault ``sm_down`` / ``sm_up`` (blocking): SIGKILL the master SM's process, as when its
        host dies (no goodbye: its port keeps IsSM until its MAD socket finds it gone), or start
        it again on its host, not waited for (with a master on the subnet it stands by). Returns
        the monotonic stamp of the act."""
        if not up:
            proc, self._sm_proc = self._sm_proc, None
            if proc is None or proc.poll() is not None:
                raise ValueError("the master SM is not running")
            t = clock.now_ns()
            proc.kill()
            proc.wait(5)
            return t
        if self._sm_proc is not None and self._sm_proc.poll() is None:
            raise ValueError("the master SM is running")
        t = clock.now_ns()
        self._sm_proc = self._launch_sm("master", restart=True)
        return t

    def sm_direct_args(self, host: str | None = None) -> list[str]:
        """ibemu's SM takes its own port's SMPs off the cable (``ibemu.sm.directport``), as a
        real SM does through its HCA, unless IBEMU_SM_DIRECT=0."""
        pp = self.plan.nodes[host or self.sm_host].ports.get(1)
        if pp is None or os.environ.get("IBEMU_SM_DIRECT") == "0":
            return []
        return ["--direct", f"{pp.ifname}={pp.peer_mac.hex(':')}"]

    def _mad_hosts(self) -> list[str]:
        cabled = [n.name for n in self.plan.cas() if 1 in n.ports]
        if self.mad_sockets is False:
            return []
        if self.mad_sockets is True:
            if len(cabled) > MAD_SOCKET_LIMIT:
                log.warning("%d hosts: MAD sockets on the first %d only (%s .. %s)", len(cabled),
                            MAD_SOCKET_LIMIT, cabled[0], cabled[MAD_SOCKET_LIMIT - 1])
            return cabled[:MAD_SOCKET_LIMIT]
        wanted = list(self.mad_sockets)
        unknown = [h for h in wanted if h not in cabled]
        if unknown:
            raise ValueError(f"no cabled host {unknown[0]} for a MAD socket")
        return wanted

    def build(self) -> None:
        """Kernel objects and agent sockets (blocking; call before trio or in a thread)."""
        raise_fd_limit()
        t0 = time.perf_counter()
        self.fabric = build(self.plan, self.state, datapath=self.datapath)
        t1 = time.perf_counter()
        try:
            events = FabricLog(self.run_dir / "events.jsonl" if self.run_dir else None)
            self.host = AgentHost(self.fabric, self.make_agents(self.plan), events=events,
                                  datapath=self.datapath, switch_model=self.switch_model,
                                  adaptive=self.adaptive)
            self.host.open()
            # The build's netlink sockets (one per namespace) reopen lazily when needed:
            # file descriptors are the scarce resource of a large fabric.
            self.fabric.links.close()
        except BaseException:
            self.teardown()
            raise
        self.timings_s = {**self.fabric.phases_s, "build": t1 - t0, "agents": time.perf_counter() - t1}

    def teardown(self) -> list[str]:
        problems: list[str] = []
        if self.host is not None:
            self.host.close()
            self.host = None
        if self.fabric is not None:
            problems = teardown(self.fabric)
            self.fabric = None
        else:
            problems = ownership.teardown(self.state)
        return problems

    @asynccontextmanager
    async def running(self) -> AsyncIterator[AgentHost]:
        """Build (if needed), run the agents in the background, tear down on the way out.
        The agents run on this thread, pinned to their CPU meanwhile (``placement``). With
        ``metrics`` (address, port) its Prometheus endpoint listens first (``fabric.metrics``:
        a port in use fails before anything is built)."""
        def serving() -> AgentHost | None:
            return self.host if self._serving else None

        # the CPUs out of halt while the fabric runs (``cpus.awake``)
        with cpus.awake():
            async with metrics.serve(self.metrics, serving, self.run_dir, self.metrics_extras), \
                    self._running() as host:
                yield host

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[AgentHost]:
        unpinned = None
        try:
            if self.host is None:
                await trio.to_thread.run_sync(self.build)
            assert self.host is not None
            # Not with the user datapath: it forwards in this thread and its sender thread, and
            # pinned they cannot leave a CPU other work is using (half the forwarding rate
            # under load here, benchmarks/bench_user_datapath.py); the scheduler places them.
            if self.datapath == "kernel":
                unpinned = cpus.pin_thread(self.placement.agents)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.host.serve)
                if self.run_dir is not None and self.sysfs:  # RUN/sysfs/<node>/class/infiniband/... (fabric.sysfs)
                    nursery.start_soon(sysfs.serve, self.host, self.run_dir / "sysfs")
                self._serving = True
                nursery.start_soon(lagmon.watch_from_env, "agent-host")  # in a run: its lag
                for name in self._mad_hosts():
                    self.mad_ports[name] = await nursery.start(
                        functools.partial(serve_mad_port, twin_cpus=madtwin.cpus_for(self.placement)), self.host, name, 1)
                if self.sm != "none":
                    await self._start_sm()
                self.state.status = "up"
                self.state.save()
                # The fabric's objects live as long as it does: keep them out of the collector,
                # whose passes over them otherwise stall the agents for milliseconds mid-reroute.
                gc.collect()
                gc.freeze()
                yield self.host
                nursery.cancel_scope.cancel()
        finally:
            self._serving = False
            cpus.unpin_thread(unpinned)
            cpus.release_threads(self.placement)  # worker threads started meanwhile
            with trio.CancelScope(shield=True):
                if self._standby_proc is not None:
                    await trio.to_thread.run_sync(opensm.stop, self._standby_proc)
                    self._standby_proc = None
                    impl, _host, _prio, sworkdir = self.sm_role("standby")
                    if impl == "opensm":
                        opensm.release_clock(sworkdir)
                        opensm_log.write_events(sworkdir)
                if self._sm_proc is not None:
                    await trio.to_thread.run_sync(opensm.stop, self._sm_proc)
                    self._sm_proc = None
                master_dir = (self.run_dir or self.state.run_dir) / self.sm
                if self.sm == "opensm" and (master_dir / "opensm.log").exists():
                    # its phases (also of a master killed by sm_down), in the vocabulary of ibemu's SM
                    opensm.release_clock(master_dir)
                    opensm_log.write_events(master_dir)
                problems = await trio.to_thread.run_sync(self.teardown)
                gc.unfreeze()  # what the fabric held is garbage now (tests build many fabrics)
            if problems:
                log.error("teardown left: %s", "; ".join(problems))
