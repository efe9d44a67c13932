"""`ibemu demo` builds, captures and decodes frames (the README's main command for now)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.cli.main import main
from ibemu.wire import decode_frame, decode_native, read_pcap


def test_demo_writes_decodable_captures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "-o", str(tmp_path), "--no-tshark", "--no-live"]) == 0
    native = [r.data for r in read_pcap(tmp_path / "demo-native.pcap")]
    roce = [r.data for r in read_pcap(tmp_path / "demo-roce.pcap")]
    assert len(native) == 7 and len(roce) == 1
    for pkt in native:
        decode_native(pkt)
    decode_frame(roce[0])
    assert "SubnTrap" not in capsys.readouterr().err


def test_demo_with_tshark(tmp_path: Path, tshark: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "-o", str(tmp_path), "--no-live"]) == 0
    out = capsys.readouterr().out
    assert "SubnTrap(Notice)" in out and "PSN Sequence Error" in out and "RRoCE" in out


def test_unknown_command_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
