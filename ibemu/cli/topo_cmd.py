"""`ibemu topo`: generate, inspect and draw fabric topologies.

``SOURCE`` is a generator name (``fat-tree``, ``leaf-spine``, ...) followed by its
parameters as options (``--k 8``, ``--hosts-per-leaf 16``), an ibnetdiscover file, or a
scenario file (``.yaml``), whose topology is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ibemu.errors import ConfigError
from ibemu.topo import analysis, ibnetdiscover
from ibemu.topo.generators import ALIASES, GENERATORS, generate, lookup
from ibemu.topo.model import Topology

_PARAMS = sorted({p.name for g in GENERATORS.values() for p in g.params})


def _add_param_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "generator parameters", "each generator takes some of these (see `ibemu topo list`)"
    )
    for name in _PARAMS:
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"gp_{name}",
            metavar="VALUE",
            default=argparse.SUPPRESS,
        )


def _params(args: argparse.Namespace) -> dict[str, str]:
    return {k[3:]: v for k, v in vars(args).items() if k.startswith("gp_")}


def load_source(source: str, params: dict[str, Any]) -> Topology:
    """A topology from a generator name + params, an ibnetdiscover file or a scenario file."""
    path = Path(source)
    if source in GENERATORS or source in ALIASES:
        return generate(source, params)
    if params:
        raise ConfigError(
            f"generator parameters ({', '.join('--' + k.replace('_', '-') for k in params)}) "
            f"only apply to a generator, and {source!r} is not one"
        )
    if path.suffix in (".yaml", ".yml") and path.is_file():
        from ibemu.scenario import load_scenario

        return load_scenario(path).topology
    if path.is_file():
        return ibnetdiscover.load(path)
    if path.exists():
        raise ConfigError(f"{source} is not a regular file")
    if "/" in source or "." in source:
        raise ConfigError(f"no such file: {source}")
    lookup(source)  # raises "unknown generator ... did you mean"
    raise AssertionError("unreachable")


def _cmd_generate(args: argparse.Namespace) -> int:
    topo = load_source(args.source, _params(args))
    text = ibnetdiscover.dumps(topo)
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        c = topo.counts()
        print(f"wrote {args.output}: {c.nodes} nodes, {c.links} links", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}:1"


def _cmd_info(args: argparse.Namespace) -> int:
    topo = load_source(args.source, _params(args))
    problems = topo.validate()
    s = analysis.summarize(topo)
    bisection = analysis.bisection_gbps(topo) if args.bisection else None
    if args.json:
        out = {
            "name": topo.name,
            "generator": topo.generator,
            "params": {k: str(v) if not isinstance(v, int) else v for k, v in topo.params.items()},
            "nodes": s.nodes,
            "switches": s.switches,
            "cas": s.cas,
            "routers": s.routers,
            "links": s.links,
            "switch_links": s.switch_links,
            "ports": s.ports,
            "cabled_ports": s.cabled_ports,
            "radix": s.radix,
            "rates": s.rates,
            "parts": s.parts,
            "diameter": s.diameter,
            "tiers": [
                {
                    "level": t.level,
                    "switches": t.switches,
                    "down_gbps": t.down_gbps,
                    "up_gbps": t.up_gbps,
                    "oversubscription": t.oversubscription,
                }
                for t in s.tiers
            ],
            "bisection_gbps": bisection,
            "problems": [
                {"where": p.where, "message": p.message, "severity": p.severity} for p in problems
            ],
        }
        print(json.dumps(out, indent=2))
    else:
        origin = (
            f"generator {topo.generator}, "
            + ", ".join(
                f"{k}={v if not isinstance(v, tuple) else 'x'.join(map(str, v))}"
                for k, v in topo.params.items()
            )
            if topo.generator
            else f"from {args.source}"
        )
        print(f"{topo.name} ({origin})")
        print(
            f"  nodes      {s.nodes:>6}  ({s.switches} switches, {s.cas} CAs, {s.routers} routers)"
        )
        print(
            f"  links      {s.links:>6}  ({s.switch_links} switch-switch, {s.links - s.switch_links} to CAs/routers)"
        )
        print(f"  ports      {s.cabled_ports:>6}  cabled of {s.ports}")
        print("  radix      " + ", ".join(f"{r} ports x {n}" for r, n in s.radix.items()))
        print("  rates      " + ", ".join(f"{r} x {n}" for r, n in s.rates.items()))
        print(
            f"  diameter   {s.diameter} hops host to host"
            if s.diameter is not None
            else "  diameter   - (some CAs cannot reach each other)"
        )
        for t in s.tiers if len(s.tiers) > 1 else ():  # one tier (torus, dragonfly): nothing to say
            load = (
                f"worst down {t.down_gbps:g} / up {t.up_gbps:g} Gb/s = {_ratio(t.oversubscription)}"
                if t.up_gbps
                else f"top tier, {t.down_gbps:g} Gb/s down per switch"
            )
            print(f"  tier {t.level}     {t.switches:>6}  switches, {load}")
        if bisection is not None:
            print(f"  bisection  {bisection:g} Gb/s between the two halves of the CAs")
        errors = [p for p in problems if p.severity == "error"]
        print(
            f"  check      {'ok' if not problems else f'{len(errors)} errors, {len(problems) - len(errors)} warnings'}"
        )
        for p in problems:
            print(f"  {p.severity}: {p}")
    return 2 if any(p.severity == "error" for p in problems) else 0


def _cmd_draw(args: argparse.Namespace) -> int:
    from ibemu.topo.draw import draw

    topo = load_source(args.source, _params(args))
    out = Path(args.output or f"{topo.name}.png")
    draw(topo, out, title=args.title)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    for g in GENERATORS.values():
        aliases = [a for a, t in ALIASES.items() if t == g.name]
        print(f"{g.name}" + (f" (alias: {', '.join(aliases)})" if aliases else ""))
        print(f"    {g.help}")
        for p in g.params:
            default = (
                "required"
                if p.required
                else "default: derived"
                if p.default is None
                else f"default {p.default}"
            )
            print(f"    --{p.name.replace('_', '-'):<18} {p.help} ({default})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "topo", help="generate, inspect and draw fabric topologies", description=__doc__
    )
    tsub = p.add_subparsers(dest="topo_command", metavar="ACTION")
    tsub.required = True
    src_help = "generator name (see `ibemu topo list`), ibnetdiscover file or scenario .yaml"

    g = tsub.add_parser("generate", help="write a generated topology as an ibnetdiscover file")
    g.add_argument("source", metavar="GENERATOR", help="generator name, e.g. fat-tree")
    g.add_argument("-o", "--output", metavar="FILE", help="output file (default: standard output)")
    _add_param_options(g)
    g.set_defaults(func=_cmd_generate)

    i = tsub.add_parser("info", help="counts, shape and checks of a topology")
    i.add_argument("source", metavar="SOURCE", help=src_help)
    i.add_argument(
        "--bisection", action="store_true", help="also compute the bisection bandwidth (max-flow)"
    )
    i.add_argument("--json", action="store_true", help="print JSON")
    _add_param_options(i)
    i.set_defaults(func=_cmd_info)

    d = tsub.add_parser("draw", help="draw a topology to a PNG/SVG/PDF file")
    d.add_argument("source", metavar="SOURCE", help=src_help)
    d.add_argument("-o", "--output", metavar="FILE", help="picture file (default: NAME.png)")
    d.add_argument("--title", help="title of the picture")
    _add_param_options(d)
    d.set_defaults(func=_cmd_draw)

    ls = tsub.add_parser("list", help="list the generators and their parameters")
    ls.set_defaults(func=_cmd_list)
