"""One physics under every command: the same AllReduce (bytes, ranks, link) costs the same seconds through
each command's own path (``simulators/collectives.py``), the closed form of ``place``'s stage sync, and
a named preset placed at its own HBM."""

from __future__ import annotations

import numpy as np
import pytest

from archplace import api
from archplace.algorithms.search.sharding_cost import ShardCost
from archplace.algorithms.solvers.grad_sync import allreduce_s as grad_allreduce_s
from archplace.algorithms.solvers.grad_sync import stage_sync
from archplace.algorithms.solvers.placement import TrainingSetup
from archplace.hardware.constants import PHAZE_LINK_BW_BYTES_PER_S
from archplace.hardware.presets import V100, Cluster
from archplace.simulators import collectives
from archplace.simulators.pipeline import PipelineProfile, PipelineSetup, evaluate
from archplace.simulators.train_step import ring_allgather_s, ring_allreduce_s

NBYTES, RANKS, BW = 3.5e9, 8, 150e9


def test_the_collective_closed_forms():
    ring = 2 * (RANKS - 1) / RANKS * NBYTES / BW
    assert collectives.allreduce_s(NBYTES, RANKS, BW) == pytest.approx(ring, rel=1e-15)
    assert collectives.allgather_s(NBYTES, RANKS, BW) == pytest.approx(ring / 2, rel=1e-15)
    assert collectives.reduce_scatter_s(NBYTES, RANKS, BW) == pytest.approx(ring / 2, rel=1e-15)
    assert collectives.alltoall_s(NBYTES, RANKS, BW) == pytest.approx(ring / 2, rel=1e-15)
    assert collectives.p2p_s(NBYTES, BW, 1e-5) == pytest.approx(NBYTES / BW + 1e-5)
    assert collectives.phaze_eq18_allreduce_s(NBYTES, RANKS, BW) == pytest.approx(2 * ring, rel=1e-15)
    assert collectives.allreduce_s(NBYTES, 1, BW) == 0.0
    # a per-step latency: 2 (d − 1) steps for the ring AllReduce
    assert collectives.allreduce_s(NBYTES, RANKS, BW, 1e-6) == pytest.approx(ring + 14e-6)
    # two levels: one node is the NVLink ring, one rank per node the network ring; 4 nodes of 8 by hand
    assert collectives.two_level_allreduce_s(NBYTES, 8, 1, BW, 1e9) == pytest.approx(ring)
    assert collectives.two_level_allreduce_s(NBYTES, 1, 8, 1e12, BW) == pytest.approx(ring)
    two = 2 * 7 / 8 * NBYTES / BW + 2 * 3 / 4 * (NBYTES / 8) / 12.5e9
    assert collectives.two_level_allreduce_s(NBYTES, 8, 4, BW, 12.5e9) == pytest.approx(two)
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        collectives.allreduce_s(1.0, 0, BW)
    with pytest.raises(ValueError, match="bytes_per_s must be > 0"):
        collectives.allreduce_s(1.0, 2, 0.0)
    with pytest.raises(ValueError, match="grad_reduce_dtype must be one of"):
        collectives.grad_reduce_bytes_per_param("int8")


def _pipeline_allreduce_s() -> float:
    """``pipeline``'s cost model: one stage holding NBYTES of fp16 gradients on RANKS GPUs of one flat
    NVLink-class network."""
    prof = PipelineProfile(
        model="one", op_names=np.array(["op0"], dtype=object), op_layers=np.array([""], dtype=object),
        compute_s_prefix=np.array([0.0, 1.0]), param_bytes_prefix=np.array([0.0, NBYTES]),
        saved_bytes_prefix=np.zeros(2), ckpt_bytes_prefix=np.zeros(2), trainable_prefix=np.array([0.0, 1.0]),
        cross_bytes=np.zeros(2), max_layer_saved_bytes=0.0, bytes_per_element=2,
        setup=PipelineSetup(micro_batch=1, num_micro_batches=1))
    r = evaluate(prof, Cluster("flat", RANKS, V100, BW), np.zeros((1, 0), dtype=np.int64))
    assert r.devices.tolist() == [[RANKS]]
    return float(r.allreduce_s[0, 0])


def test_the_same_allreduce_costs_the_same_through_every_command():
    ref = collectives.allreduce_s(NBYTES, RANKS, BW)
    paths = {
        # place / search: a stage's data-parallel gradient sync (bf16 gradients of bf16 weights)
        "place stage sync": float(stage_sync([NBYTES], [0.0], [0.0], RANKS, BW).sync_s[0]),
        "place DP": float(grad_allreduce_s(NBYTES, RANKS, BW,
                                           TrainingSetup(RANKS, RANKS, 1, 1e12, False, BW).sync_factor)),
        # shard: the plan's AllReduce on the GPU's link
        "shard": ShardCost(link_bytes_per_s=BW).collective_s("allreduce", NBYTES, RANKS),
        # pipeline (Auto-MAP) and the GPU-cluster co-design, which prices shapes through it
        "pipeline": _pipeline_allreduce_s(),
        # the Megatron-style GPU train step (TP and DP AllReduces)
        "train step": ring_allreduce_s(NBYTES, RANKS, BW),
    }
    for name, got in paths.items():
        assert got == pytest.approx(ref, rel=1e-12), name
    # an AllGather and a ReduceScatter are half of it everywhere
    half = collectives.allgather_s(NBYTES, RANKS, BW)
    assert ShardCost(link_bytes_per_s=BW).collective_s("allgather", NBYTES, RANKS) == pytest.approx(half)
    assert ShardCost(link_bytes_per_s=BW).collective_s("reducescatter", NBYTES, RANKS) == pytest.approx(half)
    assert ring_allgather_s(NBYTES, RANKS, BW) == pytest.approx(half)
    # only the paper's accounting prices eq. 18, named so; fp32 gradients move twice the bytes
    paper = TrainingSetup(RANKS, RANKS, 1, 1e12, False, BW, "paper")
    assert grad_allreduce_s(NBYTES, RANKS, BW, paper.sync_factor) == pytest.approx(
        collectives.phaze_eq18_allreduce_s(NBYTES, RANKS, BW))
    fp32 = TrainingSetup(RANKS, RANKS, 1, 1e12, False, BW, grad_reduce_dtype="fp32")
    assert grad_allreduce_s(NBYTES, RANKS, BW, fp32.sync_factor) == pytest.approx(
        collectives.allreduce_s(2 * NBYTES, RANKS, BW))
    assert fp32.grad_bytes_ratio == 2.0


def test_place_stage_sync_is_a_ring_of_its_gradient_bytes():
    """``archplace place bert-large --arch phaze-common --fixed 2,512,1 --sequential --hbm 64 --json``
    (the request ``cmd_place`` builds): each stage's ``sync_s`` is 2(d−1)/d · its gradient bytes / bw."""
    res = api.place(api.PlaceRequest("bert-large", "phaze-common", hbm_gb=(64.0,), sequential=True,
                                     fixed=(2, 512, 1))).to_dict()
    pl = res["placement"]
    assert pl["feasible"] and (pl["p"], pl["d"], pl["t"]) == (2, 512, 1)
    assert pl["allreduce"].startswith("ring") and pl["grad_reduce_dtype"] == "bf16"
    assert res["hbm"] == {"tried_gb": [64.0], "source": "asked (--hbm)"}
    d = pl["d"]
    for st in pl["stages"]:
        assert st["weight_bytes"] > 0
        assert st["sync_s"] == pytest.approx(2 * (d - 1) / d * st["weight_bytes"] / PHAZE_LINK_BW_BYTES_PER_S,
                                             rel=1e-12)


def test_a_named_preset_is_placed_at_its_own_hbm():
    """tpuv4 has 32 GiB: Llama2-7B with the paper's {8, 128, 1} does not fit it, and says so with its HBM;
    ``--hbm 64`` is still there and says it was asked for."""
    own = api.place(api.PlaceRequest("llama2-7b", "tpuv4", sequential=True, fixed=(8, 128, 1))).to_dict()
    assert own["hbm"] == {"tried_gb": [32.0], "source": "the tpuv4 preset's own"}
    assert not own["placement"]["feasible"]
    assert "32.00 GiB HBM" in own["placement"]["reason"]
    asked = api.place(api.PlaceRequest("llama2-7b", "tpuv4", sequential=True, fixed=(8, 128, 1),
                                       hbm_gb=(64.0,))).to_dict()
    assert asked["hbm"]["source"] == "asked (--hbm)"
    assert asked["placement"]["feasible"] and asked["placement"]["hbm_gb"] == 64.0


def test_a_gdp_transfer_is_the_point_to_point_price():
    """``place-ops``' event simulator: op 0 (1 s) on GPU 0 sends its output to op 1 on GPU 1; the step is
    1 s plus one point-to-point send of those bytes (``collectives.p2p_s``), in the compiled simulator
    and in the reference one alike."""
    from archplace.simulators.gpu_placement import PlacementProblem, simulate, simulate_reference

    lat = 1e-5
    prob = PlacementProblem(np.array([1.0, 0.0]), np.array([NBYTES, 0.0]), np.zeros(2), np.array([0]),
                            np.array([1]), np.array([NBYTES]), np.array([-1, -1]), np.array([0, 1]), 2,
                            1e15, BW, lat, "nvlink")
    want = 1.0 + collectives.p2p_s(NBYTES, BW, lat)
    assert simulate(prob, np.array([0, 1])).step_time_s == pytest.approx(want, rel=1e-12)
    assert simulate_reference(prob, np.array([0, 1])).step_time_s == pytest.approx(want, rel=1e-12)
