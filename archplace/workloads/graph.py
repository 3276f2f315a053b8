"""The operator-graph IR: one column-oriented table of nodes and one of edges.

Every downstream piece (cost model, ILP, DP, RL environments) reads these columns as numpy arrays,
so an operator is a row, never a Python object. A graph validates itself on construction, so a graph
that exists is acyclic, has no dangling edge and no negative or NaN size.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .ops import CORE_CLASSES, OP_KINDS


def kahn_order(n: int, src: np.ndarray, dst: np.ndarray, *,
               depth_first: bool = False) -> tuple[np.ndarray, int]:
    """Kahn's topological order of ``n`` nodes (smallest ready node first, so deterministic) and ``-1``;
    on a cycle, the nodes ordered so far and a node on or behind the cycle.

    ``depth_first`` takes the most recently readied node first instead (the initially ready nodes
    smallest first, a node's successors in edge order and the last of them first): the order the
    layer ILP has always ranked ops by. Its schedules break ties by that rank, so keeping the order
    keeps their results (and cached schedules) unchanged."""
    import heapq
    from functools import partial

    indeg_a = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    # plain lists: the loop below touches every edge once, and numpy scalars would make it slow
    starts = np.searchsorted(src[order], np.arange(n + 1)).tolist()
    succ = dst[order].tolist()
    indeg = indeg_a.tolist()
    ready = np.flatnonzero(indeg_a == 0).tolist()
    if depth_first:
        ready.reverse()
        pop, push = ready.pop, ready.append
    else:
        heapq.heapify(ready)
        pop, push = partial(heapq.heappop, ready), partial(heapq.heappush, ready)
    out = []
    while ready:
        u = pop()
        out.append(u)
        for v in succ[starts[u]:starts[u + 1]]:
            indeg[v] -= 1
            if indeg[v] == 0:
                push(v)
    stuck = next(i for i, d in enumerate(indeg) if d > 0) if len(out) != n else -1
    return np.asarray(out, dtype=np.int64), stuck

# Node columns and their dtypes. Units: *_bytes in bytes, flops in floating-point operations
# (a multiply-add counts 2). GEMM dimensions are (batch, m, n, k) with flops = 2·b·m·n·k; zero when
# the op is not a GEMM.
NODE_COLUMNS: dict[str, Any] = {
    "id": np.int64,
    "name": object,
    "kind": object,
    "core": object,
    "is_backward": np.bool_,
    "layer": np.int32,  # index into meta["layers"]; -1 when the op belongs to no layer
    "gemm_b": np.int64,
    "gemm_m": np.int64,
    "gemm_n": np.int64,
    "gemm_k": np.int64,
    "flops": np.float64,  # all arithmetic of the op
    "vector_flops": np.float64,  # the part of `flops` that runs on vector lanes
    "input_bytes": np.int64,  # activations read (weights excluded)
    "output_bytes": np.int64,
    "weight_bytes": np.int64,  # parameters read
    "saved_bytes": np.int64,  # activations the forward op keeps for its backward pass
    "fwd_id": np.int64,  # for a backward op: the forward op it differentiates; -1 otherwise
    "tp_role": object,  # Megatron role: "" replicated, "col", "row", "shard", "vocab" (split by vocabulary)
}
EDGE_COLUMNS: dict[str, Any] = {"src": np.int64, "dst": np.int64, "bytes": np.int64, "arg": np.int16}

_SIZE_COLUMNS = ("gemm_b", "gemm_m", "gemm_n", "gemm_k", "flops", "vector_flops", "input_bytes",
                 "output_bytes", "weight_bytes", "saved_bytes")
_TP_ROLES = ("", "col", "row", "shard", "vocab")
_PARQUET_META_KEY = b"archplace.opgraph"


def shared_extra_bytes(meta: dict[str, Any]) -> int:
    """Bytes counted more than once in the forward ops' ``weight_bytes``: a parameter that several
    layers read (a tied embedding and LM head) is held by one op in each of them
    (``meta["shared_params"]``, per device), so subtracting this counts every parameter once."""
    return int(sum(int(p["bytes"]) * (len(p["layers"]) - 1) for p in meta.get("shared_params") or ()))


def _json_default(x: Any) -> Any:
    """numpy scalars and arrays in ``meta`` travel as their Python values, not as strings."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def _column(values: Any, dtype: Any, n: int, name: str) -> np.ndarray:
    if values is None:
        if dtype is object:
            return np.full(n, "", dtype=object)
        return np.full(n, -1 if name in ("fwd_id", "layer") else 0, dtype=dtype)
    arr = np.asarray(values)
    if dtype is object:
        arr = arr.astype(object)
    elif np.issubdtype(np.dtype(dtype), np.integer) and arr.dtype.kind == "f":
        if np.isnan(arr).any():
            bad = int(np.flatnonzero(np.isnan(arr))[0])
            raise ValueError(f"row {bad}: field {name!r} is NaN")
        arr = np.rint(arr).astype(dtype)
    else:
        arr = arr.astype(dtype)
    if arr.shape != (n,):
        raise ValueError(f"column {name!r} has shape {arr.shape}, expected ({n},)")
    return arr


@dataclass(eq=False)
class OpGraph:
    """A DAG of operators. ``nodes`` and ``edges`` map column names to equal-length arrays.

    ``extra_nodes`` / ``extra_edges`` hold source-specific columns (profiled latencies of the
    dnn-partitioning format, for instance) that travel with the graph through Parquet.
    ``meta`` is JSON-serialisable: model name, sequence length, microbatch, TMP width, layer names.
    """

    nodes: dict[str, np.ndarray]
    edges: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    extra_nodes: dict[str, np.ndarray] = field(default_factory=dict)
    extra_edges: dict[str, np.ndarray] = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_columns(cls, nodes: dict[str, Any], edges: dict[str, Any] | None = None,
                     meta: dict[str, Any] | None = None, extra_nodes: dict[str, Any] | None = None,
                     extra_edges: dict[str, Any] | None = None) -> OpGraph:
        """Build from partial columns; missing ones get their defaults (0, -1 or "")."""
        unknown = set(nodes) - set(NODE_COLUMNS)
        if unknown:
            raise ValueError(f"unknown node columns {sorted(unknown)}; allowed: {list(NODE_COLUMNS)}")
        if "id" not in nodes or "kind" not in nodes:
            raise ValueError("node columns 'id' and 'kind' are required")
        n = len(nodes["id"])
        ncols = {c: _column(nodes.get(c), t, n, c) for c, t in NODE_COLUMNS.items()}
        if "name" not in nodes:
            ncols["name"] = np.array([f"op{i}" for i in ncols["id"]], dtype=object)
        if "core" not in nodes:
            ncols["core"] = np.array([OP_KINDS[k].core if k in OP_KINDS else "" for k in ncols["kind"]],
                                     dtype=object)
        edges = edges or {}
        unknown = set(edges) - set(EDGE_COLUMNS)
        if unknown:
            raise ValueError(f"unknown edge columns {sorted(unknown)}; allowed: {list(EDGE_COLUMNS)}")
        m = len(edges.get("src", []))
        ecols = {c: _column(edges.get(c), t, m, c) for c, t in EDGE_COLUMNS.items()}
        if "arg" not in edges:
            ecols["arg"] = np.zeros(m, dtype=np.int16)
        xn = {k: np.asarray(v) for k, v in (extra_nodes or {}).items()}
        xe = {k: np.asarray(v) for k, v in (extra_edges or {}).items()}
        return cls(ncols, ecols, dict(meta or {}), xn, xe)

    def __post_init__(self) -> None:
        self._check_ids()
        self._sort_edges()
        self.validate()

    def _check_ids(self) -> None:
        uniq, counts = np.unique(self.nodes["id"], return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"node {uniq[counts > 1][0]}: field 'id' is not unique")

    def _sort_edges(self) -> None:
        """Canonical edge order (by source then destination position) makes equality and hashing
        independent of insertion order."""
        if not len(self.edges["src"]):
            return
        pos = self._positions()
        order = np.lexsort((pos[1], pos[0]))
        if np.any(order != np.arange(len(order))):
            self.edges = {k: v[order] for k, v in self.edges.items()}
            self.extra_edges = {k: v[order] for k, v in self.extra_edges.items()}
        self._pos = None

    # ------------------------------------------------------------------ validation
    def _positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Row positions of each edge's endpoints; raises on a dangling edge."""
        ids = self.nodes["id"]
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        out = []
        for end in ("src", "dst"):
            e = self.edges[end]
            p = np.searchsorted(sorted_ids, e)
            p = np.clip(p, 0, max(len(ids) - 1, 0))
            ok = (sorted_ids[p] == e) if len(ids) else np.zeros(len(e), bool)
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                raise ValueError(f"edge {i} ({self.edges['src'][i]} -> {self.edges['dst'][i]}): "
                                 f"field {end!r} names node {e[i]}, which does not exist (dangling edge)")
            out.append(order[p])
        return out[0], out[1]

    def validate(self) -> None:
        """Raise ``ValueError`` naming the node (or edge) and the field at fault."""
        n = self.num_nodes
        for k, v in self.extra_nodes.items():
            if len(v) != n:
                raise ValueError(f"extra node column {k!r} has {len(v)} rows, expected {n}")
        for k, v in self.extra_edges.items():
            if len(v) != self.num_edges:
                raise ValueError(f"extra edge column {k!r} has {len(v)} rows, expected {self.num_edges}")
        self._check_ids()
        ids = self.nodes["id"]
        for col in _SIZE_COLUMNS:
            a = self.nodes[col]
            bad = np.isnan(a) | (a < 0) if a.dtype.kind == "f" else a < 0
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"node {ids[i]} ({self.nodes['name'][i]}): field {col!r} is "
                                 f"{a[i]}, must be a non-negative number")
        for i, k in enumerate(self.nodes["kind"]):
            if k not in OP_KINDS:
                raise ValueError(f"node {ids[i]} ({self.nodes['name'][i]}): field 'kind' is {k!r}; "
                                 f"allowed: {sorted(OP_KINDS)}")
        for i, c in enumerate(self.nodes["core"]):
            if c not in CORE_CLASSES:
                raise ValueError(f"node {ids[i]} ({self.nodes['name'][i]}): field 'core' is {c!r}; "
                                 f"allowed: {list(CORE_CLASSES)}")
        for i, r in enumerate(self.nodes["tp_role"]):
            if r not in _TP_ROLES:
                raise ValueError(f"node {ids[i]}: field 'tp_role' is {r!r}; allowed: {list(_TP_ROLES)}")
        nl = len(self.meta.get("layers", []))
        layer = self.nodes["layer"]
        bad = (layer < -1) | (layer >= max(nl, 0)) if nl else layer > -1
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"node {ids[i]}: field 'layer' is {layer[i]}, but the graph has {nl} layers")
        eb = self.edges["bytes"]
        if (eb < 0).any():
            i = int(np.flatnonzero(eb < 0)[0])
            raise ValueError(f"edge {i} ({self.edges['src'][i]} -> {self.edges['dst'][i]}): "
                             f"field 'bytes' is {eb[i]}, must be non-negative")
        src, dst = self._positions()
        if (src == dst).any():
            i = int(np.flatnonzero(src == dst)[0])
            raise ValueError(f"node {ids[src[i]]}: an edge from the node to itself makes a cycle")
        self._pos = (src, dst)
        self.topo_order()  # raises on a cycle

    # ------------------------------------------------------------------ structure
    @property
    def num_nodes(self) -> int:
        return len(self.nodes["id"])

    @property
    def num_edges(self) -> int:
        return len(self.edges["src"])

    @property
    def edge_pos(self) -> tuple[np.ndarray, np.ndarray]:
        """(source row, destination row) of every edge."""
        if getattr(self, "_pos", None) is None:
            self._pos = self._positions()
        return self._pos

    def topo_order(self) -> np.ndarray:
        """Row positions in a topological order (Kahn, smallest row first); raises on a cycle."""
        cached = getattr(self, "_topo", None)
        if cached is not None and getattr(self, "_topo_key", None) == self.num_edges:
            return cached
        src, dst = self.edge_pos
        order, stuck = kahn_order(self.num_nodes, src, dst)
        if stuck >= 0:
            raise ValueError(f"node {self.nodes['id'][stuck]} ({self.nodes['name'][stuck]}): "
                             "lies on a cycle; an operator graph must be acyclic")
        self._topo = order
        self._topo_key = self.num_edges
        return self._topo

    def subgraph(self, mask: np.ndarray, meta: dict[str, Any] | None = None) -> OpGraph:
        """The induced subgraph on the rows where ``mask`` is true (edges inside it only)."""
        mask = np.asarray(mask, dtype=bool)
        src, dst = self.edge_pos
        emask = mask[src] & mask[dst]
        return OpGraph({k: v[mask] for k, v in self.nodes.items()},
                       {k: v[emask] for k, v in self.edges.items()},
                       dict(self.meta if meta is None else meta),
                       {k: v[mask] for k, v in self.extra_nodes.items()},
                       {k: v[emask] for k, v in self.extra_edges.items()})

    def forward(self) -> OpGraph:
        return self.subgraph(~self.nodes["is_backward"])

    def backward(self) -> OpGraph:
        return self.subgraph(self.nodes["is_backward"])

    # ------------------------------------------------------------------ summaries
    def totals(self) -> dict[str, float]:
        fwd = ~self.nodes["is_backward"]
        return {
            "ops": int(self.num_nodes),
            "forward_ops": int(fwd.sum()),
            "backward_ops": int((~fwd).sum()),
            "edges": int(self.num_edges),
            "forward_flops": float(self.nodes["flops"][fwd].sum()),
            "backward_flops": float(self.nodes["flops"][~fwd].sum()),
            # every parameter once, although each layer reading a tied weight holds a copy
            "weight_bytes": int(self.nodes["weight_bytes"][fwd].sum()) - shared_extra_bytes(self.meta),
            "activation_bytes": int(self.nodes["saved_bytes"][fwd].sum()),
        }

    def content_hash(self) -> str:
        """Hash of every column and the metadata: equal graphs hash equal."""
        h = hashlib.blake2b(digest_size=16)
        for cols in (self.nodes, self.edges, self.extra_nodes, self.extra_edges):
            for k in sorted(cols):
                h.update(k.encode())
                v = cols[k]
                h.update("\x1f".join(map(str, v)).encode() if v.dtype == object else
                         np.ascontiguousarray(v).tobytes())
        h.update(json.dumps(self.meta, sort_keys=True, default=_json_default).encode())
        return h.hexdigest()

    def equals(self, other: OpGraph) -> bool:
        def same(a: dict, b: dict) -> bool:
            return a.keys() == b.keys() and all(
                a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f")
                for k in a)
        return (same(self.nodes, other.nodes) and same(self.edges, other.edges)
                and same(self.extra_nodes, other.extra_nodes)
                and same(self.extra_edges, other.extra_edges)
                and json.loads(json.dumps(self.meta, default=_json_default)) ==
                json.loads(json.dumps(other.meta, default=_json_default)))

    def __repr__(self) -> str:
        return (f"OpGraph({self.meta.get('model', '?')}: {self.num_nodes} ops, "
                f"{self.num_edges} edges, {len(self.meta.get('layers', []))} layers)")

    # ------------------------------------------------------------------ Parquet
    def to_arrow(self):
        """One Arrow table, a row per node; each node's out-edges are list columns, so edges travel
        in the same file; ``meta`` rides in the schema metadata."""
        import pyarrow as pa

        src, dst = self.edge_pos
        n = self.num_nodes
        offsets = np.searchsorted(src, np.arange(n + 1)).astype(np.int32)  # edges sorted by src
        cols: dict[str, Any] = {}
        for k, v in self.nodes.items():
            cols[k] = pa.array(v.tolist() if v.dtype == object else v, type=pa.string()
                               if v.dtype == object else None)
        for k, v in self.edges.items():
            if k != "src":
                cols[f"out_{k}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(v))
        for k, v in self.extra_nodes.items():
            cols[f"x_{k}"] = pa.array(v)
        for k, v in self.extra_edges.items():
            cols[f"out_x_{k}"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(v))
        table = pa.table(cols)
        meta = json.dumps({"meta": self.meta, "version": 1}, default=_json_default)
        return table.replace_schema_metadata({_PARQUET_META_KEY: meta.encode()})

    @classmethod
    def from_arrow(cls, table) -> OpGraph:
        raw = (table.schema.metadata or {}).get(_PARQUET_META_KEY)
        if raw is None:
            raise ValueError("not an archplace operator graph: Parquet metadata key "
                             f"{_PARQUET_META_KEY.decode()!r} is missing")
        meta = json.loads(raw)["meta"]
        nodes = {k: table.column(k).to_numpy(zero_copy_only=False) for k in NODE_COLUMNS}
        nodes = {k: (v.astype(object) if NODE_COLUMNS[k] is object else v.astype(NODE_COLUMNS[k]))
                 for k, v in nodes.items()}
        lists = {}
        for name in table.column_names:
            if name.startswith("out_"):
                col = table.column(name).combine_chunks()
                lists[name] = col
        dst_list = lists["out_dst"]
        counts = np.diff(dst_list.offsets.to_numpy())
        edges = {"src": np.repeat(nodes["id"], counts)}
        for name, col in lists.items():
            key = name[4:]
            if not key.startswith("x_"):
                edges[key] = col.flatten().to_numpy().astype(EDGE_COLUMNS[key])
        extra_nodes = {k[2:]: table.column(k).to_numpy(zero_copy_only=False)
                       for k in table.column_names if k.startswith("x_")}
        extra_edges = {k[6:]: col.flatten().to_numpy(zero_copy_only=False)
                       for k, col in lists.items() if k.startswith("out_x_")}
        return cls(nodes, edges, meta, extra_nodes, extra_edges)

    def to_parquet(self, path: str | Path) -> Path:
        import pyarrow.parquet as pq

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(self.to_arrow(), path)
        return path

    @classmethod
    def from_parquet(cls, path: str | Path) -> OpGraph:
        import pyarrow.parquet as pq

        return cls.from_arrow(pq.read_table(path))
