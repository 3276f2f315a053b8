"""GDP placement policy as an RLlib new-API-stack ``TorchRLModule`` (spec gdp.md §3-4).

Wraps :class:`archplace.algorithms.rl.gdp_policy.GDPPolicy`. GDP is a one-step contextual bandit (spec §4):
the observation is a whole graph, the action a whole placement, so one batch row = one graph.

Observation (a ``gymnasium.spaces.Dict``; keys are the constants below, sizes fixed by padding):

* ``x`` ``[N_max, F]`` float node features, nodes in **topological order**, rows past ``num_nodes`` padding;
* ``edge_index`` ``[2, E_max]`` int directed edges (producer, consumer), padded with ``-1``: a column with a
  negative (or ``>= num_nodes``) endpoint is dropped;
* ``num_nodes`` ``[1]`` (or scalar) the real node count n <= N_max, n >= 1;
* ``num_devices`` ``[1]`` (or scalar) d in [1, max_devices].

Action space: ``MultiDiscrete([max_devices] * N_max)``, one device per node. ``max_devices`` (default 8) is
read from the action space, so one module serves graphs placed on 2, 4 or 8 devices.

Batching is tensor arithmetic in the module (no ``torch_geometric`` ``Batch``): the padded nodes are
dropped, graph b's edges are offset into the compacted disjoint union (a cumulative sum over the node mask
gives each real node its row), GraphSAGE runs once on the union, and the embeddings are scattered back to
``[B, N_max, hidden]``; the placer then runs batched over the padded sequences with a key-padding mask.
Padding follows each graph's real nodes, so segment boundaries are those of the graph alone and every real
node's logits equal those of ``GDPPolicy`` run on that graph by itself.

``action_dist_inputs`` is ``[B, N_max * max_devices]``, the flattened per-node logits (devices ``>= d`` at
``-inf``). Padded nodes get the constant logits ``[0, -inf, ...]``: all mass on device 0, so their sampled
action is always 0 and their log-probability, entropy and KL are exactly 0 (and carry no gradient). The
distribution is :class:`archplace.algorithms.rl.gnn_module.NodeCategorical` (a vectorised
``TorchMultiCategorical``, one ``torch`` Categorical over ``[B, N_max, max_devices]``), whose ``logp`` is the
sum of the per-node categorical log-probs: the joint log pi(D|G) of spec §4.

Value function: GDP has **no critic**; the advantage is the reward minus the running mean reward of the same
graph (spec §4). RLlib 2.60's ``PPOLearner.rl_module_required_apis()`` nevertheless demands
``ValueFunctionAPI``, and its default learner pipeline ends with the ``GeneralAdvantageEstimation`` connector,
which calls ``compute_values`` on every batch. So :meth:`GDPPlacementModule.compute_values` returns zeros
(no parameters, no gradient). The GDP learner is expected to (a) run PPO with ``use_critic=False`` (no value
loss; ``vf_loss`` is then logged as 0) and (b) overwrite ``Postprocessing.ADVANTAGES`` with
``reward - running_mean[graph]`` after (or instead of) GAE: with zero values, ``gamma=lambda=1`` and one-step
episodes GAE would give the batch-standardised raw reward, which is *not* the paper's baseline.

``model_config`` keys: the fields of :class:`GDPPolicyConfig` (``hidden``, ``sage_layers``,
``placer_layers``, ``heads``, ``ffn_hidden``, ``segment_len``, ``mem_len``, ``attention``,
``superposition``); other keys (RLlib's auto-included defaults) are ignored, as are extra observation keys
(e.g. the env's ``graph``); ``max_devices`` is taken from the action space (a ``max_devices`` key, if
given, must match it).

Loading weights (:meth:`GDPPlacementModule.set_state`, reached by ``load_module_state`` and so by
``gdp_train(init_state=...)`` and ``place-ops --algo gdp-pretrained``) requires exactly this module's
parameter names and shapes and fails with one line naming the first difference (and the node-feature
width when that is the cause): weights saved by an earlier policy architecture or for other features are
refused rather than partly loaded.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule

from archplace.algorithms.rl.gdp_policy import MASKED_LOGIT, GDPPolicy, GDPPolicyConfig
from archplace.algorithms.rl.gnn_module import NodeCategorical

OBS_X = "x"
OBS_EDGE_INDEX = "edge_index"
OBS_NUM_NODES = "num_nodes"
OBS_NUM_DEVICES = "num_devices"


def policy_config(model_config: dict[str, Any] | None, max_devices: int) -> GDPPolicyConfig:
    """:class:`GDPPolicyConfig` from an RLlib ``model_config`` (unknown keys ignored; a ``max_devices`` key
    must agree with the action space's)."""
    given = (model_config or {}).get("max_devices")
    if given is not None and int(given) != int(max_devices):
        raise ValueError(f"model_config max_devices={given} but the action space has {max_devices} devices")
    names = {f.name for f in fields(GDPPolicyConfig)} - {"max_devices"}
    kw = {k: v for k, v in (model_config or {}).items() if k in names}
    return GDPPolicyConfig(**kw, max_devices=int(max_devices))


def union_graph(obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The padded batch as one disjoint union of its real nodes.

    Returns ``x_real [sum n_b, F]``, ``edge_index [2, E_real]`` into those rows, and the node mask
    ``[B, N_max]`` (True at real nodes).
    """
    x = obs[OBS_X].float()
    bsz, n_max, _ = x.shape
    n = obs[OBS_NUM_NODES].reshape(bsz, -1)[:, 0].long()
    mask = torch.arange(n_max, device=x.device).unsqueeze(0) < n.unsqueeze(1)  # [B, N_max]
    flat_mask = mask.reshape(-1)
    new_id = torch.cumsum(flat_mask.long(), 0) - 1  # flat padded index -> row of the union
    ei = obs[OBS_EDGE_INDEX].long().reshape(bsz, 2, -1)
    keep = ((ei >= 0) & (ei < n.view(bsz, 1, 1))).all(1)  # [B, E_max]: drop -1 padding (and junk ids)
    off = (torch.arange(bsz, device=x.device) * n_max).view(bsz, 1, 1)
    union = new_id[(ei + off).permute(1, 0, 2)[:, keep]]  # [2, E_real]
    return x.reshape(bsz * n_max, -1)[flat_mask], union, mask


def state_mismatch(own: dict[str, Any], state: dict[str, Any]) -> str:
    """'' when ``state`` has exactly ``own``'s keys and shapes, else what differs, in one line."""
    missing = [k for k in own if k not in state]
    extra = [k for k in state if k not in own]
    shapes = [f"{k} {list(state[k].shape)} vs {list(own[k].shape)}" for k in own
              if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing, e.g. {missing[0]}")
    if extra:
        parts.append(f"{len(extra)} unexpected, e.g. {extra[0]}")
    if shapes:
        parts.append(f"{len(shapes)} of another shape, e.g. {shapes[0]}")
    w = state.get("policy.in_proj.weight", state.get("policy.sage.0.pool.weight"))
    w_own = own.get("policy.in_proj.weight", own.get("policy.sage.0.pool.weight"))
    if parts and w is not None and w_own is not None and w.shape[-1] != w_own.shape[-1]:
        parts.append(f"node features: {w.shape[-1]} in the weights, {w_own.shape[-1]} here")
    return "; ".join(parts)


class GDPPlacementModule(TorchRLModule, ValueFunctionAPI):
    """Per-node device logits from :class:`GDPPolicy` for a padded batch of graphs; values are zeros."""

    def setup(self) -> None:
        nvec = self.action_space.nvec
        self.n_max = int(len(nvec))
        self.max_devices = int(nvec[0])
        if not (nvec == self.max_devices).all():
            raise ValueError(f"action space must be MultiDiscrete([max_devices] * N_max), got nvec {nvec}")
        x_space = self.observation_space[OBS_X]
        if x_space.shape[0] != self.n_max:
            raise ValueError(f"observation x has {x_space.shape[0]} rows, the action space {self.n_max}")
        self.policy_cfg = policy_config(self.model_config, self.max_devices)
        self.policy = GDPPolicy(int(x_space.shape[1]), self.policy_cfg)
        pad = torch.full((self.max_devices,), MASKED_LOGIT)
        pad[0] = 0.0
        self.register_buffer("pad_logits", pad, persistent=False)
        self.action_dist_cls = NodeCategorical.get_partial_dist_cls(
            input_lens=[self.max_devices] * self.n_max)

    def node_logits(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-node device logits ``[B, N_max, max_devices]``; padded nodes ``[0, -inf, ...]``."""
        x_real, edge_index, mask = union_graph(obs)
        h_real = self.policy.embed(x_real, edge_index)
        bsz, n_max = mask.shape
        h = h_real.new_zeros(bsz * n_max, h_real.shape[-1])
        h[mask.reshape(-1)] = h_real
        d = obs[OBS_NUM_DEVICES].reshape(bsz, -1)[:, 0].long()
        logits = self.policy.place(h.view(bsz, n_max, -1), d, mask)
        return torch.where(mask.unsqueeze(-1), logits, self.pad_logits.expand_as(logits))

    def set_state(self, state: dict[str, Any]) -> None:
        """Load weights, refusing (one line, no partial load) any whose names or shapes differ from this
        module's: RLlib's own ``set_state`` loads with ``strict=False`` and would silently keep the fresh
        initialisation of every missing layer (e.g. weights saved before issue 31's input projection)."""
        mismatch = state_mismatch(dict(self.state_dict()), state)
        if mismatch:
            raise ValueError(f"GDP weights do not fit this policy ({mismatch}); re-train them with this "
                             "code (bench/gdp/gdp_pretrain.py)")
        super().set_state(state)

    # ------------------------------------------------------------------ RLModule API
    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits = self.node_logits(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits.reshape(logits.shape[0], -1)}

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> torch.Tensor:
        """Zeros ``[B]``: GDP has no critic (module docstring); only here because PPOLearner requires it."""
        n = batch[Columns.OBS][OBS_NUM_NODES]
        return torch.zeros(n.shape[0], device=self.pad_logits.device)


GDPRLModule = GDPPlacementModule  # the name gdp_ppo.py imports
