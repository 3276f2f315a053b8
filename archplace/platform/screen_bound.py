"""An upper bound on the screen's phase-1 throughput of every architecture at once, and the
bound-and-prune rule that lets phase 1 skip the architectures that cannot reach any top k.

Phase 1 (``evaluate.evaluate_sequential``) costs an architecture the per-op estimates, the sequential
layer times and the placement DP over microbatch, TMP width, HBM size and recomputation: 0.05 to
0.85 s per (architecture, workload), ~100 CPU-hours for Phaze's 29,831 architectures x 8 workloads x 4
variants. The screen only needs each objective's top k. So it evaluates in decreasing bound and stops
once the next bound is below the k-th best value found: every architecture left has a value <= its
bound < that k-th value, so it can enter no top k (a bound equal to the k-th value is still evaluated:
its value could tie and win on the lower index). This module gives the bound and the rule; ``screen.py``
and ``bench/phaze/phaze_table2.py`` run it.

**The bound** (``throughput_bounds``), for one model and its cases (microbatch ``mbs``, TMP width
``t``): the best phase-1 throughput is ``global_batch / F`` of the best placement, with the DP's time
per batch (``placement.py``, eq. 17 and ``grad_sync.py``)

    F = (ceil(B/d) + s - 1) * max_k load_k + max_k exposed_k,      B = global_batch / mbs.

For every placement with s stages and d pipelines we have, with the sequential schedule's exact
per-layer times fw_l, bw_l (the same ``latency_components`` all-cores latencies, summed per layer, that
``placement_layers(sequential=True)`` gives the DP):

* the stages partition the layers and a stage's load is at least its layers' fw + bw (the forward and
  backward chains only add waits for transfers; recomputation only adds a forward), and a stage that
  starts at layer i > 0 waits for the slowest edge into layer i (a_i) and one that ends before layer i
  for the slowest gradient out of layer i - 1 (b_i): so sum_k load_k >= T + the s - 1 smallest
  a_i + b_i (T = sum of fw + bw) and max_k load_k >= x_s = max((T + those) / s, max_r ceil(r/s) h_r +
  e_min [s > 1]), h_r the r-th heaviest layer's fw + bw, e_min = min_i min(a_i, b_i) (some stage holds
  ceil(r/s) of the r heaviest layers, and with two stages or more every stage has a boundary);
* a pipeline holds at least s devices (t per stage that has a TMP-sliced layer, 1 per other stage),
  so d <= d_max(s) = min(B, K // min devices per pipeline) and d is one of ``_d_candidates`` (the
  smallest d of each ceil(B/d): among the d sharing a ceil(B/d), the sync below grows with d);
* every stage fits its HBM: sum_k ((1 + g) w_k + opt_k + act_k) <= s * max(hbm_gb) (g: gradient bytes
  per weight byte), so s >= s_min (an
  architecture-independent number: the memory of a layer does not depend on the architecture);
* exposed sync (``sync_model="exposed"``, linear layer graphs): exposed_k >= c_d W_k - Q(f_k) with
  c_d = f (d - 1) / (d * link_bw) (f = ``grad_sync.sync_factor``: 2 for a ring of bf16 gradients,
  4 for fp32 ones or the paper's eq. 18), W_k the stage's weight bytes and Q(f_k) the backward time
  of the layers before its first layer f_k (0 for the first stage). The stage holding layer j starts at
  some i <= j, so max_k exposed_k >= max_j min_{i<=j} (c_d (Wc[j+1] - Wc[i]) - Q[i]) (prefix sums Wc,
  a running maximum); the mean over the s stages gives max_k exposed_k >= (c_d W + a_2 tied - sum of the
  s - 1 largest Q[1..L-1]) / s; and the first stage holds layer 0 with no window: >= c_d w_0 + a_2 tied_0.
  (a_2 tied: the tied weights' AllReduce between their 2 stages, ``grad_sync.stage_sync``, for s > 1.)
  ``sync_model="paper"`` charges the first stage's sync only, >= c_d w_0 (the
  first stage of a chain holds layer 0).

So F >= min over s in [s_min, min(L, K)] and candidate d <= d_max(s) of (ceil(B/d) + s - 1) x_s + E(s, d),
and the bound is the maximum over the cases of global_batch / that minimum, times (1 + ``BOUND_SLACK``)
against rounding (numpy sums in another order than the DP's). A general (non-chain) layer graph drops
the transfer and sync terms (E = 0, e_min = 0): still a bound, only looser. Infeasible cases (a layer
that fits no HBM, or s_min above the most stages) contribute 0; an architecture whose every case is
infeasible has bound 0 and value 0, which no ranking counts. Tests: ``tests/test_screen_bound.py``
(the bound against ``evaluate_sequential`` on seeded samples, and the pruned screen's top k against
the full screen's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

BOUND_SLACK = 1e-9          # relative: covers summation-order rounding between the bound and the DP
BOUND_NAME = "sequential-dp-v1"   # names the formula in the records a pruned screen writes
CHUNK_ARCHS = 256           # architectures per numpy block (the (archs, s, d) array stays ~50 MB)


# ---------------------------------------------------------------------- the bound
@dataclasses.dataclass(frozen=True)
class _Case:
    """The architecture-independent part of one (microbatch, TMP width) graph."""

    mbs: int
    t: int
    fw_count: np.ndarray      # (unique ops, layers): how many forward rows of each op fall in each layer
    bw_count: np.ndarray
    ops: Any                  # simulators.latency.UniqueOps
    tmp: int
    weights: np.ndarray       # (L,) per-device weight bytes
    tied: np.ndarray          # (L,) bytes of each layer's weights tied with another layer
    e_min_s: float            # cheapest transfer a stage boundary adds to a stage (s); 0 for a general graph
    cut_s: np.ndarray         # (L,): [r] the least transfer time r stage boundaries add, summed over stages
    s_min: int
    s_max: int
    min_devices: np.ndarray   # (s_max - s_min + 1,): fewest devices a pipeline of s stages holds
    linear: bool


def _case(g, settings, model: str, mbs: int, t: int) -> _Case | None:
    from ..algorithms.solvers.throughput import placement_layers
    from ..simulators.latency import UniqueOps

    n = len(g.nodes["layer"])
    ly = placement_layers(g, np.zeros(n), np.zeros(n), sequential=True, optimizer=settings.optimizer)
    L, K = ly.num_layers, settings.num_devices
    from ..algorithms.solvers.grad_sync import grad_bytes_ratio

    g_ratio = grad_bytes_ratio(settings.grad_reduce_dtype)
    const = (1 + g_ratio) * np.asarray(ly.weight_bytes, float) + np.asarray(ly.optimizer_bytes, float) \
        + np.asarray(ly.activation_bytes, float)
    hbm = max(settings.hbm_gb) * 2**30
    if float(const.max()) > hbm:
        return None                       # some layer fits no stage: no placement of this case
    s_min = max(1, math.ceil(float(const.sum()) / hbm * (1 - 1e-12)))
    s_max = min(L, K)
    if s_min > s_max:
        return None
    ops = UniqueOps.from_graph(g)
    layer, bwd = g.nodes["layer"].astype(np.int64), g.nodes["is_backward"].astype(bool)
    fw_count = np.zeros((len(ops), L))
    bw_count = np.zeros((len(ops), L))
    np.add.at(fw_count, (ops.inverse[~bwd], layer[~bwd]), 1.0)
    np.add.at(bw_count, (ops.inverse[bwd], layer[bwd]), 1.0)
    linear = ly.is_linear()
    e_min, cut = 0.0, np.zeros(L)
    if linear and L > 1:
        # a boundary before layer i: the stage starting at i waits for its slowest input edge (a_i, the
        # forward chain) and the stage ending at i - 1 for its slowest output gradient (b_i, backward)
        src, dst = np.asarray(ly.edge_src, int), np.asarray(ly.edge_dst, int)
        cost = np.asarray(ly.edge_bytes, float) / settings.link_bw_bytes_per_s
        a_in, b_out = np.zeros(L + 1), np.zeros(L + 1)
        np.maximum.at(a_in, dst, cost)
        np.maximum.at(b_out, src + 1, cost)
        a_in, b_out = a_in[1:L], b_out[1:L]
        e_min = float(np.minimum(a_in, b_out).min())
        cut = np.concatenate([[0.0], np.cumsum(np.sort(a_in + b_out))])
    s = np.arange(s_min, s_max + 1)
    tmp = int(g.meta.get("tmp", 1) or 1)
    if ly.tmp > 1:
        tp = np.asarray(ly.tensor_parallel, bool)
        n_single = int((~tp).sum())
        m = np.clip(np.minimum(n_single, s - int(tp.any())), 0, None)   # most single-device stages
        min_dev = ly.tmp * s - (ly.tmp - 1) * m
    else:
        min_dev = s.copy()
    return _Case(mbs, t, fw_count, bw_count, ops, tmp, np.asarray(ly.weight_bytes, float),
                 np.asarray(ly.tied_bytes, float), e_min, cut, s_min, s_max, min_dev, linear)


def _case_bound(a, case: _Case, settings) -> np.ndarray:
    """Lower bound on F (seconds per batch) for every architecture of ``a`` (``ArchArrays``)."""
    from ..algorithms.solvers.grad_sync import sync_factor
    from ..algorithms.solvers.placement import _d_candidates
    from ..simulators.latency import latency_components

    K, bw_link = settings.num_devices, settings.link_bw_bytes_per_s
    B = settings.global_batch // case.mbs
    lat = latency_components(a, case.ops, bw_link, case.tmp, all_cores=True)["latency_s"]   # (A, U)
    fw, bw = lat @ case.fw_count, lat @ case.bw_count                                      # (A, L)
    A, L = fw.shape
    T = (fw + bw).sum(axis=1)
    s = np.arange(case.s_min, case.s_max + 1, dtype=float)
    multi = (s > 1).astype(float)                                                           # (S,)
    # pigeonhole: of the r heaviest layers some stage holds ceil(r/s), each at least the r-th heaviest
    srt = -np.sort(-(fw + bw), axis=1)                                                      # (A, L)
    per = np.ceil(np.arange(1, L + 1)[None, :] / s[:, None])                                # (S, L)
    pig = (per[None] * srt[:, None, :]).max(axis=2)                                         # (A, S)
    cuts = case.cut_s[(s - 1).astype(int)]                                                   # (S,)
    x = np.maximum((T[:, None] + cuts[None, :]) / s[None, :],
                   pig + multi[None, :] * case.e_min_s)                                     # (A, S)
    dc = _d_candidates(B, max(1, min(K, B))).astype(float)                                   # (D,)
    d_max = np.minimum(B, K // case.min_devices)                                            # (S,)
    ok = dc[None, :] <= d_max[:, None]                                                      # (S, D)
    flush = np.ceil(B / dc)[None, :] + s[:, None] - 1                                       # (S, D)
    f = sync_factor(settings.sync_model, settings.grad_reduce_dtype)  # 2: a ring of bf16 gradients
    c = f * (dc - 1.0) / dc / bw_link                                                       # (D,) s/byte
    if settings.sync_model == "paper" and case.linear:   # the first stage holds layer 0
        E = (c * case.weights[0])[None, None, :]
    elif settings.sync_model == "paper":
        E = np.zeros((1, 1, 1))
    elif case.linear:
        Q = np.concatenate([np.zeros((A, 1)), np.cumsum(bw, axis=1)], axis=1)               # (A, L+1)
        Wc = np.concatenate([[0.0], np.cumsum(case.weights)])
        # max_j [c Wc[j+1] - max_{i<=j} (c Wc[i] + Q[i])]: the stage holding layer j starts at i <= j
        V = c[None, :, None] * Wc[None, None, :L] + Q[:, None, :L]                          # (A, D, L)
        e_layer = (c[:, None] * Wc[None, 1:])[None] - np.maximum.accumulate(V, axis=2)
        e_layer = e_layer.max(axis=2)                                                       # (A, D)
        # the mean over the stages: (c W - the s - 1 largest Q[1..L-1]) / s
        top = np.concatenate([np.zeros((A, 1)), np.cumsum(Q[:, L - 1:0:-1], axis=1)], axis=1)  # (A, L)
        r = (s - 1).astype(int)
        tied2 = f * 0.5 / bw_link * multi              # allreduce over the 2 tied stages (s > 1 only)
        e_avg = (c[None, None, :] * Wc[-1] + (tied2 * case.tied.sum())[None, :, None]
                 - top[:, r][:, :, None]) / s[None, :, None]                                # (A, S, D)
        # the first stage (window 0) holds layer 0: its weights and, with s > 1, its tied bytes
        e_first = c[None, :] * case.weights[0] + (tied2 * case.tied[0])[:, None]           # (S, D)
        E = np.maximum(np.maximum(e_layer[:, None, :], e_avg), e_first[None])
        E = np.maximum(E, 0.0)
    else:
        E = np.zeros((1, 1, 1))
    F = flush[None] * x[:, :, None] + E
    F = np.where(ok[None], F, np.inf)
    return F.reshape(A, -1).min(axis=1)


def _arrays(space):
    from ..simulators.latency import ArchArrays

    return space if hasattr(space, "glb_bw") else ArchArrays.from_space(space)


def _rows(a, lo: int, hi: int):
    return dataclasses.replace(a, **{f.name: getattr(a, f.name)[lo:hi] for f in dataclasses.fields(a)})


def throughput_bounds(space, settings, graphs: dict[tuple[str, int, int], Any] | None = None,
                      chunk: int = CHUNK_ARCHS) -> dict[str, np.ndarray]:
    """Per model of ``settings``, the (architectures,) upper bound on ``evaluate_sequential``'s
    throughput (samples/s) of every architecture of ``space`` (an ``ArchSpace`` or ``ArchArrays``, in
    its order). ``graphs`` maps (model, microbatch, TMP width) to the graph (built here when absent)."""
    from ..workloads.models import build_graph

    a = _arrays(space)
    n = len(a)
    out: dict[str, np.ndarray] = {}
    for model in settings.models:
        best_F = np.full(n, np.inf)
        for mbs, t in settings.cases(model):
            g = (graphs or {}).get((model, mbs, t))
            if g is None:
                g = build_graph(model, seq=settings.seq, mbs=mbs, tmp=t,
                                capture_blocks=settings.capture_blocks)
            case = _case(g, settings, model, mbs, t)
            if case is None:
                continue
            for lo in range(0, n, chunk):
                hi = min(n, lo + chunk)
                best_F[lo:hi] = np.minimum(best_F[lo:hi], _case_bound(_rows(a, lo, hi), case, settings))
        with np.errstate(divide="ignore"):
            tp = np.where(np.isfinite(best_F), settings.global_batch / best_F, 0.0)
        out[model] = tp * (1 + BOUND_SLACK)
    return out


# ---------------------------------------------------------------------- the prune rule
def kth_best(values: np.ndarray, k: int) -> float:
    """The k-th largest positive value among the evaluated ones (NaN = not evaluated), 0.0 when fewer
    than k are positive (then nothing with a positive bound may be pruned)."""
    v = values[np.isfinite(values) & (values > 0)]
    if len(v) < k:
        return 0.0
    return float(np.partition(v, len(v) - k)[len(v) - k])


def prunable(bound: np.ndarray, threshold: float) -> np.ndarray:
    """Architectures whose value cannot enter the top k: bound < the k-th best value (strictly: a tie
    could win on the lower index), or bound <= 0 (value 0, ranked by nobody)."""
    return (bound < threshold) | (bound <= 0)


def still_needed(bounds: dict[str, np.ndarray], values: dict[str, np.ndarray], top_k: int,
                 order_rank: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Indices not yet evaluated for some objective whose bound still reaches that objective's k-th
    best evaluated value, most promising first (the smallest position in any objective's bound order).
    ``values[o]`` is NaN where objective o is not known yet."""
    n = len(next(iter(bounds.values())))
    need = np.zeros(n, bool)
    pri = np.full(n, np.iinfo(np.int64).max)
    for o, b in bounds.items():
        todo = np.isnan(values[o]) & ~prunable(b, kth_best(values[o], top_k))
        need |= todo
        rank = order_rank[o] if order_rank is not None else bound_rank(b)
        pri = np.where(todo, np.minimum(pri, rank), pri)
    idx = np.flatnonzero(need)
    return idx[np.lexsort((idx, pri[idx]))]


def bound_rank(b: np.ndarray) -> np.ndarray:
    """Position of each index in decreasing-bound order (ties: lower index first)."""
    order = np.lexsort((np.arange(len(b)), -b))
    rank = np.empty(len(b), np.int64)
    rank[order] = np.arange(len(b))
    return rank


def prune_record(bounds: dict[str, np.ndarray], values: dict[str, np.ndarray], top_k: int) -> dict[str, Any]:
    """What a pruned phase 1 left out and why: per objective the k-th best value (the threshold), and
    per unevaluated architecture its bounds ("pruned: bound < threshold" for every objective)."""
    n = len(next(iter(bounds.values())))
    evaluated = np.ones(n, bool)
    for v in values.values():
        evaluated &= ~np.isnan(v)
    thr = {o: kth_best(values[o], top_k) for o in bounds}
    pruned = np.flatnonzero(~evaluated)
    return {"bound": BOUND_NAME, "top_k": top_k, "architectures": n, "evaluated": int(evaluated.sum()),
            "pruned": len(pruned), "threshold": thr,
            "pruned_index": pruned.tolist(),
            "pruned_bound": {o: [float(x) for x in b[pruned]] for o, b in bounds.items()},
            "max_pruned_bound_over_threshold": {
                o: (float(b[pruned].max() / thr[o]) if len(pruned) and thr[o] > 0 else None)
                for o, b in bounds.items()}}


def screen_in_bound_order(evaluate: Callable[[int], dict[str, float]], bounds: dict[str, np.ndarray],
                          top_k: int, budget: int | None = None, first: Iterable[int] = ()
                          ) -> dict[str, Any]:
    """The pruned phase 1 in one process: evaluate ``first``, then the most promising needed index
    (``still_needed``) one at a time until none is needed or ``budget`` evaluations ran.
    ``evaluate(i)`` returns every objective's value (0 for infeasible). Returns the values (NaN = not
    evaluated), the evaluation order and ``complete`` (False: the budget stopped it first)."""
    n = len(next(iter(bounds.values())))
    values = {o: np.full(n, np.nan) for o in bounds}
    ranks = {o: bound_rank(b) for o, b in bounds.items()}
    order: list[int] = []

    def run(i: int) -> None:
        v = evaluate(int(i))
        for o in bounds:
            values[o][i] = float(v[o])
        order.append(int(i))

    for i in first:
        if budget is not None and len(order) >= budget:
            break
        run(i)
    complete = False
    while budget is None or len(order) < budget:
        need = still_needed(bounds, values, top_k, ranks)
        if not len(need):
            complete = True
            break
        run(need[0])
    if not complete:
        complete = not len(still_needed(bounds, values, top_k, ranks))
    return {"values": values, "order": order, "complete": complete}
