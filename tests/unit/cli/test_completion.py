"""`ibemu completion bash|zsh`: the scripts know every sub-command and complete scenario files."""

from __future__ import annotations

import argparse

import pytest

from ibemu.cli.completion_cmd import SHELLS, script
from ibemu.cli.main import build_parser, main


def _subcommands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


@pytest.mark.parametrize("shell", SHELLS)
def test_script_names_every_subcommand(shell: str) -> None:
    text = script(shell)
    names = _subcommands()
    assert {"run", "up", "down", "validate", "compare", "schema", "completion"} <= set(names)
    for name in names:
        assert name in text, name
    assert "*.yaml" in text  # scenario arguments complete YAML files


def test_cli_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    out = capsys.readouterr().out
    assert "complete " in out and "_shtab_ibemu" in out


def test_unknown_shell_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["completion", "tcsh-please"])
