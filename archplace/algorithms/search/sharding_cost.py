"""Pricing a sharding plan: predicted training-step time and per-device memory.

Step time = per-op compute on one device (roofline, as ``simulators.gpu_ops.roofline_time_s``: the op's
share of flops at the tensor-core or vector rate, or its bytes at HBM bandwidth, whichever is slower;
the backward pass costs 2x a GEMM-like op's forward time (input and weight gradients) and 1x a vector
op's; views cost nothing) plus the collectives the plan implies, with no overlap, priced by
``simulators/collectives.py`` (the one price every command uses): a ring AllReduce moves
``2 (d − 1) / d`` of its bytes per device, AllGather and ReduceScatter ``(d − 1) / d``, all-to-all
``(d − 1) / d`` of each device's buffer, at the link rate. Memory is ``workloads.sharding.memory``
against the GPU's HBM.

For one model axis the cost is linear in the per-class split booleans (each op splits along at most
one label class, each tensor along at most one dim): ``linear_terms`` gives the coefficients the exact
search (CP-SAT) minimises, and ``evaluate`` prices any propagated plan the same way, so the two agree
to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from archplace.hardware.gpus import GPUSpec, gpu_spec
from archplace.simulators import collectives as coll
from archplace.workloads.sharding import (
    VIEW_KINDS,
    Collective,
    Propagation,
    ShardGraph,
    collectives,
    local_bytes,
    memory,
    needs_grad,
    split_factor,
)

_COLLECTIVE = {"allreduce": coll.allreduce_s, "reducescatter": coll.reduce_scatter_s,
               "allgather": coll.allgather_s, "alltoall": coll.alltoall_s}


@dataclass(frozen=True)
class ShardCost:
    """The machine a plan is priced on. ``link_bytes_per_s``: the per-GPU collective bandwidth
    (default the GPU's NVLink rate)."""

    gpu: GPUSpec = field(default_factory=lambda: gpu_spec("v100-sxm2"))
    dtype: str = "fp16"
    link_bytes_per_s: float = 0.0
    optimizer_factor: float = 6.0

    @property
    def link(self) -> float:
        return self.link_bytes_per_s or self.gpu.nvlink_bytes_per_s

    def collective_s(self, kind: str, nbytes: float, devices: int) -> float:
        return float(_COLLECTIVE[kind](nbytes, devices, self.link))

    def op_s(self, flops: float, moved_bytes: float, tensor_core: bool) -> float:
        rate = self.gpu.peak(self.dtype) if tensor_core else self.gpu.vector_flops_per_s
        return max(flops / rate, moved_bytes / self.gpu.hbm_bytes_per_s)


@dataclass(frozen=True)
class PlanCost:
    step_s: float
    compute_s: float
    comm_s: float
    memory_bytes: int
    fits: bool
    collectives: tuple[Collective, ...]

    def to_dict(self) -> dict:
        kinds: dict[str, dict] = {}
        for c in self.collectives:
            k = kinds.setdefault(f"{c.phase} {c.kind}", {"count": 0, "bytes": 0})
            k["count"] += 1
            k["bytes"] += c.bytes
        return {
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "memory_bytes": self.memory_bytes,
            "fits": self.fits,
            "collectives": kinds,
        }


def _bwd_mult(g: ShardGraph, grad: np.ndarray, oi: int) -> float:
    op = g.ops[oi]
    if op.kind in VIEW_KINDS or not grad[op.output]:
        return 0.0
    return 2.0 if op.tensor_core else 1.0


def _moved(g: ShardGraph, oi: int, nbytes) -> float:
    """Bytes an op moves (``ops.moved_bytes``): its operands and output; an embedding reads the rows it
    gathers (its output's worth), not its table."""
    op = g.ops[oi]
    ins = [nbytes(t) for t in op.inputs]
    if op.kind == "embedding":
        ins[1] = 0
    return float(sum(ins) + nbytes(op.output) * (2 if op.kind == "embedding" else 1))


def evaluate(p: Propagation, cost: ShardCost) -> PlanCost:
    """Price a propagated plan (undecided dims count as replicated)."""
    g = p.graph
    grad = needs_grad(g)
    compute = 0.0
    for oi, op in enumerate(g.ops):
        if op.kind in VIEW_KINDS:
            continue
        t = cost.op_s(
            op.flops / split_factor(p, op), _moved(g, oi, lambda x: local_bytes(p, x)), op.tensor_core
        )
        compute += t * (1.0 + _bwd_mult(g, grad, oi))
    colls = tuple(collectives(p))
    comm = sum(cost.collective_s(c.kind, c.bytes, c.devices) for c in colls)
    mem = memory(p, cost.optimizer_factor).total_bytes
    return PlanCost(compute + comm, compute, comm, mem, mem <= cost.gpu.memory_bytes, colls)


@dataclass
class LinearTerms:
    """Step time and memory of a one-axis plan as ``base + Σ coef[c]·x_c + Σ grad_ar[t]·y_t`` with
    ``y_t = OR(x_c for c in grad_or[t])`` (tensor t's gradient AllReduce)."""

    base_s: float
    coef_s: np.ndarray  # per class
    grad_ar_s: dict[int, float]
    grad_or: dict[int, list[int]]
    mem_base_bytes: float
    mem_coef_bytes: np.ndarray  # per class (negative: bytes saved by splitting)


def linear_terms(g: ShardGraph, devices: int, cost: ShardCost) -> LinearTerms:
    if any(op.kind == "reshard" for op in g.ops):
        raise ValueError("graph has reshard ops: the exact sharding search prices only propagated plans")
    cl = g.classes
    T = check_devices(devices)
    grad = needs_grad(g)
    coef = np.zeros(cl.num)
    base = 0.0
    full = lambda t: g.tensors[t].nbytes  # noqa: E731
    for oi, op in enumerate(g.ops):
        if op.kind in VIEW_KINDS:
            continue
        mult = 1.0 + _bwd_mult(g, grad, oi)
        t0 = cost.op_s(op.flops, _moved(g, oi, full), op.tensor_core) * mult
        base += t0
        for c, _, _ in cl.op_classes[oi]:

            def nb(t, c=c):
                return full(t) / T if c in cl.tensor_classes[t] else full(t)

            t1 = cost.op_s(op.flops / T, _moved(g, oi, nb), op.tensor_core) * mult
            coef[c] += t1 - t0
        outc = set(cl.tensor_classes[op.output])
        labs = _labels_of(g, oi)
        for c in dict.fromkeys(int(cl.cls[labs[lab]]) for lab in op.contracted()):
            if c in outc:  # the output is split over the same axis: a ReduceScatter
                coef[c] += cost.collective_s("reducescatter", full(op.output) / T * op.partial_factor, T)
            else:
                coef[c] += cost.collective_s("allreduce", int(full(op.output) * op.partial_factor), T)
    # backward: operand t's gradient contracts the op's classes t lacks; split, it is partial
    grad_or: dict[int, list[int]] = {}
    for oi, op in enumerate(g.ops):
        for t in op.inputs:
            if not grad[t]:
                continue
            own = set(cl.tensor_classes[t])
            for c, _, _ in cl.op_classes[oi]:
                if c not in own:
                    grad_or.setdefault(t, [])
                    if c not in grad_or[t]:
                        grad_or[t].append(c)
    grad_ar = {t: cost.collective_s("allreduce", full(t), T) for t in grad_or}
    mem_base = 0.0
    mem_coef = np.zeros(cl.num)
    pf = 2.0 + cost.optimizer_factor
    tensors = [(t, pf) for t in g.params()] + [(op.output, 1.0) for op in g.ops if op.kind not in VIEW_KINDS]
    for t, f in tensors:
        b = full(t) * f
        mem_base += b
        for c in set(cl.tensor_classes[t]):
            mem_coef[c] -= b * (1 - 1 / T)
    return LinearTerms(base, coef, grad_ar, grad_or, mem_base, mem_coef)


def _labels_of(g: ShardGraph, oi: int) -> dict[str, int]:
    cl = g.classes
    op = g.ops[oi]
    out: dict[str, int] = {}
    for t, ls in list(zip(op.inputs, op.labels)) + [(op.output, op.out_labels)]:
        for d, lab in enumerate(ls):
            out.setdefault(lab, cl.slot(t, d))
    return out


def linear_value(lt: LinearTerms, x: np.ndarray) -> tuple[float, float]:
    """(step seconds, memory bytes) of class assignment ``x`` (0/1 per class) by the linear form."""
    y = sum(s for t, s in lt.grad_ar_s.items() if any(x[c] for c in lt.grad_or[t]))
    return float(lt.base_s + lt.coef_s @ x + y), float(lt.mem_base_bytes + lt.mem_coef_bytes @ x)


def check_devices(devices: int) -> int:
    if not (isinstance(devices, int) and devices >= 1):
        raise ValueError(f"devices is {devices!r}; allowed: an integer >= 1")
    return devices
