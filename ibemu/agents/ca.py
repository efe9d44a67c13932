"""The management agent of an emulated HCA: SMA, PMA, and the MAD path of local clients.

``CaAgent`` answers SMPs addressed to it (directed route ending here, or LID-routed to a
port LID) out of the port they arrived on, serves PMA ClassPortInfo / PortCounters /
PortCountersExtended, and is the origin and destination of its clients' MADs (the SM,
infiniband-diags through the MAD socket layer)::

    ca = CaAgent(node_guid=0x0002C90000001000, num_ports=1, description="host1 HCA-1")
    ca.set_is_sm(1, True)                    # the SM attached to port 1
    actions = ca.send_mad(1, 0xFFFF, 0, 0, mad)   # DR SMP from the SM: Send(1, ...) or DeliverMad
    actions = ca.receive(1, packet)          # GetResp / trap for the SM: DeliverMad(1, ...)

What goes to clients (``DeliverMad``): every response (R bit), every SubnTrap/Report, GSI
requests of classes a client registered (``register_class``), and SMInfo requests when the
port's CapabilityMask has IsSM. Unregistered GSI Get/Set requests get status 0x0004
(class not supported), SMInfo without an SM 0x000C.

Each port has its own M_Key (``DeviceAgent``'s check, also for the SMPs of local clients
answered by this CA itself); a refused SMP sends trap 256 from the port's LID to its
MasterSMLID, out of that port, repeated until repressed (``tick``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ibemu.agents import dr
from ibemu.agents.actions import (
    STATUS_UNDELIVERABLE,
    Action,
    DeliverMad,
    LinkRequest,
    LinkRequestKind,
    PortStateChange,
    Send,
)
from ibemu.agents.device import (
    CLASS_PMA,
    CLASS_SMP_DR,
    CLASS_SMP_LR,
    GET,
    SET,
    ST_BAD_VERSION,
    Clock,
    DeviceAgent,
    make_ports,
)
from ibemu.agents.port import CA_PORT_CAPS, Cap, Port, PortState, SetOutcome
from ibemu.wire.madattrs import NODE_TYPE_CA
from ibemu.wire.madpacket import (
    GSI_QKEY,
    M_ATTR_ID,
    M_CLASS,
    M_METHOD,
    M_STATUS,
    MAD_LEN,
    MAD_OFFSET,
    PERMISSIVE_LID,
    VL15,
)

ATTR_SM_INFO = 0x0020


class CaAgent(DeviceAgent):
    """SMA/PMA of a channel adapter with 1 or 2 ports (port GUID = node GUID + port)."""

    NODE_TYPE = NODE_TYPE_CA
    IS_SWITCH = False

    def __init__(
        self,
        *,
        node_guid: int,
        num_ports: int = 1,
        description: str = "",
        vendor_id: int = 0x0002C9,
        device_id: int = 0x1017,
        revision: int = 0,
        system_image_guid: int | None = None,
        link_up: Sequence[bool] | None = None,
        width: int = 4,
        speed: str = "EDR",
        mtu: int = 4096,
        partition_cap: int = 128,
        capability_mask: int = CA_PORT_CAPS,
        clock: Clock | None = None,
        count_own_traffic: bool = True,
    ) -> None:
        if num_ports not in (1, 2):
            raise ValueError(f"a CA has 1 or 2 ports, not {num_ports}")
        ports = make_ports(num_ports, 1, is_switch=False, link_up=link_up, width=width,
                           speed=speed, mtu=mtu, capability_mask=capability_mask)
        super().__init__(node_guid=node_guid, ports=ports, num_ports=num_ports,
                         description=description or f"ca {node_guid:#018x}",
                         vendor_id=vendor_id, device_id=device_id, revision=revision,
                         system_image_guid=system_image_guid, partition_cap=partition_cap,
                         clock=clock, count_own_traffic=count_own_traffic)
        self.client_classes: set[int] = set()

    # ================================================================== public

    def port_guid(self, port: int) -> int:
        return self.node_guid + port

    def lid(self, port: int) -> int:
        return self.ports[port].lid

    def port_state(self, port: int) -> PortState:
        return self.ports[port].state

    def set_is_sm(self, port: int, on: bool) -> None:
        """Set or clear CapabilityMask.IsSM on ``port`` (the MAD socket's SET_ISSM)."""
        p = self._external_port(port)
        p.capability_mask = (p.capability_mask | Cap.IS_SM) if on else (p.capability_mask & ~Cap.IS_SM)

    def set_capability_mask(self, port: int, mask: int) -> None:
        self._external_port(port).capability_mask = mask & 0xFFFFFFFF

    def register_class(self, mgmt_class: int) -> None:
        """A local client serves requests of this GSI class (e.g. 0x03 SA for the SM)."""
        self.client_classes.add(mgmt_class)

    def unregister_class(self, mgmt_class: int) -> None:
        self.client_classes.discard(mgmt_class)

    def receive(self, port: int, packet: bytes | bytearray | memoryview) -> list[Action]:
        actions = super().receive(port, packet)
        if self._pending_actions:
            actions = [*actions, *self._pending_actions]
            self._pending_actions = []
        return actions

    def send_mad(self, port: int, dlid: int, dqp: int, sqp: int, mad: bytes | bytearray, *,
                 sl: int = 0, pkey: int = 0xFFFF, qkey: int | None = None) -> list[Action]:
        """Send a 256-byte MAD from a local client out of ``port``.

        SMPs (class 0x01 / 0x81) go on VL15 to QP0; other classes on VL0 with Q_Key
        0x80010000 (or ``qkey``) and P_Key ``pkey``. Directed-route SMPs: the client leaves
        HopPointer 0; HopCount 0 is answered by this CA's own SMA (``DeliverMad`` back),
        otherwise HopPointer becomes 1 and InitialPath[1] must be ``port``. A MAD that
        cannot leave (link down, port not Active for GSI, no LID for LID routing, bad
        path) comes back as ``DeliverMad(status=110)``.
        """
        if len(mad) != MAD_LEN:
            raise ValueError(f"a MAD is {MAD_LEN} bytes, not {len(mad)}")
        p = self._external_port(port)
        buf = bytearray(MAD_OFFSET) + bytearray(mad) + bytearray(6)
        m = MAD_OFFSET
        mclass = buf[m + M_CLASS]

        def undeliverable(reason: str) -> list[Action]:
            self.stats[f"tx_undeliverable_{reason}"] += 1
            return [DeliverMad(port, bytes(mad), p.lid, dlid, sqp, dqp, sl, pkey,
                               qkey if qkey is not None else 0, STATUS_UNDELIVERABLE),
                    self._event("mad_undeliverable", port=port, reason=reason, dlid=dlid,
                                mgmt_class=mclass)]

        if mclass == CLASS_SMP_DR:
            if not p.link_is_up and buf[m + 7]:
                return undeliverable("link_down")
            kind, val = dr.on_originate(buf, m, port)
            if kind == dr.CONSUME:
                return self._local_smp(port, buf, dr_route=True)
            if kind == dr.DISCARD:
                return undeliverable(str(val))
            if kind == dr.LID:
                if not p.lid or dlid in (0, PERMISSIVE_LID):
                    return undeliverable("no_lid")
                if p.owns_lid(dlid):
                    return self._loopback(port, buf, dlid)
                return self._emit(port, buf[m : m + MAD_LEN], dlid=dlid, slid=p.lid, dqp=0, sqp=0,
                                  vl=VL15, sl=sl, pkey=pkey, qkey=0)
            return self._emit(port, buf[m : m + MAD_LEN], dlid=PERMISSIVE_LID,
                              slid=PERMISSIVE_LID, dqp=0, sqp=0, vl=VL15, sl=sl, pkey=pkey, qkey=0)
        if mclass == CLASS_SMP_LR:
            if p.owns_lid(dlid):
                return self._loopback(port, buf, dlid)
            if not p.link_is_up:
                return undeliverable("link_down")
            return self._emit(port, buf[m : m + MAD_LEN], dlid=dlid, slid=p.lid or PERMISSIVE_LID,
                              dqp=0, sqp=0, vl=VL15, sl=sl, pkey=pkey, qkey=0)
        # GSI
        if not p.lid:
            return undeliverable("no_lid")
        if p.owns_lid(dlid):
            return self._loopback(port, buf, dlid)
        if p.state != PortState.ACTIVE:
            return undeliverable("port_not_active")
        return self._emit(port, buf[m : m + MAD_LEN], dlid=dlid, slid=p.lid, dqp=dqp, sqp=sqp,
                          vl=0, sl=sl, pkey=pkey, qkey=GSI_QKEY if qkey is None else qkey)

    # ================================================================== hooks

    def _local_lid(self, dlid: int, ingress: int) -> bool:
        p = self.ports.get(ingress)
        return p is not None and p.owns_lid(dlid)

    def _my_lid(self, ingress: int) -> int:
        return self.ports[ingress].lid or PERMISSIVE_LID

    def _route_lid(self, dlid: int, ingress: int, *, vl15: bool) -> int:
        p = self.ports[ingress]
        if not p.link_is_up or (not vl15 and p.state != PortState.ACTIVE):
            p.counters.port_xmit_discards += 1
            return 0
        return ingress

    def _client_smp_request(self, attr: int) -> bool:
        return attr == ATTR_SM_INFO and any(p.capability_mask & Cap.IS_SM for p in self.ports.values())

    def _client_mad(self, port: int, pkt: bytes, mad: bytes | bytearray) -> list[Action]:
        m = MAD_OFFSET
        mclass, method = pkt[m + M_CLASS], pkt[m + M_METHOD]
        is_smp = mclass in (CLASS_SMP_LR, CLASS_SMP_DR)
        if not (method & 0x80) and method not in (0x05, 0x06) and not is_smp and mclass not in self.client_classes:
            # a GSI request nobody serves: answer it like a CA without that agent
            if method in (GET, SET):
                return self._gsi_respond(bytearray(pkt), m, port, ST_BAD_VERSION)
            self.stats["gsi_no_client"] += 1
            return []
        if is_smp and method == 0x05 and not any(p.capability_mask & Cap.IS_SM for p in self.ports.values()):
            self.stats["trap_without_sm"] += 1
            return []
        self.stats["delivered"] += 1
        slid = (pkt[6] << 8) | pkt[7]
        dlid = (pkt[2] << 8) | pkt[3]
        sqp = ((pkt[25] << 16) | (pkt[26] << 8) | pkt[27])
        dqp = ((pkt[13] << 16) | (pkt[14] << 8) | pkt[15])
        qkey = int.from_bytes(pkt[20:24], "big")
        pkey = (pkt[10] << 8) | pkt[11]
        return [DeliverMad(port, bytes(mad), slid, dlid, sqp, dqp, pkt[1] >> 4, pkey, qkey)]

    def _after_port_set(self, num: int, p: Port, outcome: object) -> None:
        assert isinstance(outcome, SetOutcome)
        if outcome.lid_changed:
            self._pending_actions.append(self._event("lid_assigned", port=num, lid=p.lid,
                                                     sm_lid=p.master_sm_lid))
        if outcome.link_request is not None:
            self._pending_actions.append(LinkRequest(num, LinkRequestKind(outcome.link_request)))
        if outcome.state_before != p.state or outcome.phys_before != p.phys or outcome.retrained:
            self._pending_actions += [
                PortStateChange(num, p.state, p.phys),
                self._event("port_state", port=num, why=f"sm_{outcome.link_request or 'set'}",
                            state=p.state.name.lower(), phys_state=p.phys.name.lower())]

    # ================================================================== local paths

    def _emit(self, port: int, mad: bytes | bytearray, **hdr: int) -> list[Action]:
        pkt = self._build(mad, **hdr)
        if self.count_own_traffic:
            self.ports[port].counters.add_tx(len(pkt))
        return [Send(port, pkt)]

    def _local_smp(self, port: int, buf: bytearray, *, dr_route: bool) -> list[Action]:
        """A HopCount-0 DR SMP (or LID-routed to our own LID) answered by our own SMA."""
        m = MAD_OFFSET
        if buf[m + M_METHOD] & 0x80:
            self.stats["tx_local_response_dropped"] += 1
            return []
        if dr_route:
            buf[m + 6] = 1  # C14-9:3 at the source: hp = n + 1
        actions = self._answer_smp(buf, m, port, dr_route=dr_route)
        if actions is not None:
            return actions
        if dr_route:
            dr.local_response(buf, m)
        lid = self.ports[port].lid or PERMISSIVE_LID
        out = [DeliverMad(port, bytes(buf[m : m + MAD_LEN]), PERMISSIVE_LID if dr_route else lid,
                          PERMISSIVE_LID if dr_route else lid, 0, 0)]
        return [*out, *self._drain()]

    def _loopback(self, port: int, buf: bytearray, dlid: int) -> list[Action]:
        """A MAD from a client to this port's own LID: our SMA/PMA answers it directly."""
        m = MAD_OFFSET
        mclass = buf[m + M_CLASS]
        if mclass in (CLASS_SMP_LR, CLASS_SMP_DR):
            if buf[m + M_METHOD] & 0x80 or buf[m + M_METHOD] in (0x05, 0x07):
                self.stats["tx_loopback_dropped"] += 1
                return []
            actions = self._answer_smp(buf, m, port, dr_route=False)
            if actions is not None:
                return actions
            return [DeliverMad(port, bytes(buf[m : m + MAD_LEN]), dlid, dlid, 0, 0), *self._drain()]
        if mclass == CLASS_PMA and not buf[m + M_METHOD] & 0x80:
            status = self._pma(buf, m, port)
            buf[m + M_METHOD] = 0x81
            buf[m + M_STATUS : m + M_STATUS + 2] = status.to_bytes(2, "big")
            return [DeliverMad(port, bytes(buf[m : m + MAD_LEN]), dlid, dlid, 1, 1, qkey=GSI_QKEY)]
        if mclass in self.client_classes or buf[m + M_METHOD] & 0x80:
            lid = self.ports[port].lid
            return [DeliverMad(port, bytes(buf[m : m + MAD_LEN]), lid, dlid, 1, 1, qkey=GSI_QKEY)]
        self.stats["tx_loopback_unsupported"] += 1
        attr = (buf[m + M_ATTR_ID] << 8) | buf[m + M_ATTR_ID + 1]
        return [self._event("mad_undeliverable", port=port, reason="loopback", mgmt_class=mclass, attr=attr)]

    def _drain(self) -> list[Action]:
        out, self._pending_actions = self._pending_actions, []
        return out


__all__ = ["ATTR_SM_INFO", "CaAgent", "Send"]
