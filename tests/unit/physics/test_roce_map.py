"""roce.queues.QueueConfig in the link model's terms."""

from __future__ import annotations

from ibemu.physics.model import EthConfig
from ibemu.roce.physics import eth_config, link_model
from ibemu.roce.queues import QueueConfig


def test_queue_config_maps_onto_the_model() -> None:
    cfg = QueueConfig(line_gbps=0.1, buffer_kb=512, ecn_mark_kb=64, pfc=frozenset({3}), xoff_kb=64, xon_kb=32,
                      delay_us=1000)
    assert eth_config(cfg) == EthConfig(buffer_bytes=512 * 1024, lossless=frozenset({3}), xoff_bytes=64 * 1024,
                                        xon_bytes=32 * 1024, ecn_mark_bytes=64 * 1024)
    lm = link_model(cfg)
    assert lm is not None and lm.gbps == 0.1 and lm.propagation == 1_000_000 and lm.framing_bytes == 20
    assert link_model(QueueConfig()) is None
