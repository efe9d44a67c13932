"""Mininet adapter: IB topologies for Mininet, an ibemu fabric with a Mininet-like API, and the
venv side of ``mn --custom`` (:mod:`ibemu.mininet.custom`).

Three ways in:

- ``sudo mn --custom $(python -m ibemu.mininet --custom-path) --topo ibfattree,4 --switch ibsw``:
  Mininet's own ``mn`` on an IB fabric. The custom file runs in ``mn``'s interpreter (the
  system Python, without ibemu's dependencies) and calls this module's command line in
  ibemu's venv: ``layout`` (a generated topology as JSON), ``run-info`` and ``pingall``.
- ``to_ibemu(topo)``: any Mininet topology (these or a user's own, ports kept) as an ibemu
  topology; ``topos`` here holds ``ibfattree``/``ibleafspine`` built straight from ibemu's
  generators (a stand-in ``Topo`` when Mininet is not installed, so the module always imports).
- :class:`IbemuNet`: an ibemu fabric driven with the calls a Mininet script uses::

    from ibemu.mininet import IbFatTree, IbemuNet
    net = IbemuNet(IbFatTree(k=4), sm="ibemu")
    net.start()
    print(net.get("h1").cmd("ip -br link"))
    net.configLinkStatus("agg0_0", "core1", "down")   # through the fabric daemon
    net.stop()
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ibemu.fabric.session import Session
from ibemu.topo import Topology, generate

try:  # a Mininet custom file is loaded by Mininet; imported on its own it must not need Mininet
    from mininet.topo import Topo as _Base

    HAVE_MININET = True
except ImportError:  # pragma: no cover - depends on the machine
    HAVE_MININET = False

    class _Base:  # type: ignore[no-redef]
        """What ibemu needs of ``mininet.topo.Topo`` (same names, same arguments)."""

        def __init__(self, *args: Any, **params: Any) -> None:
            self._nodes: dict[str, dict[str, Any]] = {}
            self._links: list[tuple[str, str, dict[str, Any]]] = []
            self.build(*args, **params)

        def build(self, *args: Any, **params: Any) -> None:
            pass

        def addHost(self, name: str, **opts: Any) -> str:
            self._nodes[name] = dict(opts)
            return name

        def addSwitch(self, name: str, **opts: Any) -> str:
            self._nodes[name] = {"isSwitch": True, **opts}
            return name

        def addLink(self, node1: str, node2: str, port1: int | None = None,
                    port2: int | None = None, **opts: Any) -> tuple[str, str]:
            # numbered as Mininet's Topo.addPort does: switches from 1, hosts from 0
            ports: dict[str, list[int]] = self.__dict__.setdefault("_ports", {})
            for n in (node1, node2):
                ports.setdefault(n, [])
            if port1 is None:
                port1 = len(ports[node1]) + (1 if self.isSwitch(node1) else 0)
            if port2 is None:
                port2 = len(ports[node2]) + (1 if self.isSwitch(node2) else 0)
            ports[node1].append(port1)
            ports[node2].append(port2)
            self._links.append((node1, node2, {"node1": node1, "node2": node2, "port1": port1,
                                               "port2": port2, **opts}))
            return (node1, node2)

        def isSwitch(self, n: str) -> bool:
            return bool(self._nodes[n].get("isSwitch", False))

        def nodes(self, sort: bool = True) -> list[str]:
            return sorted(self._nodes) if sort else list(self._nodes)

        def switches(self, sort: bool = True) -> list[str]:
            return [n for n in self.nodes(sort) if self.isSwitch(n)]

        def hosts(self, sort: bool = True) -> list[str]:
            return [n for n in self.nodes(sort) if not self.isSwitch(n)]

        def iterLinks(self, withKeys: bool = False, withInfo: bool = False) -> Any:
            for a, b, info in self._links:
                yield (a, b, info) if withInfo else (a, b)

        def links(self, sort: bool = False, withKeys: bool = False, withInfo: bool = False) -> list[Any]:
            return list(self.iterLinks(withKeys, withInfo))


class _IbTopo(_Base):
    """A Mininet topology made from an ibemu generator: same names, same port numbers."""

    generator = ""

    def build(self, *args: Any, **params: Any) -> None:
        self.ibemu_topology = self.make(*args, **params)
        for node in self.ibemu_topology.switches():
            self.addSwitch(node.name, ports=node.num_ports)
        for node in self.ibemu_topology.cas():
            self.addHost(node.name)
        for link in self.ibemu_topology.links:
            self.addLink(link.a.node, link.b.node, port1=link.a.port, port2=link.b.port)

    def make(self, *args: Any, **params: Any) -> Topology:
        raise NotImplementedError


class IbFatTree(_IbTopo):
    """``--topo ibfattree,K``: ibemu's 3-level k-ary fat-tree (edgeP_I, aggP_J, coreC, hN)."""

    def make(self, k: int = 4, **params: Any) -> Topology:
        return generate("fat-tree", {"k": int(k), **params})


class IbLeafSpine(_IbTopo):
    """``--topo ibleafspine,LEAVES,SPINES,HOSTS_PER_LEAF``: a two-tier Clos."""

    def make(self, leaves: int = 4, spines: int = 2, hosts_per_leaf: int = 4,
             **params: Any) -> Topology:
        return generate("leaf-spine", {"leaves": int(leaves), "spines": int(spines),
                                       "hosts_per_leaf": int(hosts_per_leaf), **params})


topos = {"ibfattree": IbFatTree, "ibleafspine": IbLeafSpine}


def to_ibemu(topo: Any, *, name: str = "mininet") -> Topology:
    """The ibemu topology of a Mininet topology (ours as generated; any other from its graph).

    Ports given to ``addLink`` are kept; missing ones are numbered in order from 1. Mininet
    numbers host ports from 0, so a host whose ports start at 0 is shifted by one (IB ports
    start at 1). A switch gets as many ports as its highest port number.
    """
    own = getattr(topo, "ibemu_topology", None)
    if isinstance(own, Topology):
        return own
    ports: dict[str, list[int]] = {n: [] for n in topo.nodes()}
    cables: list[tuple[str, int | None, str, int | None]] = []
    for a, b, info in topo.iterLinks(withInfo=True):
        a, b = info.get("node1", a), info.get("node2", b)
        p1, p2 = info.get("port1"), info.get("port2")
        cables.append((a, p1, b, p2))
        for n, p in ((a, p1), (b, p2)):
            if p is not None:
                ports[n].append(int(p))
    next_free = {n: max(ps, default=0) + 1 for n, ps in ports.items()}
    shift = {n: 1 if 0 in ps and not topo.isSwitch(n) else 0 for n, ps in ports.items()}
    def number(n: str, p: int | None) -> int:
        if p is None:
            p, next_free[n] = next_free[n], next_free[n] + 1
        return int(p) + shift[n]

    ends = [(a, number(a, p1), b, number(b, p2)) for a, p1, b, p2 in cables]
    used = dict.fromkeys(ports, 1)
    for a, pa, b, pb in ends:
        used[a], used[b] = max(used[a], pa), max(used[b], pb)
    t = Topology(name)
    for n in topo.switches():
        t.add_switch(n, used[n])
    for n in topo.hosts():
        t.add_ca(n, used[n])
    for a, pa, b, pb in ends:
        t.connect(a, pa, b, pb)
    return t.check()


class _Node:
    """``net.get(name)``: a node of a running ibemu fabric, Mininet's ``cmd`` on it."""

    def __init__(self, net: IbemuNet, name: str) -> None:
        self.net, self.name = net, name

    def cmd(self, *args: str) -> str:
        """Run a shell command in the node's namespace; its output (stdout and stderr)."""
        return self.net._exec(self.name, " ".join(args))

    def __repr__(self) -> str:
        return f"<{self.name}>"


class IbemuNet:
    """An ibemu fabric built from a Mininet topology, driven like ``mininet.net.Mininet``.

    ``start()`` brings the fabric up as ``ibemu up`` does (a ``Session``: the fabric daemon owns
    everything; ``IBEMU_STATE_DIR`` is honoured), ``stop()`` tears it down. Needs root.
    """

    def __init__(self, topo: Any, *, sm: str = "ibemu", datapath: str = "kernel") -> None:
        self.topo = to_ibemu(topo)
        self.sm, self.datapath = sm, datapath
        self.session: Session | None = None

    @property
    def run_id(self) -> str | None:
        return self.session.run_id if self.session is not None else None

    def start(self) -> None:
        from ibemu.fabric.session import FabricRequest

        self.topo.check()
        sm_host = next((n.name for n in self.topo.cas()), "")
        self.session = Session.up(FabricRequest(self.topo, "mininet", datapath=self.datapath, sm=self.sm,
                                                sm_host=sm_host, sm_engine="minhop"))

    def stop(self) -> None:
        if self.session is not None:
            problems, self.session = self.session.down(), None
            if problems:
                raise RuntimeError(f"ibemu down: {'; '.join(problems)}")

    def get(self, name: str) -> _Node:
        if name not in self.topo.nodes:
            raise KeyError(name)
        return _Node(self, name)

    __getitem__ = get

    def hosts(self) -> list[_Node]:
        return [_Node(self, n.name) for n in self.topo.cas()]

    def switches(self) -> list[_Node]:
        return [_Node(self, n.name) for n in self.topo.switches()]

    def _running(self) -> Session:
        if self.session is None:
            raise RuntimeError("the fabric is not running: call start() first")
        return self.session

    def _exec(self, node: str, command: str) -> str:
        r = self._running().exec(node, ["sh", "-c", command], capture_output=True, text=True, timeout=300)
        return str(r.stdout) + str(r.stderr)

    def configLinkStatus(self, src: str, dst: str, status: str) -> dict[str, Any]:
        """Mininet's ``link src dst up|down``: the cable goes through the fabric daemon."""
        return self._running().link([src, dst, status])

    def configSwitchStatus(self, name: str, status: str) -> dict[str, Any]:
        return self._running().switch([name, status])

    def __enter__(self) -> IbemuNet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()




# --- the venv side of ``mn --custom`` (ibemu/mininet/custom.py runs these as subprocesses) ---

def custom_path() -> Path:
    """The file to give ``mn --custom``."""
    return Path(__file__).with_name("custom.py")


def layout(spec: str) -> dict[str, Any]:
    """A generated topology (``fat-tree,k=4``) as the custom file builds its Mininet ``Topo``."""
    from ibemu.topo import parse_topo_spec

    topo = parse_topo_spec(spec).check()
    return {
        "switches": [{"name": n.name, "guid": f"{n.guid:016x}", "ports": n.num_ports} for n in topo.switches()],
        "hosts": [{"name": n.name, "guid": f"{n.guid:016x}", "ports": n.num_ports} for n in topo.cas()],
        "links": [{"node1": ln.a.node, "port1": ln.a.port, "intf1": topo.ifname(ln.a.node, ln.a.port),
                   "node2": ln.b.node, "port2": ln.b.port, "intf2": topo.ifname(ln.b.node, ln.b.port)}
                  for ln in topo.links],
    }


def _plan(run_id: str) -> Any:
    from ibemu.fabric.plan import plan_fabric
    from ibemu.kernel import ownership

    return plan_fabric(Session(ownership.RunState(run_id)).topology, run_id)


def run_info(run_id: str) -> dict[str, Any]:
    """Where a running fabric's nodes live: their namespaces, the daemon's control socket."""
    from ibemu.fabric import control
    from ibemu.kernel import ownership

    plan = _plan(run_id)
    return {"run": run_id, "namespaces": {name: n.ns for name, n in plan.nodes.items()},
            "control": str(control.socket_path(ownership.RunState(run_id).run_dir))}


def main(argv: list[str] | None = None) -> int:
    """``python -m ibemu.mininet --custom-path | layout SPEC | run-info RUN | pingall RUN``."""
    ap = argparse.ArgumentParser(prog="python -m ibemu.mininet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--custom-path", action="store_true", help="print the file for `mn --custom` and exit")
    sub = ap.add_subparsers(dest="what")
    lay = sub.add_parser("layout", help="a generated topology (fat-tree,k=4) as JSON")
    lay.add_argument("spec")
    info = sub.add_parser("run-info", help="namespaces and control socket of a running fabric (JSON)")
    info.add_argument("run")
    png = sub.add_parser("pingall", help="IB reachability between hosts of a running fabric (JSON)")
    png.add_argument("run")
    png.add_argument("--hosts", help="comma-separated hosts (default: every host)")
    png.add_argument("--count", type=int, default=1)
    png.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for the frames")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.custom_path:
        sys.stdout.write(f"{custom_path()}\n")
        return 0
    if args.what == "layout":
        result = layout(args.spec)
    elif args.what == "run-info":
        result = run_info(args.run)
    elif args.what == "pingall":
        from ibemu.mininet.ping import pingall

        plan = _plan(args.run)
        hosts = args.hosts.split(",") if args.hosts else [n.name for n in plan.cas()]
        result = pingall(plan, hosts, count=args.count, timeout_s=args.timeout)
    else:
        ap.print_usage(sys.stderr)
        return 2
    sys.stdout.write(json.dumps(result) + "\n")
    return 0

