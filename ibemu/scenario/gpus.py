"""The scenario's GPU servers (``gpus:``) and its training jobs (``kind: training``), read and checked.

``gpus: {model, per_server, nvlink, rails, ...}`` makes the topology's CAs GPU servers,
``rails`` consecutive CAs a server (``ibemu.traffic.training.GpuPool``); one rail's rate in the
model is the data rate of the first server's first cable (``physics.link.data_gbps``; a RoCE
user datapath's ``fabric.line_gbps`` when given). A training entry's keys (``model``,
``tokens_per_step``, ``mfu``, ``algorithm``, ``overlap``, ``scale``, ``train_tokens``) become a
``JobPlan``. A job names its servers' CAs (``hosts``: whole servers, every rail of each) or asks
for a number of them (``servers: N``), which the pool places by ``gpus.placement`` (packed,
spread, topology: ``training.place``, each server's leaf the switch its first CA is cabled to)
among the servers no job before it took; at least two (one server's allreduce is all NVLink:
nothing would cross the fabric). ``tensor`` (T), ``pipeline`` (P) and ``microbatches`` make it
tensor and pipeline parallel (``training`` module docstring). Every problem is located: unknown
presets, rails that do not divide the GPUs, a job that does not fit or takes part of a server, a
tensor degree that does not divide the GPUs per server, stages that do not divide the job's
servers, microbatches below 1, parallelism that is not a whole number.
"""

from __future__ import annotations

import yaml

from ibemu.physics.link import data_gbps
from ibemu.scenario.schema import GPUS_FIELDS, GPUS_KEYS, TRAFFIC_FIELDS, FabricSpec
from ibemu.scenario.yamlnodes import Reader, line_of
from ibemu.topo.model import Topology
from ibemu.traffic.training import GpuCluster, GpuPool, JobPlan, TrainingJob

Pairs = dict[str, tuple[yaml.Node, yaml.Node]]

DEFAULT_SCALE = 1.0


def rail_gbps(topo: Topology, ca: str, fabric: FabricSpec) -> float:
    """The data rate (Gb/s) at ``ca``'s first cable."""
    if fabric.roce_user and fabric.line_gbps:
        return fabric.line_gbps
    for lk in topo.links:
        if ca in (lk.a.node, lk.b.node):
            return data_gbps(topo.rate_of(lk))
    return data_gbps(topo.defaults.rate)


def leaves(topo: Topology, cas: list[str]) -> dict[str, str]:
    """Each CA's switch (the far end of its first cable)."""
    out: dict[str, str] = {}
    for lk in topo.links:
        for a, b in ((lk.a, lk.b), (lk.b, lk.a)):
            if a.node in cas and a.node not in out:
                out[a.node] = b.node
    return out


def read_gpus(r: Reader, node: yaml.Node | None, topo: Topology | None, fabric: FabricSpec) -> GpuPool | None:
    if node is None:
        return None
    m = r.mapping(node, "gpus", GPUS_KEYS)
    if m is None or topo is None:
        return None
    before = len(r.problems)
    kw: dict[str, object] = {}
    for key, attr in (("model", "gpu"), ("nvlink", "nvlink")):
        if key in m:
            kw[attr] = r.choice(m[key][1], f"gpus.{key}", GPUS_FIELDS[key].choices)
    placement = "topology"
    if "placement" in m:
        placement = r.choice(m["placement"][1], "gpus.placement", GPUS_FIELDS["placement"].choices) or placement
    for key in ("per_server", "rails"):
        if key in m:
            f = GPUS_FIELDS[key]
            kw[key] = r.integer(m[key][1], f"gpus.{key}", int(f.lo or 1), int(f.hi or 1))
    for key, attr, factor in (("tflops", "flops", 1e12), ("nvlink_gbs", "nvlink_gbs", 1.0),
                              ("nvlink_us", "nvlink_us", 1.0), ("net_latency_us", "net_latency_us", 1.0)):
        if key in m:
            f = GPUS_FIELDS[key]
            v = r.number(m[key][1], f"gpus.{key}", f.lo, f.hi, f.lo_open)
            kw[attr] = None if v is None else v * factor
    if len(r.problems) > before:
        return None
    cas = [n.name for n in topo.cas()]
    try:
        cluster = GpuCluster(**{k: v for k, v in kw.items() if v is not None},  # type: ignore[arg-type]
                             rail_gbps=rail_gbps(topo, cas[0], fabric) if cas else 1.0)
        return GpuPool.of(cluster, cas, f"{r.source}:{line_of(node)} gpus", leaves=leaves(topo, cas),
                          placement=placement)
    except ValueError as exc:
        r.error(m["rails"][1] if "rails" in m else node, "gpus.rails" if "rails" in m else "gpus", str(exc))
        return None


def read_job(r: Reader, m: Pairs, item: yaml.Node, path: str, hosts: tuple[str, ...],
             pool: GpuPool | None, taken: set[int]) -> tuple[JobPlan | None, tuple[str, ...]]:
    """A training entry's job and its CAs (server by server, rails in order), or None (the
    problem located). ``servers: N`` asks the pool to place it (``gpus.placement``) on servers
    no job before it took; ``hosts`` names them. ``taken`` gets its servers."""
    if pool is None:
        r.error(item, path, "kind training needs the GPU servers: a top-level gpus: {model, per_server, rails}")
        return None, hosts
    before = len(r.problems)
    kw: dict[str, object] = {}
    if "model" in m:
        kw["model"] = r.choice(m["model"][1], f"{path}.model", TRAFFIC_FIELDS["model"].choices)
    if "algorithm" in m:
        kw["algorithm"] = r.choice(m["algorithm"][1], f"{path}.algorithm", TRAFFIC_FIELDS["algorithm"].choices)
    values: dict[str, float] = {}
    for key in ("tokens_per_step", "mfu", "overlap", "scale", "train_tokens"):
        if key in m:
            f = TRAFFIC_FIELDS[key]
            v = r.number(m[key][1], f"{path}.{key}", f.lo, f.hi, f.lo_open)
            if v is not None:
                values[key] = v
    for key in ("tensor", "pipeline", "microbatches"):
        if key in m:
            f = TRAFFIC_FIELDS[key]
            v = r.integer(m[key][1], f"{path}.{key}", int(f.lo or 1), int(f.hi or 1))
            if v is not None:
                kw[key] = v
    tensor = kw.get("tensor", 1)
    if isinstance(tensor, int) and pool.cluster.per_server % tensor:
        r.error(m["tensor"][1], f"{path}.tensor", f"tensor ({tensor}) must divide the GPUs per server "
                f"({pool.cluster.per_server}): a tensor-parallel group stays inside a server, on NVLink")
    asked = None
    if "servers" in m:
        f = TRAFFIC_FIELDS["servers"]
        asked = r.integer(m["servers"][1], f"{path}.servers", int(f.lo or 1), int(f.hi or 1))
        if "hosts" in m:
            r.error(m["servers"][1], f"{path}.servers", "give hosts (the job's CAs) or servers (a number the "
                    "pool places), not both")
    if len(r.problems) > before:
        return None, hosts
    if asked is not None:
        try:
            servers = pool.place(asked, taken)
        except ValueError as exc:
            r.error(m["servers"][1], f"{path}.servers", f"{exc} ({len(taken)} taken by the jobs before it)")
            return None, hosts
    else:
        hnode = m["hosts"][1] if "hosts" in m else item
        try:
            servers = pool.whole_servers(list(hosts))
        except (KeyError, ValueError) as exc:
            r.error(hnode, f"{path}.hosts", str(exc))
            return None, hosts
    where = m["servers"][1] if "servers" in m else m["hosts"][1] if "hosts" in m else item
    if len(servers) < 2:
        r.error(where, f"{path}.{'servers' if 'servers' in m else 'hosts'}",
                f"a training job on the fabric needs at least 2 servers, got {len(servers)} "
                "(one server's allreduce is all NVLink)")
        return None, hosts
    stages = kw.get("pipeline", 1)
    if isinstance(stages, int) and len(servers) % stages:
        r.error(m["pipeline"][1], f"{path}.pipeline", f"pipeline ({stages}) must divide the job's "
                f"{len(servers)} servers: every stage is a group of as many servers")
        return None, hosts
    scale = values.pop("scale", DEFAULT_SCALE)
    job = TrainingJob(servers=len(servers), **kw, **values)  # type: ignore[arg-type]
    plan = JobPlan(job, pool.cluster, scale)
    if job.stage_servers >= 2 and plan.rail_bytes < 4 * job.stage_servers:
        r.error(m["scale"][1] if "scale" in m else item, f"{path}.scale",
                f"leaves {plan.rail_bytes} bytes per rail a step: at least one float32 per server is needed")
        return None, hosts
    taken.update(servers)
    return plan, tuple(ca for i in servers for ca in pool.servers[i])
