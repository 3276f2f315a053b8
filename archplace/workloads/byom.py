"""Bring your own model: operator graphs of any ``transformers`` config and of any ``nn.Module``.

* :func:`from_hf_config` takes a ``config.json`` (or its dict): the model class comes from its
  ``architectures`` (else the causal-LM class of its ``model_type``, else the base model), the model
  is built on the meta device (nothing downloaded, no memory for weights) with eager attention, a few
  blocks of each layer stack are captured and replicated to the configured depth, as for the presets.
* :func:`from_module` captures a module you built yourself, every block, with the layer stack found
  in the module tree (the outermost ``nn.ModuleList`` of identical parameterised modules) unless
  ``layer_stack`` names it.

The same graph comes out of ``archplace graph|estimate|place|search --hf-config config.json``: the CLI
turns the path into the model reference ``hf:/abs/path/config.json`` (:func:`hf_ref`), which every
command and Ray task resolves through ``models.preset`` and ``models.build_graph``; the references
and :class:`HfModel` live one floor down, in ``hf_config.py`` (re-exported here). Nothing here is a
silent fallback: an aten op without a cost model is an error unless allowed
(``allow_unmapped_ops``), and tensor-parallel slicing needs every block GEMM's role
(``tp_roles.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .graph import OpGraph
from .hf_config import (
    HF_PREFIX,
    HfModel,
    attention_heads,
    build_meta_model,
    find_layer_stacks,
    hf_model,
    hf_ref,
    is_hf_ref,
    make_config,
    read_config_file,
    resolve_model_class,
)
from .models import append_loss, build_graph

__all__ = ["HF_PREFIX", "HfModel", "build_meta_model", "find_layer_stacks", "from_hf_config", "from_module",
           "hf_model", "hf_ref", "is_hf_ref", "make_config", "read_config_file", "resolve_model_class"]


# ---------------------------------------------------------------------- public entry points
def from_hf_config(config: str | Path | Mapping[str, Any], *, seq: int | None = None, mbs: int = 1,
                   tmp: int = 1, training: bool = True, bytes_per_element: int = 2,
                   capture_blocks: int = 3, fuse: bool = True,
                   allow_unmapped_ops: bool = False) -> OpGraph:
    """The operator graph of a ``transformers`` config: a ``config.json`` path (or its directory), or
    the config as a dict (written to a temporary file, so that it has a reference like a file). One
    device's TMP slice of width ``tmp`` at microbatch ``mbs`` and sequence ``seq`` (default: the
    config's maximum positions, at most 2048), with the backward pass when ``training``."""
    if isinstance(config, Mapping):
        import tempfile

        text = json.dumps(dict(config), sort_keys=True)
        tmpdir = Path(tempfile.gettempdir()) / "archplace-hf-configs"
        tmpdir.mkdir(parents=True, exist_ok=True)
        path = tmpdir / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        if not path.exists():
            path.write_text(text)
        config = path
    ref = hf_ref(config, allow_unmapped_ops=allow_unmapped_ops)
    return build_graph(ref, seq=seq, mbs=mbs, tmp=tmp, training=training,
                       bytes_per_element=bytes_per_element, capture_blocks=capture_blocks, fuse=fuse)


def from_module(module, example_inputs: Any, *, example_kwargs: Mapping[str, Any] | None = None,
                layer_stack: str | Sequence[str] | None = None,
                tp_roles: str | Mapping[str, str] | None = None, name: str | None = None,
                tmp: int = 1, training: bool = True, loss: bool | None = None,
                bytes_per_element: int = 2, fuse: bool = True,
                allow_unmapped_ops: bool = False) -> OpGraph:
    """The operator graph of your own ``nn.Module`` (build it on the meta device to skip weights):
    ``example_inputs`` (a tensor or a tuple) and ``example_kwargs`` are what ``module(...)`` takes.

    ``layer_stack`` names the block stack(s) (``"model.layers"``); None finds it in the module tree
    when there is exactly one candidate, ``()`` means no stack. ``tp_roles`` is a family of
    ``tp_roles.TP_ROLES`` or your own table (weight-path suffix -> ``col``/``row``/``replicate``);
    None takes a transformers model's ``model_type``. ``loss`` appends a cross-entropy over the
    largest output (default: for a transformers model with a head, ``...For...``). Every block is
    captured (no replication); the graph's parameters must equal the module's (each parameter once),
    else an error names the layers that differ and the parameters no op reads."""
    import torch.nn as nn

    from .backward import derive_backward
    from .block_kinds import check_parameters, model_census, unread_parameters
    from .extract import capture_ops, ops_to_graph
    from .tp_roles import role_table
    from .transforms import slice_tensor_parallel

    if not isinstance(module, nn.Module):
        raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if bytes_per_element not in (1, 2, 4):
        raise ValueError(f"bytes_per_element must be 1, 2 or 4, got {bytes_per_element!r}")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    candidates = find_layer_stacks(module)
    if layer_stack is None:
        if len(candidates) != 1:
            raise ValueError(f"layer_stack: the module tree has {len(candidates)} candidate block stacks "
                             f"{[c for c, _ in candidates]}; name them (layer_stack='path' or a list), or "
                             "layer_stack=() for none")
        stacks = (candidates[0][0],)
    else:
        stacks = (layer_stack,) if isinstance(layer_stack, str) else tuple(layer_stack)
        modules = dict(module.named_modules())
        for st in stacks:
            if not isinstance(modules.get(st), (nn.ModuleList, nn.Sequential)):
                raise ValueError(f"layer_stack {st!r} is not a ModuleList in the module; candidates: "
                                 f"{[c for c, _ in candidates]}")
    cfg = getattr(module, "config", None)
    family_name = tp_roles if isinstance(tp_roles, str) else getattr(cfg, "model_type", None)
    if isinstance(tp_roles, str) and role_table(tp_roles) is None:
        from .tp_roles import known_families

        raise ValueError(f"tp_roles {tp_roles!r} is no family of the role table; known: {known_families()}")
    table = role_table(tp_roles if tp_roles is not None else family_name)
    was_training = module.training
    module.eval()
    try:
        ops, num_params, unmapped = capture_ops(module, args, dict(example_kwargs or {}), bytes_per_element,
                                                stacks=stacks, allow_unmapped_ops=allow_unmapped_ops)
    finally:
        module.train(was_training)
    first = args[0] if args else None
    shape = tuple(getattr(first, "shape", ()))
    meta = {"model": name or type(module).__name__, "source": f"nn.Module {type(module).__name__}",
            "family": family_name if not isinstance(tp_roles, Mapping) else "custom table",
            "seq": int(shape[1]) if len(shape) >= 2 else None, "mbs": int(shape[0]) if shape else None,
            "tmp": 1, "bytes_per_element": bytes_per_element, "unmapped_ops": unmapped,
            "num_parameters": int(num_params), "blocks": {st: _stack_len(module, st) for st in stacks},
            "heads": attention_heads(cfg) if cfg is not None else {}}
    g = ops_to_graph(ops, meta, fuse=fuse, roles=table)
    if loss if loss is not None else "For" in type(module).__name__:
        g = append_loss(g)
    check_parameters(g, model_census(module, stacks), meta["model"],
                     unread_parameters(module, (p for op in ops for p in op.param_paths)))
    g = slice_tensor_parallel(g, tmp)
    return derive_backward(g) if training else g


def _stack_len(module, path: str) -> int:
    return len(dict(module.named_modules())[path])
