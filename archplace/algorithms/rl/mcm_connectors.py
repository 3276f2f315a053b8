"""The MCM constraint repair as an RLlib module-to-env connector (spec §2.3, issue 16).

The policy samples a full assignment y; the repair turns it into a statically valid y' (Eqs. 2–4).
Doing that here, between the RLModule and the environment, rather than inside ``env.step`` gives the
repair what only the module side has, and lets the episode record either action:

* **the policy's probabilities**: SAMPLE repair (``repair: sample``) draws each deferred node from the
  policy's own distribution, softmax(logits) restricted to the node's domain, instead of the
  ``0.9 · onehot(y) + 0.1 / C`` an environment has to make up;
* **which action PPO trains on**: ``ACTIONS_FOR_ENV`` is y' (what the simulator evaluates) while the
  episode keeps ``ACTIONS``: y with its sampling log-probability (``train_on: sampled``, option (a),
  the solver as part of the environment), or y' with its log-probability recomputed from the same
  logits (``train_on: repaired``, option (b), the solver as part of the policy).

The repair itself is the environment's (:meth:`MCMPartitionEnv.repair_action`: the graph it is on, its
repair mode, time limit and seeded random stream), so a seeded run gives the same partitions with this
connector as the environment repairing alone, and the environment still repairs whatever it is given
when used without RLlib. Each env runner builds its own connector around its own vector env: row i of
the module's batch is sub-environment i.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.columns import Columns

TRAIN_ON = ("sampled", "repaired")


def node_probs(logits: np.ndarray, num_nodes: int) -> np.ndarray:
    """Per-node softmax of the flat ``[N_max * C]`` logits (the module's ``ACTION_DIST_INPUTS`` for
    one ``MultiDiscrete`` action), as ``[N_max, C]`` probabilities (float64, rows summing to 1)."""
    lg = np.asarray(logits, np.float64).reshape(num_nodes, -1)
    lg = lg - lg.max(-1, keepdims=True)
    e = np.exp(lg)
    return e / e.sum(-1, keepdims=True)


def joint_logp(logits: np.ndarray, action: np.ndarray) -> np.float32:
    """log π(action): the sum over nodes of each node's categorical log-probability."""
    y = np.asarray(action, np.int64).reshape(-1)
    p = node_probs(logits, len(y))
    return np.float32(np.log(p[np.arange(len(y)), y]).sum())


class RepairActions(ConnectorV2):
    """Module-to-env piece: y (sampled or greedy) → the env's repair → y' in ``ACTIONS_FOR_ENV``;
    with ``train_on="repaired"`` also ``ACTIONS`` = y' and ``ACTION_LOGP`` = log π(y'). Build it with
    :func:`repair_connector` (the ``module_to_env_connector`` factory RLlib calls with each runner's env)."""

    def __init__(self, input_observation_space=None, input_action_space=None, *, env=None,
                 train_on: str = "repaired", **kwargs: Any) -> None:
        super().__init__(input_observation_space, input_action_space, **kwargs)
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on is {train_on!r}; allowed: {list(TRAIN_ON)}")
        self.train_on = train_on
        self._vector_env = env

    def _envs(self) -> list:
        if self._vector_env is None:
            raise RuntimeError("RepairActions needs the env runner's environment (it was built without one)")
        return [e.unwrapped for e in self._vector_env.unwrapped.envs]

    def __call__(self, *, rl_module, batch: dict[str, Any], episodes: list, explore: bool | None = None,
                 shared_data: dict | None = None, **kwargs: Any) -> Any:
        envs = self._envs()
        # row i of the module's batch is sub-env i; the unbatched items are keyed by the episode id the
        # env-to-module pass memorised for that row (not always the id of episodes[i] after a reset)
        rows = (shared_data or {}).get("memorized_map_structure") or [ep.id_ for ep in episodes]
        index = {eps_id: i for i, eps_id in enumerate(rows)}
        with_logp = Columns.ACTION_LOGP in batch
        batch[Columns.ACTIONS_FOR_ENV] = copy.deepcopy(batch[Columns.ACTIONS])
        cols = [Columns.ACTIONS_FOR_ENV, Columns.ACTIONS, Columns.ACTION_DIST_INPUTS]
        cols += [Columns.ACTION_LOGP] if with_logp else []
        repaired = self.train_on == "repaired"

        def repair_one(items, eps_id, *_):
            i = index[eps_id]
            if not episodes[i].is_reset:
                # the sub-env finished an episode: gymnasium's next-step autoreset ignores this action
                # (repairing it would spend a solver call and a draw of the env's random stream)
                return items
            y = np.asarray(items[1], np.int64)
            logits = np.asarray(items[2])
            env = envs[i]
            probs = node_probs(logits, len(y)) if env.repair_mode == "sample" else None
            y_rep = env.repair_action(y, probs=probs)
            if not repaired:
                return (y_rep, *items[1:])
            out = [y_rep, y_rep.astype(y.dtype, copy=True), items[2]]
            if with_logp:
                out.append(joint_logp(logits, y_rep))
            return tuple(out)

        self.foreach_batch_item_change_in_place(batch=batch, column=cols, func=repair_one)
        return batch


def repair_connector(train_on: str):
    """The ``module_to_env_connector`` factory for ``AlgorithmConfig.env_runners``: RLlib calls it with
    each env runner's vector env (None on a driver whose runner does not sample)."""
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on is {train_on!r}; allowed: {list(TRAIN_ON)}")

    def make(env, spaces=None):
        return RepairActions(env=env, train_on=train_on)

    return make
