"""The agent host: one trio process running every device agent of a fabric on real sockets.

For each node it owns one AF_PACKET socket per cabled port (ethertype 0x88B5, so on a switch
with the kernel datapath it only sees what tc did not forward: VL15, its own LID, unroutable
frames) and one netlink link monitor per namespace. The monitors are read by a thread of
their own (``kernel.carrier``), which writes a switch port's carrier into the kernel's port
map at once (local failover) and then hands the change to this loop; a cable cut or a switch
powered off by ibemu's fault injector (``set_ports``, ``power``) is told to that thread as loss
of signal the moment it is cut, before the kernel's notification. It feeds frames and
carrier changes to the sans-IO agents (``ibemu.agents``) and carries out their actions: transmit, program the
switch's LFT in the kernel (a BPF map update, ``ibemu.kernel.lft_map``), act on a link, hand
MADs to a CA's MAD socket, log events.

On the kernel datapath the common SMPs never reach it: the kernel SMA (``ibemu.kernel.sma``,
``open_kernel_sma``) relays, forwards and answers them from the state each agent publishes
(``DeviceAgent.sma_images``; the switch's raw LFT is shared memory, ``Lft.bind``). The host
republishes what may have changed after everything an agent does that can change it: an SMP
Set it answered, a port state change, an M_Key state change (``MKeyChange``: a violation, a
lease started, stopped or run out), IsSM from a MAD socket, a rebooted node; always before
anything the agent sent in answer leaves. What reaches the agents is read in batches
(``_kernel_reader``): the frames waiting on every socket are answered one after the other,
then the images they changed are republished once per node with one system call, then the
answers go out, in order (the images are never older than a response the SM holds). CAs are
ticked only while they have a deadline (trap repeats, an M_Key lease). Lazy event records
(``events.LAZY``) wait while the agents are busy (``_ticker``).

One process scales: sockets are created by entering each namespace from this thread before
trio starts; afterwards they stay bound to their namespace.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import select
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ibemu import clock
from ibemu.agents.actions import (
    Action,
    AltUpdate,
    DeliverMad,
    Event,
    LftUpdate,
    LinkRequest,
    LinkRequestKind,
    MKeyChange,
    PartitionUpdate,
    PortStateChange,
    Send,
)
from ibemu.agents.device import DeviceAgent
from ibemu.agents.forwarder import AdaptiveRouting, Forwarder, Reason
from ibemu.events import FabricLog, Kind
from ibemu.fabric.build import BuiltFabric
from ibemu.fabric.linkplane import LinkPlane
from ibemu.fabric.plan import NodePlan
from ibemu.kernel import cpus, netns, rtnl, sockfilter
from ibemu.kernel.carrier import CarrierChange, CarrierThread
from ibemu.kernel.carrier import Stop as carrier_stop
from ibemu.kernel.commands import KernelError
from ibemu.kernel.dr_relay import FRAME_LEN as MGMT_FRAME_LEN
from ibemu.kernel.dr_relay import DrRelay
from ibemu.kernel.elf import LoadError
from ibemu.kernel.lft_map import MapLft
from ibemu.kernel.linkevents import LinkEvent, open_link_monitor
from ibemu.kernel.notice import NoticeLog, announce_loss
from ibemu.kernel.notice import warm as warm_notices
from ibemu.kernel.packet import ETH_P_IB, close_all, open_packet_socket, send_holding_gil
from ibemu.kernel.ring import RxBatcher, TxBatcher
from ibemu.kernel.sma import KernelSma, SmaLog
from ibemu.kernel.sma import load as load_kernel_sma
from ibemu.kernel.tc import KernelLft
from ibemu.kernel.tc_netlink import BlockFilters
from ibemu.physics.link import SwitchModel, default_switch_model
from ibemu.physics.plan import build_nodes

log = logging.getLogger(__name__)
SMA_LOG_DELAY_S = 0.002
"""How long the kernel SMA's log reader waits after a burst's first record (real time)."""

ETH_LEN = 14
MAD_AT = ETH_LEN + 28
BATCH_FRAMES = 32
"""Frames the agents answer at most before their answers go out (``_kernel_reader``)."""
_SMA_SET_ATTRS = (0x0012, 0x0015, 0x0016, 0xFF31)
"""What an SMP Set the agent answered may change in the kernel SMA's images."""
TICK_S = 0.05
LAZY_BUSY_S = 1.0
"""How long lazy event records wait at most while the agents have frames to answer (real time)."""
LAZY_BUSY_RECORDS = 512
"""Lazy event records written at most per tick while the agents are busy (a few ms)."""
LAZY_IDLE_RECORDS = 256
"""Lazy event records written at most per tick while the agents are idle: a k=8 bring-up's
~3,400 went out in one pause of this loop at its first idle tick (~9 ms, timed by hand on a
quiet machine), which a cable cut right after SUBNET UP can meet; in pieces of this size
(under 1 ms) they drain in ~0.7 s."""


@dataclass(slots=True)
class _Touched:
    """What changed of one node's kernel SMA images in a batch: PortInfo of these ports
    (SwitchInfo with them: its PortStateChange bit), P_KeyTables of these, SwitchInfo."""

    port_info: set[int] = field(default_factory=set)
    pkeys: set[int] = field(default_factory=set)
    switch_info: bool = False
    failover: bool = False
    """A FailoverConfig Set: its image (the kernel's notice program reads it)."""

    def note_state_changes(self, actions: Iterable[Action]) -> None:
        """The ports whose state or M_Key state ``actions`` change (their PortInfo images)."""
        for a in actions:
            if isinstance(a, PortStateChange | MKeyChange):
                self.port_info.add(a.port)


class Agent(Protocol):
    """What the host needs of a device agent (``ibemu.agents.device.DeviceAgent``)."""

    node_guid: int

    def receive(self, port: int, packet: bytes | bytearray | memoryview) -> list[Action]: ...
    def link_up(self, port: int) -> list[Action]: ...
    def link_down(self, port: int) -> list[Action]: ...
    def link_retrained(self, port: int) -> list[Action]: ...
    def tick(self, now_ns: int | None = None) -> list[Action]: ...


MadSink = Callable[[DeliverMad], None]


SWITCH_INTERVAL_S = 0.0005
"""The GIL hand-over interval of a process that runs agents (see ``AgentHost.serve``)."""
CUT_HANDOVER_WAIT_S = 0.002
"""How long ``set_ports`` waits, after telling the carrier thread of a cut, for the agents'
loop to take it up before it asks the kernel to close the interfaces."""
CARRIER_TIMINGS = 4096
"""Carrier changes whose step stamps ``AgentHost.carrier_timings`` keeps (the last ones)."""


@dataclass(frozen=True, slots=True)
class CarrierTiming:
    """The steps of one carrier change (``clock.now_ns()`` stamps): the carrier thread read the
    notification (``seen``) and wrote the port map (``written``, 0: no map to write), then
    this loop took it up (``notified``) and had done with it (``done``: the agent's actions,
    its trap 128 among them, carried out)."""

    node: str
    port: int
    up: bool
    seen: int
    written: int
    notified: int
    done: int


@dataclass
class NodeRuntime:
    plan: NodePlan
    agent: Agent
    sockets: dict[int, socket.socket] = field(default_factory=dict)
    eth: dict[int, bytes] = field(default_factory=dict)
    by_ifindex: dict[int, int] = field(default_factory=dict)
    carrier: dict[int, bool] = field(default_factory=dict)
    monitor: socket.socket | None = None
    mad_sink: MadSink | None = None
    tx_dropped: int = 0
    """Frames the agent's sends lost (the user datapath's sender counts its own by switch
    name: ``TxBatcher.dropped``)."""
    rx_runts: int = 0
    powered: bool = True
    """A powered-off node (switch_down) neither hears nor sends anything."""
    vl15_loss: float = 0.0
    """Probability that a management (VL15) frame reaching this node's agent is lost."""
    vl15_dropped: int = 0


def lazy_flush(busy: bool) -> tuple[float, int]:
    """What a tick of ``AgentHost._ticker`` writes of the lazy event records: ``EventLog.flush``'s
    (waited_s, at_most), never more than a few ms of encoding, busy or idle."""
    return (LAZY_BUSY_S, LAZY_BUSY_RECORDS) if busy else (0.0, LAZY_IDLE_RECORDS)


class AgentHost:
    """Runs ``agents`` (node name -> agent) on the sockets of ``fabric``."""

    def __init__(self, fabric: BuiltFabric, agents: Mapping[str, Agent], *,
                 events: FabricLog | None = None, datapath: str = "kernel",
                 switch_model: SwitchModel | None = None,
                 adaptive: AdaptiveRouting | None = None) -> None:
        """``datapath`` "user": switches forward in this process (their agent's forwarder),
        their egress ports timed by the link model (``fabric.linkplane``; ``switch_model``:
        latency and buffers, default by the fabric's rate). Every IB cable has a rate (4x EDR
        by default), so the model always applies there: there is no opt-out."""
        self.fabric = fabric
        self.datapath = datapath
        self.events = events or FabricLog(None)
        self.nodes: dict[str, NodeRuntime] = {
            name: NodeRuntime(fabric.plan.nodes[name], agent) for name, agent in agents.items()
        }
        self.lft_ops = 0
        self.notices_in_kernel = 0
        """Fault notices the kernel handled (``kernel.notice``), as its records told."""
        self._early_actions: deque[tuple[str, list[Action]]] = deque()
        """Events of the fault notices sent at a cut from the carrier thread, for the loop."""
        self.frames_served = 0
        """Frames the agents took from their sockets (``_kernel_reader``)."""
        self._opened = False
        self._delays_ns: dict[str, dict[int, int]] = {}
        self._rng = random.Random(0)
        self._nursery: trio.Nursery | None = None
        self.dr_relay: DrRelay | None = None
        self._lft_lock = threading.Lock()  # power() clears an LFT from a worker thread
        self._relay_ids: dict[str, int] = {}
        self._notice_ns: dict[str, int] = {}
        """Switch -> its namespace, open (``netns.open_fd``) where the kernel announces a cut."""
        self._relay_on: dict[str, bool] = {}
        self._tx: TxBatcher | None = None
        """The user datapath's sender (a worker thread batching frames into sendmmsg)."""
        self._switch_peers: dict[tuple[str, int], tuple[NodeRuntime, int]] = {}
        """(switch, port) -> the neighbour switch's runtime and port, on the user datapath."""
        self.switch_model = switch_model or default_switch_model(fabric.plan.topology.defaults.rate, ethernet=False)
        self.physics_on = datapath == "user"
        self.adaptive = adaptive if datapath == "user" else None
        """Adaptive routing over the SM's groups (``Forwarder.adapt``, decided in the link
        model); None: the LFTs' ports (and local failover) only."""
        self.links: LinkPlane | None = None
        """The user datapath's link model and its IO (``fabric.linkplane``)."""
        self.kernel_sma: KernelSma | None = None
        """The eBPF SMA of every node (``ibemu.kernel.sma``); None: the agents (and at most
        the DR relay) do it all."""
        self._sma_slots: dict[str, int] = {}
        self.port_listeners: list[Callable[[str, int], None]] = []
        """Called (node, port) on this thread after a port's carrier or state changed
        (``fabric.sysfs`` rewrites its tree then)."""
        self.carrier_thread: CarrierThread[str] | None = None
        """Reads every namespace's link notifications and writes port state into the kernel's
        maps before this loop hears of it (``kernel.carrier``); runs while ``serve`` does."""
        self.carrier_timings: deque[CarrierTiming] = deque(maxlen=CARRIER_TIMINGS)
        self._ifindex_of: dict[tuple[str, int], int] = {}
        """(node, port) -> its interface's index, for ``set_ports``' loss of signal."""
        self.loss_of_signal = True
        """``set_ports`` tells the carrier thread of the ends it cuts (a PHY's loss of signal);
        False: the kernel's notifications alone tell (``bench_local_failover --loss-of-signal
        off`` compares the two)."""
        self._carrier_taken = threading.Event()
        """Set by the loop each time it has taken a batch of carrier changes (``set_ports``
        waits for it, bounded by ``CUT_HANDOVER_WAIT_S``)."""
        self._loop_thread: int | None = None
        """The thread of this host's trio loop (``serve``)."""
        self._cpus: set[int] | None = None

    # ------------------------------------------------------------------ set-up (sync)

    def open(self) -> None:
        """Open every socket (blocking; before trio or from a worker thread)."""
        self._cpus = os.sched_getaffinity(0)  # the carrier thread's (this loop's gets pinned)
        for name, rt in self.nodes.items():
            ns = rt.plan.ns
            with netns.entered(ns):  # once for all of this node's sockets
                index = rtnl.ifindexes(ns, [pp.ifname for pp in rt.plan.ports.values()])
                # A CA's agent hears only QP0/QP1: data QPs belong to the host's transport.
                bpf = None if rt.plan.is_switch else sockfilter.CA_MANAGEMENT
                for port, pp in rt.plan.ports.items():
                    rt.sockets[port] = open_packet_socket(ns, pp.ifname, ETH_P_IB, bpf=bpf)
                    rt.eth[port] = pp.peer_mac + pp.mac + ETH_P_IB.to_bytes(2, "big")
                    rt.by_ifindex[index[pp.ifname]] = port
                rt.monitor = open_link_monitor(ns)
                # Carrier as it is now (after the monitor exists, so no change is missed).
                down = set(rtnl.carrier_down(ns, [pp.ifname for pp in rt.plan.ports.values()]))
            rt.carrier = {port: pp.ifname not in down for port, pp in rt.plan.ports.items()}
            lft = self.fabric.lfts.get(name)
            if isinstance(lft, MapLft):  # local failover: the kernel knows which ports are down
                for port in sorted(p for p, up in rt.carrier.items() if not up):
                    lft.set_port_up(port, False)
            self._follow_links(name, rt)
        self._opened = True

    def _follow_links(self, name: str, rt: NodeRuntime) -> None:
        """Ports whose frames the kernel moves without the agent (every CA port: the HCA
        transport has its own socket; every switch port on the kernel datapath: tc forwards)
        count from the interfaces' statistics, from now on (``PortCounters.follow_link``)."""
        if rt.plan.is_switch and self.datapath != "kernel":
            return
        agent: Any = rt.agent
        if not hasattr(agent, "link_counters"):
            return

        def refresh(ports: Sequence[int]) -> None:
            ifnames = {rt.plan.ports[p].ifname: p for p in ports if p in rt.plan.ports}
            try:
                stats = rtnl.link_stats(rt.plan.ns, ifnames)
            except (OSError, KernelError) as exc:
                log.warning("%s: interface statistics unavailable: %s", name, exc)
                return
            ksma, dev = self.kernel_sma, self._relay_ids.get(name)
            for ifname, st in stats.items():
                port = ifnames[ifname]
                # and the SMPs the kernel SMA's walks carried across the cable without it
                vtx, vrx = ksma.walked(dev, port) if ksma is not None and dev is not None else (0, 0)
                agent.ports[port].counters.follow_link(st.tx_bytes + vtx * MGMT_FRAME_LEN,
                                                       st.rx_bytes + vrx * MGMT_FRAME_LEN,
                                                       st.tx_packets + vtx, st.rx_packets + vrx)

        agent.link_counters = refresh
        refresh(list(rt.plan.ports))

    def keep_on_wire(self, name: str, port: int) -> None:
        """The cable at ``name``'s ``port`` carries every SMP relayed over it as a frame, both
        ways: the kernel SMA's walks no longer cross it (``KernelSma.keep_on_wire``), so that a
        capture of it sees what the switches send. Blocking (map updates)."""
        ksma = self.kernel_sma
        rt = self.nodes.get(name)
        if ksma is None or rt is None or port not in rt.plan.ports:
            return
        pp = rt.plan.ports[port]
        for node, p in ((name, port), (pp.peer_node, pp.peer_port)):
            dev = self._relay_ids.get(node)
            if dev is not None:
                ksma.keep_on_wire(dev, p)

    def open_dr_relay(self) -> None:
        """Kernel datapath: the device firmware's management hot path in eBPF. First the
        kernel SMA (``open_kernel_sma``: DR relays and the common SMPs answered in the kernel,
        on switches and CA ports); where it cannot run, the DR relay alone
        (``ibemu.kernel.dr_relay``, a bpf filter on each switch's tc block). Blocking (enters
        the namespaces). IBEMU_KERNEL_SMA=0 keeps the SMPs with the agents (the DR relay only);
        IBEMU_DR_RELAY=0 skips both."""
        if self.datapath != "kernel" or self.dr_relay is not None or self.kernel_sma is not None \
                or os.environ.get("IBEMU_DR_RELAY") == "0":
            return
        if os.environ.get("IBEMU_KERNEL_SMA") != "0" and self.open_kernel_sma():
            return
        switches = [(name, rt) for name, rt in self.nodes.items() if rt.plan.is_switch and rt.sockets]
        if not switches:
            return
        try:
            relay = DrRelay()
        except (OSError, KernelError) as exc:
            log.warning("directed-route SMPs stay with the agents (no eBPF relay: %s)", exc)
            return
        try:
            for sid, (name, rt) in enumerate(switches, 1):
                self._relay_ids[name] = sid
                self._relay_on[name] = on = rt.powered and not rt.vl15_loss
                for ifindex, port in rt.by_ifindex.items():
                    pp = rt.plan.ports[port]
                    relay.add_port(sid, port, ifindex, pp.mac, pp.peer_mac,
                                   up=rt.carrier.get(port, False), enabled=on)
                relay.attach(rt.plan.ns, prio=2)  # after the LFT (tc.KernelLft: prio 2)
        except (OSError, KernelError) as exc:
            log.warning("directed-route SMPs stay with the agents (attaching the eBPF relay failed: %s)", exc)
            relay.close()
            self._relay_ids.clear()
            return
        self.dr_relay = relay

    def open_kernel_sma(self) -> bool:
        """Load the kernel SMA and put it on every switch's tc block (after the LFT, where
        the DR relay would go) and every CA port's ingress; publish each agent's state to
        it. False (and one log line) where it cannot run: the caller falls back."""
        nodes = [(name, rt) for name, rt in self.nodes.items() if rt.sockets and hasattr(rt.agent, "sma_images")]
        if not nodes:
            return False
        t0 = clock.now_ns()
        n_switches = sum(1 for _n, rt in nodes if rt.plan.is_switch)
        entries = sum(len(rt.plan.ports) * (8 if rt.plan.is_switch else 12) + 8 for _n, rt in nodes)
        try:
            sma = load_kernel_sma(lft_slots=n_switches, attr_entries=max(4096, 2 * entries))
        except LoadError as exc:  # the verifier refused it: its name and its last words
            log.warning("SMPs are answered by the Python agents only: eBPF program %s rejected (%s)\n%s",
                        exc.name, exc.reason, exc.tail)
            return False
        except (OSError, KernelError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("SMPs are answered by the Python agents only (no eBPF SMA: %s)", first)
            return False
        try:
            slot = 0
            for dev, (name, rt) in enumerate(nodes, 1):
                self._relay_ids[name] = dev
                self._relay_on[name] = on = rt.powered and not rt.vl15_loss
                if rt.plan.is_switch:
                    self._sma_slots[name] = slot
                    slot += 1
                self._sma_device(sma, name, rt)
                for ifindex, port in rt.by_ifindex.items():
                    pp = rt.plan.ports[port]
                    sma.add_port(dev, port, ifindex, pp.mac, pp.peer_mac, up=rt.carrier.get(port, False), enabled=on)
                if rt.plan.is_switch:
                    sma.attach_switch(rt.plan.ns, prio=2)  # after the LFT (prio 2)
                    kernel_lft = self.fabric.lfts.get(name)
                    if isinstance(kernel_lft, MapLft):  # LID-routed SMPs: the SMA forwards them
                        kernel_lft.set_vl15_to_sma(True)
                else:
                    sma.attach_ports(rt.plan.ns, [pp.ifname for pp in rt.plan.ports.values()])
        except (OSError, KernelError) as exc:
            log.warning("SMPs are answered by the Python agents only (attaching the eBPF SMA failed: %s)", exc)
            for name, rt in nodes:  # the agents keep their own tables again
                kernel_lft = self.fabric.lfts.get(name)
                if isinstance(kernel_lft, MapLft):
                    kernel_lft.set_vl15_to_sma(False)
                lft_ = getattr(rt.agent, "lft", None)
                if lft_ is not None and name in self._sma_slots:
                    lft_.bind(memoryview(bytearray(lft_.cap)))
            self._relay_ids.clear()
            self._sma_slots.clear()
            sma.close()
            return False
        self.kernel_sma = sma
        if sma.notices is not None:  # the switches' namespaces, for the cut's announcements
            for name, rt in nodes:
                if name in self._relay_ids and hasattr(rt.agent, "mark_announced"):
                    self._notice_ns[name] = netns.open_fd(rt.plan.ns)
        log.info("kernel SMA on %d nodes (%d switches) in %.0f ms", len(nodes), n_switches,
                 (clock.now_ns() - t0) / 1e6)
        return True

    def _sma_device(self, sma: KernelSma, name: str, rt: NodeRuntime) -> None:
        """(Re)register a node's agent with the kernel SMA: its LFT in the shared memory,
        every image published afresh."""
        dev = self._relay_ids[name]
        agent: Any = rt.agent
        slot = self._sma_slots.get(name)
        lft_ = getattr(agent, "lft", None)
        if slot is not None and lft_ is not None:
            kernel_lft = self.fabric.lfts.get(name)
            prog = kernel_lft._prog if isinstance(kernel_lft, MapLft) else None
            lft_.bind(sma.lft_view(slot))
            sma.add_device(dev, is_switch=True, num_ports=agent.num_ports, lft_slot=slot,
                           lft_blocks=lft_.blocks, fwd_map_fd=prog.blocks.fd if prog else None,
                           alt_map_fd=prog.alts.fd if prog else None)
        else:
            sma.add_device(dev, is_switch=bool(rt.plan.is_switch), num_ports=agent.num_ports)
        sma.forget(dev)
        sma.publish(dev, agent.sma_images())

    def sma_refresh(self, name: str, *, ports: Iterable[int] | None = None,
                    attrs: Iterable[int] | None = None) -> None:
        """Republish what changed of node ``name``'s state to the kernel SMA (cheap when
        nothing did: only changed images are written)."""
        sma, dev = self.kernel_sma, self._relay_ids.get(name)
        if sma is None or dev is None:
            return
        agent: Any = self.nodes[name].agent
        sma.publish(dev, agent.sma_images(attrs=attrs, ports=ports))

    def _set_touches(self, rt: NodeRuntime, port: int, frame: bytes | memoryview, touched: _Touched) -> None:
        """The agent answered an SMP (``frame``, as received on ``port``) that may be a Set:
        note in ``touched`` which of the kernel SMA's images that Set can change."""
        if len(frame) < MAD_AT + 24 or frame[ETH_LEN] >> 4 != 15 or frame[MAD_AT + 3] != 2 \
                or frame[MAD_AT + 1] not in (0x01, 0x81):
            return
        attr = (frame[MAD_AT + 16] << 8) | frame[MAD_AT + 17]
        if attr not in _SMA_SET_ATTRS:
            return
        mod = int.from_bytes(frame[MAD_AT + 20:MAD_AT + 24], "big")
        switch = rt.plan.is_switch
        if attr == 0x0015:
            touched.port_info.add(mod & 0xFF if switch or mod & 0xFF else port)
        elif attr == 0x0016:
            touched.pkeys.add((mod >> 16) & 0xFF if switch else port)
        elif attr == 0xFF31:
            touched.failover = True
        else:
            touched.switch_info = True

    def _republish(self, touched: Mapping[str, _Touched]) -> None:
        """Write what the Sets and state changes noted in ``touched`` changed of each node's
        images into the kernel SMA: one system call for them all (``KernelSma.publish_many``)."""
        sma = self.kernel_sma
        if sma is None:
            return
        out: list[tuple[int, Mapping[tuple[int, int], bytes]]] = []
        for name, t in touched.items():
            dev = self._relay_ids.get(name)
            if dev is None:
                continue
            agent: Any = self.nodes[name].agent
            if t.port_info or t.switch_info:
                out.append((dev, agent.sma_images(attrs=(0x0012, 0x0015), ports=t.port_info)))
            if t.pkeys:
                out.append((dev, agent.sma_images(attrs=(0x0016,), ports=t.pkeys)))
            if t.failover:
                out.append((dev, agent.sma_images(attrs=(0xFF31,), ports=())))
        if out:
            sma.publish_many(out)

    def _sync_relay(self, name: str, rt: NodeRuntime) -> None:
        """A node's kernel SMA (or a switch's kernel relay) runs only while its agent would
        do the same itself: powered and without an SMP-loss fault."""
        sid = self._relay_ids.get(name)
        if sid is None or (self.dr_relay is None and self.kernel_sma is None):
            return
        on = rt.powered and not rt.vl15_loss
        if self._relay_on.get(name) != on:
            self._relay_on[name] = on
            if self.kernel_sma is not None:
                self.kernel_sma.set_enabled(sid, on)
            elif self.dr_relay is not None:
                self.dr_relay.set_enabled(sid, on)

    def _flush_lfts(self) -> None:
        """Before the namespaces go: empty the switches' tc blocks where the LFT is u32 filters
        (the fallback, ``tc.KernelLft``; see ``tc_netlink.BlockFilters.flush``), from a few
        threads. Blocking. An LFT in a BPF map leaves no mirred actions to flush."""
        names = [name for name, lft in self.fabric.lfts.items()
                 if isinstance(lft, KernelLft) and lft.installed and name in self.nodes]

        def flush(name: str) -> None:
            try:
                filters = BlockFilters(self.nodes[name].plan.ns, block=1, prio=2, protocol=ETH_P_IB)
            except (OSError, KernelError) as exc:
                log.debug("%s: no tc flush: %s", name, exc)
                return
            try:
                filters.flush()
            except (OSError, KernelError) as exc:
                log.debug("%s: tc flush: %s", name, exc)
            finally:
                filters.close()

        if names:
            with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
                list(pool.map(flush, names))

    def attach_mad_sink(self, node: str, sink: MadSink) -> None:
        """Where a CA's ``DeliverMad`` actions go (its MAD-socket server)."""
        self.nodes[node].mad_sink = sink

    def close(self) -> None:
        self._stop_carrier_thread()
        self._flush_lfts()
        if self.kernel_sma is not None and self.kernel_sma.lft_log is not None:
            self._log_kernel_lft_sets(self.kernel_sma.lft_log)  # the last ones, before the map goes
        if self.dr_relay is not None:
            self.dr_relay.close()
            self.dr_relay = None
        for fd in self._notice_ns.values():
            os.close(fd)
        self._notice_ns.clear()
        if self.kernel_sma is not None:
            for name in self._sma_slots:  # the agents keep their tables in their own memory again
                lft_ = getattr(self.nodes[name].agent, "lft", None)
                if lft_ is not None:
                    lft_.bind(memoryview(bytearray(lft_.cap)))
            self.kernel_sma.close()
            self.kernel_sma = None
        close_all(s for rt in self.nodes.values() for s in rt.sockets.values())
        for rt in self.nodes.values():
            rt.sockets.clear()
            if rt.monitor is not None:
                rt.monitor.close()
                rt.monitor = None
        self.events.close()

    # ------------------------------------------------------------------ running

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A worker thread (blocking netlink: power, links) must not hold the GIL for Python's
        # default 5 ms while the agents have SMPs to answer.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._loop_thread = threading.get_ident()
        if not self._opened:
            await trio.to_thread.run_sync(self.open)
        await trio.to_thread.run_sync(self.open_dr_relay)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                user: list[tuple[str, NodeRuntime]] = []
                kernel: list[tuple[str, NodeRuntime]] = []
                for name, rt in self.nodes.items():
                    forwarder = getattr(rt.agent, "forwarder", None) if self.datapath == "user" else None
                    if forwarder is not None:
                        self._apply_impairments(name, rt, forwarder)
                        user.append((name, rt))
                    elif rt.sockets:
                        kernel.append((name, rt))
                    # The cables were up before the agents existed: tell them.
                    for port, carrier in rt.carrier.items():
                        if carrier:
                            self.dispatch(name, rt, rt.agent.link_up(port))
                nursery.start_soon(self._carrier_events, self._start_carrier_thread())
                if user:
                    nursery.start_soon(self._user_datapath, user)
                if kernel:
                    nursery.start_soon(self._kernel_reader, kernel)
                nursery.start_soon(self._ticker)
                if self.kernel_sma is not None and self.kernel_sma.lft_log is not None:
                    nursery.start_soon(self._kernel_ring, self.kernel_sma.lft_log, self._log_kernel_lft_sets)
                if self.kernel_sma is not None and self.kernel_sma.notice_log is not None:
                    nursery.start_soon(self._kernel_ring, self.kernel_sma.notice_log, self._kernel_notices)
                task_status.started()
        finally:
            self._stop_carrier_thread()

    def _start_carrier_thread(self) -> trio.MemoryReceiveChannel[list[CarrierChange[str]]]:
        """Start the carrier thread (``kernel.carrier``) over every node's link monitor; its
        changes come to this loop on the channel returned."""
        send, receive = trio.open_memory_channel[list[CarrierChange[str]]](math.inf)
        token = trio.lowlevel.current_trio_token()

        def deliver(changes: list[CarrierChange[str]]) -> None:  # on this loop
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                send.send_nowait(changes)

        def hand_over(changes: list[CarrierChange[str]]) -> None:  # in the carrier thread
            ends = []  # every port map written first (a cut's two ends), then the notices
            for ch in changes:
                rt = self.nodes.get(ch.key)
                port = rt.by_ifindex.get(ch.ifindex) if rt is not None else None
                if not ch.carrier and ch.t_written_ns and rt is not None and port is not None and rt.powered:
                    ends.append((ch.key, rt, port))
            if ends:
                try:
                    self._announce_early(ends)
                except Exception:  # the loop's link_down announces what is left
                    log.exception("early fault notices failed")
            try:
                token.run_sync_soon(deliver, changes)
            except trio.RunFinishedError:
                raise carrier_stop from None

        monitors = {name: rt.monitor for name, rt in self.nodes.items() if rt.monitor is not None}
        carrier = {(name, ifindex): rt.carrier.get(port, False)
                   for name, rt in self.nodes.items() for ifindex, port in rt.by_ifindex.items()}
        ifindex_of = self._ifindex_of = {(name, port): ifindex for name, rt in self.nodes.items()
                                         for ifindex, port in rt.by_ifindex.items()}
        peers = {(name, ifindex_of[(name, port)]): (pp.peer_node, ifindex_of[(pp.peer_node, pp.peer_port)])
                 for name, rt in self.nodes.items() for port, pp in rt.plan.ports.items()
                 if (name, port) in ifindex_of and (pp.peer_node, pp.peer_port) in ifindex_of}
        self.carrier_thread = CarrierThread(monitors, carrier, act=self._carrier_act, hand_over=hand_over,
                                            peers=peers, cpus=self._cpus)
        self.carrier_thread.start()
        return receive

    def _stop_carrier_thread(self) -> None:
        if self.carrier_thread is not None:
            self.carrier_thread.close()
            self.carrier_thread = None

    async def _kernel_reader(self, nodes: list[tuple[str, NodeRuntime]]) -> None:
        """Kernel datapath: what reaches the agents (VL15 the kernel SMA passed up, traps,
        MADs for the CAs), in one task over one epoll set of every agent socket.

        Each round takes one frame from each socket that has one (level-triggered: a socket
        with more is ready again in the next round), until none has, or ``BATCH_FRAMES``
        frames were taken; the agents answer them one after the other (``_serve_batch``).
        Then, first, what their Sets and state changes changed of the kernel SMA's images
        is written, once per node and with one system call (``_republish``), and only then
        is anything they answered sent (``dispatch``): an SMP the kernel answers after the
        SM has a response already sees every Set answered before it. (A task per socket
        republished after each Set, with a trio wake-up and an ``epoll_ctl`` per socket that
        had a frame: the republishing alone was ~20% of this thread's busy time in a k=8
        bring-up, a py-spy profile.) A batch's first response waits for the batch's last
        frame to be answered: ``BATCH_FRAMES`` bounds that."""
        ep = select.epoll()
        by_fd: dict[int, tuple[str, NodeRuntime, int, socket.socket]] = {}
        try:
            for name, rt in nodes:
                for port, sock in rt.sockets.items():
                    by_fd[sock.fileno()] = (name, rt, port, sock)
                    ep.register(sock.fileno(), select.EPOLLIN)
            while True:  # one batch a wake-up: the loop's other tasks get their turn between
                await trio.lowlevel.wait_readable(ep.fileno())
                ready = ep.poll(0)
                if ready:
                    self._serve_batch([by_fd[fd] for fd, _ in ready], ep)
        finally:
            ep.close()

    def _serve_batch(self, ready: list[tuple[str, NodeRuntime, int, socket.socket]], ep: select.epoll) -> None:
        """One batch of ``_kernel_reader``: frames from the ``ready`` sockets, round after
        round, answered; the images republished; the answers carried out, in order."""
        done: list[tuple[str, NodeRuntime, list[Action]]] = []
        touched: dict[str, _Touched] = {}
        sma = self.kernel_sma is not None
        n = 0
        while ready:
            for name, rt, port, sock in ready:
                try:
                    frame = sock.recv(9216)
                except BlockingIOError:
                    continue
                except OSError as exc:  # interface went away under us
                    log.debug("%s port %d: recv: %s", name, port, exc)
                    continue
                n += 1
                if len(frame) <= ETH_LEN:
                    rt.rx_runts += 1
                    continue
                if not rt.powered or (rt.vl15_loss and self._lose_vl15(rt, frame)):
                    continue
                actions = rt.agent.receive(port, memoryview(frame)[ETH_LEN:])
                if sma:
                    t = touched.get(name)
                    if t is None:
                        t = touched[name] = _Touched()
                    self._set_touches(rt, port, frame, t)
                    t.note_state_changes(actions)
                if actions:
                    done.append((name, rt, actions))
            if n >= BATCH_FRAMES:
                break
            more = {fd for fd, _ in ep.poll(0)}
            ready = [r for r in ready if r[3].fileno() in more]  # the rest wait for the next batch
        self.frames_served += n
        if touched:
            self._republish(touched)
        for name, rt, actions in done:
            self.dispatch(name, rt, actions, republished=True)

    async def _user_datapath(self, switches: list[tuple[str, NodeRuntime]]) -> None:
        """User datapath: every frame of every switch port goes through its switch's forwarder,
        in this one task.

        One epoll set over all the switches' port sockets: one trio wake-up serves every
        port that has frames, and a port's waiting frames are taken with one ``recvmmsg``
        (``kernel.ring.RxBatcher``); sends go out in batches from a worker thread
        (``kernel.ring.TxBatcher``). Each batch goes receive ->
        decide -> a list per egress port -> send (``_forward_batch``), so what happens
        between deciding and sending (a per-egress scheduler) has one place to go.
        """
        for name, rt in switches:  # the neighbour switch at each port, if it is one of these
            for port, pp in rt.plan.ports.items():
                peer = self.nodes.get(pp.peer_node)
                if peer is not None and peer.plan.is_switch:
                    self._switch_peers[(name, port)] = (peer, pp.peer_port)
        ep = select.epoll()
        by_fd: dict[int, tuple[str, NodeRuntime, int, socket.socket]] = {}
        rx = RxBatcher()
        self._tx = TxBatcher()
        if self.physics_on:
            self.links = self._link_plane()
            self.links.tx = self._tx
            if self._nursery is not None:
                self._nursery.start_soon(self.links.serve)
        try:
            for name, rt in switches:
                for port, sock in rt.sockets.items():
                    by_fd[sock.fileno()] = (name, rt, port, sock)
                    ep.register(sock.fileno(), select.EPOLLIN)
            while True:
                await trio.lowlevel.wait_readable(ep.fileno())
                for fd, _ in ep.poll(0):
                    name, rt, port, sock = by_fd[fd]
                    frames = rx.recv_batch(sock)
                    if frames and rt.powered:
                        self._forward_batch(name, rt, port, frames)
        finally:
            ep.close()
            if self.links is not None:
                with contextlib.suppress(OSError):  # the last interval's link fidelity
                    self.links.report_links(final=True)
                # a credit loop closed since the ticker last looked (50 ms of emulated time apart:
                # at a high dilation, longer than a short run) still reaches the fabric log
                try:
                    self.links.plane.run_events(clock.now_ns())
                    self.links.check_loops()
                except Exception:  # teardown goes on; the datapath's figures are out already
                    log.exception("the last credit-loop check failed")
                self.links.tx = None
                self.links.close()
            self._tx.close()
            self._tx = None

    def _link_plane(self) -> LinkPlane:
        """The model of the fabric (every switch and host, every cable; ``physics.plan``)."""
        topo = self.fabric.plan.topology
        nodes = build_nodes(topo, kind="ib", switch=self.switch_model)

        def sock(name: str, port: int) -> socket.socket | None:
            return self.nodes[name].sockets.get(port)

        def head(name: str, port: int) -> bytes:
            return self.nodes[name].eth[port]

        def powered(name: str) -> bool:
            return self.nodes[name].powered

        def counts(name: str, port: int, deltas: dict[str, int]) -> None:
            add = getattr(self.nodes[name].agent, "add_counts", None)
            if add is not None and deltas:
                add(port, **deltas)

        def decide(name: str, port: int, frame: bytes) -> tuple[int, bytes] | None:
            rt = self.nodes[name]
            forwarder = getattr(rt.agent, "forwarder", None)
            if forwarder is None or not rt.powered:
                return None
            verdict = forwarder.decide(frame[ETH_LEN:], port, count_traffic=False)
            return (verdict.port, rt.eth[verdict.port] + verdict.packet) if verdict.port else None

        def adapt(name: str, port: int, frame: bytes, egress: int, now: int, load: Callable[[int], int]) -> int:
            rt = self.nodes[name]
            forwarder = getattr(rt.agent, "forwarder", None)
            if forwarder is None or not rt.powered:
                return egress
            if forwarder.adaptive is not self.adaptive:  # a rebooted switch's new forwarder
                forwarder.adaptive = self.adaptive
            moved: int = forwarder.adapt(frame, ETH_LEN, port, egress, now, load)
            return moved

        def deliver(name: str, port: int, frames: list[bytes]) -> None:  # as if read on its socket
            rt = self.nodes[name]
            if rt.powered and port in rt.sockets:
                self._forward_batch(name, rt, port, frames)

        def carrier(name: str, port: int) -> bool:
            return self.nodes[name].carrier.get(port, False)

        def where(name: str, port: int) -> tuple[str | None, str]:
            plan = self.nodes[name].plan
            return plan.ns, plan.ports[port].ifname

        return LinkPlane(nodes, self.switch_model, sockets=sock, heads=head, powered=powered,
                         events=self.events, counts=counts, decide=decide,
                         adapt=adapt if self.adaptive is not None else None,
                         deliver=deliver, carrier=carrier, where=where)

    def _forward_batch(self, name: str, rt: NodeRuntime, port: int, frames: list[bytes]) -> None:
        """Frames received on a switch's ``port``: the forwarder's fast twin takes the plain
        data frames (``Forwarder.forward_run``), the reference ``decide`` every other one, in
        order, and the SMA what is for it; then each egress port's list goes out."""
        agent = rt.agent  # per batch: a rebooted switch gets a new agent and forwarder
        forwarder: Forwarder = agent.forwarder  # type: ignore[attr-defined]
        eth = rt.eth
        out: dict[int, list[bytes]] = {}
        peer = self._switch_peers.get((name, port))
        good = peer is not None and peer[0].agent.forwarder.vouches_for(peer[1])  # type: ignore[attr-defined]
        links = self.links if peer is not None else None  # credits to settle with a neighbour switch
        if links is not None:
            links.begin()
        i, n = 0, len(frames)
        while True:
            i = forwarder.forward_run(frames, i, port, ETH_LEN, out, vcrc_known_good=good)
            if i >= n:
                break
            frame = frames[i]
            i += 1
            if len(frame) <= ETH_LEN:
                rt.rx_runts += 1
                continue
            verdict = forwarder.decide(frame[ETH_LEN:], port)
            if verdict.port:
                out.setdefault(verdict.port, []).append(eth[verdict.port] + verdict.packet)
            elif verdict.reason is Reason.TO_SMA:
                if rt.vl15_loss and self._lose_vl15(rt, frame):
                    continue
                if out:  # what was decided before is handed over before the SMA's answer (which
                    self._send_batches(name, rt, out, port)  # may still pass it: VL15 and the data
                    out = {}  # VLs are not ordered with each other on a real link either)
                self.dispatch(name, rt, agent.receive(port, verdict.packet))
                if not rt.powered:
                    return
        if out:
            self._send_batches(name, rt, out, port)
        if links is not None:
            links.settle(name, port, frames)

    def _send_batches(self, name: str, rt: NodeRuntime, out: dict[int, list[bytes]], in_port: int = 0) -> None:
        """Send each egress port's frames with its Ethernet header in place of the one they
        came with: through the link model (``self.links``), else after the port's injected
        delay if it has one."""
        if self.links is not None:
            self.links.submit(name, in_port, out)
            return
        delays = self._delays_ns.get(name)
        sockets = rt.sockets
        tx = self._tx
        assert tx is not None
        eth = rt.eth
        for egress, frames in out.items():
            sock = sockets[egress]
            delay = delays.get(egress) if delays else None
            if delay and self._nursery is not None:
                self._nursery.start_soon(self._send_later, name, sock, frames, eth[egress], delay)
            else:
                tx.send(sock, frames, name, eth[egress])

    async def _send_later(self, name: str, sock: socket.socket, frames: list[bytes], head: bytes,
                          delay_ns: int) -> None:
        await trio.sleep(delay_ns / 1e9)
        if self._tx is not None:
            self._tx.send(sock, frames, name, head)

    def _apply_impairments(self, name: str, rt: NodeRuntime, forwarder: Forwarder) -> None:
        """Per-link delay and loss from the topology, applied where a switch sends onto the link."""
        topo = self.fabric.plan.topology
        for port in rt.plan.ports:
            link = topo.link_at(name, port)
            if link is None:
                continue
            if link.loss_pct:
                forwarder.set_impairment(port, loss=link.loss_pct / 100.0)
            if link.delay_us:
                self._delays_ns.setdefault(name, {})[port] = int(link.delay_us * 1000)

    def impair(self, node: str, port: int, *, loss_pct: float = 0.0, corrupt_pct: float = 0.0,
               delay_us: float | None = None) -> None:
        """Change a switch port's injected loss/corruption/delay (user datapath only)."""
        forwarder = getattr(self.nodes[node].agent, "forwarder", None)
        if self.datapath != "user" or forwarder is None:
            raise ValueError("loss, corruption and delay injection need the user datapath on a switch")
        forwarder.set_impairment(port, loss=loss_pct / 100.0, corrupt=corrupt_pct / 100.0)
        if delay_us is not None:
            self._delays_ns.setdefault(node, {})[port] = int(delay_us * 1000)
            if self.links is not None:  # the model's propagation is the cable's delay
                self.links.plane.set_propagation(node, port, delay_us * 1000.0)

    def _carrier_act(self, name: str, ev: LinkEvent) -> bool:
        """In the carrier thread (``kernel.carrier``), before anything else hears of the change:
        a switch with its LFT in a BPF map gets the port's state in its port map (one map
        update), and its classifier forwards the port's LIDs on their alternates from the
        next frame (``kernel.lft_map``). True when the map was written."""
        rt = self.nodes.get(name)
        port = rt.by_ifindex.get(ev.ifindex) if rt is not None else None
        lft = self.fabric.lfts.get(name)
        return port is not None and isinstance(lft, MapLft) and lft.set_port_up(port, ev.carrier)

    def _announce_early(self, ends: list[tuple[str, NodeRuntime, int]]) -> None:
        """In the carrier thread, switch ports lost, their port maps written: their fault
        notices leave now, not after the loop has heard of the change (0.4-4 ms later on
        this machine: README). Where the kernel handles the switch's notices, the kernel
        announces (``kernel.notice.announce_loss``: the notice program run on the LIDs the
        LFT sends to the port, in the switch's namespace, its clones sent from there; the
        agent marks them announced at once and takes the kernel's record later); it takes
        ~0.2 ms of this thread's Python per end off the path (``announce_port_lost`` of an
        aggregation switch above a k=8 cut: 180-250 us of CPU, hand-timed). Else the agent's
        ``announce_port_lost``. The ends go shortest first (fewest LIDs routed through the
        lost port: the least work before their notices leave, which minimizes the ends' mean
        wait), each sent as soon as computed, on the agents' sockets from this thread keeping
        the GIL (``packet.send_holding_gil``: each ``send`` let the loop take it for up to its
        switch interval; the kernel's runs keep it likewise). Their events go to the loop with
        the change."""
        def work(end: tuple[str, NodeRuntime, int]) -> int:
            lft = getattr(end[1].agent, "lft", None)
            return len(lft.lids_to(end[2])) if lft is not None else 0

        ksma = self.kernel_sma
        prog = ksma.notices.prog_fd if ksma is not None and ksma.notices is not None else None
        for name, rt, port in sorted(ends, key=work):
            announce = getattr(rt.agent, "announce_port_lost", None)
            if announce is None or not getattr(rt.agent, "notices", False):
                continue  # (notices off: nothing to announce, nothing to ask the kernel)
            ns_fd = self._notice_ns.get(name)  # (a switch of the kernel SMA with the notice programs)
            if prog is not None and ns_fd is not None:
                lids = getattr(rt.agent, "lft").lids_to(port)  # noqa: B009 - a switch agent
                if not lids:
                    continue
                with netns.entered_fd(ns_fd):  # the program's clones go to its devices
                    fresh = announce_loss(prog, self._relay_ids[name], port, self._ifindex_of[(name, port)], lids)
                if fresh is not None:
                    getattr(rt.agent, "mark_announced")(fresh)  # noqa: B009
                    continue
            actions = announce(port)
            rest = [a for a in actions if not isinstance(a, Send)]
            if rest:
                self._early_actions.append((name, rest))
            by_port: dict[int, list[bytes]] = {}
            for a in actions:
                if isinstance(a, Send):
                    by_port.setdefault(a.port, []).append(rt.eth[a.port] + a.packet)
            for egress, out in by_port.items():
                sock = rt.sockets.get(egress)
                rt.tx_dropped += len(out) if sock is None else send_holding_gil(sock, out)

    async def _carrier_events(self, receive: trio.MemoryReceiveChannel[list[CarrierChange[str]]]) -> None:
        """The carrier thread's changes, on this loop: everything but the map write."""
        async for changes in receive:
            while self._early_actions:  # what the carrier thread's early notices logged
                name, actions = self._early_actions.popleft()
                self.dispatch(name, self.nodes[name], actions)
            for ch in changes:
                rt = self.nodes.get(ch.key)
                port = rt.by_ifindex.get(ch.ifindex) if rt is not None else None
                if rt is None or port is None:
                    continue
                self._carrier_changed(ch.key, rt, port, ch.carrier, ch.t_seen_ns, ch.t_written_ns)
            self._carrier_taken.set()

    def _carrier_changed(self, name: str, rt: NodeRuntime, port: int, carrier: bool, t_carrier: int,
                         t_written: int) -> None:
        """A port's carrier changed (the kernel's port map has it already when ``t_written``):
        the log, the kernel SMA's port state, the agent (its trap 128), the link model, the
        listeners."""
        if rt.carrier.get(port) == carrier:
            return
        t_notified = clock.now_ns()
        lft = self.fabric.lfts.get(name)
        rt.carrier[port] = carrier
        if self.dr_relay is not None and name in self._relay_ids:
            self.dr_relay.set_carrier(self._relay_ids[name], port, carrier)
        if self.kernel_sma is not None and name in self._relay_ids:  # before the trap: the SM's
            self.kernel_sma.set_carrier(self._relay_ids[name], port, carrier)  # reads see it
        # the agent first: a frame the link model decides again below (``redecide``)
        # sees the port down, and the user datapath's forwarder fails over from now
        actions = rt.agent.link_up(port) if carrier else rt.agent.link_down(port)
        if self.links is not None:  # down: the port's queues are discarded; up: link
            if carrier:  # training re-initializes flow control
                self.links.plane.link_up(name, port, clock.now_ns())
            else:
                self.links.plane.link_down(name, port, clock.now_ns())
            self.links.pump()
        self.dispatch(name, rt, actions)  # the trap leaves here; the records after it
        if isinstance(lft, MapLft) and t_written and not carrier:
            moved = lft.failover_lids(port) if lft.has_alternates else 0
            if moved:  # LIDs of this port that the kernel sends to an alternate since t_written
                self.events.write(name, {"kind": Kind.LOCAL_FAILOVER, "t_ns": t_written,
                                         "port": port, "lids": moved, "carrier_t_ns": t_carrier})
        elif not carrier and self.datapath == "user" and not isinstance(lft, MapLft):
            self._user_failover_event(name, rt, port, t_carrier)
        self.events.write(name, {"kind": Kind.CARRIER, "t_ns": t_carrier, "port": port, "up": carrier})
        self.carrier_timings.append(CarrierTiming(name, port, carrier, t_carrier, t_written, t_notified,
                                                  clock.now_ns()))
        for listener in self.port_listeners:
            listener(name, port)

    def _user_failover_event(self, name: str, rt: NodeRuntime, port: int, t_carrier: int) -> None:
        """A ``local_failover`` record for the user datapath: the switch's forwarder sends the
        LIDs its LFT routes to ``port`` on an alternate from the next frame (``forwarder``);
        ``lids``: how many have an alternate up now. None: no record (as on the kernel path)."""
        failover_lids = getattr(rt.agent, "failover_lids", None)
        if failover_lids is None or getattr(rt.agent, "forwarder", None) is None:
            return
        moved = failover_lids(port)
        if moved:
            self.events.write(name, {"kind": Kind.LOCAL_FAILOVER, "t_ns": clock.now_ns(), "port": port,
                                     "lids": moved, "carrier_t_ns": t_carrier})

    async def _ticker(self) -> None:
        """Timer work of the agents that keep timers (switches: trap repeats), every
        ``TICK_S``; lazy event records go out, ``LAZY_IDLE_RECORDS`` a tick once the agents had a
        tick with no frame to answer, or ``LAZY_BUSY_RECORDS`` a tick once the oldest has waited
        ``LAZY_BUSY_S``:
        their encoding (~15% of this thread's time in a k=8 bring-up's activation, whose
        ~3,400 records wait) waits for the burst to end, and a long burst's records go out
        in pieces, not in one pause that would hold the agents' answers back. (Every node
        each tick cost a k=16 fabric's 1,344 agents ~2.5 ms of this thread per tick.)"""
        served = self.frames_served
        while True:
            await trio.sleep(TICK_S)
            busy, served = self.frames_served != served, self.frames_served
            waited_s, at_most = lazy_flush(busy)
            self.events.flush(waited_s=waited_s, at_most=at_most)
            if self.links is not None:  # in steps, a checkpoint between them (LinkPlane.tick_steps)
                for _ in self.links.tick_steps({name: rt.agent for name, rt in self.nodes.items()}):
                    await trio.lowlevel.checkpoint()
            now = clock.now_ns()
            for name, rt in self.nodes.items():
                if not rt.plan.is_switch and isinstance(rt.agent, DeviceAgent) and rt.agent.next_deadline() is None:
                    continue  # no timers (a CA's: trap 256 repeats, an M_Key lease)
                actions = rt.agent.tick(now)
                if actions:
                    self.dispatch(name, rt, actions)

    def set_vl15_loss(self, name: str, fraction: float) -> None:
        """Lose ``fraction`` of the VL15 frames reaching node ``name``'s agent (its kernel
        relay stops meanwhile: the agent relays every SMP itself, and loses some)."""
        rt = self.nodes[name]
        rt.vl15_loss = fraction
        self._sync_relay(name, rt)

    # ------------------------------------------------------------------ actions

    def _lose_vl15(self, rt: NodeRuntime, frame: bytes) -> bool:
        if frame[ETH_LEN] >> 4 != 15 or self._rng.random() >= rt.vl15_loss:
            return False
        rt.vl15_dropped += 1
        return True

    def set_ports(self, name: str, ports: Sequence[int], up: bool) -> int:
        """Set ports of a node administratively down (their cables cut: both ends lose carrier)
        or up; returns the fault's stamp (``clock.now_ns()`` as the cut is made). Blocking.

        Down, the cut is loss of signal at both ends of every cable at that stamp, as a PHY sees
        it: the carrier thread is told at once (``CarrierThread.signal_lost``: the switches'
        port maps written, the agents told), from this thread raised to SCHED_FIFO for the
        step (``cpus.realtime``); this thread then waits for the agents' loop to have taken the
        cut up (their traps sent), at most ``CUT_HANDOVER_WAIT_S``, and only then are the
        interfaces set down (``rtnl.LinkSet``, readied before the cut). Closing them at once
        woke the kernel's own notification of the near end, and the carrier thread (SCHED_FIFO)
        reading it, while the loop was taking the cut up: by hand-timing over 40 alternated
        k=4 cuts (not a benchmark), the loop took the cut up 0.30 ms after it (median) instead
        of 0.39, and had done with the first end 0.55 ms after instead of 0.69. The kernel's
        own word comes after its linkwatch work, an RCU grace period per device (0.2-81 ms for
        one cable here, longest on a quiet machine), and it handles a request for several
        devices one after the other, a grace period each inside the request (2-22 ms for a
        k=8 switch's 8 ports): the fabric no longer waits for either.
        Deviation: until the kernel has closed a veth, frames already in it and frames a host
        sends into it are still delivered (the switches' maps stop their own at once): at most
        that window's frames that a real cut would lose; the wait above widens it by the
        loop's pick-up (~0.3 ms, at most ``CUT_HANDOVER_WAIT_S``).
        Where the kernel announces the cut's fault notices (``_announce_early``), the system
        call that does it is made warm before the stamp (``kernel.notice.warm``: ~0.1 ms of a
        first call after the thread slept kept out of the fault's time, as the netlink request
        readied first is).
        Up, the kernel's notifications tell, as a link trains in its own time."""
        rt = self.nodes[name]
        ifnames = [rt.plan.ports[p].ifname for p in ports]
        thread, index = self.carrier_thread, self._ifindex_of
        if up or thread is None or not self.loss_of_signal:
            return rtnl.set_up(rt.plan.ns, ifnames, up)
        ends = [(name, port) for port in ports]
        ends += [(rt.plan.ports[port].peer_node, rt.plan.ports[port].peer_port) for port in ports]
        lost = [(node, index[(node, port)]) for node, port in ends if (node, port) in index]
        with rtnl.LinkSet(rt.plan.ns, ifnames, False) as request:  # readied first: sent at once after
            self._carrier_taken.clear()
            ksma = self.kernel_sma
            if ksma is not None and ksma.notices is not None and any(
                    getattr(self.nodes[n].agent, "notices", False) for n, _p in ends if n in self._notice_ns):
                warm_notices(ksma.notices.prog_fd)  # the cut's announcements' system call, warm
            with cpus.realtime():
                t = clock.now_ns()
                thread.signal_lost(lost)
            if threading.get_ident() != self._loop_thread:  # (from the loop itself: nobody to wait for)
                self._carrier_taken.wait(CUT_HANDOVER_WAIT_S)
            # (a request that fails here fails only for an interface gone with its namespace:
            # down is then what the kernel has as well)
            request.send()
        return t

    def power(self, name: str, on: bool, *, fresh_agent: Agent | None = None) -> int:
        """Switch a node off (every port down, it answers nothing) or on again.

        Switching on with ``fresh_agent`` replaces the agent, as a rebooted device comes back
        with no LID and an empty LFT; the kernel LFT is emptied likewise. Blocking (netlink).
        Returns when the ports' state change left for the kernel (``rtnl.set_up``'s stamp).

        Off: the ports go down first and the kernel LFT is emptied after, so that the switch
        stops forwarding when its links drop, which is when its neighbours can tell (emptying
        the table first blackholed everything through it while the table was scanned and
        cleared, 2 ms for a k=8 fabric's switch here, before any neighbour lost carrier). The
        ports go down through ``set_ports``: every cable's loss of signal is told at once, the
        dying switch's own port map says every port down (it forwards nothing from then on) and
        its neighbours' say the port facing it down; the kernel then closes the ports one after
        the other, an RCU grace period each, 2-22 ms for 8 ports here.
        """
        rt = self.nodes[name]
        ifnames = [pp.ifname for pp in rt.plan.ports.values()]
        lft = self.fabric.lfts.get(name)
        if not on:
            rt.powered = False
            self._sync_relay(name, rt)
            t = self.set_ports(name, list(rt.plan.ports), False)
            with self._lft_lock:
                if lft is not None and lft.installed:
                    lft.apply(dict.fromkeys(lft.installed, 0xFF))
            return t
        with self._lft_lock:
            if lft is not None and lft.installed:
                lft.apply(dict.fromkeys(lft.installed, 0xFF))
            if isinstance(lft, MapLft) and fresh_agent is not None:
                lft.clear_alternates()  # a rebooted switch has none
        if fresh_agent is not None:
            rt.agent = fresh_agent
            rt.carrier = dict.fromkeys(rt.plan.ports, False)
            self._follow_links(name, rt)
            forwarder = getattr(fresh_agent, "forwarder", None)
            if self.datapath == "user" and forwarder is not None:
                self._apply_impairments(name, rt, forwarder)  # the cables' own delay/loss
            if self.kernel_sma is not None and name in self._relay_ids:
                self._sma_device(self.kernel_sma, name, rt)
        rt.powered = True
        self._sync_relay(name, rt)
        return rtnl.set_up(rt.plan.ns, ifnames, True)

    def dispatch(self, name: str, rt: NodeRuntime, actions: Iterable[Action], *,
                 republished: bool = False) -> None:
        """Carry out a node's actions. ``republished``: the caller has written what they
        change of the kernel SMA's images already (``_serve_batch``)."""
        if not rt.powered:
            return
        if self.kernel_sma is not None and not republished:
            # port states and M_Key states the kernel SMA answers with change before anything
            # is sent (a response first would let the SM read the old state back from the
            # kernel; the kernel would hand the next SMP over where the agent would not)
            actions = list(actions)
            t = _Touched()
            t.note_state_changes(actions)
            if t.port_info:
                self._republish({name: t})
        for action in actions:
            if isinstance(action, Send):
                sock = rt.sockets.get(action.port)
                if sock is None:
                    rt.tx_dropped += 1
                    continue
                try:
                    sock.send(rt.eth[action.port] + action.packet)
                except (BlockingIOError, OSError):
                    rt.tx_dropped += 1  # carrier down or queue full: the wire drops it
            elif isinstance(action, Event):
                self.events.write(name, action.as_dict())
            elif isinstance(action, LftUpdate):
                self._program(name, action)
            elif isinstance(action, AltUpdate):
                self._program_alternates(name, action)
            elif isinstance(action, PartitionUpdate):
                lft = self.fabric.lfts.get(name)  # user datapath: the forwarder checks them itself
                if isinstance(lft, MapLft):
                    lft.set_partition(action.port, action.flags, list(action.pkeys))
            elif isinstance(action, DeliverMad):
                if rt.mad_sink is not None:
                    rt.mad_sink(action)
            elif isinstance(action, LinkRequest):
                self._link_request(name, rt, action)
            elif isinstance(action, PortStateChange):
                self.events.write(name, {"kind": Kind.PORT_STATE, "t_ns": clock.now_ns(),
                                         "port": action.port, "state": action.state.name.lower(),
                                         "phys": action.phys_state.name.lower()})
                for listener in self.port_listeners:
                    listener(name, action.port)


    def _program(self, name: str, action: LftUpdate) -> None:
        """Carry out an LFT change the switch's SMA accepted, at once: a map update per
        64-entry block that changed (``kernel.lft_map``; u32 filters on the fallback), so the
        kernel forwards on it before the next frame is read. Each write is an
        ``lft_programmed`` event stamped when the kernel has it."""
        lft = self.fabric.lfts.get(name)
        if lft is None:
            return  # user datapath: the forwarder reads the agent's LFT itself
        t0 = clock.now_ns()
        try:
            with self._lft_lock:
                ops = lft.apply(action.changes)
        except (OSError, KernelError) as exc:
            log.error("%s: LFT write failed: %s", name, exc)
            self.events.write(name, {"kind": Kind.LFT_ERROR, "t_ns": clock.now_ns(),
                                     "entries": len(action.changes), "error": str(exc)})
            return
        t1 = clock.now_ns()
        self.lft_ops += ops
        if action.local:  # the switch's own repair (a fault notice): logged by the agent
            return
        self.events.write(name, {"kind": Kind.LFT_PROGRAMMED, "t_ns": t1, "entries": len(action.changes),
                                 "ops": ops, "apply_us": (t1 - t0) // 1000, "queued_us": 0})

    def _program_alternates(self, name: str, action: AltUpdate) -> None:
        """Write alternate ports the switch's SMA accepted into the kernel's map beside the
        LFT (local failover; the u32 fallback and the user datapath do not fail over)."""
        lft = self.fabric.lfts.get(name)
        if not isinstance(lft, MapLft):
            return
        try:
            lft.set_alternates(action.first_lid, action.entries)
        except (OSError, KernelError) as exc:
            log.error("%s: alternates write failed: %s", name, exc)
            self.events.write(name, {"kind": Kind.LFT_ERROR, "t_ns": clock.now_ns(),
                                     "entries": len(action.entries) // 4, "error": str(exc)})

    async def _kernel_ring(self, ring: SmaLog | NoticeLog, take: Callable[[Any], None]) -> None:
        """Read a ring of the kernel SMA's records (its LFT Sets, ``_log_kernel_lft_sets``; the
        fault notices it handled, ``_kernel_notices``) with ``take``.

        Read ``SMA_LOG_DELAY_S`` after the first record of a burst, not at once: the ring
        wakes its reader only when the reader has caught up, so a reader that waits lets a
        reroute's 40-50 Sets go by with one wake-up instead of one each. Each of those
        wake-ups preempted the SM mid-send (it runs the kernel's round trip in its own
        system call): measured on k=8, the SM's ``send`` took 60-110 us a Set with the reader
        woken per record, 36-55 us without it. The records carry the kernel's stamps, so the
        events logged from them are as timely either way; the kernel has acted already."""
        while True:
            await trio.lowlevel.wait_readable(ring.fd)
            await trio.sleep(clock.loop_s(SMA_LOG_DELAY_S))
            take(ring)

    def _by_node(self, records: Iterable[Any]) -> Iterator[tuple[str, NodeRuntime, Any]]:
        """The kernel SMA's records (``rec.dev``: its device id) with their nodes; those of a
        device no node has (gone) are left out."""
        names = {dev: name for name, dev in self._relay_ids.items()}
        for rec in records:
            name = names.get(rec.dev)
            rt = self.nodes.get(name) if name is not None else None
            if name is not None and rt is not None:
                yield name, rt, rec

    def _log_kernel_lft_sets(self, ring: SmaLog) -> None:
        """Log the LFT Sets the kernel SMA answered, as the agent and ``_program`` would have
        (``kernel.sma``: one ring-buffer record per block Set that changed it)."""
        for name, rt, rec in self._by_node(ring.read()):
            t = clock.to_emulated_ns(rec.t_ns)
            guid = f"{getattr(rt.agent, 'node_guid', 0):#018x}"
            self.events.write(name, {"kind": Kind.LFT_SET, "t_ns": t, "node_guid": guid,
                                     "block": rec.block, "changed": rec.changed})
            self.lft_ops += 1
            self.events.write(name, {"kind": Kind.LFT_PROGRAMMED, "t_ns": t, "entries": rec.changed,
                                     "ops": 1, "apply_us": 0, "queued_us": 0})

    def _kernel_notices(self, ring: NoticeLog) -> None:
        """Hand the fault notices the kernel handled (``kernel.notice``) to their switch
        agents, which take the same state and log the events with the kernel's stamps
        (``SwitchAgent.notice_in_kernel``)."""
        for name, rt, rec in self._by_node(ring.read()):
            if rec.loss:  # its own port's loss of signal, announced by the kernel (_announce_early)
                lost = getattr(rt.agent, "lost_in_kernel", None)
                if lost is not None:
                    self.dispatch(name, rt, lost(rec.port, rec.fresh, rec.sent, clock.to_emulated_ns(rec.t_ns)))
                continue
            mirror = getattr(rt.agent, "notice_in_kernel", None)
            if mirror is None:
                continue
            self.notices_in_kernel += 1
            self.dispatch(name, rt, mirror(rec.port, rec.lids, rec.moved, rec.noted, rec.lost, rec.fresh,
                                           rec.sent, clock.to_emulated_ns(rec.t_ns)))

    @property
    def lft_backlog(self) -> int:
        """LFT entries the switches' SMAs accepted that the kernel does not have yet: none,
        every change is written when it is accepted (``_program``)."""
        return 0

    def _link_request(self, name: str, rt: NodeRuntime, action: LinkRequest) -> None:
        pp = rt.plan.ports.get(action.port)
        if pp is None:
            return
        links = self.fabric.links
        if action.kind is LinkRequestKind.DISABLE:
            links.set_up(rt.plan.ns, pp.ifname, False)
        elif action.kind is LinkRequestKind.ENABLE:
            links.set_up(rt.plan.ns, pp.ifname, True)
        elif action.kind is LinkRequestKind.RETRAIN:
            peer = self.nodes.get(pp.peer_node)
            if peer is not None:
                self.dispatch(pp.peer_node, peer, peer.agent.link_retrained(pp.peer_port))

