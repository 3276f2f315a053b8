"""GDP's ``txl-L`` model family.

``txl-L``: Transformer-XL (Dai et al. 2019) decoder blocks: relative multi-head attention over the
concatenation of the previous segment's memory (one model input per layer, as TXL's ``mems``) and
the current segment, causal mask, post-layer-norm residuals, ReLU feed-forward. The relative
positions are TXL's own, not simplified: sinusoidal embeddings of the distances projected per layer
(``r_net``), the content and position biases ``u`` and ``v`` (``r_w_bias``, ``r_r_bias``, untied:
one pair per layer) and the ``rel_shift`` (pad, reshape, slice). Simplifications: a plain
embedding and full softmax instead of the adaptive ones, no dropout on the positional embedding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .presets import _DROPOUT, TxlSizes


class RelMultiHeadAttn(nn.Module):
    """TXL's ``RelPartialLearnableMultiHeadAttn`` (post-norm), batch-first. With queries ``q`` of
    the segment and keys ``k``, values of memory + segment and ``R`` the sinusoidal embedding of the
    distances: ``score = (q + u)·kᵀ + rel_shift((q + v)·(W_r R)ᵀ)``."""

    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        n, dh, d = s.heads, s.head_units, s.model_units
        self.n, self.dh, self.scale = n, dh, 1.0 / math.sqrt(dh)
        self.qkv_net = nn.Linear(d, 3 * n * dh, bias=False)
        self.r_net = nn.Linear(d, n * dh, bias=False)
        self.o_net = nn.Linear(n * dh, d, bias=False)
        self.layer_norm = nn.LayerNorm(d)
        # shaped [n, 1, dh] so that the add reads the parameter itself (no view op owns the weight)
        self.r_w_bias = nn.Parameter(torch.zeros(n, 1, dh))
        self.r_r_bias = nn.Parameter(torch.zeros(n, 1, dh))

    @staticmethod
    def rel_shift(x: Tensor) -> Tensor:
        b, n, q, k = x.shape
        pad = torch.zeros(b, n, q, 1, device=x.device, dtype=x.dtype)  # constant: folded
        return torch.cat([pad, x], -1).view(b, n, k + 1, q)[:, :, 1:].reshape(b, n, q, k)

    def forward(self, w: Tensor, r: Tensor, mem: Tensor, mask: Tensor) -> Tensor:
        b, qlen, _ = w.shape
        klen = qlen + mem.shape[1]
        q, k, v = self.qkv_net(torch.cat([mem, w], 1)).chunk(3, dim=-1)
        q = q[:, -qlen:].reshape(b, qlen, self.n, self.dh).transpose(1, 2)  # [B, n, q, dh]
        k = k.reshape(b, klen, self.n, self.dh).transpose(1, 2)
        v = v.reshape(b, klen, self.n, self.dh).transpose(1, 2)
        rk = self.r_net(r).reshape(klen, self.n, self.dh).transpose(0, 1)  # [n, k, dh]
        ac = torch.matmul(q + self.r_w_bias, k.transpose(-1, -2))
        bd = self.rel_shift(torch.matmul(q + self.r_r_bias, rk.transpose(-1, -2)))
        score = ((ac + bd) * self.scale).masked_fill(mask, float("-inf"))
        prob = F.dropout(F.softmax(score, dim=-1), _DROPOUT, self.training)
        vec = torch.matmul(prob, v).transpose(1, 2).reshape(b, qlen, self.n * self.dh)
        return self.layer_norm(w + F.dropout(self.o_net(vec), _DROPOUT, self.training))


class PositionwiseFF(nn.Module):
    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        self.fc1 = nn.Linear(s.model_units, s.ffn_units)
        self.fc2 = nn.Linear(s.ffn_units, s.model_units)
        self.layer_norm = nn.LayerNorm(s.model_units)

    def forward(self, x: Tensor) -> Tensor:
        core = F.dropout(F.relu(self.fc1(x)), _DROPOUT, self.training)
        return self.layer_norm(x + F.dropout(self.fc2(core), _DROPOUT, self.training))


class TxlBlock(nn.Module):
    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        self.attn = RelMultiHeadAttn(s)
        self.ff = PositionwiseFF(s)

    def forward(self, x: Tensor, r: Tensor, mem: Tensor, mask: Tensor) -> Tensor:
        return self.ff(self.attn(x, r, mem, mask))


class TransformerXL(nn.Module):
    """Inputs: token ids ``[B, q]`` and one memory ``[B, m, d]`` per layer; output: logits ``[B, q, V]``."""

    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        self.sizes = s
        self.embedding = nn.Embedding(s.vocab_tokens, s.model_units)
        self.layers = nn.ModuleList(TxlBlock(s) for _ in range(s.transformer_layers))
        self.softmax = nn.Linear(s.model_units, s.vocab_tokens)
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, s.model_units, 2.0) / s.model_units))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, ids: Tensor, mems: list[Tensor]) -> Tensor:
        s = self.sizes
        qlen, mlen = ids.shape[1], mems[0].shape[1]
        klen = qlen + mlen
        x = F.dropout(self.embedding(ids) * math.sqrt(s.model_units), _DROPOUT, self.training)
        ones = torch.ones(qlen, klen, dtype=torch.bool, device=ids.device)
        mask = torch.triu(ones, diagonal=1 + mlen)  # constant: folded
        pos = torch.arange(klen - 1, -1, -1.0, device=ids.device)
        sinusoid = torch.outer(pos, self.inv_freq)
        r = torch.cat([sinusoid.sin(), sinusoid.cos()], -1)  # [k, d], constant: folded
        for layer, mem in zip(self.layers, mems):
            x = layer(x, r, mem, mask)
        return self.softmax(x)
