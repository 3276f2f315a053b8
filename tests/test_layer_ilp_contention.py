"""Shared HBM / GLB bandwidth in the layer-schedule ILP (issue 19, item 4; ``layer_ilp.contention``).

(a)-(d) hand-computed instances (values derived in the comments) for every method; (e) CP-SAT equals
the exhaustive enumeration on 20 seeded random tiny DAGs with random shares (the bandwidth binds, i.e.
raises the optimum, on 16 of them; 3 have a zero-length op); (f) HiGHS equals CP-SAT on them; (g) a
real bert-large backward slice; (h) the shares of the latency model; (i) the CLI's ``--no-contention``
reaches the solver.
"""

import json

import numpy as np
import pytest

from archplace.algorithms.solvers import layer_ilp as L
from archplace.algorithms.solvers.layer_ilp import (
    LayerProblem,
    check_schedule,
    exhaustive_schedule,
    greedy_schedule,
    peak_shares,
    solve_layer,
)

REL = 1e-6


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b)) + 1e-12


def all_methods(p: LayerProblem):
    """(name, schedule) of every exact method; each schedule is checked (capacity included)."""
    out = [("exhaustive", exhaustive_schedule(p)),
           ("cpsat", solve_layer(p, backend="cpsat", cache=False, num_workers=2)),
           ("milp", solve_layer(p, backend="milp", cache=False))]
    for _, s in out:
        check_schedule(p, s)
    return out


def two_ops(hbm=None, glb=None) -> LayerProblem:
    # two independent TC ops on 2 TCs (1 VC): ℓ = (1.0, 2.0), ℓ̂ = (0.8, 1.5)
    return LayerProblem([0, 0], [1.0, 2.0], [0.8, 1.5], [], [], 2, 1, hbm_share=hbm, glb_share=glb)


# ---------------------------------------------------------------- (a)-(d) hand-computed

def test_a_two_ops_over_the_hbm_bandwidth_serialise():
    # no shares: both on their own TC at once, makespan max(ℓ1, ℓ2) = 2.0 (all intra: 0.8 + 1.5 = 2.3)
    for name, s in all_methods(two_ops()):
        assert close(s.makespan_s, 2.0), name
    # shares 0.6 + 0.6 > 1: they cannot overlap; serially each in its faster mode:
    # min(1.0, 0.8) + min(2.0, 1.5) = 0.8 + 1.5 = 2.3 (both intra-op)
    p = two_ops(hbm=[0.6, 0.6])
    for name, s in all_methods(p):
        assert close(s.makespan_s, 2.3), name
        assert s.peak_hbm_share <= 1.0 and np.isnan(s.peak_glb_share)
    g = greedy_schedule(p)
    check_schedule(p, g)
    assert g.makespan_s >= 2.3 - 1e-12


def test_b_shares_that_fit_overlap_as_before():
    # 0.4 + 0.4 = 0.8 <= 1: the paper's optimum 2.0 stands, with a peak HBM share of 0.8
    for name, s in all_methods(two_ops(hbm=[0.4, 0.4])):
        assert close(s.makespan_s, 2.0), name
        assert s.peak_hbm_share == pytest.approx(0.8)


def test_c_three_ops_at_most_two_at_a_time():
    # three independent TC ops, 3 TCs, ℓ = 1, ℓ̂ = 0.9, HBM share 0.4 each: any two fit (0.8), all
    # three do not (1.2). Without shares: 1.0 (all at once). With them: all single-core needs 2.0
    # (sorted by start, the third must start after the first ends: s3 >= s1 + 1, so the makespan is
    # >= 2); two single-core at once [0, 1) plus the third intra-op for 0.9 gives 1.9; more intra-op
    # ops cost more (2.8, 2.7). Optimum 1.9.
    base = dict(kind=[0, 0, 0], latency_s=[1.0] * 3, intra_latency_s=[0.9] * 3, edge_src=[], edge_dst=[],
                num_tc=3, num_vc=1)
    for name, s in all_methods(LayerProblem(**base)):
        assert close(s.makespan_s, 1.0), name
    p = LayerProblem(**base, hbm_share=[0.4] * 3)
    for name, s in all_methods(p):
        assert close(s.makespan_s, 1.9), name
        assert s.intra.sum() == 1 and s.peak_hbm_share == pytest.approx(0.8)


def test_d_glb_only_contention():
    # the GLB alone over-subscribed (0.6 + 0.6), the HBM not (0.3 + 0.3): serial, 2.3 as in (a)
    for name, s in all_methods(two_ops(glb=[0.6, 0.6])):
        assert close(s.makespan_s, 2.3), name
        assert np.isnan(s.peak_hbm_share) and s.peak_glb_share <= 1.0
    for name, s in all_methods(two_ops(hbm=[0.3, 0.3], glb=[0.6, 0.6])):
        assert close(s.makespan_s, 2.3), name
    # GLB 0.5 + 0.5 = 1 fits exactly: 2.0 again
    for name, s in all_methods(two_ops(glb=[0.5, 0.5])):
        assert close(s.makespan_s, 2.0), name
        assert s.peak_glb_share == pytest.approx(1.0)


def test_validation_and_cache_key():
    with pytest.raises(ValueError, match="hbm_share has shape"):
        two_ops(hbm=[0.5])
    with pytest.raises(ValueError, match=r"op 1: glb_share is 1.5, must be a finite number in \[0, 1\]"):
        two_ops(glb=[0.5, 1.5])
    with pytest.raises(ValueError, match="hbm_share is nan"):
        two_ops(hbm=[float("nan"), 0.1])
    plain, shared = two_ops(), two_ops(hbm=[0.6, 0.6])
    assert L.schedule_cache_key(plain) != L.schedule_cache_key(shared)
    assert L.schedule_cache_key(plain) == L.schedule_cache_key(shared, contention=False)
    assert L.schedule_cache_key(shared) != L.schedule_cache_key(two_ops(glb=[0.6, 0.6]))
    # contention=False solves the paper's model
    s = solve_layer(shared, cache=False, contention=False)
    assert close(s.makespan_s, 2.0) and peak_shares(shared, s)["hbm"] == pytest.approx(1.2)


def test_checker_rejects_an_over_subscribed_schedule():
    p = two_ops(hbm=[0.6, 0.6])
    s = solve_layer(p.without_contention(), cache=False)  # both at t = 0 on their own cores
    with pytest.raises(ValueError, match="draw more than the whole HBM bandwidth"):
        check_schedule(p, s)


# ---------------------------------------------------------------- (e)/(f) random cross-check

def rand_problem(seed: int) -> LayerProblem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    kind = rng.integers(0, 3, n)
    lat = rng.uniform(0.1, 10, n).round(3)
    lat_hat = lat * rng.choice([0.3, 0.6, 1.0, 1.5], n) * rng.uniform(0.8, 1.2, n)
    if rng.random() < 0.2:  # a zero-length op runs at no instant and draws nothing
        lat[rng.integers(n)] = 0.0
    p = rng.uniform(0.0, 0.4)
    src, dst = [], []
    for j in range(n):
        for i in range(j):
            if rng.random() < p:
                src.append(i)
                dst.append(j)
    hbm = rng.choice([0.0, 0.2, 0.35, 0.5, 0.6, 0.8, 1.0], n)
    glb = rng.choice([0.0, 0.1, 0.3, 0.45, 0.7], n) if rng.random() < 0.5 else None
    return LayerProblem(kind, lat, lat_hat, src, dst, int(rng.integers(1, 4)), int(rng.integers(1, 4)),
                        hbm_share=hbm, glb_share=glb)


@pytest.mark.parametrize("seed", range(20))
def test_e_f_cpsat_milp_and_exhaustive_agree(seed):
    p = rand_problem(seed)
    ref = exhaustive_schedule(p)
    check_schedule(p, ref)
    free = exhaustive_schedule(p.without_contention())
    assert ref.makespan_s >= free.makespan_s - 1e-9  # contention never helps
    for backend in ("cpsat", "milp"):
        s = solve_layer(p, backend=backend, cache=False, num_workers=2)
        check_schedule(p, s)
        assert s.status in ("optimal", "trivial"), backend
        assert close(s.makespan_s, ref.makespan_s), (backend, s.makespan_s, ref.makespan_s)
    if seed < 5:  # the full model at once (no lazy rounds, no series decomposition)
        s = solve_layer(p, cache=False, num_workers=2, lazy=False, decompose=False)
        check_schedule(p, s)
        assert close(s.makespan_s, ref.makespan_s)
    g = greedy_schedule(p)
    check_schedule(p, g)
    assert g.makespan_s >= ref.makespan_s - 1e-9


# ---------------------------------------------------------------- (g) a real slice

def test_g_bert_large_backward_slice():
    from archplace.hardware.accelerator import Accelerator
    from archplace.simulators.estimate import estimate_graph
    from archplace.workloads.models import build_graph

    acc = Accelerator(2, 512, 256, 256, 256, 32.0, hbm_gb=64.0)  # Phaze-Common
    g = build_graph("bert-large", mbs=1, tmp=1)
    est = estimate_graph(g, acc)
    probs = L.layer_problems(g, est.single_s, est.all_s, acc.num_tc, acc.num_vc, est.hbm_share, est.glb_share)
    p = probs["backward"][1]  # encoder.layer.0's backward slice
    assert p.has_contention and p.num_ops > 8
    free = solve_layer(p, time_limit_s=10.0, cache=False, contention=False)
    shared = solve_layer(p, time_limit_s=10.0, cache=False)
    check_schedule(p, shared)
    assert shared.peak_hbm_share <= 1.0 + 1e-9 and shared.peak_glb_share <= 1.0 + 1e-9
    assert shared.makespan_s >= free.makespan_s * (1 - 1e-9)
    assert np.isnan(free.peak_hbm_share)  # solved without shares ...
    assert peak_shares(p, free)["hbm"] > 1.0  # ... it over-subscribes the HBM (the finding)


# ---------------------------------------------------------------- (h) the shares of the latency model

def test_h_shares_in_unit_interval_and_gemm_closed_form():
    from archplace.hardware.accelerator import Accelerator
    from archplace.simulators.estimate import estimate_graph
    from archplace.simulators.latency import (
        ArchArrays,
        UniqueOps,
        bandwidth_shares,
        estimate_latencies,
        latency_components,
    )
    from archplace.workloads.models import build_graph

    acc = Accelerator(2, 512, 256, 256, 256, 32.0, hbm_gb=64.0)
    g = build_graph("bert-large", mbs=1, tmp=2)  # with TMP AllReduces
    est = estimate_graph(g, acc)
    for a in (est.hbm_share, est.glb_share):
        assert a.shape == (g.num_nodes,) and (a >= 0).all() and (a <= 1).all()
    shape_only = g.nodes["core"] == "none"
    assert (est.hbm_share[shape_only] == 0).all() and (est.glb_share[shape_only] == 0).all()
    tab = estimate_latencies(g, [acc])
    hbm, glb = tab.shares_for_arch(0)
    np.testing.assert_allclose(hbm, est.hbm_share)
    np.testing.assert_allclose(glb, est.glb_share)
    # one GEMM (b, m, n, k) = (1, 512, 1024, 1024), 2-byte words, on one 256x256 core at 1.05 GHz:
    # 4x4 = 16 weight tiles of max(512, 256) rows + fill 511: 8703 cycles; ℓ = (8703 + 100 launch)
    # cycles = 8803 / 1.05e9 s. HBM bytes (512·1024 + 1024·1024 + 512·1024)·2 = 4,194,304 (fits the
    # 32 MiB GLB: no spill) at 1.2e12 B/s: hbm_share = 4194304/1.2e12 / (8803/1.05e9) = 0.416905.
    # GLB words 512·1024·ceil(1024/256) + 1024·1024 + 512·1024 = 3,670,016 over the whole GLB's
    # 4096 words/cycle: glb_share = 3670016 / (4096 · 8803) = 0.101784.
    moved = (512 * 1024 + 1024 * 1024 + 512 * 1024) * 2.0
    ops = UniqueOps(core=np.array([1.0]), b=np.array([1.0]), m=np.array([512.0]), n=np.array([1024.0]),
                    k=np.array([1024.0]), vector_flops=np.zeros(1), hbm_bytes=np.array([moved]),
                    inverse=np.zeros(1, dtype=np.int64))
    arch = ArchArrays.from_accelerators([acc])
    comp = latency_components(arch, ops, 1.0, 1, all_cores=False)
    assert comp["latency_s"][0, 0] == pytest.approx(8803 / 1.05e9)
    assert comp["glb_words"][0, 0] == 3_670_016
    h, gl = bandwidth_shares(arch, comp)
    assert h[0, 0] == pytest.approx(4194304 / 1.2e12 / (8803 / 1.05e9))
    assert h[0, 0] == pytest.approx(0.416905, abs=1e-6)
    assert gl[0, 0] == pytest.approx(3670016 / (4096 * 8803))
    assert gl[0, 0] == pytest.approx(0.101784, abs=1e-6)


# ---------------------------------------------------------------- (i) the CLI flag

@pytest.mark.parametrize("flag", [False, True])
def test_i_no_contention_flag_reaches_the_solver(capsys, monkeypatch, flag):
    from archplace import cli
    from archplace.algorithms.solvers.layer_ilp import planning

    seen = []

    def fake_solve(problem, **kw):  # records what the solver got; answers with the sequential schedule
        seen.append((kw.get("contention"), problem.has_contention))
        return L.sequential_schedule(problem)

    monkeypatch.setattr(planning, "solve_layer", fake_solve)
    argv = ["place", "bert-base", "--arch", "tpuv4", "--accelerators", "8", "--global-batch", "8",
            "--seq", "128", "--hbm", "32", "--fixed", "1,8,1", "--json"]
    argv += ["--no-contention"] if flag else []
    assert cli.main(argv) == 0
    json.loads(capsys.readouterr().out)
    assert seen and all(s == (False, False) if flag else s == (True, True) for s in seen)
