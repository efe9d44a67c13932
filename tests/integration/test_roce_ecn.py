"""ECN marking in the kernel: a router port's virtual queue marks CE on a burst of ECN-capable
frames (IP checksum kept valid), drains with time, and never touches Not-ECT frames."""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from pathlib import Path

import pytest
import trio

from ibemu.kernel import bpf
from ibemu.kernel.ecn import EcnMarker, EcnMarking, marking_program
from ibemu.report import validate
from ibemu.scenario import load_scenario
from ibemu.scenario.runner import ScenarioRun

pytestmark = pytest.mark.root

TC_ACT_UNSPEC = -1


def _frame(tos: int, size: int = 1000) -> bytes:
    ip = bytearray(b"\x45" + bytes((tos,)) + struct.pack("!H", size - 14) + b"\x00\x00\x40\x00\x40\x11\x00\x00"
                   + bytes((198, 18, 0, 1, 198, 18, 0, 3)))
    ip[10:12] = struct.pack("!H", _csum(ip))
    return bytes(12) + b"\x08\x00" + bytes(ip) + bytes(size - 34)


def _csum(h: bytes | bytearray) -> int:
    s = sum(struct.unpack("!10H", bytes(h)))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def test_virtual_queue_marks_a_burst_and_drains() -> None:
    marker = EcnMarker(EcnMarking(mark_kb=8, line_gbps=1.0), [("ns", "port")])
    fd = bpf.load_program(marking_program(marker.ecn, marker.map.fd, 0), name="t_ecn")
    try:
        ret, out, _ = bpf.test_run(fd, _frame(0x02))
        assert ret == TC_ACT_UNSPEC and out[15] & 3 == 2  # one frame: queue far below 8 KiB
        time.sleep(0.01)
        ret, out, _ = bpf.test_run(fd, _frame(0x02), repeat=50)  # 50 KB back to back: beyond 8 KiB
        assert ret == TC_ACT_UNSPEC and out[15] & 3 == 3
        assert _csum(out[14:34]) == 0  # the checksum was fixed with the TOS byte
        queued = struct.unpack("=QQ", marker.map.lookup(bytes(4)) or b"")[1]
        assert queued > 8 * 1024
        _ret, out, _ = bpf.test_run(fd, _frame(0x00), repeat=50)  # Not-ECT: never marked
        assert out[15] & 3 == 0
        time.sleep(0.01)  # 10 ms at 1 Gb/s drains 1.25 MB
        _ret, out, _ = bpf.test_run(fd, _frame(0x02))
        assert out[15] & 3 == 2
    finally:
        os.close(fd)
        marker.close()


def test_the_control_loop_runs_on_a_live_fabric(state_dir: Path, tmp_path: Path) -> None:
    """compare-incast-ecn as RoCE, 3 s: routers mark, h0 answers with CNPs, the senders pace."""
    scen = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "compare-incast-ecn.yaml")
    scen = dataclasses.replace(scen, duration_s=3.0, faults=())
    result = trio.run(ScenarioRun(scen, tmp_path / "out").run)
    assert validate(result) == []
    x = result["traffic"][0]["extra"]
    assert "error" not in x and result["traffic"][0]["bytes"] > 0, x
    assert x["ce_received"] > 0 and x["cnp_sent"] > 0, x
    assert 0 < x["cnp_received"] <= x["cnp_sent"], x  # a CNP may be lost, never invented
    assert x["tx_paced"] > 0, x
