"""Raw rtnetlink: messages, attributes, and the acks of a batch sent in one go.

The kernel writers (links up/down in ``rtnl``, tc filters in ``tc_netlink``, clsact and bpf
filters in ``clsact``, routes and neighbours in ``ibemu.kernel.netconf``) build their own
messages and send a batch at once; this module checks the batch's acks for all of them.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

from ibemu.kernel import netns
from ibemu.kernel.commands import KernelError

NLMSGHDR = struct.Struct("=IHHII")
NLA = struct.Struct("=HH")
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x100, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_F_NESTED = 0x8000


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def parse(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """(type, sequence number, payload start, message end) of each message in ``data``, one
    read from a netlink socket (a truncated or malformed tail ends it)."""
    off = 0
    while off + NLMSGHDR.size <= len(data):
        length, kind, _flags, seq, _pid = NLMSGHDR.unpack_from(data, off)
        if length < NLMSGHDR.size or off + length > len(data):
            return
        yield kind, seq, off + NLMSGHDR.size, off + length
        off += (length + 3) & ~3


def attrs(data: bytes, off: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(type without its flag bits, payload) of each attribute in ``data[off:end]`` (a
    truncated or malformed one ends it)."""
    end = len(data) if end is None else end
    while off + NLA.size <= end:
        ln, kind = NLA.unpack_from(data, off)
        if ln < NLA.size or off + ln > end:
            return
        yield kind & 0x3FFF, data[off + NLA.size:off + ln]
        off += (ln + 3) & ~3


def acks(sock: socket.socket, first_seq: int, count: int) -> list[tuple[int, int]]:
    """Read the acks of messages ``first_seq .. first_seq + count - 1`` (every one asked for
    NLM_F_ACK); returns (sequence number, errno) of those that failed."""
    pending = count
    failed: list[tuple[int, int]] = []
    while pending:
        data = sock.recv(1 << 16)
        for kind, seq, payload, _end in parse(data):
            if kind == NLMSG_ERROR and first_seq <= seq < first_seq + count:
                err = struct.unpack_from("=i", data, payload)[0]
                if err:
                    failed.append((seq, -err))
                pending -= 1
    return failed


def request(sock: socket.socket, msgs: list[bytes], what: str, first_seq: int = 1) -> None:
    """Send ``msgs`` (sequence numbers ``first_seq`` ..) at once and check every ack."""
    sock.send(b"".join(msgs))
    failed = acks(sock, first_seq, len(msgs))
    if failed:
        raise KernelError(f"{what}: {len(failed)} of {len(msgs)} failed ({os.strerror(failed[0][1])})")


def route_socket(ns: str) -> socket.socket:
    """An rtnetlink socket in ``ns`` (1 MiB of receive buffer for the acks of large batches)."""
    with netns.entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return sock
