"""Memory-aware MCM partitioning (issue 44): the memory lower bound against brute force, every
partitioner returning a partition that fits SRAM when the time-balanced one does not, and the infeasible
verdict before any search (bert-base on 8 chiplets fits again; on 2 it cannot)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from archplace.algorithms.rl.mcm_env import MCMPartitionEnv
from archplace.algorithms.search.mcm_baselines import greedy, random_search, simulated_annealing
from archplace.algorithms.solvers.mcm_lns import lns
from archplace.algorithms.solvers.mcm_repair.memory import fix_memory, memory_greedy_partition
from archplace.simulators.mcm import (
    MCMProblem,
    evaluate,
    greedy_partition,
    memory_lower_bound,
    memory_peak_bytes,
)


def _all_parts(n: int, c: int) -> np.ndarray:
    return np.array(list(itertools.product(range(c), repeat=n)), dtype=np.int64)


def _random_dag(rng: np.random.Generator, n: int, chips: int, sram: float) -> MCMProblem:
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.35]
    src, dst = zip(*pairs) if pairs else ((), ())
    return MCMProblem.from_arrays(chips, list(src), list(dst), time_s=rng.uniform(1e-4, 1e-3, n),
                                  out_bytes=rng.integers(0, 40, n).astype(float),
                                  weight_bytes=rng.integers(0, 100, n).astype(float), sram_bytes=sram)


@pytest.mark.parametrize("seed", range(6))
def test_memory_bound_never_exceeds_the_brute_force_minimum_peak(seed):
    """Over all 3^7 partitions (statically valid or not) the smallest max-chip peak is >= the bound,
    and with SRAM one byte under the bound no partition fits (the infeasible verdict is sound)."""
    rng = np.random.default_rng(seed)
    p = _random_dag(rng, 7, 3, sram=1e9)
    parts = _all_parts(7, 3)
    least = float(memory_peak_bytes(p, parts).max(axis=1).min())
    b = memory_lower_bound(p)
    assert b.peak_bytes <= least
    assert b.peak_bytes == max(b.op_bytes, b.spread_bytes)
    tight = MCMProblem.from_arrays(3, p.src, p.dst, p.time_s, p.out_bytes, p.weight_bytes,
                                   sram_bytes=b.peak_bytes - 1)
    assert not memory_lower_bound(tight).fits
    assert not (memory_peak_bytes(tight, parts) <= tight.sram_bytes).all(axis=1).any()


def test_memory_bound_is_attained_by_an_op_with_heavy_inputs():
    # 0, 1, 2 -> 3 -> 4: op 3 holds 50 B of weights and reads three 10 B outputs, writing 7 B; its step
    # needs 50 + 30 + 7 = 87 B wherever it runs, and a partition reaches exactly that
    p = MCMProblem.from_arrays(3, [0, 1, 2, 3], [3, 3, 3, 4], time_s=[1e-3] * 5,
                               out_bytes=[10, 10, 10, 7, 1], weight_bytes=[0, 0, 0, 50, 2])
    b = memory_lower_bound(p)
    least = float(memory_peak_bytes(p, _all_parts(5, 3)).max(axis=1).min())
    assert b.op == 3 and b.op_bytes == 87 and b.peak_bytes == least == 87
    assert "op 3 alone needs" in b.describe(p)


def _tight() -> MCMProblem:
    """A 12-op chain with skips (i -> i+3) on 4 chips of 100 B: op 0 holds a 60 B table, the others
    20 B each, equal compute. The time-balanced greedy puts ops 0-2 on chip 0 (100 B of weights plus
    activations: over SRAM); partitions that fit exist (0-1 on chip 0: 80 B plus activations)."""
    n = 12
    src = list(range(n - 1)) + list(range(0, n - 3, 3))
    dst = list(range(1, n)) + list(range(3, n, 3))
    return MCMProblem.from_arrays(4, src, dst, time_s=[1e-3] * n, out_bytes=[2.0] * n,
                                  weight_bytes=[60.0] + [20.0] * (n - 1), sram_bytes=100.0)


def _fits(p: MCMProblem, part) -> bool:
    return part is not None and bool(evaluate(p, part).valid[0])


def test_the_time_balanced_greedy_overflows_but_every_partitioner_fits():
    p = _tight()
    assert memory_lower_bound(p).fits
    assert not evaluate(p, greedy_partition(p)).memory_ok[0]
    assert _fits(p, memory_greedy_partition(p))
    part, tp = greedy(p)
    assert _fits(p, part) and tp == pytest.approx(float(evaluate(p, part).throughput[0]), rel=1e-12)
    for search in (random_search, simulated_annealing):
        tr = search(p, 8, seed=1)
        assert _fits(p, tr.best_partition) and tr.best > 0 and tr.valid_samples >= 1
        assert tr.extra["repair_memory_fixes"] >= 1
    polished = lns(p, part, time_limit_s=60, seed=0, max_subsolves=4, subsolve_det=0.05)
    assert _fits(p, polished.partition) and polished.throughput >= tp * (1 - 1e-12)


def test_fix_memory_keeps_eqs_2_to_4_and_leaves_a_fitting_partition_alone():
    p = _tight()
    y = greedy_partition(p)
    fx = fix_memory(p, y)
    assert fx.valid and fx.moves >= 1 and fx.overflow_bytes == 0 and _fits(p, fx.partition)
    again = fix_memory(p, fx.partition)
    assert again.moves == 0 and np.array_equal(again.partition, fx.partition)
    with pytest.raises(ValueError, match="Eqs. 2-4"):
        fix_memory(p, np.arange(12) % 4)  # edges go backwards


def test_ppo_env_repair_fits_memory():
    """The environment's repair (what PPO samples through) moves ops off chips over SRAM; with
    ``memory_fix`` off the same action is repaired statically only and scores 0."""
    p = _tight()
    action = greedy_partition(p)  # statically valid, over SRAM on chip 0
    on = MCMPartitionEnv({"graphs": [p], "num_chips": 4})
    on.reset(seed=0)
    assert _fits(p, on.greedy_part(0))
    _, reward, _, _, info = on.step(action)
    assert info["repaired_valid"] and info["memory_fix"] is True and reward > 0
    off = MCMPartitionEnv({"graphs": [p], "num_chips": 4, "memory_fix": False})
    off.reset(seed=0)
    _, reward, _, _, info = off.step(action)
    assert not info["repaired_valid"] and info["memory_fix"] is None and reward == 0


def test_bert_base_on_8_chiplets_fits_and_on_2_is_infeasible_before_any_search(capsys):
    from archplace.cli import main

    assert main(["partition", "bert-base", "--seq", "128", "--chiplets", "8", "--algo", "greedy",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["valid"] and res["status"] == "ok" and res["throughput"] > 0 and res["reason"] is None
    assert res["memory_bound_bytes"] <= 32 * 2**20
    # 104.4 MB of int8 weights over 2 chiplets of 32 MB: the bound rules every partition out
    assert main(["partition", "bert-base", "--seq", "128", "--chiplets", "2", "--algo", "sa",
                 "--json"]) == 1
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["status"] == "infeasible" and res["samples"] == 0 and not res["valid"]
    assert res["reason"].startswith("infeasible: memory lower bound 52.21 MB > 32 MB SRAM per chiplet")
    assert res["memory_bound_bytes"] > 32 * 2**20
