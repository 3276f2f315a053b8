"""Every ``archplace`` command's ``--json`` output on small inputs, compared with stored copies
(``tests/golden/cli/``). The copies were written before the command line moved from
``archplace/platform/cli.py`` to ``archplace/cli/``: the move must not change a flag, a key or a value.

Fields that measure the machine rather than the answer (``*wall_s``, ``timing_s``, solver seconds) and
temporary paths are left out of the comparison. A change that means to alter a command's JSON rewrites
the copies with ``ARCHPLACE_UPDATE_GOLDEN=1 pytest tests/test_cli_json.py`` and says why in its commit."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import DNN_DATA

from archplace.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden" / "cli"
UPDATE = os.environ.get("ARCHPLACE_UPDATE_GOLDEN") == "1"
# keys that measure the machine (wall clock), not the answer
VOLATILE = ("wall_s", "timing_s", "solve_time_s", "elapsed_s")
VOLATILE_KEYS = ("time_s", "lattice_s")  # the max-load solver's seconds in solve-dp's stats
LAYER_GRAPH = "throughput-inputs/LayerGraphs/bert24_training.json"

SMALL = {
    "models": ["models"],
    "graph": ["graph", "bert-base", "--seq", "32"],
    "estimate": ["estimate", "bert-base", "--arch", "tpuv4", "--seq", "32"],
    "estimate-gpu": ["estimate", "bert-base", "--gpu", "h200", "--seq", "32"],
    "place-sequential": ["place", "bert-base", "--arch", "tpuv4", "--devices", "8",
                         "--global-batch", "64", "--seq", "64", "--sequential", "--hbm", "32"],
    # the layer ILP stops on deterministic budgets (issue 28), so its answer can be stored too; a
    # small budget keeps it quick (a few backward slices stop at it)
    "place-ilp": ["place", "bert-base", "--arch", "tpuv4", "--devices", "8", "--global-batch", "64",
                  "--seq", "64", "--hbm", "32", "--ilp-det-time", "0.2"],
    "solve-dp": ["solve-dp", "{dnn}/" + LAYER_GRAPH],
    "pipeline": ["pipeline", "bert-48", "--devices", "24"],
    "place-ops": ["place-ops", "txl-2", "--algo", "m-etf"],
    "partition": ["partition", "bert-base", "--seq", "128", "--devices", "8", "--algo", "sa",
                  "--max-evals", "10"],
}


def scrub(x, tmp: str = ""):
    """``x`` without the machine-dependent fields, temporary paths replaced by ``TMP``."""
    if isinstance(x, dict):
        return {k: scrub(v, tmp) for k, v in x.items() if not k.endswith(VOLATILE) and k not in VOLATILE_KEYS}
    if isinstance(x, list):
        return [scrub(v, tmp) for v in x]
    if isinstance(x, str) and tmp and tmp in x:
        return x.replace(tmp, "TMP")
    return x


def skeleton(x):
    """The keys of ``x`` and the types of its leaves: the shape of a result whose values depend on
    training that is not bit-reproducible (``tune-rl``)."""
    if isinstance(x, dict):
        return {k: skeleton(v) for k, v in x.items()}
    if isinstance(x, list):
        return [skeleton(x[0])] if x else []
    return "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x).__name__


def check_golden(name: str, res: dict, tmp: str = "", keys_only: bool = False) -> None:
    """``res`` (scrubbed) equals ``tests/golden/cli/NAME.json`` (with ``keys_only``: its keys and leaf
    types do)."""
    got = scrub(res, tmp)
    if keys_only:
        got = skeleton(got)
    path = GOLDEN / f"{name}.json"
    if UPDATE or not path.exists():
        assert UPDATE, f"no golden copy {path}: run with ARCHPLACE_UPDATE_GOLDEN=1 to write it"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True, default=str) + "\n")
        return
    want = json.loads(path.read_text())
    assert_close(json.loads(json.dumps(got, default=str)), want, name)


def assert_close(got, want, where: str) -> None:
    """Equal structure and values; floats to a relative 1e-12 (the last bits of a sum may differ)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, sorted(got), sorted(want))
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-300), (where, got, want)
    else:
        assert got == want, (where, got, want)


def run_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------ invariants
# A golden copy is regenerated from the code each time the code means to change its answer, so it only
# says "unchanged". Beside each comparison stands what must hold whatever the numbers: closed forms
# worked out by hand, parts that sum to their total, transformers' own parameter counts, a cost
# recomputed from the input file, the optimum against a brute force. They run on the live result.
APPROX = dict(rel=1e-9, abs=1e-15)
S, D, LAYERS = 32, 768, 12  # bert-base at --seq 32, one sample: hidden 768, 12 encoder layers


@functools.cache
def hf_params(name: str) -> int:
    """Parameters of the model as transformers builds it (meta device: no memory, no download)."""
    import torch
    import transformers

    with torch.device("meta"):
        if name == "bert-base":
            m = transformers.BertModel(transformers.BertConfig())  # its defaults are BERT-Base's
        elif name == "t5-base":
            m = transformers.T5ForConditionalGeneration(transformers.T5Config(
                d_model=768, d_ff=3072, d_kv=64, num_heads=12, num_layers=12, vocab_size=32128))
        else:
            raise KeyError(name)
    return sum(p.numel() for p in m.parameters())


def bert_base_gemm_flops(s: int = S) -> int:
    """Forward GEMM flops of BERT-Base on one sample of ``s`` tokens, by hand: per layer Q, K, V and
    the output projection (2·s·d·d each), the FFN (2·s·d·4d twice), QKᵀ and attention·V (2·s·s·d each);
    the pooler's d x d on the CLS token."""
    per_layer = 4 * 2 * s * D * D + 2 * (2 * s * D * 4 * D) + 2 * (2 * s * s * D)
    return LAYERS * per_layer + 2 * D * D


def check_training_memory(mem: dict, params: int) -> None:
    """Mixed-precision Adam: bf16 weights and gradients (2 B a parameter each), fp32 master copy, m
    and v (12 B); the four parts are the total."""
    assert mem["optimizer"] == "adam"
    assert mem["weight_bytes"] == mem["gradient_bytes"] == 2 * params
    assert mem["optimizer_bytes"] == 12 * params
    assert mem["total_bytes"] == (mem["weight_bytes"] + mem["gradient_bytes"] + mem["optimizer_bytes"]
                                  + mem["activation_bytes"])


def inv_models(res: dict) -> None:
    blocks = {m["name"]: m["blocks"] for m in res["models"]}
    assert len(blocks) == len(res["models"])  # names are unique
    # the papers' layer counts (T5: encoder + decoder blocks)
    assert {k: blocks[k] for k in ("bert-base", "bert-large", "gpt2-xl", "opt-350m", "llama2-7b", "t5-base",
                                   "bert-48", "megatron-8.3b", "gpt3-175b")} == {
        "bert-base": 12, "bert-large": 24, "gpt2-xl": 48, "opt-350m": 24, "llama2-7b": 32, "t5-base": 24,
        "bert-48": 48, "megatron-8.3b": 72, "gpt3-175b": 96}
    for m in res["models"]:  # TMP widths: powers of two from 1
        assert m["tmp_widths"][0] == 1 and all(w & (w - 1) == 0 for w in m["tmp_widths"]), m


def inv_graph(res: dict) -> None:
    params = hf_params("bert-base")
    assert res["parameters"] == params and res["weight_bytes"] == 2 * params
    assert res["ops"] == res["forward_ops"] + res["backward_ops"]
    assert sum(res["ops_by_core"].values()) == res["forward_ops"]
    # embed, 12 encoder layers, head; the repeated groups cover each layer once
    assert res["layers"] == LAYERS + 2 == sum(g["count"] for g in res["repeated_layer_groups"])
    assert res["unique_layers"] == len(res["repeated_layer_groups"])
    # the GEMMs are all but a fraction of a percent of the forward flops (the rest: norms, softmax, adds)
    assert bert_base_gemm_flops() <= res["forward_flops"] <= 1.01 * bert_base_gemm_flops()


def inv_estimate(res: dict) -> None:
    ops, tot = res["ops"], res["totals"]
    check_training_memory(res["memory"], hf_params("bert-base"))
    # the totals are the sums of the ops
    for core, t in tot["by_core_single_s"].items():
        assert sum(o["single_core_s"] for o in ops if o["core"] == core) == pytest.approx(t, **APPROX)
    assert sum(tot["by_core_single_s"].values()) == pytest.approx(tot["sequential_single_core_s"], **APPROX)
    for p in ("forward", "backward"):
        in_pass = sum(o["single_core_s"] for o in ops if o["pass"] == p)
        assert in_pass == pytest.approx(tot[f"{p}_s"], **APPROX)
    assert sum(o["all_cores_s"] for o in ops) == pytest.approx(tot["all_cores_s"], **APPROX)
    assert sum(o["flops"] for o in ops) == tot["flops"]
    # eight cores never make an op slower than one
    assert all(o["all_cores_s"] <= o["single_core_s"] * (1 + 1e-12) for o in ops)
    # closed forms: the backward of each GEMM is two GEMMs of its size (dX and dW); forward, the GEMMs
    # carry their fused epilogues (GELU, tanh, the 1/sqrt(d) scale) on top, a fraction of a percent
    gemm = ("linear", "matmul")
    fwd = sum(o["flops"] for o in ops if o["pass"] == "forward" and o["kind"] in gemm)
    bwd = sum(o["flops"] for o in ops if o["pass"] == "backward" and o["kind"] in gemm)
    assert bwd == 2 * bert_base_gemm_flops()
    assert bert_base_gemm_flops() <= fwd <= 1.005 * bert_base_gemm_flops()


def inv_estimate_gpu(res: dict) -> None:
    params = hf_params("bert-base")
    check_training_memory(res["memory"], params)
    assert res["fits"] == (res["memory"]["total_bytes"] <= res["memory"]["gpu_bytes"])
    assert res["memory"]["gpu_bytes"] == 141 * 2**30  # the H200's HBM3e
    layers = res["layers"]
    assert len(layers) == LAYERS + 2 and sum(x["ops"] for x in layers) == 789
    for p in ("forward", "backward"):
        assert sum(x[f"{p}_s"] for x in layers) == pytest.approx(res[f"{p}_s"], **APPROX)
    mb = res["forward_s"] + res["backward_s"]
    assert sum(res["by_core_s"].values()) == pytest.approx(mb, **APPROX)
    assert sum(res["by_kind_s"].values()) == pytest.approx(mb, **APPROX)
    assert res["microbatch_time_s"] == pytest.approx(mb, **APPROX)
    # a step: the micro-batches, then the optimizer's update, memory-bound at the H200's 4.8 TB/s
    opt = res["optimizer"]
    assert opt["params"] == params and opt["hbm_bytes_per_s"] == 4.8e12
    assert res["optimizer_s"] == pytest.approx(params * opt["bytes_per_param"] / 4.8e12, **APPROX)
    assert res["step_time_s"] == pytest.approx(res["microbatches"] * mb + res["optimizer_s"], **APPROX)
    assert res["achieved_flops_per_s"] == pytest.approx(res["flops"] / res["step_time_s"], **APPROX)
    assert res["mfu"] == pytest.approx(res["achieved_flops_per_s"] / 989.5e12, **APPROX)  # bf16 dense peak


def check_stages(stages: list[dict], n_layers: int) -> None:
    """Pipeline stages cut the layers into contiguous runs, each layer in exactly one."""
    assert stages[0]["first"] == 0 and stages[-1]["last"] == n_layers - 1
    assert all(b["first"] == a["last"] + 1 for a, b in zip(stages, stages[1:]))


def inv_place(res: dict) -> None:
    pl, G = res["placement"], res["global_batch"]
    st = pl["stages"]
    check_stages(st, LAYERS + 2)
    assert pl["p"] == len(st) and pl["p"] * pl["d"] * pl["t"] <= res["accelerators"]
    assert pl["max_load_s"] == max(x["load_s"] for x in st)
    # a synchronous pipeline of G / (microbatch · d) micro-batches: fill and drain (p − 1 more slots of
    # the slowest stage), then the gradient sync the schedule could not hide
    n_micro = G / (pl["microbatch"] * pl["d"])
    assert pl["time_per_batch_s"] == pytest.approx((n_micro + pl["p"] - 1) * pl["max_load_s"]
                                                   + pl["exposed_sync_s"], **APPROX)
    assert pl["throughput"] == pytest.approx(G / pl["time_per_batch_s"], **APPROX) == res["throughput"]
    # every weight is on exactly one stage: the stages' weights are the model's (bf16)
    assert sum(x["weight_bytes"] for x in st) == 2 * hf_params("bert-base")
    assert all(x["memory_bytes"] <= pl["hbm_gb"] * 2**30 for x in st)
    # the answer is the best feasible configuration tried
    assert res["throughput"] == max(c["throughput"] for c in res["configs"] if c["feasible"])


def inv_pipeline(res: dict) -> None:
    dev, t, a, ar = res["devices"], res["stage_time_s"], res["transfer_s"], res["allreduce_s"]
    k = res["stages"]
    assert len(dev) == len(t) == len(ar) == k == len(res["cuts"]) + 1 == len(a) + 1
    assert sum(dev) == res["gpus"] == 24 and res["device_cuts"] == np.cumsum(dev)[:-1].tolist()
    assert res["cuts"] == sorted(res["cuts"]) and 0 < res["cuts"][0] and res["cuts"][-1] < res["forward_ops"]
    # GPipe with 16 micro-batches: one pass through every stage and link, 15 more of the slowest, then
    # the slowest stage's gradient AllReduce
    assert res["length_s"] == pytest.approx(sum(t) + sum(a) + 15 * max(t + a) + max(ar), **APPROX)
    # the DP is exact: its plan is the unpruned optimum's
    assert res["gap"] == 0.0 and res["length_s"] == res["optimal_length_s"] == res["optimum"]["length_s"]
    assert res["optimum"]["proven_optimal"] and res["optimum"]["cuts"] == res["cuts"]


def inv_place_ops(res: dict) -> None:
    pl, busy = res["placement"], res["compute_busy_s"]
    assert len(pl) == res["nodes"] and set(pl.values()) <= set(range(res["devices"]))
    # the work is only moved: one device alone computes what the two do (and sends nothing)
    assert res["single_device_step_time_s"] == pytest.approx(sum(busy), **APPROX)
    assert res["step_time_s"] >= max(busy) * (1 - 1e-12)  # no device finishes before its own compute
    assert res["speedup_over_single"] == pytest.approx(res["single_device_step_time_s"] / res["step_time_s"],
                                                       **APPROX)
    assert res["valid"] and all(m <= res["memory_bytes"] for m in res["peak_memory_bytes"])


def inv_partition(res: dict) -> None:
    lat, asg = res["chip_latency_s"], res["assignment"]
    assert len(asg) == res["nodes"] and len(lat) == res["chiplets"] == 8
    assert res["chips_used"] == len(set(asg.values())) and set(asg.values()) <= set(range(8))
    # a pipeline over the chips: one sample leaves per slowest chip's latency
    assert res["valid"] and res["throughput"] == pytest.approx(1.0 / max(lat), **APPROX)
    assert res["improvement"] == pytest.approx(res["throughput"] / res["greedy_throughput"], **APPROX)


def inv_solve_dp(res: dict) -> None:
    """Each device's load recomputed from the input file: its nodes' accelerator latencies plus the
    cost of every edge it sends or receives across devices; the answer is the largest."""
    graph = json.loads((DNN_DATA / LAYER_GRAPH).read_text())
    lat = {n["id"]: float(n["fpgaLatency"]) for n in graph["nodes"]}
    size = {n["id"]: float(n["size"]) for n in graph["nodes"]}
    where = {v: d["device"] for d in res["devices"] for v in d["nodes"]}
    assert sorted(where) == sorted(lat) and sum(len(d["nodes"]) for d in res["devices"]) == len(lat)
    for d in res["devices"]:
        cut = sum(float(e["cost"]) for e in graph["edges"]
                  if (where[e["sourceId"]] == d["device"]) != (where[e["destId"]] == d["device"]))
        assert d["load"] == pytest.approx(sum(lat[v] for v in d["nodes"]) + cut, **APPROX), d["device"]
        if d["kind"] == "accelerator":
            assert sum(size[v] for v in d["nodes"]) <= float(graph["maxSizePerFPGA"])
    assert res["max_load"] == max(d["load"] for d in res["devices"])
    assert sum(d["kind"] == "accelerator" for d in res["devices"]) == res["k"] == int(graph["maxFPGAs"])
    # no split beats the average over the accelerators or the slowest node
    assert res["max_load"] >= max(sum(lat.values()) / res["k"], max(lat.values()))
    assert res["lower_bound"] <= res["max_load"] and res["max_load"] == pytest.approx(res["reference"])


INVARIANTS = {
    "models": inv_models, "graph": inv_graph, "estimate": inv_estimate, "estimate-gpu": inv_estimate_gpu,
    "place-sequential": inv_place, "place-ilp": inv_place, "pipeline": inv_pipeline,
    "place-ops": inv_place_ops, "partition": inv_partition, "solve-dp": inv_solve_dp,
}


def test_every_golden_comparison_has_invariants():
    assert set(INVARIANTS) == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_command_json_is_unchanged(name, capsys):
    dnn = str(DNN_DATA)
    argv = [a.replace("{dnn}", dnn) for a in SMALL[name]]
    res = run_json(capsys, argv)
    INVARIANTS[name](res)
    check_golden(name, res, dnn)


def test_search_and_report_json_are_unchanged(ray_session, tmp_path, capsys):
    out = tmp_path / "s"
    res = run_json(capsys, ["search", "bert-base", "--devices", "64", "--global-batch", "256",
                            "--microbatches", "1", "--hbm", "32", "--tmp-widths", "1",
                            "--schedule", "sequential", "--max-archs", "2", "--workers", "1",
                            "--out", str(out)])
    inv_search(res)
    check_golden("search", res, str(tmp_path))
    rep = run_json(capsys, ["report", str(out)])
    # the golden copy holds only the report's path: what the report says is checked against the search
    inv_report(Path(rep["report"]).read_text(), res)
    check_golden("report", rep, str(tmp_path))


def inv_report(text: str, res: dict) -> None:
    """The report names the search's best architecture with its throughput and {p,d,t}, ranks as many
    architectures as were evaluated, and its samples/s per mm² is throughput / area."""
    best, common = res["per_model"]["bert-base"], res["common"]
    tp = best["throughput"]
    assert f"**{common['arch_label']}**, {tp:,.1f} samples/s on average" in text
    assert f"{{{best['p']},{best['d']},{best['t']}}}" in text
    ranked = [line for line in text.splitlines() if re.match(r"\|\s+\d+ \| \{", line)]
    assert len(ranked) == res["evaluated"] and common["arch_label"] in ranked[0]
    assert f"{tp:,.1f}" in ranked[0] and f"{tp / common['area_mm2']:.2f}" in ranked[0]


def inv_search(res: dict) -> None:
    G, n = res["global_batch"], res["num_devices"]
    assert res["evaluated"] == res["stats"]["new_trials"] == 2 and res["failed"] == res["infeasible"] == 0
    best = res["per_model"]["bert-base"]
    assert res["common"]["per_model"]["bert-base"] == {k: v for k, v in best.items()
                                                       if k in res["common"]["per_model"]["bert-base"]}
    st = best["stages"]
    check_stages(st, LAYERS + 2)
    assert best["p"] == best["num_stages"] == len(st) and best["p"] * best["d"] * best["t"] <= n
    assert best["throughput"] == pytest.approx(G / best["time_per_batch_s"], **APPROX)
    # no faster than the pipeline's own fill, drain and G / (microbatch · d) slots of its slowest stage
    slots = G / (best["microbatch"] * best["d"]) + best["p"] - 1
    assert best["time_per_batch_s"] >= slots * max(x["load_s"] for x in st) * (1 - 1e-12)
    assert res["common"]["throughput_avg"] == best["throughput"]  # one model: its own
    ref = res["reference"]["per_model"]["bert-base"]["throughput"]
    assert res["speedup_vs_reference"]["bert-base"] == pytest.approx(best["throughput"] / ref, **APPROX)
