"""Architecture searchers: Phaze's generator and hysteresis rule, and the Ray Tune searchers (called
directly, no Ray cluster)."""

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import yaml
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.search.optuna import OptunaSearch

from archplace.algorithms.search import PhazeGenerator, area_buckets
from archplace.algorithms.search.tune_searchers import (
    GridSearcher,
    PhazeSearcher,
    RandomSearcher,
    make_searcher,
    nearest_index,
    optuna_space,
)
from archplace.hardware.space import ARCH_FIELDS, enumerate_space

M = "throughput_avg"
TPUV4 = {"num_tc": 8, "num_vc": 2, "pe_x": 128, "pe_y": 128, "glb_mb": 128}


@pytest.fixture(scope="module")
def small_path(tmp_path_factory):
    """16 architectures, all feasible, in 9 buckets of 0.01 mm² (several of two or more)."""
    p = tmp_path_factory.mktemp("space") / "small.yaml"
    p.write_text(yaml.safe_dump({
        "architecture": {"num_tc": {"pow2": [0, 1]}, "num_vc": {"pow2": [0, 1]}, "pe_x": {"pow2": [1, 2]},
                         "pe_y": {"pow2": [1, 1]}, "glb_mb": {"pow2": [1, 2]}},
        "constraints": {"area_max_preset": "tpuv4", "area_min_fraction": 0.0}}))
    return str(p)


def ready(searcher):
    searcher.set_search_properties(M, "max", {})
    return searcher


def fields(space, i):
    return tuple(float(getattr(space, f)[i]) for f in ARCH_FIELDS)


def run_generator(gen, values):
    """Sequential Algorithm 1: suggest, evaluate, observe until the generator stops."""
    seen = []
    while (i := gen.next_index()) is not None:
        seen.append(i)
        gen.observe(i, values[i])
    return seen


def run_searcher(s, value_of, start=0):
    """Sequential Tune loop; returns the suggested indices."""
    seen = []
    for t in itertools.count(start):
        cfg = s.suggest(f"t{t}")
        if cfg == Searcher.FINISHED:
            return seen
        seen.append(cfg["arch"])
        s.on_trial_complete(f"t{t}", {M: value_of(cfg["arch"])})


# --- PhazeGenerator: the hysteresis rule ---------------------------------------------------------

DISTINCT = [10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0]  # one bucket per index


@pytest.mark.parametrize("h, values, stop", [
    # h=2: maxima 1,2,3 (last two increasing) then 1,2,3,2 -> last two [3,2] non-increasing
    (2, [1, 2, 3, 2, 1, 0, 0, 0], 3),
    # equal maxima count as non-increasing; but not before more than h buckets are closed
    (2, [5, 5, 5, 5, 5, 5, 5, 5], 2),
    # h=3: last three 3,2,4 / 2,4,3 fail, 4,3,2 succeeds at index 5
    (3, [1, 3, 2, 4, 3, 2, 1, 0], 5),
    (3, [4, 3, 2, 1, 0, 0, 0, 0], 3),
    (1, [1, 2, 3, 4, 5, 6, 7, 8], 1),  # hysteresis 1 stops after the second bucket (TPUv4 wins)
])
def test_hysteresis_stops_exactly_when_the_last_maxima_become_non_increasing(h, values, stop):
    gen = PhazeGenerator(np.array(DISTINCT), hysteresis=h)
    seen = []
    while (i := gen.next_index()) is not None:
        assert not gen.converged  # not earlier
        seen.append(i)
        gen.observe(i, values[i])
    assert seen == list(range(stop + 1))
    assert gen.converged and gen.converged_bucket == stop
    assert gen.bucket_maxima == [float(v) for v in values[:stop + 1]]
    assert gen.best_value == max(values[:stop + 1])
    assert gen.best_index == int(np.argmax(values[:stop + 1]))  # ties: the larger area


def test_never_non_increasing_exhausts_the_space():
    gen = PhazeGenerator(np.array(DISTINCT), hysteresis=2)
    assert run_generator(gen, list(range(8))) == list(range(8))
    assert not gen.converged and gen.exhausted and gen.next_index() is None
    assert gen.best_index == 7


def test_buckets_group_areas_within_001_mm2():
    areas = np.array([1.005, 1.001, 0.995, 0.991, 0.985, 0.981, 0.975])
    assert area_buckets(areas, 0.01).tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert area_buckets(areas, 0).tolist() == list(range(7))  # exact areas
    # 0.03 / 0.01 is 2.9999999999999996 in floating point; it still goes to bucket 3, not 2
    assert area_buckets(np.array([0.03, 0.0299999, 0.02]), 0.01).tolist() == [0, 1, 1]

    gen = PhazeGenerator(np.array([2.004, 2.001, 1.5, 1.4]), hysteresis=1)
    assert gen.num_buckets == 3
    gen.observe(gen.next_index(), 1.0)
    assert gen.bucket_maxima == []  # index 1 shares the bucket: not closed yet
    gen.observe(gen.next_index(), 3.0)
    assert gen.bucket_maxima == [3.0] and not gen.converged
    gen.observe(gen.next_index(), 2.0)
    assert gen.bucket_maxima == [3.0, 2.0] and gen.converged and gen.next_index() is None
    # exact areas: the same values now make three buckets and stop one index earlier
    gen = PhazeGenerator(np.array([2.004, 2.001, 1.5, 1.4]), hysteresis=1, area_bucket_mm2=0)
    assert run_generator(gen, [1.0, 3.0, 2.0, 0.0]) == [0, 1] and gen.bucket_maxima == [1.0, 3.0]


def test_bucket_maximum_decides_within_a_bucket():
    # buckets {0,1}, {2,3}, {4}, {5}; h=2. Maxima 5, 4 -> not yet (2 buckets), then 6 -> [4,6] no,
    # then 1 -> [6,1] yes
    areas = np.array([1.005, 1.001, 0.995, 0.991, 0.5, 0.4, 0.3])
    gen = PhazeGenerator(areas, hysteresis=2)
    assert run_generator(gen, [1, 5, 4, 0, 6, 1, 9]) == [0, 1, 2, 3, 4, 5]
    assert gen.bucket_maxima == [5.0, 4.0, 6.0, 1.0] and gen.best_index == 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(hysteresis=0), "hysteresis"),
    (dict(hysteresis=1.5), "hysteresis"),
    (dict(hysteresis=True), "hysteresis"),
    (dict(area_bucket_mm2=-0.01), "area_bucket_mm2"),
    (dict(area_bucket_mm2=float("nan")), "area_bucket_mm2"),
    (dict(areas_mm2=np.array([1.0, 2.0])), r"areas_mm2 must be non-increasing.*areas_mm2\[0\] = 1.0"),
    (dict(areas_mm2=np.array([])), "areas_mm2 must be a non-empty 1-D array"),
])
def test_generator_validates_arguments(kwargs, match):
    args = dict(areas_mm2=np.array([3.0, 2.0, 1.0])) | kwargs
    with pytest.raises(ValueError, match=match):
        PhazeGenerator(**args)


def test_generator_rejects_bad_observations():
    gen = PhazeGenerator(np.array([3.0, 2.0]))
    for bad in (-1, 2, 1.0, True):
        with pytest.raises(ValueError, match="index must be an integer in"):
            gen.observe(bad, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        gen.observe(0, float("nan"))


def test_phaze_module_does_not_import_ray():
    code = ("import sys; import archplace.algorithms.search as s; s.PhazeGenerator([2.0, 1.0]); "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- PhazeSearcher ---------------------------------------------------------------------------------

def test_phaze_suggests_decreasing_area_from_tpuv4():
    space = enumerate_space()
    s = ready(PhazeSearcher())
    cfgs = [s.suggest(f"t{t}") for t in range(200)]
    assert cfgs == [{"arch": i} for i in range(200)]
    assert dict(zip(ARCH_FIELDS, fields(space, 0))) == TPUV4
    assert space.area_mm2[0] == space.area_mm2.max()
    assert np.all(np.diff(space.area_mm2[:200]) <= 0)


def test_phaze_out_of_order_completions_with_concurrent_trials():
    s = ready(PhazeSearcher(hysteresis=2))
    s.generator = PhazeGenerator(np.array(DISTINCT), hysteresis=2)  # 8 single-index buckets
    values = [1, 2, 3, 2, 1, 0, 0, 0]
    ids = {i: f"t{i}" for i in range(5)}
    assert [s.suggest(ids[i]) for i in range(5)] == [{"arch": i} for i in range(5)]
    for i in (4, 3, 2, 1):  # the largest area is still running: no bucket can close
        s.on_trial_complete(ids[i], {M: values[i]})
        assert s.generator.bucket_maxima == [] and not s.converged
    assert s.suggest("t5") == {"arch": 5}  # not converged: keep going
    s.on_trial_complete(ids[0], {M: values[0]})  # closes 0..4 in order; [3, 2] at bucket 3 converges
    assert s.converged and s.generator.converged_bucket == 3
    assert s.generator.bucket_maxima == [1.0, 2.0, 3.0, 2.0, 1.0]
    assert s.suggest("t6") == Searcher.FINISHED
    s.on_trial_complete("t5", {M: 7.0})  # a speculative trial still counts for the best
    assert s.best_index == 5 and s.best_value == 7.0


def test_phaze_prefix_order_matters_not_completion_order():
    # Buckets 1..3 complete first with a non-increasing tail (3, 2, 1): no convergence until bucket 0
    # closes, because only the contiguous prefix of closed buckets counts.
    gen = PhazeGenerator(np.array(DISTINCT), hysteresis=3)
    idx = [gen.next_index() for _ in range(4)]
    for i, v in zip((3, 2, 1), (1.0, 2.0, 3.0)):
        gen.observe(idx[i], v)
    assert not gen.converged
    gen.observe(0, 0.5)  # maxima 0.5, 3, 2, 1: last three non-increasing -> converged at bucket 3
    assert gen.converged and gen.converged_bucket == 3


def test_phaze_failed_trials_count_as_zero():
    s = ready(PhazeSearcher(hysteresis=2))
    s.generator = PhazeGenerator(np.array(DISTINCT), hysteresis=2)
    assert s.suggest("a") == {"arch": 0}
    s.on_trial_complete("a", {M: 1.0})
    assert s.suggest("b") == {"arch": 1}
    s.on_trial_complete("b", {M: 2.0})
    assert s.suggest("c") == {"arch": 2}
    s.on_trial_complete("c", None, error=True)  # maxima 1, 2, 0 -> [2, 0] non-increasing
    assert s.results == {0: 1.0, 1: 2.0, 2: 0.0}
    assert s.converged and s.suggest("d") == Searcher.FINISHED
    # NaN and missing results are failures too; a result without the metric is an error
    s = ready(PhazeSearcher(hysteresis=2))
    s.suggest("a"), s.suggest("b"), s.suggest("c")
    s.on_trial_complete("a", {M: float("nan")})
    s.on_trial_complete("b", {})
    assert s.results == {0: 0.0, 1: 0.0}
    with pytest.raises(ValueError, match="has no metric 'throughput_avg'"):
        s.on_trial_complete("c", {"other": 1.0})


def test_phaze_exhausted_space_finishes(small_path):
    s = ready(PhazeSearcher(small_path, hysteresis=2))
    assert len(s.space) == 16
    seen = run_searcher(s, lambda i: float(i))  # maxima strictly increasing: never converges
    assert seen == list(range(16)) and not s.converged
    assert s.suggest("again") == Searcher.FINISHED


def test_phaze_on_the_small_space_closes_multi_index_buckets(small_path):
    s = ready(PhazeSearcher(small_path, hysteresis=2))
    b = area_buckets(s.space.area_mm2, 0.01)
    assert b.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6, 6, 6, 6, 7, 8]
    # bucket maxima 1, 5, 4 -> [5, 4] stops once bucket 2 (indices 3..5) is complete
    vals = {0: 1, 1: 5, 2: 0, 3: 2, 4: 4, 5: 3}
    assert run_searcher(s, lambda i: vals.get(i, 9.0)) == [0, 1, 2, 3, 4, 5]
    assert s.generator.bucket_maxima == [1.0, 5.0, 4.0] and s.best_index == 1


def _random_values(n, seed=7):
    """Noise on an upward trend over the first 80 indices, so the search runs a while."""
    return np.random.default_rng(seed).random(n) + 4.0 * np.minimum(np.arange(n), 80) / 80


def test_phaze_resume_continues_the_same_sequence(tmp_path):
    space = enumerate_space()
    vals = _random_values(len(space))
    full = ready(PhazeSearcher(hysteresis=4))
    seq = run_searcher(full, lambda i: vals[i])
    assert full.converged and 60 < len(seq) < 2000
    assert seq == list(range(len(seq)))
    for k in (1, 5, len(seq) // 2, len(seq) - 1, len(seq)):
        s = ready(PhazeSearcher(hysteresis=4))
        for i in seq[:k]:
            s.add_evaluated_point({"arch": i}, vals[i])
        rest = run_searcher(s, lambda i: vals[i], start=k)
        assert seq[:k] + rest == seq, k
        assert s.converged and s.best_index == full.best_index
        assert s.generator.bucket_maxima == full.generator.bucket_maxima
    # save / restore mid-search
    s = ready(PhazeSearcher(hysteresis=4))
    head = [s.suggest(f"t{t}")["arch"] for t in range(3)]
    s.on_trial_complete("t0", {M: vals[0]})
    s.on_trial_complete("t1", {M: vals[1]})
    s.save(str(tmp_path / "phaze.pkl"))
    r = PhazeSearcher(hysteresis=4)
    r.restore(str(tmp_path / "phaze.pkl"))
    assert r.metric == M and r.mode == "max"
    r.on_trial_complete("t2", {M: vals[2]})
    assert head + run_searcher(r, lambda i: vals[i], start=3) == seq


def test_phaze_resumed_points_are_skipped_and_count_toward_convergence():
    s = ready(PhazeSearcher(hysteresis=2))
    s.generator = PhazeGenerator(np.array(DISTINCT), hysteresis=2)
    for i, v in ((1, 2.0), (2, 3.0), (3, 2.0), (5, 9.0)):
        s.add_evaluated_point({"arch": i}, v)
    assert not s.converged  # bucket 0 still open
    assert s.suggest("a") == {"arch": 0}
    assert s.suggest("b") == {"arch": 4}  # 1..3 skipped
    s.on_trial_complete("a", {M: 1.0})  # maxima 1, 2, 3, 2 -> converged
    assert s.converged and s.suggest("c") == Searcher.FINISHED
    # an evaluated point given by its fields, errors and pruned points as 0.0
    t = ready(PhazeSearcher(hysteresis=2))
    t.add_evaluated_point(dict(TPUV4), 5.0)
    t.add_evaluated_point({"arch": 1}, 7.0, error=True)
    t.add_evaluated_point({"arch": 2}, 7.0, pruned=True)
    assert t.results == {0: 5.0, 1: 0.0, 2: 0.0}
    assert t.suggest("x") == {"arch": 3}
    with pytest.raises(ValueError, match="not a feasible architecture"):
        t.add_evaluated_point(dict(TPUV4, num_tc=4096), 1.0)


def test_searchers_need_metric_and_take_it_from_tune():
    s = PhazeSearcher()
    assert s.metric is None and s.mode is None
    with pytest.raises(RuntimeError, match="metric and mode are not set"):
        s.suggest("a")
    assert s.set_search_properties(M, "max", {"models": ["bert"]}) is True
    assert s.metric == M and s.suggest("a") == {"arch": 0}
    with pytest.raises(ValueError, match="mode must be 'max'"):
        PhazeSearcher(mode="min")


# --- random and grid -------------------------------------------------------------------------------

def test_random_is_seeded_exhaustive_and_starts_at_the_reference(small_path):
    a = run_searcher(ready(RandomSearcher(small_path, seed=3)), lambda i: 1.0)
    b = run_searcher(ready(RandomSearcher(small_path, seed=3)), lambda i: 1.0)
    c = run_searcher(ready(RandomSearcher(small_path, seed=4)), lambda i: 1.0)
    assert a == b and a != c
    assert a[0] == 0 and c[0] == 0
    assert sorted(a) == list(range(16)) and sorted(c) == list(range(16))
    big = ready(RandomSearcher(seed=0))
    first = [big.suggest(f"t{t}")["arch"] for t in range(500)]
    assert first[0] == 0 and len(set(first)) == 500
    assert first != list(range(500))
    # resumed points are skipped
    r = ready(RandomSearcher(small_path, seed=3))
    for i in a[:5]:
        r.add_evaluated_point({"arch": i}, 1.0)
    assert run_searcher(r, lambda i: 1.0) == a[5:]


def test_grid_is_lexicographic_and_exhaustive(small_path):
    orders = {}
    for path in (small_path, None):
        s = ready(GridSearcher(path))
        space = s.space
        n = len(space) if path else 2000
        seq = orders[path] = [s.suggest(f"t{t}")["arch"] for t in range(n)]
        assert seq[0] == 0
        tuples = [fields(space, i) for i in seq[1:]]
        assert tuples == sorted(tuples)
        if path:
            assert sorted(seq) == list(range(16)) and s.suggest("end") == Searcher.FINISHED
        else:
            assert tuples[0] == (1.0, 1.0, 2.0, 2.0, 2.0)  # not the area order
    g = ready(GridSearcher(small_path))
    order = run_searcher(g, lambda i: float(i))
    assert order == orders[small_path] and g.best_index == 15 and g.best_value == 15.0


# --- nearest_index ---------------------------------------------------------------------------------

def _brute_nearest(space, cfg):
    best = None
    for i in range(len(space)):
        d = sum((math.log2(getattr(space, f)[i]) - math.log2(cfg[f])) ** 2 for f in ARCH_FIELDS)
        if best is None or d < best[0]:
            best = (d, i)
    return best[1]


def test_nearest_index_exact_hits_and_arch():
    space = enumerate_space()
    for i in (0, 1, 17, 5000, len(space) - 1):
        cfg = dict(zip(ARCH_FIELDS, fields(space, i)))
        assert nearest_index(space, cfg) == i
        assert nearest_index(space, {"arch": i, "num_tc": 1}) == i
    assert nearest_index(space, dict(TPUV4, models=["x"])) == 0
    for bad in (len(space), -1, True, 1.0):
        with pytest.raises(ValueError, match="'arch' must be an integer"):
            nearest_index(space, {"arch": bad})
    with pytest.raises(ValueError, match=r"\['glb_mb'\] missing"):
        nearest_index(space, {f: 2 for f in ARCH_FIELDS[:4]})
    with pytest.raises(ValueError, match="'pe_y' must be a positive"):
        nearest_index(space, dict(TPUV4, pe_y=0))


@pytest.mark.parametrize("cfg", [
    {"num_tc": 4096, "num_vc": 4096, "pe_x": 256, "pe_y": 256, "glb_mb": 128},  # far too large
    {"num_tc": 64, "num_vc": 64, "pe_x": 256, "pe_y": 256, "glb_mb": 2},
    {"num_tc": 3, "num_vc": 100, "pe_x": 48, "pe_y": 8, "glb_mb": 20},  # not powers of two
])
def test_nearest_index_of_infeasible_points_is_the_brute_force_nearest(cfg):
    space = enumerate_space()
    i = nearest_index(space, cfg)
    assert i == _brute_nearest(space, cfg)  # ties -> the lower index, i.e. the larger area


# --- make_searcher and Optuna ----------------------------------------------------------------------

def test_make_searcher_names():
    allowed = r"\['phaze', 'optuna', 'random', 'grid'\]"
    with pytest.raises(ValueError, match=rf"searcher 'x' unknown; allowed: {allowed}"):
        make_searcher("x")
    with pytest.raises(ValueError, match="max_concurrent"):
        make_searcher("phaze", max_concurrent=0)
    p = make_searcher("phaze", hysteresis=3, area_bucket_mm2=0.0, max_concurrent=4)
    assert isinstance(p, PhazeSearcher) and p.generator.hysteresis == 3
    assert p.generator.area_bucket_mm2 == 0.0
    assert isinstance(make_searcher("random", seed=5), RandomSearcher)
    assert isinstance(make_searcher("grid"), GridSearcher)


def test_optuna_suggests_the_five_fields_starting_at_tpuv4():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    axes = {f: set(d.choices) for f, d in optuna_space().items()}
    assert axes["num_tc"] == {2 ** k for k in range(13)} and axes["glb_mb"] == {2 ** k for k in range(1, 8)}
    o = make_searcher("optuna", seed=0)
    assert isinstance(o, OptunaSearch) and o.metric is None
    assert o.set_search_properties(M, "max", {"models": ["bert"]}) is True
    assert o.metric == M and o.mode == "max"
    assert o.suggest("t0") == TPUV4
    o.on_trial_complete("t0", {M: 1.0})
    space = enumerate_space()
    for t in range(1, 6):
        cfg = o.suggest(f"t{t}")
        assert set(cfg) == set(ARCH_FIELDS) and all(cfg[f] in axes[f] for f in ARCH_FIELDS)
        assert 0 <= nearest_index(space, cfg) < len(space)
        o.on_trial_complete(f"t{t}", {M: float(t)})
    # seeded: the same suggestions again
    o2 = make_searcher("optuna", seed=0)
    o2.set_search_properties(M, "max", {})
    assert o2.suggest("t0") == TPUV4

    # resumed: points fed in before Tune sets the metric are kept, the evaluated reference is not re-run
    r = make_searcher("optuna", seed=0)
    r.add_evaluated_point(dict(TPUV4), 3.0)
    r.add_evaluated_point(dict(TPUV4, num_tc=4), float("nan"))
    r.set_search_properties(M, "max", {})
    states = sorted((t.state.name, t.value) for t in r._ot_study.get_trials())
    assert states == [("COMPLETE", 3.0), ("FAIL", None)]
    assert r.suggest("t0") != TPUV4

    lim = make_searcher("optuna", seed=0, max_concurrent=2)
    assert isinstance(lim, ConcurrencyLimiter) and lim.max_concurrent == 2
    lim.set_search_properties(M, "max", {})
    assert lim.suggest("a") == TPUV4
    assert set(lim.suggest("b")) == set(ARCH_FIELDS)
    assert lim.suggest("c") is None  # two live trials


# --- batches, retries, budget, space by content ------------------------------------------------------

def test_batched_trials_report_every_index_and_retry_only_the_unreported():
    s = ready(GridSearcher(archs_per_trial=3, max_retries=1, budget=6))
    a, b = s.suggest("a"), s.suggest("b")
    assert a == {"archs": [0, *s.order[1:3].tolist()]} and len(b["archs"]) == 3
    assert s.suggest("c") is None            # budget spent, trials live and retries possible: wait
    s.on_trial_result("a", {M: 2.0, "evaluated": [[a["archs"][0], 1.0], [a["archs"][1], 2.0]]})
    s.on_trial_complete("a", error=True)     # the third index of "a" was never reported
    assert s.suggest("d") == {"archs": [a["archs"][2]]}   # handed out again, alone, before anything new
    s.on_trial_complete("d", error=True)     # second failure: max_retries=1 exhausted
    assert s.final_failures == {"d": [a["archs"][2]]}
    assert s.results == {a["archs"][0]: 1.0, a["archs"][1]: 2.0, a["archs"][2]: 0.0}
    s.on_trial_complete("b", {M: 3.0, "evaluated": [[i, 3.0] for i in b["archs"]]})
    assert s.suggest("e") == Searcher.FINISHED
    assert len(s.results) == 6


def test_retry_first_and_no_double_handout_in_phaze_order():
    s = ready(PhazeSearcher(retry_first=[1], budget=2, max_retries=1))
    s.add_evaluated_point({"arch": 0}, 5.0)
    # the failed index 1 comes first; the Phaze walk then skips it (in flight) instead of repeating it
    assert [s.suggest(t)["arch"] for t in ("x", "y", "z")] == [1, 2, 3]
    assert s.suggest("w") is None


def test_space_given_by_content_equals_the_file(tmp_path):
    from archplace.hardware.space import load_space_config

    yml = tmp_path / "s.yaml"
    yml.write_text("architecture:\n  num_tc: [1, 2]\n  num_vc: [2]\n  pe_x: [8, 16]\n  pe_y: [8]\n"
                   "  glb_mb: [4]\n")
    by_path, by_content = enumerate_space(yml), enumerate_space(load_space_config(yml))
    assert np.array_equal(by_path.area_mm2, by_content.area_mm2) and len(by_content) == len(by_path)
    assert GridSearcher(load_space_config(yml)).order.tolist() == GridSearcher(yml).order.tolist()


def test_pruning_cap_keeps_phaze_from_handing_out_its_budget():
    from archplace.platform.limiter import pruning_cap

    assert pruning_cap("phaze", budget=16, hysteresis=6, archs_per_trial=1) == 4
    assert pruning_cap("phaze", budget=1000, hysteresis=6, archs_per_trial=1) == 6
    assert pruning_cap("phaze", budget=3, hysteresis=6, archs_per_trial=1) == 1
    assert pruning_cap("phaze", budget=1000, hysteresis=6, archs_per_trial=4) == 1
    assert pruning_cap("grid", budget=16, hysteresis=6, archs_per_trial=1) is None
