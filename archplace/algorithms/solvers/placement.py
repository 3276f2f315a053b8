"""Phaze's device-placement dynamic program (spec phaze.md §5): data, pipeline and tensor-model
parallelism of a layer graph on K accelerators under the HBM limit.

For one TMP width t, a pipeline is a sequence of stages; each stage is a contiguous set of layers on
``a`` accelerators (``a = t`` when the stage holds a tensor-parallel layer, else 1). ``d`` identical
pipelines run data-parallel. With PipeDream-Flush (1F1B), the time per batch is

    F = (ceil(B/d) + s − 1) · max-load + max_k exposed_k                                  (17)

where B = global batch / microbatch, s the number of stages and exposed_k the part of stage k's
data-parallel gradient sync (eq. 18's AllReduce of its weights) that the schedule cannot hide behind
the backward still running in the stages before it (``grad_sync.py``). The paper charges the first
stage's sync only (``sync_model="paper"``), which a DP exploits with a first stage that holds only
the embedding. Stage load (§5.5): the forward chain
with incoming transfers, the backward chain with outgoing transfers, plus a forward recomputation
when activations are recomputed (never in the last stage). Memory (§5.6): the s-th stage from the
end holds 2·weights + optimizer state + one microbatch of activations, plus (s − 1) stashed
microbatches: its input activations (recompute) or all its activations (stash).

Implementation. The DP runs from the last stage to the first over downsets (sets of layers with no
edge leaving them). On a linear layer graph the downsets are suffixes and a stage is an interval
[i, j): all stage loads, memories and weights are (L+1)² matrices built with prefix sums and
max-plus scans, and each DP step ``f[s][m][i] = min_j max(f[s−1][m'][j], load_s[i, j])`` is one array
operation. Phaze indexes the DP by devices k; since a stage uses t or 1 devices, tracking the number
s of stages and the number m of single-device (non-TMP) stages is equivalent (devices per pipeline
= t·(s − m) + m) and much smaller. General DAG layer graphs use an explicit downset enumeration
(``general=True``), which tests cross-check against the fast path and brute force.

Exposed sync in the DP. The objective adds two bottlenecks: the max-load and the largest exposed
sync, each a maximum over per-stage terms (a stage's exposed sync depends only on its own layers:
its weights, and the backward compute of the layers before it). The DP minimises the max-load with
stages whose exposed sync exceeds a threshold ε forbidden, and carries the largest exposed sync of
the suffix it chose; it is run for decreasing ε (each round ``SYNC_STEP`` of the largest suffix
exposure that could still win, until the max-load bound shows no smaller ε can), and the best F over
the rounds is kept. The data-parallel width d scales every AllReduce by (d−1)/d, so the rounds run
per range of d (``_d_levels``), charging non-first stages at the range's top d: an upper bound, while
the returned placement's F is computed exactly for its stages and d. So F is never below the optimum
and, unlike the paper's single bottleneck, not always at it: against brute force on 315 random
instances (tests/test_placement.py's generator) it is exact on 98.7% and within 2.5% on all.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ...simulators.collectives import grad_reduce_bytes_per_param
from . import placement_kernel as _kernel
from .grad_sync import allreduce_s, check_sync_model, grad_bytes_ratio, stage_sync, sync_factor
from .placement_result import Placement, Stage

INF = math.inf
SYNC_ROUNDS = 40          # most ε rounds of the exposed-sync DP
SYNC_STEP = 0.8           # each round's ε: this share of the largest suffix exposure seen
SYNC_TOL = 1e-3           # stop when a smaller suffix exposure could gain less than this share of F
D_LEVEL_SPREAD = 0.1      # d ranges whose AllReduce factors differ by at most this share share a DP
# deterministic work of the linear DP in this process: ε rounds run, and DP cells plus final (d, candidate)
# pairs evaluated (placement_kernel.linear_round's ``work``); benches read it to show a speed-up is not load
DP_STATS = {"rounds": 0, "work": 0}
_NO_E = np.zeros((1, 1))  # the kernel's ``e`` when no exposed sync is charged
_NO_PREV_F, _NO_PREV_ARG = np.zeros((1, 1, 1)), np.zeros((1, 1, 1), np.int64)  # no previous round


@dataclass(frozen=True)
class PlacementLayers:
    """One TMP width's layer graph, per device: times (s) from the layer ILP, sizes (bytes)."""

    tmp: int
    forward_s: np.ndarray
    backward_s: np.ndarray
    weight_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activation_bytes: np.ndarray
    tensor_parallel: np.ndarray  # bool: the layer holds sliced ops, so its stage needs t devices
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_bytes: np.ndarray
    names: tuple[str, ...] = ()
    # bytes of each layer's weights that another layer also reads (tied embedding and LM head): their
    # gradient is AllReduced between the two stages when the readers sit in different stages
    tied_bytes: np.ndarray | None = None

    def __post_init__(self) -> None:
        L = len(self.forward_s)
        if self.tied_bytes is None:
            object.__setattr__(self, "tied_bytes", np.zeros(L))
        for f in ("backward_s", "weight_bytes", "optimizer_bytes", "activation_bytes", "tensor_parallel",
                  "tied_bytes"):
            if len(getattr(self, f)) != L:
                raise ValueError(f"placement layers: field {f!r} has {len(getattr(self, f))} entries, "
                                 f"expected {L}")
        for f in ("forward_s", "backward_s", "weight_bytes", "optimizer_bytes", "activation_bytes",
                  "tied_bytes"):
            v = np.asarray(getattr(self, f), dtype=float)
            if np.isnan(v).any() or (v < 0).any():
                raise ValueError(f"placement layers: field {f!r} must be non-negative numbers")
        if self.tmp < 1:
            raise ValueError(f"placement layers: field 'tmp' must be >= 1, got {self.tmp}")
        if len(self.edge_src) and (np.asarray(self.edge_src) >= np.asarray(self.edge_dst)).any():
            raise ValueError("placement layers: edges must go from an earlier to a later layer "
                             "(layers in topological order)")

    @property
    def num_layers(self) -> int:
        return len(self.forward_s)

    def is_linear(self) -> bool:
        chain = set(zip(np.asarray(self.edge_src).tolist(), np.asarray(self.edge_dst).tolist()))
        return all((i, i + 1) in chain for i in range(self.num_layers - 1))


@dataclass(frozen=True)
class TrainingSetup:
    num_devices: int
    global_batch: int
    microbatch: int
    hbm_bytes: float
    recompute: bool
    bandwidth: float  # bytes/s between accelerators (flat network)
    sync_model: str = "exposed"  # "exposed" (1F1B overlap, grad_sync.py) or "paper" (eq. 18)
    grad_reduce_dtype: str = "bf16"  # the gradients' dtype: what they occupy and what the AllReduce moves

    def __post_init__(self) -> None:
        check_sync_model(self.sync_model)
        grad_reduce_bytes_per_param(self.grad_reduce_dtype)
        for f in ("num_devices", "global_batch", "microbatch"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"training setup: field {f!r} must be a positive integer, got {v!r}")
        if self.global_batch % self.microbatch:
            raise ValueError(f"training setup: global_batch {self.global_batch} is not a multiple of "
                             f"microbatch {self.microbatch}")
        if not self.hbm_bytes > 0 or not self.bandwidth > 0:
            raise ValueError("training setup: hbm_bytes and bandwidth must be positive")

    @property
    def microbatches(self) -> int:
        return self.global_batch // self.microbatch

    @property
    def sync_factor(self) -> float:
        """``grad_sync.sync_factor``: 2 (a ring of bf16 gradients), 4 for fp32 ones or the paper's eq. 18."""
        return sync_factor(self.sync_model, self.grad_reduce_dtype)

    @property
    def grad_bytes_ratio(self) -> float:
        """Gradient bytes per weight byte (1 for bf16 gradients of bf16 weights, 2 for fp32 ones)."""
        return grad_bytes_ratio(self.grad_reduce_dtype)


# ---------------------------------------------------------------------------------------- stage costs
@dataclass(frozen=True)
class _StageTables:
    """(L+1)×(L+1) matrices over stages [i, j); entries with j <= i are meaningless."""

    load_plain: np.ndarray  # fw + bw (no recomputation)
    load_recompute: np.ndarray  # fw + fw' + bw
    const_bytes: np.ndarray
    stash_bytes: np.ndarray  # per in-flight microbatch
    weights: np.ndarray
    single_device: np.ndarray  # bool: no tensor-parallel layer in the stage
    tied: np.ndarray  # tied-weight bytes of the stage
    backward_before: np.ndarray  # (L+1,): backward compute of the layers before layer i


def _stage_tables(ly: PlacementLayers, setup: TrainingSetup) -> _StageTables:
    L = ly.num_layers
    bw = setup.bandwidth
    fw = np.asarray(ly.forward_s, float)
    bwd = np.asarray(ly.backward_s, float)
    P = np.concatenate([[0.0], np.cumsum(fw)])
    Q = np.concatenate([[0.0], np.cumsum(bwd)])
    src, dst = np.asarray(ly.edge_src, int), np.asarray(ly.edge_dst, int)
    cost = np.asarray(ly.edge_bytes, float) / bw
    # arrival[i, v]: latest external input of layer v when its stage starts at i (edges u < i <= v)
    arrival = np.zeros((L + 1, L + 1))
    # depart[j, u]: latest external gradient of layer u when its stage ends before j (u < j <= v)
    depart = np.zeros((L + 1, L + 1))
    inbytes = np.zeros((L + 2, L + 1))  # difference array over i for edges u < i <= v, column v
    for u, v, c, b in zip(src, dst, cost, np.asarray(ly.edge_bytes, float)):
        arrival[u + 1:v + 1, v] = np.maximum(arrival[u + 1:v + 1, v], c)
        depart[u + 1:v + 1, u] = np.maximum(depart[u + 1:v + 1, u], c)
        inbytes[u + 1, v] += b
        inbytes[v + 1, v] -= b
    idx = np.arange(L + 1)
    # forward chain: finish(i, j) = max_{i<=v<j} (arrival[i, v] + P[j] − P[v])   (max-plus scan)
    A = arrival - P[None, :]
    A[idx[:, None] > idx[None, :]] = -INF  # v < i is outside the stage
    fw_load = np.maximum.accumulate(A, axis=1)  # [i, v] = max over i..v
    fw_load = np.concatenate([np.full((L + 1, 1), -INF), fw_load[:, :-1]], axis=1) + P[None, :]
    # backward chain: finish(i, j) = max_{i<=u<j} (depart[j, u] + Q[u+1]) − Q[i]
    R = depart + np.concatenate([Q[1:], [0.0]])[None, :]
    R[idx[None, :] >= idx[:, None]] = -INF  # u >= j is outside the stage
    S = np.maximum.accumulate(R[:, ::-1], axis=1)[:, ::-1]  # [j, i] = max over u >= i
    bw_load = S.T - Q[:, None]  # [i, j]
    sum_fw = P[None, :] - P[:, None]
    per_layer = (1 + setup.grad_bytes_ratio) * np.asarray(ly.weight_bytes, float) \
        + np.asarray(ly.optimizer_bytes, float) + \
        np.asarray(ly.activation_bytes, float)
    C = np.concatenate([[0.0], np.cumsum(per_layer)])
    W = np.concatenate([[0.0], np.cumsum(np.asarray(ly.weight_bytes, float))])
    Act = np.concatenate([[0.0], np.cumsum(np.asarray(ly.activation_bytes, float))])
    E = np.cumsum(inbytes[:L + 1], axis=0)  # [i, v]: bytes into v from before i (u < i <= v)
    E = np.concatenate([np.zeros((L + 1, 1)), np.cumsum(E, axis=1)], axis=1)[:, :L + 1]  # sum v < j
    stash = E if setup.recompute else (Act[None, :] - Act[:, None])
    tp = np.concatenate([[0], np.cumsum(np.asarray(ly.tensor_parallel, bool))])
    single = (tp[None, :] - tp[:, None]) == 0
    Tb = np.concatenate([[0.0], np.cumsum(np.asarray(ly.tied_bytes, float))])
    return _StageTables(fw_load + bw_load, fw_load + sum_fw + bw_load, C[None, :] - C[:, None],
                        stash, W[None, :] - W[:, None], single, Tb[None, :] - Tb[:, None], Q)


def _max_stages(tables: _StageTables, hbm: float, cap: int) -> np.ndarray:
    """Largest s (position from the end) at which each stage fits: const + (s−1)·stash <= HBM."""
    c, st = tables.const_bytes, tables.stash_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(st > 0, 1 + np.floor((hbm - c) / np.where(st > 0, st, 1)), cap)
    s = np.where(c > hbm, 0, np.minimum(s, cap))
    return s.astype(np.int64)


# ---------------------------------------------------------------------------------------- the DP
@functools.lru_cache(maxsize=4096)
def _d_candidates(B: int, d_max: int) -> np.ndarray:
    """The smallest d for each value of ceil(B/d) with d <= d_max: a larger d with the same number
    of microbatches per pipeline only adds data-parallel AllReduce time."""
    q = np.unique(np.ceil(B / np.arange(1, d_max + 1)))
    out = np.unique(np.ceil(B / q).astype(np.int64))
    out.flags.writeable = False  # cached: shared by every caller
    return out


def _best_d(x: np.ndarray, weights: np.ndarray, per_pipe: np.ndarray, s: int, setup: TrainingSetup,
            fixed_d: int | None, suffix_e: np.ndarray | None = None, tied: np.ndarray | None = None,
            d_range: tuple[int, int] = (0, 2**62)) -> tuple[float, int, int]:
    """min over candidates c and d of (ceil(B/d) + s − 1)·x_c + E_c(d), with d·per_pipe_c <= K, where
    E_c(d) = max(suffix_e_c, first stage's sync) (the first stage has no window): its weights'
    AllReduce over d copies, plus the tied weights' AllReduce over the two stages that read them.
    Without ``suffix_e`` and ``tied`` this is eq. 18. Only d in ``d_range`` (lo, hi] count.
    Returns (F, c, d)."""
    K, B = setup.num_devices, setup.microbatches
    best = (INF, -1, 0)
    ok = np.isfinite(x)
    for P in np.unique(per_pipe[ok]):
        sel = np.flatnonzero(ok & (per_pipe == P))
        d_max = min(K // int(P), B)
        if fixed_d is not None:
            if fixed_d > d_max:
                continue
            ds = np.array([fixed_d])
        elif d_max < 1:
            continue
        else:
            ds = _d_candidates(B, d_max)
        ds = ds[(ds > d_range[0]) & (ds <= d_range[1])]
        if not len(ds):
            continue
        flush = np.ceil(B / ds)[:, None] + s - 1
        sync = allreduce_s(weights[sel][None, :], ds[:, None], setup.bandwidth, setup.sync_factor)
        if tied is not None and s > 1:
            sync = sync + allreduce_s(tied[sel], 2, setup.bandwidth, setup.sync_factor)[None, :]
        if suffix_e is not None:
            sync = np.maximum(sync, suffix_e[sel][None, :])
        val = flush * x[sel][None, :] + sync
        k = np.unravel_index(np.argmin(val), val.shape)
        if val[k] < best[0]:
            best = (float(val[k]), int(sel[k[1]]), int(ds[k[0]]))
    return best


def _d_upper(setup: TrainingSetup, fixed: tuple[int, int] | None) -> int:
    """The largest d any placement of this setup can use."""
    return fixed[1] if fixed is not None else max(1, min(setup.num_devices, setup.microbatches))


def _d_levels(setup: TrainingSetup, fixed: tuple[int, int] | None) -> list[tuple[int, int]]:
    """Ranges (lo, hi] of d, from the top: a range holds the d whose AllReduce factor (d−1)/d is within
    ``D_LEVEL_SPREAD`` of its top's. The DP charges a range's non-first stages at its top d, an upper
    bound tight to that spread."""
    if fixed is not None:
        return [(fixed[1] - 1, fixed[1])]
    if setup.sync_model == "paper":
        return [(0, _d_upper(setup, fixed))]
    ds = [int(d) for d in _d_candidates(setup.microbatches, _d_upper(setup, fixed))]
    levels = []
    while ds:
        top = ds.pop()
        floor = (1 - D_LEVEL_SPREAD) * (top - 1) / top
        while ds and ds[-1] > 1 and (ds[-1] - 1) / ds[-1] >= floor:
            ds.pop()
        levels.append((ds[-1] if ds else 0, top))
    return levels[::-1]


def placement_of_stages(ly: PlacementLayers, setup: TrainingSetup, parts: list[list[int]], loads: list[float],
            mems: list[float], devices: list[int], d: int) -> Placement:
    """The placement of these stages (layer lists, first to last) with d pipelines: F with the
    exposed sync computed exactly for its stages and d."""
    bwd = np.asarray(ly.backward_s, float)
    w = np.asarray(ly.weight_bytes, float)
    tied = np.asarray(ly.tied_bytes, float)
    s = len(parts)
    sync = stage_sync([w[p].sum() for p in parts], [tied[p].sum() for p in parts],
                      [bwd[:min(p)].sum() for p in parts], d, setup.bandwidth, setup.sync_model,
                      setup.grad_reduce_dtype)
    x = max(loads)
    F = (math.ceil(setup.microbatches / d) + s - 1) * x + sync.exposed_total_s
    stages = [Stage(min(p), max(p), n, ld, mem, tuple(ly.names[u] for u in p) if ly.names else (),
                    float(sync.sync_s[k]), float(sync.window_s[k]), float(sync.exposed_s[k]),
                    float(w[p].sum()))
              for k, (p, ld, mem, n) in enumerate(zip(parts, loads, mems, devices))]
    return Placement(True, F, setup.global_batch / F, s, d, ly.tmp, setup.microbatch, setup.recompute,
                     setup.hbm_bytes, x, stages, sync_model=setup.sync_model,
                     grad_reduce_dtype=setup.grad_reduce_dtype,
                     exposed_sync_s=sync.exposed_total_s)


def place(ly: PlacementLayers, setup: TrainingSetup, fixed: tuple[int, int] | None = None,
          general: bool = False) -> Placement:
    """Best placement for one TMP width, microbatch, HBM size and recompute choice.

    ``fixed = (p, d)`` evaluates a given number of stages and data-parallel width (an expert
    strategy {p, d, t}); the DP still chooses where the stages split. ``general`` forces the
    explicit downset DP (used automatically when the layer graph is not a chain).
    """
    L = ly.num_layers
    if fixed is not None and not 1 <= fixed[0] <= L:
        return Placement(False, t=ly.tmp, microbatch=setup.microbatch, recompute=setup.recompute,
                         hbm_bytes=setup.hbm_bytes, reason=f"p = {fixed[0]} stages needs 1..{L} layers")
    s_max = min(L, setup.num_devices, fixed[0] if fixed else L)
    n_single = int((~np.asarray(ly.tensor_parallel, bool)).sum()) if ly.tmp > 1 else 0
    m_max = min(s_max, n_single)
    solver = _place_general if (general or not ly.is_linear()) else _place_linear
    return solver(ly, setup, s_max, m_max, fixed)


def _infeasible(ly: PlacementLayers, setup: TrainingSetup) -> Placement:
    """Why nothing fits, checked in order: the weights, gradients and optimizer state of the whole
    model against the HBM of all devices; one layer's state and activations against one device's
    HBM; else the activations stashed for in-flight microbatches."""
    state = (1 + setup.grad_bytes_ratio) * np.asarray(ly.weight_bytes, float) \
        + np.asarray(ly.optimizer_bytes, float)
    one = state + np.asarray(ly.activation_bytes, float)
    # every layer's state is on one device of a width-t group (a TP layer's slice on each of t)
    total = float(np.where(np.asarray(ly.tensor_parallel, bool), ly.tmp, 1) @ state)
    worst = int(np.argmax(one))
    name = ly.names[worst] if ly.names else f"#{worst}"
    hbm = setup.hbm_bytes / 2**30
    if total > setup.num_devices * setup.hbm_bytes:
        why = (f"nothing fits: the weights, gradients and optimizer state need {total / 2**30:,.1f} GiB, "
               f"more than {setup.num_devices} devices × {hbm:.2f} GiB HBM = "
               f"{setup.num_devices * hbm:,.1f} GiB (tmp width {ly.tmp})")
    elif one[worst] > setup.hbm_bytes:
        why = (f"nothing fits: layer {name} alone needs {one[worst] / 2**30:.2f} GiB "
               f"(weights, gradients, optimizer state, activations) of {hbm:.2f} GiB HBM")
    else:
        why = (f"no pipeline fits {setup.num_devices} devices of {hbm:.2f} GiB HBM "
               f"with tmp width {ly.tmp} (stashed activations of in-flight microbatches)")
    return Placement(False, t=ly.tmp, microbatch=setup.microbatch, recompute=setup.recompute,
                     hbm_bytes=setup.hbm_bytes, reason=why)


def _linear_round(T: _StageTables, setup: TrainingSetup, t: int, s_max: int, m_max: int, nt: np.ndarray,
                  max_s: np.ndarray, valid: np.ndarray, e: np.ndarray | None, eps: float, fixed,
                  d_range: tuple[int, int], incumbent: float = INF, exact: bool = True, prev=None):
    """One DP over suffixes with non-first stages of exposed sync above ``eps`` forbidden. Returns
    (best (F, s, m_rest, j, d), arg, the largest suffix exposure among the final candidates that could
    still beat ``incumbent``, the smallest F any ε could still give: min over s of flush(s)·min max-load,
    per s the smallest max-load x_min). ``exact=False`` lets the kernel drop DP states that cannot beat
    ``incumbent`` (``placement_kernel.linear_round``'s ``prune``): best, arg along it and g_top stay the
    same and the bound keeps its side of min(incumbent, best), but x_min is then not the DP's.

    Per stage count s: ``f[s][m][i] = min_j max(f[s−1][m'][j], load_s[i, j])`` over the stages [i, j)
    that fit in HBM at position s from the end and whose exposed sync is at most ``eps`` (m' = m − 1
    when [i, j) is a single-device stage), with ``arg`` the first minimising j and ``g`` the largest
    exposure of the chosen suffix; then the first stage [0, j) (unmasked: it has no window) closes each
    (m_rest, j) and ``_best_d`` picks the d. Compiled in ``placement_kernel.linear_round`` (the numpy form
    cost ~80 small array operations per s; tests/test_placement_dp_speed.py keeps it as the reference)."""
    return _linear_round_tables(T, setup, t, s_max, m_max, nt, max_s, e, eps, fixed, d_range, incumbent,
                                exact, prev)[:5]


def _linear_round_tables(T, setup, t, s_max, m_max, nt, max_s, e, eps, fixed, d_range, incumbent, exact,
                         prev):
    """``_linear_round`` and its DP tables (f, g, arg); ``prev``, the tables of the previous round of
    this d range, makes the round incremental (``placement_kernel.linear_round``): the caller passes it
    only where that is exact (a smaller ε, an incumbent no larger than that round's threshold)."""
    if _kernel.numba is None:  # pragma: no cover - numba is a dependency (pyproject.toml)
        raise ImportError("the placement DP needs numba (pip install numba)")
    B = setup.microbatches
    has_e = e is not None
    inc = prev is not None
    F, s, m_rest, j, d, arg, g_top, bound, x_min, work, f, g = _kernel.linear_round(
        T.load_plain, T.load_recompute, bool(setup.recompute), max_s, nt, e if has_e else _NO_E, has_e,
        float(eps), int(s_max), int(m_max), int(t), int(B), int(setup.num_devices),
        -1 if fixed is None else int(fixed[0]), -1 if fixed is None else int(fixed[1]),
        int(d_range[0]), int(d_range[1]), float(incumbent), T.weights[0, 1:], T.tied[0, 1:],
        float(setup.bandwidth), float(setup.sync_factor), _d_candidates(B, max(1, min(setup.num_devices, B))),
        not exact,
        prev[0] if inc else _NO_PREV_F, prev[1] if inc else _NO_PREV_F, prev[2] if inc else _NO_PREV_ARG, inc)
    DP_STATS["rounds"] += 1
    DP_STATS["work"] += int(work)
    best = (float(F), int(s), int(m_rest), int(j), int(d))
    return best, arg, float(g_top), float(bound), x_min, (f, g, arg)


def _level_floor(x_free: np.ndarray | None, setup: TrainingSetup, d_range: tuple[int, int]) -> float:
    """The smallest F any placement with d in ``d_range`` can have, syncs aside: min over s of
    (ceil(B/d) + s − 1) · the unconstrained DP's smallest max-load with s stages."""
    if x_free is None:
        return 0.0
    s = np.arange(len(x_free))
    with np.errstate(invalid="ignore"):
        return float(np.min((math.ceil(setup.microbatches / d_range[1]) + s - 1) * x_free))


def _place_linear(ly, setup, s_max, m_max, fixed) -> Placement:
    L, t = ly.num_layers, ly.tmp
    T = _stage_tables(ly, setup)
    max_s = _max_stages(T, setup.hbm_bytes, setup.num_devices)
    valid = np.triu(np.ones((L + 1, L + 1), bool), 1)
    nt = T.single_device & valid if t > 1 else np.zeros_like(valid)  # stages that count in m
    best, best_arg, x_free = (INF, 0, 0, 0, 0), None, None
    for d_range in _d_levels(setup, fixed)[::-1]:
        e, eps = None, INF
        if setup.sync_model == "exposed":  # each non-first stage's exposed sync at the range's top d
            c = setup.sync_factor
            e = np.maximum(0.0, allreduce_s(T.weights, d_range[1], setup.bandwidth, c)
                           + allreduce_s(T.tied, 2, setup.bandwidth, c) - T.backward_before[:, None])
        floor, floor_set = _level_floor(x_free, setup, d_range), x_free
        if floor >= best[0]:
            continue  # no placement with d in this range can beat the best, whatever its sync
        prev, prev_eps, prev_thr = None, INF, INF
        for _ in range(SYNC_ROUNDS if e is not None else 1):
            # incremental on the previous round of this range only where that is exact (its docstring)
            inc = prev is not None and eps <= prev_eps and best[0] <= prev_thr
            cand, arg, g_top, bound, x_min, tables = _linear_round_tables(
                T, setup, t, s_max, m_max, nt, max_s, e, eps, fixed, d_range, best[0], x_free is None,
                prev if inc else None)
            x_free = x_min if x_free is None else x_free  # the first round has no mask
            prev, prev_eps, prev_thr = tables, eps, min(best[0], cand[0])
            if cand[0] < best[0]:
                best, best_arg = cand, arg
            if e is None or g_top <= SYNC_TOL * best[0] or bound >= best[0]:
                break
            if floor_set is not x_free:  # the range's floor, once x_free is known (it never changes after)
                floor, floor_set = _level_floor(x_free, setup, d_range), x_free
            # a placement of exposure E costs at least floor + E: E >= best - floor cannot win
            eps = min(SYNC_STEP * g_top, best[0] - floor)
    F, s, m_rest, j, d = best
    if not math.isfinite(F):
        return _infeasible(ly, setup)
    bounds, i, m = [(0, j)], j, m_rest
    for k in range(s - 1, 0, -1):
        nj = int(best_arg[k, m, i])
        m -= int(nt[i, nj])
        bounds.append((i, nj))
        i = nj
    loads, mems, devices = [], [], []
    for pos, (a, b) in enumerate(bounds):
        from_end = s - pos
        loads.append(float((T.load_recompute if (setup.recompute and from_end > 1) else T.load_plain)[a, b]))
        mems.append(float(T.const_bytes[a, b] + (from_end - 1) * T.stash_bytes[a, b]))
        devices.append(1 if nt[a, b] else t)
    return placement_of_stages(ly, setup, [list(range(a, b)) for a, b in bounds], loads, mems, devices, d)


# ---------------------------------------------------------------------------------------- general DAGs
def downsets(num_layers: int, src, dst, limit: int = 40_000) -> list[int]:
    """Every downset (closed under successors) as a bitmask, smallest first."""
    succ = [0] * num_layers
    for u, v in zip(src, dst):
        succ[int(u)] |= 1 << int(v)
    closure = [0] * num_layers  # u and everything reachable from it
    for u in range(num_layers - 1, -1, -1):
        c, rest = 1 << u, succ[u]
        while rest:
            v = (rest & -rest).bit_length() - 1
            c |= closure[v]
            rest &= rest - 1
        closure[u] = c
    seen, stack = {0}, [0]
    while stack:
        D = stack.pop()
        for u in range(num_layers):
            if not D >> u & 1:
                nd = D | closure[u]
                if nd not in seen:
                    if len(seen) >= limit:
                        raise ValueError(f"more than {limit} downsets: the layer graph is too branchy "
                                         "for the exact placement DP")
                    seen.add(nd)
                    stack.append(nd)
    return sorted(seen, key=lambda x: (bin(x).count("1"), x))


def stage_cost(ly: PlacementLayers, setup: TrainingSetup, layers: list[int]) -> dict[str, float]:
    """Load and memory terms of one stage holding ``layers`` (any convex set), computed directly:
    the reference the vectorised tables are tested against."""
    fw = np.asarray(ly.forward_s, float)
    bwd = np.asarray(ly.backward_s, float)
    src, dst = np.asarray(ly.edge_src, int), np.asarray(ly.edge_dst, int)
    c = np.asarray(ly.edge_bytes, float) / setup.bandwidth
    inside = np.zeros(ly.num_layers, bool)
    inside[layers] = True
    layers = sorted(layers)
    t = 0.0
    for v in layers:  # forward chain in topological (index) order, waiting for external inputs
        ext = c[(dst == v) & ~inside[src]]
        t = max(t, ext.max() if len(ext) else 0.0) + fw[v]
    f_load, t = t, 0.0
    for u in reversed(layers):  # backward chain, waiting for external gradients
        ext = c[(src == u) & ~inside[dst]]
        t = max(t, ext.max() if len(ext) else 0.0) + bwd[u]
    act = float(np.asarray(ly.activation_bytes, float)[layers].sum())
    incoming = float(np.asarray(ly.edge_bytes, float)[inside[dst] & ~inside[src]].sum())
    return {"plain": f_load + t, "recompute": f_load + fw[layers].sum() + t,
            "const": float(((1 + setup.grad_bytes_ratio) * np.asarray(ly.weight_bytes, float)
                            + np.asarray(ly.optimizer_bytes, float)
                            + np.asarray(ly.activation_bytes, float))[layers].sum()),
            "stash": incoming if setup.recompute else act,
            "weights": float(np.asarray(ly.weight_bytes, float)[layers].sum()),
            "tied": float(np.asarray(ly.tied_bytes, float)[layers].sum()),
            "single": not bool(np.asarray(ly.tensor_parallel, bool)[layers].any())}


def _fits_at(cost: dict[str, float], hbm: float, s: int) -> bool:
    return cost["const"] + (s - 1) * cost["stash"] <= hbm


def _place_general(ly, setup, s_max, m_max, fixed) -> Placement:
    L, t = ly.num_layers, ly.tmp
    ds = downsets(L, ly.edge_src, ly.edge_dst)
    index = {D: i for i, D in enumerate(ds)}
    full = (1 << L) - 1
    bits = lambda m: [u for u in range(L) if m >> u & 1]  # noqa: E731
    pairs = [(i, index[Dp]) for i, D in enumerate(ds) for Dp in ds if Dp != D and Dp & ~D == 0]
    cost = {(i, k): stage_cost(ly, setup, bits(ds[i] & ~ds[k])) for i, k in pairs}
    bwd = np.asarray(ly.backward_s, float)
    for (i, _), c in cost.items():  # the window of a non-first stage: the layers outside ds[i]
        c["before"] = float(bwd[bits(full & ~ds[i])].sum())
    exposed_model = setup.sync_model == "exposed"
    best, best_arg = (INF, 0, 0, 0, 0), None
    for d_range in _d_levels(setup, fixed)[::-1]:
        for c in cost.values():  # a non-first stage's exposed sync at the range's top d
            f = setup.sync_factor
            c["exposed"] = max(0.0, float(allreduce_s(c["weights"], d_range[1], setup.bandwidth, f)
                                          + allreduce_s(c["tied"], 2, setup.bandwidth, f)) - c["before"])
        eps = INF
        for _ in range(SYNC_ROUNDS if exposed_model else 1):
            cand, arg, g_top, bound = _general_round(ds, index, cost, setup, t, s_max, m_max, fixed,
                                                     exposed_model, eps, d_range, best[0])
            if cand[0] < best[0]:
                best, best_arg = cand, arg
            if not exposed_model or g_top <= SYNC_TOL * best[0] or bound >= best[0]:
                break
            eps = SYNC_STEP * g_top
    F, s, m_rest, k, d = best
    if not math.isfinite(F):
        return _infeasible(ly, setup)
    top = index[full]
    chain, cur, m = [(top, k)], k, m_rest
    for level in range(s - 1, 0, -1):
        nk = int(best_arg[level, m, cur])
        m -= int(cost[(cur, nk)]["single"] and t > 1)
        chain.append((cur, nk))
        cur = nk
    parts, loads, mems, devices = [], [], [], []
    for pos, (i, k) in enumerate(chain):
        from_end, c = s - pos, cost[(i, k)]
        parts.append(bits(ds[i] & ~ds[k]))
        loads.append(c["recompute"] if (setup.recompute and from_end > 1) else c["plain"])
        mems.append(c["const"] + (from_end - 1) * c["stash"])
        devices.append(1 if (c["single"] and t > 1) else t)
    return placement_of_stages(ly, setup, parts, loads, mems, devices, d)


def _general_round(ds, index, cost, setup, t, s_max, m_max, fixed, exposed_model: bool, eps: float,
                   d_range: tuple[int, int], incumbent: float = INF):
    """``_linear_round`` over downsets: one DP with non-first stages of exposed sync above ``eps``
    forbidden."""
    n = len(ds)
    f = np.full((s_max + 1, m_max + 1, n), INF)
    g = np.zeros((s_max + 1, m_max + 1, n))
    arg = np.full((s_max + 1, m_max + 1, n), -1, dtype=np.int64)
    f[0, 0, index[0]] = 0.0
    for s in range(1, s_max + 1):
        for (i, k), c in cost.items():
            if not _fits_at(c, setup.hbm_bytes, s) or (exposed_model and c["exposed"] > eps):
                continue
            load = c["recompute"] if (setup.recompute and s > 1) else c["plain"]
            dm = int(c["single"] and t > 1)
            for m in range(dm, m_max + 1):
                v = max(f[s - 1, m - dm, k], load)
                if v < f[s, m, i]:
                    f[s, m, i], arg[s, m, i] = v, k
                    g[s, m, i] = max(g[s - 1, m - dm, k], c["exposed"]) if exposed_model else 0.0
    best, g_top, bound = (INF, 0, 0, 0, 0), 0.0, INF
    top = len(ds) - 1  # the whole layer set: the only downset of the largest size
    firsts = [(k, c) for (i, k), c in cost.items() if i == top]
    B = setup.microbatches
    for s in range(1, s_max + 1):
        if fixed is not None and s != fixed[0]:
            continue
        for m_rest in range(m_max + 1):
            x, w, tied, pp, suffix = [], [], [], [], []
            for k, c in firsts:
                ok = _fits_at(c, setup.hbm_bytes, s)
                load = c["recompute"] if (setup.recompute and s > 1) else c["plain"]
                x.append(max(f[s - 1, m_rest, k], load) if ok else INF)
                w.append(c["weights"])
                tied.append(c["tied"])
                suffix.append(g[s - 1, m_rest, k])
                mt = m_rest + int(c["single"] and t > 1)
                pp.append(t * (s - mt) + mt)
            if not x or not np.isfinite(x).any():
                continue
            xa = np.array(x)
            F, ci, d = _best_d(xa, np.array(w), np.array(pp), s, setup, fixed[1] if fixed else None,
                               np.array(suffix) if exposed_model else None,
                               np.array(tied) if exposed_model else None, d_range)
            if F < best[0]:
                best = (F, s, m_rest, firsts[ci][0], d)
            low = (math.ceil(B / d_range[1]) + s - 1) * xa
            if exposed_model:
                live = low < min(incumbent, best[0])
                if live.any():
                    g_top = max(g_top, float(np.array(suffix)[live].max()))
            bound = min(bound, float(low.min()))
    return best, arg, g_top, bound


def best_placement(layers_by_t: dict[int, PlacementLayers] | list[PlacementLayers],
                   setup: TrainingSetup, fixed: tuple[int, int, int] | None = None) -> Placement:
    """Best over TMP widths for one (microbatch, HBM, recompute); ``fixed = (p, d, t)``."""
    items = layers_by_t.values() if isinstance(layers_by_t, dict) else layers_by_t
    best: Placement | None = None
    for ly in sorted(items, key=lambda ly: ly.tmp):
        if fixed is not None and ly.tmp != fixed[2]:
            continue
        res = place(ly, setup, None if fixed is None else (fixed[0], fixed[1]))
        # when nothing fits, the reason of the widest TMP slice (the least memory per device) stands
        if best is None or (res.feasible and (not best.feasible
                                              or res.time_per_batch_s < best.time_per_batch_s)) \
                or (not res.feasible and not best.feasible):
            best = res
    if best is None:
        return Placement(False, reason=f"no layer graph for tmp width {fixed[2] if fixed else '?'}")
    return best
