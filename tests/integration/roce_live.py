"""Helpers shared by the RoCE integration tests (kernel and user datapaths): k=4 core counters."""

from __future__ import annotations

from ibemu.kernel import rtnl
from ibemu.roce.fabric import RoceRun

CORES = ("core0", "core1", "core2", "core3")


def core_tx(run: RoceRun) -> dict[str, int]:
    """Frames each core router of a k=4 fat-tree has sent, over its four ports."""
    out = {}
    for core in CORES:
        stats = rtnl.link_stats(run.fab.plan.nodes[core].ns, [f"{core}-{p}" for p in range(1, 5)])
        out[core] = sum(s.tx_packets for s in stats.values())
    return out
