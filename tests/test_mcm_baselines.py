"""MCM search baselines: every sample they keep is a valid partition, their traces are best-so-far
curves that match re-evaluation, they are reproducible, and on a tiny graph they find the optimum
that brute-force enumeration gives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from archplace.algorithms.search.mcm_baselines import greedy, random_search, simulated_annealing
from archplace.simulators.mcm import MCMProblem, evaluate, static_valid
from archplace.workloads.synthetic import layered_dag


def _problem(num_nodes=20, width=3, chips=4, seed=0):
    g = layered_dag(num_nodes, width, seed=seed, batch=1, seq=128, hidden=256)
    from archplace.hardware.presets import mcm_package

    return MCMProblem.from_graph(g, mcm_package(chips))


def _tiny():
    # a diamond with a tail: 0->1, 0->2, 1->3, 2->3, 3->4; unequal compute so balance matters
    return MCMProblem.from_arrays(3, [0, 0, 1, 2, 3], [1, 2, 3, 3, 4],
                                  time_s=[1e-3, 2e-3, 3e-3, 1e-3, 2e-3], out_bytes=[1e3] * 5)


@pytest.mark.parametrize("search", [random_search, simulated_annealing])
def test_traces_are_valid_monotone_and_reproducible(search):
    p = _problem()
    a = search(p, 40, seed=3)
    b = search(p, 40, seed=3)
    assert np.array_equal(a.best_so_far, b.best_so_far)
    assert np.all(np.diff(a.best_so_far) >= 0) and a.samples == 40
    assert a.best_partition is not None and static_valid(p, a.best_partition)[0]
    assert a.best == pytest.approx(float(evaluate(p, a.best_partition).throughput[0]), rel=1e-12)
    assert a.valid_samples >= 1
    assert a.samples_to_reach(a.best) <= 40 and a.samples_to_reach(a.best * 2) is None


def test_greedy_is_valid_after_repair():
    p = _problem(chips=8)
    part, tp = greedy(p)
    assert static_valid(p, part)[0] and tp > 0
    assert tp == pytest.approx(float(evaluate(p, part).throughput[0]))


def test_search_finds_the_brute_force_optimum_on_a_tiny_graph():
    p = _tiny()
    parts = np.array(list(itertools.product(range(3), repeat=5)))
    best = float(evaluate(p, parts).throughput.max())
    assert random_search(p, 300, seed=0).best == pytest.approx(best, rel=1e-12)
    assert simulated_annealing(p, 300, seed=0).best == pytest.approx(best, rel=1e-12)


def test_bad_arguments():
    p = _tiny()
    with pytest.raises(ValueError, match="samples"):
        random_search(p, 0)
    with pytest.raises(ValueError, match="subset_fraction"):
        simulated_annealing(p, 5, subset_fraction=0)


def test_partition_command_json(capsys):
    import json

    from conftest import DNN_DATA

    from archplace.cli import main

    path = DNN_DATA / "throughput-inputs" / "LayerGraphs" / "gnmt_training.json"
    assert main(["partition", str(path), "--chiplets", "36", "--algo", "sa", "--budget", "10", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["valid"] and len(res["assignment"]) == res["nodes"] == 96
    chips = np.array(list(res["assignment"].values()))
    assert chips.min() == 0 and chips.max() == res["chips_used"] - 1 < 36
    assert res["improvement"] >= 1.0 and res["throughput"] == pytest.approx(1 / max(res["chip_latency_s"]))
    with pytest.raises(SystemExit) as e:   # refused while parsing, with the limit
        main(["partition", str(path), "--devices", "99"])
    assert e.value.code == 2 and "--devices: must be at most 64" in capsys.readouterr().err


def test_partition_command_ppo(ray_session, capsys, tmp_path):
    import json

    from conftest import DNN_DATA

    from archplace.cli import main

    path = DNN_DATA / "throughput-inputs" / "LayerGraphs" / "gnmt_inference.json"
    assert main(["partition", str(path), "--algo", "ppo", "--budget", "8", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["algo"] == "ppo" and res["mode"] == "from scratch" and res["samples"] == 8
    assert res["valid"] and len(res["assignment"]) == res["nodes"] == 96 and res["valid_samples"] == 8
    assert res["improvement"] >= 1.0 and res["throughput"] == pytest.approx(1 / max(res["chip_latency_s"]))
    assert main(["partition", str(path), "--algo", "ppo", "--zero-shot"]) == 2
    assert "--zero-shot needs --pretrained" in capsys.readouterr().err
    assert main(["partition", str(path), "--algo", "sa", "--pretrained", "x.npz"]) == 2
    assert "apply to --algo ppo" in capsys.readouterr().err
    assert main(["partition", str(path), "--algo", "ppo", "--pretrained", str(tmp_path / "no.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err
