"""Fused attention (workloads/attention_fusion.py) and the one-GPU training step (estimate --gpu,
api/gpu_estimate.py, simulators/gpu_step.py), issue 30 deliverable 4."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from archplace import api
from archplace.cli import main
from archplace.workloads.attention_fusion import (
    STAT_BYTES,
    find_attention,
    flash_backward_traffic,
    flash_forward_traffic,
    fuse_attention,
)
from archplace.workloads.backward import derive_backward, with_attention
from archplace.workloads.models import build_graph

SEQ, MBS, HEADS, D, LAYERS = 32, 2, 12, 64, 12  # bert-base, small sizes


@pytest.fixture(scope="module")
def bert():
    """(eager forward graph, fused forward graph) of bert-base at seq 32, micro-batch 2."""
    fwd = build_graph("bert-base", seq=SEQ, mbs=MBS, training=False)
    return fwd, fuse_attention(fwd, sram_bytes=16 * 1024)


# ---------------------------------------------------------------------------------- IO-aware traffic
def test_forward_traffic_is_algorithm_1_counted_by_hand():
    # N = 8, d = d_v = 4, M = 32 elements (64 bytes at 2 bytes each): B_c = ceil(32 / 16) = 2,
    # B_r = min(2, 4) = 2, T_c = ceil(8 / 2) = 4 passes over Q and O
    t = flash_forward_traffic(3, 8, 8, 4, 4, sram_bytes=64, bytes_per_element=2)
    assert (t.block_c, t.block_r, t.t_c) == (2, 2, 4)
    kv = 8 * 4 * 2 + 8 * 4 * 2                 # line 6: K_j, V_j read once each
    per_pass_read = (8 * 4 + 8 * 4) * 2 + 2 * 8 * STAT_BYTES  # line 8: Q_i, O_i (bf16), l_i, m_i (fp32)
    per_write = 8 * 4 * 2 + 2 * 8 * STAT_BYTES  # lines 12-13 (and line 2's initialisation): O, l, m
    assert t.read_bytes == 3 * (kv + 4 * per_pass_read) == 3 * 896
    assert t.write_bytes == 3 * (per_write + 4 * per_write) == 3 * 640


def test_backward_traffic_is_algorithm_4_counted_by_hand():
    t = flash_backward_traffic(1, 8, 8, 4, 4, sram_bytes=64, bytes_per_element=2)
    assert t.t_c == 4
    kv = 2 * 8 * 4 * 2                                          # line 7: K_j, V_j
    per_pass = 4 * 8 * 4 * 2 + 2 * 8 * STAT_BYTES               # line 10: Q, O, dO, dQ; l, m
    assert t.read_bytes == kv + 4 * per_pass
    init, dq, dkdv = 3 * 8 * 4 * 2, 8 * 4 * 2, 2 * 8 * 4 * 2    # line 5; line 20 per pass; line 23
    assert t.write_bytes == init + 4 * dq + dkdv


def test_traffic_follows_theorem_2():
    """Θ(N²d²/M): once the passes dominate, doubling N quadruples the traffic, doubling M halves it."""
    def total(n, m):
        t = flash_forward_traffic(1, n, n, 64, 64, sram_bytes=m, bytes_per_element=2)
        return t.read_bytes + t.write_bytes
    assert total(8192, 64 * 1024) / total(4096, 64 * 1024) == pytest.approx(4, rel=0.03)
    assert total(8192, 32 * 1024) / total(8192, 64 * 1024) == pytest.approx(2, rel=0.03)
    with pytest.raises(ValueError, match="sram_bytes .* Theorem 2"):
        flash_forward_traffic(1, 8, 8, 64, 64, sram_bytes=100, bytes_per_element=2)


# ---------------------------------------------------------------------------------- the fusion
def test_fusion_replaces_each_chain_and_keeps_every_other_op(bert):
    fwd, fused = bert
    sites, skipped = find_attention(fwd)
    assert len(sites) == LAYERS and skipped == []
    chain_rows = {r for s in sites for r in (*s.chain, s.pv)}
    kept = [i for i in range(fwd.num_nodes) if i not in chain_rows and fwd.nodes["kind"][i] != "matmul"]
    row = {int(i): r for r, i in enumerate(fused.nodes["id"])}
    for i in kept:  # every op outside the chains is there, unchanged
        r = row[int(fwd.nodes["id"][i])]
        for c in ("name", "kind", "flops", "input_bytes", "output_bytes", "weight_bytes", "saved_bytes",
                  "layer"):
            assert fused.nodes[c][r] == fwd.nodes[c][i], (c, fwd.nodes["name"][i])
    assert fused.num_nodes == fwd.num_nodes - len(chain_rows)
    att = fused.nodes["kind"] == "attention"
    assert att.sum() == LAYERS and (fused.nodes["core"][att] == "tensor").all()
    assert sorted(fused.nodes["layer"][att]) == sorted(fwd.nodes["layer"][[s.qk for s in sites]])
    # matmuls left: none (the only activation x activation GEMMs of BERT are the attention ones)
    assert not (fused.nodes["kind"] == "matmul").any()


def test_fused_flops_are_the_eager_gemms_and_softmax(bert):
    fwd, fused = bert
    nd = fused.nodes
    i = int(np.flatnonzero(nd["kind"] == "attention")[0])
    b = MBS * HEADS
    assert (nd["gemm_b"][i], nd["gemm_m"][i], nd["gemm_n"][i], nd["gemm_k"][i]) == (b, SEQ, SEQ, D)
    gemm = nd["flops"][i] - nd["vector_flops"][i]
    assert gemm == 4 * b * SEQ**2 * D  # closed form 4·b·h·N²·d
    # the eager chain's flops, every op of it, are the fused op's flops
    rec = fused.meta["fused_attention"]["ops"][str(int(nd["id"][i]))]
    assert nd["flops"][i] == pytest.approx(rec["eager_flops"], rel=1e-12)
    assert fused.totals()["forward_flops"] == pytest.approx(fwd.totals()["forward_flops"], rel=1e-12)


def test_fusion_removes_the_score_matrix_traffic(bert):
    fwd, fused = bert
    bpe = 2
    score = MBS * HEADS * SEQ * SEQ * bpe
    assert (fwd.nodes["output_bytes"] == score).sum() >= 3 * LAYERS  # scores, softmax, dropout: eager
    blocks = fused.nodes["layer"] >= 1  # the embedding layer's position table is 49,152 bytes too
    assert not (fused.nodes["output_bytes"][blocks] == score).any()
    nd = fused.nodes
    i = int(np.flatnonzero(nd["kind"] == "attention")[0])
    t = flash_forward_traffic(MBS * HEADS, SEQ, SEQ, D, D, sram_bytes=16 * 1024, bytes_per_element=bpe)
    assert (nd["input_bytes"][i], nd["output_bytes"][i]) == (t.read_bytes, t.write_bytes)
    rec = fused.meta["fused_attention"]["ops"][str(int(nd["id"][i]))]
    assert t.read_bytes + t.write_bytes < rec["eager_bytes"]
    # it keeps Q, K, V, O and the statistics for the backward pass, not the N x N probabilities
    qkvo = 4 * MBS * HEADS * SEQ * D * bpe
    assert nd["saved_bytes"][i] == qkvo + 2 * MBS * HEADS * SEQ * STAT_BYTES
    assert nd["saved_bytes"][i] < rec["eager_saved_bytes"]


def test_fused_op_reads_q_k_v_and_feeds_the_output_projection(bert):
    fwd, fused = bert
    src, dst = fused.edge_pos
    i = int(np.flatnonzero(fused.nodes["kind"] == "attention")[0])
    args = sorted(fused.edges["arg"][dst == i].tolist())
    assert args == [0, 1, 2]
    (site,) = [s for s in find_attention(fwd)[0] if int(fwd.nodes["id"][s.qk]) == int(fused.nodes["id"][i])]
    fsrc, fdst = fwd.edge_pos
    want_out = sorted(fwd.nodes["id"][fdst[fsrc == site.pv]].tolist())
    assert sorted(fused.nodes["id"][dst[src == i]].tolist()) == want_out


def test_backward_is_one_flash_attention_op(bert):
    _, fused = bert
    train = derive_backward(fused)
    nd = train.nodes
    fwd_att = np.flatnonzero((nd["kind"] == "attention") & ~nd["is_backward"])
    bwd_att = np.flatnonzero((nd["kind"] == "attention") & nd["is_backward"])
    assert len(bwd_att) == len(fwd_att) == LAYERS
    assert sorted(nd["fwd_id"][bwd_att]) == sorted(nd["id"][fwd_att])
    i, j = fwd_att[0], bwd_att[nd["fwd_id"][bwd_att] == nd["id"][fwd_att[0]]][0]
    fwd_gemm = nd["flops"][i] - nd["vector_flops"][i]
    assert nd["flops"][j] - nd["vector_flops"][j] == 2.5 * fwd_gemm  # 5 GEMMs against 2
    t = flash_backward_traffic(MBS * HEADS, SEQ, SEQ, D, D, sram_bytes=16 * 1024, bytes_per_element=2)
    assert (nd["input_bytes"][j], nd["output_bytes"][j]) == (t.read_bytes, t.write_bytes)
    src, dst = train.edge_pos
    # it gets the saved tensors from its forward op, and sends dQ, dK, dV to the three projections' grads
    assert nd["id"][i] in nd["id"][src[dst == j]]
    assert len(np.unique(dst[src == j])) == 3
    # training graph with attention eager: exactly what build_graph gives
    fwd = bert[0]
    assert with_attention(fwd, "eager").equals(build_graph("bert-base", seq=SEQ, mbs=MBS))


def test_models_without_attention_and_bad_input_are_one_line_errors(bert):
    fwd, _ = bert
    no_att = fwd.subgraph(fwd.nodes["layer"] == 0)  # the embedding layer alone
    with pytest.raises(ValueError, match="no eager attention") as e:
        fuse_attention(no_att)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="sram_bytes must be a positive integer"):
        fuse_attention(fwd, sram_bytes=0)
    with pytest.raises(ValueError, match="forward-only"):
        fuse_attention(build_graph("bert-base", seq=SEQ, mbs=MBS))
    with pytest.raises(ValueError, match=r"attention is 'flash'; allowed: \['eager', 'sdpa'\]"):
        with_attention(fwd, "flash")


@pytest.mark.parametrize("model", ["gpt2-xl", "llama2-7b"])
def test_decoder_attention_is_found(model):
    fwd = build_graph(model, seq=16, mbs=1, training=False)
    fused = fuse_attention(fwd)
    assert len(fused.meta["fused_attention"]["ops"]) == len(fwd.meta["layers"]) - 2  # embed, head
    assert fused.totals()["forward_flops"] == pytest.approx(fwd.totals()["forward_flops"], rel=1e-12)


# ---------------------------------------------------------------------------------- estimate --gpu
@pytest.mark.parametrize("op_model", ["roofline", "calibrated"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_layer_times_sum_to_the_step(op_model, attention):
    r = api.estimate_gpu(api.GpuEstimateRequest("bert-base", "h200", mbs=MBS, seq=SEQ, attention=attention,
                                                op_model=op_model))
    assert r.op_model["op_model"] == op_model and r.attention == attention
    assert [x["name"] for x in r.layers] == ["embed", *[f"encoder.layer.{i}" for i in range(12)], "head"]
    # the per-layer, per-core and per-kind rows are one micro-batch; the step adds the optimizer update
    assert sum(x["time_s"] for x in r.layers) == pytest.approx(r.microbatch_time_s, rel=1e-12)
    assert r.forward_s + r.backward_s == pytest.approx(r.microbatch_time_s, rel=1e-12)
    assert sum(r.by_core_s.values()) == pytest.approx(r.microbatch_time_s, rel=1e-12)
    assert sum(r.by_kind_s.values()) == pytest.approx(r.microbatch_time_s, rel=1e-12)
    assert ("attention" in r.by_kind_s) == (attention == "sdpa")
    assert r.microbatches == 1 and r.global_batch == MBS
    assert r.step_time_s == pytest.approx(r.microbatch_time_s + r.optimizer_s, rel=1e-12)
    assert r.microbatch_time_s > 0 and r.optimizer_s > 0


def test_roofline_step_is_the_sum_of_op_rooflines():
    """Checked against the roofline formula by hand on the training graph the request builds."""
    r = api.estimate_gpu(api.GpuEstimateRequest("bert-base", "h100-sxm", mbs=MBS, seq=SEQ,
                                                dtype="fp16", op_model="roofline"))
    g = build_graph("bert-base", seq=SEQ, mbs=MBS)
    nd = g.nodes
    moved = nd["input_bytes"] + nd["output_bytes"] + np.where(nd["kind"] == "embedding", 0,
                                                              nd["weight_bytes"])
    compute = (nd["flops"] - nd["vector_flops"]) / 989.5e12 + nd["vector_flops"] / 67e12  # datasheet
    t = np.maximum(compute, moved / 3.35e12)
    assert r.microbatch_time_s == pytest.approx(float(t.sum()), rel=1e-9)


def test_sdpa_against_eager_on_bert_base_layers_at_h200_bf16():
    """The issue's measured sizes (bf16, micro-batch 16, seq 512, H200). The measured ratios (1.8x GPT-2
    XL, 2.1x Llama-2 7B layers) are reported beside our prediction, not asserted."""
    out = {}
    for att in ("eager", "sdpa"):
        r = api.estimate_gpu(api.GpuEstimateRequest("bert-base", "h200", mbs=16, seq=512, attention=att,
                                                    op_model="calibrated"))
        out[att] = {x["name"]: x["time_s"] for x in r.layers}
    ratio = out["eager"]["encoder.layer.5"] / out["sdpa"]["encoder.layer.5"]
    print(f"bert-base layer, calibrated h200 bf16 mbs 16 seq 512: eager/sdpa = {ratio:.3f}")
    assert ratio > 1.0  # fusing never costs time here: the N x N passes are gone
    assert out["eager"]["embed"] == out["sdpa"]["embed"]  # no attention there


def test_pipeline_attention_flag_changes_the_result():
    eager = api.pipeline(api.PipelineRequest("bert-base", cluster="A"))
    sdpa = api.pipeline(api.PipelineRequest("bert-base", cluster="A", attention="sdpa"))
    assert "attention" not in eager.to_dict() and sdpa.to_dict()["attention"] == "sdpa"
    assert sdpa.length_s < eager.length_s
    assert sdpa.forward_ops < eager.forward_ops
    with pytest.raises(api.InvalidRequest, match=r"attention must be one of \['eager', 'sdpa'\]"):
        api.PipelineRequest("bert-base", cluster="A", attention="fused").validate()
    with pytest.raises(api.InvalidRequest, match="attention sdpa fuses ops it has no time for"):
        api.PipelineRequest("bert-base", cluster="A", attention="sdpa", profile=__file__).validate()


def _err(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    return err


def test_cli_estimate_gpu_errors(capsys):
    assert "not both" in _err(capsys, ["estimate", "bert-base", "--arch", "tpuv4", "--gpu", "h200"])
    assert "--arch ACCELERATOR or --gpu NAME is required" in _err(capsys, ["estimate", "bert-base"])
    assert "--dtype, --attention apply to --gpu" in _err(
        capsys, ["estimate", "bert-base", "--arch", "tpuv4", "--dtype", "bf16", "--attention", "sdpa"])
    assert "--backend and --tmp apply to --arch" in _err(
        capsys, ["estimate", "bert-base", "--gpu", "h200", "--tmp", "2"])
    err = _err(capsys, ["estimate", "bert-base", "--gpu", "b200"])
    assert err.startswith("archplace estimate: error: --gpu") and "h200" in err
    assert "--op-model profiled needs --profile" in _err(
        capsys, ["estimate", "bert-base", "--gpu", "h200", "--op-model", "profiled"])
    assert "--profile 'nope.json' does not exist" in _err(
        capsys, ["estimate", "bert-base", "--gpu", "h200", "--profile", "nope.json"])
    assert "--attention sdpa fuses ops it has no time for" in _err(
        capsys, ["estimate", "bert-base", "--gpu", "h200", "--profile", __file__, "--attention", "sdpa"])


def test_cli_estimate_gpu_json_and_text(capsys):
    assert main(["estimate", "bert-base", "--gpu", "a100-80gb", "--seq", str(SEQ), "--mbs", str(MBS),
                 "--attention", "sdpa", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["gpu"]["name"] == "a100-80gb" and r["attention"] == "sdpa" and r["dtype"] == "bf16"
    assert r["fused_attention"]["ops"] == LAYERS and r["fused_attention"]["sram_bytes"] == 163 * 1024
    # issue 44: calibrated is the default on every preset; without A100 data it says it is scaled
    assert r["op_model"]["op_model"] == "calibrated" and "scaled from h200" in r["op_model"]["note"]
    assert main(["estimate", "bert-base", "--gpu", "a100-80gb", "--seq", str(SEQ), "--mbs", str(MBS),
                 "--op-model", "roofline", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["op_model"]["op_model"] == "roofline" and "22-32%" in r["op_model"]["bias"]
    assert math.isclose(sum(x["time_s"] for x in r["layers"]), r["microbatch_time_s"], rel_tol=1e-12)
    assert main(["estimate", "bert-base", "--gpu", "h200", "--seq", str(SEQ), "--mbs", str(MBS)]) == 0
    out = capsys.readouterr().out
    assert "bert-base on one NVIDIA H200" in out and "attention eager" in out and "step" in out


def test_graph_files_and_request_round_trip(tmp_path):
    path = str(build_graph("bert-base", seq=SEQ, mbs=MBS).to_parquet(tmp_path / "b.parquet"))
    direct = {att: api.estimate_gpu(api.GpuEstimateRequest(
        "bert-base", "h200", mbs=MBS, seq=SEQ, attention=att, op_model="roofline")).step_time_s
        for att in ("eager", "sdpa")}
    for att in ("eager", "sdpa"):  # a saved training graph: its forward part is fused again
        r = api.estimate_gpu(api.GpuEstimateRequest(path, "h200", attention=att, op_model="roofline"))
        assert r.step_time_s == pytest.approx(direct[att], rel=1e-12)
    with pytest.raises(api.InvalidRequest, match="dtype fp32 needs 4 bytes per element"):
        api.estimate_gpu(api.GpuEstimateRequest(path, "h200", dtype="fp32"))
    req = api.GpuEstimateRequest("bert-base", "h100-sxm", mbs=4, seq=64, dtype="fp16", attention="sdpa",
                                 op_model="calibrated")
    assert api.GpuEstimateRequest.from_dict(json.loads(json.dumps(req.to_dict()))) == req


def test_ops_outside_every_layer_get_their_own_row(bert):
    from archplace.hardware.gpus import gpu_spec
    from archplace.simulators.gpu_step import training_step
    from archplace.workloads.graph import OpGraph

    g = derive_backward(bert[1])
    nodes = dict(g.nodes, layer=np.where(g.nodes["layer"] == 0, -1, g.nodes["layer"] - 1).astype(np.int32))
    meta = dict(g.meta, layers=g.meta["layers"][1:])  # the embedding's ops now belong to no layer
    g2 = OpGraph(nodes, dict(g.edges), meta)
    step = training_step(g2, gpu_spec("h200"), dtype="bf16", op_model="roofline")
    assert [r["name"] for r in step.layers] == [*meta["layers"], "(no layer)"]
    assert step.layers[-1]["ops"] == int((g.nodes["layer"] == 0).sum())
    assert sum(r["time_s"] for r in step.layers) == pytest.approx(step.step_time_s, rel=1e-12)
    with pytest.raises(ValueError, match="needs a training graph"):
        training_step(bert[0], gpu_spec("h200"), dtype="bf16")
