"""The unmodified OpenSM (through libumad2sim and the MAD socket) against in-memory agents.

No root needed: the MAD socket is an abstract AF_UNIX socket in the current namespace and
the fabric is an ``InMemoryFabric``. OpenSM must bring the subnet up (every port Active,
LIDs, LFTs), then handle trap 128 for a cut link by repressing it and resweeping.
Skipped when opensm / libumad2sim are not installed.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from ibemu.agents.actions import DeliverMad
from ibemu.agents.ca import CaAgent
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.testing.wiring import InMemoryFabric

trio = pytest.importorskip("trio")
umad = pytest.importorskip("ibemu.wire.umad")
umad_server = pytest.importorskip("ibemu.hca.umad_server")

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
OPENSM = shutil.which("opensm")
pytestmark = pytest.mark.skipif(OPENSM is None or not UMAD2SIM.is_file(),
                                reason="opensm and ibsim-utils (libumad2sim) not installed")


class AgentPort:
    """The MAD-socket backend of one CA port, over an InMemoryFabric (what the IO layer does)."""

    def __init__(self, fab: InMemoryFabric, name: str, port: int = 1) -> None:
        self.fab, self.name, self.port = fab, name, port
        self.ca: CaAgent = fab.agents[name]  # type: ignore[assignment]
        self.node_guid = self.ca.node_guid
        self.gid_prefix = 0xFE80000000000000
        self.node_name = name
        self.deliver = None
        self._seen = 0

    def node_info(self) -> bytes:
        return self.ca.node_info(self.port)

    def port_info(self, port: int) -> bytes:
        return self.ca.port_info(port if port in self.ca.ports else self.port)

    def pkeys(self) -> bytes:
        return self.ca.pkey_block(self.port)

    def port_lid_state(self) -> tuple[int, int]:
        return self.ca.lid(self.port), int(self.ca.port_state(self.port))

    def vendor(self) -> tuple[int, int, int, int]:
        return self.ca.vendor_id, self.ca.device_id, self.ca.revision, 0

    def set_issm(self, on: bool) -> None:
        self.ca.set_is_sm(self.port, on)

    def send_mad(self, req) -> None:  # type: ignore[no-untyped-def]
        self.fab.handle(self.name, self.ca.send_mad(self.port, req.dlid, req.dqp, req.sqp, req.mad))
        self.fab.run()
        self.pump()

    def pump(self) -> None:
        """Hand every MAD the fabric delivered to our CA to the MAD socket's clients."""
        got = self.fab.delivered[self.name]
        for d in got[self._seen :]:
            assert isinstance(d, DeliverMad)
            self.deliver(umad.SimRequest(d.dlid, d.slid, d.dqp, d.sqp, d.mad, d.status))  # type: ignore[misc]
        self._seen = len(got)


def build() -> InMemoryFabric:
    fab = InMemoryFabric(record_wire=False)
    fab.clock = time.monotonic_ns  # type: ignore[assignment]
    fab.add("smhost", CaAgent(node_guid=0x0002C90000000100, description="smhost HCA-1"))
    for i in (1, 2):
        fab.add(f"sw{i}", SwitchAgent(node_guid=0x0002C90000001000 + i, num_ports=8, description=f"sw{i}"))
    for i in range(3):
        fab.add(f"h{i}", CaAgent(node_guid=0x0002C90000000200 + 16 * i, description=f"h{i} HCA-1"))
    fab.connect("smhost", 1, "sw1", 1)
    fab.connect("h0", 1, "sw1", 2)
    fab.connect("sw1", 7, "sw2", 7)
    fab.connect("sw1", 8, "sw2", 8)
    fab.connect("h1", 1, "sw2", 1)
    fab.connect("h2", 1, "sw2", 2)
    return fab


def test_opensm_brings_the_subnet_up_and_handles_a_trap(tmp_path: Path) -> None:
    fab = build()
    backend = AgentPort(fab, "smhost")
    sockname = f"ibemut{os.getpid()}"
    log = tmp_path / "opensm.log"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(umad_server.serve, backend, None, sockname)
            backend.deliver = server.deliver
            env = _env(sockname, tmp_path)
            argv = [OPENSM, "-f", str(log), "-s", "0", "-d2"]  # no periodic sweeps; flush the log
            proc = await trio.lowlevel.open_process(argv, env=env, cwd=tmp_path,
                                                    stdout=open(os.devnull, "wb"))  # noqa: SIM115
            try:
                with trio.fail_after(30):
                    while _read(log).count("SUBNET UP") < 1:
                        await trio.sleep(0.05)
                    _check_up(fab)
                    fab.link_down("sw2", 8)  # one of the two inter-switch cables
                    backend.pump()
                    while sum(a.stats["trap_repressed"] for a in fab.agents.values()) < 2:
                        await trio.sleep(0.05)
                    while _read(log).count("SUBNET UP") < 2:
                        await trio.sleep(0.05)
            finally:
                proc.terminate()
                await proc.wait()
                nursery.cancel_scope.cancel()

    trio.run(main)
    text = log.read_text(errors="replace")
    assert "ERR" not in text, [line for line in text.splitlines() if "ERR" in line][:5]
    sw1: SwitchAgent = fab.agents["sw1"]  # type: ignore[assignment]
    sw2: SwitchAgent = fab.agents["sw2"]  # type: ignore[assignment]
    # after the resweep nothing routes over the cut cable any more
    assert 8 not in set(sw1.lft.effective().values()) | set(sw2.lft.effective().values())


def _env(sockname: str, tmp: Path) -> dict[str, str]:
    """Client environment: our MAD socket, and OpenSM's cache and dump files kept in ``tmp``."""
    return dict(os.environ, LD_PRELOAD=str(UMAD2SIM), IBSIM_SOCKNAME=sockname,
                OSM_CACHE_DIR=str(tmp), OSM_TMP_DIR=str(tmp))


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _check_up(fab: InMemoryFabric) -> None:
    lids = set()
    for name, agent in fab.agents.items():
        for num, port in agent.ports.items():
            if num == 0 or port.link_is_up:
                assert port.state == PortState.ACTIVE, f"{name}:{num} is {port.state.name}"
        if isinstance(agent, SwitchAgent):
            lids.add(agent.lid)
        else:
            lids.add(agent.lid(1))
    assert 0 not in lids and len(lids) == len(fab.agents)
    sw1: SwitchAgent = fab.agents["sw1"]  # type: ignore[assignment]
    h1: CaAgent = fab.agents["h1"]  # type: ignore[assignment]
    assert sw1.lft.lookup(h1.lid(1)) in (7, 8)


@pytest.mark.skipif(shutil.which("ibnetdiscover") is None, reason="infiniband-diags not installed")
def test_infiniband_diags_after_opensm(tmp_path: Path) -> None:
    fab = build()
    backend = AgentPort(fab, "smhost")
    sockname = f"ibemud{os.getpid()}"
    out: dict[str, str] = {}
    sw1: SwitchAgent = fab.agents["sw1"]  # type: ignore[assignment]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = await nursery.start(umad_server.serve, backend, None, sockname)
            backend.deliver = server.deliver
            env = _env(sockname, tmp_path)
            with trio.fail_after(30):
                await trio.run_process([OPENSM, "-o", "-f", str(tmp_path / "osm.log")], env=env,
                                       cwd=tmp_path, capture_stdout=True, capture_stderr=True)
                for name, argv in (("net", ["ibnetdiscover"]),
                                   ("perf", ["perfquery", str(sw1.lid), "7"]),
                                   ("route", ["ibroute", str(sw1.lid)]),
                                   ("node", ["smpquery", "-D", "nodeinfo", "0,1,7"])):
                    proc = await trio.run_process(argv, env=env, cwd=tmp_path, check=False,
                                                  capture_stdout=True, capture_stderr=True)
                    assert proc.returncode == 0, (argv, proc.stderr.decode())
                    out[name] = proc.stdout.decode()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert out["net"].count("Switch\t8 ") == 2 and out["net"].count("Ca\t1 ") == 4
    assert '"sw2" lid' in out["net"] and "4xEDR" in out["net"]
    assert "PortXmitPkts" in out["perf"] and "PortSelect:......................7" in out["perf"]
    h1: CaAgent = fab.agents["h1"]  # type: ignore[assignment]
    assert f"0x{h1.lid(1):04x} 00" in out["route"]  # LID h1 -> port 007 or 008
    assert "Guid:............................0x0002c90000001002" in out["node"]
