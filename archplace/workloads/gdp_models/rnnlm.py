"""GDP's ``rnnlm-L`` model family.

``rnnlm-L``: word embedding → L stacked LSTM layers unrolled over ``time_steps`` → softmax
projection; dropout on the non-recurrent connections (Zaremba et al. 2014). The initial (h, c) of
every layer is a model input: truncated back-propagation carries it over from the previous segment.
The paper's Table 1 has 2 and 4 layers; its appendix Table 3 also trains an 8-layer RNNLM, given
8 devices here by the pattern of the others (**[INFERENCE]**).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .lstm import LSTMCell
from .presets import _DROPOUT, RnnlmSizes


class RNNLM(nn.Module):
    """Inputs: token ids ``[B, T]``, initial states ``h0``, ``c0`` ``[L, B, H]``; output: logits
    ``[T·B, V]`` (time-major rows)."""

    def __init__(self, s: RnnlmSizes) -> None:
        super().__init__()
        self.time_steps = s.time_steps
        self.embedding = nn.Embedding(s.vocab_tokens, s.hidden_units)
        self.lstm_layers = nn.ModuleList(LSTMCell(s.hidden_units, s.hidden_units)
                                         for _ in range(s.lstm_layers))
        self.softmax = nn.Linear(s.hidden_units, s.vocab_tokens)

    def forward(self, ids: Tensor, h0: Tensor, c0: Tensor) -> Tensor:
        x = self.embedding(ids)
        h = [h0[i] for i in range(len(self.lstm_layers))]
        c = [c0[i] for i in range(len(self.lstm_layers))]
        outs = []
        for t in range(self.time_steps):
            inp = x[:, t]
            for i, cell in enumerate(self.lstm_layers):
                h[i], c[i] = cell(inp, h[i], c[i])
                inp = h[i]
            outs.append(F.dropout(inp, _DROPOUT, self.training))
        return self.softmax(torch.cat(outs, 0))
