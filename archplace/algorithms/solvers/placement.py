"""Phaze's device-placement dynamic program (spec phaze.md §5): data, pipeline and tensor-model
parallelism of a layer graph on K accelerators under the HBM limit.

For one TMP width t, a pipeline is a sequence of stages; each stage is a contiguous set of layers on
``a`` accelerators (``a = t`` when the stage holds a tensor-parallel layer, else 1). ``d`` identical
pipelines run data-parallel. With PipeDream-Flush (1F1B), the time per batch is

    F = (ceil(B/d) + s − 1) · max-load + 4 · (d−1)/d · weights(first stage) / bandwidth      (17, 18)

where B = global batch / microbatch and s the number of stages. Stage load (§5.5): the forward chain
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

INF = math.inf


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

    def __post_init__(self) -> None:
        L = len(self.forward_s)
        for f in ("backward_s", "weight_bytes", "optimizer_bytes", "activation_bytes", "tensor_parallel"):
            if len(getattr(self, f)) != L:
                raise ValueError(f"placement layers: field {f!r} has {len(getattr(self, f))} entries, "
                                 f"expected {L}")
        for f in ("forward_s", "backward_s", "weight_bytes", "optimizer_bytes", "activation_bytes"):
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

    def __post_init__(self) -> None:
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


@dataclass
class Stage:
    first: int
    last: int  # inclusive
    devices: int
    load_s: float
    memory_bytes: float
    layers: tuple[str, ...] = ()


@dataclass
class Placement:
    feasible: bool
    time_per_batch_s: float = INF
    throughput: float = 0.0  # samples/s
    p: int = 0
    d: int = 0
    t: int = 0
    microbatch: int = 0
    recompute: bool = False
    hbm_bytes: float = 0.0
    max_load_s: float = INF
    stages: list[Stage] = field(default_factory=list)
    reason: str = ""

    def summary(self) -> dict[str, Any]:
        out = {"feasible": self.feasible, "time_per_batch_s": self.time_per_batch_s,
               "throughput": self.throughput, "p": self.p, "d": self.d, "t": self.t,
               "microbatch": self.microbatch, "recompute": self.recompute,
               "hbm_gb": self.hbm_bytes / 2**30, "max_load_s": self.max_load_s,
               "stages": [{"first": s.first, "last": s.last, "devices": s.devices, "load_s": s.load_s,
                           "memory_bytes": s.memory_bytes,
                           "layers": [s.layers[0], s.layers[-1]] if s.layers else []}
                          for s in self.stages]}
        if not self.feasible:
            out["reason"] = self.reason
        return out


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
    per_layer = 2 * np.asarray(ly.weight_bytes, float) + np.asarray(ly.optimizer_bytes, float) + \
        np.asarray(ly.activation_bytes, float)
    C = np.concatenate([[0.0], np.cumsum(per_layer)])
    W = np.concatenate([[0.0], np.cumsum(np.asarray(ly.weight_bytes, float))])
    Act = np.concatenate([[0.0], np.cumsum(np.asarray(ly.activation_bytes, float))])
    E = np.cumsum(inbytes[:L + 1], axis=0)  # [i, v]: bytes into v from before i (u < i <= v)
    E = np.concatenate([np.zeros((L + 1, 1)), np.cumsum(E, axis=1)], axis=1)[:, :L + 1]  # sum v < j
    stash = E if setup.recompute else (Act[None, :] - Act[:, None])
    tp = np.concatenate([[0], np.cumsum(np.asarray(ly.tensor_parallel, bool))])
    single = (tp[None, :] - tp[:, None]) == 0
    return _StageTables(fw_load + bw_load, fw_load + sum_fw + bw_load, C[None, :] - C[:, None],
                        stash, W[None, :] - W[:, None], single)


def _max_stages(tables: _StageTables, hbm: float, cap: int) -> np.ndarray:
    """Largest s (position from the end) at which each stage fits: const + (s−1)·stash <= HBM."""
    c, st = tables.const_bytes, tables.stash_bytes
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(st > 0, 1 + np.floor((hbm - c) / np.where(st > 0, st, 1)), cap)
    s = np.where(c > hbm, 0, np.minimum(s, cap))
    return s.astype(np.int64)


# ---------------------------------------------------------------------------------------- the DP
def _d_candidates(B: int, d_max: int) -> np.ndarray:
    """The smallest d for each value of ceil(B/d) with d <= d_max: a larger d with the same number
    of microbatches per pipeline only adds data-parallel AllReduce time."""
    q = np.unique(np.ceil(B / np.arange(1, d_max + 1)))
    return np.unique(np.ceil(B / q).astype(np.int64))


def _best_d(x: np.ndarray, weights: np.ndarray, per_pipe: np.ndarray, s: int, setup: TrainingSetup,
            fixed_d: int | None) -> tuple[float, int, int]:
    """min over candidates c and d of (ceil(B/d) + s − 1)·x_c + 4(d−1)/d·weights_c/bw, with
    d·per_pipe_c <= K. Returns (F, c, d)."""
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
        flush = np.ceil(B / ds)[:, None] + s - 1
        sync = 4.0 * (ds[:, None] - 1) / ds[:, None] * weights[sel][None, :] / setup.bandwidth
        val = flush * x[sel][None, :] + sync
        k = np.unravel_index(np.argmin(val), val.shape)
        if val[k] < best[0]:
            best = (float(val[k]), int(sel[k[1]]), int(ds[k[0]]))
    return best


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
    """Why nothing fits: a layer that alone exceeds HBM, or pipelines that cannot hold their stash."""
    one = 2 * np.asarray(ly.weight_bytes, float) + np.asarray(ly.optimizer_bytes, float) + \
        np.asarray(ly.activation_bytes, float)
    worst = int(np.argmax(one))
    name = ly.names[worst] if ly.names else f"#{worst}"
    if one[worst] > setup.hbm_bytes:
        why = (f"nothing fits: layer {name} alone needs {one[worst] / 2**30:.2f} GiB "
               f"(weights, gradients, optimizer state, activations) of {setup.hbm_bytes / 2**30:.2f} GiB HBM")
    else:
        why = (f"no pipeline fits {setup.num_devices} devices of {setup.hbm_bytes / 2**30:.2f} GiB HBM "
               f"with tmp width {ly.tmp} (stashed activations of in-flight microbatches)")
    return Placement(False, t=ly.tmp, microbatch=setup.microbatch, recompute=setup.recompute,
                     hbm_bytes=setup.hbm_bytes, reason=why)


def _place_linear(ly, setup, s_max, m_max, fixed) -> Placement:
    L, t = ly.num_layers, ly.tmp
    T = _stage_tables(ly, setup)
    max_s = _max_stages(T, setup.hbm_bytes, setup.num_devices)
    valid = np.triu(np.ones((L + 1, L + 1), bool), 1)
    nt = T.single_device & valid if t > 1 else np.zeros_like(valid)  # stages that count in m
    f = np.full((s_max + 1, m_max + 1, L + 1), INF)
    arg = np.full((s_max + 1, m_max + 1, L + 1), -1, dtype=np.int64)
    f[0, 0, L] = 0.0
    rows = np.arange(L + 1)
    best = (INF, 0, 0, 0, 0)  # F, s, m_rest, j, d
    for s in range(1, s_max + 1):
        use = T.load_recompute if (setup.recompute and s > 1) else T.load_plain
        load = np.where(valid & (max_s >= s), use, INF)
        for m in range(m_max + 1):
            cand = np.where(nt, INF, np.maximum(f[s - 1, m][None, :], load))
            if m > 0:
                cand = np.minimum(cand, np.where(nt, np.maximum(f[s - 1, m - 1][None, :], load), INF))
            j = np.argmin(cand, axis=1)
            f[s, m] = cand[rows, j]
            arg[s, m] = j
        if fixed is not None and s != fixed[0]:
            continue
        # final round: the first stage [0, j) is the s-th from the end
        for m_rest in range(m_max + 1):
            x = np.maximum(f[s - 1, m_rest, 1:], load[0, 1:])
            m_tot = m_rest + nt[0, 1:].astype(int)
            per_pipe = t * (s - m_tot) + m_tot
            F, c, d = _best_d(x, T.weights[0, 1:], per_pipe, s, setup, fixed[1] if fixed else None)
            if F < best[0]:
                best = (F, s, m_rest, c + 1, d)
    F, s, m_rest, j, d = best
    if not math.isfinite(F):
        return _infeasible(ly, setup)
    bounds, i, m = [(0, j)], j, m_rest
    for k in range(s - 1, 0, -1):
        nj = int(arg[k, m, i])
        m -= int(nt[i, nj])
        bounds.append((i, nj))
        i = nj
    stages = []
    for pos, (a, b) in enumerate(bounds):
        from_end = s - pos
        load = (T.load_recompute if (setup.recompute and from_end > 1) else T.load_plain)[a, b]
        mem = T.const_bytes[a, b] + (from_end - 1) * T.stash_bytes[a, b]
        stages.append(Stage(a, b - 1, 1 if nt[a, b] else t, float(load), float(mem),
                            tuple(ly.names[a:b]) if ly.names else ()))
    return Placement(True, F, setup.global_batch / F, s, d, t, setup.microbatch, setup.recompute,
                     setup.hbm_bytes, max(st.load_s for st in stages), stages)


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
            "const": float((2 * np.asarray(ly.weight_bytes, float) + np.asarray(ly.optimizer_bytes, float)
                            + np.asarray(ly.activation_bytes, float))[layers].sum()),
            "stash": incoming if setup.recompute else act,
            "weights": float(np.asarray(ly.weight_bytes, float)[layers].sum()),
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
    n = len(ds)
    f = np.full((s_max + 1, m_max + 1, n), INF)
    arg = np.full((s_max + 1, m_max + 1, n), -1, dtype=np.int64)
    f[0, 0, index[0]] = 0.0
    for s in range(1, s_max + 1):
        for (i, k), c in cost.items():
            if not _fits_at(c, setup.hbm_bytes, s):
                continue
            load = c["recompute"] if (setup.recompute and s > 1) else c["plain"]
            dm = int(c["single"] and t > 1)
            for m in range(dm, m_max + 1):
                v = max(f[s - 1, m - dm, k], load)
                if v < f[s, m, i]:
                    f[s, m, i], arg[s, m, i] = v, k
    best = (INF, 0, 0, 0, 0)
    top = index[full]
    firsts = [(k, c) for (i, k), c in cost.items() if i == top]
    for s in range(1, s_max + 1):
        if fixed is not None and s != fixed[0]:
            continue
        for m_rest in range(m_max + 1):
            x, w, pp = [], [], []
            for k, c in firsts:
                ok = _fits_at(c, setup.hbm_bytes, s)
                load = c["recompute"] if (setup.recompute and s > 1) else c["plain"]
                x.append(max(f[s - 1, m_rest, k], load) if ok else INF)
                w.append(c["weights"])
                mt = m_rest + int(c["single"] and t > 1)
                pp.append(t * (s - mt) + mt)
            if not x:
                continue
            F, ci, d = _best_d(np.array(x), np.array(w), np.array(pp), s, setup, fixed[1] if fixed else None)
            if F < best[0]:
                best = (F, s, m_rest, firsts[ci][0], d)
    F, s, m_rest, k, d = best
    if not math.isfinite(F):
        return _infeasible(ly, setup)
    chain, cur, m = [(top, k)], k, m_rest
    for level in range(s - 1, 0, -1):
        nk = int(arg[level, m, cur])
        m -= int(cost[(cur, nk)]["single"] and t > 1)
        chain.append((cur, nk))
        cur = nk
    stages = []
    for pos, (i, k) in enumerate(chain):
        from_end, c = s - pos, cost[(i, k)]
        layers = bits(ds[i] & ~ds[k])
        stages.append(Stage(min(layers), max(layers), 1 if (c["single"] and t > 1) else t,
                            c["recompute"] if (setup.recompute and from_end > 1) else c["plain"],
                            c["const"] + (from_end - 1) * c["stash"],
                            tuple(ly.names[u] for u in layers) if ly.names else ()))
    return Placement(True, F, setup.global_batch / F, s, d, t, setup.microbatch, setup.recompute,
                     setup.hbm_bytes, max(st.load_s for st in stages), stages)


def best_placement(layers_by_t: dict[int, PlacementLayers] | list[PlacementLayers],
                   setup: TrainingSetup, fixed: tuple[int, int, int] | None = None) -> Placement:
    """Best over TMP widths for one (microbatch, HBM, recompute); ``fixed = (p, d, t)``."""
    items = layers_by_t.values() if isinstance(layers_by_t, dict) else layers_by_t
    best: Placement | None = None
    for ly in items:
        if fixed is not None and ly.tmp != fixed[2]:
            continue
        res = place(ly, setup, None if fixed is None else (fixed[0], fixed[1]))
        if best is None or (res.feasible and (not best.feasible
                                              or res.time_per_batch_s < best.time_per_batch_s)):
            best = res
    if best is None:
        return Placement(False, reason=f"no layer graph for tmp width {fixed[2] if fixed else '?'}")
    return best


def expert_placement(ly: PlacementLayers, setup: TrainingSetup, p: int, d: int,
                     block: np.ndarray | None = None) -> Placement:
    """An expert strategy {p, d, t} as the Phaze code evaluates it (spec §8.3): ceil(blocks/p)
    consecutive transformer blocks per stage, the layers before the first block in the first stage
    and those after the last block in the last; the same load, memory and F as the DP."""
    import re

    L, t = ly.num_layers, ly.tmp
    if block is None:
        block = np.array([bool(re.search(r"\.\d+$", n)) for n in ly.names]) if ly.names else np.ones(L, bool)
    idx = np.flatnonzero(block)
    if not 1 <= p <= max(len(idx), 1):
        return Placement(False, t=t, reason=f"p = {p} stages but only {len(idx)} transformer blocks")
    per = -(-len(idx) // p)
    cuts = [int(idx[k * per]) for k in range(1, p) if k * per < len(idx)]
    bounds = list(zip([0, *cuts], [*cuts, L]))
    s = len(bounds)
    stages, devices = [], 0
    for pos, (a, b) in enumerate(bounds):
        c = stage_cost(ly, setup, list(range(a, b)))
        from_end = s - pos
        mem = c["const"] + (from_end - 1) * c["stash"]
        if mem > setup.hbm_bytes:
            return Placement(False, t=t, microbatch=setup.microbatch, recompute=setup.recompute,
                             hbm_bytes=setup.hbm_bytes,
                             reason=f"expert stage {pos} needs {mem / 2**30:.2f} GiB of HBM")
        load = c["recompute"] if (setup.recompute and from_end > 1) else c["plain"]
        n_dev = 1 if (c["single"] and t > 1) else t
        devices += n_dev
        stages.append(Stage(a, b - 1, n_dev, load, mem, tuple(ly.names[a:b]) if ly.names else ()))
    if d * devices > setup.num_devices or d > setup.microbatches:
        return Placement(False, t=t, reason=f"{p}×{d}×{t} needs more than {setup.num_devices} devices "
                                            f"or {setup.microbatches} microbatches")
    x = max(st.load_s for st in stages)
    w0 = stage_cost(ly, setup, list(range(*bounds[0])))["weights"]
    F = (math.ceil(setup.microbatches / d) + s - 1) * x + 4 * (d - 1) / d * w0 / setup.bandwidth
    return Placement(True, F, setup.global_batch / F, s, d, t, setup.microbatch, setup.recompute,
                     setup.hbm_bytes, x, stages)
