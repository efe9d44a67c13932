"""ibemu.mininet.IbemuNet on a live fabric: a Mininet topology run by ibemu, driven like Mininet."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ibemu.errors import ConfigError
from ibemu.kernel import ownership
from ibemu.mininet import IbemuNet, topos

pytestmark = pytest.mark.root


def test_ibemunet_start_cmd_link_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBEMU_STATE_DIR", str(tmp_path / "state"))  # for the ibemu subprocesses
    monkeypatch.setattr(ownership, "STATE_DIR", tmp_path / "state")  # for the control socket path
    net = IbemuNet(topos["ibleafspine"](2, 2, 2), sm="ibemu")
    net.start()
    try:
        run_id = net.run_id
        assert run_id and "leaf0-1" in net.get("leaf0").cmd("ip -br link")
        reply = net.configLinkStatus("leaf0", "spine1", "down")
        assert reply["ok"], reply
        assert "DOWN" in net.get("spine1").cmd("ip -br link show dev", "spine1-1")
        assert net.configSwitchStatus("spine0", "down")["ok"]
        with pytest.raises(ConfigError, match="up or down"):
            net.configLinkStatus("leaf0", "spine1", "sideways")
    finally:
        net.stop()
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if f"ibemu-{run_id}-" in n]
