"""The summary's "Training jobs" table: a job's measured step beside the model's."""

from __future__ import annotations

from ibemu.report import summary, validate
from ibemu.traffic.training import (
    GpuCluster,
    JobPlan,
    StepMeasure,
    TrainingJob,
    fault_impact,
    measured_figures,
)
from tests.unit.report.sample import result


def test_training_jobs_table() -> None:
    plan = JobPlan(TrainingJob(model="llama2-7b", servers=4, tokens_per_step=2.5e5), GpuCluster(rails=2), 1e4)
    r = result()
    flow = dict(r["traffic"][0])
    flow.update(name="train", kind="training",
                extra=measured_figures(plan, [StepMeasure(160e-6, 72e-6), StepMeasure(170e-6, 78e-6)]))
    idle = dict(r["traffic"][0], name="idle", kind="training", extra=measured_figures(plan, []))
    r["traffic"] = [*r["traffic"], flow, idle]
    lines = summary(r).splitlines()
    start = lines.index("Training jobs (2)")
    header = lines[start + 3]
    assert header.split()[:8] == ["job", "GPUs", "model", "allreduce", "scale", "steps", "step", "us"]
    cells = next(ln for ln in lines[start:] if ln.strip().startswith("train ")).split()
    assert cells[1:8] == ["32", "H100", "llama2-7b", "hierarchical", "o=0", "10000", "2"]
    assert cells[8] == "165.0"  # the mean measured step, us
    assert f"{plan.scaled_step_s * 1e6:,.1f}" in cells  # the model's beside it
    assert f"{plan.model.step_s:.2f}" in cells
    idle_row = next(ln for ln in lines[start:] if ln.strip().startswith("idle "))
    assert idle_row.split()[7:9] == ["0", "-"]  # no step measured: no figure, the model's still given


def test_no_training_no_section() -> None:
    assert "Training jobs" not in summary(result())


def test_training_under_faults_table() -> None:
    r = result()
    ends = [100_000, 200_000, 300_000, 1_000_000, 1_150_000, 1_250_000]
    us = [100.0, 100.0, 100.0, 700.0, 150.0, 100.0]
    r["faults"][0]["flows"] = [*r["faults"][0]["flows"],
                               {"flow": "train", "blackout_ms": 0.7, "resume_ms": 0.7, "lost": 0, "retransmitted": 12,
                                "training": fault_impact(ends, us, 350_000)}]
    r["fabric"]["dilation"] = 100
    assert validate(r) == []
    lines = summary(r).splitlines()
    start = lines.index("Training jobs under faults")
    assert any("dilation 100" in ln and "not to scale" in ln for ln in lines[start:start + 8])
    row = next(ln for ln in lines[start:] if " train " in ln).split()
    # #, fault (action target), job, base, stall, x, gap, worst, after, x, slow, steps, resent
    assert row[0] == "1" and row[3] == "train"
    assert row[4:] == ["100.0", "700.0", "7.00x", "700.0", "700.0", "125.0", "1.25x", "2", "3", "12"]
    # without a training row: no section
    r["faults"][0]["flows"] = r["faults"][0]["flows"][:-1]
    assert "Training jobs under faults" not in summary(r)


def test_tensor_and_pipeline_table() -> None:
    """A job with tensor and pipeline parallelism gets a row: its layout, the model's bubble, the
    measured idle share beside the model's and what its pipeline moved; a pure data-parallel
    job gets none."""
    plan = JobPlan(TrainingJob(model="llama2-70b", servers=4, tensor=8, pipeline=2, microbatches=8),
                   GpuCluster(rails=2), 1e6)
    r = result()
    pp = dict(r["traffic"][0], name="pp", kind="training",
              extra=measured_figures(plan, [StepMeasure(180e-6, 2e-6, 170e-6)]))
    dp_plan = JobPlan(TrainingJob(model="llama2-7b", servers=4), GpuCluster(rails=2), 1e4)
    dp = dict(r["traffic"][0], name="dp", kind="training", extra=measured_figures(dp_plan, [StepMeasure(1e-4, 5e-5)]))
    r["traffic"] = [*r["traffic"], pp, dp]
    assert validate(r) == []
    lines = summary(r).splitlines()
    start = lines.index("Tensor and pipeline parallelism (1)")
    rows = [ln.split() for ln in lines[start:start + 10] if ln.strip().startswith(("pp ", "dp "))]
    assert len(rows) == 1
    m = plan.model
    idle = (170e-6 - (m.compute_s + m.tp_s) / 1e6) / 180e-6
    assert rows[0] == ["pp", "8", "x", "2", "x", "2", "8", f"{m.bubble_share * 100:.1f}%", f"{idle * 100:.1f}%",
                       f"{(m.bubble_s + m.pp_s) / m.step_s * 100:.1f}%", f"{m.tp_s:.2f}", "131,072", "131.1"]
