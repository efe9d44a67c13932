"""Small kernel helpers other layers call instead of touching the kernel themselves: the argv
of ``ip netns exec``, ``fs.nr_open``, the FIB dump request's bytes (no root needed)."""

from __future__ import annotations

import struct

from ibemu.kernel import limits, netns
from ibemu.kernel.fib import dump_request


def test_exec_argv_runs_the_program_through_ip_netns_exec() -> None:
    argv = netns.exec_argv("ibemu-x-h0", ("env", "A=1", "ibstat"))
    assert argv == ["ip", "netns", "exec", "ibemu-x-h0", "env", "A=1", "ibstat"]
    assert netns.exec_argv("n", []) == ["ip", "netns", "exec", "n"]


def test_nr_open_is_read_from_proc() -> None:
    n = limits.nr_open()
    assert n is None or n >= 1024


def test_dump_request_golden_bytes() -> None:
    body = bytes([2]) + bytes(11)  # rtmsg: AF_INET, the rest zero
    assert dump_request(7) == struct.pack("=IHHII", 28, 26, 0x301, 7, 0) + body


def test_kernel_stamp_reads_the_timestamp_and_nothing_else() -> None:
    import socket
    import struct

    from ibemu.kernel.packet import SO_TIMESTAMPNS, kernel_stamp

    ts = struct.pack("qq", 12, 345)
    assert kernel_stamp([(socket.SOL_SOCKET, SO_TIMESTAMPNS, ts)]) == 12_000_000_345
    assert kernel_stamp([(socket.SOL_SOCKET, 99, ts), (socket.SOL_SOCKET, SO_TIMESTAMPNS, ts[:8])]) is None
    assert kernel_stamp([]) is None
