"""Local-search baselines for ``place-ops`` (issue 31, deliverable 3): simulated annealing (``sa``) and
neighbourhood search (``lns``) from the best fast placer, on a budget of simulator calls.

A toy two-GPU graph of two independent heavy chains (optimum: one chain per GPU, found by brute force over
every placement) checks that both searches reach the optimum from a one-GPU start; seeded random DAGs check
the budget accounting (counted by wrapping the simulator), never ending worse than the start, and
determinism; ``txl-2`` checks the API / CLI path and its errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from archplace import api
from archplace.algorithms.search import gdp_baselines as gb
from archplace.algorithms.search import placement_local_search as ls
from archplace.api.operator_placement import DEFAULT_BUDGET_CALLS, LOCAL_SEARCH_STARTS
from archplace.cli import main
from archplace.simulators.gpu_placement import PlacementProblem, simulate, simulate_batch

GB = 1e9
SEARCHES = [ls.simulated_annealing, ls.neighbourhood_search]


def problem(compute, src, dst, *, d=2, edge_bytes=1e3, coloc=None, resident=None, memory=16 * GB):
    n = len(compute)
    return PlacementProblem(
        np.asarray(compute, float), np.full(n, 1e3),
        np.zeros(n) if resident is None else np.asarray(resident),
        np.asarray(src, np.int64), np.asarray(dst, np.int64), np.broadcast_to(edge_bytes, len(src)),
        np.full(n, -1) if coloc is None else np.asarray(coloc), np.arange(n), d, float(memory), 12e9, 10e-6,
        "pcie")


def two_chains() -> PlacementProblem:
    """Chains 0->1->2 and 3->4->5, 1 ms per op; ops 0 and 2 (and 3 and 5) share a co-location group, as a
    weight's reader and its gradient op do. One GPU: 6 ms; one chain per GPU: 3 ms."""
    return problem([1e-3] * 6, [0, 1, 3, 4], [1, 2, 4, 5], coloc=[0, -1, 0, 1, -1, 1])


def brute_force(p: PlacementProblem) -> float:
    """The fastest valid placement's step time, over all d**n placements."""
    P = np.array(list(itertools.product(range(p.num_devices), repeat=p.num_nodes)), np.int64)
    r = simulate_batch(p, P)
    return float(r.step_time_s[r.valid].min())


def random_dag(n: int, seed: int, *, d: int = 3, memory: float = 16 * GB) -> PlacementProblem:
    """Layers of 4 ops, each reading 1-2 ops of the layer before; compute 0.1-2 ms, 1-50 MB edges, some
    resident bytes; a few co-location pairs between the first and last layers (forward/backward-like)."""
    rng = np.random.default_rng(seed)
    src, dst = [], []
    for v in range(4, n):
        lay = v // 4
        for u in rng.choice(4, size=int(rng.integers(1, 3)), replace=False):
            src.append((lay - 1) * 4 + int(u))
            dst.append(v)
    coloc = np.full(n, -1)
    for g in range(3):
        coloc[g], coloc[n - 1 - g] = g, g
    return problem(rng.uniform(1e-4, 2e-3, n), src, dst, d=d, edge_bytes=rng.uniform(1e6, 5e7, len(src)),
                   coloc=coloc, resident=rng.uniform(0, 1e9, n), memory=memory)


def starts_of(p: PlacementProblem) -> dict[str, np.ndarray]:
    return {name: gb.BASELINES[name](p, seed=0) for name in ("human", "metis", "m-topo", "m-etf", "m-sct")}


@pytest.mark.parametrize("search", SEARCHES)
def test_toy_two_chains_reach_the_split_from_one_gpu(search):
    p = two_chains()
    opt = brute_force(p)
    assert opt == pytest.approx(3e-3)
    single = np.zeros(6, np.int64)
    assert simulate(p, single).step_time_s == pytest.approx(6e-3)
    r = search(p, {"single": single}, 200, seed=0)
    assert r.valid and r.start_algo == "single" and r.start_step_time_s == pytest.approx(6e-3)
    assert r.step_time_s == pytest.approx(opt)
    assert r.speedup_over_start == pytest.approx(2.0)
    a, b = set(r.placement[:3]), set(r.placement[3:])
    assert len(a) == len(b) == 1 and a != b
    assert simulate(p, r.placement).step_time_s == r.step_time_s
    assert r.best_trace[-1][1] == r.step_time_s and r.best_trace[-1][0] <= 200


def counted(monkeypatch) -> list[int]:
    """Rows of every simulate_batch call the searches make."""
    rows: list[int] = []

    def wrapped(problem, P, **kw):
        rows.append(len(P))
        return simulate_batch(problem, P, **kw)

    monkeypatch.setattr(ls, "simulate_batch", wrapped)
    return rows


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("budget", [5, 6, 37, 150])
def test_budget_is_counted_exactly(search, budget, monkeypatch):
    p = random_dag(40, 1)
    rows = counted(monkeypatch)
    r = search(p, starts_of(p), budget, seed=3)
    assert rows[0] == 5                       # the five starts, one batch
    assert sum(rows) == r.simulator_calls == budget == r.budget


@pytest.mark.parametrize("search", SEARCHES)
def test_search_ends_early_when_nothing_can_move(search, monkeypatch):
    p = random_dag(20, 2, d=1)
    rows = counted(monkeypatch)
    r = search(p, {"single": np.zeros(20, np.int64)}, 100, seed=0)
    assert rows == [1] and r.simulator_calls == 1 and r.steps == 0
    assert r.step_time_s == r.start_step_time_s


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_never_worse_than_the_best_start_and_deterministic(search, seed):
    p = random_dag(48, 10 + seed, d=3)
    starts = starts_of(p)
    r = search(p, starts, 120, seed=seed)
    own = {k: simulate(p, v) for k, v in starts.items()}
    best = min((k for k in own if own[k].valid), key=lambda k: own[k].step_time_s)
    assert r.start_algo == best and r.start_step_time_s == own[best].step_time_s
    assert r.start_step_times_s == {k: v.step_time_s for k, v in own.items()}
    assert r.valid and r.step_time_s <= r.start_step_time_s
    check = simulate(p, r.placement)
    assert check.valid and check.step_time_s == r.step_time_s
    again = search(p, starts, 120, seed=seed)
    assert np.array_equal(again.placement, r.placement) and again.best_trace == r.best_trace
    assert (again.accepted_moves, again.steps) == (r.accepted_moves, r.steps)


@pytest.mark.parametrize("search", SEARCHES)
def test_invalid_start_is_searched_to_a_valid_placement(search):
    # resident 1 GB per op, 6 GB each GPU, 8 ops: all on one GPU is out of memory, a 4/4 split fits
    p = problem([1e-3] * 8, [0, 1, 2, 4, 5, 6], [1, 2, 3, 5, 6, 7], resident=np.full(8, 1e9), memory=6e9)
    single = np.zeros(8, np.int64)
    assert not simulate(p, single).valid
    r = search(p, {"single": single}, 500, seed=0)
    assert not r.start_valid and r.valid
    assert r.step_time_s == pytest.approx(brute_force(p))


@pytest.mark.parametrize("search", SEARCHES)
def test_nothing_valid_stays_invalid(search):
    p = problem([1e-3] * 4, [0, 2], [1, 3], resident=np.full(4, 2e9), memory=1e9)
    r = search(p, {"single": np.zeros(4, np.int64)}, 30, seed=0)
    assert not r.valid and r.simulator_calls == 30
    assert not simulate(p, r.placement).valid


@pytest.mark.parametrize("budget", [4, 2.5, 0, True, "100"])
def test_bad_budget_is_one_line(budget):
    with pytest.raises(ValueError, match=r"^budget ") as e:
        api.PlaceOpsRequest("txl-2", algo="sa", budget=budget).validate()
    assert "\n" not in str(e.value) and "simulator calls" in str(e.value)
    p = two_chains()
    with pytest.raises(ValueError, match="budget"):
        ls.neighbourhood_search(p, {"a": np.zeros(6, np.int64), "b": np.ones(6, np.int64)}, 1)


def test_cli_bad_budget_names_the_flag(capsys):
    assert main(["place-ops", "txl-2", "--algo", "lns", "--max-evals", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-evals" in err and "simulator calls" in err


@pytest.mark.parametrize("algo", ["sa", "lns"])
def test_place_ops_api_reports_the_start_and_the_calls(algo):
    req = api.PlaceOpsRequest("txl-2", algo=algo, budget=40, seed=1)
    res = api.place_ops(req).to_dict()
    fast = {a: api.place_ops(api.PlaceOpsRequest("txl-2", algo=a, seed=1)) for a in LOCAL_SEARCH_STARTS}
    assert res["start_step_times_s"] == pytest.approx({a: r.step_time_s for a, r in fast.items()})
    best = min((a for a in fast if fast[a].valid), key=lambda a: fast[a].step_time_s)
    assert res["start_algo"] == best and res["start_step_time_s"] == fast[best].step_time_s
    assert res["valid"] and res["reason"] == "" and res["step_time_s"] <= res["start_step_time_s"]
    assert res["speedup_over_start"] == pytest.approx(res["start_step_time_s"] / res["step_time_s"])
    assert res["simulator_calls"] == res["budget_calls"] == 40
    again = api.place_ops(req).to_dict()
    strip = {k: v for k, v in res.items() if not k.endswith("wall_s")}
    assert strip == {k: v for k, v in again.items() if not k.endswith("wall_s")}


def test_cli_default_budget_is_calls_for_search_and_seconds_otherwise():
    assert api.PlaceOpsRequest("txl-2", algo="sa").budget_value == DEFAULT_BUDGET_CALLS == 2000
    assert api.PlaceOpsRequest("txl-2", algo="exact").budget_value == 30.0
