"""Search baselines for multi-chip-module partitioning (spec ``mcm.md`` §4), all through the
constraint solver so that every sample is a statically valid partition:

* greedy: the O(N) compiler-style heuristic (fill chips in topological order up to an equal share
  of compute), repaired with FIX; its throughput is the denominator of every improvement ratio;
* random search: a uniform distribution p(y_i = j) = 1/C, partitions drawn by the solver in
  SAMPLE mode (paper §5.1);
* simulated annealing: starts from the uniform distribution; each step redraws the distribution
  of a random subset of nodes, the solver samples a partition from it, and the new distribution is
  accepted by the Metropolis rule on relative throughput under a geometric temperature schedule.

One sample = one evaluated partition, the unit of the paper's Table 2. No Ray here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ...simulators.mcm import MCMProblem, evaluate, greedy_partition
from ..solvers.mcm_repair import MCMRepairer, RepairResult
from ..solvers.mcm_repair.memory import fix_memory, memory_greedy_partition


@dataclass
class SearchTrace:
    """Best-so-far throughput after every sample, and the best partition."""

    method: str
    best_so_far: np.ndarray  # samples/s after sample 1..n
    best_partition: np.ndarray | None
    valid_samples: int
    wall_s: float
    extra: dict = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return len(self.best_so_far)

    @property
    def best(self) -> float:
        return float(self.best_so_far[-1]) if len(self.best_so_far) else 0.0

    def samples_to_reach(self, target: float) -> int | None:
        """First sample count whose best-so-far reaches ``target`` (None if never)."""
        hit = np.flatnonzero(self.best_so_far >= target)
        return int(hit[0]) + 1 if len(hit) else None


def _scored(problem: MCMProblem, part: np.ndarray | None, stats: RepairStats,
            memory_fix: bool) -> tuple[np.ndarray | None, float]:
    """A repaired sample and its throughput; with ``memory_fix`` one that meets Eqs. 2-4 but is over
    SRAM is replaced by its ``fix_memory`` result (counted in ``stats``: ``memory_fixes`` tried,
    ``memory_fixed`` that fit after it). Without the fix, every sample of a problem whose time-balanced
    partitions overflow a chip (bert-base on 8 chiplets: the word table's chip) would score 0."""
    if part is None:
        return None, 0.0
    ev = evaluate(problem, part)
    if memory_fix and ev.static_ok[0] and not ev.memory_ok[0]:
        fx = fix_memory(problem, part)
        stats.memory(fx.valid)
        if fx.valid:
            return fx.partition, float(evaluate(problem, fx.partition).throughput[0])
    return part, float(ev.throughput[0])


class RepairStats:
    """How the repairs of a search went: repairs per stage family (``stage_family``), and the changed
    nodes (as a fraction of the graph) of those given a proposal. The chain stages are the last-resort
    fallback that rewrites most of a proposal (``mcm_repair`` module doc; issue 17), so their share is
    reported on its own."""

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = max(int(num_nodes), 1)
        self.stages: dict[str, int] = {}
        self.changed: list[float] = []
        self.memory_fixes = self.memory_fixed = 0

    def memory(self, fitted: bool) -> None:
        """One ``fix_memory`` call on a sample over SRAM; ``fitted``: it fits after the fix."""
        self.memory_fixes += 1
        self.memory_fixed += int(fitted)

    def add(self, stage: str | None, changed: int | None = None) -> None:
        fam = stage_family(stage)
        self.stages[fam] = self.stages.get(fam, 0) + 1
        if changed is not None:
            self.changed.append(int(changed) / self.num_nodes)

    def summary(self) -> dict:
        n = sum(self.stages.values())
        chain = sum(c for s, c in self.stages.items() if s.startswith("chain"))
        return {"repairs": n, "repair_stages": dict(sorted(self.stages.items())),
                "repair_chain_share": chain / n if n else 0.0,
                "repair_changed_median": float(np.median(self.changed)) if self.changed else None,
                "repair_memory_fixes": self.memory_fixes, "repair_memory_fixed": self.memory_fixed}


def stage_family(stage: str | None) -> str:
    """``"chain-cap7"`` -> ``"chain-cap"``; ``None`` (no repair ran) -> ``"none"``."""
    if stage is None:
        return "none"
    return "chain-cap" if stage.startswith("chain-cap") else str(stage)


def _repairer(problem: MCMProblem) -> MCMRepairer:
    return MCMRepairer(problem.num_chips, problem.src, problem.dst, num_nodes=problem.num_nodes)


def greedy(problem: MCMProblem, seed: int = 0, repairer: MCMRepairer | None = None, *,
           with_repair: bool = False, time_limit_s: float = 10.0):
    """The greedy heuristic's partition after FIX repair (the same repair every sampler uses), and its
    throughput; ``with_repair=True`` adds the :class:`RepairResult` (its stage and changed nodes).
    ``time_limit_s`` is the repair's wall limit; the result does not depend on it unless it cuts the
    repair short (an error then), so budgeted benches on a loaded machine give it a generous one."""
    rep = repairer or _repairer(problem)
    y = greedy_partition(problem)
    res = rep.repair("fix", y=y, seed=seed, time_limit_s=time_limit_s)
    if res.partition is None:
        raise RuntimeError(f"FIX repair of the greedy partition ended {res.status}")
    ev = evaluate(problem, res.partition)
    if ev.static_ok[0] and not ev.memory_ok[0]:
        res = _greedy_memory(problem, rep, res, seed, time_limit_s)
    tp = float(evaluate(problem, res.partition).throughput[0])
    return (res.partition, tp, res) if with_repair else (res.partition, tp)


def _greedy_memory(problem: MCMProblem, rep: MCMRepairer, res: RepairResult, seed: int,
                   time_limit_s: float) -> RepairResult:
    """The greedy heuristic when its partition is over SRAM (issue 44): the better valid one of (a) the
    repaired greedy partition with ops moved off the chips over SRAM (``fix_memory``) and (b) the
    memory-aware greedy (``memory_greedy_partition``: cuts that respect SRAM, the compute re-balanced
    over the chips after a cut memory forced), FIX-repaired and memory-fixed the same way. Only runs
    when the plain greedy fails memory, so every partition that fitted before is unchanged. ``stage``
    says which one won ("<repair stage>+memory-fix" or "<repair stage>+memory-greedy"); ``changed``
    counts the nodes away from the plain greedy partition. When neither fits, the plain one is returned
    (the caller reports why it is invalid)."""
    y0 = greedy_partition(problem)
    best, best_tp = res, 0.0
    mg = rep.repair("fix", y=memory_greedy_partition(problem), seed=seed, time_limit_s=time_limit_s)
    for label, start in (("memory-fix", res), ("memory-greedy", mg)):
        if start.partition is None:
            continue
        fx = fix_memory(problem, start.partition)
        tp = float(evaluate(problem, fx.partition).throughput[0]) if fx.valid else 0.0
        if tp > best_tp:
            best_tp = tp
            best = RepairResult(fx.partition, "valid", int((fx.partition != y0).sum()), start.failures,
                                start.branches, start.wall_s, f"{start.stage or 'none'}+{label}")
    return best


def random_search(problem: MCMProblem, samples: int, seed: int = 0,
                  repairer: MCMRepairer | None = None, time_limit_s: float | None = None, *,
                  memory_fix: bool = True) -> SearchTrace:
    """Uniform distribution through SAMPLE repair (the paper's Random); with ``time_limit_s`` it stops
    at that wall time too (``samples`` is then an upper bound). ``memory_fix``: a sample over SRAM has
    ops moved off its full chips (``fix_memory``) before it is scored (:func:`_scored`)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    rep = repairer or _repairer(problem)
    probs = np.full((problem.num_nodes, problem.num_chips), 1.0 / problem.num_chips)
    t0 = time.perf_counter()
    best, best_part, valid = 0.0, None, 0
    trace = np.zeros(samples)
    stats = RepairStats(problem.num_nodes)
    done = samples
    for k in range(samples):
        if time_limit_s is not None and k and time.perf_counter() - t0 >= time_limit_s:
            done = k
            break
        res = rep.repair("sample", probs=probs, seed=seed * 1_000_003 + k)
        stats.add(res.stage)
        part, tp = _scored(problem, res.partition, stats, memory_fix)
        valid += tp > 0
        if tp > best:
            best, best_part = tp, part
        trace[k] = best
    return SearchTrace("random", trace[:done], best_part, valid, time.perf_counter() - t0, stats.summary())


def simulated_annealing(problem: MCMProblem, samples: int, seed: int = 0, subset_fraction: float = 0.1,
                        temp_start: float = 0.05, temp_end: float = 0.001,
                        repairer: MCMRepairer | None = None, time_limit_s: float | None = None, *,
                        memory_fix: bool = True) -> SearchTrace:
    """SA over per-node distributions (paper §5.1). A move redraws the distributions of
    ``subset_fraction`` of the nodes from a flat Dirichlet; the solver samples a partition from the
    new distributions; it is accepted with probability min(1, exp((T_new/T_cur - 1) / temp)), temp
    falling geometrically from ``temp_start`` to ``temp_end`` (relative throughput units). With
    ``time_limit_s`` the schedule runs on the larger of the sample and the wall-time fractions and the
    search stops at that wall time. ``memory_fix`` as in :func:`random_search`: a move whose sample is
    over SRAM is scored (and accepted or rejected) on its memory-fixed partition, or at 0 when the fix
    fails, so the chain never settles on distributions whose partitions do not fit."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not 0 < subset_fraction <= 1:
        raise ValueError(f"subset_fraction must be in (0, 1], got {subset_fraction}")
    rep = repairer or _repairer(problem)
    rng = np.random.default_rng(seed)
    n, c = problem.num_nodes, problem.num_chips
    probs = np.full((n, c), 1.0 / c)
    k_nodes = max(1, int(round(subset_fraction * n)))
    t0 = time.perf_counter()
    cur = best = 0.0
    best_part, valid, accepted = None, 0, 0
    trace = np.zeros(samples)
    stats = RepairStats(problem.num_nodes)
    done = samples
    for k in range(samples):
        frac = k / max(samples - 1, 1)
        if time_limit_s is not None:
            el = time.perf_counter() - t0
            if k and el >= time_limit_s:
                done = k
                break
            frac = min(1.0, max(frac, el / time_limit_s))
        temp = temp_start * (temp_end / temp_start) ** frac
        cand = probs.copy()
        if k > 0:
            nodes = rng.choice(n, size=k_nodes, replace=False)
            cand[nodes] = rng.dirichlet(np.ones(c), size=k_nodes)
        res = rep.repair("sample", probs=cand, seed=int(rng.integers(2**31)))
        stats.add(res.stage)
        part, tp = _scored(problem, res.partition, stats, memory_fix)
        valid += tp > 0
        if tp > best:
            best, best_part = tp, part
        if k == 0 or tp >= cur or (cur > 0 and rng.random() < np.exp((tp / cur - 1.0) / temp)):
            probs, cur = cand, tp
            accepted += 1
        trace[k] = best
    return SearchTrace("sa", trace[:done], best_part, valid, time.perf_counter() - t0,
                       {"accepted": accepted, **stats.summary()})
