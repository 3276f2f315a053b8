"""Constraint repair (SAMPLE / FIX on the classic CP solver) and the exact CP-SAT reference for MCM
partitioning, checked against an independent checker and brute-force enumeration on tiny graphs."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest

from archplace.algorithms.solvers.mcm_exact import chip_latencies, solve_exact
from archplace.algorithms.solvers.mcm_repair import MCMRepairer, repair

STAGES = {"eq4", "cpsat", "chain", "complete"} | {f"chain-cap{k}" for k in (31, 17, 15, 8, 7, 4, 3, 2, 1, 0)}


# ============================================================================================ oracles
def statically_valid(C: int, src, dst, f) -> bool:
    """Eqs. 2–4 written the paper's way (longest chip paths), independent of the solver's bitmasks."""
    f = [int(v) for v in f]
    if any(not 0 <= v < C for v in f):
        return False
    if any(f[a] > f[b] for a, b in zip(src, dst)):  # Eq. 2
        return False
    if set(f) != set(range(max(f) + 1)):  # Eq. 3
        return False
    chip_edges = {(f[a], f[b]) for a, b in zip(src, dst) if f[a] != f[b]}
    longest = {}  # delta(a, b): longest chip path, by DP over chip ids (a topological order by Eq. 2)
    for a in range(C - 1, -1, -1):
        for b in range(a + 1, C):
            best = 1 if (a, b) in chip_edges else 0
            for k in range(a + 1, b):
                if (a, k) in chip_edges and longest.get((k, b), 0) > 0:
                    best = max(best, 1 + longest[k, b])
            longest[a, b] = best
    return all(longest[a, b] == 1 for a, b in chip_edges)  # Eq. 4


def random_dag(n: int, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random DAG with shuffled labels (node ids are not a topological order)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    src, dst = [], []
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < p:
                src.append(perm[i])
                dst.append(perm[j])
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


def brute_valid(C: int, n: int, src, dst) -> set[tuple[int, ...]]:
    return {f for f in itertools.product(range(C), repeat=n) if statically_valid(C, src, dst, f)}


@dataclass
class Problem:
    num_chips: int
    src: np.ndarray
    dst: np.ndarray
    time_s: np.ndarray
    out_bytes: np.ndarray
    weight_bytes: np.ndarray
    link_bw_bytes_per_s: float
    sram_bytes: float


def latency_loops(pb: Problem, f) -> float:
    """max_d (compute_d + link_d) with plain loops (shared definitions)."""
    C, n = pb.num_chips, len(f)
    lat = [0.0] * C
    for u in range(n):
        lat[f[u]] += pb.time_s[u]
    for u in range(n):
        m = max([f[u]] + [f[v] for a, v in zip(pb.src, pb.dst) if a == u])
        for link in range(f[u], m):
            lat[link] += pb.out_bytes[u] / pb.link_bw_bytes_per_s
    return max(lat)


def conservative_memory_ok(pb: Problem, f) -> bool:
    for d in range(pb.num_chips):
        tot = 0.0
        for u in range(len(f)):
            if f[u] == d:
                tot += pb.weight_bytes[u] + pb.out_bytes[u]
            elif any(a == u and f[v] == d for a, v in zip(pb.src, pb.dst)):
                tot += pb.out_bytes[u]
        if tot > pb.sram_bytes:
            return False
    return True


def random_problem(n: int, C: int, p: float, seed: int, sram: float = 1e18) -> Problem:
    src, dst = random_dag(n, p, seed)
    rng = np.random.default_rng(seed + 1000)
    return Problem(C, src, dst, rng.uniform(1e-4, 1e-3, n), rng.uniform(1e6, 8e6, n),
                   rng.uniform(0, 4e6, n), 32e9, sram)


# ============================================================================================ oracle sanity
def test_checker_on_paper_figure_2():
    # (c) node 2 on chip 1 feeds node 4 on chip 0
    assert not statically_valid(3, [2], [4], [0, 0, 1, 0, 0])
    # (d) chip 1 skipped
    assert not statically_valid(3, [0], [1], [0, 2])
    # (e) 0->2 direct (node0@0 -> node2@2) and 0->1->2 (node0@0 -> node1@1 -> node3@2)
    src, dst = [0, 0, 1], [2, 1, 3]
    assert not statically_valid(3, src, dst, [0, 1, 2, 2])
    assert statically_valid(3, src, dst, [0, 1, 1, 2])  # node 2 moved to chip 1: 0->1->2 only
    # a chip may skip over another one that is on no path between them
    assert statically_valid(3, [0, 0], [1, 2], [0, 2, 1])


# ============================================================================================ repair
def test_outputs_valid_on_random_dags():
    rng = np.random.default_rng(0)
    for case in range(60):
        n = int(rng.integers(2, 40))
        C = int(rng.integers(1, 9))
        src, dst = random_dag(n, float(rng.uniform(0.05, 0.4)), case)
        y = rng.integers(0, C, n)
        probs = rng.dirichlet(np.ones(C) * 0.3, size=n)
        for seed in range(3):
            fx = repair(C, src, dst, "fix", y=y, seed=seed)
            assert fx.status == "valid"
            assert statically_valid(C, src, dst, fx.partition)
            assert fx.changed == int((fx.partition != y).sum())
            sm = repair(C, src, dst, "sample", probs=probs, seed=seed)
            assert sm.status == "valid"
            assert statically_valid(C, src, dst, sm.partition)
            assert sm.changed == 0


def test_fix_keeps_valid_input_whatever_the_order():
    rng = np.random.default_rng(1)
    for case in range(20):
        n = int(rng.integers(3, 60))
        C = int(rng.integers(2, 12))
        src, dst = random_dag(n, 0.15, 100 + case)
        valid = repair(C, src, dst, "sample", probs=np.full((n, C), 1.0 / C), seed=case).partition
        for seed in range(4):
            order = rng.permutation(n) if seed else None
            res = repair(C, src, dst, "fix", y=valid, seed=seed, order=order)
            assert res.status == "valid" and res.changed == 0
            np.testing.assert_array_equal(res.partition, valid)
            assert res.failures == 0


@pytest.mark.parametrize("n,C,p,seed", [(5, 3, 0.4, 0), (6, 3, 0.3, 1), (7, 3, 0.35, 2), (6, 2, 0.5, 3),
                                        (7, 3, 0.2, 4)])
def test_complete_against_brute_force(n, C, p, seed):
    src, dst = random_dag(n, p, seed)
    valid = brute_valid(C, n, src, dst)
    rep = MCMRepairer(C, src, dst, num_nodes=n)
    rng = np.random.default_rng(seed)
    # every candidate, valid or not, is repaired into a valid partition; valid ones come back unchanged
    for y in itertools.product(range(C), repeat=n):
        res = rep.repair("fix", y=np.array(y), seed=int(rng.integers(1 << 30)))
        assert res.status == "valid"
        assert tuple(res.partition.tolist()) in valid
        if y in valid:
            assert tuple(res.partition.tolist()) == y and res.changed == 0
    # SAMPLE only ever returns valid partitions, reaches every valid one from uniform probabilities, and
    # returns a valid target exactly when its probabilities are one-hot on it
    seen = set()
    for s in range(40 * len(valid)):
        res = rep.repair("sample", probs=np.full((n, C), 1.0 / C), seed=s)
        assert res.status == "valid"
        seen.add(tuple(res.partition.tolist()))
        if seen == valid:
            break
    assert seen == valid
    for y in valid:
        res = rep.repair("sample", probs=np.eye(C)[list(y)], seed=7)
        assert tuple(res.partition.tolist()) == y


@pytest.mark.parametrize("budget", [0, 32])
def test_complete_with_pins_against_brute_force(budget):
    # pinned nodes make infeasible instances and force backtracking; budget 0 runs only the complete stage
    rng = np.random.default_rng(budget)
    outcomes = set()
    for case in range(12):
        n, C = 6, 3
        src, dst = random_dag(n, 0.35, 50 + case)
        rep = MCMRepairer(C, src, dst, num_nodes=n)
        rep.restart_failures = budget
        pins = {}
        for u in rng.choice(n, size=2, replace=False).tolist():
            pins[u] = sorted(rng.choice(C, size=int(rng.integers(1, C)), replace=False).tolist())
            rep.restrict(u, pins[u])
        valid = {f for f in brute_valid(C, n, src, dst) if all(f[u] in c for u, c in pins.items())}
        res = rep.repair("fix", y=rng.integers(0, C, n), seed=case)
        if not valid:
            assert res.status == "infeasible"
            outcomes.add("infeasible")
            continue
        assert res.status == "valid" and tuple(res.partition.tolist()) in valid
        seen = set()
        for s in range(30 * len(valid)):
            seen.add(tuple(rep.repair("sample", probs=np.full((n, C), 1 / C), seed=s).partition.tolist()))
            if seen == valid:
                break
        assert seen == valid
        outcomes.add("valid")
    assert outcomes == {"valid", "infeasible"}


def test_sample_follows_probabilities_over_the_domain():
    # two isolated nodes, C = 2: node 0 on chip 0 or 1; prefix rule forces at least one on chip 0
    probs = np.array([[0.2, 0.8], [0.2, 0.8]])
    counts = {}
    rep = MCMRepairer(2, [], [], num_nodes=2)
    for s in range(3000):
        f = tuple(rep.repair("sample", probs=probs, seed=s, order=[0, 1]).partition.tolist())
        counts[f] = counts.get(f, 0) + 1
    assert set(counts) == {(0, 0), (0, 1), (1, 0)}
    # node 0 first: chip 1 w.p. 0.8, then node 1 must take chip 0; else node 1 samples freely
    assert abs(counts[(1, 0)] / 3000 - 0.8) < 0.03
    assert abs(counts[(0, 1)] / 3000 - 0.16) < 0.03


def test_deterministic_given_seed_and_stats():
    src, dst = random_dag(80, 0.05, 9)
    y = np.random.default_rng(3).integers(0, 36, 80)
    a = repair(36, src, dst, "fix", y=y, seed=5)
    b = repair(36, src, dst, "fix", y=y, seed=5)
    np.testing.assert_array_equal(a.partition, b.partition)
    assert (a.failures, a.branches) == (b.failures, b.branches)
    assert a.branches >= 80 - 1 and a.wall_s > 0


def test_infeasible_and_unknown():
    # chain 0 -> 1 -> 2 with a shortcut 0 -> 2; pinned to chips 0 and 2, node 1 must fill chip 1, which
    # makes 0 -> 1 -> 2 next to the direct 0 -> 2: no valid partition
    rep = MCMRepairer(3, [0, 1, 0], [1, 2, 2])
    rep.restrict(0, [0])
    rep.restrict(2, [2])
    for mode in ("fix", "sample"):
        res = rep.repair(mode, y=np.array([0, 0, 2]), probs=np.full((3, 3), 1 / 3), seed=1)
        assert res.status == "infeasible" and res.partition is None and res.failures > 0
    # without the shortcut the same pins are fine
    rep = MCMRepairer(3, [0, 1], [1, 2])
    rep.restrict(0, [0])
    rep.restrict(2, [2])
    res = rep.repair("fix", y=np.array([0, 0, 2]))
    assert res.status == "valid" and res.partition.tolist() == [0, 1, 2] and res.changed == 1
    # a single node barred from chip 0 violates Eq. 3 everywhere
    rep = MCMRepairer(4, [], [], num_nodes=1)
    rep.restrict(0, [1, 2, 3])
    assert rep.repair("fix", y=np.array([2])).status == "infeasible"


def _layered(n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    from archplace.workloads.synthetic import layered_dag

    g = layered_dag(n, width, seed=0)
    pos = {int(i): k for k, i in enumerate(g.nodes["id"])}
    return (np.array([pos[int(a)] for a in g.edges["src"]]), np.array([pos[int(b)] for b in g.edges["dst"]]))


def test_restart_stages_on_36_chips():
    src, dst = _layered(120, 8)
    rep = MCMRepairer(36, src, dst, num_nodes=120)
    rng = np.random.default_rng(4)
    stages = set()
    for s in range(6):
        y = rng.integers(0, 36, 120)
        probs = rng.dirichlet(np.ones(36), 120)
        for res in (rep.repair("fix", y=y, seed=s), rep.repair("sample", probs=probs, seed=s)):
            assert res.status == "valid" and statically_valid(36, src, dst, res.partition)
            stages.add(res.stage)
            if res.stage.startswith("chain"):  # the sufficient condition of the chain stages
                assert (res.partition[dst] - res.partition[src] <= 1).all()
    assert stages <= STAGES
    # a valid input is kept by the first stage
    v = rep.repair("sample", probs=np.full((120, 36), 1 / 36), seed=0).partition
    res = rep.repair("fix", y=v, seed=3)
    assert res.stage == "eq4" and res.changed == 0 and res.failures == 0
    # forcing the chain stage (no CP-SAT stage)
    rep.restart_failures = 1
    rep.cpsat = False
    res = rep.repair("fix", y=(np.arange(120) * 36 // 120), seed=1)
    assert res.status == "valid" and statically_valid(36, src, dst, res.partition)
    if res.stage != "eq4":
        assert (res.partition[dst] - res.partition[src] <= 1).all()


def test_complete_stage_finds_what_the_chain_condition_forbids():
    # edge 0 -> 2 pinned across two chips, node 1 alone on chip 1: valid, but not under the chain condition
    rep = MCMRepairer(3, [0], [2], num_nodes=3)
    rep.restrict(0, [0])
    rep.restrict(2, [2])
    for budget in (0, 1, 32):
        rep.restart_failures = budget
        res = rep.repair("sample", probs=np.full((3, 3), 1 / 3), seed=2)
        assert res.status == "valid" and res.partition.tolist() == [0, 1, 2]
        assert res.stage == ("complete" if budget == 0 else "eq4")
    rep.restart_failures = 0
    rep.restrict(1, [0, 2])  # now chip 1 stays empty: infeasible, proven by the complete stage
    res = rep.repair("fix", y=np.array([0, 1, 2]))
    assert (res.status, res.stage, res.partition) == ("infeasible", "complete", None)


def test_time_limit_gives_unknown():
    src, dst = _layered(300, 12)
    res = repair(36, src, dst, "fix", y=np.random.default_rng(0).integers(0, 36, 300), time_limit_s=1e-6)
    assert res.status == "unknown" and res.partition is None


def test_bad_arguments():
    src, dst = np.array([0]), np.array([1])
    with pytest.raises(ValueError, match="mode"):
        repair(3, src, dst, "greedy", y=np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match="y"):
        repair(3, src, dst, "fix", y=np.zeros((2, 1), dtype=int))
    with pytest.raises(ValueError, match="y"):
        repair(3, src, dst, "fix", y=np.array([0, 3]))
    with pytest.raises(ValueError, match="probs"):
        repair(3, src, dst, "sample", probs=np.ones((2, 2)))
    with pytest.raises(ValueError, match="probs"):
        repair(3, src, dst, "sample", probs=-np.ones((2, 3)))
    with pytest.raises(ValueError, match="order"):
        repair(3, src, dst, "fix", y=np.zeros(2, dtype=int), order=[0, 0])
    with pytest.raises(ValueError, match="num_chips"):
        repair(65, src, dst, "fix", y=np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match="src"):
        repair(3, np.array([0, 1]), dst, "fix", y=np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match="src/dst"):
        repair(3, src, np.array([5]), "fix", y=np.zeros(2, dtype=int))


# ============================================================================================ exact
def test_chip_latencies_match_loops():
    pb = random_problem(12, 4, 0.3, 5)
    for s in range(20):
        f = repair(4, pb.src, pb.dst, "sample", probs=np.full((12, 4), 0.25), seed=s).partition
        assert math.isclose(chip_latencies(pb, f).max(), latency_loops(pb, f), rel_tol=1e-12)


@pytest.mark.parametrize("n,p,seed,sram", [(5, 0.4, 0, 1e18), (6, 0.3, 1, 1e18), (7, 0.3, 2, 1e18),
                                           (7, 0.2, 3, 1e18), (7, 0.3, 4, 2.0e7), (7, 0.3, 4, 1.6e7)])
def test_exact_matches_brute_force(n, p, seed, sram):
    pb = random_problem(n, 3, p, seed, sram)
    best = math.inf
    for f in itertools.product(range(3), repeat=n):
        if statically_valid(3, pb.src, pb.dst, f) and conservative_memory_ok(pb, f):
            best = min(best, latency_loops(pb, f))
    res = solve_exact(pb, time_limit_s=30, num_workers=2)
    if best == math.inf:  # the memory bound leaves nothing (seed 4 at 16 MB)
        assert res.status == "infeasible" and res.partition is None
        return
    assert res.status == "optimal"
    assert statically_valid(3, pb.src, pb.dst, res.partition)
    assert conservative_memory_ok(pb, list(res.partition))
    assert math.isclose(res.max_latency_s, best, rel_tol=1e-9)
    assert math.isclose(res.throughput, 1 / best, rel_tol=1e-9)
    assert res.bound_s <= res.max_latency_s and res.gap < 1e-8


def test_exact_memory_and_infeasible():
    pb = random_problem(6, 3, 0.3, 8)
    pb.sram_bytes = float((pb.weight_bytes + pb.out_bytes).min()) * 0.5  # no node fits anywhere
    res = solve_exact(pb, time_limit_s=10, num_workers=2)
    assert res.status == "infeasible" and res.partition is None and res.throughput == 0.0


def test_exact_40_nodes_4_chips_optimal():
    pb = random_problem(40, 4, 0.08, 11, sram=256 * 2**20)
    hint = repair(4, pb.src, pb.dst, "sample", probs=np.full((40, 4), 0.25), seed=0).partition
    res = solve_exact(pb, time_limit_s=60, num_workers=2, hint=hint)
    assert res.status == "optimal", res
    assert statically_valid(4, pb.src, pb.dst, res.partition)
    assert conservative_memory_ok(pb, list(res.partition))
    assert math.isclose(res.max_latency_s, latency_loops(pb, list(res.partition)), rel_tol=1e-12)
    # no worse than the all-on-chip-0 partition and than any repaired random sample
    assert res.max_latency_s <= latency_loops(pb, [0] * 40) * (1 + 1e-9)
    if conservative_memory_ok(pb, list(hint)):
        assert res.max_latency_s <= latency_loops(pb, list(hint)) * (1 + 1e-9)


# ============================================================================================ stages
def test_uniform_proposals_valid_with_documented_stages():
    # uniform FIX and SAMPLE proposals on random DAGs with 8 and 20 chips: always valid, stage documented
    rng = np.random.default_rng(17)
    for case in range(10):
        n = int(rng.integers(10, 36))
        C = 8 if case % 2 else 20
        src, dst = random_dag(n, float(rng.uniform(0.05, 0.3)), 300 + case)
        rep = MCMRepairer(C, src, dst, num_nodes=n)
        for seed in range(3):
            y = rng.integers(0, C, n)
            for res in (rep.repair("fix", y=y, seed=seed),
                        rep.repair("fix", y=y, probs=rng.dirichlet(np.ones(C), n), seed=seed),
                        rep.repair("sample", probs=np.full((n, C), 1.0 / C), seed=seed)):
                assert res.status == "valid" and res.stage in STAGES
                assert statically_valid(C, src, dst, res.partition)
                if res.stage.startswith("chain"):
                    assert (res.partition[dst] - res.partition[src] <= 1).all()


def _small_lstm():
    from archplace.workloads.synthetic import rnn_graph

    g = rnn_graph(2, 512, 102, batch=64, cell="lstm", bytes_per_element=1)  # lstm-s1 of bench/mcm/mcm.py
    pos = {int(i): k for k, i in enumerate(g.nodes["id"])}
    src = np.array([pos[int(a)] for a in g.edges["src"]])
    dst = np.array([pos[int(b)] for b in g.edges["dst"]])
    return src, dst, len(pos)


def test_small_graph_rarely_falls_back_to_chain():
    # the 8-chip two-step LSTM of bench/mcm/mcm.py: uniform FIX proposals end in the chain fallback on < 10%
    # of repairs (it was about 80% before the topological order and the CP-SAT stage)
    src, dst, n = _small_lstm()
    rep = MCMRepairer(8, src, dst, num_nodes=n)
    stages = []
    for s in range(20):
        y = np.random.default_rng(s).integers(0, 8, n)
        res = rep.repair("fix", y=y, seed=s)
        assert res.status == "valid" and res.stage in STAGES
        assert statically_valid(8, src, dst, res.partition)
        stages.append(res.stage)
    assert sum(st.startswith("chain") for st in stages) < 0.1 * len(stages), stages


@pytest.mark.parametrize("n,p,seed", [(6, 0.3, 0), (7, 0.35, 1), (8, 0.25, 2), (7, 0.2, 3), (8, 0.3, 4)])
def test_cpsat_stage_is_minimal_change(n, p, seed):
    # the CP-SAT stage (3 chips: every chip in every domain) keeps as many nodes of y as any valid
    # partition can: its changed count is the brute-force minimum, with and without a pin
    import time

    C = 3
    src, dst = random_dag(n, p, 700 + seed)
    valid = sorted(brute_valid(C, n, src, dst))
    rng = np.random.default_rng(seed)
    for pin in (None, int(rng.integers(n))):
        rep = MCMRepairer(C, src, dst, num_nodes=n)
        ok = valid
        if pin is not None:
            rep.restrict(pin, [1, 2])
            ok = [f for f in valid if f[pin] in (1, 2)]
            if not ok:
                continue
        for _ in range(6):
            y = rng.integers(0, C, n)
            ref = list(ok[int(rng.integers(len(ok)))])  # any valid reference (the hint)
            out = rep._cpsat_stage("fix", y.tolist(), None, ref, rng, time.perf_counter() + 30)
            assert out is not None and tuple(out) in set(ok)
            best = min(sum(a != b for a, b in zip(f, y)) for f in ok)
            assert sum(a != b for a, b in zip(out, y)) == best
        # SAMPLE: one-hot probabilities on a valid partition give it back (its log-probability is the
        # largest by far, whatever the Gumbel noise)
        tgt = ok[int(rng.integers(len(ok)))]
        out = rep._cpsat_stage("sample", None, np.eye(C)[list(tgt)], list(ok[0]), rng,
                               time.perf_counter() + 30)
        assert out is not None and tuple(out) == tgt


def test_fix_with_probs_draws_deferred_nodes_from_them():
    # a node whose y is out of its domain is deferred and draws from its probabilities over the domain
    rep = MCMRepairer(3, [0], [1], num_nodes=2)
    rep.restrict(1, [0, 1])  # node 1 cannot keep y = 2; Eq. 2 keeps node 0 at or below node 1
    counts = {0: 0, 1: 0}
    probs = np.array([[1 / 3] * 3, [0.1, 0.9, 0.0]])
    for s in range(400):
        res = rep.repair("fix", y=np.array([0, 2]), probs=probs, seed=s, order=[0, 1])
        assert res.status == "valid"
        counts[int(res.partition[1])] += 1
    assert abs(counts[1] / 400 - 0.9) < 0.06
