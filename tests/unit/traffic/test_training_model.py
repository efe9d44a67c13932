"""The training step model against values computed by hand (``ibemu.traffic.training``)."""

from __future__ import annotations

import pytest

from ibemu.traffic.training import (
    GpuCluster,
    JobPlan,
    StepMeasure,
    TrainingJob,
    allreduce_time,
    compute_time,
    fabric_bytes_per_rail,
    fault_impact,
    measured_figures,
    model_step,
    place,
    step_time,
)

NDR = GpuCluster(gpu="H100", per_server=8, rails=1, rail_gbps=400.0)  # 50e9 B/s a rail, NVLink4 450e9


def test_compute_time_is_six_p_t_over_flops() -> None:
    job = TrainingJob(model="llama2-70b", servers=4, mfu=0.4)
    # 6 x 70e9 x 4e6 = 1.68e18 FLOPs over 32 x 989e12 x 0.4 = 1.26592e16 FLOP/s
    assert compute_time(job, NDR) == pytest.approx(1.68e18 / 1.26592e16)
    assert compute_time(job, NDR) == pytest.approx(132.7098, rel=1e-5)
    b200 = GpuCluster(gpu="B200")
    assert compute_time(job, b200) == pytest.approx(1.68e18 / (32 * 2.25e15 * 0.4))


def test_ring_two_servers() -> None:
    # n = 16: 2 x 15/16 x 1e9 / 50e9 = 37.5 ms; 28 NVLink steps x 3.4 us + 2 network steps x 9.6 us
    t = allreduce_time("ring", 1e9, 2, NDR)
    assert t.fabric_s == pytest.approx(0.0375 + 2 * 9.6e-6)
    assert t.nvlink_s == pytest.approx(28 * 3.4e-6)
    assert t.total_s == pytest.approx(0.0376144)


def test_hierarchical_two_servers() -> None:
    # reduce-scatter: 7/8 x 1e9 / 450e9 + 7 x 3.4 us, twice (with the all-gather)
    t = allreduce_time("hierarchical", 1e9, 2, NDR)
    assert t.nvlink_s == pytest.approx(2 * (7 / 8 * 1e9 / 450e9 + 7 * 3.4e-6))
    # between the servers: 2 x 1/2 x 1e9 / 50e9 + 2 x 9.6 us
    assert t.fabric_s == pytest.approx(0.02 + 19.2e-6)
    assert t.total_s == pytest.approx(0.0239557, rel=1e-5)
    # eight rails carry it eight times as fast
    assert allreduce_time("hierarchical", 1e9, 2, GpuCluster(rails=8)).fabric_s == pytest.approx(0.0025 + 19.2e-6)


def test_tree_four_servers() -> None:
    t = allreduce_time("tree", 1e9, 4, NDR)
    assert t.fabric_s == pytest.approx(2 * 1e9 / 50e9 + 2 * 2 * 9.6e-6)
    assert t.nvlink_s == pytest.approx(2 * 7 * 3.4e-6)


def test_one_server_is_all_nvlink() -> None:
    t = allreduce_time("hierarchical", 1e9, 1, NDR)
    assert t.fabric_s == 0.0
    assert t.nvlink_s == pytest.approx(2 * 7 / 8 * 1e9 / 450e9 + 14 * 3.4e-6)
    assert allreduce_time("ring", 1e9, 1, GpuCluster(per_server=1)).total_s == 0.0


def test_overlap_hides_communication_behind_the_backward_pass() -> None:
    assert step_time(3.0, 1.5, 0.0) == pytest.approx(4.5)
    assert step_time(3.0, 1.5, 0.5) == pytest.approx(3.5)  # 1 s of the 2 s backward pass overlaps
    assert step_time(3.0, 1.5, 1.0) == pytest.approx(3.0)  # all of it hidden


def test_model_step_efficiency_and_time_to_train() -> None:
    job = TrainingJob(model="gpt3-175b", servers=2, algorithm="ring", tokens_per_step=1e6)
    m = model_step(job, NDR)
    t_c = 6 * 175e9 * 1e6 / (16 * 989e12 * 0.4)
    t_comm = allreduce_time("ring", 350e9, 2, NDR).total_s  # BF16 gradients: 2 bytes a parameter
    assert m.compute_s == pytest.approx(t_c)
    assert m.comm_s == pytest.approx(t_comm)
    assert m.step_s == pytest.approx(t_c + t_comm)
    assert m.efficiency == pytest.approx(t_c / (t_c + t_comm))
    assert m.comm_share == pytest.approx(t_comm / (t_c + t_comm))
    assert m.time_to_train_s == pytest.approx(300e9 / 1e6 * (t_c + t_comm))


def test_fabric_bytes_per_rail() -> None:
    assert fabric_bytes_per_rail("hierarchical", 8e6, 2, GpuCluster(rails=2)) == pytest.approx(4e6)
    # a 16-rank ring sends 2 x 15/16 S per cable; a 2-rank ring over X sends X: X = 15/16 S x 2
    assert fabric_bytes_per_rail("ring", 8e6, 2, NDR) == pytest.approx(8e6 * 15 / 16 * 2)
    assert fabric_bytes_per_rail("ring", 8e6, 1, NDR) == 0.0
    # a double binary tree of S/R per rail: each server's cable carries 2 S/R each way
    assert fabric_bytes_per_rail("tree", 8e6, 4, GpuCluster(rails=2)) == pytest.approx(4e6)
    with pytest.raises(ValueError, match="not emulated"):
        fabric_bytes_per_rail("butterfly", 8e6, 2, NDR)


def test_fault_impact_stall_and_slower_steps() -> None:
    # steps of 100 us end at 100..400 us; the fault at 450 us; a 700 us step, two of 150, then 100s
    ends = [100_000, 200_000, 300_000, 400_000, 1_100_000, 1_250_000, 1_400_000, 1_500_000, 1_600_000]
    us = [100.0, 100.0, 100.0, 100.0, 700.0, 150.0, 150.0, 100.0, 100.0]
    x = fault_impact(ends, us, 450_000)
    assert x["base_us"] == 100.0 and x["stall_us"] == 700.0 and x["stall_x"] == 7.0
    assert x["gap_us"] == 700.0  # 400 us -> 1,100 us
    assert x["into_us"] == 50.0  # the step under way had run 50 us (from 400 us) at the fault
    assert x["worst_us"] == 700.0 and x["slow_steps"] == 3 and x["steps_after"] == 5
    assert x["after_us"] == pytest.approx(125.0) and x["after_x"] == pytest.approx(1.25)
    # up to the next fault only; none before the fault: no base, no ratios
    y = fault_impact(ends, us, 450_000, until_ns=1_250_000)
    assert y["steps_after"] == 2 and y["after_us"] == 150.0
    # the stalled step counts even when it ends after the next fault; nothing after it then
    w = fault_impact(ends, us, 450_000, until_ns=1_000_000)
    assert w["stall_us"] == 700.0 and w["steps_after"] == 0 and w["after_us"] is None and w["slow_steps"] == 1
    z = fault_impact(ends[4:], us[4:], 450_000)
    assert z["base_us"] is None and z["stall_x"] is None and z["slow_steps"] == 0 and z["gap_us"] == 650.0
    assert z["into_us"] is None  # no step ended before the fault: where it fell is unknown
    assert fault_impact(ends, us, 2_000_000) == {}


def test_plan_scales_compute_and_bytes() -> None:
    job = TrainingJob(model="llama2-7b", servers=2, overlap=0.5)
    plan = JobPlan(job, NDR, scale=1e5)
    t_c = 6 * 7e9 * 4e6 / (16 * 989e12 * 0.4)
    assert plan.forward_s + plan.backward_s == pytest.approx(t_c / 1e5)
    assert plan.rail_bytes == 14e9 // 1e5 // 4 * 4
    comm = allreduce_time("hierarchical", 14e9 / 1e5, 2, NDR)
    full = allreduce_time("hierarchical", 14e9, 2, NDR)
    assert plan.nvlink_s == pytest.approx(full.nvlink_s / 1e5)  # NVLink's latency scaled with the rest
    assert plan.scaled_fabric_s == pytest.approx(comm.fabric_s)  # the fabric's latency is what it is
    assert plan.scaled_step_s == pytest.approx(step_time(t_c / 1e5, full.nvlink_s / 1e5 + comm.fabric_s, 0.5))
    assert JobPlan.from_json(plan.to_json()) == plan
    f = measured_figures(plan, [StepMeasure(plan.scaled_step_s * 2, comm.fabric_s * 3)] * 2)
    assert f["steps"] == 2
    assert f["step_us"] == [pytest.approx(plan.scaled_step_s * 2e6, abs=1e-3)] * 2
    assert f["fabric_busbw_gbs"] == pytest.approx(plan.rail_bytes / (comm.fabric_s * 3) / 1e9, rel=1e-3)
    assert f["efficiency"] == pytest.approx(t_c / 1e5 / (2 * plan.scaled_step_s), rel=1e-3)
    full = step_time(t_c, plan.model.comm.nvlink_s + comm.fabric_s * 3 * 1e5, 0.5)
    assert f["projected_step_s"] == pytest.approx(full, rel=1e-5)
    assert "step_s" not in measured_figures(plan, [])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpu": "H1000"}, "unknown GPU 'H1000'"),
    ({"nvlink": "nvlink9"}, "unknown NVLink generation"),
    ({"rails": 3}, r"rails \(3\) must divide the GPUs per server \(8\)"),
    ({"per_server": 0}, "per_server must be >= 1"),
])
def test_bad_cluster(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GpuCluster(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": "gpt5"}, "unknown model 'gpt5'"),
    ({"algorithm": "butterfly"}, "unknown allreduce algorithm"),
    ({"mfu": 1.5}, r"mfu must be in \(0, 1\]"),
    ({"overlap": -0.1}, r"overlap must be in \[0, 1\]"),
    ({"servers": 0}, "at least one server"),
])
def test_bad_job(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingJob(**kwargs)  # type: ignore[arg-type]


GROUPS = [0, 0, 1, 1, 2, 2]  # six servers, two a leaf


@pytest.mark.parametrize(("policy", "taken", "n", "want"), [
    ("packed", set(), 3, [0, 1, 2]),
    ("spread", set(), 3, [0, 2, 4]),
    ("spread", set(), 4, [0, 2, 4, 1]),
    ("topology", set(), 2, [0, 1]),
    ("topology", {0}, 2, [2, 3]),  # leaf 0 has one free: the first leaf with two
    ("topology", {0}, 1, [1]),  # best fit: the leaf with the least room that fits
    ("topology", set(), 3, [0, 1, 2]),  # no leaf holds three: the fullest leaves first
    ("packed", {0, 1}, 2, [2, 3]),
])
def test_placement(policy: str, taken: set[int], n: int, want: list[int]) -> None:
    free = [i for i in range(6) if i not in taken]
    assert place(policy, free, GROUPS, n) == want


def test_placement_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="7 servers do not fit: 6 of the pool's 6 are free"):
        place("packed", list(range(6)), GROUPS, 7)
    with pytest.raises(ValueError, match="unknown placement"):
        place("random", list(range(6)), GROUPS, 2)
