"""``madtwin serve`` end to end on real sockets, without a fabric (root).

The twin is given a datagram socketpair as its slot (the test holds the client's end) and a
packet socket on the loopback interface of a namespace of its own, so a frame the test writes
there reaches it as a response from the wire would. Checked: an unanswered request comes back
with status 110 after the timeout, exactly as the agent host returns one; a response is
written to the client exactly as the agent host would write it; what it does not take arrives
unchanged on the agent host's end; its counters; it ends on ``stop``.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from ibemu.kernel import madtwin, netns
from ibemu.kernel.packet import ETH_P_IB, open_packet_socket
from ibemu.wire.umad import SimRequest, mad_tid

from ..unit.test_madtwin import GET, SET, agent_reply, ca, dr_mad, request, response_to

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not madtwin.available(), reason="madtwin is not built (make native)")]

TIMEOUT_NS = 100_000_000


@pytest.fixture
def ns() -> Iterator[str]:
    name = f"ibemu-madtwin-test-{os.getpid()}"
    netns.create([name])
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        netns.delete([name])


def recv(sock: socket.socket, timeout: float = 2.0) -> bytes:
    sock.settimeout(timeout)
    return sock.recv(4096)


def test_serve_times_out_answers_and_forwards(ns: str) -> None:
    rng = random.Random(7)
    srv, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    twin = madtwin.Twin.start(srv, ns, "lo", bytes(6), timeout_ns=TIMEOUT_NS)
    srv.close()  # the twin has its own descriptor, as it has of a MAD-socket slot
    wire = open_packet_socket(ns, "lo", ETH_P_IB)
    try:
        # 1. unanswered: status 110, the request as the client sent it otherwise
        lost = request(dr_mad(rng, GET, 0x0011, 2))
        t0 = time.monotonic()
        client.send(lost)
        back = recv(client)
        waited = time.monotonic() - t0
        want = bytearray(lost)
        want[16:20] = (110).to_bytes(4, "big")
        assert back == bytes(want) and TIMEOUT_NS / 1e9 <= waited < 1.0

        # 2. answered: the response written on the "wire" reaches the client as the agent host's
        req = request(dr_mad(rng, SET, 0x0019, 3))
        client.send(req)
        frame = madtwin.run_test_mode("frame", req)[0]
        resp = response_to(frame, rng)
        wire.send(bytes(12) + ETH_P_IB.to_bytes(2, "big") + bytes(resp))
        got = recv(client)
        assert got.hex() == agent_reply(ca(), resp, mad_tid(SimRequest.unpack(req).mad))

        # 3. not the twin's: forwarded unchanged to the agent host
        local = request(dr_mad(rng, GET, 0x0015, 0))
        client.send(local)
        twin.fwd.settimeout(2.0)
        assert twin.fwd.recv(4096) == local

        # a corrupted frame is counted, not delivered
        bad = bytearray(resp)
        bad[200] ^= 0xFF
        wire.send(bytes(12) + ETH_P_IB.to_bytes(2, "big") + bytes(bad))
        deadline = time.monotonic() + 2
        while twin.counters()["bad_frame"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        c = twin.counters()
        assert (c["sent"], c["answered"], c["timed_out"], c["forwarded"], c["bad_frame"]) == (2, 1, 1, 1, 1)
        assert c["pending"] == 0 and c["rtt_ns"] > 0
    finally:
        final = twin.stop()
        wire.close()
        client.close()
    assert final["answered"] == 1 and twin.proc.poll() is not None
    assert madtwin.process_name(twin.pid) != "madtwin"
