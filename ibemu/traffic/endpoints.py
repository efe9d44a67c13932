"""Where a workload's hosts are: their namespace, cable, peer MAC and LID; opening their ports.

A host's LID is the one its SM assigned: read from the CA's agent when the caller runs the
fabric (the scenario runner), or asked of the host's MAD socket (``GET_PORT``, as
umad2sim asks for sysfs) from inside the host, whatever SM manages the fabric.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ibemu.errors import ConfigError
from ibemu.fabric.plan import FabricPlan
from ibemu.hca.nic import HcaPort

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HostAddress:
    """A host port as a workload needs it."""

    name: str
    ns: str
    ifname: str
    peer_mac: bytes
    lid: int
    ip: str | None = None
    """On a RoCE fabric: the port's IPv4 address (``peer_mac`` is then its first-hop router)."""

    def to_json(self) -> dict[str, Any]:
        """The form a traffic worker's spec carries (``from_json`` reads it back)."""
        d: dict[str, Any] = {"ns": self.ns, "ifname": self.ifname, "peer_mac": self.peer_mac.hex(), "lid": self.lid}
        if self.ip is not None:
            d["ip"] = self.ip
        return d

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> HostAddress:
        ip = d.get("ip")
        return cls(name, str(d["ns"]), str(d["ifname"]), bytes.fromhex(d["peer_mac"]), int(d["lid"]),
                   None if ip is None else str(ip))


def host_address(plan: FabricPlan, name: str, lid: int, *, port: int = 1) -> HostAddress:
    """``name``'s port ``port`` in ``plan``, with the LID its SM gave it."""
    node = plan.nodes.get(name)
    if node is None or node.is_switch:
        known = ", ".join(sorted(n for n, p in plan.nodes.items() if not p.is_switch)[:8])
        raise ConfigError(f"no host {name!r} in this fabric (hosts: {known} ...)")
    pp = node.ports.get(port)
    if pp is None:
        raise ConfigError(f"host {name} has no cable on port {port}")
    if not lid:
        raise ConfigError(f"host {name} has no LID yet: is a subnet manager running?")
    return HostAddress(name, node.ns, pp.ifname, pp.peer_mac, lid)


def query_lid(ns: str | None, *, timeout_s: float = 2.0) -> int:
    """The LID of the host port whose MAD socket lives in ``ns`` (None: this namespace)."""
    from ibemu.hca.umad_client import UmadClient
    from ibemu.wire.umad import CTL_LEN, CtlMessage, CtlType, unpack_port

    client = UmadClient.connect_blocking(ns, timeout_s=timeout_s)
    try:
        client.ctl.settimeout(timeout_s)
        client.ctl.send(CtlMessage(CtlType.GET_PORT, clientid=client.slot).pack())
        reply = CtlMessage.unpack(client.ctl.recv(CTL_LEN))
        if reply.type != CtlType.GET_PORT:
            raise ConfigError(f"the MAD socket in {ns or 'this namespace'} refused GET_PORT")
        lid, _state = unpack_port(reply.data)
        return lid
    finally:
        client.close()


def open_ports(addresses: Iterable[HostAddress], *, mtu: int = 4096,
               qpns: tuple[int, int] | None = None, timestamps: bool = False,
               lid_ips: Mapping[int, str] | None = None) -> dict[str, HcaPort]:
    """One ``HcaPort`` per host (blocking: before trio or in a worker thread).

    ``qpns``/``timestamps``: see ``HcaPort.open`` (a process sharing hosts with others).
    ``lid_ips``: a RoCE fabric's LID -> address table; hosts with an ``ip`` then get a
    ``RocePort`` (``ibemu.hca.roce_port``), the same transport behind RoCEv2 frames.
    """
    ports: dict[str, HcaPort] = {}
    try:
        for a in addresses:
            if a.name in ports:
                continue
            if a.ip is not None:
                from ibemu.hca.roce_port import RocePort

                if lid_ips is None:
                    raise ConfigError(f"host {a.name} is on a RoCE fabric, but no LID -> address table was given")
                ports[a.name] = RocePort.open(a.ns, a.ifname, a.peer_mac, a.lid, ip=a.ip, lid_ips=lid_ips, mtu=mtu,
                                              name=a.name, qpns=qpns, timestamps=timestamps)
            else:
                ports[a.name] = HcaPort.open(a.ns, a.ifname, a.peer_mac, a.lid, mtu=mtu, name=a.name,
                                             qpns=qpns, timestamps=timestamps)
    except BaseException:
        close_ports(ports)
        raise
    return ports


def close_ports(ports: Mapping[str, HcaPort]) -> None:
    for p in ports.values():
        with contextlib.suppress(OSError):
            p.close()
