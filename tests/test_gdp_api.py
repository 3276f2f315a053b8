"""``archplace place-ops`` / ``api.place_ops`` (issue 18): the CLI prints the API's answer, the step time
and memory are the simulator's for the returned placement, invalid requests are one-line errors naming
the field, and an out-of-memory placement says why."""

from __future__ import annotations

import json

import numpy as np
import pytest

from archplace import api
from archplace.cli import main


def test_place_ops_equals_the_cli_and_the_simulator(capsys):
    from archplace.hardware.gpu_machines import gpu_machine
    from archplace.simulators.gpu_placement import PlacementProblem, simulate
    from archplace.workloads.gdp_models import gdp_graph

    stages = []
    res = api.place_ops(api.PlaceOpsRequest("txl-2", algo="human"), progress=lambda s, i: stages.append(s))
    assert main(["place-ops", "txl-2", "--algo", "human", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    d = res.to_dict()
    assert cli.pop("budgets") == {}   # the CLI's own key (its flags' budgets); human takes none
    assert list(d) == list(cli) and all(d[k] == cli[k] for k in d if k not in ("wall_s", "placement_wall_s"))
    assert stages == ["graph", "place", "simulate", "done"]
    assert res.devices == 2 and res.machine == "p100-pcie" and res.nodes == len(res.placement)
    g = gdp_graph("txl-2")
    p = PlacementProblem.from_graph(g, gpu_machine("p100-pcie", 2))
    placement = np.array([res.placement[str(n)] for n in g.nodes["name"]])
    sim = simulate(p, placement)
    assert res.step_time_s == pytest.approx(sim.step_time_s) and res.valid == sim.valid
    assert res.peak_memory_bytes == pytest.approx(sim.peak_memory_bytes.tolist())
    one = simulate(p, np.zeros(p.num_nodes, np.int64)).step_time_s
    assert res.single_device_step_time_s == pytest.approx(one)
    assert res.speedup_over_single == pytest.approx(one / sim.step_time_s)
    assert set(placement.tolist()) == {0, 1}  # contiguous blocks over both GPUs


def test_place_ops_out_of_memory_says_why():
    # txl-2 at batch 1024 keeps ~77 GiB of activations for its backward pass: not on one 16 GiB GPU
    res = api.place_ops(api.PlaceOpsRequest("txl-2", devices=1, algo="single", batch=1024))
    assert not res.valid and res.reason.startswith("out of memory on device 0: peak ")
    assert res.reason.endswith("> 16.00 GiB") and max(res.peak_memory_bytes) > 16 * 2**30
    assert res.step_time_s > 0  # still reported


@pytest.mark.parametrize("kw, field", [({"model": "gpt5"}, "model"), ({"algo": "best"}, "algo"),
                                       ({"devices": 0}, "devices"), ({"machine": "tpu"}, "machine"),
                                       ({"budget": -1}, "budget")])
def test_place_ops_bad_requests_name_the_field(kw, field):
    args = {"model": "txl-2", **kw}
    with pytest.raises(ValueError, match=field):
        api.PlaceOpsRequest(**args).validate()


def test_place_ops_exact_refuses_graphs_over_its_limit(capsys):
    assert main(["place-ops", "txl-2", "--algo", "exact"]) == 2
    err = capsys.readouterr().err
    assert "num_nodes" in err and len(err.strip().splitlines()) == 1


def test_place_ops_gdp_pretrained_reports_best_seen_and_greedy_apart(ray_session, tmp_path):
    """gdp-pretrained counts its budget in simulator calls (issue 31): 17 calls are one PPO iteration of 16
    samples and the greedy placement's evaluation; zero-shot is that one evaluation. (``gdp`` itself, the
    warm-started placer, is tested in test_gdp_warmstart.py.)"""
    import torch

    from archplace.algorithms.rl.gdp_env import GDPGraph
    from archplace.algorithms.rl.gdp_ppo import gdp_train
    from archplace.algorithms.rl.mcm_ppo import save_state
    from archplace.hardware.gpu_machines import gpu_machine
    from archplace.simulators.gpu_placement import PlacementProblem, simulate
    from archplace.workloads.gdp_models import gdp_graph, node_features

    torch.set_num_threads(1)
    # weights of a one-iteration run, then fine-tuning from them and their zero-shot placement
    g = gdp_graph("txl-2")
    p = PlacementProblem.from_graph(g, gpu_machine("p100-pcie", 2))
    run = gdp_train([GDPGraph(p, node_features(g)[0], "txl-2")], iterations=1, keep_state=True)
    w = tmp_path / "w.npz"
    save_state(w, run.state)
    ft = api.place_ops(api.PlaceOpsRequest("txl-2", algo="gdp-pretrained", pretrained=str(w), budget=17))
    d = ft.to_dict()
    assert d["mode"] == "fine-tuned" and d["samples"] == 16 and d["ppo_iterations"] == 1
    assert d["simulator_calls"] == 17 == d["budget_calls"] and d["stopped_by"] == "budget"
    # the answer is the faster of the best sample and the greedy policy's placement, and says which
    assert ft.valid and ft.step_time_s == pytest.approx(
        min(d["best_seen_step_time_s"], d["greedy_policy_step_time_s"]))
    assert d["result_is"] == ("best seen" if d["best_seen_step_time_s"] <= d["greedy_policy_step_time_s"]
                              else "greedy policy")
    zs = api.place_ops(api.PlaceOpsRequest("txl-2", algo="gdp-pretrained", pretrained=str(w), zero_shot=True))
    z = zs.to_dict()
    assert z["mode"] == "zero-shot" and z["result_is"] == "greedy policy" and z["samples"] == 0
    assert z["simulator_calls"] == 1
    assert zs.step_time_s == pytest.approx(z["greedy_policy_step_time_s"])
    placement = np.array([zs.placement[str(n)] for n in g.nodes["name"]])
    assert zs.step_time_s == pytest.approx(simulate(p, placement).step_time_s)
    with pytest.raises(ValueError, match="pretrained"):
        api.PlaceOpsRequest("txl-2", algo="gdp-pretrained").validate()
