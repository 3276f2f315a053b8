"""The "cpsat" stage (ours, package doc "Restarts", stage 2): the CP-SAT model and the check of its output.

``_cpsat_repair`` solves the best partition within given domains under Eqs. 2–4; ``_static_ok`` checks
Eqs. 2–4 on the partition it returns. ``repairer.MCMRepairer._cpsat_stage`` chooses the domains around a
valid reference partition and the weights (FIX: nodes kept at ``y``; SAMPLE: Gumbel-perturbed
log-probabilities).
"""

from __future__ import annotations

from .common import _bits


def _cpsat_repair(C: int, pairs: list[tuple[int, int]], doms: list[list[int]], hint: list[int],
                  weights: list[dict[int, int]], seed: int, dtime: float, wall: float) -> list[int] | None:
    """The best partition with ``y_u`` in ``doms[u]`` under Eqs. 2–4, maximising ``sum_u weights[u][y_u]``
    (CP-SAT, one worker, ``random_seed=seed``, ``dtime`` deterministic seconds, at most ``wall`` seconds);
    ``hint`` is a valid partition inside the domains. ``None`` when CP-SAT returns no solution.

    Model (as ``mcm_exact``, on the chips ``0..M-1`` that some domain holds): ``x[u, d]`` for ``d`` in
    ``doms[u]``, exactly one per node, ``y_u = sum_d d x[u, d]``, Eq. 2 as ``y_src <= y_dst``; Eq. 3 with
    ``used_d`` (``x[u, d] => used_d``, ``used_d => OR_u x[u, d]``, ``used_{d+1} => used_d``); Eq. 4 with
    chip-pair booleans ``e[a, b]`` (implied by ``x[u, a] and x[v, b]`` for an edge ``(u, v)``, created only
    for pairs some edge's domains allow) and reachability ``r[a, b]`` (implied by ``e[a, b]`` and by
    ``r[a, k] and e[k, b]``), ``not (e[a, b] and r[a, k] and r[k, b])``. Only the implying direction is
    needed: the true chip graph satisfies the clauses exactly when the partition meets Eq. 4."""
    from ortools.sat.python import cp_model

    n = len(doms)
    M = max(max(d) for d in doms) + 1 if n else 1
    md = cp_model.CpModel()
    x: list[dict[int, object]] = []
    ys = []
    for u in range(n):
        xu = {d: md.new_bool_var(f"x{u}_{d}") for d in doms[u]}
        x.append(xu)
        md.add_exactly_one(list(xu.values()))
        yu = md.new_int_var_from_domain(cp_model.Domain.from_values(doms[u]), f"y{u}")
        md.add(yu == sum(d * b for d, b in xu.items() if d))
        ys.append(yu)
    for a, b in pairs:  # Eq. 2
        md.add(ys[a] <= ys[b])
    on: list[list] = [[] for _ in range(M)]
    for u in range(n):
        for d, b in x[u].items():
            on[d].append(b)
    used = [md.new_bool_var(f"used{d}") for d in range(M)]  # Eq. 3
    for d in range(M):
        for b in on[d]:
            md.add_implication(b, used[d])
        md.add_bool_or(on[d] + [~used[d]])
        if d + 1 < M:
            md.add_implication(used[d + 1], used[d])
    e: dict[tuple[int, int], object] = {}  # Eq. 4
    for u, v in pairs:
        xu, xv = x[u], x[v]
        for a, ba in xu.items():
            for b, bb in xv.items():
                if a < b:
                    eab = e.get((a, b))
                    if eab is None:
                        eab = e[a, b] = md.new_bool_var(f"e{a}_{b}")
                    md.add_bool_or([~ba, ~bb, eab])
    r = {(a, b): md.new_bool_var(f"r{a}_{b}") for a in range(M) for b in range(a + 1, M)}
    for (a, b), eab in e.items():
        md.add_implication(eab, r[a, b])
        for k in range(a + 1, b):
            md.add_bool_or([~eab, ~r[a, k], ~r[k, b]])
    for (k, b), ekb in e.items():
        for a in range(k):
            md.add_bool_or([~r[a, k], ~ekb, r[a, b]])
    md.maximize(sum(w * x[u][d] for u in range(n) for d, w in weights[u].items() if w))
    for u in range(n):
        md.add_hint(ys[u], hint[u])
        for d, b in x[u].items():
            md.add_hint(b, d == hint[u])
    slv = cp_model.CpSolver()
    prm = slv.parameters
    prm.num_workers = 1
    prm.random_seed = int(seed)
    prm.max_deterministic_time = max(float(dtime), 1e-3)
    prm.max_time_in_seconds = max(float(wall), 1e-3)
    st = slv.solve(md)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [int(slv.value(v)) for v in ys]


def _static_ok(C: int, pairs: list[tuple[int, int]], f: list[int]) -> bool:
    """Eqs. 2–4 for a full partition (a final check of the CP-SAT stage's output)."""
    if not f:
        return True
    if min(f) < 0 or max(f) >= C or len(set(f)) != max(f) + 1:
        return False
    A = [0] * C
    for a, b in pairs:
        fa, fb = f[a], f[b]
        if fa > fb:
            return False
        if fa < fb:
            A[fa] |= 1 << fb
    R2 = [0] * C  # chips reachable by a path of length >= 2
    R = [0] * C  # reachable by length >= 1
    for a in range(C - 1, -1, -1):
        for k in _bits(A[a]):
            R2[a] |= R[k]
            R[a] |= (1 << k) | R[k]
        if A[a] & R2[a]:
            return False
    return True
