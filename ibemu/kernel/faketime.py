"""A foreign program (the unmodified OpenSM, infiniband-diags) on the run's dilated clock, by libfaketime.

ibemu's own processes read the emulated clock (``ibemu.clock``): ``epoch + (mono - epoch) / N``.
A C program cannot, so it runs with Debian's ``libfaketimeMT.so.1`` preloaded, which fakes
every clock it reads and scales every timeout it waits on:

- ``FAKETIME="+0 x<1/N>"``: the clocks advance at rate 1/N from libfaketime's *start time*.
  ``gettimeofday``, ``time`` and ``clock_gettime(CLOCK_REALTIME)`` read
  ``start.real + (real - start.real) / N``. ``CLOCK_MONOTONIC`` reads
  ``start.real + (mono - start.mon) / N`` (libfaketime 0.9.10 puts the faked monotonic clock
  on the wall clock's scale; only its differences matter to a program).
- The timeouts of ``nanosleep``, ``usleep``, ``poll``, ``select``, ``ppoll``, ``epoll_wait``,
  ``sem_timedwait``, ``timer_settime``/``timerfd_settime`` and ``pthread_cond_timedwait`` are
  stretched by N (the ``MT`` build interposes the pthread calls). Measured on this machine
  (Debian libfaketime 0.9.10, glibc 2.36, ``x0.25``): a 200 ms wait of each kind lasts
  800 ms real and 200 ms on the program's clock. OpenSM's timers (complib ``cl_timer`` and
  ``cl_event``) are ``pthread_cond_timedwait`` on ``CLOCK_REALTIME`` deadlines from
  ``gettimeofday``; its MAD timeouts are libibumad's ``poll``; its log stamps are
  ``gettimeofday``: all of them follow the rate.
- The start time: by default libfaketime takes it when the program starts, which would put
  the program's clock an unknown startup delay d off the run's (an error of d(1 - 1/N)).
  libfaketime reads it instead from shared memory named by ``FAKETIME_SHARED="<sem> <shm>"``
  (how the ``faketime`` wrapper shares one start among its children) when it is set there. So
  ibemu writes the run's epoch into such a segment (``struct ft_shared_s``: ``ticks``,
  ``file_idx``, then the start ``real``, ``mon``, ``mon_raw``, ``boot`` timespecs) and
  creates the semaphore libfaketime locks it with. The program's wall clock then reads
  ``E_real + (real - E_real) / N`` with ``E_real = epoch + offset`` (``offset``: realtime
  minus monotonic when the segment was written), i.e. exactly ``clock.now_ns() + offset``:
  a wall stamp ``w`` it writes is ``w - offset`` on the emulated clock (``to_emulated_ns``).
  Measured: a faked ``gettimeofday`` and the parent's ``now_ns() + offset`` agree to ~4 us.

libfaketime reads the segment once, when the program starts (its constructor); the segment
and semaphore (4 KiB and 32 bytes in ``/dev/shm``, named ``ibemu-<token>-clock``) are removed
by ``SharedStart.remove`` once the program is up, or when it ends.

At dilation 1 nothing is preloaded: the program runs on the real clock, which is then the
emulated one. ``IBEMU_LIBFAKETIME`` names another copy of the library ("" or a missing file:
none, as if not installed).

A run killed between writing the segment and the program's start leaves those two small files
in /dev/shm (``ibemu clean`` does not match files by name).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import secrets
import struct
import time
from dataclasses import dataclass

LIB_GLOBS = (
    "/usr/lib/*/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/lib64/faketime/libfaketimeMT.so.1",
)
INSTALL_HINT = "install libfaketime (apt-get install libfaketime; scripts/setup.sh does)"
SHM_DIR = "/dev/shm"
SEGMENT_SIZE = 4096


def library_path() -> str | None:
    """The multithreaded libfaketime (its pthread interposers are what OpenSM's timers need)."""
    override = os.environ.get("IBEMU_LIBFAKETIME")
    if override is not None:
        return override if override and os.path.exists(override) else None
    for pattern in LIB_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def rate_spec(dilation: float) -> str:
    """``FAKETIME`` for a clock N times slower, from the shared start time."""
    return f"+0 x{1.0 / dilation!r}"


def _timespec(ns: int) -> bytes:
    return struct.pack("qq", ns // 1_000_000_000, ns % 1_000_000_000)


def start_record(epoch_mono_ns: int, realtime_offset_ns: int, raw_offset_ns: int, boot_offset_ns: int) -> bytes:
    """libfaketime's ``struct ft_shared_s`` with the start time at the monotonic instant
    ``epoch_mono_ns`` (each clock's offset from ``CLOCK_MONOTONIC`` given)."""
    return (struct.pack("QQ", 0, 0) + _timespec(epoch_mono_ns + realtime_offset_ns) + _timespec(epoch_mono_ns)
            + _timespec(epoch_mono_ns + raw_offset_ns) + _timespec(epoch_mono_ns + boot_offset_ns))


def faked_wall_to_emulated_ns(wall_ns: int, realtime_offset_ns: int) -> int:
    """A wall stamp of a program on ``SharedStart``'s clock, on ibemu's emulated clock."""
    return wall_ns - realtime_offset_ns


@dataclass
class SharedStart:
    """The run's epoch as libfaketime's shared start time (a semaphore and a segment)."""

    name: str
    dilation: float
    epoch_ns: int
    realtime_offset_ns: int
    library: str

    @property
    def sem_name(self) -> str:
        return f"/{self.name}-sem"

    @property
    def shm_name(self) -> str:
        return f"/{self.name}-shm"

    def env(self) -> dict[str, str]:
        """What the program's environment needs besides ``LD_PRELOAD`` (see ``preload``)."""
        return {"FAKETIME": rate_spec(self.dilation), "FAKETIME_SHARED": f"{self.sem_name} {self.shm_name}"}

    def describe(self) -> dict[str, object]:
        """Which clock the program is on (for the run's record)."""
        return {"clock": "libfaketime", "dilation": self.dilation, "rate": 1.0 / self.dilation,
                "epoch_ns": self.epoch_ns, "realtime_offset_ns": self.realtime_offset_ns, "library": self.library,
                "shared": [self.sem_name, self.shm_name]}

    def remove(self) -> None:
        """Unlink the semaphore and the segment (a program already started keeps its copy)."""
        remove_shared(self.sem_name, self.shm_name)


def remove_shared(sem_name: str, shm_name: str) -> None:
    """Unlink a ``SharedStart``'s semaphore and segment by name (gone already: nothing)."""
    for path in (f"{SHM_DIR}/sem.{sem_name.lstrip('/')}", f"{SHM_DIR}/{shm_name.lstrip('/')}"):
        if "/" in path[len(SHM_DIR) + 1:] or ".." in path:
            raise ValueError(f"not a shared-memory name: {path}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.sem_open.restype = ctypes.c_void_p
    libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
    libc.sem_close.argtypes = [ctypes.c_void_p]
    return libc


def create(dilation: float, epoch_ns: int, *, tag: str = "ibemu") -> SharedStart:
    """A ``SharedStart`` for the clock ``epoch_ns + (mono - epoch_ns) / dilation``; raises
    ``FileNotFoundError`` when libfaketime is not installed, ``OSError`` when /dev/shm fails."""
    lib = library_path()
    if lib is None:
        raise FileNotFoundError(f"libfaketimeMT.so.1 not found ({', '.join(LIB_GLOBS)}): {INSTALL_HINT}")
    mono = time.monotonic_ns()
    offsets = (time.clock_gettime_ns(time.CLOCK_REALTIME) - mono,
               time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW) - mono,
               time.clock_gettime_ns(time.CLOCK_BOOTTIME) - mono)
    start = SharedStart(f"{tag}-{secrets.token_hex(4)}-clock", dilation, epoch_ns, offsets[0], lib)
    libc = _libc()
    sem = libc.sem_open(start.sem_name.encode(), os.O_CREAT | os.O_EXCL, 0o600, 1)
    if sem is None or sem == ctypes.c_void_p(-1).value:  # SEM_FAILED
        err = ctypes.get_errno()
        raise OSError(err, f"sem_open {start.sem_name}: {os.strerror(err)}")
    libc.sem_close(sem)
    try:
        fd = os.open(f"{SHM_DIR}/{start.shm_name[1:]}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(fd, start_record(epoch_ns, *offsets).ljust(SEGMENT_SIZE, b"\0"))
        finally:
            os.close(fd)
    except BaseException:
        start.remove()
        raise
    return start


def preload(ld_preload: str | None, start: SharedStart) -> str:
    """``LD_PRELOAD`` with libfaketime after what is there (libumad2sim's ``poll`` calls the
    next ``poll``, libfaketime's, so a MAD wait is stretched too)."""
    return f"{ld_preload} {start.library}" if ld_preload else start.library
