"""``ibemu compare --variant local-failover``: the two runs it plans (the same IB scenario and
adaptive engine, with and without local failover) and the bad input it refuses, located, before
anything is built."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from ibemu.cli import compare_cmd
from ibemu.cli.main import main
from ibemu.errors import ConfigError
from ibemu.scenario import load_scenario
from ibemu.scenario.schema import Scenario

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def _scen(**sm: str) -> Scenario:
    scen = load_scenario(SCENARIOS / "compare-allreduce.yaml")  # IB, kernel, ibemu SM (ftree), two faults
    return dataclasses.replace(scen, sm=dataclasses.replace(scen.sm, **sm)) if sm else scen


def test_the_two_runs_are_one_scenario_and_engine_with_and_without_local_failover() -> None:
    scen = _scen()
    v = compare_cmd.failover_variants(scen, 5.0)
    assert list(v) == ["local-failover", "sm-only"]
    lf, sm = v["local-failover"], v["sm-only"]
    assert (lf.fabric.local_failover, sm.fabric.local_failover) == (True, False)
    for s in v.values():
        assert s.sm.engine == "ftree_ar" and s.sm.impl == "ibemu" and s.sm.host == scen.sm.host
        assert (s.fabric.kind, s.fabric.datapath) == ("ib", "kernel")
        assert s.duration_s == 5.0 and s.traffic == scen.traffic and s.faults == scen.faults
        assert s.topology is scen.topology
    assert compare_cmd.failover_variants(_scen(engine="updn"))["sm-only"].sm.engine == "updn_ar"
    assert compare_cmd.failover_variants(_scen(engine="updn_ar"))["local-failover"].sm.engine == "updn_ar"
    off = dataclasses.replace(scen, fabric=dataclasses.replace(scen.fabric, local_failover=False))
    assert compare_cmd.failover_variants(off)["local-failover"].fabric.local_failover is True


def test_what_cannot_fail_over_is_refused_with_its_location() -> None:
    scen = _scen()
    where = re.escape(str(scen.path))
    with pytest.raises(ConfigError, match=rf"^{where}: sm.engine: --variant local-failover: routing engine "
                                          r"'minhop' has no adaptive variant \(ftree -> ftree_ar, updn -> updn_ar\)"):
        compare_cmd.failover_variants(_scen(engine="minhop"))
    with pytest.raises(ConfigError, match=rf"^{where}: sm.impl: .*needs ibemu's SM .*not sm.impl opensm"):
        compare_cmd.failover_variants(_scen(impl="opensm"))
    roce = dataclasses.replace(scen, fabric=dataclasses.replace(scen.fabric, kind="roce"))
    with pytest.raises(ConfigError, match=rf"^{where}: fabric.kind: .*this scenario's fabric is roce"):
        compare_cmd.failover_variants(roce)
    for sides in (compare_cmd.failover_variants(scen, physics=True),  # the user datapath fails over too
                  compare_cmd.failover_variants(dataclasses.replace(
                      scen, fabric=dataclasses.replace(scen.fabric, datapath="user")))):
        assert {s.fabric.datapath for s in sides.values()} == {"user"}
        assert [s.fabric.local_failover for s in sides.values()] == [True, False]
    with pytest.raises(ConfigError, match=rf"^{where}: faults: .*no faults"):
        compare_cmd.failover_variants(dataclasses.replace(scen, faults=()))
    with pytest.raises(ConfigError, match=r"--duration -1"):
        compare_cmd.failover_variants(scen, -1)


def test_cli_exit_2_before_building(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    allreduce = str(SCENARIOS / "compare-allreduce.yaml")
    out = tmp_path / "out"
    assert main(["compare", allreduce, "--variant", "local-failover", "--control", "ib", "--out", str(out)]) == 2
    assert "--variant and --control together" in capsys.readouterr().err
    bad = tmp_path / "roce.yaml"
    bad.write_text("topology: {generator: fat-tree, k: 4}\nfabric: {kind: roce}\nsm: {engine: ftree}\n"
                   "faults:\n  - {at_s: 1, action: link_down, link: edge0_0:3}\n")
    assert main(["compare", str(bad), "--variant", "local-failover", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "roce.yaml" in err and "this scenario's fabric is roce" in err
    with pytest.raises(SystemExit) as exc:
        main(["compare", allreduce, "--variant", "nope"])
    assert exc.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    assert not out.exists()  # nothing started


def test_adaptive_routing_variant_plans_two_user_datapath_runs_and_refuses_what_has_no_groups() -> None:
    from ibemu.agents.forwarder import AdaptiveRouting

    scen = _scen()
    v = compare_cmd.ar_variants(scen, 5.0)
    assert list(v) == ["adaptive-routing", "static"]
    assert v["adaptive-routing"].fabric.adaptive_routing == AdaptiveRouting()
    assert v["static"].fabric.adaptive_routing is None
    for s in v.values():
        assert (s.fabric.kind, s.fabric.datapath, s.sm.engine) == ("ib", "user", "ftree_ar")
        assert s.duration_s == 5.0 and s.traffic == scen.traffic and s.faults == scen.faults
    flowlet = dataclasses.replace(scen, fabric=dataclasses.replace(
        scen.fabric, datapath="user", adaptive_routing=AdaptiveRouting("flowlet", 3000)))
    assert compare_cmd.ar_variants(flowlet)["adaptive-routing"].fabric.adaptive_routing == AdaptiveRouting("flowlet", 3000)
    where = re.escape(str(scen.path))
    with pytest.raises(ConfigError, match=rf"^{where}: sm.engine: --variant adaptive-routing: routing engine 'minhop'"):
        compare_cmd.ar_variants(_scen(engine="minhop"))
    with pytest.raises(ConfigError, match=rf"^{where}: sm.impl: --variant adaptive-routing: needs ibemu's SM"):
        compare_cmd.ar_variants(_scen(impl="opensm"))
    off = dataclasses.replace(scen, fabric=dataclasses.replace(scen.fabric, local_failover=False))
    with pytest.raises(ConfigError, match=rf"^{where}: fabric.local_failover: .*no groups"):
        compare_cmd.ar_variants(off)
