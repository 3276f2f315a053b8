"""An expert strategy {p, d, t} evaluated as the Phaze code evaluates it (spec phaze.md §8.3): an even
split of the transformer blocks over p stages, no DP over the split. It is the yardstick archplace's
placement is compared with (``archplace place --expert``, bench/phaze/phaze_tpuv4.py), charged by the same
stage costs, memory and gradient-sync model as the DP (``placement.py``)."""

from __future__ import annotations

import re

import numpy as np

from .placement import Placement, PlacementLayers, TrainingSetup, placement_of_stages, stage_cost


def expert_placement(ly: PlacementLayers, setup: TrainingSetup, p: int, d: int,
                     block: np.ndarray | None = None) -> Placement:
    """An expert strategy {p, d, t} as the Phaze code evaluates it (spec §8.3): ceil(blocks/p)
    consecutive transformer blocks per stage, the layers before the first block in the first stage
    and those after the last block in the last; the same load, memory and F as the DP."""
    L, t = ly.num_layers, ly.tmp
    if block is None:
        block = np.array([bool(re.search(r"\.\d+$", n)) for n in ly.names]) if ly.names else np.ones(L, bool)
    idx = np.flatnonzero(block)
    if not 1 <= p <= max(len(idx), 1):
        return Placement(False, t=t, reason=f"p = {p} stages but only {len(idx)} transformer blocks")
    per = -(-len(idx) // p)
    cuts = [int(idx[k * per]) for k in range(1, p) if k * per < len(idx)]
    bounds = list(zip([0, *cuts], [*cuts, L]))
    s = len(bounds)
    loads, mems, devices = [], [], []
    for pos, (a, b) in enumerate(bounds):
        c = stage_cost(ly, setup, list(range(a, b)))
        from_end = s - pos
        mem = c["const"] + (from_end - 1) * c["stash"]
        if mem > setup.hbm_bytes:
            return Placement(False, t=t, microbatch=setup.microbatch, recompute=setup.recompute,
                             hbm_bytes=setup.hbm_bytes,
                             reason=f"expert stage {pos} needs {mem / 2**30:.2f} GiB of HBM")
        loads.append(c["recompute"] if (setup.recompute and from_end > 1) else c["plain"])
        mems.append(mem)
        devices.append(1 if (c["single"] and t > 1) else t)
    if d * sum(devices) > setup.num_devices or d > setup.microbatches:
        return Placement(False, t=t, reason=f"{p}×{d}×{t} needs more than {setup.num_devices} devices "
                                            f"or {setup.microbatches} microbatches")
    return placement_of_stages(ly, setup, [list(range(a, b)) for a, b in bounds], loads, mems, devices, d)
