"""The screen's bound-and-prune phase 1 (``archplace/platform/screen_bound.py``): the bound is never
below ``evaluate_sequential``'s throughput (seeded samples of the Phaze space under several settings,
and a closed form: one device, where the bound is the throughput itself), and a screen in bound order
finds every objective's top k of the full screen, ties included, while evaluating fewer architectures."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from archplace.hardware.space import enumerate_space
from archplace.platform.evaluate import evaluate_sequential
from archplace.platform.screen_bound import (
    BOUND_SLACK,
    kth_best,
    prunable,
    screen_in_bound_order,
    still_needed,
    throughput_bounds,
)
from archplace.platform.settings import SearchSettings
from archplace.workloads.models import build_graph

MODEL = "bert-base"


def _graphs(s: SearchSettings) -> dict:
    return {k: build_graph(k[0], seq=s.seq, mbs=k[1], tmp=k[2], capture_blocks=s.capture_blocks)
            for k in s.graph_keys()}


def _values(space, idx, s, graphs) -> np.ndarray:
    rows = [evaluate_sequential(space.accelerator(int(i)).to_dict(), s, graphs)["rows"][0] for i in idx]
    return np.array([r["throughput"] for r in rows])


BASE = SearchSettings(models=(MODEL,), num_devices=64, global_batch=256, microbatches=(1, 2), hbm_gb=(16, 32),
                      tmp_widths={MODEL: (1, 2)})
CASES = {
    "exposed-adam": BASE,
    "paper-sgd": dataclasses.replace(BASE, sync_model="paper", optimizer="sgd"),
    # 1 GiB of HBM: bert-base's Adam state needs two stages at least (the bound's s_min), 8 devices
    "memory-bound": dataclasses.replace(BASE, num_devices=8, global_batch=64, hbm_gb=(1,)),
}


@pytest.fixture(scope="module")
def space():
    return enumerate_space()


@pytest.mark.parametrize("name", list(CASES))
def test_bound_is_never_below_the_phase1_throughput(space, name):
    s = CASES[name]
    graphs = _graphs(s)
    rng = np.random.default_rng(7)
    idx = np.concatenate([[0], rng.choice(len(space), size=8, replace=False)])   # TPUv4 and 8 random
    b = throughput_bounds(space, s, graphs)[MODEL]
    assert b.shape == (len(space),) and (b >= 0).all()
    v = _values(space, idx, s, graphs)
    assert (v > 0).all()
    assert (v <= b[idx]).all(), (v / b[idx]).max()
    # not vacuous: within a small factor of the DP's answer on these settings
    assert (v / b[idx]).min() > 0.2, (v / b[idx]).min()


def test_bound_on_one_device_is_the_throughput(space):
    """K = 1, one microbatch: one stage, d = 1 (no sync), F = sum of the layers' fw + bw, exactly."""
    s = SearchSettings(models=(MODEL,), num_devices=1, global_batch=1, microbatches=(1,), hbm_gb=(80,),
                       tmp_widths={MODEL: (1,)})
    graphs = _graphs(s)
    idx = [0, 100, 5000]
    b = throughput_bounds(space, s, graphs)[MODEL]
    v = _values(space, idx, s, graphs)
    assert v == pytest.approx(b[idx] / (1 + BOUND_SLACK), rel=1e-9)
    assert (v <= b[idx]).all()


def test_bound_is_zero_when_nothing_fits(space):
    s = dataclasses.replace(BASE, num_devices=1, global_batch=4, hbm_gb=(0.01,))
    b = throughput_bounds(space, s, _graphs(s))[MODEL]
    assert (b == 0).all()


# ---------------------------------------------------------------------- the prune rule
def _top(v: np.ndarray, k: int) -> list[int]:
    ok = np.flatnonzero(np.isfinite(v) & (v > 0))
    return sorted(ok.tolist(), key=lambda i: (-v[i], i))[:k]


def test_kth_best_and_prunable_are_tie_safe():
    v = np.array([5.0, np.nan, 3.0, 3.0, 0.0, 1.0])
    assert kth_best(v, 1) == 5.0 and kth_best(v, 2) == 3.0 and kth_best(v, 3) == 3.0
    assert kth_best(v, 5) == 0.0                        # fewer than k positive: prune nothing positive
    assert prunable(np.array([2.9, 3.0, 0.0]), 3.0).tolist() == [True, False, True]


@pytest.mark.parametrize("seed", range(5))
def test_pruned_screen_finds_the_full_top_k_on_synthetic_values(seed):
    """Values with ties and zeros, bounds from exact to 3x loose; two models evaluated together (the
    screen's case) and a common objective over them."""
    rng = np.random.default_rng(seed)
    n = 300
    val = {m: np.round(rng.gamma(2.0, 10.0, n)) * (rng.random(n) > 0.1) for m in "ab"}   # ties, zeros
    val["common"] = (val["a"] + val["b"]) / 2
    bnd = {m: val[m] * (1 + 2 * rng.random(n) * (rng.random(n) > 0.3)) for m in "ab"}  # 30% exact
    bnd["common"] = (bnd["a"] + bnd["b"]) / 2
    for k in (1, 4, 16):
        res = screen_in_bound_order(lambda i: {o: val[o][i] for o in val}, bnd, k)
        assert res["complete"] and len(res["order"]) == len(set(res["order"])) < n
        for o in val:
            assert _top(res["values"][o], k) == _top(val[o], k), (o, k)


def test_common_over_separately_screened_workloads():
    """The bench's common objective: each workload screened alone, then the mixed bound (value where
    screened, else bound) drives more screening until the common top k is the full one."""
    rng = np.random.default_rng(3)
    n, ws, k = 200, ("w1", "w2", "w3"), 5
    val = {w: np.round(rng.gamma(3.0, 5.0, n), 1) for w in ws}
    bnd = {w: val[w] * (1 + rng.random(n)) for w in ws}
    V = {w: screen_in_bound_order(lambda i, w=w: {w: val[w][i]}, {w: bnd[w]}, k)["values"][w] for w in ws}
    rounds = 0
    while True:
        M = np.stack([V[w] for w in ws])
        mixed = np.where(np.isnan(M), np.stack([bnd[w] for w in ws]), M).mean(axis=0)
        need = still_needed({"c": mixed}, {"c": M.mean(axis=0)}, k)
        if not len(need):
            break
        rounds += 1
        for w in ws:
            V[w][need[:10]] = val[w][need[:10]]
    full = np.mean([val[w] for w in ws], axis=0)
    assert _top(np.stack([V[w] for w in ws]).mean(axis=0), k) == _top(full, k)
    assert rounds >= 1 and np.isnan(np.stack([V[w] for w in ws])).any()


def test_pruned_screen_on_a_small_space_equals_the_full_screen():
    """The real bound and evaluate_sequential on 20 architectures of the small Table 2 space, two
    settings as two objectives plus their average: the pruned screen's top k equals the full one's."""
    space = Path(__file__).resolve().parents[1] / "bench" / "phaze" / "phaze_table2_small_space.yaml"
    sp = enumerate_space(str(space))
    idx = np.random.default_rng(11).choice(len(sp), size=20, replace=False)
    sets = {"a": BASE, "b": dataclasses.replace(BASE, sync_model="paper", global_batch=512)}
    vals, bnds = {}, {}
    for o, s in sets.items():
        g = _graphs(s)
        bnds[o] = throughput_bounds(sp, s, g)[MODEL][idx]
        vals[o] = _values(sp, idx, s, g)
    assert all((vals[o] <= bnds[o]).all() for o in sets)
    vals["common"], bnds["common"] = (vals["a"] + vals["b"]) / 2, (bnds["a"] + bnds["b"]) / 2
    for k in (1, 3):
        res = screen_in_bound_order(lambda i: {o: vals[o][i] for o in vals}, bnds, k)
        for o in vals:
            assert _top(res["values"][o], k) == _top(vals[o], k)
    res1 = screen_in_bound_order(lambda i: {o: vals[o][i] for o in vals}, bnds, 1)
    assert len(res1["order"]) < len(idx)


# ---------------------------------------------------------------------- through run_screen (Ray)
def test_run_screen_prunes_and_records(ray_session, tmp_path):
    from archplace.hardware.space import load_space_config
    from archplace.platform.screen import run_screen

    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump({
        "architecture": {"num_tc": {"pow2": [0, 1]}, "num_vc": {"pow2": [1, 1]}, "pe_x": {"pow2": [1, 3]},
                         "pe_y": {"pow2": [1, 1]}, "glb_mb": {"pow2": [1, 1]}},
        "constraints": {"area_max_preset": "tpuv4", "area_min_fraction": 0.0}}))
    cfg = load_space_config(str(p))
    n = len(enumerate_space(cfg))
    s = dataclasses.replace(BASE, microbatches=(1,), hbm_gb=(32,), tmp_widths={}, space=cfg)
    kw = dict(top_k=1, progress=False, report=False, phase2=False)
    full = run_screen(s, tmp_path / "full", **kw)
    pruned = run_screen(s, tmp_path / "pruned", prune=True, **kw)
    st = pruned["stats"]["phase1"]
    assert full["stats"]["phase1"]["new"] == n and st["remaining"] == 0
    rec = json.loads((tmp_path / "pruned" / "screen_prune.json").read_text())
    assert rec["evaluated"] == st["new"] and rec["evaluated"] + rec["pruned"] == n and rec["complete"]
    assert all(b < rec["threshold"][MODEL] for b in rec["pruned_bound"][MODEL])
    assert pruned["stats"]["phase2_candidates"] == full["stats"]["phase2_candidates"]
    # resumed without pruning: the full screen completes, the same candidates
    again = run_screen(s, tmp_path / "pruned", resume=True, **kw)
    assert again["stats"]["phase1"]["new"] == rec["pruned"]
    assert again["stats"]["phase2_candidates"] == full["stats"]["phase2_candidates"]
