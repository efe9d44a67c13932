"""Seeded mutations of valid frames, for the fuzz campaign (``benchmarks/bench_fuzz.py``) and
the small fuzz tests that keep its findings fixed (``tests/unit/test_fuzz_surfaces.py``).

``Mutator.mutate(frame)`` returns a mutated copy, whether a port cannot accept it at the link
layer (``link_bad``: a single bit flipped and the CRCs left, a truncation, an extension, a
wrong CRC byte, a PktLen that does not match: a real port counts it in PortRcvErrors) and what
was done. Field-aware mutations (LRH, BTH, DETH, MAD header, SMP fields: versions, class,
method, status, attribute ids and modifiers, M_Key, hop pointers and counts around their
bounds, initial and return paths) are resealed with good CRCs, so that they get past the CRC
checks to the layers behind them. A single flipped bit is always link-bad: every CRC with
more than one term catches a single-bit error.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable

from ibemu.wire import crc as _crc
from ibemu.wire.madpacket import MAD_OFFSET, reseal


def seal(buf: bytearray) -> bytes:
    """Good ICRC and VCRC for a native packet of any length (LRH without GRH)."""
    n = len(buf)
    if n == 290:
        return reseal(buf)
    if n < 20:
        return bytes(buf)
    masked = bytes((buf[0] | 0xF0,)) + bytes(buf[1:12]) + b"\xff"
    struct.pack_into("<I", buf, n - 6, zlib.crc32(bytes(buf[13:n - 6]), zlib.crc32(masked)))
    struct.pack_into("<H", buf, n - 2, _crc.vcrc_calc(bytes(buf[: n - 2])))
    return bytes(buf)


FIELDS: tuple[tuple[int, int], ...] = (
    # (offset, width) in a native MAD packet: LRH, BTH, DETH, MAD header, SMP fields
    (0, 1), (1, 1), (2, 2), (6, 2),                      # VL/LVer, SL/LNH, DLID, SLID
    (8, 1), (9, 1), (10, 2), (13, 3), (17, 3),           # opcode, SE/M/pad/TVer, P_Key, DestQP, PSN
    (20, 4), (25, 3),                                     # Q_Key, SrcQP
    (MAD_OFFSET + 0, 1), (MAD_OFFSET + 1, 1), (MAD_OFFSET + 2, 1), (MAD_OFFSET + 3, 1),  # versions, class, method
    (MAD_OFFSET + 4, 2), (MAD_OFFSET + 6, 1), (MAD_OFFSET + 7, 1),  # status (D bit), hop pointer, hop count
    (MAD_OFFSET + 16, 2), (MAD_OFFSET + 20, 4), (MAD_OFFSET + 24, 8),  # attribute id, modifier, M_Key
    (MAD_OFFSET + 32, 2), (MAD_OFFSET + 34, 2),          # DR SLID, DR DLID
    (MAD_OFFSET + 64, 4), (MAD_OFFSET + 70, 2), (MAD_OFFSET + 96, 4),  # attribute data
    (MAD_OFFSET + 129, 1), (MAD_OFFSET + 130, 1), (MAD_OFFSET + 191, 1),  # initial path
    (MAD_OFFSET + 193, 1), (MAD_OFFSET + 194, 1),        # return path
)
ATTR_IDS = (0x0001, 0x0002, 0x0010, 0x0011, 0x0012, 0x0014, 0x0015, 0x0016, 0x0017, 0x0018, 0x0019,
            0x001A, 0x001B, 0x0020, 0x0030, 0xFF00, 0xFF01, 0x7777, 0xFFFF, 0x0000)


class Mutator:
    """Seeded mutations of a valid frame; ``link_bad`` tells whether the result cannot pass a
    port's CRC/length checks (so a port must count it in PortRcvErrors or its equivalent)."""

    def __init__(self, rng: random.Random, fields: tuple[tuple[int, int], ...] = FIELDS,
                 sealer: Callable[[bytearray], bytes] = seal) -> None:
        self.rng = rng
        self.fields = fields
        self.seal = sealer

    def value(self, width: int, old: int, off: int) -> int:
        r = self.rng
        top = (1 << (8 * width)) - 1
        if off == MAD_OFFSET + 16 and r.random() < 0.5:
            return r.choice(ATTR_IDS)
        if off in (MAD_OFFSET + 6, MAD_OFFSET + 7):  # hop pointer / count: around the bounds
            return r.choice((0, 1, 2, 3, 62, 63, 64, 65, 127, 128, 254, 255, old + 1, old - 1)) & 0xFF
        return r.choice((0, 1, 2, top, top - 1, top >> 1, (top >> 1) + 1, old ^ 1, (old + 1) & top,
                         (old - 1) & top, r.getrandbits(8 * width), old ^ (1 << r.randrange(8 * width))))

    def mutate(self, frame: bytes) -> tuple[bytes, bool, str]:
        """(mutated frame, link_bad, what)."""
        r = self.rng
        k = r.random()
        n = len(frame)
        if k < 0.15:  # one bit flipped, not resealed: every CRC-16 catches a single bit error
            buf = bytearray(frame)
            bit = r.randrange(n * 8)
            buf[bit >> 3] ^= 1 << (bit & 7)
            return bytes(buf), True, "bit flip"
        if k < 0.22:
            return frame[: r.randrange(0, n)], True, "truncated"
        if k < 0.29:
            return frame + bytes(r.getrandbits(8) for _ in range(r.choice((1, 2, 3, 4, 5, 64, 300)))), True, "extended"
        if k < 0.34:  # a CRC byte wrong
            buf = bytearray(frame)
            buf[r.choice((n - 1, n - 2, n - 3, n - 6))] ^= 1 << r.randrange(8)
            return bytes(buf), True, "bad CRC"
        if k < 0.38:  # PktLen that does not match, CRCs good
            buf = bytearray(frame)
            words = ((buf[4] & 7) << 8 | buf[5]) + r.choice((-2, -1, 1, 2, 100))
            buf[4], buf[5] = (buf[4] & 0xF8) | ((words >> 8) & 7), words & 0xFF
            return self.seal(buf), ((buf[4] & 7) << 8 | buf[5]) * 4 + 2 != n, "PktLen"
        buf = bytearray(frame)
        for _ in range(r.choice((1, 1, 1, 2, 3))):  # field-aware, resealed
            off, width = r.choice(self.fields)
            if off + width > len(buf) - 6 or off in (4,):
                continue
            old = int.from_bytes(buf[off:off + width], "big")
            buf[off:off + width] = self.value(width, old, off).to_bytes(width, "big")
        return self.seal(buf), False, "fields"
