"""One round of the linear placement DP of :mod:`.placement` (``_linear_round``), compiled with numba.

The DP's arrays are small ((L+1)² with L = 26..98 layers) and a placement runs up to 40 ε rounds per
range of d (``_d_levels``) for each (microbatch, HBM, recompute, TMP width) of an architecture, so the
vectorised numpy form spent nearly all its time in the per-call overhead of ~80 small array operations
per stage count (issue 33's phase-1 screen: 95% of 68 s per architecture). This kernel computes the
same round in loops, bit for bit (the same IEEE operations in the same order, no fast-math, the same
first-minimum tie-breaking), with four exact shortcuts:

* the DP step visits only stages [i, j) with j > i that fit in HBM and pass the ε mask, up to the
  largest j that fits at that position and leaves the s − 1 later stages a layer each, after a finite
  suffix (every other entry of the numpy form's candidate matrix is +inf, which never wins a
  strict-less argmin; a row with no finite entry keeps argmin 0, as ``np.argmin`` of an all-inf row
  does);
* the final candidates (first stage [0, j), m_rest, d) are visited in ``_best_d``'s order (pipeline
  width P ascending, then d ascending, then candidate index), keeping a strict-less minimum, and a
  (d, candidate) pair is skipped when its sync-free lower bound ``flush(d) · x`` is already >= the best
  F of the round so far (its F = that bound + a non-negative sync, so it can neither beat the minimum
  nor tie it earlier in the order);
* ``prune``: DP states whose sync-free F bound cannot beat the incumbent are dropped (in every round
  but the one whose per-s max-loads the caller keeps; see ``linear_round``);
* ``incremental``: a round after the first of its d range reuses the states of the previous one that
  its smaller ε cannot change (see ``linear_round``).

tests/test_placement_dp_speed.py checks every output against the numpy form kept there, and the
incremental tables against full ones. On the screen's Table 2 workloads (issue 33, 8 workloads x 3
architectures x 4 variants, 6,912 placements) every placement summary is identical to the numpy DP's.
"""

from __future__ import annotations

import math

import numpy as np

try:  # numba is a dependency (pyproject.toml); the DP states why it needs it when it is missing
    import numba
except ImportError:  # pragma: no cover
    numba = None

INF = math.inf


def _allreduce(num_bytes, copies, bandwidth, factor):
    """``grad_sync.allreduce_s`` for scalars, with numpy's operation order (bit for bit)."""
    return factor * (copies - 1.0) / copies * num_bytes / bandwidth


def linear_round(load_plain, load_recompute, recompute, max_s, nt, e, has_e, eps, s_max, m_max, t, B, K,
                 fixed_s, fixed_d, d_lo, d_hi, incumbent, w0, tied0, bandwidth, sync_factor, d_all, prune,
                 prev_f, prev_g, prev_arg, incremental):
    """``placement._linear_round`` (see there for the meaning). ``fixed_s``/``fixed_d`` are -1 when not
    fixed; ``w0``/``tied0`` are the first stage's weights/tied bytes for [0, j), j = 1..L; ``d_all`` is
    ``_d_candidates(B, min(K, B))`` (a smaller d_max keeps the prefix of it at or below d_max).
    Returns (F, s, m_rest, j, d, arg, g_top, bound, x_min, work, f, g): ``work`` counts DP cells and
    final (d, candidate) pairs evaluated, the deterministic measure of the round's cost; f and g are the
    DP's tables, for the next round's ``prev_*``.

    ``prune`` drops DP states that cannot matter: a suffix of s stages with max-load v ends in final
    candidates of more than s stages, whose x >= v, so their sync-free F is at least
    (ceil(B/d_hi) + s)·v; when that is >= min(incumbent, the round's best so far) none of them can win,
    be live for ``g_top`` or bring ``bound`` below the caller's incumbent, and the state is set to +inf.
    Every state that stays has the value, argmin and suffix exposure it has without pruning (its first
    minimising j is never pruned: a state reached through a pruned one is pruned itself), so the best
    placement, ``g_top`` and the test ``bound >= min(incumbent, best)`` are unchanged; ``arg`` of pruned
    states, ``x_min`` and a ``bound`` at or above that threshold may differ, so the caller prunes only
    when it needs none of those (every round but the one whose ``x_min`` it keeps).

    ``incremental`` (with ``prune``) reuses the previous round of the same d range (``prev_f``,
    ``prev_g``, ``prev_arg``: the same e, a larger ε, an incumbent no smaller than now): its forbidden
    stages are a subset of this round's, so every value can only grow. A state whose previous argmin j
    is still allowed and whose successor state [j, L) came out the same keeps its value, argmin and
    exposure (the first minimum stays first: the j before it were larger and only grew); a state that
    was +inf stays +inf (infeasible, or pruned at a threshold no smaller than this round's: its value
    only grew). Every other state is recomputed. The tables equal those of the same round run without
    ``incremental`` (tests/test_placement_dp_speed.py checks this), with far fewer states recomputed."""
    L = max_s.shape[0] - 1
    f = np.full((s_max + 1, m_max + 1, L + 1), INF)
    g = np.zeros((s_max + 1, m_max + 1, L + 1))
    arg = np.full((s_max + 1, m_max + 1, L + 1), -1, dtype=np.int64)
    f[0, 0, L] = 0.0
    bF, bs, bm, bj, bd = INF, 0, 0, 0, 0
    g_top, bound = 0.0, INF
    x_min = np.full(s_max + 1, INF)
    n_cand = (m_max + 1) * L
    x = np.empty(n_cand)
    pp = np.empty(n_cand, dtype=np.int64)
    sfx = np.empty(n_cand)
    cw = np.empty(n_cand)
    ct = np.empty(n_cand)
    group = np.empty(n_cand, dtype=np.int64)
    same = np.ones((s_max + 1, m_max + 1, L + 1), dtype=np.bool_)  # state unchanged since prev round
    work = 0
    flush_lo = math.ceil(B / d_hi)
    # hi[i, s]: the largest j with max_s[i, j] >= s (0: none); a j above it cannot fit at position s
    hi = np.zeros((L + 1, s_max + 2), dtype=np.int64)
    for i in range(L):
        r = 0
        for j in range(L, i, -1):
            v = min(max_s[i, j], s_max)
            while r < v:
                r += 1
                hi[i, r] = j
    for s in range(1, s_max + 1):
        use = load_recompute if (recompute and s > 1) else load_plain
        for m in range(m_max + 1):
            for i in range(L + 1):
                bv = INF
                bjj = 0
                reuse = False
                if incremental:
                    pv = prev_f[s, m, i]
                    if pv == INF:
                        arg[s, m, i] = 0
                        continue  # f stays +inf, g 0: the same state
                    jj = prev_arg[s, m, i]
                    if not has_e or e[i, jj] <= eps:
                        if nt[i, jj]:
                            reuse = m >= 1 and same[s - 1, m - 1, jj]
                        else:
                            reuse = same[s - 1, m, jj]
                    if reuse:
                        bv = pv
                        bjj = jj
                # f[s−1] is +inf for suffixes [j, L) shorter than s − 1 layers: j <= L − s + 1
                for j in range(i + 1, 0 if reuse else min(hi[i, s], L - s + 1) + 1):
                    if max_s[i, j] < s:
                        continue
                    if has_e and not e[i, j] <= eps:
                        continue
                    if nt[i, j]:
                        prev = f[s - 1, m - 1, j] if m >= 1 else INF
                    else:
                        prev = f[s - 1, m, j]
                    if prev == INF:
                        continue
                    ld = use[i, j]
                    work += 1
                    v = prev if prev > ld else ld
                    if v < bv:
                        bv = v
                        bjj = j
                if prune and bv < INF:
                    thr = incumbent if incumbent < bF else bF
                    if not (flush_lo + s) * bv < thr:
                        bv = INF
                        bjj = 0
                        reuse = False
                f[s, m, i] = bv
                arg[s, m, i] = bjj
                same[s, m, i] = reuse
                if reuse:
                    g[s, m, i] = prev_g[s, m, i]
                elif has_e and bv < INF:
                    if nt[i, bjj]:
                        gc = g[s - 1, m - 1, bjj] if m >= 1 else 0.0
                    else:
                        gc = g[s - 1, m, bjj]
                    ev = e[i, bjj]
                    g[s, m, i] = gc if gc > ev else ev
        if fixed_s >= 0 and s != fixed_s:
            continue
        # final candidates c = m_rest * L + (j - 1): the first stage [0, j) is the s-th from the end
        any_ok = False
        for m in range(m_max + 1):
            for j in range(1, L + 1):
                c = m * L + j - 1
                first = use[0, j] if max_s[0, j] >= s else INF
                prev = f[s - 1, m, j]
                xv = prev if prev > first else first
                x[c] = xv
                if xv < INF:
                    any_ok = True
                mt = m + (1 if nt[0, j] else 0)
                pp[c] = t * (s - mt) + mt
                sfx[c] = g[s - 1, m, j]
                cw[c] = w0[j - 1]
                ct[c] = tied0[j - 1]
        if not any_ok:
            continue
        # _best_d: groups of equal P ascending, then d ascending, then c ascending; strict-less minimum
        lF, lc, ld_ = INF, -1, 0
        p_prev = -1
        while True:
            p_cur = -1
            for c in range(n_cand):  # the next P above p_prev among the finite candidates
                if x[c] < INF and pp[c] > p_prev and (p_cur < 0 or pp[c] < p_cur):
                    p_cur = pp[c]
            if p_cur < 0:
                break
            p_prev = p_cur
            ng, xg = 0, INF  # the group's finite candidates in c order, and their smallest x
            for c in range(n_cand):
                if pp[c] == p_cur and x[c] < INF:
                    group[ng] = c
                    ng += 1
                    if x[c] < xg:
                        xg = x[c]
            d_max = min(K // p_cur, B)
            if fixed_d >= 0:
                if fixed_d > d_max:
                    continue
                nd = 1
            elif d_max < 1:
                continue
            else:
                nd = 0
                while nd < d_all.shape[0] and d_all[nd] <= d_max:
                    nd += 1
            for k in range(nd):
                d = fixed_d if fixed_d >= 0 else d_all[k]
                if not (d > d_lo and d <= d_hi):
                    continue
                flush = math.ceil(B / d) + s - 1.0
                if not flush * xg < (lF if lF < bF else bF):
                    continue  # no candidate of the group reaches below the best with this d
                for q in range(ng):
                    c = group[q]
                    xf = flush * x[c]
                    if not xf < (lF if lF < bF else bF):
                        continue
                    work += 1
                    sync = _allreduce(cw[c], float(d), bandwidth, sync_factor)
                    if has_e and s > 1:
                        sync = sync + _allreduce(ct[c], 2.0, bandwidth, sync_factor)
                    if has_e:
                        sync = sync if sync > sfx[c] else sfx[c]
                    val = xf + sync
                    if val < lF:
                        lF, lc, ld_ = val, c, d
        if lF < bF:
            bF, bs, bm, bj, bd = lF, s, lc // L, lc % L + 1, ld_
        live = incumbent if incumbent < bF else bF
        lo_min, xs_min = INF, INF
        for c in range(n_cand):
            low = (flush_lo + s - 1) * x[c]
            if has_e and low < live and sfx[c] > g_top:
                g_top = sfx[c]
            if low < lo_min:
                lo_min = low
            if x[c] < xs_min:
                xs_min = x[c]
        if lo_min < bound:
            bound = lo_min
        if xs_min < x_min[s]:
            x_min[s] = xs_min
    return bF, bs, bm, bj, bd, arg, g_top, bound, x_min, work, f, g


if numba is not None:
    _allreduce = numba.njit(cache=True, inline="always")(_allreduce)
    linear_round = numba.njit(cache=True)(linear_round)
