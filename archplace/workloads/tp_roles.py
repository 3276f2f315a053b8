"""Megatron tensor-parallel roles of the GEMMs inside transformer blocks, per model family.

An explicit table, not a guess from module names: a GEMM's role comes from the name of the weight it
reads (its parameter path without ``.weight``), matched against the keys of its family's table as a
suffix of whole path components (``self_attn.q_proj`` matches ``model.layers.3.self_attn.q_proj``;
the longest matching key wins). Roles:

- ``col``: column-parallel, each device keeps 1/t of the output features (Q, K, V, MLP up);
- ``row``: row-parallel, 1/t of the reduction dimension, followed by an AllReduce (attention output,
  MLP down);
- ``replicate``: the whole GEMM on every device (an MoE router: every device routes its tokens).

GEMMs without weights (the attention score and context GEMMs) take ``shard`` from their place between
a column and a row GEMM (``transforms.tag_tensor_parallel``). A block GEMM that is neither in the table
nor between a column and a row GEMM has no known role: the graph records it in
``meta["tp_unknown"]`` and slicing it at a width > 1 is an error naming it. Outside the blocks, the
word embedding and the LM head split by vocabulary (role ``vocab``, found at capture by
``extract._vocab_ops``, not by this table); the rest (position embeddings, pooler, classifier) stays
whole on every device.

``tests/test_byom.py`` checks every family of this table on a small configuration.
"""

from __future__ import annotations

from collections.abc import Mapping

ROLES = ("col", "row", "replicate")

_LLAMA_LIKE = {
    "self_attn.q_proj": "col", "self_attn.k_proj": "col", "self_attn.v_proj": "col",
    "self_attn.o_proj": "row", "mlp.gate_proj": "col", "mlp.up_proj": "col", "mlp.down_proj": "row",
}
# Mixtral-style MoE (transformers 5: the sparse block is ``mlp``, its experts one module with 3-D
# weights run as grouped GEMMs; older releases called the block ``block_sparse_moe``): the router is
# replicated, each expert is split like a dense MLP (Megatron's expert tensor parallelism)
_MOE = {
    "mlp.gate": "replicate", "mlp.experts.gate_up_proj": "col", "mlp.experts.down_proj": "row",
    "block_sparse_moe.gate": "replicate", "block_sparse_moe.experts.gate_up_proj": "col",
    "block_sparse_moe.experts.down_proj": "row",
}
_BERT_LIKE = {
    "attention.self.query": "col", "attention.self.key": "col", "attention.self.value": "col",
    "attention.output.dense": "row", "intermediate.dense": "col", "output.dense": "row",
}

TP_ROLES: dict[str, dict[str, str]] = {
    "bert": _BERT_LIKE,
    "gpt2": {"attn.c_attn": "col", "attn.c_proj": "row", "mlp.c_fc": "col", "mlp.c_proj": "row"},
    "opt": {"self_attn.q_proj": "col", "self_attn.k_proj": "col", "self_attn.v_proj": "col",
            "self_attn.out_proj": "row", "fc1": "col", "fc2": "row"},
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "mixtral": {**_LLAMA_LIKE, **_MOE},
    "t5": {f"{att}.{p}": "col" for att in ("SelfAttention", "EncDecAttention") for p in "qkv"}
    | {"SelfAttention.o": "row", "EncDecAttention.o": "row", "DenseReluDense.wi": "col",
       "DenseReluDense.wi_0": "col", "DenseReluDense.wi_1": "col", "DenseReluDense.wo": "row"},
    "gpt_neox": {"attention.query_key_value": "col", "attention.dense": "row",
                 "mlp.dense_h_to_4h": "col", "mlp.dense_4h_to_h": "row"},
    "vit": {"attention.q_proj": "col", "attention.k_proj": "col", "attention.v_proj": "col",
            "attention.o_proj": "row", "mlp.fc1": "col", "mlp.fc2": "row"},
}


def known_families() -> list[str]:
    return sorted(TP_ROLES)


def role_table(family: str | Mapping[str, str] | None) -> dict[str, str] | None:
    """The role table of ``family`` (a name in :data:`TP_ROLES`), a caller's own table (a mapping of
    weight-path suffix to role, checked), or None for a family without one."""
    if family is None:
        return None
    if isinstance(family, Mapping):
        for key, role in family.items():
            if not (isinstance(key, str) and key):
                raise ValueError(f"tp_roles: keys must be non-empty weight-path suffixes, got {key!r}")
            if role not in ROLES:
                raise ValueError(f"tp_roles[{key!r}] is {role!r}; allowed: {list(ROLES)}")
        return dict(family)
    return TP_ROLES.get(family)


def weight_role(weight_path: str, table: Mapping[str, str] | None) -> str | None:
    """The role of the GEMM that reads the weight ``weight_path`` (its parameter path, with or
    without ``.weight``/``.bias``), or None when no key of ``table`` matches."""
    if not table:
        return None
    parts = weight_path.split(".")
    if parts[-1] in ("weight", "bias"):
        parts = parts[:-1]
    for n in range(len(parts), 0, -1):  # longest suffix first
        role = table.get(".".join(parts[-n:]))
        if role is not None:
            return role
    return None
