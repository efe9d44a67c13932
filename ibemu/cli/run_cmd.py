"""`ibemu run [SCENARIO]`: build, bring up, drive traffic, break things, measure, report, tear down.

With no scenario it runs the built-in default (a k=4 fat-tree, ftree routing, an aggregation
uplink failing under traffic). ``--topo``, ``--fabric``, ``--datapath``, ``--sm``,
``--sm-engine`` and ``--duration`` override the scenario (``--fabric roce``: the same
topology, traffic and faults on a RoCEv2 fabric). The summary goes to stdout; ``--json
FILE`` writes the result (schema ibemu.run/3), plots go next to it (``--no-plots`` to skip).
``--capture NODE:PORT`` records a cable end to ``OUT/capture-NODE-PORT.pcap``, bounded by
``--capture-snaplen`` (bytes a frame), ``--capture-limit`` (MB a file, then rotated to
``.pcap.1``...) and ``--capture-files`` (files kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from ibemu import clock
from ibemu.cli.completion_cmd import scenario_files
from ibemu.cli.dilation import add_dilation_argument, resolve_dilation
from ibemu.cli.metrics_opt import add_metrics_arguments, metrics_listen
from ibemu.cli.progress import Reporter
from ibemu.errors import ConfigError
from ibemu.kernel.timerfd import run_trio
from ibemu.scenario.schema import Scenario
from ibemu.sm.routing import ENGINES
from ibemu.wire.capture import DEFAULT_FILES, DEFAULT_LIMIT_MB, MAX_FRAME, CaptureBounds

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a scenario end to end (default: the built-in one)",
                       description=__doc__.splitlines()[0])
    scenario_files(p.add_argument("scenario", nargs="?", help="scenario file (default: the built-in default)"))
    p.add_argument("--topo", help="override the topology: fat-tree,k=4 | leaf-spine,leaves=4,... ")
    p.add_argument("--fabric", choices=("ib", "roce"),
                   help="override fabric.kind (roce: IP routers, ECMP, RoCEv2 frames, the fabric manager)")
    p.add_argument("--datapath", choices=("kernel", "user"), help="override fabric.datapath")
    p.add_argument("--sm", choices=("ibemu", "opensm"), help="override sm.impl")
    p.add_argument("--sm-engine", choices=tuple(ENGINES), help="override sm.engine")
    p.add_argument("--duration", type=float, metavar="S", help="override duration_s")
    p.add_argument("--out", type=Path, help="directory for results (default: results/<scenario>)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the result here (ibemu.run/3)")
    p.add_argument("--no-plots", action="store_true", help="do not draw PNG plots")
    p.add_argument("--capture", action="append", default=[], metavar="NODE:PORT",
                   help="record a cable end to out/capture-NODE-PORT.pcap, which tshark decodes (repeatable)")
    p.add_argument("--capture-snaplen", type=int, metavar="N", default=None,
                   help=f"bytes kept of each captured frame (default: whole frames, up to {MAX_FRAME})")
    p.add_argument("--capture-limit", type=float, metavar="MB", default=None,
                   help=f"rotate a capture file once it would pass MB megabytes (default {DEFAULT_LIMIT_MB})")
    p.add_argument("--capture-files", type=int, metavar="N", default=None,
                   help=f"capture files kept per cable end: FILE, FILE.1 .. FILE.N-1, the oldest "
                        f"deleted (default {DEFAULT_FILES})")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--sysfs", action="store_true",
                   help="keep per-node sysfs trees in OUT/run/sysfs while the run lasts, for node_exporter "
                        "(off by default: writing them costs the measurement CPU)")
    add_metrics_arguments(p)
    add_dilation_argument(p)
    p.set_defaults(func=run)


def _scenario(args: argparse.Namespace) -> Scenario:
    from ibemu.scenario import load_scenario
    from ibemu.scenario.loader import load_builtin

    scen = load_scenario(args.scenario) if args.scenario else load_builtin("default")
    changes: dict[str, object] = {}
    if args.topo:
        from ibemu.topo import parse_topo_spec

        topo = parse_topo_spec(args.topo)
        names = set(topo.nodes)
        used = {h for t in scen.traffic for h in t.hosts} | {f.switch for f in scen.faults if f.switch}
        used |= {ep.node for f in scen.faults if f.link for ep in (f.link.a, f.link.b)}
        missing = sorted(n for n in used if n not in names)
        if missing:
            raise ConfigError(f"--topo {args.topo}: the scenario names {', '.join(missing[:5])}, "
                              "which this topology does not have")
        changes["topology"] = topo
        changes["topology_spec"] = dataclasses.replace(scen.topology_spec, source="generator",
                                                       generator=args.topo.split(",")[0], params={})
    if args.datapath or getattr(args, "fabric", None):
        changes["fabric"] = dataclasses.replace(scen.fabric, datapath=args.datapath or scen.fabric.datapath,
                                                kind=getattr(args, "fabric", None) or scen.fabric.kind)
    if args.sm or args.sm_engine:
        changes["sm"] = dataclasses.replace(scen.sm, impl=args.sm or scen.sm.impl,
                                            engine=args.sm_engine or scen.sm.engine)
    if args.duration is not None:
        if not 0 < args.duration <= 86400:
            raise ConfigError(f"--duration {args.duration}: must be in (0, 86400] seconds")
        changes["duration_s"] = args.duration
    scen = dataclasses.replace(scen, **changes) if changes else scen  # type: ignore[arg-type]
    dilation = resolve_dilation(args.dilation, scen.time, scen)  # auto: for the scenario as changed
    if dilation != scen.time.dilation or scen.time.auto:
        where = "--dilation" if args.dilation is not None else scen.time.where
        scen = dataclasses.replace(scen, time=dataclasses.replace(scen.time, dilation=dilation, where=where,
                                                                  auto=False))
    return scen


def capture_bounds(args: argparse.Namespace) -> CaptureBounds:
    """The captures' bounds from ``--capture-snaplen/-limit/-files``; ConfigError (one line) if bad."""
    snaplen = MAX_FRAME if args.capture_snaplen is None else args.capture_snaplen
    if not 1 <= snaplen <= 262144:  # tcpdump's bound; no frame here is longer than MAX_FRAME
        raise ConfigError(f"{args.capture_snaplen}: must be 1 to 262144 bytes (a frame is at most {MAX_FRAME})",
                          where="--capture-snaplen")
    limit_mb = DEFAULT_LIMIT_MB if args.capture_limit is None else args.capture_limit
    if not (0.001 <= limit_mb <= 1_000_000):  # also refuses nan
        raise ConfigError(f"{args.capture_limit:g}: must be 0.001 to 1000000 MB (a file's size)",
                          where="--capture-limit")
    files = DEFAULT_FILES if args.capture_files is None else args.capture_files
    if not 1 <= files <= 1000:
        raise ConfigError(f"{args.capture_files}: must be 1 to 1000 (files kept per cable end)",
                          where="--capture-files")
    return CaptureBounds(snaplen=snaplen, limit_bytes=int(limit_mb * 1_000_000), files=files)


def run(args: argparse.Namespace) -> int:
    from ibemu.report import plots, store
    from ibemu.report.summary import summary as render_summary
    from ibemu.scenario.runner import ScenarioRun, capture_end

    scen = _scenario(args)  # every scenario error is reported before anything is built
    bounds = capture_bounds(args)
    for text in args.capture:  # a cable end that is not there: said before anything is built
        capture_end(scen.topology, text)
    listen = metrics_listen(args, scen.fabric.kind)
    if os.geteuid() != 0:
        raise ConfigError("ibemu run needs root (network namespaces, veth, tc): use sudo")
    out_dir = args.out or Path("results") / scen.name
    json_path = args.json or (scen.record.json if scen.record.json else out_dir / "result.json")
    clock.configure(scen.time.dilation)  # before the runner: every process of the run on it
    with Reporter(quiet=args.quiet, traffic_s=scen.duration_s * scen.time.dilation) as progress:
        runner = ScenarioRun(scen, out_dir, captures=args.capture, capture_bounds=bounds, progress=progress,
                             metrics=listen, sysfs=args.sysfs)
        result = run_trio(runner.run)
    result["files"]["json"] = str(json_path)
    if not args.no_plots and (scen.record.plots or args.scenario is None or args.json is None):
        try:
            result["files"]["plots"] = [str(p) for p in plots.write_plots(result, scen.topology, out_dir)]
        except Exception as exc:  # a plot must never lose the measurement
            log.error("plots: %s", exc)
    store.dump(result, json_path)
    print(render_summary(result))
    return 130 if result["interrupted"] else 0
