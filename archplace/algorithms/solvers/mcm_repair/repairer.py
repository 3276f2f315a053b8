"""The driver, on top of the package: :class:`MCMRepairer` and :func:`repair`.

:class:`MCMRepairer` builds the model of one graph once (the variables, Eq. 2 and Eq. 3 in ``pywrapcp``,
Eq. 4 through ``propagation._State``, and the ``chain`` / ``cap`` variables of the restart stages) and
runs the stages of each repair in turn: "eq4", "cpsat", "chain", "chain-cap<k>", "complete" (package doc,
"Restarts"). :func:`repair` is the one-call form, with the models of the last few graphs cached.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
from ortools.constraint_solver import pywrapcp

from .common import _MODES, MAX_CHIPS, RepairResult
from .cpsat import _cpsat_repair, _static_ok
from .graph import _random_topo, _skip_triples
from .propagation import _State
from .search import _RepairBuilder


def _as_edges(src, dst) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(src)
    d = np.asarray(dst)
    if s.ndim != 1 or d.ndim != 1 or s.shape != d.shape:
        raise ValueError(f"src and dst must be 1-D arrays of equal length, got shapes {s.shape} and "
                         f"{d.shape}")
    if s.size and not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(d.dtype, np.integer)):
        raise ValueError("src and dst must hold integer node indices")
    return s.astype(np.int64), d.astype(np.int64)


class MCMRepairer:
    """The repair model of one graph (variables, Eq. 2–4 constraints), reusable across many repairs.

    ``restart_failures`` and ``chain_failures`` (attributes) are the failure limits of the restart stages;
    ``cpsat`` (on/off), ``cpsat_full_chips``, ``cpsat_window`` and ``cpsat_dtime`` set the CP-SAT stage
    (module doc). ``num_nodes`` defaults to ``max(src, dst) + 1``.
    """

    def __init__(self, num_chips: int, src, dst, num_nodes: int | None = None):
        num_chips = int(num_chips)
        if not 1 <= num_chips <= MAX_CHIPS:
            raise ValueError(f"num_chips is {num_chips}, must be in [1, {MAX_CHIPS}]")
        s, d = _as_edges(src, dst)
        n = int(max(s.max(initial=-1), d.max(initial=-1)) + 1) if num_nodes is None else int(num_nodes)
        if s.size and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= n):
            raise ValueError(f"src/dst hold node indices outside [0, {n})")
        self.num_chips = num_chips
        self.num_nodes = n
        self.src, self.dst = s, d
        preds: list[set[int]] = [set() for _ in range(n)]
        succs: list[set[int]] = [set() for _ in range(n)]
        for a, b in zip(s.tolist(), d.tolist()):
            if a != b:
                succs[a].add(b)
                preds[b].add(a)
        self._preds = [sorted(p) for p in preds]
        self._succs = [sorted(q) for q in succs]
        slv = pywrapcp.Solver("mcm-repair")
        self._solver = slv
        ys = [slv.IntVar(0, num_chips - 1, f"y{u}") for u in range(n)]
        self._ys = ys
        for a, b in {(a, b) for a, b in zip(s.tolist(), d.tolist()) if a != b}:
            slv.Add(ys[a] <= ys[b])  # Eq. 2
        if n and num_chips > 1:  # Eq. 3
            cards = [slv.IntVar(0, n, f"card{c}") for c in range(num_chips)]
            slv.Add(slv.Distribute(ys, cards))
            used = [slv.IsGreaterOrEqualCstVar(cards[c], 1) for c in range(num_chips)]
            for c in range(num_chips - 1):
                slv.Add(used[c] >= used[c + 1])
            self._keep = (cards, used)
        tri = _skip_triples(n, self._preds, self._succs)
        self._st = _State(slv, ys, self._preds, self._succs, num_chips, tri)  # Eq. 4, Eq. 3 matching
        slv.Add(self._st)
        # restarts: chain = 1 adds the sufficient condition y_dst <= y_src + 1; cap bounds every chip
        self._chainvar = slv.IntVar(0, 1, "chain")
        for a, b in {(a, b) for a, b in zip(s.tolist(), d.tolist()) if a != b}:
            slv.Add(ys[b] <= ys[a] + (num_chips + 1) - self._chainvar * num_chips)
        self._capvar = slv.IntVar(0, num_chips - 1, "cap")
        for v in ys:
            slv.Add(v <= self._capvar)
        self._pos = pywrapcp.RevInteger(0)
        self._limits: dict[int, object] = {}
        self._pairs = sorted({(a, b) for a, b in zip(s.tolist(), d.tolist()) if a != b})
        self._pins: dict[int, set[int]] = {}
        self.restart_failures = max(32, n // 4)  # stage "eq4" failure limit (<= 0: straight to "complete")
        self.chain_failures = max(64, n)  # failure limit of the chain stages
        self.cpsat = True  # run the "cpsat" stage when "eq4" gives up (module doc)
        self.cpsat_full_chips = 12  # up to this many chips every node's CP-SAT domain is every chip
        self.cpsat_window = 2  # else: the chips within this distance of the reference, and the proposal
        self.cpsat_dtime = 1.0  # CP-SAT deterministic time limit (seconds of its own clock)

    def _cpsat_stage(self, mode: str, y: list[int] | None, probs: np.ndarray | None, ref: list[int],
                     rng: np.random.Generator, deadline: float) -> list[int] | None:
        """The "cpsat" stage: CP-SAT over domains around the valid partition ``ref`` (hinted), maximising
        the nodes kept at ``y`` (FIX) or the Gumbel-perturbed log-probability (SAMPLE). Returns the
        partition when it is valid and scores at least ``ref``, else ``None``."""
        n, C = self.num_nodes, self.num_chips
        if mode == "fix":
            target = y
            weights = [{y[u]: 1} for u in range(n)]
        else:
            # Gumbel-max: argmax_d (log p + g) is a sample of p_u; the perturbed log-probability is the
            # objective, so repeated SAMPLE calls give different partitions
            lp = np.log(np.maximum(probs, 1e-9)) + rng.gumbel(size=probs.shape)
            target = lp.argmax(axis=1).tolist()
            wi = np.rint((lp - lp.max(axis=1, keepdims=True)) * 100).astype(np.int64).tolist()
        full = list(range(min(C, n))) if C <= self.cpsat_full_chips else None
        w = self.cpsat_window
        doms = []
        for u in range(n):
            dom = set(full) if full is not None else set(range(max(0, ref[u] - w), min(C, ref[u] + w + 1)))
            dom.add(target[u])
            if u in self._pins:
                dom &= self._pins[u]
            dom.add(ref[u])
            doms.append(sorted(dom))
        if mode == "sample":
            weights = [{d: wi[u][d] for d in doms[u]} for u in range(n)]
        else:
            weights = [{c: v for c, v in weights[u].items() if c in doms[u]} for u in range(n)]
        seed = int(rng.integers(1 << 30))
        out = _cpsat_repair(min(C, n), self._pairs, doms, ref, weights, seed, self.cpsat_dtime,
                            deadline - time.perf_counter())
        if out is None or not _static_ok(C, self._pairs, out):
            return None

        def score(f):
            return sum(weights[u].get(f[u], 0) for u in range(n))

        return out if score(out) >= score(ref) else None

    def restrict(self, node: int, chips) -> None:
        """Permanently limit ``node`` to ``chips`` for every later repair (pinned ops; also the only way to
        make the static problem infeasible, since all nodes on chip 0 always meets Eqs. 2–4)."""
        if not 0 <= int(node) < self.num_nodes:
            raise ValueError(f"node is {node}, must be in [0, {self.num_nodes})")
        vals = sorted({int(c) for c in np.asarray(chips).ravel().tolist()} & set(range(self.num_chips)))
        slv = self._solver
        slv.Add(slv.MemberCt(self._ys[int(node)], vals) if vals else slv.FalseConstraint())
        self._pins[int(node)] = self._pins.get(int(node), set(range(self.num_chips))) & set(vals)

    def repair(self, mode: str = "fix", y=None, probs=None, seed: int = 0, order=None,
               time_limit_s: float = 10.0) -> RepairResult:
        """One SAMPLE or FIX repair; see :func:`repair`."""
        n, C = self.num_nodes, self.num_chips
        if mode not in _MODES:
            raise ValueError(f"mode is {mode!r}, must be one of {_MODES}")
        yl = None
        if y is not None:
            ya = np.asarray(y)
            if ya.shape != (n,) or (ya.size and not np.issubdtype(ya.dtype, np.integer)):
                raise ValueError(f"y must be an integer array of shape ({n},), got {ya.dtype} {ya.shape}")
            if ya.size and (ya.min() < 0 or ya.max() >= C):
                raise ValueError(f"y holds chips outside [0, {C})")
            yl = ya.astype(np.int64).tolist()
        elif mode == "fix":
            raise ValueError("y is required in mode 'fix'")
        pr = None
        if mode == "sample" and probs is None:
            raise ValueError("probs is required in mode 'sample'")
        if probs is not None:
            pr = np.asarray(probs, dtype=np.float64)
            if pr.shape != (n, C):
                raise ValueError(f"probs must have shape ({n}, {C}), got {pr.shape}")
            if not np.isfinite(pr).all() or (pr < 0).any():
                raise ValueError("probs must be finite and non-negative")
        rng = np.random.Generator(np.random.PCG64(seed))
        if order is None:
            ordl = _random_topo(n, self._succs, rng) or rng.permutation(n).tolist()
        else:
            oa = np.asarray(order)
            if oa.shape != (n,) or (n and not np.issubdtype(oa.dtype, np.integer)) or \
                    not np.array_equal(np.sort(oa), np.arange(n)):
                raise ValueError(f"order must be a permutation of range({n})")
            ordl = oa.astype(np.int64).tolist()
        if not time_limit_s > 0:
            raise ValueError(f"time_limit_s is {time_limit_s}, must be > 0")
        slv = self._solver
        ms = max(1, int(round(time_limit_s * 1000)))
        limit = self._limits.get(ms)
        if limit is None:
            limit = self._limits[ms] = slv.TimeLimit(ms)
        st = self._st
        st.reset()
        f0, b0 = slv.Failures(), slv.Branches()
        t0 = time.perf_counter()
        deadline = t0 + time_limit_s
        stage = "eq4" if self.restart_failures > 0 else "complete"
        cap = C - 1
        while True:
            chain = int(stage.startswith("chain"))
            if stage == "complete":
                lim = 1 << 62
            else:
                lim = slv.Failures() + (self.chain_failures if chain else self.restart_failures)
            db = _RepairBuilder(self, mode, ordl, yl, pr, rng, deadline, lim, cap, chain)
            found = slv.Solve(db, [limit])
            if (found and db.solution is not None) or db.timed_out or stage == "complete":
                break
            if not db.aborted and stage == "eq4":
                break  # the search of Eqs. 2-4 was exhausted: infeasible
            if db.aborted and stage == "eq4":
                stage = "chain"
            elif db.aborted and cap > 0:
                cap //= 2
                stage = f"chain-cap{cap}"
            else:
                cap, stage = C - 1, "complete"  # a restricted stage was exhausted
            st.reset()
        sol = db.solution if found else None
        if sol is not None and stage not in ("eq4", "complete") or (stage == "complete" and sol is not None
                                                                     and self.restart_failures > 0):
            # "eq4" gave up: the minimal-change (FIX) / most likely (SAMPLE) partition near this one
            if self.cpsat and time.perf_counter() < deadline:
                best = self._cpsat_stage(mode, yl, pr, sol, rng, deadline)
                if best is not None:
                    sol, stage = best, "cpsat"
        wall = time.perf_counter() - t0
        fails, branches = slv.Failures() - f0, slv.Branches() - b0
        if sol is not None:
            part = np.asarray(sol, dtype=np.int64)
            changed = int((part != np.asarray(yl)).sum()) if yl is not None else 0
            return RepairResult(part, "valid", changed, int(fails), int(branches), wall, stage)
        status = "unknown" if db.timed_out or time.perf_counter() >= deadline else "infeasible"
        return RepairResult(None, status, 0, int(fails), int(branches), wall, stage)


_CACHE: OrderedDict[tuple, MCMRepairer] = OrderedDict()
_CACHE_SIZE = 8


def repair(num_chips: int, src, dst, mode: str = "fix", y=None, probs=None, seed: int = 0, order=None,
           time_limit_s: float = 10.0, *, num_nodes: int | None = None) -> RepairResult:
    """Repair a candidate partition into one that satisfies Eqs. 2–4 (spec §3, paper Algorithms 1/2).

    ``mode="fix"`` needs ``y`` (shape ``[N]``, chips in ``[0, num_chips)``): nodes keep their chip when it is
    still in their domain, the others get a chip of their domain in a second pass, drawn from ``probs``
    (optional here, shape ``[N, num_chips]``) renormalised over the domain, uniformly without ``probs``.
    ``mode="sample"`` needs ``probs`` (shape ``[N, num_chips]``, non-negative): each node samples from its
    row renormalised over its domain; a ``y`` given here only feeds ``changed``. ``order`` is the node
    order (a permutation of ``range(N)``; default: a random topological order from ``seed``). ``N`` is the
    length of ``y`` or ``probs`` (or ``num_nodes``). The result depends only on the arguments (the search,
    CP-SAT stage included, is deterministic given ``seed``) unless ``time_limit_s`` cuts it short;
    ``status`` is "valid", "infeasible" or "unknown" and ``stage`` tells which restart stage produced it
    (module doc). The model of a graph is cached (the last few graphs), so repeated calls on one graph pay
    only for the search (and the CP-SAT stage, when it runs, for its per-repair model).
    """
    n = num_nodes
    for name, arr, dims in (("y", y, 1), ("probs", probs, 2)):
        if arr is not None:
            a = np.asarray(arr)
            if a.ndim != dims:
                raise ValueError(f"{name} must be {dims}-D, got shape {a.shape}")
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                raise ValueError(f"{name} has {a.shape[0]} nodes, expected {n}")
    if n is None:
        raise ValueError("y (mode 'fix') or probs (mode 'sample') is required")
    s, d = _as_edges(src, dst)
    key = (int(num_chips), int(n), s.tobytes(), d.tobytes())
    rep = _CACHE.get(key)
    if rep is None:
        rep = MCMRepairer(num_chips, s, d, num_nodes=n)
        _CACHE[key] = rep
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return rep.repair(mode, y=y, probs=probs, seed=seed, order=order, time_limit_s=time_limit_s)
