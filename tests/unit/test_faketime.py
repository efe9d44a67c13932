"""libfaketime's shared start time (``ibemu.kernel.faketime``): the record's layout, the
environment, and (when the library is installed) a program's faked clock against ibemu's."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibemu import clock
from ibemu.kernel import faketime


def test_start_record_is_libfaketimes_struct() -> None:
    rec = faketime.start_record(5_250_000_000, 1_700_000_000_000_000_000, 7, -3)
    assert len(rec) == 16 + 4 * 16  # ticks, file_idx, then real/mon/mon_raw/boot timespecs
    ticks, idx, *ts = struct.unpack("QQ" + "qq" * 4, rec)
    assert (ticks, idx) == (0, 0)
    assert ts == [1_700_000_005, 250_000_000, 5, 250_000_000, 5, 250_000_007, 5, 249_999_997]


def test_rate_and_environment() -> None:
    assert faketime.rate_spec(4) == "+0 x0.25"
    assert faketime.rate_spec(10) == "+0 x0.1"
    s = faketime.SharedStart("ibemu-ab-clock", 4.0, 10**12, 99, "/lib/ft.so")
    assert s.env() == {"FAKETIME": "+0 x0.25", "FAKETIME_SHARED": "/ibemu-ab-clock-sem /ibemu-ab-clock-shm"}
    assert faketime.preload("/lib/umad2sim.so", s) == "/lib/umad2sim.so /lib/ft.so"
    assert faketime.preload(None, s) == "/lib/ft.so"
    assert faketime.faked_wall_to_emulated_ns(1_000_099, 99) == 1_000_000
    with pytest.raises(ValueError):
        faketime.remove_shared("/../etc/passwd", "/x")


def test_a_missing_library_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBEMU_LIBFAKETIME", "/nonexistent/libfaketimeMT.so.1")
    assert faketime.library_path() is None
    with pytest.raises(FileNotFoundError, match="libfaketime"):
        faketime.create(4, 0)


PROBE = r"""
import sys, time
print(time.monotonic_ns(), time.time_ns())
t0 = time.time(); time.sleep(0.05); print(time.time() - t0)
"""


@pytest.mark.skipif(faketime.library_path() is None, reason="libfaketime missing (apt-get install libfaketime)")
def test_a_program_under_it_is_on_the_emulated_clock() -> None:
    """A child's faked wall clock is ibemu's ``now_ns()`` plus the recorded offset, and its
    sleeps last N times longer in real time."""
    clock.configure(4, epoch_ns=time.monotonic_ns() - 3_000_000_000)  # the epoch 3 s ago
    shared = faketime.create(clock.dilation(), clock.epoch_ns(), tag="ibemu-pytest")
    try:
        env = {**os.environ, **shared.env(), "LD_PRELOAD": faketime.preload(None, shared)}
        t0 = time.monotonic_ns()
        out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60,
                             check=True).stdout.split()
        real_s = (time.monotonic_ns() - t0) / 1e9
        lo, hi = clock.to_emulated_ns(t0), clock.now_ns()
        wall = faketime.faked_wall_to_emulated_ns(int(out[1]), shared.realtime_offset_ns)
        assert lo - 1_000_000 <= wall <= hi, (lo, wall, hi)  # on the emulated clock (ms: NTP slew)
        assert 0.045 <= float(out[2]) < 0.1 and real_s >= 4 * 0.05
    finally:
        shared.remove()
        clock.configure(1)
    assert not [p for p in Path(faketime.SHM_DIR).iterdir() if shared.name in p.name]
