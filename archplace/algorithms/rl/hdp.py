"""HDP (Mirhoseini et al. 2018, "A Hierarchical Model for Device Placement"), GDP's baseline (spec gdp.md §7),
trained with GDP's reward and GDP's PPO (issue 18), so that a comparison isolates the policy.

HDP places ops in two steps: a feed-forward **grouper** assigns every op to one of G groups (a softmax per
op), each group is embedded from the features of its ops, and a seq2seq LSTM **placer** with attention
over the encoded groups assigns each group to a device; an op runs on its group's device. The grouping is
not differentiable, so grouper and placer are trained jointly by policy gradient on the same reward.

Here:

* :class:`HDPEnv` is :class:`~archplace.algorithms.rl.gdp_env.GDPEnv` (same observation, reward, ``info``
  and best-placement bookkeeping) with the action ``MultiDiscrete([G] * max_nodes + [max_devices] * G)``:
  the group of every op (by position in topological order), then the device of every group. The grouping
  is part of the action so that PPO's probability ratio is exact: ``log pi(a) = sum over real ops of
  log p(group of op) + sum over groups of log p(device of group | grouping, earlier devices)``.
* :class:`HDPModule` samples that action itself (grouping, then group embeddings, then devices group by
  group) and returns ``actions`` and ``action_logp`` (RLlib's ``GetActions`` connector only samples when the
  module returned no actions). Its ``action_dist_inputs`` are the group logits and the device logits
  *along the sampled path*; ``forward_train`` rebuilds the latter from the batch's actions (teacher
  forcing), so :class:`HDPDistribution`'s ``logp`` of the taken action is the exact joint log-probability.
* :func:`hdp_train` runs GDP's PPO (per-graph running-mean baseline instead of a critic, the GDP learner,
  callback and :class:`~archplace.algorithms.rl.gdp_ppo.GDPRun` result) with this env and module.

Simplified against HDP (the paper's sizes are not reproduced; all of them are config keys):

* the op features are GDP's (``workloads.gdp_models.node_features``), not HDP's op-type / output-shape /
  adjacency embedding; the group embedding is the mean of its ops' features plus ``log1p`` of its op count
  (HDP: per-group op-type counts, output sizes and adjacency), layer-normalised (ours: log-byte features
  would saturate the LSTM gates);
* reward ``-sqrt(step time)`` from the simulator (as GDP), and the optimiser is GDP's PPO with its
  per-graph running-mean baseline rather than HDP's own policy-gradient set-up (the point: same reward,
  same optimiser, different policy);
* a group no op was sampled into gets device 0 with probability 1 (ours: its device cannot change the
  reward, so sampling it would only add noise to the gradient); the decoder still steps through it;
* the placer's encoder is a one-layer bidirectional LSTM, its decoder a one-layer LSTM fed the previous
  group's device and the group's encoder state, with Luong ("general") attention over the non-empty groups.

Behaviour seen on the 4-chain x 2-GPU test graph (``tests/test_hdp.py``): the uniform policy is a
saddle (swapping the devices is a symmetry, so the expected gradient of independent per-op or per-group
choices is zero there), and the untrained HDP policy samples at about the uniform-random placement's step
time (15.8 ms against the optimum's 12.1 ms). Short runs gain by spreading correlated groups over the
devices (with few groups the untrained policy is worse than uniform). In longer runs (G = 4 or 8, lr 1e-2)
leaving the saddle took 100-300 PPO iterations of 16 samples when it happened at all, and some runs
collapsed onto one device (all ops in one group: no reward variance, hence no gradient). The greedy
policy (argmax group per op, then argmax devices) often puts every op in one group early in training,
so best-seen and greedy results are reported apart.

PPO's KL penalty is **off** (``use_kl_loss=False`` in :data:`HDP_PPO_DEFAULTS`): the stored distribution
inputs are conditional on the sampled path, so a KL would only be a one-path estimate. ``compute_values``
returns zeros, as GDP's module: there is no critic.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.distribution.torch.torch_distribution import TorchDeterministic
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn

from .gdp_env import GDPEnv, GDPGraph
from .gdp_ppo import PPO_DEFAULTS, GDPRun, gdp_ppo_config, gdp_train

DEFAULT_NUM_GROUPS = 32  # HDP used 256 groups on graphs of thousands of ops
MASKED_LOGIT = float("-inf")
HDP_MODEL_DEFAULTS: dict[str, Any] = {"grouper_hidden": 64, "placer_hidden": 64, "device_embed": 16}
HDP_PPO_DEFAULTS: dict[str, Any] = {**PPO_DEFAULTS, "use_kl_loss": False}


class HDPEnv(GDPEnv):
    """:class:`GDPEnv` with the grouped action (module doc). ``config`` adds ``num_groups`` (default 32)."""

    def __init__(self, config: dict | None = None):
        super().__init__(config)
        self.num_groups = int((config or {}).get("num_groups", DEFAULT_NUM_GROUPS))
        if self.num_groups < 1:
            raise ValueError(f"num_groups is {self.num_groups}, must be >= 1")
        self.action_space = gym.spaces.MultiDiscrete(
            [self.num_groups] * self.max_nodes + [self.max_devices] * self.num_groups)

    def device_action(self, action) -> np.ndarray:
        """GDP's action (the device of every position) of an HDP action: ``device[group[position]]``."""
        a = np.asarray(action, np.int64).reshape(-1)
        if a.shape[0] != self.max_nodes + self.num_groups:
            raise ValueError(f"HDP action has {a.shape[0]} entries, expected "
                             f"{self.max_nodes + self.num_groups}")
        groups, devices = a[:self.max_nodes], a[self.max_nodes:]
        if groups.min(initial=0) < 0 or groups.max(initial=0) >= self.num_groups:
            raise ValueError(f"group ids must lie in [0, {self.num_groups})")
        return devices[groups]

    def placement_of(self, action, graph: int | None = None) -> np.ndarray:
        """The placement (device per op, in the problem's op order) an HDP action means for a graph."""
        g = self.graphs[self._g if graph is None else graph]
        return g.placement_of(self.device_action(action))

    def step(self, action):
        return super().step(self.device_action(action))


class HDPDistribution(Distribution):
    """The joint distribution of (grouping, devices) along one decoding path.

    ``logits`` ``[..., n_max * G + G * D]``: the per-op group logits, then the per-group device logits
    (each conditioned on the grouping and the earlier groups' devices of the path they were computed on).
    ``logp`` / ``entropy`` / ``kl`` are sums over the independent-given-the-path categoricals; padded ops
    and empty groups carry constant logits ``[0, -inf, ...]``, so they add exactly 0."""

    def __init__(self, logits: torch.Tensor, n_max: int, num_groups: int, max_devices: int) -> None:
        super().__init__()
        self.n_max, self.num_groups, self.max_devices = n_max, num_groups, max_devices
        cut = n_max * num_groups
        self.group_logits = logits[..., :cut].reshape(*logits.shape[:-1], n_max, num_groups)
        self.device_logits = logits[..., cut:].reshape(*logits.shape[:-1], num_groups, max_devices)
        self._g = torch.distributions.Categorical(logits=self.group_logits)
        self._d = torch.distributions.Categorical(logits=self.device_logits)

    def sample(self) -> torch.Tensor:  # only consistent with the logits' path when the module sampled them
        return torch.cat([self._g.sample(), self._d.sample()], -1)

    def rsample(self, sample_shape=()):
        raise NotImplementedError("a categorical action has no reparameterised sample")

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        value = value.long()
        return (self._g.log_prob(value[..., :self.n_max]).sum(-1)
                + self._d.log_prob(value[..., self.n_max:]).sum(-1))

    def entropy(self) -> torch.Tensor:
        return self._g.entropy().sum(-1) + self._d.entropy().sum(-1)

    def kl(self, other: HDPDistribution) -> torch.Tensor:
        kl = torch.distributions.kl_divergence
        return kl(self._g, other._g).sum(-1) + kl(self._d, other._d).sum(-1)

    @staticmethod
    def required_input_dim(space: gym.Space, n_max: int = 0, num_groups: int = 0, max_devices: int = 0,
                           **kwargs) -> int:
        return n_max * num_groups + num_groups * max_devices

    @classmethod
    def from_logits(cls, logits: torch.Tensor, n_max: int = 0, num_groups: int = 0, max_devices: int = 0,
                    **kwargs) -> HDPDistribution:
        return cls(logits, n_max, num_groups, max_devices)

    def to_deterministic(self) -> TorchDeterministic:
        greedy = [self.group_logits.argmax(-1), self.device_logits.argmax(-1)]
        return TorchDeterministic(loc=torch.cat(greedy, -1))


class HDPModule(TorchRLModule, ValueFunctionAPI):
    """HDP's grouper and placer for a padded batch of graphs (module doc); values are zeros.

    ``model_config`` keys (others ignored): ``grouper_hidden`` (64; the grouper is Linear-ReLU-Linear),
    ``placer_hidden`` (64; encoder LSTM per direction and decoder LSTM), ``device_embed`` (16; the
    embedding of the previous group's device fed to the decoder). G, ``max_devices`` and ``n_max`` come from
    the spaces."""

    def setup(self) -> None:
        cfg = {**HDP_MODEL_DEFAULTS, **{k: v for k, v in (self.model_config or {}).items()
                                        if k in HDP_MODEL_DEFAULTS}}
        x_space = self.observation_space["x"]
        self.n_max, F = int(x_space.shape[0]), int(x_space.shape[1])
        nvec = np.asarray(self.action_space.nvec)
        self.num_groups = int(len(nvec) - self.n_max)
        if self.num_groups < 1 or not (nvec[:self.n_max] == self.num_groups).all():
            raise ValueError(f"action space must be MultiDiscrete([G] * {self.n_max} + [D] * G), got {nvec}")
        self.max_devices = int(nvec[self.n_max])
        if not (nvec[self.n_max:] == self.max_devices).all():
            raise ValueError(f"the last G entries of the action space must be equal, got {nvec[self.n_max:]}")
        given = (self.model_config or {}).get("max_devices")
        if given is not None and int(given) != self.max_devices:
            raise ValueError(f"model_config max_devices={given}, the action space has {self.max_devices}")
        G, D, H, E = self.num_groups, self.max_devices, int(cfg["placer_hidden"]), int(cfg["device_embed"])
        self.grouper = nn.Sequential(nn.Linear(F, int(cfg["grouper_hidden"])), nn.ReLU(),
                                     nn.Linear(int(cfg["grouper_hidden"]), G))
        self.embed_norm = nn.LayerNorm(F + 1)
        self.encoder = nn.LSTM(F + 1, H, batch_first=True, bidirectional=True)
        self.enc_proj = nn.Linear(2 * H, H)
        self.dec_init = nn.Linear(H, H)
        self.device_emb = nn.Embedding(D + 1, E)  # index D: the start token
        self.decoder = nn.LSTM(E + H, H, batch_first=True)
        self.attn = nn.Linear(H, H, bias=False)
        self.head = nn.Sequential(nn.Linear(2 * H, H), nn.Tanh(), nn.Linear(H, D))
        for size, name in ((G, "pad_groups"), (D, "pad_devices")):
            pad = torch.full((size,), MASKED_LOGIT)
            pad[0] = 0.0
            self.register_buffer(name, pad, persistent=False)
        self.action_dist_cls = HDPDistribution.get_partial_dist_cls(n_max=self.n_max, num_groups=G,
                                                                    max_devices=D)

    # ------------------------------------------------------------------ pieces
    def group_logits(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-op group logits ``[B, n_max, G]`` (padded ops ``[0, -inf, ...]``) and the op mask."""
        x = obs["x"].float()
        n = obs["num_nodes"].reshape(x.shape[0], -1)[:, 0].long()
        mask = torch.arange(self.n_max, device=x.device).unsqueeze(0) < n.unsqueeze(1)
        logits = self.grouper(x)
        return torch.where(mask.unsqueeze(-1), logits, self.pad_groups.expand_as(logits)), mask

    def encode_groups(self, x: torch.Tensor, groups: torch.Tensor, mask: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder states ``[B, G, H]`` of a grouping's groups, and which groups hold an op ``[B, G]``."""
        onehot = nn.functional.one_hot(groups, self.num_groups).to(x.dtype) * mask.unsqueeze(-1).to(x.dtype)
        count = onehot.sum(1)  # [B, G]
        mean = onehot.transpose(1, 2) @ x / count.clamp(min=1.0).unsqueeze(-1)
        emb = self.embed_norm(torch.cat([mean, torch.log1p(count).unsqueeze(-1)], -1))
        enc, _ = self.encoder(emb)
        return self.enc_proj(enc), count > 0

    def _device_logits(self, out: torch.Tensor, enc: torch.Tensor, keys: torch.Tensor, nonempty: torch.Tensor,
                       num_devices: torch.Tensor, rows: torch.Tensor | slice) -> torch.Tensor:
        """Device logits ``[B, T, D]`` of decoder outputs ``out`` ``[B, T, H]`` for groups ``rows`` (T of
        them), attending over the non-empty groups' encoder states ``enc`` (``keys = attn(enc)``)."""
        scores = out @ keys  # [B, T, G]
        scores = scores.masked_fill(~nonempty.unsqueeze(1), MASKED_LOGIT)
        ctx = torch.softmax(scores, -1) @ enc
        logits = self.head(torch.cat([out, ctx], -1))
        dev = torch.arange(self.max_devices, device=logits.device)
        logits = logits.masked_fill(dev >= num_devices.view(-1, 1, 1), MASKED_LOGIT)
        empty = ~nonempty[:, rows].unsqueeze(-1)
        return torch.where(empty, self.pad_devices.expand_as(logits), logits)

    def _initial_state(self, enc: torch.Tensor, nonempty: torch.Tensor):
        m = nonempty.unsqueeze(-1).to(enc.dtype)
        h0 = torch.tanh(self.dec_init((enc * m).sum(1) / m.sum(1).clamp(min=1.0))).unsqueeze(0)
        return h0, torch.zeros_like(h0)

    def place(self, obs: dict[str, torch.Tensor], groups: torch.Tensor, mask: torch.Tensor,
              devices: torch.Tensor | None = None, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Device logits ``[B, G, D]`` and devices ``[B, G]`` for a grouping: teacher-forced on ``devices``
        when given (one LSTM call), else decoded group by group (sampled, or argmax when ``greedy``)."""
        x = obs["x"].float()
        bsz, G = x.shape[0], self.num_groups
        d = obs["num_devices"].reshape(bsz, -1)[:, 0].long()
        enc, nonempty = self.encode_groups(x, groups, mask)
        state = self._initial_state(enc, nonempty)
        keys = self.attn(enc).transpose(1, 2)
        start = torch.full((bsz, 1), self.max_devices, dtype=torch.long, device=x.device)
        if devices is not None:
            prev = torch.cat([start, devices[:, :-1]], 1)
            out, _ = self.decoder(torch.cat([self.device_emb(prev), enc], -1), state)
            return self._device_logits(out, enc, keys, nonempty, d, slice(None)), devices
        logits, chosen, prev = [], [], start
        for i in range(G):
            out, state = self.decoder(torch.cat([self.device_emb(prev), enc[:, i:i + 1]], -1), state)
            lg = self._device_logits(out, enc, keys, nonempty, d, slice(i, i + 1))
            gumbel = 0.0 if greedy else -torch.log(-torch.log(torch.rand_like(lg).clamp(min=1e-20)))
            dev = (lg + gumbel).argmax(-1)  # a Gumbel-max sample (masked devices stay at -inf)
            logits.append(lg)
            chosen.append(dev)
            prev = dev
        return torch.cat(logits, 1), torch.cat(chosen, 1)

    def act(self, obs: dict[str, torch.Tensor], greedy: bool = False) -> dict[str, torch.Tensor]:
        """Sample (or argmax) a grouping, then the devices given it: actions, their log-prob, dist inputs."""
        glogits, mask = self.group_logits(obs)
        groups = glogits.argmax(-1) if greedy else torch.distributions.Categorical(logits=glogits).sample()
        dlogits, devices = self.place(obs, groups, mask, greedy=greedy)
        inputs = torch.cat([glogits.flatten(1), dlogits.flatten(1)], 1)
        actions = torch.cat([groups, devices], 1)
        logp = self.action_dist_cls.from_logits(inputs).logp(actions)
        return {Columns.ACTIONS: actions, Columns.ACTION_LOGP: logp, Columns.ACTION_DIST_INPUTS: inputs}

    # ------------------------------------------------------------------ RLModule API
    def _forward_exploration(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return self.act(batch[Columns.OBS])

    def _forward_inference(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return self.act(batch[Columns.OBS], greedy=True)

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        obs, actions = batch[Columns.OBS], batch[Columns.ACTIONS].long()
        glogits, mask = self.group_logits(obs)
        dlogits, _ = self.place(obs, actions[:, :self.n_max], mask, devices=actions[:, self.n_max:])
        return {Columns.ACTION_DIST_INPUTS: torch.cat([glogits.flatten(1), dlogits.flatten(1)], 1)}

    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        return self._forward_train(batch) if Columns.ACTIONS in batch else self.act(batch[Columns.OBS])

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> torch.Tensor:
        """Zeros ``[B]``: no critic (the advantage is GDP's per-graph running-mean baseline)."""
        n = batch[Columns.OBS]["num_nodes"]
        return torch.zeros(n.shape[0], device=self.pad_groups.device)


# ---------------------------------------------------------------------- training
def hdp_ppo_config(graphs: list[GDPGraph], *, seed: int = 0, policy: dict | None = None,
                   ppo: dict | None = None, max_devices: int = 8, num_groups: int = DEFAULT_NUM_GROUPS,
                   num_env_runners: int = 0):
    """GDP's PPO config (learner with the per-graph baseline, callback, batch sizes) with HDP's env and
    module swapped in; ``ppo`` overrides :data:`HDP_PPO_DEFAULTS` (KL off)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    config = gdp_ppo_config(graphs, seed=seed, policy=policy, ppo={**HDP_PPO_DEFAULTS, **(ppo or {})},
                            max_devices=max_devices, num_env_runners=num_env_runners)
    return (config
            .environment(HDPEnv, env_config={"graphs": list(graphs), "max_devices": max_devices, "seed": seed,
                                             "num_groups": num_groups})
            .rl_module(rl_module_spec=RLModuleSpec(module_class=HDPModule, model_config=dict(policy or {}))))


def hdp_greedy_placements(algo, graphs: list[GDPGraph]) -> list[np.ndarray]:
    """The greedy policy's placement per graph (by op): argmax group of every op, then groups decoded
    with the argmax device at every step."""
    module = algo.get_module()
    env = HDPEnv({"graphs": graphs, "max_devices": module.max_devices, "num_groups": module.num_groups})
    out = []
    for gi in range(len(graphs)):
        obs = {k: torch.as_tensor(v)[None] for k, v in env.observation(gi).items()}
        with torch.no_grad():
            action = module.act(obs, greedy=True)[Columns.ACTIONS][0].numpy()
        out.append(env.placement_of(action, gi))
    return out


def hdp_train(graphs: list[GDPGraph], *, iterations: int | None = None, time_limit_s: float | None = None,
              seed: int = 0, ppo: dict | None = None, num_groups: int = DEFAULT_NUM_GROUPS,
              policy: dict | None = None, max_devices: int = 8, init_state: dict | None = None,
              keep_state: bool = False, log=None) -> GDPRun:
    """HDP trained by GDP's PPO loop (:func:`~archplace.algorithms.rl.gdp_ppo.gdp_train`) on ``graphs`` for
    ``iterations`` PPO updates or ``time_limit_s`` seconds, reporting best-seen and greedy placements
    apart."""
    config = hdp_ppo_config(graphs, seed=seed, policy=policy, ppo=ppo, max_devices=max_devices,
                            num_groups=num_groups)
    return gdp_train(graphs, iterations=iterations, time_limit_s=time_limit_s, seed=seed,
                     init_state=init_state, keep_state=keep_state, log=log, config=config,
                     greedy=hdp_greedy_placements, name="hdp")
