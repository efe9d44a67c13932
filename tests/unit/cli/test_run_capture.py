"""``ibemu run --capture`` and its bounds: bad values and cable ends that are not there are
refused with one located line (exit 2) before anything is built; the summary and the result
say what each capture holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.cli.main import main
from ibemu.report.result import RunResult, validate
from ibemu.report.summary import summary
from tests.unit.report.sample import result as sample_result

SCEN = """\
topology: {generator: leaf-spine, leaves: 2, spines: 2, hosts_per_leaf: 2}
traffic:
  - {name: bulk, kind: write_bw, from: h0, to: h2, size: 64KiB}
duration_s: 1
"""


@pytest.fixture
def scen_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("os.geteuid", lambda: 0)  # past the root check: the values are refused first

    def no_build(*_a: object, **_k: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr("ibemu.scenario.runner.ScenarioRun", no_build)
    path = tmp_path / "s.yaml"
    path.write_text(SCEN)
    return path


@pytest.mark.parametrize("flags, said", [
    (["--capture-snaplen", "0"], "--capture-snaplen: 0: must be 1 to 262144 bytes"),
    (["--capture-snaplen", "-5"], "--capture-snaplen: -5: must be 1 to 262144 bytes"),
    (["--capture-limit", "0"], "--capture-limit: 0: must be 0.001 to 1000000 MB"),
    (["--capture-limit", "-1"], "--capture-limit: -1: must be 0.001 to 1000000 MB"),
    (["--capture-limit", "nan"], "--capture-limit: nan: must be"),
    (["--capture-files", "0"], "--capture-files: 0: must be 1 to 1000"),
    (["--capture", "leaf9:1"], "--capture: leaf9:1: no node 'leaf9' (did you mean"),
    (["--capture", "leaf0:9"], "--capture: leaf0:9: leaf0 has ports 1-4"),
    (["--capture", "leaf0"], "--capture: leaf0: expected a cable end NODE:PORT"),
    (["--capture", "h0:x"], "--capture: h0:x: expected a cable end NODE:PORT"),
])
def test_bad_capture_options_exit_2_before_the_build(flags: list[str], said: str, scen_file: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(scen_file), "--capture", "leaf0:1", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def _with_captures() -> dict[str, object]:
    d = sample_result()
    d["files"]["captures"] = ["out/capture-leaf0-1.pcap", "out/capture-leaf0-3.pcap"]  # type: ignore[index]
    d["files"]["capture_stats"] = [  # type: ignore[index]
        {"file": "out/capture-leaf0-1.pcap", "files": ["out/capture-leaf0-1.pcap"], "frames": 12345,
         "bytes": 52_300_000, "rotations": 0, "discarded": 0, "dropped": 0},
        {"file": "out/capture-leaf0-3.pcap", "files": ["out/capture-leaf0-3.pcap", "out/capture-leaf0-3.pcap.1"],
         "frames": 900, "bytes": 4700, "rotations": 3, "discarded": 1200, "dropped": 7},
    ]
    return d


def test_the_summary_says_each_captures_frames() -> None:
    d = _with_captures()
    assert validate(d) == []
    text = summary(d)
    assert "  capture  out/capture-leaf0-1.pcap  12,345 frames, 52.3 MB\n" in text
    assert ("  capture  out/capture-leaf0-3.pcap  900 frames, 4.7 kB in 2 files (out/capture-leaf0-3.pcap.1), "
            "rotated 3x, 1,200 older frames deleted, 7 dropped by the kernel\n") in text
    assert RunResult.from_dict(d).to_dict()["files"] == d["files"]


def test_capture_stats_are_optional_and_checked() -> None:
    d = sample_result()
    assert "capture_stats" not in d["files"] and validate(d) == []  # results written before them
    assert "capture_stats" not in RunResult.from_dict(d).to_dict()["files"]
    d = _with_captures()
    d["files"]["capture_stats"][0]["frames"] = -1  # type: ignore[index]
    del d["files"]["capture_stats"][1]["bytes"]  # type: ignore[index]
    problems = validate(d)
    assert any("files.capture_stats[0].frames" in p for p in problems), problems
    assert any("files.capture_stats[1].bytes: missing" in p for p in problems), problems
