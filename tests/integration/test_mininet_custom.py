"""Mininet's own ``mn`` on ibemu fabrics: ``mn --custom <ibemu file> --topo ibfattree,4 --switch ibsw``.

Each test runs the real ``mn`` (a subprocess, its own interpreter) with the custom file that
``python -m ibemu.mininet --custom-path`` names, in an isolated ibemu state directory, and
checks that the fabric comes up under ibemu's SM, that IB frames cross the switches (Mininet's
``pingall``, answered by ibemu's IB ping), and that ``exit`` leaves no namespace, interface or
process behind while a foreign namespace stays.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]

MN = shutil.which("mn")


def _mn_ready() -> str | None:
    if MN is None:
        return "Mininet is not installed (no `mn`; scripts/setup.sh installs Debian's mininet as root)"
    interp = Path(MN).read_text(errors="replace").splitlines()[0].removeprefix("#!").split()
    if subprocess.run([*interp, "-c", "import mininet.net"], capture_output=True, check=False).returncode:
        return f"`mn`'s interpreter ({' '.join(interp)}) cannot import mininet"
    return None


_why = _mn_ready()
if _why:
    pytestmark.append(pytest.mark.skip(reason=_why))


def _custom_file() -> str:
    return subprocess.run([sys.executable, "-m", "ibemu.mininet", "--custom-path"], capture_output=True,
                          text=True, check=True).stdout.strip()


def _snapshot() -> tuple[set[str], set[str]]:
    """(namespaces, interfaces of the root namespace)."""
    ns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())
    ns = {n for n in ns if not n.startswith("(")}
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return ns, {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}


def _procs_with_env(needle: bytes) -> list[int]:
    """Live processes whose environment holds ``needle`` (ours carry the test's state dir)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found


class MnEnv(dict[str, str]):
    """Environment for ``mn`` (an isolated ibemu state dir) and the runs it started."""

    runs: list[str]


@pytest.fixture
def mn_env(tmp_path: Path) -> Iterator[MnEnv]:
    """Checks, after the test, that nothing of its fabrics is left and a foreign namespace is.

    Other fabrics may come and go meanwhile (the machine is shared): only this test's run ids
    and the interfaces Mininet itself would leave in the root namespace are looked for.
    """
    foreign = f"mnt-foreign-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", foreign], check=True)
    _, links_before = _snapshot()
    state = tmp_path / "state"
    env = MnEnv({**os.environ, "IBEMU_STATE_DIR": str(state), "IBEMU_PYTHON": sys.executable})
    env.runs = []
    try:
        yield env
        namespaces, links = _snapshot()
        assert foreign in namespaces, "a foreign namespace was removed"
        left = sorted(n for n in namespaces for run in env.runs if n.startswith(f"ibemu-{run}-"))
        assert not left, f"namespaces left: {left[:5]}"
        new_links = sorted(n for n in links - links_before if re.search(r"-(eth)?\d+$", n))
        assert not new_links, f"interfaces left in the root namespace: {new_links[:5]}"
        assert not _procs_with_env(f"IBEMU_STATE_DIR={state}".encode()), "processes left running"
        assert not list((state / "runs").glob("*.json")), "a run is still recorded"
    finally:
        subprocess.run(["ip", "netns", "del", foreign], check=False)
        for left_run in (state / "runs").glob("*.json"):  # a failed test: remove its fabric, by run id
            subprocess.run([sys.executable, "-m", "ibemu.cli.main", "clean", left_run.stem], env=env,
                           capture_output=True, check=False, timeout=120)


def _mn(env: MnEnv, *args: str, stdin: str = "") -> str:
    r = subprocess.run([str(MN), "--custom", _custom_file(), *args], input=stdin, capture_output=True,
                       text=True, env=env, timeout=100, check=False)
    out = r.stdout + r.stderr
    env.runs += re.findall(r"ibemu fabric (\w+) up", out)
    assert r.returncode == 0, out[-3000:]
    return out


def test_fattree_pingall_link_faults_and_exit(mn_env: MnEnv) -> None:
    """The issue's command line: a k=4 fat-tree under ibemu's SM, driven from Mininet's CLI."""
    script = "\n".join([
        "pingall",
        "link edge0_0 agg0_0 down",     # both of edge0_0's uplinks: h0, h1 cut off from the rest
        "link edge0_0 agg0_1 down",
        "sh sleep 0.5",
        "pingall",
        "link edge0_0 agg0_1 up",
        "sh sleep 0.5",
        "pingall",
        "h15 ibstat",
        "exit",
    ]) + "\n"
    out = _mn(mn_env, "--topo", "ibfattree,4", "--switch", "ibsw", stdin=script)
    assert re.search(r"ibemu fabric \w+ up: .*20 switches, 16 hosts, 48 links .*SUBNET UP", out), out
    results = re.findall(r"\*\*\* Results: (\d+)% dropped \((\d+)/(\d+) received\)", out)
    assert len(results) == 3, out
    assert results[0] == ("0", "240", "240"), out
    # cut off: h0<->h1 still (same edge switch), nothing else to or from them (2 x 14 x 2 lost)
    assert results[1][1:] == ("184", "240"), out
    assert re.search(r"^h0 -> h1 X X", out, re.M), out
    assert results[2] == ("0", "240", "240"), out
    assert "State: Active" in out and "Base lid:" in out, out   # ibstat on h15's own HCA port
    assert re.search(r"ibemu fabric \w+ down", out), out


def test_leafspine_node_commands_and_perf(mn_env: MnEnv) -> None:
    """Node commands run in the ibemu namespaces; ibemu perf crosses the spine between two hosts."""
    script = "\n".join([
        "h2 ip -br link",
        "spine1 ip -br link",
        "h0 smpquery nodedesc 1",
        "h0 ibemu perf write_bw -n 100 &",
        "sh sleep 1.5",
        "h3 ibemu perf write_bw h0 -n 100",
        "exit",
    ]) + "\n"
    out = _mn(mn_env, "--topo", "ibleafspine,2,2,2", "--switch", "ibsw", "--host", "ibhca",
              "--controller", "ibsm,engine=updn", stdin=script)
    assert re.search(r"^h2-1@\w+\s+UP", out, re.M), out
    assert re.search(r"^spine1-2@\w+\s+UP", out, re.M), out
    assert "h0 HCA-1" in out, out                                 # NodeDescription through the fabric
    assert re.search(r"write_bw: h3 \(LID \d+\) -> h0 \(LID \d+\)", out), out
    assert re.search(r"^\s*65536\s+100\s+[\d.]+\s+[\d.]+", out, re.M), out


def test_no_sm_means_no_reachability(mn_env: MnEnv) -> None:
    """``--controller none``: no subnet manager, no LIDs, so the IB pingall reaches nobody."""
    out = _mn(mn_env, "--topo", "ibleafspine,2,1,1", "--controller", "none", "--test", "pingall")
    assert re.search(r"\*\*\* Results: 100% dropped \(0/2 received\)", out), out


def test_bad_topology_fails_before_building(mn_env: MnEnv) -> None:
    r = subprocess.run([str(MN), "--custom", _custom_file(), "--topo", "ibfattree,3", "--test", "none"],
                       capture_output=True, text=True, env=mn_env, timeout=60, check=False)
    out = r.stdout + r.stderr
    assert "Caught exception" in out and "k" in out, out
    assert "no fabric of this mn to clean" in out, out   # ibemu's cleanup ran, not Mininet's
