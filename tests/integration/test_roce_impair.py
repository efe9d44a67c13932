"""RoCE cable impairments in the kernel: the eBPF program drops its share and stamps the
departure time; a delay is refused before building on a kernel without the fq qdisc."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import struct
import time
from pathlib import Path

import pytest

from ibemu.errors import ConfigError
from ibemu.kernel import bpf
from ibemu.kernel.impair import SKB_TSTAMP, Impairment, has_sch_fq, impair_program
from ibemu.scenario import load_scenario
from ibemu.scenario.runner import check_runnable

pytestmark = pytest.mark.root

FRAME = bytes(64)
SKB_SIZE = 192  # struct __sk_buff


def _run_with_ctx(fd: int) -> tuple[int, int]:
    """BPF_PROG_TEST_RUN with an __sk_buff in and out: (return value, tstamp after)."""
    din = ctypes.create_string_buffer(FRAME, len(FRAME))
    dout = ctypes.create_string_buffer(len(FRAME) + 256)
    cin = ctypes.create_string_buffer(SKB_SIZE)
    cout = ctypes.create_string_buffer(SKB_SIZE)
    attr = struct.pack("=IIIIQQIIIIQQ", fd, 0, len(FRAME), len(dout), ctypes.addressof(din),
                       ctypes.addressof(dout), 1, 0, SKB_SIZE, SKB_SIZE, ctypes.addressof(cin),
                       ctypes.addressof(cout)).ljust(128, b"\0")
    buf = ctypes.create_string_buffer(attr, len(attr))
    assert bpf._libc.syscall(bpf.SYS_BPF, bpf.BPF_PROG_TEST_RUN, buf, len(attr)) == 0, ctypes.get_errno()
    retval = ctypes.c_int32(struct.unpack_from("=I", buf.raw, 4)[0]).value
    return retval, struct.unpack_from("=Q", cout.raw, SKB_TSTAMP)[0]


def test_program_drops_its_share() -> None:
    fd = bpf.load_program(impair_program(Impairment(loss_pct=25.0)), name="t_impair")
    try:
        n = 4000
        dropped = sum(bpf.test_run(fd, FRAME)[0] == 2 for _ in range(n))  # TC_ACT_SHOT
    finally:
        os.close(fd)
    assert 0.21 * n < dropped < 0.29 * n, dropped  # 25% +- 6 sigma


def test_program_stamps_the_departure_time() -> None:
    fd = bpf.load_program(impair_program(Impairment(delay_us=50.0)), name="t_delay")
    try:
        before = time.monotonic_ns()
        ret, tstamp = _run_with_ctx(fd)
        after = time.monotonic_ns()
    finally:
        os.close(fd)
    assert ret == 0  # TC_ACT_OK: never dropped without loss
    assert before + 50_000 <= tstamp <= after + 50_000


def test_delay_needs_fq(state_dir: Path) -> None:
    scen = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "compare-lossy-ethernet.yaml")
    delayed = dataclasses.replace(scen, fabric=dataclasses.replace(scen.fabric, delay_us=20.0,
                                                                   where="x.yaml:9 fabric.delay_us"))
    if has_sch_fq():
        check_runnable(delayed)
    else:
        with pytest.raises(ConfigError, match=r"x.yaml:9 fabric.delay_us: a cable delay needs the fq qdisc"):
            check_runnable(delayed)
    check_runnable(scen)  # loss alone needs nothing this kernel lacks
