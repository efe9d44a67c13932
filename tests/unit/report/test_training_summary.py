"""The summary's "Training jobs" table: a job's measured step beside the model's."""

from __future__ import annotations

from ibemu.report import summary
from ibemu.traffic.training import GpuCluster, JobPlan, StepMeasure, TrainingJob, measured_figures
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
