"""``plan``: the fastest way to train a model on N GPUs (tensor, pipeline, data and context parallel
sizes, micro-batch, recomputation, sequence parallelism, ZeRO stage, attention kernel), exact under
archplace's step model, with its memory per GPU, its price and the configuration to launch it.

Why here: the step model (``simulators.parallel_step``, the validated ``train_step`` per layer), the
memory model (``simulators.train_memory``) and the search (``algorithms.search.plan_search``) know
nothing of model presets, GPU presets, instances or prices; this call joins them: it reads the model's
sizes, times its layers on the GPU once per (tp, micro-batch, tokens per rank, attention), and prices
the answer from the instance's list price (``hardware.cluster_prices``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ._common import (
    InvalidRequest,
    ProgressFn,
    Request,
    Result,
    Steps,
    check_bool,
    check_choice,
    check_gpu,
    check_int,
    check_model,
    invalid,
    is_number,
)

KNOB_NAMES = ("tp", "pp", "dp", "cp", "vp", "mbs", "recompute", "sequence_parallel", "zero", "attention")
_INT_KNOBS = ("tp", "pp", "dp", "cp", "vp", "mbs", "zero")
OP_MODELS = ("calibrated", "roofline")
GRAD_DTYPES = ("bf16", "fp32")


def instances() -> dict[str, Any]:
    """Instance type -> its price row (``hardware.cluster_prices.PRICE_TABLE``: GPU, GPUs, network)."""
    from ..hardware.cluster_prices import PRICE_TABLE

    return {row.instance_type.strip("()"): row for row in PRICE_TABLE.values()}


def parse_fixed(text: str | None) -> dict[str, Any]:
    """``tp=8,pp=16,recompute=selective,sequence_parallel=true`` -> a dict (one-line errors naming the
    knob)."""
    if not text:
        return {}
    out: dict[str, Any] = {}
    for part in str(text).split(","):
        if not part.strip():
            continue
        key, sep, val = part.partition("=")
        key, val = key.strip().replace("-", "_"), val.strip()
        if key == "sp":
            key = "sequence_parallel"
        if not sep or key not in KNOB_NAMES:
            raise invalid("fixed", f"takes KNOB=VALUE pairs with KNOB one of {list(KNOB_NAMES)}, "
                                   f"got {part!r}")
        if key in _INT_KNOBS:
            try:
                out[key] = int(val)
            except ValueError:
                raise invalid("fixed", f"{key} must be an integer, got {val!r}") from None
        elif key == "sequence_parallel":
            if val.lower() not in ("true", "false", "1", "0", "on", "off"):
                raise invalid("fixed", f"sequence_parallel must be true or false, got {val!r}")
            out[key] = val.lower() in ("true", "1", "on")
        else:
            out[key] = val
    return out


@dataclass(frozen=True)
class PlanRequest(Request):
    model: str                         # preset or hf:CONFIG.json
    gpus: int                          # GPUs to train on (tp x pp x dp x cp of them)
    global_batch: int                  # sequences per optimizer step
    gpu: str | None = None             # GPU preset or .json file (None: the instance's)
    gpus_per_node: int | None = None   # GPUs per server on NVLink (None: the instance's, else 8)
    network: str | None = None         # inter-server network class (None: the instance's, else the GPU's)
    instance: str | None = None        # cloud instance type: GPU, node, network and price
    seq: int | None = None             # tokens per sequence (None: the model's)
    optimizer: str = "adam"
    grad_reduce_dtype: str = "bf16"    # the gradients' dtype: their memory and the sync's bytes
    fixed: dict[str, Any] | None = None  # knobs held at a value; the rest are searched
    top_k: int = 5
    max_mbs: int = 8                   # the largest micro-batch tried (powers of two)
    op_model: str = "calibrated"
    overlap: bool = True               # TP all-reduces behind wgrad GEMMs, DP collectives behind compute
    ray_tasks: bool = False            # split the enumeration into Ray tasks (Ray must be started)
    memory_headroom: float = 0.1       # fraction of each GPU's memory kept free (CUDA context, NCCL, ...)

    @property
    def needs_ray(self) -> bool:
        return bool(self.ray_tasks)

    def validate(self) -> None:
        from ..hardware.gpu_cluster_space import NETWORKS
        from ..hardware.gpus import GPUS
        from ..simulators import train_memory as tm
        from ..workloads.layers import OPTIMIZERS

        check_model(self.model, files=False)
        check_int("gpus", self.gpus, high=1 << 20)
        check_int("global_batch", self.global_batch)
        if self.instance is not None:
            check_choice("instance", self.instance, tuple(instances()))
        elif self.gpu is None:
            raise InvalidRequest("{gpu} or {instance} is required", "gpu", "instance")
        if self.gpu is not None:
            check_gpu("gpu", self.gpu, tuple(GPUS), nvlink=True)
        check_int("gpus_per_node", self.gpus_per_node, optional=True, high=64)
        if self.network is not None:
            check_choice("network", self.network, tuple(NETWORKS))
        check_int("seq", self.seq, optional=True)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("grad_reduce_dtype", self.grad_reduce_dtype, GRAD_DTYPES)
        check_int("top_k", self.top_k, high=100)
        check_int("max_mbs", self.max_mbs, high=1024)
        check_choice("op_model", self.op_model, OP_MODELS)
        check_bool("overlap", self.overlap)
        check_bool("ray_tasks", self.ray_tasks)
        if not (is_number(self.memory_headroom) and 0 <= self.memory_headroom < 1):
            raise invalid("memory_headroom", f"must be a fraction in [0, 1), got {self.memory_headroom!r}")
        fx = self.fixed or {}
        if not isinstance(fx, dict):
            raise invalid("fixed", f"must be a dict of knob values, got {fx!r}")
        for k, v in fx.items():
            if k not in KNOB_NAMES:
                raise invalid("fixed", f"knob {k!r} is not one of {list(KNOB_NAMES)}")
            if k in _INT_KNOBS:
                check_int("fixed", v, low=0 if k == "zero" else 1)
        if "recompute" in fx:
            check_choice("fixed", fx["recompute"], tm.RECOMPUTE)
        if "attention" in fx:
            check_choice("fixed", fx["attention"], tm.ATTENTION)
        if "zero" in fx:
            check_choice("fixed", fx["zero"], tm.ZERO_STAGES)
        if "sequence_parallel" in fx and not isinstance(fx["sequence_parallel"], bool):
            raise invalid("fixed", "sequence_parallel must be true or false, got "
                                   f"{fx['sequence_parallel']!r}")
        self._check_cluster_and_seq()

    def _check_cluster_and_seq(self) -> None:
        """What ties fields together: the instance's GPU, whole servers, the model's positions."""
        from ..workloads.models import preset

        row = instances()[self.instance] if self.instance else None
        if row is not None and self.gpu is not None and self.gpu != row.gpu:
            raise InvalidRequest("{instance} " + f"{self.instance} has {row.gpu} GPUs, " + "{gpu} says "
                                 + repr(self.gpu), "instance", "gpu")
        gpn = self.gpus_per_node or (row.gpus if row else 8)
        if self.gpus % gpn and self.gpus > gpn:
            raise InvalidRequest("{gpus} " + f"{self.gpus} is not a whole number of servers of "
                                 + "{gpus_per_node} " + str(gpn), "gpus", "gpus_per_node")
        most = preset(self.model).max_positions
        if self.seq is not None and most and self.seq > most:
            raise invalid("seq", f"{self.seq} exceeds {self.model}'s {most} positions")


@dataclass
class PlanResult(Result):
    model: dict[str, Any]              # the model's sizes (transformer_shape)
    gpu: dict[str, Any]                # name, label, memory_bytes
    gpus: int
    gpus_per_node: int
    network: dict[str, Any]            # name, bytes_per_s_per_gpu, source
    instance: str | None
    global_batch: int
    seq: int
    optimizer: str
    grad_reduce_dtype: str
    op_model: str
    fits: bool                         # some configuration fits every GPU's memory
    reason: str | None                 # why none fits (None when one does)
    best: dict[str, Any] | None        # the fastest configuration that fits
    top: list[dict[str, Any]]          # the top_k, fastest first
    evaluated: int                     # configurations priced, each with its best layer split
    pruned: dict[str, int]             # skipped by the memory and the time bound
    invalid: int                       # knob combinations no framework runs (counts that do not divide)
    splits_priced: int                 # layer splits priced over all configurations
    timed: int                         # distinct (tp, mbs, tokens per rank, attention) layer timings
    price: dict[str, Any] | None       # usd_per_gpu_hour, basis (listed or built), source (None: unpriced)
    fixed: dict[str, Any] = field(default_factory=dict)
    overlap: bool = True
    assumptions: list[str] = field(default_factory=list)
    ray_tasks: int = 0                 # Ray tasks the enumeration ran in (0: this process)
    wall_s: float = 0.0


def assumptions(overlap: bool) -> list[str]:
    """What the step and memory models take for granted (the JSON's ``assumptions``)."""
    out = [
        "per-layer op times of one GPU from the op model (calibrated: H200 micro-benchmarks scaled by the "
        "GPU's peaks); bf16 weights and activations; Adam with fp32 master weights and moments",
        "tensor-parallel collectives as ring all-reduces over NVLink; pipeline sends scatter/gathered over "
        "the network; data-parallel ring over d x cp ranks in Megatron's rank order (tensor, context, data, "
        "pipeline)",
        "1F1B pipeline (interleaved with v chunks), uneven first and last stages where faster; activation "
        "memory by Korthikanti et al. 2022's counts; the CUDA context, NCCL buffers, workspaces and "
        "fragmentation are not counted: fits leaves memory_headroom of the GPU free for them",
    ]
    if overlap:
        out.append("overlap on: backward tensor-parallel all-reduces behind the weight-gradient GEMMs; the "
                   "data-parallel reduce behind the stage's last backward and the weight gather behind the "
                   "next forward (Megatron's --overlap-grad-reduce/--overlap-param-gather), ZeRO 3's per "
                   "layer behind its pass (FSDP prefetch)")
    else:
        out.append("overlap off: every collective on the critical path (Megatron-LM 2021's local DDP)")
    return out


def _cluster(req: PlanRequest):
    """GPU spec, GPUs per node, network (name, bytes/s per GPU, source), price row."""
    from ..hardware.cluster_prices import (
        NETWORK_USD_PER_GBPS_HOUR,
        PRICE_TABLE,
        gpu_usd_per_hour_without_network,
    )
    from ..hardware.gpu_cluster_space import NETWORKS
    from ..hardware.gpus import gpu_spec

    row = instances()[req.instance] if req.instance else None
    gpu_name = req.gpu or row.gpu
    spec = gpu_spec(gpu_name)
    gpn = req.gpus_per_node or (row.gpus if row else 8)
    net_name = req.network or (row.network if row else None)
    if net_name is not None:
        net = NETWORKS[net_name]
        net_bw = net.gbps_per_server * 1e9 / 8 / gpn
        network = {"name": net_name, "bytes_per_s_per_gpu": net_bw, "source": net.what}
    else:
        net_bw = spec.ib_bytes_per_s
        network = {"name": None, "bytes_per_s_per_gpu": net_bw,
                   "source": f"{spec.label} preset: one NIC per GPU ({spec.source})"}
    price = None
    if row is not None and req.network in (None, row.network) and gpn == row.gpus:
        price = {"usd_per_gpu_hour": row.usd_per_gpu_hour, "basis": f"listed: {row.instance_type}",
                 "instance": row.instance_type, "provider": row.provider, "region": row.region,
                 "date": row.date, "derived": row.derived, "source": row.source}
    elif gpu_name in PRICE_TABLE:
        # a shape that is not the instance: its GPUs without the instance's network, plus this network
        # at AWS's price per Gb/s (hardware/cluster_prices.py: one price function of the shape)
        base = PRICE_TABLE[gpu_name]
        gbps_per_server = network["bytes_per_s_per_gpu"] * 8 / 1e9 * gpn
        per_gpu = (gpu_usd_per_hour_without_network(gpu_name)
                   + gbps_per_server * NETWORK_USD_PER_GBPS_HOUR / gpn)
        price = {"usd_per_gpu_hour": per_gpu,
                 "basis": (f"built: {base.instance_type}'s GPUs without its network, plus "
                           f"{gbps_per_server:,.0f} Gb/s per server at ${NETWORK_USD_PER_GBPS_HOUR:.6f} "
                           "per Gb/s-hour"),
                 "instance": base.instance_type, "provider": base.provider, "region": base.region,
                 "date": base.date, "derived": True, "source": base.source}
    return spec, gpn, network, price


def _space(req: PlanRequest, shape, seq: int, gpn: int):
    from dataclasses import replace

    from ..algorithms.search.plan_search import default_space

    sp = default_space(shape, gpus=req.gpus, gpus_per_node=gpn, seq=seq, global_batch=req.global_batch,
                       max_mbs=req.max_mbs)
    fx = dict(req.fixed or {})
    over: dict[str, Any] = {}
    for k in ("tp", "pp", "cp", "mbs", "vp", "recompute", "sequence_parallel", "zero", "attention", "dp"):
        if k in fx:
            over[k] = (fx[k],)
    return replace(sp, **over)


def _candidate_dict(c, *, global_batch: int, seq: int, flops_per_token: float, gpus: int, peak: float,
                    usd_per_gpu_hour: float | None, overlap: bool = True) -> dict[str, Any]:
    tps = global_batch * seq / c.step_time_s
    d = {**c.knobs, "ep": 1, "global_batch": global_batch, "seq": seq, "layers_per_stage": c.layers_per_stage,
         "microbatches": c.microbatches,
         "step_time_s": c.step_time_s, "tokens_per_s": tps, "mfu": tps * flops_per_token / (gpus * peak),
         "memory_per_gpu_bytes": c.memory["total_bytes"], "memory": c.memory, "time": c.parts_s,
         "fits": c.fits}
    # what the published runs of bench/gpu/plan_validation.py (Megatron-LM, ZeRO 0, cp 1) do not cover
    notes = []
    if c.knobs["zero"] >= 1:
        notes.append(f"ZeRO {c.knobs['zero']}: " + ("its gathers and reduce-scatters are priced as hidden "
                     "behind the compute where shorter, with no per-message latency (an optimistic bound)"
                     if c.knobs["zero"] == 3 else "the optimizer state sharded, its reduce-scatter and "
                     "all-gather priced as the all-reduce's bytes")
                     + "; every published run the validation holds is ZeRO 0")
    if overlap and c.knobs["dp"] * c.knobs["cp"] > 1 and c.knobs["zero"] != 3:
        notes.append("the data-parallel sync is hidden behind the last backward where shorter (overlap on); "
                     "the validated runs with d > 1 exposed it")
    if c.knobs["cp"] > 1:
        notes.append("context parallelism: ring attention's K/V exchange is priced, hidden behind the "
                     "attention core where shorter; no published run validates it")
    d["unvalidated"] = notes
    if usd_per_gpu_hour is not None:
        d["usd_per_hour"] = usd_per_gpu_hour * gpus
        d["usd_per_million_tokens"] = usd_per_gpu_hour * gpus / 3600.0 / tps * 1e6
    return d


def plan(req: PlanRequest, *, progress: ProgressFn | None = None,
         cancel: threading.Event | None = None) -> PlanResult:
    """The fastest configurations to train ``req.model`` on ``req.gpus`` GPUs: stages ``model``,
    ``search``, ``done``."""
    from ..algorithms.search.plan_search import Cluster, search
    from ..simulators.collectives import grad_reduce_bytes_per_param
    from ..simulators.train_memory import TransformerShape
    from ..workloads.transformer_shape import transformer_fields

    t0 = time.perf_counter()
    req.validate()
    steps = Steps("plan", progress, cancel)
    spec, gpn, network, price = _cluster(req)
    try:
        fields = transformer_fields(req.model)
    except ValueError as e:
        raise invalid("model", str(e).removeprefix("model ")) from None
    seq = req.seq or int(fields["max_positions"] or 2048)
    shape = TransformerShape(**{k: fields[k] for k in ("hidden", "heads", "kv_heads", "ffn_hidden", "layers",
                                                      "vocab", "gated_mlp", "dropout")})
    steps.stage("model", layers=shape.layers, hidden=shape.hidden)
    cluster = Cluster(gpus=req.gpus, gpus_per_node=min(gpn, req.gpus), peak_flops_per_s=spec.peak("bf16"),
                      memory_bytes=int(spec.memory_bytes * (1 - req.memory_headroom)),
                      hbm_bytes_per_s=spec.hbm_bytes_per_s,
                      nvlink_bytes_per_s=spec.nvlink_bytes_per_s,
                      network_bytes_per_s=network["bytes_per_s_per_gpu"],
                      usd_per_gpu_hour=price["usd_per_gpu_hour"] if price else None)
    space = _space(req, shape, seq, cluster.gpus_per_node)
    kw = dict(seq=seq, global_batch=req.global_batch, optimizer=req.optimizer,
              grad_bytes=grad_reduce_bytes_per_param(req.grad_reduce_dtype), top_k=req.top_k,
              overlap=req.overlap)
    tasks = 0
    if req.ray_tasks:
        from ..platform.plan_tasks import search_in_tasks
        from ._common import require_ray

        require_ray("plan with ray_tasks")
        res, tasks = search_in_tasks(req.model, spec, req.op_model, shape=shape, cluster=cluster, space=space,
                                     **kw)
    else:
        from ..simulators.plan_costs import model_layer_costs

        res = search(shape, model_layer_costs(req.model, spec, req.op_model), cluster, space=space, **kw)
    # model FLOPs per token (PaLM, Chowdhery et al. 2022, App. B): 6 N + 12 L h s
    fpt = 6.0 * res.model_params + 12.0 * shape.layers * shape.hidden * seq
    kw = dict(global_batch=req.global_batch, seq=seq, flops_per_token=fpt, gpus=req.gpus,
              peak=cluster.peak_flops_per_s, usd_per_gpu_hour=cluster.usd_per_gpu_hour, overlap=req.overlap)
    top = [_candidate_dict(c, **kw) for c in res.top]
    reason = None
    if not top:
        gib = 1024 ** 3
        if res.least_memory is not None:
            c = _candidate_dict(res.least_memory, **kw)
            knobs = ", ".join(f"{k}={c[k]}" for k in KNOB_NAMES)
            reason = (f"no configuration fits {spec.label}'s {cluster.memory_bytes / gib:.1f} GiB (its "
                      f"{spec.memory_bytes / gib:.0f} GiB less {req.memory_headroom:.0%} headroom): the "
                      f"least memory per GPU is {c['memory_per_gpu_bytes'] / gib:.1f} GiB ({knobs})")
        else:
            pruned = res.pruned["memory"]
            reason = (f"no configuration fits {spec.label}'s {cluster.memory_bytes / gib:.1f} GiB (its "
                      f"{spec.memory_bytes / gib:.0f} GiB less {req.memory_headroom:.0%} headroom): weights, "
                      f"gradients and optimizer state alone exceed it in all {pruned} configurations"
                      if pruned else "no knob combination is valid for this model, GPU count and batch "
                      f"({res.invalid} combinations refused: counts must divide the GPUs, heads, layers and "
                      "batch)")
    steps.done(evaluated=res.evaluated)
    return PlanResult(
        model=fields, gpu={"name": spec.name, "label": spec.label, "memory_bytes": int(spec.memory_bytes),
                           "usable_memory_bytes": cluster.memory_bytes,
                           "memory_headroom": req.memory_headroom},
        gpus=req.gpus, gpus_per_node=cluster.gpus_per_node, network=network, instance=req.instance,
        global_batch=req.global_batch, seq=seq, optimizer=req.optimizer,
        grad_reduce_dtype=req.grad_reduce_dtype,
        op_model=req.op_model, fits=bool(top), reason=reason, best=top[0] if top else None, top=top,
        evaluated=res.evaluated, pruned=res.pruned, invalid=res.invalid, splits_priced=res.splits_priced,
        timed=res.captured, price=price, fixed=dict(req.fixed or {}), overlap=req.overlap,
        assumptions=assumptions(req.overlap), ray_tasks=tasks, wall_s=time.perf_counter() - t0)
