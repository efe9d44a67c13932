"""The unmodified OpenSM on the run's dilated clock (libfaketime): its sweep interval stretches by N.

OpenSM runs with a light sweep every second (``-s 1``) at dilation 4 on a small fabric whose
agents run on the emulated clock. Seen from outside, in real time (the log is flushed line by
line, ``-d2``, and polled every 10 ms), its light sweeps come every 4 s; on OpenSM's own clock
(its log stamps) every 1 s; and each stamp, put on ibemu's emulated clock, is when this process
saw the line on its own copy of that clock (a few emulated ms before it, never after).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibemu import clock
from ibemu.fabric import opensm, opensm_log
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import umad2sim_path
from ibemu.kernel import faketime, ownership
from ibemu.topo import generate
from tests.integration.live import fabric_in_thread

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None, reason="libumad2sim.so missing (apt-get install ibsim-utils)"),
    pytest.mark.skipif(not opensm.opensm_available(), reason="opensm missing (apt-get install opensm)"),
    pytest.mark.skipif(faketime.library_path() is None, reason="libfaketime missing (apt-get install libfaketime)"),
]

N = 4
SWEEP_S = 1
SWEEPS = 3  # two intervals


@pytest.fixture
def dilated() -> Iterator[None]:
    clock.configure(N)
    try:
        yield
    finally:
        clock.configure(1)


def watch_sweeps(workdir: Path, count: int, timeout_s: float) -> list[tuple[int, int, int]]:
    """(real ns seen, emulated ns seen, emulated stamp) of the first ``count`` light sweeps logged."""
    seen: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + timeout_s
    while len(seen) < count and time.monotonic() < deadline:
        stamps = opensm.light_sweeps(workdir)
        real, emulated = time.monotonic_ns(), clock.now_ns()
        seen += [(real, emulated, t) for t in stamps[len(seen):]]
        time.sleep(0.01)
    return seen[:count]


def test_opensm_sweep_interval_stretches_by_the_dilation(dilated: None, state_dir: Path, tmp_path: Path) -> None:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-opensm-dilated")
    rt = FabricRuntime(topo, make_agents=make_agents, datapath="kernel", state=state, run_dir=tmp_path)
    workdir = tmp_path / "opensm"
    with fabric_in_thread(rt, emulated_clock=True):
        proc = opensm.start(rt.plan.nodes["h0"].ns, workdir, extra=["-s", str(SWEEP_S), "-D", "0x07"])
        try:
            opensm.wait_subnet_up(proc, workdir, timeout_s=30)
            described = opensm_log.log_clock(workdir)
            assert described is not None and described["clock"] == "libfaketime" and described["dilation"] == N
            assert opensm.clock_name(workdir) == "libfaketime"
            # the shared start time is gone from /dev/shm once OpenSM is up
            assert not [p for p in Path(faketime.SHM_DIR).iterdir() if described["shared"][1][1:] in p.name]
            sweeps = watch_sweeps(workdir, SWEEPS, timeout_s=SWEEPS * SWEEP_S * N + 10)
        finally:
            opensm.stop(proc)
            opensm.release_clock(workdir)
    assert len(sweeps) == SWEEPS, sweeps
    real_iv = [(b[0] - a[0]) / 1e9 for a, b in itertools.pairwise(sweeps)]
    stamp_iv = [(b[2] - a[2]) / 1e9 for a, b in itertools.pairwise(sweeps)]
    # Real time: N x the configured interval (10 ms polling, OpenSM's timer restart latency).
    assert abs(statistics.median(real_iv) - N * SWEEP_S) <= 0.05 * N * SWEEP_S, real_iv
    # OpenSM's own clock: the configured interval.
    assert abs(statistics.median(stamp_iv) - SWEEP_S) <= 0.05 * SWEEP_S, stamp_iv
    # One clock: each stamp is on ibemu's emulated clock, just before this process saw it.
    for _, seen_emulated, stamp in sweeps:
        # (OpenSM's own start as its clock's origin would put it d(1 - 1/N) off, d its startup)
        assert 0 <= seen_emulated - stamp < 20_000_000, (seen_emulated - stamp) / 1e6
