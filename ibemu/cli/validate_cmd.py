"""`ibemu validate`: check scenario files without building anything (no root needed)."""

from __future__ import annotations

import argparse
import sys

from ibemu.cli.completion_cmd import scenario_files
from ibemu.errors import ConfigError
from ibemu.scenario import Scenario, ScenarioError, load_scenario


def _summary(s: Scenario) -> str:
    c = s.topology.counts()
    spec = s.topology_spec
    if spec.source == "generator":
        params = ", ".join(
            f"{k}={'x'.join(map(str, v)) if isinstance(v, tuple) else v}"
            for k, v in spec.params.items()
        )
        shape = f"{spec.generator} {params}"
    elif spec.source == "file":
        shape = f"from {spec.file}"
    else:
        shape = "explicit"
    manager = ("fabric manager (ECMP)" if s.fabric.kind == "roce"
               else f"SM {s.sm.impl}/{s.sm.engine} on {s.sm.host}")
    return (
        f"{s.name}: {shape} ({c.switches} switches, {c.cas} CAs, {c.links} links), "
        f"{s.fabric.kind}/{s.fabric.datapath}, {manager}, "
        f"{len(s.traffic)} traffic, {len(s.faults)} faults, {s.duration_s:g} s"
    )


def _cmd(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            scenario = load_scenario(path)
        except ScenarioError as exc:
            failed += 1
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            continue
        except ConfigError as exc:
            failed += 1
            print(exc, file=sys.stderr)
            continue
        for warning in scenario.warnings:
            print(warning, file=sys.stderr)
        if not args.quiet:
            print(f"ok   {path}: {_summary(scenario)}")
    if failed and len(args.files) > 1:
        print(f"{failed} of {len(args.files)} scenarios invalid", file=sys.stderr)
    return 2 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check scenario files (schema, ranges, references) without building anything",
        description=__doc__,
    )
    scenario_files(p.add_argument("files", nargs="+", metavar="SCENARIO", help="scenario .yaml files"))
    p.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    p.set_defaults(func=_cmd)
