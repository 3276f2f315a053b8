"""Memory repair for multi-chip-module partitions: the SRAM side the static repair does not see.

The constraint solver of this package (FIX / SAMPLE) repairs Eqs. 2-4 only; the simulator then checks
the dynamic constraint H (every chip's peak of resident weights plus live activations within
``sram_bytes``, :mod:`archplace.simulators.mcm`). A partitioner that balances compute alone happily puts
the blocks that balance time beside a large table (bert-base on 8 chiplets: the 22.4 MB int8 word
embedding and two encoder layers on chip 0, 32.3 MB of 32) and every sample it keeps scores 0. Two
tools here, both plain numpy over the simulator (no solver, no Ray):

* :func:`memory_greedy_partition`: the greedy heuristic (fill chips in topological order up to an equal
  share of the compute still to place) that also closes a chip before the op that would push its peak
  past SRAM. Each chip's cut is one batched evaluation of the candidate cut points (a chip's peak only
  grows as ops join it). When the last chip overflows the time target is relaxed, down to the
  memory-first packing (each chip as full as memory allows);
* :func:`fix_memory`: a local search that moves ops off each chip over SRAM while keeping Eqs. 2-4:
  per over-full chip ``d`` the candidates are the last k ops of ``d`` (topological order) onto ``d+1``,
  the first k onto ``d-1``, a split of ``d`` into ``d, d+1`` (every chip above moves up one, when a
  chip is spare), and single ops onto ``d-1`` / ``d+1``. All candidates of a step are evaluated in one
  batch; the statically valid one with the least total overflow (bytes over SRAM summed over chips),
  then the lowest max chip latency, is taken while it lowers the overflow. It stops when every chip
  fits, when no move lowers the overflow, or after ``max_moves`` moves.

Neither changes a partition that already fits, so results on problems that fitted before are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....simulators.mcm import MCMProblem, evaluate, memory_peak_bytes

# fix_memory: cut points tried per chip and move kind; a chip with more ops gets this many k values,
# all of 1..16 and the rest spread evenly (bounds one step's batch on graphs of thousands of ops)
_MAX_CUTS = 64


@dataclass
class MemoryFix:
    """The result of :func:`fix_memory`: the partition (the input when nothing helped), whether it is
    valid (Eqs. 2-4 and memory), the moves made, the candidate partitions evaluated and the bytes still
    over SRAM (summed over chips; 0 when it fits)."""

    partition: np.ndarray
    valid: bool
    moves: int
    evaluated: int
    overflow_bytes: float


def overflow_bytes(problem: MCMProblem, peak_bytes: np.ndarray) -> np.ndarray:
    """``[B]`` bytes over SRAM summed over the chips of each row of ``peak_bytes`` ``[B, C]``."""
    return np.maximum(np.asarray(peak_bytes) - problem.sram_bytes, 0.0).sum(axis=-1)


def _cuts(n: int) -> np.ndarray:
    """The k values 1..n, or ``_MAX_CUTS`` of them (all of 1..16, the rest even-spaced) when n is larger."""
    if n <= _MAX_CUTS:
        return np.arange(1, n + 1)
    rest = np.linspace(17, n, _MAX_CUTS - 16).round().astype(np.int64)
    return np.unique(np.concatenate([np.arange(1, 17), rest]))


def _candidates(problem: MCMProblem, f: np.ndarray, chips: np.ndarray) -> np.ndarray:
    """``[B, N]`` partitions one move away from ``f`` that take ops off the ``chips`` (module doc)."""
    C = problem.num_chips
    pos = problem._pre.pos
    top = int(f.max())
    rows: list[np.ndarray] = []
    for d in chips.tolist():
        ops = np.flatnonzero(f == d)
        ops = ops[np.argsort(pos[ops], kind="stable")]
        n_d = ops.size
        if n_d == 0:
            continue
        for k in _cuts(n_d).tolist():
            if d + 1 < C and k < n_d:  # the last k ops onto the next chip
                g = f.copy()
                g[ops[n_d - k:]] = d + 1
                rows.append(g)
            if d > 0 and (k < n_d or d == top):  # the first k ops onto the previous chip
                g = f.copy()
                g[ops[:k]] = d - 1
                rows.append(g)
            if top < C - 1 and k < n_d:  # split d into d (first ops) and d+1 (the last k), shift above
                g = f.copy()
                g[f > d] += 1
                g[ops[n_d - k:]] = d + 1
                rows.append(g)
        # single ops (partitions not contiguous in topological order), only those Eq. 2 lets move: onto
        # d+1 an op whose successors all lie above d, onto d-1 one whose predecessors all lie below d
        s, t = problem.src, problem.dst
        on, real = f == d, s != t
        blocked_up = np.zeros(problem.num_nodes, dtype=bool)
        blocked_up[s[on[s] & (f[t] <= d) & real]] = True
        blocked_down = np.zeros(problem.num_nodes, dtype=bool)
        blocked_down[t[on[t] & (f[s] >= d) & real]] = True
        for e, blocked in ((d - 1, blocked_down), (d + 1, blocked_up)):
            if 0 <= e < C:
                for u in ops[~blocked[ops]].tolist():
                    g = f.copy()
                    g[u] = e
                    rows.append(g)
    return np.stack(rows) if rows else np.zeros((0, problem.num_nodes), dtype=np.int64)


def fix_memory(problem: MCMProblem, partition, max_moves: int | None = None) -> MemoryFix:
    """Move ops off the chips over SRAM until every chip fits (module doc). ``partition`` must meet
    Eqs. 2-4 (ValueError otherwise: the static repair comes first); every partition on the way does too.
    ``max_moves`` defaults to the number of ops. Deterministic."""
    f = np.asarray(partition, dtype=np.int64).copy()
    ev = evaluate(problem, f)
    if not ev.static_ok[0]:
        raise ValueError("fix_memory: partition must meet Eqs. 2-4 (repair it statically first)")
    over = float(overflow_bytes(problem, ev.peak_bytes[0]))
    peak = ev.peak_bytes[0]
    limit = problem.num_nodes if max_moves is None else int(max_moves)
    moves = evaluated = 0
    while over > 0 and moves < limit:
        cand = _candidates(problem, f, np.flatnonzero(peak > problem.sram_bytes))
        if not len(cand):
            break
        ce = evaluate(problem, cand)
        evaluated += len(cand)
        ov = overflow_bytes(problem, ce.peak_bytes)
        ok = np.flatnonzero(ce.static_ok & (ov < over))
        if not ok.size:
            break
        best = ok[np.lexsort((ce.max_latency_s[ok], ov[ok]))[0]]
        f, over, peak = cand[best].copy(), float(ov[best]), ce.peak_bytes[best]
        moves += 1
    valid = over <= 0 and bool(evaluate(problem, f).static_ok[0])
    return MemoryFix(f, valid, moves, evaluated, over)


def memory_greedy_partition(problem: MCMProblem) -> np.ndarray:
    """The greedy heuristic with SRAM (module doc): contiguous in ``topo``, so Eqs. 2 and 3 hold by
    construction (Eq. 4 possibly not: the static repair follows). Tries the equal-compute target, then
    targets 1.25, 1.5, 2 and 4 times larger, then memory-first packing; returns the first whose every
    chip fits, else the memory-first one (whose last chip is over SRAM: no contiguous partition in
    this order fits)."""
    out = None
    for scale in (1.0, 1.25, 1.5, 2.0, 4.0, np.inf):
        f = _memory_greedy(problem, scale)
        if (memory_peak_bytes(problem, f)[0] <= problem.sram_bytes).all():
            return f
        out = f
    return out


def _memory_greedy(problem: MCMProblem, scale: float) -> np.ndarray:
    """One pass: chip ``c`` takes ops in ``topo`` until their compute reaches ``scale`` times the
    compute still to place over the chips left (the op that reaches it included, as in
    ``greedy_partition``) or the next op would push its peak past SRAM (at least one op per chip)."""
    C, n = problem.num_chips, problem.num_nodes
    topo = problem.topo
    t = problem.time_s[topo]
    f = np.zeros(n, dtype=np.int64)
    i = 0
    for c in range(C):
        if c == C - 1:
            f[topo[i:]] = c
            break
        left = float(t[i:].sum())
        target = left / (C - c) * scale * (1.0 - 1e-12)
        acc = np.cumsum(t[i:])
        # time cut: the first j (ops i..j-1 on c) whose compute reaches the target; all ops if none does
        hit = np.flatnonzero((acc >= target) & (acc > 0)) if np.isfinite(target) else np.zeros(0, int)
        j_time = i + int(hit[0]) + 1 if hit.size else n
        # memory cut: candidate rows j = i+1 .. j_time, ops i..j-1 on c and the rest on c+1
        js = np.arange(i + 1, j_time + 1)
        rows = np.repeat(f[None, :], js.size, axis=0)
        rank = np.empty(n, dtype=np.int64)
        rank[topo] = np.arange(n)
        later = rank >= i  # ops not placed yet
        rows[:, later] = np.where(rank[later][None, :] < js[:, None], c, c + 1)
        peak = memory_peak_bytes(problem, rows)[:, c]
        fit = np.flatnonzero(peak <= problem.sram_bytes)
        j = int(js[fit[-1]]) if fit.size else i + 1
        f[topo[i:j]] = c
        f[topo[j:]] = c + 1
        i = j
        if i >= n:
            break
    return f
