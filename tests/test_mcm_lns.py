"""CP-SAT large-neighbourhood search for MCM partitioning (issue 17): every sub-solve is checked against
an independent validity checker and brute-force enumeration of the free nodes; the whole search never
returns a worse partition than its seed and reaches the optimum (brute force on 7–8 nodes, the exact
CP-SAT model on up to 20) on small instances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from archplace.algorithms.solvers.mcm_exact import solve_exact
from archplace.algorithms.solvers.mcm_lns import (
    BottleneckChooser,
    full,
    lns,
    lower_bound_s,
    node_subset,
    solve_neighbourhood,
    window,
)
from archplace.algorithms.solvers.mcm_repair import MCMRepairer
from archplace.simulators.mcm import MCMProblem


# ============================================================================================ oracles
def valid(C: int, src, dst, f) -> bool:
    """Eqs. 2–4 straight from their definitions (spec mcm.md §1.3), loops only."""
    if any(f[u] > f[v] for u, v in zip(src, dst)):
        return False
    top = max(f)
    if any(d not in set(f) for d in range(top + 1)):
        return False
    edges = {(f[u], f[v]) for u, v in zip(src, dst) if f[u] != f[v]}

    def longest(a: int, b: int) -> int:  # longest chip path a -> b (0 if none)
        best = 0
        for (x, y) in edges:
            if x == a:
                if y == b:
                    best = max(best, 1)
                else:
                    rest = longest(y, b)
                    if rest:
                        best = max(best, 1 + rest)
        return best

    return all(longest(a, b) == 1 for a, b in edges)


def max_latency(pb: MCMProblem, f) -> float:
    """Compute per chip plus the bytes every op sends over each ring link it spans, in loops."""
    C = pb.num_chips
    lat = [0.0] * C
    for u in range(pb.num_nodes):
        lat[f[u]] += pb.time_s[u]
        succ = [int(v) for a, v in zip(pb.src, pb.dst) if a == u]
        m = max([f[u]] + [f[v] for v in succ])
        for link in range(f[u], m):
            lat[link] += pb.out_bytes[u] / pb.link_bw_bytes_per_s
    return max(lat)


def random_dag(n: int, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < p]
    for b in range(1, n):  # weakly connected
        if not any(q == b for _, q in pairs):
            pairs.append((int(rng.integers(b)), b))
    src, dst = zip(*pairs)
    return np.array(src), np.array(dst)


def random_problem(n: int, C: int, p: float, seed: int) -> MCMProblem:
    src, dst = random_dag(n, p, seed)
    rng = np.random.default_rng(seed + 1000)
    return MCMProblem.from_arrays(C, src, dst, rng.uniform(1e-4, 1e-3, n), rng.uniform(1e6, 8e6, n),
                                  link_bw_bytes_per_s=32e9, sram_bytes=1e18)


def random_valid(pb: MCMProblem, seed: int) -> np.ndarray:
    rep = MCMRepairer(pb.num_chips, pb.src, pb.dst, num_nodes=pb.num_nodes)
    res = rep.repair("sample", probs=np.full((pb.num_nodes, pb.num_chips), 1 / pb.num_chips), seed=seed)
    assert res.partition is not None
    return res.partition


def brute_best(pb: MCMProblem, f: np.ndarray, free: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    src, dst = pb.src.tolist(), pb.dst.tolist()
    best = np.inf
    for vals in itertools.product(*[range(int(a), int(b) + 1) for a, b in zip(lo, hi)]):
        g = f.copy()
        g[free] = vals
        gl = g.tolist()
        if valid(pb.num_chips, src, dst, gl):
            best = min(best, max_latency(pb, gl))
    return best


# ============================================================================================ tests
@pytest.mark.parametrize("seed", range(6))
def test_subsolve_equals_brute_force_over_the_free_nodes(seed):
    pb = random_problem(9, 5, 0.3, seed)
    f = random_valid(pb, seed)
    rng = np.random.default_rng(seed)
    top = int(f.max())
    nbs = [window(pb, f, int(rng.integers(top + 1)), int(rng.integers(1, 4)), spare=int(rng.integers(3))),
           node_subset(pb, f, rng.choice(9, size=4, replace=False), spare=1)]
    for nb in nbs:
        if nb.free.size == 0 or nb.free.size > 5:
            continue
        sub = solve_neighbourhood(pb, f, nb, time_limit_s=10)
        assert sub.status == "OPTIMAL"
        g = sub.partition
        assert valid(pb.num_chips, pb.src.tolist(), pb.dst.tolist(), g.tolist())
        fixed = np.setdiff1d(np.arange(9), nb.free)
        assert np.array_equal(g[fixed], f[fixed])
        assert (g[nb.free] >= nb.lo).all() and (g[nb.free] <= np.maximum(nb.hi, f[nb.free])).all()
        ref = brute_best(pb, f, nb.free, nb.lo, np.maximum(nb.hi, f[nb.free]))
        assert max_latency(pb, g.tolist()) == pytest.approx(ref, rel=1e-6)
        assert sub.objective_s == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_lns_never_worse_than_its_seed(seed):
    pb = random_problem(16, 6, 0.2, 100 + seed)
    f = random_valid(pb, seed)
    before = max_latency(pb, f.tolist())
    seen = []
    res = lns(pb, f, time_limit_s=30, seed=seed, subsolve_s=0.5, max_subsolves=12,
              chooser=BottleneckChooser(p_full=0.0),
              on_step=lambda step, nb, sub, ok, best: seen.append(best))
    assert res.subsolves == len(seen) and res.subsolves >= 1
    assert all(b2 <= b1 * (1 + 1e-12) for b1, b2 in zip(seen, seen[1:]))  # monotone incumbent
    assert valid(pb.num_chips, pb.src.tolist(), pb.dst.tolist(), res.partition.tolist())
    assert max_latency(pb, res.partition.tolist()) == pytest.approx(res.max_latency_s, rel=1e-9)
    assert res.max_latency_s <= before * (1 + 1e-12)
    assert res.seed_throughput == pytest.approx(1 / before, rel=1e-9)
    assert 0.0 <= res.gap < 1.0 and res.bound_s <= res.max_latency_s * (1 + 1e-9)


def brute_optimum(pb: MCMProblem) -> float:
    src, dst = pb.src.tolist(), pb.dst.tolist()
    best = np.inf
    for f in itertools.product(range(pb.num_chips), repeat=pb.num_nodes):
        if f[0] == 0 and valid(pb.num_chips, src, dst, list(f)):
            best = min(best, max_latency(pb, list(f)))
    return best


@pytest.mark.parametrize("n,C,seed", [(7, 3, 0), (7, 4, 1), (8, 3, 2), (8, 3, 3)])
def test_lns_reaches_the_brute_force_optimum(n, C, seed):
    pb = random_problem(n, C, 0.3, 200 + seed)
    f = np.zeros(n, dtype=np.int64)  # the trivial partition (everything on chip 0) as the seed
    res = lns(pb, f, time_limit_s=30, seed=seed, subsolve_s=2.0)
    assert res.max_latency_s == pytest.approx(brute_optimum(pb), rel=1e-6)


@pytest.mark.parametrize("n,C,seed", [(12, 4, 0), (16, 5, 1), (20, 6, 2)])
def test_lns_reaches_the_exact_optimum(n, C, seed):
    pb = random_problem(n, C, 0.25, 300 + seed)
    ex = solve_exact(pb, time_limit_s=60, num_workers=2)
    assert ex.status == "optimal"
    res = lns(pb, random_valid(pb, seed), time_limit_s=60, seed=seed, subsolve_s=2.0)
    assert res.max_latency_s == pytest.approx(ex.max_latency_s, rel=1e-6)
    assert res.stopped in ("optimal", "bound") or res.max_latency_s <= ex.max_latency_s * (1 + 1e-6)


def test_windows_alone_improve_a_chain():
    """A 12-op chain of equal ops on 4 chips, seeded with everything on chip 0: windows and spare chips
    alone (no full solve) reach the perfect split (3 ops per chip; no communication cost)."""
    n = 12
    pb = MCMProblem.from_arrays(4, np.arange(n - 1), np.arange(1, n), np.full(n, 1e-3))
    res = lns(pb, np.zeros(n, dtype=np.int64), time_limit_s=30, seed=0, subsolve_s=1.0,
              chooser=BottleneckChooser(p_full=0.0, p_nodes=0.0, max_spare=3))
    assert res.max_latency_s == pytest.approx(3e-3, rel=1e-9)
    assert res.stopped == "bound" and res.gap == pytest.approx(0.0, abs=1e-9)
    assert lower_bound_s(pb) == pytest.approx(3e-3)


def test_full_neighbourhood_and_errors():
    pb = random_problem(8, 3, 0.3, 7)
    f = random_valid(pb, 0)
    sub = solve_neighbourhood(pb, f, full(pb, f), time_limit_s=10)
    assert sub.status == "OPTIMAL"
    assert max_latency(pb, sub.partition.tolist()) == pytest.approx(brute_optimum(pb), rel=1e-6)
    bad = f.copy()
    bad[pb.dst[0]] = 0
    bad[pb.src[0]] = pb.num_chips - 1
    with pytest.raises(ValueError, match="seed_partition is not a valid partition"):
        lns(pb, bad, time_limit_s=1)
    with pytest.raises(ValueError, match="time_limit_s"):
        lns(pb, f, time_limit_s=0)
