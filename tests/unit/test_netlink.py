"""The netlink ack reader every raw kernel writer shares (``ibemu.kernel.netlink``)."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from ibemu.kernel import netlink
from ibemu.kernel.commands import KernelError


def ack(seq: int, err: int = 0) -> bytes:
    """An NLMSG_ERROR answering message ``seq`` (err 0: success), echoing a 16-byte header."""
    body = struct.pack("=i", -err) + netlink.NLMSGHDR.pack(16, 0, 0, seq, 0)
    return netlink.message(netlink.NLMSG_ERROR, 0, seq, body)


def test_acks_of_the_batch_are_counted_and_failures_returned_by_sequence_number() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        # another batch's ack first, then ours split over two reads
        a.send(ack(2, errno.EEXIST) + ack(5))
        a.send(ack(6, errno.ENOENT) + ack(7))
        assert netlink.acks(b, 5, 3) == [(6, errno.ENOENT)]


def test_request_raises_with_the_first_failure() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        a.send(ack(1) + ack(2, errno.EINVAL))  # queued before the send: b reads them after it
        with pytest.raises(KernelError, match=r"filters: 1 of 2 failed \(Invalid argument\)"):
            netlink.request(b, [netlink.message(44, 0, 1, b""), netlink.message(44, 0, 2, b"")], "filters")


def test_attributes_are_padded_to_four_bytes() -> None:
    assert netlink.attr(1, b"u32\0") == struct.pack("=HH", 8, 1) + b"u32\0"
    assert netlink.attr(7, b"ab") == struct.pack("=HH", 6, 7) + b"ab\0\0"
