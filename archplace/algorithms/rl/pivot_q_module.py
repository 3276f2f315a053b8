"""A Rainbow-style Q-network over candidate pivots, with the action mask applied as Q = −inf.

RLlib's :class:`DefaultDQNTorchRLModule` does the DQN plumbing (target networks, ε-greedy
exploration, double Q, the distributional loss); this module replaces its encoder and heads:

* the encoder embeds the episode ``context`` (step one-hot, compute cut so far);
* the advantage head is one MLP shared by all pivots, fed each pivot's features and the context, so
  Q(s, a) generalises across pivots and the network does not grow with the action count;
* the value head (dueling) reads the context and the mean pivot embedding;
* with ``num_atoms > 1`` both heads give logits over the support [v_min, v_max] (C51).

Only open pivots go through the networks (gathered, padded to the widest row, scattered back), which
makes an update several times cheaper than scoring all P. Masked actions get Q = −inf in every
forward pass (online and target), so ε-greedy exploration (which
samples among finite Q-values), the greedy action and the double-Q bootstrap all skip them.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.dqn.default_dqn_rl_module import (
    ATOMS,
    QF_LOGITS,
    QF_PREDS,
    QF_PROBS,
)
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.utils.schedules.scheduler import Scheduler
from torch import nn

from .gnn_module import _mlp


class PivotEncoder(nn.Module):
    """Context → embedding, and each pivot's features ⊕ context embedding → pivot embedding."""

    def __init__(self, num_features: int, context_dim: int, hidden: int):
        super().__init__()
        self.ctx = nn.Sequential(nn.Linear(context_dim, hidden), nn.ReLU())
        self.piv = nn.Sequential(nn.Linear(num_features + hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU())

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ctx = self.ctx(obs["context"])  # (B, H)
        feats = obs["pivots"]  # (B, P, F)
        x = torch.cat([feats, ctx.unsqueeze(1).expand(-1, feats.shape[1], -1)], dim=-1)
        return ctx, self.piv(x)  # (B, H), (B, P, H)


class PivotQModule(DefaultDQNTorchRLModule):
    """DQN RLModule for Dict observations {pivots, context, action_mask}; see the module docstring."""

    def __init__(self, *args, **kwargs):
        kwargs["catalog_class"] = None  # no catalog: the Dict observation has no default encoder
        super(DefaultDQNTorchRLModule, self).__init__(*args, **kwargs)

    def setup(self):
        cfg = self.model_config
        self.uses_dueling = bool(cfg.get("dueling", True))
        self.uses_double_q = bool(cfg.get("double_q", True))
        self.num_atoms = int(cfg.get("num_atoms", 1))
        if self.num_atoms > 1:
            self.v_min = float(cfg["v_min"])
            self.v_max = float(cfg["v_max"])
        eps = cfg.get("epsilon", [(0, 1.0), (10000, 0.1)])
        self.epsilon_schedule = Scheduler(fixed_value_or_schedule=eps, framework="torch")
        hidden = int(cfg.get("hidden", 64))
        space = self.observation_space
        nf = space["pivots"].shape[-1]
        self.encoder = PivotEncoder(nf, space["context"].shape[0], hidden)
        self.af = _mlp([hidden, hidden], self.num_atoms)
        if self.uses_dueling:
            self.vf = _mlp([2 * hidden, hidden], self.num_atoms)

    def get_initial_state(self) -> dict:
        return {}

    def _qf_forward_helper(self, batch: dict[str, Any], encoder, head) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        mask = obs["action_mask"] > 0.5  # (B, P)
        b, p = mask.shape
        # Only open pivots are scored (a window is a fraction of all pivots): gather them, padded to
        # the most any row has, then scatter the results back over P.
        counts = mask.sum(1)
        width = max(int(counts.max()), 1)
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :width]  # open first
        open_ = torch.arange(width, device=mask.device)[None, :] < counts[:, None]  # (B, W)
        feats = torch.gather(obs["pivots"], 1, order.unsqueeze(-1).expand(-1, -1, obs["pivots"].shape[-1]))
        ctx, piv = encoder({"context": obs["context"], "pivots": feats})
        af = head["af"] if self.uses_dueling else head
        adv = af(piv)  # (B, W, atoms)
        m = open_.unsqueeze(-1).float()
        if self.uses_dueling:
            pooled = (piv * m).sum(1) / m.sum(1).clamp(min=1.0)
            val = head["vf"](torch.cat([ctx, pooled], dim=-1)).unsqueeze(1)  # (B, 1, atoms)
            mean_adv = (adv * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)
            logits_w = val + adv - mean_adv
        else:
            logits_w = adv
        idx = order.unsqueeze(-1).expand(-1, -1, self.num_atoms)

        def spread(x: torch.Tensor, fill: float) -> torch.Tensor:  # (B, W, A) -> (B, P, A)
            full = torch.full((b, p, x.shape[-1]), fill, dtype=x.dtype, device=x.device)
            return full.scatter(1, idx[..., :x.shape[-1]], torch.where(m > 0, x, fill))

        out: dict[str, Any] = {}
        if self.num_atoms > 1:
            z = torch.linspace(self.v_min, self.v_max, self.num_atoms, device=logits_w.device)
            probs_w = torch.softmax(logits_w, dim=-1)
            q = spread((probs_w * z).sum(-1, keepdim=True), 0.0).squeeze(-1)
            out[ATOMS] = z
            out[QF_LOGITS] = spread(logits_w, 0.0)  # closed pivots: uniform (never used)
            out[QF_PROBS] = spread(probs_w, 1.0 / self.num_atoms)
        else:
            q = spread(logits_w, 0.0).squeeze(-1)
        out[QF_PREDS] = torch.where(mask, q, torch.full_like(q, float("-inf")))
        return out
