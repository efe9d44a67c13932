"""pcap capture files that Wireshark / tshark decode.

Native IB packets are written as ERF records (pcap link type 197, ERF type 21 = InfiniBand,
each record LRH .. VCRC): Wireshark 4.0 rejects link type 247. RoCEv2 (and any Ethernet
frame) is written as a plain Ethernet pcap (link type 1). Timestamps are nanoseconds.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from ibemu.errors import DecodeError

LINKTYPE_ETHERNET = 1
LINKTYPE_ERF = 197
ERF_TYPE_INFINIBAND = 21
ERF_HEADER_LEN = 16
_PCAP_MAGIC_NS = 0xA1B23C4D
_PCAP_MAGIC_US = 0xA1B2C3D4
_SNAPLEN = 65535
MAX_FRAME = 9216
"""The largest frame a cable carries (a jumbo frame): the default snap length of a capture."""
FILE_HEADER_LEN = 24
RECORD_HEADER_LEN = 16
_FILE_HDR = struct.Struct("<IHHiIII")
_REC_HDR = struct.Struct("<IIII")
_ERF_HDR = struct.Struct("<QBBHHH")  # ts (LE 32.32 fixed point), then type, flags; BE lengths


def _erf_header(ts_ns: int, length: int, interface: int, *, wlen: int | None = None) -> bytes:
    """``length``: the packet bytes in the record; ``wlen``: its length on the wire."""
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    ts = (seconds << 32) | ((ns << 32) // 1_000_000_000)
    rlen = ERF_HEADER_LEN + length
    # ERF keeps rlen/lctr/wlen big-endian; the timestamp is little-endian.
    return struct.pack("<Q", ts) + struct.pack(
        "!BBHHH", ERF_TYPE_INFINIBAND, 0x04 | (interface & 0x03), rlen, 0, length if wlen is None else wlen
    )


class PcapWriter:
    """Write packets to a pcap file; ``kind`` is ``"ib"`` (ERF/InfiniBand) or ``"eth"``.

    For ``"ib"``, ``write()`` takes either a bare native packet or an 0x88B5 Ethernet frame
    (its Ethernet header is dropped). Use as a context manager, or call ``close()``.
    """

    def __init__(self, path: str | os.PathLike[str], kind: str = "ib", *, snaplen: int = _SNAPLEN) -> None:
        if kind not in ("ib", "eth"):
            raise ValueError(f"capture kind must be 'ib' or 'eth', not {kind!r}")
        if snaplen < 1:
            raise ValueError(f"snaplen must be at least 1 byte, not {snaplen}")
        self.kind = kind
        self.path = Path(path)
        self.snaplen = snaplen
        self._f: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        linktype = LINKTYPE_ERF if kind == "ib" else LINKTYPE_ETHERNET
        # ERF records carry a 16-byte header of their own ahead of the packet's bytes
        file_snaplen = snaplen + (ERF_HEADER_LEN if kind == "ib" else 0)
        self._f.write(_FILE_HDR.pack(_PCAP_MAGIC_NS, 2, 4, 0, 0, file_snaplen, linktype))
        self.count = 0
        self.size = FILE_HEADER_LEN
        """Bytes written to the file so far."""

    def record_size(self, length: int) -> int:
        """The bytes a ``length``-byte frame takes in the file (its record header included)."""
        extra = ERF_HEADER_LEN if self.kind == "ib" else 0
        return RECORD_HEADER_LEN + extra + min(length, self.snaplen)

    def write(self, data: bytes | bytearray | memoryview, ts_ns: int | None = None, interface: int = 0,
              *, orig_len: int | None = None) -> int:
        """Append one record; ``orig_len``: the frame's length on the wire when ``data`` is
        already cut short. Returns the bytes written."""
        if ts_ns is None:
            ts_ns = time.time_ns()
        payload = bytes(data)
        wire = max(orig_len or 0, len(payload))
        if self.kind == "ib" and len(payload) >= 14 and payload[12:14] == b"\x88\xb5":
            payload = payload[14:]
            wire -= 14
        payload = payload[:self.snaplen]
        if self.kind == "ib":
            payload = _erf_header(ts_ns, len(payload), interface, wlen=wire) + payload
            wire += ERF_HEADER_LEN
        seconds, ns = divmod(ts_ns, 1_000_000_000)
        self._f.write(_REC_HDR.pack(seconds, ns, len(payload), wire))
        self._f.write(payload)
        self.count += 1
        n = RECORD_HEADER_LEN + len(payload)
        self.size += n
        return n

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


DEFAULT_LIMIT_MB = 100
DEFAULT_FILES = 2


@dataclass(frozen=True)
class CaptureBounds:
    """How much a capture keeps: ``snaplen`` bytes a frame, ``limit_bytes`` a file, ``files`` files
    (the default run keeps at most 200 MB a captured cable end)."""

    snaplen: int = MAX_FRAME
    limit_bytes: int = DEFAULT_LIMIT_MB * 1_000_000
    files: int = DEFAULT_FILES


@dataclass
class CaptureStats:
    """What one bounded capture holds: frames and bytes in its files, and what it lost."""

    path: str
    files: list[str]
    """The files on disk, newest first: ``path``, ``path.1``, ..."""
    frames: int = 0
    """Frames in ``files``."""
    bytes: int = 0
    """Bytes of ``files`` (headers included)."""
    rotations: int = 0
    discarded: int = 0
    """Frames in files deleted by the rotation (older than ``files``)."""
    dropped: int = 0
    """Frames the kernel dropped before the capture read them (its socket buffer full)."""

    def to_dict(self) -> dict[str, object]:
        return {"file": self.path, "files": list(self.files), "frames": self.frames, "bytes": self.bytes,
                "rotations": self.rotations, "discarded": self.discarded, "dropped": self.dropped}


class RotatingPcap:
    """A pcap capture bounded to ``files`` files of at most ``limit_bytes`` each (tcpdump's
    ``-C``/``-W``); the newest frames are in ``path``, older ones in ``path.1``, ``path.2``..."""

    def __init__(self, path: str | os.PathLike[str], kind: str = "ib", *, snaplen: int = MAX_FRAME,
                 limit_bytes: int = 100_000_000, files: int = 2) -> None:
        if limit_bytes < FILE_HEADER_LEN + RECORD_HEADER_LEN + 1:
            raise ValueError(f"a capture file's limit must hold a record, not {limit_bytes} bytes")
        if files < 1:
            raise ValueError(f"a capture keeps at least one file, not {files}")
        self.path = Path(path)
        self.kind = kind
        self.snaplen = snaplen
        self.limit_bytes = limit_bytes
        self.max_files = files
        self._frames: list[int] = []
        """Frames of each closed file on disk, newest first (``path.1``, ``path.2``...)."""
        self._sizes: list[int] = []
        self.rotations = 0
        self.discarded = 0
        for stale in self._rotated():  # a previous run's rotated files must not look like this one's
            stale.unlink(missing_ok=True)
        self.writer = PcapWriter(self.path, kind, snaplen=snaplen)

    def _name(self, i: int) -> Path:
        return self.path if i == 0 else self.path.with_name(f"{self.path.name}.{i}")

    def _rotated(self) -> list[Path]:
        return sorted(self.path.parent.glob(self.path.name + ".*"))

    def write(self, data: bytes | bytearray | memoryview, ts_ns: int | None = None, *,
              orig_len: int | None = None) -> None:
        w = self.writer
        if w.count and w.size + w.record_size(max(orig_len or 0, len(data))) > self.limit_bytes:
            self._rotate()
        self.writer.write(data, ts_ns, orig_len=orig_len)

    def _rotate(self) -> None:
        self.writer.close()
        self._frames.insert(0, self.writer.count)
        self._sizes.insert(0, self.writer.size)
        keep = self.max_files - 1
        while len(self._frames) > keep:  # the oldest goes (the file of _frames[i] is _name(i))
            self._name(len(self._frames) - 1).unlink(missing_ok=True)
            self.discarded += self._frames.pop()
            self._sizes.pop()
        for i in range(len(self._frames) - 1, -1, -1):
            self._name(i).replace(self._name(i + 1))
        self.rotations += 1
        self.writer = PcapWriter(self.path, self.kind, snaplen=self.snaplen)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def stats(self, dropped: int = 0) -> CaptureStats:
        return CaptureStats(str(self.path), [str(self._name(i)) for i in range(len(self._frames) + 1)],
                            frames=self.writer.count + sum(self._frames),
                            bytes=self.writer.size + sum(self._sizes), rotations=self.rotations,
                            discarded=self.discarded, dropped=dropped)

    def __enter__(self) -> RotatingPcap:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class CaptureRecord:
    ts_ns: int
    linktype: int
    data: bytes  # the native IB packet for ERF/InfiniBand records, else the link-layer frame
    erf_type: int | None = None


def read_pcap(path: str | os.PathLike[str]) -> Iterator[CaptureRecord]:
    """Records of a pcap file (us or ns, either byte order); ERF records are unwrapped."""
    with open(path, "rb") as f:
        hdr = f.read(24)
        if len(hdr) < 24:
            raise DecodeError(f"{path}: not a pcap file (only {len(hdr)} bytes)")
        magic_le = struct.unpack("<I", hdr[:4])[0]
        if magic_le in (_PCAP_MAGIC_US, _PCAP_MAGIC_NS):
            endian = "<"
            magic = magic_le
        else:
            magic = struct.unpack(">I", hdr[:4])[0]
            endian = ">"
            if magic not in (_PCAP_MAGIC_US, _PCAP_MAGIC_NS):
                raise DecodeError(f"{path}: bad pcap magic {hdr[:4].hex()}")
        scale = 1 if magic == _PCAP_MAGIC_NS else 1000
        linktype = struct.unpack(endian + "I", hdr[20:24])[0] & 0xFFFF
        rec = struct.Struct(endian + "IIII")
        index = 0
        while True:
            rh = f.read(16)
            if not rh:
                return
            index += 1
            if len(rh) < 16:
                raise DecodeError(f"{path}: record {index}: truncated record header")
            sec, frac, incl, _orig = rec.unpack(rh)
            data = f.read(incl)
            if len(data) < incl:
                raise DecodeError(f"{path}: record {index}: truncated ({len(data)} of {incl} bytes)")
            ts = sec * 1_000_000_000 + frac * scale
            if linktype == LINKTYPE_ERF:
                if len(data) < ERF_HEADER_LEN:
                    raise DecodeError(f"{path}: record {index}: ERF header truncated")
                erf_type = data[8] & 0x7F
                wlen = struct.unpack("!H", data[14:16])[0]
                body = data[ERF_HEADER_LEN:]
                yield CaptureRecord(ts, linktype, body[:wlen] if wlen <= len(body) else body, erf_type)
            else:
                yield CaptureRecord(ts, linktype, data)
