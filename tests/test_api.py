"""The public Python API (archplace.api): the same answers as the CLI, JSON round trips of requests,
one-line validation errors, progress stages, cancellation, and no Ray at import time."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import DNN_DATA

from archplace import api
from archplace.cli import main

REPO = Path(__file__).resolve().parents[1]
GNMT = str(DNN_DATA / "throughput-inputs/LayerGraphs/gnmt_training.json")


def cli_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def assert_same(api_dict: dict, cli_dict: dict, ignore=()) -> None:
    """Field by field (key order too: the CLI prints the API's dict), wall-clock times aside. The CLI
    appends one key of its own, ``budgets``: the budgets under its flags' names and units."""
    cli_dict = dict(cli_dict)
    assert isinstance(cli_dict.pop("budgets", {}), dict)   # commands without a budget print none
    assert list(api_dict) == list(cli_dict)
    for k in api_dict:
        if k not in ignore:
            assert api_dict[k] == cli_dict[k], k


def test_place_equals_the_cli_and_reports_progress(capsys):
    stages = []
    req = api.PlaceRequest("bert-base", "tpuv4", accelerators=64, global_batch=256, sequential=True)
    res = api.place(req, progress=lambda stage, info: stages.append((stage, info)))
    cli = cli_json(capsys, "place", "bert-base", "--arch", "tpuv4", "--accelerators", "64",
                   "--global-batch", "256", "--sequential")
    d = res.to_dict()
    assert_same(d, cli, ignore=("timing_s",))
    assert set(d["timing_s"]) == set(cli["timing_s"]) == {"graph_s", "estimate_s", "ilp_s", "dp_s"}
    assert json.loads(json.dumps(d)) == d  # plain JSON types
    assert res.feasible and res.reason is None and res.schedule == "sequential"
    assert res.throughput == pytest.approx(256 / res.placement["time_per_batch_s"])
    assert res.arch["num_tc"] == 8 and res.accelerators == 64
    # one "layers" stage per (microbatch, TMP width) case, then the DP, then done
    names = [s for s, _ in stages]
    n = names.count("layers")
    assert names == ["layers"] * n + ["dp", "done"] and n >= 4
    assert [i["case"] for s, i in stages if s == "layers"] == list(range(1, n + 1))
    assert all(i["cases"] == n for s, i in stages if s == "layers")
    assert stages[-1][1] == {"feasible": True, "throughput": res.throughput}


def test_partition_greedy_equals_the_cli(capsys):
    stages = []
    res = api.partition(api.PartitionRequest(GNMT, algo="greedy"), progress=lambda s, i: stages.append(s))
    cli = cli_json(capsys, "partition", GNMT, "--algo", "greedy")
    assert_same(res.to_dict(), cli, ignore=("wall_s",))
    assert res.samples == 1 and res.improvement == 1.0 and res.nodes == len(res.assignment) == 96
    assert stages == ["graph", "greedy", "done"]


def test_partition_polish_never_loses_and_reports(capsys):
    """greedy + 4 s of CP-SAT neighbourhood search: no worse than greedy, a valid partition, the repair
    stage of the greedy proposal and the search's own counts reported (CLI --json carries them too)."""
    stages = []
    res = api.partition(api.PartitionRequest(GNMT, algo="greedy", chiplets=8, polish=4.0),
                        progress=lambda s, i: stages.append(s))
    assert stages == ["graph", "greedy", "polish", "done"]
    d = res.to_dict()
    assert d["sampler_throughput"] == pytest.approx(res.greedy_throughput)
    assert res.throughput >= res.greedy_throughput and res.valid
    assert d["lns_subsolves"] >= 1 and d["lns_stopped"] in ("time", "optimal", "bound")
    assert d["lns_seed_throughput"] == pytest.approx(res.greedy_throughput) and 0 <= d["lns_gap"] < 1
    assert d["greedy_repair_stage"] in (None, "eq4", "cpsat", "complete")
    cli = cli_json(capsys, "partition", GNMT, "--algo", "greedy", "--chiplets", "8", "--polish", "1")
    assert cli["throughput"] >= cli["greedy_throughput"] and cli["lns_subsolves"] >= 1


def test_partition_deterministic_polish_repeats_exactly():
    """--polish-subsolves N (issue 31): a sub-solve count and CP-SAT deterministic time per sub-solve, so
    two runs give the same partition and the same counts whatever the load; never worse than greedy."""
    req = api.PartitionRequest(GNMT, algo="greedy", chiplets=8, polish_subsolves=3)
    a, b = api.partition(req).to_dict(), api.partition(req).to_dict()
    assert a["lns_subsolves"] == 3 and a["lns_stopped"] == "subsolves"
    assert a["assignment"] == b["assignment"] and a["throughput"] == b["throughput"]
    assert a["lns_det_time"] == pytest.approx(b["lns_det_time"]) and a["lns_det_time"] <= 3 * 0.25 + 1e-6
    assert a["throughput"] >= a["greedy_throughput"]


def test_graph_and_estimate_equal_the_cli(capsys, tmp_path):
    res = api.graph(api.GraphRequest("bert-base", seq=64))
    assert_same(res.to_dict(), cli_json(capsys, "graph", "bert-base", "--seq", "64"))
    assert "out" not in res.to_dict() and res.unique_layers is not None
    arch = {"num_tc": 1, "num_vc": 1024, "pe_x": 256, "pe_y": 256, "glb_mb": 8}
    path = tmp_path / "a.json"
    path.write_text(json.dumps(arch))
    stages = []
    est = api.estimate(api.EstimateRequest("bert-base", arch, seq=64), progress=lambda s, i: stages.append(s))
    assert_same(est.to_dict(), cli_json(capsys, "estimate", "bert-base", "--arch", str(path), "--seq", "64"))
    assert stages == ["graph", "estimate", "done"] and est.arch["num_vc"] == 1024


def test_solve_dp_equals_the_cli(capsys):
    path = str(DNN_DATA / "throughput-inputs/LayerGraphs/bert24_training.json")
    res = api.solve_dp(api.SolveDpRequest(path))
    assert_same(res.to_dict(), cli_json(capsys, "solve-dp", path), ignore=("solve_time_s", "stats"))
    assert res.status == "optimal" and res.max_load == pytest.approx(41.7458125, rel=1e-6)


@pytest.mark.parametrize("req", [
    api.PlaceRequest("bert-base", "tpuv4", accelerators=64, hbm_gb=(32.0,), fixed=(2, 4, 1), seq=128),
    api.PlaceRequest("bert-base", {"num_tc": 2, "num_vc": 2, "pe_x": 64, "pe_y": 64, "glb_mb": 8}),
    api.EstimateRequest("bert-base", "tpuv4", backend="zigzag"),
    api.GraphRequest("gpt2-xl", seq=128, out="g.parquet"),
    api.PartitionRequest("bert-base", chiplets=16, algo="ppo", zero_shot=True, pretrained="w.npz"),
    api.PipelineRequest("bert-base", cluster="A", stages=3, algo="exact"),
    api.SolveDpRequest("in.json", method="milp"),
    api.SearchRequest(("bert-base", "gpt2-xl"), "out", tmp_widths=(1, 2), space={"a": [1]}),
])
def test_requests_round_trip_through_json(req):
    d = json.loads(json.dumps(req.to_dict()))
    assert type(req).from_dict(d) == req
    assert all(not isinstance(v, tuple) for v in req.to_dict().values())


def test_from_dict_names_unknown_and_missing_fields():
    with pytest.raises(ValueError, match=r"unknown PlaceRequest field\(s\) \['hbm', 'x'\]; allowed: \["):
        api.PlaceRequest.from_dict({"model": "bert-base", "arch": "tpuv4", "hbm": 32, "x": 1})
    with pytest.raises(ValueError, match=r"PlaceRequest field\(s\) \['arch'\] missing"):
        api.PlaceRequest.from_dict({"model": "bert-base"})


def test_defaults_are_the_cli_defaults():
    p = api.PlaceRequest("m", "a")
    assert (p.ilp_budget, p.ilp_time_limit_s, p.accelerators, p.global_batch, p.hbm_gb) == (
        10.0, 300.0, 1024, 4096, None)   # None: the accelerator's own HBM (a preset's, or 32/64/80)
    assert api.PartitionRequest("m").algo == "sa" and api.PartitionRequest("m").budget == 200
    s = api.SearchRequest(("m",))
    assert (s.budget, s.ilp_budget, s.ilp_time_limit_s, s.hbm_gb) == (16, 1.0, 300.0, (32.0, 64.0, 80.0))
    assert api.SolveDpRequest("f").time_limit_s == 600.0
    assert {r.capture_blocks for r in (p, s, api.GraphRequest("m"), api.EstimateRequest("m", "a"))} == {3}


P = api.PlaceRequest


@pytest.mark.parametrize("req, message", [
    (P("bert-base", "tpuv4", accelerators=0), "accelerators must be a positive integer, got 0"),
    (P("bert-base", "tpuv4", global_batch=2.5), "global_batch must be a positive integer, got 2.5"),
    (P("bert-base", "tpuv4", fixed=(64, 64, 1)),
     "fixed 64,64,1 needs 4096 accelerators, more than accelerators 1024"),
    (P("bert-base", "tpuv4", fixed=(2, 2)), "fixed must be p,d,t with three positive integers"),
    (P("bert-base", "tpuv4", hbm_gb=()), "hbm_gb must be one or more positive sizes in GB"),
    (P("bert-base", "tpuv5"), "unknown accelerator preset 'tpuv5'"),
    (P("bert-huge", "tpuv4"), "unknown model 'bert-huge'"),
    (P("bert-base", "tpuv4", ilp_time_limit_s=0), "ilp_time_limit_s must be a positive number"),
    (P("bert-base", "tpuv4", ilp_budget=-1.0), "ilp_budget must be a positive number, got -1.0"),
    (api.GraphRequest("bert-base", mbs=0), "mbs must be a positive integer, got 0"),
    (api.EstimateRequest("bert-base", "tpuv4", backend="exact"),
     "backend must be one of ['analytical', 'zigzag'], got 'exact'"),
    (api.PartitionRequest("bert-base", chiplets=99), "chiplets must be in [1, 64], got 99"),
    (api.PartitionRequest("bert-base", zero_shot=True), "pretrained and zero_shot apply to algo ppo"),
    (api.PartitionRequest("bert-base", algo="ppo", zero_shot=True), "zero_shot needs pretrained"),
    (api.PartitionRequest("bert-base", polish=-1), "polish must be seconds in [0, 86400], got -1"),
    (api.PartitionRequest("bert-base", algo="ppo-lns"), "algo ppo-lns needs polish SECONDS > 0"),
    (api.PartitionRequest("bert-base", algo="ppo-lns", polish=5, polish_subsolves=3),
     "polish_subsolves applies to the CP-SAT polish, not algo ppo-lns"),
    (api.PartitionRequest("bert-base", polish_subsolves=0), "polish_subsolves"),
    (api.PartitionRequest("bert-base", algo="sa", pretrained="w.npz"),
     "apply to algo ppo or ppo-lns, not sa"),
    (api.PipelineRequest("bert-base", cluster="D"), "cluster must be one of ['A', 'B', 'C'], got 'D'"),
    (api.PipelineRequest("bert-base", cluster="A", stages=9), "stages must be in [2, 8], got 9"),
    (api.PipelineRequest("bert-base", algo="nope"),
     "algo must be one of ['dp', 'rainbow', 'pretrained', 'exact']"),
    (api.SolveDpRequest("missing.json"), "input file 'missing.json' does not exist"),
    (api.SearchRequest(("bert-base",), recompute="never"), "recompute must be one of"),
    (api.SearchRequest(("bert-base",), microbatches=(0,)), "microbatches must be one or more positive"),
    (api.GraphRequest("bert-base", capture_blocks=2), "capture_blocks must be an integer >= 3, got 2"),
    (P("bert-base", "tpuv4", capture_blocks=True), "capture_blocks must be an integer >= 3, got True"),
    (api.SearchRequest(("bert-base",), capture_blocks=1), "capture_blocks must be an integer >= 3, got 1"),
])
def test_validate_gives_one_line_naming_the_field(req, message):
    with pytest.raises(ValueError) as e:
        req.validate()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_invalid_request_renders_cli_flags():
    e = api.InvalidRequest("{fixed} 64,64,1 needs 4096 accelerators, more than {accelerators} 1024",
                           "fixed", "accelerators")
    assert str(e) == "fixed 64,64,1 needs 4096 accelerators, more than accelerators 1024"
    assert e.render({"fixed": "--fixed", "accelerators": "--accelerators"}) == \
        "--fixed 64,64,1 needs 4096 accelerators, more than --accelerators 1024"


def test_cancel_before_start_and_between_phases(tmp_path):
    ev = threading.Event()
    ev.set()
    with pytest.raises(api.Cancelled, match="before it started"):
        api.place(api.PlaceRequest("bert-base", "tpuv4", sequential=True), cancel=ev)
    with pytest.raises(api.Cancelled):
        api.partition(api.PartitionRequest(GNMT, algo="greedy"), cancel=ev)
    # set while the graph phase reports: the call stops before writing the file
    ev = threading.Event()
    out = tmp_path / "g.parquet"
    with pytest.raises(api.Cancelled, match="after stage 'graph'"):
        api.graph(api.GraphRequest("bert-base", seq=64, out=str(out)), progress=lambda s, i: ev.set(),
                  cancel=ev)
    assert not out.exists()


def test_no_ray_at_import_and_ray_algorithms_need_a_running_ray():
    code = ("import sys, archplace.api as api; print('ray' in sys.modules)\n"
            "for call in (lambda: api.partition(api.PartitionRequest(sys.argv[1], algo='ppo', budget=2)),\n"
            "             lambda: api.pipeline(api.PipelineRequest('bert-base', cluster='A',\n"
            "                                                      algo='rainbow'))):\n"
            "    try:\n        call()\n    except RuntimeError as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, GNMT], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "False"
    assert lines[1].startswith("partition algo 'ppo' runs on Ray") and "connect(" in lines[1]
    assert lines[2].startswith("pipeline algo 'rainbow' runs on Ray") and "ray.init()" in lines[2]


def test_search_result_keeps_the_store_keys_in_order():
    best = {"models": ["bert-base"], "num_devices": 64, "global_batch": 256, "searcher": "grid",
            "evaluated": 2, "failed": 0, "infeasible": 0, "common": None, "per_model": {}, "reference": None,
            "speedup_vs_reference": {}, "newer_key": 1, "out_dir": "/o", "stats": {"wall_s": 1.0}}
    res = api.SearchResult.from_dict(best)
    assert res.extra == {"newer_key": 1} and res.evaluated == 2
    d = res.to_dict()
    assert d == best and list(d)[:11] == list(best)[:11] and "extra" not in d


def test_codesign_result_keeps_the_store_keys_in_order():
    best = {"target": "mcm", "models": ["bert-base"], "searcher": "random", "placer": "greedy",
            "objective": "throughput", "cost": "usd", "throughput_unit": "samples/s", "evaluated": 3,
            "failed": 0, "infeasible": 1, "common": None, "per_model": {}, "pareto": [], "newer_key": [1],
            "out_dir": "/o", "stats": {}}
    from archplace.api.codesign import CodesignResult

    res = CodesignResult.from_dict(best)
    assert res.extra == {"newer_key": [1]} and res.infeasible == 1
    d = res.to_dict()
    assert d == best and list(d)[:13] == list(best)[:13] and "extra" not in d


def test_search_reports_every_architecture_and_cancels_after_the_trials_in_flight(ray_session, tmp_path):
    """A sequential-schedule grid search on one CPU's worth of trials: ``evaluated`` once per finished
    architecture, with the values the result store holds; cancelled after the first report, it stops
    short of its budget and keeps what finished."""
    import pyarrow.parquet as pq

    base = dict(models=("bert-base",), accelerators=64, global_batch=256, searcher="grid",
                schedule="sequential", microbatches=(1,), hbm_gb=(32.0,), workers=1)
    seen: list[tuple[str, dict]] = []
    res = api.search(api.SearchRequest(out_dir=str(tmp_path / "all"), budget=3, **base),
                     progress=lambda stage, info: seen.append((stage, info)))
    evaluated = [i for s, i in seen if s == "evaluated"]
    assert [s for s, _ in seen] == ["start", "evaluated", "evaluated", "evaluated", "done"]
    rows = pq.read_table(tmp_path / "all" / "evaluations.parquet").to_pylist()
    assert {i["space_index"]: i["throughput_avg"] for i in evaluated} == {
        r["space_index"]: r["throughput"] for r in rows}
    assert res.to_dict()["stats"]["cancelled"] is False

    cancel = threading.Event()
    got: list[dict] = []

    def stop_after_first(stage: str, info: dict) -> None:
        if stage == "evaluated":
            got.append(info)
            cancel.set()

    res = api.search(api.SearchRequest(out_dir=str(tmp_path / "cut"), budget=20, **base),
                     progress=stop_after_first, cancel=cancel).to_dict()
    assert res["stats"]["cancelled"] is True
    assert 1 <= res["evaluated"] == len(got) < 20
