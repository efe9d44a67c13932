"""`ibemu perf`: perftest-like tests and collectives on a running fabric (``ibemu up``).

Point to point, as perftest is used — a server, then a client naming it::

    sudo ibemu exec h1  -- ibemu perf write_bw            # server: waits for one client
    sudo ibemu exec h15 -- ibemu perf write_bw h1 -s 65536 -n 5000

Each side runs in its host's namespace on its own HCA port; they exchange QP info over a
UNIX socket in the run's directory. Collectives run every rank in one process, from the root
namespace::

    sudo ibemu perf allreduce --hosts h0,h1,h2,h3 -s 1MiB -n 5
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import trio

from ibemu.errors import ConfigError
from ibemu.kernel.timerfd import run_trio
from ibemu.scenario.yamlnodes import parse_size

# Also in ibemu.traffic (a unit test keeps them equal): importing it here would load the
# transport and scapy for every `ibemu` command.
TESTS = ("write_bw", "read_bw", "send_bw", "write_lat", "send_lat")
COLLECTIVES = ("allreduce", "alltoall")


def _size(text: str) -> int:
    """A size as scenario files write it (``4096``, ``64KiB``, ``1MiB``)."""
    n = parse_size(text)
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64KiB, 1MiB)")
    return n


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("perf", help="perftest-like tests and collectives on a running fabric",
                       description=__doc__.splitlines()[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("test", choices=TESTS + COLLECTIVES)
    p.add_argument("server", nargs="?", help="the server's host name (client side); none: be the server")
    p.add_argument("-s", "--size", type=_size, help="message size (bw 65536, lat 2, collectives 1MiB)")
    p.add_argument("-n", "--iters", type=int, help="iterations (bw 5000, lat 1000, collectives 5)")
    p.add_argument("-D", "--duration", type=float, help="run for this many seconds instead (bw)")
    p.add_argument("-q", "--qps", type=int, default=1, help="queue pairs (bw)")
    p.add_argument("-t", "--tx-depth", type=int, default=128, help="messages in flight per QP (bw)")
    p.add_argument("-m", "--mtu", type=int, default=4096, choices=(256, 512, 1024, 2048, 4096))
    p.add_argument("-b", "--bidirectional", action="store_true", help="both directions at once (bw)")
    p.add_argument("--hosts", help="collectives: comma-separated hosts (default: every host)")
    p.add_argument("--host", help="run as this host (default: the namespace ibemu exec put us in)")
    p.add_argument("--run", help="which running fabric (when several are up)")
    p.add_argument("--out-json", "-J", dest="out_json", type=Path, metavar="FILE",
                   help="also write the result as JSON: perftest's --out_json keys and units (client side), "
                        "nccl-tests' -J keys for collectives")
    p.set_defaults(func=run)


def _check_writable(path: Path) -> None:
    """``--out-json FILE`` can be written (checked before anything runs)."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"--out-json {path}: is a directory")
    if not parent.is_dir():
        raise ConfigError(f"--out-json {path}: no directory {parent}")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise ConfigError(f"--out-json {path}: not writable")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    import json

    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    print(f"# JSON written to {path}", flush=True)


def _whoami(args: argparse.Namespace) -> tuple[Any, str | None]:
    """(run state, this host or None in the root namespace)."""
    from ibemu.fabric.session import Session

    state = Session.attach(args.run or os.environ.get("IBEMU_RUN")).state
    return state, args.host or os.environ.get("IBEMU_NODE")


def _plan(state: Any) -> Any:
    from ibemu.fabric.plan import plan_fabric
    from ibemu.fabric.session import Session

    return plan_fabric(Session(state).topology, state.run_id)


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise ConfigError("ibemu perf needs root (raw sockets on the host's cable): use sudo")
    for name in ("iters", "qps", "tx_depth"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, not {v}")
    if args.out_json is not None:
        _check_writable(args.out_json)
    state, me = _whoami(args)
    plan = _plan(state)
    if args.test in COLLECTIVES:
        return _collective(args, state, plan)
    if me is None:
        raise ConfigError("run it inside a host: sudo ibemu exec HOST -- ibemu perf ... (or --host HOST)")
    if args.server == me:
        raise ConfigError(f"the server is this host ({me}): name another one")
    if args.server is not None and (args.server not in plan.nodes or plan.nodes[args.server].is_switch):
        raise ConfigError(f"no host {args.server!r} in fabric {state.run_id}")
    return run_trio(_point_to_point, args, state, plan, me)


def _open(plan: Any, host: str, *, here: bool) -> Any:
    from ibemu.traffic.endpoints import host_address, open_ports, query_lid

    ns = plan.nodes[host].ns if host in plan.nodes else None
    lid = query_lid(None if here else ns)
    return open_ports([host_address(plan, host, lid)])[host]


def _options(args: argparse.Namespace, server_side: dict[str, Any] | None = None) -> Any:
    from ibemu.traffic.perftest import PerfOptions

    if server_side is not None:
        return PerfOptions(**server_side)
    lat = args.test.endswith("_lat")
    try:
        return PerfOptions(test=args.test, size=args.size or (2 if lat else 65536),
                           iterations=args.iters or (1000 if lat else 5000), duration_s=args.duration,
                           qps=args.qps, tx_depth=args.tx_depth, mtu=args.mtu,
                           bidirectional=args.bidirectional)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


async def _point_to_point(args: argparse.Namespace, state: Any, plan: Any, me: str) -> int:
    import dataclasses

    from ibemu.traffic import oob, perftest

    here = os.environ.get("IBEMU_NODE") == me
    port = await trio.to_thread.run_sync(lambda: _open(plan, me, here=here))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(port.serve)
            if args.server is None:
                print(f"ibemu perf {args.test}: {me} (LID {port.hca.lid}) waiting for a client", flush=True)
                chan = await oob.accept_one(oob.socket_path(Path(state.run_dir), me))
                hello = await chan.recv()
                if hello.get("test") != args.test:
                    raise ConfigError(f"the client runs {hello.get('test')}, this server {args.test}")
                opts = _options(args, hello["options"])
                side = perftest.Side.create(port, opts)
                await chan.send({"info": side.info()})
                side.connect(hello["info"])
                if opts.is_latency:
                    await perftest.lat_ping(side, False)
                else:
                    done = trio.Event()
                    cpu0, rx0 = os.times(), port.rx_frames
                    nursery.start_soon(perftest.bw_server, side, done)
                    if opts.bidirectional:
                        own = await perftest.bw_client(side)
                        print(perftest.report(own))
                    await chan.recv()  # "done"
                    done.set()
                    cpu1 = os.times()
                    print(perftest.cpu_line((cpu1.user - cpu0.user, cpu1.system - cpu0.system),
                                            port.rx_frames - rx0, "receiver"), flush=True)
            else:
                opts = _options(args)
                side = perftest.Side.create(port, opts)
                chan = await oob.connect(oob.socket_path(Path(state.run_dir), args.server))
                await chan.send({"test": args.test, "options": dataclasses.asdict(opts), "info": side.info()})
                reply = await chan.recv()
                side.connect(reply["info"])
                print(f"ibemu perf {args.test}: {me} (LID {port.hca.lid}) -> {args.server} "
                      f"(LID {reply['info']['lid']}), {opts.qps} QP(s), MTU {opts.mtu}", flush=True)
                result: perftest.BwResult | perftest.LatResult
                if opts.is_latency:
                    result = await perftest.lat_ping(side, True)
                else:
                    result = await perftest.bw_client(side)
                    await chan.send({"done": True})
                print(perftest.report(result))
                if args.out_json is not None:
                    _write_json(args.out_json, perftest.json_report(result, opts, link_type=_link_type(state)))
            await chan.aclose()
            nursery.cancel_scope.cancel()
    finally:
        port.close()
    return 0


def _collective(args: argparse.Namespace, state: Any, plan: Any) -> int:
    from ibemu.traffic import collectives
    from ibemu.traffic.endpoints import close_ports, host_address, open_ports, query_lid

    hosts = [h.strip() for h in args.hosts.split(",")] if args.hosts else [
        n for n, p in plan.nodes.items() if not p.is_switch]
    unknown = [h for h in hosts if h not in plan.nodes or plan.nodes[h].is_switch]
    if unknown or len(hosts) < 2:
        raise ConfigError(f"--hosts: {', '.join(unknown) or 'at least 2 hosts'}: not hosts of this fabric")
    ports = open_ports([host_address(plan, h, query_lid(plan.nodes[h].ns)) for h in hosts], mtu=args.mtu)
    size = args.size or (1 << 20)

    async def main() -> collectives.CollectiveResult:
        async with trio.open_nursery() as nursery:
            for p in ports.values():
                await nursery.start(p.serve)
            r = await collectives.run_collective(args.test, [ports[h] for h in hosts], size,
                                                 iterations=args.iters or 5, mtu=args.mtu)
            nursery.cancel_scope.cancel()
        return r

    import sys
    import time

    start = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        r = run_trio(main)
    finally:
        close_ports(ports)
    print(f"# ibemu perf {args.test}: {len(hosts)} ranks ({', '.join(hosts[:4])}{' ...' if len(hosts) > 4 else ''})")
    print(collectives.nccl_header())
    print(collectives.nccl_line(r))
    print(collectives.nccl_footer(r))
    if args.out_json is not None:
        _write_json(args.out_json, collectives.nccl_json(r, args=sys.argv, start_time=start,
                                                         end_time=time.strftime("%Y-%m-%d %H:%M:%S")))
    return 1 if r.wrong else 0


def _link_type(state: Any) -> str:
    """perftest's ``Link_type``: IB, or Ethernet on a RoCE fabric (the daemon's ``fabric.json``)."""
    from ibemu.fabric.session import read_spec

    try:
        kind = read_spec(Path(state.run_dir)).get("fabric", "ib")
    except (OSError, ValueError):
        kind = "ib"
    return "Ethernet" if kind == "roce" else "IB"


