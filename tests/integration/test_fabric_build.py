"""A real k=4 fat-tree in the kernel: all-pairs delivery on min-hop LFTs; clean failure paths."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ibemu.fabric.build import build, teardown
from ibemu.fabric.plan import plan_fabric
from ibemu.kernel import netns, ownership
from ibemu.kernel.commands import KernelError
from ibemu.kernel.packet import open_packet_socket
from ibemu.testing.static_routes import assign_lids, minhop_lfts
from ibemu.topo import generate
from ibemu.wire import decode_native, fast

pytestmark = pytest.mark.root


def test_all_pairs_delivery_over_kernel_lfts(state_dir: Path) -> None:
    topo = generate("fat-tree", k=4)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-allpairs")
    plan = plan_fabric(topo, state.run_id)
    fabric = build(plan, state)
    socks = {}
    try:
        assert len(netns.list_names()) >= 36 and all(netns.exists(n) for n in plan.namespaces)
        lids = assign_lids(topo)
        for sw, table in minhop_lfts(topo, lids).items():
            fabric.lfts[sw].apply(table)
        hosts = [n.name for n in topo.cas()]
        for h in hosts:
            socks[h] = open_packet_socket(plan.nodes[h].ns, plan.nodes[h].ports[1].ifname)
        for src in hosts:
            pp = plan.nodes[src].ports[1]
            eth = fast.ethernet_header(pp.peer_mac, pp.mac)
            for dst in hosts:
                if dst != src:
                    t = fast.NativeTemplate(slid=lids[src], dlid=lids[dst], destqp=0x10, eth=eth)
                    socks[src].send(t.packet(0x04, lids[src], src.encode()))
        got: dict[str, list[bytes]] = {h: [] for h in hosts}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(len(v) < len(hosts) - 1 for v in got.values()):
            for h, s in socks.items():
                try:
                    while True:
                        got[h].append(s.recv(9000))
                except BlockingIOError:
                    pass
            time.sleep(0.01)
        for h in hosts:
            senders = sorted(bytes(decode_native(f[14:]).load).rstrip(b"\0").decode() for f in got[h])
            assert senders == sorted(x for x in hosts if x != h), h
            assert all(fast.peek(f[14:]).dlid == lids[h] for f in got[h])
    finally:
        for s in socks.values():
            s.close()
        assert teardown(fabric) == []
    assert not any(netns.exists(n) for n in plan.namespaces)
    assert not list(state_dir.glob("runs/*.json"))


def test_failed_build_leaves_nothing(state_dir: Path) -> None:
    topo = generate("single-switch", hosts=2)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-fail")
    plan = plan_fabric(topo, state.run_id)
    squatter = plan.nodes["h1"].ns  # someone else's namespace already has one of our names
    netns.create([squatter])
    try:
        with pytest.raises(KernelError, match="already exists"):
            build(plan, state)
        assert netns.exists(squatter)  # not ours: left alone
        assert not any(netns.exists(n) for n in plan.namespaces if n != squatter)
    finally:
        netns.delete([squatter])
