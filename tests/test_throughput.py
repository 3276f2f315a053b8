"""Throughput(model, architecture): the pipeline from graph to placement, on small settings."""

import pytest

from archplace.algorithms.solvers.throughput import model_throughput, prepare_layers, sweep
from archplace.hardware.presets import TPUV4


def test_sequential_pipeline_is_consistent():
    res = model_throughput("bert-base", TPUV4, num_devices=64, global_batch=256, microbatches=(1, 2),
                           hbm_gb=(32,), sequential=True, seq=128)
    best = res.best
    assert best.feasible and res.throughput == pytest.approx(256 / best.time_per_batch_s)
    assert best.d * sum(s.devices for s in best.stages) <= 64
    assert len(res.configs) == 2 * 1 * 2  # microbatch × HBM × recompute
    assert max(r["throughput"] for r in res.configs) == pytest.approx(res.throughput)
    # the stages cover the 14 layers in order
    assert best.stages[0].first == 0 and best.stages[-1].last == 13
    assert set(res.timing_s) >= {"estimate_s", "dp_s"}


def test_fixed_strategy_is_no_better_and_tmp_widths_are_used():
    free = model_throughput("bert-base", TPUV4, num_devices=64, global_batch=256, microbatches=(2,),
                            hbm_gb=(32,), recompute=(False,), sequential=True, seq=128)
    fixed = model_throughput("bert-base", TPUV4, num_devices=64, global_batch=256, microbatches=(2,),
                             hbm_gb=(32,), recompute=(False,), sequential=True, seq=128, fixed=(2, 8, 2))
    assert fixed.best.feasible and (fixed.best.p, fixed.best.d, fixed.best.t) == (2, 8, 2)
    assert fixed.throughput <= free.throughput + 1e-9


def test_memory_infeasible_is_a_result():
    res = model_throughput("bert-large", TPUV4, num_devices=4, global_batch=64, microbatches=(8,),
                           hbm_gb=(0.05,), recompute=(True,), sequential=True, seq=512, tmp_widths=(1,))
    assert not res.best.feasible and res.throughput == 0.0
    # the first cause in order: bert-large's 335M parameters under mixed-precision Adam, 2 + 2 + 12 bytes
    # each (5.0 GiB), against 4 × 0.05 GiB
    assert "weights, gradients and optimizer state need 5.0 GiB, more than 4 devices × 0.05 GiB" in \
        res.best.reason
    # with room for the model's state in total but not for its largest layer on one device
    one = model_throughput("bert-large", TPUV4, num_devices=4096, global_batch=64, microbatches=(8,),
                           hbm_gb=(0.05,), recompute=(True,), sequential=True, seq=512, tmp_widths=(1,),
                           optimizer="sgd")
    assert "layer encoder.layer.0 alone needs" in one.best.reason


def test_sweep_takes_a_custom_evaluator():
    layers, _, _ = prepare_layers("bert-base", TPUV4, (1,), (1,), 16, 64, seq=64, schedules=("sequential",))
    seen = []

    def evaluate(lys, setup):
        from archplace.algorithms.solvers.placement import best_placement

        seen.append((setup.microbatch, setup.hbm_bytes, setup.recompute))
        return best_placement(lys, setup)
    best, rows = sweep(layers["sequential"], 16, 64, hbm_gb=(32, 64), evaluate=evaluate)
    assert len(seen) == 4 and len(rows) == 4 and best.feasible
