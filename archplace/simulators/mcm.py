"""The multi-chip-module (MCM) partition evaluator: constraints and the analytical cost model of the MCM
paper (spec ``mcm.md``), vectorised over a batch of partitions.

A problem is a DAG of N ops and C <= 64 chips on a uni-directional ring (chip d sends only to d+1). A
partition ``f`` gives every op a chip in ``[0, C)``; a batch is an int array ``[B, N]``.

Static constraints (paper Eqs. 2-4):

- **eq2** acyclic dataflow: ``f[src] <= f[dst]`` for every edge.
- **eq3** no skipped chips: the used chips are exactly ``{0, ..., max f}``.
- **eq4** chip triangle dependency: in the chip graph ``A = {(f[u], f[v]) : (u, v) in E, f[u] < f[v]}``
  no direct edge ``a -> b`` may coexist with a path ``a -> k -> ... -> b`` of length >= 2. With one
  uint64 bitmask per chip, ``R[a] = A[a] | R2[a]`` and ``R2[a] = OR_{k in A[a]} R[k]`` for ``a = C-1 ... 0``
  (chips reachable by paths of length >= 1 and >= 2); violated iff ``A[a] & R2[a] != 0`` for some a.
  Only forward chip edges enter A, so eq4 is also defined (on the forward part) for a partition that
  breaks eq2.

Cost model (the "analytical cost model"), per chip d:

- compute_d = sum of ``time_s`` of the ops on d;
- op u's output travels the ring once, from f[u] to ``m(u) = max(f[u], max_{v in succ(u)} f[v])``:
  link l (chip l -> l+1) carries ``out_bytes[u]`` for every u with ``f[u] <= l < m(u)`` (one send per
  destination span, whatever the number of consumers on the way); link_d = bytes on link d / link_bw;
- chip latency ``L_d = compute_d + link_d``; throughput ``T = 1 / max_d L_d`` samples/s, 0 when the
  partition is invalid (static constraints or memory).

Memory, the dynamic constraint H: ops run in one fixed topological order ``topo`` (position
``pos[u]``). On chip d the weights of its ops stay resident. Op u's output is live on its own chip
``f[u]`` over positions ``[pos[u], max(pos[u], last pos of a successor on f[u])]`` (an output with no
consumer on its chip still occupies it at its own step), and on each other chip b that holds a
successor over ``[pos[u], last pos of a successor on b]`` (both ends inclusive; chips that only forward
the tensor along the ring hold nothing). ``peak_d = resident_d + max_p live_d(p)``; the partition is
invalid when some ``peak_d > sram_bytes``. Activations are counted in whole bytes (a fractional
``out_bytes`` rounds up), which keeps the position scan exact and in fast integer arithmetic.

Vectorisation: every check is numpy over the batch, in chunks of ``_CHUNK_ROWS`` rows so memory stays
bounded; the only Python loops on the hot path run over the C chips (``greedy_partition`` and
``check`` loop over ops, once per problem or per reported partition). The live intervals come from
one row-wise sort of ``(op, chip, end)`` keys: the last key of each (op, chip) run holds the interval's
end, and the last key of each op holds its farthest chip m(u), which the link model reuses. The
intervals then go into a difference array ``[rows, C, N+1]`` (a reused int32 buffer, int64 when the
activations total 2 GiB or more) that one cumulative sum turns into live bytes per position. Measured
by ``bench/mcm/mcm_eval.py``.

API: ``MCMProblem`` (``from_graph``, ``from_arrays``), ``static_violations``, ``static_valid``,
``memory_peak_bytes``, ``memory_valid``, ``chip_latency_s``, ``evaluate`` -> ``EvalResult``,
``throughput``, ``check``, ``greedy_partition``. A partition may be ``[N]`` (a batch of one: results
still have a leading axis of length 1) or ``[B, N]``.

``MCMProblem.from_graph`` keeps every op of the graph, including the zero-cost ``core == "none"``
shape ops (``view``, ``input``, ...): dropping them would mean re-wiring their producers to their
consumers (duplicate edges, a changed chip graph for eq4, and their output tensors would vanish from
the communication model), while keeping them costs only a few zero-time nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..hardware.accelerator import Accelerator
from ..hardware.presets import MCM_LINK_BW_BYTES_PER_S, Cluster, mcm_package
from ..workloads.graph import OpGraph, kahn_order

MAX_CHIPS = 64  # one uint64 bitmask per chip in the eq4 check
MB = float(2**20)
DEFAULT_SRAM_BYTES = 32.0 * MB
# Batches run in chunks of _CHUNK_ROWS rows; within a chunk the memory scan runs over a reused
# [rows, C, N+1] integer buffer of about _MEM_ELEMENTS elements (a fresh large array per pass costs
# more in page faults than the scan itself).
_CHUNK_ROWS = 64
_MEM_ELEMENTS = 1 << 21
_MAX_LISTED = 10  # check(): eq2 edges listed one by one before "... and k more"


def _array(value: Any, dtype: Any, name: str) -> np.ndarray:
    try:
        arr = np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"MCMProblem field {name!r}: cannot convert to {np.dtype(dtype)} ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"MCMProblem field {name!r} must be one-dimensional, got shape {arr.shape}")
    arr.setflags(write=False)
    return arr


def _int_array(value: Any, name: str) -> np.ndarray:
    raw = np.asarray(value)
    if raw.size and raw.dtype.kind not in "iu":
        if raw.dtype.kind == "f" and np.all(np.isfinite(raw)) and np.all(raw == np.rint(raw)):
            raw = raw.astype(np.int64)
        else:
            raise ValueError(f"MCMProblem field {name!r} must hold integers, got dtype {raw.dtype}")
    return _array(raw, np.int64, name)


@dataclass(frozen=True)
class _Pre:
    """Structures derived once per problem for the vectorised kernels."""

    pos: np.ndarray  # [N] position of each op in topo
    # ops with at least one successor, and all successors in CSR order (by source, then position)
    has_succ: np.ndarray  # [H] op ids
    succ_starts: np.ndarray  # [H] reduceat starts into succ_dst
    succ_dst: np.ndarray  # [E]
    # Live-memory entries: per op u one virtual entry (u's own chip, ending at pos[u]) then one per
    # out-edge (the consumer's chip, ending at its position), op-major. The row-wise sort of the keys
    # (u, chip, end) keeps every op's entries in the same columns, so per-column data stays static.
    ent_chip_node: np.ndarray  # [N+E] op whose chip the entry lives on
    ent_key_static: np.ndarray  # [N+E] (u << (cb+nb)) | end position
    ent_bytes: np.ndarray  # [N+E] out_bytes of u in whole bytes (rounded up), live_dtype
    ent_start: np.ndarray  # [N+E] pos[u]
    grp_last: np.ndarray  # [N] column of op u's last sorted entry: the farthest chip, m(u)
    live_dtype: Any  # int32 when the total activation bytes fit, else int64
    key_dtype: Any  # int32 when the keys fit in 31 bits, else int64
    nb: int  # bits of a position
    cb: int  # bits of a chip id


@dataclass(frozen=True, eq=False)
class MCMProblem:
    """One partitioning instance: a DAG (edges ``src[e] -> dst[e]`` over ops ``0..N-1``) with per-op
    ``time_s`` (seconds on one chip), ``out_bytes`` and ``weight_bytes``, a topological order ``topo``
    (the execution order of the memory model), ``num_chips`` chips on a uni-directional ring with links
    of ``link_bw_bytes_per_s`` and ``sram_bytes`` of memory each. Arrays are copied and read-only."""

    num_chips: int
    src: np.ndarray
    dst: np.ndarray
    time_s: np.ndarray
    out_bytes: np.ndarray
    weight_bytes: np.ndarray
    topo: np.ndarray
    link_bw_bytes_per_s: float
    sram_bytes: float
    names: tuple[str, ...] | None = None
    _pre: _Pre = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        c = self.num_chips
        if isinstance(c, bool) or not isinstance(c, int | np.integer) or not 1 <= c <= MAX_CHIPS:
            raise ValueError(f"MCMProblem field 'num_chips' must be an integer in [1, {MAX_CHIPS}], "
                             f"got {c!r}")
        object.__setattr__(self, "num_chips", int(c))
        for name in ("time_s", "out_bytes", "weight_bytes"):
            arr = _array(getattr(self, name), np.float64, name)
            bad = ~np.isfinite(arr) | (arr < 0)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"MCMProblem field {name!r}: op {i} has {arr[i]}, must be finite and >= 0")
            object.__setattr__(self, name, arr)
        n = len(self.time_s)
        if n < 1:
            raise ValueError("MCMProblem field 'time_s' is empty; a problem needs at least one op")
        for name in ("out_bytes", "weight_bytes"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"MCMProblem field {name!r} has {len(getattr(self, name))} entries, "
                                 f"expected {n} (one per op, as time_s)")
        for name in ("src", "dst"):
            arr = _int_array(getattr(self, name), name)
            bad = (arr < 0) | (arr >= n)
            if bad.any():
                e = int(np.flatnonzero(bad)[0])
                raise ValueError(f"MCMProblem field {name!r}: edge {e} names op {arr[e]}, outside [0, {n})")
            object.__setattr__(self, name, arr)
        if len(self.src) != len(self.dst):
            raise ValueError(f"MCMProblem fields 'src' and 'dst' differ in length "
                             f"({len(self.src)} != {len(self.dst)})")
        topo = _int_array(self.topo, "topo")
        if len(topo) != n or not np.array_equal(np.sort(topo), np.arange(n)):
            raise ValueError(f"MCMProblem field 'topo' must be a permutation of 0..{n - 1}")
        pos = np.empty(n, dtype=np.int64)
        pos[topo] = np.arange(n)
        bad = pos[self.src] >= pos[self.dst]
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            raise ValueError(f"MCMProblem field 'topo' is not a topological order: edge {e} "
                             f"({self.src[e]} -> {self.dst[e]}) goes backwards"
                             + (" (a self-loop)" if self.src[e] == self.dst[e] else ""))
        object.__setattr__(self, "topo", topo)
        for name in ("link_bw_bytes_per_s", "sram_bytes"):
            v = getattr(self, name)
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"MCMProblem field {name!r} must be a number, got {v!r}") from None
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"MCMProblem field {name!r} must be finite and > 0, got {v!r}")
            object.__setattr__(self, name, v)
        if self.names is not None:
            names = tuple(str(s) for s in self.names)
            if len(names) != n:
                raise ValueError(f"MCMProblem field 'names' has {len(names)} entries, expected {n}")
            object.__setattr__(self, "names", names)
        object.__setattr__(self, "_pre", self._derive(pos))

    def _derive(self, pos: np.ndarray) -> _Pre:
        n, src, dst = self.num_nodes, self.src, self.dst
        order = np.lexsort((pos[dst], src))  # by source, then consumer position
        s_src, s_dst = src[order], dst[order]
        outdeg = np.bincount(src, minlength=n)
        has_succ = np.flatnonzero(outdeg > 0)
        starts = np.concatenate([[0], np.cumsum(outdeg)])[has_succ]
        nb = max(1, int(n).bit_length())
        cb = max(1, int(self.num_chips - 1).bit_length())
        gb = max(1, int(n - 1).bit_length())
        if nb + cb + gb > 62:
            raise ValueError(f"MCMProblem: {n} ops are too many for the 64-bit live-interval keys")
        key_dtype = np.int32 if nb + cb + gb <= 31 else np.int64
        group = np.concatenate([np.arange(n), s_src])
        chip_node = np.concatenate([np.arange(n), s_dst])
        end = np.concatenate([pos, pos[s_dst]])
        o = np.argsort(group, kind="stable")
        group, chip_node, end = group[o], chip_node[o], end[o]
        out_int = np.ceil(self.out_bytes)
        live_dtype = np.int32 if out_int.sum() < 2**31 - 1 else np.int64
        return _Pre(pos=pos, has_succ=has_succ, succ_starts=starts, succ_dst=s_dst,
                    ent_chip_node=chip_node, ent_key_static=((group << (cb + nb)) | end).astype(key_dtype),
                    ent_bytes=out_int[group].astype(live_dtype), ent_start=pos[group].astype(key_dtype),
                    grp_last=np.cumsum(outdeg + 1) - 1, live_dtype=live_dtype, key_dtype=key_dtype,
                    nb=nb, cb=cb)

    @property
    def num_nodes(self) -> int:
        return len(self.time_s)

    @property
    def num_edges(self) -> int:
        return len(self.src)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_arrays(cls, num_chips: int, src: Any, dst: Any, time_s: Any, out_bytes: Any = None,
                    weight_bytes: Any = None, topo: Any = None,
                    link_bw_bytes_per_s: float = MCM_LINK_BW_BYTES_PER_S,
                    sram_bytes: float = DEFAULT_SRAM_BYTES, names: Any = None) -> MCMProblem:
        """Build from plain arrays; ``out_bytes`` / ``weight_bytes`` default to 0 and ``topo`` to Kahn's
        order taking the smallest ready op first (raises naming ``src``/``dst`` on a cycle)."""
        time_s = np.asarray(time_s, dtype=np.float64)
        n = len(time_s)
        zeros = np.zeros(n)
        if topo is None:
            topo = _kahn(n, _int_array(src, "src"), _int_array(dst, "dst"))
        return cls(num_chips, src, dst, time_s, zeros if out_bytes is None else out_bytes,
                   zeros if weight_bytes is None else weight_bytes, topo, link_bw_bytes_per_s, sram_bytes,
                   None if names is None else tuple(names))

    @classmethod
    def from_graph(cls, g: OpGraph, package: Cluster | None = None, forward_only: bool = True) -> MCMProblem:
        """The MCM problem of graph ``g`` on ``package`` (default ``mcm_package(36)``).

        Per-op time is the graph's profiled ``acc_latency`` when it has one (dnn-partitioning inputs),
        else ``estimate_graph(g, package.device).all_s``; ``out_bytes``/``weight_bytes`` are
        the graph's ``output_bytes``/``weight_bytes``; the order is ``g.topo_order()``; SRAM is the
        device's GLB (``glb_mb`` MiB). ``forward_only`` keeps the ``~is_backward`` ops (the MCM paper
        partitions inference graphs). Every op is kept, ``core == "none"`` ones included (module doc)."""
        from .estimate import estimate_graph

        package = mcm_package(36) if package is None else package
        if not isinstance(package, Cluster):
            raise ValueError(f"from_graph: 'package' must be a Cluster, got {type(package).__name__}")
        if package.topology != "uni-ring":
            raise ValueError(f"from_graph: 'package' topology is {package.topology!r}; the MCM model "
                             "needs a 'uni-ring' cluster (e.g. mcm_package(36))")
        if not isinstance(package.device, Accelerator):
            raise ValueError(f"from_graph: 'package' device must be an Accelerator, got "
                             f"{type(package.device).__name__}")
        if forward_only and g.nodes["is_backward"].any():
            g = g.forward()
        if g.num_nodes == 0:
            raise ValueError("from_graph: the graph has no ops"
                             + (" in its forward part" if forward_only else ""))
        extra = g.extra_nodes or {}
        # dnn-partitioning inputs carry profiled accelerator latencies; model graphs are estimated
        time_s = (np.asarray(extra["acc_latency"], dtype=np.float64) if "acc_latency" in extra
                  else estimate_graph(g, package.device).all_s)
        src, dst = g.edge_pos
        return cls(package.num_devices, src, dst, time_s, g.nodes["output_bytes"],
                   g.nodes["weight_bytes"], g.topo_order(), package.link_bw,
                   float(package.device.glb_mb) * MB, tuple(str(s) for s in g.nodes["name"]))


def _kahn(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    if len(src) != len(dst) or ((src < 0) | (src >= n) | (dst < 0) | (dst >= n)).any():
        raise ValueError(f"MCMProblem fields 'src'/'dst' must be equal-length op ids in [0, {n})")
    order, stuck = kahn_order(n, src, dst)
    if stuck >= 0:
        raise ValueError(f"MCMProblem fields 'src'/'dst': the edges form a cycle through op {stuck}")
    return order


# ---------------------------------------------------------------------------------------- batches
def _as_parts(problem: MCMProblem, parts: Any) -> np.ndarray:
    """``parts`` as a C-contiguous int64 ``[B, N]`` array; a single ``[N]`` partition is a batch of one."""
    arr = np.asarray(parts)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"parts must be an integer array, got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    n = problem.num_nodes
    if arr.ndim != 2 or arr.shape[1] != n:
        raise ValueError(f"parts must have shape [{n}] or [B, {n}], got {tuple(np.shape(parts))}")
    if arr.size and (arr.min() < 0 or arr.max() >= problem.num_chips):
        bad = np.argwhere((arr < 0) | (arr >= problem.num_chips))[0]
        raise ValueError(f"parts[{bad[0]}, {bad[1]}] is chip {arr[tuple(bad)]}, outside "
                         f"[0, {problem.num_chips})")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _scan_rows(problem: MCMProblem) -> int:
    """Rows per pass of the memory scan: its [rows, C, N+1] buffer holds about ``_MEM_ELEMENTS``
    integers (at least one row)."""
    return max(1, _MEM_ELEMENTS // (problem.num_chips * (problem.num_nodes + 1)))


def _chunks(b: int, size: int) -> Iterator[slice]:
    for s in range(0, b, size):
        yield slice(s, min(b, s + size))


class _Scratch:
    """Per-call reusable arrays: the memory-scan buffer and the per-op weights tiled over a chunk's
    rows (bincount wants one weight per index; tiling once per call instead of once per chunk)."""

    def __init__(self, problem: MCMProblem, rows: int) -> None:
        self.problem, self.rows = problem, rows
        self.scan_rows = min(rows, _scan_rows(problem))
        self.buf = np.empty(self.scan_rows * problem.num_chips * (problem.num_nodes + 1),
                            dtype=problem._pre.live_dtype)
        self._tiles: dict[str, np.ndarray] = {}

    def tile(self, name: str, b: int) -> np.ndarray:
        if name not in self._tiles:
            self._tiles[name] = np.tile(getattr(self.problem, name), self.rows)
        return self._tiles[name][:b * self.problem.num_nodes]


def _flat_chip(f: np.ndarray, c: int) -> np.ndarray:
    """Flat ``row * c + chip`` index of every (row, op)."""
    return (f + (np.arange(f.shape[0]) * c)[:, None]).ravel()


def _per_chip(fi: np.ndarray, rows: int, c: int, weights: np.ndarray | None = None) -> np.ndarray:
    """``[rows, c]`` sums of ``weights`` (counts without) per row and chip, ``fi`` from :func:`_flat_chip`."""
    return np.bincount(fi, weights=weights, minlength=rows * c).reshape(rows, c)


def _gather(f: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``f[:, idx]`` as a C-contiguous array (fancy indexing on axis 1 returns a Fortran-ordered one,
    which makes every later row-wise operation strided)."""
    return np.take(f, idx, axis=1)


def _chip_adjacency(problem: MCMProblem, f: np.ndarray, fs: np.ndarray | None = None,
                    fd: np.ndarray | None = None) -> np.ndarray:
    """``[C, C, B]`` bool, batch last: ``adj[a, b, row]`` when row's chip graph has the forward edge
    ``a -> b`` (a < b); ``fs``/``fd`` are the optional gathered chips of the edges' ends."""
    b, c = f.shape[0], problem.num_chips
    fs = _gather(f, problem.src) if fs is None else fs
    fd = _gather(f, problem.dst) if fd is None else fd
    mask = fs < fd
    idx = ((fs * c + fd) * b + np.arange(b)[:, None])[mask]
    adj = np.zeros(c * c * b, dtype=bool)
    adj[idx] = True
    return adj.reshape(c, c, b)


def _reachability(adj: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bitmasks ``[C, B]`` uint64 (batch last) of A, R (chips reachable by paths of length >= 1) and R2
    (length >= 2), for a forward-only chip adjacency ``adj`` ``[C, C, B]``; one step per chip, from
    the last down, each a contiguous select-and-OR over the batch."""
    c, _, b = adj.shape
    packed = np.packbits(adj, axis=1, bitorder="little")  # [C, ceil(C/8), B]
    a_bits = np.zeros((c, b), dtype=np.uint64)
    for j in range(packed.shape[1]):
        a_bits |= packed[:, j, :].astype(np.uint64) << np.uint64(8 * j)
    r = np.zeros((c, b), dtype=np.uint64)
    r2 = np.zeros((c, b), dtype=np.uint64)
    zero = np.uint64(0)
    for a in range(c - 2, -1, -1):  # chip C-1 has no forward successor
        sel = np.where(adj[a, a + 1:], r[a + 1:], zero)
        np.bitwise_or.reduce(sel, axis=0, out=r2[a])
        np.bitwise_or(a_bits[a], r2[a], out=r[a])
    return a_bits, r, r2


def _static_chunk(problem: MCMProblem, f: np.ndarray,
                  count: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """eq2, eq3, eq4 violations ``[B]``; ``count`` is the optional ``[B, C]`` ops-per-chip."""
    c = problem.num_chips
    fs, fd = _gather(f, problem.src), _gather(f, problem.dst)
    eq2 = (fs > fd).any(axis=1)
    if count is None:
        count = _per_chip(_flat_chip(f, c), f.shape[0], c)
    eq3 = (count > 0).sum(axis=1) != f.max(axis=1) + 1
    a_bits, _, r2 = _reachability(_chip_adjacency(problem, f, fs, fd))
    eq4 = ((a_bits & r2) != 0).any(axis=0)
    return eq2, eq3, eq4


def _far_chip(problem: MCMProblem, f: np.ndarray) -> np.ndarray:
    """``[B, N]`` m(u): the farthest chip op u's output travels to (f[u] itself without successors)."""
    p = problem._pre
    m = f.copy()
    if len(p.has_succ):
        far = np.maximum.reduceat(_gather(f, p.succ_dst), p.succ_starts, axis=1)
        m[:, p.has_succ] = np.maximum(_gather(f, p.has_succ), far)
    return m


def _link_s(problem: MCMProblem, f: np.ndarray, m: np.ndarray, out_w: np.ndarray) -> np.ndarray:
    """``[B, C]`` link time of each chip's outgoing link: op u's bytes cross links f[u] .. m(u)-1.
    ``out_w`` is ``out_bytes`` tiled over the rows."""
    c, b = problem.num_chips, f.shape[0]
    diff = (np.bincount(_flat_chip(f, c + 1), weights=out_w, minlength=b * (c + 1))
            - np.bincount(_flat_chip(m, c + 1), weights=out_w, minlength=b * (c + 1)))
    return np.cumsum(diff.reshape(b, c + 1), axis=1)[:, :c] / problem.link_bw_bytes_per_s


def _sorted_keys(problem: MCMProblem, f: np.ndarray) -> np.ndarray:
    """Per row, the entry keys (op, chip, end) sorted: each (op, chip) run ends with its interval end,
    and each op's last column holds its farthest chip."""
    p = problem._pre
    chip = _gather(f, p.ent_chip_node).astype(p.key_dtype)
    chip <<= p.nb
    chip |= p.ent_key_static
    chip.sort(axis=1)
    return chip


def _live_peak(problem: MCMProblem, keys: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """``[B, C]`` peak live activation bytes from the sorted keys, using the flat scan buffer ``buf``."""
    p, c, n, b = problem._pre, problem.num_chips, problem.num_nodes, keys.shape[0]
    run = keys >> p.nb  # (op, chip)
    last = np.empty(keys.shape, dtype=bool)
    last[:, -1] = True
    np.not_equal(run[:, 1:], run[:, :-1], out=last[:, :-1])
    base = ((run & ((1 << p.cb) - 1)) + (np.arange(b, dtype=keys.dtype) * c)[:, None]) * (n + 1)
    w = np.where(last, p.ent_bytes, 0).ravel()
    live = buf[:b * c * (n + 1)]
    live.fill(0)
    np.add.at(live, (base + p.ent_start).ravel(), w)
    np.subtract.at(live, (base + (keys & ((1 << p.nb) - 1)) + 1).ravel(), w)
    live3 = live.reshape(b, c, n + 1)
    np.cumsum(live3, axis=2, out=live3)
    return live3.max(axis=2)


def _live_peak_rows(problem: MCMProblem, keys: np.ndarray, scratch: _Scratch) -> np.ndarray:
    out = np.empty((keys.shape[0], problem.num_chips))
    for sl in _chunks(keys.shape[0], scratch.scan_rows):
        out[sl] = _live_peak(problem, keys[sl], scratch.buf)
    return out


# ---------------------------------------------------------------------------------------- public API
def static_violations(problem: MCMProblem, parts: Any) -> dict[str, np.ndarray]:
    """Bool arrays ``eq2``, ``eq3``, ``eq4`` of shape ``[B]`` (True = violated)."""
    f = _as_parts(problem, parts)
    out = {k: np.zeros(f.shape[0], dtype=bool) for k in ("eq2", "eq3", "eq4")}
    for sl in _chunks(f.shape[0], _CHUNK_ROWS):
        for k, v in zip(("eq2", "eq3", "eq4"), _static_chunk(problem, f[sl])):
            out[k][sl] = v
    return out


def static_valid(problem: MCMProblem, parts: Any) -> np.ndarray:
    """``[B]`` bool: the partition meets Eqs. 2, 3 and 4."""
    v = static_violations(problem, parts)
    return ~(v["eq2"] | v["eq3"] | v["eq4"])


def memory_peak_bytes(problem: MCMProblem, parts: Any) -> np.ndarray:
    """``[B, C]`` peak memory of each chip in bytes (resident weights + peak live activations)."""
    f = _as_parts(problem, parts)
    b, c = f.shape[0], problem.num_chips
    scratch = _Scratch(problem, min(_CHUNK_ROWS, max(1, b)))
    peak = np.zeros((b, c))
    for sl in _chunks(b, scratch.rows):
        fc = f[sl]
        resident = _per_chip(_flat_chip(fc, c), fc.shape[0], c, scratch.tile("weight_bytes", fc.shape[0]))
        peak[sl] = resident + _live_peak_rows(problem, _sorted_keys(problem, fc), scratch)
    return peak


def memory_valid(problem: MCMProblem, parts: Any) -> np.ndarray:
    """``[B]`` bool: every chip's peak fits in ``sram_bytes`` (the dynamic constraint H)."""
    return (memory_peak_bytes(problem, parts) <= problem.sram_bytes).all(axis=1)


def chip_latency_s(problem: MCMProblem, parts: Any) -> np.ndarray:
    """``[B, C]`` chip latencies ``L_d`` (compute plus outgoing link time), valid or not."""
    f = _as_parts(problem, parts)
    b, c = f.shape[0], problem.num_chips
    scratch = _Scratch(problem, min(_CHUNK_ROWS, max(1, b)))
    out = np.zeros((b, c))
    for sl in _chunks(b, scratch.rows):
        fc = f[sl]
        compute = _per_chip(_flat_chip(fc, c), fc.shape[0], c, scratch.tile("time_s", fc.shape[0]))
        link = _link_s(problem, fc, _far_chip(problem, fc), scratch.tile("out_bytes", fc.shape[0]))
        out[sl] = compute + link
    return out


@dataclass(frozen=True)
class EvalResult:
    """Batch evaluation. ``throughput`` is ``1 / max_latency_s`` (samples/s) where ``valid``, else 0;
    ``latency_s`` and ``peak_bytes`` are per chip ``[B, C]`` and filled for invalid rows too."""

    throughput: np.ndarray  # [B] float
    valid: np.ndarray  # [B] bool: static_ok & memory_ok
    static_ok: np.ndarray  # [B] bool: Eqs. 2-4 hold
    memory_ok: np.ndarray  # [B] bool: every peak <= sram_bytes
    latency_s: np.ndarray  # [B, C] chip latencies L_d
    max_latency_s: np.ndarray  # [B]
    peak_bytes: np.ndarray  # [B, C] memory peaks


def evaluate(problem: MCMProblem, parts: Any) -> EvalResult:
    """Evaluate ``parts`` (``[N]`` = a batch of one, or ``[B, N]``) under the constraints and the cost
    model; out-of-range chip ids raise ``ValueError`` naming ``parts``. Rows run in chunks of
    ``_CHUNK_ROWS`` (the memory scan in smaller passes), so memory stays bounded for any batch."""
    f = _as_parts(problem, parts)
    b, c, pre = f.shape[0], problem.num_chips, problem._pre
    scratch = _Scratch(problem, min(_CHUNK_ROWS, max(1, b)))
    static_ok = np.zeros(b, dtype=bool)
    lat = np.zeros((b, c))
    peak = np.zeros((b, c))
    for sl in _chunks(b, scratch.rows):
        fc = f[sl]
        bc = fc.shape[0]
        fi = _flat_chip(fc, c)
        count = _per_chip(fi, bc, c)
        eq2, eq3, eq4 = _static_chunk(problem, fc, count)
        static_ok[sl] = ~(eq2 | eq3 | eq4)
        keys = _sorted_keys(problem, fc)
        m = ((_gather(keys, pre.grp_last) >> pre.nb) & ((1 << pre.cb) - 1)).astype(np.int64)  # far chips
        compute = _per_chip(fi, bc, c, scratch.tile("time_s", bc))
        lat[sl] = compute + _link_s(problem, fc, m, scratch.tile("out_bytes", bc))
        resident = _per_chip(fi, bc, c, scratch.tile("weight_bytes", bc))
        peak[sl] = resident + _live_peak_rows(problem, keys, scratch)
    memory_ok = (peak <= problem.sram_bytes).all(axis=1)
    valid = static_ok & memory_ok
    max_lat = lat.max(axis=1)
    with np.errstate(divide="ignore"):
        thr = np.where(valid, 1.0 / max_lat, 0.0)
    return EvalResult(thr, valid, static_ok, memory_ok, lat, max_lat, peak)


def throughput(problem: MCMProblem, parts: Any) -> np.ndarray:
    """``[B]`` throughput (0 for invalid partitions)."""
    return evaluate(problem, parts).throughput


def check(problem: MCMProblem, f: Any) -> list[str]:
    """Human-readable reasons why the single partition ``f`` is invalid; ``[]`` when it is valid."""
    arr = _as_parts(problem, f)
    if arr.shape[0] != 1:
        raise ValueError(f"check takes one partition of shape [{problem.num_nodes}], got {np.shape(f)}")
    fr = arr[0]
    names = problem.names
    out: list[str] = []
    bad = np.flatnonzero(fr[problem.src] > fr[problem.dst])
    for e in bad[:_MAX_LISTED]:
        u, v = int(problem.src[e]), int(problem.dst[e])
        label = f" ({names[u]} -> {names[v]})" if names else ""
        out.append(f"eq2: edge {u}->{v} goes from chip {fr[u]} to chip {fr[v]}{label}")
    if len(bad) > _MAX_LISTED:
        out.append(f"eq2: ... and {len(bad) - _MAX_LISTED} more edges go to a lower chip")
    used = np.bincount(fr, minlength=problem.num_chips) > 0
    top = int(fr.max())
    for d in np.flatnonzero(~used[:top]):
        out.append(f"eq3: chip {d} is skipped (no op on it, but chip {top} is used)")
    adj = _chip_adjacency(problem, arr)
    a_bits, r, r2 = _reachability(adj)
    a_list, r, r2 = ([int(x) for x in arr_[:, 0]] for arr_ in (a_bits, r, r2))
    for a, (ab, rb2) in enumerate(zip(a_list, r2)):
        both = ab & rb2
        for b in range(problem.num_chips):
            if both >> b & 1:
                via = next(k for k in range(a + 1, b) if adj[a, k, 0] and r[k] >> b & 1)
                out.append(f"eq4: chips {a}->{b} direct and via {via}")
    peak = memory_peak_bytes(problem, arr)[0]
    for d in np.flatnonzero(peak > problem.sram_bytes):
        out.append(f"memory: chip {d} peaks at {peak[d] / MB:.1f} MB > {problem.sram_bytes / MB:g} MB")
    return out


def greedy_partition(problem: MCMProblem) -> np.ndarray:
    """The O(N) compiler heuristic (before repair): walk ``topo``, keep filling the current chip until its
    compute time reaches ``sum(time_s) / C``, then move to the next chip (never back; the last chip
    takes the rest). Meets Eqs. 2 and 3 by construction, possibly not Eq. 4. With zero total time every
    op stays on chip 0."""
    c = problem.num_chips
    target = float(problem.time_s.sum()) / c * (1.0 - 1e-12)
    f = np.zeros(problem.num_nodes, dtype=np.int64)
    chip, acc = 0, 0.0
    for u, t in zip(problem.topo.tolist(), problem.time_s[problem.topo].tolist()):
        f[u] = chip
        acc += t
        if acc > 0 and acc >= target and chip < c - 1:
            chip += 1
            acc = 0.0
    return f


@dataclass(frozen=True)
class MemoryBound:
    """A lower bound on the peak memory of the fullest chip, valid for *every* partition of a problem
    (statically valid or not, on any number of the chips), from the memory model above:

    - ``op_bytes``: when op u runs (position ``pos[u]`` on chip ``f[u]``) its weights are resident there
      and its own output and the output of each distinct predecessor are live there (each such interval
      on ``f[u]`` reaches ``pos[u]``), so some chip peaks at >= ``weight[u] + out[u] + sum of out[p]``
      (whole bytes, as the model counts them); ``op_bytes`` is the largest over u, set by ``op``;
    - ``spread_bytes``: the weights stay resident, so the fullest of the ``C`` chips holds at least
      ``sum(weight) / C``.

    ``peak_bytes`` is the larger. When it exceeds ``sram_bytes`` no partition fits (``fits`` False):
    partitioners report that before any search. When it does not, a partition may still not exist
    (the bound ignores Eqs. 2-4 and how ops share chips); the partitioners then search for one."""

    peak_bytes: float
    op_bytes: float
    op: int
    spread_bytes: float
    sram_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.sram_bytes

    def describe(self, problem: MCMProblem) -> str:
        """One line naming the bound, what sets it and the SRAM it is compared with."""
        mb = self.sram_bytes / MB
        if self.op_bytes >= self.spread_bytes:
            name = problem.names[self.op] if problem.names else f"op {self.op}"
            what = (f"op {name} alone needs {self.op_bytes / MB:.2f} MB on its chip (weights, output and "
                    f"inputs)")
        else:
            what = (f"the weights ({float(problem.weight_bytes.sum()) / MB:.2f} MB) spread over "
                    f"{problem.num_chips} chiplets leave {self.spread_bytes / MB:.2f} MB on the fullest")
        rel = ">" if not self.fits else "<="
        return f"memory lower bound {self.peak_bytes / MB:.2f} MB {rel} {mb:g} MB SRAM per chiplet: {what}"


def op_live_bytes(problem: MCMProblem) -> np.ndarray:
    """``[N]`` activation bytes live on op u's chip at u's own step under any partition: u's output
    plus the output of each distinct predecessor, in whole bytes (see :class:`MemoryBound`)."""
    out = np.ceil(problem.out_bytes)
    pairs = np.unique(np.stack([problem.src, problem.dst], axis=1), axis=0) if problem.num_edges else \
        np.zeros((0, 2), dtype=np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return out + np.bincount(pairs[:, 1], weights=out[pairs[:, 0]], minlength=problem.num_nodes)


def memory_lower_bound(problem: MCMProblem) -> MemoryBound:
    """The :class:`MemoryBound` of ``problem`` (O(N + E))."""
    foot = problem.weight_bytes + op_live_bytes(problem)
    op = int(np.argmax(foot))
    spread = float(problem.weight_bytes.sum()) / problem.num_chips
    return MemoryBound(max(float(foot[op]), spread), float(foot[op]), op, spread, problem.sram_bytes)
