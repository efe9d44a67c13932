"""`ibemu cli` driven as a user drives it: commands piped into its console on a live k=4 fat-tree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

COMMANDS = """\
nodes
h1 perf write_bw h3 -n 300
link agg0_0:4 down
links
h1 sleep 1
h1 grep -c '"action": "link_down"' {state}/runs/$IBEMU_RUN/events.jsonl
sm routes agg0_0
sm path h1 h15
link edge0_0 core0 down
switch h1 down
h1 ip -br link
exit
nodes
"""


def _netns() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def test_console_on_a_live_fat_tree(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "IBEMU_STATE_DIR": str(state)}
    try:
        proc = subprocess.run([sys.executable, "-m", "ibemu.cli.main", "cli", "--topo", "fat-tree,k=4",
                               "--sm", "ibemu"], input=COMMANDS.format(state=state), capture_output=True,
                              text=True, timeout=240, env=env, check=False)
    finally:  # whatever happened, nothing of this state dir's runs may survive
        runs = [p.stem for p in (state / "runs").glob("*.json")]
        if runs:
            subprocess.run([sys.executable, "-m", "ibemu.cli.main", "clean", *runs], env=env,
                           capture_output=True, timeout=120, check=False)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr + out
    run_id = re.search(r"fabric (\S+) up in", out).group(1)  # type: ignore[union-attr]
    sections = out.split("ibemu> ")
    # nodes
    assert "available nodes are: \ncore0 core1" in sections[1] and "h15" in sections[1]
    # perftest between two hosts, through the fabric
    assert "BW average[MiB/sec]" in sections[2] and "h1 (LID" in sections[2] and "-> h3" in sections[2]
    assert re.search(r"^ 65536\s+300\s+[\d.]+\s+[1-9][\d.]*", sections[2], re.M), sections[2]
    # the fault went through the daemon (stamped in its event log) and both ends lost carrier
    assert re.match(r"link_down (agg0_0:4-core1:1|core1:1-agg0_0:4): injected", sections[3]), sections[3]
    assert "agg0_0-4<->core1-1 (MISSING MISSING)" in sections[4]
    assert "agg0_0-3<->core0-1 (OK OK)" in sections[4]
    assert sections[6].strip().splitlines()[0] == "1"
    # the SM rerouted around the cut: agg0_0 forwards nothing out of port 4 any more
    routes = sections[7]
    assert "valid lids dumped" in routes and "(ibemu agg0_0)" in routes
    assert not re.search(r"^0x[0-9a-f]{4} 004 :", routes, re.M), routes
    assert re.search(r"arrived after \d switches", sections[8])
    # errors are said and the console goes on
    assert "*** no link between edge0_0 and core0" in sections[9]
    assert "*** h1 is a CA (host), expected a switch" in sections[10]
    assert "h1-1" in sections[11]
    # exit tears down (the `nodes` after it is never read)
    assert out.rstrip().endswith(f"fabric {run_id} down")
    assert len(sections) == 13
    assert not [n for n in _netns() if f"ibemu-{run_id}-" in n]
    assert not list((state / "runs").glob("*.json"))
