"""A synthetic, realistic ``ibemu.run/3`` result (k=4 fat-tree, two faults, three flows)."""

from __future__ import annotations

import math
from typing import Any

BIN_S = 0.1
DURATION_S = 20.0


def _timeline(peak: float, dips: list[tuple[float, float]]) -> dict[str, list[float]]:
    """Throughput bins at ``peak`` Gb/s, zero inside each ``(start, end)`` dip."""
    n = int(DURATION_S / BIN_S)
    t = [round(i * BIN_S, 6) for i in range(n)]
    g = []
    for i, ts in enumerate(t):
        down = any(a <= ts < b for a, b in dips)
        g.append(0.0 if down else round(peak * (0.95 + 0.05 * math.sin(i / 7)), 3))
    return {"t_s": t, "gbps": g}


def result() -> dict[str, Any]:
    """A fresh copy each call (tests mutate it)."""
    return {
        "schema": "ibemu.run/3",
        "scenario": {
            "name": "default",
            "file": "scenarios/default.yaml",
            "description": "k=4 fat-tree, an aggregation uplink failing under traffic",
        },
        "started_at": "2025-03-14T10:21:07.512+00:00",
        "duration_s": 23.4,
        "interrupted": False,
        "fabric": {
            "kind": "ib",
            "datapath": "kernel",
            "nodes": 36,
            "switches": 20,
            "hosts": 16,
            "links": 48,
            "topology": "fat-tree k=4",
        },
        "sm": {"impl": "ibemu", "engine": "ftree", "host": "h0"},
        "bringup": {"fabric_s": 0.85, "sm_s": 0.42},
        "faults": [
            {
                "at_s": 5.0,
                "action": "link_down",
                "target": "agg0_0:3-core0:1",
                "t_fault_s": 5.012,
                "phases_ms": {"detect": 0.31, "trap": 1.24, "routed": 3.4, "programmed": 8.71},
                "flows": [
                    {
                        "flow": "bulk",
                        "blackout_ms": 9.8,
                        "resume_ms": 10.2,
                        "lost": 37,
                        "retransmitted": 41,
                    },
                    {
                        "flow": "probe",
                        "blackout_ms": 0.2,
                        "resume_ms": 0.3,
                        "lost": 0,
                        "retransmitted": 0,
                    },
                ],
            },
            {
                "at_s": 12.0,
                "action": "switch_down",
                "target": "core3",
                "t_fault_s": 12.004,
                "phases_ms": {"detect": 0.52, "trap": 2.9, "routed": 6.1, "programmed": 19.4},
                "flows": [
                    {
                        "flow": "bulk",
                        "blackout_ms": None,
                        "resume_ms": None,
                        "lost": 0,
                        "retransmitted": 0,
                    },
                    {
                        "flow": "probe",
                        "blackout_ms": 21.3,
                        "resume_ms": 21.9,
                        "lost": 213,
                        "retransmitted": 0,
                    },
                ],
            },
        ],
        "traffic": [
            {
                "name": "bulk",
                "kind": "write_bw",
                "from": "h0",
                "to": "h15",
                "gbps": 2.41,
                "packets": 1_472_930,
                "bytes": 6_033_121_280,
                "timeline": _timeline(2.5, [(5.0, 5.1)]),
                "extra": {"qps": 2, "size": 65536},
            },
            {
                "name": "probe",
                "kind": "stream",
                "from": "h1",
                "to": "h14",
                "gbps": 0.08,
                "packets": 199_787,
                "bytes": 10_228_992,
                "timeline": _timeline(0.082, [(12.0, 12.1)]),
                "extra": {"rate_pps": 10000},
            },
            {
                "name": "ring",
                "kind": "allreduce",
                "from": "h2",
                "to": ["h3", "h6", "h7", "h10", "h11"],
                "gbps": 1.12,
                "packets": 402_118,
                "bytes": 1_647_075_328,
                "timeline": _timeline(1.15, [(5.0, 5.1), (12.0, 12.1)]),
                "extra": {"busbw_gbps": 0.93, "latency_us": {"p50": 41.2, "p99": 118.0}},
            },
        ],
        "fidelity": {
            "valid": True,
            "dilation": 1.0,
            "threshold_us": 2000.0,
            "worst_lag_us": 812.0,
            "worst_process": "agent-host",
            "processes": {
                "agent-host": {"p50_us": 95.1, "p99_us": 812.0, "max_us": 1403.2, "samples": 2311},
                "sm": {"p50_us": 88.0, "p99_us": 402.5, "max_us": 950.0, "samples": 2305},
            },
            "worst_link": None,
            "note": "every process kept up: p99 lag under 2 ms of emulated time",
        },
        "files": {
            "events": "runs/default/events.jsonl",
            "json": "results/default.json",
            "plots": [],
            "captures": ["runs/default/agg0_0-3.pcap"],
        },
    }
