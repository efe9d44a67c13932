"""``--capture`` on every fabric kind and datapath: the frames of a cable the flow crosses, on
a host's cable and between two switches, bounded (rotated at the size limit), and decoded by
tshark with no malformed frame."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from ibemu.kernel import netns
from ibemu.report import validate
from ibemu.scenario import loads_scenario
from ibemu.scenario.runner import ScenarioRun
from ibemu.wire.capture import CaptureBounds, read_pcap

pytestmark = [pytest.mark.root, pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")]

SCENARIO = """
name: pytest-capture
topology: {{generator: leaf-spine, leaves: 2, spines: 2, hosts_per_leaf: 2}}
fabric: {{kind: {kind}, datapath: {datapath}}}
traffic:
  - {{name: bulk, kind: write_bw, from: h0, to: h2, size: 64KiB}}
duration_s: 2
"""
HOST_END = "leaf0:1"  # h0's cable
UPLINKS = ("leaf0:3", "leaf0:4")  # to spine0 and spine1: the flow takes one of them
LIMIT = 2_000_000


def tshark(path: str) -> tuple[int, int]:
    """Frames tshark reads in ``path`` and how many of them it calls malformed."""
    out = subprocess.run(["tshark", "-n", "-r", path, "-d", "udp.port==4791,infiniband"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    return len(lines), sum("Malformed" in line for line in lines)


@pytest.mark.parametrize("kind, datapath", [("ib", "kernel"), ("ib", "user"), ("roce", "kernel"),
                                            ("roce", "user")])
def test_captures_hold_the_flows_frames(kind: str, datapath: str, state_dir: Path, tmp_path: Path) -> None:
    scen = loads_scenario(SCENARIO.format(kind=kind, datapath=datapath))
    runner = ScenarioRun(scen, tmp_path / "out", captures=[HOST_END, *UPLINKS],
                         capture_bounds=CaptureBounds(limit_bytes=LIMIT, files=2))
    result = trio.run(runner.run)
    assert validate(result) == []
    assert not [n for n in netns.list_names() if runner.state.run_id in n]
    assert next(t for t in result["traffic"] if t["name"] == "bulk")["bytes"] > 0
    stats = {s["file"]: s for s in result["files"]["capture_stats"]}
    assert list(stats) == result["files"]["captures"] == [
        str(tmp_path / "out" / f"capture-{e.replace(':', '-')}.pcap") for e in (HOST_END, *UPLINKS)]
    frames: dict[str, int] = {}
    for name, st in stats.items():
        assert len(st["files"]) <= 2 and all(Path(f).stat().st_size <= LIMIT for f in st["files"])
        on_disk = 0
        for f in st["files"]:
            n, malformed = tshark(f)
            assert malformed == 0, f"{f}: {malformed} of {n} frames malformed"
            assert n == len(list(read_pcap(f)))
            on_disk += n
        assert on_disk == st["frames"]
        frames[name] = st["frames"]
    host, *uplinks = frames.values()
    assert host > 100  # the bulk flow's data (and its acknowledgements) on h0's cable
    assert max(uplinks) > 100  # and on the uplink it took
    host_stats = stats[str(tmp_path / "out" / "capture-leaf0-1.pcap")]
    assert host_stats["rotations"] > 0 and host_stats["bytes"] > LIMIT  # bounded: rotated, not grown
    # IB recorded as ERF/InfiniBand records, RoCE as Ethernet frames: RoCEv2 in IPv4/UDP 4791
    records = list(read_pcap(host_stats["file"]))
    if kind == "ib":
        assert {r.erf_type for r in records} == {21}
    else:
        assert {r.linktype for r in records} == {1}
        assert any(r.data[12:14] == b"\x08\x00" and r.data[23] == 17 and r.data[36:38] == (4791).to_bytes(2, "big")
                   for r in records)
