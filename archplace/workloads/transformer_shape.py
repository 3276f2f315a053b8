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


# what a preset's config dict leaves to its transformers class's defaults (transformers' GPT2Config,
# BertConfig, OPTConfig, LlamaConfig): read here so that planning a preset does not import transformers
# (3 s; the layer graphs come from the capture cache); tests/test_plan_memory.py checks them against the
# classes
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"vocab_size": 50257, "activation_function": "gelu_new", "resid_pdrop": 0.1, "attn_pdrop": 0.1,
             "tie_word_embeddings": True},
    "bert": {"vocab_size": 30522, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
             "attention_probs_dropout_prob": 0.1, "tie_word_embeddings": True},
    "opt": {"vocab_size": 50272, "activation_function": "relu", "dropout": 0.1, "attention_dropout": 0.0,
            "tie_word_embeddings": True},
    "llama": {"vocab_size": 32000, "hidden_act": "silu", "attention_dropout": 0.0,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000.0},
}
_ALIASES = {"hidden_size": ("hidden_size", "n_embd", "d_model"),
            "num_attention_heads": ("num_attention_heads", "n_head", "num_heads")}


class _DictConfig:
    """A preset's config dict with its family's defaults, read like a transformers config."""

    def __init__(self, d: dict[str, Any], family: str) -> None:
        self._d = {**FAMILY_DEFAULTS[family], **d, "model_type": family}
        for std, names in _ALIASES.items():
            self._d.setdefault(std, next((d[n] for n in names if n in d), None))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._d[name]
        except KeyError:
            raise AttributeError(name) from None


def transformer_fields(model: str) -> dict[str, Any]:
    """The decoder stack's sizes as a dict (the fields of ``train_memory.TransformerShape`` plus
    ``name``, ``max_positions``, ``norm``, ``position``, ``tied_embeddings``). A model that is not one
    stack of blocks (T5's encoder-decoder) is refused by name."""
    p = preset(model)
    cfg = (_DictConfig(p.config, p.family) if getattr(p, "config", None) is not None
           and p.family in FAMILY_DEFAULTS else p.make_config())
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
