"""M_Key on a live fabric (kernel datapath, the kernel SMA on): a rogue SM without the key
changes nothing, and the SMs' own keys work through the agents.

ibemu's SM brings a small leaf-spine up with M_KeyProtectBits 2; from another host, the real
``smpquery`` and ``ibportstate`` and an LFT Set sent with ibemu's SM transport, all with a
wrong key, get no answer, change no LFT and no port state, are counted in M_KeyViolations,
and their trap 256 reaches the SM (its ``mkey_violation`` events). With the key, the same
tools work. The unmodified OpenSM, given an M_Key in its config, brings the same fabric up
with every port keyed, its own SMPs never refused.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ibemu.agents.port import PhysState, PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.fabric import opensm
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import tool_argv, umad2sim_path
from ibemu.hca.umad_client import UmadClient
from ibemu.kernel import ownership
from ibemu.sm.transport import Request, Transport, UmadPort
from ibemu.topo import generate
from ibemu.wire import madcodec as mb
from tests.integration.live import Running, fabric_in_thread

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None or shutil.which("smpquery") is None
                       or shutil.which("ibportstate") is None,
                       reason="needs ibsim-utils and infiniband-diags (scripts/setup.sh installs them)"),
]

KEY = 0x5EC12E7000000001
WRONG = 0x0BADC0DE
ROGUE = "h3"  # on leaf 1; the SM runs on h0 (leaf 0)


def _topo() -> Any:
    return generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("mkey")
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-mkey")
    rt = FabricRuntime(_topo(), make_agents=make_agents, state=state, run_dir=tmp, sm="ibemu", sm_host="h0",
                       sm_keys={"m_key": KEY, "m_key_protect": 2, "m_key_lease_s": 600})
    with fabric_in_thread(rt, 90) as running:
        yield running


def _tool(live: Running, host: str, *argv: str) -> subprocess.CompletedProcess[str]:
    ns = live.rt.plan.nodes[host].ns
    return subprocess.run(tool_argv(ns, list(argv)), capture_output=True, text=True, timeout=30, check=False)


def _agents(live: Running) -> dict[str, Any]:
    assert live.host is not None
    return {name: rt.agent for name, rt in live.host.nodes.items()}


def _key_ports(live: Running) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(M_Key, protect, violations) of every port that holds a key."""
    def scan() -> dict[tuple[str, int], tuple[int, int, int]]:
        out = {}
        for name, a in _agents(live).items():
            for num, p in a.ports.items():
                if (num == 0) == isinstance(a, SwitchAgent):
                    out[(name, num)] = (p.m_key, p.m_key_protect, p.m_key_violations)
        return out
    return live.on_loop(scan)


def _not_active(live: Running) -> list[str]:
    def scan() -> list[str]:
        return [f"{name}:{num}" for name, a in _agents(live).items() for num, p in a.ports.items()
                if num and p.phys == PhysState.LINK_UP and p.state != PortState.ACTIVE]
    return live.on_loop(scan)


def _sm_events(live: Running, impl: str = "ibemu") -> list[dict[str, Any]]:
    path = live.rt.run_dir / impl / "events.jsonl"  # type: ignore[operator]
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


async def _lft_set(ns: str, lid: int, block: int, data: bytes, key: int) -> bytes | None:
    """An LFT block Set from a MAD socket client (not the SM), LID-routed, with ``key``."""
    client = await UmadClient.connect(ns)
    try:
        t = Transport(UmadPort(client), timeout_s=0.3, retries=1, m_key=key)
        async with trio.open_nursery() as n:
            await n.start(t.serve)
            r = await t.request(Request(mb.lr_smp(mb.SET, 0x19, modifier=block, data=data), dlid=lid))
            n.cancel_scope.cancel()
        return None if r is None else r.data
    finally:
        client.close()


def test_a_rogue_sm_without_the_key_changes_nothing(keyed: Running) -> None:
    live = keyed
    assert live.host is not None and live.host.kernel_sma is not None, "the kernel SMA must be on"
    ports = _key_ports(live)
    assert len(ports) == 7 and {(k, prot) for k, prot, _v in ports.values()} == {(KEY, 2)}
    assert all(v == 0 for _k, _p, v in ports.values())  # the SM's own SMPs all carried the key
    assert _not_active(live) == []
    agents = _agents(live)
    leaf1 = agents["leaf1"]
    lids = live.on_loop(lambda: {n: (a.lid if isinstance(a, SwitchAgent) else a.lid(1)) for n, a in agents.items()})
    lft_before = live.on_loop(lambda: [leaf1.lft.get_block(b) for b in range(2)])
    host_port = 1  # leaf1:1 - h2
    # 1. the real tools, with a wrong key: no answer at protect level 2 (ibportstate reads
    # NodeInfo first, and goes no further)
    r = _tool(live, ROGUE, "smpquery", "-y", hex(WRONG), "-t", "200", "nodeinfo", str(lids["spine0"]))
    assert r.returncode != 0, r.stdout
    r = _tool(live, ROGUE, "ibportstate", "-y", hex(WRONG), "-t", "200", str(lids["leaf1"]), str(host_port), "disable")
    assert r.returncode != 0, r.stdout
    # 2. an LFT Set by ibemu's SM transport with a wrong key: route every LID to port 1
    ns = live.rt.plan.nodes[ROGUE].ns
    got = trio.run(_lft_set, ns, lids["leaf1"], 0, bytes([1]) * 64, WRONG)
    assert got is None
    time.sleep(0.3)  # let the traps reach the SM and its log
    assert live.on_loop(lambda: [leaf1.lft.get_block(b) for b in range(2)]) == lft_before
    assert _not_active(live) == []
    assert live.on_loop(lambda: leaf1.ports[host_port].phys) == PhysState.LINK_UP
    after = _key_ports(live)
    assert after[("spine0", 0)][2] >= 1 and after[("leaf1", 0)][2] >= 2, after
    assert all(k == KEY and p == 2 for k, p, _v in after.values())
    violations = [e for e in _sm_events(live) if e["kind"] == "mkey_violation"]
    by = {(e["issuer_lid"], e["attr"]) for e in violations}
    assert all(e["lidaddr"] == lids[ROGUE] for e in violations), violations
    assert (lids["spine0"], 0x11) in by and (lids["leaf1"], 0x11) in by and (lids["leaf1"], 0x19) in by, by
    # 3. with the key, the same tools work
    r = _tool(live, ROGUE, "smpquery", "-K", "-y", hex(KEY), "-t", "500", "portinfo", str(lids["leaf1"]), "0")
    assert r.returncode == 0, r.stderr
    m = re.search(r"^Mkey:\.+(0x[0-9a-f]+)", r.stdout, re.M)
    assert m and int(m.group(1), 16) == KEY, r.stdout
    got = trio.run(_lft_set, ns, lids["leaf1"], 0, lft_before[0], KEY)  # the same block: harmless
    assert got == lft_before[0]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(live.on_loop(lambda: [len(a.traps) for a in agents.values()])):
        time.sleep(0.1)
    assert not any(live.on_loop(lambda: [len(a.traps) for a in agents.values()])), "traps not repressed"
    # the SM's TrapRepress (with the key) stopped the lease countdowns the violations started
    assert not any(live.on_loop(lambda: [a.next_deadline() for a in agents.values()]))


@pytest.mark.skipif(not opensm.opensm_available(), reason="opensm missing (apt-get install opensm)")
def test_opensm_with_an_m_key_keys_every_port(tmp_path: Path) -> None:
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-mkey-opensm")
    rt = FabricRuntime(_topo(), make_agents=make_agents, state=state, run_dir=tmp_path, sm="opensm", sm_host="h0",
                       sm_keys={"m_key": KEY, "m_key_protect": 1, "m_key_lease_s": 0})
    with fabric_in_thread(rt, 90) as live:
        ports = _key_ports(live)
        assert len(ports) == 7 and {(k, p) for k, p, _v in ports.values()} == {(KEY, 1)}, ports
        assert _not_active(live) == []
        # OpenSM's own SMPs carried the key: no violation anywhere
        assert all(v == 0 for _k, _p, v in ports.values()), ports
        # level 1: a wrong key still reads PortInfo, with M_Key 0
        r = _tool(live, "h3", "smpquery", "-K", "-y", hex(WRONG), "-t", "500", "-D", "portinfo", "0")
        assert r.returncode == 0, r.stderr
        m = re.search(r"^Mkey:\.+(0x[0-9a-f]+)", r.stdout, re.M)
        assert m and int(m.group(1), 16) == 0, r.stdout
        # a cable cut: leaf1's trap 128 is repressed by OpenSM with the key (no violation)
        assert live.rt.fabric is not None
        ns, ifname = live.rt.plan.nodes["leaf1"].ns, live.rt.topo.ifname("leaf1", 2)
        live.rt.fabric.links.set_up(ns, ifname, False)
        leaf1 = _agents(live)["leaf1"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not live.on_loop(lambda: leaf1.stats["traps_sent"])
                                               or live.on_loop(lambda: len(leaf1.traps))):
            time.sleep(0.1)
        assert live.on_loop(lambda: leaf1.stats["trap_repressed"]) >= 1
        assert all(v == 0 for _k, _p, v in _key_ports(live).values()), _key_ports(live)
