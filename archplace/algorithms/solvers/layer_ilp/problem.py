"""The layer-schedule instance: ``LayerProblem`` (one layer's operator DAG, ℓ, ℓ̂ and core counts),
checked on construction, and how one is built from a graph's rows.

Kept apart from the solvers because every method (heuristics, enumeration, CP-SAT, HiGHS, the
caching and planning of a whole graph) starts from it and none of them changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ....workloads.graph import kahn_order

KIND_TC, KIND_VC, KIND_FUSED = 0, 1, 2
KIND_NAMES = ("tc", "vc", "fused")
# graph ``core`` column -> ILP kind; "comm" (TMP AllReduce) runs on the vector core (Phaze Table 3);
# "none" (shape-only, zero latency) ops are dropped with precedence kept through them.
CORE_TO_KIND = {"tensor": KIND_TC, "vector": KIND_VC, "fused": KIND_FUSED, "comm": KIND_VC}


@dataclass(frozen=True, eq=False)
class LayerProblem:
    """One layer's (or slice's) scheduling instance. Arrays are indexed by op (0..n-1).

    ``kind``: 0 TC-operator, 1 VC-operator, 2 fused operator. ``latency_s`` is ℓ (one core, or one
    fused pair), ``intra_latency_s`` is ℓ̂ (all cores of the op's type). ``edge_src``/``edge_dst``
    are data dependences (deduplicated and sorted on construction).

    ``hbm_share``/``glb_share`` (optional, in [0, 1]): the fraction of the shared HBM / GLB
    bandwidth op i draws while it runs on one core; the running single-core ops' shares must sum to
    at most 1 at every instant (``contention.py``). None (the default) is the paper's model: no
    contention, and the cache key is what it was.
    """

    kind: np.ndarray
    latency_s: np.ndarray
    intra_latency_s: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    num_tc: int
    num_vc: int
    names: tuple[str, ...] | None = None
    hbm_share: np.ndarray | None = None
    glb_share: np.ndarray | None = None

    def __post_init__(self) -> None:
        kind = np.asarray(self.kind)
        n = kind.shape[0] if kind.ndim == 1 else -1
        if kind.ndim != 1:
            raise ValueError(f"kind must be a 1-d array, got shape {kind.shape}")
        if n and not np.issubdtype(kind.dtype, np.integer):
            raise ValueError(f"kind must hold integers 0 (TC), 1 (VC), 2 (fused); got dtype {kind.dtype}")
        kind = kind.astype(np.int8)
        bad = (kind < 0) | (kind > 2)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"op {self._label(i)}: kind {kind[i]} is not 0 (TC), 1 (VC) or 2 (fused)")
        lat = {}
        for f in ("latency_s", "intra_latency_s"):
            a = np.asarray(getattr(self, f), dtype=np.float64)
            if a.shape != (n,):
                raise ValueError(f"{f} has shape {a.shape}, expected ({n},)")
            badl = ~np.isfinite(a) | (a < 0)
            if badl.any():
                i = int(np.flatnonzero(badl)[0])
                raise ValueError(f"op {self._label(i)}: {f} is {a[i]}, must be a finite number >= 0")
            lat[f] = a
        shares = {}
        for f in ("hbm_share", "glb_share"):
            v = getattr(self, f)
            if v is None:
                continue
            a = np.asarray(v, dtype=np.float64)
            if a.shape != (n,):
                raise ValueError(f"{f} has shape {a.shape}, expected ({n},)")
            bads = ~np.isfinite(a) | (a < 0) | (a > 1)
            if bads.any():
                i = int(np.flatnonzero(bads)[0])
                raise ValueError(f"op {self._label(i)}: {f} is {a[i]}, must be a finite number in [0, 1]")
            shares[f] = a
        for f in ("num_tc", "num_vc"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{f} must be an integer >= 1, got {v!r}")
        src = np.asarray(self.edge_src).astype(np.int64).ravel()
        dst = np.asarray(self.edge_dst).astype(np.int64).ravel()
        if src.shape != dst.shape:
            raise ValueError(f"edge_src has {src.size} entries but edge_dst has {dst.size}")
        if src.size:
            out = (src < 0) | (src >= n) | (dst < 0) | (dst >= n)
            if out.any():
                e = int(np.flatnonzero(out)[0])
                raise ValueError(f"edge {e} ({src[e]} -> {dst[e]}) names an op outside 0..{n - 1}")
            if (src == dst).any():
                e = int(np.flatnonzero(src == dst)[0])
                raise ValueError(f"op {self._label(int(src[e]))}: an edge to itself makes a cycle")
            pairs = np.unique(src * max(n, 1) + dst)
            src, dst = pairs // n, pairs % n
        if self.names is not None:
            names = tuple(str(s) for s in self.names)
            if len(names) != n:
                raise ValueError(f"names has {len(names)} entries, expected {n}")
            object.__setattr__(self, "names", names)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "latency_s", lat["latency_s"])
        object.__setattr__(self, "intra_latency_s", lat["intra_latency_s"])
        object.__setattr__(self, "edge_src", src)
        object.__setattr__(self, "edge_dst", dst)
        object.__setattr__(self, "num_tc", int(self.num_tc))
        object.__setattr__(self, "num_vc", int(self.num_vc))
        for f, a in shares.items():
            object.__setattr__(self, f, a)
        self._topo()  # raises on a cycle
        for a in (kind, lat["latency_s"], lat["intra_latency_s"], src, dst, *shares.values()):
            a.setflags(write=False)

    def _label(self, i: int) -> str:
        if self.names is not None and i < len(self.names):
            return f"{i} ({self.names[i]})"
        return str(i)

    # ------------------------------------------------------------------ structure
    @property
    def num_ops(self) -> int:
        return int(self.kind.shape[0])

    @property
    def num_pairs(self) -> int:
        """Fused cores: tensor core c paired with vector core c for c < min(num_tc, num_vc)."""
        return min(self.num_tc, self.num_vc)

    def _topo(self) -> np.ndarray:
        """Kahn's order, depth-first (see ``kahn_order``): ``_rank`` breaks ties in every schedule
        by it, so it must not change."""
        cached = self.__dict__.get("_topo_cache")
        if cached is not None:
            return cached
        out, stuck = kahn_order(self.num_ops, self.edge_src, self.edge_dst, depth_first=True)
        if stuck >= 0:
            raise ValueError(f"op {self._label(stuck)} lies on a cycle; a layer graph must be acyclic")
        self.__dict__["_topo_cache"] = out
        return out

    def topo_order(self) -> np.ndarray:
        return self._topo()

    def reach(self) -> np.ndarray:
        """``reach[i, j]``: ``i ≺ j`` (a path i -> j in the DAG, i ≠ j)."""
        cached = self.__dict__.get("_reach_cache")
        if cached is not None:
            return cached
        n = self.num_ops
        r = np.zeros((n, n), dtype=bool)
        succ: list[list[int]] = [[] for _ in range(n)]
        for s, d in zip(self.edge_src.tolist(), self.edge_dst.tolist()):
            succ[s].append(d)
        for u in self._topo()[::-1].tolist():
            for v in succ[u]:
                r[u, v] = True
                r[u] |= r[v]
        r.setflags(write=False)
        self.__dict__["_reach_cache"] = r
        return r

    def predecessors(self) -> list[list[int]]:
        pred: list[list[int]] = [[] for _ in range(self.num_ops)]
        for s, d in zip(self.edge_src.tolist(), self.edge_dst.tolist()):
            pred[d].append(s)
        return pred

    @property
    def has_contention(self) -> bool:
        """Whether shared-bandwidth shares are given (``contention.py``)."""
        return self.hbm_share is not None or self.glb_share is not None

    def without_contention(self) -> LayerProblem:
        """The same instance in the paper's model (no shares)."""
        if not self.has_contention:
            return self
        return LayerProblem(self.kind, self.latency_s, self.intra_latency_s, self.edge_src, self.edge_dst,
                            self.num_tc, self.num_vc, self.names)

    def horizon_s(self) -> float:
        """Big-M ``H = min(Σ ℓ̂, Σ ℓ)`` (spec §11.3)."""
        return float(min(self.intra_latency_s.sum(), self.latency_s.sum()))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_graph(cls, sub: Any, single_s: Any, all_s: Any, num_tc: int, num_vc: int,
                   hbm_share: Any = None, glb_share: Any = None) -> LayerProblem:
        """From one layer's forward or backward subgraph (an ``OpGraph``) and its per-row ℓ
        (``single_s``) and ℓ̂ (``all_s``), and optionally per-row bandwidth shares. Ops with core
        ``none`` are dropped; each dropped op's predecessors are connected to its successors
        (transitively through chains of dropped ops)."""
        n = sub.num_nodes
        single_s = np.asarray(single_s, dtype=np.float64)
        all_s = np.asarray(all_s, dtype=np.float64)
        for f, a in (("single_s", single_s), ("all_s", all_s), ("hbm_share", hbm_share),
                     ("glb_share", glb_share)):
            if a is not None and np.shape(a) != (n,):
                what = "latency" if f.endswith("_s") else "share"
                raise ValueError(f"{f} has shape {np.shape(a)}, expected ({n},): one {what} per graph row")
        src, dst = sub.edge_pos
        return _problem_from_rows(sub.nodes["core"], sub.nodes["name"], src, dst, single_s, all_s,
                                  num_tc, num_vc, sub.topo_order(), hbm_share, glb_share)


def _problem_from_rows(core: np.ndarray, names: np.ndarray, src: np.ndarray, dst: np.ndarray,
                       single_s: np.ndarray, all_s: np.ndarray, num_tc: int, num_vc: int,
                       topo: np.ndarray, hbm_share: Any = None, glb_share: Any = None) -> LayerProblem:
    """Rows 0..len(core)-1 with local edge positions ``src -> dst`` and a topological order;
    optional per-row shares (None: no contention)."""
    n = len(core)
    kind = np.full(n, -1, dtype=np.int64)
    for i, c in enumerate(core):
        if c == "none":
            continue
        if c not in CORE_TO_KIND:
            raise ValueError(f"row {i} ({names[i]}): core {c!r} unknown; allowed: "
                             f"{sorted(CORE_TO_KIND) + ['none']}")
        kind[i] = CORE_TO_KIND[c]
    keep = kind >= 0
    new = np.cumsum(keep) - 1
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
        preds[d].append(s)
    front: list[frozenset] = [frozenset()] * n  # nearest kept ancestors (itself when kept)
    es: list[int] = []
    ed: list[int] = []
    for u in np.asarray(topo).tolist():
        inc = frozenset().union(*(front[p] for p in preds[u])) if preds[u] else frozenset()
        if keep[u]:
            nu = int(new[u])
            es.extend(inc)
            ed.extend([nu] * len(inc))
            front[u] = frozenset((nu,))
        else:
            front[u] = inc
    return LayerProblem(kind[keep], single_s[keep], all_s[keep], np.asarray(es, dtype=np.int64),
                        np.asarray(ed, dtype=np.int64), num_tc, num_vc,
                        tuple(str(s) for s in np.asarray(names)[keep]),
                        None if hbm_share is None else np.asarray(hbm_share, dtype=np.float64)[keep],
                        None if glb_share is None else np.asarray(glb_share, dtype=np.float64)[keep])
