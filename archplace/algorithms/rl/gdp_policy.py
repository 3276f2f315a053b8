"""GDP placement policy as a plain PyTorch module (spec gdp.md §3; paper §3, Figure 1). No ``ray`` import.

Given one dataflow graph (node features ``x [N, F]``, directed edges ``edge_index [2, E]``) and a device
count ``d``, :class:`GDPPolicy` returns per-node device logits ``[N, max_devices]``, the whole placement in
one forward pass (non-autoregressive: each node's device is sampled independently from its own softmax,
the nodes see each other only through attention). Three parts:

1. **Graph embedding** (§3.2, GraphSAGE with the paper's max-pool aggregator). Per layer l, Eq. 2
   ``h_N(v) = max_{u in N(v)} sigmoid(W h_u + b)`` (element-wise max) and Eq. 3
   ``f(h_v, h_N(v)) = relu(W_f concat(h_v, h_N(v)) + b_f)``.
   [GAP] choices (ours): ``sage_layers`` = 3 layers of width ``hidden`` = 64 (the pool width is ``hidden``
   too); f's activation is ReLU (GraphSAGE's); N(v) is **undirected**: the DAG edges are used in both
   directions, so a node sees its producers and its consumers (no self loop: the node itself enters through
   the concat); a node with no neighbour aggregates the zero vector (PyG's empty-max value, below every
   sigmoid output); no neighbour sampling (full neighbourhoods: the max aggregation is one scatter over E
   edges, cheap at 50k nodes).
   **Normalisation and skips (issue 31).** The paper's GraphSAGE (Algorithm 1: ``h' = f(.) / ||f(.)||_2``,
   no skip; ``sage_norm="l2", skip=False``) collapses at initialisation: with unit-norm inputs every entry
   is ~1/8, so ``W_f h`` is small beside ``b_f + W_f h_N`` (the pooled sigmoids sit near 1/2 on every node)
   and each layer shrinks what differs between nodes ~4x. Measured (``bench/gdp/gdp_policy_probe.py``, txl-2,
   rnnlm-2, inception-v3 x 3 seeds): RMS spread about the centroid 0.2-0.4 -> 0.04-0.09 -> 0.012-0.022,
   cosine to the centroid 0.9999, std of the logits across nodes <= 0.007, greedy placement on one GPU in 9
   of 9. Standardised input features alone do not change that. The default (``sage_norm="layer",
   skip=True``): ``h_0 = LN(W_in x + b_in)`` (the raw features projected), then per layer a residual
   ``h_{l+1} = LN_l(h_l + f(h_l, h_N(v)))`` (post-norm: entries stay O(1), so the affine maps see the node's
   own signal), and the node embedding passed to the placer is ``h_L + h_0`` (the raw projection skips
   straight to the placer input). Spread then stays 0.79-0.84 through all layers (cosine 0.55-0.61),
   the mean pairwise total-variation distance between node softmaxes is 0.12-0.23 (was <= 0.003) and the
   greedy placement uses both GPUs on 9 of 9 (busiest GPU 86-99% of the compute: the untrained argmax is
   not a balanced split, nor should it be). What it buys in PPO (``tests/test_gdp_policy_sees_graph.py``,
   ``tests/test_gdp_ppo.py``): on two independent 4-op chains the greedy policy goes from one GPU to the
   split optimum in 40 iterations (the paper's GraphSAGE stays on one GPU); on four 6-op chains 30
   iterations take the greedy placement from 24.1 ms (one GPU) to 14.1 ms (the paper's GraphSAGE: 24.1).
2. **Placer** (§3.3, Transformer-XL-style). The nodes are taken **in the order given**: the caller must pass
   them in topological order (what the GDP environment does). The sequence is cut into segments of
   ``segment_len`` = 128 nodes; each segment attends over itself plus a memory of the last ``mem_len`` = 128
   layer inputs of the preceding segments, which are **detached** (stop-gradient: segment-level recurrence,
   Transformer-XL §3.2). Attention cost is O(N * segment_len * (segment_len + mem_len)), linear in N, so a
   20,000+ node graph fits on a CPU. **No positional encoding at all** (neither absolute, which the paper
   removes "to prevent the model from overfitting node identifications", nor Transformer-XL's relative one:
   topology already reaches every node through the GraphSAGE embedding); as a consequence the placer is
   permutation-equivariant within a segment. Attention is **non-causal** within segment + memory: the
   placement is emitted in one pass, not node by node, so a node may attend to later nodes of its segment.
   Layers: pre-norm (LayerNorm before each sub-layer, a final LayerNorm before the head; more stable than
   Transformer-XL's post-norm without warm-up), ``placer_layers`` = 2, ``heads`` = 4,
   ``d_model`` = ``hidden``, FFN width ``ffn_hidden`` = 256, ReLU, no dropout (RL). The head is one dense
   layer to ``max_devices`` = 8 logits; logits of devices ``>= d`` are set to ``-inf``, so one policy serves
   d in {2, 4, 8} and a batch of graphs with different d. With ``skip`` the head's bias starts at 0 (no
   device is preferred before training; with drawn biases a device offset adds to any common component
   of the node embeddings and pushes the greedy placement onto one device).
   ``attention=False`` (the §4.4 "no attention" ablation, [GAP] what replaces it): every node attends only to
   itself, i.e. the attention sub-layer becomes ``x + W_o W_v LN(x)`` (Q and K projections dropped): a
   per-node residual MLP of the same depth and width, whose logits depend only on the node's GraphSAGE
   neighbourhood (when superposition, which is graph-global, is off).
3. **Parameter superposition** (§3.3, Eq. 4 ``x^{l+1} = g^l(c(x^0) ⊙ x^l)``). [GAP] choices (ours): ``x^0``
   is a *graph-level* vector, the mean over the graph's nodes of the GraphSAGE output (one gate per graph,
   as in Cheung et al. 2019); ``c`` is "an additional transformer layer": a pre-norm transformer FFN block
   on that single vector, ``z = g + W_2 relu(W_1 LN(g))`` (on a one-token sequence self-attention is a
   fixed linear map, so we keep only the FFN half), followed by one dense layer to the concatenation of all
   gates, ``c = 1 + tanh(W_c z + b_c)`` (in (0, 2), centred on the identity gate 1). Every dense layer of
   the placer gets its **own** gate vector on its input: per placer layer Q, K, V, O, FFN-1 (width
   ``hidden``) and FFN-2 (width ``ffn_hidden``) (V, O, FFN-1, FFN-2 with ``attention=False``), plus the
   output head. LayerNorms are not gated (they have no dense weight). ``superposition=False`` removes ``c``
   (and its parameters) and leaves every input ungated.

Sampling helpers :func:`sample`, :func:`log_prob` (joint: sum over nodes of log-softmax, the log pi(D|G) of
PPO, spec §4) and :func:`entropy` (sum over nodes) work on ``[..., N, D]`` logits with ``-inf`` masks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import MessagePassing

MASKED_LOGIT = float("-inf")  # logit of a device >= d: probability exactly 0
_ATT_MASK = -1.0e30  # score of a padded key: finite, so a row with no real key gives no NaN
SAGE_NORMS = ("layer", "l2")


@dataclass
class GDPPolicyConfig:
    """Sizes and ablation switches of :class:`GDPPolicy` (defaults are ours: the paper gives none)."""

    hidden: int = 64  # GraphSAGE width = placer d_model
    sage_layers: int = 3  # GraphSAGE iterations (Eq. 2-3)
    placer_layers: int = 2  # transformer (or per-node MLP) layers
    heads: int = 4
    ffn_hidden: int = 256  # transformer FFN width (also the conditioning block's)
    segment_len: int = 128  # S: nodes per segment
    mem_len: int = 128  # M: cached (detached) layer inputs from previous segments; 0 = no recurrence
    max_devices: int = 8  # logits emitted per node; devices >= d are masked
    attention: bool = True  # False: the "no attention" ablation (per-node MLP of the same depth)
    superposition: bool = True  # False: no feature conditioning (Eq. 4 off)
    sage_norm: str = "layer"  # between GraphSAGE layers: "layer" (LayerNorm) or "l2" (GraphSAGE's, collapses)
    skip: bool = True  # input projection, residual GraphSAGE layers, raw projection added to the placer input

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.sage_norm not in SAGE_NORMS:
            raise ValueError(f"sage_norm is {self.sage_norm!r}, must be one of {list(SAGE_NORMS)}")
        if min(self.hidden, self.sage_layers, self.placer_layers, self.heads, self.ffn_hidden,
               self.segment_len, self.max_devices) < 1 or self.mem_len < 0:
            raise ValueError(f"invalid GDPPolicyConfig {asdict(self)}")

    def gate_dims(self) -> list[int]:
        """Input widths of the placer's dense layers, in order: the sizes of the superposition gates."""
        h, f = self.hidden, self.ffn_hidden
        per_layer = [h, h, h, h, h, f] if self.attention else [h, h, h, f]  # (Q, K,) V, O, FFN-1, FFN-2
        return per_layer * self.placer_layers + [h]  # + the output head


# ------------------------------------------------------------------------------------------ graph embedding
class MaxPoolSAGEConv(MessagePassing):
    """One GraphSAGE iteration with the paper's max-pool aggregator (Eq. 2) and concat update (Eq. 3).

    ``pool`` is (W, b) of Eq. 2, applied (with the sigmoid) once per node before message passing, so a
    message is just the source's pooled vector and the aggregation is PyG's scatter-max. ``update`` is
    f of Eq. 3 (dense + ReLU); with ``l2`` the output is L2-normalised (GraphSAGE Algorithm 1, line 7),
    else returned as is (the policy adds the residual and a LayerNorm, module docstring).
    """

    def __init__(self, in_dim: int, out_dim: int, l2: bool = True) -> None:
        super().__init__(aggr="max")
        self.l2 = l2
        self.pool = nn.Linear(in_dim, out_dim)
        self.update_lin = nn.Linear(in_dim + out_dim, out_dim)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        pooled = torch.sigmoid(self.pool(x))  # sigma(W h_u + b) for every u
        h_nbr = self.propagate(edge_index, x=pooled)  # element-wise max over N(v); 0 if N(v) is empty
        h = torch.relu(self.update_lin(torch.cat([x, h_nbr], dim=-1)))
        return F.normalize(h, p=2.0, dim=-1) if self.l2 else h

    def message(self, x_j: torch.Tensor) -> torch.Tensor:
        return x_j


def undirected(edge_index: torch.Tensor) -> torch.Tensor:
    """Both directions of every edge: N(v) = producers and consumers of v."""
    return torch.cat([edge_index, edge_index.flip(0)], dim=1)


# ------------------------------------------------------------------------------------------ placer
class PlacerLayer(nn.Module):
    """Pre-norm transformer layer whose dense layers take gated inputs (Eq. 4) and whose attention also
    reads a detached memory. ``attention=False``: self-only attention (``x + W_o W_v LN(x)``)."""

    def __init__(self, cfg: GDPPolicyConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.attention = cfg.attention
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(h)
        if self.attention:
            self.q = nn.Linear(h, h)
            self.k = nn.Linear(h, h)
        self.v = nn.Linear(h, h)
        self.o = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.ff1 = nn.Linear(h, cfg.ffn_hidden)
        self.ff2 = nn.Linear(cfg.ffn_hidden, h)

    @property
    def num_gates(self) -> int:
        return 6 if self.attention else 4

    def forward(self, x: torch.Tensor, mem: torch.Tensor | None, key_mask: torch.Tensor,
                gates: list[torch.Tensor] | None) -> torch.Tensor:
        """``x [B, S, h]`` the segment, ``mem [B, M, h]`` detached memory or None, ``key_mask [B, M+S]``
        True at real keys, ``gates`` the layer's gate vectors ``[B, 1, width]`` (None: no superposition)."""

        def g(i: int, t: torch.Tensor) -> torch.Tensor:  # c_i(x^0) ⊙ input of dense layer i (Eq. 4)
            return t if gates is None else t * gates[i]

        gi = iter(range(self.num_gates))
        y = self.ln1(x)
        if self.attention:
            kv_in = y if mem is None else self.ln1(torch.cat([mem, x], dim=1))
            bsz, s, h = y.shape
            dh = h // self.heads
            q = self.q(g(next(gi), y)).view(bsz, s, self.heads, dh).transpose(1, 2)  # [B, H, S, dh]
            k = self.k(g(next(gi), kv_in)).view(bsz, -1, self.heads, dh).transpose(1, 2)  # [B, H, M+S, dh]
            v = self.v(g(next(gi), kv_in)).view(bsz, -1, self.heads, dh).transpose(1, 2)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(dh)  # non-causal: no future mask
            scores = scores.masked_fill(~key_mask[:, None, None, :], _ATT_MASK)
            att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(bsz, s, h)
        else:
            att = self.v(g(next(gi), y))  # each node attends only to itself
        x = x + self.o(g(next(gi), att))
        y = torch.relu(self.ff1(g(next(gi), self.ln2(x))))
        return x + self.ff2(g(next(gi), y))


class Conditioning(nn.Module):
    """c(x^0) of Eq. 4: graph vector -> one pre-norm transformer FFN block -> all gates, ``1 + tanh(.)``."""

    def __init__(self, cfg: GDPPolicyConfig) -> None:
        super().__init__()
        h = cfg.hidden
        self.dims = cfg.gate_dims()
        self.ln = nn.LayerNorm(h)
        self.ff1 = nn.Linear(h, cfg.ffn_hidden)
        self.ff2 = nn.Linear(cfg.ffn_hidden, h)
        self.gate = nn.Linear(h, sum(self.dims))

    def forward(self, graph_vec: torch.Tensor) -> list[torch.Tensor]:
        """``graph_vec [B, h]`` -> one gate ``[B, 1, width]`` per dense layer of the placer."""
        z = graph_vec + self.ff2(torch.relu(self.ff1(self.ln(graph_vec))))
        c = 1.0 + torch.tanh(self.gate(z))
        return [t.unsqueeze(1) for t in torch.split(c, self.dims, dim=-1)]


# ------------------------------------------------------------------------------------------ policy
class GDPPolicy(nn.Module):
    """GraphSAGE (max-pool) embedding + segment-recurrent attention placer + superposition (module docstring).

    ``forward(x, edge_index, num_devices)`` handles one graph; :meth:`embed` + :meth:`place` are the two
    halves, :meth:`place` batched over padded graphs (the RLlib module runs :meth:`embed` on the disjoint
    union of a batch and :meth:`place` on the padded node embeddings).
    """

    def __init__(self, in_features: int, cfg: GDPPolicyConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or GDPPolicyConfig()
        self.in_features = int(in_features)
        first = cfg.hidden if cfg.skip else self.in_features
        dims = [first] + [cfg.hidden] * cfg.sage_layers
        l2 = cfg.sage_norm == "l2"
        self.sage = nn.ModuleList(MaxPoolSAGEConv(a, b, l2) for a, b in zip(dims[:-1], dims[1:]))
        if cfg.skip:  # h_0 = LN(W x + b), the "raw projected features"
            self.in_proj = nn.Linear(self.in_features, cfg.hidden)
            self.in_ln = nn.LayerNorm(cfg.hidden)
        self.sage_ln = nn.ModuleList(nn.LayerNorm(cfg.hidden) for _ in range(cfg.sage_layers)) \
            if cfg.sage_norm == "layer" else None
        self.layers = nn.ModuleList(PlacerLayer(cfg) for _ in range(cfg.placer_layers))
        self.ln_out = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.max_devices)
        if cfg.skip:  # no device preferred before training: a device's bias is learned, not drawn
            nn.init.zeros_(self.head.bias)
        self.conditioning = Conditioning(cfg) if cfg.superposition else None

    # -------------------------------------------------------------------------------- halves
    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """GraphSAGE node embeddings ``[N, hidden]`` of a graph or a disjoint union of graphs (per node: the
        union's graphs do not mix).
        ``edge_index`` holds directed edges; both directions are used (undirected N(v))."""
        return self.embed_layers(x, edge_index)[-1]

    def embed_layers(self, x: torch.Tensor, edge_index: torch.Tensor) -> list[torch.Tensor]:
        """The output of every GraphSAGE layer (the last one is :meth:`embed`)."""
        cfg = self.cfg
        ei = undirected(edge_index.long())
        h = x.float()
        if cfg.skip:
            h = h0 = self.in_ln(self.in_proj(h))
        out = []
        for i, conv in enumerate(self.sage):
            z = conv(h, ei)
            if cfg.skip:
                z = h + z  # residual: the layer adds to what the node already knew
            h = self.sage_ln[i](z) if self.sage_ln is not None else z
            out.append(h)
        if cfg.skip:
            out[-1] = out[-1] + h0
        return out

    def gates(self, h: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor] | None:
        """Superposition gates from the masked mean of ``h [B, N, hidden]`` (None when switched off)."""
        if self.conditioning is None:
            return None
        m = mask.unsqueeze(-1).to(h.dtype)
        graph_vec = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        return self.conditioning(graph_vec)

    def place(self, h: torch.Tensor, num_devices: int | torch.Tensor, mask: torch.Tensor | None = None,
              gates: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Device logits ``[B, N, max_devices]`` from node embeddings ``h [B, N, hidden]``, nodes in
        topological order.

        ``mask [B, N]`` is True at real nodes; padding must follow a graph's real nodes (then segment
        boundaries, and so the logits, equal those of the graph alone). ``num_devices`` is an int or ``[B]``.
        ``gates`` overrides the superposition gates (default: computed from ``h`` and ``mask``). Padded rows
        are returned as computed (finite); callers overwrite them.
        """
        cfg = self.cfg
        bsz, n, _ = h.shape
        if mask is None:
            mask = torch.ones(bsz, n, dtype=torch.bool, device=h.device)
        if gates is None:
            gates = self.gates(h, mask)
        per = self.layers[0].num_gates if self.layers else 0
        layer_gates = [None if gates is None else gates[i * per:(i + 1) * per]
                       for i in range(len(self.layers))]
        mems: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.layers)
        outs = []
        for s in range(0, n, cfg.segment_len):
            x = h[:, s:s + cfg.segment_len]
            m = mask[:, s:s + cfg.segment_len]
            for li, layer in enumerate(self.layers):
                mem = mems[li]
                key_mask = m if mem is None else torch.cat([mem[1], m], dim=1)
                if cfg.mem_len > 0:  # Transformer-XL: cache this layer's input, gradient stopped
                    cat_x = x if mem is None else torch.cat([mem[0], x], dim=1)
                    mems[li] = (cat_x[:, -cfg.mem_len:].detach(), key_mask[:, -cfg.mem_len:])
                x = layer(x, None if mem is None else mem[0], key_mask, layer_gates[li])
            outs.append(x)
        y = self.ln_out(torch.cat(outs, dim=1))
        if gates is not None:
            y = y * gates[-1]
        return mask_devices(self.head(y), num_devices)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                num_devices: int | torch.Tensor) -> torch.Tensor:
        """Per-node device logits ``[N, max_devices]`` of one graph whose nodes are in topological order;
        logits of devices ``>= num_devices`` are ``-inf``."""
        h = self.embed(x, edge_index)
        return self.place(h.unsqueeze(0), num_devices)[0]

    # convenience aliases of the module-level helpers
    @staticmethod
    def sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return sample(logits, generator)

    @staticmethod
    def log_prob(logits: torch.Tensor, placement: torch.Tensor) -> torch.Tensor:
        return log_prob(logits, placement)

    @staticmethod
    def entropy(logits: torch.Tensor) -> torch.Tensor:
        return entropy(logits)


# ------------------------------------------------------------------------------------------ distribution
def mask_devices(logits: torch.Tensor, num_devices: int | torch.Tensor) -> torch.Tensor:
    """Set logits ``[B, N, D]`` of devices ``>= num_devices`` (int or ``[B]``) to ``-inf``."""
    d = torch.as_tensor(num_devices, device=logits.device).reshape(-1, 1, 1)
    dev = torch.arange(logits.shape[-1], device=logits.device).view(1, 1, -1)
    if (d < 1).any() or (d > logits.shape[-1]).any():
        raise ValueError(f"num_devices must lie in [1, {logits.shape[-1]}], got {num_devices}")
    return logits.masked_fill(dev >= d, MASKED_LOGIT)


def sample(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One device per node from logits ``[..., N, D]``: a placement ``[..., N]`` (int64)."""
    probs = logits.detach().softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def log_prob(logits: torch.Tensor, placement: torch.Tensor) -> torch.Tensor:
    """Joint log pi(D|G) = sum over nodes of the per-node log-softmax at the chosen device: ``[...]``."""
    lp = logits.log_softmax(-1).gather(-1, placement.long().unsqueeze(-1)).squeeze(-1)
    return lp.sum(-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Sum over nodes of the per-node entropy ``[...]``; masked (``-inf``) devices contribute 0 (the log-prob
    is clamped before the product, so neither the value nor the gradient is NaN)."""
    lp = logits.log_softmax(-1)
    return -(lp.exp() * lp.clamp(min=torch.finfo(lp.dtype).min)).sum(-1).sum(-1)
