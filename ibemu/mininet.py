"""Mininet adapter: IB topologies as Mininet custom topologies, and an ibemu fabric with a Mininet-like API.

As a Mininet custom file it registers ``topos`` (``ibfattree`` with ``k``, ``ibleafspine``
with ``leaves, spines, hosts_per_leaf``), so ``mn --custom ibemu/mininet.py --topo
ibfattree,4`` finds them. Mininet itself is optional: without it the topologies subclass a
small stand-in with the same building API (``addSwitch``/``addHost``/``addLink``,
``hosts``/``switches``/``iterLinks``), so this module always imports.

What runs an IB fabric is ibemu, not Mininet's nodes: Mininet's ``Host``/``Switch``/``Link``
classes make Ethernet namespaces through ``mnexec``, with Linux bridges or Open vSwitch and
veths named ``s1-eth1``, and nothing in them speaks IB. So there are no ``ibsw``/``ibhost``
node classes for ``mn``; instead :func:`to_ibemu` turns any Mininet topology (these or a
user's own, ports kept) into an ibemu topology, and :class:`IbemuNet` runs it with the calls a
Mininet script uses (``start``, ``stop``, ``get(name).cmd(...)``, ``configLinkStatus``)::

    from ibemu.mininet import IbFatTree, IbemuNet
    net = IbemuNet(IbFatTree(k=4), sm="ibemu")
    net.start()
    print(net.get("h1").cmd("ip -br link"))
    net.configLinkStatus("agg0_0", "core1", "down")   # through the fabric daemon
    net.stop()
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ibemu.topo import Topology, dumps_ibnetdiscover, generate

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

    ``start()`` runs ``ibemu up`` (the fabric daemon owns everything; ``IBEMU_STATE_DIR`` is
    honoured), ``stop()`` tears it down. Needs root, as ``ibemu up`` does.
    """

    def __init__(self, topo: Any, *, sm: str = "ibemu", datapath: str = "kernel") -> None:
        self.topo = to_ibemu(topo)
        self.sm, self.datapath = sm, datapath
        self.run_id: str | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def _ibemu(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ibemu.cli.main", *args], capture_output=True,
                              text=True, check=False, timeout=300)

    def start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="ibemu-mininet-")
        topo_file = Path(self._tmp.name) / "fabric.ibnd"
        topo_file.write_text(dumps_ibnetdiscover(self.topo))
        scen = Path(self._tmp.name) / "mininet.yaml"
        scen.write_text(f"name: mininet\ntopology: {{file: {topo_file}}}\n")
        up = self._ibemu("up", str(scen), "--sm", self.sm, "--datapath", self.datapath)
        if up.returncode != 0:
            raise RuntimeError(f"ibemu up failed: {up.stderr.strip() or up.stdout.strip()}")
        self.run_id = up.stdout.split()[1]

    def stop(self) -> None:
        if self.run_id is not None:
            down = self._ibemu("down", "--run", self.run_id)
            self.run_id = None
            if down.returncode != 0:
                raise RuntimeError(f"ibemu down: {down.stderr.strip()}")
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def get(self, name: str) -> _Node:
        if name not in self.topo.nodes:
            raise KeyError(name)
        return _Node(self, name)

    __getitem__ = get

    def hosts(self) -> list[_Node]:
        return [_Node(self, n.name) for n in self.topo.cas()]

    def switches(self) -> list[_Node]:
        return [_Node(self, n.name) for n in self.topo.switches()]

    def _running(self) -> str:
        if self.run_id is None:
            raise RuntimeError("the fabric is not running: call start() first")
        return self.run_id

    def _exec(self, node: str, command: str) -> str:
        run = self._running()
        r = self._ibemu("exec", "--run", run, node, "--", "sh", "-c", command)
        return r.stdout + r.stderr

    def configLinkStatus(self, src: str, dst: str, status: str) -> dict[str, Any]:
        """Mininet's ``link src dst up|down``: the cable goes through the fabric daemon."""
        from ibemu.cli.console_cmd import link_request
        from ibemu.fabric import control
        from ibemu.kernel import ownership

        req = link_request(self.topo, [src, dst, status])
        return control.request(control.socket_path(ownership.RunState(self._running()).run_dir), req)

    def configSwitchStatus(self, name: str, status: str) -> dict[str, Any]:
        from ibemu.cli.console_cmd import switch_request
        from ibemu.fabric import control
        from ibemu.kernel import ownership

        req = switch_request(self.topo, [name, status])
        return control.request(control.socket_path(ownership.RunState(self._running()).run_dir), req)

    def __enter__(self) -> IbemuNet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


