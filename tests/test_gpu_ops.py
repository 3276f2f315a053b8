"""GPU presets and op-time models (issue 30): the datasheet numbers, the roofline bit-for-bit as the pipeline
and place-ops simulators had it, the calibrated model at its measured points (closed forms: at a grid point
the interpolation returns the measurement), its hold-out error, scaling to unmeasured GPUs, and the wiring
of --gpu / --machine / --op-model / --dtype / --profile through the API and the command line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from archplace import api
from archplace.cli import main
from archplace.hardware.gpu_machines import GIB, P100_PCIE, V100_NVLINK, GPUMachine, gpu_machine
from archplace.hardware.gpus import DTYPES, GPUS, H100_SXM, H200, V100_SXM2, gpu_spec
from archplace.hardware.presets import GPU, V100, gpu_servers, v100_servers
from archplace.simulators import gpu_ops
from archplace.simulators.gpu_ops import (
    OP_MODELS,
    OpTimes,
    default_op_model,
    gpu_op_times,
    load_calibration,
)
from archplace.simulators.gpu_ops_fit import holdout_errors, holdout_mask, microbench_errors
from archplace.simulators.gpu_placement import PlacementProblem
from archplace.simulators.pipeline import gpu_op_time_s, profile_from_graph
from archplace.workloads.backward import derive_backward
from archplace.workloads.gdp_models import gdp_graph
from archplace.workloads.graph import OpGraph
from archplace.workloads.models import build_graph
from archplace.workloads.ops import moved_bytes

CAL = load_calibration("h200")
RAW = CAL.raw
O = CAL.call_overhead_s  # an isolated call's extra latency, taken off every measurement


# ------------------------------------------------------------------------------------------ presets
def test_preset_numbers_are_the_datasheets():
    assert sorted(GPUS) == ["a100-40gb", "a100-80gb", "h100-sxm", "h200", "p100-pcie", "v100-sxm2"]
    assert [GPUS["h200"].peak(d) for d in DTYPES] == [989.5e12, 989.5e12, 494.5e12, 67e12]
    assert (H200.hbm_bytes_per_s, H200.memory_bytes, H200.nvlink_bytes_per_s) == (4.8e12, 141 * GIB, 450e9)
    h100 = H100_SXM
    assert (h100.hbm_bytes_per_s, h100.memory_bytes, h100.ib_bytes_per_s) == (3.35e12, 80 * GIB, 50e9)
    a40, a80 = GPUS["a100-40gb"], GPUS["a100-80gb"]
    assert [a40.peak(d) for d in DTYPES] == [312e12, 312e12, 156e12, 19.5e12] == [a80.peak(d) for d in DTYPES]
    assert (a40.hbm_bytes_per_s, a80.hbm_bytes_per_s, a40.nvlink_bytes_per_s) == (1555e9, 2039e9, 300e9)
    # no TF32 on Volta and Pascal, no tensor cores on the P100: their fp16 rates
    assert [V100_SXM2.peak(d) for d in DTYPES] == [125e12, 125e12, 15.7e12, 15.7e12]
    p = GPUS["p100-pcie"]
    assert [p.peak(d) for d in DTYPES] == [18.7e12, 18.7e12, 9.3e12, 9.3e12]
    assert (p.hbm_bytes_per_s, p.memory_bytes, p.nvlink_bytes_per_s) == (732e9, 16 * GIB, 0.0)
    assert all(g.source and g.launch_s == 5e-6 for g in GPUS.values())


def test_old_presets_keep_their_numbers():
    assert V100 == GPU("V100-SXM2-32GB", 125e12, 15.7e12, 900e9, 32.0)
    assert v100_servers(2).link_bw == 150e9 and v100_servers(2).inter_server_bw == 25e9 / 8
    old = {"p100-pcie": (9.3e12, 732e9, 16 * GIB, 12e9, 10e-6, "pcie", 5e-6),
           "v100-nvlink": (15.7e12, 900e9, 16 * GIB, 25e9, 5e-6, "nvlink", 5e-6)}
    for m in (P100_PCIE, V100_NVLINK):
        assert (m.peak_flops_per_s, m.hbm_bytes_per_s, m.memory_bytes, m.link_bytes_per_s, m.link_latency_s,
                m.interconnect, m.kernel_launch_s) == old[m.name]
        assert gpu_machine(m.name) is m and gpu_machine(m.name, 3).num_devices == 3


def test_new_gpu_machines_and_servers():
    m = gpu_machine("h100-sxm", 4)
    assert (m.num_devices, m.peak_flops_per_s, m.hbm_bytes_per_s, m.interconnect, m.link_bytes_per_s) == \
        (4, 67e12, 3.35e12, "nvlink", 450e9)
    assert gpu_machine("h100-sxm", 4, "bf16").peak_flops_per_s == 989.5e12
    assert gpu_machine("p100-pcie", None, "fp16").peak_flops_per_s == 18.7e12
    assert GPUMachine.from_spec(GPUS["p100-pcie"]).interconnect == "pcie"
    cl = gpu_servers("a100-80gb", 3, "bf16")
    dev = cl.device
    assert (cl.num_devices, cl.link_bw, cl.inter_server_bw, dev.peak_tensor_flops, dev.hbm_gb) == \
        (24, 300e9, 25e9, 312e12, 80.0)


@pytest.mark.parametrize("call, match", [
    (lambda: gpu_spec("h300"), r"gpu is 'h300'; allowed: \['a100-40gb'"),
    (lambda: H200.peak("int8"), r"dtype is 'int8'; allowed: \['bf16', 'fp16', 'tf32', 'fp32'\]"),
    (lambda: gpu_machine("h300"), r"machine is 'h300'; allowed:"),
    (lambda: gpu_servers("p100-pcie", 2), r"gpu 'p100-pcie' has no NVLink"),
])
def test_bad_gpu_names_are_one_line_errors(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------ roofline
def _old_pipeline_roofline(nodes, gpu):  # simulators/pipeline.py::gpu_op_time_s before issue 30
    flops = nodes["flops"].astype(float)
    vec = nodes["vector_flops"].astype(float)
    compute = (flops - vec) / gpu.peak_tensor_flops + vec / gpu.peak_vector_flops
    return np.maximum(compute, moved_bytes(nodes) / gpu.hbm_bw)


def _old_place_ops_roofline(nd, machine):  # PlacementProblem.from_graph before issue 30
    comp = np.maximum(nd["flops"] / machine.peak_flops_per_s, moved_bytes(nd) / machine.hbm_bytes_per_s)
    shape_only = (nd["flops"] == 0) & (nd["kind"] == "input")
    return np.where(shape_only, 0.0, comp + machine.kernel_launch_s)


@pytest.fixture(scope="module")
def bert():
    """A real transformer training graph, at the pipeline's micro-batch."""
    return build_graph("bert-base", seq=32, mbs=16)


def test_roofline_is_bit_identical_to_the_old_ones(bert):
    g = bert
    want = _old_pipeline_roofline(g.nodes, V100)
    assert np.array_equal(gpu_op_time_s(g.nodes, V100), want)
    assert np.array_equal(gpu_op_times(g, V100_SXM2, dtype="fp16", op_model="roofline").time_s, want)
    gg = gdp_graph("txl-2")
    for m in (P100_PCIE, V100_NVLINK):
        want = _old_place_ops_roofline(gg.nodes, m)
        assert np.array_equal(PlacementProblem.from_graph(gg, m).compute_s, want)
        t = gpu_op_times(gg, m.spec, dtype="fp32", op_model="roofline", launch_s=m.kernel_launch_s)
        assert np.array_equal(t.time_s, want)
    assert default_op_model(V100_SXM2) == default_op_model(GPUS["p100-pcie"]) == "roofline"
    assert default_op_model(H200) == "calibrated" and OP_MODELS == api.pipelining.OP_MODELS


# ------------------------------------------------------------------------------------------ calibrated
def _graph(rows: list[dict]) -> OpGraph:
    """A chain of ops (row dicts of node columns)."""
    n = len(rows)
    nodes = {c: [r.get(c, 0) for r in rows] for c in ("kind", "gemm_b", "gemm_m", "gemm_n", "gemm_k", "flops",
                                                       "vector_flops", "input_bytes", "output_bytes",
                                                       "weight_bytes")}
    nodes["id"] = list(range(n))
    nodes["layer"] = [0] * n
    edges = dict(src=list(range(n - 1)), dst=list(range(1, n)),
                 bytes=[r.get("output_bytes", 0) for r in rows[:-1]])
    return OpGraph.from_columns(nodes, edges, dict(model="t", layers=["l0"], mbs=1, bytes_per_element=2))


def _gemm_entry(dtype, m, n, k):
    return next(g for g in RAW["gemm"] if (g["dtype"], g["m"], g["n"], g["k"]) == (dtype, m, n, k))


def _vec_entry(op, dtype, numel):
    return next(e for e in RAW["elementwise"] if (e["op"], e["dtype"], e["numel"]) == (op, dtype, numel))


def _tiny(numel=2**20, m=1024, n=4096, k=1024):
    return _graph([
        dict(kind="input", output_bytes=2 * m * k),
        dict(kind="linear", gemm_b=1, gemm_m=m, gemm_n=n, gemm_k=k, flops=2.0 * m * n * k,
             input_bytes=2 * m * k, output_bytes=2 * m * n, weight_bytes=2 * n * k),
        dict(kind="add", flops=float(numel), vector_flops=float(numel), input_bytes=4 * numel,
             output_bytes=2 * numel),
        dict(kind="view", input_bytes=2 * numel, output_bytes=2 * numel),
        dict(kind="add", flops=16.0, vector_flops=16.0, input_bytes=64, output_bytes=32),
    ])


def test_calibrated_returns_the_measurements_at_measured_points():
    g = _tiny()
    t = gpu_op_times(g, H200, dtype="bf16", op_model="calibrated")
    assert t.op_model == "calibrated" and t.gpu == "h200" and t.dtype == "bf16"
    assert t.time_s[0] == 0.0 and t.time_s[3] == 0.0  # input, view
    assert t.time_s[1] == pytest.approx(_gemm_entry("bfloat16", 1024, 4096, 1024)["s"] - O, rel=1e-9)
    assert t.time_s[2] == pytest.approx(_vec_entry("add", "bfloat16", 2**20)["s"] - O, rel=1e-9)
    assert t.time_s[4] == CAL.floor_s  # 96 bytes: below the measured sizes, at the launch floor
    assert "measured on NVIDIA H200 (h200_microbench.json)" in t.note
    assert "1 of 3 timed ops outside the measured sizes" in t.note
    assert t.to_dict() == {"op_model": "calibrated", "gpu": "h200", "dtype": "bf16", "note": t.note}
    # fp16 runs on the bf16 data; fp32 on its own grid; tf32 = the fp32 efficiency on the TF32 peak
    assert np.array_equal(gpu_op_times(g, H200, dtype="fp16", op_model="calibrated").time_s, t.time_s)
    t32 = gpu_op_times(g, H200, dtype="fp32", op_model="calibrated")
    assert t32.time_s[1] == pytest.approx(_gemm_entry("float32", 1024, 4096, 1024)["s"] - O, rel=1e-9)
    tf = gpu_op_times(g, H200, dtype="tf32", op_model="calibrated")
    assert tf.time_s[1] == pytest.approx(t32.time_s[1] * 67e12 / 494.5e12, rel=1e-12)
    assert "tf32 uses the fp32 efficiencies on the tf32 peak" in tf.note


def test_calibrated_conv_forward_and_backward_are_the_measured_ones():
    c = RAW["conv2d"][1]  # 64 -> 80 channels, 1x1, 73x73, batch 32
    mm, nn, kk = gpu_ops.conv_gemm_dims(c)
    fl = float(c["fwd_flops"])
    assert fl == 2.0 * mm * nn * kk
    fwd = _graph([dict(kind="input", output_bytes=4 * mm * kk),
                  dict(kind="conv", gemm_b=1, gemm_m=mm, gemm_n=nn, gemm_k=kk, flops=fl,
                       input_bytes=4 * mm * kk, output_bytes=4 * mm * nn, weight_bytes=4 * nn * kk)])
    g = derive_backward(fwd)
    t = gpu_op_times(g, H200, dtype="fp32", op_model="calibrated")
    nd = g.nodes
    conv_bwd = (nd["kind"] == "conv") & nd["is_backward"]
    assert conv_bwd.sum() == 2  # dgrad and wgrad
    assert t.time_s[1] == pytest.approx(c["fwd_s"] - O, rel=1e-9)
    # the backward pair together: fwd+bwd - fwd, less the backward() call's fixed cost
    want = c["fwd_bwd_s"] - c["fwd_s"] - CAL.backward_call_s
    assert t.time_s[conv_bwd].sum() == pytest.approx(want, rel=1e-9)
    assert 1e-4 < CAL.backward_call_s < 1e-3


def test_fit_reproduces_the_micro_benchmarks_and_the_hold_out_generalises():
    errs = {f: np.abs(p / y - 1) for f, (p, y) in microbench_errors(CAL).items()}
    for f in ("gemm", "elementwise", "conv"):
        assert errs[f].max() < 1e-9, f
    assert len(errs["gemm"]) == 155 and len(errs["conv"]) == 18 and len(errs["elementwise"]) == 96
    # the QK^T and P·V bmms of one shape share their flops (one point of the curve): not exact
    assert np.median(errs["bmm"]) <= 0.10
    assert np.median(np.concatenate([errs[f] for f in ("gemm", "bmm", "elementwise", "conv")])) <= 0.10
    p, y = holdout_errors(CAL, seed=0)
    assert len(p) == 39  # a quarter of the 155 GEMMs
    assert np.median(np.abs(p / y - 1)) <= 0.10
    mask = holdout_mask(155, 0)
    assert mask.sum() == 39 and np.array_equal(mask, holdout_mask(155, 0))


def test_other_gpus_scale_from_the_h200_by_peak_ratios():
    g = _tiny()
    h200 = gpu_op_times(g, H200, dtype="bf16", op_model="calibrated")
    h100 = gpu_op_times(g, H100_SXM, dtype="bf16", op_model="calibrated")
    assert "calibrated: scaled from h200 by peak ratios (bf16 data at bf16 x1.00, HBM x0.70" in h100.note
    assert h100.time_s[1] == pytest.approx(h200.time_s[1], rel=1e-12)  # the same bf16 peak
    assert h100.time_s[2] == pytest.approx(h200.time_s[2] * 4.8e12 / 3.35e12, rel=1e-12)
    a100 = gpu_op_times(g, GPUS["a100-80gb"], dtype="bf16", op_model="calibrated")
    assert a100.time_s[1] == pytest.approx(h200.time_s[1] * 989.5 / 312, rel=1e-12)
    assert gpu_ops.nearest_measured(GPUS["v100-sxm2"]) == "h200"


def test_fused_attention_is_one_batched_gemm_and_one_launch(monkeypatch):
    b, s, d = 256, 512, 64
    fl = 2 * 2.0 * b * s * s * d
    g = _graph([dict(kind="attention", gemm_b=b, gemm_m=s, gemm_n=s, gemm_k=d, flops=fl,
                     input_bytes=3 * 2 * b * s * d, output_bytes=2 * b * s * d)])
    # with the H200's measured scaled_dot_product_attention (issue 44): the measured forward kernels
    # (non-causal) of these flops, less the isolated-call latency: 256 x 512^2 and 64 x 1024^2 (both d 64),
    # at the geometric mean of their efficiencies
    sdpa = json.loads((gpu_ops.CALIBRATION_DIR / "h200_steps" / "sdpa_microbench.json").read_text())
    meas = [r["sdpa_fwd_s"] - O for r in sdpa["rows"]
            if not r["causal"] and 4.0 * r["batch_heads"] * r["seq"] ** 2 * r["head_dim"] == fl]
    assert len(meas) == 2
    t = gpu_op_times(g, H200, dtype="bf16", op_model="calibrated").time_s[0]
    assert t == pytest.approx(float(np.exp(np.mean(np.log(meas)))), rel=1e-9)
    # without those measurements: one batched GEMM at the bmm curve and one launch
    monkeypatch.setattr(gpu_ops, "load_calibration",
                        lambda gpu: dataclasses.replace(CAL, sdpa_fwd_curve=None, sdpa_bwd_curve=None))
    t = gpu_op_times(g, H200, dtype="bf16", op_model="calibrated").time_s[0]
    # the curve's point at these flops: the QK^T and P·V bmms of this shape (same flops), geometric mean
    f1 = 2.0 * b * s * s * d
    effs = [f1 / (x["s"] - O) / 989.5e12 for x in RAW["bmm"] if 2.0 * x["b"] * x["m"] * x["n"] * x["k"] == f1]
    assert len(effs) == 2
    eff = np.exp(np.mean(np.log(effs)))
    assert t == pytest.approx(max(fl / (eff * 989.5e12), 8 * b * s * d / 4.8e12) + CAL.floor_s, rel=1e-9)


class _Profile:
    """What the op model needs of an OpProfile (workloads/op_profile.py)."""

    model, device_name, dtype, mbs, coverage = "t", "NVIDIA H200", "bf16", 1, 0.97

    def times_for(self, graph):
        return np.arange(graph.num_nodes, dtype=float) * 1e-3


def test_profiled_takes_the_profile_times():
    g = _tiny()
    t = gpu_op_times(g, H200, dtype="bf16", profile=_Profile())
    assert t.op_model == "profiled" and np.array_equal(t.time_s, np.arange(5) * 1e-3)
    assert "profiled: t measured on NVIDIA H200" in t.note and "coverage 97.0%" in t.note


@pytest.mark.parametrize("kw, match", [
    (dict(op_model="measured"), r"op_model is 'measured'; allowed: \['roofline', 'calibrated', 'profiled'\]"),
    (dict(op_model="profiled"), r"op_model 'profiled' needs a profile"),
    (dict(op_model="roofline", profile=_Profile()), r"op_model is 'roofline' but a profile was given"),
    (dict(dtype="int8"), r"dtype is 'int8'; allowed"),
])
def test_bad_op_model_inputs_are_one_line_errors(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        gpu_op_times(_tiny(), H200, **{"dtype": "bf16", **kw})
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------ wiring
def test_pipeline_profile_takes_op_times(bert):
    g = bert
    times = gpu_op_times(g, H200, dtype="bf16", op_model="calibrated")
    base = profile_from_graph(g, V100)
    prof = profile_from_graph(g, GPU.from_spec(H200, "bf16"), op_times=times.time_s)
    assert prof.compute_s_prefix[-1] == pytest.approx(times.time_s.sum(), rel=1e-9)
    assert base.compute_s_prefix[-1] == pytest.approx(gpu_op_time_s(g.nodes, V100).sum(), rel=1e-9)
    with pytest.raises(ValueError, match="op_times has shape"):
        profile_from_graph(g, V100, op_times=times.time_s[:3])


def _stage_compute(res) -> float:
    return sum(t * d for t, d in zip(res["stage_time_s"], res["devices"]))


def test_pipeline_api_honours_gpu_and_op_model():
    from archplace.algorithms.rl.pipeline_plan import training_setup

    default = api.pipeline(api.PipelineRequest("bert-48", cluster="A")).to_dict()
    assert "op_model" not in default
    roof = api.pipeline(api.PipelineRequest("bert-48", cluster="A", op_model="roofline")).to_dict()
    assert roof["length_s"] == default["length_s"] and roof["op_model"]["gpu"] == "v100-sxm2"
    g = build_graph("bert-48", mbs=16)
    params = float(g.nodes["weight_bytes"][~g.nodes["is_backward"]].sum()) / 2
    rec = 2.0 if training_setup("bert-48", params).recompute else 1.0
    fwd = ~g.nodes["is_backward"]
    for model in ("roofline", "calibrated"):
        res = api.pipeline(api.PipelineRequest("bert-48", cluster="A", gpu="h200", op_model=model)).to_dict()
        assert res["gpus"] == 16 and res["op_model"]["op_model"] == model and res["op_model"]["gpu"] == "h200"
        t = gpu_op_times(g, H200, dtype="fp16", op_model=model).time_s
        assert _stage_compute(res) == pytest.approx(rec * t[fwd].sum() + t[~fwd].sum(), rel=1e-9)
    with pytest.raises(api.InvalidRequest, match="gpu must be one of"):
        api.pipeline(api.PipelineRequest("bert-48", cluster="A", gpu="p100-pcie"))


def test_place_ops_api_honours_machine_and_op_model():
    g = gdp_graph("txl-2")
    default = api.place_ops(api.PlaceOpsRequest("txl-2", devices=1, algo="single")).to_dict()
    assert "op_model" not in default
    for machine, model in (("p100-pcie", "roofline"), ("p100-pcie", "calibrated"), ("h100-sxm", "calibrated"),
                           ("h200", None)):
        res = api.place_ops(api.PlaceOpsRequest("txl-2", devices=1, algo="single", machine=machine,
                                                op_model=model)).to_dict()
        m = gpu_machine(machine)
        t = gpu_op_times(g, m.spec, dtype="fp32", op_model=model, launch_s=m.kernel_launch_s)
        # one GPU, no transfers: the step is the sum of the op times
        assert res["step_time_s"] == pytest.approx(t.time_s.sum(), rel=1e-9)
        assert res["op_model"] == t.to_dict()
    assert res["op_model"]["op_model"] == "calibrated"  # h200's default: it was measured
    assert res["memory_bytes"] == 141 * GIB
    with pytest.raises(api.InvalidRequest, match="machine must be one of"):
        api.PlaceOpsRequest("txl-2", machine="h300").validate()
    with pytest.raises(api.InvalidRequest, match="op_model profiled needs profile"):
        api.PlaceOpsRequest("txl-2", op_model="profiled").validate()


def test_cli_flags(capsys):
    def run(argv):
        assert main([*argv, "--json"]) == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    res = run(["pipeline", "bert-48", "--cluster", "A", "--gpu", "h100-sxm", "--dtype", "bf16"])
    assert res["op_model"]["gpu"] == "h100-sxm" and res["op_model"]["op_model"] == "roofline"
    res = run(["place-ops", "txl-2", "--machine", "h100-sxm", "--op-model", "calibrated", "--devices", "2"])
    assert res["devices"] == 2 and "scaled from h200" in res["op_model"]["note"]
    with pytest.raises(SystemExit):
        main(["place-ops", "txl-2", "--dtype", "int8"])
    assert main(["pipeline", "bert-48", "--cluster", "A", "--op-model", "profiled"]) != 0
    assert "--op-model profiled needs --profile FILE" in capsys.readouterr().err


def test_op_times_dataclass():
    t = OpTimes(np.zeros(2), "roofline", "h200", "bf16", "n")
    assert t.to_dict() == {"op_model": "roofline", "gpu": "h200", "dtype": "bf16", "note": "n"}
