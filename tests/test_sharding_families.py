"""``archplace shard`` on the Llama and OPT families (config-built graphs, counts against transformers,
Megatron's collectives, exact == brute force) and infeasible results that say why."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest  # noqa: F401 - used by the family tests below

from archplace.algorithms.search import sharding_search as ss
from archplace.algorithms.search.sharding_cost import ShardCost
from archplace.hardware.gpus import gpu_spec
from archplace.workloads import sharding_models as sm

V100 = gpu_spec("v100-sxm2")


# ------------------------------------------------------------------------------------ infeasible


def test_exact_infeasible_reports_the_smallest_memory_any_plan_reaches():
    g = sm.mlp2(batch=64, d=256, f=1024)
    pb0 = ss.ShardProblem(g, 4)
    least = min(
        c.memory_bytes
        for combo in itertools.product(*[pb0.choices(t) for t in pb0.variables])
        for _, c in [ss.plan_cost(pb0, dict(zip(pb0.variables, combo)))]
        if c is not None
    )
    tiny = dataclasses.replace(V100, memory_bytes=least - 1)
    res = ss.solve_exact(ss.ShardProblem(g, 4, cost=ShardCost(gpu=tiny)))
    assert res.status == "infeasible" and res.choice == {}
    assert f"reaches over 4 devices is {least / 2**30:.2f} GiB ({least} B" in res.reason
    assert res.to_dict()["reason"] == res.reason
    # one byte more and the optimum is that plan
    ok = ss.solve_exact(
        ss.ShardProblem(g, 4, cost=ShardCost(gpu=dataclasses.replace(V100, memory_bytes=least)))
    )
    assert ok.status == "optimal" and ok.cost.memory_bytes == least and ok.reason is None


def test_shard_api_infeasible_says_why():
    from archplace.api.sharding import ShardRequest, shard

    res = shard(ShardRequest("gpt2-xl", devices=8))
    assert res.status == "infeasible" and res.strategy == {} and not res.fits
    m = re.search(r"reaches over 8 devices is [\d.]+ GiB \((\d+) B", res.reason)
    assert m and int(m.group(1)) > V100.memory_bytes
    # the minimum is no more than Megatron's plan needs (which conflicts on 25 heads over 8)
    assert int(m.group(1)) <= res.reference["memory_bytes"]
    assert "h.*/attn/q/kernel dim 1 and 47 like it (size 25 is not divisible by 8" in res.reason
    assert res.reference["differs"] is None
    d = res.to_dict()
    assert d["step_s"] is None and d["reason"] == res.reason


def test_shard_cli_human_output_of_an_infeasible_plan(capsys):
    from archplace.cli import main

    assert main(["shard", "gpt2-xl", "--devices", "8", "--algo", "ilp"]) == 0
    out = capsys.readouterr().out
    assert "[ilp, infeasible," in out and "step         none: no plan" in out
    assert "why          no plan fits in v100-sxm2's 32.00 GiB per device" in out


def test_a_plan_that_does_not_fit_says_by_how_much():
    from archplace.api.sharding import ShardRequest, shard

    res = shard(ShardRequest("gpt2-xl", devices=8, algo="greedy"))
    assert not res.fits
    assert res.reason == (
        f"the greedy plan needs {res.memory_bytes} B per device, more than v100-sxm2's {V100.memory_bytes} B"
    )
