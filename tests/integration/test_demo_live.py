"""`sudo make run`'s live part: OpenSM brings up the default fabric, a cut cable is rerouted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ibemu.cli.main import main
from ibemu.fabric.demo import live_demo_available

pytestmark = [pytest.mark.root, pytest.mark.skipif(live_demo_available() is not None,
                                                   reason=f"live demo unavailable: {live_demo_available()}")]


def test_live_demo_end_to_end(state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "-o", str(tmp_path), "--no-tshark"]) == 0
    out = capsys.readouterr().out
    assert "reached SUBNET UP" in out
    assert "ibnetdiscover on h5: 20 switches, 16 CAs" in out
    path_before = re.search(r"ibtracert h1 .*?: (.*)$", out, re.M).group(1)  # type: ignore[union-attr]
    path_after = re.search(r"ibtracert now: (.*)$", out, re.M).group(1)  # type: ignore[union-attr]
    assert path_before.count("->") == 4 and path_after.count("->") == 4 and path_before != path_after
    assert out.count(": 1000 delivered") == 2
    assert "torn down" in out
