"""The exact dynamic program over the ideals of the contracted forward graph (the reference's
recursion, made fast with bitsets, numpy over all device-count states, and threshold pruning).

``_SMALL_LATTICE`` and ``_STRAIGHT_TO_UB`` decide how the pruning threshold is chosen; they can be set
on the ``maxload`` package (the tests do, to exercise the pruned DP on small inputs).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .contraction import _Problem
from .evaluate import evaluate_split
from .inputs import _INF


class _TooManyIdeals(Exception):
    pass


def _enumerate_ideals(p: _Problem, limit: int) -> list[int]:
    """All downsets of the contracted forward DAG as bitmasks (each generated once: a child adds an
    available supernode above the current maximum)."""
    F = p.F
    preds, succs = p.preds, p.succs
    out = [0]
    init_avail = 0
    for v in range(F):
        if preds[v] == 0:
            init_avail |= 1 << v
    stack = [(0, init_avail, -1)]
    while stack:
        ideal, avail, top = stack.pop()
        cand = avail >> (top + 1) << (top + 1)
        while cand:
            low = cand & -cand
            v = low.bit_length() - 1
            cand ^= low
            child = ideal | low
            new_avail = avail & ~low
            for w in succs[v]:
                if preds[w] & ~child == 0:
                    new_avail |= 1 << w
            out.append(child)
            if len(out) > limit:
                raise _TooManyIdeals(limit)
            stack.append((child, new_avail, v))
    return out


class _Lattice:
    """The ideals as arrays: bitset words, per-ideal sums and hyperedge split counts."""

    def __init__(self, p: _Problem, ideals: list[int]):
        F = p.F
        N = self.N = len(ideals)
        W = self.W = max(1, (F + 63) // 64)
        raw = b"".join(i.to_bytes(8 * W, "little") for i in ideals)
        self.words = np.frombuffer(raw, dtype=np.uint64).reshape(N, W)
        bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8).reshape(N, 8 * W), axis=1,
                             bitorder="little")[:, :F]
        self.bits = bits
        sums = np.empty((N, 4))
        weights = np.stack([p.acc, p.cpu, p.size, p.unsup], axis=1)
        for a in range(0, N, 8192):  # in chunks: a float copy of all the bits may be large
            sums[a:a + 8192] = bits[a:a + 8192].astype(np.float64) @ weights
        self.acc, self.cpu, self.size, self.unsup = (np.ascontiguousarray(sums[:, c]) for c in range(4))
        self.pop = bits.sum(axis=1, dtype=np.int64)
        H = p.H
        S = np.zeros((N, H), dtype=np.int16)
        for h, members in enumerate(p.h_members):
            cnt = bits[:, members].sum(axis=1, dtype=np.int16)
            S[:, h] = np.where((cnt > 0) & (cnt < len(members)), cnt, 0)
        self.split = S
        self.fcut = (S > 0).astype(np.float64) @ p.h_cost if H else np.zeros(N)
        self.full = int(np.argmax(self.pop))
        self.empty = int(np.argmin(self.pop))


class _DPRun:
    """One run of the DP at threshold ``T``: pieces of cost > T are dropped, and an ideal is kept in a
    state (c CPUs and f accelerators used) only if its forward accelerator work fits in those devices
    and the rest fits in the others. ``dp[i, c, f]`` is the best max-load covering ideal i."""

    def __init__(self, p: _Problem, lat: _Lattice, T: float):
        self.p, self.lat, self.T = p, lat, T
        k, cpus = p.k, p.cpus
        C1, K1 = cpus + 1, k + 1
        self.tol = 1e-9 * max(1.0, T if math.isfinite(T) else 1.0)
        rmax = p._cpu_ratio()
        if math.isfinite(T):
            ccap = (T * rmax if math.isfinite(rmax) else _INF) if cpus else 0.0
            total = float(lat.acc[lat.full])
            fs = np.arange(K1)[None, :]
            cs = np.arange(C1)[:, None]
            cpu_work = np.where(cs > 0, cs * ccap if math.isfinite(ccap) else _INF, 0.0)
            rest_work = np.where(cpus - cs > 0, (cpus - cs) * ccap if math.isfinite(ccap) else _INF, 0.0)
            before = fs * T + cpu_work                 # work that fits in f accs and c cpus
            after = (k - fs) * T + rest_work            # work that fits in the devices left
            a = lat.acc[:, None, None]
            self.band = (a <= before[None] + self.tol) & (total - a <= after[None] + self.tol)
            self.window = max(T, ccap)
        else:
            self.band = np.ones((lat.N, C1, K1), dtype=bool)
            self.window = _INF
        self.dp = np.full((lat.N, C1, K1), _INF)
        self.alive = np.zeros(lat.N, dtype=bool)  # finite in some state: the only useful sources
        in_any = self.band.any(axis=(1, 2))
        order_acc = np.flatnonzero(in_any)
        self.order_acc = order_acc[np.argsort(lat.acc[order_acc], kind="stable")]
        self.acc_sorted = lat.acc[self.order_acc]
        # the candidates' data in that order, so that a window is a slice (no gathers)
        self.words_sorted = np.ascontiguousarray(lat.words[self.order_acc].T)   # (W, n)
        self.pop_sorted = lat.pop[self.order_acc]
        self.alive_sorted = np.zeros(len(self.order_acc), dtype=bool)
        self.sorted_pos = np.full(lat.N, -1, dtype=np.int64)
        self.sorted_pos[self.order_acc] = np.arange(len(self.order_acc))
        process = np.flatnonzero(in_any)
        self.process = process[np.argsort(lat.pop[process], kind="stable")]
        self.pairs = 0
        self.window_total = 0

    def pieces_into(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The live proper sub-ideals j of ideal i and the cost of the piece i \\ j on an accelerator
        (inf when over T, over memory or holding a CPU-only node) and on a CPU (inf when over T)."""
        p, lat, T, tol = self.p, self.lat, self.T, self.tol
        ai = lat.acc[i]
        lo = 0
        if math.isfinite(self.window):
            lo = int(np.searchsorted(self.acc_sorted, ai - self.window - tol))
        hi = int(np.searchsorted(self.acc_sorted, ai + tol, side="right"))
        self.window_total += hi - lo
        wi = ~lat.words[i]
        ws = self.words_sorted
        outside = ws[0, lo:hi] & wi[0]
        for w in range(1, len(wi)):
            outside |= ws[w, lo:hi] & wi[w]
        keep = (outside == 0) & self.alive_sorted[lo:hi] & (self.pop_sorted[lo:hi] < lat.pop[i])
        cand = self.order_acc[lo:hi][keep]
        if not len(cand):
            return cand, np.zeros(0), np.zeros(0)
        fs = np.flatnonzero(lat.split[i])
        comm = lat.fcut[i] + lat.fcut[cand]
        if len(fs):
            sc = lat.split[np.ix_(cand, fs)]
            comm = comm - ((sc > 0) * (1 + (sc == lat.split[i, fs]))) @ p.h_cost[fs]
        fcost = (ai - lat.acc[cand]) + comm
        bad = (fcost > T + tol) | (lat.size[i] - lat.size[cand] > p.mem)
        bad |= lat.unsup[i] - lat.unsup[cand] > 0.5
        fcost = np.where(bad, _INF, fcost)
        ccost = lat.cpu[i] - lat.cpu[cand]
        ccost = np.where(ccost > T + tol, _INF, ccost)
        return cand, fcost, ccost

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The values of ideal i per state through one last (non-empty) piece, with the pieces."""
        p, dp = self.p, self.dp
        k, cpus = p.k, p.cpus
        if i == self.lat.empty:
            return np.zeros((cpus + 1, k + 1)), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
        new = np.full((cpus + 1, k + 1), _INF)
        cand, fcost, ccost = self.pieces_into(i)
        if len(cand):
            D = dp[cand]  # (n, C1, K1)
            if k:
                new[:, 1:] = np.maximum(D[:, :, :-1], fcost[:, None, None]).min(axis=0)
            if cpus:
                np.minimum(new[1:, :], np.maximum(D[:, :-1, :], ccost[:, None, None]).min(axis=0),
                           out=new[1:, :])
        return new, cand, fcost, ccost

    def run(self, deadline: float) -> float:
        lat, dp = self.lat, self.dp
        for it, i in enumerate(self.process):
            if it % 256 == 0 and time.monotonic() > deadline:
                raise TimeoutError
            new, cand, _, _ = self.raw(i)
            self.pairs += len(cand)
            # a device may stay empty: the value with fewer devices carries over
            new = np.minimum.accumulate(np.minimum.accumulate(new, axis=0), axis=1)
            new[~self.band[i]] = _INF
            dp[i] = new
            if np.isfinite(new).any():
                self.alive[i] = True
                self.alive_sorted[self.sorted_pos[i]] = True
        return float(dp[lat.full, self.p.cpus, self.p.k])

    def stats(self) -> dict[str, Any]:
        return {"T": self.T, "processed_ideals": int(len(self.process)),
                "alive_ideals": int(self.alive.sum()), "window": int(self.window_total),
                "pairs": int(self.pairs)}

    def backtrack(self) -> np.ndarray:
        """The split achieving ``dp[full, cpus, k]``: recompute the transitions along the way back."""
        p, lat, dp = self.p, self.lat, self.dp
        c, f, i = p.cpus, p.k, lat.full
        v = dp[i, c, f]
        pieces: list[tuple[str, int, int]] = []
        while i != lat.empty:
            raw, cand, fcost, ccost = self.raw(i)
            # the state (c', f') <= (c, f) whose last piece gave v (the devices in between stay empty)
            c, f = (int(x[0]) for x in np.nonzero(raw[:c + 1, :f + 1] == v))
            j = -1
            if f:
                hit = np.flatnonzero(np.maximum(dp[cand, c, f - 1], fcost) == v)
                if len(hit):
                    j = int(cand[hit[0]])
                    pieces.append(("acc", j, i))
                    f -= 1
            if j < 0 and c:
                hit = np.flatnonzero(np.maximum(dp[cand, c - 1, f], ccost) == v)
                if len(hit):
                    j = int(cand[hit[0]])
                    pieces.append(("cpu", j, i))
                    c -= 1
            if j < 0:  # pragma: no cover - a finite DP value is always reached by some transition
                raise AssertionError("DP backtracking found no transition")
            i = j
            v = dp[i, c, f]
        pieces.reverse()
        sn_dev = np.full(p.F, -1, dtype=np.int64)
        na = nc = 0
        for kind, j, i in pieces:
            mask = lat.bits[i].astype(bool) & ~lat.bits[j].astype(bool)
            if kind == "acc":
                sn_dev[mask] = na
                na += 1
            else:
                sn_dev[mask] = p.k + nc
                nc += 1
        assert (sn_dev >= 0).all()
        return sn_dev[p.sn]


_DELTAS = (0.005, 0.01, 0.02, 0.03, 0.045, 0.065, 0.09, 0.125, 0.175, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5,
           2.5, 4.0)
_SMALL_LATTICE = 6000  # up to this many ideals, the DP runs unpruned at once
_STRAIGHT_TO_UB = 1.5  # prune at the known split's value at once when it is within this factor of the bound


def _chain_split(p: _Problem, deadline: float) -> tuple[np.ndarray | None, float]:
    """A quick feasible split: the DP over the prefixes of the topological order (a sub-lattice)."""
    lat = _Lattice(p, [(1 << i) - 1 for i in range(p.F + 1)])
    run = _DPRun(p, lat, _INF)
    try:
        val = run.run(deadline)
    except TimeoutError:
        return None, _INF
    if not math.isfinite(val):
        return None, _INF
    dev = run.backtrack()
    return dev, evaluate_split(p.g, dev).max_load


def _solve_dp(p: _Problem, lat: _Lattice, deadline: float, stats: dict, lb: float,
              ub: float) -> tuple[np.ndarray | None, float, str]:
    """The exact DP, pruned by a threshold that grows from ``lb`` to ``ub`` (a known split's value).
    Returns (device_of or None, proven lower bound, "optimal" | "infeasible" | "timeout")."""
    if lat.N <= _SMALL_LATTICE or lb <= 0:
        thresholds = [_INF]
    elif math.isfinite(ub) and ub <= lb * _STRAIGHT_TO_UB:
        # an attempt at a known split's value always succeeds; below it, attempts near the optimum
        # cost about as much as one at it, so go straight there when the split is already close
        thresholds = [ub * (1 + 1e-9)]
    else:
        cap = ub / _STRAIGHT_TO_UB
        thresholds = [lb * (1 + d) for d in _DELTAS if lb * (1 + d) < cap]
        thresholds.append(ub * (1 + 1e-9) if math.isfinite(ub) else _INF)
    attempts: list[dict] = []
    stats["dp_attempts"] = attempts
    for T in thresholds:
        t0 = time.monotonic()
        run = _DPRun(p, lat, T)
        try:
            val = run.run(deadline)
        except TimeoutError:
            attempts.append(run.stats() | {"timeout": True})
            return None, lb, "timeout"
        st = run.stats()
        st["found"] = math.isfinite(val)
        st["time_s"] = round(time.monotonic() - t0, 3)
        attempts.append(st)
        if math.isfinite(val):
            return run.backtrack(), val, "optimal"
        if math.isfinite(T):
            lb = max(lb, T)  # no split of max-load <= T exists
        else:
            return None, _INF, "infeasible"
    return None, lb, "timeout"  # pragma: no cover - the last threshold is >= a known split's value
