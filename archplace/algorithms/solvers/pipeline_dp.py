"""Exact pipeline cuts by dynamic programming over *all* contiguous cut sets (no pivot pruning).

The problem (cost model in :mod:`archplace.simulators.pipeline`): choose pivots
``0 = b_0 < b_1 < … < b_K = n`` (every stage owning at least one trainable op, as in
:func:`~archplace.algorithms.solvers.pipeline_exact.candidate_pivots`) minimising

    L = Σ_s t_s + Σ_j a_j + (M − 1) · max(max_s t_s, max_j a_j) + max_s AR_s

with no device running out of memory, where stage s gets ``d_s`` devices from the global
largest-remainder rule :func:`~archplace.simulators.pipeline.allocate_devices`. Three things keep
this from being a plain min-sum DP; each is removed exactly:

1. **The allocation couples the stages.** Write ``q_s = D · C_s / C_total`` (the stage's share of the
   D devices; ``q_s = x(b_{s+1}) − x(b_s)`` with ``x(p) = D · C(p) / C_total`` the device position of
   pivot p). Following ``allocate_devices`` step by step shows that its answer is a *common shift*
   rule: ``d_s = max(1, ⌊q_s − λ⌋)`` for the λ at which these sum to D. When the floors fall short
   (no clamped stage), units go to the largest remainders: λ = τ − 1 with τ the remainder threshold,
   λ ∈ (−1, 0]; when clamping stages of ``q < 1`` up to one device overshoots, units are taken back
   from the smallest remainders, round after round, in the order of ``r_s + k`` (k-th unit of stage
   s): that is λ > 0. So for a *fixed* λ every stage's device count is a function of its two pivots
   alone, and a DP whose state carries the devices used so far (``e``) and ends at ``e = D`` ranges
   over exactly the plans whose allocation is that rule. λ is continuous, so it is handled by branch
   and bound: a node holds an interval [λ_lo, λ_hi] and lets each stage take any
   ``d ∈ [max(1, ⌊q − λ_hi⌋), max(1, ⌊q − λ_lo⌋)]`` — a relaxation of every λ inside. If the DP's
   best plan is allocated that way by ``allocate_devices`` it is the node's optimum; otherwise two of
   its stages ask for disjoint λ ranges and the interval is split between them, which excludes it
   from both halves.
2. **The max terms.** A *box* is a set of plans given by caps (θ, ψ): every ``t_s`` and ``a_j`` ≤ θ and
   every ``AR_s`` ≤ ψ — per-stage constraints a DP can enforce — and by lower limits (θ_lo, ψ_lo) on
   its plans' maxima and s_lo on their ``S = Σ t + Σ a``, used in bounds only. The DP finds the box's
   min-S plan P whose allocation is the cost model's (item 1, best first over the λ intervals), so
   ``S_P + (M − 1) θ_lo + ψ_lo`` bounds every plan in the box, and every plan of the box with
   ``max ≥ B_P`` and ``max AR ≥ A_P`` (P's maxima) is no better than P (its S is no smaller). Only
   ``max < B_P`` and ``max ≥ B_P, max AR < A_P`` remain; each is halved (the upper half gets the
   tighter bound, the lower half the tighter cap) and pushed as new boxes. Boxes are expanded best
   bound first until the best bound reaches the incumbent (the best plan met, starting from a few
   plans cut near server boundaries). The caps of a box are also tightened from the incumbent:
   ``(M − 1) · max ≤ best − s_lo − ψ_lo`` and ``max AR ≤ best − s_lo − (M − 1) θ_lo``. The first θ_lo
   is ``max(C_total / D, the smallest inter-server transfer)`` (some stage has ``C_s / d_s`` at least
   the mediant ``C_total / D``, and when the devices span several servers some transfer crosses
   between them); the first ψ_lo is 0.
3. **Speed.** The DP's state is (stages done s, devices used e, pivot p, "the last stage lies inside
   one server" — a transfer uses NVLink only when both its stages do). For fixed (s, e, d) every
   constraint on the previous pivot p given the next pivot p' is an interval ``lo(p') ≤ p ≤ hi(p')``:
   the λ window, ``t ≤ θ`` (``C(p) ≥ C(p') − θ d``), ``AR ≤ ψ`` and memory (prefix differences) bound
   p from below, the trainable rule from above. So a DP step is a range minimum of
   ``V(p) + a(p) − C(p)/d``, answered for all (d, p') at once from a sparse table: numpy work of
   ``O(K · D² · n log n)`` at most per DP run, never a Python loop over pivots. States that cannot
   beat the incumbent are dropped as they are made: a plan through (s, e, p) with S so far V has
   ``L ≥ max(V + (C_total − C(p)) / (D − e), s_lo) + (M − 1) max(θ_lo, C(p)/e, (C_total − C(p))/(D − e))
   + ψ_lo`` (the mediants of the prefix and of the rest), which keeps e close to p's device position.

Memory is a per-stage constraint (it depends on the stage, its index and its devices), so plans that
run out of memory never enter the DP. When no plan fits, the answer says so and gives the plan with
the smallest peak per-device memory (bisection on the memory limit, each step an exact feasibility
search; to 1e-9 relative).

Exactness is up to floating-point ties: caps are made strict by a relative margin of 1e-10, a box is
pruned when its bound is within 1e-12 (relative) of the incumbent, and the returned plan is re-scored
by :func:`~archplace.simulators.pipeline.evaluate` (its L, memory and devices are the cost model's).
Pivots that differ only in the activation bytes they cut are collapsed to the cheapest first, as in
:mod:`.pipeline_exact` (exact: nothing else of the plan changes). Given ``candidates`` (per-cut pivot
sets, e.g. the pruned ones of :func:`~.pipeline_exact.candidate_pivots`) the same search is the
optimum over them, :func:`~.pipeline_exact.solve_exact`'s answer without the enumeration.

Cost here (two shared cores): the Table 7 cases (1,306–2,818 forward ops, 2–4 stages on 16–32 GPUs)
take 0.05–2.5 s; 8 stages on 32–64 GPUs 2 s–1 min, 16 stages on 64 GPUs 20 s–2.5 min (many
near-equal plans with one-device stages to tell apart).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace

import numpy as np

from ...hardware.presets import GPU, Cluster
from ...simulators.collectives import RING_ALLREDUCE_FACTOR
from ...simulators.pipeline import BYTES_PER_PARAM, PipelineProfile, evaluate
from .pipeline_exact import Candidates, PipelinePlan, _dominated, centre_device_cuts

_STRICT = 1e-10  # a cap of X (1 - _STRICT) excludes plans whose maximum is X
_PRUNE = 1e-12  # a box whose bound is within this (relative) of the incumbent cannot improve it


@dataclass
class DPPlan(PipelinePlan):
    """The DP's answer. ``evaluated`` counts the DP states reached over all subproblems (each one stage's
    cost, a part of the cost model); ``plan_evaluations`` the complete plans the simulator scored on the
    way (heuristic starts, each subproblem's plan, the memory bisection, the answer)."""

    subproblems: int = 0  # DP runs (boxes × allocation-shift intervals)
    boxes: int = 0  # boxes of the branch and bound over the max terms
    peak_memory_bytes: float = 0.0  # the plan's largest per-device memory
    unpruned: bool = True  # over every contiguous cut set (False: over given candidate pivots)
    plan_evaluations: int = 0  # complete plans scored by simulators.pipeline.evaluate


@dataclass(frozen=True)
class _Box:
    """Plans with every t_s and a_j <= theta and every AR_s <= psi; they also have max >= theta_lo, max AR
    >= psi_lo and Σt + Σa >= s_lo (bounds only). ``lams`` partitions the allocation shift range [−1, D]
    into intervals, each with a lower bound on the Σ of the box's plans allocated with a shift in it."""

    theta: float
    psi: float
    theta_lo: float
    psi_lo: float
    s_lo: float
    lams: tuple[tuple[float, float, float], ...]  # (bound on Σ, λ_lo, λ_hi)

    def tightened(self, best: float, m1: int) -> _Box | None:
        """The caps a plan of the box needs to beat ``best`` (None: no plan can)."""
        if not np.isfinite(best):
            return self
        room = best - self.s_lo
        theta = min(self.theta, (room - self.psi_lo) / m1 * (1.0 + _PRUNE)) if m1 else self.theta
        psi = min(self.psi, (room - m1 * self.theta_lo) * (1.0 + _PRUNE))
        if theta < self.theta_lo or psi < self.psi_lo:
            return None
        return replace(self, theta=theta, psi=psi)


class _Problem:
    """Arrays of one (profile, cluster, K) instance and the DP over them."""

    def __init__(self, prof: PipelineProfile, cluster: Cluster, k: int, allowed: list[np.ndarray]):
        s = prof.setup
        n, d = prof.num_ops, cluster.num_devices
        self.prof, self.cluster = prof, cluster
        self.n, self.k, self.D, self.M = n, k, d, s.num_micro_batches
        self.per = cluster.devices_per_server or d
        self.nv = float(cluster.link_bw)
        self.inter = float(cluster.inter_server_bw if cluster.topology == "servers" else cluster.link_bw)
        self.cp = np.asarray(prof.compute_s_prefix, dtype=float)
        self.ct = float(self.cp[n] - self.cp[0])
        self.x = d * (self.cp / self.ct)  # device position of each pivot
        self.w = np.asarray(prof.param_bytes_prefix, dtype=float)
        self.cross = np.asarray(prof.cross_bytes, dtype=float)
        tv = np.asarray(prof.trainable_prefix, dtype=float)
        self.hi_tv = np.searchsorted(tv, tv - 1.0, side="right") - 1  # last p with tv[p] <= tv[p'] - 1
        self.allowed = allowed
        self.in_flight = np.minimum(self.M, k - np.arange(k))
        self.limit = cluster.device.hbm_gb * 2**30
        self.states = 0
        self.runs = 0
        self.plan_evals = 0   # complete plans scored by the simulator
        # mediant bounds per state (e devices used, pivot p): the prefix has a stage with t >= C(p)/e,
        # the rest one with t >= (C_total − C(p))/(D − e), and the rest's Σt is at least the latter
        e = np.arange(d + 1, dtype=float)[:, None]
        crem = self.ct - self.cp[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            head = np.where(e > 0, self.cp[None, :] / e, 0.0)
            self.tail = np.where(d - e > 0, crem / (d - e), np.where(crem > 0, np.inf, 0.0))
        self.slow = np.maximum(head, self.tail)
        self._lo_mem: dict[float, np.ndarray] = {}

    # --------------------------------------------------------------------------------- tables
    def lo_mem(self, limit: float) -> np.ndarray:
        """(K, D+1, n+1): the first p for which stage [p, p') on d devices fits in ``limit``."""
        if limit in self._lo_mem:
            return self._lo_mem[limit]
        prof, s = self.prof, self.prof.setup
        wterm = self.w / prof.bytes_per_element * BYTES_PER_PARAM[s.optimizer]
        act = np.asarray(prof.ckpt_bytes_prefix if s.recompute else prof.saved_bytes_prefix, dtype=float)
        const = prof.max_layer_saved_bytes if s.recompute else 0.0
        out = np.zeros((self.k, self.D + 1, self.n + 1), dtype=np.int64)
        done: dict[int, int] = {}
        for si, inf in enumerate(self.in_flight.tolist()):
            if inf in done:
                out[si] = out[done[inf]]
                continue
            done[inf] = si
            for d in range(1, self.D + 1):
                f = wterm + inf * act / d
                out[si, d] = np.searchsorted(f, f + const / d - limit, side="left")
        self._lo_mem = {limit: out}
        return out

    def tables(self, lam_lo: float, lam_hi: float, theta: float, psi: float
               ) -> tuple[np.ndarray, np.ndarray]:
        """lo (2, D+1, n+1) per AllReduce link class (0: NVLink, 1: network) and hi (D+1, n+1): the range
        of previous pivots p allowed before p' for a stage of d devices."""
        dv = np.arange(self.D + 1, dtype=float)[:, None]
        x, cp, w = self.x, self.cp, self.w
        with np.errstate(invalid="ignore", divide="ignore"):
            qlo = np.where(dv >= 2, dv + lam_lo, -np.inf)
            qhi = dv + 1.0 + lam_hi
            hi = np.searchsorted(x, x[None, :] - qlo, side="right") - 1  # q >= qlo
            lo = np.searchsorted(x, x[None, :] - qhi, side="right")  # q < qhi
            if np.isfinite(theta):  # t = (C(p') - C(p)) / d <= theta
                lo = np.maximum(lo, np.searchsorted(cp, cp[None, :] - theta * dv, side="left"))
            lo2 = np.stack([lo, lo])
            if np.isfinite(psi):  # AR = 2 (d-1)/d G / bw <= psi (collectives.allreduce_s, inverted)
                for c, bw in enumerate((self.nv, self.inter)):
                    lim = np.where(dv >= 2, psi * bw * dv / (RING_ALLREDUCE_FACTOR * (dv - 1.0)), np.inf)
                    lo2[c] = np.maximum(lo, np.searchsorted(w, w[None, :] - lim, side="left"))
        hi = np.minimum(hi, self.hi_tv[None, :])
        return lo2, hi

    # ------------------------------------------------------------------------------------ DP
    def _g(self, s: int, f_in: int, e: int, ds: np.ndarray, pp: np.ndarray, base: np.ndarray,
           theta: float) -> np.ndarray:
        """V(p) + a(p) − C(p)/d for each d (rows) and previous pivot p (columns)."""
        dsf = ds.astype(float)[:, None]
        if s == 0:
            return base[None, :] - self.cp[pp][None, :] / dsf
        same = ((e + ds - 1) // self.per == (e - 1) // self.per) & bool(f_in)
        bwl = np.where(same, self.nv, self.inter)
        a = 2.0 * self.cross[pp][None, :] / bwl[:, None]
        if np.isfinite(theta):
            a = np.where(a <= theta, a, np.inf)
        return (base[None, :] + a) - self.cp[pp][None, :] / dsf

    def run(self, box: _Box, lam_lo: float, lam_hi: float, lo_mem: np.ndarray, best: float = np.inf
            ) -> tuple[float, np.ndarray, np.ndarray] | None:
        """Min Σt + Σa over the box with allocation shifts in [lam_lo, lam_hi] (relaxed), keeping only
        states that can still beat ``best``: (value, cuts, devices) or None."""
        n, k, big_d, per = self.n, self.k, self.D, self.per
        self.runs += 1
        lo2, hi_t = self.tables(lam_lo, lam_hi, box.theta, box.psi)
        # a plan through state (e, p) with Σ so far V has L >= max(V + tail, s_lo) + maxterm
        with np.errstate(invalid="ignore"):  # 0 · inf where no device is left: such states are dead
            maxterm = (self.M - 1) * np.maximum(self.slow, box.theta_lo) + box.psi_lo
        thr = best * (1.0 - _PRUNE)
        alive = (self.slow <= box.theta) & (np.maximum(self.tail, box.s_lo) + maxterm < thr)
        # per e: the first and last pivot a live state can have (as positions in each cut's pivot list)
        any_alive = alive.any(axis=1)
        first = np.where(any_alive, np.argmax(alive, axis=1), n + 1)
        final = np.where(any_alive, n - np.argmax(alive[:, ::-1], axis=1), -1)
        v = np.full((k + 1, 2, big_d + 1, n + 1), np.inf)
        v[0, 0, 0, 0] = 0.0
        x, cp, tail = self.x, self.cp, self.tail
        for s in range(k):
            last = s == k - 1
            tg = np.array([n]) if last else self.allowed[s]
            xt = x[tg]
            for f_in in (0, 1):
                for e in range(s, big_d - (k - s) + 1):
                    row = v[s, f_in, e]
                    fin = np.flatnonzero(row < np.inf)
                    if not fin.size:
                        continue
                    self.states += fin.size
                    p0, p1 = int(fin[0]), int(fin[-1])
                    ds = np.array([big_d - e]) if last else np.arange(1, big_d - e - (k - s - 1) + 1)
                    # the next pivots p' each d can reach from [p0, p1]
                    qlo = np.where(ds >= 2, ds + lam_lo, -np.inf)
                    st = np.maximum(np.searchsorted(xt, x[p0] + qlo, side="left"),
                                    np.searchsorted(tg, np.maximum(first[e + ds] - 1, p0), side="right"))
                    en = np.minimum(np.searchsorted(xt, x[p1] + ds + 1.0 + lam_hi, side="left"),
                                    np.searchsorted(tg, final[e + ds], side="right"))
                    cnt = np.maximum(en - st, 0)
                    tot = int(cnt.sum())
                    if not tot:
                        continue
                    di = np.repeat(np.arange(len(ds)), cnt)
                    ti = np.repeat(st - (np.cumsum(cnt) - cnt), cnt) + np.arange(tot)
                    pq, dq = tg[ti], ds[di]
                    ee = e + dq
                    ok = alive[ee, pq]
                    if not ok.any():
                        continue
                    di, pq, dq, ee = di[ok], pq[ok], dq[ok], ee[ok]
                    nf = (e // per == (e + ds - 1) // per).astype(np.int64)  # new stage in one server
                    lo = np.maximum(np.maximum(lo2[1 - nf[di], dq, pq], lo_mem[s, dq, pq]), p0)
                    hi = np.minimum(hi_t[dq, pq], p1)
                    ok = lo <= hi
                    if not ok.any():
                        continue
                    di, pq, dq, ee, lo, hi = di[ok], pq[ok], dq[ok], ee[ok], lo[ok] - p0, hi[ok] - p0
                    used = np.flatnonzero(np.bincount(di, minlength=len(ds)))
                    remap = np.zeros(len(ds), dtype=np.int64)
                    remap[used] = np.arange(len(used))
                    di = remap[di]
                    g = self._g(s, f_in, e, ds[used], np.arange(p0, p1 + 1), row[p0:p1 + 1], box.theta)
                    # range minima from a sparse table over p
                    lvl = np.floor(np.log2(hi - lo + 1)).astype(np.int64)
                    top = int(lvl.max())
                    tab = np.full((top + 1,) + g.shape, np.inf)
                    tab[0] = g
                    for j in range(1, top + 1):
                        h = 1 << (j - 1)
                        np.minimum(tab[j - 1, :, :-h], tab[j - 1, :, h:], out=tab[j, :, :-h])
                    val = np.minimum(tab[lvl, di, lo], tab[lvl, di, hi - (1 << lvl) + 1]) + cp[pq] / dq
                    keep = np.maximum(val + tail[ee, pq], box.s_lo) + maxterm[ee, pq] < thr
                    if not keep.any():
                        continue
                    fl, ee, pq, val = nf[used][di][keep], ee[keep], pq[keep], val[keep]
                    v[s + 1, fl, ee, pq] = np.minimum(v[s + 1, fl, ee, pq], val)
        end = v[k, :, big_d, n]
        if not np.isfinite(end).any():
            return None
        f = int(np.argmin(end))
        cuts, devs = self._backtrack(v, box, lo2, hi_t, lo_mem, f)
        return float(end[f]), cuts, devs

    def _backtrack(self, v, box, lo2, hi_t, lo_mem, f) -> tuple[np.ndarray, np.ndarray]:
        """The plan behind the DP's optimum, recomputing each step's candidates with the same
        arithmetic (so the minimum is found exactly)."""
        n, k, big_d, per = self.n, self.k, self.D, self.per
        e1, p1 = big_d, n
        cuts, devs = [], []
        for s in reversed(range(k)):
            best = (np.inf, 0, 0, 0)
            for f_in in (0, 1):
                for e in range(s, e1):
                    d = e1 - e
                    nf = int(e // per == (e + d - 1) // per)
                    if nf != f:
                        continue
                    lo = max(int(lo2[1 - nf, d, p1]), int(lo_mem[s, d, p1]))
                    hi = min(int(hi_t[d, p1]), p1 - 1)
                    if lo > hi:
                        continue
                    pp = np.arange(lo, hi + 1)
                    g = self._g(s, f_in, e, np.array([d]), pp, v[s, f_in, e, lo:hi + 1], box.theta)[0]
                    val = g + self.cp[p1] / d
                    i = int(np.argmin(val))
                    if val[i] < best[0]:
                        best = (float(val[i]), f_in, e, int(pp[i]))
            _, f, e0, p0 = best
            devs.append(e1 - e0)
            cuts.append(p0)
            e1, p1 = e0, p0
        assert e1 == 0 and p1 == 0
        return np.array(cuts[::-1][1:], dtype=np.int64), np.array(devs[::-1], dtype=np.int64)

    def split_point(self, cuts: np.ndarray, devs: np.ndarray, lam_lo: float, lam_hi: float) -> float | None:
        """A λ between two stages whose allowed shift ranges are disjoint (None: none found)."""
        b = np.r_[0, cuts, self.n]
        q = np.diff(self.x[b])
        upper = np.where(devs >= 2, q - devs, np.inf)  # λ ∈ (q − d − 1, q − d]; d = 1: λ > q − 2
        lower = np.where(devs >= 2, q - devs - 1.0, q - 2.0)
        u, lo = float(upper.min()), float(lower.max())
        mu = 0.5 * (u + lo)
        if not (u < mu < lo and lam_lo < mu < lam_hi):
            return None
        return mu

    def evaluate(self, cuts: np.ndarray):
        """The simulator on a batch of complete plans, counted in ``plan_evals``."""
        self.plan_evals += len(cuts)
        return evaluate(self.prof, self.cluster, cuts)

    # ---------------------------------------------------------------------------- one box
    def solve_box(self, box: _Box, lo_mem: np.ndarray, best: float, max_runs: int
                  ) -> tuple[tuple[float, np.ndarray, object] | None, bool, list]:
        """The box's min-Σ plan whose allocation is the cost model's (among plans that can beat ``best``):
        best first over the λ intervals, splitting an interval whose relaxed optimum is not allocated
        that way. Returns (value, cuts, evaluation) or None, whether a float tie stopped a split, and
        every plan evaluated on the way (incumbent candidates)."""
        heap = [(b, lo, hi) for b, lo, hi in box.lams]
        heapq.heapify(heap)
        found: tuple | None = None
        seen: list = []
        stuck = False
        while heap:
            b, lo, hi = heapq.heappop(heap)
            if (found is not None and b >= found[0]) or self.runs >= max_runs:
                break
            res = self.run(box, lo, hi, lo_mem, best)
            if res is None:
                continue  # nothing in this interval beats the incumbent, here or in any sub-box
            val, cuts, devs = res
            val = max(val, b)
            r = self.evaluate(cuts[None, :])
            seen.append((cuts, r))
            if (r.devices[0] == devs).all():
                if found is None or val < found[0]:
                    found = (val, cuts, r)
                continue
            mu = self.split_point(cuts, devs, lo, hi)
            if mu is None:
                stuck = True
                continue
            heapq.heappush(heap, (val, lo, mu))
            heapq.heappush(heap, (val, mu, hi))
        return found, stuck, seen


def _halves(lo: float, hi: float) -> tuple[tuple[float, float], ...]:
    """[lo, hi] as an upper and a lower half (one piece when it is already narrow)."""
    if hi - lo <= 1e-6 * max(abs(hi), 1e-300):
        return ((lo, hi),)
    mid = 0.5 * (lo + hi)
    return ((mid, hi), (lo, mid))


def _allowed_pivots(prof: PipelineProfile, k: int, candidates: Candidates | None,
                    collapse: bool) -> list[np.ndarray]:
    n = prof.num_ops
    if candidates is not None:
        if len(candidates.per_cut) != k - 1:
            raise ValueError(f"candidates are for {len(candidates.per_cut) + 1} stages, not {k}")
        return [np.unique(np.asarray(c, dtype=np.int64)) for c in candidates.per_cut]
    tv = prof.trainable_prefix
    p = np.arange(1, n)
    p = p[(tv[p] >= 1) & (tv[n] - tv[p] >= 1)]
    if collapse:
        p = p[_dominated(prof, p)]
    return [p] * (k - 1)


def _heuristic_plans(pr: _Problem, allowed: list[np.ndarray]) -> np.ndarray:
    """A few quick plans to start from: for server-boundary and even device cuts, the pivot near each
    cut's device position that cuts the fewest bytes (within a few widths), or the nearest one."""
    k, big_d = pr.k, pr.D
    rows = []
    for tgt in (centre_device_cuts(pr.cluster, k).astype(float), np.arange(1, k) * big_d / k):
        for width in (0.0, 0.05, 0.2, 0.5):
            row = []
            for j in range(k - 1):
                a = allowed[j]
                xa = pr.x[a]
                near = np.flatnonzero(np.abs(xa - tgt[j]) <= width)
                if not near.size:
                    near = np.array([int(np.clip(np.searchsorted(xa, tgt[j]), 0, len(a) - 1))])
                i = near[np.lexsort((np.abs(xa[near] - tgt[j]), pr.cross[a[near]]))[0]]
                row.append(int(a[i]))
            rows.append(row)
    cuts = np.unique(np.array(rows, dtype=np.int64).reshape(len(rows), k - 1), axis=0)
    n, tv = pr.n, pr.prof.trainable_prefix
    b = np.concatenate([np.zeros((len(cuts), 1), np.int64), cuts, np.full((len(cuts), 1), n)], axis=1)
    ok = (np.diff(b, axis=1) > 0).all(axis=1) & (np.diff(tv[b], axis=1) >= 1).all(axis=1)
    return cuts[ok]


def _plan(prof, cluster, cuts, pr: _Problem | None, boxes: int, wall: float, unpruned: bool,
          optimal: bool = True) -> DPPlan:
    r = evaluate(prof, cluster, np.asarray(cuts, dtype=np.int64)[None, :])
    return DPPlan(np.asarray(cuts, dtype=np.int64), float(r.length_s[0]), bool(r.oom[0]), r.device_cuts[0],
                  r.devices[0], pr.states if pr else 1, wall, optimal, subproblems=pr.runs if pr else 0,
                  boxes=boxes, peak_memory_bytes=float(r.memory_bytes[0].max()), unpruned=unpruned,
                  plan_evaluations=(pr.plan_evals if pr else 0) + 1)


def _check(prof: PipelineProfile, cluster: Cluster, k) -> int:
    if cluster.topology not in ("servers", "flat"):
        raise ValueError(f"pipeline needs a 'servers' or 'flat' cluster, got {cluster.topology!r}")
    if not isinstance(cluster.device, GPU):
        raise ValueError(f"pipeline needs a GPU cluster, {cluster.name} holds {cluster.device.name}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"stages must be a positive integer, got {k!r}")
    k = int(k)
    if k > cluster.num_devices:
        raise ValueError(f"stages must be <= the cluster's {cluster.num_devices} devices, got {k}")
    if k > prof.num_ops:
        raise ValueError(f"stages must be <= the model's {prof.num_ops} forward ops, got {k}")
    return k


def solve_dp(prof: PipelineProfile, cluster: Cluster, num_stages: int, *,
             candidates: Candidates | None = None, collapse: bool = True,
             max_subproblems: int = 100_000) -> DPPlan:
    """The L-optimal memory-feasible plan over every contiguous cut set into ``num_stages`` stages (each
    owning a trainable op), or over ``candidates`` (per-cut pivot sets, e.g. the pruned ones) when given.
    When nothing fits, the plan with the smallest peak per-device memory, ``oom=True``. ``optimal`` is
    False only if ``max_subproblems`` ran out or a floating-point tie stopped a split (the plan is then
    the best found)."""
    t0 = time.perf_counter()
    k = _check(prof, cluster, num_stages)
    unpruned = candidates is None
    if k == 1:
        return _plan(prof, cluster, np.zeros(0, np.int64), None, 0, time.perf_counter() - t0, unpruned)
    if not prof.compute_s_prefix[-1] > 0:
        raise ValueError("the profile has no compute: devices cannot be allocated in proportion to it")
    allowed = _allowed_pivots(prof, k, candidates, collapse)
    if any(len(a) == 0 for a in allowed):
        raise ValueError("no cut set gives every stage a trainable variable")
    pr = _Problem(prof, cluster, k, allowed)
    best_l, best_cuts = np.inf, None

    def offer(cuts: np.ndarray, r) -> None:
        nonlocal best_l, best_cuts
        i = int(np.argmin(np.where(r.oom, np.inf, r.length_s)))
        if not r.oom[i] and r.length_s[i] < best_l:
            best_l, best_cuts = float(r.length_s[i]), cuts[i]

    heur = _heuristic_plans(pr, allowed)
    if len(heur):
        offer(heur, pr.evaluate(heur))
    lo_mem = pr.lo_mem(pr.limit)
    # every plan has max(t, a) >= C_total / D (the mediant of the stages' C/d), and a transfer that
    # crosses between servers when the devices span several (two stages inside one server share it)
    piv = np.unique(np.concatenate(allowed))
    bw_min = pr.inter if pr.D > pr.per else pr.nv
    theta0 = max(pr.ct / pr.D, 2.0 * float(pr.cross[piv].min()) / bw_min) * (1.0 - _PRUNE)
    m1 = pr.M - 1
    heap: list = []
    tick = 0

    def push(key: float, box: _Box) -> None:
        nonlocal tick
        heapq.heappush(heap, (key, tick, box))
        tick += 1

    push(0.0, _Box(np.inf, np.inf, theta0, 0.0, 0.0, ((0.0, -1.0, 0.0), (0.0, 0.0, float(pr.D)))))
    boxes, stuck = 0, False
    while heap:
        key, _, box = heapq.heappop(heap)
        if key >= best_l * (1.0 - _PRUNE):
            break
        if pr.runs >= max_subproblems:
            break
        box = box.tightened(best_l, m1)
        if box is None:
            continue
        boxes += 1
        found, tie, seen = pr.solve_box(box, lo_mem, best_l, max_subproblems)
        stuck |= tie
        for cuts, r in seen:
            offer(cuts[None, :], r)
        if found is None:
            continue
        val, cuts, r = found
        if val + m1 * box.theta_lo + box.psi_lo >= best_l * (1.0 - _PRUNE):
            continue
        # sub-boxes start again from the two shift regimes (refining from scratch costs fewer DP runs
        # than inheriting a fine partition whose every interval would be re-run), bounded by val
        lams = ((val, -1.0, 0.0), (val, 0.0, float(pr.D)))
        # the plan minimises Σ over the box: plans with max >= B_P and max AR >= A_P are no better;
        # what is left, max < B_P and (max >= B_P, max AR < A_P), is halved so that the upper half gets a
        # tighter bound and the lower half tighter caps
        b_p = float(max(r.stage_time_s[0].max(), r.transfer_s[0].max()))
        a_p = float(r.allreduce_s[0].max())
        cap_b = b_p * (1.0 - _STRICT)
        if cap_b >= box.theta_lo:
            for lo_b, hi_b in _halves(box.theta_lo, cap_b):
                push(val + m1 * lo_b + box.psi_lo,
                     replace(box, theta=hi_b, theta_lo=lo_b, s_lo=val, lams=lams))
        cap_a = a_p * (1.0 - _STRICT)
        if a_p > 0 and cap_a >= box.psi_lo:
            tlo = max(box.theta_lo, b_p)
            for lo_a, hi_a in _halves(box.psi_lo, cap_a):
                push(val + m1 * tlo + lo_a,
                     replace(box, psi=hi_a, theta_lo=tlo, psi_lo=lo_a, s_lo=val, lams=lams))
    exhausted = pr.runs >= max_subproblems
    if best_cuts is not None:
        return _plan(prof, cluster, best_cuts, pr, boxes, time.perf_counter() - t0, unpruned,
                     not exhausted and not stuck)
    cuts, ok = _min_peak_plan(pr, max_subproblems)
    return _plan(prof, cluster, cuts, pr, boxes, time.perf_counter() - t0, unpruned,
                 ok and not exhausted and not stuck)


def _feasible_plan(pr: _Problem, limit: float, max_runs: int) -> tuple[np.ndarray | None, bool]:
    """Any plan whose allocation is the cost model's and whose peak memory is <= ``limit`` (and whether
    the answer is sure)."""
    box = _Box(np.inf, np.inf, 0.0, 0.0, 0.0, ((0.0, -1.0, 0.0), (0.0, 0.0, float(pr.D))))
    found, tie, _ = pr.solve_box(box, pr.lo_mem(limit), np.inf, max_runs)
    return (None if found is None else found[1]), not tie and pr.runs < max_runs


def _min_peak_plan(pr: _Problem, max_runs: int) -> tuple[np.ndarray, bool]:
    """When no plan fits: the plan with the smallest peak per-device memory, by bisection on the limit."""
    hi_cuts, sure = _feasible_plan(pr, np.inf, max_runs)
    if hi_cuts is None:
        raise ValueError("no cut set gives every stage a trainable variable")

    def peak(c):
        return float(pr.evaluate(c[None, :]).memory_bytes[0].max())

    hi = peak(hi_cuts)
    lo = pr.limit  # nothing fits below the device's memory
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        cuts, ok = _feasible_plan(pr, mid, max_runs)
        sure &= ok
        if cuts is None:
            lo = mid
        else:
            hi_cuts, hi = cuts, min(peak(cuts), mid)
    return hi_cuts, sure
