"""The compiled round of the linear placement DP (``placement_kernel.linear_round``, issue 33's screen
cost) against the numpy form it replaced, kept here verbatim as the reference (``reference_round``,
placement.py before the kernel): every output of a round (best F, s, m_rest, j, d; the argmin table
with its first-minimum tie-breaking; the suffix exposure g_top, the bound and the per-s max-loads);
with pruning, what ``_place_linear`` reads of a round (best, its stages, g_top, the bound's side of the
incumbent); incremental ε rounds against full ones (tables f, g, argmin, bit for bit); and every
placement ``place`` returns, bit for bit, on random chains (TMP widths with
single-device layers, tied weights, recomputation, tight HBM, fixed {p, d}, few devices), on chains of
identical layers (ties everywhere) and on real BERT-Large layer graphs on TPUv4."""

import math

import numpy as np
import pytest

import archplace.algorithms.solvers.placement as P
from archplace.algorithms.solvers.placement import (
    INF,
    PlacementLayers,
    TrainingSetup,
    _best_d,
    _d_candidates,
    _StageTables,
    place,
)


def reference_round(T: _StageTables, setup: TrainingSetup, t: int, s_max: int, m_max: int, nt: np.ndarray,
                  max_s: np.ndarray, valid: np.ndarray, e: np.ndarray | None, eps: float, fixed,
                  d_range: tuple[int, int], incumbent: float = INF):
    """One DP over suffixes with non-first stages of exposed sync above ``eps`` forbidden. Returns
    (best (F, s, m_rest, j, d), arg, the largest suffix exposure among the final candidates that could
    still beat ``incumbent``, the smallest F any ε could still give: min over s of flush(s)·min max-load)."""
    L = valid.shape[0] - 1
    f = np.full((s_max + 1, m_max + 1, L + 1), INF)
    g = np.zeros((s_max + 1, m_max + 1, L + 1))  # largest exposure of the chosen suffix
    arg = np.full((s_max + 1, m_max + 1, L + 1), -1, dtype=np.int64)
    f[0, 0, L] = 0.0
    rows = np.arange(L + 1)
    allowed = valid if e is None else valid & (e <= eps)
    best = (INF, 0, 0, 0, 0)  # F, s, m_rest, j, d
    g_top, bound = 0.0, INF
    x_min = np.full(s_max + 1, INF)  # per number of stages: the smallest max-load of this round
    B = setup.microbatches
    for s in range(1, s_max + 1):
        use = T.load_recompute if (setup.recompute and s > 1) else T.load_plain
        fits = valid & (max_s >= s)
        load = np.where(fits & allowed, use, INF)
        # all m at once: a single-device stage (nt) moves the suffix's count from m − 1 to m
        prev_f = np.full((m_max + 2, L + 1), INF)
        prev_f[1:] = f[s - 1]
        cand = np.where(nt[None], np.maximum(prev_f[:-1, None, :], load[None]),
                        np.maximum(f[s - 1][:, None, :], load[None]))  # (m, i, j)
        j = np.argmin(cand, axis=2)
        f[s] = np.take_along_axis(cand, j[:, :, None], axis=2)[:, :, 0]
        arg[s] = j
        if e is not None:
            prev_g = np.zeros((m_max + 2, L + 1))
            prev_g[1:] = g[s - 1]
            m_idx = np.arange(m_max + 1)[:, None]
            from_prev = nt[rows[None, :], j]  # the chosen stage is single-device: suffix at m − 1
            gc = np.where(from_prev, prev_g[m_idx, j], g[s - 1][m_idx, j])
            g[s] = np.where(np.isfinite(f[s]), np.maximum(gc, e[rows[None, :], j]), 0.0)
        if fixed is not None and s != fixed[0]:
            continue
        # final round: the first stage [0, j) is the s-th from the end (no window: not masked); all
        # (m_rest, j) candidates at once
        first = np.where(fits[0, 1:], use[0, 1:], INF)
        x = np.maximum(f[s - 1, :, 1:], first[None, :])  # (m_max + 1, L)
        ok = np.isfinite(x)
        if not ok.any():
            continue
        m_tot = np.arange(m_max + 1)[:, None] + nt[0, 1:].astype(int)[None, :]
        per_pipe = t * (s - m_tot) + m_tot
        suffix = g[s - 1, :, 1:] if e is not None else None
        tile = (m_max + 1, 1)
        F, c, d = _best_d(x.ravel(), np.tile(T.weights[0, 1:], tile).ravel(), per_pipe.ravel(), s, setup,
                          fixed[1] if fixed else None, None if suffix is None else suffix.ravel(),
                          np.tile(T.tied[0, 1:], tile).ravel() if e is not None else None, d_range)
        if F < best[0]:
            m_rest, j = divmod(c, L)
            best = (F, s, m_rest, j + 1, d)
        low = (math.ceil(B / d_range[1]) + s - 1) * x  # F of each candidate without any sync
        if suffix is not None:
            live = low < min(incumbent, best[0])
            if live.any():
                g_top = max(g_top, float(suffix[live].max()))
        bound = min(bound, float(low.min()))
        x_min[s] = min(x_min[s], float(x.min()))
    return best, arg, g_top, bound, x_min



def chain_layers(rng, L, t, tp_prob=0.7, tied=False, integer=False):
    """A random linear layer graph (so ``place`` takes the linear DP); ``integer`` rounds every time
    and size to a few values, so loads, exposures and F tie often."""
    draw = (lambda lo, hi, n: rng.integers(lo, hi + 1, n).astype(float)) if integer else rng.uniform
    weights = draw(1, 4, L) * 1e9
    tied_bytes = np.zeros(L)
    if tied and L > 1:
        tied_bytes[[0, -1]] = weights[0]
    return PlacementLayers(t, draw(1, 5, L), draw(2, 10, L), weights, draw(0, 2, L) * 1e9,
                           draw(1, 3, L) * 1e9, rng.random(L) < tp_prob, np.arange(L - 1), np.arange(1, L),
                           draw(0, 3, L - 1) * 1e9, tuple(f"l{i}" for i in range(L)), tied_bytes)


def random_setup(rng, ly, sync_model):
    """A setup whose HBM lets some, not all, stages fit (the memory masks matter)."""
    state = 2 * ly.weight_bytes + ly.optimizer_bytes + ly.activation_bytes
    hbm = float(rng.uniform(1.2, 6.0) * state.max())
    return TrainingSetup(int(rng.choice([4, 16, 64, 1024])), int(rng.choice([16, 64, 256])), 1, hbm,
                         bool(rng.random() < 0.5), float(rng.uniform(5e9, 5e10)), sync_model)


def round_inputs(ly, setup):
    """What ``_place_linear`` hands a round: the tables, masks and the exposure matrix of the top d."""
    L, t = ly.num_layers, ly.tmp
    T = P._stage_tables(ly, setup)
    max_s = P._max_stages(T, setup.hbm_bytes, setup.num_devices)
    valid = np.triu(np.ones((L + 1, L + 1), bool), 1)
    nt = T.single_device & valid if t > 1 else np.zeros_like(valid)
    n_single = int((~np.asarray(ly.tensor_parallel, bool)).sum()) if t > 1 else 0
    s_max = min(L, setup.num_devices)
    return T, max_s, valid, nt, s_max, min(s_max, n_single)


def stage_path(arg, best, nt):
    """The stages of a round's best, first to last, read back from its argmin table."""
    F, s, m, j, _ = best
    if not math.isfinite(F):
        return []
    path, i = [(0, j)], j
    for k in range(s - 1, 0, -1):
        nj = int(arg[k, m, i])
        m -= int(nt[i, nj])
        path.append((i, nj))
        i = nj
    return path


def same_placement(ly, setup, fixed=None):
    """``place`` with the kernel and with the reference round: identical summaries."""
    new = place(ly, setup, fixed)
    saved = P._linear_round_tables

    def reference_tables(T, setup, t, s_max, m_max, nt, max_s, e, eps, fixed, d_range, incumbent, exact,
                         prev):
        valid = np.triu(np.ones(max_s.shape, bool), 1)
        return (*reference_round(T, setup, t, s_max, m_max, nt, max_s, valid, e, eps, fixed, d_range,
                                 incumbent), None)

    P._linear_round_tables = reference_tables
    try:
        old = place(ly, setup, fixed)
    finally:
        P._linear_round_tables = saved
    assert new.summary() == old.summary()
    return new


@pytest.mark.parametrize("seed", range(12))
def test_round_outputs_equal_the_numpy_round(seed):
    rng = np.random.default_rng(seed)
    L, t = int(rng.integers(2, 12)), int(rng.choice([1, 2, 4]))
    ly = chain_layers(rng, L, t, tp_prob=float(rng.uniform(0.3, 1.0)), tied=bool(seed % 2),
                      integer=seed % 3 == 0)
    setup = random_setup(rng, ly, "exposed")
    T, max_s, valid, nt, s_max, m_max = round_inputs(ly, setup)
    for d_range in P._d_levels(setup, None):
        e = np.maximum(0.0, P.allreduce_s(T.weights, d_range[1], setup.bandwidth)
                       + P.allreduce_s(T.tied, 2, setup.bandwidth) - T.backward_before[:, None])
        finite = e[valid]
        for eps, use_e in [(INF, False), (INF, True), (float(np.median(finite)), True),
                           (float(finite.min()), True)]:
            for incumbent in (INF, float(rng.uniform(10, 400))):
                args = (T, setup, t, s_max, m_max, nt, max_s, valid, e if use_e else None, eps, None,
                        d_range, incumbent)
                new, old = P._linear_round(*args), reference_round(*args)
                assert new[0] == old[0]
                np.testing.assert_array_equal(new[1], old[1])  # argmin tables, first minimum on ties
                assert new[2:4] == old[2:4]
                np.testing.assert_array_equal(new[4], old[4])
                # pruned (every round but the first of a placement): what the caller reads is the same
                pruned = P._linear_round(*args, False)
                if old[0][0] < incumbent:  # the caller keeps a round's best only below its incumbent
                    assert pruned[0] == old[0]
                    assert stage_path(pruned[1], old[0], nt) == stage_path(old[1], old[0], nt)
                else:
                    assert pruned[0][0] >= incumbent
                assert pruned[2] == old[2]
                thr = min(incumbent, old[0][0])
                assert (pruned[3] >= thr) == (old[3] >= thr)


@pytest.mark.parametrize("seed", range(12))
def test_incremental_rounds_equal_full_rounds(seed):
    """The ε rounds of one d range as ``_place_linear`` runs them: each round recomputed from scratch
    and each round built on the previous one give the same tables (f, g, argmin) and outputs."""
    rng = np.random.default_rng(500 + seed)
    L, t = int(rng.integers(3, 14)), int(rng.choice([1, 2, 4]))
    ly = chain_layers(rng, L, t, tp_prob=float(rng.uniform(0.3, 1.0)), tied=bool(seed % 2),
                      integer=seed % 3 == 0)
    setup = random_setup(rng, ly, "exposed")
    T, max_s, valid, nt, s_max, m_max = round_inputs(ly, setup)
    d_range = P._d_levels(setup, None)[-1]
    e = np.maximum(0.0, P.allreduce_s(T.weights, d_range[1], setup.bandwidth)
                   + P.allreduce_s(T.tied, 2, setup.bandwidth) - T.backward_before[:, None])
    args = (T, setup, t, s_max, m_max, nt, max_s, e)
    best, prev = INF, None
    # ε falls as in _place_linear, and through every part of the exposures' range
    for k, eps in enumerate([INF, *np.quantile(e[valid], [0.9, 0.7, 0.5, 0.3, 0.1, 0.0])]):
        full = P._linear_round_tables(*args, float(eps), None, d_range, best, k == 0, None)
        inc = P._linear_round_tables(*args, float(eps), None, d_range, best, k == 0, prev)
        assert full[0] == inc[0] and full[2:4] == inc[2:4]
        np.testing.assert_array_equal(full[4], inc[4])
        for a, b in zip(full[5], inc[5]):
            np.testing.assert_array_equal(a, b)
        prev, best = inc[5], min(best, full[0][0])


@pytest.mark.parametrize("sync_model", ["exposed", "paper"])
@pytest.mark.parametrize("seed", range(30))
def test_placements_equal_the_numpy_dp(seed, sync_model):
    rng = np.random.default_rng(1000 + seed)
    L, t = int(rng.integers(1, 14)), int(rng.choice([1, 2, 4, 8]))
    ly = chain_layers(rng, L, t, tp_prob=float(rng.uniform(0.3, 1.0)), tied=bool(rng.random() < 0.5),
                      integer=seed % 3 == 0)
    setup = random_setup(rng, ly, sync_model)
    res = same_placement(ly, setup)
    p = int(rng.integers(1, L + 1))
    same_placement(ly, setup, (p, int(rng.integers(1, max(2, setup.num_devices // (p * t) + 1)))))
    if res.feasible:
        assert res.time_per_batch_s > 0 and res.p == len(res.stages)


def test_identical_layers_tie_the_same_way():
    """Every layer alike: many splits have equal max-loads and F; the first minimum must win as before."""
    L = 12
    one = lambda v: np.full(L, float(v))  # noqa: E731
    for t in (1, 2):
        tp = np.arange(L) % 3 != 0
        ly = PlacementLayers(t, one(1), one(2), one(1e9), one(1e9), one(1e9), tp, np.arange(L - 1),
                             np.arange(1, L), np.full(L - 1, 1e9))
        for K in (8, 64, 1024):
            for rec in (False, True):
                for sync in ("exposed", "paper"):
                    setup = TrainingSetup(K, 64, 1, 12e9, rec, 1e10, sync)
                    same_placement(ly, setup)
                    same_placement(ly, setup, (4, 2))


def test_d_candidates_below_a_bound_are_a_prefix():
    """The kernel takes ``_d_candidates(B, min(K, B))`` once and keeps the part at or below each
    pipeline's d_max: the same list ``_best_d`` builds per d_max."""
    for B in (1, 7, 64, 100, 512, 4096):
        full = _d_candidates(B, B)
        for d_max in range(1, B + 1, max(1, B // 97)):
            np.testing.assert_array_equal(_d_candidates(B, d_max), full[full <= d_max])


def test_bert_large_on_tpuv4_equals_the_numpy_dp():
    """Real layer graphs (BERT-Large, TMP 1 and 4, the screen's sequential schedule on TPUv4): the
    screen's placements, unchanged, and the round counter counts what ran."""
    from archplace.algorithms.solvers.throughput import PHAZE_LINK_BW_BYTES_PER_S, placement_layers
    from archplace.hardware.presets import TPUV4
    from archplace.simulators.estimate import estimate_graph
    from archplace.workloads.models import build_graph

    for t in (1, 4):
        g = build_graph("bert-large", mbs=2, tmp=t)
        est = estimate_graph(g, TPUV4, link_bw=PHAZE_LINK_BW_BYTES_PER_S)
        ly = placement_layers(g, est.single_s, est.all_s, sequential=True, optimizer="adam")
        assert ly.is_linear()
        for rec in (False, True):
            for sync in ("exposed", "paper"):
                setup = TrainingSetup(1024, 4096, 2, 32 * 2**30, rec, PHAZE_LINK_BW_BYTES_PER_S, sync)
                before = dict(P.DP_STATS)
                res = same_placement(ly, setup)
                assert res.feasible
                assert P.DP_STATS["rounds"] > before["rounds"] and P.DP_STATS["work"] > before["work"]
