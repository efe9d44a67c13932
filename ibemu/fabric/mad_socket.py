"""A CA port's MAD socket wired to its agent: the backend ``UmadServer`` needs, and back.

Client requests become ``CaAgent.send_mad`` calls whose actions the agent host carries out
(the MADs leave as real packets); ``DeliverMad`` actions of that CA come back here and go to
the right client through ``UmadServer.deliver``.

OpenSM's slot is handed to the C twin of this path (``kernel.madtwin``) when it is built and
not turned off (``IBEMU_MADTWIN=0``): its directed-route SMPs then leave and return through
that process, as through an HCA, and only the rest (HopCount 0, which this CA's SMA answers,
GSI classes, traps, control) comes here. A client is OpenSM when its process's name is
``opensm`` (``/proc/PID/comm``; the client's PID is in its CONNECT). The twin's requests carry
no slot in TID bits 48-63 and time out after the same ``timeout_s``, in real time; its
counters are ``CaMadPort.twin_counters``. The twin runs where the runtime's placement puts
it (``twin_cpus``, ``madtwin.cpus_for``): on the fabric's CPU, as ibsim runs beside OpenSM,
which then has its CPU to itself as on a real SM host whose HCA frames and carries its SMPs.
(It had been put on OpenSM's CPU while the agents' CPU also wrote per-node sysfs trees after
every port change: 189 ms against 156-162 for a reroute then; now the fabric's CPU is the
faster, with or without the kernel SMA's walks, README issue 17.) Deviation: the CA port's own
packet counters do not count the twin's SMPs (its interface's do).
"""

from __future__ import annotations

import logging
import socket

import trio

from ibemu import clock
from ibemu.agents.actions import STATUS_UNDELIVERABLE, DeliverMad
from ibemu.agents.ca import CaAgent
from ibemu.fabric.agenthost import AgentHost
from ibemu.hca.umad_server import UmadServer
from ibemu.kernel import madtwin
from ibemu.wire.umad import CLASS_SA, Client, SimRequest, rmpp_length, rmpp_seal

log = logging.getLogger(__name__)


NO_REPLY_METHODS = frozenset({0x03, 0x05, 0x07})  # Send, Trap, TrapRepress
DEFAULT_MAD_TIMEOUT_S = 0.5
TWIN_CLIENTS = frozenset({"opensm"})
"""Process names whose slot the C twin serves."""


class CaMadPort:
    """``UmadPortBackend`` for port ``port`` of the CA agent of node ``name``.

    umad2sim has no MAD timeouts (the real kernel's umad module returns an unanswered
    request with ETIMEDOUT after the client's timeout; umad2sim ignores it): a request lost
    in the fabric — to a dead switch, through a cut cable — would hang OpenSM forever. So a
    request unanswered after ``timeout_s`` goes back to its client with status 110, as
    ibsim does for what it cannot deliver. ``timeout_s`` is above ibemu's own SM's per-try
    timeout, which retries by itself.
    """

    def __init__(self, host: AgentHost, name: str, port: int = 1, *,
                 timeout_s: float = DEFAULT_MAD_TIMEOUT_S, twin_cpus: frozenset[int] | None = None) -> None:
        rt = host.nodes[name]
        if not isinstance(rt.agent, CaAgent):
            raise TypeError(f"{name} is not a CA: MAD sockets live on hosts")
        self.host = host
        self.name = name
        self.port = port
        self.agent: CaAgent = rt.agent
        self.node_guid = self.agent.node_guid
        self.gid_prefix = self.agent.ports[port].gid_prefix
        self.node_name = name
        self.server: UmadServer | None = None
        self.timeout_ns = int(timeout_s * 1e9)
        self.pending: dict[int, tuple[int, SimRequest]] = {}  # TID -> (deadline, request)
        self.timed_out = 0
        self._armed: trio.Event | None = None  # set when a request starts waiting
        self.twin_cpus = twin_cpus
        """Where the C twin runs: the SM's CPU as the runtime placed it (``FabricRuntime.placement``);
        not ``cpus.placement()`` here, which reads the calling thread's CPUs: in the agent
        host's worker thread, pinned to the agents' one CPU, that gave no placement at all and
        the twin inherited the agents' CPU."""
        host.attach_mad_sink(name, self._from_fabric)

    # the C twin ------------------------------------------------------------------
    def twin_for(self, slot: int, client: Client, data_sock: socket.socket) -> madtwin.Twin | None:
        """``UmadServer.takeover``: the C twin for OpenSM's slot (blocking: a worker thread)."""
        if madtwin.process_name(client.pid) not in TWIN_CLIENTS:
            return None
        if not madtwin.enabled():
            madtwin.notice_if_missing()
            return None
        rt = self.host.nodes[self.name]
        pp = rt.plan.ports.get(self.port)
        if pp is None:
            return None
        twin = madtwin.Twin.start(data_sock, rt.plan.ns, pp.ifname, pp.peer_mac, port=self.port,
                                  timeout_ns=int(self.timeout_ns * clock.dilation()),
                                  cpus=self.twin_cpus)
        try:
            self.host.fabric.state.claim_process(twin.pid, "madtwin")
        except BaseException:
            twin.stop()
            raise
        log.info("%s: OpenSM (pid %d, slot %d) served by madtwin %d", self.name, client.pid, slot, twin.pid)
        return twin

    def twin_counters(self) -> dict[str, int]:
        """The C twin's counters (``madtwin.COUNTERS``): the running one's, else the last
        one's; empty when none ran."""
        if self.server is None:
            return {}
        for handover in self.server.handovers:
            if isinstance(handover, madtwin.Twin):
                return handover.counters()
        return dict(self.server.last_handover_counters)

    # UmadPortBackend -------------------------------------------------------------
    def node_info(self) -> bytes:
        return self.agent.node_info(self.port)

    def port_info(self, port: int) -> bytes:
        if port not in self.agent.ports:
            port = self.port
        return self.agent.port_info(port)

    def pkeys(self) -> bytes:
        keys = self.agent.pkeys(self.port)[:32]
        return b"".join(k.to_bytes(2, "big") for k in keys).ljust(64, b"\0")

    def port_lid_state(self) -> tuple[int, int]:
        return self.agent.lid(self.port), int(self.agent.port_state(self.port))

    def vendor(self) -> tuple[int, int, int, int]:
        return self.agent.vendor_id, self.agent.device_id, self.agent.revision, 0

    def set_issm(self, on: bool) -> None:
        """An SM attached (or left): IsSM on the port, and the SA's GSI class served here
        (umad2sim registers classes locally; an SM client registers the SA's)."""
        self.agent.set_is_sm(self.port, on)
        self.host.sma_refresh(self.name, ports=(self.port,), attrs=(0x0015,))  # CapabilityMask.IsSM
        if on:
            self.agent.register_class(CLASS_SA)
        else:
            self.agent.unregister_class(CLASS_SA)

    def send_mad(self, req: SimRequest) -> None:
        method = req.mad[3] if len(req.mad) > 3 else 0
        if not method & 0x80 and method not in NO_REPLY_METHODS:
            self.pending[req.tid] = (clock.now_ns() + self.timeout_ns, req)
            if self._armed is not None:
                self._armed.set()
        mad = rmpp_seal(req.mad, req.length)  # what the kernel's RMPP layer would send
        actions = self.agent.send_mad(self.port, req.dlid, req.dqp, req.sqp, mad)
        if method == 0x02 and len(mad) > 7 and (  # an SMP Set our own SMA answered: the
                (mad[1] == 0x81 and mad[7] == 0)  # kernel SMA's images before the response
                or (mad[1] == 0x01 and self.agent.ports[self.port].owns_lid(req.dlid))):
            self.host.sma_refresh(self.name)
        self.host.dispatch(self.name, self.host.nodes[self.name], actions)

    async def watch_deadlines(self) -> None:
        """Sleep until the earliest pending deadline (or until a request arrives), expire."""
        while True:
            if not self.pending:
                self._armed = trio.Event()
                await self._armed.wait()
                self._armed = None
                continue
            earliest = min(deadline for deadline, _ in self.pending.values())
            await trio.sleep(max(0.0, (earliest - clock.now_ns()) / 1e9) + 0.001)
            self.expire(clock.now_ns())

    def expire(self, now_ns: int) -> int:
        """Return the requests past their deadline to their clients with status 110."""
        late = [tid for tid, (deadline, _) in self.pending.items() if deadline <= now_ns]
        for tid in late:
            _, req = self.pending.pop(tid)
            self.timed_out += 1
            if self.server is not None:
                self.server.deliver(SimRequest(dlid=req.dlid, slid=req.slid, dqp=req.dqp, sqp=req.sqp,
                                               mad=req.mad, status=STATUS_UNDELIVERABLE))
        return len(late)

    # fabric -> clients -------------------------------------------------------------
    def _from_fabric(self, mad: DeliverMad) -> None:
        if self.server is None or mad.port != self.port:
            return
        if len(mad.mad) >= 16:
            self.pending.pop(int.from_bytes(mad.mad[8:16], "big"), None)
        self.server.deliver(SimRequest(dlid=mad.dlid, slid=mad.slid, dqp=mad.dqp, sqp=mad.sqp,
                                       mad=mad.mad, status=mad.status, length=rmpp_length(mad.mad)))


async def serve_mad_port(host: AgentHost, name: str, port: int = 1, *, twin_cpus: frozenset[int] | None = None,
                         task_status: trio.TaskStatus[CaMadPort] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the MAD socket of ``name``'s ``port`` in its namespace until cancelled; ``twin_cpus``:
    where a C twin it starts runs (the SM's CPU)."""
    backend = CaMadPort(host, name, port, twin_cpus=twin_cpus)
    server = UmadServer(backend, host.nodes[name].plan.ns)
    server.takeover = backend.twin_for
    backend.server = server

    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        task_status.started(backend)
        await backend.watch_deadlines()
