"""Operator-partitioning (OPP) and data-parallel (ADP) searches over the sharding-propagation engine.

A plan is one choice per decision tensor: replicate it, or split one of its dimensions over every
device (Auto-MAP's binary per-dimension decisions; its tables list one split index per variable).
OPP decides the trainable variables with the data inputs replicated; ADP decides the data inputs
(Auto-MAP's candidate filter: not a trainable variable, not a constant) with the variables
replicated. Undecided dimensions count as replicated.

* ``solve_exact``: CP-SAT over the per-class split booleans (a class is a set of dimensions the rules
  tie together, ``workloads.sharding``), which are exactly the per-variable choices after the linkage
  constraints, minimising the predicted step time (``sharding_cost``) under per-device memory.
  Deterministic: a fixed worker count and seed and a deterministic-time budget.
* ``brute_force``: every combination of per-variable choices, each propagated and priced (the
  yardstick of the tests).
* ``greedy``: the paper's decision order (linkage-group size, largest first), each dimension split
  when propagation allows it and the predicted step time drops (or, while the plan does not fit, its
  memory overflow does).
* ``random_search``: the same order with coin-flip decisions (a conflicting split becomes a
  replicate), episodes until it has spent as many propagation calls as it was given.
* ``megatron``: Megatron-LM's known sharding (``meta["megatron"]``), a variable whose split conflicts
  (12 heads over 8 devices) replicated and reported.
* ``linkage_groups``: per (variable, dim, decision), the decisions a single-seed propagation forces
  on other variables (Auto-MAP §3.3.2).
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field

import numpy as np

from archplace.algorithms.search.sharding_cost import (
    PlanCost,
    ShardCost,
    check_devices,
    evaluate,
    linear_terms,
    linear_value,
)
from archplace.workloads.sharding import (
    REPLICATED,
    UNKNOWN,
    Mesh,
    Propagation,
    ShardGraph,
    memory,
    propagate,
)

MODES = ("opp", "adp")


@dataclass
class ShardProblem:
    graph: ShardGraph
    devices: int
    mode: str = "opp"
    cost: ShardCost = field(default_factory=ShardCost)
    calls: int = 0  # propagation calls spent

    def __post_init__(self) -> None:
        check_devices(self.devices)
        if self.mode not in MODES:
            raise ValueError(f"mode is {self.mode!r}; allowed: {list(MODES)}")
        self.axis = "model" if self.mode == "opp" else "data"
        self.mesh = Mesh(((self.axis, self.devices),))
        g = self.graph
        if self.mode == "opp":
            self.variables = g.params()
            fixed_t = g.inputs()
        else:  # candidates: inputs, i.e. neither trainable variables nor constants
            self.variables = [i for i, t in enumerate(g.tensors) if t.role == "input"]
            fixed_t = g.params()
        self.fixed = {(t, d): None for t in fixed_t for d in range(len(g.tensors[t].shape))}
        self._base = propagate(g, self.mesh, self.fixed)
        if self._base.conflict is not None:
            raise ValueError(f"the fixed decisions conflict: {self._base.conflict}")
        self._lt = None

    @property
    def base(self) -> np.ndarray:
        return self._base.values

    def propagate(self, decisions, base: np.ndarray | None = None) -> Propagation:
        self.calls += 1
        return propagate(self.graph, self.mesh, decisions, self.base if base is None else base)

    def choices(self, t: int) -> list[int | None]:
        return [None, *range(len(self.graph.tensors[t].shape))]

    def decisions(self, choice: dict[int, int | None]) -> dict:
        out = {}
        for t, d in choice.items():
            for k in range(len(self.graph.tensors[t].shape)):
                out[(t, k)] = self.axis if k == d else None
        return out

    def linear(self):
        if self._lt is None:
            self._lt = linear_terms(self.graph, self.devices, self.cost)
        return self._lt

    def fast_cost(self, values: np.ndarray) -> tuple[float, float]:
        """(step s, memory bytes) by the linear form (equal to ``evaluate`` on a propagated plan)."""
        return linear_value(self.linear(), (values > 0).astype(float))

    def score(self, values: np.ndarray) -> tuple[float, float]:
        """(bytes over the per-device memory, step s): what greedy and random minimise, so a search that
        starts from a plan that does not fit first makes it fit."""
        s, m = self.fast_cost(values)
        return max(0.0, m - self.cost.gpu.memory_bytes), s

    def choice_of(self, values: np.ndarray) -> dict[int, int | None]:
        cl = self.graph.classes
        out = {}
        for t in self.variables:
            split = [d for d, c in enumerate(cl.tensor_classes[t]) if values[c] > 0]
            out[t] = split[0] if split else None
        return out


@dataclass
class ShardResult:
    algo: str
    choice: dict[str, int]  # variable -> split dim, -1 replicated (Auto-MAP Table 3 form)
    cost: PlanCost
    propagation_calls: int
    search_s: float
    notes: list[str] = field(default_factory=list)
    status: str = "ok"  # ok | optimal | feasible (exact, budget ran out) | infeasible
    evaluated: int = 0
    reason: str | None = None  # infeasible: why no plan fits (the memory it misses by, the dims at fault)

    @property
    def partitioned(self) -> int:
        return sum(1 for d in self.choice.values() if d >= 0)

    def to_dict(self) -> dict:
        return {
            "algo": self.algo,
            "status": self.status,
            "strategy": self.choice,
            "partitioned_variables": self.partitioned,
            **self.cost.to_dict(),
            "propagation_calls": self.propagation_calls,
            "search_s": self.search_s,
            "evaluated": self.evaluated,
            "notes": self.notes,
            "reason": self.reason,
        }


def result_from_values(
    pb: ShardProblem, algo: str, values: np.ndarray, t0: float, calls0: int, **kw
) -> ShardResult:
    choice = pb.choice_of(values)
    p = propagate(pb.graph, pb.mesh, {**pb.fixed, **pb.decisions(choice)})
    if p.conflict is not None:  # a bug, not an input error: every searcher returns propagated plans
        raise RuntimeError(f"{algo}: the returned plan conflicts: {p.conflict}")
    names = {pb.graph.tensors[t].name: (-1 if d is None else d) for t, d in choice.items()}
    return ShardResult(algo, names, evaluate(p, pb.cost), pb.calls - calls0, time.perf_counter() - t0, **kw)


def plan_cost(pb: ShardProblem, choice: dict[int, int | None]) -> tuple[Propagation, PlanCost | None]:
    """Propagate and price one per-variable choice (None cost on a conflict)."""
    p = pb.propagate({**pb.fixed, **pb.decisions(choice)}, base=np.full(pb.graph.classes.num, UNKNOWN))
    return p, (None if p.conflict is not None else evaluate(p, pb.cost))


# ------------------------------------------------------------------------------------ linkage groups


def linkage_groups(pb: ShardProblem) -> dict[tuple[int, int, str], list[tuple[int, int, str]]]:
    """Per (variable, dim, "split" | "replicate"), the decisions on other variables' dims that a
    propagation from that seed alone forces (Auto-MAP §3.3.2: extracted once, partial by nature)."""
    out = {}
    cl = pb.graph.classes
    empty = np.full(cl.num, UNKNOWN)
    for t in pb.variables:
        for d in range(len(pb.graph.tensors[t].shape)):
            for dec, axis in (("split", pb.axis), ("replicate", None)):
                p = pb.propagate({(t, d): axis}, base=empty)
                forced = []
                if p.conflict is None:
                    for u in pb.variables:
                        for k, c in enumerate(cl.tensor_classes[u]):
                            if (u, k) != (t, d) and p.values[c] != UNKNOWN:
                                forced.append((u, k, "split" if p.values[c] > 0 else "replicate"))
                out[(t, d, dec)] = forced
    return out


def decision_order(pb: ShardProblem, groups=None) -> list[tuple[int, int]]:
    """Variable dims by the size of their split linkage group, largest first (stable)."""
    groups = groups if groups is not None else linkage_groups(pb)
    dims = [(t, d) for t in pb.variables for d in range(len(pb.graph.tensors[t].shape))]
    return sorted(dims, key=lambda td: -len(groups[(td[0], td[1], "split")]))


# --------------------------------------------------------------------------------------- searchers


def brute_force(pb: ShardProblem, limit: int = 100_000) -> ShardResult:
    t0, c0 = time.perf_counter(), pb.calls
    opts = [pb.choices(t) for t in pb.variables]
    n = int(np.prod([len(o) for o in opts], dtype=float))
    if n > limit:
        raise ValueError(f"brute force over {n} plans exceeds limit={limit}")
    best, best_v, seen, valid, least = None, None, 0, 0, None
    for combo in itertools.product(*opts):
        p, c = plan_cost(pb, dict(zip(pb.variables, combo)))
        if c is not None:
            valid += 1
            least = c.memory_bytes if least is None else min(least, c.memory_bytes)
        if c is None or not c.fits:
            continue
        seen += 1
        if best is None or c.step_s < best.step_s - 1e-15:
            best, best_v = c, p.values.copy()
    if best is None:
        raise ValueError(
            f"no plan fits in {pb.cost.gpu.name}'s {_gib(pb.cost.gpu.memory_bytes)} per device: "
            + (
                f"the smallest of the {valid} plans without a conflict (of {n}) needs {_gib(least)} "
                f"({least} B) over {pb.devices} devices"
                if valid
                else f"all {n} plans conflict"
            )
        )
    return result_from_values(pb, "brute", best_v, t0, c0, status="optimal", evaluated=seen)


def _free_classes(pb: ShardProblem) -> list[bool]:
    """Per class: may the exact search split it (a decision variable's dim, not fixed by the base
    propagation, splittable, its size divisible by the devices, at most once per tensor)."""
    cl, T = pb.graph.classes, pb.devices
    decided = set()
    for t in pb.variables:
        decided.update(cl.tensor_classes[t])
    free = []
    for c in range(cl.num):
        ok = c in decided and pb.base[c] == UNKNOWN and c not in cl.nosplit and cl.gcd[c] % T == 0
        ok = ok and all(cl.tensor_classes[t].count(c) <= 1 for t in cl.tensors_of[c])
        free.append(ok and T > 1)
    return free


def _cpsat(
    pb: ShardProblem, objective: str, max_deterministic_s: float, workers: int, seed: int, limit_s: float
):
    """The CP-SAT model over the free class booleans: ``objective`` "step" (predicted step time in
    integer picoseconds, under the per-device memory) or "memory" (per-device bytes, no cap)."""
    from ortools.sat.python import cp_model

    g, cl, lt = pb.graph, pb.graph.classes, pb.linear()
    free = _free_classes(pb)
    md = cp_model.CpModel()
    x = {c: md.NewBoolVar(f"x{c}") for c in range(cl.num) if free[c]}
    groups = [cl.tensor_classes[t] for t in range(len(g.tensors))] + [
        [c for c, _, _ in oc] for oc in cl.op_classes
    ]
    for grp in groups:
        vs = [x[c] for c in dict.fromkeys(grp) if c in x]
        if len(vs) > 1:
            md.AddAtMostOne(vs)
    mem = sum(int(np.floor(lt.mem_coef_bytes[c])) * v for c, v in x.items())
    if objective == "memory":
        md.Minimize(mem)
    else:
        obj = [(int(round(lt.coef_s[c] * _PS)), v) for c, v in x.items()]
        for t, cs in lt.grad_or.items():
            vs = [x[c] for c in cs if c in x]
            if not vs:
                continue
            y = md.NewBoolVar(f"y{t}")
            for v in vs:
                md.AddImplication(v, y)
            obj.append((int(round(lt.grad_ar_s[t] * _PS)), y))
        md.Add(mem <= int(np.floor(pb.cost.gpu.memory_bytes - lt.mem_base_bytes)))
        md.Minimize(sum(k * v for k, v in obj))
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = int(workers)
    prm.random_seed = int(seed)
    prm.max_deterministic_time = float(max_deterministic_s)
    prm.max_time_in_seconds = float(limit_s)
    st = solver.Solve(md)
    ok = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    status = (
        "optimal"
        if st == cp_model.OPTIMAL
        else "feasible"
        if ok
        else ("infeasible" if st == cp_model.INFEASIBLE else "unknown")
    )
    values = None
    if ok:
        values = pb.base.copy()
        values[values == UNKNOWN] = REPLICATED
        for c, v in x.items():
            if solver.Value(v):
                values[c] = 1
    return status, values, solver, x


_PS = 1e12  # the exact search's time unit: integer picoseconds


def solve_exact(
    pb: ShardProblem,
    max_deterministic_s: float = 10.0,
    workers: int = 1,
    seed: int = 0,
    time_limit_s: float = 600.0,
) -> ShardResult:
    """CP-SAT over the per-class split booleans (module docstring). Times are integer picoseconds.
    When no plan fits, a second solve finds the smallest per-device memory any plan reaches, and
    ``reason`` says by how much it misses and which dims would have saved the most had they split."""
    t0, c0, lt = time.perf_counter(), pb.calls, pb.linear()
    status, values, solver, x = _cpsat(pb, "step", max_deterministic_s, workers, seed, time_limit_s)
    if values is None:
        if status == "infeasible":
            why = infeasible_reason(pb, max_deterministic_s, workers, seed, time_limit_s)
        else:
            why = (
                f"CP-SAT found no plan within its deterministic-time budget {max_deterministic_s} "
                "(raise max_deterministic_s)"
            )
        return ShardResult(
            "ilp",
            {},
            PlanCost(float("nan"), float("nan"), float("nan"), 0, False, ()),
            0,
            time.perf_counter() - t0,
            [why],
            status="infeasible",
            reason=why,
        )
    res = result_from_values(pb, "ilp", values, t0, c0, status=status)
    res.notes.append(
        f"CP-SAT: {len(x)} class booleans, objective {solver.objective_value / _PS + lt.base_s:.6f} s, "
        f"bound {solver.best_objective_bound / _PS + lt.base_s:.6f} s, deterministic time "
        f"{solver.deterministic_time:.3f} of {max_deterministic_s}"
    )
    return res


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def infeasible_reason(
    pb: ShardProblem,
    max_deterministic_s: float = 10.0,
    workers: int = 1,
    seed: int = 0,
    limit_s: float = 600.0,
) -> str:
    """Why no plan fits: the smallest per-device memory any plan reaches (CP-SAT on the memory alone,
    the plan then propagated and measured) against the GPU's, its split into model state and
    activations, and the three dim classes that would have saved the most memory, with why each
    cannot split (size not divisible, an op's axis, tied to a fixed input)."""
    g, cl, lt, T = pb.graph, pb.graph.classes, pb.linear(), pb.devices
    cap = pb.cost.gpu.memory_bytes
    status, values, _, _ = _cpsat(pb, "memory", max_deterministic_s, workers, seed, limit_s)
    if values is None:  # pragma: no cover - the all-replicated plan is always a solution
        return f"no plan fits in {pb.cost.gpu.name}'s {_gib(cap)} per device"
    p = propagate(g, pb.mesh, {**pb.fixed, **pb.decisions(pb.choice_of(values))})
    m = memory(p, pb.cost.optimizer_factor)
    state = m.params_bytes + m.grads_bytes + m.optimizer_bytes
    least = "the smallest" if status == "optimal" else "the smallest found (budget ran out)"
    why = (
        f"no plan fits in {pb.cost.gpu.name}'s {_gib(cap)} per device: {least} per-device memory any "
        f"plan reaches over {T} devices is {_gib(m.total_bytes)} ({m.total_bytes} B: parameters, "
        f"gradients and optimizer state {_gib(state)}, activations {_gib(m.activations_bytes)})"
    )
    free = _free_classes(pb)
    fold = lambda text: re.sub(r"\.\d+/", ".*/", text)  # noqa: E731 - one entry for all blocks
    stuck: dict[str, list] = {}  # cause (blocks folded) -> [first dim text, classes, bytes saved]
    for c in range(cl.num):
        if free[c] or lt.mem_coef_bytes[c] >= 0 or values[c] > 0:
            continue
        if pb.base[c] != UNKNOWN:
            cause = "tied to a data input, replicated under OPP" if pb.mode == "opp" else "tied to a variable"
        elif c in cl.nosplit:
            oi, lab = cl.nosplit[c]
            cause = f"op {fold(g.ops[oi].name)!r} may not split its label {lab!r}"
        elif cl.gcd[c] % T:
            cause = f"size {int(cl.gcd[c])} is not divisible by {T}"
        else:
            cause = "no decision variable touches it alone" if T > 1 else "one device"
        s = cl.members[c][0]
        t = cl.tensor_of(s)
        e = stuck.setdefault(cause, [fold(f"{g.tensors[t].name} dim {s - int(cl.offset[t])}"), 0, 0.0])
        e[1] += 1
        e[2] -= lt.mem_coef_bytes[c]
    top = sorted(stuck.items(), key=lambda kv: -kv[1][2])[:3]
    if top:
        why += "; the dims that would save the most but cannot split: " + "; ".join(
            f"{dim} and {n - 1} like it ({cause}; each alone would save, summed, {_gib(saved)})"
            if n > 1
            else f"{dim} ({cause}; would save {_gib(saved)})"
            for cause, (dim, n, saved) in top
        )
    return why


def greedy(pb: ShardProblem, order=None) -> ShardResult:
    t0, c0 = time.perf_counter(), pb.calls
    order = order if order is not None else decision_order(pb)
    cl = pb.graph.classes
    vals = pb.base.copy()
    cur = pb.score(vals)
    for t, d in order:
        if vals[cl.tensor_classes[t][d]] != UNKNOWN:
            continue
        p = pb.propagate({(t, d): pb.axis}, base=vals)
        if p.conflict is None:
            sc = pb.score(p.values)
            if sc < cur:
                vals, cur = p.values, sc
                continue
        vals = pb.propagate({(t, d): None}, base=vals).values
    vals[vals == UNKNOWN] = REPLICATED
    return result_from_values(pb, "greedy", vals, t0, c0)


def random_search(pb: ShardProblem, calls: int, seed: int = 0, order=None) -> ShardResult:
    """Coin-flip episodes in the decision order until ``calls`` propagation calls are spent.

    The budget can run out inside an episode: that last episode is scored with its undecided dims
    replicated (the score counts only splits, so it is the plan returned if it wins) and is reported
    apart from the complete ones, so a budget below one episode's calls is visible in the notes. The
    decision order's own propagations (linkage groups) count against ``calls`` too; a budget they use up
    is an error naming ``budget``, not a replicate-everything plan."""
    t0, c0 = time.perf_counter(), pb.calls
    rng = np.random.default_rng(seed)
    order = order if order is not None else decision_order(pb)
    order_calls = pb.calls - c0
    if order_calls >= calls:
        raise ValueError(f"budget: random search spends {order_calls} propagation calls on its decision "
                         f"order before any episode; give more than {order_calls} (got {calls})")
    cl = pb.graph.classes
    best, best_v, episodes, cut = None, None, 0, 0
    while pb.calls - c0 < calls:
        vals = pb.base.copy()
        for t, d in order:
            if vals[cl.tensor_classes[t][d]] != UNKNOWN:
                continue
            if pb.calls - c0 >= calls:
                cut = 1
                break
            if rng.random() < 0.5:
                p = pb.propagate({(t, d): pb.axis}, base=vals)
                if p.conflict is None:
                    vals = p.values
                    continue
            vals = pb.propagate({(t, d): None}, base=vals).values
        episodes += 1 - cut
        sc = pb.score(vals)
        if best is None or sc < best:
            best, best_v = sc, vals.copy()
    if best_v is None:
        best_v = pb.base.copy()
    best_v[best_v == UNKNOWN] = REPLICATED
    res = result_from_values(pb, "random", best_v, t0, c0, evaluated=episodes + cut)
    res.notes.append(f"{episodes} complete episodes, seed {seed} ({order_calls} calls on the decision order)"
                     + (f"; the budget of {calls} propagation calls ended one more episode early, its "
                        "undecided dims replicated" if cut else ""))
    return res


def megatron(pb: ShardProblem) -> ShardResult:
    t0, c0 = time.perf_counter(), pb.calls
    g = pb.graph
    ref = g.meta.get("megatron")
    if pb.mode != "opp" or ref is None:
        raise ValueError(
            "algo 'megatron' needs mode 'opp' and a graph with Megatron roles (meta['megatron'])"
        )
    vals, notes = pb.base.copy(), []
    for t in pb.variables:
        d = ref.get(g.tensors[t].name)
        p = pb.propagate(pb.decisions({t: d}), base=vals)
        if p.conflict is not None and d is not None:
            notes.append(
                f"{g.tensors[t].name}: Megatron splits dim {d}, which conflicts ({p.conflict.reason}); "
                "replicated"
            )
            p = pb.propagate(pb.decisions({t: None}), base=vals)
        if p.conflict is not None:
            raise RuntimeError(f"megatron: replicating {g.tensors[t].name} conflicts: {p.conflict}")
        vals = p.values
    vals[vals == UNKNOWN] = REPLICATED
    return result_from_values(pb, "megatron", vals, t0, c0, notes=notes)


def adp_exhaustive(pb: ShardProblem, limit: int = 100_000) -> ShardResult:
    """ADP by enumerating every candidate's choice (Auto-MAP's T5-base has 10 candidates, ours 5)."""
    if pb.mode != "adp":
        raise ValueError("adp_exhaustive needs mode 'adp'")
    res = brute_force(pb, limit)
    res.algo = "exhaustive"
    return res


def differences(a: ShardResult, b: ShardResult) -> list[str]:
    """Variables whose choice differs between two results, as 'name: a -> b'."""
    return [f"{k}: {b.choice.get(k)} -> {v}" for k, v in a.choice.items() if b.choice.get(k) != v]
