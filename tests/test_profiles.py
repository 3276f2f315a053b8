"""Auto-MAP §10.2 profile transform, §10.3 synthetic profiles: exact values, invariants, seeding, errors."""

from __future__ import annotations

import numpy as np
import pytest

from archplace.workloads.profiles import (
    DISTRIBUTIONS,
    CoarseProfile,
    coarse_indices,
    coarsen,
    draw_raw,
    synthetic_profile,
)

# Hand-computed case, n = 10 ops, G = 4 points.
C = [1, 2, 0, 3, 1, 0, 2, 1, 0, 1]  # prefix: 1 3 3 6 7 7 9 10 10 11
A = [4, 8, 2, 16, 3, 1, 6, 2, 7, 0]
W = [0, 0, 5, 0, 0, 5, 0, 0, 0, 2]  # prefix: 0 0 5 5 5 10 10 10 10 12


def _exactly_one_reaches_one(p: CoarseProfile) -> bool:
    return [p.compute.max() == 1.0, p.activation.max() == 1.0, p.params.max() == 1.0].count(True) == 1


def test_hand_computed_small_case():
    p = coarsen(C, A, W, granularity=4)
    # linspace(0, 9, 4) = [0, 3, 6, 9], already integral
    np.testing.assert_array_equal(p.source_index, [0, 3, 6, 9])
    # C'' = C'[[0,3,6,9]] = [1, 6, 9, 11]; A'' = [4, 16, 6, 0]; W'' = [0, 5, 10, 12]; MAX = 16 (from A)
    assert p.scale == 16.0
    np.testing.assert_array_equal(p.compute, [1 / 16, 6 / 16, 9 / 16, 11 / 16])
    np.testing.assert_array_equal(p.activation, [4 / 16, 1.0, 6 / 16, 0.0])
    np.testing.assert_array_equal(p.params, [0.0, 5 / 16, 10 / 16, 12 / 16])
    assert p.granularity == 4
    assert _exactly_one_reaches_one(p) and p.activation.max() == 1.0
    # one shared scale, not per-array: compute's own max stays below 1
    assert p.compute.max() == 11 / 16


def test_compute_dominated_case_scales_by_total_compute():
    # C'' = [3, 4, 8], A'' = [1, 0, 2], W'' = [0, 1, 2]
    p = coarsen([3, 1, 4], [1, 0, 2], [0, 1, 1], granularity=3)
    assert p.scale == 8.0
    np.testing.assert_array_equal(p.compute, [3 / 8, 4 / 8, 1.0])
    np.testing.assert_array_equal(p.activation, [1 / 8, 0.0, 2 / 8])
    np.testing.assert_array_equal(p.params, [0.0, 1 / 8, 2 / 8])
    np.testing.assert_array_equal(p.source_index, [0, 1, 2])


@pytest.mark.parametrize(("n", "g", "expected"), [
    (10, 4, [0, 3, 6, 9]),
    (6, 4, [0, 2, 3, 5]),  # [0, 1.67, 3.33, 5]
    (6, 3, [0, 2, 5]),  # [0, 2.5, 5]: rint rounds half to even
    (8, 3, [0, 4, 7]),  # [0, 3.5, 7]
    (5, 5, [0, 1, 2, 3, 4]),  # n == G: every op
])
def test_coarse_indices_small(n, g, expected):
    np.testing.assert_array_equal(coarse_indices(n, g), expected)


def test_coarse_indices_default_granularity():
    idx = coarse_indices(1024)
    assert len(idx) == 128
    # k * 1023 / 127 rounded: 8.055 -> 8, 16.11 -> 16, 507.47 -> 507, 515.53 -> 516, 1014.94 -> 1015
    np.testing.assert_array_equal(idx[[0, 1, 2, 63, 64, 126, 127]], [0, 8, 16, 507, 516, 1015, 1023])
    assert np.all(np.diff(idx) >= 1)
    for n in (128, 129, 200, 255, 1000):  # strictly increasing whenever n >= G
        assert np.all(np.diff(coarse_indices(n)) >= 1)


def test_source_index_maps_back_to_original_positions():
    rng = np.random.default_rng(3)
    c, a, w = rng.uniform(size=(3, 300))
    p = coarsen(c, a, w, granularity=16)
    np.testing.assert_allclose(p.compute * p.scale, np.cumsum(c)[p.source_index], rtol=1e-12)
    np.testing.assert_allclose(p.activation * p.scale, a[p.source_index], rtol=1e-12)
    np.testing.assert_allclose(p.params * p.scale, np.cumsum(w)[p.source_index], rtol=1e-12)


@pytest.mark.parametrize("distribution", [*DISTRIBUTIONS, "mixed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_synthetic_invariants(distribution, seed):
    p = synthetic_profile(np.random.default_rng(seed), distribution=distribution)
    assert p.granularity == 128
    for arr in (p.compute, p.activation, p.params):
        assert arr.shape == (128,) and arr.min() >= 0.0 and arr.max() <= 1.0
    assert _exactly_one_reaches_one(p)
    assert np.all(np.diff(p.compute) >= 0) and np.all(np.diff(p.params) >= 0)
    assert max(p.compute[-1], p.params[-1], p.activation.max()) == 1.0  # MAX is a prefix total or an A point
    assert p.source_index[0] == 0 and p.source_index[-1] == 1023


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_synthetic_is_coarsen_of_raw_draws(distribution):
    """Draw order is compute, activation, params; C*[-1] is total compute over MAX."""
    p = synthetic_profile(np.random.default_rng(11), n_ops=500, distribution=distribution, granularity=32)
    rng = np.random.default_rng(11)
    c, a, w = (draw_raw(rng, 500, distribution) for _ in range(3))
    expected = coarsen(c, a, w, granularity=32)
    for field in ("compute", "activation", "params", "source_index"):
        np.testing.assert_array_equal(getattr(p, field), getattr(expected, field))
    assert p.scale == expected.scale
    # np.sum is pairwise, cumsum sequential: equal up to rounding
    assert p.scale == pytest.approx(max(c.sum(), w.sum(), a[p.source_index].max()), rel=1e-12)
    assert p.compute[-1] == pytest.approx(c.sum() / p.scale, rel=1e-12)
    assert p.params[-1] == pytest.approx(w.sum() / p.scale, rel=1e-12)


def test_same_seed_identical_different_seed_differs():
    for distribution in (*DISTRIBUTIONS, "mixed"):
        p1, p2, p3 = (synthetic_profile(np.random.default_rng(s), distribution=distribution)
                      for s in (5, 5, 6))
        for field in ("compute", "activation", "params", "source_index"):
            np.testing.assert_array_equal(getattr(p1, field), getattr(p2, field))
        assert p1.scale == p2.scale
        assert not np.array_equal(p1.compute, p3.compute)
        assert not np.array_equal(p1.activation, p3.activation)


def test_mixed_draws_distributions_per_array():
    """Some seed gives binomial (values on the k/20 grid) activations next to non-binomial ones."""
    grid_hits = []
    for seed in range(20):
        p = synthetic_profile(np.random.default_rng(seed), n_ops=256, distribution="mixed", granularity=256)
        raw = p.activation * p.scale  # pointwise, so the raw draws come back
        grid_hits.append(bool(np.allclose(raw * 20, np.round(raw * 20), atol=1e-9)))
    assert any(grid_hits) and not all(grid_hits)


@pytest.mark.parametrize(("distribution", "mean", "std"), [
    ("uniform", 0.5, (1 / 12) ** 0.5),
    ("normal", 0.5, 0.15),  # clipping at 0.5 +- 3.3 sigma barely changes the std
    ("binomial", 0.3, (0.3 * 0.7 / 20) ** 0.5),
])
def test_raw_draw_moments(distribution, mean, std):
    x = draw_raw(np.random.default_rng(0), 200_000, distribution)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert x.mean() == pytest.approx(mean, abs=0.003)
    assert x.std() == pytest.approx(std, abs=0.003)
    if distribution == "binomial":
        np.testing.assert_array_equal(x * 20, np.round(x * 20))


def test_shared_scale_is_unit_free():
    p1 = coarsen(C, A, W, granularity=4)
    p2 = coarsen(np.multiply(C, 1024.0), np.multiply(A, 1024.0), np.multiply(W, 1024.0), granularity=4)
    assert p2.scale == 1024.0 * p1.scale
    for field in ("compute", "activation", "params"):
        np.testing.assert_array_equal(getattr(p1, field), getattr(p2, field))


def test_profile_is_immutable():
    p = coarsen(C, A, W, granularity=4)
    with pytest.raises(ValueError):
        p.compute[0] = 0.5
    with pytest.raises(AttributeError):
        p.scale = 1.0  # type: ignore[misc]


def test_inputs_not_modified():
    c = np.array(C, dtype=float)
    coarsen(c, A, W, granularity=4)
    np.testing.assert_array_equal(c, C)


def _bad(field: str, value) -> dict:
    kwargs = {"compute_s": C, "activation_bytes": A, "param_bytes": W, "granularity": 4}
    kwargs[field] = value
    return kwargs


@pytest.mark.parametrize(("kwargs", "field"), [
    (_bad("compute_s", [[1.0, 2.0]] * 5), "compute_s"),  # 2-D
    (_bad("compute_s", []), "compute_s"),
    (_bad("compute_s", ["a"] * 10), "compute_s"),
    (_bad("compute_s", [1j] * 10), "compute_s"),
    (_bad("activation_bytes", [np.nan] + A[1:]), "activation_bytes"),
    (_bad("activation_bytes", A[:-1]), "activation_bytes"),  # length mismatch
    (_bad("param_bytes", [np.inf] + W[1:]), "param_bytes"),
    (_bad("param_bytes", [-1.0] + W[1:]), "param_bytes"),
    (_bad("param_bytes", W + [0]), "param_bytes"),  # length mismatch
    (_bad("granularity", 11), "granularity"),  # > n
    ({"compute_s": [1.0], "activation_bytes": [1.0], "param_bytes": [1.0]}, "granularity"),  # n = 1
    (_bad("granularity", 1), "granularity"),
    (_bad("granularity", 2.5), "granularity"),
    (_bad("granularity", True), "granularity"),
    ({"compute_s": [0.0] * 10, "activation_bytes": [0.0] * 10, "param_bytes": [0.0] * 10, "granularity": 4},
     "MAX"),
])
def test_coarsen_bad_inputs(kwargs, field):
    with pytest.raises(ValueError, match=field):
        coarsen(**kwargs)


def test_granularity_error_names_allowed_range():
    msg = r"granularity is 11, must be an int in \[2, 10\] \(at most the number of ops\)"
    with pytest.raises(ValueError, match=msg):
        coarsen(C, A, W, granularity=11)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"distribution": "poisson"},
     r"distribution is 'poisson', must be one of \['binomial', 'mixed', 'normal', 'uniform'\]"),
    ({"n_ops": 100}, "n_ops"),  # < granularity 128
    ({"n_ops": 0, "granularity": 2}, "n_ops"),
    ({"n_ops": 64.0, "granularity": 2}, "n_ops"),
    ({"granularity": 0}, "granularity"),
])
def test_synthetic_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_profile(np.random.default_rng(0), **kwargs)


def test_draw_unknown_distribution_lists_allowed():
    with pytest.raises(ValueError, match=r"must be one of \['binomial', 'normal', 'uniform'\]"):
        draw_raw(np.random.default_rng(0), 4, "mixed")


def test_synthetic_rejects_seed_instead_of_generator():
    with pytest.raises(TypeError, match="rng"):
        synthetic_profile(0)  # type: ignore[arg-type]


def test_no_heavy_imports():
    import subprocess
    import sys

    code = ("import sys, archplace.workloads.profiles; "
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
