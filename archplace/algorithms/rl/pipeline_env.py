"""Gymnasium environment for pipeline cuts (Auto-MAP online training, spec automap.md §9.3–9.5).

An episode makes the K − 1 cuts of one model, one per step, each after the previous one. The action
is an index into the pruned candidate pivots (:func:`~archplace.algorithms.solvers.pipeline_exact.
candidate_pivots`); the Dict observation carries

* ``pivots`` (P, 4): the paper's three features of every candidate, as if the next cut were made
  there now (§9.3): the gradient AllReduce time of the whole pipeline, the largest activation
  transfer time over the cuts made so far, and the compute balance ratio min / max over stages; and a
  fourth (ours), ``L_unit / L`` of that tentative plan, the reward it would earn. The stages not cut
  yet are taken as equal shares of the remaining compute and parameters (their cuts cost nothing), so
  at the last cut every feature is exact. Times are log1p of their ratio to the ideal per-micro-batch
  stage time (total compute / devices), since they span orders of magnitude (NVLink vs 25 Gbps).
  With the three features alone the agent stalled 31% above the optimum on bert-48 / C in 3,000
  steps (its Q has to rebuild L from parts); the fourth hands it the combination;
  With ``raw_features`` (the online-inference agent, §10.4) three more columns give the
  transformed profile itself at each pivot, C*, A*, W*; with ``lookahead: False`` the fourth column is
  left out (the feature ablation of ``bench/automap/pipeline.py``);
* ``context``: the step as a one-hot over ``max_stages`` − 1 cuts, K / ``max_stages`` and the compute
  fraction cut so far (``max_stages``, default ``MAX_STAGES`` = 8, sets the observation's size, so
  weights trained at one value only load into an env with the same);
* ``action_mask`` (P,): 1 for a pivot the next cut may take (its own window, after the last cut, a
  trainable variable in the new stage and enough left for the stages after it).

Reward (§9.5): 0 until the last cut, then ``L_unit / L`` with ``L_unit = M · C / D`` the ideal
iteration time (so 1/L in units that make it O(1)); a plan that runs out of memory gets
``-sqrt(L_unit / L)``. The paper writes both 1/L and 1/√L; we use 1/L for the reward because at equal
spacing of plans it separates a 1% better plan by 1% of the reward where 1/√L gives 0.5%, and keep
the paper's −1/√L for OOM so any feasible plan outranks every infeasible one.

Every completed plan is logged (``best_cuts``, ``best_length_s``, ``plans_evaluated``) so a search
keeps the best plan it has seen.

**Cost-model evaluations (issue 31).** The features are the cost model run on a tentative plan per
open pivot, so they are counted as evaluations like the simulator call that scores a completed plan:
``sim_calls`` counts plans scored by :func:`~archplace.simulators.pipeline.evaluate` (one per completed
plan), ``feature_calls`` counts tentative plans scored for the features (one per open pivot per
observation; masked pivots are not scored, their rows are zeros, which the Q-network never reads), and
``calls`` is their sum. With ``eval_budget`` in the config the env never spends more: before an
observation it checks that the open pivots' features plus the plan's final simulator call still fit;
if not it sets ``exhausted`` and from then on every episode ends at once (``truncated``, info
``budget_exhausted``) without scoring anything, so an RLlib runner that keeps sampling spends nothing.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from ...hardware.presets import Cluster
from ...simulators import collectives
from ...simulators.pipeline import PipelineProfile, _inter_bw, allocate_devices, evaluate
from ..solvers.pipeline_exact import Candidates, candidate_pivots

MAX_STAGES = 8
NUM_FEATURES = 4
FEATURE_CLIP = 10.0


class PipelineCutEnv(gym.Env):
    """K − 1 cuts of one model's forward graph; see the module docstring."""

    metadata: dict = {}

    def __init__(self, config: dict | None = None):
        cfg = dict(config or {})
        self.raw_features = bool(cfg.get("raw_features", False))
        self.ignore_memory = bool(cfg.get("ignore_memory", False))
        # every pivot is an action (coarse profiles: one action space for all models, masks do the rest)
        self.full_action_set = bool(cfg.get("full_action_set", False))
        self.lookahead = bool(cfg.get("lookahead", True))
        self.max_stages = int(cfg.get("max_stages", MAX_STAGES))
        self.rng = np.random.default_rng(cfg.get("seed", 0))
        self._load(cfg["profile"], cfg["cluster"], int(cfg.get("num_stages", cfg["cluster"].num_servers)),
                   cfg.get("candidates"), cfg.get("radius", 3), cfg.get("collapse", True))
        p = len(self.pivots)
        nf = NUM_FEATURES - (0 if self.lookahead else 1) + (3 if self.raw_features else 0)
        self.observation_space = gym.spaces.Dict({
            "pivots": gym.spaces.Box(0.0, FEATURE_CLIP, (p, nf), np.float32),
            "context": gym.spaces.Box(0.0, 1.0, (self.max_stages + 1,), np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, (p,), np.float32),
        })
        self.action_space = gym.spaces.Discrete(p)
        self.cuts: list[int] = []
        self.best_cuts: np.ndarray | None = None
        self.best_length_s = np.inf
        self.best_oom = True
        self.plans_evaluated = 0
        budget = cfg.get("eval_budget")
        if budget is not None and (isinstance(budget, bool) or int(budget) != budget or budget < 0):
            raise ValueError(f"eval_budget is {budget!r}; allowed: None or an integer >= 0 evaluations")
        self.eval_budget = None if budget is None else int(budget)
        self.sim_calls = 0       # completed plans scored by the simulator
        self.feature_calls = 0   # tentative plans scored for the features (one per open pivot)
        self.live_steps = 0      # steps taken before the budget ran out
        self.exhausted = False
        self.history: list[float] = []  # best feasible L after each plan (inf until one)

    def _load(self, profile: PipelineProfile, cluster: Cluster, num_stages: int,
              cand: Candidates | None = None, radius: int | None = 3, collapse: bool = True) -> None:
        """Point the environment at a (profile, cluster, K) case."""
        max_stages = getattr(self, "max_stages", MAX_STAGES)
        if not 2 <= num_stages <= max_stages:
            raise ValueError(f"stages must be in [2, {max_stages}] for the agent, got {num_stages}")
        self.profile, self.cluster, self.num_stages = profile, cluster, num_stages
        self.cand = cand or candidate_pivots(profile, cluster, num_stages, radius, collapse=collapse)
        if any(len(c) == 0 for c in self.cand.per_cut):
            raise ValueError("no candidate pivot for some cut: widen the radius or use fewer stages")
        self.pivots = np.arange(1, profile.num_ops) if self.full_action_set else self.cand.all
        self.window = np.stack([np.isin(self.pivots, c) for c in self.cand.per_cut])  # (K-1, P)
        self.c_total = float(profile.compute_s_prefix[-1])
        self.t_unit = self.c_total / cluster.num_devices
        self.l_unit = profile.setup.num_micro_batches * self.t_unit
        self.cuts = []

    # ----------------------------------------------------------------- features and mask
    def _mask(self) -> np.ndarray:
        j = len(self.cuts)
        prof = self.profile
        tv = prof.trainable_prefix
        last = self.cuts[-1] if self.cuts else 0
        ok = self.window[j] & (self.pivots > last)
        ok &= tv[self.pivots] - tv[last] >= 1
        ok &= tv[-1] - tv[self.pivots] >= self.num_stages - j - 1
        return ok

    @property
    def calls(self) -> int:
        """Cost-model evaluations so far: simulator calls plus feature evaluations."""
        return self.sim_calls + self.feature_calls

    def affordable(self, n: int) -> bool:
        """Whether ``n`` more evaluations stay within ``eval_budget``."""
        return self.eval_budget is None or self.calls + n <= self.eval_budget

    def evaluate_plans(self, cuts: np.ndarray):
        """The simulator on a batch of complete plans (B, K − 1), counted in ``sim_calls``."""
        cuts = np.asarray(cuts, dtype=np.int64)
        self.sim_calls += len(cuts)
        return evaluate(self.profile, self.cluster, cuts)

    def _features(self, idx: np.ndarray | None = None) -> np.ndarray:
        """The feature rows of the pivots ``self.pivots[idx]`` (default: all), as if the next cut were
        made there; each row is one cost-model evaluation, counted in ``feature_calls``."""
        prof, k = self.profile, self.num_stages
        j = len(self.cuts)
        p = self.pivots if idx is None else self.pivots[np.asarray(idx, dtype=np.int64)]
        self.feature_calls += len(p)
        cp, wp = prof.compute_s_prefix, prof.param_bytes_prefix
        known = np.array([0] + self.cuts, dtype=np.int64)
        rest = k - j - 1
        rows = len(p)
        comp = np.zeros((rows, k))
        par = np.zeros((rows, k))
        for s in range(j):
            comp[:, s] = cp[known[s + 1]] - cp[known[s]]
            par[:, s] = wp[known[s + 1]] - wp[known[s]]
        comp[:, j] = cp[p] - cp[known[-1]]
        par[:, j] = wp[p] - wp[known[-1]]
        if rest:
            comp[:, j + 1:] = ((cp[-1] - cp[p]) / rest)[:, None]
            par[:, j + 1:] = ((wp[-1] - wp[p]) / rest)[:, None]
        comp = np.maximum(comp, 0.0)
        d = allocate_devices(np.maximum(comp, 1e-12), self.cluster.num_devices)
        end = np.cumsum(d, axis=1)
        start = end - d
        cl = self.cluster
        per = cl.devices_per_server or cl.num_devices
        inter = _inter_bw(cl)
        bw = np.where(start // per != (end - 1) // per, inter, cl.link_bw)
        ar = collectives.allreduce_s(par, np.maximum(d, 1), bw).max(axis=1)
        # activation transfers over the cuts made so far and this one
        cut_pos = np.concatenate([np.tile(known[1:], (rows, 1)), p[:, None]], axis=1)
        same = (start[:, :j + 1] // per) == ((end[:, 1:j + 2] - 1) // per)
        acts = 2.0 * prof.cross_bytes[cut_pos] / np.where(same, cl.link_bw, inter)
        act = acts.max(axis=1)
        t = comp / d
        balance = t.min(axis=1) / np.maximum(t.max(axis=1), 1e-30)
        m = prof.setup.num_micro_batches
        est = t.sum(axis=1) + acts.sum(axis=1) + (m - 1) * np.maximum(t.max(axis=1), act) + ar
        cols = [np.log1p(ar / self.t_unit), np.log1p(act / self.t_unit), balance]
        if self.lookahead:
            cols.append(self.l_unit / est)
        if self.raw_features:  # the transformed profile itself at each pivot (online inference, §10.4)
            scale = max(cp[-1], wp[-1] / self._inter_bw, prof.cross_bytes.max() / self._inter_bw, 1e-30)
            cols += [cp[p] / scale, prof.cross_bytes[p] / self._inter_bw / scale,
                     wp[p] / self._inter_bw / scale]
        return np.clip(np.stack(cols, axis=1), 0.0, FEATURE_CLIP).astype(np.float32)

    @property
    def _inter_bw(self) -> float:
        return _inter_bw(self.cluster)

    def _obs(self) -> dict:
        j = len(self.cuts)
        ctx = np.zeros(self.max_stages + 1, np.float32)
        done = j >= self.num_stages - 1
        if not done:
            ctx[j] = 1.0
        last = self.cuts[-1] if self.cuts else 0
        ctx[-2] = self.num_stages / self.max_stages
        ctx[-1] = self.profile.compute_s_prefix[last] / self.c_total
        p = len(self.pivots)
        nf = self.observation_space["pivots"].shape[1]
        if not done and not self.exhausted:   # once the budget is spent nothing more is scored
            mask = self._mask()
            idx = np.flatnonzero(mask)
            # this cut's features and the plan's final simulator call must fit in the budget
            if not self.affordable(len(idx) + 1):
                self.exhausted = True
            else:
                feats = np.zeros((p, nf), np.float32)
                feats[idx] = self._features(idx)
                return {"pivots": feats, "context": ctx, "action_mask": mask.astype(np.float32)}
        # terminal (or budget spent): no action is applied, but vectorised runners still query the
        # module on it, so one action is left open (the bootstrap is zeroed by `terminated` anyway)
        mask = np.zeros(p, np.float32)
        mask[0] = 1.0
        return {"pivots": np.zeros((p, nf), np.float32), "context": ctx, "action_mask": mask}

    # ----------------------------------------------------------------- gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.cuts = []
        obs = self._obs()
        return obs, ({"budget_exhausted": True} if self.exhausted else {})

    def step(self, action):
        if self.exhausted:   # the budget is spent: end at once, score nothing
            return self._obs(), 0.0, False, True, {"budget_exhausted": True}
        self.live_steps += 1
        a = int(action)
        mask = self._mask()
        if not (0 <= a < len(self.pivots)) or not mask[a]:
            raise ValueError(f"action {a} is masked at cut {len(self.cuts) + 1}: a masked action was taken")
        self.cuts.append(int(self.pivots[a]))
        info: dict = {}
        if len(self.cuts) < self.num_stages - 1:
            obs = self._obs()
            if self.exhausted:
                return obs, 0.0, False, True, {"budget_exhausted": True}
            if not obs["action_mask"].any():  # dead end (overlapping windows): a failed plan
                return obs, -1.0, True, False, {"dead_end": True}
            return obs, 0.0, False, False, info
        cuts = np.asarray(self.cuts, dtype=np.int64)
        r = self.evaluate_plans(cuts[None, :])   # affordable: reserved when the features were scored
        length, oom = float(r.length_s[0]), bool(r.oom[0]) and not self.ignore_memory
        self.plans_evaluated += 1
        if (oom, length) < (self.best_oom, self.best_length_s):
            self.best_oom, self.best_length_s, self.best_cuts = oom, length, cuts
        self.history.append(self.best_length_s if not self.best_oom else np.inf)
        reward = -np.sqrt(self.l_unit / length) if oom else self.l_unit / length
        info = {"length_s": length, "oom": oom, "cuts": cuts}
        return self._obs(), float(reward), True, False, info

    def random_plan_lengths(self, plans: int, seed: int = 0) -> np.ndarray:
        """L of ``plans`` uniformly random valid plans (the random-cut baseline); OOM → inf."""
        rng = np.random.default_rng(seed)
        out = np.empty(plans)
        saved = self.cuts
        for i in range(plans):
            self.cuts = []
            while len(self.cuts) < self.num_stages - 1:
                m = np.flatnonzero(self._mask())
                if not len(m):
                    break
                self.cuts.append(int(self.pivots[rng.choice(m)]))
            if len(self.cuts) < self.num_stages - 1:
                out[i] = np.inf
                continue
            r = self.evaluate_plans(np.asarray(self.cuts)[None, :])
            out[i] = np.inf if (r.oom[0] and not self.ignore_memory) else r.length_s[0]
        self.cuts = saved
        return out


class SyntheticPipelineEnv(PipelineCutEnv):
    """Online-inference pre-training (spec §10.3–10.5): every ``steps_per_profile`` steps (paper: 50
    interactions per environment) a new seeded synthetic 128-point profile and a cluster from
    ``clusters`` (K = its servers); actions are the 127 coarse pivots, unpruned."""

    def __init__(self, config: dict | None = None):
        from ...hardware.presets import v100_cluster

        cfg = dict(config or {})
        self.clusters = [v100_cluster(c) for c in cfg.get("clusters", ("A", "B", "C"))]
        self.distributions = tuple(cfg.get("distributions", ("uniform", "normal")))
        self.granularity = int(cfg.get("granularity", 128))
        self.steps_per_profile = int(cfg.get("steps_per_profile", 50))
        self._gen = np.random.default_rng(cfg.get("seed", 0))
        prof, cl = self._new_case()
        super().__init__({**cfg, "profile": prof, "cluster": cl, "num_stages": cl.num_servers,
                          "radius": None, "collapse": False, "raw_features": True, "ignore_memory": True,
                          "full_action_set": True})
        self._steps = 0

    def _new_case(self):
        from ...simulators.pipeline import coarse_pipeline_profile
        from ...workloads.profiles import coarsen, draw_raw

        dist = self.distributions[int(self._gen.integers(len(self.distributions)))]
        n = 1024
        c, a, w = (draw_raw(self._gen, n, dist) for _ in range(3))
        # Raw draws in [0, 1] make one activation as costly as one op's compute, while in real models
        # a cut's transfer over 25 Gbps is ~5-50 ops' worth (bert-48: max A* 0.11 after the shared
        # scaling, vs ~0.001 unscaled); so activations get a log-uniform weight in [2, 200] (ours).
        a = a * float(np.exp(self._gen.uniform(np.log(2.0), np.log(200.0))))
        cp = coarsen(c, a, w, granularity=self.granularity)
        cl = self.clusters[int(self._gen.integers(len(self.clusters)))]
        return coarse_pipeline_profile(cp, cl), cl

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._steps >= self.steps_per_profile:
            prof, cl = self._new_case()
            self._load(prof, cl, cl.num_servers, None, None, collapse=False)
            self._steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self._steps += 1
        return super().step(action)
