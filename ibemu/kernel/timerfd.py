"""A CLOCK_MONOTONIC timerfd: a descriptor trio can wait on that fires at a nanosecond deadline.

trio's own timers round to milliseconds; the RoCE user datapath (``ibemu.roce.userpath``)
wakes on one of these when its next frame is due. Python 3.11 has no ``os.timerfd_*``, so
the calls go through libc.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct


class TimerFd:
    """A CLOCK_MONOTONIC timerfd (through libc: Python 3.11 has no os.timerfd_*)."""

    CLOCK_MONOTONIC, TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        fd = self.libc.timerfd_create(self.CLOCK_MONOTONIC, self.TFD_NONBLOCK | self.TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self.fd = fd

    def arm(self, at_ns: int) -> None:
        """Fire at ``at_ns`` on the monotonic clock (``time.monotonic_ns``)."""
        at_ns = max(at_ns, 1)
        spec = struct.pack("=qqqq", 0, 0, at_ns // 1_000_000_000, at_ns % 1_000_000_000)
        buf = ctypes.create_string_buffer(spec)
        if self.libc.timerfd_settime(self.fd, self.TFD_TIMER_ABSTIME, buf, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def disarm(self) -> None:
        """Never fire (until armed again)."""
        buf = ctypes.create_string_buffer(struct.pack("=qqqq", 0, 0, 0, 0))
        if self.libc.timerfd_settime(self.fd, 0, buf, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)

    def close(self) -> None:
        os.close(self.fd)
