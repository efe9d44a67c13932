"""Flows' paths through a fabric as its real tables route them, for ``ibemu.physics.bisection``.

The physics layer computes rates on paths and may not know the SM or the RoCE routes; this
module (for tests and ``benchmarks/bench_bisection.py``) turns a topology and a flow into the
path the emulator would give it:

- :class:`IbRouting`: the LFTs ibemu's routing engine computes (``ibemu.sm.routing.compute``
  on the graph discovery would build, ``ibemu.testing.fromtopo.graph_of``: the tables the SM
  would program), followed from the source's switch by the destination's LID. A flow's path
  depends on its destination only. ``shift_order`` gives the hosts in ftree's own index order
  (leaf by leaf, pod by pod), the order its shift permutations are contention-free in.
- :class:`EcmpRouting`: a RoCE fabric as the user datapath forwards it. The routes are the
  fabric manager's (``ibemu.roce.routes.compute`` on ``ibemu.roce.addressing.plan_addresses``:
  every shortest next hop), plus each router's connected /31s, loaded into the datapath's own
  ``ibemu.kernel.fib.Fib`` with the router's seed (``netconf.multipath_seed``); the next hops'
  interface indexes are the fabric plan's (``fabric.plan.plan_fabric``: 16, 17, ... in link
  order; the Fib sorts them, so the hash's modulo picks by index as live). At every router the
  next hop is ``Fib.choose`` on the flow's 5-tuple as ``kernel.fib.flow_key`` reads it from the
  frame: source and destination addresses (the hosts' addresses of the plan), protocol UDP,
  source port ``wire.rocecodec.udp_sport`` of the destination QP, destination port 4791. The
  destination QP is the first of the flow's worker's range as ``ibemu run`` gives it
  (``QPN_BASE + index * QPNS_PER_FLOW``, ``index`` the flow's place in the scenario's list):
  per-flow static hashing, so two flows may collide on one link while another idles.
"""

from __future__ import annotations

import ipaddress
import struct

from ibemu.fabric.plan import plan_fabric
from ibemu.kernel.fib import Fib, RouteMsg, flow_key
from ibemu.kernel.netconf import multipath_seed
from ibemu.physics.bisection import Path, trace
from ibemu.roce import routes as roce_routes
from ibemu.roce.addressing import plan_addresses
from ibemu.scenario.runner import QPN_BASE, QPNS_PER_FLOW
from ibemu.sm.routing import compute
from ibemu.sm.routing.alternates import AR_ENGINES, compute_ar
from ibemu.testing.fromtopo import graph_of
from ibemu.topo.model import Topology
from ibemu.wire.roce import ROCEV2_UDP_PORT
from ibemu.wire.rocecodec import udp_sport


class IbRouting:
    """Paths by the LFTs of one of ibemu's routing engines (see the module docstring)."""

    def __init__(self, topo: Topology, engine: str = "ftree") -> None:
        """``engine`` ``ftree_ar``/``updn_ar``: the base engine's LFTs and the checked
        alternates its SM would write (``compute_ar``), as ``alternates`` and ``group``."""
        self.topo = topo
        graph = graph_of(topo)
        alts: dict[int, dict[int, tuple[int, ...]]] = {}
        if engine in AR_ENGINES:
            ar = compute_ar(graph, engine)
            self.routes, alts = ar.primary, ar.alternates
        else:
            self.routes = compute(graph, engine)
        self.lfts = {n: self.routes.lfts[node.guid] for n, node in topo.nodes.items() if node.is_switch}
        self.lids = {n: graph.nodes[node.guid].ports[1].lid for n, node in topo.nodes.items() if node.is_ca}
        self.switch_lids = {n: graph.nodes[node.guid].ports[0].lid for n, node in topo.nodes.items()
                            if node.is_switch}
        self.alternates: dict[str, dict[int, tuple[int, ...]]] = {
            n: dict(alts.get(node.guid, {})) for n, node in topo.nodes.items() if node.is_switch}
        """Switch name -> LID -> alternate ports (empty without an ``_ar`` engine)."""

    def group(self, switch: str, lid: int) -> tuple[int, ...]:
        """The ports ``switch`` may send ``lid`` by: its LFT's, then the alternates."""
        return (self.lfts[switch][lid], *self.alternates[switch].get(lid, ()))

    def path(self, src: str, dst: str, index: int = 0) -> Path:
        lid = self.lids[dst]
        return trace(self.topo, src, dst, lambda sw: self.lfts[sw][lid])

    def shift_order(self) -> list[str]:
        """Hosts in the engine's destination index order (ftree), else by LID."""
        idx = self.routes.state.ca_index if self.routes.state is not None else {}
        return sorted(self.lids, key=lambda h: (idx.get(self.lids[h], self.lids[h]), self.lids[h]))


def qpn_of_flow(index: int) -> int:
    """The destination QP of the ``index``-th flow of a run (its worker's first QP number)."""
    return QPN_BASE + index * QPNS_PER_FLOW


def header(src_ip: str, dst_ip: str, sport: int, dport: int = ROCEV2_UDP_PORT) -> bytes:
    """Ethernet + IPv4 + UDP headers of a RoCEv2 frame, as far as the ECMP hash reads them."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0x4000, 64, 17, 0,
                     ipaddress.IPv4Address(src_ip).packed, ipaddress.IPv4Address(dst_ip).packed)
    return bytes(12) + b"\x08\x00" + ip + struct.pack("!HHHH", sport, dport, 0, 0)


class EcmpRouting:
    """Paths by the RoCE user datapath's ECMP (see the module docstring)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.addrs = plan_addresses(topo)
        plan = plan_fabric(topo, "bisect")
        ifindex: dict[tuple[str, str], int] = {}
        for link, cable in zip(topo.links, plan.cables, strict=True):
            assert cable.a_index is not None and cable.b_index is not None
            ifindex[(link.a.node, cable.a_if)] = cable.a_index
            ifindex[(link.b.node, cable.b_if)] = cable.b_index
        self.port_of: dict[str, dict[int, int]] = {}
        self.fibs: dict[str, Fib] = {}
        names = roce_routes.routers(topo)
        table = roce_routes.compute(self.addrs, names)
        for r in names:
            fib = self.fibs[r] = Fib(multipath_seed(r))
            ports = self.port_of[r] = {}
            for pa in self.addrs.node_ports(r):
                ix = ifindex[(r, pa.ifname)]
                ports[ix] = pa.port
                net = ipaddress.IPv4Network(f"{pa.ip}/31", strict=False)
                fib.apply(RouteMsg(False, int(net.network_address), 31, (ix,)))
            for prefix, hops in table[r].items():
                net = ipaddress.IPv4Network(prefix)
                oifs = tuple(sorted({ifindex[(r, h.ifname)] for h in hops}))
                fib.apply(RouteMsg(False, int(net.network_address), net.prefixlen, oifs))

    def flow_key(self, src: str, dst: str, index: int) -> bytes:
        sport = udp_sport(qpn_of_flow(index))
        return flow_key(header(self.addrs.host_ip(src), self.addrs.host_ip(dst), sport))

    def path(self, src: str, dst: str, index: int = 0) -> Path:
        key = self.flow_key(src, dst, index)
        dst_ip = int(ipaddress.IPv4Address(self.addrs.host_ip(dst)))

        def egress(sw: str) -> int:
            fib = self.fibs[sw]
            hops = fib.lookup(dst_ip)
            if hops is None:
                raise LookupError(f"{sw} has no route to {dst}")
            ix = fib.choose(hops, key)
            assert ix is not None
            return self.port_of[sw][ix]

        return trace(self.topo, src, dst, egress)
