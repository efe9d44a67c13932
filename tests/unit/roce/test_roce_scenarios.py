"""RoCE scenarios: what the runner accepts and refuses before building, and ``--fabric roce``."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from ibemu.cli import run_cmd
from ibemu.errors import ConfigError
from ibemu.fabric.faults import FaultSpec
from ibemu.scenario import load_scenario
from ibemu.scenario.loader import load_builtin
from ibemu.scenario.runner import check_runnable

ROCE = Path(__file__).resolve().parents[3] / "scenarios" / "roce-fat-tree.yaml"


def test_shipped_roce_scenario_is_runnable() -> None:
    scen = load_scenario(ROCE)
    assert scen.fabric.kind == "roce"
    check_runnable(scen)


def test_roce_refuses_what_it_cannot_do() -> None:
    scen = load_scenario(ROCE)
    check_runnable(dataclasses.replace(scen, fabric=dataclasses.replace(scen.fabric, datapath="user")))  # userpath
    corrupt = FaultSpec(at_s=1.0, action="corrupt", link=scen.faults[0].link, percent=1.0, where="faults[2]")
    with pytest.raises(ConfigError, match="does not apply to a RoCE fabric"):
        check_runnable(dataclasses.replace(scen, faults=(*scen.faults, corrupt)))


def test_fabric_override_runs_the_default_as_roce() -> None:
    parser = argparse.ArgumentParser()
    run_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["run", "--fabric", "roce"])
    scen = run_cmd._scenario(args)
    default = load_builtin("default")
    assert scen.fabric.kind == "roce" and scen.fabric.datapath == default.fabric.datapath
    assert [t.name for t in scen.traffic] == [t.name for t in default.traffic]
    assert [(f.action, str(f.link)) for f in scen.faults] == [(f.action, str(f.link)) for f in default.faults]
    check_runnable(scen)
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--fabric", "ethernet"])
