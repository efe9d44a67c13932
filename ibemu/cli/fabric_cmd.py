"""`ibemu up | down | status | exec`: a fabric left running, Mininet-style.

``ibemu up [SCENARIO] [--topo fat-tree,k=4] [--datapath kernel|user]`` builds the fabric in a
background daemon (it owns the namespaces and the agents) and returns once every agent
answers; ``ibemu exec NODE -- CMD`` runs a command in a node's namespace; ``ibemu down``
tears it down. ``--web [ADDR:]PORT`` serves a live page of the fabric from its daemon
(``ibemu.fabric.web``). Each is a call on ``ibemu.fabric.session.Session``; this module turns the
command line (a scenario, ``--topo``, ``--sm``...) into a ``FabricRequest`` and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ibemu.cli.completion_cmd import scenario_files
from ibemu.cli.dilation import add_dilation_argument, resolve_dilation
from ibemu.cli.metrics_opt import add_metrics_arguments, metrics_listen
from ibemu.errors import ConfigError
from ibemu.fabric.metrics import listen_text
from ibemu.fabric.session import FabricRequest, Session, require_root
from ibemu.fabric.umad2sim import dilated_clock
from ibemu.scenario.schema import FabricSpec, Scenario, SMSpec
from ibemu.topo import Topology, parse_topo_spec


def _resolve(args: argparse.Namespace) -> tuple[Topology, str, str, SMSpec | None, FabricSpec, float,
                                              Scenario | None]:
    """(topology, datapath, description, the scenario's SM, its fabric with ``--fabric`` over
    the kind, the dilation, the scenario) from a scenario and/or overrides (a plain IB fabric,
    and no scenario, for ``--topo``)."""
    datapath = args.datapath
    kind = getattr(args, "fabric", None)
    if args.topo:
        return (parse_topo_spec(args.topo), datapath or "kernel", args.topo, None, FabricSpec(kind=kind or "ib"),
                resolve_dilation(getattr(args, "dilation", None)), None)
    if args.scenario:
        from ibemu.scenario import load_scenario
        from ibemu.scenario.loader import RATES_USER_ONLY

        scen, name = load_scenario(args.scenario), str(args.scenario)
        for warning in scen.warnings:
            if not (datapath == "user" and RATES_USER_ONLY in warning):  # --datapath user: not for the kernel
                print(warning, file=sys.stderr)
    else:
        from ibemu.scenario.loader import load_builtin

        scen, name = load_builtin("default"), "built-in default"
    fabric = dataclasses.replace(scen.fabric, kind=kind) if kind else scen.fabric
    return (scen.topology, datapath or scen.fabric.datapath, name, scen.sm, fabric,
            resolve_dilation(getattr(args, "dilation", None), scen.time, scen), scen)


def _sm_choice(args: argparse.Namespace, topo: Topology, spec: SMSpec | None) -> tuple[str, str, str]:
    """(impl, host, engine): the command line, else the scenario's SM, else ibemu's (an IB
    fabric without an SM carries nothing: ``--sm none`` asks for that)."""
    sm = args.sm
    if sm is None and spec is not None:
        sm = spec.impl
    sm = sm or "ibemu"
    host = args.sm_host or (spec.host if spec is not None and spec.host else "") or next(
        (n.name for n in topo.cas()), "")
    engine = args.sm_engine or (spec.engine if spec is not None else "minhop")
    if host not in topo.nodes or not topo.node(host).is_ca:
        raise ConfigError(f"--sm-host {host}: not a host of this fabric")
    if sm == "opensm":
        from ibemu.fabric.opensm import opensm_available
        from ibemu.fabric.umad2sim import umad2sim_path

        if not opensm_available() or umad2sim_path() is None:
            raise ConfigError("--sm opensm needs Debian's opensm and ibsim-utils (scripts/setup.sh installs them)")
    return sm, host, engine


def _roce_settings(spec: FabricSpec) -> dict[str, float]:
    """A RoCE fabric's cable loss, delay and ECN settings, checked against this kernel."""
    if spec.delay_us:
        from ibemu.kernel.impair import Impairment, check_supported

        check_supported(Impairment(spec.loss_pct, spec.delay_us), spec.where or "fabric.delay_us")
    return {"loss_pct": spec.loss_pct, "delay_us": spec.delay_us, "ecn_mark_kb": spec.ecn_mark_kb,
            "ecn_line_gbps": spec.ecn_line_gbps}


def request_from_args(args: argparse.Namespace) -> FabricRequest:
    """What ``ibemu up`` (and ``ibemu cli``) asks for: every check made before anything is built."""
    topo, datapath, name, sm_spec, fabric, dilation, scen = _resolve(args)
    topo.check()
    kind = fabric.kind
    if kind == "roce":  # its fabric manager routes it; its routers forward in the kernel
        if args.sm not in (None, "none") or args.sm_host or args.sm_engine:
            raise ConfigError("--sm/--sm-host/--sm-engine: a RoCE fabric has no subnet manager "
                              "(its fabric manager computes and installs the routes)")
        if args.datapath == "user":
            raise ConfigError("--datapath user: a RoCE fabric's routers forward in the kernel")
        if fabric.datapath == "user":  # not half-wired: the daemon has no user datapath for RoCE yet
            raise ConfigError("ibemu up runs a RoCE fabric on the kernel datapath only; its user datapath "
                              "(queues, PFC, delay) runs under ibemu run", fabric.where or "fabric.datapath")
        return FabricRequest(topo, name, kind="roce", datapath="kernel", sm="none", sm_host="", sm_engine="",
                             roce=_roce_settings(fabric), dilation=dilation)
    sm, sm_host, engine = _sm_choice(args, topo, sm_spec)
    qos = fabric.qos.sm_json() if fabric.qos is not None and sm in ("ibemu", "opensm") else ""
    election = sm_spec.election() if sm_spec is not None and sm != "none" else {}
    if (election.get("standby") or {}).get("host") == sm_host:  # --sm-host moved the master onto it
        raise ConfigError(f"--sm-host {sm_host}: the scenario's standby SM runs there (sm.standby.host)")
    # The rest of what the scenario asks of its SM and switches, as `ibemu run` builds it
    # (scenario.runner.fabric_request): its M_Key, partitions, local failover, switch model.
    from ibemu.scenario.runner import fabric_request

    from_scen = fabric_request(scen) if scen is not None else None
    extra: dict[str, Any] = {}
    if from_scen is not None:
        extra = {"switch": from_scen.switch, "sm_local_failover": from_scen.sm_local_failover}
        if sm != "none":
            extra |= {"sm_keys": from_scen.sm_keys, "sm_partitions": from_scen.sm_partitions}
    return FabricRequest(topo, name, kind=kind, datapath=datapath, sm=sm, sm_host=sm_host, sm_engine=engine,
                         dilation=dilation, sm_qos=qos, sm_election=election, **extra)


def web_address(args: argparse.Namespace) -> tuple[str, int] | None:
    """``--web [ADDR:]PORT`` checked (a non-loopback address only with ``--web-remote``)."""
    if getattr(args, "web", None) is None:
        if getattr(args, "web_remote", False):
            raise ConfigError("--web-remote: only with --web [ADDR:]PORT")
        return None
    from ibemu.fabric.web import parse_address

    return parse_address(args.web, args.web_remote)


def cmd_up(args: argparse.Namespace) -> int:
    require_root("up")
    web = web_address(args)
    req = request_from_args(args)
    listen = metrics_listen(args, req.kind)
    if listen is not None:
        req = dataclasses.replace(req, metrics=listen_text(*listen))
    if web is not None and req.kind != "ib":
        raise ConfigError("--web: the live page shows IB fabrics (a RoCE fabric's routers have no PMA)")
    session = up_with_progress(req, web)
    say_up(session, req)
    return 0


def up_with_progress(req: FabricRequest, web: tuple[str, int] | None = None) -> Session:
    """``Session.up(req)``, its build shown as it goes (a spinner on a terminal, a line otherwise:
    a k=16 fabric takes seconds)."""
    from ibemu.cli.progress import Reporter

    counts = req.topology.counts()
    sm = f", {req.sm} SM to SUBNET UP" if req.sm != "none" else ""
    with Reporter(timed=("build",)) as progress:
        progress("build", f"{req.name}: {counts.switches} switches, {counts.cas} hosts, {counts.links} links "
                          f"({req.kind}, {req.datapath} datapath{sm})")
        session = Session.up(req, web=web)
        progress("up", f"fabric {session.run_id}")
    return session


def say_up(session: Session, req: FabricRequest) -> None:
    """What ``ibemu up`` (and ``ibemu cli``) print once the fabric is up."""
    topo, name, took = req.topology, req.name, session.up_s or 0.0
    counts = topo.counts()
    if req.kind == "roce":
        print(f"RoCE fabric {session.run_id} up in {took:.2f} s: {counts.switches} IP routers "
              f"(ECMP), {counts.cas} hosts, {counts.links} links, routes installed by the fabric manager, "
              f"from {name}")
        print(f"  ibemu exec NODE -- CMD    e.g. ibemu exec {topo.cas()[0].name} -- ip -br addr")
        print("  ibemu status | ibemu down")
        return
    sm_note = f", {req.sm} on {req.sm_host}: SUBNET UP" if req.sm != "none" else ", no SM (ports stay in Init)"
    print(f"fabric {session.run_id} up in {took:.2f} s: {counts.switches} switches, "
          f"{counts.cas} hosts, {counts.links} links ({req.datapath} datapath){sm_note} from {name}")
    print(f"  ibemu exec NODE -- CMD    e.g. ibemu exec {topo.cas()[0].name} -- ip -br link")
    print(f"  sysfs of each node: {session.run_dir / 'sysfs'}/NODE/class/infiniband")
    if req.metrics:
        print(f"  Prometheus metrics: http://{req.metrics}/metrics")
    if session.web_url:
        print(f"  live page: {session.web_url}")
    print("  ibemu status | ibemu down")


def cmd_down(args: argparse.Namespace) -> int:
    require_root("down")
    session = Session.attach(args.run)
    problems = session.down()
    if problems:
        print(f"fabric {session.run_id}: {'; '.join(problems)} (try `ibemu clean`)", file=sys.stderr)
        return 1
    print(f"fabric {session.run_id} down")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    rows = Session.status()
    if args.json:
        print(json.dumps(rows, indent=1))
    elif not rows:
        print("no ibemu runs")
    else:
        for row in rows:
            print(f"{row['run']}  {row['status']:<9} {row['namespaces']:>5} namespaces  "
                  f"processes: {', '.join(row['processes']) or 'none'}  {row['scenario']}")
    return 0


def _node_command(args: argparse.Namespace, what: str, usage: str) -> tuple[Session, list[str]]:
    """(the fabric, the command after ``--``) for exec and diag; the node is checked."""
    require_root(what)
    session = Session.attach(args.run)
    session.namespace(args.node)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError(f"{usage}: no command given")
    return session, command


def cmd_exec(args: argparse.Namespace) -> int:
    session, command = _node_command(args, "exec", "ibemu exec NODE -- CMD")
    argv, env = session.command(args.node, command)
    os.execvpe(argv[0], argv, env)
    return 127  # not reached


def cmd_diag(args: argparse.Namespace) -> int:
    """Run an infiniband-diags tool (or OpenSM) on a host, through its MAD socket."""
    session, command = _node_command(args, "diag", "ibemu diag HOST TOOL [ARGS...] (e.g. ibnetdiscover)")
    shared = dilated_clock(session.state)  # a dilated fabric's clock (the session took it from the fabric)
    argv, cwd = session.diag_command(args.node, command, faketime=shared)
    os.chdir(cwd)
    if shared is None:
        os.execvp(argv[0], argv)
        return 127  # not reached
    try:  # the tool reads libfaketime's shared start when it starts; remove it after
        return subprocess.run(argv, check=False).returncode
    finally:
        shared.remove()


def add_fabric_arguments(p: argparse.ArgumentParser) -> None:
    """What ``cmd_up`` reads: a scenario or a topology shorthand, datapath and SM choices."""
    scenario_files(p.add_argument("scenario", nargs="?", type=Path, help="scenario file (default: the built-in one)"))
    p.add_argument("--topo", help="topology shorthand instead of a scenario, e.g. fat-tree,k=4")
    p.add_argument("--datapath", choices=("kernel", "user"), help="switch forwarding plane")
    p.add_argument("--sm", choices=("ibemu", "opensm", "none"),
                   help="subnet manager to start on the SM host (default: the scenario's, else ibemu's; "
                        "none: ports stay in Init until an SM attaches)")
    p.add_argument("--sm-host", help="host that runs the SM (default: the scenario's, else the first host)")
    p.add_argument("--sm-engine", help="routing engine, e.g. minhop, updn, ftree (default: the scenario's, else minhop)")
    add_dilation_argument(p)


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="build a fabric and leave it running")
    add_fabric_arguments(up)
    up.add_argument("--fabric", choices=("ib", "roce"),
                    help="override fabric.kind (roce: IP routers, ECMP, RoCEv2, the fabric manager)")
    add_metrics_arguments(up)
    up.add_argument("--web", metavar="[ADDR:]PORT",
                    help="serve a live page of the fabric there (read-only; address 127.0.0.1 by default)")
    up.add_argument("--web-remote", action="store_true",
                    help="allow --web on an address that is not loopback (the page has no authentication)")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="tear a running fabric down")
    down.add_argument("--run", help="run id (when several fabrics run)")
    down.set_defaults(func=cmd_down)
    status = sub.add_parser("status", help="list ibemu runs and what they own")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)
    ex = sub.add_parser("exec", help="run a command inside a node's namespace")
    ex.add_argument("--run", help="run id (when several fabrics run)")
    ex.add_argument("node")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    ex.set_defaults(func=cmd_exec)
    dg = sub.add_parser("diag", help="run an infiniband-diags tool on a host (ibnetdiscover, smpquery, ...)")
    dg.add_argument("--run", help="run id (when several fabrics run)")
    dg.add_argument("node", help="the host whose HCA port the tool uses")
    dg.add_argument("command", nargs=argparse.REMAINDER, help="tool and its arguments")
    dg.set_defaults(func=cmd_diag)
