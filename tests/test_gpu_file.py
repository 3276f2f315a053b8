"""A GPU of the user's own, given as a .json file of ``GPUSpec``'s fields (``--gpu FILE``): a copy of a
preset's fields under another name must give that preset's numbers in every command that takes a GPU,
and a bad file is refused in one line naming the field."""

import dataclasses
import json

import pytest

from archplace import api
from archplace.api.sharding import ShardRequest, shard
from archplace.hardware.gpus import GPUS, gpu_spec, load_gpu_file
from archplace.simulators.gpu_step import SRAM_BYTES


def _copy_of(preset: str, tmp_path, name: str = "my-gpu", **over) -> str:
    spec = GPUS[preset]
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    fields.update(name=name, label=name, peak_flops_per_s=dict(spec.peak_flops_per_s),
                  sram_bytes_per_sm=SRAM_BYTES[preset], **over)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(fields))
    return str(path)


def test_a_copy_of_a_preset_loads_with_the_same_numbers(tmp_path):
    spec = load_gpu_file(_copy_of("h100-sxm", tmp_path))
    ref = GPUS["h100-sxm"]
    assert spec.name == "my-gpu"
    for f in ("vector_flops_per_s", "hbm_bytes_per_s", "memory_bytes", "nvlink_bytes_per_s",
              "pcie_bytes_per_s", "ib_bytes_per_s", "launch_s"):
        assert getattr(spec, f) == getattr(ref, f)
    assert dict(spec.peak_flops_per_s) == dict(ref.peak_flops_per_s)
    assert gpu_spec(_copy_of("h100-sxm", tmp_path)) == spec


def test_the_gpu_step_of_a_copied_file_equals_the_presets(tmp_path):
    # the roofline has no measured calibration: a file GPU and its preset are timed by the same formula
    kw = dict(mbs=2, seq=128, op_model="roofline", attention="sdpa")
    a = api.estimate_gpu(api.GpuEstimateRequest("bert-base", gpu="h100-sxm", **kw))
    b = api.estimate_gpu(api.GpuEstimateRequest("bert-base", gpu=_copy_of("h100-sxm", tmp_path), **kw))
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-12)
    assert b.memory["total_bytes"] == a.memory["total_bytes"]
    # twice the HBM bandwidth can only make the memory-bound parts faster, never slower
    fast = _copy_of("h100-sxm", tmp_path, name="fast-gpu",
                    hbm_bytes_per_s=2 * GPUS["h100-sxm"].hbm_bytes_per_s)
    c = api.estimate_gpu(api.GpuEstimateRequest("bert-base", gpu=fast, **kw))
    assert c.step_time_s < a.step_time_s


def test_shard_prices_a_copied_file_as_its_preset(tmp_path):
    a = shard(ShardRequest("t5-base", devices=4, algo="megatron", gpu="v100-sxm2"))
    b = shard(ShardRequest("t5-base", devices=4, algo="megatron", gpu=_copy_of("v100-sxm2", tmp_path)))
    assert b.step_s == pytest.approx(a.step_s, rel=1e-12)
    assert b.comm_s == pytest.approx(a.comm_s, rel=1e-12)


@pytest.mark.parametrize("change, words", [
    ({"name": "h200"}, "field 'name' is 'h200', a preset's name"),
    ({"hbm_bytes_per_s": "fast"}, "field 'hbm_bytes_per_s' must be a number"),
    ({"colour": "green"}, "field 'colour' is unknown"),
    ({"peak_flops_per_s": {"bf16": 1e15}}, "needs the dtypes"),
    ({"memory_bytes": None}, "field 'memory_bytes' must be a number"),
])
def test_a_bad_gpu_file_is_refused_naming_the_field(tmp_path, change, words):
    path = tmp_path / "bad.json"
    fields = json.loads(open(_copy_of("h200", tmp_path)).read())
    fields.update(change)
    path.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        load_gpu_file(str(path))
    assert "\n" not in str(e.value)


def test_a_missing_field_and_a_missing_file_are_named(tmp_path):
    fields = json.loads(open(_copy_of("h200", tmp_path)).read())
    del fields["sram_bytes_per_sm"]
    (tmp_path / "short.json").write_text(json.dumps(fields))
    with pytest.raises(ValueError, match="lacks the field 'sram_bytes_per_sm'"):
        load_gpu_file(str(tmp_path / "short.json"))
    with pytest.raises(ValueError, match="does not exist"):
        gpu_spec(str(tmp_path / "nope.json"))
