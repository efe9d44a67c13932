"""``dilation: auto``'s sans-IO parts: the choice from (load, capacity, headroom) and a
scenario's offered load (``ibemu.scenario.autodilation``)."""

from __future__ import annotations

import pytest

from ibemu.scenario import loads_scenario
from ibemu.scenario.autodilation import HEADER_BYTES, MAX_DILATION, choose, offered_load


def test_a_load_that_fits_picks_one() -> None:
    c = choose(0.0, 100_000)
    assert c.dilation == 1 and c.reasons == ("no traffic",)
    c = choose(50_000, 100_000, 0.5)
    assert c.dilation == 1 and "fits" in c.reasons[0]
    assert "offered load 50k frame-hops/s, capacity 100k frame-hops/s, headroom 50% -> N = 1" in c.line()


@pytest.mark.parametrize("load, capacity, headroom, n", [
    (50_001, 100_000, 0.5, 2),
    (100_000, 100_000, 0.5, 2),
    (100_001, 100_000, 0.5, 3),
    (1_000_000, 250_000, 1.0, 4),
    (3_000_000, 60_000, 0.5, 100),
])
def test_the_smallest_integer_factor_that_fits(load: float, capacity: float, headroom: float, n: int) -> None:
    c = choose(load, capacity, headroom)
    assert c.dilation == n and load / n <= capacity * headroom < load / (n - 1)


def test_beyond_the_cap_and_bad_figures_are_refused() -> None:
    assert choose(MAX_DILATION * 1000.0, 2000, 0.5).dilation == MAX_DILATION
    with pytest.raises(ValueError, match=r"needs dilation 1001 .* above the cap of 1000: the scenario cannot be run"):
        choose(MAX_DILATION * 1000.0 + 1, 2000, 0.5)
    with pytest.raises(ValueError, match="above the cap of 10"):
        choose(11.0, 1.0, 1.0, cap=10)
    for capacity in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="no usable calibration"):
            choose(1.0, capacity)
    for headroom in (0.0, 1.5):
        with pytest.raises(ValueError, match="headroom"):
            choose(1.0, 1.0, headroom)
    for load in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="offered load"):
            choose(load, 1.0)


LEAF_SPINE = """
topology: {generator: leaf-spine, leaves: 2, spines: 2, hosts_per_leaf: 2}
defaults: {rate: 4x EDR, mtu: 4096}
fabric: {datapath: user}
duration_s: 10
"""


def test_offered_load_of_paced_and_unpaced_flows() -> None:
    scen = loads_scenario(LEAF_SPINE + """traffic:
  - {name: probe, kind: stream, from: h0, to: h2, size: 256, rate_pps: 1000}
  - {name: big, kind: stream, from: h0, to: h1, size: 10000, rate_pps: 100}
  - {name: bulk, kind: write_bw, from: h1, to: h3, size: 64KiB, start_s: 2, stop_s: 4}
  - {name: lat, kind: write_lat, from: h2, to: h3}
""", "x.yaml")
    load = offered_load(scen)
    by = {f.name: f for f in load.flows}
    assert set(by) == {"probe h0->h2", "big h0->h1", "bulk h1->h3"}
    assert by["probe h0->h2"].frames_per_s == 1000 and by["probe h0->h2"].hops == 3  # leaf, spine, leaf
    assert by["big h0->h1"].frames_per_s == 300 and by["big h0->h1"].hops == 1  # 3 frames a message, one leaf
    bulk = by["bulk h1->h3"]
    assert bulk.frames_per_s == pytest.approx(100e9 / 8 / (4096 + HEADER_BYTES)) and bulk.hops == 3
    assert load.frame_hops_per_s == pytest.approx(3000 + 300 + bulk.frame_hops_per_s)  # the peak: 2..4 s
    assert load.frame_bytes == 4096 + HEADER_BYTES
    assert any("write_lat" in n for n in load.notes)
    # flows one after the other do not add up
    late = loads_scenario(LEAF_SPINE + """traffic:
  - {name: first, kind: stream, from: h0, to: h2, size: 256, rate_pps: 1000, stop_s: 4}
  - {name: then, kind: stream, from: h0, to: h2, size: 256, rate_pps: 500, start_s: 5}
""", "x.yaml")
    assert offered_load(late).frame_hops_per_s == 3000
    # the kernel datapath forwards in the kernel: each frame costs its two endpoints, a stream's
    # message (its own completion and ACK) twice that
    kernel = loads_scenario(LEAF_SPINE.replace("datapath: user", "datapath: kernel") + """traffic:
  - {name: probe, kind: stream, from: h0, to: h2, size: 256, rate_pps: 1000}
  - {name: bulk, kind: write_bw, from: h1, to: h3, size: 4096, rate_pps: 1000}
""", "x.yaml")
    assert offered_load(kernel).frame_hops_per_s == 4000 + 2000 and "kernel datapath" in offered_load(kernel).notes[0]


def test_unpaced_flows_of_one_host_share_its_cable_and_shapes_expand() -> None:
    scen = loads_scenario(LEAF_SPINE + """traffic:
  - {name: a, kind: write_bw, from: h0, to: h2, size: 4096, bidirectional: true}
  - {name: b, kind: send_bw, from: h0, to: h3, size: 4096}
  - {name: in, kind: incast, from: [h1, h2], to: h3, size: 4096}
""", "x.yaml")
    by = {f.name: f for f in offered_load(scen).flows}
    assert set(by) == {"a h0->h2", "a h2->h0", "b h0->h3", "in h1->h3", "in h2->h3"}
    line = 100e9 / 8 / (4096 + HEADER_BYTES)
    assert by["a h0->h2"].frames_per_s == pytest.approx(line / 2)  # h0's cable: a and b
    assert by["a h2->h0"].frames_per_s == pytest.approx(line / 2)  # h2's: a's way back and the incast
    assert by["in h1->h3"].frames_per_s == pytest.approx(line)


def test_a_paced_bandwidth_flow_counts_its_rate_and_the_default_scenario_is_paced() -> None:
    """``rate_pps`` on a bandwidth kind: messages/s, counted like a stream's (frames per
    message x rate); without it the flow stays unpaced (None, its cable's rate)."""
    kernel = LEAF_SPINE.replace("datapath: user", "datapath: kernel")
    scen = loads_scenario(kernel + """traffic:
  - {name: bulk, kind: write_bw, from: h0, to: h2, size: 64KiB, qps: 2, rate_pps: 200}
  - {name: free, kind: write_bw, from: h1, to: h3, size: 4096}
""", "x.yaml")
    bulk, free = scen.traffic
    assert bulk.rate_pps == 200 and free.rate_pps is None
    by = {f.name: f for f in offered_load(scen).flows}
    assert by["bulk h0->h2"].frames_per_s == 200 * 16 and "200 msg/s x 16 frames" in by["bulk h0->h2"].how
    assert "unpaced" in by["free h1->h3"].how
    from ibemu.scenario import load_builtin

    default = load_builtin()
    assert {t.name: t.rate_pps for t in default.traffic} == {"bulk": 200, "probe": 2000}
    assert offered_load(default).frame_hops_per_s == 200 * 16 * 2 + 2000 * 4  # kernel datapath: 2 endpoints, 4 a stream's


def test_the_busiest_worker_bounds_the_factor_on_its_own() -> None:
    """One traffic worker is one process on one core: its own load (its endpoints and, on the
    kernel datapath, the switches its frames and a stream's ACKs cross in its send calls) gets
    a quarter of the capacity, so a fast stream needs a factor the whole run's load would not."""
    kernel = LEAF_SPINE.replace("datapath: user", "datapath: kernel")
    scen = loads_scenario(kernel + """traffic:
  - {name: probe, kind: stream, from: h0, to: h2, size: 256, rate_pps: 30000}
  - {name: bulk, kind: write_bw, from: h1, to: h3, size: 64KiB, rate_pps: 100}
""", "x.yaml")
    load = offered_load(scen)
    # leaf, spine, leaf: 3 switches, crossed by each message and its ACK: 4 + 0.5 x 3 x 2 = 7 units
    assert load.worker == ("probe", 30000 * 7)
    assert load.frame_hops_per_s == 30000 * 4 + 100 * 16 * 2  # the run's load: endpoints only
    assert choose(load.frame_hops_per_s, 100_000).dilation == 3  # the run's load alone: 123.2k / 3 <= 50k
    c = choose(load.frame_hops_per_s, 100_000, worker=load.worker)
    assert c.dilation == 9 and "worker probe" in c.line()  # 210k / 9 <= 25k
    user = loads_scenario(LEAF_SPINE + """traffic:
  - {name: probe, kind: stream, from: h0, to: h2, size: 256, rate_pps: 30000}
""", "x.yaml")
    assert offered_load(user).worker == ("probe", 30000 * 4)  # the user datapath's hops are the agent host's
    assert choose(0.0, 100_000, worker=("w", 0.0)).dilation == 1
    with pytest.raises(ValueError):
        choose(1.0, 1.0, worker=("w", -1.0))
    with pytest.raises(ValueError):
        choose(1.0, 1.0, worker_headroom=0.0)


def test_the_choice_says_what_the_run_will_be_judged_on() -> None:
    from ibemu.scenario.autodilation import judged
    from ibemu.scenario.schema import TimeSpec

    assert judged(1) == "judged on: every process's p99 lag < 2 ms (2 ms of real time)"
    assert judged(6).startswith("judged on: every process's p99 lag < 2 ms emulated = 12 ms real; with a time "
                                "figure (a latency, a training step) < 333 us emulated = 2 ms real, relaxed up to 5%")
    assert "< 0.1 us emulated = 2 ms real" in judged(20_000)
    assert "< 833 us emulated = 5 ms real" in judged(6, TimeSpec(lag_threshold_real_us=5000.0))
    assert "< 300 us emulated = 1.8 ms real (time.lag_threshold_us" in judged(6, TimeSpec(lag_threshold_us=300.0))
