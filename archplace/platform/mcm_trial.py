"""One MCM co-design trial (``archplace search --target mcm``): a package of identical chiplets from the
hardware space, every model partitioned on it by the chosen placer, the partitions evaluated by the MCM
simulator, the package priced by the chiplet cost model.

**Hardware point** (:class:`MCMDesign`, from ``tune_configs/mcm_codesign.yaml``): chiplets, PE array side
and clock, SRAM, die-to-die link bandwidth and energy, ring or 2-D mesh. The chiplet is the MCM preset's
(``hardware/presets.py`` ``MCM_CHIPLET``: one tensor core of ``pe × pe`` int8 MACs, SRAM as its only
memory, its SRAM bandwidth ``pe`` bytes per cycle, which is the preset's 64 B/cycle at ``pe`` 64) with
those fields changed. Op times come from the analytical estimator on that chiplet
(``MCMProblem.from_graph``).

**Topology.** The MCM partition model (paper Eqs. 2-4, ``simulators/mcm.py``) pipelines a model over a
chain of chips. A ring runs that chain on its own links and is evaluated by the simulator as it is. A 2-D
mesh (``mesh_grid``: the most square rows × cols) runs the chain along a snake (boustrophedon) path, so
every chain hop is one mesh link, and a tensor that skips chips takes the mesh's shortest path instead of
every chain hop in between: :func:`mesh_chip_latency_s` routes op u's output from its chip to each chip
holding a consumer by dimension-order routing (``_route``: along the row then the column, or the
other way, whichever stays between the two chips in chain order, else the chain; links are directed,
each GB/s per direction), charges ``out_bytes[u]`` once to every link of the union of those paths
(one multicast, as the ring model sends once per span), and a chip's latency is its compute plus its
busiest outgoing link (its up to 4 ports run concurrently). A 1 × C mesh is the ring exactly, and a
mesh is never slower than the ring for the same partition (``_route``; tests check both). Eqs. 2-4 and
memory are about the pipeline order, not the wires, so validity is the simulator's ``check`` on both.
The placers optimise the chain model; on a mesh their partition is then scored by the mesh model. The
mesh chiplet pays for 4 D2D ports instead of 2 (``chiplet_cost``).

**Placers** (deterministic budgets: sub-solve counts and CP-SAT deterministic time, one CP-SAT worker,
seeded; the wall clock, ``safety_s``, is only an outer safety limit, and a row records when it stopped a
run):

* ``greedy``: the compiler heuristic with repair (``mcm_baselines.greedy``);
* ``greedy+lns``: greedy, then ``subsolves`` CP-SAT neighbourhood re-solves (``mcm_lns.lns``) of
  ``det_time`` deterministic units each;
* ``cpsat``: greedy, then one CP-SAT solve of the whole problem (the LNS model with every node free,
  hinted with greedy) of ``subsolves × det_time`` deterministic units: the same CP-SAT work as greedy+lns;
* ``ppo-pretrained``: greedy, then ``subsolves`` sub-solves whose neighbourhoods the pre-trained learned-LNS
  policy (``mcm_lns_hint``, weights ``tune_configs/mcm_large_policy.npz``, from ``bench/mcm/mcm_large.py``)
  picks, zero-shot; with ``finetune_subsolves`` > 0 the policy is first fine-tuned by PPO on this problem
  for at least that many sub-solves (whole PPO batches of 64; needs Ray);
* ``ppo-lns``: the same search with a policy trained from scratch on this problem for ``subsolves``
  sub-solves first (needs Ray).

The greedy partition is always a candidate: a placer whose answer is invalid or slower falls back to it
(the row's ``fallback`` says so). Every placer starts from it, so a model whose greedy partition breaks
memory on a package (the repair fixes Eqs. 2-4, not memory) is infeasible there ("greedy invalid", with
the simulator's reason), even where some other partition might fit. Every partition in a row passes
``simulators.mcm.check`` or the row says why not.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..hardware.chiplet_cost import TOPOLOGY_PORTS, CostParams, package_cost

PLACERS = ("greedy", "greedy+lns", "cpsat", "ppo-pretrained", "ppo-lns")
AXES = ("num_chiplets", "pe", "clock_mhz", "sram_mb", "link_gbs", "link_pj_per_bit", "topology")
DEFAULT_SPACE = "mcm_codesign.yaml"
# shipped with the package (a copy of bench/mcm/mcm_large.py's bench/mcm/results/mcm_large_policy.npz), so an
# installed archplace finds it as it finds the pipeline DQN's weights
DEFAULT_POLICY = Path(__file__).resolve().parents[1] / "tune_configs" / "mcm_large_policy.npz"


# ---------------------------------------------------------------------- the space
def load_space(spec: str | dict | None = None) -> dict[str, Any]:
    """The MCM hardware space: the packaged ``mcm_codesign.yaml`` (None), a YAML path, or its content.
    Checks every axis (one-line errors naming it) and the cost constants."""
    from ..hardware.space import read_space_spec

    cfg, where = read_space_spec(spec, DEFAULT_SPACE, "mcm space", "--space")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("axes"), dict):
        raise ValueError(f"{where}: field 'axes' is missing (a mapping of {list(AXES)} to value lists)")
    axes = cfg["axes"]
    unknown = sorted(set(axes) - set(AXES))
    if unknown:
        raise ValueError(f"{where}: unknown axis {unknown}; allowed: {list(AXES)}")
    out: dict[str, list] = {}
    for a in AXES:
        v = axes.get(a)
        if not isinstance(v, list) or not v:
            raise ValueError(f"{where}: axes.{a} must be a non-empty list, got {v!r}")
        if len(set(map(str, v))) != len(v):
            raise ValueError(f"{where}: axes.{a} lists a value twice: {v}")
        for x in v:
            _check_value(a, x, where)
        out[a] = list(v)
    cost = CostParams.from_dict(cfg.get("cost") or {})
    return {"axes": out, "cost": cost.to_dict()}


def _check_value(axis: str, x: Any, where: str) -> None:
    if axis == "topology":
        if x not in TOPOLOGY_PORTS:
            raise ValueError(f"{where}: axes.topology value {x!r} unknown; allowed: {sorted(TOPOLOGY_PORTS)}")
        return
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise ValueError(f"{where}: axes.{axis} value {x!r} must be a positive number")
    if axis == "num_chiplets" and not (isinstance(x, int) and 1 <= x <= 64):
        raise ValueError(f"{where}: axes.num_chiplets value {x!r} must be an integer in [1, 64] "
                         "(the MCM simulator's limit)")
    if axis == "pe" and not (isinstance(x, int) and x & (x - 1) == 0):
        raise ValueError(f"{where}: axes.pe value {x!r} must be a power of two (the accelerator template)")


def space_size(space: dict[str, Any]) -> int:
    return int(np.prod([len(space["axes"][a]) for a in AXES]))


def point(space: dict[str, Any], index: int) -> dict[str, Any]:
    """The ``index``-th hardware point: the axes' product in the order of :data:`AXES` (the last axis
    fastest), as a config dict."""
    sizes = [len(space["axes"][a]) for a in AXES]
    if not 0 <= index < int(np.prod(sizes)):
        raise ValueError(f"hardware point {index} outside the space of {int(np.prod(sizes))}")
    idx = np.unravel_index(index, sizes)
    return {a: space["axes"][a][int(i)] for a, i in zip(AXES, idx)}


def index_of(space: dict[str, Any], config: dict[str, Any]) -> int:
    """The index of a config's point (its axis values must be in the space)."""
    sizes = [len(space["axes"][a]) for a in AXES]
    pos = []
    for a in AXES:
        vals = [str(v) for v in space["axes"][a]]
        if str(config[a]) not in vals:
            raise ValueError(f"{a} = {config[a]!r} is not in the space's {space['axes'][a]}")
        pos.append(vals.index(str(config[a])))
    return int(np.ravel_multi_index(pos, sizes))


def all_points(space: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(AXES, v)) for v in itertools.product(*(space["axes"][a] for a in AXES))]


# ---------------------------------------------------------------------- one design
@dataclass(frozen=True)
class MCMDesign:
    num_chiplets: int
    pe: int
    clock_mhz: float
    sram_mb: float
    link_gbs: float
    link_pj_per_bit: float
    topology: str

    @classmethod
    def from_config(cls, c: dict[str, Any]) -> MCMDesign:
        return cls(int(c["num_chiplets"]), int(c["pe"]), float(c["clock_mhz"]), float(c["sram_mb"]),
                   float(c["link_gbs"]), float(c["link_pj_per_bit"]), str(c["topology"]))

    def key(self) -> str:
        return (f"mcm{self.num_chiplets}-pe{self.pe}-{self.clock_mhz:g}MHz-{self.sram_mb:g}MB-"
                f"{self.link_gbs:g}GBs-{self.link_pj_per_bit:g}pJ-{self.topology}")

    def label(self) -> str:
        return (f"{self.num_chiplets}×[{self.pe}² @{self.clock_mhz:g} MHz, {self.sram_mb:g} MB] "
                f"{self.topology} {self.link_gbs:g} GB/s")

    def chiplet(self):
        from ..hardware.presets import MCM_CHIPLET

        clock = self.clock_mhz * 1e6
        return MCM_CHIPLET.with_(pe_x=self.pe, pe_y=self.pe, pe_vc=self.pe, glb_mb=self.sram_mb,
                                 clock_hz=clock, hbm_bw=self.pe * clock, name="")

    def package(self):
        """The chain the partition model runs on (module doc: a mesh runs it along a snake path)."""
        from ..hardware.presets import Cluster

        return Cluster(self.key(), self.num_chiplets, self.chiplet(), self.link_gbs * 1e9, "uni-ring")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------- graphs
def mcm_graph(model: str, seq: int | None = None):
    """A model's forward graph for the MCM (int8, batch 1), as ``archplace partition`` builds it. A
    dnn-partitioning ``.json`` carries profiled op times of one chip, which would not change with the
    chiplet; co-design needs op times estimated per chiplet, so it is refused."""
    if model.endswith(".json") and not model.startswith("hf:"):
        raise ValueError(f"model {model!r}: a dnn-partitioning graph has profiled op times of one fixed "
                         "chip; --target mcm needs a model preset, --hf-config or a graph .parquet")
    if model.endswith(".parquet") and not model.startswith("hf:"):
        from ..workloads import OpGraph

        if not Path(model).exists():
            raise ValueError(f"graph file {model!r} does not exist")
        g = OpGraph.from_parquet(Path(model))
        return g.forward() if g.nodes["is_backward"].any() else g
    from ..workloads.models import build_graph

    return build_graph(model, seq=seq, mbs=1, training=False, bytes_per_element=1)


# ---------------------------------------------------------------------- 2-D mesh links
def mesh_grid(num_chips: int) -> tuple[int, int]:
    """(rows, cols) of a 2-D mesh of ``num_chips``: the most square factorisation, rows <= cols."""
    r = math.isqrt(num_chips)
    while num_chips % r:
        r -= 1
    return r, num_chips // r


def snake_position(num_chips: int) -> np.ndarray:
    """``[C, 2]`` (row, col) of chain chip i on the mesh: rows left to right, then right to left."""
    rows, cols = mesh_grid(num_chips)
    i = np.arange(num_chips)
    r, c = i // cols, i % cols
    return np.stack([r, np.where(r % 2 == 0, c, cols - 1 - c)], axis=1)


def mesh_chip_latency_s(problem, f: np.ndarray) -> tuple[np.ndarray, float]:
    """(``[C]`` chip latencies on the 2-D mesh, bytes over all links) of one partition (module doc)."""
    c = problem.num_chips
    cols = mesh_grid(c)[1]
    pos = snake_position(c)

    def chip(r: int, k: int) -> int:
        return r * cols + (k if r % 2 == 0 else cols - 1 - k)

    f = np.asarray(f, dtype=np.int64)
    compute = np.bincount(f, weights=problem.time_s, minlength=c)
    fu, fv = f[problem.src], f[problem.dst]
    sel = fv != fu
    # (op, consumer chip) pairs, sorted by op: each op's destinations are one run
    pairs = np.unique(np.stack([problem.src[sel], fv[sel]], axis=1), axis=0).reshape(-1, 2)
    load: dict[tuple[int, int], float] = {}
    ops, starts = np.unique(pairs[:, 0], return_index=True)
    for u, start, end in zip(ops.tolist(), starts.tolist(), [*starts[1:].tolist(), len(pairs)]):
        a = int(f[u])
        links: set[tuple[int, int]] = set()
        for d in pairs[start:end, 1].tolist():
            hops = _route(a, d, pos, chip)
            links.update(zip(hops[:-1], hops[1:]))
        for link in links:
            load[link] = load.get(link, 0.0) + float(problem.out_bytes[u])
    busiest = np.zeros(c)
    for (a, _), v in load.items():
        busiest[a] = max(busiest[a], v)
    return compute + busiest / problem.link_bw_bytes_per_s, float(sum(load.values()))


def _route(a: int, d: int, pos: np.ndarray, chip) -> list[int]:
    """The chips a tensor passes from chain chip ``a`` to ``d > a``: XY (row first), else YX, whichever
    passes only chips in ``[a, d]``, else the chain itself. Every link used then leaves a chip the ring
    model charges for the same tensor (a chip in ``[a, d - 1]``), so no chip's busiest port carries more
    than its ring link would: a mesh is never slower than the ring of the same partition."""
    (r1, c1), (r2, c2) = (tuple(int(x) for x in pos[a]), tuple(int(x) for x in pos[d]))
    for first_x in (True, False):
        r, k, hops = r1, c1, [a]
        for axis in ((0, 1) if first_x else (1, 0)):
            while (k != c2) if axis == 0 else (r != r2):
                if axis == 0:
                    k += 1 if c2 > k else -1
                else:
                    r += 1 if r2 > r else -1
                hops.append(chip(r, k))
        if all(a <= h <= d for h in hops):
            return hops
    return list(range(a, d + 1))


# ---------------------------------------------------------------------- placers
@dataclass(frozen=True)
class PlacerOptions:
    placer: str = "greedy+lns"
    subsolves: int = 16            # CP-SAT sub-solves (greedy+lns, ppo-*) or their work (cpsat)
    det_time: float = 0.25         # CP-SAT deterministic units per sub-solve
    safety_s: float = 600.0        # outer wall-clock safety limit per model
    finetune_subsolves: int = 0    # ppo-pretrained: PPO fine-tune sub-solves first (0: zero-shot)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.placer not in PLACERS:
            raise ValueError(f"--placer {self.placer!r} unknown; allowed: {list(PLACERS)}")
        for name in ("subsolves", "finetune_subsolves", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "subsolves" else 0):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= "
                                 f"{1 if name == 'subsolves' else 0}, got {v!r}")
        for name in ("det_time", "safety_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {v!r}")


def place(problem, opts: PlacerOptions,
          policy_state: dict | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """(partition, details) for one problem: the placer's answer, or greedy's when that is better or the
    placer's is invalid (module doc)."""
    from ..algorithms.search.mcm_baselines import greedy
    from ..simulators.mcm import evaluate

    t0 = time.perf_counter()
    g_part, g_tp = greedy(problem, seed=opts.seed, time_limit_s=opts.safety_s)
    part, info = g_part, {"subsolves": 0, "det_time": 0.0, "stopped": "", "fallback": False}
    if opts.placer == "greedy" or not g_tp > 0:
        # an invalid greedy partition (the weights do not fit, or no repair) has nothing to improve from
        info["stopped"] = "greedy" if g_tp > 0 else "greedy invalid"
    elif opts.placer == "greedy+lns":
        from ..algorithms.solvers.mcm_lns import lns

        r = lns(problem, g_part, time_limit_s=opts.safety_s, seed=opts.seed, max_subsolves=opts.subsolves,
                subsolve_det=opts.det_time)
        part = r.partition
        info = {**info, "subsolves": r.subsolves, "det_time": r.det_time, "stopped": r.stopped}
    elif opts.placer == "cpsat":
        from ..algorithms.solvers.mcm_lns import full, solve_neighbourhood

        sub = solve_neighbourhood(problem, g_part, full(problem, g_part), time_limit_s=opts.safety_s,
                                  seed=opts.seed, num_workers=1, det_time=opts.subsolves * opts.det_time)
        # the deterministic limit binds; "time" says the wall-clock safety limit ended it instead
        stopped = "time" if sub.wall_s >= 0.99 * opts.safety_s else sub.status
        info = {**info, "subsolves": 1, "det_time": sub.det_time, "stopped": stopped}
        if sub.partition is not None:
            part = sub.partition
    else:
        part, extra = _learned(problem, g_part, opts, policy_state)
        info.update(extra)
    tp = float(evaluate(problem, part).throughput[0])
    if part is not g_part and not tp >= g_tp:
        part, info["fallback"] = g_part, True
    info["placer_s"] = time.perf_counter() - t0
    info["greedy_throughput"] = g_tp
    return np.asarray(part, dtype=np.int64), info


def _learned(problem, start: np.ndarray, opts: PlacerOptions, policy_state: dict | None):
    from ..algorithms.rl.mcm_lns_hint import search

    state, extra = policy_state, {}
    if opts.placer == "ppo-lns" or opts.finetune_subsolves:
        state, extra["trained_subsolves"] = _train(problem, start, opts,
                                                   None if opts.placer == "ppo-lns" else policy_state)
    if state is None:
        raise ValueError(f"--placer {opts.placer} needs the pre-trained policy's weights")
    from ..algorithms.rl.mcm_lns_ppo import PolicyChooser

    r = search(problem, start, PolicyChooser(state), opts.subsolves, seed=opts.seed, det_time=opts.det_time,
               safety_s=opts.safety_s)
    stopped = "subsolves" if r.subsolves >= opts.subsolves else "time"
    return r.partition, {**extra, "subsolves": int(r.subsolves), "det_time": float(r.det_time),
                         "stopped": stopped}


def _train(problem, start: np.ndarray, opts: PlacerOptions, init: dict | None) -> tuple[dict, int]:
    """PPO on this one problem from ``start`` (``init`` weights, or from scratch) for at least
    ``subsolves`` (ppo-lns) or ``finetune_subsolves`` sub-solves, in whole PPO batches (64 sub-solves,
    ``HINT_PPO_DEFAULTS``); returns the final weights and the sub-solves trained. Needs Ray (RLlib)."""
    import torch

    from ..algorithms.rl.mcm_lns_ppo import _train_until, hint_ppo_config
    from ..algorithms.rl.mcm_ppo import load_module_state, module_state

    n = opts.subsolves if init is None else opts.finetune_subsolves
    torch.manual_seed(opts.seed)
    algo = hint_ppo_config([problem], starts=[start], seed=opts.seed, det_time=opts.det_time).build_algo()
    try:
        if init is not None:
            load_module_state(algo, init)
        _, done = _train_until(algo, n, None, "codesign", 3, time.perf_counter())
        return module_state(algo), int(done)
    finally:
        algo.stop()


def load_policy(path: str | Path | None = None) -> dict:
    """The pre-trained learned-LNS weights (``bench/mcm/mcm_large.py train``); read by the driver and shipped
    to the trials, so no worker node needs the file."""
    from ..algorithms.rl.mcm_ppo import load_state

    p = Path(path) if path else DEFAULT_POLICY
    if not p.exists():
        raise ValueError(f"--policy {str(p)!r} does not exist (bench/mcm/mcm_large.py train writes "
                         "bench/mcm/results/mcm_large_policy.npz; the package ships a copy as "
                         "archplace/tune_configs/mcm_large_policy.npz)")
    return load_state(p)[0]


# ---------------------------------------------------------------------- one trial
def evaluate_design(design: MCMDesign, graphs: dict[str, Any], opts: PlacerOptions,
                    cost: CostParams | None = None, policy_state: dict | None = None) -> list[dict[str, Any]]:
    """One row per model: the partition (chip per op, JSON), its throughput (samples/s), the package's
    cost and area, the D2D energy per sample, and how the placer ran. A model with no valid partition
    (the greedy one too) gets ``status`` "infeasible", throughput 0 and the simulator's reason."""
    from ..simulators.mcm import MCMProblem, check, evaluate

    cost = cost or CostParams()
    pc = package_cost(design.num_chiplets, design.pe, design.sram_mb, design.link_gbs, design.topology, cost)
    acc = design.chiplet()
    common = {"arch_key": design.key(), "arch_label": design.label(), **design.to_dict(),
              "chiplet_area_mm2": pc.chiplet_area_mm2, "phy_area_mm2": pc.phy_area_mm2,
              "silicon_area_mm2": pc.silicon_area_mm2, "die_yield": pc.die_yield, "kgd_usd": pc.kgd_usd,
              "package_yield": pc.package_yield, "package_usd": pc.package_usd,
              "peak_tops": 2 * acc.peak_macs_per_s * design.num_chiplets / 1e12, "placer": opts.placer,
              "is_reference": False}
    rows = []
    for m, g in graphs.items():
        t0 = time.perf_counter()
        problem = MCMProblem.from_graph(g, design.package())
        part, info = place(problem, opts, policy_state)
        ev = evaluate(problem, part)
        why = check(problem, part)
        if design.topology == "mesh":
            lat, link_bytes = mesh_chip_latency_s(problem, part)
        else:
            lat = ev.latency_s[0]
            compute = np.bincount(part, weights=problem.time_s, minlength=problem.num_chips)
            link_bytes = float(np.clip(lat - compute, 0, None).sum() * problem.link_bw_bytes_per_s)
        tp = 1.0 / float(lat.max()) if not why and lat.max() > 0 else 0.0
        rows.append({**common, "model": m, "status": "ok" if not why else "infeasible",
                     "error": "; ".join(why[:3]), "throughput": tp,
                     "throughput_per_kusd": tp / pc.package_usd * 1e3,
                     "max_latency_s": float(lat.max()), "chips_used": int(part.max()) + 1,
                     "nodes": problem.num_nodes, "link_bytes": link_bytes,
                     "d2d_energy_per_sample_j": link_bytes * 8 * design.link_pj_per_bit * 1e-12,
                     "greedy_throughput": info["greedy_throughput"], "subsolves": int(info["subsolves"]),
                     "det_time": float(info["det_time"]), "stopped": str(info["stopped"]),
                     "fallback": bool(info["fallback"]), "placer_s": info["placer_s"],
                     "trained_subsolves": int(info.get("trained_subsolves", 0)),
                     "total_s": time.perf_counter() - t0, "partition_json": json.dumps(part.tolist())})
    return rows
