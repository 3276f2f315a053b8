"""The propagation rules as op builders, and the models the sharding search runs on.

``Builder`` turns each op kind into labels (``sharding`` module docstring): element-wise ops with
broadcasting, GEMMs and batched GEMMs (an einsum), embedding lookups (the vocabulary is contracted:
a vocabulary-split table leaves a partial sum, Megatron's vocab-parallel embedding), norms and
softmax (their axis may not split), reshapes (dims tied only where groups line up), transposes,
reductions, fused attention, convolutions, pooling, cross entropy and explicit reshards.

The models are written from their configs, as ``inception_v3`` is: a GPT-2 / Megatron GPT, BERT, T5
(v1.0: RMS norms, no biases, relative position bias shared by all layers of a stack, tied LM head)
and VGG-19 (Llama and OPT: ``sharding_families``). Weights are stored [in, out] (mesh-TensorFlow's
kernels, the layout of Auto-MAP's Table 3, where "q split on dim 1" is the output dimension). Each
builder also records Megatron's sharding of every weight (``meta["megatron"]``: the dim split over
the model axis, or None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .sharding import Op, ShardGraph, Tensor

_EW_FLOPS = {
    "add": 1.0,
    "mul": 1.0,
    "gelu": 8.0,
    "relu": 1.0,
    "scale": 1.0,
    "tanh": 4.0,
    "mask": 1.0,
    "dropout": 2.0,
    "silu": 4.0,  # x·sigmoid(x): exp, add, divide, multiply
    "expand": 1.0,  # grouped-query attention's repeat_kv copy (sharding_families)
}


class Builder:
    def __init__(self, bytes_per_element: int = 2):
        self.g = ShardGraph()
        self.bpe = bytes_per_element
        self.megatron: dict[str, int | None] = {}

    # ------------------------------------------------------------------ tensors
    def _tensor(self, name: str, shape, role: str, bpe: int | None = None, producer: int = -1) -> int:
        shape = tuple(int(x) for x in shape)
        if any(x < 1 for x in shape):
            raise ValueError(f"tensor {name!r}: shape {shape} has a dimension < 1")
        self.g.tensors.append(Tensor(name, shape, role, self.bpe if bpe is None else bpe, producer))
        return len(self.g.tensors) - 1

    def param(self, name: str, shape, megatron: int | None = None) -> int:
        self.megatron[name] = megatron
        return self._tensor(name, shape, "param")

    def input(self, name: str, shape, bpe: int = 4) -> int:
        return self._tensor(name, shape, "input", bpe)

    def const(self, name: str, shape, bpe: int = 4) -> int:
        return self._tensor(name, shape, "const", bpe)

    def shape(self, t: int) -> tuple[int, ...]:
        return self.g.tensors[t].shape

    def op(
        self,
        kind: str,
        name: str,
        inputs,
        labels,
        out_shape,
        out_labels,
        *,
        nosplit=(),
        flops=0.0,
        tensor_core=False,
        partial_factor=1.0,
    ) -> int:
        out = self._tensor(name, out_shape, "act", producer=len(self.g.ops))
        self.g.ops.append(
            Op(
                name,
                kind,
                tuple(inputs),
                out,
                tuple(tuple(x) for x in labels),
                tuple(out_labels),
                frozenset(nosplit),
                float(flops),
                tensor_core,
                partial_factor,
            )
        )
        return out

    # ------------------------------------------------------------------ rules
    def elementwise(self, kind: str, name: str, *xs: int) -> int:
        """Broadcasting element-wise op: dims aligned from the right share a label, except a size-1
        dim broadcast to a larger one (which gets its own)."""
        shapes = [self.shape(x) for x in xs]
        rank = max(len(s) for s in shapes)
        out = [max(s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0) for i in range(rank)]
        labels = []
        for j, s in enumerate(shapes):
            off = rank - len(s)
            labels.append([f"d{i + off}" if s[i] == out[i + off] else f"u{j}_{i}" for i in range(len(s))])
        return self.op(
            kind,
            name,
            xs,
            labels,
            out,
            [f"d{i}" for i in range(rank)],
            flops=_EW_FLOPS.get(kind, 1.0) * math.prod(out),
        )

    def einsum(self, spec: str, name: str, a: int, b: int, kind: str = "matmul") -> int:
        """GEMM / batched GEMM as an einsum over one-letter labels; flops 2·∏(all label sizes)."""
        ins, out_l = spec.replace(" ", "").split("->")
        la, lb = ins.split(",")
        size: dict[str, int] = {}
        for ls, t in ((la, a), (lb, b)):
            if len(ls) != len(self.shape(t)):
                raise ValueError(f"op {name!r}: einsum {spec!r} does not fit shape {self.shape(t)}")
            for c, n in zip(ls, self.shape(t)):
                if size.setdefault(c, n) != n:
                    raise ValueError(f"op {name!r}: label {c!r} has sizes {size[c]} and {n}")
        return self.op(
            kind,
            name,
            (a, b),
            (la, lb),
            [size[c] for c in out_l],
            out_l,
            flops=2.0 * math.prod(size.values()),
            tensor_core=True,
        )

    def linear(self, name: str, x: int, w: int) -> int:
        """x[..., k] @ w[k, n]."""
        r = len(self.shape(x))
        lx = "abcdefg"[: r - 1]
        return self.einsum(f"{lx}k,kn->{lx}n", name, x, w, kind="linear")

    def embedding(self, name: str, ids: int, table: int) -> int:
        lx = "abcdefg"[: len(self.shape(ids))]
        v, h = self.shape(table)
        return self.op(
            "embedding", name, (ids, table), (lx, "vh"), (*self.shape(ids), h), lx + "h", flops=0.0
        )

    def norm(self, name: str, x: int, scale: int, bias: int | None = None) -> int:
        """Layer / RMS norm over the last dim (statistics over the whole row: the dim may not split)."""
        r = len(self.shape(x))
        lx = "abcdefg"[: r - 1] + "h"
        ins, labels = [x, scale], [lx, "h"]
        if bias is not None:
            ins.append(bias)
            labels.append("h")
        return self.op(
            "layernorm",
            name,
            ins,
            labels,
            self.shape(x),
            lx,
            nosplit={"h"},
            flops=8.0 * math.prod(self.shape(x)),
        )

    def softmax(self, name: str, x: int) -> int:
        r = len(self.shape(x))
        lx = "abcdefg"[: r - 1] + "z"
        return self.op(
            "softmax",
            name,
            (x,),
            (lx,),
            self.shape(x),
            lx,
            nosplit={"z"},
            flops=5.0 * math.prod(self.shape(x)),
        )

    def reshape(self, name: str, x: int, shape) -> int:
        """Dims group by equal running products; in each group the first dim of size > 1 on either
        side share a label (splitting it in contiguous blocks is the same split on both sides); the
        other dims of a group may not split."""
        src, dst = self.shape(x), tuple(int(v) for v in shape)
        if math.prod(src) != math.prod(dst):
            raise ValueError(f"reshape {name!r}: {src} -> {dst} changes the element count")
        li, lo, nos = [""] * len(src), [""] * len(dst), set()
        i = j = 0
        grp = 0
        while i < len(src) or j < len(dst):
            gi, gj = [i], [j]
            pi = src[i] if i < len(src) else 1
            pj = dst[j] if j < len(dst) else 1
            i, j = i + 1, j + 1
            while pi != pj:
                if pi < pj:
                    gi.append(i)
                    pi *= src[i]
                    i += 1
                else:
                    gj.append(j)
                    pj *= dst[j]
                    j += 1
            while i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
                gi.append(i)
                i += 1
            while j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
                gj.append(j)
                j += 1
            gi = [k for k in gi if k < len(src)]
            gj = [k for k in gj if k < len(dst)]
            mi = next((k for k in gi if src[k] > 1), None)
            mj = next((k for k in gj if dst[k] > 1), None)
            for k in gi:
                li[k] = f"g{grp}" if k == mi and mj is not None else f"i{k}"
                if li[k] != f"g{grp}" and src[k] > 1:
                    nos.add(li[k])
            for k in gj:
                lo[k] = f"g{grp}" if k == mj and mi is not None else f"o{k}"
                if lo[k] != f"g{grp}" and dst[k] > 1:
                    nos.add(lo[k])
            grp += 1
        return self.op("reshape", name, (x,), (li,), dst, lo, nosplit=nos)

    def transpose(self, name: str, x: int, perm) -> int:
        src = self.shape(x)
        li = [f"t{k}" for k in range(len(src))]
        return self.op("transpose", name, (x,), (li,), [src[p] for p in perm], [li[p] for p in perm])

    def reduce(self, kind: str, name: str, x: int, axes) -> int:
        """Sum / mean over ``axes`` (dropped): a split reduced axis leaves a partial sum."""
        src = self.shape(x)
        axes = {a % len(src) for a in axes}
        li = [f"r{k}" for k in range(len(src))]
        keep = [k for k in range(len(src)) if k not in axes]
        return self.op(
            kind,
            name,
            (x,),
            (li,),
            [src[k] for k in keep],
            [li[k] for k in keep],
            flops=float(math.prod(src)),
        )

    def attention(self, name: str, q: int, k: int, v: int) -> int:
        """Fused attention (FlashAttention): batch, heads and query positions split; the key positions
        and the head dims are reduced inside the kernel's softmax and may not split."""
        b, n, s, d = self.shape(q)
        t = self.shape(k)[2]
        e = self.shape(v)[3]
        return self.op(
            "attention",
            name,
            (q, k, v),
            ("bnsd", "bntd", "bnte"),
            (b, n, s, e),
            "bnse",
            nosplit={"t", "d"},
            flops=2.0 * b * n * s * t * (d + e),
            tensor_core=True,
        )

    def conv2d(self, name: str, x: int, w: int, stride: int = 1, pad: int = 1) -> int:
        """NCHW x, OIHW w: batch and output channels split freely, input channels are contracted (a
        partial sum), the spatial dims and window may not split (halo exchange is not modelled)."""
        b, c, h, wd = self.shape(x)
        o, c2, kh, kw = self.shape(w)
        if c != c2:
            raise ValueError(f"conv {name!r}: input channels {c} vs weight {c2}")
        ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
        return self.op(
            "conv",
            name,
            (x, w),
            ("bcHW", "ocKL"),
            (b, o, ho, wo),
            "boPQ",
            nosplit={"H", "W", "K", "L", "P", "Q"},
            flops=2.0 * b * o * ho * wo * c * kh * kw,
            tensor_core=True,
        )

    def pool(self, name: str, x: int, k: int = 2) -> int:
        b, c, h, w = self.shape(x)
        return self.op(
            "pool",
            name,
            (x,),
            ("bcHW",),
            (b, c, h // k, w // k),
            "bcPQ",
            nosplit={"H", "W", "P", "Q"},
            flops=float(b * c * h * w),
        )

    def cross_entropy(self, name: str, logits: int, labels: int) -> int:
        """Per-example loss of logits[..., V] against integer labels[...]. A vocabulary split is
        Megatron's vocab-parallel cross entropy: three per-example statistics (max, sum of exponentials,
        the target logit) are AllReduced, hence ``partial_factor`` 3 on the [...] fp32 output."""
        lx = "abcdefg"[: len(self.shape(labels))]
        out = self.op(
            "cross_entropy",
            name,
            (logits, labels),
            (lx + "v", lx),
            self.shape(labels),
            lx,
            flops=5.0 * math.prod(self.shape(logits)),
            partial_factor=3.0,
        )
        self.g.tensors[out] = Tensor(
            self.g.tensors[out].name, self.g.tensors[out].shape, "act", 4, self.g.tensors[out].producer
        )
        return out

    def reshard(self, name: str, x: int) -> int:
        """An explicit change of sharding: output dims are not tied to the input's."""
        src = self.shape(x)
        return self.op(
            "reshard",
            name,
            (x,),
            ([f"i{k}" for k in range(len(src))],),
            src,
            [f"o{k}" for k in range(len(src))],
        )

    def build(self, **meta: Any) -> ShardGraph:
        self.g.meta = dict(meta, megatron=dict(self.megatron))
        return self.g


# ------------------------------------------------------------------------------------------ models


def mlp2(batch: int = 8, d: int = 16, f: int = 64, bias: bool = True) -> ShardGraph:
    """x[b, d] -> relu(x W1 + b1) W2 + b2: Megatron splits W1 by columns and W2 by rows."""
    B = Builder()
    x = B.input("x", (batch, d), bpe=2)
    w1 = B.param("fc1/kernel", (d, f), 1)
    h = B.linear("fc1", x, w1)
    if bias:
        h = B.elementwise("add", "fc1/bias_add", h, B.param("fc1/bias", (f,), 0))
    h = B.elementwise("relu", "relu", h)
    y = B.linear("fc2", h, B.param("fc2/kernel", (f, d), 0))
    if bias:
        y = B.elementwise("add", "fc2/bias_add", y, B.param("fc2/bias", (d,), None))
    return B.build(model="mlp2", batch=batch)


def _attention(
    B: Builder,
    p: str,
    x: int,
    kv: int,
    heads: int,
    dk: int,
    *,
    bias: bool,
    mask: int | None,
    pos_bias: int | None,
    scale: bool,
) -> int:
    b, s, h = B.shape(x)
    t = B.shape(kv)[1]
    inner = heads * dk
    outs = []
    for nm, src, ln in (("q", x, s), ("k", kv, t), ("v", kv, t)):
        y = B.linear(f"{p}/{nm}", src, B.param(f"{p}/{nm}/kernel", (h, inner), 1))
        if bias:
            y = B.elementwise("add", f"{p}/{nm}/bias_add", y, B.param(f"{p}/{nm}/bias", (inner,), 0))
        y = B.reshape(f"{p}/{nm}/heads", y, (b, ln, heads, dk))
        outs.append(B.transpose(f"{p}/{nm}/bnsd", y, (0, 2, 1, 3)))
    q, k, v = outs
    sc = B.einsum("bnsd,bntd->bnst", f"{p}/scores", q, k)
    if scale:
        sc = B.elementwise("scale", f"{p}/scale", sc)
    if pos_bias is not None:
        sc = B.elementwise("add", f"{p}/position_bias", sc, pos_bias)
    if mask is not None:
        sc = B.elementwise("mask", f"{p}/mask", sc, mask)
    pr = B.softmax(f"{p}/softmax", sc)
    ctx = B.einsum("bnst,bntd->bnsd", f"{p}/context", pr, v)
    ctx = B.transpose(f"{p}/context/bsnd", ctx, (0, 2, 1, 3))
    ctx = B.reshape(f"{p}/context/merge", ctx, (b, s, inner))
    o = B.linear(f"{p}/o", ctx, B.param(f"{p}/o/kernel", (inner, h), 0))
    if bias:
        o = B.elementwise("add", f"{p}/o/bias_add", o, B.param(f"{p}/o/bias", (h,), None))
    return o


def _mlp(B: Builder, p: str, x: int, ff: int, act: str, bias: bool, names=("wi", "wo")) -> int:
    h = B.shape(x)[-1]
    y = B.linear(f"{p}/{names[0]}", x, B.param(f"{p}/{names[0]}/kernel", (h, ff), 1))
    if bias:
        y = B.elementwise("add", f"{p}/{names[0]}/bias_add", y, B.param(f"{p}/{names[0]}/bias", (ff,), 0))
    y = B.elementwise(act, f"{p}/{act}", y)
    y = B.linear(f"{p}/{names[1]}", y, B.param(f"{p}/{names[1]}/kernel", (ff, h), 0))
    if bias:
        y = B.elementwise("add", f"{p}/{names[1]}/bias_add", y, B.param(f"{p}/{names[1]}/bias", (h,), None))
    return y


def _ln(B: Builder, p: str, x: int, bias: bool) -> int:
    h = B.shape(x)[-1]
    return B.norm(p, x, B.param(f"{p}/scale", (h,), None), B.param(f"{p}/bias", (h,), None) if bias else None)


def gpt(
    layers: int = 1,
    hidden: int = 64,
    heads: int = 4,
    ffn: int | None = None,
    vocab: int = 128,
    seq: int = 16,
    batch: int = 2,
    positions: int | None = None,
    lm_head: bool = True,
    family: str = "gpt2",
) -> ShardGraph:
    """GPT-2 (pre-norm blocks with biases, learned positions, tied LM head, cross entropy). With
    ``lm_head=False`` and ``layers=1`` and no embeddings it is a lone transformer block."""
    B = Builder()
    ffn = ffn or 4 * hidden
    ids = B.input("input_ids", (batch, seq))
    wte = B.param("wte", (vocab, hidden), 0)
    x = B.embedding("embed/tokens", ids, wte)
    pos = B.embedding(
        "embed/positions", B.const("position_ids", (seq,)), B.param("wpe", (positions or seq, hidden), None)
    )
    x = B.elementwise("add", "embed/add", x, pos)
    mask = B.const("causal_mask", (1, 1, seq, seq))
    for i in range(layers):
        p = f"h.{i}"
        n1 = _ln(B, f"{p}/ln_1", x, True)
        a = _attention(
            B, f"{p}/attn", n1, n1, heads, hidden // heads, bias=True, mask=mask, pos_bias=None, scale=True
        )
        x = B.elementwise("add", f"{p}/residual_1", x, a)
        m = _mlp(B, f"{p}/mlp", _ln(B, f"{p}/ln_2", x, True), ffn, "gelu", True, names=("c_fc", "c_proj"))
        x = B.elementwise("add", f"{p}/residual_2", x, m)
    x = _ln(B, "ln_f", x, True)
    if lm_head:
        logits = B.einsum("bsh,vh->bsv", "lm_head", x, wte, kind="linear")
        B.cross_entropy("loss", logits, B.input("labels", (batch, seq)))
    return B.build(model=family, layers=layers, hidden=hidden, heads=heads, seq=seq, batch=batch)


def gpt_block(hidden: int = 64, heads: int = 4, seq: int = 16, batch: int = 2) -> ShardGraph:
    """One Megatron GPT block alone: x -> x + attn(ln1 x) -> + mlp(ln2 ·)."""
    B = Builder()
    x = B.input("x", (batch, seq, hidden), bpe=2)
    mask = B.const("causal_mask", (1, 1, seq, seq))
    n1 = _ln(B, "ln_1", x, True)
    a = _attention(B, "attn", n1, n1, heads, hidden // heads, bias=True, mask=mask, pos_bias=None, scale=True)
    x = B.elementwise("add", "residual_1", x, a)
    m = _mlp(B, "mlp", _ln(B, "ln_2", x, True), 4 * hidden, "gelu", True, names=("c_fc", "c_proj"))
    B.elementwise("add", "residual_2", x, m)
    return B.build(model="gpt-block", hidden=hidden, heads=heads, seq=seq, batch=batch)


def t5_block(
    hidden: int = 32, heads: int = 4, dk: int = 8, ff: int = 64, seq: int = 8, batch: int = 2
) -> ShardGraph:
    """One T5 encoder block without biases (RMS norms, q/k/v/o, ReLU FFN): 8 weights, small enough to
    enumerate every per-variable choice (3^6 · 2^2)."""
    B = Builder()
    x = B.input("x", (batch, seq, hidden), bpe=2)
    n0 = _ln(B, "ln_0", x, False)
    a = _attention(B, "SelfAttention", n0, n0, heads, dk, bias=False, mask=None, pos_bias=None, scale=False)
    x = B.elementwise("add", "residual_0", x, a)
    m = _mlp(B, "DenseReluDense", _ln(B, "ln_1", x, False), ff, "relu", False)
    B.elementwise("add", "residual_1", x, m)
    return B.build(model="t5-block", hidden=hidden, seq=seq, batch=batch)


def t5(cfg: Mapping[str, Any], seq: int = 512, batch: int = 8, tgt: int | None = None) -> ShardGraph:
    """T5 v1.0 (``T5ForConditionalGeneration``) from its config: shared embedding tied to the LM head
    (logits scaled by d_model^-0.5), RMS norms, relative position bias computed by the first block of
    each stack and added in every block, ReLU FFN, no biases."""
    d, dk, nh, ff = (int(cfg[k]) for k in ("d_model", "d_kv", "num_heads", "d_ff"))
    ne = int(cfg["num_layers"])
    nd = int(cfg.get("num_decoder_layers") or ne)
    vocab, nb = int(cfg.get("vocab_size", 32128)), int(cfg.get("relative_attention_num_buckets", 32))
    tgt = tgt or seq
    B = Builder()
    shared = B.param("shared", (vocab, d), 0)
    ids = B.input("input_ids", (batch, seq))
    am = B.input("attention_mask", (batch, seq))
    dids = B.input("decoder_input_ids", (batch, tgt))
    dam = B.input("decoder_attention_mask", (batch, tgt))
    labels = B.input("labels", (batch, tgt))

    def ext_mask(name: str, m: int, n: int) -> int:
        e = B.elementwise("mask", f"{name}/extend", m)
        return B.reshape(f"{name}/broadcast", e, (batch, 1, 1, n))

    def rel_bias(stack: str, s: int, t: int) -> int:
        buckets = B.const(f"{stack}/relative_position_buckets", (s, t))
        tab = B.param(f"{stack}/block.0/layer.0/SelfAttention/relative_attention_bias", (nb, nh), 1)
        e = B.embedding(f"{stack}/relative_attention_bias", buckets, tab)
        return B.transpose(f"{stack}/position_bias", e, (2, 0, 1))

    # encoder
    x = B.embedding("encoder/embed_tokens", ids, shared)
    emask, ebias = ext_mask("encoder/mask", am, seq), rel_bias("encoder", seq, seq)
    for i in range(ne):
        p = f"encoder/block.{i}"
        n0 = _ln(B, f"{p}/layer.0/layer_norm", x, False)
        a = _attention(
            B,
            f"{p}/layer.0/SelfAttention",
            n0,
            n0,
            nh,
            dk,
            bias=False,
            mask=emask,
            pos_bias=ebias,
            scale=False,
        )
        x = B.elementwise("add", f"{p}/layer.0/residual", x, a)
        m = _mlp(
            B, f"{p}/layer.1/DenseReluDense", _ln(B, f"{p}/layer.1/layer_norm", x, False), ff, "relu", False
        )
        x = B.elementwise("add", f"{p}/layer.1/residual", x, m)
    enc = _ln(B, "encoder/final_layer_norm", x, False)
    # decoder
    y = B.embedding("decoder/embed_tokens", dids, shared)
    causal = B.const("decoder/causal_mask", (1, 1, tgt, tgt))
    dmask = B.elementwise("add", "decoder/mask/combine", ext_mask("decoder/mask", dam, tgt), causal)
    dbias = rel_bias("decoder", tgt, tgt)
    for i in range(nd):
        p = f"decoder/block.{i}"
        n0 = _ln(B, f"{p}/layer.0/layer_norm", y, False)
        a = _attention(
            B,
            f"{p}/layer.0/SelfAttention",
            n0,
            n0,
            nh,
            dk,
            bias=False,
            mask=dmask,
            pos_bias=dbias,
            scale=False,
        )
        y = B.elementwise("add", f"{p}/layer.0/residual", y, a)
        c = _attention(
            B,
            f"{p}/layer.1/EncDecAttention",
            _ln(B, f"{p}/layer.1/layer_norm", y, False),
            enc,
            nh,
            dk,
            bias=False,
            mask=emask,
            pos_bias=None,
            scale=False,
        )
        y = B.elementwise("add", f"{p}/layer.1/residual", y, c)
        m = _mlp(
            B, f"{p}/layer.2/DenseReluDense", _ln(B, f"{p}/layer.2/layer_norm", y, False), ff, "relu", False
        )
        y = B.elementwise("add", f"{p}/layer.2/residual", y, m)
    y = _ln(B, "decoder/final_layer_norm", y, False)
    y = B.elementwise("scale", "lm_head/rescale", y)
    logits = B.einsum("bsh,vh->bsv", "lm_head", y, shared, kind="linear")
    B.cross_entropy("loss", logits, labels)
    return B.build(model="t5", d_model=d, num_layers=ne, num_decoder_layers=nd, seq=seq, batch=batch)


def bert(cfg: Mapping[str, Any], seq: int = 512, batch: int = 8) -> ShardGraph:
    """``BertModel`` (post-norm encoder with word, position and type embeddings, GELU FFN, pooler)."""
    h, nl, nh = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    ff, vocab = int(cfg.get("intermediate_size", 4 * h)), int(cfg.get("vocab_size", 30522))
    npos, ntype = int(cfg.get("max_position_embeddings", 512)), int(cfg.get("type_vocab_size", 2))
    B = Builder()
    ids = B.input("input_ids", (batch, seq))
    x = B.embedding("embeddings/word", ids, B.param("embeddings/word_embeddings", (vocab, h), 0))
    x = B.elementwise(
        "add",
        "embeddings/add_pos",
        x,
        B.embedding(
            "embeddings/position",
            B.const("position_ids", (seq,)),
            B.param("embeddings/position_embeddings", (npos, h), None),
        ),
    )
    x = B.elementwise(
        "add",
        "embeddings/add_type",
        x,
        B.embedding(
            "embeddings/token_type",
            B.input("token_type_ids", (batch, seq)),
            B.param("embeddings/token_type_embeddings", (ntype, h), None),
        ),
    )
    x = _ln(B, "embeddings/LayerNorm", x, True)
    mask = B.reshape(
        "mask/broadcast",
        B.elementwise("mask", "mask/extend", B.input("attention_mask", (batch, seq))),
        (batch, 1, 1, seq),
    )
    for i in range(nl):
        p = f"encoder/layer.{i}"
        a = _attention(
            B, f"{p}/attention", x, x, nh, h // nh, bias=True, mask=mask, pos_bias=None, scale=True
        )
        x = _ln(B, f"{p}/attention/LayerNorm", B.elementwise("add", f"{p}/attention/residual", x, a), True)
        m = _mlp(B, f"{p}/ffn", x, ff, "gelu", True, names=("intermediate", "output"))
        x = _ln(B, f"{p}/output/LayerNorm", B.elementwise("add", f"{p}/output/residual", x, m), True)
    first = B.einsum("bsh,s->bh", "pooler/select", x, B.const("first_token", (seq,)))
    pooled = B.linear("pooler/dense", first, B.param("pooler/dense/kernel", (h, h), None))
    pooled = B.elementwise("add", "pooler/bias_add", pooled, B.param("pooler/dense/bias", (h,), None))
    B.elementwise("tanh", "pooler/tanh", pooled)
    return B.build(model="bert", hidden=h, layers=nl, seq=seq, batch=batch)


VGG19_CONVS = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    512,
    "M",
)


def vgg19(batch: int = 32, image: int = 224, classes: int = 1000) -> ShardGraph:
    """VGG-19 (Simonyan & Zisserman 2015, configuration E): 16 3x3 convs, 5 max pools, FC 4096-4096-
    classes, softmax cross entropy; 143.7M parameters. Megatron-style tensor parallelism of a CNN is
    not defined; ``meta["megatron"]`` holds Auto-MAP's Table 4 (convs replicated, FC layers split)."""
    B = Builder(bytes_per_element=4)
    x = B.input("features", (batch, 3, image, image))
    c, i = 3, 0
    for v in VGG19_CONVS:
        if v == "M":
            x = B.pool(f"pool{i}", x)
            continue
        i += 1
        x = B.conv2d(f"conv{i}", x, B.param(f"conv{i}/kernel", (v, c, 3, 3), None))
        x = B.elementwise("add", f"conv{i}/bias_add", x, B.param(f"conv{i}/bias", (v, 1, 1), None))
        x = B.elementwise("relu", f"conv{i}/relu", x)
        c = v
    b, ch, hh, ww = B.shape(x)
    x = B.reshape("flatten", x, (b, ch * hh * ww))
    # Table 4 (Auto-MAP p. 11): fc1/kernel=1, fc1/bias=0, fc2/kernel=0, fc2/bias=0 (as printed),
    # predictions/kernel=1, predictions/bias=0
    for nm, n, kdim, bdim, act in (
        ("fc1", 4096, 1, 0, True),
        ("fc2", 4096, 0, None, True),
        ("predictions", classes, 1, 0, False),
    ):
        x = B.linear(nm, x, B.param(f"{nm}/kernel", (B.shape(x)[-1], n), kdim))
        x = B.elementwise("add", f"{nm}/bias_add", x, B.param(f"{nm}/bias", (n,), bdim))
        if act:
            x = B.elementwise("relu", f"{nm}/relu", x)
    B.cross_entropy("loss", x, B.input("labels", (batch,)))
    return B.build(model="vgg19", batch=batch, image=image)
