"""Ops costed for the work they do (issue 28, item 3), each against a closed form: batched GEMM shapes,
embedding lookups, tied weights, data-moving ops, the input-gradient GEMM, vocab-parallel embedding
and LM head, the tensor-parallel width check, one backward AllReduce per gated FFN.

Small configs (4 blocks, 3 captured) keep each capture to a few seconds."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from archplace import api
from archplace.hardware.presets import TPUV4
from archplace.simulators.latency import estimate_latencies
from archplace.workloads import layer_graph
from archplace.workloads.ops import moved_bytes

BPE = 2  # bytes per element of the graphs (training precision); ids are int64, 8 bytes
_LM = dict(num_hidden_layers=4, max_position_embeddings=256)


def _rows(g, prefix: str) -> np.ndarray:
    """Rows whose op name starts with ``prefix``."""
    return np.flatnonzero(np.array([n.startswith(prefix) for n in g.nodes["name"]]))


def _one(g, op: str, suffix: str = "") -> int:
    """The row of the op ``module/aten`` (any ``_N`` numbering and ``+vector`` fusion of the capture)
    followed by ``suffix`` (``/grad``, ``/dgrad``, ``/allreduce``...)."""
    pat = re.compile(re.escape(op) + r"(_\d+)?(\+\w+)?" + re.escape(suffix))
    rows = [i for i, n in enumerate(g.nodes["name"]) if pat.fullmatch(n)]
    assert len(rows) == 1, (op, suffix, [g.nodes["name"][i] for i in rows])
    return rows[0]


def _gemm(g, r: int) -> tuple[int, int, int, int]:
    return tuple(int(g.nodes[c][r]) for c in ("gemm_b", "gemm_m", "gemm_n", "gemm_k"))


# ---------------------------------------------------------------------------- 1. batched GEMM shapes
def test_baddbmm_is_the_attention_score_gemm():
    """BLOOM's scores ``baddbmm(alibi, Q, Kᵀ)`` at 16 heads of 64, sequence 128: (b·H, S, S, D) =
    (16, 128, 128, 64), 2·16·128²·64 flops (the bias was read as the left operand: (4096, 1, 64, 128))."""
    cfg = dict(architectures=["BloomForCausalLM"], model_type="bloom", hidden_size=1024, n_layer=4,
               n_head=16, vocab_size=512)
    g = api.from_hf_config(cfg, seq=128, mbs=1, training=False)
    r = _one(g, "transformer.h.1.self_attention/baddbmm")
    assert _gemm(g, r) == (16, 128, 128, 64)
    assert g.nodes["flops"][r] >= 2.0 * 16 * 128 * 128 * 64
    ctx = _one(g, "transformer.h.1.self_attention/bmm")  # probabilities · V
    assert _gemm(g, ctx) == (16, 128, 64, 128)


def test_addbmm_sums_batch_gemms():
    """``addbmm(C, A[B,M,K], B[B,K,N])`` is B GEMMs of (M, N, K) summed into one (M, N) output."""
    class AddBmm(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):  # x: (4, 6, 8)
            h = self.proj(x)
            return torch.addbmm(torch.zeros(6, 6), h, h.transpose(1, 2))

    g = api.from_module(AddBmm(), torch.zeros(4, 6, 8), layer_stack=(), loss=False, training=False)
    r = _one(g, "model/addbmm")
    assert _gemm(g, r) == (4, 6, 6, 8)
    assert g.nodes["flops"][r] == 2.0 * 4 * 6 * 6 * 8


# ---------------------------------------------------------------------------- 2. embedding lookups
GEMMA_2B = dict(_LM, architectures=["GemmaForCausalLM"], model_type="gemma", hidden_size=2048,
                intermediate_size=16384, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                vocab_size=256000)


def test_embedding_lookup_reads_its_rows_not_the_table():
    """Gemma-2B at sequence 128: the lookup moves its ids (8 bytes each) and 128 rows of 2048 in and out
    (2·128·2048·2 bytes), not the 256000-row table (1 GB, 874 µs at TPUv4's 1.2 TB/s); it still holds
    the table. Its gradient scatter-adds dY into those rows (reads dY, ids and the rows, writes them)."""
    b, s, h, V = 1, 128, 2048, 256000
    g = api.from_hf_config(GEMMA_2B, seq=s, mbs=b, training=True)
    r = _one(g, "model.embed_tokens/embedding")
    nd = g.nodes
    rows = b * s * h * BPE
    assert nd["weight_bytes"][r] == V * h * BPE
    ids = 8 * b * s
    assert (nd["input_bytes"][r], nd["output_bytes"][r], nd["saved_bytes"][r]) == (ids + rows, rows, ids)
    assert moved_bytes(nd)[r] == 8 * b * s + 2 * rows
    single, _ = estimate_latencies(g, [TPUV4]).for_arch(0)
    assert single[r] < 2e-6 < V * h * BPE / TPUV4.hbm_bw  # about 0.9 µs instead of 874 µs
    gr = _one(g, "model.embed_tokens/embedding", "/grad")
    assert (nd["input_bytes"][gr], nd["output_bytes"][gr]) == (rows + 8 * b * s + rows, rows)
    assert nd["vector_flops"][gr] == b * s * h  # one add per element of the rows


# ---------------------------------------------------------------------------- 3. tied weights
GPT2 = dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=64, n_layer=4, n_head=4,
            vocab_size=512, n_positions=128)


def test_tied_weights_are_held_by_every_reading_layer():
    """GPT-2's LM head reads the token embedding: the embed layer holds (V + P)·h, the head layer V·h
    plus ln_f; the table is listed once in ``meta["shared_params"]`` and in ``LayerGraph.tied_groups``,
    so counting each parameter once gives transformers' count. The head's weight gradient is V·h."""
    V, P, h, b, s = 512, 128, 64, 2, 32
    g = api.from_hf_config(GPT2, seq=s, mbs=b, training=True)
    lg = layer_graph(g)
    last = lg.num_layers - 1
    assert (lg.names[0], lg.names[last]) == ("embed", "head")
    table = V * h * BPE
    assert lg.param_bytes[0] == (V + P) * h * BPE
    assert lg.param_bytes[last] == table + 2 * h * BPE
    assert g.meta["shared_params"] == [{"param": g.meta["shared_params"][0]["param"], "bytes": table,
                                        "layers": ["embed", "head"], "vocab": True}]
    assert lg.tied_groups == (((0, last), table),)
    assert lg.tied_bytes.tolist() == [table] + [0] * (last - 1) + [table]
    with torch.device("meta"):
        from transformers import GPT2Config, GPT2LMHeadModel

        count = GPT2LMHeadModel(GPT2Config(**{k: v for k, v in GPT2.items()
                                              if k not in ("architectures", "model_type")})).num_parameters()
    assert g.totals()["weight_bytes"] == count * BPE == lg.unique_param_bytes()
    assert int(lg.param_bytes.sum()) == count * BPE + table
    assert lg.unique_param_bytes([0, last]) == lg.param_bytes[0] + lg.param_bytes[last] - table
    wgrad = _one(g, "lm_head/linear", "/wgrad")
    assert g.nodes["output_bytes"][wgrad] == table


# ---------------------------------------------------------------------------- 4. data-moving ops
class _Mover(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x, idx, rows):  # x (2, 8, 16); idx (2, 4, 16) and rows (5,) int64
        h = self.proj(x)
        return (h.clone(), h.transpose(1, 2).contiguous(), h.contiguous() + 1, h.reshape(2, 128) + 1,
                h.transpose(1, 2).reshape(2, 128), h.repeat_interleave(2, dim=1),
                torch.gather(h, 1, idx), h[:, rows], h.long(), h.to(torch.float32) + 1,
                torch.ops.aten._to_copy(h, dtype=torch.float16))


def test_data_moving_ops_are_charged_their_bytes():
    """A copy reads and writes its bytes; a gather reads the elements it picks and its indices (kept for
    the backward scatter-add); a reshape or contiguous that can be a view, and a cast to the same dtype,
    stay free. X = 2·8·16 elements of 2 bytes."""
    x, idx = torch.zeros(2, 8, 16), torch.zeros(2, 4, 16, dtype=torch.long)
    rows = torch.zeros(5, dtype=torch.long)
    g = api.from_module(_Mover(), (x, idx, rows), layer_stack=(), loss=False, training=True, fuse=False)
    nd = g.nodes
    X = 2 * 8 * 16 * BPE
    expect = {  # name -> (input bytes, output bytes, saved bytes)
        "model/clone": (X, X, 0), "model/contiguous": (X, X, 0),  # of a transposed h
        "model/reshape_1": (X, X, 0),  # of a transposed h
        "model/repeat_interleave": (X, 2 * X, 0),
        "model/gather": (2 * 4 * 16 * BPE + 2 * 4 * 16 * 8, 2 * 4 * 16 * BPE, 2 * 4 * 16 * 8),
        "model/index": (2 * 5 * 16 * BPE + 5 * 8, 2 * 5 * 16 * BPE, 5 * 8),
        "model/to": (X, 2 * 8 * 16 * 8, 0),  # float -> int64: a real cast
        "model/_to_copy": (X, X, 0),
    }
    for name, (i, o, sv) in expect.items():
        r = int(np.flatnonzero(nd["name"] == name)[0])
        assert (nd["kind"][r], nd["core"][r]) == ("copy", "vector"), name
        assert (nd["input_bytes"][r], nd["output_bytes"][r], nd["saved_bytes"][r]) == (i, o, sv), name
        gr = int(np.flatnonzero(nd["name"] == name + "/grad")[0]) if name != "model/to" else None
        if gr is not None:  # (an integer output has no gradient worth the name, but one is derived)
            assert (nd["input_bytes"][gr], nd["output_bytes"][gr]) == (o + sv, i - sv), name
    # views cost nothing: a reshape of contiguous h, a cast to its own dtype (h.contiguous() is no op)
    for name in ("model/reshape", "model/to_1", "model/transpose"):
        r = np.flatnonzero(nd["name"] == name)
        assert len(r) == 1 and nd["core"][r[0]] == "none", name
    single, every = estimate_latencies(g, [TPUV4]).for_arch(0)
    copy = nd["kind"] == "copy"
    assert (single[copy] >= moved_bytes(nd)[copy] / TPUV4.hbm_bw).all() and (single[copy] > 0).all()


def test_moe_token_permute_is_charged():
    """Mixtral's grouped-GEMM experts gather each (token, expert) row, 2 of 64 per token: the permute
    reads and writes 64·2 rows of 64 and the 64·2 int64 positions; GQA's repeated K/V (2 KV heads → 4)
    is a real copy of b·S·H·D."""
    cfg = dict(_LM, architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=64,
               intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
               num_local_experts=8, num_experts_per_tok=2)
    g = api.from_hf_config(cfg, seq=32, training=False, fuse=False)
    nd = g.nodes
    rows = 32 * 2 * 64 * BPE
    copies = [r for r in _rows(g, "model.layers.1.mlp.experts/index") if nd["kind"][r] == "copy"]
    moved = [(int(nd["input_bytes"][r]), int(nd["output_bytes"][r])) for r in copies]
    # the permute into expert order, and back: in a bf16 capture the way back gathers fp32 rows (the
    # expert outputs times the fp32 routing weights promote to fp32; 4 bytes each)
    assert moved.count((rows + 32 * 2 * 8, rows)) == moved.count((2 * rows + 32 * 2 * 8, 2 * rows)) == 1
    rep = [r for r in _rows(g, "model.layers.1.self_attn/reshape") if nd["kind"][r] == "copy"]
    assert len(rep) == 2 and all(nd["output_bytes"][r] == 32 * 4 * 16 * BPE for r in rep)


# ---------------------------------------------------------------------------- 5. dgrad reads weights
def test_input_gradient_gemm_reads_the_weights():
    """dX = dY·Wᵀ of GPT-2's c_fc (64 → 256, b·s = 64 rows): it moves dY (64·256), W (64·256 + bias)
    and dX (64·64); the attention context's dA = dY·Vᵀ reads V (b·H·S·D) besides dY."""
    g = api.from_hf_config(GPT2, seq=32, mbs=2, training=True)
    nd = g.nodes
    f = _one(g, "transformer.h.1.mlp.c_fc/addmm")
    d = _one(g, "transformer.h.1.mlp.c_fc/addmm", "/dgrad")
    w = (64 * 256 + 256) * BPE
    assert nd["weight_bytes"][f] == nd["weight_bytes"][d] == w
    grad_in = int(nd["input_bytes"][d])  # dY (b·s × 256)
    assert grad_in == 64 * 256 * BPE
    assert moved_bytes(nd)[d] == 64 * 256 * BPE + w + 64 * 64 * BPE
    ctx = [r for r in _rows(g, "transformer.h.1.attn/matmul_") if nd["name"][r].endswith("/dgrad")
           and "+" not in nd["name"][r]][0]
    b, m, n, k = _gemm(g, ctx)  # dA: (b·H, S, D) · (D, S)
    assert (b, m, n, k) == (8, 32, 32, 16)
    assert nd["input_bytes"][ctx] == 8 * 32 * 16 * BPE + 8 * 32 * 16 * BPE  # dY and V


# ---------------------------------------------------------------------------- 6. vocab parallel
QWEN2 = dict(_LM, architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=64,
             intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


@pytest.mark.parametrize("V", [512, 515])
def test_vocab_parallel_embedding_lm_head_and_loss(V):
    """Megatron at t = 2: each device holds V' = ceil(V/2) rows of the tied table. The lookup reads
    V'/V of the b·s rows and writes all of them (zeros outside its rows), summed by a forward AllReduce
    of b·s·h; the LM head computes V' logits per token after a copy-to-region (a backward AllReduce of
    b·s·h); the cross-entropy does V'/V of its work and three AllReduces of one fp32 per token."""
    b, s, h, t = 2, 32, 64, 2
    Vp = -(-V // t)
    g = api.from_hf_config(dict(QWEN2, vocab_size=V), seq=s, mbs=b, tmp=t, training=True)
    nd = g.nodes
    names = g.meta["layers"]
    emb = _one(g, "model.embed_tokens/embedding")
    rows = b * s * h * BPE
    assert nd["tp_role"][emb] == "vocab" and nd["weight_bytes"][emb] == Vp * h * BPE
    assert (nd["input_bytes"][emb], nd["output_bytes"][emb]) == (8 * b * s + -(-rows * Vp // V), rows)
    ar = _one(g, "model.embed_tokens/embedding", "/allreduce")
    assert (nd["input_bytes"][ar], nd["output_bytes"][ar]) == (rows, rows)
    head = _one(g, "lm_head/linear")
    assert _gemm(g, head) == (1, b * s, Vp, h) and nd["weight_bytes"][head] == Vp * h * BPE
    assert nd["output_bytes"][head] == b * s * Vp * BPE
    copy_grad = _one(g, "lm_head/linear", "/tp_copy/grad")
    assert (nd["kind"][copy_grad], nd["output_bytes"][copy_grad]) == ("allreduce", rows)
    ce = _one(g, "loss/cross_entropy")
    assert nd["input_bytes"][ce] == b * s * Vp * BPE and nd["flops"][ce] == pytest.approx(5.0 * b * s * Vp)
    head_layer = names.index("head")
    fwd_ar = (nd["layer"] == head_layer) & (nd["kind"] == "allreduce") & ~nd["is_backward"]
    assert sorted(nd["name"][fwd_ar]) == [f"loss/cross_entropy/allreduce_{w}"
                                          for w in ("max", "predicted", "sum_exp")]
    assert set(nd["output_bytes"][fwd_ar]) == {4 * b * s}
    assert layer_graph(g).tied_groups == (((0, len(names) - 1), Vp * h * BPE),)
    assert g.meta["vocab_per_device"] == Vp


# ---------------------------------------------------------------------------- 7. width vs heads
MISTRAL = dict(_LM, architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=64,
               intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


@pytest.mark.parametrize("mbs", [1, 2, 4])
def test_tmp_width_must_divide_kv_heads_at_every_microbatch(mbs):
    """4 query heads, 2 KV heads: t = 4 divides the query heads and b·H, not the KV heads."""
    with pytest.raises(ValueError, match=r"^tmp width 4 does not divide field 'num_key_value_heads' = 2 of "
                       r"model '.*'; allowed widths: \[1, 2\]$"):
        api.from_hf_config(MISTRAL, seq=32, mbs=mbs, tmp=4, training=False)
    g = api.from_hf_config(MISTRAL, seq=32, mbs=mbs, tmp=2, training=False)
    assert g.meta["heads"] == {"num_attention_heads": 4, "num_key_value_heads": 2}


# ---------------------------------------------------------------------------- 8. gated FFN
T5_GATED = dict(architectures=["T5ForConditionalGeneration"], model_type="t5", d_model=64, d_ff=128, d_kv=16,
                num_layers=4, num_decoder_layers=4, num_heads=4, vocab_size=512,
                feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def test_gated_ffn_has_one_backward_allreduce():
    """T5 v1.1 at t = 2: an encoder block AllReduces twice forward (attention and FFN outputs) and twice
    backward (the attention's and the FFN's input gradients), not three times; a decoder block 3 and 4
    (cross-attention adds its output, its query input and the encoder output it reads). The gate's
    tanh-GELU lies between the column and the row GEMM: half its work per device."""
    g1 = api.from_hf_config(T5_GATED, seq=32, tmp=1, training=True)
    g2 = api.from_hf_config(T5_GATED, seq=32, tmp=2, training=True)
    nd = g2.nodes
    names = g2.meta["layers"]
    for li, name in enumerate(names):
        ar = (nd["layer"] == li) & (nd["kind"] == "allreduce")
        fwd, bwd = int((ar & ~nd["is_backward"]).sum()), int((ar & nd["is_backward"]).sum())
        if name.startswith("encoder.block."):
            assert (fwd, bwd) == (2, 2), name
        elif name.startswith("decoder.block."):
            assert (fwd, bwd) == (3, 4), name
    gate = "encoder.block.1.layer.1.DenseReluDense.act/"
    act1 = [r for r in _rows(g1, gate) if not g1.nodes["is_backward"][r]]
    act2 = [r for r in _rows(g2, gate) if not nd["is_backward"][r]]
    assert len(act1) == len(act2) == 8 and (nd["tp_role"][act2] == "shard").all()
    assert nd["vector_flops"][act2].sum() * 2 == g1.nodes["vector_flops"][act1].sum()
