"""`ibemu clean [RUN ...]`: remove what ibemu runs own (after a crash, or a forgotten `up`)."""

from __future__ import annotations

import argparse
import os

from ibemu.errors import ConfigError
from ibemu.kernel import ownership


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clean", help="remove every namespace and process ibemu runs own")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids (default: all recorded runs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise ConfigError("ibemu clean needs root (it removes network namespaces): use sudo")
    runs = ownership.list_runs()
    if args.runs:
        known = {r.run_id for r in runs}
        unknown = [r for r in args.runs if r not in known]
        if unknown:
            raise ConfigError(f"no recorded run {unknown[0]} (known: {', '.join(sorted(known)) or 'none'})")
        runs = [r for r in runs if r.run_id in set(args.runs)]
    if not runs:
        print("ibemu clean: nothing to clean")
        return 0
    failed = 0
    for state in runs:
        live = sum(p.alive() for p in state.processes)
        problems = ownership.teardown(state)
        what = f"{len(state.namespaces)} namespaces, {live} live processes"
        if problems:
            failed += 1
            print(f"run {state.run_id}: could not remove everything ({what}): {'; '.join(problems)}")
        else:
            print(f"run {state.run_id}: removed {what}")
    return 1 if failed else 0
