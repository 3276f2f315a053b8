"""``archplace profile``: a model's training step measured on the CPU per archplace graph node
(workloads/op_profiler.py, op_mapping.py, op_profile.py).

Each profiled model is measured once per module (fixtures); the tests then check that the profile's
step (node times + unmapped) is the measured step within 10% (issue 30), that its names are those of
the graph the builders make for the same arguments, the mapping's closed forms (the backward split,
the totals), the file round trip, one-line errors, and that ``pipeline`` and ``place-ops`` run on a
profile file. Sizes are small; the CPU times are thread CPU times, which other processes' load
inflates less than wall times, but not by nothing (``_check_step`` says how the 10% check copes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from archplace.workloads.hf_config import hf_ref
from archplace.workloads.op_profile import OpProfile
from archplace.workloads.op_profiler import profile_model

DATA = Path(__file__).parent / "data"
TINY = hf_ref(DATA / "tiny_llama_config.json")      # Llama, hidden 64, 4 layers, 32 positions
SMALL = hf_ref(DATA / "small_gpt2_config.json")     # GPT-2, hidden 384, 4 layers, 128 positions
FAST = dict(steps=7, warmup=1)


@pytest.fixture(scope="module")
def bert():
    return profile_model("bert-base", mbs=1, seq=16, **FAST)


@pytest.fixture(scope="module")
def gpt2():
    return profile_model(SMALL, mbs=2, seq=64, **FAST)


@pytest.fixture(scope="module")
def txl():
    return profile_model("txl-2", mbs=1, **FAST)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """The tiny Llama at the pipeline's micro-batch (16) and its default sequence, through the CLI."""
    from archplace.cli.commands import main

    out = tmp_path_factory.mktemp("prof") / "tiny.json"
    assert main(["profile", "--hf-config", str(DATA / "tiny_llama_config.json"), "--mbs", "16",
                 "--steps", "1", "--warmup", "0", "--out", str(out), "--json"]) == 0
    return out


def _check_step(p: OpProfile, again=None) -> None:
    """The profiled step is the measured step within 10% (issue 30). On an idle core the first profile
    is (ratios 0.95-1.01 here); with other processes on the two cores a step's CPU time drifts by up to
    +-40% between rounds (the suite at load 10 once gave 1.36), so up to two fresh profiles
    (``again()``) are taken before the test fails: it fails when three measurements in a row miss."""
    ratios = [p.profiled_step_s / p.measured_step_s]
    while abs(ratios[-1] - 1) > 0.10 and again is not None and len(ratios) < 3:
        q = again()
        ratios.append(q.profiled_step_s / q.measured_step_s)
    assert abs(ratios[-1] - 1) <= 0.10, (ratios, p.details)
    assert p.profiled_step_s == pytest.approx(p.time_s.sum() + p.unmapped_s, rel=1e-12)
    assert p.coverage == pytest.approx(p.time_s.sum() / p.profiled_step_s, rel=1e-12)
    assert p.coverage > 0.97
    assert p.details["backward_unmapped"] == 0  # every backward function found its forward op


def _check_split(p: OpProfile, graph) -> None:
    """A GEMM's backward function is split over dgrad and wgrad by flops, which are equal."""
    t = p.times_for(graph)
    names = list(graph.nodes["name"])
    pairs = [(names.index(n.removesuffix("/dgrad") + "/wgrad"), i) for i, n in enumerate(names)
             if n.endswith("/dgrad")]
    assert pairs
    for w, d in pairs:
        assert t[w] == pytest.approx(t[d], rel=1e-12) and t[d] > 0


def test_bert_base_profile_matches_measured_step(bert):
    from archplace.workloads.models import build_graph

    g = build_graph("bert-base", seq=16, mbs=1, bytes_per_element=4)
    assert bert.names == tuple(g.nodes["name"])
    assert np.array_equal(bert.times_for(g), bert.time_s)
    assert (bert.model, bert.device, bert.dtype, bert.mbs, bert.seq) == ("bert-base", "cpu", "fp32", 1, 16)
    _check_step(bert, lambda: profile_model("bert-base", mbs=1, seq=16, **FAST))
    _check_split(bert, g)
    # blocks 3..11 are copies of block 2 in the graph, yet each was measured on its own
    t = dict(zip(bert.names, bert.time_s))
    layers = [t[f"encoder.layer.{i}.intermediate.dense/linear_16+gelu"] for i in range(3, 12)]
    assert len(set(layers)) == len(layers) and min(layers) > 0


def test_hf_config_profile_matches_measured_step(gpt2):
    from archplace.workloads.byom import from_hf_config

    g = from_hf_config(DATA / "small_gpt2_config.json", seq=64, mbs=2, bytes_per_element=4)
    assert gpt2.names == tuple(g.nodes["name"])
    _check_step(gpt2, lambda: profile_model(SMALL, mbs=2, seq=64, **FAST))
    _check_split(gpt2, g)
    # GPT2LMHeadModel from a config file gets no loss node (hf_config.HfModel.has_loss): the step seeds
    # the logits with ones, as the graph's backward does, and that seed is the unmapped rest
    assert "loss/cross_entropy" not in gpt2.names
    assert "loss/seeds (the graph has no loss node)" in gpt2.details["unmapped_top_s"]


def test_gdp_preset_profile_matches_measured_step(txl):
    from archplace.workloads.gdp_models import gdp_graph

    g = gdp_graph("txl-2", batch=1)
    assert txl.names == tuple(g.nodes["name"]) and txl.seq == g.meta["seq"] == 128
    t = dict(zip(txl.names, txl.time_s))
    assert t["loss/cross_entropy"] > 0 and t["loss/cross_entropy/grad"] > 0  # the loss node is timed
    _check_step(txl, lambda: profile_model("txl-2", mbs=1, **FAST))
    _check_split(txl, g)


def test_round_trip(bert, tmp_path):
    path = bert.save(tmp_path / "sub" / "bert.json")
    back = OpProfile.load(path)
    for f in ("model", "device", "device_name", "dtype", "mbs", "seq", "names", "measured_step_s",
              "profiled_step_s", "unmapped_s", "coverage", "software", "details"):
        assert getattr(back, f) == getattr(bert, f), f
    assert np.array_equal(back.time_s, bert.time_s)
    assert {"torch", "transformers", "numpy", "python"} <= set(back.software)


def test_times_for_another_model_is_one_line(gpt2, txl):
    from archplace.workloads.gdp_models import gdp_graph

    with pytest.raises(ValueError) as e:
        gpt2.times_for(gdp_graph("txl-2", batch=1))
    msg = str(e.value)
    assert "\n" not in msg and "lacks" in msg and "of the graph's" in msg
    from archplace.workloads.byom import from_hf_config

    with pytest.raises(ValueError, match=r"measured at mbs 2, the graph is built at mbs 3"):
        gpt2.times_for(from_hf_config(DATA / "small_gpt2_config.json", seq=64, mbs=3, bytes_per_element=4))


@pytest.mark.parametrize("text, match", [
    (None, "does not exist"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"model": "x"}', "missing field"),
])
def test_load_errors_are_one_line(tmp_path, text, match):
    path = tmp_path / "p.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        OpProfile.load(path)
    assert "\n" not in str(e.value)


def test_bad_arguments_are_one_line():
    for kw, match in [(dict(device="tpu"), "device is 'tpu'; allowed"),
                      (dict(dtype="fp8"), "dtype is 'fp8'; allowed"),
                      (dict(mbs=0), "mbs is 0; allowed"),
                      (dict(method="guess"), "method is 'guess'; allowed")]:
        with pytest.raises(ValueError, match=match):
            profile_model("bert-base", **kw)
    with pytest.raises(ValueError, match="GDP preset 'txl-2' is an fp32 graph"):
        profile_model("txl-2", dtype="bf16")
    with pytest.raises(ValueError, match="sequence fixed by the preset: allowed: 128"):
        profile_model("txl-2", seq=64)


def test_profiler_method_maps_every_backward_function():
    """The torch.profiler path (the one CUDA takes) on the CPU: every backward function found its op,
    forward ops and the loss are timed; the split is the timer's."""
    p = profile_model(TINY, mbs=2, method="profiler", steps=1, warmup=1)
    assert p.details["method"] == "profiler" and p.details["backward_unmapped"] == 0
    assert p.details["backward_functions"] > 300
    t = dict(zip(p.names, p.time_s))
    assert t["lm_head/linear_21"] > 0 and t["lm_head/linear_21/dgrad"] == t["lm_head/linear_21/wgrad"] > 0
    assert t["loss/cross_entropy"] > 0 and t["loss/cross_entropy/grad"] > 0
    assert p.profiled_step_s == pytest.approx(p.time_s.sum() + p.unmapped_s, rel=1e-12)


def test_cli_writes_the_profile(tiny_file):
    p = OpProfile.load(tiny_file)
    assert (p.mbs, p.seq, p.dtype) == (16, 32, "fp32") and p.coverage > 0.5
    d = json.loads(tiny_file.read_text())
    assert d["format"] == 1 and len(d["names"]) == len(d["time_s"]) == len(p.names)


def test_pipeline_runs_on_a_profile(tiny_file, capsys):
    from archplace.cli.commands import main

    assert main(["pipeline", TINY, "--cluster", "A", "--gpu", "h200", "--profile", str(tiny_file),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["op_model"]["op_model"] == "profiled" and "coverage" in out["op_model"]["note"]
    assert out["length_s"] > 0


def test_place_ops_runs_on_a_profile(txl, tmp_path, capsys):
    from archplace.cli.commands import main

    path = txl.save(tmp_path / "txl.json")
    assert main(["place-ops", "txl-2", "--batch", "1", "--algo", "m-etf", "--machine", "h100-sxm",
                 "--profile", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["op_model"]["op_model"] == "profiled" and out["valid"]
    # a one-GPU placement runs every op once: its compute is the profile's node times
    assert out["single_device_step_time_s"] >= txl.time_s.sum() * 0.999


def test_profiler_module_imports_no_ray():
    """It runs on GPU machines with torch and transformers only (PYTHONPATH=. from a checkout)."""
    code = ("import sys, archplace.workloads.op_profiler as m; m.main; "
            "bad = [x for x in ('ray', 'ortools', 'pyarrow', 'pandas') if x in sys.modules]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr[-2000:]


def test_profile_request_round_trip_and_field_errors():
    from archplace import api

    req = api.ProfileRequest("txl-2", out="p.json", mbs=2, steps=3)
    assert api.ProfileRequest.from_dict(req.to_dict()) == req
    req.validate()
    for kw, field in [(dict(device="tpu"), "device"), (dict(dtype="int8"), "dtype"), (dict(mbs=0), "mbs"),
                      (dict(capture_blocks=2), "capture_blocks"), (dict(method="x"), "method"),
                      (dict(steps=0), "steps"), (dict(out=""), "out")]:
        with pytest.raises(api.InvalidRequest) as e:
            api.ProfileRequest(**{"model": "bert-base", "out": "p.json", **kw}).validate()
        assert e.value.fields[0] == field and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        api.ProfileRequest("nope", out="p.json").validate()


def test_mapping_closed_form():
    """The mapping on made-up times: exported op i takes i + 1 s forward and 1000 (i + 1) s backward
    (sequence number 10 i + 10); each forward row gets its ops' sum, a fused row's absorbed ops' backward
    goes to /grad_vec, a GEMM's is halved between dgrad and wgrad, the loss gets its own, and what
    maps to no node (gradient accumulation, ops the capture folds away, a sequence number no op
    made) is unmapped; nothing is lost or counted twice."""
    from archplace.workloads.op_mapping import Mapper
    from archplace.workloads.op_profiler import _Program, _workload

    w = _workload(TINY, device="cpu", dtype="fp32", mbs=2, seq=8, capture_blocks=None)
    prog = _Program(w)
    m = Mapper(w, prog)
    n = len(prog.calls)
    idx = np.arange(n)
    fwd = idx + 1.0
    top = 10 * idx + 10
    loss_hi = 10 * n + 20
    bwd = [(10 * i + 10, 1000.0 * (i + 1), "") for i in range(n)] + [(loss_hi, 3.0, ""), (-5, 11.0, "X")]
    t, unmapped, info = m.assemble(fwd, 5.0, bwd, {"AccumulateGrad": 7.0}, top, 0, (10 * n + 10, loss_hi))
    assert t.sum() + unmapped == pytest.approx(fwd.sum() + 5 + sum(b[1] for b in bwd) + 7, rel=1e-12)
    g = w.graph
    names = [str(x) for x in g.nodes["name"]]
    row = {nm: r for r, nm in enumerate(names)}
    fused = checked = 0
    for r, ids in enumerate(m.members):
        name = names[r]
        if not ids:
            continue
        assert t[r] == pytest.approx(sum(i + 1.0 for i in ids))
        if "+" in name:
            fused += 1
            assert t[row[name + "/grad_vec"]] == pytest.approx(sum(1000.0 * (i + 1) for i in ids[1:]))
        if name + "/dgrad" in row:
            checked += 1
            half = 500.0 * (ids[0] + 1)
            assert t[row[name + "/dgrad"]] == pytest.approx(half)
            assert t[row[name + "/wgrad"]] == pytest.approx(half)
    assert fused > 0 and checked > 0
    assert t[row["loss/cross_entropy"]] == 5.0 and t[row["loss/cross_entropy/grad"]] == 3.0
    folded = [i for i in idx if m.fwd_row_of_op[i] < 0]  # ops on constants, views of parameters
    assert folded and unmapped == pytest.approx(7 + 11 + sum(1001.0 * (i + 1) for i in folded))
    assert info["backward_unmapped"] == 1
