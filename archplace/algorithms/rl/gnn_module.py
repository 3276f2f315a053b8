"""GraphSAGE policy for MCM partitioning as an RLlib new-API-stack ``TorchRLModule`` (spec mcm.md §2.4).

Observation (a ``gymnasium.spaces.Dict`` with fixed padded sizes, written by
:class:`archplace.algorithms.rl.mcm_env.MCMPartitionEnv`):

* ``x`` ``[N_max, F]`` float node features (rows past ``num_nodes`` are zero);
* ``edge_index`` ``[2, E_max]`` int, columns past ``num_edges`` are padding (0 -> 0);
* ``num_nodes``, ``num_edges`` ``[1]`` ints; ``node_mask`` ``[N_max]`` (1 for real nodes);
* ``prev`` ``[N_max]`` the previous repaired assignment y'^(t-1) (chip ids), embedded as a one-hot over
  the C chips and concatenated to ``x`` (the "current state embedding" of the paper's Eq. 7, our choice);
* ``round`` ``[1]`` (optional) t / T, the refinement step, broadcast to every node as one more input
  channel: without it the value head cannot tell how many rewards are left in the episode.
* ``chip_load`` ``[C]`` (optional) the per-chip latency of ``prev`` over its maximum, broadcast to every
  node (C channels) plus the load of the node's own chip (one channel).

Network (paper: "8 GraphSAGE layers, and the size of each layer is 128"; policy "a feed-forward network
with 2 layers" of the same width): an input projection is *not* used, the first ``SAGEConv`` maps
``F + C`` to ``hidden``; ``num_layers`` ``SAGEConv`` (mean aggregation) with ReLU and, from the second
layer on, a residual connection (ours: keeps an 8-deep stack trainable); message passing runs over the
DAG edges in both directions (``bidirectional``, ours: a node sees its producers and its consumers).
The head is ``len(head_hiddens)`` ReLU layers then a linear map to C logits per node. The value head
(PPO needs one; the paper describes none) is an MLP on the mean-pooled embedding of the real nodes.

Batching is tensor arithmetic: sample b's edges are offset by ``b * N_max`` and padded edge columns are
dropped with a mask, so one ``SAGEConv`` call processes the whole batch; the padded nodes are dropped
too (the rows are compacted with ``node_mask`` and the edge ids remapped by a cumulative sum), so
padding costs no compute and the logits of real nodes cannot depend on ``N_max``.

Actions are ``MultiDiscrete([C] * N_max)`` with the distribution ``NodeCategorical``, a vectorised
``TorchMultiCategorical`` (``get_partial_dist_cls(input_lens=[C] * N_max)``). Padded nodes get the
constant logits ``[0, -1e4, ...]`` (all mass on chip 0, no gradient), so their sampled action is
always 0 and their log-probability, entropy and KL are exactly 0.

``model_config`` keys: ``hidden`` (128), ``num_layers`` (8), ``head_hiddens`` ([128, 128]),
``vf_hiddens`` ([128]), ``aggr`` ("mean"), ``bidirectional`` (True), ``residual`` (True), ``prev_bias``
(None): when set, a learnable logit bonus ``log(C - 1) + prev_bias`` on each node's previous chip, a
keep-the-previous-assignment prior that turns refinement into a learned local search (ours; off by default:
in our runs it helped on a 24-node graph over 8 chips, 1.56x -> 1.67x greedy, the optimum, and hurt on
36 chips, 2.05x -> 1.62x on lstm0 and 1.47x -> 1.12x on t5-l2, where FIX's randomness explores better).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.core.distribution.torch.torch_distribution import TorchDeterministic, TorchMultiCategorical
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn
from torch_geometric.nn import SAGEConv

PAD_LOGIT = -1.0e4  # the logit of chips 1..C-1 at a padded node: exp(-1e4) is exactly 0 in float32

DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "hidden": 128,
    "num_layers": 8,
    "head_hiddens": [128, 128],
    "vf_hiddens": [128],
    "aggr": "mean",
    "bidirectional": True,
    "residual": True,
    "prev_bias": None,
}


class NodeCategorical(TorchMultiCategorical):
    """``TorchMultiCategorical`` for ``MultiDiscrete([C] * N)``, vectorised: one ``torch`` Categorical over
    ``[..., N, C]`` instead of N Python-level Categoricals. Same ``from_logits(logits, input_lens)``
    signature and the same values of ``sample`` / ``logp`` / ``entropy`` / ``kl``; at N = 300 it turns
    ~300 small kernel launches per call into one (sampling a batch of 80 was ~1.5 s, now ~ms)."""

    def __init__(self, logits: torch.Tensor, num_groups: int) -> None:
        Distribution.__init__(self)
        self._logits = logits.reshape(*logits.shape[:-1], num_groups, -1)
        self._dist = torch.distributions.Categorical(logits=self._logits)

    @property
    def _cats(self):  # the parent's per-group view, for code that reads it
        from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical

        return [TorchCategorical(logits=lg) for lg in self._logits.unbind(-2)]

    def sample(self) -> torch.Tensor:
        return self._dist.sample()

    def rsample(self, sample_shape=()):
        raise NotImplementedError("a categorical action has no reparameterised sample")

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        return self._dist.log_prob(value.long()).sum(-1)

    def entropy(self) -> torch.Tensor:
        return self._dist.entropy().sum(-1)

    def kl(self, other: NodeCategorical) -> torch.Tensor:
        return torch.distributions.kl_divergence(self._dist, other._dist).sum(-1)

    @classmethod
    def from_logits(cls, logits: torch.Tensor, input_lens: list[int], temperatures: list[float] | None = None,
                    **kwargs) -> NodeCategorical:
        if len(set(input_lens)) != 1 or sum(input_lens) != logits.shape[-1]:
            raise ValueError(f"NodeCategorical needs equal input_lens summing to {logits.shape[-1]}")
        if temperatures:
            t = torch.as_tensor(temperatures, dtype=logits.dtype, device=logits.device)
            logits = (logits.reshape(*logits.shape[:-1], len(input_lens), -1) / t.unsqueeze(-1)).flatten(-2)
        return cls(logits, len(input_lens))

    def to_deterministic(self) -> TorchDeterministic:
        return TorchDeterministic(loc=self._logits.argmax(-1))


def _mlp(sizes: list[int], out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], out))
    return nn.Sequential(*layers)


class GraphPartitionModule(TorchRLModule, ValueFunctionAPI):
    """Per-node chip logits from a batched GraphSAGE encoder; value from the mean-pooled embedding."""

    def setup(self) -> None:
        cfg = {**DEFAULT_MODEL_CONFIG, **(self.model_config or {})}
        self.cfg = cfg
        nvec = self.action_space.nvec
        self.n_max = int(len(nvec))
        self.num_chips = int(nvec[0])
        if not (nvec == self.num_chips).all():
            raise ValueError(f"action space must be MultiDiscrete([C] * N_max), got nvec {nvec}")
        x_space = self.observation_space["x"]
        if x_space.shape[0] != self.n_max:
            raise ValueError(f"observation x has {x_space.shape[0]} rows, the action space {self.n_max}")
        self.num_features = int(x_space.shape[1])
        self.has_round = "round" in self.observation_space.spaces
        self.has_load = "chip_load" in self.observation_space.spaces
        hid = int(cfg["hidden"])
        n_in = self.num_features + self.num_chips + int(self.has_round) + (self.num_chips + 1) * self.has_load
        dims = [n_in] + [hid] * int(cfg["num_layers"])
        self.convs = nn.ModuleList(SAGEConv(a, b, aggr=cfg["aggr"]) for a, b in zip(dims[:-1], dims[1:]))
        self.pi_head = _mlp([hid, *cfg["head_hiddens"]], self.num_chips)
        self.vf_head = _mlp([hid, *cfg["vf_hiddens"]], 1)
        # keep-the-previous-chip prior: logit + (log(C-1) + prev_bias) on prev's chip, learnable
        pb = cfg.get("prev_bias")
        self.prev_bias = None if pb is None else nn.Parameter(
            torch.tensor(float(pb) + math.log(max(self.num_chips - 1, 1))))
        pad = torch.full((self.num_chips,), PAD_LOGIT)
        pad[0] = 0.0
        self.register_buffer("pad_logits", pad, persistent=False)
        self.action_dist_cls = NodeCategorical.get_partial_dist_cls(
            input_lens=[self.num_chips] * self.n_max)

    # ------------------------------------------------------------------ encoder
    def encode(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Node embeddings ``[B, N_max, hidden]`` (zero at padded nodes) and the node mask ``[B, N_max]``."""
        x = obs["x"].float()
        bsz, n_max, _ = x.shape
        mask = obs["node_mask"].reshape(bsz, n_max) > 0.5
        prev = obs["prev"].reshape(bsz, n_max).long().clamp(0, self.num_chips - 1)
        parts = [x, nn.functional.one_hot(prev, self.num_chips).float()]
        if self.has_round:
            parts.append(obs["round"].reshape(bsz, 1, 1).float().expand(bsz, n_max, 1))
        if self.has_load:  # every chip's load under prev (C channels) and the node's own chip's load
            load = obs["chip_load"].reshape(bsz, 1, self.num_chips).float()
            parts += [load.expand(bsz, n_max, self.num_chips), load.squeeze(1).gather(1, prev).unsqueeze(-1)]
        h = torch.cat(parts, dim=-1)
        flat_mask = mask.reshape(-1)
        h = h.reshape(bsz * n_max, -1)[flat_mask]  # real nodes only: padding costs no compute
        new_id = torch.cumsum(flat_mask.long(), 0) - 1  # flat padded index -> row of h
        ei = obs["edge_index"].long().reshape(bsz, 2, -1)
        e_max = ei.shape[-1]
        n_e = obs["num_edges"].reshape(bsz, -1)[:, 0].long()
        keep = torch.arange(e_max, device=x.device).unsqueeze(0) < n_e.unsqueeze(1)  # [B, E_max]
        off = (torch.arange(bsz, device=x.device) * n_max).view(bsz, 1, 1)
        ei = new_id[(ei + off).permute(1, 0, 2)[:, keep]]  # [2, total real edges]
        if self.cfg["bidirectional"]:
            ei = torch.cat([ei, ei.flip(0)], dim=1)
        for i, conv in enumerate(self.convs):
            out = torch.relu(conv(h, ei))
            h = out + h if (self.cfg["residual"] and i > 0) else out
        full = h.new_zeros(bsz * n_max, h.shape[-1])
        full[flat_mask] = h
        h = full
        return h.reshape(bsz, n_max, -1), mask

    def _heads(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h, mask = self.encode(obs)
        logits = self.pi_head(h)  # [B, N_max, C]
        if self.prev_bias is not None:
            prev = obs["prev"].reshape(logits.shape[:2]).long().clamp(0, self.num_chips - 1)
            logits = logits + self.prev_bias * nn.functional.one_hot(prev, self.num_chips).to(logits.dtype)
        logits = torch.where(mask.unsqueeze(-1), logits, self.pad_logits.expand_as(logits))
        m = mask.unsqueeze(-1).float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        return logits, pooled

    def node_logits(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-node chip logits ``[B, N_max, C]`` (for analysis and tests)."""
        return self._heads(obs)[0]

    # ------------------------------------------------------------------ RLModule API
    def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits, _ = self._heads(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits.reshape(logits.shape[0], -1)}

    def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
        logits, pooled = self._heads(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: logits.reshape(logits.shape[0], -1), Columns.EMBEDDINGS: pooled}

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> torch.Tensor:
        if embeddings is None:
            _, embeddings = self._heads(batch[Columns.OBS])
        return self.vf_head(embeddings).squeeze(-1)
