"""``archplace plan``'s search and step model: the per-layer time is ``train_step.microbatch_time`` (the
model the Megatron validation holds), the search equals brute force over every configuration and every
layer split on small spaces (so neither bound ever drops the optimum), and the answer is deterministic."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from archplace.algorithms.search import plan_search as S
from archplace.simulators import parallel_step as ps
from archplace.simulators import train_memory as tm
from archplace.simulators.gpu_step import optimizer_update_bytes_per_param
from archplace.simulators.train_step import Links, TrainSetup, layer_cost, microbatch_time

SHAPE = tm.TransformerShape(hidden=512, heads=8, kv_heads=8, ffn_hidden=2048, layers=6, vocab=1000)
SEQ = 1024


def synthetic_costs(tp: int, mbs: int, seq: int, attention: str) -> ps.LayerTimes:
    """Closed-form layer times: heterogeneous blocks (odd blocks 30 % slower), an attention core that is
    quadratic in the sequence (eager dearer), collectives and parameters that shrink with tp."""
    L = SHAPE.layers
    names = ("embed", *[f"b{i}" for i in range(L)], "head")
    n = len(names)
    w = np.array([0.5] + [1.0 + 0.3 * (i % 2) for i in range(L)] + [0.7])
    tok = mbs * seq
    core = (2.0 if attention == "eager" else 1.0) * mbs * seq * seq * 1e-9 / tp
    attn = np.array([0.0] + [core] * L + [0.0])
    fwd = w * tok * 1e-6 / tp + attn
    bwd = 2 * w * tok * 1e-6 / tp + 2 * attn
    rep = 0.05 * w * tok * 1e-6
    coll = np.array([0.0] + [2 * tok * SHAPE.hidden * 2.0] * L + [0.0]) if tp > 1 else np.zeros(n)
    params = (np.array([1e6] + [3e6] * L + [1e6]) / tp).astype(np.int64)
    return ps.LayerTimes(names=names, fwd_s=fwd, bwd_s=bwd, attn_fwd_s=attn, attn_bwd_s=2 * attn,
                         replicated_fwd_s=rep, replicated_bwd_s=rep, col_wgrad_s=0.2 * bwd,
                         fwd_collective_bytes=coll, bwd_collective_bytes=coll, params=params, shared_params=0)


CLUSTER = S.Cluster(gpus=8, gpus_per_node=4, peak_flops_per_s=312e12, memory_bytes=2 * 1024 ** 3,
                    hbm_bytes_per_s=2e12, nvlink_bytes_per_s=300e9, network_bytes_per_s=25e9)


def brute_force(space: S.Space, cluster: S.Cluster, global_batch: int, overlap: bool = True):
    """Every configuration, every split, priced stage by stage in plain loops; the fastest that fits."""
    best = None
    opt_update = optimizer_update_bytes_per_param("adam", 2)
    for att, tp, cp, pp, mbs, zero, v, sp, rec in itertools.product(
            space.attention, space.tp, space.cp, space.pp, space.mbs, space.zero, space.vp,
            space.sequence_parallel, space.recompute):
        gpn = cluster.gpus_per_node
        if SHAPE.heads % tp or tp > gpn or cluster.gpus % (tp * cp * pp) or pp > SHAPE.layers:
            continue
        if cp > 1 and (att != "sdpa" or SEQ % (2 * cp)):
            continue
        if sp and tp == 1:
            continue
        dp = cluster.gpus // (tp * cp * pp)
        if global_batch % (dp * mbs):
            continue
        m = global_batch // (dp * mbs)
        if v > 1 and (pp < 2 or m % pp or SHAPE.layers % (pp * v)):
            continue
        lt = synthetic_costs(tp, mbs, SEQ // cp, att)
        links = Links(tp_bytes_per_s=cluster.nvlink_bytes_per_s,
                      pp_bytes_per_s=cluster.nvlink_bytes_per_s if cluster.gpus <= cluster.gpus_per_node
                      else cluster.network_bytes_per_s,
                      dp_bytes_per_s=ps.dp_bytes_per_s(tp, cp, dp, gpn, cluster.network_bytes_per_s,
                                                       cluster.nvlink_bytes_per_s),
                      hbm_bytes_per_s=cluster.hbm_bytes_per_s)
        cp_bw = cluster.nvlink_bytes_per_s if tp * cp <= gpn else cluster.network_bytes_per_s
        knobs = ps.StepKnobs(tp=tp, cp=cp, sequence_parallel=sp, recompute=rec, tp_bwd_overlap=overlap)
        kvb = 2 * mbs * (SEQ / cp) * SHAPE.kv_hidden / tp * 2
        per = ps.layer_microbatch_s(lt, knobs, links, cp_bytes_per_s=cp_bw, kv_bytes=kvb)
        fper = ps.layer_forward_s(lt, knobs, links, cp_bytes_per_s=cp_bw, kv_bytes=kvb)
        p2p = ps.p2p_stage_s(mbs * (SEQ / cp) * SHAPE.hidden * 2, knobs, links, v) if pp > 1 else 0.0
        state = tm.state_bytes_per_param(zero=zero, shards=dp * cp, grad_bytes=2)
        act = tm.layer_activation_bytes(SHAPE, seq=SEQ, mbs=mbs, tp=tp, cp=cp, sequence_parallel=sp,
                                        recompute=rec, attention=att)
        for split in ps.candidate_splits(SHAPE.layers, pp, v):
            sizes = split.layers_per_stage()
            stage, fwd, params, mem = [], [], [], []
            start = 0
            for k, nk in enumerate(sizes):
                idx = list(range(1 + start, 1 + start + nk))
                start += nk
                t = sum(per[i] for i in idx) + p2p
                f = sum(fper[i] for i in idx) + p2p / 2
                pk = sum(int(lt.params[i]) for i in idx)
                if k == 0:
                    t, f, pk = t + per[0], f + fper[0], pk + int(lt.params[0])
                if k == pp - 1:
                    t, f, pk = t + per[-1], f + fper[-1], pk + int(lt.params[-1])
                inflight = tm.in_flight_microbatches(k, pp, m, v)
                a = nk * act * inflight + (tm.MASK_BYTES * (SEQ / cp) * mbs * SHAPE.hidden / (tp if sp else 1)
                                           * inflight if k == 0 else 0.0)
                tmp = max(tm.logits_bytes(SHAPE, seq=SEQ, mbs=mbs, tp=tp, cp=cp) if k == pp - 1 else 0.0,
                          tm.layer_temporary_bytes(SHAPE, seq=SEQ, mbs=mbs, tp=tp, cp=cp,
                                                   sequence_parallel=sp, recompute=rec, attention=att))
                if zero == 3:
                    tmp += 2 * max(int(x) for x in lt.params[1:-1]) * 2
                    t = float(ps.zero3_stage_s(f, t - f, pk, ranks=dp * cp, grad_bytes=2,
                                               bytes_per_s=links.dp_bytes_per_s, overlap=overlap))
                stage.append(t)
                fwd.append(f)
                params.append(pk)
                mem.append(pk * state.total + a + tmp)
            if max(mem) > cluster.memory_bytes:
                continue
            T = max(stage)
            pipe = (m - 1) * T + sum(stage) if v == 1 else m * T + (sum(stage) - T) / v
            syncs = []
            for k in range(pp):
                red, gat = ps.dp_sync_parts_s(params[k], zero=zero, ranks=dp * cp, grad_bytes=2,
                                              bytes_per_s=links.dp_bytes_per_s)
                if overlap:
                    bwd_k = (stage[k] if zero != 3 else stage[k]) - fwd[k]
                    syncs.append(max(float(red) - bwd_k, 0) + max(float(gat) - fwd[k], 0))
                else:
                    syncs.append(float(red) + float(gat))
            opt = max(params) * opt_update / (dp * cp if zero >= 1 else 1) / cluster.hbm_bytes_per_s
            total = pipe + max(syncs) + opt
            if best is None or total < best[0] - 1e-15:
                best = (total, dict(tp=tp, pp=pp, dp=dp, cp=cp, vp=v, mbs=mbs, recompute=rec,
                                    sequence_parallel=sp, zero=zero, attention=att), sizes)
    return best


def small_space(**over) -> S.Space:
    sp = S.default_space(SHAPE, gpus=CLUSTER.gpus, gpus_per_node=CLUSTER.gpus_per_node, seq=SEQ,
                         global_batch=32, max_mbs=4)
    from dataclasses import replace
    return replace(sp, cp=(1, 2), zero=(0, 1, 3), **over)


@pytest.mark.parametrize("overlap", [True, False])
def test_search_equals_brute_force(overlap):
    space = small_space()
    got = S.search(SHAPE, synthetic_costs, CLUSTER, seq=SEQ, global_batch=32, space=space, top_k=3,
                   overlap=overlap)
    want = brute_force(space, CLUSTER, 32, overlap=overlap)
    assert got.top, "something fits"
    assert got.top[0].step_time_s == pytest.approx(want[0], rel=1e-9)
    assert got.evaluated + got.pruned["time"] + got.pruned["memory"] > 0
    # the top K are in order and distinct
    times = [c.step_time_s for c in got.top]
    assert times == sorted(times) and len(got.top) == 3


def test_search_equals_brute_force_when_memory_binds():
    tight = S.Cluster(**{**CLUSTER.__dict__, "memory_bytes": 140 * 1024 ** 2})
    space = small_space()
    got = S.search(SHAPE, synthetic_costs, tight, seq=SEQ, global_batch=32, space=space, top_k=1)
    want = brute_force(space, tight, 32)
    assert want is not None and got.top
    assert got.top[0].step_time_s == pytest.approx(want[0], rel=1e-9)
    assert got.top[0].memory["total_bytes"] <= tight.memory_bytes


def test_nothing_fits_reports_the_least_memory():
    tiny = S.Cluster(**{**CLUSTER.__dict__, "memory_bytes": 1024})
    got = S.search(SHAPE, synthetic_costs, tiny, seq=SEQ, global_batch=32, space=small_space(), top_k=2)
    assert got.top == [] and got.pruned["memory"] > 0
    assert got.least_memory is None or not got.least_memory.fits


def test_search_is_deterministic():
    a = S.search(SHAPE, synthetic_costs, CLUSTER, seq=SEQ, global_batch=32, space=small_space(), top_k=5)
    b = S.search(SHAPE, synthetic_costs, CLUSTER, seq=SEQ, global_batch=32, space=small_space(), top_k=5)
    assert [(c.knobs, c.layers_per_stage, c.step_time_s) for c in a.top] == \
        [(c.knobs, c.layers_per_stage, c.step_time_s) for c in b.top]
    assert (a.evaluated, a.pruned, a.splits_priced) == (b.evaluated, b.pruned, b.splits_priced)


def test_uneven_split_beats_even_when_the_ends_are_heavy():
    # stage 0 carries the embedding, the last the head: with 6 blocks over 2 stages an even 3 + 3 split
    # is not the fastest when the head is heavy
    lt = synthetic_costs(1, 1, SEQ, "sdpa")
    heavy = ps.LayerTimes(**{**lt.__dict__, "fwd_s": lt.fwd_s * np.r_[1, np.ones(6), 8],
                             "bwd_s": lt.bwd_s * np.r_[1, np.ones(6), 8]})
    space = S.Space(tp=(1,), pp=(2,), cp=(1,), mbs=(1,), vp=(1,), recompute=("none",),
                    sequence_parallel=(False,), zero=(0,), attention=("sdpa",))
    got = S.search(SHAPE, lambda *k: heavy, CLUSTER, seq=SEQ, global_batch=32, space=space, top_k=1)
    first, last = got.top[0].layers_per_stage
    assert first + last == 6 and last < first


def test_candidate_splits_megatron_forms():
    assert [s.layers_per_stage() for s in ps.candidate_splits(4, 2, 1)] == [[1, 3], [2, 2], [3, 1]]
    assert [s.layers_per_stage() for s in ps.candidate_splits(12, 4, 3)] == [[3, 3, 3, 3]]
    assert ps.candidate_splits(12, 4, 5) == []
    for s in ps.candidate_splits(10, 4, 1):
        sizes = s.layers_per_stage()
        assert sum(sizes) == 10 and min(sizes) >= 1 and len(set(sizes[1:-1])) == 1
    sums = ps.stage_sums(np.arange(10.0), ps.candidate_splits(10, 3, 1))
    for s, row in zip(ps.candidate_splits(10, 3, 1), sums):
        edges = np.cumsum([0, *s.layers_per_stage()])
        assert list(row) == [float(np.arange(10.0)[a:b].sum()) for a, b in zip(edges[:-1], edges[1:])]


@pytest.fixture(scope="module")
def bert_tp2():
    from archplace.hardware.gpus import gpu_spec
    from archplace.simulators.gpu_ops import gpu_op_times
    from archplace.workloads.models import build_graph

    g = build_graph("bert-base", seq=128, mbs=2, tmp=2)
    return g, gpu_op_times(g, gpu_spec("a100-80gb"), dtype="bf16", op_model="calibrated").time_s


@pytest.mark.parametrize("sp,rec", [(False, "none"), (True, "selective"), (False, "full"), (True, "full")])
def test_layer_time_is_train_step_microbatch_time(bert_tp2, sp, rec):
    """One price per layer: the vectorised per-layer time equals the validated model's, layer by layer."""
    g, ts = bert_tp2
    lt = ps.layer_times(g, ts)
    links = Links(tp_bytes_per_s=300e9, pp_bytes_per_s=25e9, dp_bytes_per_s=25e9, hbm_bytes_per_s=2e12)
    per = ps.layer_microbatch_s(lt, ps.StepKnobs(tp=2, sequence_parallel=sp, recompute=rec), links,
                                cp_bytes_per_s=300e9, kv_bytes=0.0)
    setup = TrainSetup(tp=2, pp=1, dp=1, micro_batch=2, global_batch=2, recompute=rec, sequence_parallel=sp,
                       tp_bwd_overlap=True)
    for i, name in enumerate(lt.names):
        if name in ("embed", "head"):
            continue
        want = microbatch_time(layer_cost(g, ts, name), setup, links).total_s
        assert per[i] == pytest.approx(want, rel=1e-12), name
        assert int(lt.params[i]) == layer_cost(g, ts, name).params


def test_zero3_overlap_and_dp_sync_forms():
    # a ring all-gather of P bf16 weights over d ranks: (d - 1) / d * 2P / bw, twice, plus a reduce-scatter
    P, d, bw = 1e9, 8, 50e9
    ag = (d - 1) / d * 2 * P / bw
    rs = (d - 1) / d * 2 * P / bw
    assert ps.zero3_stage_s(1.0, 2.0, P, ranks=d, grad_bytes=2, bytes_per_s=bw) == pytest.approx(
        max(1.0, ag) + max(2.0, ag + rs))
    assert ps.zero3_stage_s(1.0, 2.0, P, ranks=d, grad_bytes=2, bytes_per_s=bw, overlap=False) == \
        pytest.approx(3.0 + 2 * ag + rs)
    assert ps.dp_sync_s(P, zero=0, ranks=d, grad_bytes=2, bytes_per_s=bw) == \
        pytest.approx(2 * (d - 1) / d * 2 * P / bw)
    red, gat = ps.dp_sync_parts_s(P, zero=1, ranks=d, grad_bytes=4, bytes_per_s=bw)
    assert float(red) == pytest.approx((d - 1) / d * 4 * P / bw) and float(gat) == pytest.approx(ag)
    assert ps.dp_sync_s(P, zero=3, ranks=d, grad_bytes=2, bytes_per_s=bw) == 0.0
    assert math.isclose(ps.dp_sync_s(P, zero=0, ranks=1, grad_bytes=2, bytes_per_s=bw), 0.0)


@pytest.mark.parametrize("model,seq,tp", [("bert-base", 128, 2), ("opt-350m", 256, 4)])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_captured_blocks_time_every_copy_exactly(model, seq, tp, attention):
    """plan times the captured blocks only (workloads.stack_truncate); mapped back, every layer's times,
    collective bytes and parameters equal those of the full-depth graph."""
    from archplace.hardware.gpus import gpu_spec
    from archplace.simulators.gpu_ops import gpu_op_times
    from archplace.workloads.backward import with_attention
    from archplace.workloads.models import build_graph
    from archplace.workloads.stack_truncate import truncate_to_captured

    spec = gpu_spec("a100-80gb")
    full_fwd = build_graph(model, seq=seq, mbs=2, tmp=tp, training=False)
    cut, rep = truncate_to_captured(full_fwd)
    assert len(cut.meta["layers"]) < len(full_fwd.meta["layers"])

    def times(fwd):
        g = with_attention(fwd, attention, sram_bytes=163 * 1024)
        return ps.layer_times(g, gpu_op_times(g, spec, dtype="bf16", op_model="calibrated").time_s)

    full, small = times(full_fwd), times(cut)
    idx = [small.names.index(rep[n]) for n in full.names]
    for f in ("fwd_s", "bwd_s", "attn_fwd_s", "attn_bwd_s", "replicated_fwd_s", "replicated_bwd_s",
              "col_wgrad_s", "fwd_collective_bytes", "bwd_collective_bytes", "params"):
        np.testing.assert_array_equal(getattr(full, f), getattr(small, f)[idx], err_msg=f)
    assert full.shared_params == small.shared_params


@pytest.mark.parametrize("model", ["gpt3-175b", "llama2-7b", "bert-large", "opt-350m", "gpt2-xl"])
def test_preset_sizes_without_transformers_equal_the_config_classes(model, monkeypatch):
    """transformer_fields reads a preset's dict with its family's defaults (no transformers import); the
    defaults are the transformers config classes' own."""
    from archplace.workloads import transformer_shape as T

    fast = T.transformer_fields(model)
    family = T.preset(model).family
    monkeypatch.delitem(T.FAMILY_DEFAULTS, family)      # falls back to the transformers config class
    assert T.transformer_fields(model) == fast


def test_gpu_cluster_trial_plans_as_archplace_plan():
    """search --target gpu-cluster with ``planner: plan`` prices a shape as ``archplace plan`` does for the
    same GPUs, node, network and batch."""
    from archplace.api.planning import PlanRequest, plan
    from archplace.hardware.gpu_cluster_space import ClusterShape
    from archplace.platform.gpu_cluster_trial import evaluate_cluster

    row = evaluate_cluster(ClusterShape("a100-80gb", 8, 2, "nvlink", "efa-400g"), ["bert-large"],
                           planner="plan", dtype="bf16")
    res = plan(PlanRequest(model="bert-large", gpu="a100-80gb", gpus=16, gpus_per_node=8, network="efa-400g",
                           global_batch=256, seq=512, top_k=1))
    assert row["bert-large.memory_fit"] and res.fits
    assert row["bert-large.iteration_time_s"] == pytest.approx(res.best["step_time_s"], rel=1e-12)
    assert row["bert-large.plan"] == {k: res.best[k] for k in row["bert-large.plan"]}
    assert row["bert-large.throughput_samples_per_s"] == pytest.approx(256 / res.best["step_time_s"])


def test_ray_tasks_give_the_same_answer(ray_session):
    """plan --address: one Ray task per (tp, pp) slice, merged: the same top K as one process."""
    from archplace.api.planning import PlanRequest, plan

    kw = dict(model="bert-base", gpu="a100-80gb", gpus=8, global_batch=64, seq=512, top_k=4)
    one = plan(PlanRequest(**kw))
    many = plan(PlanRequest(**kw, ray_tasks=True))
    assert many.ray_tasks > 1 and one.ray_tasks == 0
    assert [(c["step_time_s"], {k: c[k] for k in S.KNOBS}, c["layers_per_stage"]) for c in many.top] == \
        [(c["step_time_s"], {k: c[k] for k in S.KNOBS}, c["layers_per_stage"]) for c in one.top]


def test_fixed_plan_is_the_validated_step_model():
    """plan with every knob fixed prices a whole iteration exactly as train_step.step_time (the model
    bench/gpu/gpu_validation.py holds against published runs): GPT-3 175B as Korthikanti et al. 2022 ran it
    (t8 p8 v3, selective recomputation with sequence parallelism) on 64 A100s."""
    from archplace.api.planning import PlanRequest, plan
    from archplace.hardware.gpus import gpu_spec
    from archplace.simulators.gpu_ops import gpu_op_times
    from archplace.simulators.gpu_step import optimizer_update_bytes_per_param
    from archplace.simulators.train_step import step_time
    from archplace.workloads.models import build_graph

    fixed = dict(tp=8, pp=8, dp=1, cp=1, vp=3, mbs=1, recompute="selective", sequence_parallel=True, zero=0,
                 attention="eager")
    res = plan(PlanRequest(model="gpt3-175b", gpu="a100-80gb", gpus=64, global_batch=64, seq=2048,
                           fixed=fixed, top_k=1))
    assert res.fits and res.best["layers_per_stage"] == [12] * 8
    spec = gpu_spec("a100-80gb")
    g = build_graph("gpt3-175b", seq=2048, mbs=1, tmp=8)
    ts = gpu_op_times(g, spec, dtype="bf16", op_model="calibrated").time_s
    links = Links(tp_bytes_per_s=spec.nvlink_bytes_per_s, pp_bytes_per_s=spec.ib_bytes_per_s,
                  dp_bytes_per_s=spec.nvlink_bytes_per_s, hbm_bytes_per_s=spec.hbm_bytes_per_s)
    setup = TrainSetup(tp=8, pp=8, dp=1, micro_batch=1, global_batch=64, virtual_stages=3,
                       recompute="selective", sequence_parallel=True, tp_bwd_overlap=True)
    want = step_time(layer_cost(g, ts, "transformer.h.1"), 96, setup, links,
                     activation_bytes=2048 * 12288 * 2, embed=layer_cost(g, ts, "embed"),
                     head=layer_cost(g, ts, "head"), grad_bytes_per_param=2,
                     optimizer_bytes_per_param=optimizer_update_bytes_per_param("adam", 2))
    assert res.best["step_time_s"] == pytest.approx(want.iteration_s, rel=1e-12)
    assert res.best["time"]["bubble_s"] == pytest.approx(want.bubble_s, rel=1e-9, abs=1e-12)
