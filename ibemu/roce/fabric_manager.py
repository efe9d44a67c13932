"""The RoCE fabric manager: the IB subnet manager's counterpart for a routed Ethernet fabric.

    python -m ibemu.roce.fabric_manager --plan RUN_DIR/roce.json --events fm.jsonl [--no-reroute]

Reads the fabric's plan (``ibemu.fabric.roce_fabric`` writes it), computes shortest-path ECMP routes
(``ibemu.roce.routes``) over the cables that have carrier and writes them into every router's
namespace over rtnetlink, then logs ``fabric_up``. It watches every router port's link state
(RTM_NEWLINK); when a cable goes down (or comes back) it recomputes and rewrites only the
routes that changed, and logs a ``reroute`` event with ``t_detect -> t_routed ->
t_programmed``, like the SM's. Meanwhile the routers' kernels have already stopped using next
hops without carrier (``ignore_routes_with_linkdown``): the ``reroute`` event says how many
routes that local repair covered on the routers beside the cable (``local_covered``) and how
many had no next hop left and waited for the manager (``local_blackholed``). With
``--no-reroute`` the manager only observes, so the local repair can be measured alone.

Events (JSON lines, ``clock.now_ns()`` stamps, the clock every ibemu process shares):
``fm_start`` · ``routes_computed`` (seconds, routes, routers) · ``routes_programmed``
(seconds, messages, routers) · ``fabric_up`` (seconds, routes) · ``carrier`` (node, port,
ifname, up: administratively up and running) · ``reroute`` (t_trap None, t_detect, t_routed, t_programmed, reason, cables,
changes, routers, local_covered, local_blackholed, reprogrammed) · ``fm_stop``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ibemu import clock, lagmon
from ibemu.events import EventLog, Kind, Log
from ibemu.kernel import linkevents, rtnl
from ibemu.kernel.commands import KernelError
from ibemu.kernel.netconf import RouteWriter
from ibemu.kernel.timerfd import run_trio
from ibemu.roce.addressing import AddressPlan, PortAddress
from ibemu.roce.routes import NextHop, RouteChanges, Routes, compute, diff, local_repair

log = logging.getLogger("ibemu.roce.fabric_manager")


def link_states(data: bytes) -> Iterator[tuple[int, bool, bool]]:
    """``(ifindex, admin up, running)`` of each link message in a netlink datagram.

    IFF_RUNNING (operationally up) rather than carrier: a veth whose peer just came up has
    carrier at once but drops every frame until linkwatch activates it, up to a second later;
    the kernel revives its own next hops only then, and so does the manager.
    """
    for ev in linkevents.parse(data):
        alive = not ev.deleted
        yield ev.ifindex, alive and ev.admin_up, alive and ev.running


@dataclass(slots=True)
class PortState:
    addr: PortAddress
    peer_mac: bytes
    admin_up: bool = True
    running: bool = True

    @property
    def ok(self) -> bool:
        return self.admin_up and self.running


class FabricManager:
    """Routes of a RoCE fabric: computed from its plan, written over netlink, kept current."""

    def __init__(self, manifest: dict[str, Any], events: EventLog, *, reroute: bool = True) -> None:
        self.addrs = AddressPlan.from_dict(manifest["addresses"])
        self.router_ns: dict[str, str] = dict(manifest["routers"])
        self.peer_macs: dict[str, dict[str, str]] = dict(manifest.get("peer_macs", {}))
        self.events = events
        self.reroute_enabled = reroute
        self.routes: Routes = {}
        self.down: set[int] = set()
        self.writers: dict[str, RouteWriter] = {}
        self.ports: dict[str, dict[int, PortState]] = {}
        """router -> ifindex -> state of the port."""
        self.reroutes = 0
        self._monitors: dict[str, socket.socket] = {}

    # -- set-up (blocking) ---------------------------------------------------------------
    def open(self) -> None:
        """Netlink sockets in every router's namespace; the ports' present link state."""
        for name, ns in self.router_ns.items():
            mine = self.addrs.node_ports(name)
            if not mine:
                continue
            names = [p.ifname for p in mine]
            self._monitors[name] = linkevents.open_link_monitor(ns)  # before reading: no change missed
            self.writers[name] = RouteWriter(ns, names)
            index = self.writers[name].ifindex
            down = set(rtnl.carrier_down(ns, names))
            macs = self.peer_macs.get(name, {})
            self.ports[name] = {index[p.ifname]: PortState(p, bytes.fromhex(macs.get(p.ifname, "")),
                                                           running=p.ifname not in down) for p in mine}
            self.down |= {p.cable for p in mine if p.ifname in down}

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
        for s in self._monitors.values():
            s.close()

    # -- routes --------------------------------------------------------------------------
    def _compute(self) -> Routes:
        return compute(self.addrs, self.router_ns, self.down)

    def program(self, changes: RouteChanges) -> int:
        """Write ``changes`` router by router; returns the netlink messages sent."""
        sent = 0
        for r in changes.routers:
            sent += self.writers[r].apply(changes.put.get(r, {}), changes.delete.get(r, ()))
        return sent

    def bring_up(self) -> None:
        t0 = self.events.now()
        new = self._compute()
        t1 = self.events.now()
        total = sum(map(len, new.values()))
        self.events.emit(Kind.ROUTES_COMPUTED, t_ns=t1, seconds=(t1 - t0) / 1e9, routes=total, routers=len(new),
                         cables_down=sorted(self.down))
        changes = diff({}, new)
        sent = self.program(changes)
        t2 = self.events.now()
        self.routes = new
        self.events.emit(Kind.ROUTES_PROGRAMMED, t_ns=t2, seconds=(t2 - t1) / 1e9, messages=sent,
                         routers=len(changes.routers))
        self.events.emit(Kind.FABRIC_UP, t_ns=t2, seconds=(t2 - t0) / 1e9, routes=total)
        log.info("fabric up: %d routes on %d routers in %.1f ms", total, len(new), (t2 - t0) / 1e6)

    def on_link_events(self, router: str, evs: Iterable[tuple[int, bool, bool]], t_ns: int) -> None:
        """Link changes ``(ifindex, admin up, running)`` of one router's ports (read at
        ``t_ns``); reroute if a cable changed."""
        ports = self.ports.get(router, {})
        was_down = set(self.down)
        back: list[tuple[str, str, bytes]] = []
        for ifindex, admin_up, running in evs:
            st = ports.get(ifindex)
            if st is None or (st.admin_up, st.running) == (admin_up, running):
                continue
            before = st.ok
            st.admin_up, st.running = admin_up, running
            if st.ok != before:
                self.events.emit(Kind.CARRIER, t_ns=t_ns, node=router, port=st.addr.port, ifname=st.addr.ifname,
                                 up=st.ok)
                if st.ok and len(st.peer_mac) == 6:
                    back.append((st.addr.ifname, st.addr.peer_ip, st.peer_mac))
        if back:  # an interface set down lost its neighbours, permanent ones too
            try:
                self.writers[router].neighbours(back)
            except KernelError as exc:
                log.warning("%s", exc)
        self.down = {st.addr.cable for ps in self.ports.values() for st in ps.values() if not st.ok}
        if self.down != was_down:
            self.reroute(t_ns, was_down)

    def reroute(self, t_detect: int, was_down: set[int]) -> None:
        went_down = self.down - was_down
        came_up = was_down - self.down
        dead = [NextHop(pa.ifname, pa.peer_ip) for pa in self.addrs.ports.values() if pa.cable in went_down]
        covered = blackholed = 0
        for r in {pa.node for pa in self.addrs.ports.values() if pa.cable in went_down and pa.node in self.routes}:
            c, b = local_repair(self.routes, dead, r)
            covered, blackholed = covered + c, blackholed + b
        new = self._compute()
        t_routed = self.events.now()
        changes = diff(self.routes, new)
        sent = 0
        if self.reroute_enabled:
            sent = self.program(changes)
            self.routes = new
        t_programmed = self.events.now()
        self.reroutes += 1
        cables = [str(self._cable_name(c)) for c in sorted(went_down | came_up)]
        self.events.emit(Kind.REROUTE, t_trap=None, t_detect=t_detect, t_routed=t_routed,
                         t_programmed=t_programmed if self.reroute_enabled else None,
                         reason="link_down" if went_down else "link_up", cables=cables,
                         changes=changes.count, routers=len(changes.routers), messages=sent,
                         local_covered=covered, local_blackholed=blackholed, reprogrammed=self.reroute_enabled)
        log.info("reroute (%s): %d changes on %d routers, routed %.2f ms, programmed %.2f ms after detect",
                 ", ".join(cables), changes.count, len(changes.routers), (t_routed - t_detect) / 1e6,
                 (t_programmed - t_detect) / 1e6)

    def _cable_name(self, cable: int) -> str:
        ends = sorted(f"{p.node}:{p.port}" for p in self.addrs.ports.values() if p.cable == cable)
        return "-".join(ends)

    # -- trio ----------------------------------------------------------------------------
    async def _watch(self, router: str, sock: socket.socket) -> None:
        while True:
            await trio.lowlevel.wait_readable(sock)
            t_ns = clock.now_ns()
            evs: list[tuple[int, bool, bool]] = []
            while True:
                try:
                    evs.extend(link_states(sock.recv(1 << 16)))
                except BlockingIOError:
                    break
            if evs:
                self.on_link_events(router, evs, t_ns)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bring the fabric up, then keep its routes current until cancelled."""
        self.bring_up()
        async with trio.open_nursery() as nursery:
            for router, sock in self._monitors.items():
                nursery.start_soon(self._watch, router, sock)
            task_status.started()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ibemu.roce.fabric_manager", description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", required=True, help="the fabric's roce.json (in its run directory)")
    p.add_argument("--events", default=None, help="JSON-lines event log file")
    p.add_argument("--no-reroute", action="store_true",
                   help="observe only: log carrier changes and what a reroute would change, write nothing")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    manifest = json.loads(Path(args.plan).read_text())
    events = EventLog(args.events, log=Log.FM)
    fm = FabricManager(manifest, events, reroute=not args.no_reroute)
    events.emit(Kind.FM_START, routers=len(fm.router_ns), reroute=fm.reroute_enabled)
    try:
        fm.open()
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as n:
                await n.start(fm.serve)
                n.start_soon(lagmon.watch_from_env, "fabric-manager")  # in a run: its lag
                async for _sig in signals:
                    n.cancel_scope.cancel()
                    break
    finally:
        events.emit(Kind.FM_STOP, reroutes=fm.reroutes)
        events.close()
        fm.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_trio(amain, args)


if __name__ == "__main__":
    sys.exit(main())
