"""``archplace place --tp-from shard``: Phaze's tensor-parallel slices from the sharding that ``archplace
shard --algo ilp`` finds, instead of the built-in role tables (``workloads/tp_roles.py``).

Why a role table derived from the plan rather than the plan itself: the placement's layer model
(``workloads/transforms.slice_tensor_parallel``) slices a captured graph by Megatron's vocabulary of
roles (column- and row-parallel GEMMs, the ops between them split by heads or hidden units, the
vocabulary-parallel embedding and LM head, everything else whole), and it captures a few leading blocks
and copies them. So a sharding plan is applied as: per block GEMM of the family's role table, the dim
the plan splits of its kernel (kernels are stored [in, out]: dim 1 is ``col``, dim 0 ``row``, none
``replicate``), the same in every block; per attention or MLP unit either Megatron's roles or all
replicated (an attention left whole no longer needs the TP width to divide its heads); the word
embedding vocabulary-split or whole as the plan says. A plan the slicer cannot express (blocks that
disagree, a unit split some other way) is an error naming ``tp_from``; splits outside the blocks other
than the vocabulary (BERT's pooler, T5's relative position bias) are listed as not applied.

The sharding graph is built from the model's config (``workloads/sharding_models.py``), the placement
graph is captured by torch.export: the two meet on weight names, mapped per family below.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._common import invalid

# sharding-graph kernel suffix (after the block prefix, before "/kernel") -> role-table key
SHARD_KEYS: dict[str, dict[str, str]] = {
    "bert": {"attention/q": "attention.self.query", "attention/k": "attention.self.key",
             "attention/v": "attention.self.value", "attention/o": "attention.output.dense",
             "ffn/intermediate": "intermediate.dense", "ffn/output": "output.dense"},
    "gpt2": {"attn/q": "attn.c_attn", "attn/k": "attn.c_attn", "attn/v": "attn.c_attn",
             "attn/o": "attn.c_proj", "mlp/c_fc": "mlp.c_fc", "mlp/c_proj": "mlp.c_proj"},
    "t5": {f"{a}/{p}": f"{a}.{p}" for a in ("SelfAttention", "EncDecAttention") for p in "qkvo"}
    | {"DenseReluDense/wi": "DenseReluDense.wi", "DenseReluDense/wo": "DenseReluDense.wo"},
}
# the units whose roles go together: Megatron's, or all replicated (attention units first)
UNITS: dict[str, dict[str, tuple[str, ...]]] = {
    "bert": {"attention": ("attention.self.query", "attention.self.key", "attention.self.value",
                           "attention.output.dense"),
             "mlp": ("intermediate.dense", "output.dense")},
    "gpt2": {"attention": ("attn.c_attn", "attn.c_proj"), "mlp": ("mlp.c_fc", "mlp.c_proj")},
    "t5": {"self-attention": tuple(f"SelfAttention.{p}" for p in "qkvo"),
           "cross-attention": tuple(f"EncDecAttention.{p}" for p in "qkvo"),
           "mlp": ("DenseReluDense.wi", "DenseReluDense.wo")},
}
VOCAB = {"bert": "embeddings/word_embeddings", "gpt2": "wte", "t5": "shared"}
ROLE_OF_DIM = {1: "col", 0: "row", -1: "replicate"}


def shard_models() -> list[str]:
    from ..workloads.models import PRESETS

    return sorted(n for n, p in PRESETS.items() if p.family in SHARD_KEYS)


def check_shard_model(model: str) -> None:
    """One line naming ``tp_from`` and the models allowed when shard has no tensor graph for ``model``."""
    if model not in shard_models():
        raise invalid("tp_from", f"shard builds its tensor graph for the presets {shard_models()} only, "
                                 f"not {model!r}; use tp_from roles")


def roles_from_plan(family: str, table3: dict[str, Any], t: int) -> tuple[dict[str, str], bool, list[str]]:
    """The block role table the plan implies, whether it splits the vocabulary, and the splits it makes
    that the slicer does not apply. Errors (one line, naming ``tp_from``) where the slicer cannot follow."""
    from ..workloads.tp_roles import TP_ROLES

    keys, roles, seen = SHARD_KEYS[family], {}, {}
    not_applied: list[str] = []
    for pattern, d in table3.items():
        base = pattern.removesuffix("/kernel").removesuffix("/bias")
        suffix = next((s for s in keys if "*/" in base and base.endswith("/" + s)), None)
        if suffix is None:
            if pattern != VOCAB[family] and d != -1:
                not_applied.append(f"{pattern} split on dim {d}")
            continue
        if pattern.endswith("/bias"):
            continue   # a GEMM's bias follows its kernel
        if isinstance(d, list):
            raise invalid("tp_from", f"the ILP plan at t={t} splits {pattern} differently across blocks "
                                     f"(dims {d}); the slicer copies one captured block, so it needs one "
                                     "role per weight")
        key, role = keys[suffix], ROLE_OF_DIM[d]
        if roles.setdefault(key, role) != role:
            raise invalid("tp_from", f"the ILP plan at t={t} gives {key} two roles ({seen[key]}: "
                                     f"{roles[key]}, {pattern}: {role}); the slicer needs one")
        seen.setdefault(key, pattern)
    megatron = TP_ROLES[family]
    for unit, members in UNITS[family].items():
        got = [roles.get(k) for k in members if k in roles]
        if got and not (got == [megatron[k] for k in members if k in roles] or set(got) == {"replicate"}):
            raise invalid("tp_from", f"the ILP plan at t={t} splits the {unit} as "
                                     f"{dict(zip(members, got))}; the slicer takes Megatron's roles "
                                     f"{ {k: megatron[k] for k in members} } or all replicated")
    vocab = table3.get(VOCAB[family], -1)
    if vocab not in (0, -1):
        not_applied.append(f"{VOCAB[family]} split on dim {vocab}")
    return roles, vocab == 0, not_applied


def retag(g, roles: dict[str, str], vocab_split: bool, attention_split: bool):
    """The forward graph ``g`` (width 1, tagged by the role tables) tagged by ``roles`` instead: GEMMs of
    a replicated unit lose their role and so do the ops between them; a replicated vocabulary loses
    ``vocab``; a replicated attention drops the heads check. Unchanged roles give ``g``'s tags exactly."""
    from ..workloads.graph import OpGraph
    from ..workloads.tp_roles import weight_role
    from ..workloads.transforms import tag_tensor_parallel

    nd = dict(g.nodes)
    old = nd["tp_role"]
    role = old.copy()
    for i in np.flatnonzero(np.isin(old, ("col", "row"))):
        r = weight_role(str(nd["name"][i]).split("/")[0], roles)
        if r is None:
            raise ValueError(f"tp_from: GEMM {nd['name'][i]!r} matches no weight of the sharding plan")
        role[i] = r if r in ("col", "row") else ""
    if not vocab_split:
        role[role == "vocab"] = ""
    if (role != old).any():
        # the ops between: only where a column GEMM still reaches a row GEMM (never a new "shard")
        plain = np.where(role == "shard", "", role).astype(object)
        between = tag_tensor_parallel(OpGraph(dict(nd, tp_role=plain), dict(g.edges), dict(g.meta)))
        role = np.where((role == "shard") & (between.nodes["tp_role"] != "shard"), "", role).astype(object)
    meta = dict(g.meta)
    if not attention_split:
        meta.pop("heads", None)   # heads stay whole on every device: the width need not divide them
    return OpGraph(dict(nd, tp_role=role), dict(g.edges), meta)


def shard_graph_fn(model: str, widths: list[int], seq: int | None, batch: int, capture_blocks: int):
    """Per width, the ILP plan (``shard --algo ilp`` over ``t`` devices, its defaults: V100 SXM2, fp16,
    ``batch`` examples) and its role table; and the ``prepare_layers`` graph builder that slices by it."""
    from ..workloads.backward import derive_backward
    from ..workloads.models import build_graph, preset
    from ..workloads.tp_roles import TP_ROLES
    from ..workloads.transforms import slice_tensor_parallel
    from .sharding import ShardRequest, shard

    family = preset(model).family
    source: dict[str, Any] = {"from": "shard", "algo": "ilp", "batch": batch, "widths": {}}
    tables = {}
    for t in widths:
        plan = shard(ShardRequest(model, devices=t, algo="ilp", seq=seq, batch=batch))
        if plan.status not in ("optimal", "feasible"):
            raise invalid("tp_from", f"shard --algo ilp found no plan for {model} over {t} devices "
                                     f"({plan.status}: {'; '.join(plan.notes[:1])})")
        roles, vocab, not_applied = roles_from_plan(family, plan.table3, t)
        attention_split = any(roles.get(k, "replicate") != "replicate"
                              for u, members in UNITS[family].items() if "attention" in u for k in members)
        builtin = {k: TP_ROLES[family][k] for k in roles}
        tables[t] = (roles, vocab, attention_split)
        source["widths"][t] = {
            "roles": roles, "vocab_split": vocab, "heads_split": attention_split,
            "equals_role_tables": roles == builtin and vocab,
            "differences": [f"{k}: {builtin[k]} -> {roles[k]}" for k in roles if roles[k] != builtin[k]]
            + ([] if vocab else [f"{VOCAB[family]}: vocab -> replicate"]),
            "not_applied": not_applied, "shard_step_s": plan.step_s, "shard_status": plan.status,
            "megatron_step_s": (plan.reference or {}).get("step_s"),
        }

    def graph_fn(name: str, seq: int | None = None, mbs: int = 1, tmp: int = 1, capture_blocks: int = 3):
        if tmp not in tables:
            return build_graph(name, seq=seq, mbs=mbs, tmp=tmp, capture_blocks=capture_blocks)
        fwd = build_graph(name, seq=seq, mbs=mbs, tmp=1, training=False, capture_blocks=capture_blocks)
        return derive_backward(slice_tensor_parallel(retag(fwd, *tables[tmp]), tmp))

    return source, graph_fn
