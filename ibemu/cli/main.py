"""Entry point of the `ibemu` command: builds the sub-command parser and dispatches.

Each sub-command lives in its own module exposing ``register(subparsers)``; the module adds
its parser and sets ``func`` (``args -> int`` exit code). Add new modules to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from ibemu import __version__
from ibemu.errors import IbemuError, leaves

COMMANDS = (
    "ibemu.cli.demo_cmd",
    "ibemu.cli.clean_cmd",
    "ibemu.cli.fabric_cmd",
    "ibemu.cli.sm_cmd",
    "ibemu.cli.topo_cmd",
    "ibemu.cli.validate_cmd",
    "ibemu.cli.run_cmd",
    "ibemu.cli.compare_cmd",
    "ibemu.cli.report_cmd",
    "ibemu.cli.perf_cmd",
    "ibemu.cli.console_cmd",
    "ibemu.cli.schema_cmd",
    "ibemu.cli.completion_cmd",
)

log = logging.getLogger("ibemu")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ibemu", description="Packet-level InfiniBand / RoCEv2 fabric emulator."
    )
    parser.add_argument("--version", action="version", version=f"ibemu {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser



def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except IbemuError as exc:
        print(f"ibemu: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # raised inside a trio task: report it the same way
        inner = leaves(group)
        if all(isinstance(e, IbemuError) for e in inner):
            for e in inner:
                print(f"ibemu: error: {e}", file=sys.stderr)
            return 2
        if all(isinstance(e, KeyboardInterrupt) for e in inner):
            print("ibemu: interrupted", file=sys.stderr)
            return 130
        raise
    except KeyboardInterrupt:
        print("ibemu: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ibemu ... | head`: the reader left, nothing more to say
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
