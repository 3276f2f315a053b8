"""GDP's ``gnmt-L`` model family.

``gnmt-L``: GNMT (Wu et al. 2016) with L encoder and L decoder layers: the bottom encoder layer is
bidirectional (its outputs concatenated), residual connections from the third layer on, additive
(Bahdanau) attention whose query is the bottom decoder layer's output and whose context feeds every
decoder layer above it and the bottom layer at the next step (TensorFlow NMT's GNMT attention cell).
The decoder starts from the encoder's final states (the bidirectional layer's forward direction).
Simplification: GNMT's *normalised* attention (``g·v/‖v‖``) is plain ``v``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .lstm import LSTMCell
from .presets import _DROPOUT, GnmtSizes


class BiLSTMLayer(nn.Module):
    """GNMT's bottom encoder layer: a forward and a backward LSTM over the source."""

    def __init__(self, input_units: int, hidden_units: int) -> None:
        super().__init__()
        self.fw = LSTMCell(input_units, hidden_units)
        self.bw = LSTMCell(input_units, hidden_units)


class AdditiveAttention(nn.Module):
    """Bahdanau attention: ``score_j = v·tanh(W_q·q + b + W_k·k_j)``; the keys ``W_k·k`` are
    projected once per sentence (``memory_layer``), the query once per decoder step."""

    def __init__(self, units: int) -> None:
        super().__init__()
        self.memory_layer = nn.Linear(units, units, bias=False)
        self.query_layer = nn.Linear(units, units)
        self.v = nn.Linear(units, 1, bias=False)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor) -> Tensor:
        scores = self.v(torch.tanh(keys + self.query_layer(query).unsqueeze(1))).squeeze(-1)  # [B, S]
        probs = F.softmax(scores, dim=-1)
        return torch.bmm(probs.unsqueeze(1), memory).squeeze(1)  # [B, H]


class GNMT(nn.Module):
    """Inputs: source and target ids ``[B, S]``, ``[B, T]``; output: logits ``[T·B, V]``."""

    def __init__(self, s: GnmtSizes) -> None:
        super().__init__()
        h = s.hidden_units
        self.sizes = s
        self.src_embedding = nn.Embedding(s.vocab_tokens, h)
        self.tgt_embedding = nn.Embedding(s.vocab_tokens, h)
        self.encoder_layers = nn.ModuleList(
            [BiLSTMLayer(h, h)] + [LSTMCell(2 * h if i == 1 else h, h) for i in range(1, s.lstm_layers)])
        self.attention = AdditiveAttention(h)
        # every decoder layer reads [its input ; attention context]
        self.decoder_layers = nn.ModuleList(LSTMCell(2 * h, h) for _ in range(s.lstm_layers))
        self.softmax = nn.Linear(h, s.vocab_tokens)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        s = self.sizes
        b, h = src.shape[0], s.hidden_units
        zeros = torch.zeros(b, h, device=src.device)  # a constant: folded, not an op
        x = self.src_embedding(src)
        steps = [x[:, t] for t in range(s.source_steps)]
        final: list[tuple[Tensor, Tensor]] = []
        bi = self.encoder_layers[0]
        fw, bw = [], []
        hf, cf, hb, cb = zeros, zeros, zeros, zeros
        for t in range(s.source_steps):
            hf, cf = bi.fw(steps[t], hf, cf)
            fw.append(hf)
        for t in reversed(range(s.source_steps)):
            hb, cb = bi.bw(steps[t], hb, cb)
            bw.append(hb)
        final.append((hf, cf))
        steps = [torch.cat([f, r], -1) for f, r in zip(fw, bw[::-1])]
        for i in range(1, s.lstm_layers):
            cell, hi, ci, outs = self.encoder_layers[i], zeros, zeros, []
            for t in range(s.source_steps):
                hi, ci = cell(steps[t], hi, ci)
                outs.append(hi + steps[t] if i >= 2 else hi)  # residual from the third layer
            final.append((hi, ci))
            steps = outs
        memory = torch.cat([o.unsqueeze(1) for o in steps], 1)  # [B, S, H]
        keys = self.attention.memory_layer(memory)
        y = self.tgt_embedding(tgt)
        hd = [hc[0] for hc in final]
        cd = [hc[1] for hc in final]
        ctx = zeros
        outs = []
        for t in range(s.target_steps):
            hd[0], cd[0] = self.decoder_layers[0]([y[:, t], ctx], hd[0], cd[0])
            ctx = self.attention(hd[0], keys, memory)
            inp = hd[0]
            for i in range(1, s.lstm_layers):
                hd[i], cd[i] = self.decoder_layers[i]([inp, ctx], hd[i], cd[i])
                inp = hd[i] + inp if i >= 2 else hd[i]
            outs.append(F.dropout(inp, _DROPOUT, self.training))
        return self.softmax(torch.cat(outs, 0))
