"""Launch configurations for a training plan of ``archplace plan``: Megatron-LM, torchtitan, DeepSpeed.

Why: the plan search chooses tensor/pipeline/context/data parallel sizes, the micro-batch, recomputation,
the ZeRO stage and the attention kernel, and a user then launches one framework. Each framework spells
those choices in its own configuration language, and some choices do not exist in a given framework
(torchtitan has no ZeRO-1, DeepSpeed's pipeline engine has no interleaving). This module writes each
framework's file and, where the framework cannot run the plan at all, refuses it in one line naming the
plan field, rather than writing a file that fails at launch or silently runs something else. Where a
framework runs the plan with a small difference (torchtitan always reduces gradients in fp32), the file
says so in a comment.

The option names were checked against, and the tests parse the files with, each library's own code:
- Megatron-LM ``pretrain_gpt.py`` (``megatron/training/arguments.py`` of the main branch, 2026-08): the
  file is a bash array ``MEGATRON_ARGS`` (tests: megatron-core's ``TransformerConfig``,
  ``DistributedDataParallelConfig`` and micro-batch calculator built from it);
- torchtitan 0.2.x, the last releases whose job configuration is a TOML file
  (``torchtitan/config/job_config.py``, ``--job.config_file``; 0.3 replaced the files with Python config
  registries, and takes the same ``[section] key`` as ``--section.key`` overrides);
- DeepSpeed 0.19 (``deepspeed/runtime/config.py``): ``ds_config.json``. DeepSpeed's JSON has no tensor or
  pipeline sizes: the launching script sets them (Megatron-DeepSpeed's ``--tensor-model-parallel-size``,
  ``PipelineModule(num_stages=...)``), so they are listed under the ``_archplace`` key, which DeepSpeed
  ignores.

Only the standard library is imported here; the frameworks are needed only where the files are used.
"""

from __future__ import annotations

import json
import os
import shlex

EXPORT_FORMATS = ("megatron", "torchtitan", "deepspeed")
FILE_NAMES = {"megatron": "megatron_args.sh", "torchtitan": "torchtitan.toml", "deepspeed": "ds_config.json"}

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("sdpa", "eager")
ZERO_STAGES = (0, 1, 2, 3)
OPTIMIZERS = ("adam", "sgd")
DTYPES = ("bf16", "fp16", "fp32")
GRAD_REDUCE_DTYPES = ("bf16", "fp32")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")

PLAN_INT_KEYS = ("tp", "pp", "dp", "cp", "vp", "ep", "mbs", "global_batch", "seq")
PLAN_KEYS = PLAN_INT_KEYS + ("recompute", "sequence_parallel", "zero", "attention", "layers_per_stage")
MODEL_INT_KEYS = ("hidden", "heads", "kv_heads", "ffn_hidden", "layers", "vocab", "max_positions")
MODEL_KEYS = ("name",) + MODEL_INT_KEYS + ("gated_mlp", "norm", "position", "tied_embeddings")

# torchtitan 0.2's built-in llama3 flavours (torchtitan/models/llama3/__init__.py):
# (dim, n_layers, n_heads, n_kv_heads, vocab_size) -> flavour name
_TORCHTITAN_LLAMA3_FLAVORS = {
    (4096, 32, 32, 8, 128256): "8B",
    (8192, 80, 64, 8, 128256): "70B",
    (16384, 126, 128, 8, 128256): "405B",
}


def _int(d: dict, where: str, key: str, minimum: int = 1) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{where}.{key}: {v!r} is not an integer >= {minimum}")
    return v


def _choice(value, field: str, allowed: tuple) -> None:
    if value not in allowed or isinstance(value, bool):
        raise ValueError(f"{field}: {value!r} is not one of {', '.join(map(str, allowed))}")


def _check(plan: dict, model: dict, fmt: str, gpus: int, gpus_per_node: int, optimizer: str, dtype: str,
           grad_reduce_dtype: str) -> None:
    """The checks every framework shares: fields present and in range, and a plan consistent in itself."""
    _choice(fmt, "fmt", EXPORT_FORMATS)
    for where, d, keys in (("plan", plan, PLAN_KEYS), ("model", model, MODEL_KEYS)):
        if not isinstance(d, dict):
            raise ValueError(f"{where}: a dict is needed, got {type(d).__name__}")
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"{where}.{missing[0]}: missing; a {where} needs {', '.join(keys)}")
    for k in PLAN_INT_KEYS:
        _int(plan, "plan", k)
    for k in MODEL_INT_KEYS:
        _int(model, "model", k)
    for field, value in (("gpus", gpus), ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}: {value!r} is not an integer >= 1")
    _choice(plan["recompute"], "plan.recompute", RECOMPUTE)
    _choice(plan["attention"], "plan.attention", ATTENTION)
    _choice(plan["zero"], "plan.zero", ZERO_STAGES)
    _choice(optimizer, "optimizer", OPTIMIZERS)
    _choice(dtype, "dtype", DTYPES)
    _choice(grad_reduce_dtype, "grad_reduce_dtype", GRAD_REDUCE_DTYPES)
    _choice(model["norm"], "model.norm", NORMS)
    _choice(model["position"], "model.position", POSITIONS)
    for where, d, key in (("plan", plan, "sequence_parallel"), ("model", model, "gated_mlp"),
                          ("model", model, "tied_embeddings")):
        if not isinstance(d[key], bool):
            raise ValueError(f"{where}.{key}: {d[key]!r} is not true or false")
    tp, pp, dp, cp, vp, ep = (plan[k] for k in ("tp", "pp", "dp", "cp", "vp", "ep"))
    if tp * pp * dp * cp != gpus:
        raise ValueError(f"gpus: tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {tp * pp * dp * cp}, not gpus = {gpus}")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise ValueError(f"gpus_per_node: {gpus} GPUs do not fill whole nodes of {gpus_per_node}")
    if vp > 1 and pp == 1:
        raise ValueError(f"plan.vp: {vp} virtual stages per GPU need pipeline parallelism (pp > 1)")
    if (dp * cp) % ep:
        raise ValueError(f"plan.ep: {ep} does not divide dp*cp = {dp * cp} (experts spread over data ranks)")
    if plan["global_batch"] % (plan["mbs"] * dp):
        raise ValueError(f"plan.global_batch: {plan['global_batch']} is not a multiple of mbs*dp = "
                         f"{plan['mbs']}*{dp}")
    if model["heads"] % model["kv_heads"]:
        raise ValueError(f"model.kv_heads: {model['kv_heads']} does not divide heads = {model['heads']}")
    if model["position"] == "learned" and plan["seq"] > model["max_positions"]:
        raise ValueError(f"plan.seq: {plan['seq']} is longer than the learned positions "
                         f"(model.max_positions = {model['max_positions']})")
    lps = plan["layers_per_stage"]
    if (not isinstance(lps, list | tuple) or len(lps) != pp
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lps)):
        raise ValueError(f"plan.layers_per_stage: {lps!r} is not a list of pp = {pp} positive integers")
    if sum(lps) != model["layers"]:
        raise ValueError(f"plan.layers_per_stage: sums to {sum(lps)}, not model.layers = {model['layers']}")
    if any(n < vp for n in lps):
        raise ValueError(f"plan.layers_per_stage: every GPU needs at least vp = {vp} layers (one per chunk)")
    if ep > 1 and not model.get("experts"):
        raise ValueError(f"model.experts: expert parallelism (plan.ep = {ep}) needs the number of experts")


def _has_bias(model: dict) -> bool:
    """Whether the linear layers carry biases: ``model["bias"]`` where given, else GPT-style models do and
    SwiGLU (Llama-style) decoders do not."""
    return bool(model.get("bias", not model["gated_mlp"]))


def _nodes(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs started per node)."""
    return max(1, gpus // gpus_per_node), min(gpus, gpus_per_node)


def _chunks(lps: list[int], vp: int) -> list[int]:
    """Transformer layers of each virtual stage, in model order (stage v = chunk * pp + rank).

    Each GPU's layers go to its vp chunks as evenly as possible, the earlier chunks taking the remainder.
    """
    pp = len(lps)
    per_rank = [[n // vp + (1 if c < n % vp else 0) for c in range(vp)] for n in lps]
    return [per_rank[r][c] for c in range(vp) for r in range(pp)]


def _megatron_layout(lps: list[int], vp: int) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout``: stages split by '|', E embedding, t a
    transformer layer, L the loss; stages in model order, virtual stage v on pipeline rank v % pp."""
    stages = []
    chunks = _chunks(lps, vp)
    for v, n in enumerate(chunks):
        s = ("E" if v == 0 else "") + (f"t*{n}" if n > 1 else "t" * n) + ("L" if v == len(chunks) - 1 else "")
        stages.append(s)
    return "|".join(stages)


def _zero_name(zero: int) -> str:
    return {0: "plain data parallel", 1: "ZeRO-1 (distributed optimizer)", 2: "ZeRO-2",
            3: "ZeRO-3 (fully sharded)"}[zero]


def _summary(plan: dict, model: dict, gpus: int, gpus_per_node: int) -> str:
    nodes, per_node = _nodes(gpus, gpus_per_node)
    pp = f"pp {plan['pp']}"
    if plan["vp"] > 1:
        pp += f" (interleaved, {plan['vp']} virtual stages per GPU)"
    parts = [f"tp {plan['tp']}", pp, f"cp {plan['cp']}", f"dp {plan['dp']}"]
    if plan["ep"] > 1:
        parts.append(f"ep {plan['ep']}")
    return (f"{model['name']} on {gpus} GPUs ({nodes} node(s) x {per_node}): {', '.join(parts)}, "
            f"{_zero_name(plan['zero'])}; micro-batch {plan['mbs']}, global batch {plan['global_batch']}, "
            f"sequence {plan['seq']}, recompute {plan['recompute']}, layers per pipeline stage "
            f"{list(plan['layers_per_stage'])}")


# ---------------------------------------------------------------------------------------------------------
# Megatron-LM


def megatron_argv(plan: dict, model: dict, *, gpus: int, gpus_per_node: int, optimizer: str = "adam",
                  dtype: str = "bf16", grad_reduce_dtype: str = "bf16") -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` arguments for ``plan`` (without data, tokenizer, learning rate,
    iterations and checkpoints, which are the user's)."""
    _check(plan, model, "megatron", gpus, gpus_per_node, optimizer, dtype, grad_reduce_dtype)
    tp, pp, dp, cp, vp, ep = (plan[k] for k in ("tp", "pp", "dp", "cp", "vp", "ep"))
    lps = list(plan["layers_per_stage"])
    a = ["--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp,
         "--context-parallel-size", cp]
    if ep > 1:
        a += ["--expert-model-parallel-size", ep, "--num-experts", model["experts"]]
    if plan["sequence_parallel"] and tp > 1:
        a.append("--sequence-parallel")
    # the pipeline split: Megatron's even split, its first/last-stage counts, or an explicit layout
    layers = model["layers"]
    middle = lps[1:-1]
    if len(set(lps)) == 1:
        if vp > 1:
            if lps[0] % vp == 0:
                a += ["--num-layers-per-virtual-pipeline-stage", lps[0] // vp]
            else:
                a += ["--pipeline-model-parallel-layout", _megatron_layout(lps, vp)]
    elif len(set(middle)) <= 1 and all(n % vp == 0 for n in lps):
        a += ["--decoder-first-pipeline-num-layers", lps[0], "--decoder-last-pipeline-num-layers", lps[-1]]
        if vp > 1:
            a += ["--num-virtual-stages-per-pipeline-rank", vp]
    else:
        a += ["--pipeline-model-parallel-layout", _megatron_layout(lps, vp)]
    a += ["--micro-batch-size", plan["mbs"], "--global-batch-size", plan["global_batch"],
          "--seq-length", plan["seq"], "--max-position-embeddings", model["max_positions"],
          "--num-layers", layers, "--hidden-size", model["hidden"], "--ffn-hidden-size", model["ffn_hidden"],
          "--num-attention-heads", model["heads"]]
    if model["kv_heads"] < model["heads"]:
        a += ["--group-query-attention", "--num-query-groups", model["kv_heads"]]
    if model["gated_mlp"]:
        a.append("--swiglu")
    a += ["--normalization", "RMSNorm" if model["norm"] == "rmsnorm" else "LayerNorm",
          "--position-embedding-type", "rope" if model["position"] == "rope" else "learned_absolute"]
    if not model["tied_embeddings"]:
        a.append("--untie-embeddings-and-output-weights")
    if not _has_bias(model):
        a.append("--disable-bias-linear")
    if model.get("dropout") is False:  # Megatron's default is 0.1 for both
        a += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    if model["position"] == "rope" and model.get("rope_theta"):
        a += ["--rotary-base", int(model["rope_theta"])]
    if plan["recompute"] == "selective":
        a += ["--recompute-granularity", "selective"]
    elif plan["recompute"] == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    a += ["--attention-backend", "flash" if plan["attention"] == "sdpa" else "unfused"]
    if dtype != "fp32":
        a.append(f"--{dtype}")
    if grad_reduce_dtype == "bf16":
        if dtype != "bf16":
            raise ValueError(f"grad_reduce_dtype: bf16 gradient reduction needs dtype bf16, not {dtype}")
        a.append("--grad-reduce-in-bf16")
    elif dtype == "fp16":
        a.append("--accumulate-allreduce-grads-in-fp32")  # Megatron does this by itself for bf16 only
    a += ["--optimizer", optimizer]
    zero = plan["zero"]
    if zero == 1:
        a.append("--use-distributed-optimizer")
    elif zero in (2, 3):
        # Megatron-FSDP: optim_grads shards optimizer state and gradients (ZeRO-2), optim_grads_params the
        # parameters too (ZeRO-3); its version 1 runs on the distributed optimizer and saves fsdp_dtensor
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "optim_grads" if zero == 2 else "optim_grads_params", "--use-distributed-optimizer",
              "--ckpt-format", "fsdp_dtensor"]
    return [str(x) for x in a]


def _megatron(plan: dict, model: dict, gpus: int, gpus_per_node: int, optimizer: str, dtype: str,
              grad_reduce_dtype: str) -> str:
    argv = megatron_argv(plan, model, gpus=gpus, gpus_per_node=gpus_per_node, optimizer=optimizer,
                         dtype=dtype, grad_reduce_dtype=grad_reduce_dtype)
    nodes, per_node = _nodes(gpus, gpus_per_node)
    lines = [
        "# Megatron-LM pretrain_gpt.py arguments written by archplace plan.",
        f"# {_summary(plan, model, gpus, gpus_per_node)}",
        "# Add your data, tokenizer, learning-rate, iteration and checkpoint arguments; on each node:",
        f"#   source {FILE_NAMES['megatron']}",
        f"#   torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank $NODE_RANK "
        "--master-addr $MASTER_ADDR --master-port 6000 \\",
        '#       pretrain_gpt.py "${MEGATRON_ARGS[@]}" --data-path ... --tokenizer-type ... --lr ... '
        "--train-iters ...",
    ]
    if plan["zero"] >= 2:
        lines.append("# Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or above 1.")
        lines.append("unset CUDA_DEVICE_MAX_CONNECTIONS")
    elif plan["tp"] > 1 or plan["cp"] > 1:
        lines.append("# tensor and context parallelism need one CUDA connection (GPUs before Blackwell)")
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    lines.append("MEGATRON_ARGS=(")
    i = 0
    while i < len(argv):  # one option per line, with its value
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        lines.append("  " + " ".join(shlex.quote(x) for x in argv[i:j]))
        i = j
    lines.append(")")
    return "\n".join(lines) + "\n"


def parse_megatron_args(text: str) -> list[str]:
    """The argument list of a ``megatron_args.sh`` written here (the words of its ``MEGATRON_ARGS=(...)``)."""
    start = text.index("MEGATRON_ARGS=(") + len("MEGATRON_ARGS=(")
    return shlex.split(text[start:text.index("\n)", start)])


# ---------------------------------------------------------------------------------------------------------
# torchtitan


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string for the ASCII text written here
    if isinstance(v, list):
        if v and all(isinstance(x, list) for x in v):
            return "[\n" + "".join(f"  {_toml_value(x)},\n" for x in v) + "]"
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def torchtitan_config(plan: dict, model: dict, *, gpus: int, gpus_per_node: int, optimizer: str = "adam",
                      dtype: str = "bf16", grad_reduce_dtype: str = "bf16") -> tuple[dict, list[str]]:
    """torchtitan 0.2 job-configuration sections for ``plan`` and the notes the file carries as comments."""
    _check(plan, model, "torchtitan", gpus, gpus_per_node, optimizer, dtype, grad_reduce_dtype)
    tp, pp, dp, cp, vp, ep = (plan[k] for k in ("tp", "pp", "dp", "cp", "vp", "ep"))
    notes = []
    # the architecture: torchtitan builds registered model families, the llama3 one for a dense decoder
    for field, value, need in (("model.position", model["position"], "rope"),
                               ("model.norm", model["norm"], "rmsnorm"),
                               ("model.gated_mlp", model["gated_mlp"], True)):
        if value != need:
            raise ValueError(f"{field}: torchtitan's dense decoder (llama3) has {field.split('.')[1]} = "
                             f"{need!r}, not {value!r}; export megatron or deepspeed instead")
    if ep > 1:
        raise ValueError(f"plan.ep: {ep}; torchtitan's llama3 is dense (expert parallelism needs MoE)")
    if plan["zero"] in (1, 2):
        raise ValueError(f"plan.zero: {plan['zero']}; torchtitan shards data-parallel state only as FSDP "
                         "(zero 3) or not at all (zero 0)")
    if plan["zero"] == 0 and dp > 1 and dp != gpus:
        raise ValueError("plan.zero: 0; torchtitan's replicated data parallel (DDP) runs only alone, "
                         "without tp, pp or cp (use zero 3)")
    if dtype == "fp16":
        raise ValueError("dtype: fp16; torchtitan trains in bf16 or fp32")
    if optimizer != "adam":
        raise ValueError(f"optimizer: {optimizer}; torchtitan's optimizers are Adam and AdamW (adam)")
    key = (model["hidden"], model["layers"], model["heads"], model["kv_heads"], model["vocab"])
    flavor = _TORCHTITAN_LLAMA3_FLAVORS.get(key)
    if flavor is None:
        flavor = model["name"]
        notes.append(f"flavor {flavor!r} is not built into torchtitan: register it in "
                     "torchtitan/models/llama3/__init__.py (llama3_args) as TransformerModelArgs("
                     f"dim={model['hidden']}, n_layers={model['layers']}, n_heads={model['heads']}, "
                     f"n_kv_heads={model['kv_heads']}, vocab_size={model['vocab']}, with ffn_dim_multiplier "
                     f"and multiple_of giving an FFN of {model['ffn_hidden']})")
    if model["tied_embeddings"]:
        notes.append("the plan ties the input and output embeddings; torchtitan's llama3 keeps them separate "
                     f"({model['vocab'] * model['hidden']:,} more parameters)")
    if model.get("dropout"):
        notes.append("the model uses dropout; torchtitan's llama3 has none")
    if plan["attention"] == "eager":
        notes.append("the plan uses eager attention; torchtitan's llama3 uses scaled_dot_product_attention")
    if grad_reduce_dtype != "fp32":
        notes.append(f"the plan reduces gradients in {grad_reduce_dtype}; torchtitan 0.2 reduces them in "
                     "float32 (training.mixed_precision_reduce)")
    if tp > 1 and not plan["sequence_parallel"]:
        notes.append("torchtitan always shards norms and dropout along the sequence with tensor parallelism "
                     "(the plan has sequence_parallel off)")
    training = {"local_batch_size": plan["mbs"], "global_batch_size": plan["global_batch"],
                "seq_len": plan["seq"],
                "mixed_precision_param": "bfloat16" if dtype == "bf16" else "float32",
                "mixed_precision_reduce": "float32"}
    parallelism = {
        "data_parallel_replicate_degree": dp if plan["zero"] == 0 else 1,
        "data_parallel_shard_degree": dp if plan["zero"] == 3 else 1,
        "tensor_parallel_degree": tp,
        "context_parallel_degree": cp,
        "pipeline_parallel_degree": pp,
    }
    if pp > 1:
        # the whole per-replica batch enters the pipeline at once, as global_batch / dp / mbs micro-batches
        training["local_batch_size"] = plan["global_batch"] // dp
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if vp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = plan["mbs"]
        # the plan's own split, module by module (torchtitan's default counts the embedding as a layer)
        parts, first = [], 0
        chunks = _chunks(list(plan["layers_per_stage"]), vp)
        for v, n in enumerate(chunks):
            part = ["tok_embeddings"] if v == 0 else []
            part += [f"layers.{i}" for i in range(first, first + n)]
            if v == len(chunks) - 1:
                part += ["norm", "output"]
            parts.append(part)
            first += n
        parallelism["module_fqns_per_model_part"] = parts
    ac = {"mode": plan["recompute"]}
    if plan["recompute"] == "selective":
        ac["selective_ac_option"] = "op"  # per-operator: keep the matmuls, recompute the rest
    sections = {
        "job": {"description": f"archplace plan: {model['name']} on {gpus} GPUs"},
        "model": {"name": "llama3", "flavor": flavor},
        "optimizer": {"name": "AdamW"},
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": ac,
    }
    return sections, notes


def _torchtitan(plan: dict, model: dict, gpus: int, gpus_per_node: int, optimizer: str, dtype: str,
                grad_reduce_dtype: str) -> str:
    sections, notes = torchtitan_config(plan, model, gpus=gpus, gpus_per_node=gpus_per_node,
                                        optimizer=optimizer, dtype=dtype, grad_reduce_dtype=grad_reduce_dtype)
    nodes, per_node = _nodes(gpus, gpus_per_node)
    lines = [
        "# torchtitan job configuration written by archplace plan (torchtitan 0.2.x TOML job files).",
        f"# {_summary(plan, model, gpus, gpus_per_node)}",
        "# Add your dataset, tokenizer (model.hf_assets_path), learning rate and steps; on each node:",
        f"#   torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
        "--rdzv-endpoint $MASTER_ADDR:29500 \\",
        f"#       -m torchtitan.train --job.config_file {FILE_NAMES['torchtitan']}",
        "# torchtitan 0.3 has no job files: pass each `[section] key = value` as `--section.key value`.",
    ]
    lines += [f"# note: {n}" for n in notes]
    for name, values in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# DeepSpeed


def deepspeed_config(plan: dict, model: dict, *, gpus: int, gpus_per_node: int, optimizer: str = "adam",
                     dtype: str = "bf16", grad_reduce_dtype: str = "bf16") -> dict:
    """DeepSpeed's configuration dict (``ds_config.json``) for ``plan``."""
    _check(plan, model, "deepspeed", gpus, gpus_per_node, optimizer, dtype, grad_reduce_dtype)
    tp, pp, dp, cp, vp, ep = (plan[k] for k in ("tp", "pp", "dp", "cp", "vp", "ep"))
    zero = plan["zero"]
    if pp > 1 and zero >= 2:
        raise ValueError(f"plan.zero: {zero}; DeepSpeed's pipeline engine runs ZeRO 0 or 1 only (pp = {pp})")
    if vp > 1:
        raise ValueError(f"plan.vp: {vp}; DeepSpeed's pipeline engine runs one stage per GPU (vp 1)")
    nodes, per_node = _nodes(gpus, gpus_per_node)
    accumulation = plan["global_batch"] // (plan["mbs"] * dp)
    cfg: dict = {
        # DeepSpeed's rule: train_batch_size = micro-batch * accumulation steps * data-parallel ranks
        "train_batch_size": plan["global_batch"],
        "train_micro_batch_size_per_gpu": plan["mbs"],
        "gradient_accumulation_steps": accumulation,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16"},
        "communication_data_type": grad_reduce_dtype,
        "zero_optimization": {"stage": zero},
        "optimizer": {"type": "AdamW" if optimizer == "adam" else "SGD", "params": {}},
    }
    if plan["recompute"] != "none":
        # the checkpointed layers are chosen by the model code; this section shards the saved inputs over TP
        cfg["activation_checkpointing"] = {"partition_activations": tp > 1, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False}
    unequal = len(set(plan["layers_per_stage"])) > 1
    cfg["_archplace"] = {
        "note": ("DeepSpeed's JSON holds no model-parallel sizes: set these in the training script (for "
                 "Megatron-DeepSpeed --tensor-model-parallel-size, --pipeline-model-parallel-size, "
                 "--ds-sequence-parallel-size; or PipelineModule(num_stages=pp)). The optimizer's learning "
                 "rate and schedule are yours to add."),
        "summary": _summary(plan, model, gpus, gpus_per_node),
        "launch": f"deepspeed --num_nodes {nodes} --num_gpus {per_node} <train.py> --deepspeed_config "
                  f"{FILE_NAMES['deepspeed']}",
        "tp": tp, "pp": pp, "cp": cp, "dp": dp, "ep": ep,
        "sequence_parallel": plan["sequence_parallel"] and tp > 1,
        "recompute": plan["recompute"],
        "attention": plan["attention"],
        "layers_per_stage": list(plan["layers_per_stage"]),
    }
    if unequal:
        cfg["_archplace"]["layers_per_stage_note"] = (
            "uneven: PipelineModule's partition_method ('uniform', 'parameters') does not take counts; "
            "pass the split as a custom partition")
    if cp > 1:
        cfg["_archplace"]["cp_note"] = ("DeepSpeed splits sequences with Ulysses (all-to-all over heads), "
                                        "not ring attention; heads must divide by tp*cp")
    return cfg


# ---------------------------------------------------------------------------------------------------------


def export_plan(plan: dict, model: dict, *, fmt: str, gpus: int, gpus_per_node: int, optimizer: str = "adam",
                dtype: str = "bf16", grad_reduce_dtype: str = "bf16") -> dict[str, str]:
    """{file name: file text} for launching ``plan`` with framework ``fmt`` (one of ``EXPORT_FORMATS``).

    ``plan`` holds ``PLAN_KEYS``, ``model`` ``MODEL_KEYS`` and optionally ``experts`` (needed when ep > 1),
    ``bias`` (linear-layer biases; default: true unless ``gated_mlp``), ``dropout`` (bool; false turns
    Megatron's default 0.1 off) and ``rope_theta``. Raises
    ValueError, one line naming the field, for a plan the framework cannot run."""
    _choice(fmt, "fmt", EXPORT_FORMATS)
    kw = dict(gpus=gpus, gpus_per_node=gpus_per_node, optimizer=optimizer, dtype=dtype,
              grad_reduce_dtype=grad_reduce_dtype)
    if fmt == "megatron":
        text = _megatron(plan, model, **kw)
    elif fmt == "torchtitan":
        text = _torchtitan(plan, model, **kw)
    else:
        text = json.dumps(deepspeed_config(plan, model, **kw), indent=2) + "\n"
    return {FILE_NAMES[fmt]: text}


def write_export(files: dict[str, str], out_dir: str) -> list[str]:
    """Write ``files`` ({name: text}) into ``out_dir`` (created if needed); the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, text in files.items():
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(f"files: {name!r} is not a plain file name")
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths.append(path)
    return paths
