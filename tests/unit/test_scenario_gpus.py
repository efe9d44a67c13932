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


POOL = ("topology: {generator: gpu-rails, servers: 6, rails: 1, servers_per_leaf: 2}\n"
        "gpus: {placement: PLACEMENT}\ntraffic:\n")


@pytest.mark.parametrize(("placement", "want"), [
    ("spread", [("s0_r0", "s2_r0"), ("s1_r0", "s3_r0"), ("s4_r0", "s5_r0")]),
    ("topology", [("s0_r0", "s1_r0"), ("s2_r0", "s3_r0"), ("s4_r0", "s5_r0")]),
])
def test_pool_places_jobs_in_order(placement: str, want: list[tuple[str, ...]]) -> None:
    jobs = "".join(f"  - {{name: j{i}, kind: training, servers: 2, scale: 1000000}}\n" for i in range(3))
    scen = loads_scenario(POOL.replace("PLACEMENT", placement) + jobs, "x.yaml")
    assert scen.gpus is not None and scen.gpus.groups == (0, 0, 1, 1, 2, 2)
    assert [t.hosts for t in scen.traffic] == want


def test_pool_jobs_that_do_not_fit() -> None:
    jobs = ("  - {name: a, kind: training, hosts: [s0_r0, s1_r0, s2_r0], scale: 1000000}\n"
            "  - {name: b, kind: training, servers: 4, scale: 1000000}\n")
    with pytest.raises(ScenarioError) as exc:
        loads_scenario(POOL.replace("PLACEMENT", "packed") + jobs, "x.yaml")
    assert str(exc.value).splitlines()[0] == (
        "x.yaml:5 traffic[1].servers: 4 servers do not fit: 3 of the pool's 6 are free (3 taken by the jobs "
        "before it)")


@pytest.mark.parametrize(("gpus", "job", "message"), [
    ("gpus: {placement: random}\n", TRAIN + "}", "x.yaml:3 gpus.placement: expected one of packed, spread, topology"),
    ("gpus: {}\n", TRAIN + ", servers: 2}", "x.yaml:5 traffic[0].servers: give hosts (the job's CAs) or servers"),
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
    ("gpus: {}\n", TRAIN + ", algorithm: butterfly}",
     "x.yaml:5 traffic[0].algorithm: expected one of ring, tree, hierarchical, got 'butterfly'"),
    ("gpus: {}\n", TRAIN + ", overlap: 2}", "x.yaml:5 traffic[0].overlap: expected a number from 0 to 1, got 2"),
    ("gpus: {}\n", TRAIN.replace("1000000", "1.0e+15") + "}",
     "x.yaml:5 traffic[0].scale: leaves 4 bytes per rail a step: at least one float32 per server"),
    ("gpus: {}\n", TRAIN + ", qps: 2}", "x.yaml:5 traffic[0].qps: not a key of kind training"),
    ("gpus: {}\n", TRAIN + ", tensor: 3}",
     "x.yaml:5 traffic[0].tensor: tensor (3) must divide the GPUs per server (8): a tensor-parallel group stays"),
    ("gpus: {}\n", TRAIN + ", pipeline: 3}",
     "x.yaml:5 traffic[0].pipeline: pipeline (3) must divide the job's 8 servers: every stage is a group"),
    ("gpus: {}\n", TRAIN.replace("hosts: all", "servers: 6") + ", pipeline: 4}",
     "x.yaml:5 traffic[0].pipeline: pipeline (4) must divide the job's 6 servers"),
    ("gpus: {}\n", TRAIN + ", pipeline: 2, microbatches: 0}",
     "x.yaml:5 traffic[0].microbatches: expected an integer from 1"),
    ("gpus: {}\n", TRAIN + ", pipeline: 2, microbatches: 300}",
     "x.yaml:5 traffic[0].microbatches: expected an integer from 1 to 256, got 300"),
    ("gpus: {}\n", TRAIN + ", tensor: 2.5}", "x.yaml:5 traffic[0].tensor: expected an integer from 1"),
    ("gpus: {}\n", TRAIN + ", pipeline: two}", "x.yaml:5 traffic[0].pipeline: expected an integer from 1"),
    ("gpus: {}\n", TRAIN + ",\n     pipeline: 2, microbatches: 1.5}",
     "x.yaml:6 traffic[0].microbatches: expected an integer from 1"),
])
def test_bad_gpus_and_jobs(gpus: str, job: str, message: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        load(gpus, job)
    assert str(exc.value).splitlines()[0].startswith(message), str(exc.value)


def test_tensor_and_pipeline_job() -> None:
    """tensor, pipeline and microbatches reach the plan; stages of one server are allowed (the
    pipeline's transfers cross the fabric, the DP allreduce is NVLink's)."""
    scen = load("gpus: {per_server: 4, rails: 2}\n", TRAIN + ", tensor: 4, pipeline: 2, microbatches: 6}")
    plan = scen.traffic[0].training  # type: ignore[attr-defined]
    assert (plan.job.servers, plan.job.tensor, plan.job.pipeline, plan.job.m) == (4, 4, 2, 6)
    assert plan.job.stage_servers == 2 and plan.pp_bytes > 0
    one = load("gpus: {per_server: 4, rails: 2}\n", TRAIN + ", pipeline: 4}").traffic[0].training  # type: ignore[attr-defined]
    assert (one.job.stage_servers, one.rail_bytes, one.job.m) == (1, 0, 16)


def test_gpu_rails_is_rail_optimized() -> None:
    from ibemu.topo.generators import ParamError, generate

    t = generate("gpu-rails", servers=5, rails=2, servers_per_leaf=2, spines=2)
    assert t.validate() == []
    assert [n.name for n in t.cas()][:4] == ["s0_r0", "s0_r1", "s1_r0", "s1_r1"]  # server by server
    for sv in range(5):
        for r in range(2):
            ((_, peer),) = t.neighbors(f"s{sv}_r{r}")
            assert peer.node == f"leaf{sv // 2}_{r}"  # rail r of every server of a group on one leaf
    for grp in range(3):
        for r in range(2):  # every leaf up to every spine
            assert {p.node for _, p in t.neighbors(f"leaf{grp}_{r}")} >= {"spine0", "spine1"}
    with pytest.raises(ParamError, match="servers_per_leaf"):
        generate("gpu-rails", servers=300, rails=1, servers_per_leaf=300)


def test_a_jobs_rc_timers_go_to_its_workers() -> None:
    """``rc_timeout``/``rc_retry_cnt`` reach the worker's flow (``flow_dict``); absent, the
    flow says nothing and the transport's defaults hold."""
    scen = loads_scenario(LS + "gpus: {per_server: 8}\ntraffic:\n" + TRAIN + ", rc_timeout: 20, rc_retry_cnt: 2}\n"
                          "  - {kind: allreduce, hosts: [h0, h1]}\n", "x.yaml")
    job, ring = (flow_dict(t, scen) for t in scen.traffic)
    assert (job["rc_timeout"], job["rc_retry_cnt"]) == (20, 2)
    assert "rc_timeout" not in ring and "rc_retry_cnt" not in ring
