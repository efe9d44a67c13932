"""The kernel substrate for real: namespaces, veth cables, tc LFT forwarding, ownership/clean."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from ibemu.cli.main import main
from ibemu.kernel import features, lft_map, netns, ownership, tc
from ibemu.kernel.links import Cable, LinkControl, create_cables
from ibemu.kernel.packet import open_packet_socket
from ibemu.wire import fast

pytestmark = pytest.mark.root
ETH = fast.ethernet_header(b"\xff" * 6, b"\x02" * 6)


def _drain(sock) -> list[bytes]:  # type: ignore[no-untyped-def]
    out = []
    while True:
        try:
            out.append(sock.recv(9000))
        except BlockingIOError:
            return out


def _wait_drain(sock, n: int, timeout: float = 2.0) -> list[bytes]:  # type: ignore[no-untyped-def]
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += _drain(sock)
        time.sleep(0.005)
    return got + _drain(sock)


def _three_nodes(state: ownership.RunState) -> tuple[str, str, str, LinkControl]:
    h1, sw, h2 = (ownership.ns_name(state.run_id, n) for n in ("h1", "sw", "h2"))
    state.claim_namespaces([h1, sw, h2])
    netns.create([h1, sw, h2])
    create_cables([Cable(h1, "p1", sw, "p1"), Cable(h2, "p1", sw, "p2")])
    links = LinkControl()
    links.all_up(h1, ["p1"])
    links.all_up(h2, ["p1"])
    links.all_up(sw, ["p1", "p2"])
    links.wait_carrier({h1: ["p1"], h2: ["p1"], sw: ["p1", "p2"]})  # veth carrier lags up to ~1 s
    return h1, sw, h2, links


def test_cables_carrier_follows_either_end(run_state: ownership.RunState) -> None:
    h1, sw, _h2, links = _three_nodes(run_state)
    try:
        assert links.carrier(h1, "p1") and links.carrier(sw, "p1")
        links.set_up(sw, "p1", False)  # the switch end goes down: the host loses carrier
        assert not links.carrier(h1, "p1")
        links.set_up(sw, "p1", True)
        deadline = time.monotonic() + 2
        while not links.carrier(h1, "p1") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert links.carrier(h1, "p1")
        assert subprocess.run(["ip", "-n", h1, "-o", "link", "show", "p1"], capture_output=True,
                              text=True).stdout.count("mtu 4400") == 1
    finally:
        links.close()


@pytest.mark.parametrize("kind", ["map", "tc"])
def test_lft_in_the_kernel_forwards_data_and_leaves_vl15_to_the_sma(run_state: ownership.RunState,
                                                                    kind: str) -> None:
    """The LFT in a BPF map (``lft_map.MapLft``) and the u32 fallback (``tc.KernelLft``)."""
    h1, sw, h2, links = _three_nodes(run_state)
    lft: lft_map.MapLft | tc.KernelLft = (lft_map.MapLft if kind == "map" else tc.KernelLft)(sw, {1: "p1", 2: "p2"})
    lft.setup()
    s_h1, s_h2 = open_packet_socket(h1, "p1"), open_packet_socket(h2, "p1")
    s_sw1 = open_packet_socket(sw, "p1")
    try:
        assert lft.apply({1: 1, 2: 2}) == (1 if kind == "map" else 2)  # one 64-entry block, or a filter each
        assert lft.apply({1: 1, 2: 2}) == 0  # nothing changed, nothing written
        data = fast.NativeTemplate(slid=1, dlid=2, destqp=5, eth=ETH)
        for psn in range(500):
            s_h1.send(data.packet(0x04, psn, b"x" * 100))
        got = _wait_drain(s_h2, 500)
        assert len(got) == 500 and fast.peek(got[-1][14:]).psn == 499
        assert got[0] == data.packet(0x04, 0, b"x" * 100)  # as sent, Ethernet header included
        assert _drain(s_sw1) == []  # forwarded frames never reach the switch's SMA socket
        directed = fast.NativeTemplate(slid=0xFFFF, dlid=0xFFFF, destqp=0, vl=15, eth=ETH)
        lid_routed_smp = fast.NativeTemplate(slid=1, dlid=2, destqp=0, vl=15, eth=ETH)
        unroutable = fast.NativeTemplate(slid=1, dlid=9, destqp=5, eth=ETH)
        s_h1.send(directed.packet(0x64, 0, b"\0" * 256, ext=fast.deth(0, 0)))
        s_h1.send(lid_routed_smp.packet(0x64, 0, b"\0" * 256, ext=fast.deth(0, 0)))
        s_h1.send(unroutable.packet(0x04, 0, b"y"))
        at_sma = _wait_drain(s_sw1, 2)
        # DR SMPs and unroutable frames reach the SMA; LID-routed SMPs are switched (VL15 kept).
        assert sorted(fast.dlid_vl(f[14:]) for f in at_sma) == [(9, 0), (0xFFFF, 15)]
        switched = _wait_drain(s_h2, 1)
        assert [fast.dlid_vl(f[14:]) for f in switched] == [(2, 15)]
        # Reroute LID 2 back out of port 1 (a hairpin), then remove it.
        assert lft.apply({2: 1}) == 1
        s_h1.send(data.packet(0x04, 1, b"z"))
        assert len(_wait_drain(s_h1, 1)) == 1
        assert lft.apply({2: 0xFF}) == 1 and 2 not in lft.installed
        if isinstance(lft, lft_map.MapLft):
            assert lft.read(2) == 0 and lft.read(1) == 1  # what the kernel map holds
            s_h1.send(data.packet(0x04, 2, b"z"))
            assert [fast.dlid_vl(f[14:]) for f in _wait_drain(s_sw1, 1)] == [(2, 0)]  # no route: the SMA
        else:
            assert tc.lft_lines({2: 2}, installed=lft.installed, ifnames=lft.ifnames)[0].startswith("filter add block 1")
    finally:
        for s in (s_h1, s_h2, s_sw1):
            s.close()
        lft.close()
        links.close()


def test_feature_probe_finds_what_this_kernel_has(state_dir: Path) -> None:
    feats = features.detect(use_cache=False)
    assert feats.clsact and feats.mirred and feats.tbf  # ibemu's kernel datapath needs these
    assert feats.missing({"tbf", "netem"}) == ([] if feats.netem else ["netem"])
    assert not [n for n in netns.list_names() if "probe" in n]


def test_clean_removes_only_what_ibemu_owns(state_dir: Path) -> None:
    foreign_ns = "ibemu-foreign-pytest"  # looks like ours, but no run recorded it
    foreign_link = "ibtfrgn0"
    subprocess.run(["ip", "netns", "add", foreign_ns], check=True)
    subprocess.run(["ip", "link", "add", foreign_link, "type", "veth", "peer", "name", "ibtfrgn1"], check=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = ownership.RunState(ownership.new_run_id(), scenario="crashed")
        names = [ownership.ns_name(state.run_id, n) for n in ("a", "b")]
        state.claim_namespaces(names)
        netns.create(names)
        create_cables([Cable(names[0], "p1", names[1], "p1")])
        state.claim_process(child.pid, "agent")
        # The owner "crashes": nothing torn down. `ibemu clean` must find and remove it all.
        assert main(["clean"]) == 0
        assert not any(netns.exists(n) for n in names)
        assert child.wait(timeout=5) is not None
        assert not list(state_dir.glob("runs/*.json"))
        assert netns.exists(foreign_ns)
        assert subprocess.run(["ip", "link", "show", foreign_link], capture_output=True).returncode == 0
        assert main(["clean"]) == 0  # idempotent
    finally:
        child.kill()
        subprocess.run(["ip", "netns", "del", foreign_ns], check=False)
        subprocess.run(["ip", "link", "del", foreign_link], check=False)


def test_recycled_pid_is_never_signalled(state_dir: Path) -> None:
    proc = ownership.OwnedProcess(pid=1, start_time=123456789, role="impostor")
    assert not proc.alive()  # PID 1 exists, but with another start time: not ours
    ownership.stop_processes([proc])  # must not signal init


def test_link_monitor_sees_carrier_loss_on_the_far_end(run_state: ownership.RunState) -> None:
    from ibemu.kernel.linkevents import open_link_monitor, read_events

    h1, sw, _h2, links = _three_nodes(run_state)
    mon = open_link_monitor(h1)
    try:
        idx = links.index(h1, "p1")
        links.set_up(sw, "p1", False)  # unplug at the switch end
        deadline = time.monotonic() + 2
        seen = []
        while time.monotonic() < deadline and not any(e.ifindex == idx and not e.carrier for e in seen):
            seen += read_events(mon)
            time.sleep(0.005)
        down = [e for e in seen if e.ifindex == idx]
        assert down and not down[-1].carrier and down[-1].admin_up
        links.set_up(sw, "p1", True)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and not any(e.ifindex == idx and e.carrier for e in seen):
            seen += read_events(mon)
            time.sleep(0.005)
        assert any(e.ifindex == idx and e.carrier for e in seen)
    finally:
        mon.close()
        links.close()


def test_the_far_end_of_a_cut_cable_learns_of_it_at_once(run_state: ownership.RunState) -> None:
    """With ends of their own interface index (as ``fabric.plan`` numbers them) the far end's
    carrier loss is reported at once; with equal ones it waited for linkwatch (0.5-0.8 s)."""
    from ibemu.kernel.linkevents import open_link_monitor, read_events

    a, b = (ownership.ns_name(run_state.run_id, n) for n in ("a", "b"))
    run_state.claim_namespaces([a, b])
    netns.create([a, b])
    with pytest.raises(ValueError, match="both ends"):
        create_cables([Cable(a, "p1", b, "p1", a_index=40, b_index=40)])
    create_cables([Cable(a, "p1", b, "p1", a_index=40, b_index=41)])
    links = LinkControl()
    links.all_up(a, ["p1"])
    links.all_up(b, ["p1"])
    links.wait_carrier({a: ["p1"], b: ["p1"]})
    assert links.index(b, "p1") == 41
    mon = open_link_monitor(b)
    late = []
    try:
        for _ in range(4):
            read_events(mon)
            t0 = time.monotonic()
            links.set_up(a, "p1", False)
            while not any(e.ifindex == 41 and not e.carrier for e in read_events(mon)):
                assert time.monotonic() - t0 < 2, "the far end never lost carrier"
                time.sleep(0.001)
            late.append(time.monotonic() - t0)
            links.set_up(a, "p1", True)
            time.sleep(0.1)
        assert max(late) < 0.25, late
    finally:
        mon.close()
        links.close()


def test_tbf_shapes_a_cable_and_netem_absence_is_explained(run_state: ownership.RunState) -> None:
    from ibemu.kernel.commands import KernelError
    from ibemu.kernel.links import netem, shape

    h1, sw, _h2, links = _three_nodes(run_state)
    s_out, s_in = open_packet_socket(h1, "p1"), open_packet_socket(sw, "p1")
    try:
        frame = ETH + b"\0" * 1000
        for _ in range(300):  # unshaped: everything arrives
            s_out.send(frame)
        assert len(_wait_drain(s_in, 300)) == 300
        shape(h1, "p1", 10_000_000, latency_ms=20)  # 10 Mbit/s: ~25 KB may queue, the rest drops
        sent = 0
        for _ in range(2000):
            try:
                s_out.send(frame)
                sent += 1
            except (BlockingIOError, OSError):  # ENOBUFS: the shaper's queue is full
                pass
        got = len(_wait_drain(s_in, 2000, timeout=1.5))
        assert 10 < got < 600 and got <= sent, (got, sent)
        feats = features.detect()
        if not feats.netem:
            with pytest.raises(KernelError, match=r"no netem.*datapath: user"):
                netem(h1, "p1", delay_us=100, have_netem=False)
        else:
            netem(h1, "p1", delay_us=100, have_netem=True)
    finally:
        s_out.close()
        s_in.close()
        links.close()


def test_netlink_skeleton_equals_what_tc_itself_builds(run_state: ownership.RunState) -> None:
    """The raw rtnetlink encoder writes exactly the filters `tc -batch setup_lines` would."""
    import re as _re

    from ibemu.kernel.commands import batch

    a, b = (ownership.ns_name(run_state.run_id, n) for n in ("nl", "tc"))
    run_state.claim_namespaces([a, b])
    netns.create([a, b])
    create_cables([Cable(a, "p1", b, "p1"), Cable(a, "p2", b, "p2")])
    ours = tc.KernelLft(a, {1: "p1", 2: "p2"})
    ours.setup()
    ours.apply({5: 2, 300: 1})
    batch("tc", tc.setup_lines(["p1", "p2"]), netns=b)
    batch("tc", tc.lft_lines({5: 2, 300: 1}, installed={}, ifnames={1: "p1", 2: "p2"}), netns=b)
    try:
        def shown(ns: str) -> list[str]:
            out = subprocess.run(["tc", "-n", ns, "filter", "show", "block", "1"], capture_output=True,
                                 text=True, check=True).stdout
            # action indexes and device names' ifindexes differ between namespaces; the rest must not
            return sorted(_re.sub(r"index \d+ ref \d+ bind \d+", "", line).strip()
                          for line in out.splitlines() if line.strip())
        assert shown(a) == shown(b)
    finally:
        ours.close()


def test_batched_receive_and_send_keep_order_and_count_what_a_dead_link_refuses(
        run_state: ownership.RunState) -> None:
    """``kernel.ring``: recvmmsg batches and sendmmsg batches from the worker thread, with the
    egress header written into each frame, the short-batch direct path, a frame larger than a
    receive slot's usual size, and the drops of a link that is down."""
    from ibemu.kernel.ring import RxBatcher, TxBatcher

    h1, sw, _h2, links = _three_nodes(run_state)
    a = open_packet_socket(h1, "p1")
    b = open_packet_socket(sw, "p1")
    rx, tx = RxBatcher(), TxBatcher()
    try:
        head = bytes(range(12)) + b"\x88\xb5"
        frames = [bytes(14) + bytes([i]) * 300 for i in range(200)]
        tx.send(a, frames, "h1", head)  # batches of TX_BATCH through the worker
        tx.send(a, [bytes(14) + b"\xee" * 4000], "h1", head)  # a jumbo (MTU 4400) frame
        tx.flush()
        got: list[bytes] = []
        deadline = time.monotonic() + 2
        while len(got) < 201 and time.monotonic() < deadline:
            got += rx.recv_batch(b)
            time.sleep(0.005)
        assert [g[14] for g in got[:200]] == list(range(200))
        assert all(g[:14] == head and len(g) == 314 for g in got[:200])
        assert len(got) == 201 and got[200] == head + b"\xee" * 4000
        assert rx.recv_batch(b) == [] and tx.dropped["h1"] == 0
        links.set_up(h1, "p1", False)  # sends on a dead link are refused: lost and counted
        tx.send(a, frames[:5], "h1")
        tx.send(a, frames[:1], "h1")
        tx.flush()
        assert tx.dropped["h1"] == 6
    finally:
        tx.close()
        a.close()
        b.close()
        links.close()
