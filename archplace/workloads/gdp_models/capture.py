"""A GDP preset's training-step ``OpGraph``: the module on the meta device, its capture, its layers and
its co-location groups (:func:`gdp_graph`).

Inception-v3 is torchvision's without the auxiliary head (:mod:`archplace.workloads.inception_v3`),
299×299 images, 94 convolutions; the other families are this package's modules.

Loss: a cross-entropy op after the logits (for WaveNet the softmax over the 256 quantised sample
values), appended like the transformer presets' (``models._append_loss``).

**Co-location groups** (``graph.extra_nodes["coloc_group"]``, int64, -1 for none). TensorFlow
colocates a variable with the ops that read it and with its gradient and update ops, and GDP counts a
placement that splits such a group as invalid (spec §2.1 and §4). In this IR a weight lives with the op the
capture attributes it to (its first reader: :func:`capture_ops` charges a parameter's bytes to one
op), so every forward op that reads a parameter, every other op reading the same parameter (an
unrolled LSTM's later time steps, a tied embedding) and all backward ops that differentiate any of them
(``fwd_id``) form one group; groups are numbered 0, 1, ... by their first reader's row. Keeping all
readers of a weight together is stricter than TensorFlow, which lets a variable's readers run elsewhere
and copies the variable to them each step: the simulator does not model those copies, so letting
readers spread would make them free.

**Layers** (``graph.meta["layers"]``): a layer is a module path up to its index in a stack of
blocks (``lstm_layers.1``, ``encoder_layers.0``, ``cells.3``, ``blocks.17``), else its top-level
module (``embedding``, ``attention``, ``Mixed_6b``, ``softmax``); ops of the root module join the
layer of their first input. A human-expert placement puts whole layers on devices.
"""

from __future__ import annotations

import functools
from dataclasses import asdict

import numpy as np
import torch
from torch import nn

from ..backward import derive_backward
from ..capture_cache import cached_graph
from ..extract import capture_ops, ops_to_graph
from ..graph import OpGraph
from ..inception_v3 import Inception3
from ..models import _append_loss
from .amoebanet import AmoebaNet
from .gnmt import GNMT
from .presets import (
    AmoebaSizes,
    GdpPreset,
    GnmtSizes,
    InceptionSizes,
    RnnlmSizes,
    TxlSizes,
    WavenetSizes,
    gdp_preset,
)
from .rnnlm import RNNLM
from .transformer_xl import TransformerXL
from .wavenet import WaveNet

BYTES_PER_ELEMENT = 4  # fp32: assumed for GDP's TensorFlow training graphs (the paper does not say)


def build_module(preset: GdpPreset, device: str = "meta") -> nn.Module:
    """The preset's model on the meta device (``device``: another one, with initialised weights, as
    ``archplace profile`` runs it), in training mode."""
    s = preset.sizes
    builders = {"rnnlm": RNNLM, "gnmt": GNMT, "txl": TransformerXL, "amoebanet": AmoebaNet,
                "wavenet": WaveNet, "inception": lambda sz: Inception3(sz.classes, aux_logits=False)}
    if preset.family not in builders:
        raise ValueError(f"preset {preset.name!r}: family {preset.family!r} is unknown; "
                         f"allowed: {sorted(builders)}")
    with torch.device(device):
        return builders[preset.family](s).train()


def example_inputs(preset: GdpPreset, batch: int) -> tuple:
    """Meta-device example inputs of the preset's model for ``batch`` examples."""
    s = preset.sizes

    def z(*shape, dtype=torch.float32):
        return torch.zeros(shape, dtype=dtype, device="meta")

    if isinstance(s, RnnlmSizes):
        st = (s.lstm_layers, batch, s.hidden_units)
        return z(batch, s.time_steps, dtype=torch.long), z(*st), z(*st)
    if isinstance(s, GnmtSizes):
        return z(batch, s.source_steps, dtype=torch.long), z(batch, s.target_steps, dtype=torch.long)
    if isinstance(s, TxlSizes):
        return (z(batch, s.segment_tokens, dtype=torch.long),
                [z(batch, s.memory_tokens, s.model_units) for _ in range(s.transformer_layers)])
    if isinstance(s, (InceptionSizes, AmoebaSizes)):
        return (z(batch, 3, s.image_px, s.image_px),)
    if isinstance(s, WavenetSizes):
        return (z(batch, s.quantization_levels, s.audio_samples),)
    raise ValueError(f"preset {preset.name!r}: no inputs for sizes {type(s).__name__}")


_STACK_SUFFIXES = ("layers", "cells", "blocks")


def _layer_key(name: str) -> str | None:
    """Layer of an op from its name ``module/node``: the module path up to the index in a block
    stack, else the top-level module; None for root-module ops and inputs."""
    if "/" not in name:
        return None
    module = name.split("/", 1)[0]
    if module == "model":  # extract names root-module ops "model/..."
        return None
    parts = module.split(".")
    for i in range(1, len(parts)):
        if parts[i].isdigit() and parts[i - 1].endswith(_STACK_SUFFIXES):
            return ".".join(parts[:i + 1])
    return parts[0]


def _assign_layers(g: OpGraph) -> OpGraph:
    """Re-layer a forward graph by module (module docstring): root-module ops join their first
    input's layer, sources without a module (the inputs) their first consumer's."""
    n = g.num_nodes
    src, dst = g.edge_pos
    keys: list[str | None] = [_layer_key(str(nm)) for nm in g.nodes["name"]]
    order = g.topo_order()
    first_in = np.full(n, -1)
    first_out = np.full(n, -1)
    for e in range(len(src) - 1, -1, -1):  # edges are sorted by source: the last write is the first
        first_out[src[e]] = dst[e]
    by_dst = np.lexsort((src, g.edges["arg"], dst))  # per destination: argument 0 first
    for e in by_dst[::-1]:
        first_in[dst[e]] = src[e]
    for u in order:
        if keys[u] is None and first_in[u] >= 0:
            keys[u] = keys[first_in[u]]
    for u in order[::-1]:
        if keys[u] is None and first_out[u] >= 0:
            keys[u] = keys[first_out[u]]
    names: list[str] = []
    index: dict[str, int] = {}
    layer = np.empty(n, dtype=np.int32)
    for u in order:
        k = keys[u] or "input"
        if k not in index:
            index[k] = len(names)
            names.append(k)
        layer[u] = index[k]
    nodes = dict(g.nodes, layer=layer)
    return OpGraph(nodes, dict(g.edges), dict(g.meta, layers=names), dict(g.extra_nodes),
                   dict(g.extra_edges))


def colocation_groups(g: OpGraph, params_read: dict[int, tuple[str, ...]] | None = None) -> np.ndarray:
    """Group per node (int64, -1 for none; module doc): the forward ops that read one parameter
    (``params_read``: forward op id -> the parameters it reads; without it, each op with
    ``weight_bytes > 0`` is its own reader set) and the backward ops whose ``fwd_id`` is one of them share
    a group; groups are numbered by their first reader's row."""
    nd = g.nodes
    ids = nd["id"]
    row_of = {int(i): r for r, i in enumerate(ids.tolist())}
    if params_read is None:
        params_read = {int(ids[r]): (f"w{r}",) for r in
                       np.flatnonzero(~nd["is_backward"] & (nd["weight_bytes"] > 0))}
    parent = list(range(g.num_nodes))  # union-find over rows

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    first_reader: dict[str, int] = {}
    readers = sorted(row_of[i] for i, ps in params_read.items() if ps and i in row_of)
    for r in readers:
        for name in params_read[int(ids[r])]:
            if name in first_reader:
                a, b = find(first_reader[name]), find(r)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                first_reader[name] = r
    group = np.full(g.num_nodes, -1, dtype=np.int64)
    root_gid: dict[int, int] = {}
    for r in readers:
        root = find(r)
        if root not in root_gid:
            root_gid[root] = len(root_gid)
        group[r] = root_gid[root]
    reader_gid = {int(ids[r]): int(group[r]) for r in readers}
    bwd = np.flatnonzero(nd["is_backward"])
    group[bwd] = np.array([reader_gid.get(int(f), -1) for f in nd["fwd_id"][bwd]], dtype=np.int64)
    return group


def _check_int(field_name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{field_name} must be an integer >= {minimum}, got {value!r}")


# Megatron roles (tp_roles.py's format) of the GEMMs these graphs have always had. GDP graphs are never
# sliced; a row GEMM stays out of a fused pair when ``fuse`` is on.
_TP_ROLES = {"txl": {"ff.fc1": "col", "ff.fc2": "row"}}


@functools.lru_cache(maxsize=16)
def _graph(name: str, batch: int, training: bool, fuse: bool) -> OpGraph:
    """:func:`_capture_graph`, kept per process and on disk across processes (``capture_cache``)."""
    identity = {"name": name, "batch": batch, "training": training, "fuse": fuse}
    return cached_graph("gdp", identity, lambda: _capture_graph(name, batch, training, fuse))


def _capture_graph(name: str, batch: int, training: bool, fuse: bool) -> OpGraph:
    p = gdp_preset(name)
    model = build_module(p)
    ops, num_params, unmapped = capture_ops(model, example_inputs(p, batch), {}, BYTES_PER_ELEMENT)
    meta = {"model": name, "family": p.family, "devices": p.devices, "batch": batch,
            "sizes": asdict(p.sizes), "source": p.source, "mbs": batch, "tmp": 1,
            "bytes_per_element": BYTES_PER_ELEMENT, "num_parameters": int(num_params),
            "unmapped_ops": unmapped}
    if isinstance(p.sizes, (RnnlmSizes, TxlSizes)):
        meta["seq"] = p.sizes.time_steps if isinstance(p.sizes, RnnlmSizes) else p.sizes.segment_tokens
    g = _assign_layers(ops_to_graph(ops, meta, fuse=fuse, roles=_TP_ROLES.get(p.family),
                                    shared_weights="first_reader"))
    # op i of the capture is node id i (ops_to_graph numbers nodes in capture order), so each node's
    # parameters are those of its op; fusing keeps the GEMM's id and drops the absorbed op's, whose
    # parameters then join no group (fuse is off for GDP by default)
    params_read = {i: op.params for i, op in enumerate(ops) if op.params}
    if training:
        g = derive_backward(_append_loss(g))
    g.extra_nodes["coloc_group"] = colocation_groups(g, params_read)
    return g


def gdp_graph(name: str, *, batch: int | None = None, training: bool = True, fuse: bool = False) -> OpGraph:
    """The operator graph of GDP preset ``name`` (see :data:`GDP_PRESETS`) for ``batch`` examples
    (the preset's by default): the training step (forward, loss, backward) when ``training``, else the
    forward pass. ``fuse`` merges each GEMM with the element-wise op after it (Phaze's fused cores);
    GDP places TensorFlow ops one by one, so it is off by default.

    Graphs are cached per arguments (capturing 8-layer GNMT takes tens of seconds): the same object
    comes back for the same arguments, so treat it as read-only."""
    p = gdp_preset(name)
    batch = p.batch_examples if batch is None else batch
    _check_int("batch", batch)
    for field_name, value in (("training", training), ("fuse", fuse)):
        if not isinstance(value, bool):
            raise ValueError(f"{field_name} must be True or False, got {value!r}")
    return _graph(name, int(batch), training, fuse)


def num_parameters(name: str) -> int:
    """Parameters of the preset's module (``nn.Module.parameters``, built on the meta device)."""
    return sum(t.numel() for t in build_module(gdp_preset(name)).parameters())
