"""`ibemu report RESULT [--html] [--out FILE]`: a saved run result, shown again.

Reads a result file (``ibemu run --json FILE``: ``ibemu.run/3``, and ``/2`` and ``/1``) and
prints its terminal summary (``ibemu.report.summary``) or, with ``--html``, writes one
self-contained HTML page (``ibemu.report.html``: topology with cable loads and failures,
reroute phases, throughput, fidelity; no network fetches) to ``--out`` (default: the result's
path with ``.html``). A file that is not JSON, of another schema (``ibemu.compare/1``...) or
not a valid result is a located error, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ibemu.cli.completion_cmd import any_file
from ibemu.errors import ConfigError
from ibemu.report.result import READABLE_VERSIONS, ResultError, RunResult


def load_result(path: Path) -> RunResult:
    """The run result in ``path``; a :class:`ConfigError` that says what is wrong and where."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: line {e.lineno} column {e.colno}: not JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a run result (a JSON {type(data).__name__}, not an object)")
    schema = data.get("schema")
    if schema not in READABLE_VERSIONS:
        what = f"schema {schema!r}" if schema is not None else "no 'schema' key"
        raise ConfigError(f"{path}: not a run result: {what}; expected one of {', '.join(READABLE_VERSIONS)} "
                          "(what `ibemu run --json FILE` writes)")
    try:
        return RunResult.from_dict(data, str(path))
    except ResultError as exc:
        raise ConfigError(str(exc)) from None


def write_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file beside it: never a half-written page."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot write: {exc.strerror or exc}") from None


def cmd_report(args: argparse.Namespace) -> int:
    result = load_result(args.result)
    if not args.html:
        if args.out is not None:
            raise ConfigError("--out: only with --html (the summary goes to standard output)")
        from ibemu.report.summary import summary

        sys.stdout.write(summary(result))
        return 0
    from ibemu.report.html import render

    out = args.out or args.result.with_suffix(".html")
    if out.resolve() == args.result.resolve():
        raise ConfigError(f"--out {out}: that is the result file itself")
    write_atomic(out, render(result))
    print(f"wrote {out}" + (" (INVALID run: marked on every figure)" if result.invalid else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="show a saved run result (terminal summary, or one HTML page)",
                       description=__doc__.splitlines()[0])
    any_file(p.add_argument("result", type=Path, help="a result file (ibemu run --json FILE)"))
    p.add_argument("--html", action="store_true", help="write a self-contained HTML page instead of the summary")
    any_file(p.add_argument("--out", type=Path, metavar="FILE", help="where --html writes (default: RESULT with .html)"))
    p.set_defaults(func=cmd_report)
