"""``RouterPlane.express`` (an idle port without line rate sends at once) and
``RouterPlane.receive_batch`` (its inline common case) change no outcome.

Two identical routers take the same generated frames (routed over ECMP, unrouted, for the
router, TTL 1, malformed, PFC pauses) and link changes, one with the express path, one
always through the queues; each is served as the user datapath serves it (after every batch).
Every port must carry the same frames in the same order, and the counters and statistics
must end equal.
"""

from __future__ import annotations

import random
import socket

import pytest

from ibemu.kernel.fib import RouteMsg
from ibemu.roce.queues import QueueConfig
from ibemu.roce.userplane import PortInfo, RouterPlane
from ibemu.wire import pfc
from tests.unit.roce.test_userpath_units import ip_frame


def router(cfg: QueueConfig) -> RouterPlane:
    ports = {i: PortInfo(f"r-{i}", bytes.fromhex(f"02000000000{i}"), bytes.fromhex(f"02000000010{i}"),
                         to_host=i == 1) for i in (1, 2, 3, 4)}
    r = RouterPlane("r", ports, cfg, seed=3, local_ips=frozenset({socket.inet_aton("198.18.1.0")}))
    ip = lambda a: int.from_bytes(socket.inet_aton(a), "big")  # noqa: E731
    r.fib.apply(RouteMsg(False, ip("198.18.0.5"), 32, (2, 3)))
    r.fib.apply(RouteMsg(False, ip("198.18.0.0"), 24, (4,)))
    r.fib.apply(RouteMsg(False, ip("198.18.2.0"), 24, (1,)))
    return r


def frames(rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(rng.randrange(1, 30)):
        dst = rng.choice(["198.18.0.5", "198.18.0.5", "198.18.0.7", "198.18.2.9", "198.18.1.0", "10.0.0.1"])
        f = ip_frame(rng.choice([64, 200, 1000]), dst=dst, sport=rng.randrange(0xC000, 0xC100),
                     ttl=rng.choice([64, 64, 64, 1]), tos=rng.choice([26 << 2 | 2, 48 << 2, 0]))
        if rng.random() < 0.05:
            f[16:18] = b"\xff\xff"
        if rng.random() < 0.05:
            f = bytearray(pfc.pause_frame(bytes(6), {3: rng.choice([0, 100])}))
        out.append(bytes(f))
    return out


@pytest.mark.parametrize(("seed", "cfg"), [(s, c) for s in range(4) for c in (
    QueueConfig(), QueueConfig(ecn_mark_kb=1, buffer_kb=4), QueueConfig(line_gbps=1.0),
    QueueConfig(delay_us=5), QueueConfig(loss_pct=10))])
def test_express_sends_what_the_queues_send(seed: int, cfg: QueueConfig) -> None:
    rng = random.Random(seed)
    fast, ref, batched = router(cfg), router(cfg), router(cfg)
    ref.express = False
    sent: dict[str, dict[int, list[bytes]]] = {"fast": {}, "ref": {}, "batch": {}}
    now = 0
    for _ in range(80):
        now += rng.choice([0, 100, 1000, 20_000])
        if rng.random() < 0.1:
            port, up = rng.choice([2, 3, 4]), rng.random() < 0.6
            for r in (fast, ref, batched):
                r.set_link(port, up, now)
        ingress = rng.choice([1, 2, 3, 4])
        batch = frames(rng)
        for name, r in (("fast", fast), ("ref", ref)):
            for f in batch:
                for egress, data in r.receive(ingress, f, now):
                    sent[name].setdefault(egress, []).append(bytes(data))
            for egress, data in r.service(now):  # the datapath's pump, after the batch
                sent[name].setdefault(egress, []).append(bytes(data))
        out: dict[int, list[bytes | bytearray]] = {}
        batched.receive_batch(ingress, batch, now, out)  # as the user datapath runs it
        out_service = batched.service(now)
        for egress, q in out.items():
            sent["batch"].setdefault(egress, []).extend(bytes(x) for x in q)
        for egress, data in out_service:
            sent["batch"].setdefault(egress, []).append(bytes(data))
    now += 10**9
    for name, r in (("fast", fast), ("ref", ref), ("batch", batched)):
        for egress, data in r.service(now):
            sent[name].setdefault(egress, []).append(bytes(data))
    assert sent["fast"] == sent["ref"] == sent["batch"]
    assert fast.counters(now) == ref.counters(now) == batched.counters(now)
    assert fast.stats == ref.stats == batched.stats
    assert sum(map(len, sent["ref"].values())) > 50
