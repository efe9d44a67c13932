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
_FILE_HDR = struct.Struct("<IHHiIII")
_REC_HDR = struct.Struct("<IIII")
_ERF_HDR = struct.Struct("<QBBHHH")  # ts (LE 32.32 fixed point), then type, flags; BE lengths


def _erf_header(ts_ns: int, length: int, interface: int) -> bytes:
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    ts = (seconds << 32) | ((ns << 32) // 1_000_000_000)
    rlen = ERF_HEADER_LEN + length
    # ERF keeps rlen/lctr/wlen big-endian; the timestamp is little-endian.
    return struct.pack("<Q", ts) + struct.pack(
        "!BBHHH", ERF_TYPE_INFINIBAND, 0x04 | (interface & 0x03), rlen, 0, length
    )


class PcapWriter:
    """Write packets to a pcap file; ``kind`` is ``"ib"`` (ERF/InfiniBand) or ``"eth"``.

    For ``"ib"``, ``write()`` takes either a bare native packet or an 0x88B5 Ethernet frame
    (its Ethernet header is dropped). Use as a context manager, or call ``close()``.
    """

    def __init__(self, path: str | os.PathLike[str], kind: str = "ib") -> None:
        if kind not in ("ib", "eth"):
            raise ValueError(f"capture kind must be 'ib' or 'eth', not {kind!r}")
        self.kind = kind
        self.path = Path(path)
        self._f: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        linktype = LINKTYPE_ERF if kind == "ib" else LINKTYPE_ETHERNET
        self._f.write(_FILE_HDR.pack(_PCAP_MAGIC_NS, 2, 4, 0, 0, _SNAPLEN, linktype))
        self.count = 0

    def write(self, data: bytes | bytearray | memoryview, ts_ns: int | None = None, interface: int = 0) -> None:
        if ts_ns is None:
            ts_ns = time.time_ns()
        payload = bytes(data)
        if self.kind == "ib":
            if len(payload) >= 14 and payload[12:14] == b"\x88\xb5":
                payload = payload[14:]
            payload = _erf_header(ts_ns, len(payload), interface) + payload
        seconds, ns = divmod(ts_ns, 1_000_000_000)
        self._f.write(_REC_HDR.pack(seconds, ns, len(payload), len(payload)))
        self._f.write(payload)
        self.count += 1

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> PcapWriter:
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
