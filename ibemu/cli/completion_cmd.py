"""`ibemu completion bash|zsh`: the shell completion script of the `ibemu` command (shtab).

Generated from the argparse parser itself, so it knows every sub-command and option; scenario
file arguments complete ``*.yaml`` files. Install it (``scripts/setup.sh`` does, as root)::

    ibemu completion bash | sudo tee /etc/bash_completion.d/ibemu
    ibemu completion zsh > "${fpath[1]}/_ibemu"
"""

from __future__ import annotations

import argparse

import shtab

SHELLS = ("bash", "zsh")
SCENARIO_FILES = shtab.glob("*.yaml", "*.yml")
"""What a scenario-file argument completes: YAML files (and folders to descend into)."""


def scenario_files(action: argparse.Action) -> argparse.Action:
    """Mark a parser argument as naming scenario files (completed as ``*.yaml``)."""
    action.complete = SCENARIO_FILES  # type: ignore[attr-defined]
    return action


def any_file(action: argparse.Action) -> argparse.Action:
    """Mark a parser argument as naming any file."""
    action.complete = shtab.FILE  # type: ignore[attr-defined]
    return action


def script(shell: str) -> str:
    """The completion script of ``ibemu`` for ``shell`` (bash or zsh)."""
    from ibemu.cli.main import build_parser  # main imports this module: import when asked

    return str(shtab.complete(build_parser(), shell=shell))


def _cmd(args: argparse.Namespace) -> int:
    print(script(args.shell))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("completion", help="print the shell completion script (bash or zsh)",
                       description=__doc__.splitlines()[0])
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=_cmd)
