"""A whole graph: every layer's forward and backward instance, deduplicated by cache key
(``plan_layer_schedules``), and ``schedule_layers`` that solves the unique ones in-process.

The plan is separate from the solving so that ``platform`` can solve the unique instances on a pool
of Ray actors and ``assemble`` the per-layer makespans here, without this package importing ray.

Shared bandwidth: given per-row ``hbm_share``/``glb_share`` (``OpEstimates``) and ``contention``
(default True), every instance carries its ops' shares (``contention.py``); without the shares, or
with ``contention=False``, the instances are the paper's model and keep their old cache keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .cache import schedule_cache_key
from .problem import LayerProblem, _problem_from_rows
from .schedule import LayerSchedule
from .solve import solve_layer


def layer_problems(g: Any, est_single_s: Any, est_all_s: Any, num_tc: int, num_vc: int,
                   hbm_share: Any = None, glb_share: Any = None) -> dict[str, list[LayerProblem]]:
    """Every layer's forward and backward ``LayerProblem`` (lists indexed by layer), with the
    per-row bandwidth shares when given."""
    out = {"forward": [], "backward": []}
    for _, _, bw, prob in _iter_layer_problems(g, est_single_s, est_all_s, num_tc, num_vc, {},
                                               hbm_share, glb_share):
        out["backward" if bw else "forward"].append(prob)
    return out


def _iter_layer_problems(g: Any, single: Any, all_: Any, num_tc: int, num_vc: int, memo: dict,
                         hbm_share: Any = None, glb_share: Any = None):
    from ....workloads.layers import structural_hashes

    single = np.asarray(single, dtype=np.float64)
    all_ = np.asarray(all_, dtype=np.float64)
    if single.shape != (g.num_nodes,) or all_.shape != (g.num_nodes,):
        raise ValueError(f"latency arrays must have one entry per graph row ({g.num_nodes}); got "
                         f"{single.shape} and {all_.shape}")
    shares = []
    for f, a in (("hbm_share", hbm_share), ("glb_share", glb_share)):
        if a is not None:
            a = np.asarray(a, dtype=np.float64)
            if a.shape != (g.num_nodes,):
                raise ValueError(f"{f} must have one entry per graph row ({g.num_nodes}); got {a.shape}")
        shares.append(a)
    names = tuple(g.meta.get("layers", ()))
    if not names:
        raise ValueError(f"graph {g.meta.get('model')!r} has no layers (meta['layers'] is empty)")
    hashes = structural_hashes(g)
    layer = g.nodes["layer"]
    bwd = g.nodes["is_backward"]
    src, dst = g.edge_pos
    topo = g.topo_order()
    topo_pos = np.empty(g.num_nodes, dtype=np.int64)
    topo_pos[topo] = np.arange(g.num_nodes)
    for bw in (False, True):
        for li in range(len(names)):
            rows = np.flatnonzero((layer == li) & (bwd == bw))
            mkey = (hashes[li], bw, single[rows].tobytes(), all_[rows].tobytes(),
                    *(None if a is None else a[rows].tobytes() for a in shares))
            if mkey in memo:
                yield li, mkey, bw, memo[mkey]
                continue
            local = np.full(g.num_nodes, -1, dtype=np.int64)
            local[rows] = np.arange(len(rows))
            inside = (local[src] >= 0) & (local[dst] >= 0)
            ltopo = local[rows[np.argsort(topo_pos[rows])]]
            prob = _problem_from_rows(g.nodes["core"][rows], g.nodes["name"][rows], local[src[inside]],
                                      local[dst[inside]], single[rows], all_[rows], num_tc, num_vc, ltopo,
                                      *(None if a is None else a[rows] for a in shares))
            memo[mkey] = prob
            yield li, mkey, bw, prob


@dataclass
class LayerPlan:
    """Every layer's forward and backward ILP instance of one graph, deduplicated by cache key.

    ``keys[pass][layer]`` names the instance in ``problems`` (unique, insertion order); the split
    lets a caller solve the unique instances anywhere (in-process, or on a pool of solver actors
    with a shared cache) and then ``assemble`` the per-layer makespans.
    """

    layers: tuple[str, ...]
    keys: dict[str, list[str]]
    problems: dict[str, LayerProblem]
    sequential_s: dict[str, np.ndarray]
    num_ops: dict[str, np.ndarray]

    @property
    def lookups(self) -> int:
        return len(self.keys["forward"]) + len(self.keys["backward"])

    def assemble(self, makespan_s: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """Per-layer forward and backward makespans from the makespan of each unique key."""
        missing = [k for k in self.problems if k not in makespan_s]
        if missing:
            raise KeyError(f"{len(missing)} layer schedule(s) missing, e.g. {missing[0]}")
        return tuple(np.array([makespan_s[k] for k in self.keys[p]], dtype=np.float64)
                     for p in ("forward", "backward"))


def plan_layer_schedules(g: Any, est_single_s: Any, est_all_s: Any, num_tc: int, num_vc: int,
                         hbm_share: Any = None, glb_share: Any = None, **settings: Any) -> LayerPlan:
    """The unique layer-slice ILP instances of a graph and which layer uses which. ``hbm_share`` /
    ``glb_share``: per-row bandwidth shares (``OpEstimates``), attached to the instances unless
    ``settings["contention"]`` is False. ``settings`` are ``solve_layer`` options; those that enter
    the cache key (backend, budget, rel_gap, lazy, decompose, contention, large_budget, large_min_ops,
    num_workers) are used, the others (the wall-clock limits, the cache) ignored."""
    names = tuple(g.meta.get("layers", ()))
    L = len(names)
    settings = {k: settings[k] for k in ("backend", "budget", "rel_gap", "lazy", "decompose", "contention",
                                         "large_budget", "large_min_ops", "num_workers")
                if k in settings and settings[k] is not None}
    if not settings.get("contention", True):
        hbm_share = glb_share = None
    keys = {"forward": [""] * L, "backward": [""] * L}
    seq = {"forward": np.zeros(L), "backward": np.zeros(L)}
    num_ops = {"forward": np.zeros(L, np.int64), "backward": np.zeros(L, np.int64)}
    problems: dict[str, LayerProblem] = {}
    memo: dict = {}
    by_mkey: dict = {}
    for li, mkey, bw, prob in _iter_layer_problems(g, est_single_s, est_all_s, num_tc, num_vc, memo,
                                                   hbm_share, glb_share):
        pas = "backward" if bw else "forward"
        key = by_mkey.get(mkey)
        if key is None:
            key = by_mkey[mkey] = schedule_cache_key(prob, **settings)
            problems.setdefault(key, prob)
        keys[pas][li] = key
        seq[pas][li] = float(prob.intra_latency_s.sum())
        num_ops[pas][li] = prob.num_ops
    return LayerPlan(names, keys, problems, seq, num_ops)


def schedule_layers(g: Any, est_single_s: Any, est_all_s: Any, num_tc: int, num_vc: int,
                    hbm_share: Any = None, glb_share: Any = None, **solve_kw: Any) -> dict[str, Any]:
    """Solve every layer's forward and backward subgraph; each distinct (structural hash, pass,
    latencies, shares) is solved once, so repeated transformer blocks share one solve. With per-row
    ``hbm_share``/``glb_share`` and ``contention`` (a ``solve_kw``, default True) the schedules
    respect the shared HBM/GLB bandwidth; without shares they are the paper's model.

    Returns a dict with ``forward_s``/``backward_s`` (ILP makespans, arrays indexed by layer),
    ``sequential_forward_s``/``sequential_backward_s`` (Σ ℓ̂ baselines), ``keys`` (per pass, the
    cache key of each layer), ``schedules`` and ``problems`` (by key, the unique ones), ``num_ops``
    (per pass, ops after dropping ``none``), and counts: ``unique`` (distinct problems, both
    passes), ``unique_forward``, ``unique_backward``, ``solved`` (actually solved now),
    ``cache_hits`` (layer lookups answered without a solve, including repeats within this call)
    and ``solve_time_s`` (sum over the solves done now).
    """
    plan = plan_layer_schedules(g, est_single_s, est_all_s, num_tc, num_vc, hbm_share, glb_share, **solve_kw)
    schedules: dict[str, LayerSchedule] = {}
    solved, solve_time = 0, 0.0
    for key, prob in plan.problems.items():
        s = solve_layer(prob, **solve_kw)
        if not s.from_cache:
            solved += 1
            solve_time += s.solve_time_s
        schedules[key] = s
    fw, bw = plan.assemble({k: s.makespan_s for k, s in schedules.items()})
    return {
        "layers": plan.layers, "forward_s": fw, "backward_s": bw,
        "sequential_forward_s": plan.sequential_s["forward"],
        "sequential_backward_s": plan.sequential_s["backward"],
        "keys": plan.keys, "num_ops": plan.num_ops, "schedules": schedules, "problems": plan.problems,
        "solved": solved, "cache_hits": plan.lookups - solved, "solve_time_s": solve_time,
        "unique": len(schedules), "unique_forward": len(set(plan.keys["forward"])),
        "unique_backward": len(set(plan.keys["backward"])),
    }
