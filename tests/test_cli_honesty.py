"""Issue 19, no silent fallbacks: a zero, invalid or infeasible CLI result says why; ``place`` reports
each layer slice's ILP status and the worst gap; ``place --expert`` is the bench's expert evaluation."""

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import DNN_DATA

from archplace.cli import main
from archplace.workloads.models import preset

ROOT = Path(__file__).resolve().parents[1]
PROFILED = DNN_DATA / "throughput-inputs/LayerGraphs/bert24_inference.json"
STATUSES = {"optimal", "feasible", "fallback", "trivial"}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------- estimate
def test_estimate_on_a_profiled_graph_reports_the_measured_latencies(capsys):
    nodes = json.loads(PROFILED.read_text())["nodes"]
    code, out, _ = run(capsys, "estimate", str(PROFILED), "--arch", "tpuv4", "--json")
    res = json.loads(out)
    assert code == 0 and res["backend"] == "profiled" and res["reason"] is None
    assert "fpgaLatency" in res["note"] and "--arch and --backend are not used" in res["note"]
    by_name = {o["name"]: o["single_core_s"] for o in res["ops"]}
    assert by_name == pytest.approx({n["name"]: n["fpgaLatency"] for n in nodes})
    assert res["totals"]["sequential_single_core_s"] == pytest.approx(sum(n["fpgaLatency"] for n in nodes))
    assert res["totals"]["sequential_single_core_s"] > 0
    code, out, _ = run(capsys, "estimate", str(PROFILED), "--arch", "tpuv4")
    assert code == 0 and "measured latencies from the file [profiled]" in out and "fpgaLatency" in out
    assert "node30" in out and " ms" not in out   # the file's unit, not labelled as milliseconds


def test_estimate_all_zero_says_why(capsys, tmp_path):
    path = tmp_path / "zeros.json"
    path.write_text(json.dumps({
        "maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1,
        "nodes": [{"id": i, "supportedOnFpga": 1, "cpuLatency": 0.0, "fpgaLatency": 0.0, "isBackwardNode": 0}
                  for i in range(3)],
        "edges": [{"sourceId": 0, "destId": 1, "cost": 0.0}, {"sourceId": 1, "destId": 2, "cost": 0.0}]}))
    code, out, _ = run(capsys, "estimate", str(path), "--arch", "tpuv4", "--json")
    res = json.loads(out)
    assert code == 0 and res["totals"]["sequential_single_core_s"] == 0
    assert "profiled latencies in the file are all 0" in res["reason"]
    code, out, _ = run(capsys, "estimate", str(path), "--arch", "tpuv4")
    assert "all latencies are 0: every op's latency is 0" in out


def test_estimate_of_a_model_has_no_reason(capsys):
    code, out, _ = run(capsys, "estimate", "bert-base", "--arch", "tpuv4", "--seq", "64", "--json")
    res = json.loads(out)
    assert code == 0 and res["backend"] == "analytical" and res["reason"] is None and res["note"] is None


# ---------------------------------------------------------------------- partition
def test_infeasible_partition_says_why(capsys):
    """bert-base's int8 weights cannot fit 2 chiplets of 32 MB: the memory bound says so before any
    search (throughput 0, exit 1), in the JSON and the summary; 8 chiplets fit (memory-aware greedy)."""
    code, out, _ = run(capsys, "partition", "bert-base", "--chiplets", "2", "--algo", "greedy", "--json")
    res = json.loads(out)
    assert code == 1 and not res["valid"] and res["throughput"] == 0 and res["status"] == "infeasible"
    assert "memory lower bound" in res["reason"] and "32 MB" in res["reason"]
    code, out, _ = run(capsys, "partition", "bert-base", "--chiplets", "8", "--algo", "greedy", "--json")
    res = json.loads(out)
    assert code == 0 and res["valid"] and res["throughput"] > 0 and res["status"] == "ok"


def test_valid_partition_has_no_reason(capsys):
    code, out, _ = run(capsys, "partition", "bert-base", "--chiplets", "36", "--algo", "greedy",
                       "--seq", "64", "--json")
    res = json.loads(out)
    assert code == 0 and res["valid"] and res["throughput"] > 0 and res["reason"] is None


# ---------------------------------------------------------------------- place
PLACE = ["place", "bert-base", "--arch", "tpuv4", "--accelerators", "64", "--global-batch", "255",
         "--ilp-budget", "0.1"]   # 255: microbatch 1 only, one case


def _bench():
    spec = importlib.util.spec_from_file_location("phaze_tpuv4", ROOT / "bench" / "phaze" / "phaze_tpuv4.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_place_expert_is_the_bench_expert_evaluation(capsys, monkeypatch):
    """`place --expert` gives the number bench/phaze/phaze_tpuv4.py reports in its expert column (same
    layer schedules: the same deterministic budget gives the same answer, cached or not)."""
    bench = _bench()
    monkeypatch.setitem(bench.WORKLOADS, "tiny", ("bert-base", (1,), (4, 16, 1), (1, 2, 4, 8)))
    row = bench.run("tiny", 64, 255, (32.0,), budget=0.1)   # the TPUv4's own HBM, as place's default
    assert row["expert_feasible"] and row["expert_throughput"] > 0
    code, out, _ = run(capsys, *PLACE, "--expert", "4,16,1", "--json")
    res = json.loads(out)
    pl = res["placement"]
    assert code == 0 and res["strategy"] == "expert" and pl["feasible"]
    assert (pl["p"], pl["d"], pl["t"]) == (4, 16, 1)
    assert res["throughput"] == pytest.approx(row["expert_throughput"], rel=1e-12)
    # the even split: embeddings with the first blocks, the head with the last (12 blocks / 4 stages)
    assert [(s["first"], s["last"]) for s in pl["stages"]] == [(0, 3), (4, 6), (7, 9), (10, 13)]
    # --fixed keeps p, d, t but lets the DP choose the split: never slower than the expert split
    code, out, _ = run(capsys, *PLACE, "--fixed", "4,16,1", "--json")
    fixed = json.loads(out)
    assert fixed["strategy"] == "fixed" and fixed["throughput"] >= res["throughput"] * (1 - 1e-12)
    code, out, _ = run(capsys, *PLACE, "--expert", "4,16,1")
    assert "expert placement, even block split" in out and "p=4 d=16 t=1" in out


def test_place_reports_slice_status_and_worst_gap(capsys):
    code, out, _ = run(capsys, *PLACE, "--json")
    res = json.loads(out)
    ilp = res["ilp"]
    slices = ilp["slices"]
    assert code == 0 and res["strategy"] == "dp" and slices
    assert set(ilp["status_counts"]) <= STATUSES
    assert sum(ilp["status_counts"].values()) == len(slices)
    for s in slices:
        assert s["status"] in STATUSES and s["pass"] in ("forward", "backward") and s["layers"]
        assert s["microbatch"] == 1 and s["tmp"] in preset("bert-base").tmp_widths
        assert s["gap"] is None or 0 <= s["gap"] <= 1
        if s["status"] in ("optimal", "trivial"):
            assert s["gap"] in (0.0, None)
    gaps = [s["gap"] for s in slices if s["gap"] is not None]
    assert ilp["worst_gap"] == max(gaps)
    assert ilp["gap_unknown"] == sum(1 for s in slices if s["gap"] is None and s["status"] not in
                                     ("optimal", "trivial"))
    if ilp["worst_gap"]:
        assert ilp["worst_slice"]["gap"] == ilp["worst_gap"]
    json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))   # no NaN / Infinity
    code, out, _ = run(capsys, *PLACE)
    line = next(ln for ln in out.splitlines() if ln.startswith("  layer ILP"))
    assert f"{len(slices)} distinct slice(s)" in line and "worst gap" in line


def test_place_sequential_says_no_ilp(capsys):
    code, out, _ = run(capsys, "place", "bert-base", "--arch", "tpuv4", "--accelerators", "32",
                       "--global-batch", "128", "--seq", "128", "--hbm", "32", "--sequential")
    assert code == 0 and "layer ILP    not used (sequential schedules" in out


def test_place_infeasible_says_why(capsys):
    """gpt3-175b does not fit 8 accelerators of 32 GB: infeasible, with the DP's reason."""
    code, out, _ = run(capsys, "place", "gpt3-175b", "--arch", "tpuv4", "--accelerators", "8",
                       "--global-batch", "8", "--hbm", "32", "--sequential", "--fixed", "8,1,1", "--json")
    res = json.loads(out)
    assert code == 0 and not res["placement"]["feasible"] and res["throughput"] == 0
    assert res["placement"]["reason"]
    code, out, _ = run(capsys, "place", "gpt3-175b", "--arch", "tpuv4", "--accelerators", "8",
                       "--global-batch", "8", "--hbm", "32", "--sequential", "--fixed", "8,1,1")
    assert "infeasible: " + res["placement"]["reason"] in out


@pytest.mark.parametrize("argv, match", [
    (["--expert", "2,2"], "--expert must be p,d,t"),
    (["--expert", "64,64,1"], "--expert 64,64,1 needs 4096 accelerators, more than --devices 1024"),
    (["--expert", "2,4,1", "--fixed", "2,4,1"], "--fixed and --expert exclude each other"),
    (["--expert", "paper"], "--expert paper: the paper gives no expert placement for 'bert-base'"),
])
def test_place_expert_bad_input(capsys, argv, match):
    code, out, err = run(capsys, "place", "bert-base", "--arch", "tpuv4", "--sequential", *argv)
    assert code == 2 and out == "" and match in err and err.count("\n") == 1


def test_place_expert_paper_is_table_4(capsys):
    code, out, _ = run(capsys, "place", "bert-large", "--arch", "tpuv4", "--seq", "128", "--sequential",
                       "--expert", "paper", "--json")
    res = json.loads(out)
    pl = res["placement"]
    assert code == 0 and res["strategy"] == "expert" and (pl["p"], pl["d"], pl["t"]) == (8, 128, 1)


# ---------------------------------------------------------------------- solve-dp
def test_solve_dp_without_a_split_says_why(capsys, tmp_path):
    """A node larger than an accelerator's memory and no CPU: infeasible, with the solver's finding
    (the summary no longer crashes on the empty device loads)."""
    path = tmp_path / "inf.json"
    path.write_text(json.dumps({
        "maxSizePerFPGA": 1000, "maxFPGAs": 1, "maxCPUs": 0,
        "nodes": [{"id": 0, "supportedOnFpga": 1, "cpuLatency": 1.0, "fpgaLatency": 1.0, "isBackwardNode": 0,
                   "size": 2000},
                  {"id": 1, "supportedOnFpga": 1, "cpuLatency": 1.0, "fpgaLatency": 1.0, "isBackwardNode": 0,
                   "size": 10}],
        "edges": [{"sourceId": 0, "destId": 1, "cost": 0.5}]}))
    code, out, _ = run(capsys, "solve-dp", str(path), "--json")
    res = json.loads(out)
    assert code == 0 and res["max_load"] is None and res["status"] == "infeasible"
    assert res["reason"].startswith("a node fits on no device; no split meets the constraints")
    code, out, _ = run(capsys, "solve-dp", str(path))
    assert code == 0 and "no split     a node fits on no device" in out


def test_solve_dp_with_a_split_has_no_reason(capsys):
    path = str(DNN_DATA / "throughput-inputs/LayerGraphs/bert24_inference.json")
    code, out, _ = run(capsys, "solve-dp", path, "--json")
    res = json.loads(out)
    assert code == 0 and res["max_load"] > 0 and res["reason"] is None


# ---------------------------------------------------------------------- search summary
def test_search_summary_prints_ilp_answers_and_why_nothing_fits(capsys):
    from archplace.cli.searching import print_search

    res = {"models": ["bert-base", "gpt3-175b"], "num_devices": 64, "global_batch": 256, "searcher": "phaze",
           "evaluated": 3, "failed": 0, "infeasible": 3, "common": None, "reference": None,
           "speedup_vs_reference": {}, "out_dir": "runs/x",
           "per_model": {"bert-base": {"arch_label": "A", "throughput": 10.0, "p": 2, "d": 4, "t": 1,
                                       "microbatch": 1, "ilp_status": {"optimal": 5, "feasible": 1},
                                       "ilp_worst_gap": 0.1}},
           "stats": {"wall_s": 1.0, "ilp": {"status_counts": {"optimal": 15, "feasible": 3}, "worst_gap": 0.1,
                                            "worst_gap_at": {"model": "bert-base", "arch_label": "A"},
                                            "gap_unknown": 2},
                     "no_placement": {"gpt3-175b": {"expert stage 0 needs 40.00 GiB of HBM": 2, "x": 1}}}}
    print_search(res)
    out = capsys.readouterr().out
    assert ("ILP answers  18 slice solves over architectures × models: 3 feasible, 15 optimal; "
            "worst gap 10.0% (bert-base on A); 2 without a proven bound") in out
    assert "ILP 1 feasible, 5 optimal, worst gap 10.0%" in out
    assert "no architecture gave a feasible placement (3 infeasible, 0 failed" in out
    assert ("gpt3-175b      no feasible placement on any architecture evaluated; most often: expert stage 0 "
            "needs 40.00 GiB of HBM (2 of 3)") in out
