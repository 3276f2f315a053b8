"""GDP's ``amoebanet`` model.

``amoebanet``: AmoebaNet-A (Real et al. 2019), the cell network the paper names. Its normal and
reduction cells are the genotype the DARTS code base publishes (Liu et al. 2019, ``genotypes.py``,
Apache-2.0), built with DARTS's ImageNet network layout (two stride-2 stems, reduction cells at one
and two thirds of the depth, channels doubled at each): ``normal_cells_per_stage`` normal cells,
a reduction cell, the same, a reduction cell, the same. AmoebaNet-A, not NASNet-A, because GDP's
Table 1 reports AmoebaNet. Drop-path is left out (a random mask multiply, no change in structure).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .presets import AmoebaSizes

# The AmoebaNet-A genotype as DARTS's genotypes.py publishes it: (operation, input state) pairs, two
# per intermediate node; states 0 and 1 are the two previous cells' outputs.
AMOEBANET_NORMAL = (("avg_pool_3x3", 0), ("max_pool_3x3", 1), ("sep_conv_3x3", 0), ("sep_conv_5x5", 2),
                    ("sep_conv_3x3", 0), ("avg_pool_3x3", 3), ("sep_conv_3x3", 1), ("skip_connect", 1),
                    ("skip_connect", 0), ("avg_pool_3x3", 1))
AMOEBANET_NORMAL_CONCAT = (4, 5, 6)
AMOEBANET_REDUCE = (("avg_pool_3x3", 0), ("sep_conv_3x3", 1), ("max_pool_3x3", 0), ("sep_conv_7x7", 2),
                    ("sep_conv_7x7", 0), ("avg_pool_3x3", 1), ("max_pool_3x3", 0), ("max_pool_3x3", 1),
                    ("conv_7x1_1x7", 0), ("sep_conv_3x3", 5))
AMOEBANET_REDUCE_CONCAT = (3, 4, 6)


class ReLUConvBN(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int) -> None:
        super().__init__(nn.ReLU(), nn.Conv2d(c_in, c_out, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(c_out))


class SepConv(nn.Sequential):
    """Two (ReLU, depthwise k×k, pointwise 1×1, BN) stacks; the first carries the stride."""

    def __init__(self, c: int, kernel: int, stride: int) -> None:
        p = kernel // 2
        super().__init__(nn.ReLU(), nn.Conv2d(c, c, kernel, stride, p, groups=c, bias=False),
                         nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c),
                         nn.ReLU(), nn.Conv2d(c, c, kernel, 1, p, groups=c, bias=False),
                         nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))


class Conv7x1_1x7(nn.Sequential):
    def __init__(self, c: int, stride: int) -> None:
        super().__init__(nn.ReLU(), nn.Conv2d(c, c, (1, 7), (1, stride), (0, 3), bias=False),
                         nn.Conv2d(c, c, (7, 1), (stride, 1), (3, 0), bias=False), nn.BatchNorm2d(c))


class FactorizedReduce(nn.Module):
    """Halve the resolution with two offset stride-2 1×1 convolutions (DARTS)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv_1 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.conv_2 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(x)
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(x[:, :, 1:, 1:])], 1))


def _cell_op(name: str, c: int, stride: int) -> nn.Module:
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride, 1, count_include_pad=False)
    if name == "max_pool_3x3":
        return nn.MaxPool2d(3, stride, 1)
    if name == "skip_connect":
        return nn.Identity() if stride == 1 else FactorizedReduce(c, c)
    if name.startswith("sep_conv_"):
        return SepConv(c, int(name[-1]), stride)
    if name == "conv_7x1_1x7":
        return Conv7x1_1x7(c, stride)
    raise ValueError(f"unknown cell operation {name!r}")


class AmoebaCell(nn.Module):
    def __init__(self, c_prev_prev: int, c_prev: int, c: int, reduction: bool, reduction_prev: bool) -> None:
        super().__init__()
        self.preprocess0 = FactorizedReduce(c_prev_prev, c) if reduction_prev else ReLUConvBN(
            c_prev_prev, c, 1, 1, 0)
        self.preprocess1 = ReLUConvBN(c_prev, c, 1, 1, 0)
        genotype = AMOEBANET_REDUCE if reduction else AMOEBANET_NORMAL
        self.concat = AMOEBANET_REDUCE_CONCAT if reduction else AMOEBANET_NORMAL_CONCAT
        self.indices = [i for _, i in genotype]
        self.ops = nn.ModuleList(_cell_op(op, c, 2 if reduction and i < 2 else 1) for op, i in genotype)
        self.multiplier = len(self.concat)

    def forward(self, s0: Tensor, s1: Tensor) -> Tensor:
        states = [self.preprocess0(s0), self.preprocess1(s1)]
        for k in range(len(self.ops) // 2):
            a, b = 2 * k, 2 * k + 1
            states.append(self.ops[a](states[self.indices[a]]) + self.ops[b](states[self.indices[b]]))
        return torch.cat([states[i] for i in self.concat], 1)


class AmoebaNet(nn.Module):
    """DARTS's ``NetworkImageNet`` layout with AmoebaNet-A cells: N normal, reduction, N normal,
    reduction, N normal (``N = normal_cells_per_stage``), channels doubled at each reduction."""

    def __init__(self, s: AmoebaSizes) -> None:
        super().__init__()
        c = s.initial_channels
        self.stem0 = nn.Sequential(nn.Conv2d(3, c // 2, 3, 2, 1, bias=False), nn.BatchNorm2d(c // 2),
                                   nn.ReLU(), nn.Conv2d(c // 2, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c))
        self.stem1 = nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c))
        n = s.normal_cells_per_stage
        c_pp, c_p, c_cur = c, c, c
        cells, reduction_prev = [], True
        for i in range(3 * n + 2):
            reduction = i in (n, 2 * n + 1)
            c_cur = 2 * c_cur if reduction else c_cur
            cell = AmoebaCell(c_pp, c_p, c_cur, reduction, reduction_prev)
            cells.append(cell)
            reduction_prev = reduction
            c_pp, c_p = c_p, cell.multiplier * c_cur
        self.cells = nn.ModuleList(cells)
        self.global_pooling = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c_p, s.classes)

    def forward(self, x: Tensor) -> Tensor:
        s0 = self.stem0(x)
        s1 = self.stem1(s0)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.classifier(torch.flatten(self.global_pooling(s1), 1))
