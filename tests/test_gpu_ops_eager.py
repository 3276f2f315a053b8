"""The calibrated op model's eager-mode kernels (issue 44, deliverable 4): fp32 casts, softmax widened to
fp32, the loss, and view rows that copy. Closed forms: each kernel's bytes at the bandwidth the H200
micro-benchmark measured for its class at that size (log-log interpolation between the two measured
sizes around it, recomputed here from the raw file), at least one launch floor per kernel."""

from __future__ import annotations

import numpy as np
import pytest

from archplace.hardware.gpus import H200
from archplace.simulators.gpu_ops import gpu_op_times, load_calibration
from archplace.workloads.backward import derive_backward
from archplace.workloads.graph import OpGraph
from archplace.workloads.models import build_graph
from archplace.workloads.view_copies import view_copies

CAL = load_calibration("h200")
RAW = CAL.raw
O = CAL.call_overhead_s
TENSORS = {"mul_scalar": 2, "softmax_h1024": 2}  # tensors a benchmarked op reads + writes
N = 3 * 2**22  # elements: between measured sizes, so the interpolation is exercised


def kernel_s(op: str, dtype: str, nbytes: float) -> float:
    """One kernel moving ``nbytes``: the measured bandwidth of ``op`` in ``dtype`` (bfloat16 or float32)
    interpolated in log-log over the raw micro-benchmark, at least the launch floor."""
    bpe = {"bfloat16": 2, "float32": 4}[dtype]
    rows = sorted((e["numel"], e["s"]) for e in RAW["elementwise"] if e["op"] == op and e["dtype"] == dtype)
    by = np.array([r[0] for r in rows], float) * bpe * TENSORS[op]
    bw = by / (np.array([r[1] for r in rows], float) - O)
    return max(nbytes / np.exp(np.interp(np.log(nbytes), np.log(by), np.log(bw))), CAL.floor_s)


def chain(rows: list[dict]) -> OpGraph:
    n = len(rows)
    cols = ("kind", "core", "flops", "vector_flops", "input_bytes", "output_bytes", "saved_bytes")
    nodes = {c: [r.get(c, "" if c in ("kind", "core") else 0) for r in rows] for c in cols}
    nodes.update(id=list(range(n)), layer=[0] * n,
                 name=[r.get("name", f"op_{i}") for i, r in enumerate(rows)])
    edges = dict(src=list(range(n - 1)), dst=list(range(1, n)),
                 bytes=[r.get("output_bytes", 0) for r in rows[:-1]])
    return OpGraph.from_columns(nodes, edges, dict(model="t", layers=["l0"], mbs=1, bytes_per_element=2))


def times(g: OpGraph, dtype: str = "bf16") -> np.ndarray:
    return gpu_op_times(g, H200, dtype=dtype, op_model="calibrated").time_s


def test_an_fp32_upcast_and_downcast_move_their_bytes_at_the_copy_bandwidth():
    g = chain([dict(kind="input", core="none", output_bytes=2 * N),
               dict(kind="copy", core="vector", input_bytes=2 * N, output_bytes=4 * N),  # bf16 -> fp32
               dict(kind="copy", core="vector", input_bytes=4 * N, output_bytes=2 * N)])  # fp32 -> bf16
    t = times(derive_backward(g))
    up = kernel_s("mul_scalar", "bfloat16", (2 + 4) * N)
    assert t[1] == pytest.approx(up, rel=1e-12) and t[2] == pytest.approx(up, rel=1e-12)
    # their gradients move the same bytes back: 4 forward + backward casts of (2 + 4)·N bytes
    assert t[3:].tolist() == pytest.approx([up, up], rel=1e-12)
    # 1.5x the bytes of a same-dtype copy of N bf16 elements
    same = chain([dict(kind="input", core="none", output_bytes=2 * N),
                  dict(kind="copy", core="vector", input_bytes=2 * N, output_bytes=2 * N)])
    assert times(same)[1] == pytest.approx(kernel_s("mul_scalar", "bfloat16", 4 * N), rel=1e-12)


def test_softmax_to_fp32_is_an_upcast_and_an_fp32_softmax_forward_and_backward():
    fwd = chain([dict(kind="input", core="none", output_bytes=2 * N),
                 dict(kind="softmax", core="vector", flops=5.0 * N, vector_flops=5.0 * N, input_bytes=2 * N,
                      output_bytes=4 * N, saved_bytes=4 * N),
                 dict(kind="copy", core="vector", input_bytes=4 * N, output_bytes=2 * N)])
    g = derive_backward(fwd)
    t = times(g)
    assert t[1] == pytest.approx(kernel_s("mul_scalar", "bfloat16", 6 * N)
                                 + kernel_s("softmax_h1024", "float32", 8 * N), rel=1e-12)
    grad = int(np.flatnonzero(g.nodes["name"] == "op_1/grad")[0])
    assert g.nodes["input_bytes"][grad] == 8 * N  # its fp32 gradient and saved fp32 output
    # the fp32 softmax backward (8N read, 4N written), then the cast back (4N read, 2N written)
    assert t[grad] == pytest.approx(kernel_s("softmax_h1024", "float32", 12 * N)
                                    + kernel_s("mul_scalar", "bfloat16", 6 * N), rel=1e-12)
    # a softmax that keeps its dtype is one kernel, as before
    plain = chain([dict(kind="input", core="none", output_bytes=2 * N),
                   dict(kind="softmax", core="vector", flops=5.0 * N, vector_flops=5.0 * N, input_bytes=2 * N,
                        output_bytes=2 * N, saved_bytes=2 * N)])
    assert times(plain)[1] == pytest.approx(kernel_s("softmax_h1024", "bfloat16", 4 * N), rel=1e-12)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_loss_is_cast_log_softmax_and_nll_kernels(dtype):
    bpe = 2 if dtype == "bf16" else 4
    data = "bfloat16" if dtype == "bf16" else "float32"
    fwd = chain([dict(kind="input", core="none", output_bytes=bpe * N),
                 dict(kind="cross_entropy", core="vector", flops=5.0 * N, vector_flops=5.0 * N,
                      input_bytes=bpe * N, output_bytes=4, saved_bytes=bpe * N)])
    g = derive_backward(fwd)
    t = times(g, dtype)
    cast = kernel_s("mul_scalar", data, (bpe + 4) * N) if bpe < 4 else 0.0
    assert t[1] == pytest.approx(cast + kernel_s("softmax_h1024", "float32", 8 * N) + CAL.floor_s, rel=1e-12)
    grad = int(np.flatnonzero(g.nodes["name"] == "op_1/grad")[0])
    assert t[grad] == pytest.approx(kernel_s("mul_scalar", data, 4 * N)
                                    + kernel_s("softmax_h1024", "float32", 12 * N) + cast + CAL.floor_s,
                                    rel=1e-12)


def _heads(name: str, flips: int) -> list[dict]:
    """input -> view (split heads) -> ``flips`` transposes -> a batched GEMM."""
    b = 2 * N
    return ([dict(kind="input", core="none", output_bytes=b, name=f"{name}/in"),
             dict(kind="view", core="none", input_bytes=b, output_bytes=b, name=f"{name}/view_{flips}")]
            + [dict(kind="view", core="none", input_bytes=b, output_bytes=b, name=f"{name}/transpose_{i}")
               for i in range(flips)]
            + [dict(kind="elementwise", core="vector", flops=1.0 * N, vector_flops=1.0 * N, input_bytes=b,
                    output_bytes=b, name=f"{name}/gelu")])


@pytest.mark.parametrize("flips, copies", [(0, False), (1, True), (2, False), (3, True)])
def test_a_view_gradient_copies_after_an_odd_number_of_transposes(flips, copies):
    g = derive_backward(chain(_heads("q", flips)))
    mask = view_copies(g)
    grad = int(np.flatnonzero(g.nodes["name"] == f"q/view_{flips}/grad")[0])
    assert mask[grad] == copies and mask.sum() == copies
    t = times(g)
    assert t[grad] == (pytest.approx(kernel_s("mul_scalar", "bfloat16", 4 * N), rel=1e-12) if copies else 0.0)
    assert (t[g.nodes["kind"] == "view"] > 0).sum() == copies  # every other view stays free


def test_a_split_gradient_is_a_concatenation():
    g = derive_backward(chain([dict(kind="input", core="none", output_bytes=2 * N),
                               dict(kind="view", core="none", input_bytes=2 * N, output_bytes=2 * N,
                                    name="attn/split_2"),
                               dict(kind="gelu", core="vector", input_bytes=2 * N, output_bytes=2 * N)]))
    mask = view_copies(g)
    assert mask.tolist() == (g.nodes["name"] == "attn/split_2/grad").tolist()


def test_bert_copies_the_q_and_v_head_gradients_and_not_k():
    g = build_graph("bert-base", seq=128, mbs=1)
    mask = view_copies(g)
    names = [str(x) for x in g.nodes["name"][mask]]
    layer0 = sorted(n.split("/")[-2] for n in names if ".layer.0." in n)
    assert len(names) == 2 * 12 and len(layer0) == 2
    # each copied view feeds exactly one transpose, which feeds a GEMM (Q, V); K's goes through two
    nd, (src, dst) = g.nodes, g.edge_pos
    row = {str(n): i for i, n in enumerate(nd["name"])}
    for n in names:
        u = row[n[: -len("/grad")]]
        (v,) = [d for s, d in zip(src, dst) if s == u and not nd["is_backward"][d]]
        assert "transpose" in str(nd["name"][v])
        (w,) = [d for s, d in zip(src, dst) if s == v and not nd["is_backward"][d]]
        assert nd["kind"][w] == "matmul"


def test_a_bf16_capture_records_casts_as_copies_with_fp32_bytes():
    import torch
    import torch.nn as nn

    from archplace.workloads.extract import capture_ops

    class Att(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)

        def forward(self, x):
            s = self.proj(x)
            p = torch.softmax(s, dim=-1, dtype=torch.float32).to(s.dtype)
            return p * 2

    with torch.device("meta"):
        m = Att()
        x = torch.zeros((4, 16))
    ops16 = {o.name: o for o in capture_ops(m.to(torch.bfloat16), (x.to(torch.bfloat16),), {}, 2)[0]}
    ops32 = {o.name: o for o in capture_ops(m.to(torch.float32), (x,), {}, 2)[0]}
    sm, cast = "model/softmax", "model/to"
    assert (ops16[sm].in_bytes, ops16[sm].out_bytes) == (4 * 16 * 2, 4 * 16 * 4)  # bf16 in, fp32 out
    assert ops16[cast].kind == "copy" and (ops16[cast].in_bytes, ops16[cast].out_bytes) == (256, 128)
    assert ops16["model/mul"].in_bytes == ops32["model/mul"].in_bytes == 128  # bf16 again after the cast
    # an fp32 model (the GDP graphs) counts every float at bytes_per_element: the cast is a view
    assert ops32[cast].kind == "view" and ops32[sm].out_bytes == 4 * 16 * 2
