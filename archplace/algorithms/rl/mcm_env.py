"""The MCM partitioning environment: iterative refinement (paper Eq. 7) with constraint repair.

One episode is ``rounds`` (T) steps on one graph. At step t the agent emits a full assignment y^(t)
(``MultiDiscrete([C] * N_max)``, entries past the graph's N ignored); the environment repairs it into
a statically valid y'^(t) (``repair="fix"``, the paper's best, or ``"sample"``; ``"none"`` evaluates y
as is, the paper's RL-without-solver baseline), evaluates y'^(t) with the analytical cost model
(:func:`archplace.simulators.mcm.evaluate`, memory included) and returns

    reward = throughput(y'^(t)) / throughput(greedy after FIX repair)

(0 when y' is invalid, i.e. fails memory, or the repair found nothing). The next observation carries
y'^(t-1) in ``prev`` and t / T in ``round`` (the value function needs to know how many rewards are
left: without it PPO's advantages are dominated by the step index and nothing is learnt at T = 4);
y'^(0) is the greedy-repaired partition (``init="greedy"``, our choice: the paper
leaves y^(0) open), all zeros (``init="zeros"``), or the best partition found so far on the graph
(``init="best"``, greedy until there is one: refinement anchored at the incumbent, a learned local search).
With ``load_features`` the observation also carries ``chip_load`` ``[C]``: the chip latencies L_d of
y'^(t-1) over their maximum, so the policy sees which chip is the bottleneck (ours).

Under RLlib the repair runs one step earlier, in the module-to-env connector
(:mod:`archplace.algorithms.rl.mcm_connectors`), which calls :meth:`MCMPartitionEnv.repair_action` with
the policy's probabilities and sends y' to :meth:`step`; the episode keeps y and its log-probability
(spec §2.3 option (a), ``train_on: sampled``: the solver as part of the environment) or y' and its
log-probability (``train_on: repaired``, the YAML's default, option (b)). Given an action nobody
repaired, :meth:`step` repairs it itself, so the env works on its own too.

Design choices the paper leaves open (all ours):

* node features ``x`` (F = 8, :data:`FEATURES`): time_s / max time_s; time_s · C / total time (its
  share of a balanced chip, clipped at 4); out_bytes and weight_bytes / SRAM (clipped at 4); log1p of
  in- and out-degree / 2; topological position / N; compute time before the op in ``topo`` / total
  (where a time-balanced pipeline would cut);
* SAMPLE mode needs P: under RLlib the connector passes the policy's softmax; an action given to
  :meth:`step` directly gets ``0.9 · onehot(y) + 0.1 / C``;
* the normaliser is the throughput of the greedy partition after FIX repair (:meth:`greedy_part`,
  computed on a graph's first visit); if that is invalid (memory), it is ``1 / sum(time_s)``, the
  throughput of a single chip without memory limits;
* FIX keeps every node of a statically valid y, so such a y is not sent to the solver (same result,
  no solver call); a repair that fails (time limit, status ``"unknown"``) gives reward 0 and leaves
  ``prev`` unchanged;
* the repair sees SRAM too (``memory_fix``, default on unless ``repair="none"``; issue 44): a repaired
  y' that meets Eqs. 2-4 but is over SRAM has ops moved off its full chips by
  :func:`~archplace.algorithms.solvers.mcm_repair.memory.fix_memory`, and the greedy partition of a
  graph is the memory-aware one of :func:`~archplace.algorithms.search.mcm_baselines.greedy` when
  the plain one is over SRAM. Without it an untrained policy on bert-base over 8 chiplets (the 22.4 MB
  word table's chip) never sees a valid sample: every reward is 0 and nothing is learnt;
* graphs are visited round-robin (``select="round_robin"``) or at random (``"random"``);
  ``reset(options={"graph": i})`` picks graph i.

``info`` per step: ``raw_valid`` (y itself valid, memory included), ``repaired_valid``, ``throughput``
(of y'), ``reward``, ``changed`` (nodes the repair moved), ``samples`` (1: one evaluation is one
sample), ``total_samples`` (this env's count), ``graph``, ``round``, ``repair_status``, ``repair_stage``
(the repair's restart stage, None when no repair ran), ``memory_fix`` (None when y' fitted or the fix
is off, else whether ``fix_memory`` made it fit),
``repaired_action`` (y' padded to ``N_max``; y itself when the repair found nothing).
The best partition found per graph is kept in :attr:`MCMPartitionEnv.best` (name -> (throughput,
partition)) and the per-graph best-so-far curve in :attr:`MCMPartitionEnv.history`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ...hardware.presets import mcm_package
from ...simulators.mcm import MCMProblem, chip_latency_s, evaluate, greedy_partition, static_valid
from ...workloads.graph import OpGraph
from ..solvers.mcm_repair import repair
from ..solvers.mcm_repair.memory import fix_memory

FEATURES = ("time_rel_max", "time_share", "out_bytes_sram", "weight_bytes_sram", "log_in_degree",
            "log_out_degree", "topo_position", "time_before")
REPAIR_MODES = ("fix", "sample", "none")
INIT_MODES = ("greedy", "zeros", "best")


def to_problems(graphs: Any, num_chips: int = 36) -> tuple[list[MCMProblem], list[str]]:
    """``graphs`` (MCMProblems, OpGraphs, CorpusGraphs, or a ``{split: [...]}`` dict of them) as
    problems on ``num_chips`` chips, with names."""
    if isinstance(graphs, dict):
        graphs = [g for split in graphs.values() for g in split]
    if isinstance(graphs, MCMProblem | OpGraph) or hasattr(graphs, "graph"):
        graphs = [graphs]
    problems, names = [], []
    package = mcm_package(num_chips)
    for i, g in enumerate(graphs):
        if isinstance(g, MCMProblem):
            if g.num_chips != num_chips:
                raise ValueError(f"graph {i}: MCMProblem has {g.num_chips} chips, the env {num_chips}")
            problems.append(g)
            names.append(f"problem{i}")
        elif isinstance(g, OpGraph):
            problems.append(MCMProblem.from_graph(g, package))
            names.append(str(g.meta.get("model", f"graph{i}")))
        elif hasattr(g, "graph") and hasattr(g, "name"):  # a CorpusGraph
            problems.append(MCMProblem.from_graph(g.graph, package))
            names.append(str(g.name))
        else:
            raise ValueError(f"graph {i}: expected MCMProblem, OpGraph or CorpusGraph, "
                             f"got {type(g).__name__}")
    if not problems:
        raise ValueError("MCMPartitionEnv config 'graphs' is empty")
    seen: set[str] = set()
    for i, name in enumerate(names):  # a graph given twice gets two names (best / history keys)
        if name in seen:
            names[i] = name = f"{name}#{i}"
        seen.add(name)
    return problems, names


def node_features(problem: MCMProblem) -> np.ndarray:
    """``[N, F]`` float32 features (see :data:`FEATURES`)."""
    n, c = problem.num_nodes, problem.num_chips
    t = problem.time_s
    tot = float(t.sum())
    tmax = float(t.max())
    indeg = np.bincount(problem.dst, minlength=n)
    outdeg = np.bincount(problem.src, minlength=n)
    pos = np.empty(n, dtype=np.int64)
    pos[problem.topo] = np.arange(n)
    before = np.zeros(n)
    before[problem.topo] = np.concatenate([[0.0], np.cumsum(t[problem.topo])[:-1]])
    sram = problem.sram_bytes
    x = np.stack([
        t / tmax if tmax > 0 else np.zeros(n),
        np.clip(t * c / tot, 0, 4) if tot > 0 else np.zeros(n),
        np.clip(problem.out_bytes / sram, 0, 4),
        np.clip(problem.weight_bytes / sram, 0, 4),
        np.log1p(indeg) / 2,
        np.log1p(outdeg) / 2,
        pos / n,
        before / tot if tot > 0 else pos / n,
    ], axis=1)
    return x.astype(np.float32)


class MCMPartitionEnv(gym.Env):
    """See the module docstring. ``config`` keys: ``graphs`` (required), ``names`` (default: the
    graphs' names, ``problem{i}`` for bare MCMProblems), ``num_chips`` (36), ``n_max``
    and ``e_max`` (default: the largest graph's), ``rounds`` (4), ``repair`` ("fix"), ``seed`` (0),
    ``select`` ("round_robin"), ``init`` ("greedy"), ``repair_time_limit_s`` (10.0), ``sample_budget`` (None:
    samples past it still train but no longer update :attr:`best` and the valid counts), ``memory_fix``
    (True unless ``repair`` is "none")."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = dict(config or {})
        if "graphs" not in config:
            raise ValueError("MCMPartitionEnv config needs 'graphs'")
        self.num_chips = int(config.get("num_chips", 36))
        self.problems, self.names = to_problems(config["graphs"], self.num_chips)
        if config.get("names") is not None:
            names = [str(x) for x in config["names"]]
            if len(names) != len(self.problems) or len(set(names)) != len(names):
                raise ValueError(f"names must be {len(self.problems)} distinct strings, got {names}")
            self.names = names
        n_big = max(p.num_nodes for p in self.problems)
        e_big = max(p.num_edges for p in self.problems)
        self.n_max = int(config.get("n_max") or n_big)
        self.e_max = int(config.get("e_max") or max(e_big, 1))
        if self.n_max < n_big or self.e_max < e_big:
            raise ValueError(f"n_max={self.n_max}, e_max={self.e_max} are smaller than the largest graph "
                             f"({n_big} nodes, {e_big} edges)")
        self.rounds = int(config.get("rounds", 4))
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        self.repair_mode = str(config.get("repair", "fix"))
        if self.repair_mode not in REPAIR_MODES:
            raise ValueError(f"repair is {self.repair_mode!r}; allowed: {list(REPAIR_MODES)}")
        self.select = str(config.get("select", "round_robin"))
        if self.select not in ("round_robin", "random"):
            raise ValueError(f"select is {self.select!r}; allowed: ['round_robin', 'random']")
        self.init = str(config.get("init", "greedy"))
        if self.init not in INIT_MODES:
            raise ValueError(f"init is {self.init!r}; allowed: {list(INIT_MODES)}")
        self.time_limit_s = float(config.get("repair_time_limit_s", 10.0))
        self.memory_fix = bool(config.get("memory_fix", self.repair_mode != "none"))
        self.load_features = bool(config.get("load_features", False))
        # samples after this many no longer update ``best`` (a PPO iteration may overshoot a search budget)
        self.sample_budget = config.get("sample_budget")
        # unix time after which steps neither repair nor evaluate (a wall-time budget, bench/mcm/mcm.py):
        # such a
        # step ends the episode with reward 0 and no "throughput" in info, so no callback counts it
        self.deadline = config.get("deadline")
        # distinct streams per RLlib env runner / sub-env (EnvContext carries the indices)
        base = int(config.get("seed", 0))
        wi, vi = int(getattr(config, "worker_index", 0)), int(getattr(config, "vector_index", 0))
        self._rng = np.random.default_rng([base, wi, vi])

        c, nm, em = self.num_chips, self.n_max, self.e_max
        self.observation_space = gym.spaces.Dict({
            "x": gym.spaces.Box(-np.inf, np.inf, (nm, len(FEATURES)), np.float32),
            "edge_index": gym.spaces.Box(0, max(nm - 1, 0), (2, em), np.int64),
            "num_nodes": gym.spaces.Box(0, nm, (1,), np.int64),
            "num_edges": gym.spaces.Box(0, em, (1,), np.int64),
            "node_mask": gym.spaces.Box(0.0, 1.0, (nm,), np.float32),
            "prev": gym.spaces.Box(0, c - 1, (nm,), np.int64),
            "round": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
        })
        if self.load_features:
            self.observation_space["chip_load"] = gym.spaces.Box(0.0, 1.0, (c,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete(np.full(nm, c, dtype=np.int64))

        self._static = [self._static_obs(p) for p in self.problems]
        # the greedy baselines are computed on a graph's first visit (a repair per graph is not free)
        self._greedy: list[np.ndarray | None] = [None] * len(self.problems)
        self._baseline: list[float | None] = [None] * len(self.problems)
        self.best: dict[str, tuple[float, np.ndarray]] = {}
        self.history: dict[str, list[float]] = {n: [] for n in self.names}
        self.total_samples = 0
        self.valid_samples = 0  # samples (within sample_budget) whose repaired partition is valid
        self.raw_valid_samples = 0  # samples (within sample_budget) whose raw action y was valid
        self._next = 0
        self._g = 0
        self._t = 0
        self._prev = np.zeros(nm, dtype=np.int64)
        self._pending: dict[str, Any] | None = None   # repair_action's result, for the next step

    # ------------------------------------------------------------------ helpers
    def _static_obs(self, p: MCMProblem) -> dict[str, np.ndarray]:
        x = np.zeros((self.n_max, len(FEATURES)), np.float32)
        x[:p.num_nodes] = node_features(p)
        ei = np.zeros((2, self.e_max), np.int64)
        ei[0, :p.num_edges] = p.src
        ei[1, :p.num_edges] = p.dst
        mask = np.zeros(self.n_max, np.float32)
        mask[:p.num_nodes] = 1.0
        return {"x": x, "edge_index": ei, "num_nodes": np.array([p.num_nodes], np.int64),
                "num_edges": np.array([p.num_edges], np.int64), "node_mask": mask}

    def _obs(self) -> dict[str, np.ndarray]:
        obs = {**self._static[self._g], "prev": self._prev.copy(),
               "round": np.array([self._t / self.rounds], np.float32)}
        if self.load_features:
            p = self.problems[self._g]
            lat = chip_latency_s(p, self._prev[:p.num_nodes])[0]
            top = float(lat.max())
            obs["chip_load"] = (lat / top if top > 0 else np.zeros_like(lat)).astype(np.float32)
        return obs

    def _repair(self, p: MCMProblem, y: np.ndarray, mode: str, seed: int, probs: np.ndarray | None = None):
        if mode == "sample" and probs is None:
            probs = np.full((p.num_nodes, p.num_chips), 0.1 / p.num_chips)
            probs[np.arange(p.num_nodes), y] += 0.9
        return repair(p.num_chips, p.src, p.dst, mode=mode, y=y, probs=probs, seed=seed,
                      time_limit_s=self.time_limit_s)

    def greedy_part(self, i: int) -> np.ndarray:
        """Graph i's greedy partition after FIX repair (the greedy one itself when it is statically
        valid: FIX keeps every node of a valid partition). Should FIX fail (time limit) for seeds 0-2,
        every node goes to chip 0, which is always statically valid."""
        if self._greedy[i] is None:
            p = self.problems[i]
            y0 = greedy_partition(p)
            part = None
            if static_valid(p, y0)[0]:
                part = y0
            else:
                for seed in range(3):
                    res = self._repair(p, y0, "fix", seed)
                    if res.partition is not None:
                        part = np.asarray(res.partition, dtype=np.int64)
                        break
            if part is not None and self.memory_fix and not evaluate(p, part).memory_ok[0]:
                from ..search.mcm_baselines import greedy  # the memory-aware greedy (module doc)

                g_part, g_tp = greedy(p, seed=0, time_limit_s=self.time_limit_s)
                part = np.asarray(g_part, dtype=np.int64) if g_tp > 0 else part
            self._greedy[i] = np.zeros(p.num_nodes, np.int64) if part is None else part
        return self._greedy[i]

    def baseline(self, i: int) -> float:
        """The reward normaliser of graph i: the throughput of :meth:`greedy_part`, or ``1 / sum(time_s)``
        (one chip, no memory limit) when that partition is invalid."""
        if self._baseline[i] is None:
            p = self.problems[i]
            thr = float(evaluate(p, self.greedy_part(i)).throughput[0])
            self._baseline[i] = thr if thr > 0 else 1.0 / max(float(p.time_s.sum()), 1e-30)
        return self._baseline[i]

    @property
    def problem(self) -> MCMProblem:
        return self.problems[self._g]

    @property
    def graph_index(self) -> int:
        return self._g

    def pad(self, part: np.ndarray) -> np.ndarray:
        """A partition of the current graph as a full ``[N_max]`` action (zeros past N)."""
        out = np.zeros(self.n_max, np.int64)
        out[:len(part)] = part
        return out

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        if options and "graph" in options:
            self._g = int(options["graph"])
        elif self.select == "random":
            self._g = int(self._rng.integers(len(self.problems)))
        else:
            self._g = self._next
            self._next = (self._next + 1) % len(self.problems)
        self._t = 0
        self._pending = None
        p = self.problems[self._g]
        name = self.names[self._g]
        if self.init == "best" and name in self.best:
            start = self.best[name][1]  # incumbent-anchored refinement: the episode starts from the best
        elif self.init == "zeros":
            start = np.zeros(p.num_nodes, np.int64)
        else:
            start = self.greedy_part(self._g)
        self._prev = self.pad(start)
        return self._obs(), {"graph": self.names[self._g]}

    def repair_action(self, action, probs: np.ndarray | None = None) -> np.ndarray:
        """The repaired partition y' (padded to ``N_max``) of an action y on the current graph, with this
        env's repair mode, time limit and random stream; :meth:`step` given that y' evaluates it with
        the bookkeeping of this call (y's own validity, the repair's status, stage and changed nodes).
        ``probs`` (``[N_max or N, C]``): the policy's per-node probabilities for SAMPLE (default: the
        made-up ``0.9 · onehot(y) + 0.1 / C``). The RLlib path calls this from the
        :class:`~archplace.algorithms.rl.mcm_connectors.RepairActions` connector."""
        p = self.problems[self._g]
        n, c = p.num_nodes, p.num_chips
        if self._past_deadline():
            self._pending = None
            return self.pad(np.clip(np.asarray(action, dtype=np.int64).reshape(-1)[:n], 0, c - 1))
        y = np.clip(np.asarray(action, dtype=np.int64).reshape(-1)[:n], 0, c - 1)
        raw = evaluate(p, y)
        status, changed, stage = "none", 0, None
        if self.repair_mode == "none":
            yr, ok = y, True
        elif self.repair_mode == "fix" and bool(raw.static_ok[0]):
            yr, ok, status = y, True, "valid"  # FIX keeps every node of a statically valid y
        else:
            res = self._repair(p, y, self.repair_mode, int(self._rng.integers(2**31 - 1)),
                               None if probs is None else np.asarray(probs)[:n])
            status, changed, stage = str(res.status), int(res.changed), res.stage
            ok = res.partition is not None
            yr = np.asarray(res.partition, dtype=np.int64) if ok else y
        mem = None
        if ok and self.memory_fix:
            ev = raw if yr is y else evaluate(p, yr)
            if ev.static_ok[0] and not ev.memory_ok[0]:
                fx = fix_memory(p, yr)
                mem = fx.valid
                if fx.valid:
                    changed += int((fx.partition != yr).sum())
                    yr = fx.partition
        padded = self.pad(yr)
        self._pending = {"y": y, "raw": raw, "yr": yr, "ok": ok, "status": status, "changed": changed,
                         "stage": stage, "padded": padded, "memory_fix": mem}
        return padded.copy()

    def _past_deadline(self) -> bool:
        import time

        return self.deadline is not None and time.time() >= float(self.deadline)

    def step(self, action):
        p, g = self.problems[self._g], self._g
        a = np.asarray(action, dtype=np.int64).reshape(-1)
        if self._past_deadline():
            self._t += 1
            return self._obs(), 0.0, True, False, {"graph": self.names[g], "graph_index": g, "deadline": True}
        rep = self._pending
        if rep is None or not np.array_equal(rep["padded"], a):
            self.repair_action(a)   # not repaired beforehand (no connector): repair here
            rep = self._pending
        self._pending = None
        y, raw, yr, ok, status, changed = (rep[k] for k in ("y", "raw", "yr", "ok", "status", "changed"))
        raw_valid = bool(raw.valid[0])
        ev = raw if yr is y else evaluate(p, yr)
        thr = float(ev.throughput[0]) if ok else 0.0
        reward = thr / self.baseline(g)
        self.total_samples += 1
        in_budget = self.sample_budget is None or self.total_samples <= int(self.sample_budget)
        self.valid_samples += in_budget and thr > 0
        self.raw_valid_samples += in_budget and raw_valid
        name = self.names[g]
        improved = bool(in_budget and thr > 0 and (name not in self.best or thr > self.best[name][0]))
        if improved:
            self.best[name] = (thr, yr.copy())
        self.history[name].append(self.best[name][0] if name in self.best else 0.0)
        if ok and bool(ev.static_ok[0]):
            self._prev = self.pad(yr)
        self._t += 1
        info = {"raw_valid": raw_valid, "repaired_valid": bool(ok and ev.valid[0]), "throughput": thr,
                "reward": reward, "changed": changed, "samples": 1, "total_samples": self.total_samples,
                "graph": name, "graph_index": g, "round": self._t, "repair_status": status,
                "repair_stage": rep["stage"], "memory_fix": rep["memory_fix"], "improved": improved,
                "repaired_action": rep["padded"]}
        return self._obs(), float(reward), self._t >= self.rounds, False, info
