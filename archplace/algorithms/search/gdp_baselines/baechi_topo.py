"""Baechi's m-TOPO (Jeon et al., "Baechi: Fast Device Placement of Machine Learning Graphs", SoCC
2020), written after the authors' code (``placer/m_topo.py`` of github.com/beomyeol/baechi).

**m-TOPO** walks a topological order (``problem.priority``) and fills device 0, then device 1, ...
A unit goes to the current device while it has memory for it and while the device's compute, with
half of the unit's, stays within the device's share: the compute not yet placed divided by the
devices not yet filled (a device always takes its first unit); a full device is never revisited.
A co-location group is placed with its first op in the order. *Changed*: Baechi's m-TOPO balances
*memory* (share = total memory / d + the largest op's); here the share is compute (the step time
is what GDP optimises) and the device memory is the hard cap. The "half of the unit" rule cuts the
order at the unit whose compute straddles the share, so a device may end a little above its share.

Memory: the model of :mod:`.baechi_memory`.
"""

from __future__ import annotations

import numpy as np

from ....simulators.gpu_placement import PlacementProblem
from .baechi_memory import _MemoryBook
from .units import _check, _units


def m_topo(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """Baechi's m-TOPO: fill devices in topological order, each up to its compute share (module doc)."""
    _check(problem)
    n, d = problem.num_nodes, problem.num_devices
    if n == 0:
        return np.zeros(0, np.int64)
    unit, members = _units(problem)
    book = _MemoryBook(problem, unit, members)
    ucomp = np.bincount(unit, weights=problem.compute_s, minlength=len(members)).tolist()
    unit_l = unit.tolist()
    remaining = float(sum(ucomp))
    dev = [-1] * n
    k, load = 0, 0.0
    share = remaining / d
    for w in np.argsort(problem.priority, kind="stable").tolist():
        if dev[w] >= 0:  # a later op of a placed group
            book.commit(w, dev[w], dev)
            continue
        u = unit_l[w]
        c = ucomp[u]
        while True:
            fits = book.fits(w, k, dev)
            if fits and (load == 0.0 or load + 0.5 * c <= share * (1 + 1e-12)):
                break
            if k == d - 1:
                break
            k, load = k + 1, 0.0
            share = remaining / (d - k)
        f = k if fits else book.roomiest()
        for x in members[u]:
            dev[x] = f
        book.commit(w, f, dev)
        if f == k:
            load += c
        remaining -= c
    return np.asarray(dev, np.int64)
