"""``archplace shard``: --json output (golden copy), T5-base on 8 devices against Megatron, ADP, errors."""

from __future__ import annotations

import pytest
from test_cli_json import APPROX, check_golden, hf_params, run_json

from archplace.cli import main


def test_shard_t5_base_json_is_unchanged_and_no_worse_than_megatron(capsys):
    res = run_json(capsys, ["shard", "t5-base", "--devices", "8"])
    # beside the golden copy, what holds whatever the numbers: transformers' own parameter count; the
    # step is compute plus communication, and the communication is ring AllReduces (2 (d - 1) / d of
    # the bytes each way) over the V100's 150 GB/s NVLink; a variable is partitioned or replicated (-1)
    assert res["graph"]["parameters"] == hf_params("t5-base") == 222_903_552
    assert res["step_s"] == pytest.approx(res["compute_s"] + res["comm_s"], **APPROX)
    ar_bytes = sum(c["bytes"] for c in res["collectives"].values())
    assert res["comm_s"] == pytest.approx(2 * 7 / 8 * ar_bytes / 150e9, **APPROX)
    assert res["partitioned_variables"] == sum(v != -1 for v in res["strategy"].values())
    assert len(res["strategy"]) == res["graph"]["decision_variables"]
    assert res["fits"] == (res["memory_bytes"] <= 32 * 2**30)  # a V100-SXM2's 32 GiB
    assert res["reference"]["speedup"] == pytest.approx(res["reference"]["step_s"] / res["step_s"], **APPROX)
    check_golden("shard", res)
    assert res["status"] == "optimal" and res["fits"]
    ref = res["reference"]
    assert res["step_s"] <= ref["step_s"] * (1 + 1e-12)
    # 12 heads do not split over 8 devices: Megatron's attention splits conflict and are replicated,
    # its MLP and embedding splits stand; the optimum is that plan
    assert ref["dropped"] > 0 and ref["differs"] == 0
    assert res["table3"]["encoder/block.*/layer.*/DenseReluDense/wi/kernel"] == 1
    assert res["table3"]["encoder/block.*/layer.*/DenseReluDense/wo/kernel"] == 0
    assert res["table3"]["shared"] == 0
    assert res["collectives"]["forward allreduce"]["count"] == 24 + 2 + 1  # MLPs, 2 lookups, the loss


def test_shard_t5_base_on_four_devices_is_megatron():
    from archplace.api.sharding import ShardRequest, shard

    res = shard(ShardRequest("t5-base", devices=4))
    assert res.reference["differs"] == 0 and res.reference["dropped"] == 0
    t3 = res.table3
    assert (
        t3["encoder/block.*/layer.*/SelfAttention/q/kernel"],
        t3["encoder/block.*/layer.*/SelfAttention/o/kernel"],
    ) == (1, 0)
    assert t3["encoder/block.*/layer.*/layer_norm/scale"] == -1
    assert res.partitioned_variables == 1 + 2 + 12 * 6 + 12 * 10  # shared, 2 position biases, enc, dec


def test_shard_data_parallel(capsys):
    res = run_json(
        capsys,
        ["shard", "vgg19", "--devices", "8", "--batch", "32", "--data-parallel", "--algo", "exhaustive"],
    )
    assert res["mode"] == "adp" and res["strategy"] == {"features": 0, "labels": 0}
    assert res["collectives"]["backward allreduce"]["count"] == 38  # one per weight and bias


def test_shard_errors(capsys, tmp_path):
    assert main(["shard", "t5-base", "--devices", "8", "--algo", "megatron", "--data-parallel"]) == 2
    assert "algo" in capsys.readouterr().err
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "mistral", "hidden_size": 32}')
    assert main(["shard", "--hf-config", str(cfg), "--devices", "8"]) == 2
    assert "family 'mistral'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["shard", "t5-base"])  # --devices is required
