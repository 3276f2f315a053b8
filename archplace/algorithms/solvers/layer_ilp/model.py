"""What both ILP backends share: the index arrays of every constraint family of one lazy round
(``_Spec``) and the raw answer a backend returns (``_Raw``).

Both are pickled to and from the solver worker subprocesses (``workers.py``), so they hold plain
arrays, not solver objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .contention import SHARE_QUANTUM, demands
from .problem import KIND_FUSED, KIND_TC, KIND_VC, LayerProblem


@dataclass
class _Spec:
    """Index arrays of every constraint family for one round (``tc``/``vc``: z present)."""

    n: int
    reach: np.ndarray
    inc_i: np.ndarray  # ordered incomparable pairs (i, j), i != j
    inc_j: np.ndarray
    prec_i: np.ndarray  # i ≺ j
    prec_j: np.ndarray
    tri: np.ndarray  # (m, 3) transitivity triples (i, j, k) to emit
    k_tc: int
    k_vc: int
    tc: bool
    vc: bool
    # shared bandwidth (HiGHS only; CP-SAT uses cumulatives): incomparable pairs whose demands sum
    # above the capacity on some resource, and the lazy cuts' op sets (each: some pair is ordered)
    share_pairs: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    share_cuts: list = field(default_factory=list)


def _build_spec(problem: LayerProblem, tc: bool, vc: bool, share_cuts=()) -> _Spec:
    n = problem.num_ops
    r = problem.reach()
    eye = np.eye(n, dtype=bool)
    inc = ~r & ~r.T & ~eye
    inc_i, inc_j = np.nonzero(inc)
    prec_i, prec_j = np.nonzero(r)
    # F: 1 fixed (i ≺ j), 0 fixed (j ≺ i), -1 variable (incomparable)
    f = np.where(r, 1, np.where(r.T, 0, -1)).astype(np.int8)
    f[eye] = 0
    # keep triples (i, j, k) distinct where the constraint is not a tautology given (5)/(6)
    fij = f[:, :, None]
    fjk = f[None, :, :]
    fik = f[:, None, :]
    keep = (fik != 1) & (fij != 0) & (fjk != 0) & ~((fij == 1) & (fjk == 1))
    keep &= ~eye[:, :, None] & ~eye[None, :, :] & ~eye[:, None, :]
    tri = np.argwhere(keep)
    k = problem.kind
    n_tc = int(((k == KIND_TC) | (k == KIND_FUSED)).sum())
    n_vc = int(((k == KIND_VC) | (k == KIND_FUSED)).sum())
    pairs = np.zeros((0, 2), dtype=np.int64)
    if problem.has_contention:
        dem = demands(problem)
        over = ((dem[:, :, None] + dem[:, None, :]) > SHARE_QUANTUM).any(axis=0)
        pairs = np.argwhere(np.triu(over & inc, 1)).astype(np.int64)
    return _Spec(n, r, inc_i, inc_j, prec_i, prec_j, tri, min(problem.num_tc, n_tc),
                 min(problem.num_vc, n_vc), tc, vc, pairs, [tuple(c) for c in share_cuts])


@dataclass
class _Raw:
    """What a backend returns for one round."""

    has_solution: bool
    optimal: bool
    obj_s: float
    bound_s: float
    start_s: np.ndarray | None = None
    end_s: np.ndarray | None = None  # solver's own finish times (its latency model)
    y: np.ndarray | None = None
    x: np.ndarray | None = None  # bool n×n
    z_tc: np.ndarray | None = None  # core per op or -1
    z_vc: np.ndarray | None = None
    name: str = ""
    stop: str = "solver_failed"  # why the solver stopped (``budget.STOP_REASONS``)
    dtime: float = 0.0  # deterministic seconds spent (HiGHS: nodes / MILP_NODES_PER_DTIME)


def _z_ops(problem: LayerProblem, spec: _Spec) -> tuple[np.ndarray, np.ndarray]:
    k = problem.kind
    return (k != KIND_VC), (k != KIND_TC)  # may use TC / may use VC


def _z_argmax(zv: np.ndarray | None, n: int) -> np.ndarray | None:
    if zv is None:
        return None
    zv = np.asarray(zv).reshape(n, -1) > 0.5
    return np.where(zv.any(axis=1), zv.argmax(axis=1), -1).astype(np.int64)
