"""The RoCE user datapath on the link model: a 2:1 incast through one router at 4x EDR, on a
clock dilated 2,000 times (each sender offers 105% of the line rate: ~1,500 frames/s of real
time). Without PFC the router's port drops what the model expects (drop tail: half of what
arrives beyond its 1 MiB buffer); with PFC on the data's priority it drops nothing, sends
pause frames and the senders' NIC queues stand paused. Either way the user datapath's
``link_fidelity`` records reach the lag log and the fidelity monitor judges the links."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scapy.contrib.roce import BTH

from ibemu import clock, lagmon
from ibemu.fabric.roce_fabric import RoceRun
from ibemu.kernel import ownership
from ibemu.kernel.packet import open_packet_socket
from ibemu.physics import expect
from ibemu.physics.link import ETH_FRAMING_BYTES, data_gbps
from ibemu.roce.physics import switch_model
from ibemu.roce.queues import QueueConfig
from ibemu.scenario.fidelity import judge_links
from ibemu.topo import generate
from ibemu.wire.roce import roce_packet

pytestmark = pytest.mark.root

DILATION = 2000
SECONDS = 2.0
OFFER = 1.05


def frames(run: RoceRun, src: str, n: int = 8) -> list[bytes]:
    fab = run.fab
    hp = fab.host_port(src)
    mac = ":".join(f"{b:02x}" for b in fab.plan.nodes[src].ports[1].mac)
    gw = ":".join(f"{b:02x}" for b in hp.gateway_mac)
    return [bytes(roce_packet(hp.ip, fab.addrs.host_ip("h2"), BTH(opcode=0x0A, dqpn=0x100, psn=i),
                              payload=bytes(16 + 4096), sport=0xC000 + i, tos=26 << 2 | 2, src_mac=mac, dst_mac=gw))
            for i in range(n)]


def send(run: RoceRun, fps: float) -> int:
    """h0 and h1 each send ``fps`` frames a second (real) for ``SECONDS``; how many in all."""
    socks = {h: open_packet_socket(run.fab.plan.nodes[h].ns, run.fab.plan.nodes[h].ports[1].ifname, 0x0003)
             for h in ("h0", "h1")}
    data = {h: frames(run, h) for h in socks}
    sent = [0]

    def go() -> None:
        t0 = time.perf_counter()
        i = 0
        while (t := time.perf_counter() - t0) < SECONDS:
            while i < t * fps:
                for h, s in socks.items():
                    s.send(data[h][i % len(data[h])])
                    sent[0] += 1
                i += 1
            time.sleep(0.001)

    th = threading.Thread(target=go)
    th.start()
    th.join()
    for s in socks.values():
        s.close()
    return sent[0]


def incast(tmp: Path, pfc_on: bool) -> dict[str, Any]:
    clock.configure(DILATION)
    lag = tmp / "lag.jsonl"
    os.environ[lagmon.ENV_LOG] = str(lag)
    topo = generate("single-switch", hosts=3)  # 4x EDR: 100 Gb/s of data
    q = QueueConfig(pfc=frozenset({3}) if pfc_on else frozenset())
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-roce-physics")
    try:
        run = RoceRun.up(topo, state, queues=q)
        try:
            size = len(frames(run, "h0", 1)[0]) + 4
            fps = OFFER * data_gbps(topo.defaults.rate) * 1e9 / ((size + ETH_FRAMING_BYTES) * 8) / DILATION
            t0 = clock.now_ns()
            sent = send(run, fps)
            time.sleep(1.0)  # the NICs' queues drain
        finally:
            run.down()
    finally:
        os.environ.pop(lagmon.ENV_LOG, None)
        clock.configure(1)
    recs = [json.loads(line) for line in lag.read_text().splitlines()] if lag.exists() else []
    return {"sent": sent, "size": size, "buffer": switch_model(q).buffer_bytes, "counters": run.counters,
            "fidelity": judge_links([r for r in recs if r.get("t_ns", 0) >= t0])}


def test_without_pfc_the_port_drops_what_the_model_expects(tmp_path: Path) -> None:
    r = incast(tmp_path, pfc_on=False)
    tot, model = r["counters"]["totals"], r["counters"]["model"]
    want = expect.incast_drops(2, r["sent"] // 2, r["size"], r["buffer"])
    assert want > 1000
    assert tot.get("dropped", 0) == model["drops"] == pytest.approx(want, rel=0.03), (tot, want)
    assert tot.get("pause_sent", 0) == 0 and not model["hosts_paused_us"]
    f = r["fidelity"]
    assert "sw0:3" in f["links"] and f["valid"], f  # judged, and kept to the model


def test_with_pfc_nothing_drops_and_pauses_are_counted(tmp_path: Path) -> None:
    r = incast(tmp_path, pfc_on=True)
    tot, model = r["counters"]["totals"], r["counters"]["model"]
    assert tot.get("dropped", 0) == model["drops"] == 0, tot
    waiting = sum(model["queued_bytes"].values()) // r["size"]  # still queued in the NICs and the router
    assert tot["pause_sent"] > 10 and tot["tx_frames"] + waiting == pytest.approx(r["sent"], abs=8), (tot, model)
    assert set(model["hosts_paused_us"]) == {"h0:1", "h1:1"} and min(model["hosts_paused_us"].values()) > 100
    f = r["fidelity"]
    assert "sw0:3" in f["links"] and f["valid"], f
