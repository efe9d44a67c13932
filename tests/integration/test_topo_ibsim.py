"""Exported topologies run in the real ibsim, OpenSM brings them to SUBNET UP, and what the real
``ibnetdiscover`` then prints imports back to the same graph.

Needs Debian's ibsim-utils + libumad2sim0, opensm and infiniband-diags (no root: ibsim talks
over abstract unix sockets named by IBSIM_SOCKNAME, unique per test). Skipped, with the
reason, where they are missing. Every process started here is stopped by its own PID.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path

import pytest

from ibemu.topo import Topology, generate
from ibemu.topo import ibnetdiscover as ib

ROOT = Path(__file__).resolve().parents[2]
IBSIM = shutil.which("ibsim")
OPENSM = shutil.which("opensm") or (
    "/usr/sbin/opensm" if os.path.exists("/usr/sbin/opensm") else None
)
IBNETDISCOVER = shutil.which("ibnetdiscover") or (
    "/usr/sbin/ibnetdiscover" if os.path.exists("/usr/sbin/ibnetdiscover") else None
)
UMAD2SIM = next(iter(sorted(glob.glob("/usr/lib/*/umad2sim/libumad2sim.so"))), None)
EXAMPLES = Path("/usr/share/doc/ibsim-utils/net-examples")

pytestmark = [
    pytest.mark.skipif(IBSIM is None, reason="ibsim not installed (apt-get install ibsim-utils)"),
    pytest.mark.skipif(
        UMAD2SIM is None, reason="libumad2sim.so not installed (apt-get install libumad2sim0)"
    ),
    pytest.mark.timeout(120),
]
needs_opensm = pytest.mark.skipif(
    OPENSM is None, reason="opensm not installed (apt-get install opensm)"
)
needs_diags = pytest.mark.skipif(
    IBNETDISCOVER is None, reason="ibnetdiscover not installed (apt-get install infiniband-diags)"
)
_ids = count()


@contextmanager
def ibsim(netfile: Path, workdir: Path) -> Iterator[dict[str, str]]:
    """Run ``ibsim -s`` on ``netfile``; yield the environment its clients need."""
    assert IBSIM is not None and UMAD2SIM is not None
    sock = f"ibemu-test-{os.getpid()}-{next(_ids)}"
    out = workdir / "ibsim.out"
    with out.open("wb") as fh:
        proc = subprocess.Popen(
            [IBSIM, "-s", "-n", "-N", "4096", "-S", "1024", "-P", "32768", str(netfile)],
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "IBSIM_SOCKNAME": sock},
        )
    try:
        deadline = time.monotonic() + 15
        while b"Network simulator ready" not in out.read_bytes():
            if proc.poll() is not None:
                pytest.fail(f"ibsim exited with {proc.returncode} on {netfile}:\n{out.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"ibsim not ready after 15 s:\n{out.read_text()}")
            time.sleep(0.05)
        yield {
            **os.environ,
            "IBSIM_SOCKNAME": sock,
            "LD_PRELOAD": UMAD2SIM,
            "OSM_TMP_DIR": str(workdir),
            "OSM_CACHE_DIR": str(workdir),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def run_opensm(env: dict[str, str], workdir: Path, sim_host: str, engine: str = "minhop") -> str:
    """One OpenSM pass (``-o``) with every file in ``workdir``; returns its log."""
    assert OPENSM is not None
    log = workdir / "opensm.log"
    argv = [
        OPENSM,
        "-F",
        "/dev/null",
        "-f",
        str(log),
        "--dump_files_dir",
        str(workdir),
        "-s",
        "0",
        "-o",
    ]
    argv += ["-R", engine]
    subprocess.run(
        argv, env={**env, "SIM_HOST": sim_host}, capture_output=True, timeout=60, check=False
    )
    return log.read_text() if log.exists() else ""


def discover(env: dict[str, str], sim_host: str) -> str:
    assert IBNETDISCOVER is not None
    r = subprocess.run(
        [IBNETDISCOVER],
        env={**env, "SIM_HOST": sim_host},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def node_id(topo: Topology, name: str) -> str:
    return f"H-{topo.node(name).guid:016x}"


def links_and_nodes(t: Topology) -> tuple[object, object]:
    nodes, links = t.graph_key()
    return nodes, tuple(lk[:2] for lk in links)


CASES = [
    ("fat-tree", {"k": 4}, "ftree"),
    ("fat-tree", {"k": 4, "levels": 2}, "updn"),
    ("leaf-spine", {"leaves": 3, "spines": 2, "hosts_per_leaf": 2, "uplinks_per_leaf": 4}, "updn"),
    ("torus", {"dims": "3x3"}, "minhop"),
    ("dragonfly", {"routers_per_group": 2, "global_links": 2, "hosts_per_router": 1}, "minhop"),
    ("ring", {"switches": 4}, "minhop"),
]


@needs_opensm
@needs_diags
@pytest.mark.parametrize(("gen", "params", "engine"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_exported_topology_runs_in_ibsim_and_opensm(
    gen: str, params: dict[str, object], engine: str, tmp_path: Path
) -> None:
    topo = generate(gen, params)
    net = tmp_path / "fabric.ibnd"
    ib.dump(topo, net)
    host = node_id(topo, topo.cas()[0].name)
    with ibsim(net, tmp_path) as env:
        log = run_opensm(env, tmp_path, host, engine)
        assert "SUBNET UP" in log, log[-3000:]
        if engine == "ftree":  # ftree accepted the generated fat-tree as a fat-tree
            assert "ftree tables configured on all switches" in log
        seen = ib.loads(discover(env, host), "ibnetdiscover")
    assert seen.graph_key() == topo.graph_key()  # names, GUIDs, descriptions, links and rates


@needs_opensm
@needs_diags
def test_cluster_snapshot_round_trips_through_ibsim(tmp_path: Path) -> None:
    topo = ib.load(ROOT / "scenarios" / "small-cluster.ibnd")
    net = tmp_path / "cluster.ibnd"
    ib.dump(topo, net)
    with ibsim(net, tmp_path) as env:
        assert "SUBNET UP" in run_opensm(env, tmp_path, "H-0002c90300a1b000")
        seen = ib.loads(discover(env, "H-0002c90300a1b000"))
    assert seen.graph_key() == topo.graph_key()


EXAMPLE_NETS = sorted(EXAMPLES.glob("net*")) if EXAMPLES.is_dir() else []


@needs_opensm
@needs_diags
@pytest.mark.skipif(not EXAMPLE_NETS, reason="ibsim example nets not installed (ibsim-utils docs)")
@pytest.mark.parametrize("path", EXAMPLE_NETS, ids=lambda p: p.name)
def test_ibsim_example_matches_what_ibnetdiscover_sees(path: Path, tmp_path: Path) -> None:
    direct = ib.load(path)
    with ibsim(path, tmp_path) as env:
        assert "SUBNET UP" in run_opensm(env, tmp_path, "Hca1")
        seen = ib.loads(discover(env, "Hca1"))
    # Same names (from the descriptions ibsim reports), GUIDs, port counts and cables;
    # rates differ (ibsim brings unrated links up at 4xSDR, ibemu uses its default).
    assert links_and_nodes(seen) == links_and_nodes(direct)


def test_ibsim_loads_a_large_export(tmp_path: Path) -> None:
    topo = generate("fat-tree", k=12)  # 612 nodes
    net = tmp_path / "big.ibnd"
    ib.dump(topo, net)
    with ibsim(net, tmp_path):
        out = (tmp_path / "ibsim.out").read_text()
    assert f"{net}: parsed" in out and "ibwarn" not in out
