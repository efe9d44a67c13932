"""The user datapath of a RoCE fabric: every router's forwarder in one trio process.

    python -m ibemu.roce.userpath --config RUN_DIR/userpath.json [--counters FILE] [--ready FILE]

Like a switch ASIC under SONiC: the control plane stays in each router namespace's kernel FIB
(the fabric manager writes ECMP routes there over rtnetlink, unchanged), the data plane is
here. Per router: a packet socket on every port (IPv4 and PFC frames; its own transmissions
ignored), a route socket in its namespace (a dump at start, then RTM_NEWROUTE/RTM_DELROUTE:
the ``Fib`` mirrors the kernel's), a link monitor (a port without carrier leaves ECMP, its
queues are lost; the FIB is dumped again when a port comes back, since the kernel does not
announce the routes it drops with a link). Frames go through ``RouterPlane`` (forwarding,
host-side loss), then the link model (``ibemu.roce.links``: ``ibemu.physics`` with Ethernet
nodes, the IB user datapath's model and live adapter): egress queues, line rate, switch
latency, propagation, drop tail, ECN, PFC, on the emulated clock; one timerfd wakes the
datapath when the next frame is due. A frame onto a cable between two routers is handed to
the next router in memory (``kernel.linkio.LiveLinks``, as the IB user datapath's switches
do), not through the veth, unless either end has no carrier or a capture listens on it;
``"handover": false`` in the config sends every frame through its veth. The cables (rates, delays) come in ``userpath.json``
(``physics``: the topology's, as ``physics.plan.cables_of`` gives them). The routers' kernels
do not forward (``ip_forward=0``) and drop RoCE frames at ingress (the hosts' guard).
Counters go to ``--counters`` every second and at exit, each cable direction's fidelity
(``link_fidelity``) to the run's lag log; malformed frames are counted, never raised.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ibemu import clock, lagmon
from ibemu.kernel import linkevents, rtnl, sockfilter
from ibemu.kernel.fib import RouteMsg, parse_routes
from ibemu.kernel.linkio import CAPTURE_CHECK_S
from ibemu.kernel.packet import ETH_P_ALL, ignore_outgoing, open_packet_socket
from ibemu.kernel.ring import RxBatcher, TxBatcher
from ibemu.kernel.routeevents import dump_routes, open_route_monitor
from ibemu.kernel.timerfd import run_trio
from ibemu.physics.plan import Cable, nodes_from_cables
from ibemu.roce.links import RoceLinks
from ibemu.roce.physics import eth_config, switch_model
from ibemu.roce.queues import QueueConfig
from ibemu.roce.userplane import PortInfo, RouterPlane
from ibemu.wire import pfc

log = logging.getLogger("ibemu.roce.userpath")

SOCK_BUFFER = 8 << 20
COUNTERS_EVERY_S = 1.0
SWITCH_INTERVAL_S = 0.0005


def port_filter() -> list[sockfilter.Insn]:
    """Classic BPF: IPv4 and MAC control (PFC) frames."""
    return [(0x28, 0, 0, 12), (0x15, 2, 0, 0x0800), (0x15, 1, 0, pfc.ETH_P_PAUSE),
            (0x06, 0, 0, 0), (0x06, 0, 0, sockfilter.ACCEPT)]


@dataclass
class Router:
    plane: RouterPlane
    ns: str
    socks: dict[int, socket.socket]
    routes: socket.socket
    links: socket.socket
    by_port: dict[int, int]
    """Topology port number -> ifindex."""
    route_batches: int = 0
    """Route notifications read: a dump that raced one is taken again."""


def _replace_fib(plane: RouterPlane, msgs: list[RouteMsg]) -> None:
    """``plane``'s FIB becomes ``msgs`` at once (on the trio thread: no frame sees it half done)."""
    plane.fib.clear()
    for m in msgs:
        plane.fib.apply(m)


class UserDatapath:
    """Every router of the config, forwarding in this process."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.cfg = QueueConfig.from_dict(config["queues"])
        self.config = config
        self.routers: dict[str, Router] = {}
        self.tx_errors = 0
        self.tx = TxBatcher()
        """Sends every frame (sendmmsg batches from a worker thread; refused frames counted)."""
        self.links: RoceLinks | None = None
        self.handover = bool(config.get("handover", True))
        """Frames between routers handed over in memory (``LiveLinks``); False: every one
        through its veth (``handover: false`` in the config)."""

    def open(self) -> None:
        """Sockets in every router namespace, FIBs dumped, the link model built (blocking)."""
        for name, r in self.config["routers"].items():
            ns = r["ns"]
            by_name = {p["ifname"]: p for p in r["ports"]}
            routes = open_route_monitor(ns)  # subscribed before the dump: no change missed
            links = linkevents.open_link_monitor(ns)
            socks: dict[int, socket.socket] = {}
            ports: dict[int, PortInfo] = {}
            for ifname, p in by_name.items():
                sock = open_packet_socket(ns, ifname, ETH_P_ALL, bpf=port_filter(), buffer_bytes=SOCK_BUFFER)
                ignore_outgoing(sock)
                ifindex = rtnl.ifindexes(ns, [ifname])[ifname]
                socks[ifindex] = sock
                ports[ifindex] = PortInfo(ifname, bytes.fromhex(p["mac"]), bytes.fromhex(p["peer_mac"]),
                                          to_host=bool(p.get("to_host")), port=int(p.get("port", 0)))
            local = frozenset(socket.inet_aton(p["ip"]) for p in r["ports"] if p.get("ip"))
            plane = RouterPlane(name, ports, self.cfg, seed=int(r.get("seed", 0)), local_ips=local)
            routes.setblocking(False)
            _replace_fib(plane, dump_routes(ns))
            self.routers[name] = Router(plane, ns, socks, routes, links, {pi.port: i for i, pi in ports.items()})
        self.links = self._link_model()
        self.links.tx = self.tx
        log.info("user datapath: %d routers, %d ports, %s", len(self.routers),
                 sum(len(r.socks) for r in self.routers.values()), self.cfg)

    def _link_model(self) -> RoceLinks:
        phys = self.config["physics"]
        nodes = nodes_from_cables({str(k): bool(v) for k, v in phys["nodes"].items()},
                                  [Cable.from_list(c) for c in phys["cables"]], kind="eth",
                                  switch=switch_model(self.cfg), eth=eth_config(self.cfg))
        routers = self.routers

        def sock(name: str, port: int) -> socket.socket | None:
            r = routers.get(name)
            i = r.by_port.get(port) if r is not None else None
            return r.socks.get(i) if r is not None and i is not None else None

        def mac(name: str, port: int) -> bytes:
            r = routers[name]
            return r.plane.ports[r.by_port[port]].mac

        ports_down = {(name, port): (r.plane.down, i) for name, r in routers.items() for port, i in r.by_port.items()}

        def down(name: str, port: int) -> bool:  # (every departure's: one lookup)
            where = ports_down.get((name, port))
            return where is None or where[1] in where[0]

        def deliver(name: str, port: int, frames: list[bytearray]) -> None:  # as if read on its socket
            r = routers[name]
            i = r.by_port.get(port)
            if i is not None:
                self.receive_batch(r, i, frames, clock.now_ns())  # type: ignore[arg-type]

        def where(name: str, port: int) -> tuple[str | None, str]:
            r = routers[name]
            return r.ns, r.plane.ports[r.by_port[port]].ifname

        return RoceLinks(nodes, sockets=sock, macs=mac, down=down, loss_pct=self.cfg.loss_pct,
                         seed=int(phys.get("seed", 0)), deliver=deliver if self.handover else None, where=where)

    def close(self) -> None:
        self.tx.close()  # first: what it has queued goes out on sockets still open (no reused fd)
        for r in self.routers.values():
            for s in (*r.socks.values(), r.routes, r.links):
                s.close()
        if self.links is not None:
            self.links.close()

    def sync_tx_errors(self) -> None:
        """Frames the sender could not send, into the routers' ``tx_errors`` statistics."""
        total = 0
        for r in self.routers.values():
            n = self.tx.dropped.get(r.plane.name, 0)
            total += n
            r.plane.stats["tx_errors"] = n
        self.tx_errors = total

    # -- tasks ---------------------------------------------------------------------------
    async def forward(self) -> None:
        """Every port of every router, in this one task: receive -> plane -> send.

        One epoll set over the ports' sockets: one trio wake-up serves every port that has
        frames, and a port's waiting frames are taken with one ``recvmmsg``
        (``kernel.ring.RxBatcher``). The batch goes through the router's ``RouterPlane``
        frame by frame (forwarding), its decisions per egress port into the link model
        (``RoceLinks.submit``), which sends what is due at once and arms its timer; what is
        due for other routers is handed to them at the end of the wake-up (``LiveLinks.batch``).
        """
        links = self.links
        assert links is not None
        ep = select.epoll()
        by_fd: dict[int, tuple[Router, int, socket.socket]] = {}
        rx = RxBatcher()
        try:
            for r in self.routers.values():
                for ifindex, sock in r.socks.items():
                    by_fd[sock.fileno()] = (r, ifindex, sock)
                    ep.register(sock.fileno(), select.EPOLLIN)
            while True:
                await trio.lowlevel.wait_readable(ep.fileno())
                now = clock.now_ns()
                with links.batch():
                    for fd, _ in ep.poll(0):
                        r, ifindex, sock = by_fd[fd]
                        frames = rx.recv_batch(sock)
                        if frames:
                            self.receive_batch(r, ifindex, frames, now)
        finally:
            ep.close()

    def receive_batch(self, r: Router, ifindex: int, frames: list[bytes], now: int) -> None:
        """``frames`` received on ``ifindex``: through the plane, then into the link model."""
        plane, links = r.plane, self.links
        assert links is not None
        out: dict[int, list[bytes | bytearray]] = {}
        try:
            missed = plane.receive_batch(ifindex, frames, now, out)
        except Exception:  # a frame must never take the datapath down (the batch's rest is lost)
            plane.stats["rx_errors"] += 1
            log.exception("%s: frames on %d", plane.name, ifindex)
            return
        port = plane.ports[ifindex]
        if missed and not port.to_host:  # frames of a neighbour not forwarded: their records go
            sent = {id(f) for q in out.values() for f in q}
            for f in frames:
                if id(f) not in sent and len(f) >= 54 and not pfc.is_pause(f):
                    links.settle(plane.name, port.port, f)
        if plane.host_pauses:
            for i, quanta in plane.host_pauses:
                links.host_pause(plane.name, plane.ports[i].port, quanta)
            plane.host_pauses.clear()
        if out:
            links.submit(plane.name, port.port, {plane.ports[e].port: q for e, q in out.items()}, plane.prio)

    async def route_watch(self, r: Router) -> None:
        while True:
            await trio.lowlevel.wait_readable(r.routes)
            while True:
                try:
                    data = r.routes.recv(1 << 16)
                except BlockingIOError:
                    break
                except OSError as exc:  # ENOBUFS: notifications lost; dump again
                    log.warning("%s: route socket: %s: dumping the FIB again", r.plane.name, exc)
                    await self.redump(r)
                    break
                r.route_batches += 1
                for m in parse_routes(data):
                    r.plane.fib.apply(m)

    async def link_watch(self, r: Router) -> None:
        while True:
            await trio.lowlevel.wait_readable(r.links)
            came_back = False
            now = clock.now_ns()
            for ev in linkevents.read_events(r.links):
                if ev.ifindex not in r.plane.ports:
                    continue
                up = ev.admin_up and ev.carrier and not ev.deleted
                if up == (ev.ifindex not in r.plane.down):
                    continue
                r.plane.set_link(ev.ifindex, up, now)
                if self.links is not None:  # the frames on the cable are gone
                    self.links.plane.link_reset(r.plane.name, r.plane.ports[ev.ifindex].port, now)
                came_back |= up
                log.info("%s: port %s %s", r.plane.name, r.plane.ports[ev.ifindex].ifname, "up" if up else "down")
            if came_back:
                await self.redump(r)

    async def redump(self, r: Router, tries: int = 3) -> None:
        """The FIB from a fresh dump; again if notifications arrived meanwhile (the dump may
        predate them)."""
        for _ in range(tries):
            seen = r.route_batches
            msgs = await trio.to_thread.run_sync(dump_routes, r.ns)
            _replace_fib(r.plane, msgs)
            if r.route_batches == seen:
                return

    def counters(self) -> dict[str, Any]:
        self.sync_tx_errors()
        now = clock.now_ns()
        per: dict[str, dict[str, Any]] = {name: r.plane.counters(now) for name, r in self.routers.items()}
        model = self.links.port_counters(now) if self.links is not None else {}
        for name, r in self.routers.items():
            ports: dict[str, dict[str, dict[str, int]]] = {}
            tot: dict[str, int] = {}
            for port, prios in model.get(name, {}).items():
                i = r.by_port.get(port)
                if i is None:
                    continue
                ports[r.plane.ports[i].ifname] = {str(p): d for p, d in prios.items()}
                for d in prios.values():
                    for k, v in d.items():
                        tot[k] = tot.get(k, 0) + v
            per[name]["ports"] = ports
            per[name]["totals"] = tot
        totals: dict[str, int] = {}
        for c in per.values():
            for part in ("totals", "stats"):
                counts: dict[str, int] = c[part]
                for k, v in counts.items():
                    totals[k] = totals.get(k, 0) + int(v)
        state: dict[str, Any] = {}
        if self.links is not None:
            lp = self.links.plane
            queued = {f"{n.name}:{num}": p.total_bytes for n in lp.nodes.values() for num, p in n.ports.items()
                      if p.total_bytes}
            paused = {f"{n.name}:{num}": sorted(p.paused) for n in lp.nodes.values() for num, p in n.ports.items()
                      if p.paused}
            hosts = {f"{n.name}:{num}": (p.counters.paused_ns + sum(now - t for t in p.paused_since.values())) // 1000
                     for n in lp.nodes.values() if not n.switch for num, p in n.ports.items()
                     if p.counters.paused_ns or p.paused_since}
            state = {"hosts_paused_us": hosts, "frames_in": lp.frames_in, "unmatched": lp.unmatched, "drops": lp.drops,
                     "drop_reasons": dict(lp.drop_reasons), "queued_bytes": queued, "paused": paused,
                     "sent": self.links.sent, "handed": self.links.handed}
        return {"schema": "ibemu.roce-userpath/1", "t_ns": now, "config": self.cfg.to_dict(),
                "totals": totals, "routers": per, "model": state}

    def write_counters(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.counters()))
        tmp.replace(path)

    async def counter_writer(self, path: Path | None) -> None:
        """Every second: the counters (to ``path``), the links' fidelity (to the lag log)."""
        while True:
            await trio.sleep(clock.emulated_s(COUNTERS_EVERY_S))
            if path is not None:
                self.write_counters(path)
            if self.links is not None:
                self.links.plane.expire(clock.now_ns())
                self.links.report_links()

    async def capture_watch(self) -> None:
        """Every ``CAPTURE_CHECK_S``: which cables between routers a capture listens on (they
        go through their veth, not in memory)."""
        while self.links is not None:
            await trio.sleep(clock.loop_s(CAPTURE_CHECK_S))  # (real seconds, at any dilation)
            self.links.check_captures()

    async def serve(self, counters: Path | None, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            if self.links is not None:
                n.start_soon(self.links.serve)
                if self.handover:
                    n.start_soon(self.capture_watch)
            n.start_soon(self.forward)
            for r in self.routers.values():
                n.start_soon(self.route_watch, r)
                n.start_soon(self.link_watch, r)
            n.start_soon(self.counter_writer, counters)
            task_status.started()


async def amain(args: argparse.Namespace) -> int:
    config = json.loads(Path(args.config).read_text())
    # The sender thread (TxBatcher) must not wait Python's default 5 ms for the GIL while
    # this thread works through a batch: its frames would leave late.
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    dp = UserDatapath(config)
    counters = Path(args.counters) if args.counters else None
    try:
        dp.open()
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as n:
                await n.start(dp.serve, counters)
                n.start_soon(lagmon.watch_from_env, "user-datapath")  # in a run: its lag
                if args.ready:
                    Path(args.ready).write_text(str(os.getpid()))
                async for _sig in signals:
                    n.cancel_scope.cancel()
                    break
    finally:
        if dp.links is not None:
            try:
                dp.links.report_links(final=True)  # the last interval's link fidelity
            except OSError:
                log.warning("the last link fidelity records were not written")
        if counters is not None and dp.routers:
            dp.write_counters(counters)
        dp.close()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ibemu.roce.userpath", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="userpath.json (in the run directory)")
    p.add_argument("--counters", default=None, help="where to write the counters (JSON)")
    p.add_argument("--ready", default=None, help="a file written once every router forwards")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_trio(amain, args)


if __name__ == "__main__":
    sys.exit(main())
