"""Training jobs with tensor and pipeline parallelism on a real fabric (``ibemu run``, at the
scenario's dilation): every microbatch's activations and gradients cross between the stages as
RDMA writes and arrive intact, each stage's gradients are allreduced exactly, and the measured
pipeline holds its work and its bubble, within the model's time."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ibemu.kernel import netns
from ibemu.report import validate

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
SCENARIO = """
name: pytest-pipeline
topology: {{generator: gpu-rails, servers: 4, rails: {rails}, spines: 1}}
defaults: {{rate: 4x NDR, cable_m: 2}}
fabric: {fabric}
{sm}gpus: {{model: H100, per_server: 8, rails: {rails}}}
traffic:
  - {{name: job, kind: training, hosts: all, model: llama2-7b, tokens_per_step: 250000, scale: 30000, {job}}}
duration_s: 0.0004
time: {{dilation: 20000}}
"""


@pytest.mark.parametrize(("fabric", "rails", "job"), [
    # one server a stage: only the pipeline crosses the fabric (the DP allreduce is NVLink's)
    ("{kind: roce, datapath: user, pfc: true}", 1, "tensor: 2, pipeline: 4, microbatches: 4, algorithm: tree"),
    # two servers a stage, two rails: transfers rail by rail and a DP ring per rail and stage
    ("{kind: ib, datapath: user}", 2, "pipeline: 2, microbatches: 3, algorithm: ring, overlap: 0.5"),
], ids=["roce-p4-t2", "ib-p2-rails2"])
def test_pipeline_job_moves_checked_microbatches(fabric: str, rails: int, job: str, state_dir: Path,
                                                 tmp_path: Path) -> None:
    sm = "sm: {impl: ibemu, engine: updn}\n" if "ib," in fabric else ""
    scen = tmp_path / "s.yaml"
    scen.write_text(SCENARIO.format(fabric=fabric, rails=rails, job=job, sm=sm))
    out, result_path = tmp_path / "o", tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--json", str(result_path),
                           "--out", str(out), "--no-plots", "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_id,) = set(re.findall(r"ibemu-([0-9a-f]+)-", (out / "run" / "traffic-0.json").read_text()))
    assert not [n for n in netns.list_names() if run_id in n]  # torn down
    result = json.loads(result_path.read_text())
    assert validate(result) == []
    assert "Tensor and pipeline parallelism (1)" in proc.stdout
    (t,) = result["traffic"]
    x = t["extra"]
    assert "error" not in x, x["error"]
    assert x["steps"] >= 2 and x["wrong"] == 0, x
    assert t["bytes"] >= x["steps"] * x["pp_bytes_per_step"] > 0
    # the measured pipeline: at least its work and its bubble (emulated sleeps), at most the
    # model's (whose transfers pay NCCL's 9.6 us step latency, more than these cables take)
    work = (x["model_compute_s"] + x["model_tp_s"]) / x["scale"]
    bubble = x["model_bubble_s"] / x["scale"]
    assert work + bubble <= x["pipeline_s"] * 1.001, x
    assert x["pipeline_s"] <= x["model_scaled_pipeline_s"] * 1.05, x
