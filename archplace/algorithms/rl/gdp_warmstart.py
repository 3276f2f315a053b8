"""Warm-started GDP (issue 31, deliverable 2): behaviour cloning of the best fast placer, then PPO.

Why: from random weights GDP's policy starts far from any good placement, and within a few thousand
simulator calls PPO does not catch up with the fast placers (METIS, Baechi's m-TOPO / m-ETF / m-SCT, the
human-expert-like one). Starting the policy *at* the best of them, and answering with the best of what
the policy then proposes and the start itself, makes the learned placer at least as fast as the fast
placers by construction; what PPO adds on top is then measurable (``bench/gdp/gdp.py``, methods ``gdp-warm``,
``warm``, ``warm+ppo``, ``warm+sa``).

Steps of :func:`gdp_warm` (``place-ops --algo gdp``):

1. **Warm start.** Every placer of :data:`WARM_START_ALGOS` places the graph; all are simulated in one
   batch (one simulator call each, counted in the budget); the fastest valid one is the target (ties: the
   first in :data:`WARM_START_ALGOS` order; none valid: the fastest, and it says so).
2. **Behaviour cloning.** The GDP RLModule (built exactly as PPO builds it: same observation and action
   spaces, same ``model_config``) is trained with Adam on the cross-entropy of its per-node logits against
   the target's device of every node, for at most ``bc_steps`` steps (deterministic: seeded weights,
   fixed step count, full-graph batches; no wall-clock budget). It stops at the first step whose greedy
   (argmax) placement, read as the environment reads an action (a co-location group follows its first
   op), equals the target, so the policy is as close to the target as needed and no sharper: PPO must
   still sample around it. ``agreement`` is the fraction of ops whose greedy device is the target's; if
   no step copies the target exactly, the weights of the step with the highest agreement are kept. No
   simulator call (agreement is checked on placements, not step times).
3. **PPO** (``gdp_ppo.gdp_train``'s fine-tuning path, ``init_state`` = the cloned weights) for as many
   iterations of ``train_batch_size_per_learner`` (16) samples as the budget leaves after the warm start
   and the final evaluation of the greedy placement (one call).
4. **Answer**: the fastest valid of the policy's greedy placement, its best sample and the warm start;
   on a tie the warm start, then the greedy placement (the answer credits learning only for a strictly
   faster placement). ``answer_source`` says which.

Budget: simulator calls (:func:`simulate_batch` rows), counted as for ``sa`` / ``lns``
(``search/placement_local_search.py``): the fast placers' evaluations, every PPO sample and the greedy
evaluation. A leftover smaller than one PPO batch is not spent. Wall time is only an outer safety limit
(``time_limit_s``); ``stopped_by`` says whether it bound. The one-GPU reference and the answer's own
simulation that ``place-ops`` reports are not part of the method and are not counted (as for ``sa``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...simulators.gpu_placement import PlacementProblem, simulate_batch
from ..search.gdp_baselines import FAST_PLACERS, fast_placements
from .gdp_env import GDPEnv, GDPGraph

# the fast placers the warm start picks from: the same five sa / lns start from, so all three begin at the
# same placement (m-TOPO is cheap: a list schedule, one pass)
WARM_START_ALGOS = FAST_PLACERS
# behaviour cloning: at most this many Adam steps (each one full-graph forward and backward pass). With the
# policy of branch gdp-policy (2140ac0): txl-2 (210 ops) is copied exactly after 39 steps at lr 1e-2;
# rnnlm-2 (1,620 ops, target METIS) wanders between 0.80 and 0.90 agreement over 200 steps at 1e-2 and
# stays near 0.81 at 3e-2, so more steps would mostly cost time (about 0.5 s a step there on this machine)
BC_STEPS = 200
BC_LR = 1e-2
# outer wall-clock safety limit of the PPO phase (the budget is simulator calls): an hour
SAFETY_LIMIT_S = 3600.0
PPO_BATCH = 16  # samples per PPO iteration (gdp_ppo.PPO_DEFAULTS' train_batch_size_per_learner)
ANSWER_SOURCES = ("warm_start", "greedy", "best_sample")  # tie-break order


@dataclass
class WarmStart:
    """The fast placers' best placement (the target) and the policy cloned from it."""

    algo: str                       # the fast placer whose placement is the target
    placement: np.ndarray           # [n] device per op
    step_time_s: float
    valid: bool
    step_times_s: dict[str, float]  # every fast placer's simulated step time
    valid_by_algo: dict[str, bool]
    simulator_calls: int            # one per fast placer
    state: dict[str, Any]           # the cloned module weights (gdp_train's init_state format)
    bc_steps: int                   # Adam steps taken (< bc_steps_max when the greedy copy was exact)
    bc_steps_max: int
    bc_best_step: int               # the step whose weights are kept (the highest agreement)
    agreement: float                # fraction of ops whose greedy device is the target's (1.0: exact copy)
    target_prob_mean: float         # mean over ops of the policy's probability of the target device
    greedy_placement: np.ndarray    # the cloned policy's argmax placement (by op)
    bc_loss: list[float] = field(default_factory=list)  # cross-entropy per step
    placers_wall_s: float = 0.0
    bc_wall_s: float = 0.0


@dataclass
class GDPWarmRun:
    """:func:`gdp_warm`'s answer and its three candidates, each with its simulated step time."""

    placement: np.ndarray
    step_time_s: float
    valid: bool
    answer_source: str              # one of ANSWER_SOURCES
    warm: WarmStart
    greedy_step_time_s: float       # the policy's argmax placement after PPO
    greedy_valid: bool
    greedy_placement: np.ndarray
    best_sample_step_time_s: float  # inf when no sample was valid (or none was drawn)
    best_sample_placement: np.ndarray | None
    samples: int
    ppo_iterations: int
    ppo_iterations_planned: int
    simulator_calls: int            # <= budget
    budget: int
    stopped_by: str                 # "budget" or "time limit"
    ppo_wall_s: float
    wall_s: float
    sampled_mean_step_time_s: list[float] = field(default_factory=list)  # per PPO iteration

    def candidates(self) -> dict[str, tuple[float, bool]]:
        return {"warm_start": (self.warm.step_time_s, self.warm.valid),
                "greedy": (self.greedy_step_time_s, self.greedy_valid),
                "best_sample": (self.best_sample_step_time_s, self.best_sample_placement is not None)}


def min_budget(starts: int = len(WARM_START_ALGOS)) -> int:
    """The fewest simulator calls :func:`gdp_warm` needs: the fast placers and the greedy evaluation."""
    return starts + 1


def pick_best(problem: PlacementProblem, placements: dict[str, np.ndarray]):
    """(name, placement, step time, valid, step times, validity): every candidate simulated once, the
    fastest valid wins (ties: the first given); none valid: the fastest."""
    names = list(placements)
    P = np.stack([np.asarray(placements[k], np.int64) for k in names])
    r = simulate_batch(problem, P)
    t = np.asarray(r.step_time_s, float)
    valid = np.asarray(r.valid, bool)
    i = int(np.argmin(np.where(valid, t, np.inf))) if valid.any() else int(np.argmin(t))
    return (names[i], P[i].copy(), float(t[i]), bool(valid[i]), dict(zip(names, map(float, t))),
            dict(zip(names, map(bool, valid))))


def build_module(gg: GDPGraph, *, seed: int = 0, policy: dict | None = None, max_devices: int = 8):
    """The GDP RLModule as ``gdp_ppo.gdp_ppo_config`` builds it (same spaces and ``model_config``), so its
    state is the weights format ``gdp_train(init_state=...)`` loads. Seeded: the initial weights depend
    on ``seed`` only."""
    import torch
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from .gdp_module import GDPRLModule

    env = GDPEnv({"graphs": [gg], "max_devices": max_devices})
    torch.manual_seed(seed)
    spec = RLModuleSpec(module_class=GDPRLModule, observation_space=env.observation_space,
                        action_space=env.action_space,
                        model_config={"max_devices": max_devices, **(policy or {})})
    return spec.build(), env


def behaviour_clone(gg: GDPGraph, target: np.ndarray, *, steps: int = BC_STEPS, lr: float = BC_LR,
                    seed: int = 0, policy: dict | None = None, max_devices: int = 8) -> dict[str, Any]:
    """Clone ``target`` (device per op) into a fresh seeded GDP module (module doc, step 2). Returns the
    weights of the step with the highest agreement (the first such; the last step's when the copy is
    exact), its step (``best_step``), agreement, mean target probability and greedy placement, the steps
    taken and the loss per step. Keeping the best step matters where the copy cannot be made exact: the
    agreement then wanders by several points from step to step (rnnlm-2: 0.80-0.90)."""
    import torch

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"bc steps is {steps!r}; must be an integer >= 0")
    target = np.asarray(target, np.int64)
    n = gg.problem.num_nodes
    if target.shape != (n,) or target.min(initial=0) < 0 or target.max(initial=0) >= gg.problem.num_devices:
        raise ValueError(f"target must be {n} devices in [0, {gg.problem.num_devices}), got shape "
                         f"{target.shape}, devices {target.min(initial=0)}..{target.max(initial=0)}")
    module, env = build_module(gg, seed=seed, policy=policy, max_devices=max_devices)
    module.train()
    obs = {k: torch.as_tensor(v)[None] for k, v in env.observation(0).items()}
    tgt = torch.as_tensor(target[gg.order])  # the target by position (the observation's node order)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    losses: list[float] = []
    taken, best = 0, None  # best: (agreement, step, state, greedy, mean target probability)
    while True:
        logits = module.node_logits(obs)[0, :n]
        greedy = gg.placement_of(logits.detach().argmax(-1).numpy())
        agreement = float((greedy == target).mean()) if n else 1.0
        if best is None or agreement > best[0]:
            with torch.no_grad():
                prob = float(logits.softmax(-1).gather(-1, tgt[:, None]).mean()) if n else 1.0
            best = (agreement, taken, {k: np.array(v, copy=True) for k, v in module.get_state().items()},
                    greedy, prob)
        if agreement == 1.0 or taken == steps:
            break
        loss = torch.nn.functional.cross_entropy(logits, tgt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        taken += 1
    agreement, at, state, greedy, prob = best
    return {"state": state, "steps": taken, "best_step": at, "agreement": agreement,
            "target_prob_mean": prob, "greedy_placement": greedy, "loss": losses}


def warm_start(graph, gg: GDPGraph, *, seed: int = 0, bc_steps: int = BC_STEPS, bc_lr: float = BC_LR,
               policy: dict | None = None, algos: tuple[str, ...] = WARM_START_ALGOS) -> WarmStart:
    """Steps 1-2 of the module doc: the fast placers' best placement and the policy cloned from it."""
    t0 = time.perf_counter()
    problem = gg.problem
    name, p, t, ok, times, valid = pick_best(problem, fast_placements(graph, problem, seed, algos))
    t1 = time.perf_counter()
    bc = behaviour_clone(gg, p, steps=bc_steps, lr=bc_lr, seed=seed, policy=policy)
    return WarmStart(name, p, t, ok, times, valid, len(algos), bc["state"], bc["steps"], bc_steps,
                     bc["best_step"], bc["agreement"], bc["target_prob_mean"], bc["greedy_placement"],
                     bc["loss"], t1 - t0, time.perf_counter() - t1)


def answer(candidates: dict[str, tuple[float, bool]]) -> str:
    """The fastest valid candidate's name; ties go to the earlier one of :data:`ANSWER_SOURCES`; none
    valid: the fastest."""
    order = [k for k in ANSWER_SOURCES if k in candidates]
    return min(order, key=lambda k: (not candidates[k][1], candidates[k][0], order.index(k)))


def gdp_warm(graph, gg: GDPGraph, budget: int, *, seed: int = 0, time_limit_s: float = SAFETY_LIMIT_S,
             bc_steps: int = BC_STEPS, bc_lr: float = BC_LR, policy: dict | None = None,
             ppo: dict | None = None, log=None) -> GDPWarmRun:
    """Warm start, behaviour cloning, PPO within ``budget`` simulator calls, and the best of the three
    candidates (module doc). ``graph`` is the op graph of ``gg`` (the human-like placer reads it)."""
    from .gdp_ppo import PPO_DEFAULTS, gdp_train

    low = min_budget()
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < low:
        raise ValueError(f"budget is {budget!r}; must be an integer >= {low} (simulator calls: one per fast "
                         f"placer and one for the greedy placement)")
    t0 = time.perf_counter()
    ws = warm_start(graph, gg, seed=seed, bc_steps=bc_steps, bc_lr=bc_lr, policy=policy)
    batch = int({**PPO_DEFAULTS, **(ppo or {})}["train_batch_size_per_learner"])
    planned = (int(budget) - ws.simulator_calls - 1) // batch
    t1 = time.perf_counter()
    run = gdp_train([gg], iterations=planned, time_limit_s=time_limit_s, seed=seed, init_state=ws.state,
                    policy=policy, ppo=ppo, log=log, name="gdp-warm")
    ppo_wall = time.perf_counter() - t1
    calls = ws.simulator_calls + run.samples + 1
    if calls > budget:  # gdp_train draws train_batch_size_per_learner samples per iteration
        raise RuntimeError(f"gdp_warm used {calls} simulator calls on a budget of {budget} ({run.samples} "
                           f"PPO samples in {run.iterations} iterations of {batch} planned)")
    best_p = run.best_placement[0]
    cands = {"warm_start": (ws.step_time_s, ws.valid),
             "greedy": (run.greedy_step_time_s[0], run.greedy_valid[0]),
             "best_sample": (run.best_step_time_s[0] if best_p is not None else float("inf"),
                             best_p is not None)}
    src = answer(cands)
    placement = {"warm_start": ws.placement, "greedy": run.greedy_placement[0], "best_sample": best_p}[src]
    return GDPWarmRun(np.asarray(placement, np.int64), cands[src][0], cands[src][1], src, ws,
                      run.greedy_step_time_s[0], run.greedy_valid[0], np.asarray(run.greedy_placement[0]),
                      cands["best_sample"][0], best_p, run.samples, run.iterations, planned, calls,
                      int(budget), "budget" if run.iterations >= planned else "time limit", ppo_wall,
                      time.perf_counter() - t0, [m[0] for m in run.sampled_mean_step_time_s])
