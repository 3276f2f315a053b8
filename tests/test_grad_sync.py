"""The exposed-gradient-sync model (``grad_sync.py``) against an event simulation of the 1F1B schedule
(``simulators/pipeline_1f1b.py``), and its closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from archplace.algorithms.solvers.grad_sync import allreduce_s, stage_sync
from archplace.simulators import collectives
from archplace.simulators.pipeline_1f1b import one_f_one_b_order, simulate_1f1b


def formula(f, b, act, grad, sync, n):
    """The placement DP's time per batch for these stages: (n + s − 1) · max-load + the largest
    exposed sync, a stage's load counting its incoming activation and gradient transfers, its window
    the backward compute of the stages before it."""
    s = len(f)
    load = f + b + np.concatenate([[0.0], act]) + np.concatenate([grad, [0.0]])
    window = np.concatenate([[0.0], np.cumsum(b)[:-1]])
    return (n + s - 1) * load.max() + np.maximum(0.0, sync - window).max()


@pytest.mark.parametrize("seed", range(60))
def test_the_formula_bounds_the_simulated_step_from_above(seed):
    rng = np.random.default_rng(seed)
    s, n = int(rng.integers(1, 6)), int(rng.integers(1, 12))
    f, b = rng.uniform(0.1, 2, s), rng.uniform(0.2, 4, s)
    act, grad = rng.uniform(0, 1, s - 1), rng.uniform(0, 1, s - 1)
    sync = rng.uniform(0, 20, s) * (rng.random(s) < 0.8)
    sim = simulate_1f1b(f, b, act, grad, sync, n)
    assert sim.step_s <= formula(f, b, act, grad, sync, n) * (1 + 1e-12)
    # the sync of each stage starts after its last backward, on its own link
    assert (sim.sync_end_s >= sim.last_backward_s + sync - 1e-12).all()


@pytest.mark.parametrize("seed", range(20))
def test_equal_stages_without_transfers_meet_the_formula(seed):
    """Equal stages: the pipeline ends (n + s − 1)(f + b) after it starts and stage k's last backward
    k·b before the end, so the window is exact and the formula is the simulated step."""
    rng = np.random.default_rng(1000 + seed)
    s, n = int(rng.integers(1, 6)), int(rng.integers(1, 12))
    f, b = np.full(s, rng.uniform(0.1, 2)), np.full(s, rng.uniform(0.2, 4))
    sync = rng.uniform(0, 30, s)
    zeros = np.zeros(s - 1)
    sim = simulate_1f1b(f, b, zeros, zeros, sync, n)
    assert sim.pipeline_s == pytest.approx((n + s - 1) * (f[0] + b[0]))
    assert sim.step_s == pytest.approx(formula(f, b, zeros, zeros, sync, n))


def test_one_f_one_b_order():
    assert one_f_one_b_order(0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1),
                                          ("B", 2), ("B", 3)]
    assert one_f_one_b_order(2, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_stage_sync_closed_forms():
    """Three stages, 4 copies, 1 GB/s: a ring AllReduce 2·3/4·W/bw; tied weights on the first and last
    stages add 2·1/2·T/bw; windows 0, b0, b0 + b1. The paper's eq. 18 charges 4·3/4·W/bw, first stage
    only; fp32 gradients move twice the bytes."""
    w, tied, before = [1e9, 2e9, 1e9], [5e8, 0.0, 5e8], [0.0, 1.0, 3.0]
    got = stage_sync(w, tied, before, 4, 1e9)
    assert got.sync_s.tolist() == pytest.approx([1.5 + 0.5, 3.0, 1.5 + 0.5])
    assert got.sync_s[1] == pytest.approx(collectives.allreduce_s(2e9, 4, 1e9))
    assert got.window_s.tolist() == [0.0, 1.0, 3.0]
    assert got.exposed_s.tolist() == pytest.approx([2.0, 2.0, 0.0]) and got.exposed_total_s == 2.0
    paper = stage_sync(w, tied, before, 4, 1e9, "paper")
    assert paper.exposed_s.tolist() == pytest.approx([3.0, 0.0, 0.0])
    assert paper.exposed_s[0] == pytest.approx(collectives.phaze_eq18_allreduce_s(1e9, 4, 1e9))
    fp32 = stage_sync(w, tied, before, 4, 1e9, grad_reduce_dtype="fp32")
    assert fp32.sync_s.tolist() == pytest.approx([4.0, 6.0, 4.0])
    assert stage_sync([1e9], [5e8], [0.0], 4, 1e9).sync_s.tolist() == [1.5]  # one stage: nothing tied apart
    assert allreduce_s(1e9, 1, 1e9) == 0.0
    with pytest.raises(ValueError, match="sync_model must be one of"):
        stage_sync(w, tied, before, 4, 1e9, "gpipe")
