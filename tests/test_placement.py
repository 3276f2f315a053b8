"""Phaze placement DP against brute force and hand-computed cases."""

import itertools
import math

import numpy as np
import pytest

from archplace.algorithms.solvers.placement import (
    PlacementLayers,
    TrainingSetup,
    best_placement,
    downsets,
    expert_placement,
    place,
    stage_cost,
)


def random_layers(rng, L, t, skip=True, tp_prob=0.7):
    src, dst = list(range(L - 1)), list(range(1, L))
    if skip:
        for _ in range(L // 2):
            u = int(rng.integers(0, L - 1))
            v = int(rng.integers(u + 1, L))
            if (u, v) not in set(zip(src, dst)):
                src.append(u)
                dst.append(v)
    return PlacementLayers(t, rng.uniform(1, 5, L), rng.uniform(2, 10, L), rng.uniform(1, 4, L) * 1e9,
                           rng.uniform(0, 2, L) * 1e9, rng.uniform(1, 3, L) * 1e9, rng.random(L) < tp_prob,
                           np.array(src), np.array(dst), rng.uniform(0, 3, len(src)) * 1e9,
                           tuple(f"l{i}" for i in range(L)))


def brute_force(ly, setup, fixed=None):
    """Every contiguous partition, every d: the time per batch of the best."""
    L, t = ly.num_layers, ly.tmp
    K, B = setup.num_devices, setup.microbatches
    best = math.inf
    for s in range(1, L + 1):
        if fixed and s != fixed[0]:
            continue
        for cuts in itertools.combinations(range(1, L), s - 1):
            bounds = list(zip((0, *cuts), (*cuts, L)))
            loads, devices, ok = [], 0, True
            for pos, (a, b) in enumerate(bounds):
                c = stage_cost(ly, setup, list(range(a, b)))
                from_end = s - pos
                if c["const"] + (from_end - 1) * c["stash"] > setup.hbm_bytes:
                    ok = False
                    break
                loads.append(c["recompute"] if (setup.recompute and from_end > 1) else c["plain"])
                devices += 1 if (c["single"] and t > 1) else t
            if not ok:
                continue
            w0 = stage_cost(ly, setup, list(range(*bounds[0])))["weights"]
            for d in range(1, min(K // devices, B) + 1):
                if fixed and d != fixed[1]:
                    continue
                F = (math.ceil(B / d) + s - 1) * max(loads) + 4 * (d - 1) / d * w0 / setup.bandwidth
                best = min(best, F)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force_on_random_layer_graphs(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(2, 8))
    t = int(rng.choice([1, 2, 4]))
    ly = random_layers(rng, L, t)
    setup = TrainingSetup(int(rng.choice([4, 8, 16, 32])), int(rng.choice([16, 64])), 2,
                          float(rng.uniform(8e9, 40e9)), bool(rng.random() < 0.5), 4e9)
    bf = brute_force(ly, setup)
    res = place(ly, setup)
    gen = place(ly, setup, general=True)
    if math.isinf(bf):
        assert not res.feasible and not gen.feasible and res.reason
        return
    assert res.feasible and res.time_per_batch_s == pytest.approx(bf, rel=1e-9)
    assert gen.time_per_batch_s == pytest.approx(bf, rel=1e-9)
    # the reported placement is self-consistent
    assert res.p == len(res.stages) and res.d * sum(s.devices for s in res.stages) <= setup.num_devices
    assert [s.first for s in res.stages] == [0] + [s.last + 1 for s in res.stages[:-1]]
    assert res.stages[-1].last == L - 1
    assert all(s.memory_bytes <= setup.hbm_bytes for s in res.stages)
    assert res.throughput == pytest.approx(setup.global_batch / res.time_per_batch_s)


@pytest.mark.parametrize("seed", range(10))
def test_fixed_strategy_equals_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    ly = random_layers(rng, 6, 2)
    setup = TrainingSetup(32, 64, 1, 30e9, False, 4e9)
    p, d = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    bf = brute_force(ly, setup, fixed=(p, d))
    res = place(ly, setup, fixed=(p, d))
    if math.isinf(bf):
        assert not res.feasible
    else:
        assert (res.p, res.d) == (p, d) and res.time_per_batch_s == pytest.approx(bf, rel=1e-9)


def test_general_dp_on_a_branchy_dag_equals_chain_enumeration():
    """A diamond layer graph (0 -> {1, 2} -> 3): the explicit downset DP against all chains of
    downsets."""
    ly = PlacementLayers(1, np.array([1.0, 3.0, 2.0, 1.0]), np.array([2.0, 6.0, 4.0, 2.0]),
                         np.full(4, 1e9), np.zeros(4), np.full(4, 1e9), np.ones(4, bool),
                         np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3]), np.full(4, 4e8),
                         ("a", "b", "c", "d"))
    assert sorted(bin(d).count("1") for d in downsets(4, ly.edge_src, ly.edge_dst)) == [0, 1, 2, 2, 3, 4]
    setup = TrainingSetup(4, 8, 1, 100e9, False, 4e9)
    res = place(ly, setup)
    best = math.inf
    ds = downsets(4, ly.edge_src, ly.edge_dst)
    for s in range(1, 5):  # chains 0 = D_0 < D_1 < ... < D_s = V, the first stage is V \\ D_{s-1}
        for chain in itertools.combinations([d for d in ds if d not in (0, 15)], s - 1):
            chain = sorted(chain, key=lambda x: bin(x).count("1"))
            seq = [0, *chain, 15]
            if any(a & ~b for a, b in zip(seq, seq[1:])):
                continue
            stages = [[u for u in range(4) if (b & ~a) >> u & 1] for a, b in zip(seq, seq[1:])][::-1]
            loads = [stage_cost(ly, setup, st)["plain"] for st in stages]
            w0 = stage_cost(ly, setup, stages[0])["weights"]
            for d in range(1, 4 // s + 1):
                F = (math.ceil(8 / d) + s - 1) * max(loads) + 4 * (d - 1) / d * w0 / 4e9
                best = min(best, F)
    assert res.time_per_batch_s == pytest.approx(best, rel=1e-12)
    assert sorted(n for st in res.stages for n in st.layers) == ["a", "b", "c", "d"]


def test_hand_computed_two_layer_pipeline():
    """Two equal layers, 2 devices, no memory pressure: one pipeline of 2 stages vs 2 data-parallel
    copies; transfers and the gradient AllReduce decide."""
    ly = PlacementLayers(1, np.array([1.0, 1.0]), np.array([2.0, 2.0]), np.array([4e9, 4e9]),
                         np.zeros(2), np.ones(2), np.ones(2, bool), np.array([0]), np.array([1]),
                         np.array([4e9]))
    setup = TrainingSetup(2, 8, 1, 1e12, False, 4e9)  # B = 8 microbatches, 1 s per 4 GB transfer
    # p=2, d=1: stage loads: first = fw 1 + (bw waits 1 s for the gradient) 1 + 2 = 4; last = 1 + 1 + 2 = 4
    # F = (8 + 1) · 4 = 36.   p=1, d=2: load 6, F = 4·6 + 4·(1/2)·8e9/4e9 = 28.  p=1, d=1: 8·6 = 48.
    assert place(ly, setup, fixed=(2, 1)).time_per_batch_s == pytest.approx(36.0)
    assert place(ly, setup, fixed=(1, 2)).time_per_batch_s == pytest.approx(28.0)
    best = place(ly, setup)
    assert (best.p, best.d, best.time_per_batch_s) == (1, 2, pytest.approx(28.0))


def test_memory_decides_recompute_and_infeasibility():
    L = 4
    ly = PlacementLayers(1, np.ones(L), 2 * np.ones(L), np.full(L, 1e9), np.zeros(L), np.full(L, 4e9),
                         np.ones(L, bool), np.arange(L - 1), np.arange(1, L), np.full(L - 1, 1e8))
    # a 4-stage pipeline: with stashing the first stage keeps 3 more microbatches: 2+4 + 3·4 = 18 GB
    stash = place(ly, TrainingSetup(4, 16, 1, 10e9, False, 4e9), fixed=(4, 1))
    rec = place(ly, TrainingSetup(4, 16, 1, 10e9, True, 4e9), fixed=(4, 1))
    assert not stash.feasible and rec.feasible
    # recompute stashes only a stage's input: none for the first, 2 microbatches of 0.1 GB for the second
    assert rec.stages[0].memory_bytes == pytest.approx(2e9 + 4e9)
    assert rec.stages[1].memory_bytes == pytest.approx(2e9 + 4e9 + 2 * 1e8)
    nothing = place(ly, TrainingSetup(4, 16, 1, 5e9, True, 4e9))
    assert not nothing.feasible and "alone needs 5.59 GiB" in nothing.reason


def test_best_placement_chooses_the_tmp_width():
    rng = np.random.default_rng(7)
    base = random_layers(rng, 6, 1, skip=False)
    halved = PlacementLayers(2, base.forward_s / 1.9, base.backward_s / 1.9, base.weight_bytes / 2,
                             base.optimizer_bytes / 2, base.activation_bytes / 2, np.ones(6, bool),
                             base.edge_src, base.edge_dst, base.edge_bytes)
    setup = TrainingSetup(8, 8, 1, 6e9, False, 4e9)
    best = best_placement({1: base, 2: halved}, setup)
    each = [place(base, setup), place(halved, setup)]
    assert best.time_per_batch_s == min(p.time_per_batch_s for p in each)
    assert best_placement([base, halved], setup, fixed=(2, 2, 2)).t == 2


def test_bad_inputs():
    with pytest.raises(ValueError, match="field 'global_batch' must be a positive integer"):
        TrainingSetup(8, 0, 1, 1e9, False, 1e9)
    with pytest.raises(ValueError, match="not a multiple of microbatch 3"):
        TrainingSetup(8, 16, 3, 1e9, False, 1e9)
    with pytest.raises(ValueError, match="field 'backward_s' has 1 entries"):
        PlacementLayers(1, np.ones(2), np.ones(1), np.ones(2), np.ones(2), np.ones(2), np.ones(2, bool),
                        np.array([0]), np.array([1]), np.array([1.0]))
    with pytest.raises(ValueError, match="earlier to a later layer"):
        PlacementLayers(1, np.ones(2), np.ones(2), np.ones(2), np.ones(2), np.ones(2), np.ones(2, bool),
                        np.array([1]), np.array([0]), np.array([1.0]))


def test_expert_placement_splits_blocks_evenly_and_never_beats_the_dp():
    L = 10  # embed, 8 blocks, head
    names = ("embed", *(f"h.{i}" for i in range(8)), "head")
    rng = np.random.default_rng(3)
    ly = PlacementLayers(2, rng.uniform(1, 2, L), rng.uniform(2, 4, L), np.full(L, 1e8), np.zeros(L),
                         np.full(L, 1e8), np.array([False] + [True] * 8 + [False]), np.arange(L - 1),
                         np.arange(1, L), np.full(L - 1, 1e7), names)
    setup = TrainingSetup(64, 64, 1, 80e9, False, 4e9)
    ex = expert_placement(ly, setup, 4, 4)
    assert ex.feasible and [(s.first, s.last) for s in ex.stages] == [(0, 2), (3, 4), (5, 6), (7, 9)]
    direct = brute_force_fixed_split(ly, setup, [(0, 3), (3, 5), (5, 7), (7, 10)], 4)
    assert ex.time_per_batch_s == pytest.approx(direct)
    assert place(ly, setup, fixed=(4, 4)).time_per_batch_s <= ex.time_per_batch_s + 1e-12
    assert not expert_placement(ly, setup, 9, 1).feasible  # more stages than blocks


def brute_force_fixed_split(ly, setup, bounds, d):
    s = len(bounds)
    loads = [stage_cost(ly, setup, list(range(a, b)))["plain"] for a, b in bounds]
    w0 = stage_cost(ly, setup, list(range(*bounds[0])))["weights"]
    return (math.ceil(setup.microbatches / d) + s - 1) * max(loads) + 4 * (d - 1) / d * w0 / setup.bandwidth
