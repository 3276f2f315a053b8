"""Warm-started GDP (issue 31, deliverable 2; ``algorithms/rl/gdp_warmstart.py``, ``place-ops --algo gdp``).

* Behaviour cloning copies a target placement exactly into the policy's greedy (argmax) placement on a
  toy graph of two independent chains whose target puts one chain on each GPU (a policy whose node
  embeddings collapse cannot tell the chains apart and stays at agreement 0.5), deterministically.
* The answer rule: the fastest valid of greedy / best sample / warm start, ties to the warm start.
* ``gdp_warm`` counts every simulator call (the simulator wrapped and its rows counted), and with a
  budget that leaves no PPO iteration its greedy placement is the cloned one (the weights reach PPO).
* ``place-ops --algo gdp`` on txl-2: never slower than the warm start, names its source, stays within
  its budget; bad budgets are one-line errors naming the field.
"""

from __future__ import annotations

import numpy as np
import pytest

from archplace import api
from archplace.algorithms.rl import gdp_warmstart as gw
from archplace.algorithms.rl.gdp_env import GDPGraph
from archplace.api.operator_placement import DEFAULT_BUDGET_CALLS
from archplace.cli import main
from archplace.simulators.gpu_placement import PlacementProblem, simulate

GB = 1e9
CHAIN = 8


def two_chains() -> GDPGraph:
    """Chains 0..7 and 8..15 (1 ms per op) on 2 GPUs; features: chain id, position in the chain, 1."""
    n = 2 * CHAIN
    src = [i for i in range(CHAIN - 1)] + [CHAIN + i for i in range(CHAIN - 1)]
    s = np.asarray(src, np.int64)
    p = PlacementProblem(np.full(n, 1e-3), np.full(n, 1e3), np.zeros(n), s, s + 1, np.full(len(src), 1e3),
                         np.full(n, -1), np.arange(n), 2, 16 * GB, 12e9, 10e-6, "pcie")
    x = np.zeros((n, 3), np.float32)
    x[CHAIN:, 0] = 1.0
    x[:, 1] = np.r_[np.arange(CHAIN), np.arange(CHAIN)] / CHAIN
    x[:, 2] = 1.0
    return GDPGraph(p, x, "two-chains")


def test_behaviour_cloning_copies_the_split_exactly_and_deterministically():
    import torch

    torch.set_num_threads(1)
    gg = two_chains()
    target = np.r_[np.zeros(CHAIN), np.ones(CHAIN)].astype(np.int64)
    assert simulate(gg.problem, target).step_time_s < simulate(gg.problem, np.zeros(16, np.int64)).step_time_s
    a = gw.behaviour_clone(gg, target, seed=0)
    assert a["agreement"] == 1.0 and (a["greedy_placement"] == target).all()
    assert 0 < a["steps"] == a["best_step"] < gw.BC_STEPS and len(a["loss"]) == a["steps"]
    assert 0.5 < a["target_prob_mean"] <= 1.0
    b = gw.behaviour_clone(gg, target, seed=0)
    assert b["steps"] == a["steps"] and all(np.array_equal(a["state"][k], b["state"][k]) for k in a["state"])
    # the state is the RLModule's (the format gdp_train's init_state takes): the policy's weights
    assert any(k.startswith("policy.") for k in a["state"])
    # zero steps: the seeded initial policy, reported as it is
    z = gw.behaviour_clone(gg, target, seed=0, steps=0)
    assert z["steps"] == 0 and z["loss"] == [] and 0.0 <= z["agreement"] <= 1.0
    with pytest.raises(ValueError, match="target"):
        gw.behaviour_clone(gg, np.full(16, 2), seed=0)


INF = float("inf")


@pytest.mark.parametrize("cands, want", [
    ({"warm_start": (1.0, True), "greedy": (1.0, True), "best_sample": (1.0, True)}, "warm_start"),
    ({"warm_start": (1.0, True), "greedy": (0.9, True), "best_sample": (0.9, True)}, "greedy"),
    ({"warm_start": (1.0, True), "greedy": (0.9, True), "best_sample": (0.8, True)}, "best_sample"),
    ({"warm_start": (1.0, True), "greedy": (0.5, False), "best_sample": (INF, False)}, "warm_start"),
    ({"warm_start": (2.0, False), "greedy": (3.0, False), "best_sample": (INF, False)}, "warm_start"),
])
def test_the_answer_is_the_fastest_valid_candidate_ties_to_the_warm_start(cands, want):
    assert gw.answer(cands) == want


def test_gdp_warm_counts_every_call_and_hands_the_cloned_weights_to_ppo(ray_session, monkeypatch):
    """Budget 6: the 5 fast placers and the greedy evaluation, no PPO iteration; the greedy placement PPO
    reports is then exactly the cloned policy's (its weights were loaded)."""
    import torch

    from archplace.algorithms.rl import gdp_env, gdp_ppo
    from archplace.hardware.gpu_machines import gpu_machine
    from archplace.workloads.gdp_models import gdp_graph, node_features

    torch.set_num_threads(1)
    rows = []
    for mod in (gw, gdp_env, gdp_ppo):
        real = mod.simulate_batch
        monkeypatch.setattr(mod, "simulate_batch",
                            lambda p, P, _real=real: rows.append(len(np.atleast_2d(P))) or _real(p, P))
    g = gdp_graph("txl-2")
    p = PlacementProblem.from_graph(g, gpu_machine("p100-pcie", 2))
    run = gw.gdp_warm(g, GDPGraph(p, node_features(g)[0], "txl-2"), 6, seed=0, bc_steps=20)
    assert sum(rows) == run.simulator_calls == 6 == run.budget
    assert run.samples == run.ppo_iterations == run.ppo_iterations_planned == 0 and run.stopped_by == "budget"
    assert np.array_equal(run.greedy_placement, run.warm.greedy_placement)
    assert run.best_sample_placement is None and run.answer_source in ("warm_start", "greedy")
    assert run.step_time_s <= run.warm.step_time_s and run.valid
    assert run.warm.algo in gw.WARM_START_ALGOS and run.warm.step_time_s == min(
        t for a, t in run.warm.step_times_s.items() if run.warm.valid_by_algo[a])


def test_place_ops_gdp_is_never_slower_than_its_warm_start(ray_session):
    import torch

    torch.set_num_threads(1)
    res = api.place_ops(api.PlaceOpsRequest("txl-2", algo="gdp", budget=38, seed=1))
    d = res.to_dict()
    # 38 calls: 5 fast placers, 2 PPO iterations of 16 samples, the greedy placement
    assert d["samples"] == 32 and d["ppo_iterations"] == 2 and d["simulator_calls"] == 38 == d["budget_calls"]
    times = {"greedy": (d["greedy_step_time_s"], d["greedy_valid"]),
             "best_sample": (d["best_sample_step_time_s"], d["best_sample_valid"]),
             "warm_start": (d["warm_start_step_time_s"], d["warm_start_valid"])}
    assert d["answer_source"] == gw.answer(times)
    assert res.valid and d["warm_start_valid"]
    assert res.step_time_s == pytest.approx(times[d["answer_source"]][0], rel=1e-12)
    assert res.step_time_s <= d["warm_start_step_time_s"]
    assert res.step_time_s == pytest.approx(min(t for t, ok in times.values() if ok), rel=1e-12)
    ws = api.place_ops(api.PlaceOpsRequest("txl-2", algo=d["warm_start_algo"], seed=1))
    assert d["warm_start_step_time_s"] == pytest.approx(ws.step_time_s, rel=1e-12)


@pytest.mark.parametrize("algo, budget", [("gdp", 5), ("gdp", 2.5), ("gdp", 0), ("gdp", True), ("gdp", "100"),
                                          ("gdp-pretrained", 0)])
def test_bad_gdp_budget_is_one_line(algo, budget, tmp_path):
    w = tmp_path / "w.npz"
    w.write_bytes(b"")
    kw = {"pretrained": str(w)} if algo == "gdp-pretrained" else {}
    with pytest.raises(ValueError, match=r"^budget for algo gdp.* is simulator calls") as e:
        api.PlaceOpsRequest("txl-2", algo=algo, budget=budget, **kw).validate()
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(ValueError, match="budget"):
        gw.gdp_warm(None, two_chains(), 5)


def test_cli_gdp_budget_is_calls_and_bad_budget_names_the_flag(capsys):
    assert api.PlaceOpsRequest("txl-2", algo="gdp").budget_value == DEFAULT_BUDGET_CALLS == 2000
    assert main(["place-ops", "txl-2", "--algo", "gdp", "--max-evals", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-evals" in err and "simulator calls" in err
