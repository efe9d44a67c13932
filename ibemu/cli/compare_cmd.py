"""`ibemu compare SCENARIO`: the same scenario as InfiniBand and as RoCEv2, side by side.

Runs the scenario twice on the same topology, traffic and faults: as ``ib`` (ibemu's SM, or
the scenario's ``sm``) and as ``roce`` (IP routers, ECMP, the fabric manager, and the
scenario's cable impairments ``fabric.loss_pct`` / ``fabric.delay_us``, which apply to the
RoCE run only: IB is lossless). Prints one table: bring-up, each fault's reroute phases,
each flow's blackout and throughput, collectives' time, bus bandwidth and #wrong. Writes
``OUT/ib.json`` and ``OUT/roce.json`` (ibemu.run/2) and ``--json FILE`` (default
``OUT/compare.json``: both runs and the comparison, ibemu.compare/1). Both variants are
checked before anything is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from ibemu import clock
from ibemu.cli.dilation import add_dilation_argument, resolve_dilation
from ibemu.errors import ConfigError
from ibemu.scenario.schema import Scenario


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run a scenario as InfiniBand and as RoCEv2, side by side",
                       description=__doc__.splitlines()[0])
    p.add_argument("scenario", help="scenario file")
    p.add_argument("--duration", type=float, metavar="S", help="override duration_s (both runs)")
    p.add_argument("--out", type=Path, help="directory for results (default: results/compare-<scenario>)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write both runs and the comparison here (default: OUT/compare.json)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_dilation_argument(p)
    p.set_defaults(func=run)


def variants(scen: Scenario, duration: float | None = None) -> dict[str, Scenario]:
    """The scenario as ``ib`` and as ``roce``, each checked runnable (ConfigError otherwise)."""
    from ibemu.scenario.runner import check_runnable

    if duration is not None:
        if not 0 < duration <= 86400:
            raise ConfigError(f"--duration {duration}: must be in (0, 86400] seconds")
        scen = dataclasses.replace(scen, duration_s=duration)
    f = scen.fabric
    out = {
        "ib": dataclasses.replace(scen, fabric=dataclasses.replace(
            f, kind="ib", datapath=f.datapath if f.kind == "ib" else "kernel", loss_pct=0.0, delay_us=0.0,
            ecn_mark_kb=0.0, ecn_line_gbps=0.0)),
        "roce": dataclasses.replace(scen, fabric=dataclasses.replace(f, kind="roce")),
    }
    for kind, variant in out.items():
        try:
            check_runnable(variant)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in the {kind} run; ibemu compare runs the scenario as ib and as roce)") \
                from None
    return out


def run(args: argparse.Namespace) -> int:
    import trio

    from ibemu.report import compare, store
    from ibemu.scenario import load_scenario
    from ibemu.scenario.runner import ScenarioRun

    path = Path(args.scenario)
    if not path.is_file():
        raise ConfigError(f"no scenario file {args.scenario!r}")
    scen = load_scenario(path)
    runs = variants(scen, args.duration)  # every error before anything is built
    dilation = resolve_dilation(args.dilation, scen.time, scen)
    if os.geteuid() != 0:
        raise ConfigError("ibemu compare needs root (network namespaces, veth, tc): use sudo")
    out_dir = args.out or Path("results") / f"compare-{scen.name}"
    json_path = args.json or out_dir / "compare.json"
    t0 = time.monotonic()
    results = {}
    for kind, variant in runs.items():
        def progress(phase: str, text: str, kind: str = kind) -> None:
            if not args.quiet:
                print(f"[{time.monotonic() - t0:6.2f}s] {kind:<4} {phase:<9} {text}", file=sys.stderr, flush=True)

        clock.configure(dilation)  # each run from its own epoch
        result = trio.run(ScenarioRun(variant, out_dir / kind, progress=progress).run, clock=clock.trio_clock())
        result["files"]["json"] = str(out_dir / f"{kind}.json")
        store.dump(result, out_dir / f"{kind}.json")
        results[kind] = result
        if result["interrupted"]:
            break
    if len(results) < 2:
        print("ibemu compare: interrupted before both runs were done", file=sys.stderr)
        return 130
    impair = {"loss_pct": scen.fabric.loss_pct, "delay_us": scen.fabric.delay_us,
              "ecn_mark_kb": scen.fabric.ecn_mark_kb, "ecn_line_gbps": scen.fabric.ecn_line_gbps}
    doc = compare.document(results["ib"], results["roce"], impair)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(compare.render(doc["comparison"]), end="")
    print(f"\n  written: {out_dir / 'ib.json'}, {out_dir / 'roce.json'}, {json_path}")
    return 130 if any(r["interrupted"] for r in results.values()) else 0
