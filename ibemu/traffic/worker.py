"""The traffic worker: the process that runs a scenario's flows on the hosts' cables.

``python -m ibemu.traffic.worker SPEC OUT`` reads ``SPEC`` (JSON: ``t0_ns`` or ``ready`` and ``go``
paths (see ``time_zero``), ``hosts``
{name: {ns, ifname, peer_mac, lid[, ip]}}, ``flows`` [flow dicts, see ``flows.run_flow``], ``mtu``,
``qpns`` [first, end], ``timestamps`` and, on a RoCE fabric, ``roce`` {lid_ips}), opens one HCA port per host (sockets entered into
each host's namespace), runs every flow and writes ``OUT`` (JSON: ``flows`` [FlowOutput],
``ports`` {name: counters}).

With ``live`` in the spec (``ibemu run --metrics``), it also rewrites ``OUT`` with suffix
``.live.json`` every ``LIVE_PERIOD_S``: the frames its ports received since time zero and the
longest silence between them so far (``blackout.LiveGaps``), which the metrics endpoint
serves while the run goes on.

The runner starts one worker per flow, apart from the agent host: a busy bulk flow then
cannot delay a probe stream's sends, and management keeps its own core. Workers sharing a
host take disjoint QP number ranges (``qpns``), so the kernel gives each only its frames.
SIGTERM or SIGINT stops the flows early; what was measured is still written.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from ibemu import clock, lagmon
from ibemu.hca.nic import HcaPort
from ibemu.kernel.timerfd import run_trio
from ibemu.traffic.blackout import LiveGaps
from ibemu.traffic.endpoints import HostAddress, close_ports, open_ports
from ibemu.traffic.flows import FlowOutput, run_flow

log = logging.getLogger("ibemu.traffic.worker")


def addresses(spec: dict[str, Any]) -> list[HostAddress]:
    return [HostAddress.from_json(name, h) for name, h in spec["hosts"].items()]


def port_counters(port: HcaPort) -> dict[str, int]:
    st = port.hca.stats
    counters = {"tx_packets": port.tx_packets, "tx_dropped": port.tx_dropped, "rx_frames": port.rx_frames,
                "rx_packets": st.rx_packets, "malformed": st.malformed, "crc_errors": st.crc_errors,
                "rx_runts": port.rx_runts, "dlid_mismatch": st.dlid_mismatch, "unknown_qp": st.unknown_qp,
                "pkey_violations": st.pkey_violations}
    roce = getattr(port, "roce_stats", None)  # a RocePort: what its RoCEv2 layer refused
    if roce is not None:
        counters.update({f"roce_{k}": int(v) for k, v in dataclasses.asdict(roce).items()})
    return counters


GRACE_S = 3.0
"""After a stop signal, how long flows get to finish what is in flight."""
LIVE_PERIOD_S = 0.25
"""How often (real seconds) the live watch is written, with ``live`` in the spec."""


async def _write_live(path: Path, names: list[str], gaps: LiveGaps) -> None:
    """``path`` rewritten every ``LIVE_PERIOD_S`` (write, then rename: readers see whole files)."""
    tmp = path.with_suffix(".tmp")
    while True:
        tmp.write_text(json.dumps({"flows": names, **gaps.as_dict(clock.now_ns())}))
        tmp.replace(path)
        await trio.sleep(clock.emulated_s(LIVE_PERIOD_S))


async def run(spec: dict[str, Any], ports: dict[str, HcaPort], live: Path | None = None) -> list[FlowOutput]:
    """Every flow of ``spec`` on ``ports``; SIGTERM/SIGINT end them early, measured.
    ``live``: where to keep the live watch of its frames (module docstring)."""
    outputs: list[FlowOutput] = []
    abort = trio.Event()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            for p in ports.values():
                await nursery.start(p.serve)
            waiting, flows_scope = trio.CancelScope(), trio.CancelScope()

            async def _on_signal() -> None:
                async for _ in signals:
                    log.info("signal: stopping the flows")
                    abort.set()
                    waiting.cancel()
                    flows_scope.deadline = trio.current_time() + GRACE_S
                    return

            nursery.start_soon(_on_signal)
            flow_names = ",".join(str(f["name"]) for f in spec["flows"])
            # its lag behind the clock, while its flows run (not while they compute their output)
            watching = trio.CancelScope()
            drained = [trio.Event() for _ in spec["flows"]]

            async def _watch() -> None:
                with watching:
                    await lagmon.watch_from_env(f"traffic {flow_names}")

            async def _until_drained() -> None:
                for ev in drained:
                    await ev.wait()
                watching.cancel()

            nursery.start_soon(_watch)
            nursery.start_soon(_until_drained)
            t0 = None
            # What start-up allocated (imports, ports, sockets) leaves the collector's reach: a
            # full collection of it stalled a flow's first second by 10-20 ms.
            gc.collect()
            gc.freeze()
            with waiting:
                t0 = await time_zero(spec)
            if t0 is not None and live is not None:
                gaps = LiveGaps(since_ns=t0)
                for p in ports.values():
                    p.on_frame.append(gaps)
                nursery.start_soon(_write_live, live, [str(f["name"]) for f in spec["flows"]], gaps)
            if t0 is not None:
                with flows_scope:
                    async with trio.open_nursery() as flows:
                        for f, ev in zip(spec["flows"], drained, strict=True):
                            flows.start_soon(_collect, f, ports, t0, abort, outputs, ev)
            nursery.cancel_scope.cancel()
    names = {o.name for o in outputs}
    for f in spec["flows"]:  # flows that did not finish in the grace time: said so
        if f["name"] not in names:
            outputs.append(FlowOutput(f["name"], f["kind"], f.get("src") or "", f.get("dst") or "",
                                      error="interrupted"))
    return outputs


async def time_zero(spec: dict[str, Any]) -> int:
    """The flows' time zero (monotonic ns): ``t0_ns`` in the spec, or, with ``ready`` and
    ``go`` paths, tell the runner the ports are open and wait for the time it writes to ``go``."""
    if "t0_ns" in spec:
        return int(spec["t0_ns"])
    Path(spec["ready"]).touch()
    go = Path(spec["go"])
    while True:
        try:
            return int(json.loads(go.read_text())["t0_ns"])
        except FileNotFoundError:
            await trio.sleep(clock.emulated_s(0.005))  # a real-time poll at any dilation


async def _collect(flow: dict[str, Any], ports: dict[str, HcaPort], t0: int, abort: trio.Event,
                   outputs: list[FlowOutput], drained: trio.Event) -> None:
    outputs.append(await run_flow(flow, ports, t0, abort, drained))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ibemu.traffic.worker")
    ap.add_argument("spec", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Outside trio's own signal handling a late SIGINT/SIGTERM must not kill the process
    # before it has written what it measured.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    spec = json.loads(args.spec.read_text())
    qpns = spec.get("qpns")
    roce = spec.get("roce")  # a RoCE fabric: {"lid_ips": {lid: address}}
    ports = open_ports(addresses(spec), mtu=int(spec.get("mtu", 4096)),
                       qpns=(int(qpns[0]), int(qpns[1])) if qpns else None,
                       timestamps=bool(spec.get("timestamps", False)),
                       lid_ips={int(k): str(v) for k, v in roce["lid_ips"].items()} if roce else None)
    if roce and roce.get("dcqcn"):  # ECN in the fabric: CNPs and DCQCN on every port
        from ibemu.hca.dcqcn import DcqcnParams

        for p in ports.values():
            p.enable_dcqcn(DcqcnParams(line_gbps=float(roce["dcqcn"]["line_gbps"])))  # type: ignore[attr-defined]
    if roce and roce.get("pfc"):  # PFC on a user-datapath fabric: honour the first hop's pauses
        for p in ports.values():
            p.enable_pfc(float(roce["pfc"]["line_gbps"]), int(roce["pfc"].get("priority", 3)))  # type: ignore[attr-defined]
    t_start = clock.now_ns()
    try:
        live = args.out.with_suffix(".live.json") if spec.get("live") else None
        outputs = run_trio(run, spec, ports, live)
        code = 0
    except Exception:
        log.exception("traffic worker failed")
        outputs, code = [], 1
    finally:
        counters = {name: port_counters(p) for name, p in ports.items()}
        close_ports(ports)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"started_ns": t_start, "flows": [o.as_dict() for o in outputs],
                               "ports": counters}))
    tmp.replace(args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
