"""PPO with constraint-repaired actions for MCM partitioning: build, train, pre-train, transfer.

The thin Ray layer over :class:`~archplace.algorithms.rl.mcm_env.MCMPartitionEnv` and
:class:`~archplace.algorithms.rl.gnn_module.GraphPartitionModule` (spec mcm.md §2.5, §5):

* :func:`build_ppo` makes an RLlib new-API-stack PPO ``Algorithm`` from ``tune_configs/mcm_ppo.yaml``
  (sampling and learning in-process: one env runner, one local learner, so an MCM search is one
  Ray task and a bench can run several side by side);
* :func:`rl_search` is one search on one graph with a fixed sample budget, as a
  :class:`~archplace.algorithms.search.mcm_baselines.SearchTrace`, from scratch, fine-tuned from a
  pre-trained module state, or zero-shot (the pre-trained policy sampled without any update);
* :func:`pretrain` trains one policy on many graphs (round robin), scores a checkpoint every
  ``checkpoint_every`` samples on the validation graphs and keeps the best (paper: 20,000 samples,
  200 checkpoints, best by average reward on 5 validation graphs).

Every graph is padded to the same ``n_max`` / ``e_max`` (:data:`CORPUS_N_MAX`, :data:`CORPUS_E_MAX`
cover the corpus): the module's weights do not depend on them, but RLlib's spaces do, and equal
spaces let a pre-trained state load into a test-graph algorithm as it is.

One sample is one evaluated (repaired) partition, i.e. one environment step.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import yaml

from ...simulators.mcm import MCMProblem
from ..search.mcm_baselines import SearchTrace
from .mcm_env import MCMPartitionEnv

CONFIG_FILE = "mcm_ppo.yaml"
CORPUS_N_MAX = 320  # the largest corpus graph has 300 nodes, the test graphs at most 266
CORPUS_E_MAX = 640


def load_config() -> dict[str, Any]:
    """``tune_configs/mcm_ppo.yaml`` as a dict (sections env, ppo, model, pretraining)."""
    return yaml.safe_load(resources.files("archplace.tune_configs").joinpath(CONFIG_FILE).read_text())


MAX_LOG_RATIO = 20.0


def _bounded_ratio_learner():
    import torch
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.core.columns import Columns

    class BoundedRatioPPOLearner(PPOTorchLearner):
        """PPO's loss with the joint log-ratio bounded to +-:data:`MAX_LOG_RATIO`. The ratio is that of a
        whole partition (a sum over N nodes): after a few epochs on y' it can pass exp(88), and one
        infinite ratio, even at a masked-out step, turns every gradient into NaN (0 * inf). The bound
        moves the stored behaviour log-probability, so RLlib's loss is otherwise unchanged."""

        def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
            module = self.module[module_id].unwrapped()
            dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
            curr = dist.logp(batch[Columns.ACTIONS]).detach()
            batch = dict(batch)
            batch[Columns.ACTION_LOGP] = torch.clamp(batch[Columns.ACTION_LOGP], curr - MAX_LOG_RATIO,
                                                     curr + MAX_LOG_RATIO)
            return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch,
                                                   fwd_out=fwd_out)

    return BoundedRatioPPOLearner


def build_ppo(graphs: Any, **kw: Any):
    """:func:`ppo_config` built into an ``Algorithm``."""
    config = ppo_config(graphs, **kw)
    algo = config.build_algo()
    algo.archplace_env_config = config.env_config   # what SampleTracker needs to name graphs and baselines
    return algo


def ppo_config(graphs: Any, *, num_chips: int = 36, seed: int = 0, env: dict | None = None,
               ppo: dict | None = None, model: dict | None = None, n_max: int | None = None,
               e_max: int | None = None, num_env_runners: int = 0, num_learners: int = 0):
    """A PPO ``Algorithm`` on ``graphs`` (anything :class:`MCMPartitionEnv` takes). ``env``, ``ppo`` and
    ``model`` override the YAML sections key by key. ``num_env_runners`` remote EnvRunner actors
    sample (0: the driver's own runner); every sampled partition reaches the driver through the
    :class:`~archplace.algorithms.rl.callbacks.MCMSampleLog` metrics either way."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from .callbacks import MCMSampleLog
    from .gnn_module import GraphPartitionModule
    from .mcm_connectors import repair_connector

    cfg = load_config()
    env_cfg = {**cfg["env"], **(env or {}), "graphs": graphs, "num_chips": num_chips, "seed": seed}
    train_on = env_cfg.pop("train_on", "repaired")
    connector = repair_connector(train_on)     # raises on an unknown train_on
    if n_max is not None:
        env_cfg["n_max"], env_cfg["e_max"] = n_max, e_max
    ppo_cfg = {**cfg["ppo"], **(ppo or {})}
    episodes = int(ppo_cfg.pop("episodes_per_iteration"))
    rounds = int(env_cfg["rounds"])
    batch = episodes * rounds
    minibatches = int(ppo_cfg.pop("num_minibatches"))
    ppo_cfg["train_batch_size_per_learner"] = batch
    ppo_cfg["minibatch_size"] = max(1, batch // minibatches)
    model_cfg = {**cfg["model"], **(model or {})}
    config = (
        PPOConfig()
        # a MultiDiscrete action needs no unsquashing, and RLlib's normaliser would overwrite the
        # connector's ACTIONS_FOR_ENV (y') with a copy of ACTIONS (y)
        .environment(MCMPartitionEnv, env_config=env_cfg, normalize_actions=False, clip_actions=False)
        .framework("torch")
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=1,
                     rollout_fragment_length=max(1, batch // max(1, num_env_runners)),
                     module_to_env_connector=connector)     # the repair y -> y', between module and env
        .learners(num_learners=num_learners, learner_class=_bounded_ratio_learner())
        .training(**ppo_cfg)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=GraphPartitionModule, model_config=model_cfg))
        .reporting(metrics_num_episodes_for_smoothing=episodes)
        .debugging(seed=seed)
    )
    return config.callbacks(MCMSampleLog)


def env_of(algo) -> MCMPartitionEnv:
    """The environment of the driver's own runner (``num_env_runners=0`` only; tests inspect it)."""
    if algo.env_runner is None or getattr(algo.env_runner, "env", None) is None:
        raise RuntimeError("the environments run in remote env runners: read SampleTracker, not the env")
    return algo.env_runner.env.unwrapped.envs[0].unwrapped


def env_runner_nodes(algo) -> list[str]:
    """The Ray node id of each remote env runner (empty when sampling runs in this process)."""
    if algo.config.num_env_runners == 0:
        return []
    import ray

    return list(algo.env_runner_group.foreach_env_runner(lambda er: ray.get_runtime_context().get_node_id(),
                                                         local_env_runner=False))


class SampleTracker:
    """The driver's record of every sampled partition, from the ``MCMSampleLog`` metrics of each
    result, so searches work with any number of remote env runners: sample count, valid counts, the
    best-so-far history and best partition per graph. Samples past ``budget`` are not counted."""

    def __init__(self, algo, budget: int | None = None) -> None:
        cfg = algo.archplace_env_config
        self.probe = MCMPartitionEnv({**cfg, "sample_budget": None})   # names and greedy baselines
        self.names = self.probe.names
        self.budget = budget
        self.total = 0
        self.valid_samples = 0
        self.raw_valid_samples = 0
        self.history: dict[str, list[float]] = {n: [] for n in self.names}
        self.best: dict[str, tuple[float, np.ndarray]] = {}
        from ..search.mcm_baselines import RepairStats

        self.repair = RepairStats(max(p.num_nodes for p in self.probe.problems))

    def update(self, result: dict[str, Any]) -> None:
        from .callbacks import mcm_records, repair_records

        samples, improvements = mcm_records(result)
        for stage, changed in repair_records(result)[: max(0, (self.budget or 1 << 62) - self.total)]:
            self.repair.add(stage, changed if stage is not None else None)
        counted_best: dict[int, float] = {}
        for g, thr, raw_valid, _ in samples:
            self.total += 1
            if self.budget is not None and self.total > self.budget:
                continue
            name = self.names[g]
            self.valid_samples += thr > 0
            self.raw_valid_samples += raw_valid
            if thr > 0 and thr > counted_best.get(g, 0.0):
                counted_best[g] = thr
            prev = self.best[name][0] if name in self.best else 0.0
            self.history[name].append(max(prev, counted_best.get(g, 0.0)))
        for g, thr, part in improvements:   # the partition of each counted improvement
            name = self.names[g]
            if thr == counted_best.get(g) and (name not in self.best or thr > self.best[name][0]):
                self.best[name] = (thr, part[: self.probe.problems[g].num_nodes].copy())


def module_state(algo) -> dict[str, Any]:
    """The learner's module weights (numpy arrays), to save or to load into another algorithm."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    return algo.learner_group.get_weights()[DEFAULT_MODULE_ID]


def load_module_state(algo, state: dict[str, Any]) -> None:
    """Load ``state`` into the learner and every env runner (the optimizer starts afresh)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    algo.learner_group.set_weights({DEFAULT_MODULE_ID: state})
    if algo.env_runner is not None:
        algo.env_runner.module.set_state(state)
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)


def train_samples(algo, samples: int, train: bool = True, tracker: SampleTracker | None = None,
                  deadline: float | None = None) -> SampleTracker:
    """Run until ``samples`` more partitions have been evaluated (or the ``time.time()`` ``deadline``
    passes, checked between iterations): PPO iterations, or (``train=False``) sampling from the current
    policy without updates (zero-shot).

    With a ``deadline`` an iteration is not started when the last one's wall time says it would end past
    the deadline (issue 31: the env stops sampling at the deadline, but the PPO update that follows still
    ran, and paper PPO took a median 16 s on a 10 s budget); the run then stops short of its budget
    instead of overrunning it (its wall time shows it)."""
    tracker = tracker or SampleTracker(algo)
    target = tracker.total + samples
    last_s = 0.0
    while tracker.total < target and (deadline is None or time.time() + last_s < deadline):
        t_it = time.time()
        if train:
            tracker.update(algo.train())
        else:
            steps = min(algo.config.train_batch_size_per_learner, target - tracker.total)
            for res in _sample_only(algo, steps):
                tracker.update(res)
        last_s = time.time() - t_it
    return tracker


def _sample_only(algo, steps: int) -> list[dict[str, Any]]:
    """Sample ``steps`` environment steps with the current policy on every runner, no training; the
    runners' metrics, shaped as ``algo.train()`` results."""
    n = algo.config.num_env_runners
    if n == 0:
        algo.env_runner.sample(num_timesteps=steps, explore=True)
        return [{"env_runners": _reduced(algo.env_runner.get_metrics())}]
    per = max(1, -(-steps // n))
    metrics = algo.env_runner_group.foreach_env_runner(
        lambda er: (er.sample(num_timesteps=per, explore=True), er.get_metrics())[1], local_env_runner=False)
    return [{"env_runners": _reduced(m)} for m in metrics]


def _reduced(metrics: dict[str, Any]) -> dict[str, Any]:
    """An env runner's metrics as plain values (they come back as Stats objects to be merged)."""
    out = {}
    for k, v in metrics.items():
        out[k] = v.peek() if hasattr(v, "peek") else v
    return out


@dataclass
class RLRun:
    """One RL search: the per-graph trace and the module state at the end."""

    trace: SearchTrace
    state: dict[str, Any] | None = None


def rl_search(problem: MCMProblem, samples: int, *, seed: int = 0, init_state: dict | None = None,
              train: bool = True, repair: str = "fix", env: dict | None = None, ppo: dict | None = None,
              model: dict | None = None, method: str | None = None, n_max: int = CORPUS_N_MAX,
              e_max: int = CORPUS_E_MAX, keep_state: bool = False, num_env_runners: int = 0,
              num_learners: int = 0, time_limit_s: float | None = None) -> RLRun:
    """PPO on one graph for ``samples`` evaluated partitions. ``init_state``: start from these module
    weights (fine-tuning, or zero-shot with ``train=False``); ``repair="none"``: RL without the solver
    (invalid -> reward 0). A graph larger than ``n_max`` / ``e_max`` widens the padding (the weights do not
    depend on it). ``time_limit_s``: also stop at that wall time (the algorithm build included): past it
    the env stops evaluating (its ``deadline``), so the running iteration ends within one sample."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    name = method or ("rl" if init_state is None else ("rl_finetune" if train else "rl_zeroshot"))
    t0 = time.perf_counter()
    deadline = None if time_limit_s is None else time.time() + time_limit_s
    algo = build_ppo([problem], num_chips=problem.num_chips, seed=seed,
                     env={**(env or {}), "repair": repair, "sample_budget": samples, "deadline": deadline},
                     ppo=ppo, model=model, n_max=max(n_max, problem.num_nodes),
                     e_max=max(e_max, problem.num_edges), num_env_runners=num_env_runners,
                     num_learners=num_learners)
    try:
        if init_state is not None:
            load_module_state(algo, init_state)
        e = train_samples(algo, samples, train=train, tracker=SampleTracker(algo, budget=samples),
                          deadline=deadline)
        nodes = env_runner_nodes(algo)
        hist = np.asarray(e.history[e.names[0]][:samples], dtype=float)
        best = e.best.get(e.names[0])
        state = module_state(algo) if keep_state else None
    finally:
        algo.stop()
    tr = SearchTrace(name, hist, None if best is None else best[1], e.valid_samples, time.perf_counter() - t0,
                     {"raw_valid_samples": e.raw_valid_samples, "baseline": e.probe.baseline(0),
                      "env_runner_nodes": nodes,
                      # the env runners' metrics carry no memory-fix counts: leave those keys out
                      **{k: v for k, v in e.repair.summary().items() if not k.startswith("repair_memory")}})
    return RLRun(tr, state)


@dataclass
class PretrainResult:
    """The chosen checkpoint and the validation curve it was chosen on."""

    best_state: dict[str, Any]
    best_samples: int
    best_validation_reward: float
    checkpoints: list[tuple[int, float]]  # (training samples, mean validation reward)
    train_reward: list[float]  # mean reward per step of each PPO iteration
    wall_s: float


def validation_reward(algo, val_env: MCMPartitionEnv, episodes: int = 2, seed: int = 0) -> float:
    """Mean reward per step of ``episodes`` sampled episodes on every validation graph, with a fixed
    torch seed (the policy is used by sampling, so it is scored by sampling; argmax of an early policy
    puts whole graphs on one chip and says little)."""
    import torch
    from ray.rllib.core.columns import Columns

    module = algo.get_module()
    gen = torch.Generator().manual_seed(seed)
    total, steps = 0.0, 0
    for i in range(len(val_env.problems)):
        for _ in range(episodes):
            obs, _ = val_env.reset(options={"graph": i})
            done = False
            while not done:
                batch = {k: torch.as_tensor(v).unsqueeze(0) for k, v in obs.items()}
                with torch.no_grad():
                    out = module.forward_inference({Columns.OBS: batch})
                logits = out[Columns.ACTION_DIST_INPUTS].reshape(val_env.n_max, -1)
                y = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1)
                obs, r, done, _, _ = val_env.step(y.numpy())
                total += r
                steps += 1
    return total / max(steps, 1)


def pretrain(train_graphs: Any, validation_graphs: Any, *, total_samples: int, checkpoint_every: int,
             seed: int = 0, num_chips: int = 36, ppo: dict | None = None, model: dict | None = None,
             env: dict | None = None, n_max: int = CORPUS_N_MAX, e_max: int = CORPUS_E_MAX,
             log=None) -> PretrainResult:
    """Multi-graph pre-training (round robin over ``train_graphs``) with checkpoint choice on the
    validation graphs' mean sampled reward. ``env`` overrides the YAML's env keys (``train_on`` included)."""
    if total_samples < checkpoint_every or checkpoint_every < 1:
        raise ValueError(f"need 1 <= checkpoint_every ({checkpoint_every}) <= total_samples "
                         f"({total_samples})")
    t0 = time.perf_counter()
    algo = build_ppo(train_graphs, num_chips=num_chips, seed=seed, ppo=ppo, model=model, n_max=n_max,
                     e_max=e_max, env={**(env or {}), "select": "round_robin"})
    rounds = int(algo.archplace_env_config["rounds"])
    val_env = MCMPartitionEnv({"graphs": validation_graphs, "num_chips": num_chips, "n_max": n_max,
                               "e_max": e_max, "seed": seed + 1, "rounds": rounds})
    checkpoints: list[tuple[int, float]] = []
    train_reward: list[float] = []
    best = (-1.0, 0, None)
    try:
        next_ckpt = checkpoint_every
        done = 0   # sampled partitions so far: one per environment step, on any runner
        while done < total_samples:
            res = algo.train()
            done = int(res["env_runners"]["num_env_steps_sampled_lifetime"])
            train_reward.append(float(res["env_runners"]["episode_return_mean"]) / rounds)
            if done >= next_ckpt or done >= total_samples:
                next_ckpt += checkpoint_every
                v = validation_reward(algo, val_env)
                checkpoints.append((done, v))
                if v > best[0]:
                    best = (v, done, module_state(algo))
                if log:
                    log(f"pretrain {done}/{total_samples} samples: train reward "
                        f"{train_reward[-1]:.3f}, validation {v:.3f} (best {best[0]:.3f} @ {best[1]})")
    finally:
        algo.stop()
    return PretrainResult(best[2], best[1], best[0], checkpoints, train_reward, time.perf_counter() - t0)


def save_state(path, state: dict[str, Any], **meta: Any) -> None:
    """Write module weights (and JSON-able ``meta``) to an ``.npz`` file."""
    np.savez_compressed(path, __meta__=np.array(json.dumps(meta)),
                        **{k: np.asarray(v) for k, v in state.items()})


def load_state(path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Module weights and meta written by :func:`save_state`."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"])) if "__meta__" in z.files else {}
        return {k: z[k] for k in z.files if k != "__meta__"}, meta
