"""GPU servers and training jobs in scenarios: what loads, and every bad input located."""

from __future__ import annotations

import pytest

from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.scenario.runner import flow_dict
from ibemu.traffic.training import JobPlan

LS = "topology: {generator: leaf-spine, leaves: 2, spines: 1, hosts_per_leaf: 4}\ndefaults: {rate: 4x HDR}\n"  # 8 CAs
TRAIN = "  - {name: t, kind: training, hosts: all, model: llama2-70b, scale: 1000000"


def load(gpus: str, job: str = TRAIN + "}") -> object:
    return loads_scenario(LS + gpus + "traffic:\n" + job + "\n", "x.yaml")


def test_servers_and_job() -> None:
    scen = loads_scenario(LS + "gpus: {model: B200, per_server: 8, rails: 2}\ntraffic:\n"
                          "  - {name: t, kind: training, hosts: [h6, h7, h2, h3], algorithm: ring, overlap: 0.25,"
                          " scale: 1000000, mfu: 0.5}\n", "x.yaml")
    assert scen.gpus is not None
    assert scen.gpus.servers == (("h0", "h1"), ("h2", "h3"), ("h4", "h5"), ("h6", "h7"))
    assert scen.gpus.cluster.rail_gbps == pytest.approx(200.0)  # 4x HDR's data rate
    assert scen.gpus.cluster.nvlink_bps == pytest.approx(900e9)  # B200: NVLink 5
    t = scen.traffic[0]
    assert t.hosts == ("h6", "h7", "h2", "h3")  # server by server, rails in order
    plan = t.training
    assert plan is not None
    assert (plan.job.servers, plan.job.algorithm, plan.job.overlap, plan.job.mfu) == (2, "ring", 0.25, 0.5)
    d = flow_dict(t, scen)
    assert JobPlan.from_json(d["training"]) == plan
    # ring over 16 GPUs on 2 servers, 2 rails: S/R x 15/16 x 2/1 per rail, S = 140e9 / 1e6 bytes
    assert plan.rail_bytes == int(140e3 / 2 * 15 / 16 * 2) // 4 * 4


@pytest.mark.parametrize(("gpus", "job", "message"), [
    ("gpus: {model: H1000}\n", TRAIN + "}",
     "x.yaml:3 gpus.model: expected one of A100, H100, H200, B200, got 'H1000'"),
    ("gpus: {nvlink: nvlink7}\n", TRAIN + "}", "x.yaml:3 gpus.nvlink: expected one of nvlink2"),
    ("gpus: {rails: 3}\n", TRAIN + "}", "x.yaml:3 gpus.rails: rails (3) must divide the GPUs per server (8)"),
    ("gpus: {per_server: 4, rails: 4}\n", TRAIN.replace("all", "[h0, h1, h2, h3]") + "}",
     "x.yaml:5 traffic[0].hosts: a training job on the fabric needs at least 2 servers, got 1"),
    ("gpus: {per_server: 2, rails: 2}\n", TRAIN.replace("all", "[h0, h1, h2]") + "}",
     "x.yaml:5 traffic[0].hosts: a job takes whole servers: server 1 is h2, h3, h3 missing"),
    ("", TRAIN + "}", "x.yaml:4 traffic[0]: kind training needs the GPU servers: a top-level gpus:"),
    ("gpus: {}\n", TRAIN.replace("llama2-70b", "gpt-5") + "}",
     "x.yaml:5 traffic[0].model: expected one of gpt3-175b, llama2-70b, llama2-7b, seed-80b, got 'gpt-5'"),
    ("gpus: {}\n", TRAIN + ", algorithm: tree}", "x.yaml:5 traffic[0].algorithm: expected one of ring, hierarchical, got 'tree'"),
    ("gpus: {}\n", TRAIN + ", overlap: 2}", "x.yaml:5 traffic[0].overlap: expected a number from 0 to 1, got 2"),
    ("gpus: {}\n", TRAIN.replace("1000000", "1.0e+15") + "}",
     "x.yaml:5 traffic[0].scale: leaves 4 bytes per rail a step: at least one float32 per server"),
    ("gpus: {}\n", TRAIN + ", qps: 2}", "x.yaml:5 traffic[0].qps: not a key of kind training"),
])
def test_bad_gpus_and_jobs(gpus: str, job: str, message: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        load(gpus, job)
    assert str(exc.value).splitlines()[0].startswith(message), str(exc.value)
