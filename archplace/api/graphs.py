"""Operator graphs and per-operator latency estimates (``archplace graph`` / ``estimate``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import (
    ProgressFn,
    Request,
    Result,
    Steps,
    check_capture_blocks,
    check_choice,
    check_int,
    check_model,
    check_optional_str,
    invalid,
)

BACKENDS = ("analytical", "zigzag")


# ---------------------------------------------------------------------- loaders
def load_graph(model: str, seq: int | None, mbs: int, tmp: int, training: bool = True,
               capture_blocks: int = 3):
    """A preset name, a dnn-partitioning ``.json`` or an archplace ``.parquet`` graph; ``capture_blocks``
    as ``build_graph`` takes it (for presets and ``hf:`` configs)."""
    from ..workloads import OpGraph

    path = Path(model)
    if model.startswith("hf:"):  # a transformers config (--hf-config): captured like a preset
        from ..workloads.models import build_graph

        return build_graph(model, seq=seq, mbs=mbs, tmp=tmp, training=training, capture_blocks=capture_blocks)
    if model.endswith(".parquet"):
        if not path.exists():
            raise ValueError(f"graph file {model!r} does not exist")
        return OpGraph.from_parquet(path)
    from ..workloads.dnn_partitioning import load_dnn_partitioning, resolve_graph_file

    if model.endswith(".json"):
        found = resolve_graph_file(model)
        if found is None:
            raise ValueError(f"graph file {model!r} does not exist")
        return load_dnn_partitioning(found)
    from ..workloads.models import PRESETS, build_graph

    if model not in PRESETS and (found := resolve_graph_file(model)) is not None:   # a bundled graph's name
        return load_dnn_partitioning(found)

    return build_graph(model, seq=seq, mbs=mbs, tmp=tmp, training=training, capture_blocks=capture_blocks)


def load_accelerator(arch: str | dict):
    """A preset name, a JSON file of Accelerator fields, or those fields as a dict."""
    from ..hardware import Accelerator
    from ..hardware.presets import preset_accelerator

    if isinstance(arch, dict):
        return Accelerator.from_dict(arch)
    if not (isinstance(arch, str) and arch):
        raise invalid("arch", "must be an accelerator preset name, a .json file or a dict of Accelerator "
                              f"fields, got {arch!r}")
    if arch.endswith(".json"):
        return Accelerator.from_json(arch)
    return preset_accelerator(arch)


def graph_summary(g) -> dict[str, Any]:
    """Counts, sizes, flops and repeated layers of an operator graph (``GraphResult``'s fields)."""
    import numpy as np

    tot = g.totals()
    fwd = ~g.nodes["is_backward"]
    bpe = int(g.meta.get("bytes_per_element", 2))
    out: dict[str, Any] = {
        "model": g.meta.get("model"), "source": g.meta.get("source"),
        "seq": g.meta.get("seq"), "mbs": g.meta.get("mbs"), "tmp": g.meta.get("tmp"),
        "ops": tot["ops"], "forward_ops": tot["forward_ops"], "backward_ops": tot["backward_ops"],
        "edges": tot["edges"], "parameters": tot["weight_bytes"] // bpe,
        "weight_bytes": tot["weight_bytes"], "forward_flops": tot["forward_flops"],
        "backward_flops": tot["backward_flops"], "activation_bytes": tot["activation_bytes"],
        "ops_by_core": {c: int(n) for c, n in zip(*np.unique(g.nodes["core"][fwd], return_counts=True))},
    }
    layers = g.meta.get("layers") or []
    out["layers"] = len(layers)
    if layers and (g.nodes["layer"] >= 0).all():
        from ..workloads import layer_graph

        lg = layer_graph(g)
        out["repeated_layer_groups"] = [
            {"layers": [layers[i] for i in grp], "count": len(grp), "hash": lg.structural_hash[grp[0]]}
            for grp in lg.repeat_groups()]
        out["unique_layers"] = len(out["repeated_layer_groups"])
    else:
        out["repeated_layer_groups"] = []
    kinds = g.meta.get("block_kinds")
    if kinds:  # a captured model: each block stack's depth, its kinds of block, the blocks captured
        out["stacks"] = {st: {"blocks": len(k), "kinds": len(set(k)),
                              "captured": int(g.meta.get("captured_blocks", {}).get(st, len(k)))}
                         for st, k in kinds.items()}
    if g.meta.get("unmapped_ops"):  # allowed with allow_unmapped_ops: counted as element-wise ops
        out["unmapped_ops"] = list(g.meta["unmapped_ops"])
    return out


# ---------------------------------------------------------------------- bring your own model
def from_hf_config(config, *, seq: int | None = None, mbs: int = 1, tmp: int = 1, training: bool = True,
                   bytes_per_element: int = 2, capture_blocks: int = 3, fuse: bool = True,
                   allow_unmapped_ops: bool = False):
    """The ``OpGraph`` of any ``transformers`` config: a ``config.json`` path (or its directory) or
    the config as a dict. The model class comes from ``architectures`` (else ``model_type``); see
    ``archplace.workloads.byom.from_hf_config``. ``archplace graph --hf-config`` prints its summary."""
    from ..workloads.byom import from_hf_config as _from_hf_config

    return _from_hf_config(config, seq=seq, mbs=mbs, tmp=tmp, training=training,
                           bytes_per_element=bytes_per_element, capture_blocks=capture_blocks, fuse=fuse,
                           allow_unmapped_ops=allow_unmapped_ops)


def from_module(module, example_inputs, *, example_kwargs=None, layer_stack=None, tp_roles=None,
                name: str | None = None, tmp: int = 1, training: bool = True, loss: bool | None = None,
                bytes_per_element: int = 2, fuse: bool = True, allow_unmapped_ops: bool = False):
    """The ``OpGraph`` of your own ``torch.nn.Module`` called on ``example_inputs``; the block stack
    is found in the module tree where it is unambiguous (else name it: ``layer_stack="model.layers"``).
    See ``archplace.workloads.byom.from_module``; ``graph_summary(g)`` gives ``GraphResult``'s fields."""
    from ..workloads.byom import from_module as _from_module

    return _from_module(module, example_inputs, example_kwargs=example_kwargs, layer_stack=layer_stack,
                        tp_roles=tp_roles, name=name, tmp=tmp, training=training, loss=loss,
                        bytes_per_element=bytes_per_element, fuse=fuse,
                        allow_unmapped_ops=allow_unmapped_ops)


# ---------------------------------------------------------------------- graph
@dataclass(frozen=True)
class GraphRequest(Request):
    model: str                 # preset, hf:CONFIG.json, dnn-partitioning .json or archplace .parquet
    seq: int | None = None     # sequence length (None: the preset's)
    mbs: int = 1               # microbatch size
    tmp: int = 1               # tensor-model-parallel width (one slice)
    out: str | None = None     # write the graph to this Parquet file
    capture_blocks: int = 3    # leading blocks captured per stack (more where its block kinds need them)

    def validate(self) -> None:
        check_model(self.model, files=True)
        check_int("seq", self.seq, optional=True)
        check_int("mbs", self.mbs)
        check_int("tmp", self.tmp)
        check_optional_str("out", self.out)
        check_capture_blocks(self.model, self.capture_blocks)


@dataclass
class GraphResult(Result):
    model: str | None
    source: str | None
    seq: int | None
    mbs: int | None
    tmp: int | None
    ops: int
    forward_ops: int
    backward_ops: int
    edges: int
    parameters: int
    weight_bytes: int
    forward_flops: float
    backward_flops: float
    activation_bytes: int
    ops_by_core: dict[str, int]
    layers: int
    repeated_layer_groups: list[dict[str, Any]]
    unique_layers: int | None = None   # None (left out of to_dict) when ops lack layer ids
    out: str | None = None             # the Parquet file written, if any
    unmapped_ops: list[str] | None = None  # aten ops counted as element-wise (allow_unmapped_ops)
    # a captured model's block stacks: {stack: {blocks, kinds, captured}} (None for graph files)
    stacks: dict[str, dict[str, int]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        for k in ("unique_layers", "out", "unmapped_ops", "stacks"):
            if d[k] is None:
                del d[k]
        return d


def graph(req: GraphRequest, *, progress: ProgressFn | None = None,
          cancel: threading.Event | None = None) -> GraphResult:
    """The training operator graph of a model: stages ``graph``, (``write``,) ``done``."""
    req.validate()
    steps = Steps("graph", progress, cancel)
    g = load_graph(req.model, req.seq, req.mbs, req.tmp, capture_blocks=req.capture_blocks)
    res = GraphResult(**graph_summary(g))
    steps.stage("graph", ops=res.ops, edges=res.edges)
    if req.out:
        res.out = str(g.to_parquet(req.out))
        steps.stage("write", path=res.out)
    steps.done(ops=res.ops)
    return res


# ---------------------------------------------------------------------- estimate
@dataclass(frozen=True)
class EstimateRequest(Request):
    model: str                 # preset, hf:CONFIG.json, dnn-partitioning .json or archplace .parquet
    arch: str | dict           # accelerator preset, .json file, or a dict of Accelerator fields
    mbs: int = 1
    tmp: int = 1
    seq: int | None = None
    backend: str = "analytical"
    optimizer: str = "adam"    # sgd, adam, adafactor: the optimizer state in ``memory``
    capture_blocks: int = 3    # leading blocks captured per stack (more where its block kinds need them)

    def validate(self) -> None:
        from ..workloads.layers import OPTIMIZERS

        check_model(self.model, files=True)
        load_accelerator(self.arch)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_int("mbs", self.mbs)
        check_int("tmp", self.tmp)
        check_int("seq", self.seq, optional=True)
        check_choice("backend", self.backend, BACKENDS)
        check_capture_blocks(self.model, self.capture_blocks)


@dataclass
class EstimateResult(Result):
    model: str | None
    seq: int | None
    mbs: int | None
    tmp: int | None
    backend: str
    arch: dict[str, Any]
    area_mm2: float
    peak_flops: float
    totals: dict[str, Any]       # sequential_single_core_s, all_cores_s, forward_s, backward_s, ...
    ops: list[dict[str, Any]]    # one per operator: name, kind, core, pass, layer, flops, latencies
    note: str | None = None      # where the latencies come from when they are not --arch estimates
    reason: str | None = None    # why every latency is zero (None when some is not)
    # one device's training state for this slice: optimizer, weight_bytes, gradient_bytes,
    # optimizer_bytes (mixed precision, workloads.layers), activation_bytes kept for backward, total_bytes
    memory: dict[str, Any] | None = None


def _training_memory(g, optimizer: str) -> dict[str, Any]:
    """Weights, gradients, optimizer state and saved activations of one device's slice (bytes)."""
    from ..workloads.layers import optimizer_bytes_per_param

    nd = g.nodes
    fwd = ~nd["is_backward"]
    bpe = int(g.meta.get("bytes_per_element", 2) or 2)
    w = int(nd["weight_bytes"][fwd].sum())
    opt = int(w // bpe * optimizer_bytes_per_param(optimizer, bpe))
    act = int(nd["saved_bytes"][fwd].sum())
    return {"optimizer": optimizer, "weight_bytes": w, "gradient_bytes": w, "optimizer_bytes": opt,
            "activation_bytes": act, "total_bytes": 2 * w + opt + act}


def estimate(req: EstimateRequest, *, progress: ProgressFn | None = None,
             cancel: threading.Event | None = None) -> EstimateResult:
    """Per-operator latency of a model on an accelerator: stages ``graph``, ``estimate``, ``done``."""
    import numpy as np

    from ..hardware.area import accelerator_area_mm2
    from ..simulators.estimate import estimate_graph

    req.validate()
    steps = Steps("estimate", progress, cancel)
    acc = load_accelerator(req.arch)
    g = load_graph(req.model, req.seq, req.mbs, req.tmp, capture_blocks=req.capture_blocks)
    steps.stage("graph", ops=g.num_nodes)
    extra = g.extra_nodes or {}
    note = None
    if "acc_latency" in extra:
        # a profiled graph (dnn-partitioning) has measured times and no shapes: the cost model would
        # give 0 for every op, so report the measurements themselves, and say so
        from ..simulators.estimate import OpEstimates

        lat = np.asarray(extra["acc_latency"], dtype=np.float64)
        est = OpEstimates(lat, lat, "profiled")
        unsupported = int((~np.asarray(extra.get("supported_on_acc", np.ones(len(lat), bool)))).sum())
        note = ("profiled latencies: each op's measured accelerator time (the file's fpgaLatency, in the "
                "file's time unit: the *_s fields hold it unconverted), not an estimate for --arch; "
                "--arch and --backend are not used")
        if unsupported:
            note += f"; {unsupported} op(s) are not supported on the accelerator"
    else:
        est = estimate_graph(g, acc, backend=req.backend)
    steps.stage("estimate", backend=est.backend)
    nd = g.nodes
    bwd = nd["is_backward"]
    by_core = {c: float(est.single_s[nd["core"] == c].sum()) for c in np.unique(nd["core"])}
    layers = g.meta.get("layers") or []
    ops = [{"name": nd["name"][i], "kind": nd["kind"][i], "core": nd["core"][i],
            "pass": "backward" if bwd[i] else "forward",
            "layer": layers[nd["layer"][i]] if nd["layer"][i] >= 0 else None,
            "flops": float(nd["flops"][i]), "single_core_s": float(est.single_s[i]),
            "all_cores_s": float(est.all_s[i])} for i in range(g.num_nodes)]
    res = EstimateResult(
        model=g.meta.get("model"), seq=g.meta.get("seq"), mbs=g.meta.get("mbs"), tmp=g.meta.get("tmp"),
        backend=est.backend, arch=acc.to_dict(), area_mm2=accelerator_area_mm2(acc),
        peak_flops=acc.peak_flops,
        totals={"sequential_single_core_s": float(est.single_s.sum()), "all_cores_s": float(est.all_s.sum()),
                "forward_s": float(est.single_s[~bwd].sum()), "backward_s": float(est.single_s[bwd].sum()),
                "by_core_single_s": by_core, "flops": float(nd["flops"].sum())},
        ops=ops, note=note, memory=_training_memory(g, req.optimizer))
    if not (est.single_s > 0).any():
        kinds = ", ".join(f"{k} {n}" for k, n in zip(*np.unique(nd["core"], return_counts=True)))
        res.reason = ("every op's latency is 0: " + ("the graph has no ops" if g.num_nodes == 0 else
                      "the profiled latencies in the file are all 0" if note else
                      f"no op has work the cost model can time (ops by core: {kinds}; flops "
                      f"{float(nd['flops'].sum()):g})"))
    steps.done(ops=len(ops))
    return res
