"""The fabric daemon: the process that owns a fabric left running by ``ibemu up``.

``python -m ibemu.fabric.daemon RUN_DIR`` reads ``RUN_DIR/fabric.json`` (the run id, the
fabric kind, the datapath and the topology in ibnetdiscover form), builds the fabric, runs its
agents (a RoCE fabric: its routers' addresses and the fabric manager) and marks the run state
``up``; ``RUN_DIR/control.sock`` then takes faults on demand
(:mod:`ibemu.fabric.control`, used by ``ibemu cli``). With ``--web-fd FD`` (``ibemu up --web``:
a socket already listening, inherited) it serves the live page (:mod:`ibemu.fabric.web`) while
the fabric is up. SIGTERM or SIGINT tears everything
down and exits 0. If it dies any other way, ``ibemu clean`` removes what it left (the state
file lists it all).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import trio

from ibemu.fabric import control, web
from ibemu.fabric.agents import make_agent
from ibemu.fabric.control import serve_control
from ibemu.fabric.faults import FaultInjector
from ibemu.fabric.roce_runtime import RoceFaultInjector, RoceRuntime
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.session import adopt_clock, open_runtime, read_spec, request_from_spec
from ibemu.kernel import ownership
from ibemu.kernel.timerfd import run_trio

log = logging.getLogger("ibemu.fabric.daemon")

async def _serve(rt: FabricRuntime, web_sock: socket.socket | None = None) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with rt.running() as host, trio.open_nursery() as nursery:
            log.info("fabric %s up: %s", rt.state.run_id, rt.timings_s)
            run_dir = rt.run_dir or rt.state.run_dir
            # Faults on demand (``ibemu cli``), stamped by the same injector as scheduled ones.
            injector = FaultInjector(host, lambda name: make_agent(rt.plan, rt.topo.node(name)),
                                     sm_power=rt.sm_power)
            await nursery.start(serve_control, control.socket_path(run_dir), injector)
            server = None
            if web_sock is not None:  # the live page (``ibemu up --web``): read-only
                feed = web.LiveFeed()
                server = web.LiveServer(web_sock, feed, web.page(rt.topo, f"{rt.state.scenario or 'fabric'} "
                                                                           f"({rt.state.run_id})"))
                nursery.start_soon(web.watch, host, run_dir, feed)
                server.start()
            try:
                async for sig in signals:
                    log.info("signal %s: tearing down", signal.Signals(sig).name)
                    break
            finally:
                if server is not None:
                    server.stop()
            nursery.cancel_scope.cancel()


async def _serve_roce(rt: RoceRuntime) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with rt.running() as run, trio.open_nursery() as nursery:
            log.info("RoCE fabric %s up: %s", rt.state.run_id, rt.timings_s)
            # The faults that apply to RoCE (faults.FAULT_ACTIONS); the channel refuses the others.
            injector = RoceFaultInjector(run, rt.run_dir / "events.jsonl")
            await nursery.start(serve_control, control.socket_path(rt.run_dir), injector)
            async for sig in signals:
                log.info("signal %s: tearing down", signal.Signals(sig).name)
                break
            nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ibemu.fabric.daemon")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--web-fd", type=int, help="a listening socket (inherited) to serve the live page on")
    args = ap.parse_args(argv)
    logging.basicConfig(filename=args.run_dir / "daemon.log", level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = read_spec(args.run_dir)
    adopt_clock(args.run_dir)  # the clock `up` recorded (its environment carries it too)
    state = ownership.RunState.load(ownership.RunState(spec["run_id"]).path)
    state.claim_process(os.getpid(), "fabric-daemon")
    try:
        rt = open_runtime(request_from_spec(spec), state, args.run_dir)
        if isinstance(rt, RoceRuntime):
            run_trio(_serve_roce, rt)
        else:
            web_sock = socket.socket(fileno=args.web_fd) if args.web_fd is not None else None
            run_trio(_serve, rt, web_sock)
    except Exception:
        log.exception("fabric daemon failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
