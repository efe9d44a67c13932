"""``ibemu compare``: both variants of a scenario, and bad input refused (exit 2) before building."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ibemu.cli import compare_cmd
from ibemu.cli.main import main
from ibemu.errors import ConfigError
from ibemu.fabric.faults import FaultSpec
from ibemu.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def test_variants_are_the_same_scenario_as_ib_and_roce() -> None:
    scen = load_scenario(SCENARIOS / "compare-lossy-ethernet.yaml")
    v = compare_cmd.variants(scen, 7.0)
    assert (v["ib"].fabric.kind, v["roce"].fabric.kind) == ("ib", "roce")
    assert not v["ib"].fabric.impaired  # IB is lossless
    assert v["roce"].fabric.loss_pct == scen.fabric.loss_pct > 0
    for s in v.values():
        assert s.duration_s == 7.0 and s.traffic == scen.traffic and s.faults == scen.faults
        assert s.topology is scen.topology


def test_a_scenario_one_kind_cannot_run_is_refused_with_its_location() -> None:
    scen = load_scenario(SCENARIOS / "compare-allreduce.yaml")
    bad = FaultSpec(at_s=1.0, action="smp_loss", percent=5.0, where="x.yaml:30 faults[2]")
    with pytest.raises(ConfigError, match=r"x.yaml:30 faults\[2\]: fault 'smp_loss' does not apply .* roce run"):
        compare_cmd.variants(dataclasses.replace(scen, faults=(*scen.faults, bad)))
    user = dataclasses.replace(scen, fabric=dataclasses.replace(scen.fabric, datapath="user"))
    v = compare_cmd.variants(user)  # a RoCE fabric may forward in the user datapath (ibemu.roce.userpath)
    assert v["roce"].fabric.datapath == "user"


def test_cli_exit_2_on_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "nope.yaml")]) == 2
    assert "no scenario file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("topology: {generator: fat-tree, k: 4}\nfabric: {kind: roce, loss_pct: 80}\n")
    assert main(["compare", str(bad)]) == 2
    assert "bad.yaml:2 fabric.loss_pct: expected a number from 0 to 50, got 80" in capsys.readouterr().err
    bad.write_text("topology: {generator: fat-tree, k: 4}\nfabric:\n  kind: ib\n  loss_pct: 1\n")
    assert main(["compare", str(bad)]) == 2
    assert "bad.yaml:4 fabric.loss_pct: cable impairments and ECN apply to a RoCE fabric only" in capsys.readouterr().err
    assert main(["compare", str(SCENARIOS / "compare-allreduce.yaml"), "--duration", "0"]) == 2
    assert "--duration 0" in capsys.readouterr().err


def test_roce_keys_are_checked_where_they_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "ecn.yaml"
    bad.write_text("topology: {generator: fat-tree, k: 4}\nfabric:\n  kind: roce\n  ecn_mark_kb: 64\n")
    assert main(["validate", str(bad)]) == 2
    assert "ecn.yaml:4 fabric.ecn_mark_kb: ECN marking needs fabric.ecn_line_gbps too" in capsys.readouterr().err
    bad.write_text("topology: {generator: fat-tree, k: 4}\nfabric: {kind: roce, ecn_mark_kb: 0, ecn_line_gbps: 1}\n")
    assert main(["validate", str(bad)]) == 2
    assert "fabric.ecn_mark_kb: expected a number" in capsys.readouterr().err
    scen = load_scenario(SCENARIOS / "compare-incast-ecn.yaml")
    assert scen.fabric.ecn and (scen.fabric.ecn_mark_kb, scen.fabric.ecn_line_gbps) == (64.0, 1.0)
    v = compare_cmd.variants(scen)
    assert not v["ib"].fabric.ecn and v["roce"].fabric.ecn


def test_equal_physics_puts_both_kinds_on_the_link_model_and_a_control_repeats_one() -> None:
    scen = load_scenario(SCENARIOS / "compare-lossy-ethernet.yaml")
    v = compare_cmd.variants(scen, physics=True)
    assert (v["ib"].fabric.datapath, v["roce"].fabric.datapath) == ("user", "user")
    assert v["roce"].fabric.line_gbps == 0 and v["roce"].fabric.loss_pct == scen.fabric.loss_pct
    assert not v["ib"].fabric.impaired and v["ib"].topology is v["roce"].topology  # the same cables
    slow = dataclasses.replace(scen, fabric=dataclasses.replace(scen.fabric, datapath="user", line_gbps=0.5))
    assert compare_cmd.variants(slow)["roce"].fabric.line_gbps == 0  # a user-datapath scenario: equal physics
    c = compare_cmd.variants(scen, physics=True, control="roce")
    assert c["ib"] == c["roce"] == v["roce"]
    k = compare_cmd.variants(scen, control="ib")
    assert k["ib"] == k["roce"] and k["ib"].fabric.kind == "ib" and k["ib"].fabric.datapath == "kernel"
