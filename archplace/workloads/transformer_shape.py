"""The sizes of a decoder-only transformer that ``archplace plan`` needs beyond its captured graph:
hidden size, query and KV heads, feed-forward width, layers, vocabulary, whether its MLP is gated and
whether it uses dropout, read from the model's ``transformers`` config.

Why from the config: the memory model (``simulators.train_memory``) counts activations in these terms,
and a launch configuration (``api.plan_export``) must name them as Megatron-LM, torchtitan and DeepSpeed
do. ``transformers`` configs spell them differently per family; their ``attribute_map`` gives most of
them the standard names (``hidden_size``, ``num_attention_heads``, ``num_hidden_layers``)."""

from __future__ import annotations

from typing import Any

from .models import preset

_FFN_FIELDS = ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
_GATED_ACTS = ("silu", "swiglu", "geglu", "gelu_glu")
_DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "dropout",
                   "resid_pdrop", "hidden_dropout_prob")


def transformer_fields(model: str) -> dict[str, Any]:
    """The decoder stack's sizes as a dict (the fields of ``train_memory.TransformerShape`` plus
    ``name``, ``max_positions``, ``norm``, ``position``, ``tied_embeddings``). A model that is not one
    stack of decoder blocks (T5's encoder-decoder, BERT's encoder are accepted: one stack) is refused by
    name."""
    p = preset(model)
    cfg = p.make_config()
    stacks = dict(p.stacks)
    if len(stacks) != 1:
        raise ValueError(f"model {model!r} has {len(stacks)} block stacks {sorted(stacks)}; plan takes a "
                         "model with one stack of blocks (a GPT, Llama, OPT or BERT)")
    layers = next(iter(stacks.values()))
    hidden = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    ffn = next((getattr(cfg, f) for f in _FFN_FIELDS if getattr(cfg, f, None)), None) or 4 * hidden
    act = str(getattr(cfg, "hidden_act", None) or getattr(cfg, "activation_function", None) or "gelu")
    family = getattr(cfg, "model_type", "")
    gated = family in ("llama", "mistral", "qwen2", "gemma") or act in _GATED_ACTS
    drop = any(float(getattr(cfg, f, 0.0) or 0.0) > 0 for f in _DROPOUT_FIELDS)
    norm = "rmsnorm" if hasattr(cfg, "rms_norm_eps") else "layernorm"
    position = "rope" if (hasattr(cfg, "rope_theta") or getattr(cfg, "rope_scaling", None) is not None
                          or family in ("llama", "mistral", "qwen2", "gemma")) else "learned"
    return {"name": model, "hidden": hidden, "heads": heads, "kv_heads": int(kv), "ffn_hidden": int(ffn),
            "layers": int(layers), "vocab": int(cfg.vocab_size), "gated_mlp": bool(gated),
            "dropout": bool(drop),
            "max_positions": p.max_positions, "norm": norm, "position": position,
            "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", True))}
