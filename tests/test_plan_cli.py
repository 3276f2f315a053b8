"""``archplace plan`` from the command line: the issue's spellings (``--gpus`` beside ``--devices``,
``--instance``, ``--fixed``), the JSON keys, one-line refusals, and the headline case (GPT-3 175B on 1,024
A100s fits and uses at most those GPUs; its speed is a bench, bench/gpu/plan_speed.py, not a test)."""

from __future__ import annotations

import json

import pytest

from archplace.cli.commands import main

BERT = ["plan", "bert-base", "--gpu", "a100-80gb", "--global-batch", "64", "--seq", "512", "--top", "3"]


def run(argv, capsys) -> tuple[int, dict | None, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 and "--json" in argv else None), err


def strip(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "wall_s"}


def test_gpus_and_devices_are_one_flag(capsys):
    rc1, a, _ = run([*BERT, "--gpus", "8", "--json"], capsys)
    rc2, b, _ = run([*BERT, "--devices", "8", "--json"], capsys)
    assert rc1 == rc2 == 0
    assert strip(a) == strip(b)
    best = a["best"]
    for key in ("tp", "pp", "dp", "cp", "vp", "ep", "mbs", "recompute", "sequence_parallel", "zero",
                "attention", "step_time_s", "tokens_per_s", "mfu", "memory_per_gpu_bytes", "fits"):
        assert key in best, key
    assert best["tp"] * best["pp"] * best["dp"] * best["cp"] == 8
    assert best["tokens_per_s"] == pytest.approx(64 * 512 / best["step_time_s"])
    assert a["evaluated"] >= 1 and set(a["pruned"]) == {"memory", "time"} and a["op_model"] == "calibrated"
    assert [c["step_time_s"] for c in a["top"]] == sorted(c["step_time_s"] for c in a["top"])


def test_fixed_knobs_hold(capsys):
    fixed = "tp=2,pp=2,mbs=2,recompute=full,zero=1"
    rc, d, _ = run([*BERT, "--gpus", "8", "--fixed", fixed, "--json"], capsys)
    assert rc == 0
    b = d["best"]
    assert (b["tp"], b["pp"], b["dp"], b["mbs"], b["recompute"], b["zero"]) == (2, 2, 2, 2, "full", 1)
    assert sum(b["layers_per_stage"]) == 12 and len(b["layers_per_stage"]) == 2
    assert d["fixed"] == {"tp": 2, "pp": 2, "mbs": 2, "recompute": "full", "zero": 1}


def test_instance_sets_gpu_network_and_listed_price(capsys):
    rc, d, _ = run(["plan", "bert-base", "--instance", "p4d.24xlarge", "--gpus", "16", "--global-batch", "64",
                    "--seq", "512", "--top", "1", "--json"], capsys)
    assert rc == 0
    assert d["gpu"]["name"] == "a100-40gb" and d["network"]["name"] == "efa-400g"
    assert d["network"]["bytes_per_s_per_gpu"] == pytest.approx(400e9 / 8 / 8)
    assert d["price"]["basis"] == "listed: p4d.24xlarge"
    assert d["best"]["usd_per_hour"] == pytest.approx(32.7726 / 8 * 16)


@pytest.mark.parametrize("argv,needle", [
    ([*BERT, "--gpus", "8", "--fixed", "tq=2"], "--fixed takes KNOB=VALUE pairs"),
    ([*BERT, "--gpus", "8", "--fixed", "zero=4"], "--fixed must be one of [0, 1, 2, 3], got 4"),
    ([*BERT, "--gpus", "8", "--export", "megatron"], "--export needs --out DIR"),
    ([*BERT, "--gpus", "8", "--arch", "tpuv4"], "--arch does not apply"),
    (["plan", "t5-base", "--gpu", "a100-80gb", "--gpus", "8", "--global-batch", "8"], "2 block stacks"),
    (["plan", "bert-base", "--gpus", "8", "--global-batch", "8"], "--gpu or --instance is required"),
    (["plan", "bert-base", "--gpu", "a100-80gb", "--gpus", "12", "--global-batch", "8"],
     "not a whole number of servers"),
])
def test_bad_input_is_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) if "--arch" in argv else _nothing():
        rc = main(argv)
        assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_nothing_fits_says_why(capsys):
    rc, d, _ = run(["plan", "gpt3-175b", "--gpu", "v100-sxm2", "--gpus", "8", "--global-batch", "64",
                    "--json"], capsys)
    assert rc == 0 and d["fits"] is False and d["best"] is None
    assert "weights, gradients and optimizer state alone exceed it" in d["reason"]


def test_gpt3_175b_on_1024_a100s_fits(capsys):
    """The issue's headline command: a configuration that fits 80 GB with tp x pp x dp x cp <= 1024."""
    rc, d, _ = run(["plan", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024", "--global-batch", "1536",
                    "--seq", "2048", "--json"], capsys)
    assert rc == 0 and d["fits"]
    b = d["best"]
    assert b["tp"] * b["pp"] * b["dp"] * b["cp"] <= 1024
    assert b["memory_per_gpu_bytes"] <= 80 * 1024 ** 3 and b["step_time_s"] > 0
    assert 0 < b["mfu"] < 1


@pytest.mark.filterwarnings("ignore::UserWarning")  # megatron-core without Apex and Transformer Engine
def test_gpt3_best_exports_megatron_arguments_megatron_core_accepts(capsys, tmp_path):
    """The issue's done-when: the headline plan's ``--export megatron`` is accepted by megatron-core's own
    configuration classes, with the plan's sizes."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (make install puts it in)")
    from test_plan_export import _megatron_core_configs

    from archplace.api.plan_export import parse_megatron_args

    rc, d, _ = run(["plan", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024", "--global-batch", "1536",
                    "--seq", "2048", "--export", "megatron", "--out", str(tmp_path), "--json"], capsys)
    assert rc == 0 and d["exported"]["files"] == [str(tmp_path / "megatron_args.sh")]
    b = d["best"]
    argv = parse_megatron_args((tmp_path / "megatron_args.sh").read_text())
    config, ddp, micro = _megatron_core_configs(argv, 1024)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
            config.context_parallel_size) == (b["tp"], b["pp"], b["cp"])
    assert config.num_layers == 96 and config.hidden_size == 12288 and config.sequence_parallel == \
        b["sequence_parallel"]
    assert micro.get() == 1536 // (b["mbs"] * b["dp"])
