"""``kernel.ring.TxBatcher.send_groups``: the frames of several sockets packed into shared
slots, each socket's frames in order with its header, across more than one slot buffer
(Unix datagram socket pairs: sendmmsg without root or a veth)."""

from __future__ import annotations

import socket
import time

from ibemu.kernel.ring import TX_BATCH, RxBatcher, TxBatcher


def _drain(rx: RxBatcher, sock: socket.socket, n: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 2
    while len(got) < n and time.monotonic() < deadline:
        got += rx.recv_batch(sock)
        time.sleep(0.002)
    return got


def test_send_groups_keeps_each_sockets_order_and_header() -> None:
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(3)]
    for a, b in pairs:
        b.setblocking(False)
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
    tx, rx = TxBatcher(), RxBatcher()
    try:
        heads = [bytes([k]) * 14 for k in range(3)]
        counts = [1, TX_BATCH + 7, 40]  # the second overflows a slot buffer
        frames = [[bytes(14) + bytes([k, i % 256]) + bytes(100) for i in range(n)] for k, n in enumerate(counts)]
        tx.send_groups([(pairs[k][0], frames[k], f"s{k}", heads[k]) for k in range(3)])
        tx.send_groups([(pairs[0][0], [bytes(14) + b"\x00\xff"], "s0", heads[0])])  # short: direct when idle
        tx.flush()
        for k in range(len(counts)):
            want = [heads[k] + f[14:] for f in frames[k]] + ([heads[0] + b"\x00\xff"] if k == 0 else [])
            assert _drain(rx, pairs[k][1], len(want)) == want
        assert tx.frames == sum(counts) + 1 and not tx.dropped
        tx.send_groups([])
    finally:
        tx.close()
        for a, b in pairs:
            a.close()
            b.close()
