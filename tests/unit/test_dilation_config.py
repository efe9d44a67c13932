"""``time: {dilation: N}`` in scenarios, ``--dilation N`` on the commands, and the dilation in
the run result: good values taken, bad ones refused with a located error (exit 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibemu import clock
from ibemu.cli.dilation import resolve_dilation
from ibemu.cli.main import main
from ibemu.errors import ConfigError
from ibemu.report.result import FabricInfo, validate
from ibemu.report.summary import summary
from ibemu.scenario import ScenarioError, TimeSpec, loads_scenario
from tests.unit.report.sample import result as sample_result

TOPO = "topology:\n  generator: single-switch\n  hosts: 2\n"  # lines 1-3


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    clock.configure(1)


def test_default_is_one() -> None:
    assert loads_scenario(TOPO, "x.yaml").time == TimeSpec()
    assert loads_scenario(TOPO, "x.yaml").time.dilation == 1.0


@pytest.mark.parametrize("value, expected", [("4", 4.0), ("2.5", 2.5), ("1", 1.0)])
def test_a_number_is_taken(value: str, expected: float) -> None:
    spec = loads_scenario(TOPO + f"time:\n  dilation: {value}\n", "x.yaml").time
    assert spec.dilation == expected and spec.where == "x.yaml:5 time.dilation"


@pytest.mark.parametrize("text, expected", [
    ("time:\n  dilation: 0.5\n", "x.yaml:5 time.dilation: expected a number >= 1, got 0.5"),
    ("time:\n  dilation: fast\n", "x.yaml:5 time.dilation: expected a number >= 1, got 'fast'"),
    ("time:\n  dilation: true\n", "x.yaml:5 time.dilation: expected a number >= 1"),
    ("time:\n  dilation: [2]\n", "x.yaml:5 time.dilation: expected a number >= 1, got a list"),
    ("time:\n  factor: 2\n", "x.yaml:5 time.factor: unknown key"),
    ("time: 2\n", "x.yaml:4 time: expected a mapping"),
])
def test_bad_values_are_located(text: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as e:
        loads_scenario(TOPO + text, "x.yaml")
    assert e.value.problems[0].startswith(expected), e.value.problems


def test_the_command_line_overrides_the_scenario() -> None:
    assert resolve_dilation(None, TimeSpec(3.0)) == 3.0
    assert resolve_dilation("2", TimeSpec(3.0)) == 2.0
    assert resolve_dilation(None) == 1.0
    for bad in ("0", "0.99", "x", "nan", "inf", "-2", ""):
        with pytest.raises(ConfigError) as e:
            resolve_dilation(bad)
        assert e.value.where == "--dilation" and "expected a number >= 1 or auto" in str(e.value)
    said: list[str] = []
    assert resolve_dilation("auto", say=said.append) == 1.0  # no scenario: no flows, nothing to dilate
    assert said and "-> N = 1" in said[0] and "no traffic" in said[0]


@pytest.fixture
def scen_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(TOPO + "duration_s: 1\n")
    return path


@pytest.mark.parametrize("argv", [
    ["run", "{scen}", "--dilation", "0.5"],
    ["run", "{unpaced}", "--dilation", "auto"],  # an unpaced 4x EDR flow (100 Gb/s): beyond the cap here
    ["compare", "{scen}", "--dilation", "zero"],
    ["up", "--topo", "single-switch,hosts=2", "--dilation", "0"],
    ["cli", "{scen}", "--dilation", "-1"],
])
def test_bad_dilation_on_the_command_line_exits_2(argv: list[str], scen_file: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)  # past the root checks: the value is refused first
    slow_machine(tmp_path, monkeypatch, 10_000.0)
    import ibemu.fabric.session as session

    def no_build(*_a: object, **_k: object) -> None:
        raise AssertionError("a fabric was built")

    monkeypatch.setattr(session.Session, "up", classmethod(no_build))
    monkeypatch.setattr(session, "require_root", lambda *_a: None)
    monkeypatch.setattr("ibemu.cli.fabric_cmd.require_root", lambda *_a: None)
    unpaced = tmp_path / "unpaced.yaml"
    unpaced.write_text(TOPO + "defaults: {rate: 4x EDR}\nsm: {host: h0}\n"
                       "traffic:\n  - {name: bulk, kind: write_bw, from: h0, to: h1}\nduration_s: 1\n")
    argv = [a.replace("{scen}", str(scen_file)).replace("{unpaced}", str(unpaced)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--dilation:" in err and ("expected a number >= 1" in err or "above the cap of 1000" in err), err
    assert clock.dilation() == 1.0


def slow_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capacity: float) -> None:
    """A calibration cache saying this machine's user datapath does ``capacity`` frame-hops/s."""
    from ibemu.fabric import calibrate

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("IBEMU_CALIBRATION", str(path))
    path.write_text(json.dumps({calibrate.cache_key(b, physics): {"frame_hops_per_s": capacity, "measured_at": "test"}
                                for b in (298, 4138) for physics in (False, True)}))


def test_auto_in_a_scenario_is_chosen_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_machine(tmp_path, monkeypatch, 10_000.0)
    flows = ("traffic:\n  - {name: probe, kind: stream, from: h0, to: h1, size: 256, rate_pps: 4000}\n"
             "time: {dilation: auto}\n")
    scen = loads_scenario(TOPO + flows, "x.yaml")
    assert scen.time.auto and scen.time.where == "x.yaml:6 time.dilation"
    said: list[str] = []
    # kernel datapath: 4000 frames/s x 4 (a stream's endpoints) = 16000 frame-hops/s; 10k x 50% = 5000 a
    # second for the run (N = 4); its one worker also carries the switch its frames and ACKs cross
    # (4 + 0.5 x 1 x 2 = 5 units a message: 20k), 10k x 25% = 2500 for it: N = 8
    assert resolve_dilation(None, scen.time, scen, say=said.append) == 8.0
    assert said[0].startswith("dilation auto: offered load 16k frame-hops/s, capacity 10k frame-hops/s"), said
    assert "-> N = 8" in said[0] and "worker probe: 20k / 8" in said[0] and "probe h0->h1: 4,000 frames/s" in said[1]
    assert said[-1] == ("  judged on: every process's p99 lag < 2 ms emulated = 16 ms real; with a time figure "
                        "(a latency, a training step) < 250 us emulated = 2 ms real, relaxed up to 5% of the smallest")
    assert resolve_dilation("3", scen.time, scen) == 3.0  # a number on the command line wins
    user = loads_scenario(TOPO + flows + "fabric: {datapath: user}\n", "x.yaml")  # one switch hop per frame
    assert resolve_dilation(None, user.time, user, say=said.append) == 7.0  # the run fits; its worker (16k) does not
    light = loads_scenario(TOPO + flows.replace("4000", "600") + "fabric: {datapath: user}\n", "x.yaml")
    assert resolve_dilation(None, light.time, light, say=said.append) == 1.0
    fast = loads_scenario(TOPO + flows.replace("4000", "100"), "x.yaml")
    assert resolve_dilation("auto", fast.time, fast, say=said.append) == 1.0
    unpaced = loads_scenario(TOPO + flows.replace(", rate_pps: 4000", "").replace("stream", "write_bw"), "x.yaml")
    with pytest.raises(ConfigError) as e:
        resolve_dilation(None, unpaced.time, unpaced, say=said.append)
    assert e.value.where == "x.yaml:6 time.dilation" and "above the cap of 1000" in str(e.value)


def test_auto_without_a_calibration_is_a_located_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ibemu.fabric import calibrate

    monkeypatch.setenv("IBEMU_CALIBRATION", str(tmp_path / "none.json"))

    def cannot(*_a: object, **_k: object) -> float:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(calibrate, "measure", cannot)
    scen = loads_scenario(TOPO + "traffic:\n  - {name: p, kind: stream, from: h0, to: h1, rate_pps: 10}\n",
                          "x.yaml")
    with pytest.raises(ConfigError) as e:
        resolve_dilation("auto", scen.time, scen)
    assert e.value.where == "--dilation" and "cannot calibrate this machine's user datapath" in str(e.value)


def test_a_bad_scenario_key_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(TOPO + "time: {dilation: 0}\n")
    assert main(["run", str(path)]) == 2
    assert f"{path}:4 time.dilation: expected a number >= 1" in capsys.readouterr().err


def test_the_result_records_the_dilation() -> None:
    d = sample_result()
    assert "dilation" not in d["fabric"]  # dilation 1: the result as before
    assert FabricInfo.from_dict(d["fabric"]).dilation == 1.0
    d["fabric"]["dilation"] = 4
    assert validate(d) == []
    info = FabricInfo.from_dict(d["fabric"])
    assert info.dilation == 4 and info.to_dict()["dilation"] == 4
    from ibemu.report.result import RunResult

    assert "time dilation 4: emulated time runs 4x slower" in summary(RunResult.from_dict(d))
    assert "time dilation" not in summary(RunResult.from_dict(sample_result()))
    d["fabric"]["dilation"] = 0.5
    assert any(p.startswith("fabric.dilation: must be >= 1") for p in validate(d)), validate(d)


def test_a_fabric_spec_records_its_clock(tmp_path: Path) -> None:
    from ibemu.fabric.session import FabricRequest, adopt_clock, write_spec
    from ibemu.topo import parse_topo_spec

    clock.configure(3, 42)
    write_spec(tmp_path, "r1", FabricRequest(parse_topo_spec("single-switch,hosts=2"), "t", dilation=3))
    assert json.loads((tmp_path / "fabric.json").read_text())["clock"] == {"dilation": 3.0, "epoch_ns": 42}
    clock.configure(1)
    adopt_clock(tmp_path)  # a client of that fabric (ibemu exec, perf) stamps on its clock
    assert clock.dilation() == 3.0 and clock.epoch_ns() == 42


def test_a_lag_threshold_is_taken_and_bad_ones_are_located() -> None:
    spec = loads_scenario(TOPO + "time:\n  lag_threshold_us: 500\n", "x.yaml").time
    assert spec.lag_threshold_us == 500.0 and spec.dilation == 1.0
    spec = loads_scenario(TOPO + "time:\n  dilation: 4\n  lag_threshold_us: 250\n", "x.yaml").time
    assert spec.lag_threshold_us == 250.0 and spec.dilation == 4.0
    assert loads_scenario(TOPO, "x.yaml").time.lag_threshold_us is None
    for bad, expected in (("0", "got 0"), ("-5", "got -5"), ("slow", "got 'slow'")):
        with pytest.raises(ScenarioError) as e:
            loads_scenario(TOPO + f"time:\n  lag_threshold_us: {bad}\n", "x.yaml")
        assert e.value.problems[0].startswith("x.yaml:5 time.lag_threshold_us: expected a number > 0"), \
            e.value.problems
        assert expected in e.value.problems[0]


def test_a_real_time_lag_threshold_is_taken_and_bad_ones_are_located() -> None:
    spec = loads_scenario(TOPO + "time:\n  dilation: 20000\n  lag_threshold_real_us: 5000\n", "x.yaml").time
    assert spec.lag_threshold_real_us == 5000.0 and spec.lag_threshold_us is None and spec.dilation == 20000.0
    spec = loads_scenario(TOPO + "time:\n  dilation: auto\n  lag_threshold_real_us: 1500\n", "x.yaml").time
    assert spec.auto and spec.lag_threshold_real_us == 1500.0
    assert loads_scenario(TOPO, "x.yaml").time.lag_threshold_real_us is None
    for bad, expected in (("0", "got 0"), ("-5", "got -5"), ("fast", "got 'fast'")):
        with pytest.raises(ScenarioError) as e:
            loads_scenario(TOPO + f"time:\n  lag_threshold_real_us: {bad}\n", "x.yaml")
        assert e.value.problems[0].startswith("x.yaml:5 time.lag_threshold_real_us: expected a number > 0"), \
            e.value.problems
        assert expected in e.value.problems[0]
    with pytest.raises(ScenarioError) as e:
        loads_scenario(TOPO + "time:\n  lag_threshold_us: 5\n  lag_threshold_real_us: 2000\n", "x.yaml")
    assert e.value.problems == ["x.yaml:6 time.lag_threshold_real_us: give the lag threshold in emulated time "
                                "(lag_threshold_us) or in real time (lag_threshold_real_us), not both"]


def test_the_result_records_the_sm_clock() -> None:
    from ibemu.report.result import SMInfo

    d = sample_result()
    assert "clock" not in d["sm"] and SMInfo.from_dict(d["sm"]).clock is None  # dilation 1: as before
    d["sm"]["clock"] = "libfaketime"
    assert validate(d) == []
    assert SMInfo.from_dict(d["sm"]).to_dict()["clock"] == "libfaketime"
    d["sm"]["clock"] = "wall"
    assert any(p.startswith("sm.clock") for p in validate(d)), validate(d)


def test_opensm_at_a_dilation_without_libfaketime_is_refused_located(monkeypatch: pytest.MonkeyPatch) -> None:
    from ibemu.scenario.runner import check_runnable

    monkeypatch.setenv("IBEMU_LIBFAKETIME", "/nonexistent/libfaketimeMT.so.1")
    text = TOPO + "sm: {impl: opensm, host: h0}\ntime: {dilation: 4}\n"
    with pytest.raises(ConfigError) as e:
        check_runnable(loads_scenario(text, "x.yaml"))
    assert e.value.where == "x.yaml:5 time.dilation" and "libfaketime, which is not installed" in str(e.value)
    check_runnable(loads_scenario(text.replace("dilation: 4", "dilation: 1"), "x.yaml"))  # dilation 1: no preload
    monkeypatch.delenv("IBEMU_LIBFAKETIME")
    from ibemu.kernel import faketime

    if faketime.library_path() is not None:
        check_runnable(loads_scenario(text, "x.yaml"))
