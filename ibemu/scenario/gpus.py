"""The scenario's GPU servers (``gpus:``) and its training jobs (``kind: training``), read and checked.

``gpus: {model, per_server, nvlink, rails, ...}`` makes the topology's CAs GPU servers,
``rails`` consecutive CAs a server (``ibemu.traffic.training.GpuPool``); one rail's rate in the
model is the data rate of the first server's first cable (``physics.link.data_gbps``; a RoCE
user datapath's ``fabric.line_gbps`` when given). A training entry's keys (``model``,
``tokens_per_step``, ``mfu``, ``algorithm``, ``overlap``, ``scale``, ``train_tokens``) become a
``JobPlan``; its ``hosts`` must be whole servers (every rail of each), at least two (one
server's allreduce is all NVLink: nothing would cross the fabric). Every problem is located.
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
        return GpuPool.of(cluster, cas, f"{r.source}:{line_of(node)} gpus")
    except ValueError as exc:
        r.error(m["rails"][1] if "rails" in m else node, "gpus.rails" if "rails" in m else "gpus", str(exc))
        return None


def read_job(r: Reader, m: Pairs, item: yaml.Node, path: str, hosts: tuple[str, ...],
             pool: GpuPool | None) -> JobPlan | None:
    """A training entry's job, or None (the problem located)."""
    if pool is None:
        r.error(item, path, "kind training needs the GPU servers: a top-level gpus: {model, per_server, rails}")
        return None
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
    if len(r.problems) > before:
        return None
    hnode = m["hosts"][1] if "hosts" in m else item
    try:
        servers = pool.whole_servers(list(hosts))
    except (KeyError, ValueError) as exc:
        r.error(hnode, f"{path}.hosts", str(exc))
        return None
    if len(servers) < 2:
        r.error(hnode, f"{path}.hosts", f"a training job on the fabric needs at least 2 servers, got "
                f"{len(servers)} (one server's allreduce is all NVLink)")
        return None
    scale = values.pop("scale", DEFAULT_SCALE)
    job = TrainingJob(servers=len(servers), **kw, **values)  # type: ignore[arg-type]
    plan = JobPlan(job, pool.cluster, scale)
    if plan.rail_bytes < 4 * len(servers):
        r.error(m["scale"][1] if "scale" in m else item, f"{path}.scale",
                f"leaves {plan.rail_bytes} bytes per rail a step: at least one float32 per server is needed")
        return None
    return plan


def job_hosts(pool: GpuPool, hosts: tuple[str, ...]) -> tuple[str, ...]:
    """A job's CAs in server order, each server's rails in rail order (what the flow expects)."""
    order = pool.whole_servers(list(hosts))
    return tuple(ca for i in order for ca in pool.servers[i])
