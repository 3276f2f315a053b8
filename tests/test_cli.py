"""The command-line contract: summaries, --json, --out, one-line errors."""

import json

import pytest
from conftest import DNN_DATA

from archplace.cli import main
from archplace.workloads import OpGraph

DNN = str(DNN_DATA / "throughput-inputs/LayerGraphs/bert24_inference.json")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_models_lists_every_preset(capsys):
    code, out, _ = run(capsys, "models", "--json")
    names = [m["name"] for m in json.loads(out)["models"]]
    assert code == 0 and {"bert-large", "gpt3-175b", "llama2-7b", "t5-base"} <= set(names)
    code, out, _ = run(capsys, "models")
    assert "megatron-8.3b" in out and "GPT2LMHeadModel" in out


def test_graph_json_fields_and_parquet(capsys, tmp_path):
    path = tmp_path / "b.parquet"
    code, out, _ = run(capsys, "graph", "bert-large", "--seq", "128", "--mbs", "2", "--tmp", "2",
                       "--out", str(path), "--json")
    res = json.loads(out)
    assert code == 0
    assert res["layers"] == 26 and res["tmp"] == 2 and res["mbs"] == 2
    assert res["forward_flops"] > 0
    assert res["backward_flops"] == pytest.approx(2 * res["forward_flops"], rel=0.02)
    groups = {g["count"] for g in res["repeated_layer_groups"]}
    assert 23 in groups  # blocks 0..22 repeat; block 23 also feeds the outputs
    g = OpGraph.from_parquet(path)
    assert g.num_nodes == res["ops"] and g.meta["tmp"] == 2
    code, out, _ = run(capsys, "graph", str(path), "--json")
    assert json.loads(out)["ops"] == res["ops"]


def test_graph_human_summary(capsys):
    code, out, _ = run(capsys, "graph", "bert-base", "--seq", "64")
    assert code == 0 and "parameters   109,482,240" in out and "repeated" in out


def test_graph_loads_dnn_partitioning_json(capsys):
    code, out, _ = run(capsys, "graph", DNN, "--json")
    res = json.loads(out)
    assert code == 0 and res["source"] == "dnn-partitioning" and res["ops"] > 0


@pytest.mark.parametrize("argv, match", [
    (["graph", "bert-huge"], "unknown model 'bert-huge'"),
    (["graph", "bert-base", "--mbs", "0"], "mbs must be a positive integer"),
    (["graph", "gpt2-xl", "--tmp", "2"], "tmp width 2 does not divide field 'num_attention_heads' = 25"),
    (["graph", "missing.parquet"], "does not exist"),
])
def test_bad_input_is_one_line(capsys, argv, match):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert match in err and err.count("\n") == 1 and "Traceback" not in err


def test_estimate_json_totals_are_consistent(capsys, tmp_path):
    code, out, _ = run(capsys, "estimate", "bert-base", "--arch", "tpuv4", "--seq", "128", "--json")
    res = json.loads(out)
    assert code == 0 and res["backend"] == "analytical" and res["arch"]["num_tc"] == 8
    single = sum(o["single_core_s"] for o in res["ops"])
    assert res["totals"]["sequential_single_core_s"] == pytest.approx(single)
    assert res["totals"]["all_cores_s"] < single
    graph = json.loads(run(capsys, "graph", "bert-base", "--seq", "128", "--json")[1])
    assert len(res["ops"]) == graph["ops"]
    arch = tmp_path / "a.json"
    arch.write_text(json.dumps({"num_tc": 1, "num_vc": 1024, "pe_x": 256, "pe_y": 256, "glb_mb": 8}))
    code, out, _ = run(capsys, "estimate", "bert-base", "--arch", str(arch), "--seq", "128")
    assert code == 0 and "{1, 1024, 256, 256, 256} glb 8 MB" in out


@pytest.mark.parametrize("arch, match", [
    ('{"num_tc": 3, "num_vc": 2, "pe_x": 8, "pe_y": 8, "glb_mb": 8}', "'num_tc' must be a power of two"),
    ('{"num_vc": 2, "pe_x": 8, "pe_y": 8, "glb_mb": 8}', "field 'num_tc' is missing"),
    ('{"num_tc": 1, "num_vc": 2, "pe_x": 8, "pe_y": 8, "glb_mb": 8, "hbm": 3}', "unknown accelerator field"),
])
def test_estimate_bad_architecture_files(capsys, tmp_path, arch, match):
    path = tmp_path / "a.json"
    path.write_text(arch)
    code, out, err = run(capsys, "estimate", "bert-base", "--arch", str(path))
    assert code == 2 and match in err and err.count("\n") == 1


def test_place_sequential_json(capsys):
    code, out, _ = run(capsys, "place", "bert-base", "--arch", "tpuv4", "--accelerators", "32",
                       "--global-batch", "128", "--seq", "128", "--hbm", "32", "--sequential", "--json")
    res = json.loads(out)
    pl = res["placement"]
    assert code == 0 and pl["feasible"] and res["schedule"] == "sequential"
    assert pl["p"] * pl["d"] <= 32 and res["throughput"] == pytest.approx(128 / pl["time_per_batch_s"])
    code, out, _ = run(capsys, "place", "bert-base", "--arch", "tpuv4", "--accelerators", "32",
                       "--global-batch", "128", "--seq", "128", "--hbm", "32", "--sequential",
                       "--fixed", "2,4,1", "--json")
    fixed = json.loads(out)["placement"]
    assert (fixed["p"], fixed["d"], fixed["t"]) == (2, 4, 1)


@pytest.mark.parametrize("argv, match", [
    (["--fixed", "2,2"], "--fixed must be p,d,t"),
    (["--fixed", "64,64,1"], "needs 4096 accelerators, more than --devices 1024"),
    (["--devices", "0"], "argument --devices: must be at least 1"),
])
def test_place_bad_input(capsys, argv, match):
    try:
        code, out, err = run(capsys, "place", "bert-base", "--arch", "tpuv4", "--sequential", *argv)
    except SystemExit as e:  # an argparse error (one line too)
        code, err = e.code, capsys.readouterr().err
    assert code == 2 and match in err and err.count("\n") == 1


def test_solve_dp_reproduces_a_reference(capsys):
    path = str(DNN_DATA / "throughput-inputs/LayerGraphs/bert24_training.json")
    code, out, _ = run(capsys, "solve-dp", path, "--json")
    res = json.loads(out)
    assert code == 0 and res["status"] == "optimal"
    assert res["max_load"] == pytest.approx(41.7458125, rel=1e-6) and res["rel_diff"] <= 1e-6
    code, out, _ = run(capsys, "solve-dp", path)
    assert code == 0 and "reference optimum 41.7458125" in out and "accelerator 0" in out
    code, out, err = run(capsys, "solve-dp", "missing.json")
    assert code == 2 and "does not exist" in err


def test_pipeline_exact_json_and_summary(capsys):
    """`archplace pipeline --algo exact`: the optimum over the candidates, gap 0, server-boundary cuts."""
    code, out, _ = run(capsys, "pipeline", "bert-base", "--cluster", "A", "--algo", "exact", "--json")
    res = json.loads(out)
    assert code == 0
    assert res["stages"] == 2 and res["gpus"] == 16 and res["feasible"]
    assert res["gap"] == 0.0 and res["length_s"] == res["optimal_length_s"]
    assert res["device_cuts"] == [8] and sum(res["devices"]) == 16
    assert len(res["cuts"]) == 1 and res["cut_layers"][0].startswith("encoder.layer.")
    code, out, _ = run(capsys, "pipeline", "bert-base", "--cluster", "B", "--algo", "exact")
    assert code == 0 and "device cuts  [8, 16]" in out and "gap +0.00%" in out


@pytest.mark.parametrize("argv, match", [
    (["pipeline", "bert-base", "--devices", "8"], "--devices: must be 16, 24, 32"),
    (["pipeline", "bert-base", "--devices", "16", "--stages", "9"], "--stages must be in"),
    (["pipeline", "bert-base", "--devices", "16", "--max-evals", "0"], "--max-evals: must be at least 1"),
    (["pipeline", "nosuch", "--devices", "16"], "unknown model"),
    (["pipeline", "bert-base", "--devices", "16", "--algo", "pretrained", "--pretrained", "/nope.npz"],
     "does not exist"),
])
def test_pipeline_bad_input(capsys, argv, match):
    try:
        code, _, err = run(capsys, *argv)
    except SystemExit as e:  # an argparse error (one line too)
        code, err = e.code, capsys.readouterr().err
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1


def test_an_infeasible_placement_is_strict_json_with_its_first_cause(capsys):
    """bert-base's 110M parameters under mixed-precision Adam (2 + 2 + 12 bytes each, 1.6 GiB) on
    2 devices of 0.5 GiB: the total state is the first cause; no Infinity or NaN in the JSON."""
    def strict(text: str):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))

    code, out, _ = run(capsys, "place", "bert-base", "--arch", "tpuv4", "--accelerators", "2", "--seq", "64",
                       "--global-batch", "8", "--hbm", "0.5", "--sequential", "--json")
    pl = strict(out)["placement"]
    assert code == 0 and not pl["feasible"] and pl["time_per_batch_s"] is None and pl["max_load_s"] is None
    assert "the weights, gradients and optimizer state need 1.6 GiB, more than 2 devices × 0.50 GiB" \
        in pl["reason"]
    code, out, _ = run(capsys, "place", "bert-base", "--arch", "tpuv4", "--accelerators", "2", "--seq", "64",
                       "--global-batch", "8", "--hbm", "0.5", "--sequential", "--optimizer", "sgd", "--json")
    assert strict(out)["placement"]["feasible"]  # 4 bytes per parameter fit: the optimizer decided
