"""GDP's ``wavenet-SxL`` model family.

``wavenet-SxL``: WaveNet (van den Oord et al. 2016): a causal convolution of the one-hot μ-law
input, then S stacks of L/S residual blocks with dilations 1, 2, 4, ... 256 (so "2-stack 18-layer"
is 2 × 9 blocks and "4-stack 36-layer" 4 × 9), each block a dilated causal convolution pair
(filter and gate) → ``tanh · sigmoid`` → a 1×1 residual convolution added to the block input and a
1×1 skip convolution; the skips are summed, then ReLU → 1×1 → ReLU → 1×1 to 256 logits per sample.
The last block has no residual 1×1: its output would feed nothing (TensorFlow runs only what the
loss needs), and a dead op would seed a gradient of its own in the backward pass.
Causality: the convolution pads both sides and the trailing outputs are sliced off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .presets import WavenetSizes


class ResidualBlock(nn.Module):
    """Gated dilated causal convolution block. Parameters (with biases, taps ``k``, residual ``r``,
    dilation ``g``, skip ``s`` channels): ``2(g·r·k + g) + (r·g + r) + (s·g + s)``; the last block
    has no residual 1×1 (``residual=False``, minus ``r·g + r``): its output would feed nothing, and
    TensorFlow runs only what the loss needs."""

    def __init__(self, s: WavenetSizes, dilation: int, residual: bool = True) -> None:
        super().__init__()
        pad = (s.filter_taps - 1) * dilation
        r, g = s.residual_channels, s.dilation_channels
        self.filter = nn.Conv1d(r, g, s.filter_taps, dilation=dilation, padding=pad)
        self.gate = nn.Conv1d(r, g, s.filter_taps, dilation=dilation, padding=pad)
        self.dense = nn.Conv1d(g, r, 1) if residual else None
        self.skip = nn.Conv1d(g, s.skip_channels, 1)

    def forward(self, x: Tensor, skips: Tensor | None) -> tuple[Tensor | None, Tensor]:
        """Returns the next block's input and the running sum of the skip outputs (summed here,
        block by block, so the adds belong to the blocks)."""
        t = x.shape[-1]
        # causal: the convolutions pad both sides; the tail (outputs that saw the future) is sliced off
        z = torch.tanh(self.filter(x)[..., :t]) * torch.sigmoid(self.gate(x)[..., :t])
        skip = self.skip(z)
        out = None if self.dense is None else x + self.dense(z)
        return out, skip if skips is None else skips + skip


def wavenet_block_params(s: WavenetSizes) -> int:
    r, g, k, sk = s.residual_channels, s.dilation_channels, s.filter_taps, s.skip_channels
    return 2 * (g * r * k + g) + (r * g + r) + (sk * g + sk)


class WaveNet(nn.Module):
    """Input: one-hot μ-law samples ``[B, Q, T]``; output: logits ``[B, Q, T]``."""

    def __init__(self, s: WavenetSizes) -> None:
        super().__init__()
        q, r = s.quantization_levels, s.residual_channels
        self.causal_conv = nn.Conv1d(q, r, s.initial_filter_taps, padding=s.initial_filter_taps - 1)
        n = s.stacks * s.blocks_per_stack
        self.blocks = nn.ModuleList(ResidualBlock(s, 2 ** (i % s.blocks_per_stack), residual=i < n - 1)
                                    for i in range(n))
        self.postprocess1 = nn.Conv1d(s.skip_channels, s.skip_channels, 1)
        self.postprocess2 = nn.Conv1d(s.skip_channels, q, 1)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[-1]
        h = self.causal_conv(x)[..., :t]
        total = None
        for block in self.blocks:
            h, total = block(h, total)
        return self.postprocess2(F.relu(self.postprocess1(F.relu(total))))
