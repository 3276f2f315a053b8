"""The LSTM cell of GDP's recurrent models (RNNLM and GNMT), written with explicit GEMMs.

A placement decides per *operation*, and TensorFlow's static unrolled RNN graph has every time step's
ops as separate nodes. ``nn.LSTM`` is one fused op, so the cell is written with two ``nn.Linear``
(input and recurrent weights) and element-wise gates, and the models' Python loops over time steps
unroll it: every step's GEMMs and gates appear in the graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .presets import _DROPOUT


class LSTMCell(nn.Module):
    """One LSTM step with explicit GEMMs: ``gates = W_x·x + b + W_h·h`` (one bias), then
    ``c' = σ(f)·c + σ(i)·tanh(g)`` and ``h' = σ(o)·tanh(c')``. Parameters: ``4H(X + H) + 4H``.

    ``x`` may be a list of tensors, concatenated first (GNMT's ``[input ; context]``); dropout on
    the input (the non-recurrent connection) is part of the cell, so these ops sit in its layer."""

    def __init__(self, input_units: int, hidden_units: int) -> None:
        super().__init__()
        self.ih = nn.Linear(input_units, 4 * hidden_units)
        self.hh = nn.Linear(hidden_units, 4 * hidden_units, bias=False)

    def forward(self, x: Tensor | list[Tensor], h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat(x, -1) if isinstance(x, list) else x
        x = F.dropout(x, _DROPOUT, self.training)
        i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


def lstm_cell_params(input_units: int, hidden_units: int) -> int:
    return 4 * hidden_units * (input_units + hidden_units) + 4 * hidden_units
