"""``kernel.mmsg.send_many``: every frame in order, through the preallocated slots and past
them (a frame larger than a slot, more frames than slots), from several threads at once
(Unix datagram socket pairs: sendmmsg without root or a veth)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ibemu.kernel import mmsg


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
    b.setblocking(False)
    return a, b


def _drain(sock: socket.socket) -> list[bytes]:
    got: list[bytes] = []
    while True:
        try:
            got.append(sock.recv(1 << 16))
        except BlockingIOError:
            return got


@pytest.mark.parametrize("frames", [
    [bytes([i]) * (60 + i) for i in range(8)],                          # the slots
    [b"a" * 304, b"b" * (mmsg.SLOT + 1), b"c" * 304],                   # one too large for a slot
    [bytes([i % 256]) * 100 for i in range(mmsg.SLOTS + 3)],            # more than the slots
    [b"x" * mmsg.SLOT, b"", b"y"],                                      # a full slot, an empty frame
], ids=["slots", "large-frame", "many-frames", "edges"])
def test_send_many_sends_each_frame_whole_and_in_order(frames: list[bytes]) -> None:
    a, b = _pair()
    try:
        assert mmsg.send_many(a, frames) == len(frames)
        assert _drain(b) == frames
        # the slots are reused: a shorter batch after a longer one sends only its own frames
        assert mmsg.send_many(a, [b"short"]) == 1
        assert _drain(b) == [b"short"]
    finally:
        a.close()
        b.close()


def test_send_many_from_several_threads_keeps_each_threads_frames() -> None:
    """The GIL is released during ``sendmmsg``: each thread has slots of its own."""
    pairs = [_pair() for _ in range(4)]
    errors: list[BaseException] = []

    def sender(k: int) -> None:
        try:
            for i in range(300):
                frames = [bytes([k, i % 256, j]) * 50 for j in range(8)]
                assert mmsg.send_many(pairs[k][0], frames) == 8
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for k, (_a, b) in enumerate(pairs):
            want = [bytes([k, i % 256, j]) * 50 for i in range(300) for j in range(8)]
            assert _drain(b) == want
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_a_full_socket_raises_blocking_io_error_when_nothing_went() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    try:
        sent = 0
        while True:  # fill the receiver
            try:
                sent += mmsg.send_many(a, [b"z" * 1000] * 8)
            except BlockingIOError:
                break
            if sent > 1_000_000:
                pytest.fail("the socket never filled")
        assert sent > 0
    finally:
        a.close()
        b.close()


def test_recv_many_takes_every_waiting_frame_with_its_stamp_and_drops_what_is_too_long() -> None:
    from ibemu.kernel import packet

    a, b = _pair()
    rx = mmsg.RecvMany(slots=4, slot=256)
    try:
        assert rx.recv(b) == []  # nothing waiting
        frames = [bytes([i]) * (100 + i) for i in range(6)]
        for f in frames:
            a.send(f)
        got = rx.recv(b) + rx.recv(b)  # four slots: two calls
        assert [f for f, _ in got] == frames
        assert all(stamp is None for _, stamp in got)  # the socket stamps nothing
        packet.stamp_received(b)
        a.send(b"x" * 257)  # one byte too long for a slot
        a.send(b"y" * 256)
        before = time.clock_gettime_ns(time.CLOCK_REALTIME)
        got = rx.recv(b)
        assert [f for f, _ in got] == [b"y" * 256] and rx.truncated == 1
        stamp = got[0][1]
        assert stamp is not None and 0 <= before - stamp < 5_000_000_000
        b.close()
        with pytest.raises(OSError):
            rx.recv(b)
    finally:
        a.close()
        b.close()
