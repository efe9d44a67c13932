"""Bounded captures: the snap length, the size limit and the rotation (NAME, NAME.1, ...), and
what the capture says it holds."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from ibemu.wire.capture import ERF_HEADER_LEN, PcapWriter, RotatingPcap, read_pcap


def _frame(i: int, n: int = 100) -> bytes:
    return bytes([i]) * n


def test_rotation_keeps_the_newest_frames_in_files_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "c.pcap"
    (tmp_path / "c.pcap.7").write_bytes(b"stale")  # a previous run's: not this one's
    record = 16 + 100
    with RotatingPcap(path, "eth", limit_bytes=24 + 3 * record, files=3) as cap:
        for i in range(20):
            cap.write(_frame(i), ts_ns=i)
    st = cap.stats(dropped=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pcap", "c.pcap.1", "c.pcap.2"]
    assert st.files == [str(path), f"{path}.1", f"{path}.2"]
    assert [[r.data[0] for r in read_pcap(f)] for f in st.files] == [[18, 19], [15, 16, 17], [12, 13, 14]]
    assert all(Path(f).stat().st_size <= 24 + 3 * record for f in st.files)
    assert (st.frames, st.rotations, st.discarded, st.dropped) == (8, 6, 12, 5)
    assert st.bytes == sum(Path(f).stat().st_size for f in st.files)
    assert st.to_dict()["frames"] == 8


def test_one_file_starts_again_at_the_limit(tmp_path: Path) -> None:
    with RotatingPcap(tmp_path / "c.pcap", "eth", limit_bytes=24 + 2 * 116, files=1) as cap:
        for i in range(5):
            cap.write(_frame(i), ts_ns=i)
    assert [r.data[0] for r in read_pcap(tmp_path / "c.pcap")] == [4]
    assert list(tmp_path.iterdir()) == [tmp_path / "c.pcap"]
    assert (cap.stats().frames, cap.stats().discarded) == (1, 4)


def test_under_the_limit_nothing_rotates(tmp_path: Path) -> None:
    with RotatingPcap(tmp_path / "c.pcap", "eth") as cap:
        cap.write(_frame(1))
    st = cap.stats()
    assert (st.frames, st.rotations, st.files, st.bytes) == (1, 0, [str(tmp_path / "c.pcap")], 24 + 116)


def test_snaplen_cuts_records_and_keeps_the_wire_length(tmp_path: Path) -> None:
    eth = tmp_path / "e.pcap"
    with PcapWriter(eth, "eth", snaplen=64) as w:
        w.write(_frame(1, 1000), ts_ns=1, orig_len=1000)
    raw = eth.read_bytes()
    assert struct.unpack("<I", raw[16:20])[0] == 64  # the file header's snap length
    assert struct.unpack("<II", raw[32:40]) == (64, 1000)  # captured, on the wire
    ib = tmp_path / "i.pcap"
    with PcapWriter(ib, "ib", snaplen=20) as w:
        w.write(b"\x02" * 12 + b"\x88\xb5" + _frame(7, 200), ts_ns=1, orig_len=214)
    (rec,) = read_pcap(ib)
    assert rec.data == _frame(7, 20)
    raw = ib.read_bytes()
    assert struct.unpack("<II", raw[32:40]) == (ERF_HEADER_LEN + 20, ERF_HEADER_LEN + 200)
    assert struct.unpack("!H", raw[40 + 14:40 + 16])[0] == 200  # ERF wlen: the packet's length


def test_bad_bounds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        PcapWriter(tmp_path / "a.pcap", "eth", snaplen=0)
    with pytest.raises(ValueError):
        RotatingPcap(tmp_path / "b.pcap", "eth", files=0)
    with pytest.raises(ValueError):
        RotatingPcap(tmp_path / "c.pcap", "eth", limit_bytes=10)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_tshark_reads_every_rotated_file(tmp_path: Path) -> None:
    frame = bytes.fromhex("020000000001020000000002") + b"\x08\x06" + bytes(28)  # an ARP frame
    with RotatingPcap(tmp_path / "c.pcap", "eth", limit_bytes=24 + 3 * (16 + len(frame)), files=2) as cap:
        for i in range(7):
            cap.write(frame, ts_ns=i)
    for f in cap.stats().files:
        out = subprocess.run(["tshark", "-r", f], capture_output=True, text=True, timeout=60, check=True).stdout
        assert out.count("ARP") == len(list(read_pcap(f))) > 0 and "Malformed" not in out
