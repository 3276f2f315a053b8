"""``simulators.train_memory``: the activation and model-state counts ``archplace plan`` checks against a
GPU, each against a hand count from Korthikanti et al. 2022 (§4: ``s b h (34 + 5 a s / h)`` per layer and
its tensor-parallel, sequence-parallel, selective and full-recomputation forms) and Megatron-LM's
distributed-optimizer table (bytes per parameter)."""

from __future__ import annotations

import pytest

from archplace.simulators import train_memory as tm

# a GPT layer: h 1024, 16 heads, MLP 4h, dropout (GPT-2/3)
GPT = tm.TransformerShape(hidden=1024, heads=16, kv_heads=16, ffn_hidden=4096, layers=24, vocab=50304)
S, B = 2048, 2


def sbh(shape=GPT, s=S, b=B) -> float:
    return s * b * shape.hidden


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_tensor_parallel_layer_is_korthikanti_eq_2(t):
    # s b h (10 + 24 / t + 5 a s / (h t)): the replicated 10 s b h stays, the rest is split
    want = sbh() * (10 + 24 / t + 5 * GPT.heads * S / (GPT.hidden * t))
    got = tm.layer_activation_bytes(GPT, seq=S, mbs=B, tp=t)
    assert got == pytest.approx(want, rel=1e-12)


def test_no_parallelism_is_34_sbh_plus_5_as2b():
    want = S * B * GPT.hidden * 34 + 5 * GPT.heads * S * S * B
    assert tm.layer_activation_bytes(GPT, seq=S, mbs=B) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_sequence_parallel_divides_everything_by_t(t):
    want = sbh() / t * (34 + 5 * GPT.heads * S / GPT.hidden)          # Korthikanti eq. 4
    got = tm.layer_activation_bytes(GPT, seq=S, mbs=B, tp=t, sequence_parallel=True)
    assert got == pytest.approx(want, rel=1e-12)


def test_selective_recompute_drops_the_attention_core():
    t = 8
    assert tm.layer_activation_bytes(GPT, seq=S, mbs=B, tp=t, sequence_parallel=True,
                                     recompute="selective") == pytest.approx(34 * sbh() / t, rel=1e-12)
    assert tm.layer_activation_bytes(GPT, seq=S, mbs=B, tp=t, recompute="selective") == pytest.approx(
        sbh() * (10 + 24 / t), rel=1e-12)


def test_full_recompute_keeps_the_layer_input_and_rebuilds_one_layer():
    t = 4
    assert tm.layer_activation_bytes(GPT, seq=S, mbs=B, tp=t, recompute="full") == 2 * sbh()
    assert tm.layer_activation_bytes(GPT, seq=S, mbs=B, tp=t, sequence_parallel=True,
                                     recompute="full") == 2 * sbh() / t
    assert tm.layer_temporary_bytes(GPT, seq=S, mbs=B, tp=t, recompute="full") == pytest.approx(
        tm.layer_activation_bytes(GPT, seq=S, mbs=B, tp=t))
    assert tm.layer_temporary_bytes(GPT, seq=S, mbs=B, tp=t) == 0.0


def test_fused_attention_keeps_the_log_sum_exp_not_the_scores():
    got = tm.layer_activation_bytes(GPT, seq=S, mbs=B, attention="sdpa")
    assert got == pytest.approx(34 * sbh() + 4 * GPT.heads * S * B, rel=1e-12)


def test_context_parallel_splits_tokens_and_keeps_all_keys():
    cp = 4
    got = tm.layer_activation_bytes(GPT, seq=S, mbs=B, cp=cp)
    # s / cp tokens per rank; the scores are (s / cp) x s per head
    want = (S / cp) * B * GPT.hidden * 34 + 5 * GPT.heads * (S / cp) * S * B
    assert got == pytest.approx(want, rel=1e-12)


def test_llama_layer_gqa_swiglu_no_dropout_hand_count():
    # Llama-2 70B-like: 64 heads, 8 KV heads, SwiGLU of 28672, no dropout
    sh = tm.TransformerShape(hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, layers=80, vocab=32000,
                             gated_mlp=True, dropout=False)
    s, b, h, hk, f, a, t = 4096, 1, 8192, 1024, 28672, 64, 8
    replicated = 2 * s * b * (2 * h + h + h)                    # 2 norms, QKV input, MLP input (bf16)
    # Q, K, V, out-proj input; gate, up, activation, product
    sharded = 2 * s * b * (h + hk + hk + h) + 8 * s * b * f
    core = 2 * a * s * s * b                                    # softmax output, no dropout
    want = replicated + (sharded + core) / t
    assert tm.layer_activation_bytes(sh, seq=s, mbs=b, tp=t) == pytest.approx(want, rel=1e-12)
    assert sh.kv_hidden == hk


def test_logits_are_fp32_over_the_vocabulary_split():
    assert tm.logits_bytes(GPT, seq=S, mbs=B, tp=4) == 4 * S * B * GPT.vocab / 4


@pytest.mark.parametrize("d", [1, 8, 64])
def test_state_bytes_match_megatron_distributed_optimizer_table(d):
    # Megatron-LM docs (distributed optimizer): bf16 params with fp32 grads 18 B non-distributed, 6 + 12/d
    assert tm.state_bytes_per_param(zero=0, shards=d, grad_bytes=4).total == 18
    assert tm.state_bytes_per_param(zero=1, shards=d, grad_bytes=4).total == pytest.approx(6 + 12 / d)
    # ZeRO-2 also shards the gradients, ZeRO-3 the weights (Rajbhandari et al. 2020, §5)
    assert tm.state_bytes_per_param(zero=2, shards=d, grad_bytes=2).total == pytest.approx(2 + 14 / d)
    assert tm.state_bytes_per_param(zero=3, shards=d, grad_bytes=2).total == pytest.approx(16 / d)
    # SGD without momentum keeps no state, and no master copy
    assert tm.state_bytes_per_param(zero=0, shards=d, grad_bytes=2, optimizer="sgd").total == 4


def test_in_flight_microbatches_1f1b_and_interleaved():
    assert [tm.in_flight_microbatches(k, 4, 16) for k in range(4)] == [4, 3, 2, 1]
    assert tm.in_flight_microbatches(0, 4, 2) == 2                     # fewer micro-batches than stages
    # interleaved: (1 + (p - 1) / (p v)) x p (Korthikanti §4.2.3)
    assert tm.in_flight_microbatches(0, 8, 64, virtual_stages=3) == pytest.approx(8 * (1 + 7 / 24))


@pytest.mark.parametrize("field,value", [("recompute", "some"), ("attention", "flash")])
def test_unknown_mode_is_one_line(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be one of"):
        tm.layer_activation_bytes(GPT, seq=S, mbs=B, **{field: value})
    with pytest.raises(ValueError, match="^zero must be one of"):
        tm.state_bytes_per_param(zero=4, shards=2, grad_bytes=2)
