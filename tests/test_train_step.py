"""The Megatron-style step-time estimator (simulators/train_step.py) against closed forms: ring
all-reduce, pipeline bubble, 1F1B against the event simulation, a hand-built toy layer, and the
collectives of a captured GPT-2 layer under tensor parallelism."""

from __future__ import annotations

import json

import numpy as np
import pytest

from archplace.simulators.pipeline_1f1b import simulate_1f1b
from archplace.simulators.train_step import (
    LayerCost,
    Links,
    TrainSetup,
    bubble_fraction,
    dp_ring_bytes_per_s,
    layer_cost,
    microbatch_time,
    pipeline_time_s,
    ring_allgather_s,
    ring_allreduce_s,
    step_time,
)
from archplace.workloads.graph import OpGraph


def test_ring_allreduce_closed_form():
    assert ring_allreduce_s(8e9, 8, 300e9) == pytest.approx(2 * 7 / 8 * 8e9 / 300e9)
    assert ring_allreduce_s(1e6, 2, 1e9) == pytest.approx(1e-3)
    assert ring_allreduce_s(1e6, 1, 1e9) == 0.0
    assert ring_allgather_s(8e9, 8, 300e9) == pytest.approx(7 / 8 * 8e9 / 300e9)
    with pytest.raises(ValueError, match="ranks"):
        ring_allreduce_s(1.0, 0, 1e9)
    with pytest.raises(ValueError, match="bytes_per_s"):
        ring_allreduce_s(1.0, 4, 0.0)


def test_bubble_and_equal_stages():
    assert bubble_fraction(8, 64) == pytest.approx(7 / 64)
    assert bubble_fraction(64, 512, 2) == pytest.approx(63 / 1024)
    for p, m, v in [(1, 7, 1), (4, 16, 1), (8, 64, 2), (35, 280, 3)]:
        t = 0.25
        got = pipeline_time_s([t] * p, m, v)
        assert got == pytest.approx(m * t * (1 + bubble_fraction(p, m, v)))
        if v == 1:
            assert got == pytest.approx((m + p - 1) * t)
    with pytest.raises(ValueError, match="stage_s"):
        pipeline_time_s([], 4)


def test_pipeline_matches_1f1b_event_simulation():
    rng = np.random.default_rng(7)
    for p, m in [(2, 3), (4, 9), (8, 32)]:
        fw = rng.uniform(1.0, 2.0, p)
        bw = 2.0 * fw
        fw[-1], bw[-1] = fw.max() + 0.3, bw.max() + 0.6   # the last stage (LM head) is the heaviest
        zero = np.zeros(p)
        ref = simulate_1f1b(fw, bw, zero[:-1], zero[:-1], zero, m).pipeline_s
        assert pipeline_time_s(fw + bw, m) == pytest.approx(ref, rel=1e-12)
        fw2 = rng.uniform(1.0, 2.0, p)   # any stage the heaviest: the closed form bounds the simulation
        ref2 = simulate_1f1b(fw2, 2 * fw2, zero[:-1], zero[:-1], zero, m).pipeline_s
        assert pipeline_time_s(3 * fw2, m) >= ref2 - 1e-9


def _toy_graph() -> tuple[OpGraph, np.ndarray]:
    """One layer: ln -> qkv (col) -> QKᵀ, softmax, ·V (shard) -> proj (row) -> allreduce -> add, and its
    backward; times are set per row (the allreduce rows' times must be ignored)."""
    rows = [  # name, kind, core, is_backward, tp_role, time, input_bytes, weight_bytes
        ("ln", "layernorm", "vector", False, "", 1.0, 0, 4),
        ("qkv", "linear", "tensor", False, "col", 10.0, 0, 600),
        ("qk", "matmul", "tensor", False, "shard", 3.0, 0, 0),
        ("softmax", "softmax", "vector", False, "shard", 2.0, 0, 0),
        ("av", "matmul", "tensor", False, "shard", 3.0, 0, 0),
        ("proj", "linear", "tensor", False, "row", 5.0, 0, 200),
        ("proj/allreduce", "allreduce", "comm", False, "", 99.0, 1000, 0),
        ("add", "add", "vector", False, "", 1.0, 0, 0),
        ("add/grad", "add", "vector", True, "", 1.0, 0, 0),
        ("proj/dgrad", "linear", "tensor", True, "row", 5.0, 0, 0),
        ("proj/wgrad", "linear", "tensor", True, "row", 5.0, 0, 0),
        ("attn/grad", "matmul", "tensor", True, "shard", 8.0, 0, 0),
        ("qkv/dgrad", "linear", "tensor", True, "col", 10.0, 0, 0),
        ("qkv/wgrad", "linear", "tensor", True, "col", 10.0, 0, 0),
        ("qkv/tp_copy/grad", "allreduce", "comm", True, "", 99.0, 3000, 0),
        ("ln/grad", "layernorm", "vector", True, "", 2.0, 0, 0),
    ]
    n = len(rows)
    cols = ("name", "kind", "core", "is_backward", "tp_role", None, "input_bytes", "weight_bytes")
    nodes = {c: [r[i] for r in rows] for i, c in enumerate(cols) if c}
    nodes.update(id=np.arange(n), layer=np.zeros(n))
    edges = {"src": np.arange(n - 1), "dst": np.arange(1, n), "bytes": np.ones(n - 1), "arg": np.zeros(n - 1)}
    g = OpGraph.from_columns(nodes, edges, {"layers": ["block"], "bytes_per_element": 2})
    return g, np.array([r[5] for r in rows])


def test_toy_layer_cost():
    g, ts = _toy_graph()
    c = layer_cost(g, ts, "block")
    assert c == layer_cost(g, ts, 0)
    assert c.fwd_compute_s == 25.0 and c.bwd_compute_s == 41.0
    assert c.attn_core_fwd_s == 8.0
    assert (c.replicated_fwd_s, c.replicated_bwd_s, c.col_wgrad_s) == (2.0, 3.0, 10.0)
    assert (c.fwd_collective_bytes, c.bwd_collective_bytes) == ((1000,), (3000,))
    assert c.params == 402
    with pytest.raises(ValueError, match="not in the graph"):
        layer_cost(g, ts, "nope")
    with pytest.raises(ValueError, match="time_s"):
        layer_cost(g, ts[:-1], 0)


LINKS = Links(tp_bytes_per_s=1000.0, pp_bytes_per_s=100.0, dp_bytes_per_s=50.0, hbm_bytes_per_s=1e4)


def test_microbatch_time_recompute_sp_overlap():
    g, ts = _toy_graph()
    c = layer_cost(g, ts, 0)
    ar_f, ar_b = 2 * 3 / 4 * 1000 / 1000, 2 * 3 / 4 * 3000 / 1000   # t = 4
    base = dict(tp=4, pp=1, dp=1, micro_batch=1, global_batch=1)
    none = microbatch_time(c, TrainSetup(**base, recompute="none"), LINKS)
    assert (none.compute_s, none.recompute_s, none.tp_comm_s) == pytest.approx((66.0, 0.0, ar_f + ar_b))
    full = microbatch_time(c, TrainSetup(**base, recompute="full"), LINKS)
    assert (full.recompute_s, full.tp_comm_s) == pytest.approx((25.0, 2 * ar_f + ar_b))
    sel = microbatch_time(c, TrainSetup(**base, recompute="selective"), LINKS)
    assert sel.total_s == pytest.approx(66.0 + 8.0 + ar_f + ar_b)
    sp = microbatch_time(c, TrainSetup(**base, recompute="none", sequence_parallel=True), LINKS)
    assert sp.compute_s == pytest.approx(66.0 - 0.75 * (2.0 + 3.0))
    ov = microbatch_time(c, TrainSetup(**base, recompute="none", tp_bwd_overlap=True), LINKS)
    assert (ov.tp_comm_s, ov.tp_hidden_s) == pytest.approx((ar_f, ar_b))   # 4.5 s hides behind 10 s of wgrad
    with pytest.raises(ValueError, match="recompute"):
        TrainSetup(**base, recompute="some")


def test_step_time_toy_pipeline():
    g, ts = _toy_graph()
    c = layer_cost(g, ts, 0)
    head = LayerCost(4.0, 6.0, 0.0, 0.0, 0.0, 0.0, (), (), 100)
    s = TrainSetup(tp=1, pp=2, dp=4, micro_batch=2, global_batch=64, recompute="full")
    assert s.microbatches == 8
    r = step_time(c, 6, s, LINKS, activation_bytes=200, head=head, grad_bytes_per_param=2,
                  optimizer_bytes_per_param=10)
    per_layer = 66.0 + 25.0            # t = 1: no collective costs anything
    p2p = 2 * (200 / 100.0)
    stage = np.array([3 * per_layer + p2p, 3 * per_layer + 10.0 + p2p])
    assert r.stage_s == pytest.approx(tuple(stage))
    assert r.pipeline_s == pytest.approx(7 * stage.max() + stage.sum())
    assert r.bubble_s == pytest.approx(r.pipeline_s - 8 * stage.max())
    assert r.params_per_gpu == 3 * 402 + 100
    dp = 2 * 3 / 4 * (3 * 402 + 100) * 2 / 50.0
    assert r.dp_allreduce_s == pytest.approx(dp)
    assert r.iteration_s == pytest.approx(r.pipeline_s + dp + (3 * 402 + 100) * 10 / 1e4)
    assert r.compute_s == pytest.approx(8 * (3 * 66.0 + 10.0)) and r.recompute_s == pytest.approx(8 * 75.0)
    hidden = step_time(c, 6, TrainSetup(tp=1, pp=2, dp=4, micro_batch=2, global_batch=64, dp_overlap=True),
                       LINKS, activation_bytes=200, head=head)
    assert hidden.dp_exposed_s == 0.0 and hidden.iteration_s == pytest.approx(hidden.pipeline_s)
    with pytest.raises(ValueError, match="num_layers"):
        step_time(c, 5, s, LINKS, activation_bytes=200)
    with pytest.raises(ValueError, match="global_batch"):
        TrainSetup(tp=1, pp=2, dp=3, micro_batch=2, global_batch=64)


def test_dp_ring_bandwidth():
    ib, nv = 25e9, 300e9
    assert dp_ring_bytes_per_s(8, 6, 8, ib, nv) == ib          # one rank per node
    assert dp_ring_bytes_per_s(1, 32, 8, ib, nv) == 8 * ib      # eight NICs per node carry the ring
    assert dp_ring_bytes_per_s(2, 4, 8, ib, nv) == nv           # the ring fits in one node
    assert dp_ring_bytes_per_s(4, 32, 8, ib, nv) == 2 * ib


def test_captured_gpt2_layer_collectives(tmp_path):
    """A GPT-2 block sliced 2 ways: two forward all-reduces (after the attention and MLP row GEMMs)
    and two backward ones (the copy-to-region gradients), each of b·s·h elements; forward GEMM FLOPs
    24·b·s·h²/t + 4·b·s²·h/t (Narayanan et al. 2021, appendix)."""
    from archplace.workloads.hf_config import hf_ref
    from archplace.workloads.models import build_graph

    h, a, s, b, t = 64, 4, 32, 2, 2
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=3, n_embd=h,
                                   n_head=a, n_positions=s, vocab_size=128,
                                   activation_function="gelu_pytorch_tanh")))
    g = build_graph(hf_ref(cfg), seq=s, mbs=b, tmp=t)
    li = g.meta["layers"].index("transformer.h.1")
    c = layer_cost(g, np.ones(g.num_nodes), li)
    assert c.fwd_collective_bytes == (b * s * h * 2,) * 2
    assert c.bwd_collective_bytes == (b * s * h * 2,) * 2
    nd = g.nodes
    gemm = (nd["layer"] == li) & ~nd["is_backward"] & (nd["gemm_m"] > 0)
    gemm_flops = 2.0 * (nd["gemm_b"] * nd["gemm_m"] * nd["gemm_n"] * nd["gemm_k"])[gemm].sum()
    assert gemm_flops == pytest.approx(24 * b * s * h * h / t + 4 * b * s * s * h / t)
    assert c.params == (12 * h * h + 9 * h) // t + 4 * h   # GEMM weights and biases sliced, layer norms whole
