"""Training on GPU servers (data, tensor and pipeline parallel): presets, the step-time model, and
the job a run emulates.

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

Models: GPT-3 175B (Brown et al. 2020: 175e9 parameters, 3.2M-token batches, 300e9 tokens;
Table 2.1: hidden size 12288, 96 layers), Llama 2 70B and 7B (Touvron et al. 2023: 4M-token
batches, 2e12 tokens; hidden size 8192 and 80 layers, 4096 and 32, as their published configs),
and ``seed-80b``, the 80e9-parameter model of the seed's "28 days became 9" (batch, token count
and shape assumed: Llama 2 70B's).

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

**Tensor and pipeline parallelism** (job keys ``tensor: T``, ``pipeline: P``, ``microbatches:
m``; Megatron-LM's layout, Shoeybi et al. 2019 and Narayanan et al. 2021). T divides the GPUs
per server (a TP group stays inside a server, on NVLink), P divides the job's s servers (stage k
is servers k s/P .. (k+1) s/P - 1, holding L/P of the L layers), d = n / (T P) data-parallel
replicas; m defaults to 4P (1 without a pipeline). With h the hidden size, a microbatch's
activations of one replica are ``A = tokens / (d m) x h x 2`` bytes. Per step:

- compute and TP: each GPU computes ``t_c`` as above; TP adds 2 allreduces of A per layer in the
  forward pass and 2 in the backward (Megatron-LM's f and g operators), a ring among the T GPUs
  on NVLink: ``t_tp = 4 (L/P) m (2(T-1)/T A / B + 2(T-1) a_nv)``, on the critical path (not
  overlapped). A microbatch's forward on a stage is ``t_f = (t_c/3 + t_tp/2)/m``, its backward
  ``t_b = (2 t_c/3 + t_tp/2)/m``.
- PP: each microbatch's activations go to the next stage and their gradients come back, A per
  replica and direction, cut into T pieces, one from each rank of the TP group (Megatron-LM's
  scatter/gather), so a stage server's rail carries ``x = G/(T R) A`` bytes a microbatch and
  direction (``pp_rail_bytes``), holding it ``x / b`` and arriving ``a_net`` later.
- the pipeline (GPipe, Huang et al. 2019: all forward passes, then all backward passes; 1F1B
  has the same bubble and differs in activation memory, not modelled): a flow shop of m
  identical microbatches through P stages and P - 1 links takes ``P t_f + (P-1)(x/b + a_net) +
  (m-1) max(t_f, x/b)`` forward and the same with ``t_b`` backward; where the links keep up,
  ``(t_c + t_tp)(m + P - 1)/m + 2(P-1)(x/b + a_net)``. The bubble is ``(P-1)/m (t_c + t_tp)``.
- DP: every stage allreduces its gradients, ``2 params / (T P)`` bytes per GPU among the d
  replicas: T allreduces at once, each over G/T GPUs per server on the stage's s/P servers, the
  server's rails shared among them (``dp_allreduce_time``: the formulas above with G/T for G and
  R b / T for R b). It starts once ``1 - overlap`` of the first stage's last backward pass has
  run: ``t_step = pipeline + max(0, t_dp - overlap t_b)``.
- T = P = 1 with one microbatch is the pure data-parallel model above, figure for figure.

**Deviations.** Without ``tensor``/``pipeline`` a job is pure data parallelism: a 175B model's
weights, gradients and optimizer state do not fit in one GPU's memory (real runs add tensor,
pipeline or ZeRO sharding); the step model is then the data-parallel gradient exchange alone.
With them: layers split evenly over the stages (L/P, even where P does not divide L; the
embedding and output layers' extra work on the first and last stage is not modelled), no
interleaved schedule, no sequence parallelism (same TP volume), no activation recomputation. No SHARP, no NVLS, no compute slowed by
communication kernels. The ring's bandwidth term uses the slower of NVLink and the server's
rails; the emulated run moves the fabric part (``fabric_bytes_per_rail``) over RDMA and
models the NVLink part in time (``JobPlan``): TP is modelled time only, the pipeline's
transfers and each stage's DP allreduce are real RDMA writes. The model's ``a_net`` (NCCL's
protocol step cost) stays whole in the 1/scale model, where the emulated fabric's latency is its
cables' and switches': the scaled model's step overstates a scaled run's by a few ``a_net``.
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
    hidden: int = 0
    """Hidden size h (the activation per token is h elements)."""
    layers: int = 0


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
    "gpt3-175b": ModelPreset("gpt3-175b", 175e9, 3.2e6, 300e9, 12288, 96),
    "llama2-70b": ModelPreset("llama2-70b", 70e9, 4e6, 2e12, 8192, 80),
    "llama2-7b": ModelPreset("llama2-7b", 7e9, 4e6, 2e12, 4096, 32),
    "seed-80b": ModelPreset("seed-80b", 80e9, 4e6, 2e12, 8192, 80),
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
    tensor: int = 1
    """Tensor-parallel degree T (GPUs of a server that split every layer: it divides ``per_server``)."""
    pipeline: int = 1
    """Pipeline stages P (each a group of ``servers / P`` servers holding ``L / P`` layers)."""
    microbatches: int = 0
    """Microbatches a step is cut into (0: ``default_microbatches(pipeline)``)."""

    def __post_init__(self) -> None:
        if self.tensor < 1 or self.pipeline < 1 or not 0 <= self.microbatches <= MAX_MICROBATCHES:
            raise ValueError(f"tensor and pipeline must be >= 1 and microbatches 1-{MAX_MICROBATCHES}, got "
                             f"{self.tensor}, {self.pipeline}, {self.microbatches}")
        if self.servers % self.pipeline:
            raise ValueError(f"pipeline ({self.pipeline}) must divide the job's servers ({self.servers})")
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

    @property
    def m(self) -> int:
        """Microbatches per step."""
        return self.microbatches or default_microbatches(self.pipeline)

    @property
    def stage_servers(self) -> int:
        """Servers per pipeline stage."""
        return self.servers // self.pipeline

    def check_cluster(self, c: GpuCluster) -> None:
        """ValueError when the job's parallelism does not fit the servers ``c`` describes."""
        if c.per_server % self.tensor:
            raise ValueError(f"tensor ({self.tensor}) must divide the GPUs per server ({c.per_server}): "
                             "a tensor-parallel group stays inside a server, on NVLink")

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
    return _allreduce(algorithm, size, servers, c.per_server, c.rails * c.rail_bps, c)


def _allreduce(algorithm: str, size: float, s: int, g: int, fabric_bps: float, c: GpuCluster) -> AllreduceTime:
    """``size`` bytes over ``s`` servers x ``g`` GPUs, the ranks of a server sharing ``fabric_bps``."""
    n = s * g
    if n == 1:
        return AllreduceTime(0.0, 0.0)
    if s == 1:  # every step on NVLink, whatever the algorithm
        if algorithm == "tree":
            return AllreduceTime(2 * size / c.nvlink_bps + 2 * (g - 1) * c.a_nv, 0.0)
        return AllreduceTime(2 * (n - 1) / n * size / c.nvlink_bps + 2 * (n - 1) * c.a_nv, 0.0)
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


MAX_MICROBATCHES = 256
"""A step's microbatches are all in flight at once on a stage boundary's QPs, each a WRITE with
immediate that takes one of the 256 receives a QP keeps posted (``collectives._connect``)."""


def default_microbatches(pipeline: int) -> int:
    """4 microbatches per stage (the pipeline bubble (P - 1)/m then stays under a quarter of the
    work), at most ``MAX_MICROBATCHES``; 1 without a pipeline (no gradient accumulation: the step
    as pure data parallelism)."""
    return min(MAX_MICROBATCHES, 4 * pipeline) if pipeline > 1 else 1


def dp_allreduce_time(job: TrainingJob, c: GpuCluster, scale: float = 1.0) -> AllreduceTime:
    """Each stage's data-parallel gradient allreduce (all stages at once): T concurrent allreduces
    of ``2 params / (T P) / scale`` bytes, each among the d replicas (G/T GPUs per server on the
    stage's s/P servers), sharing each server's rails; with T = P = 1 ``allreduce_time``'s."""
    t, p = job.tensor, job.pipeline
    if t == 1 and p == 1:
        return allreduce_time(job.algorithm, job.grad_bytes / scale, job.servers, c)
    return _allreduce(job.algorithm, job.grad_bytes / (t * p) / scale, job.stage_servers, c.per_server // t,
                      c.rails * c.rail_bps / t, c)


def tp_time(job: TrainingJob, c: GpuCluster) -> float:
    """A step's tensor-parallel allreduces on one GPU (NVLink, on the critical path): per layer
    and microbatch 2 in the forward pass and 2 in the backward (Megatron-LM), each of the
    microbatch's activations (tokens per replica / m x h x 2 bytes), a ring among the T GPUs."""
    t = job.tensor
    if t == 1:
        return 0.0
    y = activation_bytes_of(job, c)
    one = 2 * (t - 1) / t * y / c.nvlink_bps + 2 * (t - 1) * c.a_nv
    return 4 * job.preset.layers / job.pipeline * job.m * one


def pp_rail_bytes(job: TrainingJob, c: GpuCluster, scale: float = 1.0) -> float:
    """What one rail of a stage server carries to the next stage per microbatch and direction:
    its G/T tensor-parallel groups each send a microbatch's activations (or their gradients),
    cut into T pieces, one per rank of the group (Megatron-LM's scatter/gather), over the
    server's R rails: G/(T R) x tokens / (d m) x h x 2 bytes. 0 without a pipeline."""
    if job.pipeline == 1:
        return 0.0
    return c.per_server / (job.tensor * c.rails) * activation_bytes_of(job, c) / scale


def activation_bytes_of(job: TrainingJob, c: GpuCluster) -> float:
    """One microbatch's activations of one replica: tokens / (d m) x h x 2 bytes."""
    return job.tokens / replicas(job, c) / job.m * job.preset.hidden * GRAD_BYTES


def replicas(job: TrainingJob, c: GpuCluster) -> int:
    """The data-parallel degree d = n / (T P)."""
    return job.servers * c.per_server // (job.tensor * job.pipeline)


@dataclass(frozen=True, slots=True)
class StepModel:
    """One step of a job, by the model."""

    gpus: int
    compute_s: float
    comm: AllreduceTime
    """The data-parallel gradient allreduce (each stage's)."""
    step_s: float
    time_to_train_s: float
    tp_s: float = 0.0
    """Tensor-parallel allreduces on NVLink (on the critical path, inside the pipeline)."""
    bubble_s: float = 0.0
    """The pipeline's fill and drain: (P - 1)/m of the work (compute and TP)."""
    pp_s: float = 0.0
    """Exposed pipeline transfers (activations and gradients between stages)."""
    pipeline_s: float = 0.0
    """Compute, TP, bubble and transfers: until the first stage's last backward pass ends."""

    @property
    def comm_s(self) -> float:
        return self.comm.total_s

    @property
    def exposed_comm_s(self) -> float:
        """What the step waits for communication (DP, TP and PP; not the bubble)."""
        return self.step_s - self.compute_s - self.bubble_s

    @property
    def efficiency(self) -> float:
        return self.compute_s / self.step_s if self.step_s else 1.0

    @property
    def comm_share(self) -> float:
        """The share of a step spent waiting for the network (exposed communication)."""
        return self.exposed_comm_s / self.step_s if self.step_s else 0.0

    @property
    def bubble_share(self) -> float:
        return self.bubble_s / self.step_s if self.step_s else 0.0


def compute_time(job: TrainingJob, c: GpuCluster) -> float:
    return 6 * job.n_params * job.tokens / (job.servers * c.per_server * c.gpu_flops * job.mfu)


def step_time(compute_s: float, comm_s: float, overlap: float) -> float:
    """A step: the allreduce starts once ``1 - overlap`` of the backward pass (2/3 of compute) ran."""
    return compute_s + max(0.0, comm_s - overlap * 2 * compute_s / 3)


def pipeline_time(job: TrainingJob, compute_s: float, tp_s: float, x_s: float,
                  lat_s: float) -> tuple[float, float, float]:
    """The pipeline part of a step, GPipe's schedule (every forward pass, then every backward
    pass): P compute stages with a link between each two, m microbatches through them. A
    microbatch's forward takes ``t_f = (t_c/3 + t_tp/2)/m`` on a stage, its backward ``t_b =
    (2 t_c/3 + t_tp/2)/m``; a transfer holds the link for ``x_s`` and arrives ``lat_s`` later. A flow
    shop of identical jobs takes the sum of its stages plus (m - 1) of the busiest: ``P t_f +
    (P-1)(x + a) + (m-1) max(t_f, x)`` forward, the same with ``t_b`` backward; where the links
    keep up, ``(t_c + t_tp)(m + P - 1)/m + 2 (P-1)(x + a)``. Returns (pipeline, bubble = (P - 1)/m
    (t_c + t_tp), exposed transfers)."""
    p, m = job.pipeline, job.m
    work = compute_s + tp_s
    bubble = (p - 1) / m * work
    if p == 1:
        return work * m / m, bubble, 0.0
    t_f = (compute_s / 3 + tp_s / 2) / m
    t_b = (2 * compute_s / 3 + tp_s / 2) / m
    pp = 2 * (p - 1) * (x_s + lat_s) + (m - 1) * (max(0.0, x_s - t_f) + max(0.0, x_s - t_b))
    return work + bubble + pp, bubble, pp


def dp_window(job: TrainingJob, compute_s: float, tp_s: float) -> float:
    """How much of the data-parallel allreduce hides behind the last backward pass of the first
    stage: ``overlap`` of it (the whole backward pass without gradient accumulation)."""
    m = job.m
    return job.overlap * 2 * (compute_s / m) / 3 + (job.overlap * tp_s / 2 / m if tp_s else 0.0)


def model_step(job: TrainingJob, c: GpuCluster, *, dp_fabric_s: float | None = None) -> StepModel:
    """The model's step (``dp_fabric_s`` replaces the DP allreduce's fabric time: a projection)."""
    t_c = compute_time(job, c)
    comm = dp_allreduce_time(job, c)
    if dp_fabric_s is not None:
        comm = AllreduceTime(comm.nvlink_s, dp_fabric_s)
    if job.tensor == 1 and job.pipeline == 1 and job.m == 1:  # pure data parallelism
        t = step_time(t_c, comm.total_s, job.overlap)
        return StepModel(job.servers * c.per_server, t_c, comm, t, job.total_tokens / job.tokens * t,
                         pipeline_s=t_c)
    tp = tp_time(job, c)
    pipe, bubble, pp = pipeline_time(job, t_c, tp, pp_rail_bytes(job, c) / c.rail_bps, c.a_net)
    t = pipe + max(0.0, comm.total_s - dp_window(job, t_c, tp))
    return StepModel(job.servers * c.per_server, t_c, comm, t, job.total_tokens / job.tokens * t, tp_s=tp,
                     bubble_s=bubble, pp_s=pp, pipeline_s=pipe)


def pp_bytes_per_step(job: TrainingJob, c: GpuCluster) -> float:
    """What the pipeline moves over the fabric a step (every replica, boundary and direction):
    2 x m x (P - 1) x d x tokens / (d m) x h x 2 bytes."""
    if job.pipeline == 1:
        return 0.0
    return 2 * job.m * (job.pipeline - 1) * replicas(job, c) * activation_bytes_of(job, c)


def fabric_bytes_per_rail(algorithm: str, size: float, servers: int, c: GpuCluster,
                          per_server: int | None = None) -> float:
    """The size of the allreduce each rail runs between the servers so that its cables carry
    what the algorithm sends over them: ``hierarchical``, G/R slices of S/G (S/R); ``ring``, a
    ring of n ranks sends 2(n-1)/n S/R over each rail's cable, which a ring of s ranks over X bytes
    does for X = S/R (n-1)/n s/(s-1); ``tree``, a double binary tree of S/R per rail between the
    servers (2 S/R on each server's cable each way, as the model's ``2 S / (R b)``). ``S`` is all
    that a server's GPUs allreduce; ``per_server`` the ranks of one allreduce on a server (G/T
    with tensor parallelism, default G)."""
    if servers < 2:
        return 0.0
    if algorithm in ("hierarchical", "tree"):
        return size / c.rails
    if algorithm == "ring":
        n = servers * (per_server or c.per_server)
        return size / c.rails * (n - 1) / n * servers / (servers - 1)
    raise ValueError(f"allreduce {algorithm!r} is not emulated on the fabric (one of {', '.join(EMULATED_ALGORITHMS)})")


def _floats(b: float) -> int:
    """``b`` bytes as a whole number of float32 elements (at least one; 0 stays 0)."""
    return max(4, int(b) // 4 * 4) if b else 0


@dataclass(frozen=True, slots=True)
class JobPlan:
    """What a training flow does each step, scaled down by ``scale``: compute time and bytes
    (gradients and activations) all divided by it (a 1/scale model of the step; latencies stay
    what they are), the compute phases, the TP and the NVLink time in emulated time, each rail's
    RDMA allreduce size per stage and each rail's transfer between stages per microbatch."""

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
    def mb_forward_s(self) -> float:
        """One microbatch's forward pass on a stage, its TP allreduces included (scaled)."""
        m = self.model
        return (m.compute_s / 3 + m.tp_s / 2) / self.job.m / self.scale

    @property
    def mb_backward_s(self) -> float:
        m = self.model
        return (2 * m.compute_s / 3 + m.tp_s / 2) / self.job.m / self.scale

    @property
    def nvlink_s(self) -> float:
        """The NVLink phases of the scaled step: the full step's / scale (modelled, latency
        included: they do not cross the fabric, so the scale model scales them whole)."""
        return self.model.comm.nvlink_s / self.scale

    @property
    def scaled_fabric_s(self) -> float:
        """The model's fabric part for the scaled gradient (bandwidth and per-step latency)."""
        return dp_allreduce_time(self.job, self.cluster, self.scale).fabric_s

    @property
    def scaled_step_s(self) -> float:
        """The model's scaled step: what the run's measured step is compared with."""
        job, k = self.job, self.scale
        m = self.model
        if job.tensor == 1 and job.pipeline == 1 and job.m == 1:
            return step_time(m.compute_s / k, self.nvlink_s + self.scaled_fabric_s, job.overlap)
        pipe = self.scaled_pipeline_s
        return pipe + max(0.0, self.nvlink_s + self.scaled_fabric_s - dp_window(job, m.compute_s / k, m.tp_s / k))

    @property
    def scaled_pipeline_s(self) -> float:
        """The model's scaled pipeline part (compute, TP, bubble, transfers)."""
        job, c, k = self.job, self.cluster, self.scale
        m = self.model
        return pipeline_time(job, m.compute_s / k, m.tp_s / k, pp_rail_bytes(job, c, k) / c.rail_bps, c.a_net)[0]

    @property
    def rail_bytes(self) -> int:
        """Each rail's allreduce per step and stage (bytes, a multiple of 4: float32 elements)."""
        job, c = self.job, self.cluster
        return _floats(fabric_bytes_per_rail(job.algorithm, job.grad_bytes / job.pipeline / self.scale,
                                             job.stage_servers, c, c.per_server // job.tensor))

    @property
    def pp_bytes(self) -> int:
        """Each rail's transfer to the next stage per microbatch and direction (bytes, float32s)."""
        return _floats(pp_rail_bytes(self.job, self.cluster, self.scale))

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
    """The rails' RDMA allreduce (until the slowest rail finished; the slowest stage's)."""
    pipeline_s: float = 0.0
    """From the step's start until the first stage's last backward pass ended (0: no pipeline)."""


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

    With tensor or pipeline parallelism (or microbatches) also: the layout (``tensor``,
    ``pipeline``, ``microbatches``, ``replicas``), ``pp_bytes`` (a rail's transfer a microbatch
    and direction), the model's ``model_tp_s``, ``model_bubble_s``, ``model_bubble_share``,
    ``model_pp_s``, ``model_pp_bytes_per_step`` and ``model_scaled_pipeline_s``; with a pipeline,
    measured ``pipeline_s`` (until the first stage's last backward pass ended),
    ``pipeline_idle_share`` (the pipeline beyond its compute and TP work, over the step) beside
    ``model_pipeline_idle_share``, and ``pp_bytes_per_step``. ``comm_share`` then leaves out the
    model's bubble, and the projection takes the model's step with the measured DP fabric time.
    """
    m = plan.model
    job = plan.job
    c, s = plan.cluster, job.stage_servers
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
    parallel = job.tensor > 1 or job.pipeline > 1 or job.m > 1
    if parallel:
        out.update({
            "tensor": job.tensor, "pipeline": job.pipeline, "microbatches": job.m, "replicas": replicas(job, c),
            "pp_bytes": plan.pp_bytes, "model_tp_s": round(m.tp_s, 6), "model_bubble_s": round(m.bubble_s, 6),
            "model_pp_s": round(m.pp_s, 6), "model_bubble_share": round(m.bubble_share, 4),
            "model_pp_bytes_per_step": pp_bytes_per_step(job, c),
            "model_scaled_pipeline_s": round(plan.scaled_pipeline_s, 9),
        })
    if not steps:
        return out
    step = sum(s.step_s for s in steps) / len(steps)
    fabric = sum(s.fabric_s for s in steps) / len(steps)
    compute = plan.forward_s + plan.backward_s
    if parallel:
        full = model_step(job, c, dp_fabric_s=fabric * plan.scale).step_s
    else:
        full = step_time(m.compute_s, m.comm.nvlink_s + fabric * plan.scale, plan.job.overlap)
    out.update({
        "step_s": round(step, 9), "fabric_s": round(fabric, 9), "nvlink_s": round(plan.nvlink_s, 9),
        "fabric_busbw_gbs": round(2 * (s - 1) / s * plan.rail_bytes / fabric / 1e9, 3) if fabric else 0.0,
        "compute_s": round(compute, 9),
        "comm_share": round(max(0.0, step - compute - m.bubble_s / plan.scale) / step, 4),
        "efficiency": round(min(1.0, compute / step), 4),
        "projected_step_s": round(full, 6), "projected_efficiency": round(m.compute_s / full, 4),
        "projected_time_to_train_days": round(plan.job.total_tokens / plan.job.tokens * full / 86400, 3),
        "step_us": [round(x.step_s * 1e6, 3) for x in steps],
    })
    if job.pipeline > 1:
        pipe = sum(x.pipeline_s for x in steps) / len(steps)
        work = (m.compute_s + m.tp_s) / plan.scale
        out.update({
            "pipeline_s": round(pipe, 9),
            # the pipeline beyond its work: the bubble and the exposed transfers, measured
            "pipeline_idle_share": round(max(0.0, pipe - work) / step, 4),
            "model_pipeline_idle_share": round((m.bubble_s + m.pp_s) / m.step_s, 4),
            "pp_bytes_per_step": 2 * job.m * (job.pipeline - 1) * s * c.rails * plan.pp_bytes,
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
