"""One trial of the GPU-cluster co-design (``archplace search --target gpu-cluster``, issue 32 item 2): a
:class:`~archplace.hardware.gpu_cluster_space.ClusterShape`, every model planned on it by the exact
pipeline DP, and one flat row with time, money and memory.

Per model the plan is what ``archplace pipeline MODEL --algo dp --gpu GPU`` computes: the model's
training graph at micro-batch 16 (16 micro-batches, 256 samples per step; T5s with Adafactor, others with
Adam, recomputation above 1B parameters: ``pipeline_plan.training_setup``), its op times on the GPU
(``simulators/gpu_ops.py``; ``calibrated`` by default: the H200's measured efficiencies carried to
each GPU by its peaks and bandwidth, the same model for every GPU and one that does not run the GEMMs
at datasheet peak; ``roofline`` on request), and
:func:`~archplace.algorithms.solvers.pipeline_dp.solve_dp`, the L-optimal memory-feasible cut set over
every contiguous cut set, on the cluster of the shape (``cluster_of_shape``: between servers, one GPU's
share of the server's network). On a shape whose share is the V100 Auto-MAP cluster's 25 Gb/s per
transfer (8 per server, NVLink, ``ib-hdr-200g``) the answer under the roofline is ``pipeline --cluster
A|B|C --algo dp``'s to the bit (tests/test_codesign_gpu.py).

The row, flat so it goes into Parquet and a Tune result as is (``M`` is a model name):

- the shape's fields and numbers (``ClusterShape.to_dict``), ``price_per_hour_usd``, ``listed``,
  ``network_usd_per_hour`` (the servers' network, in that price) and ``price_basis``
  (``hardware/cluster_prices.py``);
- ``M.iteration_time_s`` (one training step, seconds), ``M.cost_per_step_usd`` (that time at the price),
  ``M.memory_fit`` and, when it does not fit, ``M.memory_reason``; time and cost are None then (a plan
  that runs out of memory is no design point);
- the plan: ``M.stages`` (K), ``M.devices`` (GPUs per stage), ``M.device_cuts``, ``M.cuts`` (pivots),
  ``M.cut_layers``, ``M.peak_memory_gib``, and what the DP spent (``M.dp_states``, ``M.dp_subproblems``,
  ``M.simulator_calls``, ``M.proven_optimal``, ``M.dp_wall_s``);
- over all models, one step of each in turn: ``iteration_time_s``, ``cost_per_step_usd`` (sums; None
  unless every model fits) and ``memory_fit`` (all fit).

With ``planner: plan`` (training option) each model is planned instead by ``archplace plan``'s search
(``algorithms/search/plan_search.py``: tensor, pipeline, data and context parallel sizes, micro-batch,
recomputation, ZeRO stage, attention) for the same 256 samples per step at the model's sequence, on the
shape's GPUs, servers, NVLink or PCIe and network share; the row then carries ``M.plan`` (the knobs),
``M.layers_per_stage``, ``M.peak_memory_gib``, ``M.configurations_priced`` and ``M.pruned`` in place of
the DP's columns. It takes models with one stack of blocks (not the T5s).

The number of stages K is a rule: ``servers`` (one per server, at most 8 and at most the GPUs:
``archplace pipeline``'s default), ``servers+fit`` (the default: that K, and when its best plan runs out
of memory, 2K, 4K, ... up to 8 or the GPUs, the first that fits; a one-server shape can then pipeline
inside its server as a real one would), an integer, or a list of integers (the fastest plan over them).
Nothing here imports Ray; the search wraps :func:`evaluate_cluster` in its trainable.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..hardware.cluster_prices import (
    is_listed,
    network_usd_per_hour,
    price_basis,
    price_per_gpu_hour_usd,
    price_per_hour_usd,
)
from ..hardware.gpu_cluster_space import ClusterShape, cluster_of_shape

DEFAULTS = {"dtype": "fp16", "op_model": "calibrated", "stages": "servers+fit", "attention": "eager",
            "planner": "pipeline-dp"}
PLANNERS = ("pipeline-dp", "plan")
MAX_AUTO_STAGES = 8   # ``stages: servers`` caps K here (the pipeline command's range is 2..8)
_OPTS = set(DEFAULTS) | {"max_subproblems"}


@functools.lru_cache(maxsize=64)
def pipeline_profile(model: str, gpu: str, dtype: str = "fp16", op_model: str = "calibrated",
                     attention: str = "eager"):
    """(PipelineProfile, op-model note) of ``model`` on GPU preset ``gpu``: the graph, op times and
    training setup of ``api.pipelining.pipeline_model`` (``pipeline --gpu``), cached per process (a sweep
    meets each (model, GPU) many times)."""
    from ..algorithms.rl.pipeline_plan import training_setup
    from ..hardware.gpus import gpu_spec
    from ..hardware.presets import GPU
    from ..simulators.gpu_ops import gpu_op_times
    from ..simulators.pipeline import PipelineSetup, profile_from_graph
    from ..workloads.backward import with_attention
    from ..workloads.models import build_graph

    spec = gpu_spec(gpu)
    kw = {}
    if attention == "sdpa":
        from ..simulators.gpu_step import sram_bytes
        kw["sram_bytes"] = sram_bytes(spec)
    g = with_attention(build_graph(model, mbs=PipelineSetup().micro_batch, training=False), attention, **kw)
    fwd = ~g.nodes["is_backward"]
    params = float(g.nodes["weight_bytes"][fwd].sum()) / int(g.meta.get("bytes_per_element", 2))
    times = gpu_op_times(g, spec, dtype=dtype, op_model=op_model)
    prof = profile_from_graph(g, GPU.from_spec(spec, dtype), training_setup(model, params), times.time_s)
    return prof, times.note


def stage_counts(shape: ClusterShape, stages: Any) -> list[int]:
    """The K values a trial may try on ``shape`` under rule ``stages`` (module doc), in the order tried."""
    top = min(MAX_AUTO_STAGES, shape.num_gpus)
    k0 = max(1, min(shape.num_servers, top))
    if stages == "servers":
        return [k0]
    if stages == "servers+fit":
        ks = [k0]
        while ks[-1] < top:
            ks.append(min(2 * ks[-1], top))
        return ks
    ks = [stages] if not isinstance(stages, (list, tuple)) else list(stages)
    if not ks or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1 for k in ks):
        raise ValueError(f"stages is {stages!r}; allowed: 'servers', 'servers+fit', a positive integer or a "
                         "list of them")
    ks = sorted({int(k) for k in ks})
    if ks[-1] > shape.num_gpus:
        raise ValueError(f"stages {ks[-1]} exceeds the {shape.num_gpus} GPUs of {shape.name}")
    return ks


def _check_opts(opts: dict) -> dict:
    unknown = sorted(set(opts) - _OPTS)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; allowed: {sorted(_OPTS)}")
    o = {**DEFAULTS, **{k: v for k, v in opts.items() if v is not None}}
    from ..hardware.gpus import DTYPES
    from ..simulators.gpu_ops import OP_MODELS
    if o["dtype"] not in DTYPES:
        raise ValueError(f"dtype is {o['dtype']!r}; allowed: {list(DTYPES)}")
    if o["op_model"] not in ("roofline", "calibrated"):
        raise ValueError(f"op_model is {o['op_model']!r}; allowed: ['roofline', 'calibrated'] "
                         f"(of {list(OP_MODELS)}: a profile is measured for one GPU, a sweep spans several)")
    if o["attention"] not in ("eager", "sdpa"):
        raise ValueError(f"attention is {o['attention']!r}; allowed: ['eager', 'sdpa']")
    if o["planner"] not in PLANNERS:
        raise ValueError(f"planner is {o['planner']!r}; allowed: {list(PLANNERS)}")
    return o


def _param_bound_fits(prof, k: int, hbm_bytes: float) -> bool:
    """Whether K stages can fit at all: some stage holds at least 1/K of the parameters with their
    optimizer state, on every one of its devices (activations only add), so P · bytes/param / K must fit."""
    from ..simulators.pipeline import BYTES_PER_PARAM

    params = float(prof.param_bytes_prefix[-1]) / prof.bytes_per_element
    return params * BYTES_PER_PARAM[prof.setup.optimizer] / k <= hbm_bytes


def _plan_model(prof, cluster, ks: list[int], first_fit: bool, max_subproblems: int):
    """The best plan over the K values: the fastest that fits (``first_fit``: the first K, in order, that
    fits); if none fits, the one with the smallest peak per-device memory. A K whose parameter share alone
    exceeds the HBM (:func:`_param_bound_fits`) is not solved unless it is the only one. Returns (DPPlan,
    K, [(K, plan) solved], Ks skipped by the bound, wall seconds)."""
    from ..algorithms.solvers.pipeline_dp import solve_dp

    t0 = time.perf_counter()
    hbm = cluster.device.hbm_gb * 2**30
    plans, skipped = [], []
    for k in ks:
        if not _param_bound_fits(prof, k, hbm) and (plans or k != ks[-1]):
            skipped.append(k)
            continue
        p = solve_dp(prof, cluster, k, max_subproblems=max_subproblems)
        plans.append((k, p))
        if first_fit and not p.oom:
            break
    fit = [(p.length_s, k, p) for k, p in plans if not p.oom]
    if fit:
        _, k, p = min(fit, key=lambda x: (x[0], x[1]))
    else:
        k, p = min(plans, key=lambda kp: (kp[1].peak_memory_bytes, kp[0]))
    return p, k, plans, skipped, time.perf_counter() - t0


@functools.lru_cache(maxsize=16)
def _layer_costs(model: str, gpu: str, op_model: str, dtype: str):
    """``simulators.plan_costs.model_layer_costs`` with its timings kept per process (a sweep meets each
    (model, GPU) on many shapes)."""
    from ..hardware.gpus import gpu_spec
    from ..simulators.plan_costs import model_layer_costs

    return functools.lru_cache(maxsize=None)(model_layer_costs(model, gpu_spec(gpu), op_model, dtype))


def _plan_columns(shape: ClusterShape, m: str, o: dict, price: float) -> dict[str, Any]:
    """``planner: plan``: model ``m`` on ``shape`` by ``archplace plan``'s search (tensor, pipeline, data and
    context parallel sizes, micro-batch, recomputation, ZeRO, attention), the same samples per step as the
    pipeline DP's plan (``PipelineSetup``: 16 micro-batches of 16) at the model's own sequence."""
    from ..algorithms.search.plan_search import Cluster, default_space, search
    from ..simulators.pipeline import PipelineSetup
    from ..simulators.train_memory import TransformerShape
    from ..workloads.models import preset
    from ..workloads.transformer_shape import transformer_fields

    t0 = time.perf_counter()
    fields = transformer_fields(m)
    tshape = TransformerShape(**{k: fields[k] for k in ("hidden", "heads", "kv_heads", "ffn_hidden", "layers",
                                                       "vocab", "gated_mlp", "dropout")})
    seq = int(preset(m).seq_len)
    setup = PipelineSetup()
    batch = setup.micro_batch * setup.num_micro_batches
    spec = shape.spec
    cluster = Cluster(gpus=shape.num_gpus, gpus_per_node=shape.gpus_per_server,
                      peak_flops_per_s=spec.peak(o["dtype"]), memory_bytes=int(spec.memory_bytes),
                      hbm_bytes_per_s=spec.hbm_bytes_per_s, nvlink_bytes_per_s=shape.intra_server_bytes_per_s,
                      network_bytes_per_s=shape.inter_server_bytes_per_s)
    space = default_space(tshape, gpus=shape.num_gpus, gpus_per_node=shape.gpus_per_server, seq=seq,
                          global_batch=batch)
    res = search(tshape, _layer_costs(m, shape.gpu, o["op_model"], o["dtype"]), cluster, seq=seq,
                 global_batch=batch, space=space, top_k=1)
    best = res.top[0] if res.top else None
    t = best.step_time_s if best else None
    reason = ""
    if best is None:
        c = res.least_memory
        reason = (f"no configuration fits {spec.memory_bytes / 2**30:.0f} GiB HBM of {shape.gpu}"
                  + (f": the least is {c.memory['total_bytes'] / 2**30:.2f} GiB per GPU ({c.knobs})" if c else
                     ": weights, gradients and optimizer state alone exceed it"))
    return {f"{m}.iteration_time_s": t, f"{m}.cost_per_step_usd": t * price / 3600.0 if best else None,
            f"{m}.memory_fit": best is not None, f"{m}.memory_reason": reason, f"{m}.samples_per_step": batch,
            f"{m}.throughput_samples_per_s": batch / t if best else None,
            f"{m}.plan": dict(best.knobs) if best else None,
            f"{m}.layers_per_stage": best.layers_per_stage if best else None,
            f"{m}.stages": best.knobs["pp"] if best else None,
            f"{m}.peak_memory_gib": best.memory["total_bytes"] / 2**30 if best else None,
            f"{m}.configurations_priced": res.evaluated, f"{m}.pruned": dict(res.pruned),
            f"{m}.plan_wall_s": time.perf_counter() - t0}


def evaluate_cluster(shape: ClusterShape, models: list[str], **opts) -> dict:
    """The flat row of ``shape`` for ``models`` (module doc). ``opts``: ``dtype`` (fp16), ``op_model``
    (calibrated | roofline), ``stages`` (servers+fit | servers | K | [K, ...]), ``attention`` (eager | sdpa),
    ``max_subproblems`` (the DP's deterministic budget, 100,000), ``planner`` (``pipeline-dp``: Auto-MAP's
    pipeline cuts, the default; ``plan``: ``archplace plan``'s search over every parallelism, for models
    with one stack of blocks)."""
    from ..algorithms.rl.pipeline_plan import describe

    t0 = time.perf_counter()
    if not isinstance(shape, ClusterShape):
        raise ValueError(f"shape must be a ClusterShape, got {type(shape).__name__}")
    if isinstance(models, str) or not isinstance(models, (list, tuple)) or not models or \
            not all(isinstance(m, str) and m for m in models):
        raise ValueError(f"models must be a non-empty list of model names, got {models!r}")
    if len(set(models)) != len(models):
        raise ValueError(f"models lists a model twice: {list(models)}")
    o = _check_opts(opts)
    max_sub = opts.get("max_subproblems") or 100_000
    ks = stage_counts(shape, o["stages"])
    cluster = cluster_of_shape(shape, o["dtype"])
    price = price_per_hour_usd(shape)
    hbm_gib = shape.spec.memory_bytes / 2**30
    row: dict[str, Any] = {**shape.to_dict(), "shape": shape.name, "models": list(models),
                           "price_per_hour_usd": price,
                           "price_per_gpu_hour_usd": price_per_gpu_hour_usd(shape.gpu),
                           "listed": is_listed(shape),
                           "network_usd_per_hour": shape.num_servers
                           * network_usd_per_hour(shape.inter_class),
                           "price_basis": price_basis(shape), "dtype": o["dtype"], "op_model": o["op_model"],
                           "attention": o["attention"], "stage_rule": str(o["stages"])}
    total_t, total_c, all_fit = 0.0, 0.0, True
    if o["planner"] == "plan":
        row["stage_rule"] = "plan"
        for m in models:
            cols = _plan_columns(shape, m, o, price)
            row.update(cols)
            fits = cols[f"{m}.memory_fit"]
            all_fit &= fits
            if fits:
                total_t += cols[f"{m}.iteration_time_s"]
                total_c += cols[f"{m}.cost_per_step_usd"]
        row.update({"iteration_time_s": total_t if all_fit else None,
                    "cost_per_step_usd": total_c if all_fit else None, "memory_fit": all_fit,
                    "wall_s": time.perf_counter() - t0})
        return row
    for m in models:
        prof, _note = pipeline_profile(m, shape.gpu, o["dtype"], o["op_model"], o["attention"])
        plan, k, tried, skipped, wall = _plan_model(prof, cluster, ks, o["stages"] == "servers+fit", max_sub)
        d = describe(prof, cluster, plan.cuts)
        fits = not plan.oom
        peak_gib = plan.peak_memory_bytes / 2**30
        samples = prof.setup.micro_batch * prof.setup.num_micro_batches
        t = float(plan.length_s) if fits else None
        c = t * price / 3600.0 if fits else None
        reason = ""
        if not fits:
            worst = int(np.argmax(d["memory_gib"]))
            reason = (f"no cut set into {'/'.join(map(str, ks))} stage(s) fits: the smallest peak is "
                      f"{peak_gib:.2f} GiB per GPU with {k} stage(s) (stage {worst} on {d['devices'][worst]} "
                      f"GPU(s)) > {hbm_gib:.0f} GiB HBM of {shape.gpu} ({prof.setup.optimizer}, "
                      f"{'recompute' if prof.setup.recompute else 'no recompute'})")
            if skipped:
                reason += (f"; K = {'/'.join(map(str, skipped))} skipped: 1/K of the parameters with "
                           "optimizer state alone exceeds the HBM")
        row.update({
            f"{m}.iteration_time_s": t, f"{m}.cost_per_step_usd": c, f"{m}.memory_fit": fits,
            f"{m}.memory_reason": reason, f"{m}.samples_per_step": samples,
            f"{m}.throughput_samples_per_s": samples / t if fits else None,
            f"{m}.stages": k, f"{m}.stages_tried": [kk for kk, _ in tried],
            f"{m}.stages_skipped": skipped,
            f"{m}.devices": d["devices"], f"{m}.device_cuts": d["device_cuts"], f"{m}.cuts": d["cuts"],
            f"{m}.cut_layers": d["cut_layers"], f"{m}.peak_memory_gib": peak_gib,
            f"{m}.oom_plan_length_s": None if fits else float(plan.length_s),
            f"{m}.proven_optimal": all(p.optimal for _, p in tried),
            f"{m}.dp_states": int(sum(p.evaluated for _, p in tried)),
            f"{m}.dp_subproblems": int(sum(p.subproblems for _, p in tried)),
            f"{m}.simulator_calls": int(sum(p.plan_evaluations for _, p in tried)),
            f"{m}.dp_wall_s": wall})
        all_fit &= fits
        if fits:
            total_t += t
            total_c += c
    row.update({"iteration_time_s": total_t if all_fit else None,
                "cost_per_step_usd": total_c if all_fit else None, "memory_fit": all_fit,
                "wall_s": time.perf_counter() - t0})
    return row


def pareto_front(rows: Sequence[dict], x: str = "cost_per_step_usd",
                 y: str = "iteration_time_s") -> list[dict]:
    """The rows no other row beats on both ``x`` and ``y`` (both minimised; rows whose x or y is None or
    NaN are left out), sorted by ``x``. Uses ``report.pareto_front`` (small area, large value) on
    (x, −y); exact duplicates both stay."""
    from .report import pareto_front as mask_of

    def num(r: dict, k: str) -> float:
        v = r.get(k)
        try:
            return float(v) if v is not None else math.nan
        except (TypeError, ValueError):
            return math.nan

    rows = list(rows)
    if not rows:
        return []
    xs = np.array([num(r, x) for r in rows])
    ys = np.array([num(r, y) for r in rows])
    on = mask_of(xs, -ys)
    idx = sorted(np.flatnonzero(on).tolist(), key=lambda i: (xs[i], ys[i], i))
    return [rows[i] for i in idx]
