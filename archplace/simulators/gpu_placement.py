"""Step time and memory of an operator graph placed on the GPUs of one machine (GDP, issue 18).

GDP rewarded placements with their measured step time on real GPUs (spec §6); archplace simulates it.
The model is TensorFlow's executor on a multi-GPU host, kept to what decides a placement's quality:

* **Compute.** Every op runs on its device's one compute stream, one op at a time, for ``compute_s``
  (a roofline: ``max(flops / peak, bytes / HBM bandwidth)`` plus the kernel launch, or a profile).
  An op is *ready* on its device once every input is there; an idle device starts the ready op of the
  lowest ``priority`` (its rank in a topological order, so the order is deterministic), at once.
* **Transfers.** When an op finishes, its output goes once to every other device that holds a consumer
  (``bytes`` = the largest edge to that device), in finish order. A transfer takes
  ``link_latency_s + bytes / link_bytes_per_s`` on its channels and starts when they are all free:
  on ``pcie`` the sender's send port and the receiver's receive port, on ``nvlink`` the directed pair's
  link. So two transfers into one GPU over PCIe queue behind each other (contention); over NVLink only
  transfers between the same pair do.
* **Memory.** A device holds, all step long, the ``resident_bytes`` of its ops (weights, their
  gradients and optimizer state). An op's output is allocated when the op starts and freed when its last
  consumer on that device and its last outgoing transfer are done; a received copy is allocated when
  its transfer starts and freed when its last consumer there is done. The peak over the step must fit
  ``memory_bytes``; frees at an instant come before allocations at it.
* **Validity.** Out of memory and a split co-location group (ops that must share a device, e.g. a
  weight's reader and its gradient ops) make a placement invalid. They are results, not exceptions:
  ``valid`` is False, ``reason`` says which device or group, and the step time is still reported.

:func:`simulate_batch` runs the event simulation compiled with numba (:mod:`.gpu_placement_kernel`, which
says how it is made fast) for many placements of one graph (``placements`` of shape ``[K, n]``), on one
thread or split over several; :func:`simulate_reference` is a plain-Python implementation of the same
rules that the tests hold the fast one to. No Ray import here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from ..hardware.gpu_machines import GPUMachine
from . import collectives
from . import gpu_placement_kernel as _k
from .gpu_ops import roofline_time_s

ADAM_STATE_FACTOR = 4  # weights + gradients + Adam's two moments, each the size of the weights


@dataclass(eq=False)
class PlacementProblem:
    """One graph on one machine, as arrays (positions ``0..n-1``; edges by position).

    ``resident_bytes`` sits on an op's device all step; ``output_bytes`` is the op's output tensor;
    ``coloc_group`` is -1 or a group id whose ops must share a device; ``priority`` ranks ops for the
    per-device ready queue (a topological rank)."""

    compute_s: np.ndarray
    output_bytes: np.ndarray
    resident_bytes: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_bytes: np.ndarray
    coloc_group: np.ndarray
    priority: np.ndarray
    num_devices: int
    memory_bytes: float
    link_bytes_per_s: float
    link_latency_s: float
    interconnect: str
    names: tuple[str, ...] = ()
    _csr: tuple | None = field(default=None, repr=False)
    _in_csr: tuple | None = field(default=None, repr=False)
    _out_max: np.ndarray | None = field(default=None, repr=False)
    _ids32: tuple | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.compute_s)
        self.compute_s = np.asarray(self.compute_s, np.float64)
        self.output_bytes = np.asarray(self.output_bytes, np.float64)
        self.resident_bytes = np.asarray(self.resident_bytes, np.float64)
        self.src = np.asarray(self.src, np.int64)
        self.dst = np.asarray(self.dst, np.int64)
        self.edge_bytes = np.asarray(self.edge_bytes, np.float64)
        self.coloc_group = np.asarray(self.coloc_group, np.int64)
        self.priority = np.asarray(self.priority, np.int64)
        for f in ("output_bytes", "resident_bytes", "coloc_group", "priority"):
            if len(getattr(self, f)) != n:
                raise ValueError(f"{f} has {len(getattr(self, f))} entries, expected {n} (one per op)")
        if not (len(self.src) == len(self.dst) == len(self.edge_bytes)):
            raise ValueError("src, dst and edge_bytes must have one entry per edge")
        ends = np.concatenate([self.src, self.dst])
        if ends.size and (ends.min() < 0 or ends.max() >= n):
            raise ValueError(f"an edge names an op outside 0..{n - 1}")
        if (self.compute_s < 0).any() or not np.isfinite(self.compute_s).all():
            raise ValueError("compute_s must be finite and >= 0")
        if self.interconnect not in ("pcie", "nvlink"):
            raise ValueError(f"interconnect is {self.interconnect!r}; allowed: ['pcie', 'nvlink']")
        if self.num_devices < 1:
            raise ValueError(f"num_devices is {self.num_devices}, must be >= 1")

    @property
    def num_nodes(self) -> int:
        return len(self.compute_s)

    @property
    def num_edges(self) -> int:
        return len(self.src)

    @classmethod
    def from_graph(cls, graph, machine: GPUMachine, *, state_factor: int = ADAM_STATE_FACTOR,
                   profiled_compute_s: np.ndarray | None = None) -> PlacementProblem:
        """Roofline compute times on ``machine`` (or ``profiled_compute_s``, e.g. the times of another op
        model of ``simulators/gpu_ops.py``), resident bytes = ``state_factor`` x the forward ops' weights,
        co-location from ``extra_nodes["coloc_group"]``."""
        nd = graph.nodes
        n = graph.num_nodes
        if profiled_compute_s is not None:
            comp = np.asarray(profiled_compute_s, np.float64)
            if comp.shape != (n,):
                raise ValueError(f"profiled_compute_s has shape {comp.shape}, expected ({n},)")
        else:  # one rate for all flops (fp32 on CUDA cores), the launch, free inputs
            comp = roofline_time_s(nd, machine.peak_flops_per_s, machine.peak_flops_per_s,
                                   machine.hbm_bytes_per_s, machine.kernel_launch_s, zero_inputs=True)
        resident = np.where(nd["is_backward"], 0, nd["weight_bytes"]).astype(np.float64) * state_factor
        src, dst = graph.edge_pos
        coloc = graph.extra_nodes.get("coloc_group")
        coloc = np.full(n, -1, np.int64) if coloc is None else np.asarray(coloc, np.int64)
        rank = np.empty(n, np.int64)
        rank[graph.topo_order()] = np.arange(n)
        return cls(comp, nd["output_bytes"], resident, src, dst, graph.edges["bytes"], coloc, rank,
                   machine.num_devices, float(machine.memory_bytes), machine.link_bytes_per_s,
                   machine.link_latency_s, machine.interconnect, tuple(str(x) for x in nd["name"]))

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Out-edges by source: (pointer [n+1], destination, bytes) and in-degree per op."""
        if self._csr is None:
            n = self.num_nodes
            order = np.argsort(self.src, kind="stable")
            ptr = np.zeros(n + 1, np.int64)
            np.add.at(ptr, self.src + 1, 1)
            self._csr = (np.cumsum(ptr), self.dst[order].copy(), self.edge_bytes[order].copy(),
                         np.bincount(self.dst, minlength=n).astype(np.int64))
        return self._csr

    def in_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """In-edges by destination: (pointer [n+1], source); the compiled simulator frees a buffer when
        the last op reading it finishes."""
        if self._in_csr is None:
            n = self.num_nodes
            order = np.argsort(self.dst, kind="stable")
            ptr = np.zeros(n + 1, np.int64)
            np.add.at(ptr, self.dst + 1, 1)
            self._in_csr = (np.cumsum(ptr), self.src[order].copy())
        return self._in_csr

    def output_buffer_bytes(self) -> np.ndarray:
        """Bytes of each op's output buffer on its own device: its output, or its largest out-edge."""
        if self._out_max is None:
            node_max = np.zeros(self.num_nodes)
            if self.num_edges:
                np.maximum.at(node_max, self.src, self.edge_bytes)
            self._out_max = np.maximum(self.output_bytes, node_max)
        return self._out_max


@dataclass
class PlacementResult:
    """A simulated placement. ``step_time_s`` is reported for invalid placements too."""

    step_time_s: float
    valid: bool
    reason: str
    peak_memory_bytes: np.ndarray  # per device, resident + activations
    compute_busy_s: np.ndarray  # per device
    transfer_bytes: float
    num_transfers: int


@dataclass
class BatchResult:
    """:func:`simulate_batch` over ``K`` placements (arrays indexed by placement first)."""

    step_time_s: np.ndarray  # [K]
    valid: np.ndarray  # [K] bool
    oom: np.ndarray  # [K] bool
    coloc_violated: np.ndarray  # [K] bool
    peak_memory_bytes: np.ndarray  # [K, d]
    compute_busy_s: np.ndarray  # [K, d]
    transfer_bytes: np.ndarray  # [K]
    num_transfers: np.ndarray  # [K]

    def result(self, problem: PlacementProblem, placement: np.ndarray, k: int = 0) -> PlacementResult:
        reason = explain(problem, placement, self.peak_memory_bytes[k]) if not self.valid[k] else ""
        return PlacementResult(float(self.step_time_s[k]), bool(self.valid[k]), reason,
                               self.peak_memory_bytes[k].copy(), self.compute_busy_s[k].copy(),
                               float(self.transfer_bytes[k]), int(self.num_transfers[k]))


def check_placements(problem: PlacementProblem, placements) -> np.ndarray:
    """``[K, n]`` int64 placements; raises naming the bad entry."""
    P = np.asarray(placements)
    if P.ndim == 1:
        P = P[None, :]
    if P.ndim != 2 or P.shape[1] != problem.num_nodes:
        raise ValueError(f"placement has shape {np.shape(placements)}, expected ({problem.num_nodes},) "
                         f"or (K, {problem.num_nodes})")
    if P.size and (P.min() < 0 or P.max() >= problem.num_devices):
        bad = np.argwhere((P < 0) | (P >= problem.num_devices))[0]
        raise ValueError(f"placement[{bad[0]}][{bad[1]}] is device {P[tuple(bad)]}, allowed 0.."
                         f"{problem.num_devices - 1}")
    return np.ascontiguousarray(P, dtype=np.int64)


def coloc_violations(problem: PlacementProblem, P: np.ndarray) -> np.ndarray:
    """``[K]`` bool: some co-location group spans more than one device."""
    g = problem.coloc_group
    idx = np.flatnonzero(g >= 0)
    if idx.size == 0:
        return np.zeros(P.shape[0], bool)
    idx = idx[np.argsort(g[idx], kind="stable")]
    same = g[idx][1:] == g[idx][:-1]
    d = P[:, idx]
    return ((d[:, 1:] != d[:, :-1]) & same).any(axis=1)


def explain(problem: PlacementProblem, placement: np.ndarray, peak: np.ndarray) -> str:
    """The one-line reason a placement is invalid ("" when it is valid)."""
    P = np.asarray(placement, np.int64).reshape(1, -1)
    parts = []
    if coloc_violations(problem, P)[0]:
        g = problem.coloc_group
        for gid in np.unique(g[g >= 0]):
            devs = np.unique(P[0, g == gid])
            if devs.size > 1:
                ops = np.flatnonzero(g == gid)
                name = problem.names[ops[0]] if problem.names else str(ops[0])
                parts.append(f"co-location group {gid} (with {name}) is split over devices "
                             f"{', '.join(map(str, devs))}")
                break
    over = np.flatnonzero(peak > problem.memory_bytes)
    if over.size:
        k = int(over[np.argmax(peak[over])])
        parts.append(f"out of memory on device {k}: peak {peak[k] / 2**30:.2f} GiB > "
                     f"{problem.memory_bytes / 2**30:.2f} GiB")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------- reference
def simulate_reference(problem: PlacementProblem, placement) -> PlacementResult:
    """The module doc's rules in plain Python (heapq): the yardstick for the compiled simulator."""
    P = check_placements(problem, placement)[0]
    n, d = problem.num_nodes, problem.num_devices
    ptr, out_dst, out_b, indeg = problem.csr()
    pending = indeg.copy()
    ready: list[list[tuple[int, int]]] = [[] for _ in range(d)]
    busy = [False] * d
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    xfer: dict[tuple[int, int], tuple[float, float]] = {}
    send_free, recv_free = [0.0] * d, [0.0] * d
    pair_free = [[0.0] * d for _ in range(d)]
    events: list[tuple[float, int, int, int, int]] = []  # (time, type, seq, a, b); 0 done, 1 xfer, 2 go
    seq = 0

    def push(t: float, typ: int, a: int, b: int = 0) -> None:
        nonlocal seq
        heapq.heappush(events, (t, typ, seq, a, b))
        seq += 1

    for v in range(n):
        if pending[v] == 0:
            heapq.heappush(ready[P[v]], (int(problem.priority[v]), v))
    for e in range(d):
        push(0.0, 2, e)
    while events:
        t, typ, _, a, b = heapq.heappop(events)
        if typ == 0:
            v, e = a, P[a]
            busy[e] = False
            size: dict[int, float] = {}
            for k in range(ptr[v], ptr[v + 1]):
                w = out_dst[k]
                if P[w] == e:
                    pending[w] -= 1
                    if pending[w] == 0:
                        heapq.heappush(ready[e], (int(problem.priority[w]), w))
                else:
                    size[P[w]] = max(size.get(P[w], 0.0), out_b[k])
            for f in sorted(size):
                dur = collectives.p2p_s(size[f], problem.link_bytes_per_s, problem.link_latency_s)
                if problem.interconnect == "pcie":
                    s = max(t, send_free[e], recv_free[f])
                    send_free[e] = recv_free[f] = s + dur
                else:
                    s = max(t, pair_free[e][f])
                    pair_free[e][f] = s + dur
                xfer[(v, f)] = (s, s + dur)
                push(s + dur, 1, v, f)
            push(t, 2, e)
        elif typ == 1:
            v, f = a, b
            for k in range(ptr[v], ptr[v + 1]):
                w = out_dst[k]
                if P[w] == f:
                    pending[w] -= 1
                    if pending[w] == 0:
                        heapq.heappush(ready[f], (int(problem.priority[w]), w))
            push(t, 2, f)
        else:
            e = a
            if not busy[e] and ready[e]:
                _, v = heapq.heappop(ready[e])
                start[v], finish[v] = t, t + problem.compute_s[v]
                busy[e] = True
                push(finish[v], 0, v)
    if np.isnan(finish).any():
        raise ValueError("the graph has a cycle: some ops never became ready")
    # memory: (time, delta) per device; frees sort before allocations at the same time
    mem: list[list[tuple[float, int, float]]] = [[] for _ in range(d)]
    for v in range(n):
        e = P[v]
        tb = max(problem.output_bytes[v], max(out_b[ptr[v]:ptr[v + 1]], default=0.0))
        end = finish[v]
        cons_end: dict[int, float] = {}
        for k in range(ptr[v], ptr[v + 1]):
            w = out_dst[k]
            cons_end[P[w]] = max(cons_end.get(P[w], -np.inf), finish[w])
        end = max([end, cons_end.get(e, -np.inf)] + [xfer[(v, f)][1] for f in cons_end if f != e])
        mem[e] += [(start[v], 1, tb), (end, 0, -tb)]
        for f in cons_end:
            if f != e:
                s, _ = xfer[(v, f)]
                sz = max(out_b[k] for k in range(ptr[v], ptr[v + 1]) if P[out_dst[k]] == f)
                mem[f] += [(s, 1, sz), (cons_end[f], 0, -sz)]
    peak = np.zeros(d)
    for e in range(d):
        cur = 0.0
        for _, _, delta in sorted(mem[e]):
            cur += delta
            peak[e] = max(peak[e], cur)
    peak += np.bincount(P, weights=problem.resident_bytes, minlength=d)
    busy_s = np.bincount(P, weights=problem.compute_s, minlength=d)
    coloc = bool(coloc_violations(problem, P[None, :])[0])
    valid = not coloc and bool((peak <= problem.memory_bytes).all())
    reason = "" if valid else explain(problem, P, peak)
    tbytes = sum(max(out_b[k] for k in range(ptr[v], ptr[v + 1]) if P[out_dst[k]] == f) for v, f in xfer)
    return PlacementResult(float(finish.max()) if n else 0.0, valid, reason, peak, busy_s, float(tbytes),
                           len(xfer))


def simulate_batch(problem: PlacementProblem, placements, *, threads: int = 1) -> BatchResult:
    """Simulate ``placements`` (``[K, n]`` or ``[n]``) of ``problem`` (module doc).

    ``threads`` > 1 splits the batch into that many chunks run on numba's threads
    (``numba.set_num_threads`` caps how many run at once); each placement's numbers are the same as with
    one thread, bit for bit. The default stays on one core, since callers (Ray tasks, RLlib env runners)
    are usually given one CPU each."""
    if _k.numba is None:  # pragma: no cover
        raise ImportError("simulate_batch needs numba (pip install numba); simulate_reference does not")
    if threads < 1:
        raise ValueError(f"threads is {threads}, must be >= 1")
    P = check_placements(problem, placements)
    K, d = P.shape[0], problem.num_devices
    ptr, out_dst, out_b, indeg = problem.csr()
    in_ptr, in_src = problem.in_csr()
    if problem.num_nodes >= 2**32 or d >= 2**16:
        raise ValueError(f"{problem.num_nodes} ops on {d} devices: the simulator takes < 2**32 ops and "
                         "< 2**16 devices")
    # unsigned op and device ids: numba indexes with them without the negative-index wrap-around test
    P16 = P.astype(np.uint16)
    if problem._ids32 is None:  # cached: GDP's env simulates one placement a call
        problem._ids32 = (out_dst.astype(np.uint32), in_src.astype(np.uint32))
    out_dst, in_src = problem._ids32
    step = np.zeros(K)
    peak = np.zeros((K, d))
    busy = np.zeros((K, d))
    tbytes = np.zeros(K)
    ntrans = np.zeros(K, np.int64)
    args = (P16, problem.compute_s, problem.priority, ptr, out_dst, out_b, in_ptr, in_src, indeg,
            problem.output_buffer_bytes(), problem.resident_bytes, d, problem.interconnect == "pcie",
            float(problem.link_bytes_per_s), float(problem.link_latency_s), step, peak, busy, tbytes, ntrans)
    threads = min(threads, K)
    if threads > 1:
        _k.run_batch_parallel(*args, threads)
    else:
        _k.run_batch(*args)
    if np.isinf(step).any():
        raise ValueError("the graph has a cycle: some ops never became ready")
    coloc = coloc_violations(problem, P)
    oom = (peak > problem.memory_bytes).any(axis=1)
    return BatchResult(step, ~coloc & ~oom, oom, coloc, peak, busy, tbytes, ntrans)


def simulate(problem: PlacementProblem, placement) -> PlacementResult:
    """One placement: step time, validity and the reason it is invalid, per-device peak memory."""
    P = check_placements(problem, placement)
    return simulate_batch(problem, P).result(problem, P[0])
