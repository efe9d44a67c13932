"""Unmodified infiniband-diags and OpenSM attach to the MAD socket through libumad2sim.so.

The server runs in a namespace the test owns, with a test backend that answers the local
CA's SMPs itself (``LocalSma``); the tools run in that namespace under ``nsenter``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from ibemu.hca.umad_server import UmadServer
from ibemu.kernel import netns, ownership
from ibemu.wire.umad import Delivery, SimRequest
from tests.unit.umad.fakes import NODE_DESC, NODE_GUID, LocalSma, PyClient

pytestmark = pytest.mark.root
T = TypeVar("T")


def _find_umad2sim() -> str | None:
    env = os.environ.get("IBEMU_UMAD2SIM")
    if env:
        return env if os.path.isfile(env) else None
    found = sorted(glob.glob("/usr/lib/*/umad2sim/libumad2sim.so") + glob.glob("/usr/lib*/umad2sim/libumad2sim.so"))
    return found[0] if found else None


UMAD2SIM = _find_umad2sim()
if UMAD2SIM is None or shutil.which("smpquery") is None:
    pytest.skip("needs libumad2sim.so (Debian: libumad2sim0 / ibsim-utils) and smpquery "
                "(infiniband-diags)", allow_module_level=True)


class ServerThread:
    """A ``UmadServer`` on its own trio loop in a background thread; ``call`` runs code there."""

    def __init__(self, backend: LocalSma, ns: str, **kwargs: Any) -> None:
        self.backend = backend
        self.server = UmadServer(backend, ns, **kwargs)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._scope: trio.CancelScope | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread = threading.Thread(target=self._main, name="umad-server", daemon=True)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.server.serve)
                self.backend.deliver = self.server.deliver
                self._ready.set()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        assert self._ready.wait(10), "MAD socket server did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive() and self._scope is not None:
            trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)
        assert not self._thread.is_alive(), "MAD socket server did not stop"
        if self._error is not None:
            raise self._error

    def call(self, fn: Callable[[], T]) -> T:
        return trio.from_thread.run_sync(fn, trio_token=self._token)

    def slots(self) -> list[tuple[int, bool]]:
        return self.call(lambda: [(c.slot, c.issm) for c in self.server.session.clients])

    def wait(self, cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not self.call(cond):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; stats {dict(self.server.stats)}")
            time.sleep(0.02)


@pytest.fixture
def host_ns(run_state: ownership.RunState) -> str:
    ns = ownership.ns_name(run_state.run_id, "h1")
    run_state.claim_namespaces([ns])
    netns.create([ns])
    return ns


@pytest.fixture
def backend() -> LocalSma:
    return LocalSma()


@pytest.fixture
def mad_socket(host_ns: str, backend: LocalSma) -> Iterator[ServerThread]:
    with ServerThread(backend, host_ns, reap_interval=0.2) as srv:
        yield srv


class Tools:
    """Runs programs in the host's namespace with libumad2sim.so preloaded, in a scratch cwd."""

    def __init__(self, ns: str, workdir: Path, run_state: ownership.RunState) -> None:
        self.ns = ns
        self.workdir = workdir
        self.run_state = run_state
        self.env = {**os.environ, "LD_PRELOAD": str(UMAD2SIM), "OSM_CACHE_DIR": str(workdir / "osm-cache")}
        self.env.pop("IBSIM_SOCKNAME", None)  # the default "sim": names are per namespace
        self.env.pop("SIM_HOST", None)
        self.env.pop("SIM_SET_ISSM", None)

    def argv(self, *args: str) -> list[str]:
        return ["nsenter", f"--net={netns.NETNS_RUN_DIR / self.ns}", "--", *args]

    def run(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=self.env, cwd=self.workdir, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def ok(self, *args: str) -> str:
        res = self.run(*args)
        assert res.returncode == 0, f"{args} exited {res.returncode}: {res.stderr}"
        return res.stdout + res.stderr

    def start(self, *args: str, role: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(self.argv(*args), env=self.env, cwd=self.workdir, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.run_state.claim_process(proc.pid, role)  # torn down even if the test fails
        return proc


@pytest.fixture
def tools(host_ns: str, tmp_path: Path, run_state: ownership.RunState) -> Tools:
    (tmp_path / "osm-cache").mkdir()
    return Tools(host_ns, tmp_path, run_state)


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)


def field(output: str, name: str) -> str:
    """``Name:.......value`` lines of smpquery output."""
    for line in output.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].lstrip(".")
    raise AssertionError(f"no {name} in {output!r}")


def test_smpquery_reads_the_local_ca(mad_socket: ServerThread, tools: Tools) -> None:
    nodeinfo = tools.ok("smpquery", "-D", "nodeinfo", "0")
    assert field(nodeinfo, "Guid") == f"{NODE_GUID:#018x}"
    assert field(nodeinfo, "PortGuid") == f"{NODE_GUID + 1:#018x}"
    assert field(nodeinfo, "NodeType") == "Channel Adapter"
    assert field(nodeinfo, "LocalPort") == "1"
    portinfo = tools.ok("smpquery", "-D", "portinfo", "0")
    assert field(portinfo, "Lid") == "23"
    assert field(portinfo, "LinkState") == "Active"
    assert field(portinfo, "SMLid") == "1"
    nodedesc = tools.ok("smpquery", "-D", "nodedesc", "0")
    assert field(nodedesc, "Node Description") == NODE_DESC
    stats = mad_socket.call(lambda: dict(mad_socket.server.stats))
    assert stats["connect"] == 3 and stats["disconnect"] == 3
    assert stats["data_sent"] == stats["delivered"] >= 3
    assert mad_socket.slots() == []


def test_sockets_live_in_the_hosts_namespace(mad_socket: ServerThread, host_ns: str) -> None:
    with netns.entered(host_ns):
        inside = PyClient("sim", pid=5_000_001)
    try:
        assert inside.connect().type == 1
        assert inside.query(0x0011, 1).mad[64:128] == mad_socket.backend.node_info()
        inside.disconnect()
    finally:
        inside.close()


def test_ibstat_and_ibaddr(mad_socket: ServerThread, tools: Tools) -> None:
    ibstat = tools.ok("ibstat")
    assert f"Node GUID: {NODE_GUID:#018x}" in ibstat
    assert f"Port GUID: {NODE_GUID + 1:#018x}" in ibstat
    assert "Base lid: 23" in ibstat and "State: Active" in ibstat and "SM lid: 1" in ibstat
    ibaddr = tools.ok("ibaddr")
    assert "GID fe80::8:f104:396:559 LID start 0x17 end 0x17" in ibaddr


def test_python_client_and_smpquery_at_once(mad_socket: ServerThread, tools: Tools, host_ns: str) -> None:
    with netns.entered(host_ns):
        longrun = PyClient("sim", pid=5_000_002)
    try:
        assert longrun.connect().type == 1 and longrun.slot == 0
        out = tools.ok("smpquery", "-D", "nodedesc", "0")
        assert 'attached as client 1 at node "h1"' in out  # umad2sim's own message
        assert field(out, "Node Description") == NODE_DESC
        assert longrun.query(0x0015, 0xABCD_0000_0000_0001).tid == 0xABCD_0000_0000_0001
        assert mad_socket.slots() == [(0, False)]
        longrun.disconnect()
    finally:
        longrun.close()


def test_killed_smpquery_frees_its_slot(host_ns: str, backend: LocalSma, tools: Tools) -> None:
    backend.answer = False  # the query hangs in the fabric
    with ServerThread(backend, host_ns, reap_interval=None) as srv:  # only a failed send frees it
        proc = tools.start("smpquery", "-D", "nodeinfo", "0", role="smpquery")
        try:
            srv.wait(lambda: len(backend.sent) == 1, what="smpquery's MAD")
            assert srv.slots() == [(0, False)]
        finally:
            kill(proc)
        late = backend.respond(backend.sent[0])
        assert srv.call(lambda: srv.server.deliver(late)) is Delivery.CLIENT_GONE
        assert srv.slots() == []
        backend.answer = True
        out = tools.ok("smpquery", "-D", "nodeinfo", "0")
        assert 'attached as client 0 at node "h1"' in out and field(out, "Guid") == f"{NODE_GUID:#018x}"


def test_eleventh_client_refused_until_a_dead_one_is_reaped(
        host_ns: str, backend: LocalSma, tools: Tools) -> None:
    with ServerThread(backend, host_ns, reap_interval=None) as srv:
        with netns.entered(host_ns):
            clients = [PyClient("sim", pid=6_000_000 + i) for i in range(10)]
        try:
            for c in clients:
                assert c.connect().type == 1
            refused = tools.run("smpquery", "-D", "nodeinfo", "0")
            assert refused.returncode != 0
            assert "ctl error" in refused.stderr and "connect failed" in refused.stderr
            clients[6].close()  # dies without DISCONNECT
            out = tools.ok("smpquery", "-D", "nodeinfo", "0")
            assert 'attached as client 6 at node "h1"' in out
            assert srv.call(lambda: srv.server.stats["client_gone"]) == 1
        finally:
            for c in clients:
                c.close()


def _trap128(tid: int, issuer_lid: int) -> bytes:
    mad = bytearray(256)
    mad[0:4] = bytes([1, 0x01, 1, 0x05])  # SubnTrap
    struct.pack_into(">QH", mad, 8, tid, 0x0002)  # Notice
    # generic, type 1 (urgent), producer 2 (switch), trap 128, issuer LID; LIDADDR at 74
    struct.pack_into(">BBHHH", mad, 64, 0x81, 0, 2, 128, issuer_lid)
    struct.pack_into(">H", mad, 74, issuer_lid)
    return bytes(mad)


def test_opensm_attaches_as_sm_gets_a_trap_and_is_reaped_when_killed(
        mad_socket: ServerThread, backend: LocalSma, tools: Tools) -> None:
    log = tools.workdir / "opensm.log"
    osm = tools.start("opensm", "-f", str(log), "--dump_files_dir", str(tools.workdir), "-s", "1",
                      role="opensm")
    try:
        mad_socket.wait(lambda: any(c.issm for c in mad_socket.server.session.clients),
                        what="OpenSM to attach as SM")
        assert backend.issm_calls == [True] and backend.capmask & 2
        mad_socket.wait(lambda: len(backend.sent) > 0, what="OpenSM's first SMP")
        # a second umad2sim client while OpenSM sweeps
        out = tools.ok("smpquery", "-D", "nodedesc", "0")
        assert 'attached as client 1 at node "h1"' in out
        # a switch's trap TID, with bits 32-47 set (umad2sim overwrites those in TrapRepress)
        trap = SimRequest(dlid=1, slid=0x22, dqp=0, sqp=0, mad=_trap128(0x1002_5EED_0001, 0x22))
        assert mad_socket.call(lambda: mad_socket.server.deliver(trap)) is Delivery.DELIVERED
        mad_socket.wait(lambda: any(r.method == 0x07 for r in backend.sent), what="TrapRepress")
        repress = next(r for r in backend.sent if r.method == 0x07)
        assert repress.tid == 0x1002_5EED_0001 and repress.dlid == 0x22  # back to the issuer
        assert osm.poll() is None, "OpenSM exited"
    finally:
        kill(osm)
    mad_socket.wait(lambda: not mad_socket.server.session.clients, what="the dead SM's slot")
    assert backend.issm_calls == [True, False]
    out = tools.ok("smpquery", "-D", "nodeinfo", "0")
    assert 'attached as client 0 at node "h1"' in out
    # OpenSM kept its cache in our scratch directory (OSM_CACHE_DIR), not the system's
    ours = f"{NODE_GUID + 1:#018x}"
    system = Path("/var/cache/opensm")
    assert not any(ours in f.read_text(errors="replace") for f in system.glob("*") if f.is_file())
