"""Data-parallel training on GPU servers: presets, the step-time model, and the job a run emulates.

Pure (no IO, no trio): the scenario loader checks jobs and GPU pools with it, the training
traffic kind (``ibemu.traffic.flows``) takes a job's plan from it, the report and the benchmark
print its figures. Times in seconds, sizes in bytes, bandwidths in bytes/s unless a name says
otherwise (``_gbs``: GB/s = 1e9 bytes/s; ``_gbps``: Gb/s).

**GPU servers.** A server holds ``per_server`` GPUs (G, 8 by default, as in DGX/HGX A100, H100
and B200) joined by NVLink through NVSwitch, and ``rails`` HCA ports (R, dividing G): GPU g
sends over rail ``g * R // G``. Every GPU is a rank. In a topology each rail is a CA of its own
(a DGX H100 has eight single-port ConnectX-7 HCAs, each its own IB node), so a server is R
consecutive CAs; rail-optimized wiring (rail r of every server on leaf r) is the generator
``gpu-rails`` (``ibemu.topo.generators``).

**Presets** (public figures; every one overridable in a scenario):

=========  ======================  ==========================================================
GPU        dense BF16 FLOP/s       source
=========  ======================  ==========================================================
A100       312e12                  NVIDIA A100 datasheet (SXM, Tensor Core BF16, no sparsity)
H100       989e12                  NVIDIA H100 datasheet (SXM5, 1,979 TFLOPS is with sparsity)
H200       989e12                  NVIDIA H200 datasheet (the H100's compute, more memory)
B200       2.25e15                 NVIDIA HGX B200 datasheet (4.5 PFLOPS with sparsity)
=========  ======================  ==========================================================

NVLink per GPU, each direction (half the "total bandwidth" NVIDIA quotes): NVLink 2 (V100)
150 GB/s, 3 (A100) 300 GB/s, 4 (H100) 450 GB/s, 5 (B200) 900 GB/s. Latency per ring step:
3.4 us on NVLink and 9.6 us on the network, the figures of NCCL's own tuning model
(``src/graph/tuning.cc``, ``hwLat``, ring, Simple protocol); they are a protocol's step cost,
not a wire's, and are configurable (``nvlink_us``, ``net_latency_us``).

Models: GPT-3 175B (Brown et al. 2020: 175e9 parameters, 3.2M-token batches, 300e9 tokens),
Llama 2 70B and 7B (Touvron et al. 2023: 4M-token batches, 2e12 tokens), and ``seed-80b``,
the 80e9-parameter model of the seed's "28 days became 9" (batch and token count assumed:
Llama 2's).

**Step time** (data parallel over n = s x G GPUs on s servers, gradients in BF16, 2 bytes per
parameter, so S = 2P bytes):

- compute: ``t_c = 6 P T / (n F MFU)``, T tokens per step, F the GPU's FLOP/s (6 P T: the
  forward pass costs 2 P T FLOPs and the backward pass 4 P T, Kaplan et al. 2020); forward
  ``t_c / 3``, backward ``2 t_c / 3``.
- allreduce of S (b = one rail's data rate in bytes/s, B = NVLink per GPU; the fabric's
  share per server is R b):

  - ``ring`` (one ring over all n GPUs, NCCL's channels spread over the rails):
    ``2(n-1)/n S / min(B, R b) + (2(n-1) - 2(s-1)) a_nv + 2(s-1) a_net``
  - ``tree`` (NCCL's double binary tree between servers, a chain inside: algbw = busbw / 2):
    ``2 S / min(B, R b) + 2 ((G-1) a_nv + ceil(log2 s) a_net)``
  - ``hierarchical`` (NVLink reduce-scatter in the server, G concurrent ring allreduces of
    S/G between the servers, G/R of them per rail, NVLink all-gather):
    ``2 ((G-1)/G S / B + (G-1) a_nv) + 2(s-1)/s S / (R b) + 2(s-1) a_net``

  The latency terms follow NCCL's tuning model (intra-node steps at the NVLink latency,
  inter-node steps at the network's); with one server every step is NVLink's.
- overlap o in [0, 1]: the allreduce starts once a share 1 - o of the backward pass has run
  (gradient buckets ready early), so ``t_step = t_c + max(0, t_comm - o 2 t_c / 3)``.
- scaling efficiency = ``t_c / t_step`` (against n GPUs that never wait for the network:
  perfect linear scaling of one GPU); communication share = ``(t_step - t_c) / t_step`` (the
  exposed part) beside ``t_comm / t_step``; time to train = ``train_tokens / T x t_step``.

**Deviations.** Pure data parallelism: a 175B model's weights, gradients and optimizer state do
not fit in one GPU's memory (real runs add tensor, pipeline or ZeRO sharding); the step model
is the data-parallel gradient exchange alone. No SHARP, no NVLS, no compute slowed by
communication kernels. The ring's bandwidth term uses the slower of NVLink and the server's
rails; the emulated run moves the fabric part (``fabric_bytes_per_rail``) over RDMA and
models the NVLink part in time (``JobPlan``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

ALGORITHMS = ("ring", "tree", "hierarchical")
EMULATED_ALGORITHMS = ALGORITHMS
"""What a training job on the fabric runs: each rail's RDMA allreduce is a ring (``ring``,
``hierarchical``) or a double binary tree (``tree``), ``ibemu.traffic.collectives``."""
GRAD_BYTES = 2
"""Bytes per gradient element (BF16)."""


@dataclass(frozen=True, slots=True)
class GpuPreset:
    name: str
    flops: float
    """Dense BF16 FLOP/s."""
    nvlink: str
    """Its NVLink generation (``NVLINKS``)."""


@dataclass(frozen=True, slots=True)
class NvlinkPreset:
    name: str
    gbs: float
    """Per GPU, each direction (GB/s)."""
    latency_us: float = 3.4


@dataclass(frozen=True, slots=True)
class ModelPreset:
    name: str
    params: float
    tokens_per_step: float
    train_tokens: float


GPUS: dict[str, GpuPreset] = {
    "A100": GpuPreset("A100", 312e12, "nvlink3"),
    "H100": GpuPreset("H100", 989e12, "nvlink4"),
    "H200": GpuPreset("H200", 989e12, "nvlink4"),
    "B200": GpuPreset("B200", 2.25e15, "nvlink5"),
}
NVLINKS: dict[str, NvlinkPreset] = {
    "nvlink2": NvlinkPreset("nvlink2", 150.0),
    "nvlink3": NvlinkPreset("nvlink3", 300.0),
    "nvlink4": NvlinkPreset("nvlink4", 450.0),
    "nvlink5": NvlinkPreset("nvlink5", 900.0),
}
MODELS: dict[str, ModelPreset] = {
    "gpt3-175b": ModelPreset("gpt3-175b", 175e9, 3.2e6, 300e9),
    "llama2-70b": ModelPreset("llama2-70b", 70e9, 4e6, 2e12),
    "llama2-7b": ModelPreset("llama2-7b", 7e9, 4e6, 2e12),
    "seed-80b": ModelPreset("seed-80b", 80e9, 4e6, 2e12),
}
NET_LATENCY_US = 9.6
DEFAULT_MFU = 0.4
DEFAULT_PER_SERVER = 8


@dataclass(frozen=True, slots=True)
class GpuCluster:
    """The GPU servers of a fabric: what every server holds and how fast its links are."""

    gpu: str = "H100"
    per_server: int = DEFAULT_PER_SERVER
    nvlink: str = ""
    """NVLink generation (empty: the GPU's)."""
    rails: int = 1
    rail_gbps: float = 400.0
    """One rail's data rate (Gb/s): the fabric's rate at the server's HCA port."""
    flops: float = 0.0
    """Overrides the GPU's FLOP/s (0: the preset's)."""
    nvlink_gbs: float = 0.0
    """Overrides NVLink's GB/s per GPU and direction (0: the generation's)."""
    nvlink_us: float | None = None
    net_latency_us: float = NET_LATENCY_US

    def __post_init__(self) -> None:
        if self.gpu not in GPUS:
            raise ValueError(f"unknown GPU {self.gpu!r} (one of {', '.join(GPUS)})")
        if self.nvlink and self.nvlink not in NVLINKS:
            raise ValueError(f"unknown NVLink generation {self.nvlink!r} (one of {', '.join(NVLINKS)})")
        if self.per_server < 1:
            raise ValueError(f"per_server must be >= 1, got {self.per_server}")
        if self.rails < 1 or self.per_server % self.rails:
            raise ValueError(f"rails ({self.rails}) must divide the GPUs per server ({self.per_server})")
        if self.rail_gbps <= 0:
            raise ValueError(f"rail rate must be > 0 Gb/s, got {self.rail_gbps:g}")

    @property
    def gpu_flops(self) -> float:
        return self.flops or GPUS[self.gpu].flops

    @property
    def link(self) -> NvlinkPreset:
        return NVLINKS[self.nvlink or GPUS[self.gpu].nvlink]

    @property
    def nvlink_bps(self) -> float:
        """NVLink per GPU, each direction, bytes/s."""
        return (self.nvlink_gbs or self.link.gbs) * 1e9

    @property
    def a_nv(self) -> float:
        return (self.link.latency_us if self.nvlink_us is None else self.nvlink_us) / 1e6

    @property
    def a_net(self) -> float:
        return self.net_latency_us / 1e6

    @property
    def rail_bps(self) -> float:
        return self.rail_gbps * 1e9 / 8

    def rail_of(self, gpu: int) -> int:
        """The rail (HCA) GPU ``gpu`` of a server sends on."""
        return gpu * self.rails // self.per_server

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuCluster:
        return cls(**d)


@dataclass(frozen=True, slots=True)
class TrainingJob:
    """One data-parallel job on ``servers`` whole servers."""

    model: str = "llama2-70b"
    servers: int = 1
    tokens_per_step: float = 0.0
    """Tokens per step over all GPUs (0: the model's)."""
    mfu: float = DEFAULT_MFU
    algorithm: str = "hierarchical"
    overlap: float = 0.0
    train_tokens: float = 0.0
    """Tokens to train on (0: the model's)."""
    params: float = 0.0
    """Overrides the model's parameter count (0: the preset's)."""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r} (one of {', '.join(MODELS)})")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {self.algorithm!r} (one of {', '.join(ALGORITHMS)})")
        if self.servers < 1:
            raise ValueError(f"a job needs at least one server, got {self.servers}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"mfu must be in (0, 1], got {self.mfu:g}")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap:g}")

    @property
    def preset(self) -> ModelPreset:
        return MODELS[self.model]

    @property
    def n_params(self) -> float:
        return self.params or self.preset.params

    @property
    def tokens(self) -> float:
        return self.tokens_per_step or self.preset.tokens_per_step

    @property
    def total_tokens(self) -> float:
        return self.train_tokens or self.preset.train_tokens

    @property
    def grad_bytes(self) -> float:
        return GRAD_BYTES * self.n_params

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TrainingJob:
        return cls(**d)


@dataclass(frozen=True, slots=True)
class AllreduceTime:
    """An allreduce's time, split into what crosses NVLink and what crosses the fabric."""

    nvlink_s: float
    fabric_s: float

    @property
    def total_s(self) -> float:
        return self.nvlink_s + self.fabric_s


def allreduce_time(algorithm: str, size: float, servers: int, c: GpuCluster) -> AllreduceTime:
    """The model's time to allreduce ``size`` bytes over ``servers`` x ``c.per_server`` GPUs."""
    s, g = servers, c.per_server
    n = s * g
    if n == 1:
        return AllreduceTime(0.0, 0.0)
    if s == 1:  # every step on NVLink, whatever the algorithm
        if algorithm == "tree":
            return AllreduceTime(2 * size / c.nvlink_bps + 2 * (g - 1) * c.a_nv, 0.0)
        return AllreduceTime(2 * (n - 1) / n * size / c.nvlink_bps + 2 * (n - 1) * c.a_nv, 0.0)
    fabric_bps = c.rails * c.rail_bps
    bw = min(c.nvlink_bps, fabric_bps)
    if algorithm == "ring":
        return AllreduceTime((2 * (n - 1) - 2 * (s - 1)) * c.a_nv,
                             2 * (n - 1) / n * size / bw + 2 * (s - 1) * c.a_net)
    if algorithm == "tree":
        return AllreduceTime(2 * (g - 1) * c.a_nv,
                             2 * size / bw + 2 * math.ceil(math.log2(s)) * c.a_net)
    if algorithm == "hierarchical":
        rs = (g - 1) / g * size / c.nvlink_bps + (g - 1) * c.a_nv
        return AllreduceTime(2 * rs, 2 * (s - 1) / s * size / fabric_bps + 2 * (s - 1) * c.a_net)
    raise ValueError(f"unknown allreduce algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")


@dataclass(frozen=True, slots=True)
class StepModel:
    """One step of a job, by the model."""

    gpus: int
    compute_s: float
    comm: AllreduceTime
    step_s: float
    time_to_train_s: float

    @property
    def comm_s(self) -> float:
        return self.comm.total_s

    @property
    def exposed_comm_s(self) -> float:
        return self.step_s - self.compute_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s if self.step_s else 1.0

    @property
    def comm_share(self) -> float:
        """The share of a step spent waiting for the network (exposed communication)."""
        return self.exposed_comm_s / self.step_s if self.step_s else 0.0


def compute_time(job: TrainingJob, c: GpuCluster) -> float:
    return 6 * job.n_params * job.tokens / (job.servers * c.per_server * c.gpu_flops * job.mfu)


def step_time(compute_s: float, comm_s: float, overlap: float) -> float:
    """A step: the allreduce starts once ``1 - overlap`` of the backward pass (2/3 of compute) ran."""
    return compute_s + max(0.0, comm_s - overlap * 2 * compute_s / 3)


def model_step(job: TrainingJob, c: GpuCluster) -> StepModel:
    t_c = compute_time(job, c)
    comm = allreduce_time(job.algorithm, job.grad_bytes, job.servers, c)
    t = step_time(t_c, comm.total_s, job.overlap)
    return StepModel(job.servers * c.per_server, t_c, comm, t, job.total_tokens / job.tokens * t)


def fabric_bytes_per_rail(algorithm: str, size: float, servers: int, c: GpuCluster) -> float:
    """The size of the allreduce each rail runs between the servers so that its cables carry
    what the algorithm sends over them: ``hierarchical``, G/R slices of S/G (S/R); ``ring``, a
    ring of n ranks sends 2(n-1)/n S/R over each rail's cable, which a ring of s ranks over X bytes
    does for X = S/R (n-1)/n s/(s-1); ``tree``, a double binary tree of S/R per rail between the
    servers (2 S/R on each server's cable each way, as the model's ``2 S / (R b)``)."""
    if servers < 2:
        return 0.0
    if algorithm in ("hierarchical", "tree"):
        return size / c.rails
    if algorithm == "ring":
        n = servers * c.per_server
        return size / c.rails * (n - 1) / n * servers / (servers - 1)
    raise ValueError(f"allreduce {algorithm!r} is not emulated on the fabric (one of {', '.join(EMULATED_ALGORITHMS)})")


@dataclass(frozen=True, slots=True)
class JobPlan:
    """What a training flow does each step, scaled down by ``scale``: compute time and gradient
    bytes both divided by it (a 1/scale model of the step; latencies stay what they are), the
    compute phases and the NVLink time in emulated time, and each rail's RDMA allreduce size."""

    job: TrainingJob
    cluster: GpuCluster
    scale: float = 1.0

    @property
    def model(self) -> StepModel:
        """The full-size step by the model."""
        return model_step(self.job, self.cluster)

    @property
    def forward_s(self) -> float:
        return self.model.compute_s / 3 / self.scale

    @property
    def backward_s(self) -> float:
        return 2 * self.model.compute_s / 3 / self.scale

    @property
    def nvlink_s(self) -> float:
        """The NVLink phases of the scaled step: the full step's / scale (modelled, latency
        included: they do not cross the fabric, so the scale model scales them whole)."""
        return self.model.comm.nvlink_s / self.scale

    @property
    def scaled_fabric_s(self) -> float:
        """The model's fabric part for the scaled gradient (bandwidth and per-step latency)."""
        return allreduce_time(self.job.algorithm, self.job.grad_bytes / self.scale, self.job.servers,
                              self.cluster).fabric_s

    @property
    def scaled_step_s(self) -> float:
        """The model's scaled step: what the run's measured step is compared with."""
        return step_time(self.model.compute_s / self.scale, self.nvlink_s + self.scaled_fabric_s, self.job.overlap)

    @property
    def rail_bytes(self) -> int:
        """Each rail's allreduce per step (bytes, a multiple of 4: float32 elements)."""
        b = fabric_bytes_per_rail(self.job.algorithm, self.job.grad_bytes / self.scale, self.job.servers,
                                  self.cluster)
        return max(4, int(b) // 4 * 4) if b else 0

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job.to_json(), "cluster": self.cluster.to_json(), "scale": self.scale}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobPlan:
        return cls(TrainingJob.from_json(d["job"]), GpuCluster.from_json(d["cluster"]), float(d["scale"]))


@dataclass(frozen=True, slots=True)
class StepMeasure:
    """A step as the run measured it (emulated seconds, scaled)."""

    step_s: float
    fabric_s: float
    """The rails' RDMA allreduce (until the slowest rail finished)."""


def measured_figures(plan: JobPlan, steps: list[StepMeasure]) -> dict[str, Any]:
    """A job's figures from its measured steps, beside the model's (for ``traffic[].extra``).

    Measured (emulated time, the scaled step): ``step_s``, ``fabric_s``, ``fabric_busbw_gbs``
    (each rail's ring: 2(s-1)/s of its bytes over the time, against one rail's ``rail_gbs``),
    ``comm_share`` (exposed communication over the step), ``efficiency`` (compute over the
    step), and every step's time in order (``step_us``: a fault's stall and the slower steps after
    it). Projected to full size: the model's compute and NVLink time with the measured fabric
    time times ``scale``, and the time to train from that step. The projection takes the fabric
    part as bandwidth-bound: it holds where ``fabric_busbw_gbs`` is close to ``rail_gbs``, and
    overstates the fabric's time where per-step latency dominated the scaled ring.
    """
    m = plan.model
    c, s = plan.cluster, plan.job.servers
    out: dict[str, Any] = {
        "model": plan.job.model, "gpu": plan.cluster.gpu, "gpus": m.gpus, "servers": plan.job.servers,
        "rails": plan.cluster.rails, "algorithm": plan.job.algorithm, "overlap": plan.job.overlap,
        "scale": plan.scale, "rail_bytes": plan.rail_bytes,
        "model_scaled_step_s": round(plan.scaled_step_s, 9),
        "model_scaled_fabric_s": round(plan.scaled_fabric_s, 9), "rail_gbs": round(c.rail_bps / 1e9, 3),
        "model_step_s": round(m.step_s, 6), "model_compute_s": round(m.compute_s, 6),
        "model_comm_s": round(m.comm_s, 6), "model_efficiency": round(m.efficiency, 4),
        "model_comm_share": round(m.comm_share, 4),
        "model_time_to_train_days": round(m.time_to_train_s / 86400, 3), "steps": len(steps),
    }
    if not steps:
        return out
    step = sum(s.step_s for s in steps) / len(steps)
    fabric = sum(s.fabric_s for s in steps) / len(steps)
    compute = plan.forward_s + plan.backward_s
    full = step_time(m.compute_s, m.comm.nvlink_s + fabric * plan.scale, plan.job.overlap)
    out.update({
        "step_s": round(step, 9), "fabric_s": round(fabric, 9), "nvlink_s": round(plan.nvlink_s, 9),
        "fabric_busbw_gbs": round(2 * (s - 1) / s * plan.rail_bytes / fabric / 1e9, 3) if fabric else 0.0,
        "compute_s": round(compute, 9), "comm_share": round(max(0.0, step - compute) / step, 4),
        "efficiency": round(min(1.0, compute / step), 4),
        "projected_step_s": round(full, 6), "projected_efficiency": round(m.compute_s / full, 4),
        "projected_time_to_train_days": round(plan.job.total_tokens / plan.job.tokens * full / 86400, 3),
        "step_us": [round(x.step_s * 1e6, 3) for x in steps],
    })

    return out


SLOW = 1.1
"""A step more than 10% over the job's steps before a fault counts as slowed by it."""


def fault_impact(end_ns: list[int], step_us: list[float], t_fault_ns: int, until_ns: int | None = None) -> dict[str, Any]:
    """What a fault cost a training job, from its steps (each step's end, emulated ns, and its
    time, us, in order): ``base_us``, the median step that ended before the fault (None if
    none did); ``stall_us``, the step under way at the fault (the first to end after it, even
    beyond ``until_ns``) and ``stall_x`` its ratio to the base; ``gap_us``, from the last step
    end before the fault (or the fault) to that step's end; then the steps that ended up to
    ``until_ns`` (the next fault): ``worst_us``, the longest of them and the stall;
    ``after_us``, the mean of those after the stalled one (``after_x`` over the base);
    ``slow_steps``, the steps from the stalled one on that took more than ``SLOW`` x the base
    before the first that did not; ``steps_after``, how many ended after the fault up to
    ``until_ns``; ``into_us``, how far the step under way had got when the fault came (from the
    last step end before it; None if none ended before): against the step's compute time it
    tells whether the fault fell while the job's frames were on the fabric. Empty when no step
    ended after the fault."""
    pairs = list(zip(end_ns, step_us, strict=False))
    before = sorted(u for e, u in pairs if e <= t_fault_ns)
    later = [(e, u) for e, u in pairs if e > t_fault_ns]
    if not later:
        return {}
    window = [(e, u) for e, u in later if until_ns is None or e <= until_ns]
    base = before[len(before) // 2] if before else None
    last = max((e for e, _ in pairs if e <= t_fault_ns), default=t_fault_ns)
    stall_end, stall = later[0]
    rest = [u for _, u in window[1:]]
    slow = 0
    if base:
        for u in [stall, *rest]:
            if u <= SLOW * base:
                break
            slow += 1
    mean_rest = sum(rest) / len(rest) if rest else None
    return {
        "base_us": round(base, 3) if base is not None else None, "stall_us": round(stall, 3),
        "stall_x": round(stall / base, 3) if base else None, "gap_us": round((stall_end - last) / 1e3, 3),
        "worst_us": round(max([stall, *rest]), 3),
        "after_us": round(mean_rest, 3) if mean_rest is not None else None,
        "after_x": round(mean_rest / base, 3) if base and mean_rest is not None else None,
        "slow_steps": slow, "steps_after": len(window),
        "into_us": round((t_fault_ns - last) / 1e3, 3) if before else None,
    }


PLACEMENTS = ("packed", "spread", "topology")
"""How a pool places a job that asks for a number of servers: ``packed``, the first free servers
in the topology's order; ``spread``, one server from each leaf group in turn (as many leaves as
it can: a scheduler balancing load, or one placing at random); ``topology``, inside one leaf
group where one has room (the one with the least room that fits: best fit), else over the
groups with the most room first (the fewest leaves and spine crossings)."""


def place(policy: str, free: list[int], groups: list[int], n: int) -> list[int]:
    """``n`` of the ``free`` servers by ``policy``; ``groups[i]`` is server i's leaf group."""
    if n > len(free):
        raise ValueError(f"{n} servers do not fit: {len(free)} of the pool's {len(groups)} are free")
    by_group: dict[int, list[int]] = {}
    for i in free:
        by_group.setdefault(groups[i], []).append(i)
    if policy == "packed":
        return free[:n]
    if policy == "spread":
        out: list[int] = []
        queues = [list(q) for q in by_group.values()]
        while len(out) < n:
            for q in queues:
                if q and len(out) < n:
                    out.append(q.pop(0))
        return out
    if policy == "topology":
        fits = [q for q in by_group.values() if len(q) >= n]
        if fits:
            return min(fits, key=len)[:n]
        out = []
        for q in sorted(by_group.values(), key=len, reverse=True):
            out += q[:n - len(out)]
        return out
    raise ValueError(f"unknown placement {policy!r} (one of {', '.join(PLACEMENTS)})")


@dataclass(frozen=True, slots=True)
class GpuPool:
    """A fabric's GPU servers: the cluster's figures and each server's CAs (one per rail, in rail
    order), taken from the topology's CAs in order, ``rails`` at a time; each server's leaf
    group (the switch its first CA is cabled to) and the pool's placement policy."""

    cluster: GpuCluster
    servers: tuple[tuple[str, ...], ...]
    where: str = ""
    groups: tuple[int, ...] = ()
    placement: str = "topology"

    @classmethod
    def of(cls, cluster: GpuCluster, cas: list[str], where: str = "", *, leaves: dict[str, str] | None = None,
           placement: str = "topology") -> GpuPool:
        """``leaves``: each CA's switch (default: one group)."""
        r = cluster.rails
        if len(cas) % r:
            raise ValueError(f"the topology's {len(cas)} CAs do not make servers of {r} rails (HCA ports) each")
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r} (one of {', '.join(PLACEMENTS)})")
        servers = tuple(tuple(cas[i:i + r]) for i in range(0, len(cas), r))
        order: dict[str, int] = {}
        groups = tuple(order.setdefault((leaves or {}).get(s[0], ""), len(order)) for s in servers)
        return cls(cluster, servers, where, groups, placement)

    def place(self, n: int, taken: set[int]) -> list[int]:
        """``n`` servers not in ``taken``, by the pool's policy."""
        free = [i for i in range(len(self.servers)) if i not in taken]
        return place(self.placement, free, list(self.groups or [0] * len(self.servers)), n)

    def server_of(self, ca: str) -> int:
        for i, s in enumerate(self.servers):
            if ca in s:
                return i
        raise KeyError(ca)

    def whole_servers(self, hosts: list[str]) -> list[int]:
        """The servers ``hosts`` make up, in order; ValueError when a server is only partly there."""
        seen: list[int] = []
        for h in hosts:
            i = self.server_of(h)
            if i not in seen:
                seen.append(i)
        for i in seen:
            missing = [c for c in self.servers[i] if c not in hosts]
            if missing:
                raise ValueError(f"a job takes whole servers: server {i} is {', '.join(self.servers[i])}, "
                                 f"{', '.join(missing)} missing")
        return seen
