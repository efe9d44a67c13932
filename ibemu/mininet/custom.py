"""ibemu for Mininet's ``mn``: ``sudo mn --custom FILE --topo ibfattree,4 --switch ibsw``.

FILE is this file (``python -m ibemu.mininet --custom-path`` prints it). ``mn`` runs it in its
own interpreter, usually the system Python, which has Mininet but not ibemu's dependencies, so
it imports nothing but the standard library and Mininet and drives ibemu through ibemu's venv
(``ibemu up/down/diag``, ``python -m ibemu.mininet layout|run-info|pingall``).

The IB fabric is ibemu's: its namespaces, veth cables, switch and HCA agents and subnet
manager, started by ``ibemu up`` when Mininet creates the first node. The Mininet objects wrap
it: ``IbHca`` and ``IbSwitch`` are nodes whose shell runs in the ibemu node's namespace,
``IbCable`` is a link over the existing cable (``link a b down`` goes through the fabric
daemon, stamped as a fault), ``IbSubnetManager`` is the controller (the SM: ``--controller
ibsm,engine=ftree``), and ``IbMininet`` answers ``pingall`` with IB frames between the hosts'
LIDs. The last node's ``terminate`` (``exit``) runs ``ibemu down``.

``mn`` copies every top-level name of a custom file into its own globals: besides ``topos``,
``switches``, ``hosts`` and ``controllers``, this file deliberately sets ``Mininet`` (IB-aware
ping), ``findController`` (the SM is the default controller) and ``cleanup`` (tear down this
fabric only: Mininet's own cleanup kills processes by name machine-wide).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from mininet.link import Intf, Link
from mininet.log import output
from mininet.net import Mininet as _MininetBase
from mininet.node import Controller, Host, Node, Switch
from mininet.topo import Topo

_log = logging.getLogger("ibemu.mininet.custom")

# infiniband-diags tools a host's shell runs on its own HCA port (through ``ibemu diag``)
_IB_TOOLS = ("ibnetdiscover", "smpquery", "ibroute", "ibtracert", "perfquery", "ibstat", "ibaddr",
             "sminfo", "saquery", "iblinkinfo", "ibqueryerrors", "ibswitches", "ibhosts", "ibnodes",
             "ibportstate", "ibping")


def _this_file() -> Path:
    """This file's path, also when ``mn`` exec()s it (no ``__file__`` then)."""
    return Path(sys._getframe().f_code.co_filename).resolve()


def _ibemu_python() -> str:
    """The Python that has ibemu: ``$IBEMU_PYTHON``, else the venv this file lives in or beside."""
    env = os.environ.get("IBEMU_PYTHON")
    if env:
        return env
    here = _this_file()
    for parent in here.parents:
        for cand in (parent / ".venv" / "bin" / "python", parent / "bin" / "python"):
            if cand.exists() and (cand.parent.parent / "pyvenv.cfg").exists():
                return str(cand)
    found = shutil.which("ibemu")
    if found:
        first = Path(found).read_text(errors="replace").splitlines()[0]
        if first.startswith("#!"):
            return first[2:].strip()
    return sys.executable


def _venv_call(*args: str, timeout: float = 300.0) -> str:
    """Run ``python -m ARGS`` in ibemu's venv; its stdout (raises with stderr on failure)."""
    argv = [_ibemu_python(), "-m", *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                       cwd=str(_this_file().parent.parent))
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


class IbFabric:
    """One ibemu fabric behind a Mininet network: ``ibemu up`` on first use, ``down`` once."""

    current: IbFabric | None = None

    def __init__(self, spec: str, *, datapath: str = "kernel") -> None:
        self.spec, self.datapath = spec, datapath
        self.sm, self.sm_engine, self.sm_host = "none", "", ""
        self.layout: dict[str, Any] = json.loads(_venv_call("ibemu.mininet", "layout", spec))
        self.run_id: str | None = None
        self.info: dict[str, Any] = {}
        self.users: set[str] = set()
        IbFabric.current = self

    def ensure_up(self) -> None:
        if self.run_id is not None:
            return
        args = ["ibemu.cli.main", "up", "--topo", self.spec, "--datapath", self.datapath, "--sm", self.sm]
        if self.sm_engine:
            args += ["--sm-engine", self.sm_engine]
        if self.sm_host:
            args += ["--sm-host", self.sm_host]
        out = _venv_call(*args)
        self.run_id = out.split()[1]  # "fabric <run> up in ..."
        atexit.register(self.down)
        output(f"*** ibemu fabric {self.run_id} up: {out.splitlines()[0]}\n")
        self.info = json.loads(_venv_call("ibemu.mininet", "run-info", self.run_id))

    def namespace(self, node: str) -> str:
        return str(self.info["namespaces"][node])

    def shell_env(self, node: str) -> list[str]:
        """``NAME=value`` words a node's shell starts with: ibemu on PATH, its run and node."""
        bindir = str(Path(_ibemu_python()).parent)
        return [f"PATH={bindir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
                f"IBEMU_RUN={self.run_id}", f"IBEMU_NODE={node}"]

    def control(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request to the fabric daemon's control channel (``ibemu.fabric.control``)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(self.info["control"])
            s.sendall(json.dumps(request).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        return dict(json.loads(buf or b'{"ok": false, "error": "no reply"}'))

    def attach(self, node: str) -> None:
        self.users.add(node)

    def detach(self, node: str) -> None:
        self.users.discard(node)
        if not self.users:
            self.down()

    def down(self) -> None:
        if self.run_id is None:
            return
        run, self.run_id = self.run_id, None
        try:
            _venv_call("ibemu.cli.main", "down", "--run", run)
            output(f"*** ibemu fabric {run} down\n")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            output(f"*** ibemu fabric {run}: {exc} (`sudo ibemu clean {run}` removes what is left)\n")


def _fabric(given: IbFabric | None, what: str) -> IbFabric:
    fabric = given or IbFabric.current
    if fabric is None:
        raise RuntimeError(f"{what} runs on an ibemu fabric: use an IB topology "
                           "(--topo ibfattree,4 | ibleafspine,4,2,4 | ibemu,GENERATOR,key=value)")
    return fabric


class _IbNode(Node):
    """A Mininet node whose shell runs in an existing ibemu namespace (never its own)."""

    def __init__(self, name: str, fabric: IbFabric | None = None, **params: Any) -> None:
        self.fabric = _fabric(fabric, type(self).__name__)
        self.fabric.ensure_up()
        self.fabric.attach(name)
        params["inNamespace"] = False  # the namespace is ibemu's; mnexec must not make one
        super().__init__(name, **params)

    def _popen(self, cmd: list[str], **params: Any) -> Any:
        if self.shell is None and cmd[:1] == ["mnexec"]:  # the node's shell: into ibemu's namespace
            cmd = ["ip", "netns", "exec", self.fabric.namespace(self.name), "env",
                   *self.fabric.shell_env(self.name), *cmd]
        return super()._popen(cmd, **params)

    def terminate(self) -> None:
        super().terminate()
        self.fabric.detach(self.name)


class IbHca(_IbNode, Host):
    """``--host ibhca``: an emulated HCA; no IP, ``pingall`` is an IB ping (see ``IbMininet``)."""

    def __init__(self, name: str, fabric: IbFabric | None = None, **params: Any) -> None:
        super().__init__(name, fabric=fabric, **params)
        # `h1 smpquery nodeinfo 1`: the diags run on this host's HCA port (its MAD socket)
        self.cmd(" ".join(f'{t}() {{ ibemu diag --run "$IBEMU_RUN" "$IBEMU_NODE" {t} "$@"; }};'
                          for t in _IB_TOOLS))

    def config(self, **_params: Any) -> dict[str, Any]:
        self.cmd("ip link set lo up")  # the HCA port carries IB frames: no MAC or IP is set
        return {}

    def IP(self, intf: Any = None) -> None:
        return None


class IbSwitch(_IbNode, Switch):
    """``--switch ibsw``: an ibemu IB switch (its SMA and forwarding run in ibemu's agents)."""

    def __init__(self, name: str, fabric: IbFabric | None = None, **params: Any) -> None:
        fab = _fabric(fabric, "IbSwitch")
        guid = next((s["guid"] for s in fab.layout["switches"] if s["name"] == name), None)
        params.setdefault("dpid", guid)
        super().__init__(name, fabric=fab, **params)

    def start(self, controllers: list[Any]) -> None:
        """Nothing to start: the switch's agent runs since ``ibemu up``."""

    def stop(self, deleteIntfs: bool = True) -> None:
        """Its interfaces are ibemu's: ``ibemu down`` removes them with the namespace."""

    def connected(self) -> bool:
        return self.fabric.run_id is not None


class IbPort(Intf):
    """An ibemu interface (``edge0_0-3``) as a Mininet ``Intf``; never moved, addressed or deleted."""

    def config(self, **_params: Any) -> dict[str, Any]:
        return {}

    def updateIP(self) -> None:
        return None

    def ifconfig(self, *args: str) -> str:
        """``up``/``down`` through the fabric daemon (a stamped fault); the rest as Mininet does."""
        if len(args) == 1 and args[0] in ("up", "down"):
            end = f"{self.node.name}:{self.node.ports[self]}"
            reply = self.node.fabric.control({"fault": f"link_{args[0]}", "link": end, "end": end})
            return "" if reply.get("ok") else f"{self.name}: {reply.get('error')}"
        return str(super().ifconfig(*args))

    def delete(self) -> None:
        self.node.delIntf(self)
        self.link = None


class IbCable(Link):
    """A cable ibemu made (a veth pair between two namespaces), seen as a Mininet ``Link``."""

    def __init__(self, node1: Any, node2: Any, port1: int | None = None, port2: int | None = None,
                 intfName1: str | None = None, intfName2: str | None = None,
                 **_params: Any) -> None:
        self.intf1 = IbPort(intfName1 or f"{node1.name}-{port1}", node=node1, port=port1, link=self)
        self.intf2 = IbPort(intfName2 or f"{node2.name}-{port2}", node=node2, port=port2, link=self)
        self.fast = False

    def stop(self) -> None:
        """The cable is ibemu's: ``ibemu down`` removes it."""

    def delete(self) -> None:
        self.stop()


class IbSubnetManager(Controller):
    """``--controller ibsm[,impl=ibemu|opensm][,engine=ftree][,host=h0]``: the fabric's SM.

    IB switches have no OpenFlow controller; the subnet manager programs them. It runs as
    ibemu runs it (on a host's MAD socket); this node is a shell in the root namespace.
    """

    def __init__(self, name: str, impl: str = "ibemu", engine: str = "", host: str = "",
                 **params: Any) -> None:
        fabric = _fabric(None, "IbSubnetManager")
        fabric.sm, fabric.sm_engine, fabric.sm_host = impl, engine, host
        self.fabric = fabric
        super().__init__(name, **params)

    def checkListening(self) -> None:
        """No OpenFlow port to check."""

    def start(self) -> None:
        """``ibemu up`` has the SM running (it returns at SUBNET UP)."""

    def stop(self, *args: Any, **kwargs: Any) -> None:
        self.terminate()

    def IP(self, intf: Any = None) -> None:
        return None


class IbMininet(_MininetBase):
    """``Mininet`` whose ``ping`` (``pingall``, ``pingpair``) between IB hosts is an IB ping.

    Every ordered pair of hosts gets a UD SEND frame from the source's port to the destination's
    LID, through the LFTs the SM wrote (``python -m ibemu.mininet pingall``); other hosts are
    pinged as Mininet does.
    """

    def ping(self, hosts: list[Any] | None = None, timeout: Any = None,
             manualdestip: Any = None) -> float:
        hosts = list(self.hosts if hosts is None else hosts)
        if not hosts or not all(isinstance(h, IbHca) for h in hosts) or manualdestip:
            return float(super().ping(hosts, timeout, manualdestip))
        fabric = hosts[0].fabric
        output("*** Ping: testing IB reachability (UD SEND to each LID)\n")
        result = json.loads(_venv_call("ibemu.mininet", "pingall", str(fabric.run_id), "--hosts",
                                       ",".join(h.name for h in hosts),
                                       "--timeout", str(float(timeout or 1.0))))
        sent = received = 0
        for src in hosts:
            output(f"{src.name} -> ")
            for dst in hosts:
                if dst is src:
                    continue
                ok = result["reached"][src.name][dst.name]
                sent, received = sent + 1, received + ok
                output(f"{dst.name} " if ok else "X ")
            output("\n")
        lost = 100.0 * (sent - received) / sent if sent else 0.0
        output(f"*** Results: {lost:.0f}% dropped ({received}/{sent} received)\n")
        return lost


    def iperf(self, hosts: list[Any] | None = None, *args: Any, **kwargs: Any) -> list[str]:
        """Mininet's iperf needs IP; between IB hosts it says what to run instead."""
        pair = list(hosts or self.hosts[:1] + self.hosts[-1:])
        if not pair or not all(isinstance(h, IbHca) for h in pair):
            return list(super().iperf(hosts, *args, **kwargs))
        a, b = pair[0].name, pair[-1].name
        output(f"*** iperf: IB hosts have no IP. RDMA bandwidth instead: `{b} ibemu perf write_bw &` "
               f"then `{a} ibemu perf write_bw {b}`\n")
        return []


class _IbTopo(Topo):
    """A Mininet topology of an ibemu generator, its nodes and links bound to the IB classes."""

    def build(self, spec: str, datapath: str = "kernel") -> None:
        fabric = IbFabric(spec, datapath=datapath)
        for sw in fabric.layout["switches"]:
            self.addSwitch(sw["name"], cls=IbSwitch, fabric=fabric)
        for h in fabric.layout["hosts"]:
            self.addHost(h["name"], cls=IbHca, fabric=fabric)
        for ln in fabric.layout["links"]:
            self.addLink(ln["node1"], ln["node2"], port1=ln["port1"], port2=ln["port2"], cls=IbCable,
                         fabric=fabric, intfName1=ln["intf1"], intfName2=ln["intf2"])


def _spec(generator: str, params: dict[str, Any]) -> str:
    return ",".join([generator, *(f"{k}={v}" for k, v in params.items())])


class IbFatTree(_IbTopo):
    """``--topo ibfattree,K``: ibemu's 3-level k-ary fat-tree (edgeP_I, aggP_J, coreC, hN)."""

    def build(self, k: int = 4, datapath: str = "kernel", **params: Any) -> None:  # type: ignore[override]
        super().build(_spec("fat-tree", {"k": k, **params}), datapath)


class IbLeafSpine(_IbTopo):
    """``--topo ibleafspine,LEAVES,SPINES,HOSTS_PER_LEAF``: a two-tier Clos."""

    def build(self, leaves: int = 4, spines: int = 2, hosts_per_leaf: int = 4,  # type: ignore[override]
              datapath: str = "kernel", **params: Any) -> None:
        super().build(_spec("leaf-spine", {"leaves": leaves, "spines": spines,
                                           "hosts_per_leaf": hosts_per_leaf, **params}), datapath)


class IbGenerated(_IbTopo):
    """``--topo ibemu,GENERATOR,key=value,...``: any ibemu generator (``ibemu topo list``)."""

    def build(self, generator: str = "fat-tree", datapath: str = "kernel", **params: Any) -> None:  # type: ignore[override]
        super().build(_spec(generator, params), datapath)


def findController(*_args: Any, **_kwargs: Any) -> type:
    """``mn``'s default controller, when none is named: the subnet manager."""
    return IbSubnetManager


def cleanup() -> None:
    """``mn``'s cleanup (on an error, Ctrl-C or ``mn -c``): tear down this process's fabric only."""
    fabric = IbFabric.current
    if fabric is not None and fabric.run_id is not None:
        fabric.down()
    else:
        output("*** ibemu: no fabric of this mn to clean; `sudo ibemu status` lists runs, "
               "`sudo ibemu clean RUN` removes one\n")


Mininet = IbMininet
topos = {"ibfattree": IbFatTree, "ibleafspine": IbLeafSpine, "ibemu": IbGenerated}
switches = {"ibsw": IbSwitch}
hosts = {"ibhca": IbHca}
controllers = {"ibsm": IbSubnetManager}
