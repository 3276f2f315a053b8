"""Config-built tensor graphs of the decoder-only families Phaze's Table 2 adds to Auto-MAP's models:
Llama (Llama 2) and OPT, for ``archplace shard`` (``sharding_models`` holds the rules and the T5,
GPT-2, BERT and VGG-19 graphs; this module only composes its ``Builder``).

Both follow the transformers modules they are counted against (``LlamaForCausalLM``,
``OPTForCausalLM``), with weights stored [in, out] as everywhere in the sharding graphs, and record
Megatron-LM's sharding of every weight (``meta["megatron"]``): q/k/v and the MLP's first GEMMs
column-parallel (dim 1), the attention output and the MLP's last GEMM row-parallel (dim 0), the token
embedding vocabulary-parallel (dim 0), an untied LM head column-parallel over the vocabulary (dim 1),
norms, positions and OPT's small projections replicated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .sharding import ShardGraph
from .sharding_models import Builder, _attention, _ln, _mlp


def rotary(B: Builder, name: str, x: int, cos: int, sin: int) -> int:
    """Rotary position embedding on x[b, n, s, d]: ``x·cos + rotate_half(x)·sin`` with cos, sin[s, d]
    (an element-wise op over the positions; rotate_half pairs element i with i + d/2, so the head
    dim may not split). 3 flops an element (two products, one sum; the negation is free)."""
    b, n, s, d = B.shape(x)
    return B.op(
        "rotary",
        name,
        (x, cos, sin),
        ("bnsd", "sd", "sd"),
        (b, n, s, d),
        "bnsd",
        nosplit={"d"},
        flops=3.0 * b * n * s * d,
    )


def repeat_kv(B: Builder, name: str, x: int, groups: int) -> int:
    """Grouped-query attention's ``repeat_kv``: x[b, kv, t, d] -> [b, kv·groups, t, d], a
    materialised copy (as transformers does it) by a broadcast against a [1, 1, groups, 1, 1] constant
    and a reshape whose group (kv, groups) -> heads ties the kv heads to the query heads: splitting
    the heads in contiguous blocks splits the kv heads the same way."""
    if groups == 1:
        return x
    b, kv, t, d = B.shape(x)
    y = B.reshape(f"{name}/unsqueeze", x, (b, kv, 1, t, d))
    y = B.elementwise("expand", f"{name}/expand", y, B.const(f"{name}/groups", (1, 1, groups, 1, 1)))
    return B.reshape(f"{name}/merge", y, (b, kv * groups, t, d))


def _llama_attention(
    B: Builder, p: str, x: int, heads: int, kv_heads: int, hd: int, rope: tuple[int, int], mask: int
) -> int:
    b, s, h = B.shape(x)
    outs = []
    for nm, n in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
        y = B.linear(f"{p}/{nm}_proj", x, B.param(f"{p}/{nm}_proj/kernel", (h, n * hd), 1))
        y = B.reshape(f"{p}/{nm}/heads", y, (b, s, n, hd))
        y = B.transpose(f"{p}/{nm}/bnsd", y, (0, 2, 1, 3))
        if nm != "v":
            y = rotary(B, f"{p}/{nm}/rotary", y, *rope)
        if nm != "q":
            y = repeat_kv(B, f"{p}/{nm}/repeat_kv", y, heads // kv_heads)
        outs.append(y)
    q, k, v = outs
    sc = B.elementwise("scale", f"{p}/scale", B.einsum("bnsd,bntd->bnst", f"{p}/scores", q, k))
    pr = B.softmax(f"{p}/softmax", B.elementwise("mask", f"{p}/mask", sc, mask))
    ctx = B.einsum("bnst,bntd->bnsd", f"{p}/context", pr, v)
    ctx = B.reshape(
        f"{p}/context/merge", B.transpose(f"{p}/context/bsnd", ctx, (0, 2, 1, 3)), (b, s, heads * hd)
    )
    return B.linear(f"{p}/o_proj", ctx, B.param(f"{p}/o_proj/kernel", (heads * hd, h), 0))


def _swiglu(B: Builder, p: str, x: int, ff: int) -> int:
    """down(silu(gate x) · up x): gate and up column-parallel, down row-parallel."""
    h = B.shape(x)[-1]
    gate = B.linear(f"{p}/gate_proj", x, B.param(f"{p}/gate_proj/kernel", (h, ff), 1))
    up = B.linear(f"{p}/up_proj", x, B.param(f"{p}/up_proj/kernel", (h, ff), 1))
    y = B.elementwise("mul", f"{p}/gate_mul", B.elementwise("silu", f"{p}/silu", gate), up)
    return B.linear(f"{p}/down_proj", y, B.param(f"{p}/down_proj/kernel", (ff, h), 0))


def llama(cfg: Mapping[str, Any], seq: int = 4096, batch: int = 8, embeddings: bool = True) -> ShardGraph:
    """``LlamaForCausalLM`` from its config: RMS norms (scale only), rotary positions on q and k,
    grouped-query attention when ``num_key_value_heads`` < heads, SwiGLU MLP, no biases, an LM head
    untied from the embedding unless ``tie_word_embeddings``, causal mask and cross entropy. With
    ``embeddings=False`` the blocks alone, from a bf16 input x[batch, seq, hidden] (small enough with
    one block to enumerate every per-variable choice)."""
    h, nl, nh = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    hd = int(cfg.get("head_dim") or h // nh)
    ff, vocab = int(cfg["intermediate_size"]), int(cfg.get("vocab_size", 32000))
    if nh % nkv:
        raise ValueError(
            f"llama config: num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}"
        )
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("llama config: attention_bias / mlp_bias are not modelled (Llama 2 has none)")
    B = Builder()
    if embeddings:
        emb = B.param("embed_tokens", (vocab, h), 0)
        x = B.embedding("embed_tokens/lookup", B.input("input_ids", (batch, seq)), emb)
    else:
        x = B.input("x", (batch, seq, h), bpe=2)
    rope = (B.const("rotary/cos", (seq, hd)), B.const("rotary/sin", (seq, hd)))
    mask = B.const("causal_mask", (1, 1, seq, seq))
    for i in range(nl):
        p = f"layers.{i}"
        a = _llama_attention(
            B, f"{p}/self_attn", _ln(B, f"{p}/input_layernorm", x, False), nh, nkv, hd, rope, mask
        )
        x = B.elementwise("add", f"{p}/residual_1", x, a)
        m = _swiglu(B, f"{p}/mlp", _ln(B, f"{p}/post_attention_layernorm", x, False), ff)
        x = B.elementwise("add", f"{p}/residual_2", x, m)
    if not embeddings:
        return B.build(
            model="llama-blocks", hidden=h, layers=nl, heads=nh, kv_heads=nkv, seq=seq, batch=batch
        )
    x = _ln(B, "norm", x, False)
    if cfg.get("tie_word_embeddings"):
        logits = B.einsum("bsh,vh->bsv", "lm_head", x, emb, kind="linear")
    else:
        logits = B.linear("lm_head", x, B.param("lm_head/kernel", (h, vocab), 1))
    B.cross_entropy("loss", logits, B.input("labels", (batch, seq)))
    return B.build(model="llama", hidden=h, layers=nl, heads=nh, kv_heads=nkv, seq=seq, batch=batch)


def opt(cfg: Mapping[str, Any], seq: int = 2048, batch: int = 8) -> ShardGraph:
    """``OPTForCausalLM`` from its config: learned positions (offset 2: the table has
    ``max_position_embeddings + 2`` rows), biased q/k/v/out projections, ReLU MLP (fc1, fc2), layer
    norms before each sub-block (``do_layer_norm_before``, the default) or after the residual add
    (OPT-350M), ``project_in``/``project_out`` when ``word_embed_proj_dim`` differs from the hidden
    size, the LM head tied to the token embedding."""
    h, nl, nh = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    ff, vocab = int(cfg.get("ffn_dim", 4 * h)), int(cfg.get("vocab_size", 50272))
    wp = int(cfg.get("word_embed_proj_dim") or h)
    npos = int(cfg.get("max_position_embeddings", 2048)) + 2
    pre = bool(cfg.get("do_layer_norm_before", True))
    if cfg.get("activation_function", "relu") != "relu" or cfg.get("enable_bias", True) is False:
        raise ValueError("opt config: only activation_function 'relu' with biases is modelled (every OPT)")
    if seq + 2 > npos:
        raise ValueError(f"opt: seq {seq} exceeds max_position_embeddings {npos - 2}")
    B = Builder()
    ids = B.input("input_ids", (batch, seq))
    emb = B.param("embed_tokens", (vocab, wp), 0)
    x = B.embedding("embed_tokens/lookup", ids, emb)
    if wp != h:
        x = B.linear("project_in", x, B.param("project_in/kernel", (wp, h), None))
    pos = B.embedding(
        "embed_positions/lookup", B.const("position_ids", (seq,)), B.param("embed_positions", (npos, h), None)
    )
    x = B.elementwise("add", "embed/add", x, pos)
    mask = B.const("causal_mask", (1, 1, seq, seq))
    for i in range(nl):
        p = f"layers.{i}"
        a_in = _ln(B, f"{p}/self_attn_layer_norm", x, True) if pre else x
        a = _attention(
            B, f"{p}/self_attn", a_in, a_in, nh, h // nh, bias=True, mask=mask, pos_bias=None, scale=True
        )
        x = B.elementwise("add", f"{p}/residual_1", x, a)
        if not pre:
            x = _ln(B, f"{p}/self_attn_layer_norm", x, True)
        m = _mlp(
            B,
            f"{p}",
            _ln(B, f"{p}/final_layer_norm", x, True) if pre else x,
            ff,
            "relu",
            True,
            ("fc1", "fc2"),
        )
        x = B.elementwise("add", f"{p}/residual_2", x, m)
        if not pre:
            x = _ln(B, f"{p}/final_layer_norm", x, True)
    if pre and not cfg.get("_remove_final_layer_norm", False):
        x = _ln(B, "final_layer_norm", x, True)
    if wp != h:
        x = B.linear("project_out", x, B.param("project_out/kernel", (h, wp), None))
    logits = B.einsum("bsh,vh->bsv", "lm_head", x, emb, kind="linear")
    B.cross_entropy("loss", logits, B.input("labels", (batch, seq)))
    return B.build(model="opt", hidden=h, layers=nl, heads=nh, seq=seq, batch=batch, pre_norm=pre)


def llama_params(cfg: Mapping[str, Any]) -> int:
    """``LlamaForCausalLM``'s parameter count in closed form (no biases): per layer q, o [h, nh·hd],
    k, v [h, nkv·hd], three [h, ff] MLP weights and two norms; the embedding, final norm and (untied)
    LM head."""
    h, nl, nh = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    hd = int(cfg.get("head_dim") or h // nh)
    ff, v = int(cfg["intermediate_size"]), int(cfg.get("vocab_size", 32000))
    layer = 2 * h * nh * hd + 2 * h * nkv * hd + 3 * h * ff + 2 * h
    return nl * layer + v * h * (1 if cfg.get("tie_word_embeddings") else 2) + h
