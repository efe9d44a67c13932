"""Rates after the line code, serialization, propagation, switch models, analytic figures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibemu.errors import ConfigError
from ibemu.physics import expect
from ibemu.physics.link import (
    ETH_FRAMING_BYTES,
    IB_FRAMING_BYTES,
    LANE_CODING,
    LinkModel,
    data_gbps,
    default_switch_model,
    propagation_ns,
    switch_model,
)
from ibemu.topo.rates import LANE_GBPS, WIDTHS, LinkRate, parse_rate


@pytest.mark.parametrize(("rate", "gbps"), [
    ("4x EDR", 100.0), ("NDR", 400.0), ("4x HDR", 200.0), ("4x QDR", 32.0), ("1x SDR", 2.0),
    ("4x FDR10", 40.0), ("12x EDR", 300.0),
])
def test_data_rate_after_line_code(rate: str, gbps: float) -> None:
    assert data_gbps(parse_rate(rate)) == pytest.approx(gbps)


def test_fdr_is_64b66b() -> None:
    assert data_gbps(parse_rate("4x FDR")) == pytest.approx(4 * 14.0625 * 64 / 66)


def test_data_rate_never_exceeds_signalling() -> None:
    for speed, (sig, _code, data) in LANE_CODING.items():
        assert data <= sig
        assert data <= LANE_GBPS[speed] + 1e-9


@given(st.sampled_from(WIDTHS), st.sampled_from(sorted(LANE_GBPS)), st.integers(1, 10_000))
def test_serialization_is_bytes_over_data_rate(width: int, speed: str, size: int) -> None:
    rate = LinkRate(width, speed)
    lm = LinkModel.of(rate)
    assert lm.serialization_ns(size) == pytest.approx((size + IB_FRAMING_BYTES) * 8 / data_gbps(rate))
    assert lm.frame_ns(size) >= lm.serialization_ns(size) - 1e-6
    assert lm.frame_ns(size) < lm.serialization_ns(size) + 1


def test_edr_4k_packet() -> None:
    lm = LinkModel.of(parse_rate("4x EDR"))
    assert lm.frame_ns(4126) == 331  # (4126 + 2) * 8 / 100 = 330.24
    eth = LinkModel.of(parse_rate("100G"), ethernet=True)
    assert eth.serialization_ns(1000) == pytest.approx((1000 + ETH_FRAMING_BYTES) * 0.08)


def test_propagation() -> None:
    assert propagation_ns(cable_m=10) == 50
    assert propagation_ns(delay_us=2, cable_m=10) == 2000  # delay_us wins
    assert LinkModel.of(parse_rate("EDR"), cable_m=3).propagation == 15
    with pytest.raises(ValueError):
        propagation_ns(delay_us=-1)
    with pytest.raises(ValueError):
        LinkModel(gbps=0)


def test_switch_models() -> None:
    assert default_switch_model(parse_rate("EDR"), ethernet=False).latency_ns == 90
    assert default_switch_model(parse_rate("HDR"), ethernet=False).latency_ns == 130
    assert default_switch_model(parse_rate("NDR"), ethernet=False).name == "ib-ndr"
    assert default_switch_model(parse_rate("NDR"), ethernet=True).ethernet
    with pytest.raises(ConfigError, match="no switch model"):
        switch_model("ib-xyz")


def test_expectations() -> None:
    lm = LinkModel.of(parse_rate("4x EDR"), cable_m=2)
    assert expect.hop_latency_ns(4096, lm, 90) == 90 + lm.frame_ns(4096) + 10
    assert expect.path_latency_ns(4096, [lm, lm], [90]) == 2 * (lm.frame_ns(4096) + 10) + 90
    with pytest.raises(ValueError):
        expect.path_latency_ns(4096, [lm], [90])
    assert expect.wire_efficiency(4096, lm) == pytest.approx(4096 / 4098)
