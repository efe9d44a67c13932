"""Memory regions: ``bytearray`` buffers with an lkey, an rkey, access flags and a VA base."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntFlag


class Access(IntFlag):
    """Access rights of a memory region (the ibv_access_flags that matter here)."""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4


@dataclass(slots=True, eq=False)
class MemoryRegion:
    """``buf`` registered at virtual addresses ``addr .. addr + len(buf)``."""

    buf: bytearray
    addr: int
    lkey: int
    rkey: int
    access: Access
    bits: int = 0  # int(access), for the data path (IntFlag operators are slow)

    def __post_init__(self) -> None:
        self.bits = int(self.access)

    @property
    def length(self) -> int:
        return len(self.buf)

    def offset(self, va: int, length: int) -> int | None:
        """Offset of ``va`` in ``buf`` when ``[va, va + length)`` lies inside, else None."""
        off = va - self.addr
        if off < 0 or off + length > len(self.buf):
            return None
        return off


@dataclass(frozen=True, slots=True)
class Sge:
    """A scatter/gather element: ``length`` bytes at ``addr`` of the region with ``lkey``."""

    addr: int
    length: int
    lkey: int


Segment = tuple[bytearray, int, int]
"""A resolved SGE: (buffer, offset, length)."""


class MrTable:
    """The regions of one HCA (a single protection domain), indexed by lkey and rkey."""

    __slots__ = ("_by_lkey", "_by_rkey", "_next")

    def __init__(self) -> None:
        self._by_lkey: dict[int, MemoryRegion] = {}
        self._by_rkey: dict[int, MemoryRegion] = {}
        self._next = 1

    def register(self, buf: bytearray, access: Access, addr: int | None = None) -> MemoryRegion:
        n = self._next
        self._next += 1
        lkey = (n << 8) | 0x11
        rkey = (n << 8) | 0x22
        mr = MemoryRegion(buf, n << 32 if addr is None else addr, lkey, rkey, Access(access))
        self._by_lkey[lkey] = mr
        self._by_rkey[rkey] = mr
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        self._by_lkey.pop(mr.lkey, None)
        self._by_rkey.pop(mr.rkey, None)

    def remote(self, rkey: int, va: int, length: int, need: int) -> tuple[MemoryRegion, int] | None:
        """(region, offset) for a remote access, or None: unknown rkey, no right, out of range."""
        mr = self._by_rkey.get(rkey)
        if mr is None or not mr.bits & need:
            return None
        off = va - mr.addr
        if off < 0 or off + length > len(mr.buf):
            return None
        return mr, off

    def resolve(self, sges: Sequence[Sge], *, write: bool) -> list[Segment]:
        """Check local SGEs (lkey, range, LOCAL_WRITE when the HCA writes into them)."""
        if len(sges) == 1:  # the common case, without the loop
            s = sges[0]
            mr = self._by_lkey.get(s.lkey)
            if mr is not None and (not write or mr.bits & 1):
                off = s.addr - mr.addr
                if off >= 0 and off + s.length <= len(mr.buf):
                    return [(mr.buf, off, s.length)]
        out: list[Segment] = []
        for s in sges:
            mr = self._by_lkey.get(s.lkey)
            if mr is None:
                raise ValueError(f"unknown lkey {s.lkey:#x}")
            if write and not mr.access & Access.LOCAL_WRITE:
                raise ValueError(f"region {s.lkey:#x} has no LOCAL_WRITE access")
            where = mr.offset(s.addr, s.length)
            if where is None:
                raise ValueError(f"SGE {s.addr:#x}+{s.length} is outside region {s.lkey:#x}")
            out.append((mr.buf, where, s.length))
        return out


def gather(segs: Sequence[Segment]) -> bytes | memoryview:
    """The bytes of ``segs`` in order: a view of the region for one SGE (read again at each
    (re)transmission, as an HCA's DMA does), a copy taken at post time for several."""
    if len(segs) == 1:
        buf, off, n = segs[0]
        return memoryview(buf)[off : off + n]
    return b"".join(bytes(memoryview(b)[o : o + n]) for b, o, n in segs)


def capacity(segs: Sequence[Segment]) -> int:
    return sum(n for _b, _o, n in segs)


def scatter(segs: Sequence[Segment], at: int, data: bytes | memoryview) -> None:
    """Write ``data`` at byte ``at`` of the concatenation of ``segs`` (caller checks the fit)."""
    if len(segs) == 1:
        buf, off, _n = segs[0]
        buf[off + at : off + at + len(data)] = data
        return
    pos = 0
    for buf, off, n in segs:
        if not data:
            return
        if at < n:
            take = min(n - at, len(data))
            buf[off + at : off + at + take] = data[:take]
            data = data[take:]
            at = 0
        else:
            at -= n
        pos += n
