"""Exact pipeline cuts by dynamic programming (archplace.algorithms.solvers.pipeline_dp), checked against
brute-force enumeration of every cut set on seeded synthetic profiles, against the pruned enumeration
(solve_exact) on Auto-MAP's Table 7 cases, and through `archplace pipeline` (its default algo)."""

import dataclasses
import functools
import itertools
import json

import numpy as np
import pytest

from archplace import api
from archplace.algorithms.rl.pipeline_plan import cluster_of, model_profile
from archplace.algorithms.solvers.pipeline_dp import solve_dp
from archplace.algorithms.solvers.pipeline_exact import candidate_pivots, solve_exact
from archplace.cli import main
from archplace.hardware.presets import (
    INTER_SERVER_25GBPS_BYTES_PER_S,
    NVLINK2_BW_BYTES_PER_S,
    V100,
    Cluster,
)
from archplace.simulators.pipeline import PipelineProfile, PipelineSetup, allocate_devices, evaluate

GiB = 2.0**30


def _prefix(x) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=float))])


def random_case(seed: int, oom: bool = False):
    """A seeded synthetic profile (8-40 ops, some with no compute, no parameters or nothing at all) on
    2-3 servers of 2-8 GPUs, K in 2-5; ``oom`` scales the activations up so that nothing fits."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 41))
    per = int(rng.choice([2, 4, 8]))
    servers = int(rng.integers(2, 4))
    cluster = Cluster(f"r{servers}x{per}", servers * per, V100, 100e9, "servers", per, 10e9)
    k = min(int(rng.integers(2, 6)), cluster.num_devices)
    setup = PipelineSetup(micro_batch=2, num_micro_batches=int(rng.choice([1, 2, 4, 16])),
                          optimizer=str(rng.choice(["adam", "adafactor"])),
                          recompute=bool(rng.random() < 0.3))
    compute = rng.uniform(0.001, 0.02, n) * rng.choice([1, 1, 5], n)
    params = rng.uniform(0.05, 1.0, n) * GiB * (rng.random(n) < 0.8)
    scale = 20.0 if oom else float(rng.choice([0.5, 1.0, 3.0, 8.0]))
    saved = rng.uniform(0.1, 1.5, n) * GiB * scale
    ckpt = rng.uniform(0.0, 0.3, n) * GiB * scale
    idle = rng.random(n) < 0.1  # ops of nothing: runs of equal prefixes (the pivot collapse)
    compute[idle | (rng.random(n) < 0.05)] = 0.0
    params[idle] = saved[idle] = ckpt[idle] = 0.0
    compute[0] = max(compute[0], 0.001)
    cross = np.r_[0.0, rng.uniform(1e6, 6e8, n - 1), 0.0]
    prof = PipelineProfile(
        model=f"rand{seed}", op_names=np.array([f"op{i}" for i in range(n)], dtype=object),
        op_layers=np.array([""] * n, dtype=object), compute_s_prefix=_prefix(compute),
        param_bytes_prefix=_prefix(params), saved_bytes_prefix=_prefix(saved),
        ckpt_bytes_prefix=_prefix(ckpt),
        trainable_prefix=_prefix(params > 0), cross_bytes=cross, max_layer_saved_bytes=float(saved.max()),
        bytes_per_element=2, setup=setup)
    return prof, cluster, k


def brute_force(prof, cluster, k):
    """Every cut set into k stages that gives each stage a trainable op, and the cost model on all."""
    n, tv = prof.num_ops, prof.trainable_prefix
    rows = [c for c in itertools.combinations(range(1, n), k - 1)
            if all(tv[b] - tv[a] >= 1 for a, b in zip((0, *c), (*c, n)))]
    return np.array(rows, dtype=np.int64).reshape(len(rows), k - 1), evaluate(
        prof, cluster, np.array(rows, dtype=np.int64).reshape(len(rows), k - 1))


# ----------------------------------------------------------------------- 1. the allocation lemma
def test_allocate_devices_is_a_common_shift_of_the_shares():
    """The method rests on this: largest remainder with at least one device each gives every stage
    max(1, floor(q_s − λ)) for one λ, q_s = D · C_s / C_total (generic shares, no ties)."""
    rng = np.random.default_rng(7)
    for _ in range(2000):
        k = int(rng.integers(2, 9))
        d = int(rng.integers(k, 40))
        c = rng.exponential(1.0, k) * rng.choice([1.0, 1.0, 0.01], k)  # some stages of q < 1
        q = d * c / c.sum()
        dv = allocate_devices(c, d)[0]
        # each stage's λ range, (q − d − 1, q − d] (d >= 2) or (q − 2, ∞) (d = 1); they must meet
        lower = np.where(dv >= 2, q - dv - 1.0, q - 2.0)
        upper = np.where(dv >= 2, q - dv, np.inf)
        assert lower.max() < upper.min() and dv.sum() == d


# ------------------------------------------------------------------- 2. against brute force
SEEDS = list(range(16))
OOM_SEEDS = [100, 102, 103]


@functools.cache
def solved(seed: int):
    prof, cluster, k = random_case(seed)
    rows, r = brute_force(prof, cluster, k)
    return prof, cluster, k, rows, r, solve_dp(prof, cluster, k)


@pytest.mark.parametrize("seed", SEEDS)
def test_dp_equals_enumeration_of_every_cut_set(seed):
    prof, cluster, k, rows, r, plan = solved(seed)
    assert plan.optimal and plan.unpruned
    if (~r.oom).any():
        best = float(r.length_s[~r.oom].min())
        assert not plan.oom and plan.length_s == pytest.approx(best, rel=1e-9)
    else:  # nothing fits: the plan with the smallest peak memory, flagged
        assert plan.oom and plan.peak_memory_bytes == pytest.approx(float(r.memory_bytes.max(axis=1).min()),
                                                                    rel=1e-6)
    # the plan is a valid cut set, scored by the cost model itself
    tv, n = prof.trainable_prefix, prof.num_ops
    b = np.r_[0, plan.cuts, n]
    assert len(plan.cuts) == k - 1 and (np.diff(b) > 0).all() and (np.diff(tv[b]) >= 1).all()
    rb = evaluate(prof, cluster, plan.cuts[None, :])
    assert plan.length_s == rb.length_s[0] and plan.devices.tolist() == rb.devices[0].tolist()


def test_the_random_cases_cover_memory_and_allocation_corners():
    """The seeds above include plans that do not fit beside ones that do, optima whose fastest plan does
    not fit, and optima with one-device stages (allocation clamped) and uneven device counts."""
    partly, fastest_oom, clamped, uneven = 0, 0, 0, 0
    for seed in SEEDS:
        *_, r, plan = solved(seed)
        partly += bool(r.oom.any() and (~r.oom).any())
        fastest_oom += bool(r.oom[int(np.argmin(r.length_s))] and (~r.oom).any())
        dv = plan.devices
        clamped += bool((dv == 1).any())
        uneven += len(set(dv.tolist())) > 1
    assert partly >= 3 and fastest_oom >= 1 and clamped >= 3 and uneven >= 5


@pytest.mark.parametrize("seed", OOM_SEEDS)
def test_all_oom_is_reported_with_the_smallest_peak_memory(seed):
    prof, cluster, k = random_case(seed, oom=True)
    rows, r = brute_force(prof, cluster, k)
    assert r.oom.all()
    plan = solve_dp(prof, cluster, k)
    assert plan.oom and not plan.feasible and plan.optimal
    assert plan.peak_memory_bytes == pytest.approx(float(r.memory_bytes.max(axis=1).min()), rel=1e-6)


@pytest.mark.parametrize("seed", [1, 4, 7, 11])
def test_dp_over_candidates_equals_solve_exact(seed):
    """Given the pruned candidate pivots, the DP is the enumeration's optimum (and the unpruned DP is
    never worse)."""
    prof, cluster, k = random_case(seed)
    cand = candidate_pivots(prof, cluster, k, radius=1)
    exact = solve_exact(prof, cluster, cand)
    on_cand = solve_dp(prof, cluster, k, candidates=cand)
    full = solve_dp(prof, cluster, k)
    assert not on_cand.unpruned and on_cand.oom == exact.oom
    if not exact.oom:
        assert on_cand.length_s == pytest.approx(exact.length_s, rel=1e-9)
        assert full.length_s <= exact.length_s * (1 + 1e-12)


def test_one_stage_and_bad_input():
    prof, cluster, _ = random_case(0)
    one = solve_dp(prof, cluster, 1)
    assert one.cuts.tolist() == [] and one.devices.tolist() == [cluster.num_devices]
    with pytest.raises(ValueError, match="stages must be <="):
        solve_dp(prof, cluster, cluster.num_devices + 1)
    with pytest.raises(ValueError, match="positive integer"):
        solve_dp(prof, cluster, 0)
    flat = dataclasses.replace(prof, compute_s_prefix=np.zeros(prof.num_ops + 1))
    with pytest.raises(ValueError, match="no compute"):
        solve_dp(flat, cluster, 2)


# --------------------------------------------------------------------------------- 3. Table 7
MODELS = ("bert-48", "t5-base", "t5-3b", "t5-11b")
# the pruned enumeration's optimum (solve_exact, radius 3) on the 4-stage cases, where it takes 46-270 s
# here; recomputed with solve_exact for the bf16 capture (T5's fp32 layer-norm and softmax upcasts are
# copy kernels; before: 0.38953, 1.87578, 7.12621 for the T5s, bert-48 unchanged; in
# bench/automap/results/pipeline.json: 0.32723, 0.38941, 1.87024, 7.10323); the A and B cases are
# enumerated in
# the test itself
PRUNED_C = {"bert-48": 0.3281244650750115, "t5-base": 0.39180675955704736, "t5-3b": 1.9182044573079307,
            "t5-11b": 7.16863844815895}


@pytest.fixture(scope="module")
def profiles():
    return {m: model_profile(m) for m in MODELS}


@functools.cache
def table7_dp(model: str, name: str):
    cl = cluster_of(name)
    return solve_dp(model_profile(model), cl, cl.num_servers)


def _inside(cuts, cand) -> bool:
    return all(int(c) in set(p.tolist()) for c, p in zip(cuts, cand.per_cut))


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_table7_dp_against_the_pruned_enumeration(profiles, model):
    prof = profiles[model]
    for name in ("A", "B", "C"):
        cl = cluster_of(name)
        k = cl.num_servers
        cand = candidate_pivots(prof, cl, k, radius=3)
        dp = table7_dp(model, name)
        on_cand = solve_dp(prof, cl, k, candidates=cand)
        assert dp.optimal and on_cand.optimal
        if name == "C":
            pruned_l, pruned_oom = PRUNED_C[model], False
        else:
            ex = solve_exact(prof, cl, cand)
            pruned_l, pruned_oom = ex.length_s, ex.oom
        assert on_cand.oom == pruned_oom
        if pruned_oom:  # t5-11b on A: nothing fits, pruned or not
            assert model == "t5-11b" and name == "A"
            assert dp.oom and dp.peak_memory_bytes <= on_cand.peak_memory_bytes * (1 + 1e-9)
            assert dp.peak_memory_bytes > 32 * GiB
            continue
        assert on_cand.length_s == pytest.approx(pruned_l, rel=1e-9)
        assert not dp.oom and dp.length_s <= pruned_l * (1 + 1e-12)
        if _inside(dp.cuts, cand):
            assert dp.length_s == pytest.approx(pruned_l, rel=1e-9)


@pytest.mark.slow
def test_unpruned_optimum_beats_pruning_on_t5_base(profiles):
    """Where the radius-3 window excludes the optimum (t5-base on C; on B too before issue 28's op
    costs, now B's optimum is inside the window) the DP finds it outside."""
    prof = profiles["t5-base"]
    cl = cluster_of("B")
    cand = candidate_pivots(prof, cl, cl.num_servers, radius=3)
    assert table7_dp("t5-base", "B").length_s == pytest.approx(solve_exact(prof, cl, cand).length_s, rel=1e-9)
    for name in ("C",):
        cl = cluster_of(name)
        dp = table7_dp("t5-base", name)
        cand = candidate_pivots(prof, cl, cl.num_servers, radius=3)
        assert not _inside(dp.cuts, cand)
        pruned = PRUNED_C["t5-base"] if name == "C" else solve_exact(prof, cl, cand).length_s
        assert dp.length_s < pruned * 0.97


@pytest.mark.slow
def test_large_unpruned_case_is_no_worse_than_sampled_plans(profiles):
    """64 GPUs, 8 stages: beyond enumeration; the DP's optimum beats 3,000 random plans and the
    server-boundary plan."""
    prof = profiles["bert-48"]
    cl = Cluster("v100x8", 64, V100, NVLINK2_BW_BYTES_PER_S, "servers", 8, INTER_SERVER_25GBPS_BYTES_PER_S)
    dp = solve_dp(prof, cl, 8)
    assert dp.optimal and not dp.oom
    rng = np.random.default_rng(0)
    n = prof.num_ops
    cuts = np.sort(np.array([rng.choice(np.arange(2, n - 1), 7, replace=False) for _ in range(3000)]), axis=1)
    r = evaluate(prof, cl, cuts)
    assert dp.length_s <= r.length_s[~r.oom].min()
    centre = np.searchsorted(64 * prof.compute_s_prefix / prof.compute_s_prefix[-1], 8 * np.arange(1, 8))
    assert dp.length_s <= evaluate(prof, cl, centre[None, :]).length_s[0]


# ------------------------------------------------------------------------- 4. API and command line
def test_dp_is_the_default_and_needs_no_ray():
    req = api.PipelineRequest("bert-48", cluster="A")
    assert req.algo == "dp" and not req.needs_ray and "dp" in api.PIPELINE_ALGOS


def test_cli_pipeline_defaults_to_the_unpruned_dp(capsys, profiles):
    assert main(["pipeline", "bert-48", "--cluster", "B", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    ref = table7_dp("bert-48", "B")
    assert res["algo"] == "dp" and res["gap"] == 0.0 and res["feasible"]
    assert res["length_s"] == res["optimal_length_s"] == pytest.approx(ref.length_s, rel=1e-12)
    assert res["cuts"] == ref.cuts.tolist() == res["optimum"]["cuts"]
    o = res["optimum"]
    assert o["space"] == "all contiguous cut sets (unpruned)" and o["proven_optimal"]
    assert o["evaluated"] > 0 and o["wall_s"] > 0 and res["dp_wall_s"] == o["wall_s"]
    assert main(["pipeline", "bert-48", "--cluster", "B"]) == 0
    out = capsys.readouterr().out
    assert "[dp," in out and "over all contiguous cut sets (unpruned), by dynamic programming in" in out
    assert "device cuts  [8, 16]" in out


def test_cli_pipeline_dp_reports_infeasible(capsys, profiles):
    assert main(["pipeline", "t5-11b", "--cluster", "A"]) == 0
    out = capsys.readouterr().out
    assert "infeasible: no contiguous cut set fits in memory (the smallest peak is" in out
    assert main(["pipeline", "t5-11b", "--cluster", "A", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["oom"] and not res["feasible"] and res["gap"] is None and max(res["memory_gib"]) > 32
