"""The subnet manager's state machine: cold sweep, traps, light sweeps, reroute.

One sweep at a time. Traps are repressed at once (TrapRepress to the issuer) and mark
their switch dirty; whatever arrives during a sweep coalesces into one follow-up. Every
``sweep_interval_s`` without traps a light sweep reads SwitchInfo of every switch and
re-discovers the ports of those whose PortStateChange is set (or that have a port whose
far end never answered), which catches changes whose traps were lost.

A change (link down/up, a port back in Init) leads to: directed routes re-derived over
live links, unreachable nodes dropped and reported (``partition``), LIDs for new ports,
routes recomputed by the engine (``route_fn(graph, engine)``, default
``ibemu.sm.routing.compute``), only the changed LFT blocks written, new ports activated.
Each such pass is a ``reroute`` event with ``t_trap -> t_rediscovered -> t_routed ->
t_programmed`` (monotonic ns).

A switch that dies still sits in the graph until every one of its cables is known down, and
its neighbours' traps may be lost (their route to the SM went through it). So after a trap
sweep a switch is never waited for: a reroute's blocks to a switch that does not answer are
abandoned as soon as a trap (or a suspicion) waits (``LftProgrammer``), and the switch
becomes a *suspect*. So does the far end of a cable found down whose other cables, read from
their other ends while the reroute is being programmed, are down too. The next pass checks
each suspect at once: its cables are read from its neighbours and it gets one NodeInfo
(``suspect_probe_s``); unanswered, it is dropped from the subnet as if all its cables were
down (as a heavy sweep would leave it out), and the light sweep probes its cables again.
The SM's own switch (the gateway every directed route crosses) gets a NodeInfo in that pass
too, sent last, as the control: unanswered, the silence is the SM's side's (a loaded machine),
and no suspect is dropped on it; the gateway is never dropped so (``_check_suspects``).
Directed routes avoid suspects. ``t_programmed`` is the last ack from the switches that
answered; blocks not waited for are in ``blocks_failed`` (and ``blocks_abandoned``).

With ``SmConfig.dump_dir``, OpenSM's dump files (``ibemu.sm.dumps``: opensm-subnet.lst,
opensm-lfts.dump, guid2lid) are rewritten after each heavy sweep and each reroute, built
between passes, never holding up one.

M_Key (``m_key``, ``m_key_protect``, ``m_key_lease_s``): the PortInfo Sets that give ports
their LIDs write the key, protect bits and lease too (every port that holds one: CA ports,
switch port 0), and every SMP the SM sends carries the key (``Transport.m_key``). Ports
keyed before (by this SM or another with the same key) are left as they are. Trap 256 (Bad
M_Key: someone sent an SMP without the key) is repressed and logged (``mkey_violation``)
and triggers no sweep: nothing in the subnet changed. The SM does not look keys up per port
(OpenSM's guid2mkey): one key for the subnet.

Time dilation (``ibemu.sm.timers``): the SM's timers run on trio's clock, the run's emulated
clock. The modelled SM's own (the light sweep's ``sweep_interval_s``, ``overdue_s``,
``suspect_probe_s``, a standby's polls) stay to scale; those that wait on this machine's
agents and datapaths (``timers``: an SMP's timeout, the pause before an unclean cold sweep is
repeated, the repair sweep, the snapshot and dump writers' polls) last their configured
emulated time but at most ``guard_real_s`` (1 s) of real time, never less than their value
at dilation 1. A heavy sweep that leaves SMPs unanswered after every retry is followed by a
heavy ``repair`` sweep ``timers.resweep_s`` later (doubling while it stays unclean, at most
``sweep_interval_s``); OpenSM's next sweep after errors is heavy too, but comes at its sweep
interval (10 s emulated: 55 hours of real time at dilation 20,000).

Election (``ibemu.sm.election``, the state machine; this class carries out its actions): each
heavy sweep's discovery is followed by a SubnGet(SMInfo) to every other CA port with IsSM,
and the sweep goes on only if this SM is master. A standby runs ``_standby``: it polls its
master on the election's timer (trio's clock) and, when the master is lost, sweeps as a
candidate master (``full_sweep("takeover")``: nothing it wrote before is trusted). SMInfo
requests reach this SM as unsolicited MADs (its HCA port hands them over: IsSM) and are
answered by ``_on_sm_info``; a Set's modifier (HANDOVER, ACKNOWLEDGE, ...) goes to the
election. A master polled by another SM (or sent trap 144) looks at the subnet's SMs again
(``_check_peers``, at most once per ``sweep_interval_s``) and hands over to a higher standby.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import json
import logging
import os
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ibemu import clock
from ibemu.events import LINK_CHANGE, EventLog, Kind
from ibemu.sm import activate as act
from ibemu.sm import election as el
from ibemu.sm.discovery import PHYS_LINK_UP, Change, Discovery
from ibemu.sm.graph import Routes, SubnetGraph
from ibemu.sm.lids import LidTable
from ibemu.sm.program import LftProgrammer
from ibemu.sm.timers import GUARD_REAL_S, SmTimers, next_step_delay
from ibemu.sm.transport import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    MadPort,
    Transport,
)
from ibemu.wire import madcodec as mb
from ibemu.wire.madattrs import TRAP_BAD_M_KEY, TRAP_BAD_P_KEY, decode_trap256, decode_trap257
from ibemu.wire.umad import SimRequest

if TYPE_CHECKING:  # only with a configuration that has them: imported when used (start-up)
    from ibemu.sm.partitions import SmPartitions
    from ibemu.sm.qos import SmQos

log = logging.getLogger(__name__)

RouteFn = Callable[[SubnetGraph, str], Routes]
RerouteFn = Callable[[SubnetGraph, Routes, list[tuple[int, int]]], Routes]

CLASS_SUBN_LID = 0x01
ATTR_NOTICE = 0x0002
ATTR_SM_INFO = 0x0020
CAP_IS_SM = 1 << 1  # PortInfo CapabilityMask.IsSM
TRAP_SM_PRIORITY = 144  # "local changes" trap; OpenSM's standby sends it when it outranks the master
PERMISSIVE_LID = 0xFFFF


def _trio_ns() -> int:
    """The election's timers run on trio's clock (the run's emulated clock in the SM process,
    a mock clock in tests)."""
    return int(trio.current_time() * 1e9)


@contextlib.contextmanager
def _collector_held() -> Iterator[None]:
    """Python's cyclic garbage collector off for a trap's pass, back on (if it was) after it.

    A k=8 cut's reroute allocates enough (calls, replies, frames, the reroute's tables) for
    one or two young-generation collections in the middle of it, 0.14-0.29 ms each and a
    0.4 ms older one in some restores (hand-timed with ``gc.callbacks`` in the SM process),
    all of it between the trap and the last LFT ack. Held, they run after the pass;
    reference counting frees what is not in a cycle meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def default_route_fn(graph: SubnetGraph, engine: str) -> Routes:
    """``ibemu.sm.routing`` (imported on first use): ``compute_with_fallback`` when it has it
    (an engine that cannot apply falls back to minhop, as OpenSM does), else ``compute``."""
    mod = importlib.import_module("ibemu.sm.routing")
    entry = getattr(mod, "ENGINES", {}).get(engine)
    if getattr(entry, "adaptive", False):  # the base engine's LFTs and their checked alternates
        try:
            ar = importlib.import_module("ibemu.sm.routing.alternates").compute_ar(graph, engine)
        except mod.RoutingError as exc:
            log.warning("%s: no alternates (%s); routing without them", engine, exc)
        else:
            primary: Routes = ar.primary
            primary.engine, primary.alternates = engine, ar.alternates
            primary.compute_s = ar.compute_s
            return primary
    fn = getattr(mod, "compute_with_fallback", None) or mod.compute
    routes: Routes = fn(graph, engine)
    return routes


def default_reroute_fn(graph: SubnetGraph, prev: Routes, ends: list[tuple[int, int]]) -> Routes:
    """``ibemu.sm.reroute.reroute``: incremental after a failure, re-balancing otherwise."""
    res = importlib.import_module("ibemu.sm.reroute").reroute(graph, prev, ends)
    routes: Routes = res.routes
    routes.patches = {g: (prev.lfts[g], d) for g, d in res.diff.items() if g in prev.lfts}
    return routes


@dataclass
class SmConfig:
    engine: str = "minhop"
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    sweep_interval_s: float = 10.0
    outbox: int = 1024  # TrapRepress / SMInfo responses waiting to be sent
    priority: int = 0
    lid_routed_activation: bool = True  # after a clean programming pass (cheaper per hop)
    state_path: str | None = None  # where to keep a JSON snapshot of LIDs, links and LFTs
    dump_dir: str | None = None  # where to write OpenSM's dump files (ibemu.sm.dumps); None: none
    overdue_s: float = 0.02  # with a trap waiting, an LFT Set unanswered this long is abandoned
    suspect_probe_s: float = 0.05  # a suspected switch not answering NodeInfo within this is dropped
    qos: SmQos | None = None  # VLs, SL -> VL and VL arbitration to program (ibemu.sm.qos); None: leave defaults
    m_key: int = 0  # the M_Key every port gets (and every SMP carries); 0: none
    m_key_protect: int = 0  # M_KeyProtectBits written with it (0-3)
    m_key_lease_s: int = 0  # M_KeyLeasePeriod written with it (seconds; 0: the lease never runs out)
    partitions: SmPartitions | None = None  # P_KeyTables and enforcement to program (ibemu.sm.partitions)
    local_failover: bool = True  # an _ar engine's alternates and fault-notice settings go to the switches
    poll_interval_s: float = 1.0  # a standby polls its master's SMInfo this often (OpenSM: sminfo_polling_timeout)
    poll_retries: int = 3  # failed polls in a row before a standby takes over (OpenSM: polling_retry_number)
    sm_key: int = 1  # SMInfo SM_Key (OpenSM's default too: OpenSM ignores an SM whose key differs)
    unclean_cold_sweeps: int = 3  # cold sweeps with SMPs unanswered after every retry before SUBNET UP anyway
    dilation: float | None = None  # the run's time dilation (None: this process's clock, ``clock.dilation()``)
    guard_real_s: float = GUARD_REAL_S  # the timers that wait on this machine last at most this real time (ibemu.sm.timers)


class SubnetManager:
    def __init__(self, port: MadPort, config: SmConfig | None = None, *,
                 route_fn: RouteFn | None = None, reroute_fn: RerouteFn | None = None,
                 events: EventLog | None = None) -> None:
        """``route_fn`` computes routes from scratch; ``reroute_fn`` after changes (given the
        previous routes and the changed ends). Defaults: ``ibemu.sm.routing`` and
        ``ibemu.sm.reroute``; an injected ``route_fn`` alone is used for both."""
        self.config = config or SmConfig()
        cfg = self.config
        self.timers = SmTimers.at(clock.dilation() if cfg.dilation is None else cfg.dilation,
                                  timeout_s=cfg.timeout_s, sweep_interval_s=cfg.sweep_interval_s,
                                  cap_real_s=cfg.guard_real_s)
        """The SM's timers in emulated time at the run's dilation (``ibemu.sm.timers``)."""
        self._generation = 0
        self._groups_due = False
        """The adaptive groups of the current routes are not on the switches yet."""
        """Programming passes that wrote alternates (``FailoverConfig``'s generation)."""
        self.events = events or EventLog()
        self.route_fn = route_fn or default_route_fn
        self.reroute_fn = reroute_fn or (default_reroute_fn if route_fn in (None, default_route_fn) else None)
        self.transport = Transport(port, max_in_flight=self.config.max_in_flight,
                                   timeout_s=self.timers.timeout_s, retries=self.config.retries,
                                   on_unsolicited=self._on_mad, m_key=self.config.m_key)
        self.disc = Discovery(self.transport)
        self.lids = LidTable()
        self.prog = LftProgrammer(self.transport, self.events, overdue_s=self.config.overdue_s)
        self.prog.fdb_top = functools.partial(act.fdb_top, self.disc)  # LID-routed only below each LinearFDBTop
        self.disc.avoid = self.prog.suspects
        self._check: set[int] = set()  # suspects the next pass looks at
        self._unanswered: set[int] = set()  # suspects because an SMP to them went unanswered
        self._reprogram = False  # the last pass left blocks unwritten
        self.routes: Routes | None = None
        self.sm_lid = 0
        self._snapshot_due = False
        self.up = trio.Event()
        self.lost: dict[int, str] = {}
        self.stats: Counter[str] = Counter()
        self.sweeps = 0
        self._unclean = 0
        self._repair_due = 0
        """Heavy sweeps in a row that left SMPs unanswered after every retry (a node
        undiscovered, a port not activated, a block unwritten): the next periodic sweep is a
        heavy one, soon (``timers.next_step_delay``)."""
        """Cold sweeps that ended with SMPs unanswered after every retry."""
        self._dirty: dict[int, int] = {}  # switch GUID -> t_ns of its first trap
        self._trap_cpu_ns = 0
        """This process's CPU time (``time.process_time_ns``) when the first trap waiting was
        taken: a reroute's ``cpu_ms`` counts from it."""
        self._pass_cpu_ns = 0
        """That stamp for the trap pass under way (0: not a trap's pass)."""
        self._trap_unknown = 0  # t_ns of a trap from a LID we do not know
        self._trap_pass = False
        """A trap's pass runs (``step``)."""
        self._pass_over = trio.Event()
        """Set when a trap's pass ends (then replaced): held TrapRepresses go (``_outbox``)."""
        self._wake = trio.Event()
        self._light_scope: trio.CancelScope | None = None
        """The light sweep under way, which a trap ends (``light_sweep``)."""
        self._out_send, self._out_recv = trio.open_memory_channel[tuple[bytes, int]](self.config.outbox)
        self._sweeping = False
        self._lft_views: dict[int, tuple[dict[int, int], int, dict[str, int]]] = {}
        self._dumps_wake = trio.Event()
        self._t_start = clock.now_ns()
        self._keys = act.MKeys(cfg.m_key, cfg.m_key_protect, cfg.m_key_lease_s) if cfg.m_key else None
        self._pkeys_written: dict[Any, bytes] = {}
        """What ``program_partitions`` wrote (per port and block), so that a pass writes only changes."""
        self.election = el.Election(0, priority=cfg.priority, poll_interval_ns=int(cfg.poll_interval_s * 1e9),
                                    poll_retries=cfg.poll_retries, sm_key=cfg.sm_key)
        """This SM among the others (``ibemu.sm.election``); its GUID is our port's, set by discovery."""
        self.sm_peers: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        """Other SMs' ports found by the last heavy sweep: port GUID -> (node GUID, port, directed route)."""
        self._state_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._lost_master = 0
        self._peer_check_due = False
        self._peer_check_next = 0.0
        self._takeover_due = False
        """The election made this SM a candidate master (master lost, a HANDOVER): its next
        heavy sweep is a takeover (every table written again, whatever this SM wrote before)."""
        self.offload: Callable[[bool], None] | None = None
        """Told, as a heavy sweep moves on, whether the SMPs that follow are answered in the
        kernel (True: Gets, LFT Sets, and everything after the sweep) or by the agents
        (False: PortInfo, SwitchInfo and P_Key Sets); ``python -m ibemu.sm`` steers the far
        end of its cable by it (``kernel.steer``)."""

    @property
    def graph(self) -> SubnetGraph:
        return self.disc.graph

    # ------------------------------------------------------------------ running

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SubnetManager]:
        """The transport and the outbox run; sweeps are the caller's (tests drive them)."""
        async with trio.open_nursery() as n:
            await n.start(self.transport.serve)
            self._nursery = n
            n.start_soon(self._outbox)
            n.start_soon(self._snapshots)
            n.start_soon(self._dumps)
            yield self
            n.cancel_scope.cancel()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Cold sweep, then traps and light sweeps until cancelled."""
        t = self.timers
        self.events.emit(Kind.SM_START, engine=self.config.engine, max_in_flight=self.config.max_in_flight,
                         priority=self.config.priority, dilation=t.dilation, timeout_s=t.timeout_s,
                         timeout_real_s=t.real(t.timeout_s))
        self.warm_up()
        async with self.running():
            task_status.started()
            while True:
                state = self.election.state
                if state is el.SmState.MASTER and self.up.is_set() and not self._takeover_due:
                    await self._after_up()
                elif state is el.SmState.STANDBY:
                    await self._standby()
                elif state is el.SmState.NOT_ACTIVE:
                    await self._state_changed.wait()
                else:  # DISCOVERING, or master by a handover before a sweep of our own
                    reason = "takeover" if self._takeover_due else "cold"
                    self._takeover_due = False
                    await self.full_sweep(reason)
                    if self.election.state is el.SmState.DISCOVERING or (
                            self.election.state is el.SmState.MASTER and not self.up.is_set()):
                        await trio.sleep(self.timers.resweep_s)

    def warm_up(self) -> None:
        """Import the routing modules now: a first import costs ~8 ms of a reroute."""
        for name, used in (("ibemu.sm.routing", self.route_fn is default_route_fn),
                           ("ibemu.sm.reroute", self.reroute_fn is default_reroute_fn)):
            if used:
                try:
                    importlib.import_module(name)
                except ImportError as exc:
                    log.warning("cannot import %s: %s", name, exc)

    async def _after_up(self) -> None:
        """The master's loop after SUBNET UP: trap sweeps and periodic light sweeps, until this
        SM is no longer master (it handed the subnet over)."""
        while self.election.state is el.SmState.MASTER:
            with trio.move_on_after(next_step_delay(self.timers, repairs=self._repair_due)):
                await self._wake.wait()
            if self.election.state is not el.SmState.MASTER:
                return
            await self.step()

    # ------------------------------------------------------------------ election

    def act_count(self) -> int:
        """SMInfo ActCount: the SMPs this SM has sent (the heartbeat a standby watches)."""
        return (self.transport.stats["sent"] + self.transport.stats["sent_unacked"]) & 0xFFFFFFFF

    def _own_port_guid(self) -> int:
        node = self.graph.nodes.get(self.graph.sm_guid)
        port = node.ports.get(self.disc.sm_port) if node is not None else None
        return port.guid if port is not None else self.graph.sm_guid

    def _find_sm_ports(self) -> dict[int, tuple[int, int, tuple[int, ...]]]:
        """Every CA port but ours whose PortInfo CapabilityMask has IsSM."""
        out: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        for node in self.graph.cas():
            for num, port in node.ports.items():
                pi = self.disc.port_info.get((node.guid, num))
                if pi is None or (node.guid, num) == (self.graph.sm_guid, self.disc.sm_port):
                    continue
                if struct.unpack_from("!I", pi, 20)[0] & CAP_IS_SM:
                    out[port.guid] = (node.guid, num, port.dr_path)
        return out

    async def _get_sm_info(self, guid: int, *, timeout_s: float | None = None,
                           retries: int | None = None) -> el.SmInfo | None:
        peer = self.sm_peers.get(guid)
        if peer is None:
            return None
        r = await self.transport.request(mb.dr_smp(mb.GET, ATTR_SM_INFO, path=list(peer[2])),
                                         timeout_s=timeout_s, retries=retries)
        if r is None or not r.ok:
            return None
        try:
            info = el.SmInfo.unpack(r.data)
        except ValueError:
            self.stats["sm_info_malformed"] += 1
            return None
        if self.config.sm_key and info.sm_key != self.config.sm_key:  # not of our subnet: ignored, as OpenSM does
            self.stats["sm_key_mismatch"] += 1
            log.warning("SM %#018x answers with SM_Key %#x, not ours: ignored", info.guid, info.sm_key)
            return None
        return info

    async def _elect(self) -> bool:
        """After discovery: read every other SM's SMInfo and run the election. True when this
        SM is (still) master and goes on with the sweep."""
        self.election.guid = self._own_port_guid()
        self.sm_peers = self._find_sm_ports()
        guids = sorted(self.sm_peers)
        infos: list[el.SmInfo | None] = [None] * len(guids)

        async def one(i: int, guid: int) -> None:
            # the master we just gave up on gets one try: it is most likely dead
            infos[i] = await self._get_sm_info(guid, retries=0 if guid == self._lost_master else None)
            info = infos[i]
            fields: dict[str, Any] = {} if info is None else {
                "priority": info.priority, "state": info.state.name.lower(), "act_count": info.act_count}
            self.events.emit(Kind.SM_FOUND, guid=f"{guid:#018x}", answered=info is not None, **fields)

        async with trio.open_nursery() as n:
            for i, guid in enumerate(guids):
                n.start_soon(one, i, guid)
        await self._act(self.election.discovered(infos, _trio_ns()))
        return self.election.state is el.SmState.MASTER

    def _note_peer(self) -> None:
        """Another SM showed itself to this master: look at the SMs of the subnet in the next
        step, at most once per ``sweep_interval_s``."""
        if not self._peer_check_due and trio.current_time() >= self._peer_check_next:
            self._peer_check_due = True
            self._wake.set()

    async def _check_peers(self) -> None:
        """A master's look at the other SMs between heavy sweeps: the CA ports' PortInfo again
        (IsSM), the SMInfo of those that have it, and the election (a higher standby gets the
        subnet: HANDOVER)."""
        self._peer_check_due = False
        self._peer_check_next = trio.current_time() + self.config.sweep_interval_s
        own = (self.graph.sm_guid, self.disc.sm_port)
        await self.disc.read_ends([(n.guid, num) for n in self.graph.cas() for num in n.ports
                                   if (n.guid, num) != own])
        self.stats["peer_checks"] += 1
        await self._elect()

    async def _act(self, actions: list[el.Action]) -> None:
        """Carry out what the election asked for."""
        for a in actions:
            if isinstance(a, el.StateChange):
                log.warning("SM %s -> %s (%s)", a.old.name, a.new.name, a.reason)
                self.events.emit(Kind.SM_STATE, old=a.old.name.lower(), new=a.new.name.lower(), reason=a.reason,
                                 master=f"{a.master:#018x}" if a.master else None)
                self._state_changed.set()
                self._state_changed = trio.Event()
                self._wake.set()  # a master's loop looks at its state again
            elif isinstance(a, el.MasterLost):  # the election's stamps are trio's: moved onto the log's clock
                t_first = self.events.now() - (_trio_ns() - a.first_failed_ns)
                self.events.emit(Kind.SM_MASTER_LOST, master=f"{a.guid:#018x}", failed=a.failed,
                                 t_first_failed=t_first)
                self._lost_master = a.guid
            elif isinstance(a, el.Takeover):
                self._takeover_due = True
            elif isinstance(a, el.SendSet):
                peer = self.sm_peers.get(a.guid)
                r = None
                if peer is not None:
                    data = self.election.on_get(self.act_count()).pack()
                    r = await self.transport.request(mb.dr_smp(mb.SET, ATTR_SM_INFO, path=list(peer[2]),
                                                               modifier=int(a.modifier), data=data))
                self.events.emit(Kind.SM_HANDOVER, to=f"{a.guid:#018x}", modifier=a.modifier.name.lower(),
                                 answered=r is not None and r.ok)
                if a.modifier is el.SmInfoMod.HANDOVER and (r is None or not r.ok):
                    self.election.handover_failed()

    async def _standby(self) -> None:
        """A standby's loop: poll the master's SMInfo on the election's timer until the
        state changes (master lost: a takeover sweep follows; a HANDOVER: master)."""
        e = self.election
        while e.state is el.SmState.STANDBY:
            for a in e.poll_due(_trio_ns()):
                if not isinstance(a, el.Poll):
                    continue
                timeout = min(self.timers.timeout_s, self.config.poll_interval_s)
                info = await self._get_sm_info(a.guid, timeout_s=timeout, retries=0)
                before = e.failed
                acts = e.poll_result(info, _trio_ns())
                if e.failed > before or any(isinstance(x, el.MasterLost) for x in acts):
                    why = ("unanswered" if info is None else f"state {info.state.name.lower()}"
                           if info.state is not el.SmState.MASTER else "act_count still")
                    self.events.emit(Kind.SM_POLL_FAILED, master=f"{a.guid:#018x}", failed=e.failed or before + 1,
                                     why=why)
                await self._act(acts)
            if e.state is not el.SmState.STANDBY:
                return
            delay = max(0, e.next_poll_ns - _trio_ns()) / 1e9
            with trio.move_on_after(delay):
                await self._state_changed.wait()

    async def step(self) -> None:
        """One pass: handle pending traps (and suspects), else a light sweep."""
        self._wake = trio.Event()
        if self._dirty or self._trap_unknown or self._check:
            self._trap_pass = True
            try:
                with _collector_held():
                    await self.trap_sweep()
            finally:
                self._trap_pass = False
                self._pass_over.set()  # the represses held for it go (``_outbox``)
                self._pass_over = trio.Event()
            # a cable changed state: switches may have repaired routes by themselves (fault
            # notices) even where the SM's routes need no change (a cable back before the
            # SM looked): a new generation ends those repairs
            self._groups_due = self._groups_due or (self.config.local_failover and self._adaptive())
        elif self._repair_due:
            # as OpenSM after a sweep with errors: a heavy sweep again rather than a light one,
            # which looks only for PortStateChange and would never see what was missed
            await self.full_sweep("repair")
        else:
            await self.light_sweep()
        if self._groups_due and not self._wake.is_set():  # skipped while traps waited
            await self._program_groups()
        if self._peer_check_due and self.election.state is el.SmState.MASTER:
            await self._check_peers()

    # ------------------------------------------------------------------ unsolicited

    def _on_mad(self, req: SimRequest) -> None:
        mad = req.mad
        attr = struct.unpack_from("!H", mad, 16)[0]
        if req.mgmt_class == CLASS_SUBN_LID and req.method == mb.TRAP and attr == ATTR_NOTICE:
            self._on_trap(req)
        elif req.mgmt_class in (0x01, 0x81) and req.method in (mb.GET, mb.SET) and attr == ATTR_SM_INFO:
            self._on_sm_info(req)
        else:
            self.stats["unsolicited_ignored"] += 1

    def _on_trap(self, req: SimRequest) -> None:
        now = self.events.now()
        data = mb.smp_data(req.mad)
        trap_number, issuer = struct.unpack_from("!HH", data, 4)
        self.stats["traps"] += 1
        arrival = getattr(self.transport.port, "arrival_ns", None)  # ``DirectPort``: the HCA's stamp
        t_port = arrival(req) if arrival is not None else None
        # a trap the master's loop takes up at once: written with the pass it starts (its
        # records are lazy until the pass's last: no file write before the reroute starts)
        passes = (trap_number not in (TRAP_BAD_M_KEY, TRAP_SM_PRIORITY, TRAP_BAD_P_KEY)
                  and self.up.is_set() and self.election.state is el.SmState.MASTER)
        self.events.emit(Kind.TRAP, t_ns=now, lazy=passes, issuer_lid=issuer, trap_number=trap_number,
                         tid=req.tid, slid=req.slid, **({"t_port_ns": t_port} if t_port else {}))
        repress = bytearray(req.mad)
        repress[3] = mb.TRAP_REPRESS
        self._queue_out(bytes(repress), req.slid or issuer)
        if trap_number == TRAP_BAD_M_KEY:
            # someone without our key tried to read or change a port: a security event,
            # not a change of the subnet (nothing to re-sweep)
            d = decode_trap256(data)
            self.stats["mkey_violations"] += 1
            log.warning("bad M_Key at LID %d: method %#x attribute %#x from LID %d", issuer,
                        d["method"], d["attr_id"], d["lidaddr"])
            self.events.emit(Kind.MKEY_VIOLATION, t_ns=now, issuer_lid=issuer, lidaddr=d["lidaddr"],
                             dr_slid=d["dr_slid"], method=d["method"], attr=d["attr_id"],
                             modifier=d["attr_mod"], m_key=f"{d['m_key']:#x}")
            return
        if trap_number == TRAP_SM_PRIORITY:  # a standby says it outranks us (OpenSM's trap 144)
            self._note_peer()
            return
        if trap_number == TRAP_BAD_P_KEY:  # a packet outside its partition: no subnet change
            d257 = decode_trap257(data)
            self.stats["pkey_violations"] += 1
            log.warning("bad P_Key %#06x at LID %d: LID %d -> LID %d", d257["pkey"], issuer, d257["lid1"],
                        d257["lid2"])
            self.events.emit(Kind.PKEY_VIOLATION, t_ns=now, issuer_lid=issuer, lid1=d257["lid1"],
                             lid2=d257["lid2"], pkey=d257["pkey"], sl=d257["sl"], qp2=d257["qp2"])
            return
        guid = self.lids.owner(issuer)
        node = self.graph.nodes.get(guid) if guid is not None else None
        if not self._dirty and not self._trap_unknown:
            self._trap_cpu_ns = time.process_time_ns()
        if node is not None and node.is_switch:
            self._dirty.setdefault(node.guid, now)
        elif not self._trap_unknown:
            self._trap_unknown = now
        if self._light_scope is not None:
            self._light_scope.cancel()
        self._wake.set()

    def _on_sm_info(self, req: SimRequest) -> None:
        """Another SM's SubnGet/SubnSet(SMInfo), handed to us by our HCA port (IsSM): a Set's
        AttributeModifier goes to the election (HANDOVER, ACKNOWLEDGE, ...); both are answered
        with our SMInfo, directed route back along the request's path or LID-routed."""
        self.stats["sm_info"] += 1
        dr = req.mgmt_class == 0x81
        method = req.method
        modifier = struct.unpack_from("!I", req.mad, 20)[0]
        if not dr and (not req.slid or req.slid == 0xFFFF):
            self.events.emit(Kind.SM_INFO, from_lid=req.slid, answered=False, method=method, dr=dr)
            return
        if method == mb.GET and self.election.state is el.SmState.MASTER:
            self._note_peer()  # an SM polls us: it may outrank us (then we hand the subnet over)
        if method == mb.SET:
            try:
                sender = el.SmInfo.unpack(mb.smp_data(req.mad)).guid
            except ValueError:
                sender = 0
            acts = self.election.on_set(modifier, sender, _trio_ns())
            if acts and self._nursery is not None:
                self._nursery.start_soon(self._act, acts)
        resp = bytearray(req.mad)
        resp[3] = mb.GET_RESP
        if dr:
            resp[4] |= 0x80  # direction: returning, along the request's return path
        info = self.election.on_get(self.act_count())
        resp[64:64 + el.SM_INFO_LEN] = info.pack()
        self._queue_out(bytes(resp), PERMISSIVE_LID if dr else req.slid)
        self.events.emit(Kind.SM_INFO, from_lid=req.slid, answered=True, method=method, modifier=modifier,
                         state=info.state.name.lower(), dr=dr)

    def _queue_out(self, mad: bytes, dlid: int) -> None:
        try:
            self._out_send.send_nowait((mad, dlid))
        except trio.WouldBlock:
            self.stats["outbox_full"] += 1

    def _pass_coming(self) -> bool:
        """A trap's pass runs or is about to (the master's loop takes traps up at once)."""
        return ((self._trap_pass or bool(self._dirty) or bool(self._trap_unknown))
                and self.up.is_set() and self.election.state is el.SmState.MASTER)

    async def _outbox(self) -> None:
        """Sends what ``_queue_out`` queued, in order. A TrapRepress waits for the pass its
        trap starts (at most the SMP timeout): sent at once, it took the SM's CPU on the way
        to that pass's first SMP (~0.05 ms a trap, two traps a cut cable, hand-timed), and a
        device repeats an unrepressed trap only after seconds."""
        async for mad, dlid in self._out_recv:
            if mad[3] == mb.TRAP_REPRESS and self._pass_coming():
                with trio.move_on_after(self.timers.timeout_s):
                    while self._pass_coming():
                        await self._pass_over.wait()
            await self.transport.send_only(mad, dlid=dlid)
            if mad[3] == mb.TRAP_REPRESS:
                self.stats["trap_repress"] += 1

    # ------------------------------------------------------------------ sweeps

    def _begin(self, reason: str, *, lazy: bool = False) -> tuple[int, Counter[str]]:
        """A pass starts (``lazy``: its record written with the next, its ``sweep_end`` at the
        latest)."""
        self.sweeps += 1
        self._sweeping = True
        self.events.emit(Kind.SWEEP_START, lazy=lazy, sweep=self.sweeps, reason=reason)
        return self.events.now(), Counter(self.transport.stats)

    def _end(self, reason: str, t0: int, before: Counter[str], **fields: Any) -> None:
        self._sweeping = False
        smps = dict(Counter(self.transport.stats) - before)
        self.events.emit(Kind.SWEEP_END, sweep=self.sweeps, reason=reason,
                         seconds=(self.events.now() - t0) / 1e9, nodes=len(self.graph.nodes),
                         smps=smps, **fields)

    async def full_sweep(self, reason: str = "cold") -> bool:
        """Discover everything, assign LIDs, route, program, activate. True when up."""
        t0, before = self._begin(reason)
        known = set(self.graph.nodes)
        self.prog.suspects.clear()
        self._check.clear()
        if reason == "takeover":  # another SM wrote the tables since: nothing we wrote is known
            for guid in known:
                self.prog.forget(guid)
            self._pkeys_written.clear()
            self.routes = None
        self._offload(True)
        try:
            return await self._full_sweep(reason, t0, before, known)
        finally:
            self._offload(True)
            # unanswered for good (every early return too: the SM's own port silent): a
            # repair sweep soon, backing off while they stay unanswered (``timers``)
            unanswered = self.transport.stats["failed"] > before["failed"]
            self._repair_due = self._repair_due + 1 if unanswered else 0

    def _offload(self, kernel: bool) -> None:
        if self.offload is not None:
            try:
                self.offload(kernel)
            except Exception:
                log.exception("offload hint failed")

    async def _full_sweep(self, reason: str, t0: int, before: Counter[str], known: set[int]) -> bool:
        await self.disc.discover()
        g = self.graph
        for guid in set(g.nodes) - known:
            self.prog.forget(guid)
        self.events.emit(Kind.DISCOVERED, switches=len(g.switches()), cas=len(g.cas()),
                         links=sum(1 for n in g.nodes.values() for _ in n.neighbors()) // 2,
                         seconds=(self.events.now() - t0) / 1e9)
        if g.sm_guid not in g.nodes:
            self.events.emit(Kind.ERROR, what="the SM's own port did not answer")
            self._end(reason, t0, before, ok=False)
            return False
        if not await self._elect():  # another SM is (or is to be) master: we stand by
            self._end(reason, t0, before, ok=False, state=self.election.state.name.lower())
            return False
        self.recompute_paths()
        new = self.lids.assign(g)
        self.sm_lid = g.nodes[g.sm_guid].ports[self.disc.sm_port].lid
        self.prog.sm_guid, self.prog.sm_port, self.prog.sm_lid = g.sm_guid, self.disc.sm_port, self.sm_lid
        self.events.emit(Kind.LIDS_ASSIGNED, new=len(new), total=len(self.lids.by_guid), sm_lid=self.sm_lid)
        self._offload(False)  # PortInfo and P_Key Sets: the agents answer
        await act.set_lids(self.disc, self.sm_lid, keys=self._keys)
        await act.set_pkeys(self.disc)
        self._pkeys_written.clear()  # a heavy sweep writes every table again
        await self._program_partitions()
        self._offload(True)  # LFT Sets: the kernel
        ok = await self._route_and_program(None)
        self._offload(False)  # SwitchInfo Sets, activation
        top = self.lids.top
        await act.set_switch_info(self.disc, [s.guid for s in g.switches()], top=top)
        if self.config.qos is not None and reason == "cold":  # ports still in Init: OperationalVLs may change
            from ibemu.sm.qos import program_qos  # only with QoS configured (start-up)

            counts = await program_qos(self.disc, self.config.qos)
            log.info("QoS programmed: %s", counts)
            self.stats.update({f"qos_{k}": v for k, v in counts.items()})
        n = await act.activate(self.disc, lid_routed=ok and self.config.lid_routed_activation)
        self.events.emit(Kind.PORTS_ACTIVE, sets=n, ports=len(act.link_ends(self.disc)))
        # SMPs unanswered after every retry left nodes undiscovered, ports not Active or blocks
        # unwritten: not up yet, the cold sweep runs again (as OpenSM resweeps after errors), up
        # to ``unclean_cold_sweeps`` times; then SUBNET UP all the same, the light sweeps finish
        # the job (a machine too loaded to answer within the timeouts must still come up)
        failed = self.transport.stats["failed"] - before["failed"]
        if failed and reason == "cold":
            self._unclean += 1
            self.events.emit(Kind.ERROR, what=f"{failed} SMPs unanswered after every retry"
                             + (": sweeping again" if self._unclean <= self.config.unclean_cold_sweeps else ""))
        if ok and reason in ("cold", "takeover") and not self.up.is_set() and (
                reason == "takeover" or not failed or self._unclean > self.config.unclean_cold_sweeps):
            self.events.emit(Kind.SUBNET_UP, seconds=(self.events.now() - t0) / 1e9, nodes=len(g.nodes),
                             ports=len(act.link_ends(self.disc)), reason=reason)
            self.up.set()
        self._end(reason, t0, before, ok=ok)
        if ok:
            self._dumps_wake.set()
        return ok

    async def _program_partitions(self) -> None:
        """The partitions' P_KeyTables and enforcement bits (``ibemu.sm.partitions``), where
        they differ from what was written before."""
        parts = self.config.partitions
        if parts is None or not parts.partitions:
            return
        from ibemu.sm.partitions import program_partitions  # only with partitions (start-up)

        counts = await program_partitions(self.disc, parts, self._pkeys_written)
        self.stats.update({f"partition_{k}": v for k, v in counts.items()})
        if counts["tables"] or counts["ports"] or counts["failed"]:
            self.events.emit(Kind.PARTITIONS_PROGRAMMED, tables=counts["tables"], ports=counts["ports"],
                             failed=counts["failed"])

    def _compute(self, ends: list[tuple[int, int]] | None) -> Routes:
        if ends is not None and self.routes is not None and self.reroute_fn is not None:
            try:
                return self.reroute_fn(self.graph, self.routes, ends)
            except Exception:
                log.exception("incremental reroute failed; recomputing")
                self.stats["reroute_errors"] += 1
        return self.route_fn(self.graph, self.config.engine)

    async def _route_and_program(self, info: dict[str, Any] | None,
                                 ends: list[tuple[int, int]] | None = None, *,
                                 recompute: bool = True, first: set[int] | None = None,
                                 between: Callable[[], Awaitable[object]] | None = None) -> bool:
        """Route (``recompute=False``: keep the routes, write what is still unwritten) and
        program. With ``info`` (a trap or light sweep) unresponsive switches are not waited
        for once a trap waits (see the module docstring).

        Make before break: the switches in ``first`` (back from a reboot, new) get their
        tables, then ``between`` runs (their LinearFDBTop, the new cables' ports to Active),
        and only then do the other switches get routes that lead through them."""
        t = self.events.now()
        try:
            routes = self._compute(ends) if recompute or self.routes is None else self.routes
        except Exception as exc:
            log.exception("routing engine %s failed", self.config.engine)
            self.events.emit(Kind.ERROR, what=f"routing failed: {exc!r}")
            return False
        t_routed = self.events.now()
        self.events.emit(Kind.ROUTES_COMPUTED, t_ns=t_routed, lazy=info is not None, engine=routes.engine,
                         seconds=(t_routed - t) / 1e9, switches=len(routes.lfts))
        self.routes = routes
        early = None
        if first:
            stage = Routes(engine=routes.engine, lfts={g: routes.lfts[g] for g in first if g in routes.lfts})
            early = await self.prog.program(self.graph, stage, self.lids.top)
        if between is not None:
            await between()
        if info is None:
            res = await self.prog.program(self.graph, routes, self.lids.top)
        else:
            res = await self.prog.program(self.graph, routes, self.lids.top, urgent=self._wake,
                                          on_suspect=self._on_suspect)
        cpu_done = time.process_time_ns()
        if early is not None:
            res = res.after(early)
        if self.config.local_failover and self._adaptive():
            self._groups_due = True
            if not (info is not None and self._wake.is_set()):  # a trap waits: after it
                await self._program_groups()
        self._reprogram = res.failed > 0
        self._snapshot_due = True
        self.events.emit(Kind.LFT_PROGRAMMED, blocks=res.acked, failed=res.failed, abandoned=res.abandoned,
                         switches=res.switches, seconds=(self.events.now() - t_routed) / 1e9)
        if info is not None:
            if self._pass_cpu_ns:  # a trap's pass: this process's CPU from the trap to the last ack
                info["cpu_ms"] = (cpu_done - self._pass_cpu_ns) / 1e6
            info.update(t_route_start=t, t_routed=t_routed, t_planned=res.t_planned_ns,
                        t_programmed=res.t_last_ack_ns or self.events.now(),
                        blocks=res.acked, blocks_failed=res.failed, blocks_abandoned=res.abandoned,
                        suspects=[f"{g:#018x}" for g in res.suspects])
        return res.failed == 0

    async def _program_groups(self) -> None:
        """The adaptive engine's groups for the current routes (a reroute's computed now,
        after its LFTs), then every switch's FailoverConfig with a new generation: the
        switches end their own repairs, these routes replace them."""
        routes = self.routes
        if routes is None:
            return
        if routes.alternates is None:
            routes.alternates = self._refresh_alternates(routes)
        self._generation += 1
        alt = await self.prog.program_alternates(self.graph, routes.alternates, self.lids.top,
                                                 generation=self._generation)
        self._groups_due = alt.failed > 0
        if alt.repaired:  # their tables hold their own repairs: the SM's routes again, in full
            for guid in alt.repaired:
                self.prog.written.pop(guid, None)
            redo = await self.prog.program(self.graph, Routes(engine=routes.engine, lfts={
                g: routes.lfts[g] for g in alt.repaired if g in routes.lfts}), self.lids.top)
            self.stats["tables_rewritten"] += len(alt.repaired)
            self.stats["table_blocks_rewritten"] += redo.acked
        self.events.emit(Kind.GROUPS_PROGRAMMED, generation=self._generation, blocks=alt.acked,
                         failed=alt.failed, switches=alt.switches, tables_rewritten=len(alt.repaired))
        self.stats["alt_blocks"] += alt.acked
        self.stats["alt_blocks_failed"] += alt.failed

    def _adaptive(self) -> bool:
        """The engine writes alternates (``ftree_ar``, ``updn_ar``)."""
        entry = getattr(importlib.import_module("ibemu.sm.routing"), "ENGINES", {}).get(self.config.engine)
        return bool(getattr(entry, "adaptive", False))

    def _refresh_alternates(self, routes: Routes) -> dict[int, dict[int, tuple[int, ...]]]:
        """The adaptive engine's checked alternates for ``routes`` (after a reroute, which
        computes primaries only); none when they fail the check (the old ones are cleared)."""
        mod = importlib.import_module("ibemu.sm.routing.alternates")
        try:
            ar = mod.refresh_ar(self.graph, self.config.engine, routes)
        except Exception as exc:  # RoutingError, or an engine state the rule cannot read
            log.warning("%s: no alternates after the reroute (%s)", self.config.engine, exc)
            return {}
        self.stats["alt_refreshes"] += 1
        return dict(ar.alternates)

    def _on_suspect(self, guid: int, why: str = "unanswered") -> None:
        """A switch did not answer (or looks dead from its neighbours): check it next pass."""
        node = self.graph.nodes.get(guid)
        self.prog.suspects.add(guid)
        if why == "unanswered":
            self._unanswered.add(guid)
        self.events.emit(Kind.SUSPECT, guid=f"{guid:#018x}", desc=node.desc if node else "", why=why)
        self._check.add(guid)
        self._wake.set()

    async def _check_suspects(self, guids: set[int]) -> list[Change]:
        """Read the suspects' cables from their neighbours (dead ones unlinked), then one
        NodeInfo each; a suspect that does not answer is dropped: every cable of it unlinked
        (``link_down``), the far ends still up remembered as unresponsive (the light sweep
        probes them again, so a switch that was only slow comes back).

        The gateway (the switch at the far end of the SM's own cable, which every directed
        route crosses) gets its NodeInfo too, sent after the suspects', as the control of the
        probes: when even it does not answer within ``suspect_probe_s``, the silence is the
        SM's side's (a loaded machine answering late; a stall of the agents), not the
        suspects', and nobody is dropped: the suspects stay, checked again next pass. The
        gateway itself is never dropped here: were it gone, the SM's own port would be down
        (the light sweep's ``_own_port_ok`` then reports everything lost); dropping it
        would cut the SM off from the whole subnet on one late answer."""
        g = self.graph
        self.disc.recompute_paths()  # routes around the suspects where there is a way
        facing = sorted({(peer, pp) for s in guids if s in g.nodes for _n, peer, pp in g.nodes[s].neighbors()
                         if peer in g.nodes and g.nodes[peer].is_switch and peer not in guids})
        changes = await self.disc._check_ports(facing)
        cut_off = self.disc.recompute_paths()  # all its cables down: nothing left to ask
        # unanswered, and cables of it going down: dying, no need to ask again
        dying = {c.peer[0] for c in changes if c.peer is not None} & self._unanswered
        cut_off |= dying
        gateway = self._gateway()
        probed = [guid for guid in sorted(guids - cut_off) if guid in g.nodes and guid != gateway]
        if gateway is not None:
            probed.append(gateway)  # last: behind every suspect's probe
        alive = await self._probe(probed)
        trusted = gateway is None or gateway in alive
        if not trusted:
            log.warning("the SM's own switch did not answer NodeInfo within %.0f ms: %d suspects kept, "
                        "checked again next pass", self.config.suspect_probe_s * 1e3, len(guids - alive))
        for guid in guids:
            node = g.nodes.get(guid)
            if node is None:
                continue
            if guid in alive:
                self.prog.suspects.discard(guid)
                continue
            if guid in cut_off - dying:
                continue  # unreachable: the caller drops it (``partition``)
            if not trusted:  # the gateway among them (trusted: it answered)
                self._check.add(guid)  # not woken for: the next pass (a trap, the light sweep's time)
                continue
            for num, peer, pp in list(node.neighbors()):
                far = g.nodes.get(peer)
                if far is not None and far.is_switch and self.disc.phys((peer, pp)) == PHYS_LINK_UP:
                    self.disc.unresponsive.add((peer, pp))
                self.disc.unlink(guid, num)
                changes.append(Change("down", guid, num, (peer, pp)))
            self.events.emit(Kind.SWITCH_DROPPED, guid=f"{guid:#018x}", desc=node.desc)
        return changes

    def _gateway(self) -> int | None:
        """The switch at the far end of the SM's own cable (None: no cable, or a CA there)."""
        sm = self.graph.nodes.get(self.graph.sm_guid)
        port = sm.ports.get(self.disc.sm_port) if sm is not None else None
        far = self.graph.nodes.get(port.peer[0]) if port is not None and port.peer is not None else None
        return far.guid if far is not None and far.is_switch else None

    async def _probe(self, guids: list[int]) -> set[int]:
        """One NodeInfo (``suspect_probe_s``, no retry) to each of ``guids``, sent in that
        order in one pass; those that answered as themselves."""
        replies = await self.transport.request_many(
            [mb.dr_smp(mb.GET, 0x0011, path=list(self.graph.nodes[guid].dr_path)) for guid in guids],
            timeout_s=self.config.suspect_probe_s, retries=0)
        return {guid for guid, r in zip(guids, replies, strict=True)
                if r is not None and r.ok and mb.parse_node_info(r.data).node_guid == guid}

    async def _check_far_ends(self, guids: set[int]) -> None:
        """The far switches of cables just found down: are their other cables down too (a
        switch dying, whose neighbours' traps may never come)? Read from the other ends."""
        g = self.graph
        ends = sorted({(peer, pp) for s in guids if s in g.nodes for _n, peer, pp in g.nodes[s].neighbors()
                       if peer in g.nodes and g.nodes[peer].is_switch and peer not in self._dirty})
        with trio.move_on_after(self.timers.timeout_s):
            await self.disc.read_ends(ends)
        for guid in guids:
            node = g.nodes.get(guid)
            if node is None or guid in self.prog.suspects:
                continue
            if any(self.disc.phys((peer, pp)) not in (0, PHYS_LINK_UP) for _n, peer, pp in node.neighbors()):
                self._on_suspect(guid, "cables")

    def snapshot(self) -> dict[str, Any]:
        """LIDs, names, cables and LFTs as this SM last wrote them (``ibemu sm routes``)."""
        nodes = {f"{g:#018x}": {"desc": n.desc, "switch": n.is_switch, "lid": n.lid,
                                "ports": {str(num): [f"{p.peer[0]:#018x}", p.peer[1]]
                                          for num, p in n.ports.items() if p.peer is not None}}
                 for g, n in self.graph.nodes.items()}
        lfts = {f"{g:#018x}": self._lft_view(g, lft) for g, lft in (self.routes.lfts.items() if self.routes else [])}
        return {"t_ns": self.events.now(), "engine": self.routes.engine if self.routes else None,
                "sm_guid": f"{self.graph.sm_guid:#018x}", "sm_lid": self.sm_lid, "nodes": nodes, "lfts": lfts}

    def _lft_view(self, guid: int, lft: dict[int, int]) -> dict[str, int]:
        """A switch's LFT as the snapshot shows it; reused while the routes keep the same
        table (an incremental reroute copies only the tables it changes)."""
        cached = self._lft_views.get(guid)
        if cached is not None and cached[0] is lft and cached[1] == len(lft):
            return cached[2]
        view = {str(lid): port for lid, port in sorted(lft.items())}
        self._lft_views[guid] = (lft, len(lft), view)
        return view

    async def _snapshots(self) -> None:
        """Keep ``config.state_path`` current, at most every half second (``timers.housekeeping_s``:
        at most a second of real time under dilation), off the trio thread,
        and never while a sweep runs or a trap waits (building it holds the loop for ms)."""
        path = self.config.state_path
        if not path:
            return
        while True:
            await trio.sleep(self.timers.housekeeping_s)
            if not self._snapshot_due or self._sweeping or self._dirty or self._trap_unknown:
                continue
            self._snapshot_due = False
            data = self.snapshot()

            def write(data: dict[str, Any] = data) -> None:
                tmp = f"{path}.tmp"
                with open(tmp, "w") as f:
                    json.dump(data, f)
                os.replace(tmp, path)

            await trio.to_thread.run_sync(write)

    def render_dumps(self) -> dict[str, str]:
        """OpenSM's dump files (``ibemu.sm.dumps``) of the subnet as this SM last set it up."""
        from ibemu.sm import dumps  # only for dumps (start-up)

        lfts = self.routes.lfts if self.routes else {}
        return dumps.render(self.graph, self.disc.port_info, lfts, self.lids.by_guid, self.lids.top)

    def _pass_pending(self) -> bool:
        return self._sweeping or bool(self._dirty) or bool(self._trap_unknown)

    async def _dumps(self) -> None:
        """Write ``config.dump_dir``'s files after each heavy sweep and reroute (woken by
        them), each by an atomic rename, the files written off the trio thread. Built on the
        loop a piece at a time (``dumps.iter_render``), yielding between pieces; a pass that
        begins meanwhile (a trap, a sweep) is let finish and the files are built again after
        it, once."""
        where = self.config.dump_dir
        if not where:
            return
        from ibemu.sm import dumps  # only with a dump directory (start-up)

        while True:
            await self._dumps_wake.wait()
            while self._pass_pending():
                await trio.sleep(self.timers.poll_s)
            self._dumps_wake = trio.Event()
            texts: dict[str, list[str]] = {name: [] for name in dumps.FILES}
            lfts = self.routes.lfts if self.routes else {}
            try:
                for name, chunk in dumps.iter_render(self.graph, self.disc.port_info, lfts, self.lids.by_guid,
                                                     self.lids.top):
                    texts[name].append(chunk)
                    await trio.sleep(0)
                    if self._pass_pending() or self._dumps_wake.is_set():
                        self._dumps_wake.set()  # the state moved under us: again, after that pass
                        break
                else:
                    await trio.to_thread.run_sync(self._write_dumps, where, texts)
                    self.stats["dumps"] += 1
                    self.events.emit(Kind.DUMPS_WRITTEN, dir=where, sweep=self.sweeps)
            except Exception as exc:  # the files are a view: never the SM's end
                log.error("cannot write OpenSM dump files in %s: %r", where, exc)
                self.stats["dump_errors"] += 1

    @staticmethod
    def _write_dumps(where: str, texts: dict[str, list[str]]) -> None:
        os.makedirs(where, exist_ok=True)
        for name, chunks in texts.items():
            path = os.path.join(where, name)
            with open(f"{path}.tmp", "w") as f:
                f.writelines(chunks)
            os.replace(f"{path}.tmp", path)

    def recompute_paths(self, avoid: set[int] | None = None) -> set[int]:
        """Re-derive directed routes (through ``avoid`` only where there is no other way);
        drop and report nodes that became unreachable."""
        lost = self.disc.recompute_paths(avoid)
        if lost:
            gone = self.disc.remove(lost)
            for node in gone:
                if node.is_switch:
                    self.prog.forget(node.guid)
                self.lost[node.guid] = node.desc or f"{node.guid:#018x}"
            cas = [n for n in gone if not n.is_switch]
            lost_names = sorted(n.desc or f"{n.guid:#018x}" for n in cas)
            reachable = sorted(n.desc or f"{n.guid:#018x}" for n in self.graph.cas())
            self.events.emit(Kind.PARTITION, lost=lost_names,
                             lost_switches=sum(1 for n in gone if n.is_switch),
                             peers_lost={ca: lost_names for ca in reachable} if lost_names else {})
            log.warning("fabric partitioned: %d nodes unreachable (%d CAs)", len(gone), len(cas))
        back = [g for g in self.lost if g in self.graph.nodes]
        for guid in back:
            del self.lost[guid]
        if back:
            self.events.emit(Kind.PARTITION_HEALED, nodes=len(back), still_lost=len(self.lost))
        return lost

    async def trap_sweep(self) -> None:
        """Re-discover the switches that sent traps, then reroute if anything changed."""
        dirty, self._dirty = self._dirty, {}
        unknown, self._trap_unknown = self._trap_unknown, 0
        self._pass_cpu_ns = self._trap_cpu_ns if dirty or unknown else 0
        stamps = [*dirty.values(), *([unknown] if unknown else [])]
        t_trap = min(stamps) if stamps else None  # None: only suspects to check
        guids = set(dirty)
        if unknown and not await self._own_port_ok():
            return
        if unknown:  # a LID we do not know (or of a node cut off): look at every switch
            guids |= {s.guid for s in self.graph.switches()}
        await self._resweep(guids, "trap", t_trap)

    async def light_sweep(self) -> None:
        """SwitchInfo of every switch; re-discover those with PortStateChange set.

        A trap that reports a change ends it (``deferred``), unanswered SMPs and all: a light
        sweep that met the cut the trap is about waited out its SMPs' timeouts and retries
        (~0.8 s at k=8, one instrumented run's SM log) before the trap's pass could start,
        which then came ~0.85 s after the trap; the next pass handles the trap, and the next
        light sweep comes a sweep interval later as usual."""
        self._pass_cpu_ns = 0
        if not await self._own_port_ok():
            return
        t0, before = self._begin("light")
        switches = [s.guid for s in self.graph.switches()]
        with trio.CancelScope() as scope:  # a trap ends it (``_on_trap``): the trap sweep first
            self._light_scope = scope
            try:
                infos = await self.disc.read_switch_info(switches)
            finally:
                self._light_scope = None
        if scope.cancelled_caught:
            self._end("light", t0, before, changed=0, deferred=True)
            return
        guids = {g for g, si in infos.items() if si[11] & 0x04}
        guids |= {end[0] for end in self.disc.unresponsive if end[0] in self.graph.nodes}
        reset = self._reset_switches(infos)
        missing = [g for g in switches if g not in infos]
        self._end("light", t0, before, changed=len(guids), unanswered=len(missing), reset=len(reset))
        if guids or reset or self._reprogram:
            await self._resweep(guids | reset, "light", None, reset=reset)

    def _reset_switches(self, infos: dict[int, bytes]) -> set[int]:
        """Switches whose LinearFDBTop is not ours: rebooted (or reset) behind our back."""
        top = self.lids.top
        out = {g for g, si in infos.items() if struct.unpack_from("!H", si, 6)[0] != top}
        for guid in out:
            self.prog.forget(guid)
        return out

    async def _own_port_ok(self) -> bool:
        """Our own cable: down -> everything is lost (reported); back -> a full sweep.

        Our own port's PortInfo unanswered after every retry is not taken for the cable
        down (it was: the whole subnet reported lost, then swept afresh, when the SM's side
        was only late, a loaded machine): nothing is learnt, this pass is skipped and the
        next one asks again."""
        sm = self.graph.nodes.get(self.graph.sm_guid)
        num = self.disc.sm_port
        port = sm.ports.get(num) if sm is not None else None
        r = await self.transport.request(mb.dr_smp(mb.GET, 0x0015, path=[], modifier=num))
        if r is None:
            log.warning("our own port's PortInfo went unanswered: this pass skipped")
            return False
        up = r.ok and r.data[33] >> 4 == 5
        if port is None or (up and port.peer is None):
            if up:
                await self.full_sweep("recover")
            return False
        if not up and port.peer is not None:
            self.disc.unlink(self.graph.sm_guid, num)
            self.events.emit(Kind.LINK_DOWN, guid=f"{self.graph.sm_guid:#018x}", port=num, peer=None)
            self.recompute_paths()
        return up

    async def _resweep(self, guids: set[int], reason: str, t_trap: int | None, *,
                       reset: set[int] | None = None) -> None:
        """Re-discover ``guids`` and act on what changed. ``reset``: switches known to have
        lost their configuration (LIDs, LFT), rewritten in full.

        The pass's records up to its programming are lazy (``EventLog.emit``): its
        ``lft_programmed``, ``reroute`` or ``sweep_end`` writes them, in order, with their own
        stamps, instead of a file write and flush each on the way to the first LFT Set
        (~0.03 ms each, hand-timed: ~0.13 ms of a k=8 cut's reroute)."""
        t0, before = self._begin(reason, lazy=True)
        if not self.up.is_set():
            self._end(reason, t0, before, changed=0, deferred=True)
            return
        known = set(self.graph.nodes)
        check, self._check = {g for g in self._check if g in self.graph.nodes}, set()
        changes: list[Change] = await self._check_suspects(check) if check else []
        self._unanswered -= check
        guids = {g for g in guids if g not in check}
        changes += await self.disc.refresh(guids, verify=True)
        read = set(self.disc.read_all)  # every port read (a second ``refresh`` below starts its own set)
        t_rediscovered = self.events.now()
        for guid in set(self.graph.nodes) - known:
            self.prog.forget(guid)
        for c in changes:
            peer = f"{c.peer[0]:#018x}:{c.peer[1]}" if c.peer else None
            self.events.emit(LINK_CHANGE[c.kind], lazy=True, guid=f"{c.guid:#018x}", port=c.port, peer=peer)
        structural = [c for c in changes if c.kind in ("down", "up")]
        # a switch at the far end of a port that retrained may have rebooted in between
        peers = {c.peer[0] for c in changes if c.kind in ("up", "reinit") and c.peer}
        peers |= {c.guid for c in changes if c.kind == "reinit"}
        peers = {g for g in peers if g in self.graph.nodes and self.graph.nodes[g].is_switch}
        reset = set(reset or ())
        if peers - reset:
            reset |= self._reset_switches(await self.disc.read_switch_info(sorted(peers - reset)))
        if reset - guids:
            changes += await self.disc.refresh(reset - guids)  # its ports, as they are now
        for guid in reset:
            await self.disc.read_port0(guid)
        retrained = [c.peer for c in changes if c.kind == "reinit" and c.peer]
        if retrained:
            await self.disc.read_ends(retrained)
            lost_lid = [e for e in retrained if e[0] in self.graph.nodes and not self.graph.nodes[e[0]].is_switch
                        and self.disc.port_info.get(e, b"\0" * 64)[16:18] == b"\0\0"]
            if lost_lid:  # a CA that rebooted: its LID goes back
                self.lids.assign(self.graph)
                await act.set_lids(self.disc, self.sm_lid, lost_lid, keys=self._keys)
        info: dict[str, Any] = {}
        if structural or reset:
            # Far ends of cables found down, unless they answered this pass themselves (they
            # trapped too: alive, and their other cables were just read first-hand).
            far = {c.peer[0] for c in structural if c.kind == "down" and c.peer is not None
                   and c.guid not in check and c.peer[0] not in check}
            far = {f for f in far if f in self.graph.nodes and self.graph.nodes[f].is_switch
                   and f not in self.disc.answered}
            # their neighbours are asked around them, not through them: one pass finds the
            # new routes and steers them clear of the far ends; none when nothing changes
            cut = [((c.guid, c.port), c.peer) for c in structural if c.kind == "down" and c.peer is not None]
            only_cuts = not reset and len(cut) == len(structural) and not set(self.graph.nodes) - known
            if not only_cuts or not self.disc.paths_hold(cut, far):
                self.recompute_paths(avoid=far)
                far &= set(self.graph.nodes)
            if not only_cuts:  # cables gone bring no port that lacks its LID or P_Key
                self.lids.assign(self.graph)
                # only ports whose LID is not what we gave them are written: new ports, and
                # nodes that come back (rebooted: no LID), whose GUIDs keep their LIDs
                await act.set_lids(self.disc, self.sm_lid, keys=self._keys)
                await act.set_pkeys(self.disc)
                again = reset | (set(self.graph.nodes) - known)  # rebooted or new: tables empty
                for k in [k for k in self._pkeys_written if k[0][0] in again]:
                    del self._pkeys_written[k]
                await self._program_partitions()
            ends = [(c.guid, c.port) for c in structural]
            ends += [c.peer for c in structural if c.peer is not None]
            top = self.lids.top
            # switches back from a reboot (or new) are programmed before routes lead into them
            fresh = {g for g in (reset | (set(self.graph.nodes) - known))
                     if g in self.graph.nodes and self.graph.nodes[g].is_switch}
            ups = [e for c in structural if c.kind == "up" for e in ((c.guid, c.port), c.peer) if e is not None]

            async def make_ready() -> None:
                """The fresh switches' LinearFDBTop, then the new cables' ports to Active."""
                if fresh:
                    await act.set_switch_info(self.disc, sorted(fresh), top=top)
                if ups:
                    await act.activate(self.disc, ups)

            # A far end whose own trap came while this pass read (``_dirty``: alive a moment
            # ago; the next pass reads its cables first-hand) is checked after the programming,
            # not beside it: its Gets and their answers took the SM's CPU between the LFT
            # Sets' answers (~0.3 ms of a k=8 cut, hand-timed). The others, beside it.
            late = far & set(self._dirty)
            async with trio.open_nursery() as n:
                if far - late:  # beside the programming: not on a single cable's fast path
                    n.start_soon(self._check_far_ends, far - late)
                await self._route_and_program(info, ends, first=fresh,
                                              between=make_ready if fresh or ups else None)
            if late:
                await self._check_far_ends(late)
            stale = [s.guid for s in self.graph.switches() if act.fdb_top(self.disc, s.guid) != top]
            await act.set_switch_info(self.disc, stale, top=top)
        elif self._reprogram:  # blocks a pass left unwritten (abandoned, unanswered)
            await self._route_and_program(info, recompute=False)
        if changes or reset:
            await act.activate(self.disc)
        # clear PortStateChange of the switches whose every port was read: one that did not
        # answer them all keeps it, so the light sweep reads it again (was: cleared all the
        # same, and a cut whose PortInfo went unanswered was never found, the routes left
        # through it)
        present = [g for g in guids if g in self.graph.nodes and g in read]
        await act.set_switch_info(self.disc, present, top=None)
        if structural or reset or info:
            rec = {"t_trap": t_trap, "t_rediscovered": t_rediscovered, **info,
                   "issuers": len(guids), "changes": len(changes), "reset": len(reset), "reason": reason}
            self.events.emit(Kind.REROUTE, **rec)
            self._dumps_wake.set()
        self._end(reason, t0, before, changed=len(changes))
