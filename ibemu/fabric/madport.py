"""A CA port's MAD socket wired to its agent: the backend ``UmadServer`` needs, and back.

Client requests become ``CaAgent.send_mad`` calls whose actions the agent host carries out
(the MADs leave as real packets); ``DeliverMad`` actions of that CA come back here and go to
the right client through ``UmadServer.deliver``.
"""

from __future__ import annotations

import logging

import trio

from ibemu.device.actions import DeliverMad
from ibemu.fabric.host import AgentHost
from ibemu.hca.sma import CaAgent
from ibemu.hca.umad import SimRequest
from ibemu.hca.umad_server import UmadServer

log = logging.getLogger(__name__)


class CaMadPort:
    """``UmadPortBackend`` for port ``port`` of the CA agent of node ``name``."""

    def __init__(self, host: AgentHost, name: str, port: int = 1) -> None:
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
        host.attach_mad_sink(name, self._from_fabric)

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
        self.agent.set_is_sm(self.port, on)

    def send_mad(self, req: SimRequest) -> None:
        actions = self.agent.send_mad(self.port, req.dlid, req.dqp, req.sqp, req.mad)
        self.host.dispatch(self.name, self.host.nodes[self.name], actions)

    # fabric -> clients -------------------------------------------------------------
    def _from_fabric(self, mad: DeliverMad) -> None:
        if self.server is None or mad.port != self.port:
            return
        self.server.deliver(SimRequest(dlid=mad.dlid, slid=mad.slid, dqp=mad.dqp, sqp=mad.sqp,
                                       mad=mad.mad, status=mad.status))


async def serve_mad_port(host: AgentHost, name: str, port: int = 1, *,
                         task_status: trio.TaskStatus[CaMadPort] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the MAD socket of ``name``'s ``port`` in its namespace until cancelled."""
    backend = CaMadPort(host, name, port)
    server = UmadServer(backend, host.nodes[name].plan.ns)
    backend.server = server

    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        task_status.started(backend)
