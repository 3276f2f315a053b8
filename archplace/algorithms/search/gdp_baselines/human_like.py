"""``human``: human-expert-like placements (GDP does not describe its human placements, spec §7/§11
GAP). RNN-like graphs (``family`` in ``{"rnnlm", "gnmt"}``): layer-wise round-robin, layer ``i`` on
device ``i % d``; when layer names say so, an embedding (or ``input``) layer goes with the first
recurrent layer, a softmax/loss layer with the last and an attention layer with the one after it
(GNMT: encoder and decoder layer ``i`` on device ``i``, as in Wu et al. 2016). Transformer-XL and
the others: contiguous blocks of layers balanced by compute (the largest block's compute is the
smallest possible). Ops without a layer take that of the nearest op in the topological order.
:func:`human_from_graph` reads layers and names from an ``OpGraph`` and puts every backward op on
its forward op's device. ``human(problem)`` without layers (the plain :data:`BASELINES` call) makes
every op its own layer: a compute-balanced contiguous split of the topological order. Not
memory-aware.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ....simulators.gpu_placement import PlacementProblem
from .units import _check, _units

RNN_FAMILIES = ("rnnlm", "gnmt")
_FIRST = re.compile(r"embed|^input", re.IGNORECASE)  # RNN layers that join the first recurrent layer
_LAST = re.compile(r"softmax|loss|logit|head|classifier", re.IGNORECASE)  # ... the last one
_NEXT = re.compile(r"attention|attn", re.IGNORECASE)  # ... the next one (GNMT: the decoder's bottom layer)


def _fill_layers(layer: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """Layer of every op: an op without one (-1) takes the layer of the nearest op with one in the
    topological order (by position in the order; the earlier one on a tie). No op with a layer: every
    op is its own layer, in topological order."""
    order = np.argsort(priority, kind="stable")
    lay = layer[order]
    has = lay >= 0
    if not has.any():
        out = np.empty(len(layer), np.int64)
        out[order] = np.arange(len(layer))
        return out
    pos = np.arange(len(lay))
    prev = np.maximum.accumulate(np.where(has, pos, -1))
    nxt = np.minimum.accumulate(np.where(has, pos, len(lay))[::-1])[::-1]
    dp = np.where(prev >= 0, pos - prev, np.iinfo(np.int64).max)
    dn = np.where(nxt < len(lay), nxt - pos, np.iinfo(np.int64).max)
    src = np.where(dp <= dn, prev, nxt)
    out = np.empty(len(layer), np.int64)
    out[order] = lay[src]
    return out


def _balanced_blocks(weights: np.ndarray, k: int) -> np.ndarray:
    """Block index of each item: ``k`` contiguous blocks, each non-empty, whose largest sum is the
    smallest possible (bisection on that bound, to 1e-9 relative); blocks are filled greedily up to the
    bound, each leaving at least one item for every later block."""
    L = len(weights)
    k = min(k, L)
    if k <= 1:
        return np.zeros(L, np.int64)
    S = np.concatenate([[0.0], np.cumsum(weights)])

    def cuts(T: float) -> list[int] | None:
        out, start = [], 0
        for b in range(k - 1):
            j = int(np.searchsorted(S, S[start] + T * (1 + 1e-12), side="right")) - 1
            j = min(max(j, start + 1), L - (k - 1 - b))
            if S[j] - S[start] > T * (1 + 1e-12):
                return None
            out.append(j)
            start = j
        return out if S[L] - S[start] <= T * (1 + 1e-12) else None

    lo, hi = float(np.max(weights)), float(S[L])
    for _ in range(200):
        if hi - lo <= 1e-9 * max(hi, 1e-300):
            break
        mid = 0.5 * (lo + hi)
        if cuts(mid) is None:
            lo = mid
        else:
            hi = mid
    block = np.zeros(L, np.int64)
    for c in cuts(hi) or []:
        block[c:] += 1
    return block


def human(problem: PlacementProblem, *, seed: int = 0, layer: np.ndarray | None = None,
          family: str | None = None, layer_names: Sequence[str] | None = None,
          follow: np.ndarray | None = None) -> np.ndarray:
    """Human-expert-like placement (module doc).

    ``layer``: per-op layer index (-1: none, filled by :func:`_fill_layers`; ``None``: every op is its
    own layer in topological order). ``family`` in :data:`RNN_FAMILIES`: layer-wise round-robin over the
    layers present (in index order); otherwise contiguous compute-balanced blocks. ``layer_names``
    (indexed by layer) lets an RNN's embedding (or ``input``) layer join its first recurrent layer, a
    softmax/loss/logits layer its last and an attention layer the next one (GNMT's attention feeds the
    decoder, so encoder layer ``i`` and decoder layer ``i`` share device ``i`` as in Wu et al. 2016).
    ``follow``: per-op position of an op whose device it takes (a backward op's forward op), -1 for
    none. A co-location group then goes to the device of its first op in topological order.
    """
    _check(problem)
    n, d = problem.num_nodes, problem.num_devices
    if family is not None and not isinstance(family, str):
        raise ValueError(f"family is {family!r}, expected a string or None")
    if n == 0:
        return np.zeros(0, np.int64)
    if layer is None:
        layer = np.full(n, -1, np.int64)
    layer = np.asarray(layer)
    if layer.shape != (n,) or layer.dtype.kind not in "iu":
        raise ValueError(f"layer has shape {layer.shape} and dtype {layer.dtype}, expected ({n},) integers")
    if (layer < -1).any():
        raise ValueError(f"layer[{int(np.flatnonzero(layer < -1)[0])}] is < -1")
    lay = _fill_layers(layer.astype(np.int64), problem.priority)
    ids = np.unique(lay)
    if family is not None and family.lower() in RNN_FAMILIES:
        attach: dict[int, str] = {}
        if layer_names is not None:
            if len(layer_names) <= int(ids.max()):
                raise ValueError(f"layer_names has {len(layer_names)} entries, but layer goes up to "
                                 f"{int(ids.max())}")
            for i in ids.tolist():
                name = str(layer_names[i])
                for rule, pattern in (("first", _FIRST), ("last", _LAST), ("next", _NEXT)):
                    if pattern.search(name):
                        attach[i] = rule
                        break
        body = [i for i in ids.tolist() if i not in attach]
        if not body:
            body, attach = ids.tolist(), {}
        dev_of = {i: r % d for r, i in enumerate(body)}
        for i, rule in attach.items():
            later = [j for j in body if j > i]
            j = body[0] if rule == "first" else later[0] if rule == "next" and later else body[-1]
            dev_of[i] = dev_of[j]
        lut = np.array([dev_of[int(i)] for i in ids], np.int64)
    else:
        w = np.bincount(np.searchsorted(ids, lay), weights=problem.compute_s, minlength=len(ids))
        lut = _balanced_blocks(w, d)
    dev = lut[np.searchsorted(ids, lay)]
    if follow is not None:
        follow = np.asarray(follow)
        if follow.shape != (n,) or follow.dtype.kind not in "iu" or ((follow < -1) | (follow >= n)).any():
            raise ValueError(f"follow must be ({n},) integers in -1..{n - 1}")
        f = follow >= 0
        dev = np.where(f, dev[np.where(f, follow, 0)], dev)
    unit, members = _units(problem)
    first = np.array([m[0] for m in members], np.int64)
    return dev[first][unit]


def human_from_graph(graph, problem: PlacementProblem, *, seed: int = 0,
                     family: str | None = None) -> np.ndarray:
    """:func:`human` with the layers, layer names and backward→forward map of an ``OpGraph``; the family
    is ``family``, else ``graph.meta["family"]``, else the start of ``graph.meta["model"]``."""
    if graph.num_nodes != problem.num_nodes:
        raise ValueError(f"graph has {graph.num_nodes} ops but problem has {problem.num_nodes}")
    nd = graph.nodes
    if family is None:
        family = graph.meta.get("family")
    if family is None:
        model = str(graph.meta.get("model", "")).lower()
        family = next((f for f in RNN_FAMILIES if model.startswith(f)), model or None)
    ids = nd["id"]
    order = np.argsort(ids, kind="stable")
    fwd = nd["fwd_id"]
    p = np.clip(np.searchsorted(ids[order], fwd), 0, max(len(ids) - 1, 0))
    ok = (fwd >= 0) & (ids[order][p] == fwd)
    follow = np.where(ok, order[p], -1).astype(np.int64)
    names = list(graph.meta.get("layers", [])) or None
    return human(problem, seed=seed, layer=nd["layer"].astype(np.int64), family=family, layer_names=names,
                 follow=follow)
