"""`ibemu compare SCENARIO`: the same scenario as InfiniBand and as RoCEv2, side by side.

Runs the scenario twice on the same topology, traffic and faults: as ``ib`` (ibemu's SM, or
the scenario's ``sm``) and as ``roce`` (IP routers, ECMP, the fabric manager, and the
scenario's cable impairments ``fabric.loss_pct`` / ``fabric.delay_us``, which apply to the
RoCE run only: IB is lossless). Prints one table: bring-up, each fault's reroute phases,
each flow's blackout and throughput, collectives' time, bus bandwidth and #wrong. Writes
``OUT/ib.json`` and ``OUT/roce.json`` (ibemu.run/3) and ``--json FILE`` (default
``OUT/compare.json``: both runs and the comparison, ibemu.compare/1). Both variants are
checked before anything is built.

``--physics``: both runs on the user datapath, so both are timed by the same link model
(``ibemu.physics``): the same cable rates and delays (the topology's: ``defaults``/links
``rate``, ``delay_us``/``cable_m``), each kind's switch model (``fabric.switch`` where it
names no model of the other kind: IB credits per VL input buffer, Ethernet drop tail / PFC /
ECN per egress port). The RoCE run's ``line_gbps`` override is dropped (the topology's rates),
its cable impairments stay (they are what is compared). A scenario on the user datapath gets
this by itself.

``--control KIND``: the fairness check of a comparison. Both runs are KIND (``ib`` or
``roce``), on the physics the comparison would use: the same scenario twice, so every
ratio should be 1 (within the run-to-run noise, the issue's 100 +- 3%); the table and
``compare.json`` (``control``) say so, and each flow's ratio is printed as the control
ratio. Files: ``OUT/KIND-a.json``, ``OUT/KIND-b.json``.

``--variant local-failover``: two IB runs of the scenario (on its datapath; ``--physics``:
both on the user datapath, timed by the link model) with ibemu's SM and one adaptive engine (the scenario's ``ftree_ar``/``updn_ar``, or its base engine's:
ftree -> ftree_ar, updn -> updn_ar): A with ``fabric.local_failover: true`` (the switches
move to alternates and send fault notices by themselves), B with ``false`` (the SM writes no
alternates: SM-only recovery). The table adds each fault's ``local_failover`` phase; the
ratio column is B over A. Files: ``OUT/local-failover.json``, ``OUT/sm-only.json``. Refused
before anything is built (located): a RoCE fabric, OpenSM, an engine with no adaptive
variant, a scenario with no faults, and ``--control`` with it.

``--variant adaptive-routing``: two IB runs on the user datapath (adaptive routing reads the
link model's queues) with ibemu's SM and one adaptive engine, as above: A with
``fabric.adaptive_routing`` (the scenario's setting, or per packet), B without (the LFTs'
ports; local failover as the scenario says). Files: ``OUT/adaptive-routing.json``,
``OUT/static.json``. Refused before anything is built (located): a RoCE fabric, OpenSM, an
engine with no adaptive variant, ``fabric.local_failover: false``, and ``--control`` with it.
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
from ibemu.cli.completion_cmd import scenario_files
from ibemu.cli.dilation import add_dilation_argument, resolve_dilation
from ibemu.cli.progress import Reporter
from ibemu.errors import ConfigError
from ibemu.kernel.timerfd import run_trio
from ibemu.physics.link import SWITCH_MODELS
from ibemu.report.compare import VARIANTS, sides
from ibemu.scenario.schema import FabricSpec, Scenario, SwitchSpec


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run a scenario as InfiniBand and as RoCEv2, side by side",
                       description=__doc__.splitlines()[0])
    scenario_files(p.add_argument("scenario", help="scenario file"))
    p.add_argument("--duration", type=float, metavar="S", help="override duration_s (both runs)")
    p.add_argument("--out", type=Path, help="directory for results (default: results/compare-<scenario>)")
    p.add_argument("--json", type=Path, metavar="FILE",
                   help="write both runs and the comparison here (default: OUT/compare.json)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--physics", action="store_true",
                   help="both runs on the user datapath: timed by the same link model (rates, delays, buffers)")
    p.add_argument("--control", choices=("ib", "roce"), metavar="KIND",
                   help="the control run: the same kind (ib or roce) on both sides, whose ratios should be 1")
    p.add_argument("--variant", choices=tuple(VARIANTS), metavar="NAME",
                   help="two IB runs instead: local-failover (switches fail over by themselves) "
                        "against SM-only recovery, or adaptive-routing (user datapath) against static routes")
    add_dilation_argument(p)
    p.set_defaults(func=run)


def _switch_for(f: FabricSpec, kind: str) -> SwitchSpec | None:
    """``fabric.switch`` for a run of ``kind``: as written unless it names the other kind's model."""
    sw = f.switch
    if sw is None or not sw.model:
        return sw
    return sw if SWITCH_MODELS[sw.model].ethernet == (kind == "roce") else None


def variants(scen: Scenario, duration: float | None = None, *, physics: bool = False,
             control: str | None = None) -> dict[str, Scenario]:
    """The scenario as ``ib`` and as ``roce`` (``control``: twice as that kind, keyed ``ib``
    and ``roce`` still: run A and run B), each checked runnable (ConfigError otherwise).
    ``physics`` (or a scenario on the user datapath): both on the user datapath, timed by the
    same link model."""
    from ibemu.scenario.runner import check_runnable

    scen = _with_duration(scen, duration)
    f = scen.fabric
    physics = physics or f.datapath == "user"
    ib_dp = "user" if physics else (f.datapath if f.kind == "ib" else "kernel")
    ib = dataclasses.replace(scen, fabric=dataclasses.replace(
        f, kind="ib", datapath=ib_dp, loss_pct=0.0, delay_us=0.0, ecn_mark_kb=0.0, ecn_line_gbps=0.0, line_gbps=0.0,
        buffer_kb=1024.0, pfc=(), dscp_priority=(), switch=_switch_for(f, "ib")))
    roce = dataclasses.replace(scen, fabric=dataclasses.replace(
        f, kind="roce", qos=None, switch=_switch_for(f, "roce"), datapath="user" if physics else f.datapath,
        line_gbps=0.0 if physics else f.line_gbps))
    out = {"ib": ib, "roce": roce}
    if control is not None:
        out = {"ib": out[control], "roce": out[control]}
    for kind, variant in out.items():
        try:
            check_runnable(variant)
        except ConfigError as exc:
            what = f"the control's {control} runs" if control else f"the {kind} run"
            raise ConfigError(f"{exc} (in {what}; ibemu compare runs the scenario as ib and as roce)") from None
    return out


def _with_duration(scen: Scenario, duration: float | None) -> Scenario:
    if duration is None:
        return scen
    if not 0 < duration <= 86400:
        raise ConfigError(f"--duration {duration}: must be in (0, 86400] seconds")
    return dataclasses.replace(scen, duration_s=duration)


def ar_variants(scen: Scenario, duration: float | None = None) -> dict[str, Scenario]:
    """The scenario with adaptive routing (``adaptive-routing``) and without (``static``): the
    same IB fabric on the user datapath, ibemu's SM, one adaptive engine; each checked runnable.
    Every error (ConfigError, located) is raised before anything is built."""
    from ibemu.agents.forwarder import AdaptiveRouting

    scen = _with_duration(scen, duration)
    f = scen.fabric
    where = scen.path or scen.name
    what = "--variant adaptive-routing"
    if f.kind != "ib":
        raise ConfigError(f"{what}: adaptive routing is the InfiniBand switches' (groups from ibemu's SM); "
                          f"this scenario's fabric is {f.kind}", f.where or f"{where}: fabric.kind")
    if scen.sm.impl != "ibemu":
        raise ConfigError(f"{what}: needs ibemu's SM (it writes the groups), not sm.impl {scen.sm.impl}",
                          f"{where}: sm.impl")
    if f.local_failover is False:
        raise ConfigError(f"{what}: fabric.local_failover: false makes the SM write no groups",
                          f"{where}: fabric.local_failover")
    engine = adaptive_engine(scen, what)
    sm = dataclasses.replace(scen.sm, engine=engine)
    f = dataclasses.replace(f, datapath="user")
    ar = f.adaptive_routing or AdaptiveRouting()
    out = {name: dataclasses.replace(scen, sm=sm, fabric=dataclasses.replace(f, adaptive_routing=a))
           for name, a in zip(VARIANTS["adaptive-routing"], (ar, None), strict=True)}
    return _all_runnable(out, f"ibemu compare {what}", "adaptive routing")


def adaptive_engine(scen: Scenario, what: str = "--variant local-failover") -> str:
    """The adaptive engine a local-failover comparison runs: the scenario's, or its base
    engine's ``_ar`` variant (ConfigError, located at ``sm.engine``, when there is none)."""
    from ibemu.sm.routing.alternates import AR_ENGINES

    engine = scen.sm.engine
    if engine in AR_ENGINES:
        return engine
    if f"{engine}_ar" in AR_ENGINES:
        return f"{engine}_ar"
    offered = ", ".join(f"{a.base} -> {name}" for name, a in AR_ENGINES.items())
    raise ConfigError(f"{what}: routing engine {engine!r} has no adaptive variant "
                      f"({offered}): its switches get no alternate ports",
                      f"{scen.path or scen.name}: sm.engine")


def failover_variants(scen: Scenario, duration: float | None = None, *, physics: bool = False) -> dict[str, Scenario]:
    """The scenario with local failover (``local-failover``) and with SM-only recovery
    (``sm-only``): the same IB fabric, ibemu's SM, one adaptive engine; each checked runnable.
    Every error (ConfigError, located) is raised before anything is built."""

    scen = _with_duration(scen, duration)
    f = scen.fabric
    where = scen.path or scen.name
    if f.kind != "ib":
        raise ConfigError(f"--variant local-failover: local failover is the InfiniBand switches' (alternates "
                          f"from ibemu's SM); this scenario's fabric is {f.kind}", f.where or f"{where}: fabric.kind")
    if scen.sm.impl != "ibemu":
        raise ConfigError(f"--variant local-failover: needs ibemu's SM (it writes the alternate ports), "
                          f"not sm.impl {scen.sm.impl}", f"{where}: sm.impl")
    if physics:  # both runs timed by the link model: the user datapath's forwarder fails over too
        f = dataclasses.replace(f, datapath="user")
    if not scen.faults:
        raise ConfigError("--variant local-failover: the scenario has no faults, so nothing to fail over from "
                          "(add a link_down or node_down under faults:)", f"{where}: faults")
    engine = adaptive_engine(scen)
    sm = dataclasses.replace(scen.sm, engine=engine)
    out = {name: dataclasses.replace(scen, sm=sm, fabric=dataclasses.replace(f, local_failover=on))
           for name, on in zip(VARIANTS["local-failover"], (True, False), strict=True)}
    return _all_runnable(out, "ibemu compare --variant local-failover", "local failover")


def _all_runnable(variants: dict[str, Scenario], command: str, feature: str) -> dict[str, Scenario]:
    """``variants``, each checked runnable; a ConfigError names the run it is about."""
    from ibemu.scenario.runner import check_runnable

    for name, variant in variants.items():
        try:
            check_runnable(variant)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (in the {name} run; {command} runs the scenario "
                              f"with and without {feature})") from None
    return variants


def run(args: argparse.Namespace) -> int:

    from ibemu.report import compare, store
    from ibemu.scenario import load_scenario
    from ibemu.scenario.runner import ScenarioRun

    path = Path(args.scenario)
    if not path.is_file():
        raise ConfigError(f"no scenario file {args.scenario!r}")
    if args.variant and args.control:
        raise ConfigError("--variant and --control together: a comparison is one or the other "
                          "(--control checks an ib/roce comparison's fairness)", "ibemu compare")
    scen = load_scenario(path)
    if args.variant == "adaptive-routing":  # every error before building
        sides_a_b = ar_variants(scen, args.duration)
        runs = dict(zip(("ib", "roce"), sides_a_b.values(), strict=True))
    elif args.variant:
        sides_a_b = failover_variants(scen, args.duration, physics=args.physics)
        runs = dict(zip(("ib", "roce"), sides_a_b.values(), strict=True))
    else:
        runs = variants(scen, args.duration, physics=args.physics, control=args.control)
    dilation = resolve_dilation(args.dilation, scen.time, scen)
    if os.geteuid() != 0:
        raise ConfigError("ibemu compare needs root (network namespaces, veth, tc): use sudo")
    out_dir = args.out or Path("results") / f"compare-{scen.name}"
    json_path = args.json or out_dir / "compare.json"
    t0 = time.monotonic()
    results = {}
    names = dict(zip(("ib", "roce"), sides(args.control, args.variant), strict=True))
    for kind, variant in runs.items():
        name = names[kind]

        clock.configure(dilation)  # each run from its own epoch
        with Reporter(quiet=args.quiet, label=name, traffic_s=variant.duration_s * dilation) as progress:
            progress.t0 = t0  # one clock for both runs' lines
            result = run_trio(ScenarioRun(variant, out_dir / name, progress=progress).run)
        result["files"]["json"] = str(out_dir / f"{name}.json")
        store.dump(result, out_dir / f"{name}.json")
        results[kind] = result
        if result["interrupted"]:
            break
    if len(results) < 2:
        print("ibemu compare: interrupted before both runs were done", file=sys.stderr)
        return 130
    roce_f = runs["roce"].fabric
    impair = {"loss_pct": roce_f.loss_pct, "delay_us": roce_f.delay_us, "ecn_mark_kb": roce_f.ecn_mark_kb,
              "ecn_line_gbps": roce_f.ecn_line_gbps} if runs["roce"].fabric.kind == "roce" else {}
    doc = compare.document(results["ib"], results["roce"], impair, control=args.control, variant=args.variant,
                           physics="link model" if runs["ib"].fabric.datapath == "user" else "kernel")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    print(compare.render(doc["comparison"]), end="")
    print(f"\n  written: {out_dir / (names['ib'] + '.json')}, {out_dir / (names['roce'] + '.json')}, {json_path}")
    return 130 if any(r["interrupted"] for r in results.values()) else 0
