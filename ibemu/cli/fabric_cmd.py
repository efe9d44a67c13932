"""`ibemu up | down | status | exec`: a fabric left running, Mininet-style.

``ibemu up [SCENARIO] [--topo fat-tree,k=4] [--datapath kernel|user]`` builds the fabric in a
background daemon (it owns the namespaces and the agents) and returns once every agent
answers; ``ibemu exec NODE -- CMD`` runs a command in a node's namespace; ``ibemu down``
tears it down.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ibemu.errors import ConfigError, IbemuError
from ibemu.fabric.daemon import write_spec
from ibemu.fabric.umad2sim import scratch_dir, tool_argv
from ibemu.kernel import netns, ownership
from ibemu.scenario.schema import FabricSpec, SMSpec
from ibemu.topo import Topology, dumps_ibnetdiscover, generate

UP_TIMEOUT_S = 120.0


def parse_topo_spec(text: str) -> Topology:
    """``fat-tree,k=4`` / ``leaf-spine,leaves=4,spines=2`` -> a generated topology."""
    name, *pairs = [p.strip() for p in text.split(",") if p.strip()]
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--topo {text}: expected NAME,key=value,..., got {pair!r}")
        params[key.strip().replace("-", "_")] = value.strip()
    return generate(name, params)


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ConfigError(f"ibemu {what} needs root (network namespaces, veth, tc): use sudo")


def _resolve(args: argparse.Namespace) -> tuple[Topology, str, str, SMSpec | None, FabricSpec]:
    """(topology, datapath, description, the scenario's SM, its fabric with ``--fabric`` over
    the kind) from a scenario and/or overrides (a plain IB fabric for ``--topo``)."""
    datapath = args.datapath
    kind = getattr(args, "fabric", None)
    if args.topo:
        return parse_topo_spec(args.topo), datapath or "kernel", args.topo, None, FabricSpec(kind=kind or "ib")
    if args.scenario:
        from ibemu.scenario import load_scenario

        scen, name = load_scenario(args.scenario), str(args.scenario)
    else:
        from ibemu.scenario.loader import load_builtin

        scen, name = load_builtin("default"), "built-in default"
    fabric = dataclasses.replace(scen.fabric, kind=kind) if kind else scen.fabric
    return scen.topology, datapath or scen.fabric.datapath, name, scen.sm, fabric


def _sm_choice(args: argparse.Namespace, topo: Topology, spec: SMSpec | None) -> tuple[str, str, str]:
    """(impl, host, engine): the command line, else the scenario's SM, else none."""
    sm = args.sm
    if sm is None and spec is not None:
        sm = spec.impl
    sm = sm or "none"
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


def _live_runs() -> list[ownership.RunState]:
    return [r for r in ownership.list_runs() if r.status in ("building", "built", "up")]


def _pick_run(run_id: str | None) -> ownership.RunState:
    runs = _live_runs()
    if run_id:
        for r in runs:
            if r.run_id == run_id:
                return r
        raise ConfigError(f"no running fabric {run_id} (running: {', '.join(r.run_id for r in runs) or 'none'})")
    if not runs:
        raise ConfigError("no fabric is running: start one with `sudo ibemu up`")
    if len(runs) > 1:
        raise ConfigError(f"{len(runs)} fabrics are running ({', '.join(r.run_id for r in runs)}): pass --run")
    return runs[0]


def _roce_settings(spec: FabricSpec) -> dict[str, float]:
    """A RoCE fabric's cable loss, delay and ECN settings, checked against this kernel."""
    if spec.delay_us:
        from ibemu.kernel.impair import Impairment, check_supported

        check_supported(Impairment(spec.loss_pct, spec.delay_us), spec.where or "fabric.delay_us")
    return {"loss_pct": spec.loss_pct, "delay_us": spec.delay_us, "ecn_mark_kb": spec.ecn_mark_kb,
            "ecn_line_gbps": spec.ecn_line_gbps}


def cmd_up(args: argparse.Namespace) -> int:
    _require_root("up")
    topo, datapath, name, sm_spec, fabric = _resolve(args)
    topo.check()
    kind = fabric.kind
    roce: dict[str, float] = {}
    if kind == "roce":  # its fabric manager routes it; its routers forward in the kernel
        if args.sm not in (None, "none") or args.sm_host or args.sm_engine:
            raise ConfigError("--sm/--sm-host/--sm-engine: a RoCE fabric has no subnet manager "
                              "(its fabric manager computes and installs the routes)")
        if args.datapath == "user":
            raise ConfigError("--datapath user: a RoCE fabric's routers forward in the kernel")
        if fabric.datapath == "user":  # not half-wired: the daemon has no user datapath for RoCE yet
            raise ConfigError("ibemu up runs a RoCE fabric on the kernel datapath only; its user datapath "
                              "(queues, PFC, delay) runs under ibemu run", fabric.where or "fabric.datapath")
        sm, sm_host, engine, datapath = "none", "", "", "kernel"
        roce = _roce_settings(fabric)
    else:
        sm, sm_host, engine = _sm_choice(args, topo, sm_spec)  # every check before anything is recorded
    state = ownership.RunState(ownership.new_run_id(), scenario=name)
    run_dir = state.run_dir
    state.save()
    write_spec(run_dir, run_id=state.run_id, datapath=datapath, topology_text=dumps_ibnetdiscover(topo),
               scenario=name, sm=sm, sm_host=sm_host, sm_engine=engine, fabric=kind, roce=roce)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ibemu.fabric.daemon", str(run_dir)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(run_dir / "daemon.err", "w"), start_new_session=True)  # noqa: SIM115
    while True:
        time.sleep(0.05)
        current = ownership.RunState.load(state.path) if state.path.exists() else state
        if current.status == "up":
            break
        if proc.poll() is not None or time.monotonic() - t0 > UP_TIMEOUT_S:
            reason = "exited" if proc.poll() is not None else f"not up after {UP_TIMEOUT_S:.0f} s"
            log_tail = _tail(run_dir / "daemon.log") + _tail(run_dir / "daemon.err")
            ownership.teardown(current)
            raise IbemuError(f"fabric daemon {reason}; nothing is left running.\n{log_tail}")
    counts = topo.counts()
    if kind == "roce":
        print(f"RoCE fabric {state.run_id} up in {time.monotonic() - t0:.2f} s: {counts.switches} IP routers "
              f"(ECMP), {counts.cas} hosts, {counts.links} links, routes installed by the fabric manager, "
              f"from {name}")
        print(f"  ibemu exec NODE -- CMD    e.g. ibemu exec {topo.cas()[0].name} -- ip -br addr")
        print("  ibemu status | ibemu down")
        return 0
    sm_note = f", {sm} on {sm_host}: SUBNET UP" if sm != "none" else ", no SM (ports stay in Init)"
    print(f"fabric {state.run_id} up in {time.monotonic() - t0:.2f} s: {counts.switches} switches, "
          f"{counts.cas} hosts, {counts.links} links ({datapath} datapath){sm_note} from {name}")
    print(f"  ibemu exec NODE -- CMD    e.g. ibemu exec {topo.cas()[0].name} -- ip -br link")
    print("  ibemu status | ibemu down")
    return 0


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:]) + "\n"
    except FileNotFoundError:
        return ""


def cmd_down(args: argparse.Namespace) -> int:
    _require_root("down")
    state = _pick_run(args.run)
    problems = ownership.teardown(state)
    if problems:
        print(f"fabric {state.run_id}: {'; '.join(problems)} (try `ibemu clean`)", file=sys.stderr)
        return 1
    print(f"fabric {state.run_id} down")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for r in ownership.list_runs():
        present = sum(netns.exists(n) for n in r.namespaces)
        alive = [p.role for p in r.processes if p.alive()]
        rows.append({"run": r.run_id, "status": r.status, "scenario": r.scenario,
                     "namespaces": present, "recorded_namespaces": len(r.namespaces),
                     "processes": alive, "age_s": round(time.time() - r.created, 1)})
    if args.json:
        print(json.dumps(rows, indent=1))
    elif not rows:
        print("no ibemu runs")
    else:
        for row in rows:
            print(f"{row['run']}  {row['status']:<9} {row['namespaces']:>5} namespaces  "
                  f"processes: {', '.join(row['processes']) or 'none'}  {row['scenario']}")
    return 0


def _node_command(args: argparse.Namespace, what: str, usage: str) -> tuple[ownership.RunState, str, list[str]]:
    """(run, namespace of ``args.node``, the command after ``--``) for exec and diag."""
    _require_root(what)
    state = _pick_run(args.run)
    ns = ownership.ns_name(state.run_id, args.node)
    if ns not in state.namespaces:
        raise ConfigError(f"no node {args.node!r} in fabric {state.run_id}")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError(f"{usage}: no command given")
    return state, ns, command


def cmd_exec(args: argparse.Namespace) -> int:
    state, ns, command = _node_command(args, "exec", "ibemu exec NODE -- CMD")
    # Tell ibemu commands inside which run and node they are (``ibemu perf`` uses it).
    os.environ["IBEMU_RUN"], os.environ["IBEMU_NODE"] = state.run_id, args.node
    os.execvp("ip", ["ip", "netns", "exec", ns, *command])
    return 127  # not reached


def cmd_diag(args: argparse.Namespace) -> int:
    """Run an infiniband-diags tool (or OpenSM) on a host, through its MAD socket."""
    state, ns, command = _node_command(args, "diag", "ibemu diag HOST TOOL [ARGS...] (e.g. ibnetdiscover)")
    argv = tool_argv(ns, command)
    os.chdir(scratch_dir(state.run_dir, args.node))
    os.execvp(argv[0], argv)
    return 127  # not reached


def add_fabric_arguments(p: argparse.ArgumentParser) -> None:
    """What ``cmd_up`` reads: a scenario or a topology shorthand, datapath and SM choices."""
    p.add_argument("scenario", nargs="?", type=Path, help="scenario file (default: the built-in one)")
    p.add_argument("--topo", help="topology shorthand instead of a scenario, e.g. fat-tree,k=4")
    p.add_argument("--datapath", choices=("kernel", "user"), help="switch forwarding plane")
    p.add_argument("--sm", choices=("ibemu", "opensm", "none"),
                   help="subnet manager to start on the SM host (default: the scenario's; none for --topo)")
    p.add_argument("--sm-host", help="host that runs the SM (default: the scenario's, else the first host)")
    p.add_argument("--sm-engine", help="routing engine, e.g. minhop, updn, ftree (default: the scenario's, else minhop)")


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="build a fabric and leave it running")
    add_fabric_arguments(up)
    up.add_argument("--fabric", choices=("ib", "roce"),
                    help="override fabric.kind (roce: IP routers, ECMP, RoCEv2, the fabric manager)")
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
