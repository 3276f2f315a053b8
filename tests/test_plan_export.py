"""archplace.api.plan_export: the launch files of ``archplace plan`` (Megatron-LM, torchtitan, DeepSpeed).

Each file is read back (the bash array as an argument list, tomllib, json) and its values asserted. Then the
consuming library's own code must accept it; ``make install`` installs each library that runs on a CPU-only
machine (the ``export-check`` extra and torchtitan, see the Makefile), and a test skips, saying why, where one
is missing:
- megatron-core 0.16.1, the last release for Python 3.11: ``TransformerConfig`` (its checks of the parallel
  sizes, the pipeline split and layout, recomputation), ``DistributedDataParallelConfig`` and the micro-batch
  calculator, built from the arguments as Megatron-LM's ``core_transformer_config_from_args`` does.
  Megatron-LM's own argument parser (``megatron/training``) is not published as a package; the option names
  were checked by running its ``parse_args``, ``validate_args`` and ``core_transformer_config_from_args``
  (main branch, 2026-08-22) on these plans, by hand, outside the suite.
- torchtitan 0.2.2, the last release with TOML job files (installed without its dependencies, whose pins would
  downgrade huggingface_hub under transformers 5): ``ConfigManager.parse_args(["--job.config_file", path])``,
  which refuses any unknown section or key. torchtitan's package ``__init__`` imports its MoE kernels and so
  triton, which CPU torch does not ship; the fixture imports ``torchtitan.config`` without that ``__init__``.
- deepspeed 0.19.8 (pure Python, no ops built): ``DeepSpeedConfig(dict, mpu)``, with an mpu reporting the
  plan's data-parallel ranks, applies DeepSpeed's batch rule (train_batch_size = micro-batch x accumulation x
  data-parallel ranks) and its section parsers.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tomllib
import types
import typing

import pytest

from archplace.api.plan_export import (
    EXPORT_FORMATS,
    export_plan,
    megatron_argv,
    parse_megatron_args,
    write_export,
)

GPT3 = dict(name="gpt3-175b", hidden=12288, heads=96, kv_heads=96, ffn_hidden=49152, layers=96, vocab=50257,
            max_positions=2048, gated_mlp=False, norm="layernorm", position="learned", tied_embeddings=True)
LLAMA = dict(name="llama3-70b", hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, layers=80, vocab=128256,
             max_positions=8192, gated_mlp=True, norm="rmsnorm", position="rope", tied_embeddings=False)
GPT3_KW = dict(gpus=1024, gpus_per_node=8)
LLAMA_KW = dict(gpus=64, gpus_per_node=8)


def gpt3_plan(**over) -> dict:
    """GPT-3 175B on 1024 GPUs: tp 8 x pp 16 (3 virtual stages per GPU) x dp 8, ZeRO-1."""
    p = dict(tp=8, pp=16, dp=8, cp=1, vp=3, ep=1, mbs=1, global_batch=1536, seq=2048, recompute="selective",
             sequence_parallel=True, zero=1, attention="sdpa", layers_per_stage=[6] * 16)
    p.update(over)
    return p


def llama_plan(**over) -> dict:
    """Llama-3 70B on 64 GPUs: tp 8 x pp 4 x dp 2, FSDP (ZeRO-3), full recomputation."""
    p = dict(tp=8, pp=4, dp=2, cp=1, vp=1, ep=1, mbs=1, global_batch=64, seq=8192, recompute="full",
             sequence_parallel=True, zero=3, attention="sdpa", layers_per_stage=[20] * 4)
    p.update(over)
    return p


def options(argv: list[str]) -> dict:
    """{option: value} of an argument list; True for a switch."""
    out, i = {}, 0
    while i < len(argv):
        assert argv[i].startswith("--"), argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]], i = argv[i + 1], i + 2
        else:
            out[argv[i]], i = True, i + 1
    return out


def one_file(plan, model, fmt, **kw) -> tuple[str, str]:
    files = export_plan(plan, model, fmt=fmt, **kw)
    assert len(files) == 1
    return next(iter(files.items()))


# ------------------------------------------------------------------------------------------------ Megatron-LM


def test_megatron_gpt3_interleaved():
    name, text = one_file(gpt3_plan(), GPT3, "megatron", **GPT3_KW)
    assert name == "megatron_args.sh"
    argv = parse_megatron_args(text)
    assert argv == megatron_argv(gpt3_plan(), GPT3, **GPT3_KW)
    o = options(argv)
    assert {k: o[k] for k in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                              "--context-parallel-size", "--num-layers-per-virtual-pipeline-stage",
                              "--micro-batch-size", "--global-batch-size", "--seq-length",
                              "--max-position-embeddings", "--num-layers", "--hidden-size",
                              "--ffn-hidden-size", "--num-attention-heads")} == {
        "--tensor-model-parallel-size": "8", "--pipeline-model-parallel-size": "16",
        "--context-parallel-size": "1", "--num-layers-per-virtual-pipeline-stage": "2",  # 96 / 16 / 3
        "--micro-batch-size": "1", "--global-batch-size": "1536", "--seq-length": "2048",
        "--max-position-embeddings": "2048", "--num-layers": "96", "--hidden-size": "12288",
        "--ffn-hidden-size": "49152", "--num-attention-heads": "96"}
    assert o["--sequence-parallel"] is True and o["--use-distributed-optimizer"] is True
    assert o["--recompute-granularity"] == "selective" and "--recompute-method" not in o
    assert o["--normalization"] == "LayerNorm" and o["--position-embedding-type"] == "learned_absolute"
    assert o["--attention-backend"] == "flash" and o["--bf16"] is True and o["--grad-reduce-in-bf16"] is True
    for absent in ("--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
                   "--use-megatron-fsdp", "--expert-model-parallel-size", "--pipeline-model-parallel-layout",
                   "--decoder-first-pipeline-num-layers"):
        assert absent not in o
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert "torchrun --nnodes 128 --nproc-per-node 8" in text


def test_megatron_llama_gqa_fsdp_context_parallel():
    plan = llama_plan(pp=1, cp=2, dp=4, layers_per_stage=[80])
    o = options(parse_megatron_args(one_file(plan, LLAMA, "megatron", **LLAMA_KW)[1]))
    assert o["--context-parallel-size"] == "2" and o["--pipeline-model-parallel-size"] == "1"
    assert o["--group-query-attention"] is True and o["--num-query-groups"] == "8"
    assert o["--swiglu"] is True and o["--normalization"] == "RMSNorm"
    assert o["--position-embedding-type"] == "rope" and o["--untie-embeddings-and-output-weights"] is True
    assert o["--disable-bias-linear"] is True  # a SwiGLU decoder without biases, unless model["bias"]
    assert (o["--recompute-granularity"], o["--recompute-method"], o["--recompute-num-layers"]) == (
        "full", "uniform", "1")
    # ZeRO-3 is Megatron-FSDP sharding optimizer state, gradients and parameters
    assert o["--use-megatron-fsdp"] is True and o["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert o["--ckpt-format"] == "fsdp_dtensor"
    text = one_file(plan, LLAMA, "megatron", **LLAMA_KW)[1]
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in text and "export CUDA_DEVICE_MAX_CONNECTIONS" not in text
    o2 = options(megatron_argv(dict(plan, zero=2), LLAMA, **LLAMA_KW))
    assert o2["--data-parallel-sharding-strategy"] == "optim_grads"


def test_megatron_uneven_pipeline_split():
    # first and last stages differ, the middle ones agree: Megatron's first/last-stage counts
    o = options(megatron_argv(gpt3_plan(vp=1, layers_per_stage=[4] + [6] * 14 + [8]), GPT3, **GPT3_KW))
    assert (o["--decoder-first-pipeline-num-layers"], o["--decoder-last-pipeline-num-layers"]) == ("4", "8")
    assert "--pipeline-model-parallel-layout" not in o
    o = options(megatron_argv(gpt3_plan(vp=2, layers_per_stage=[4] + [6] * 14 + [8]), GPT3, **GPT3_KW))
    assert o["--num-virtual-stages-per-pipeline-rank"] == "2"
    # any other split: an explicit layout, stages in model order
    o = options(megatron_argv(gpt3_plan(vp=1, layers_per_stage=[5, 7] + [6] * 14), GPT3, **GPT3_KW))
    assert o["--pipeline-model-parallel-layout"] == "Et*5|t*7|" + "t*6|" * 13 + "t*6L"
    o = options(megatron_argv(gpt3_plan(vp=3, layers_per_stage=[5, 7] + [6] * 14), GPT3, **GPT3_KW))
    stages = o["--pipeline-model-parallel-layout"].split("|")
    assert len(stages) == 48  # pp 16 x vp 3; virtual stage v on pipeline rank v % 16
    assert stages[0] == "Et*2" and stages[16] == "t*2" and stages[32] == "t"  # rank 0: 5 = 2 + 2 + 1
    assert (stages[1], stages[17], stages[33]) == ("t*3", "t*2", "t*2")  # rank 1: 7 = 3 + 2 + 2
    assert stages[-1] == "t*2L"


def test_megatron_options_follow_the_plan():
    o = options(megatron_argv(gpt3_plan(vp=1, zero=0, attention="eager", recompute="none",
                                        sequence_parallel=False), GPT3, **GPT3_KW, grad_reduce_dtype="fp32"))
    for absent in ("--use-distributed-optimizer", "--recompute-granularity", "--sequence-parallel",
                   "--grad-reduce-in-bf16", "--num-layers-per-virtual-pipeline-stage"):
        assert absent not in o
    assert o["--attention-backend"] == "unfused"
    o = options(megatron_argv(llama_plan(ep=2, pp=1, dp=8, layers_per_stage=[80]),
                              dict(LLAMA, experts=16), **LLAMA_KW, dtype="fp16", grad_reduce_dtype="fp32",
                              optimizer="sgd"))
    assert (o["--expert-model-parallel-size"], o["--num-experts"]) == ("2", "16")
    assert o["--fp16"] is True and "--bf16" not in o and o["--optimizer"] == "sgd"
    assert o["--accumulate-allreduce-grads-in-fp32"] is True and o["--disable-bias-linear"] is True
    o = options(megatron_argv(llama_plan(), dict(LLAMA, rope_theta=500000, bias=True), **LLAMA_KW))
    assert o["--rotary-base"] == "500000" and "--disable-bias-linear" not in o
    assert "--hidden-dropout" not in o
    o = options(megatron_argv(llama_plan(), dict(LLAMA, dropout=False), **LLAMA_KW))
    assert (o["--attention-dropout"], o["--hidden-dropout"]) == ("0.0", "0.0")
    with pytest.raises(ValueError, match="^grad_reduce_dtype: "):
        megatron_argv(gpt3_plan(), GPT3, **GPT3_KW, dtype="fp32")
    with pytest.raises(ValueError, match="^model.experts: "):
        megatron_argv(llama_plan(ep=2, pp=1, dp=8, layers_per_stage=[80]), LLAMA, **LLAMA_KW)


def _megatron_core_configs(argv: list[str], gpus: int):
    """megatron-core's configurations from Megatron-LM arguments, mapped as core_transformer_config_from_args
    maps them (options named after TransformerConfig fields; --swiglu, --group-query-attention, the
    first/last-stage counts and the virtual-stage options by hand)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    o = {k[2:].replace("-", "_"): v for k, v in options(argv).items()}
    fields = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    ints = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
            "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
            "expert_model_parallel_size", "recompute_num_layers")
    kw = {k: int(o[k]) for k in ints if k in o}
    for k in ("sequence_parallel", "bf16", "fp16"):
        kw[k] = bool(o.get(k, False))
    kw["add_bias_linear"] = not o.get("disable_bias_linear", False)
    for k in ("recompute_granularity", "recompute_method", "normalization", "pipeline_model_parallel_layout"):
        if k in o:
            kw[k] = o[k]
    for k in ("attention_dropout", "hidden_dropout"):
        if k in o:
            kw[k] = float(o[k])
    assert set(kw) <= set(fields), set(kw) - set(fields)
    kw["num_query_groups"] = int(o["num_query_groups"]) if o.get("group_query_attention") else None
    if o.get("swiglu"):
        kw["gated_linear_unit"], kw["activation_func"] = True, F.silu
    if "num_experts" in o:
        kw["num_moe_experts"] = int(o["num_experts"])
    kw["num_layers_in_first_pipeline_stage"] = int(o.get("decoder_first_pipeline_num_layers", 0)) or None
    kw["num_layers_in_last_pipeline_stage"] = int(o.get("decoder_last_pipeline_num_layers", 0)) or None
    pp = kw["pipeline_model_parallel_size"]
    if "num_layers_per_virtual_pipeline_stage" in o:  # as Megatron-LM's validate_args derives it
        kw["virtual_pipeline_model_parallel_size"] = kw["num_layers"] // pp // int(
            o["num_layers_per_virtual_pipeline_stage"])
    elif "num_virtual_stages_per_pipeline_rank" in o:
        kw["virtual_pipeline_model_parallel_size"] = int(o["num_virtual_stages_per_pipeline_rank"])
    kw["attention_backend"] = AttnBackend[o["attention_backend"]]
    dtype = torch.bfloat16 if kw["bf16"] else torch.float16 if kw["fp16"] else torch.float32
    kw["params_dtype"] = kw["pipeline_dtype"] = dtype
    config = TransformerConfig(**kw)
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=not o.get("grad_reduce_in_bf16", False),
        use_distributed_optimizer=bool(o.get("use_distributed_optimizer")),
        use_megatron_fsdp=bool(o.get("use_megatron_fsdp")),
        data_parallel_sharding_strategy=o.get("data_parallel_sharding_strategy", "no_shard"))
    dp = gpus // (kw["tensor_model_parallel_size"] * pp * kw["context_parallel_size"])
    micro = ConstantNumMicroBatchesCalculator(int(o["global_batch_size"]), int(o["micro_batch_size"]), dp,
                                              False, 0)
    return config, ddp, micro


@pytest.mark.filterwarnings("ignore::UserWarning")  # megatron-core without Apex and Transformer Engine
def test_megatron_core_accepts_the_arguments():
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (make install puts it in)")
    import inspect

    from megatron.core.models.gpt import GPTModel

    cases = [
        (gpt3_plan(), GPT3, GPT3_KW),
        (gpt3_plan(vp=2, layers_per_stage=[4] + [6] * 14 + [8]), GPT3, GPT3_KW),
        (gpt3_plan(vp=3, layers_per_stage=[5, 7] + [6] * 14), GPT3, GPT3_KW),
        (llama_plan(), LLAMA, LLAMA_KW),
        (llama_plan(pp=1, cp=2, dp=4, layers_per_stage=[80], zero=2), LLAMA, LLAMA_KW),
        (llama_plan(pp=1, dp=8, ep=2, layers_per_stage=[80], zero=1), dict(LLAMA, experts=16, dropout=False),
         LLAMA_KW),
    ]
    seen = []
    for plan, model, kw in cases:
        argv = parse_megatron_args(one_file(plan, model, "megatron", **kw)[1])
        config, ddp, micro = _megatron_core_configs(argv, kw["gpus"])
        seen.append((config.virtual_pipeline_model_parallel_size, config.num_layers_in_first_pipeline_stage,
                     config.num_layers_in_last_pipeline_stage, micro.get(),
                     ddp.data_parallel_sharding_strategy))
        assert config.num_layers == model["layers"] and config.tensor_model_parallel_size == plan["tp"]
        assert config.num_query_groups in (None, model["kv_heads"])
        assert config.gated_linear_unit == model["gated_mlp"] and config.add_bias_linear != model["gated_mlp"]
        assert micro.get() == plan["global_batch"] // (plan["mbs"] * plan["dp"])
        # the options GPTModel takes rather than TransformerConfig
        o = options(argv)
        allowed = typing.get_args(inspect.signature(GPTModel.__init__).parameters["position_embedding_type"]
                                  .annotation)
        assert o["--position-embedding-type"] in allowed
    assert seen[0][:4] == (3, None, None, 192)
    assert seen[1][:3] == (2, 4, 8)
    assert seen[2][0] == 3  # from the layout
    layout_only = megatron_argv(gpt3_plan(vp=1, layers_per_stage=[5, 7] + [6] * 14), GPT3, **GPT3_KW)
    config = _megatron_core_configs(layout_only, 1024)[0]
    assert str(config.pipeline_model_parallel_layout).startswith("Et*5|t*7|")
    assert config.virtual_pipeline_model_parallel_size is None
    assert seen[3][4] == "optim_grads_params" and seen[4][4] == "optim_grads"
    # the check is live: megatron-core refuses heads that tensor parallelism cannot split
    argv = megatron_argv(gpt3_plan(), GPT3, **GPT3_KW)
    bad = argv[:]
    bad[bad.index("--num-attention-heads") + 1] = "100"
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        _megatron_core_configs(bad, 1024)


# ------------------------------------------------------------------------------------------------ torchtitan


def test_torchtitan_llama_values():
    name, text = one_file(llama_plan(), LLAMA, "torchtitan", **LLAMA_KW)
    assert name == "torchtitan.toml"
    cfg = tomllib.loads(text)
    assert cfg["model"] == {"name": "llama3", "flavor": "70B"}
    assert cfg["training"]["global_batch_size"] == 64 and cfg["training"]["seq_len"] == 8192
    assert cfg["training"]["local_batch_size"] == 32  # global / dp, split into micro-batches of 1
    par = cfg["parallelism"]
    degrees = ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
               "data_parallel_shard_degree", "data_parallel_replicate_degree")
    assert [par[k] for k in degrees] == [8, 4, 1, 2, 1]  # FSDP (ZeRO-3): data parallel is sharded
    assert par["pipeline_parallel_schedule"] == "1F1B" and par["pipeline_parallel_microbatch_size"] == 1
    parts = par["module_fqns_per_model_part"]
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [20] * 4
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert cfg["activation_checkpoint"] == {"mode": "full"}
    assert cfg["optimizer"] == {"name": "AdamW"}
    assert "reduces them in float32" in text  # the plan's bf16 reduction is not available there
    # interleaved, uneven, selective, plain data parallel on its own
    cfg = tomllib.loads(one_file(llama_plan(vp=2, layers_per_stage=[18, 22, 20, 20], recompute="selective"),
                                 LLAMA, "torchtitan", **LLAMA_KW)[1])
    par = cfg["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    counts = [sum(m.startswith("layers.") for m in p) for p in par["module_fqns_per_model_part"]]
    assert counts == [9, 11, 10, 10, 9, 11, 10, 10]  # virtual stage v on rank v % 4
    assert cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    ddp = llama_plan(tp=1, pp=1, dp=64, zero=0, layers_per_stage=[80], recompute="none")
    par = tomllib.loads(one_file(ddp, LLAMA, "torchtitan", **LLAMA_KW)[1])["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (64, 1)
    assert "module_fqns_per_model_part" not in par
    own = dict(LLAMA, name="llama-like-13b", hidden=5120, heads=40, kv_heads=40, layers=40)
    text = one_file(llama_plan(layers_per_stage=[10] * 4), own, "torchtitan", **LLAMA_KW)[1]
    assert tomllib.loads(text)["model"]["flavor"] == "llama-like-13b" and "register it" in text


def test_torchtitan_refuses_what_it_cannot_run():
    for plan, model, kw, field in [
        (gpt3_plan(), GPT3, {}, "model.position"),
        (llama_plan(), dict(LLAMA, norm="layernorm"), {}, "model.norm"),
        (llama_plan(zero=1), LLAMA, {}, "plan.zero"),
        (llama_plan(zero=2), LLAMA, {}, "plan.zero"),
        (llama_plan(zero=0), LLAMA, {}, "plan.zero"),  # DDP only without tp/pp/cp
        (llama_plan(), LLAMA, {"dtype": "fp16"}, "dtype"),
        (llama_plan(), LLAMA, {"optimizer": "sgd"}, "optimizer"),
    ]:
        with pytest.raises(ValueError, match=f"^{field}: ") as e:
            export_plan(plan, model, fmt="torchtitan", **LLAMA_KW if model is not GPT3 else GPT3_KW, **kw)
        assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def torchtitan_config():
    """torchtitan.config, imported without torchtitan/__init__.py (which imports triton through its MoE
    kernels); the modules are taken out of sys.modules afterwards."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None:
        pytest.skip("torchtitan is not installed (make install puts in 0.2.2)")
    version = importlib.metadata.version("torchtitan")
    if not version.startswith("0.2."):
        pytest.skip(f"torchtitan {version}: the TOML job files are those of 0.2.x")
    before = {k: v for k, v in sys.modules.items() if k == "torchtitan" or k.startswith("torchtitan.")}
    package = types.ModuleType("torchtitan")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["torchtitan"] = package
    try:
        yield importlib.import_module("torchtitan.config")
    finally:
        for k in [k for k in sys.modules if k == "torchtitan" or k.startswith("torchtitan.")]:
            del sys.modules[k]
        sys.modules.update(before)


def _check_literals(obj, where=""):
    """Every value whose field is a Literal holds one of its allowed values (tyro does not re-check the
    values it takes from the file)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _check_literals(value, f"{where}{f.name}.")
        elif typing.get_origin(f.type) is typing.Literal:
            assert value in typing.get_args(f.type), f"{where}{f.name} = {value!r}"


def test_torchtitan_config_manager_accepts_the_file(torchtitan_config, tmp_path):
    cases = [llama_plan(), llama_plan(vp=2, layers_per_stage=[18, 22, 20, 20], recompute="selective"),
             llama_plan(pp=1, cp=2, dp=4, layers_per_stage=[80], recompute="none"),
             llama_plan(tp=1, pp=1, dp=64, zero=0, layers_per_stage=[80])]
    for i, plan in enumerate(cases):
        path = write_export(export_plan(plan, LLAMA, fmt="torchtitan", **LLAMA_KW), str(tmp_path / str(i)))[0]
        job = torchtitan_config.ConfigManager().parse_args(["--job.config_file", path])
        _check_literals(job)
        par = job.parallelism
        assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree) == (
            plan["tp"], plan["pp"], plan["cp"])
        assert par.data_parallel_shard_degree * par.data_parallel_replicate_degree == plan["dp"]
        assert job.training.global_batch_size == plan["global_batch"] and job.training.seq_len == plan["seq"]
        assert job.activation_checkpoint.mode == plan["recompute"]
        assert job.model.flavor == "70B"
    # the check is live: torchtitan refuses a key it does not know
    bad = tmp_path / "bad.toml"
    bad.write_text(open(path).read().replace("[parallelism]", "[parallelism]\nzero_stage = 1"))
    with pytest.raises(ValueError, match="zero_stage"):
        torchtitan_config.ConfigManager().parse_args(["--job.config_file", str(bad)])


# ------------------------------------------------------------------------------------------------ DeepSpeed


def test_deepspeed_values():
    plan = gpt3_plan(vp=1)
    name, text = one_file(plan, GPT3, "deepspeed", **GPT3_KW)
    assert name == "ds_config.json"
    cfg = json.loads(text)
    batch = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    assert [cfg[k] for k in batch] == [1536, 1, 192]  # 1536 = 1 x 192 x dp 8
    assert cfg["bf16"] == {"enabled": True} and cfg["fp16"] == {"enabled": False}
    assert cfg["zero_optimization"] == {"stage": 1} and cfg["optimizer"]["type"] == "AdamW"
    assert cfg["communication_data_type"] == "bf16"
    assert cfg["activation_checkpointing"]["partition_activations"] is True  # tp 8
    note = cfg["_archplace"]
    assert (note["tp"], note["pp"], note["dp"], note["cp"]) == (8, 16, 8, 1)
    assert "--num_nodes 128 --num_gpus 8" in note["launch"]
    cfg = json.loads(one_file(llama_plan(pp=1, cp=2, dp=4, layers_per_stage=[80], recompute="none", mbs=2),
                              LLAMA, "deepspeed", **LLAMA_KW, grad_reduce_dtype="fp32")[1])
    assert cfg["zero_optimization"] == {"stage": 3} and "activation_checkpointing" not in cfg
    assert cfg["gradient_accumulation_steps"] == 8 and cfg["communication_data_type"] == "fp32"
    assert "Ulysses" in cfg["_archplace"]["cp_note"]
    with pytest.raises(ValueError, match="^plan.vp: "):
        export_plan(gpt3_plan(), GPT3, fmt="deepspeed", **GPT3_KW)
    with pytest.raises(ValueError, match="^plan.zero: "):
        export_plan(llama_plan(), LLAMA, fmt="deepspeed", **LLAMA_KW)  # ZeRO-3 with pp 4


def test_deepspeed_config_accepts_the_file(monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (make install puts it in)")
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    # DeepSpeedConfig reads the data-parallel size from mpu once a rank is known; with no process group it
    # would fall back to one rank
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda *a, **k: 0)
    cases = [(gpt3_plan(vp=1), GPT3, GPT3_KW, {}),
             (llama_plan(pp=1, cp=2, dp=4, layers_per_stage=[80], mbs=2), LLAMA, LLAMA_KW, {}),
             (llama_plan(pp=1, dp=8, layers_per_stage=[80], zero=2), LLAMA, LLAMA_KW, {"dtype": "fp16"})]
    for plan, model, kw, extra in cases:
        cfg = json.loads(one_file(plan, model, "deepspeed", **kw, **extra)[1])
        mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda plan=plan: plan["dp"])
        ds = DeepSpeedConfig(cfg, mpu=mpu)
        assert ds.world_size == plan["dp"]
        assert ds.train_batch_size == plan["global_batch"]
        assert ds.gradient_accumulation_steps == plan["global_batch"] // (plan["mbs"] * plan["dp"])
        assert ds.zero_optimization_stage == plan["zero"]
        assert ds.bfloat16_config.enabled == (extra.get("dtype", "bf16") == "bf16")
        assert ds.float16_config.enabled == (extra.get("dtype") == "fp16")
        assert ds.communication_data_type is not None
    # the check is live: DeepSpeed's batch rule refuses a batch that micro-batch x steps x ranks does not make
    cfg["train_batch_size"] += plan["dp"]
    with pytest.raises(AssertionError, match="train_batch_size"):
        DeepSpeedConfig(cfg, mpu=mpu)


# ------------------------------------------------------------------------------------------------ common


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_inconsistent_plans_are_refused_naming_the_field(fmt):
    plan, kw = llama_plan(pp=1, layers_per_stage=[80], dp=8), LLAMA_KW
    for over, kwo, field in [
        ({"dp": 4}, {}, "gpus"),
        ({"layers_per_stage": [79]}, {}, "plan.layers_per_stage"),
        ({"global_batch": 60}, {}, "plan.global_batch"),
        ({"recompute": "some"}, {}, "plan.recompute"),
        ({"zero": 4}, {}, "plan.zero"),
        ({"tp": 0}, {}, "plan.tp"),
        ({"vp": 2}, {}, "plan.vp"),
        ({}, {"gpus_per_node": 7}, "gpus_per_node"),
        ({}, {"dtype": "fp8"}, "dtype"),
    ]:
        with pytest.raises(ValueError, match=f"^{field}: ") as e:
            export_plan(dict(plan, **over), LLAMA, fmt=fmt, **dict(kw, **kwo))
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="^plan.sequence_parallel: missing"):
        export_plan({k: v for k, v in plan.items() if k != "sequence_parallel"}, LLAMA, fmt=fmt, **kw)
    with pytest.raises(ValueError, match="^fmt: "):
        export_plan(plan, LLAMA, fmt="jax", **kw)


def test_write_export(tmp_path):
    files = export_plan(llama_plan(), LLAMA, fmt="megatron", **LLAMA_KW)
    out = tmp_path / "new" / "dir"
    paths = write_export(files, str(out))
    assert paths == [str(out / "megatron_args.sh")]
    assert open(paths[0]).read() == files["megatron_args.sh"]
    with pytest.raises(ValueError, match="^files: "):
        write_export({"../x": ""}, str(out))
    assert sorted(os.listdir(out)) == ["megatron_args.sh"]
