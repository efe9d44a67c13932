"""Tensor and pipeline parallelism in the training model (``ibemu.traffic.training``), against
values computed by hand and an event-by-event schedule of the pipeline."""

from __future__ import annotations

import itertools

import pytest

from ibemu.traffic.training import (
    ALGORITHMS,
    MODELS,
    GpuCluster,
    JobPlan,
    StepMeasure,
    TrainingJob,
    allreduce_time,
    compute_time,
    fabric_bytes_per_rail,
    measured_figures,
    model_step,
    pipeline_time,
    pp_bytes_per_step,
    step_time,
)

NDR = GpuCluster(gpu="H100", per_server=8, rails=1, rail_gbps=400.0)  # 50e9 B/s a rail, NVLink4 450e9


@pytest.mark.parametrize(("model", "algorithm", "overlap", "servers", "rails"),
                         list(itertools.product(MODELS, ALGORITHMS, (0.0, 0.5, 1.0), (2, 3, 8), (1, 2))))
def test_one_stage_no_tensor_parallelism_is_todays_model(model: str, algorithm: str, overlap: float, servers: int,
                                                         rails: int) -> None:
    """T = P = 1 (one microbatch) gives exactly the pure data-parallel figures (== on floats)."""
    c = GpuCluster(rails=rails)
    for job in (TrainingJob(model=model, servers=servers, algorithm=algorithm, overlap=overlap),
                TrainingJob(model=model, servers=servers, algorithm=algorithm, overlap=overlap, tensor=1, pipeline=1,
                            microbatches=1)):
        m = model_step(job, c)
        t_c = compute_time(job, c)
        comm = allreduce_time(algorithm, job.grad_bytes, servers, c)
        assert (m.compute_s, m.comm, m.step_s) == (t_c, comm, step_time(t_c, comm.total_s, overlap))
        assert (m.tp_s, m.bubble_s, m.pp_s, m.bubble_share) == (0.0, 0.0, 0.0, 0.0)
        assert m.comm_share == (m.step_s - t_c) / m.step_s
        plan = JobPlan(job, c, 1e6)
        fabric = allreduce_time(algorithm, job.grad_bytes / 1e6, servers, c).fabric_s
        assert plan.scaled_step_s == step_time(t_c / 1e6, comm.nvlink_s / 1e6 + fabric, overlap)
        assert plan.rail_bytes == max(4, int(fabric_bytes_per_rail(algorithm, job.grad_bytes / 1e6, servers, c))
                                      // 4 * 4)
        assert plan.pp_bytes == 0
        assert "tensor" not in measured_figures(plan, [StepMeasure(1e-4, 1e-5)])


def test_tensor_and_pipeline_by_hand() -> None:
    """Llama 2 7B (h 4096, 32 layers) on 4 x 8 H100, one 400 Gb/s rail: T 4, P 2, m 8, so d 4."""
    job = TrainingJob(model="llama2-7b", servers=4, tensor=4, pipeline=2, microbatches=8)
    m = model_step(job, NDR)
    t_c = 6 * 7e9 * 4e6 / (32 * 989e12 * 0.4)
    assert m.compute_s == pytest.approx(t_c) and t_c == pytest.approx(13.27098, rel=1e-6)
    a = 4e6 / (4 * 8) * 4096 * 2  # a microbatch's activations of one replica
    assert a == 1.024e9
    # TP: 4 allreduces a layer and microbatch, 16 layers a stage, 8 microbatches; ring of 4 on NVLink
    tp = 4 * 16 * 8 * (2 * 3 / 4 * a / 450e9 + 2 * 3 * 3.4e-6)
    assert m.tp_s == pytest.approx(tp) and tp == pytest.approx(1.758071, rel=1e-6)
    # PP: a rail carries G/(T R) A = 2.048e9 bytes a microbatch and direction, 40.96 ms at 50e9 B/s
    x = 8 / 4 * a / 50e9
    assert m.bubble_s == pytest.approx((t_c + tp) / 8)
    assert m.pp_s == pytest.approx(2 * (x + 9.6e-6))  # the links keep up: t_f is 0.66 s
    assert m.pipeline_s == pytest.approx((t_c + tp) * 9 / 8 + 2 * (x + 9.6e-6))
    # DP: 4 allreduces of 2 x 7e9 / 8 bytes at once, each over 2 GPUs a server on 2 servers
    g = 2 * 7e9 / 8
    nv = 2 * (1 / 2 * g / 450e9 + 3.4e-6)
    fab = 2 * 1 / 2 * g / (50e9 / 4) + 2 * 9.6e-6
    assert (m.comm.nvlink_s, m.comm.fabric_s) == (pytest.approx(nv), pytest.approx(fab))
    assert m.step_s == pytest.approx(m.pipeline_s + nv + fab)  # no overlap
    # 15.029052 x 9/8 + 2 x 0.0409696 + 0.0038957 + 0.1400192
    assert m.step_s == pytest.approx(17.13354, rel=1e-6)
    assert m.bubble_share == pytest.approx(m.bubble_s / m.step_s)
    assert m.comm_share == pytest.approx((tp + m.pp_s + nv + fab) / m.step_s)
    assert pp_bytes_per_step(job, NDR) == pytest.approx(2 * 8 * 1 * 4 * a)
    # overlap hides the DP allreduce behind the first stage's last backward pass (t_b)
    o = TrainingJob(model="llama2-7b", servers=4, tensor=4, pipeline=2, microbatches=8, overlap=1.0)
    t_b = (2 * t_c / 3 + tp / 2) / 8
    assert model_step(o, NDR).step_s == pytest.approx(m.pipeline_s + max(0.0, nv + fab - t_b))
    # the default: 4 microbatches a stage
    assert TrainingJob(pipeline=2, servers=2).m == 8 and TrainingJob(servers=2).m == 1
    assert TrainingJob(pipeline=128, servers=128).m == 256


def _gpipe(p: int, m: int, t_f: float, t_b: float, x: float, a: float) -> float:
    """GPipe event by event: each stage and each link serves one microbatch at a time, in order;
    a transfer holds its link for ``x`` and lands ``a`` later. Returns when stage 0 ends."""
    done = [0.0] * p
    link = [0.0] * p
    ready = [[0.0] * m for _ in range(p)]
    for i in range(m):  # forward
        for k in range(p):
            done[k] = max(done[k], ready[k][i]) + t_f
            if k < p - 1:
                link[k] = max(link[k], done[k]) + x
                ready[k + 1][i] = link[k] + a
    back = [[0.0] * m for _ in range(p)]
    link = [0.0] * p
    for i in reversed(range(m)):  # backward
        for k in reversed(range(p)):
            done[k] = max(done[k], back[k][i]) + t_b
            if k:
                link[k - 1] = max(link[k - 1], done[k]) + x
                back[k - 1][i] = link[k - 1] + a
    return done[0]


@pytest.mark.parametrize(("p", "m", "x"), [(2, 8, 0.01), (4, 3, 0.02), (3, 12, 0.5), (4, 4, 2.0), (2, 1, 0.3)])
def test_pipeline_time_is_the_gpipe_schedule(p: int, m: int, x: float) -> None:
    """The closed form against the schedule run event by event, links keeping up or not."""
    job = TrainingJob(servers=p, pipeline=p, microbatches=m)
    t_c, tp, a = 3.0, 0.6, 0.001
    t_f, t_b = (t_c / 3 + tp / 2) / m, (2 * t_c / 3 + tp / 2) / m
    pipe, bubble, pp = pipeline_time(job, t_c, tp, x, a)
    assert pipe == pytest.approx(_gpipe(p, m, t_f, t_b, x, a))
    assert bubble == pytest.approx((p - 1) / m * (t_c + tp))
    assert pipe == pytest.approx(t_c + tp + bubble + pp)


def test_plan_scales_the_pipeline() -> None:
    c = GpuCluster(rails=2)
    job = TrainingJob(model="llama2-70b", servers=4, tensor=8, pipeline=2, microbatches=8)
    plan = JobPlan(job, c, 1e6)
    # a stage's DP: 2 x 70e9 / 2 / 1e6 = 70,000 bytes a server, hierarchical: half a rail
    assert plan.rail_bytes == 35000
    # PP: G/(T R) x 4e6 / (2 x 8) x 8192 x 2 / 1e6 = 2,048 bytes a rail, microbatch and direction
    assert plan.pp_bytes == 2048
    m = plan.model
    assert plan.mb_forward_s == pytest.approx((m.compute_s / 3 + m.tp_s / 2) / 8 / 1e6)
    assert plan.mb_backward_s == pytest.approx((2 * m.compute_s / 3 + m.tp_s / 2) / 8 / 1e6)
    assert JobPlan.from_json(plan.to_json()) == plan
    steps = [StepMeasure(180e-6, 2e-6, 170e-6), StepMeasure(190e-6, 2e-6, 180e-6)]
    x = measured_figures(plan, steps)
    assert (x["tensor"], x["pipeline"], x["microbatches"], x["replicas"], x["pp_bytes"]) == (8, 2, 8, 2, 2048)
    assert x["pipeline_s"] == pytest.approx(175e-6)
    assert x["pipeline_idle_share"] == pytest.approx(round((175e-6 - (m.compute_s + m.tp_s) / 1e6) / 185e-6, 4))
    assert x["pp_bytes_per_step"] == 2 * 8 * 1 * 2 * 2 * 2048  # both ways, m, boundaries, servers, rails
    assert x["model_bubble_share"] == round(m.bubble_share, 4)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"servers": 3, "pipeline": 2}, "pipeline (2) must divide the job's servers (3)"),
    ({"servers": 2, "pipeline": 0}, "tensor and pipeline must be >= 1"),
    ({"servers": 2, "tensor": 0}, "tensor and pipeline must be >= 1"),
    ({"servers": 2, "pipeline": 2, "microbatches": 257}, "microbatches 1-256"),
])
def test_bad_parallelism(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainingJob(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tensor \\(3\\) must divide the GPUs per server \\(8\\)"):
        TrainingJob(tensor=3, servers=2).check_cluster(NDR)
