"""eBPF without a compiler: the bpf() syscall through ctypes and a small bytecode assembler.

Enough for the programs ibemu loads itself (``ibemu.kernel.dr_relay``): array and hash maps,
a SCHED_CLS program written with ``Asm``, used as a cls_bpf filter (``tc_netlink``), and
BPF_PROG_TEST_RUN to try it on a packet. (A TCX link per interface would also work, but
every attach and detach waits for an RCU grace period under the RTNL lock: ~10 ms per port,
seconds for a fabric.) Encodings: linux/bpf.h, linux/bpf_common.h. Every object is a file
descriptor owned by this process; a filter using a program keeps it alive.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ibemu.kernel.commands import KernelError

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280, "ppc64le": 361,
            "s390x": 351, "armv7l": 386, "i686": 357}
SYS_BPF = _SYS_BPF.get(os.uname().machine, 321)
"""bpf(2)'s number on this machine's architecture (asm/unistd.h); x86_64's where unknown."""

BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_PROG_LOAD = 5
BPF_PROG_TEST_RUN = 10
BPF_MAP_GET_NEXT_ID = 12
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_UPDATE_BATCH = 26
ENOTSUPP = 524
"""What bpf(2) returns for a command the map type lacks (the kernel's own errno, not ENOTSUP)."""

T = TypeVar("T")

BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PROG_ARRAY = 3
BPF_MAP_TYPE_ARRAY_OF_MAPS = 12
BPF_MAP_TYPE_RINGBUF = 27
BPF_F_NO_PREALLOC = 1
BPF_F_MMAPABLE = 1 << 10
BPF_PROG_TYPE_SCHED_CLS = 3

TC_ACT_UNSPEC = -1  # direct action: go on with the next filter
TC_ACT_OK = 0
TC_ACT_SHOT = 2
TC_ACT_REDIRECT = 7

FN_MAP_LOOKUP_ELEM = 1
FN_REDIRECT = 23

# __sk_buff fields
SKB_LEN = 0
SKB_IFINDEX = 40
SKB_CB = 48
SKB_DATA = 76
SKB_DATA_END = 80

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc_held = ctypes.PyDLL(None, use_errno=True)
"""The same C library, called without releasing the GIL: for a short system call on a path
that must not queue for the GIL again half-way (``Map.update(hold_gil=True)``)."""
_libc_held.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: bytes | bytearray) -> int:
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    ret = _libc.syscall(SYS_BPF, cmd, buf, len(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return int(ret)


def _bpf_buf(cmd: int, attr: ctypes.Array[ctypes.c_char], *, hold_gil: bool = False) -> int:
    """``_bpf`` on an attr buffer the caller keeps (a hot path's update: no copies)."""
    ret = (_libc_held if hold_gil else _libc).syscall(SYS_BPF, cmd, attr, len(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({cmd}): {os.strerror(err)}")
    return int(ret)


def _addr(buf: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.addressof(buf)


class Map:
    """A BPF map: ``update(key, value)`` with raw bytes, ``lookup``, ``delete``."""

    def __init__(self, map_type: int, key_size: int, value_size: int, max_entries: int,
                 name: str = "", *, flags: int = 0, inner_map_fd: int = 0) -> None:
        # map_type, key_size, value_size, max_entries, map_flags, inner_map_fd, numa_node, name
        attr = struct.pack("=7I", map_type, key_size, value_size, max_entries, flags, inner_map_fd, 0)
        attr = (attr + name.encode()[:15].ljust(16, b"\0")).ljust(128, b"\0")
        self.fd = _bpf(BPF_MAP_CREATE, attr)
        self.map_type, self.max_entries, self.flags = map_type, max_entries, flags
        self.key_size, self.value_size = key_size, value_size
        self._update_lock = threading.Lock()
        self._update_bufs: tuple[ctypes.Array[ctypes.c_char], ...] | None = None
        self._no_batch = False

    def update(self, key: bytes, value: bytes, *, hold_gil: bool = False) -> None:
        """``hold_gil``: the system call keeps the GIL (a thread that has just got it after a
        wait does not give it up again half-way; the update takes microseconds)."""
        if len(key) != self.key_size or len(value) != self.value_size:
            raise ValueError("key/value size does not match the map")
        # one set of buffers per map, its attr packed once: an agent republishing its images
        # updates thousands of entries in a bring-up (a lock: worker threads update too)
        with self._update_lock:
            bufs = self._update_bufs
            if bufs is None:
                k = ctypes.create_string_buffer(max(1, self.key_size))
                v = ctypes.create_string_buffer(max(1, self.value_size))
                attr = ctypes.create_string_buffer(
                    struct.pack("=IIQQQ", self.fd, 0, _addr(k), _addr(v), 0).ljust(128, b"\0"), 128)
                bufs = self._update_bufs = (k, v, attr)
            k, v, attr = bufs
            ctypes.memmove(k, key, len(key))
            ctypes.memmove(v, value, len(value))
            _bpf_buf(BPF_MAP_UPDATE_ELEM, attr, hold_gil=hold_gil)

    def update_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Update every ``(key, value)`` of ``items``, in order, with one system call
        (``BPF_MAP_UPDATE_BATCH``, Linux 5.6; ~0.4 us an entry against ~3.6 us for an
        ``update`` each). The GIL is kept for the call. A kernel without batch updates for
        this map type gets one ``update`` each."""
        if len(items) <= 1 or self._no_batch:
            for key, value in items:
                self.update(key, value, hold_gil=True)
            return
        ks, vs = self.key_size, self.value_size
        if any(len(k) != ks or len(v) != vs for k, v in items):
            raise ValueError("key/value size does not match the map")
        keys = ctypes.create_string_buffer(b"".join(k for k, _v in items), len(items) * ks)
        values = ctypes.create_string_buffer(b"".join(v for _k, v in items), len(items) * vs)
        # struct bpf_attr.batch: in_batch, out_batch, keys, values, count, map_fd, elem_flags, flags
        attr = ctypes.create_string_buffer(
            struct.pack("=QQQQIIQQ", 0, 0, _addr(keys), _addr(values), len(items), self.fd, 0, 0).ljust(128, b"\0"),
            128)
        try:
            _bpf_buf(BPF_MAP_UPDATE_BATCH, attr, hold_gil=True)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, ENOTSUPP):
                raise
            done = struct.unpack_from("=I", attr, 32)[0]  # count: how many it did before failing
            self._no_batch = True
            for key, value in items[done:]:
                self.update(key, value, hold_gil=True)

    @property
    def id(self) -> int:
        """The kernel's id of this map (``map_ids``): it outlives this descriptor while a
        loaded program holds the map."""
        return int(struct.unpack_from("=I", _map_info(self.fd), 4)[0])

    def lookup(self, key: bytes) -> bytes | None:
        k = ctypes.create_string_buffer(key, len(key))
        v = ctypes.create_string_buffer(self.value_size)
        try:
            _bpf(BPF_MAP_LOOKUP_ELEM, struct.pack("=IIQQQ", self.fd, 0, _addr(k), _addr(v), 0).ljust(128, b"\0"))
        except FileNotFoundError:
            return None
        return v.raw

    def delete(self, key: bytes) -> bool:
        k = ctypes.create_string_buffer(key, len(key))
        try:
            _bpf(BPF_MAP_DELETE_ELEM, struct.pack("=IIQ", self.fd, 0, _addr(k)).ljust(128, b"\0"))
        except FileNotFoundError:
            return False
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RingBuffer:
    """The consumer side of a ``BPF_MAP_TYPE_RINGBUF`` map (``bpf_ringbuf_output`` in a
    program): the consumer position page mapped read-write, the producer position page and
    the data area (mapped twice by the kernel, so a record never wraps) read-only. ``fd``
    polls readable when records wait; :meth:`read` returns the committed ones in order and
    frees their space. One consumer per map."""

    BUSY = 1 << 31
    DISCARD = 1 << 30
    HEADER = 8

    def __init__(self, ring: Map) -> None:
        if ring.map_type != BPF_MAP_TYPE_RINGBUF:
            raise ValueError("not a ring buffer map")
        page = mmap.PAGESIZE
        self.fd, self._page, self._mask = ring.fd, page, ring.max_entries - 1
        self._cons = mmap.mmap(ring.fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            self._data = mmap.mmap(ring.fd, page + 2 * ring.max_entries, mmap.MAP_SHARED, mmap.PROT_READ,
                                   offset=page)
        except BaseException:
            self._cons.close()
            raise

    def read(self) -> list[bytes]:
        cons = struct.unpack_from("=Q", self._cons, 0)[0]
        prod = struct.unpack_from("=Q", self._data, 0)[0]
        out: list[bytes] = []
        while cons < prod:
            at = self._page + (cons & self._mask)
            word = struct.unpack_from("=I", self._data, at)[0]
            if word & self.BUSY:
                break  # reserved, not committed yet: the records after it wait too
            length = word & ~(self.BUSY | self.DISCARD)
            if not word & self.DISCARD:
                out.append(self._data[at + self.HEADER:at + self.HEADER + length])
            cons += (length + self.HEADER + 7) & ~7
        struct.pack_into("=Q", self._cons, 0, cons)
        return out

    def close(self) -> None:
        self._data.close()
        self._cons.close()


class RecordRing(Generic[T]):
    """A reader of a ring buffer whose records are of one kind: ``fd`` polls readable when
    records wait; :meth:`read` returns them parsed (``parse``), those shorter than ``size``
    left out."""

    def __init__(self, ring: Map, size: int, parse: Callable[[bytes], T]) -> None:
        self._ring = RingBuffer(ring)
        self.fd = self._ring.fd
        self._size, self._parse = size, parse

    def read(self) -> list[T]:
        return [self._parse(raw) for raw in self._ring.read() if len(raw) >= self._size]

    def close(self) -> None:
        self._ring.close()


def _map_info(fd: int) -> bytes:
    """``struct bpf_map_info`` of the map ``fd`` (type @0, id @4, name @24..40)."""
    info = ctypes.create_string_buffer(80)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("=IIQ", fd, len(info), _addr(info)).ljust(128, b"\0"))
    return info.raw


def map_ids() -> dict[int, str]:
    """Every BPF map on the machine (any process's), id -> name: to check what is left."""
    found: dict[int, str] = {}
    next_id = 0
    while True:
        attr = ctypes.create_string_buffer(struct.pack("=III", next_id, 0, 0).ljust(128, b"\0"), 128)
        if _libc.syscall(SYS_BPF, BPF_MAP_GET_NEXT_ID, attr, 128) < 0:
            return found  # ENOENT: no more
        next_id = struct.unpack_from("=I", attr.raw, 4)[0]
        try:
            fd = _bpf(BPF_MAP_GET_FD_BY_ID, struct.pack("=III", next_id, 0, 0).ljust(128, b"\0"))
        except OSError:
            continue  # freed meanwhile
        try:
            found[next_id] = _map_info(fd)[24:40].split(b"\0", 1)[0].decode(errors="replace")
        finally:
            os.close(fd)


def map_names() -> list[str]:
    """The names of every BPF map on the machine (any process's)."""
    return list(map_ids().values())


PROG_LOAD_ATTEMPTS = 5
"""BPF_PROG_LOAD returns EAGAIN when the verifier stopped for a pending signal (a profiler or
debugger attached to the process sends them); the load is tried again, as libbpf does."""


def load_program(insns: bytes, *, prog_type: int = BPF_PROG_TYPE_SCHED_CLS, name: str = "",
                 expected_attach_type: int = 0) -> int:
    """Load (and verify) a program; returns its fd. A rejection raises with the verifier's log."""
    license_ = ctypes.create_string_buffer(b"GPL")
    code = ctypes.create_string_buffer(insns, len(insns))

    def attempt(log_level: int, log_size: int) -> tuple[int, ctypes.Array[ctypes.c_char] | None]:
        log = ctypes.create_string_buffer(log_size) if log_size else None
        attr = struct.pack("=IIQQIIQII", prog_type, len(insns) // 8, _addr(code), _addr(license_),
                           log_level, log_size, _addr(log) if log is not None else 0, 0, 0)
        attr += name.encode()[:15].ljust(16, b"\0") + struct.pack("=II", 0, expected_attach_type)
        return _bpf(BPF_PROG_LOAD, attr.ljust(128, b"\0")), log

    for left in range(PROG_LOAD_ATTEMPTS - 1, -1, -1):
        try:
            return attempt(0, 0)[0]
        except OSError as exc:
            if exc.errno == errno.EAGAIN and left:
                continue  # the verifier gave up for now (a signal, e.g. a profiler's): again
            log_text = verifier_log(insns, prog_type=prog_type)
            raise KernelError(f"BPF program {name!r} rejected: {exc}\n{log_text[-3000:]}") from exc
    raise AssertionError("unreachable")


def verifier_log(insns: bytes, *, prog_type: int = BPF_PROG_TYPE_SCHED_CLS) -> str:
    """The verifier's log for ``insns`` (for debugging a program)."""
    license_ = ctypes.create_string_buffer(b"GPL")
    code = ctypes.create_string_buffer(insns, len(insns))
    log = ctypes.create_string_buffer(1 << 22)
    attr = struct.pack("=IIQQIIQII", prog_type, len(insns) // 8, _addr(code), _addr(license_),
                       1, len(log), _addr(log), 0, 0).ljust(128, b"\0")
    try:
        fd = _bpf(BPF_PROG_LOAD, attr)
        os.close(fd)
    except OSError:
        pass
    return log.value.decode(errors="replace")


SKB_CTX_SIZE = 192
"""sizeof(struct __sk_buff) as test runs pass it (``test_run(..., ctx=True)``)."""


def skb_ctx(*, ifindex: int = 0, cb: Sequence[int] = ()) -> bytes:
    """A ``struct __sk_buff`` to run a program on (``test_run(..., ctx_in=...)``): the device
    the packet is on (``ifindex``: found in the calling thread's network namespace; its
    redirects go to that namespace's devices) and ``cb[0..4]``; the rest zero, as the kernel
    requires of what it does not take."""
    out = bytearray(SKB_CTX_SIZE)
    struct.pack_into("=I", out, SKB_IFINDEX, ifindex)
    for i, v in enumerate(cb[:5]):
        struct.pack_into("=I", out, SKB_CB + 4 * i, v & 0xFFFFFFFF)
    return bytes(out)


def test_run(prog_fd: int, data: bytes, repeat: int = 1, *, ctx: bool = False, ctx_in: bytes | None = None,
             hold_gil: bool = False) -> tuple[int, bytes, int]:
    """BPF_PROG_TEST_RUN: (return value, packet after the run, average ns per run).

    ``ctx``: the packet after the run is followed by the ``struct __sk_buff`` the program
    left (``SKB_CTX_SIZE`` bytes: ``cb[0]`` at offset 48, ...). ``ctx_in``: the one it starts
    with (``skb_ctx``). ``hold_gil``: the GIL kept through the run (a run whose redirects set
    off the kernel's own work, on a path that must not queue for the GIL again half-way)."""
    din = ctypes.create_string_buffer(data, len(data))
    dout = ctypes.create_string_buffer(len(data) + 256)
    cout = ctypes.create_string_buffer(SKB_CTX_SIZE)
    cin = ctypes.create_string_buffer(ctx_in, len(ctx_in)) if ctx_in is not None else None
    fields = struct.pack("=IIIIQQII", prog_fd, 0, len(data), len(dout), _addr(din), _addr(dout), repeat, 0)
    if ctx or cin is not None:
        fields += struct.pack("=IIQQ", len(cin) if cin is not None else 0, SKB_CTX_SIZE,
                              _addr(cin) if cin is not None else 0, _addr(cout))
    attr = bytearray(fields.ljust(128, b"\0"))
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    ret = (_libc_held if hold_gil else _libc).syscall(SYS_BPF, BPF_PROG_TEST_RUN, buf, len(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN: {os.strerror(err)}")
    raw = buf.raw
    retval = struct.unpack_from("=I", raw, 4)[0]
    size_out = struct.unpack_from("=I", raw, 12)[0]
    duration = struct.unpack_from("=I", raw, 36)[0]
    return ctypes.c_int32(retval).value, dout.raw[:size_out] + (cout.raw if ctx else b""), duration


# ---------------------------------------------------------------------- assembler

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)

_SIZE = {1: 0x10, 2: 0x08, 4: 0x00, 8: 0x18}
_ALU = {"add": 0x00, "sub": 0x10, "mul": 0x20, "div": 0x30, "or": 0x40, "and": 0x50, "lsh": 0x60,
        "rsh": 0x70, "neg": 0x80, "mod": 0x90, "xor": 0xA0, "mov": 0xB0, "arsh": 0xC0}
_JMP = {"ja": 0x00, "jeq": 0x10, "jgt": 0x20, "jge": 0x30, "jset": 0x40, "jne": 0x50, "jsgt": 0x60,
        "jsge": 0x70, "jlt": 0xA0, "jle": 0xB0, "jslt": 0xC0, "jsle": 0xD0}


def _insn(op: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", op, (src << 4) | dst, off, ctypes.c_int32(imm).value)


@dataclass
class Asm:
    """Instructions with symbolic jump labels: ``a.jmp("jne", R2, 5, "next")``, ``a.label("next")``."""

    code: list[bytes | tuple[int, int, int, int, str]] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)
    _n: int = 0

    def _emit(self, b: bytes) -> None:
        self.code.append(b)

    def label(self, name: str) -> None:
        if name in self.labels:
            raise ValueError(f"label {name!r} defined twice")
        self.labels[name] = len(self.code)

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"{stem}.{self._n}"

    # ALU
    def alu64(self, op: str, dst: int, src_or_imm: int, *, reg: bool = False) -> None:
        code = 0x07 | _ALU[op] | (0x08 if reg else 0)
        self._emit(_insn(code, dst, src_or_imm if reg else 0, 0, 0 if reg else src_or_imm))

    def alu32(self, op: str, dst: int, src_or_imm: int, *, reg: bool = False) -> None:
        code = 0x04 | _ALU[op] | (0x08 if reg else 0)
        self._emit(_insn(code, dst, src_or_imm if reg else 0, 0, 0 if reg else src_or_imm))

    def mov(self, dst: int, src: int) -> None:
        self.alu64("mov", dst, src, reg=True)

    def movi(self, dst: int, imm: int) -> None:
        self.alu64("mov", dst, imm)

    def ld_map_fd(self, dst: int, fd: int) -> None:
        self._emit(_insn(0x18, dst, 1, 0, fd))  # BPF_PSEUDO_MAP_FD
        self._emit(_insn(0, 0, 0, 0, 0))

    # memory
    def ldx(self, size: int, dst: int, src: int, off: int) -> None:
        self._emit(_insn(0x61 | _SIZE[size], dst, src, off, 0))

    def stx(self, size: int, dst: int, off: int, src: int) -> None:
        self._emit(_insn(0x63 | _SIZE[size], dst, src, off, 0))

    def st(self, size: int, dst: int, off: int, imm: int) -> None:
        self._emit(_insn(0x62 | _SIZE[size], dst, 0, off, imm))

    def atomic_add(self, size: int, dst: int, off: int, src: int) -> None:
        """``lock *(size *)(dst + off) += src`` (BPF_ATOMIC BPF_ADD; 4 or 8 bytes)."""
        self._emit(_insn(0xC3 | _SIZE[size], dst, src, off, 0))

    # control
    def jmp(self, op: str, dst: int, src_or_imm: int, target: str, *, reg: bool = False) -> None:
        code = 0x05 | _JMP[op] | (0x08 if reg else 0)
        self.code.append((code, dst, src_or_imm if reg else 0, 0 if reg else src_or_imm, target))

    def goto(self, target: str) -> None:
        self.code.append((0x05, 0, 0, 0, target))

    def map_lookup(self, map_fd: int, key_off: int) -> None:
        """r0 = bpf_map_lookup_elem(map, r10 + key_off): NULL when the key is absent."""
        self.ld_map_fd(R1, map_fd)
        self.mov(R2, R10)
        self.alu64("add", R2, key_off)
        self.call(FN_MAP_LOOKUP_ELEM)

    def call(self, fn: int) -> None:
        self._emit(_insn(0x85, 0, 0, 0, fn))

    def exit(self) -> None:
        self._emit(_insn(0x95))

    def assemble(self) -> bytes:
        # ld_imm64 occupies two slots: positions already count per list item, which is one
        # 8-byte instruction each (the second half is its own item), so offsets are direct.
        out = []
        for i, item in enumerate(self.code):
            if isinstance(item, bytes):
                out.append(item)
                continue
            code, dst, src, imm, target = item
            if target not in self.labels:
                raise ValueError(f"undefined label {target!r}")
            out.append(_insn(code, dst, src, self.labels[target] - i - 1, imm))
        return b"".join(out)


def crc_table(poly_reflected: int, width: int) -> list[int]:
    """Byte-wise table of a reflected CRC (``crc = T[(crc ^ b) & 0xff] ^ (crc >> 8)``)."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly_reflected if c & 1 else c >> 1
        table.append(c & ((1 << width) - 1))
    return table


def crc_slices(table: Sequence[int], n: int = 8) -> list[int]:
    """Slicing-by-``n`` tables of a reflected CRC from its byte-wise table ``T_0``, one after
    the other: ``T_k[i] = T_{k-1}[i] >> 8 ^ T_0[T_{k-1}[i] & 0xff]`` (``T_k`` advances a byte
    that is ``k`` bytes before the end of a step)."""
    slices = [list(table)]
    for _ in range(1, n):
        prev = slices[-1]
        slices.append([(prev[i] >> 8) ^ table[prev[i] & 0xFF] for i in range(256)])
    return [v for s in slices for v in s]


def pack_u32s(values: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)
