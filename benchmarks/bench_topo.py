"""Topology figures: k=16 fat-tree generate + validate, and a 10,000-node ibnetdiscover import.

Run: ``.venv/bin/python benchmarks/bench_topo.py``. Prints the best of several runs; targets
are <= 1 s and <= 3 s.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ibemu.topo import generate
from ibemu.topo import ibnetdiscover as ib

T = TypeVar("T")


def best(fn: Callable[[], T], runs: int) -> tuple[float, T]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main() -> int:
    def gen_validate() -> int:
        t = generate("fat-tree", k=16)
        problems = t.validate()
        assert not problems, problems[:3]
        return t.counts().nodes

    secs, _ = best(gen_validate, 5)
    ft = generate("fat-tree", k=16).counts()
    print(
        f"fat-tree k=16 generate+validate: {secs * 1000:7.1f} ms  ({ft.nodes} nodes, {ft.links} links; target <= 1000 ms)"
    )
    ok = secs <= 1.0

    big = generate("fat-tree", k=34, hosts_per_edge=15)  # 10,115 nodes: the "10,000-node cluster"
    with tempfile.TemporaryDirectory(prefix="ibemu-bench-") as tmp:
        path = Path(tmp) / "big.ibnd"
        export_secs, _ = best(lambda: ib.dump(big, path), 3)
        size = path.stat().st_size
        lines = path.read_text().count("\n")
        import_secs, back = best(lambda: ib.load(path), 3)
    c = back.counts()
    assert back.graph_key() == big.graph_key()
    print(
        f"ibnetdiscover import (10k nodes):  {import_secs * 1000:7.1f} ms  ({c.nodes} nodes, {c.links} links, "
        f"{lines} lines, {size / 1e6:.1f} MB; target <= 3000 ms)"
    )
    print(f"ibnetdiscover export (10k nodes):  {export_secs * 1000:7.1f} ms")
    ok = ok and import_secs <= 3.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
