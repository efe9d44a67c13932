"""Latency tests' buffers: the polled mark byte starts at a value no iteration writes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ibemu.hca.transport.hca import Hca
from ibemu.traffic import perftest


@pytest.mark.parametrize("test", ["write_lat", "send_lat"])
def test_the_mark_byte_of_a_latency_side_starts_at_zero(test: str) -> None:
    """write_lat polls the first half's last byte for marks 1..255. Random content there (as
    the buffers' first 64 bytes are) let a side see its own mark before the peer wrote it, 1
    side in 256, and the ping-pong hung: 2,000 sides would have hit it almost surely."""
    opts = perftest.PerfOptions(test=test, size=64, iterations=1)
    port = SimpleNamespace(hca=Hca(lid=1))
    for _ in range(2000):
        side = perftest.Side.create(port, opts)  # type: ignore[arg-type]
        buf = side.mrs[0].buf
        assert len(buf) == 2 * opts.size and buf[opts.size - 1] == 0
