"""Seeded prioritized episode replay, with n-step returns that stop at the episode's end (issue 16).

RLlib's episode buffers draw from ``np.random.default_rng(seed=None)`` and take no seed, so a "seeded"
DQN run replays different transitions each time it runs; this buffer takes ``seed``.

RLlib's :class:`PrioritizedEpisodeReplayBuffer` builds an n-step transition only when n steps of its
episode follow it and redraws the others. A pipeline-cut episode has K − 1 steps, so with n ≥ K − 1
the last n − 1 cuts of every episode, the ones whose reward is the plan's length, are never learnt
from, and with n > K − 1 no transition qualifies and sampling never returns. The textbook n-step
target instead truncates at the end:

    G_t = Σ_{i < k} γ^i r_{t+i} + [not terminal] γ^k max_a Q(s_{t+k}, a),   k = min(n, T − t),

which is what this buffer samples: it draws transitions by priority exactly as RLlib does (one step,
so nothing is redrawn), then extends each to k steps of its own episode and records k as the sample's
``n_step``, the exponent RLlib's DQN learner puts on γ for the bootstrap.
"""

from __future__ import annotations

from abc import ABCMeta
from typing import Any

import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer


def discounted_sum(rewards, gamma: float) -> float:
    """Σ_i γ^i r_i."""
    r = np.asarray(rewards, np.float64)
    return float((gamma ** np.arange(len(r)) * r).sum())


class _NameTest(ABCMeta):
    """RLlib 2.60 sets a buffer up after testing ``"EpisodeReplayBuffer" in replay_buffer_config["type"]``,
    which assumes a string; Tune hands it the class (it resolves dotted type names). The class answers
    that test from its name."""

    def __contains__(cls, part: object) -> bool:
        return isinstance(part, str) and part in cls.__name__


class NStepPrioritizedEpisodeReplayBuffer(PrioritizedEpisodeReplayBuffer, metaclass=_NameTest):
    """:class:`PrioritizedEpisodeReplayBuffer` with a seeded random stream (``seed``) whose n-step
    transitions are truncated at the episode's end instead of redrawn (module docstring). Only an
    integer ``n_step`` is supported."""

    def __init__(self, *args: Any, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rng = np.random.default_rng(seed)

    def sample(self, num_items: int | None = None, *, n_step: Any = None, gamma: float = 0.99,
               include_infos: bool = False, to_numpy: bool = False, **kwargs: Any):
        n = 1 if n_step is None else n_step
        if isinstance(n, (tuple, list)) or int(n) != n or n < 1:
            raise ValueError(f"n_step is {n_step!r}; allowed: an integer >= 1")
        n = int(n)
        one = super().sample(num_items, n_step=1, gamma=gamma, include_infos=include_infos,
                             to_numpy=False, **kwargs)
        if n == 1:
            if to_numpy:
                for e in one:
                    e.to_numpy()
            return one
        out = []
        for e, tree_idx in zip(one, self._last_sampled_indices):
            ep_idx, ts = self._indices[self._tree_idx_to_sample_idx[tree_idx]][:2]
            src = self.episodes[ep_idx - self._num_episodes_evicted]
            k = min(n, len(src) - ts)
            end = ts + k == len(src)
            extra = {key: [e.get_extra_model_outputs(key, 0)] for key in e.extra_model_outputs.keys()}
            extra["n_step"] = [k]
            t = SingleAgentEpisode(
                observations=[src.get_observations(ts), src.get_observations(ts + k)],
                observation_space=src.observation_space,
                infos=[src.get_infos(ts), src.get_infos(ts + k)] if include_infos else None,
                actions=[src.get_actions(ts)],
                action_space=src.action_space,
                rewards=[discounted_sum(src.get_rewards(slice(ts, ts + k)), gamma)],
                terminated=src.is_terminated if end else False,
                truncated=src.is_truncated if end else False,
                extra_model_outputs=extra,
                len_lookback_buffer=0,
                t_started=ts,
            )
            if to_numpy:
                t.to_numpy()
            out.append(t)
        return out
