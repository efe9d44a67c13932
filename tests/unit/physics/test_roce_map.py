"""roce.queues.QueueConfig in the link model's terms."""

from __future__ import annotations

import pytest

from ibemu.physics.model import EthConfig
from ibemu.physics.plan import Cable
from ibemu.roce.physics import cables, eth_config, switch_model
from ibemu.roce.queues import QueueConfig
from ibemu.topo import generate


def test_queue_config_maps_onto_the_model() -> None:
    cfg = QueueConfig(line_gbps=0.1, buffer_kb=512, ecn_mark_kb=64, pfc=frozenset({3}), xoff_kb=64, xon_kb=32,
                      delay_us=1000)
    assert eth_config(cfg) == EthConfig(buffer_bytes=512 * 1024, lossless=frozenset({3}), xoff_bytes=64 * 1024,
                                        xon_bytes=32 * 1024, ecn_mark_bytes=64 * 1024)
    sw = switch_model(cfg)
    assert sw.name == "eth" and sw.latency_ns == 500 and sw.buffer_bytes == 512 * 1024 and sw.ethernet
    spectrum = switch_model(QueueConfig(switch="eth-spectrum", latency_ns=250))
    assert spectrum.latency_ns == 250 and spectrum.buffer_bytes == 1024 * 1024
    with pytest.raises(ValueError):
        switch_model(QueueConfig(switch="ib-edr"))


def test_cables_are_the_topologys_unless_overridden() -> None:
    topo = generate("single-switch", hosts=2)
    own = cables(topo, QueueConfig())
    assert {c.gbps for c in own} == {100.0} and {c.propagation_ns for c in own} == {0.0}  # 4x EDR default
    slow = cables(topo, QueueConfig(line_gbps=0.1, delay_us=2))
    assert {c.gbps for c in slow} == {0.1} and {c.propagation_ns for c in slow} == {2000.0}
    assert Cable.from_list(slow[0].to_list()) == slow[0]
