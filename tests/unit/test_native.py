"""The link model's compiled twins (``ibemu.native``): where built they are what runs, they give
the trace digests the sources give, and ``IBEMU_NATIVE=0`` brings the sources back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ibemu import native
from tests.unit.physics.test_live_trace import BEFORE, trace

BUILT = all(native.extension(m) is not None for m in native.MODULES) and not native.stale()
ROOT = str(native.ROOT)

PLAY = """
import json, sys
from ibemu import native
from tests.unit.physics.test_live_trace import BEFORE, trace
print(json.dumps({"compiled": [m for m in native.MODULES if native.compiled(m)],
                  "digests": [[s, q, *trace(s, qos=q)] for s, q in sorted(BEFORE)]}))
"""


def _play(env: dict[str, str]) -> dict[str, list]:
    out = subprocess.run([sys.executable, "-c", PLAY], env={**os.environ, "PYTHONPATH": ROOT, **env},
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=120).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not BUILT, reason="the compiled twins are not built (make native) or are stale")
def test_built_twins_run_and_the_sources_give_the_same_digests() -> None:
    if os.environ.get("IBEMU_NATIVE") != "0":
        assert all(native.compiled(m) for m in native.MODULES), native.status()
        assert "compiled" in native.status()
    for s, q in sorted(BEFORE)[:2]:  # this process's modules (compiled unless IBEMU_NATIVE=0)
        assert trace(s, qos=q) == BEFORE[(s, q)]
    sources = _play({"IBEMU_NATIVE": "0"})
    assert sources["compiled"] == []
    assert {(s, q): (d, n) for s, q, d, n in sources["digests"]} == BEFORE
    compiled = _play({"IBEMU_NATIVE": "1"})
    assert compiled["compiled"] == list(native.MODULES)
    assert compiled["digests"] == sources["digests"]


def test_the_sources_run_where_asked() -> None:
    out = subprocess.run([sys.executable, "-c", "from ibemu import native; import ibemu.physics.live as m; "
                          "print(m.__file__, native.status())"],
                         env={**os.environ, "PYTHONPATH": ROOT, "IBEMU_NATIVE": "0"}, cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split()[0].endswith("live.py")
    assert "interpreted (IBEMU_NATIVE=0)" in out


@pytest.mark.skipif(not BUILT, reason="the compiled twins are not built (make native) or are stale")
def test_a_source_newer_than_the_build_runs_from_source(tmp_path: Path) -> None:
    """An edit after ``make native``: the sources run (all of the group), with a warning."""
    shutil.copytree(Path(ROOT) / "ibemu", tmp_path / "ibemu", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "bpf_src", "c_src"))
    src = tmp_path / "ibemu" / "physics" / "live.py"
    lib = native.group_library()
    assert lib is not None
    when = lib.stat().st_mtime + 10
    os.utime(src, (when, when))
    run = subprocess.run([sys.executable, "-c", "from ibemu import native; import ibemu.physics.live as l, "
                          "ibemu.physics.model as m; print(l.__file__, m.__file__); print(native.status())"],
                         env={**os.environ, "PYTHONPATH": str(tmp_path), "IBEMU_NATIVE": "1"}, cwd=tmp_path,
                         capture_output=True, text=True, check=True, timeout=60)
    files, status = run.stdout.splitlines()
    assert all(f.endswith(".py") for f in files.split()), files
    assert "ibemu.physics.live: make native" in status
    assert "older than ibemu.physics.live" in run.stderr
