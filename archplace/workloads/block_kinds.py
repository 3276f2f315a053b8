"""Block kinds of a layer stack, how many leading blocks a capture must hold, and the parameter check.

A stack whose blocks all look alike is captured a few blocks deep and its last block repeated. A
heterogeneous stack has several *kinds* of block: dense layers then mixture-of-experts layers
(Qwen2-MoE's ``mlp_only_layers`` and ``decoder_sparse_step``, DeepSeek's ``first_k_dense_replace``),
sliding and global attention in turn (Gemma-2/3, ``layer_types``), layers without rotary embeddings
(``no_rope_layers``). Replicating block 2 of such a stack drops or multiplies the wrong layers, so:

* :func:`model_census` reads the full model (built on the meta device): each block's kind (its class,
  its parameters' names and shapes, its submodules' classes, the per-layer attention attributes such
  as ``attention_type`` and ``sliding_window``, and the config's per-layer lists at its index) and
  each block's parameter count, every parameter counted once as ``transformers`` counts it.
* :func:`capture_depths` chooses how many leading blocks of each stack to capture: at least
  ``capture_blocks``, and enough that every pair (kind of block p-1, kind of block p) of the full
  stack occurs at a captured position >= 2 (the template ``stack_expand.expand_stack`` copies, chained
  to the block before it), and that the last captured block has the kind of the stack's last block
  (its outputs feed the head).
* :func:`truncate_stacks` cuts the full model's stacks to those leading blocks, so that the captured
  blocks are the full model's own (a config reduced in depth can build other kinds, or resize
  parameters outside the blocks); the config keeps its depth.
* :func:`check_parameters` compares the full-depth graph's parameters with the model's own count; a
  difference is an error naming the layers that differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# attributes of a block's modules that make one layer's attention differ from another's
_KIND_ATTRS = ("attention_type", "layer_type", "is_sliding", "sliding_window", "is_local_attention",
               "use_rope", "use_sliding_window")
_NOT_PER_LAYER = frozenset({"architectures"})


@dataclass(frozen=True)
class StackCensus:
    """One block stack of the full model."""

    kinds: tuple[int, ...]          # each block's kind, numbered in order of first appearance
    # a parameter of a block is also another block's or the model's (Zamba's shared transformer): which
    # one a copy would read is not in the blocks' structure, so every block is captured
    shares_parameters: bool
    block_params: tuple[int, ...]   # parameters of each block (a shared parameter counts in its first)

    @property
    def depth(self) -> int:
        return len(self.kinds)


@dataclass(frozen=True)
class Census:
    stacks: dict[str, StackCensus]
    other_params: int               # parameters outside every block (embeddings, final norm, head)
    total_params: int               # transformers' num_parameters(): each parameter once


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _hashable(x)) for k, x in v.items()))
    return v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)


def _per_layer_lists(config, depth: int) -> list[tuple[str, Any]]:
    """The config's fields with one entry per layer of a ``depth``-deep stack (``layer_types``)."""
    if config is None or depth < 2 or not hasattr(config, "to_dict"):
        return []
    return [(k, v) for k, v in config.to_dict().items()
            if isinstance(v, (list, tuple)) and len(v) == depth and k not in _NOT_PER_LAYER]


def _block_signature(block, index: int, lists: list[tuple[str, Any]]) -> tuple:
    params = tuple((n, tuple(p.shape)) for n, p in block.named_parameters())
    mods = tuple((n, type(m).__name__) for n, m in block.named_modules())
    attrs = tuple((n, a, _hashable(m.__dict__[a])) for n, m in block.named_modules() for a in _KIND_ATTRS
                  if a in m.__dict__)
    per_layer = tuple((k, _hashable(v[index])) for k, v in lists)
    return (type(block).__name__, params, mods, attrs, per_layer)


def _block_index(name: str, stacks: Sequence[str]) -> tuple[str, int] | None:
    """(stack, i) when parameter path ``name`` lies in block i of one of ``stacks`` (longest first)."""
    for st in stacks:
        if name.startswith(st + "."):
            head = name[len(st) + 1:].split(".", 1)[0]
            if head.isdigit():
                return st, int(head)
    return None


def model_census(model, stacks: Iterable[str]) -> Census:
    """Kinds and parameter counts of ``model``'s block ``stacks`` (module paths of ``ModuleList``s)."""
    modules = dict(model.named_modules())
    stacks = list(stacks)
    config = getattr(model, "config", None)
    counts = {st: [0] * len(modules[st]) for st in stacks}
    other = total = 0
    longest_first = sorted(stacks, key=len, reverse=True)
    for name, p in model.named_parameters():  # each parameter once, under its first name
        n = p.numel()
        total += n
        at = _block_index(name, longest_first)
        if at is None:
            other += n
        else:
            counts[at[0]][at[1]] += n
    owners: dict[int, set] = {}  # parameter -> the (stack, block) or "" of each of its names
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), set()).add(_block_index(name, longest_first) or "")
    out = {}
    for st in stacks:
        shares = any(len(o) > 1 and any(b and b[0] == st for b in o) for o in owners.values())
        blocks = list(modules[st])
        lists = _per_layer_lists(config, len(blocks))
        seen: dict[tuple, int] = {}
        kinds = [seen.setdefault(_block_signature(b, i, lists), len(seen)) for i, b in enumerate(blocks)]
        out[st] = StackCensus(tuple(kinds), shares, tuple(counts[st]))
    return Census(out, other, total)


# ---------------------------------------------------------------------- how deep to capture
def covers(kinds: Sequence[int], n: int) -> bool:
    """Whether capturing the first ``n`` blocks lets the rest of the stack be built by copying."""
    depth = len(kinds)
    if n >= depth:
        return True
    if n < 3 or kinds[n - 1] != kinds[-1]:
        return False
    have = {(kinds[j - 1], kinds[j]) for j in range(2, n)}
    return all((kinds[p - 1], kinds[p]) in have for p in range(n, depth))


def capture_depth(kinds: Sequence[int], at_least: int) -> int:
    """The fewest leading blocks (at least ``at_least``, at most all) that :func:`covers` the stack."""
    n = min(at_least, len(kinds))
    while not covers(kinds, n):
        n += 1
    return n


def capture_depths(census: Census, at_least: int, reducible: Iterable[str]) -> dict[str, int]:
    """Blocks to capture per stack: :func:`capture_depth` for the ``reducible`` stacks (those a config
    depth field sizes) whose blocks share no parameter, every block of the others."""
    reducible = set(reducible)
    return {st: capture_depth(c.kinds, at_least) if st in reducible and not c.shares_parameters else c.depth
            for st, c in census.stacks.items()}


def truncate_stacks(model, depths: Mapping[str, int]) -> None:
    """Keep the first ``depths[stack]`` blocks of each stack of ``model`` (in place). The config keeps
    its full depth: transformers' layer loops run over the ``ModuleList`` (``self.layers[:
    config.num_hidden_layers]``), so the kept blocks run, while per-layer lists (``layer_types``) and
    tensors sized by the depth (Gemma-3n's per-layer inputs) keep their full size and indices."""
    import torch.nn as nn

    modules = dict(model.named_modules())
    for st, k in depths.items():
        blocks = modules[st]
        if k < len(blocks):
            parent_path, _, attr = st.rpartition(".")
            parent = modules[parent_path] if parent_path else model
            setattr(parent, attr, nn.ModuleList(list(blocks)[:k]))


# ---------------------------------------------------------------------- the parameter check
def unread_parameters(model, read_paths: Iterable[str]) -> list[str]:
    """The parameters of ``model`` (each once, under its first name) that no captured op reads;
    ``read_paths`` are the paths the ops read them by (a tied weight under either of its names)."""
    by_name = dict(model.named_parameters(remove_duplicate=False))
    read = {id(by_name[p]) for p in read_paths if p in by_name}
    return [n for n, p in model.named_parameters() if id(p) not in read]


class ParameterMismatchError(ValueError):
    """A captured graph whose parameter count differs from the model's (``graph_params`` vs
    ``model_params``)."""

    def __init__(self, message: str, graph_params: int, model_params: int):
        super().__init__(message)
        self.graph_params = graph_params
        self.model_params = model_params


def check_parameters(g, census: Census, model: str, unread: Sequence[str] = ()) -> None:
    """The forward graph's parameters (weight bytes / bytes per element) must equal the model's own
    count; otherwise a one-line error naming the layers whose counts differ (graph vs model) and the
    parameters no captured op reads."""
    import numpy as np

    from .graph import shared_extra_bytes

    nd = g.nodes
    fwd = ~nd["is_backward"]
    bpe = int(g.meta.get("bytes_per_element", 2))
    # a tied parameter (embedding and LM head) is held by an op in each layer that reads it: once here
    total = (int(nd["weight_bytes"][fwd].sum()) - shared_extra_bytes(g.meta)) // bpe
    if total == census.total_params:
        return
    names = list(g.meta.get("layers") or [])
    layer = nd["layer"][fwd]
    ok = layer >= 0
    per_layer = np.bincount(layer[ok], weights=nd["weight_bytes"][fwd][ok], minlength=len(names)) // bpe
    index = {n: i for i, n in enumerate(names)}
    diffs: list[str] = []
    in_blocks = 0
    for st, c in census.stacks.items():
        for i, want in enumerate(c.block_params):
            li = index.get(f"{st}.{i}")
            got = int(per_layer[li]) if li is not None else 0
            in_blocks += got
            if got != want:
                where = "" if li is not None else " (not in the graph)"
                diffs.append(f"{st}.{i} {got:,} vs {want:,}{where}")
    other = total - in_blocks
    if other != census.other_params:
        diffs.append(f"outside the blocks {other:,} vs {census.other_params:,}")
    shown = ", ".join(diffs[:6]) + (f" (and {len(diffs) - 6} more)" if len(diffs) > 6 else "")
    never = (f"; parameters no op reads: {', '.join(unread[:3])}"
             f"{f' (and {len(unread) - 3} more)' if len(unread) > 3 else ''}") if unread else ""
    raise ParameterMismatchError(
        f"model {model!r}: the captured graph holds {total:,} parameters, the model {census.total_params:,} "
        f"(each parameter once, as transformers counts); layers that differ (graph vs model): "
        f"{shown or 'none'}{never}",
        total, census.total_params)
