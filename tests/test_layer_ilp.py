"""Phaze's per-layer schedule ILP (archplace.algorithms.solvers.layer_ilp).

(a) Cross-check on 240 seeded random DAGs of 1–7 operators (random op types, random ℓ with ℓ̂ both
    below and above ℓ, some zero latencies, 1–3 tensor and 1–3 vector cores): CP-SAT, the HiGHS
    MILP (through PuLP) and the solver-free exhaustive enumeration agree on the optimal makespan to
    1e-6 relative, on all 240 instances for all three; 60 of them also with ``lazy=False`` and
    ``decompose=False`` (CP-SAT). Every returned schedule passes ``check_schedule``.
(b) Hand-computed cases; (c) the time-limit fallback; (d) caching and ``schedule_layers`` on
    bert-base.
"""

import math

import numpy as np
import pytest

from archplace.algorithms.solvers import layer_ilp as L
from archplace.algorithms.solvers.layer_ilp import (
    KIND_FUSED,
    KIND_TC,
    KIND_VC,
    LayerProblem,
    LayerSchedule,
    check_schedule,
    exhaustive_schedule,
    greedy_schedule,
    schedule_cache_key,
    schedule_layers,
    sequential_schedule,
    solve_layer,
)

N_RANDOM = 240
CHUNK = 30
REL = 1e-6


def rand_problem(seed: int, nmax: int = 7) -> LayerProblem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, nmax + 1))
    kind = rng.integers(0, 3, n)
    lat = rng.uniform(0.1, 10, n).round(3)
    lat_hat = lat * rng.choice([0.3, 0.6, 1.0, 1.5], n) * rng.uniform(0.8, 1.2, n)
    if rng.random() < 0.2:
        lat[rng.integers(n)] = 0.0
    p = rng.uniform(0.1, 0.6)
    src, dst = [], []
    for j in range(n):
        for i in range(j):
            if rng.random() < p:
                src.append(i)
                dst.append(j)
    perm = rng.permutation(n)
    return LayerProblem(kind, lat, lat_hat, perm[src] if src else [], perm[dst] if dst else [],
                        int(rng.integers(1, 4)), int(rng.integers(1, 4)))


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b)) + 1e-12


@pytest.mark.parametrize("chunk", range(N_RANDOM // CHUNK))
def test_random_dags_cpsat_milp_exhaustive_agree(chunk):
    kinds_seen = set()
    for seed in range(chunk * CHUNK, (chunk + 1) * CHUNK):
        pb = rand_problem(seed)
        kinds_seen.update(pb.kind.tolist())
        ex = exhaustive_schedule(pb)
        check_schedule(pb, ex)
        for backend in ("cpsat", "milp"):
            s = solve_layer(pb, backend, cache=False)
            check_schedule(pb, s)
            assert s.status in ("optimal", "trivial"), (seed, backend, s.status)
            assert close(s.makespan_s, ex.makespan_s), (seed, backend, s.makespan_s, ex.makespan_s)
            assert s.gap == 0.0
        if seed % 4 == 0:  # the other switches, on a quarter of the instances
            s = solve_layer(pb, "cpsat", lazy=False, decompose=False, cache=False)
            check_schedule(pb, s)
            assert close(s.makespan_s, ex.makespan_s), (seed, "full model", s.makespan_s, ex.makespan_s)
            assert s.lazy_rounds == 0
    assert kinds_seen == {KIND_TC, KIND_VC, KIND_FUSED}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_medium_dags_cpsat_and_milp_agree(seed):
    """9–12 ops: past the exhaustive range, and through CP-SAT's two phases (quick attempt, then the
    interval warm start) and the series decomposition."""
    rng = np.random.default_rng(1000 + seed)
    pb = rand_problem(1000 + seed, nmax=12)
    while pb.num_ops < 9:
        pb = rand_problem(int(rng.integers(1 << 30)), nmax=12)
    a = solve_layer(pb, "cpsat", cache=False, time_limit_s=120)
    b = solve_layer(pb, "milp", cache=False, time_limit_s=120)
    for s in (a, b):
        check_schedule(pb, s)
        assert s.status in ("optimal", "trivial")
    assert close(a.makespan_s, b.makespan_s), (a.makespan_s, b.makespan_s)


def test_second_phase_with_interval_warm_start(monkeypatch):
    """Force CP-SAT's quick first attempt to run out so the warm start and the second phase run."""
    pb = rand_problem(1003, nmax=12)
    while pb.num_ops < 9:
        pb = rand_problem(pb.num_ops + 5000, nmax=12)
    calls = []
    real = L._run_warm_start

    def spy(*a, **k):
        out = real(*a, **k)
        calls.append(out)
        return out

    monkeypatch.setattr(L, "QUICK_ATTEMPT_DTIME", 1e-4)
    monkeypatch.setattr(L, "_run_warm_start", spy)
    ref = solve_layer(pb, "milp", cache=False, time_limit_s=120)
    s = solve_layer(pb, "cpsat", cache=False, decompose=False, time_limit_s=120)
    assert calls, "the warm start did not run"
    ws = calls[0]
    assert ws is not None
    check_schedule(pb, ws)
    assert ws.makespan_s >= ref.makespan_s * (1 - REL)
    check_schedule(pb, s)
    assert s.status == "optimal" and close(s.makespan_s, ref.makespan_s)


def test_zero_latency_problems():
    for lat, lat_hat in (([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]), ([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]),
                         ([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])):
        pb = P([KIND_TC, KIND_VC, KIND_FUSED], lat, lat_hat, [(0, 1)], num_tc=1, num_vc=1)
        s = solve_layer(pb, cache=False)
        check_schedule(pb, s)
        assert s.makespan_s == 0.0


# ---------------------------------------------------------------------------- hand-computed
def P(kind, lat, lat_hat, edges=(), num_tc=2, num_vc=2):
    src = [a for a, _ in edges]
    dst = [b for _, b in edges]
    return LayerProblem(np.array(kind), np.array(lat, float), np.array(lat_hat, float), src, dst,
                        num_tc, num_vc)


BACKENDS = ("cpsat", "milp")


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_is_sum_of_min_latencies(backend):
    lat, lat_hat = [3.0, 1.0, 4.0, 2.0], [1.0, 2.0, 0.5, 2.0]
    pb = P([KIND_TC, KIND_VC, KIND_FUSED, KIND_TC], lat, lat_hat, [(0, 1), (1, 2), (2, 3)])
    s = solve_layer(pb, backend, cache=False)
    check_schedule(pb, s)
    assert s.makespan_s == pytest.approx(sum(map(min, lat, lat_hat)))
    assert s.status == "trivial" and s.gap == 0.0
    assert s.intra.tolist() == [True, False, True, False]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_independent_tc_ops_run_in_parallel_on_two_cores(backend):
    pb = P([KIND_TC, KIND_TC], [2.0, 2.0], [1.5, 1.5], num_tc=2, num_vc=1)
    s = solve_layer(pb, backend, cache=False)
    check_schedule(pb, s)
    assert s.makespan_s == pytest.approx(2.0)
    assert not s.intra.any() and sorted(s.tc_core.tolist()) == [0, 1]
    assert s.start_s.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_independent_tc_ops_serialise_on_one_core(backend):
    pb = P([KIND_TC, KIND_TC], [2.0, 2.0], [1.5, 1.5], num_tc=1, num_vc=1)
    s = solve_layer(pb, backend, cache=False)
    check_schedule(pb, s)
    assert s.makespan_s == pytest.approx(3.0)  # both intra-op, one after the other
    assert s.intra.all()
    assert exhaustive_schedule(pb).makespan_s == pytest.approx(3.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_intra_op_exclusivity(backend):
    # A fast only when intra-op (1 vs 4); B a vector op of length 1. Overlapping them would need A on
    # one core (4), so the optimum runs A intra-op and B strictly before or after it: 2, not 1.
    pb = P([KIND_TC, KIND_VC], [4.0, 1.0], [1.0, 1.0], num_tc=4, num_vc=1)
    s = solve_layer(pb, backend, cache=False)
    check_schedule(pb, s)
    assert s.makespan_s == pytest.approx(2.0)
    assert s.intra[0]
    a0, a1 = s.start_s[0], s.start_s[0] + 1.0
    b0, b1 = s.start_s[1], s.start_s[1] + 1.0
    assert a1 <= b0 + 1e-12 or b1 <= a0 + 1e-12
    # the check rejects an intra-op op overlapping anything
    bad = s.copy(start_s=np.array([0.0, 0.5]))
    bad.makespan_s = 1.5
    with pytest.raises(ValueError, match="intra-op parallel but overlaps"):
        check_schedule(pb, bad)
    # when branching pays, both run at once on their own cores
    pb2 = P([KIND_TC, KIND_VC], [4.0, 2.5], [3.0, 2.5], num_tc=4, num_vc=1)
    s2 = solve_layer(pb2, backend, cache=False)
    check_schedule(pb2, s2)
    assert s2.makespan_s == pytest.approx(4.0) and not s2.intra.any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_ops_need_a_pair_when_fewer_vector_cores(backend):
    # 3 tensor cores, 1 vector core: a single TC/VC pair (c = 0). Two independent fused ops must
    # share it (serialise); an independent TC op runs beside them on an unpaired tensor core.
    pb = P([KIND_FUSED, KIND_FUSED, KIND_TC], [1.0, 1.0, 2.0], [5.0, 5.0, 5.0], num_tc=3, num_vc=1)
    s = solve_layer(pb, backend, cache=False)
    check_schedule(pb, s)
    assert s.makespan_s == pytest.approx(2.0)
    assert s.tc_core[:2].tolist() == [0, 0] and s.vc_core[:2].tolist() == [0, 0]
    assert s.tc_core[2] in (1, 2) and s.vc_core[2] == -1
    assert exhaustive_schedule(pb).makespan_s == pytest.approx(2.0)
    # a fused op on an unpaired tensor core is rejected
    bad = s.copy(tc_core=np.array([1, 0, 2]), vc_core=np.array([0, 0, -1]))
    with pytest.raises(ValueError, match="fused op"):
        check_schedule(pb, bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lazy_rounds_when_branching_oversubscribes_cores(backend):
    # Three independent TC ops, one tensor core, intra-op slower: without z-variables all three
    # run at once (makespan 1); that needs 3 cores, so z is added back and the optimum is 3.
    pb = P([KIND_TC] * 3, [1.0] * 3, [1.2] * 3, num_tc=1, num_vc=2)
    s = solve_layer(pb, backend, cache=False)
    check_schedule(pb, s)
    assert s.makespan_s == pytest.approx(3.0) and s.status == "optimal"
    assert s.lazy_rounds >= 1
    full = solve_layer(pb, backend, lazy=False, cache=False)
    assert full.makespan_s == pytest.approx(3.0) and full.lazy_rounds == 0
    # with enough cores nothing is added back
    pb3 = P([KIND_TC] * 3, [1.0] * 3, [1.2] * 3, num_tc=3, num_vc=2)
    s3 = solve_layer(pb3, backend, cache=False)
    assert s3.makespan_s == pytest.approx(1.0) and s3.lazy_rounds == 0


def test_sequential_and_greedy_baselines():
    pb = rand_problem(7)
    seq = sequential_schedule(pb)
    check_schedule(pb, seq)
    assert seq.makespan_s == pytest.approx(pb.intra_latency_s.sum())
    assert seq.intra.all()
    g = greedy_schedule(pb)
    check_schedule(pb, g)
    assert g.makespan_s >= exhaustive_schedule(pb).makespan_s - 1e-12


def test_exhaustive_refuses_large_instances():
    pb = P([KIND_TC] * 8, [1.0] * 8, [1.0] * 8)
    with pytest.raises(ValueError, match="tiny instances"):
        exhaustive_schedule(pb)


def test_series_segments_split_at_full_cuts():
    # 0 -> {1, 2} -> 3 -> 4: cuts after 0 and after 3
    pb = P([KIND_TC] * 5, [1.0] * 5, [1.0] * 5, [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)])
    segs = [sorted(s.tolist()) for s in L._series_segments(pb)]
    assert segs == [[0], [1, 2], [3], [4]]
    s = solve_layer(pb, cache=False)
    check_schedule(pb, s)
    assert s.makespan_s == pytest.approx(4.0)


# ---------------------------------------------------------------------------- validation
def test_problem_validation():
    with pytest.raises(ValueError, match="latency_s is -1"):
        P([KIND_TC], [-1.0], [1.0])
    with pytest.raises(ValueError, match="intra_latency_s is nan"):
        P([KIND_TC], [1.0], [float("nan")])
    with pytest.raises(ValueError, match="cycle"):
        P([KIND_TC] * 3, [1.0] * 3, [1.0] * 3, [(0, 1), (1, 2), (2, 0)])
    with pytest.raises(ValueError, match="cycle"):
        P([KIND_TC] * 2, [1.0] * 2, [1.0] * 2, [(1, 1)])
    with pytest.raises(ValueError, match="num_tc must be an integer >= 1"):
        P([KIND_TC], [1.0], [1.0], num_tc=0)
    with pytest.raises(ValueError, match="num_vc must be an integer >= 1"):
        P([KIND_TC], [1.0], [1.0], num_vc=True)
    with pytest.raises(ValueError, match="kind 3"):
        P([3], [1.0], [1.0])
    with pytest.raises(ValueError, match="outside"):
        P([KIND_TC], [1.0], [1.0], [(0, 5)])
    with pytest.raises(ValueError, match="backend"):
        solve_layer(P([KIND_TC], [1.0], [1.0]), backend="gurobi")


def test_from_graph_drops_shape_ops_and_keeps_precedence():
    from archplace.workloads import OpGraph

    # 0 linear -> 1 view -> 2 view -> {3 gelu, 4 allreduce};  0 -> 5 add (direct); 2 -> 5
    g = OpGraph.from_columns(
        dict(id=list(range(6)), kind=["linear", "view", "view", "gelu", "allreduce", "add"],
             core=["tensor", "none", "none", "vector", "comm", "vector"], name=[f"n{i}" for i in range(6)]),
        edges=dict(src=[0, 1, 2, 2, 0, 2], dst=[1, 2, 3, 4, 5, 5]))
    single = np.array([1.0, 0.0, 0.0, 2.0, 3.0, 4.0])
    pb = LayerProblem.from_graph(g, single, single / 2, 4, 2)
    assert pb.names == ("n0", "n3", "n4", "n5")
    assert pb.kind.tolist() == [KIND_TC, KIND_VC, KIND_VC, KIND_VC]  # comm -> vector core
    assert sorted(zip(pb.edge_src.tolist(), pb.edge_dst.tolist())) == [(0, 1), (0, 2), (0, 3)]
    with pytest.raises(ValueError, match="one latency per graph row"):
        LayerProblem.from_graph(g, single[:3], single, 4, 2)


def test_check_schedule_rejects_violations():
    pb = P([KIND_TC, KIND_TC], [2.0, 2.0], [1.5, 1.5], [(0, 1)], num_tc=2)
    s = solve_layer(pb, cache=False)
    bad = s.copy(start_s=np.array([0.0, 0.5]))
    bad.makespan_s = float((bad.start_s + bad.durations(pb)).max())
    with pytest.raises(ValueError, match="precedence"):
        check_schedule(pb, bad)
    pb2 = P([KIND_TC, KIND_TC], [2.0, 2.0], [1.5, 1.5], num_tc=2)
    same_core = LayerSchedule(2.0, np.zeros(2), np.zeros(2, bool), np.array([0, 0]), np.array([-1, -1]),
                              "feasible", math.nan, "test", 0.0)
    with pytest.raises(ValueError, match="overlap on tensor core 0"):
        check_schedule(pb2, same_core)


# ---------------------------------------------------------------------------- fallback
def test_tiny_time_limit_falls_back_to_a_valid_schedule():
    """The wall-clock safety limit stops the solve: a valid list schedule, recorded as stopped by the
    wall clock (its answer depends on the load) and left out of the cache."""
    L.clear_schedule_cache()
    pb = P([KIND_TC, KIND_VC, KIND_FUSED], [2.0, 1.0, 3.0], [1.0, 1.0, 1.0], [(0, 2)])
    assert L._trivial(pb, 0.0) is None  # reaches the solver
    s = solve_layer(pb, time_limit_s=1e-6)
    check_schedule(pb, s)
    assert s.status == "fallback" and s.stopped_by == "wall_limit"
    assert math.isnan(s.gap)
    again = solve_layer(pb)
    assert not again.from_cache and again.status == "optimal" and again.stopped_by == "optimal"


def test_tiny_budget_falls_back_reproducibly():
    """The deterministic budget stops the solve: the same fallback both times, marked as stopped by
    the budget, and cached (it is reproducible)."""
    L.clear_schedule_cache()
    pb = P([KIND_TC, KIND_VC, KIND_FUSED], [2.0, 1.0, 3.0], [1.0, 1.0, 1.0], [(0, 2)])
    s = solve_layer(pb, budget=1e-9)
    check_schedule(pb, s)
    assert s.stopped_by == "deterministic_limit" and s.status in ("fallback", "feasible")
    assert solve_layer(pb, budget=1e-9).from_cache
    assert schedule_cache_key(pb, budget=1e-9) != schedule_cache_key(pb)


@pytest.mark.parametrize("bound", [math.nan, 1.0])
def test_solver_without_solution_falls_back(monkeypatch, bound):
    def no_solution(backend, problem, spec, *a, **k):
        return L._Raw(False, False, math.nan, bound, name="stub")

    monkeypatch.setattr(L, "_run_backend", no_solution)
    pb = P([KIND_TC, KIND_VC, KIND_FUSED], [2.0, 1.0, 3.0], [1.0, 1.0, 1.0], [(0, 2)])
    s = solve_layer(pb, cache=False)
    check_schedule(pb, s)
    assert s.status == "fallback" and "stub" in s.solver
    if math.isnan(bound):
        assert math.isnan(s.gap)
    else:
        assert s.gap == pytest.approx(1.0 - bound / s.makespan_s)


# ---------------------------------------------------------------------------- caching
def test_cache_hits_in_memory_and_on_disk(tmp_path):
    L.clear_schedule_cache()
    pb = rand_problem(11)
    a = solve_layer(pb, cache_dir=tmp_path)
    assert not a.from_cache
    b = solve_layer(pb, cache_dir=tmp_path)
    assert b.from_cache and b.makespan_s == a.makespan_s
    np.testing.assert_array_equal(b.start_s, a.start_s)
    assert len(list(tmp_path.glob("*.json"))) == 1
    L.clear_schedule_cache()
    c = solve_layer(pb, cache_dir=tmp_path)
    assert c.from_cache and c.makespan_s == a.makespan_s and c.status == a.status
    # other settings, other key
    assert schedule_cache_key(pb) != schedule_cache_key(pb, rel_gap=0.01)
    renamed = LayerProblem(pb.kind, pb.latency_s, pb.intra_latency_s, pb.edge_src, pb.edge_dst, pb.num_tc,
                           pb.num_vc, tuple(f"op{i}" for i in range(pb.num_ops)))
    assert schedule_cache_key(renamed) == schedule_cache_key(pb)


def test_schedule_layers_solves_repeated_blocks_once():
    from archplace.hardware.presets import TPUV4
    from archplace.simulators.estimate import estimate_graph
    from archplace.workloads.models import build_graph

    g = build_graph("bert-base", seq=128, mbs=1)
    est = estimate_graph(g, TPUV4)
    L.clear_schedule_cache()
    res = schedule_layers(g, est.single_s, est.all_s, TPUV4.num_tc, TPUV4.num_vc, time_limit_s=20.0)
    names = res["layers"]
    enc = [i for i, n in enumerate(names) if n.startswith("encoder.layer.")]
    assert len(enc) == 12
    for pas in ("forward", "backward"):
        keys = {res["keys"][pas][i] for i in enc}
        assert len(keys) == 1, pas  # the 12 identical encoder blocks share one schedule
        assert res[f"unique_{pas}"] == len(set(res["keys"][pas])) <= len(names) - 11
        assert (res[f"{pas}_s"] <= res[f"sequential_{pas}_s"] * (1 + 1e-9)).all()
        assert (res[f"{pas}_s"][enc] > 0).all()
    assert res["unique"] == len(res["schedules"]) <= res["unique_forward"] + res["unique_backward"]
    assert res["solved"] == res["unique"]  # cache cleared: every unique one solved once
    assert res["cache_hits"] == 2 * len(names) - res["unique"]
    for key, s in res["schedules"].items():
        check_schedule(res["problems"][key], s)
        assert s.status in ("optimal", "trivial", "feasible")
    again = schedule_layers(g, est.single_s, est.all_s, TPUV4.num_tc, TPUV4.num_vc, time_limit_s=20.0)
    assert again["solved"] == 0 and again["cache_hits"] == 2 * len(names)
    np.testing.assert_array_equal(again["forward_s"], res["forward_s"])


def test_large_slices_get_the_larger_budget():
    """``large_budget`` (and the safety limit ``large_time_limit_s``) apply from ``large_min_ops`` ops
    on; the cache key holds the budget the slice gets, so a small slice shares its entry with a run
    without the rule; the wall-clock limits are not in the key."""
    assert L.effective_time_limit_s(48, 30.0, 120.0, 40) == 120.0
    assert L.effective_time_limit_s(39, 30.0, 120.0, 40) == 30.0
    assert L.effective_time_limit_s(48, 30.0) == 30.0
    with pytest.raises(ValueError, match="large_time_limit_s must be > 0"):
        L.effective_time_limit_s(48, 30.0, 0.0)
    with pytest.raises(ValueError, match="large_min_ops must be an integer >= 1"):
        L.effective_time_limit_s(48, 30.0, 60.0, 0)
    assert L.effective_limit(48, 2.0, 8.0, 40) == 8.0 and L.effective_limit(39, 2.0, 8.0, 40) == 2.0
    with pytest.raises(ValueError, match="large_budget must be > 0"):
        L.effective_limit(48, 2.0, -1.0)
    p = LayerProblem(np.zeros(3, np.int64), np.ones(3), np.full(3, 0.5), [0, 1], [1, 2], 2, 2)
    k = L.schedule_cache_key
    assert k(p, budget=3.0, large_budget=12.0, large_min_ops=4) == k(p, budget=3.0)
    assert k(p, budget=3.0, large_budget=12.0, large_min_ops=3) == k(p, budget=12.0)
    assert k(p, budget=3.0, large_budget=12.0, large_min_ops=3) != k(p, budget=3.0)
    assert k(p, budget=3.0, time_limit_s=5.0) == k(p, budget=3.0, time_limit_s=500.0, large_time_limit_s=9.0)
    assert k(p, num_workers=2) != k(p)
