"""`ibemu schema [--out FILE]`: the JSON Schema of scenario files, for editors.

Generated from the scenario format's one declaration (``ibemu.scenario.schema``); the
repository keeps a copy at ``docs/scenario.schema.json`` (``ibemu schema --out
docs/scenario.schema.json`` regenerates it). ``ibemu validate`` checks more than a JSON Schema
can: see ``ibemu.scenario.jsonschema``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ibemu.cli.completion_cmd import any_file
from ibemu.scenario.jsonschema import scenario_schema_text

log = logging.getLogger(__name__)


def _cmd(args: argparse.Namespace) -> int:
    text = scenario_schema_text()
    if args.out is None:
        print(text, end="")
        return 0
    args.out.write_text(text)
    log.info("wrote %s", args.out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of scenario files (for editors)",
                       description=__doc__.splitlines()[0])
    any_file(p.add_argument("--out", type=Path, metavar="FILE", help="write it to FILE instead of stdout"))
    p.set_defaults(func=_cmd)
