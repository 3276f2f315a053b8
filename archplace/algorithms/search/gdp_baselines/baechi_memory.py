"""The memory bookkeeping of Baechi's memory-constrained placers (``m_topo``, ``m_etf``, ``m_sct``;
Jeon et al., "Baechi: Fast Device Placement of Machine Learning Graphs", SoCC 2020).

**Memory model (all three).** An op costs its device ``resident_bytes + output`` where ``output`` is
the largest of ``output_bytes`` and its out-edges' bytes (what the simulator allocates for it), plus
one received copy per (producer, device) pair whose size is the largest edge from that producer to an
op on the device. This counts every tensor as alive all step, an upper bound of the simulator's peak
(which frees activations), so a placement these placers make without running out of room is valid in
``simulate``. A co-location group reserves, when its first op is placed, the costs of all its ops plus
the bytes of all their inputs from outside the group (their largest copies); each later op of the
group gives back what its copies did not use. When no device has room for a unit, it goes to the
device with the most room left and the simulator will report out of memory.
"""

from __future__ import annotations

import numpy as np

from ....simulators.gpu_placement import PlacementProblem


class _MemoryBook:
    """Conservative per-device memory bookkeeping of the Baechi placers (module doc, "Memory model")."""

    def __init__(self, problem: PlacementProblem, unit: np.ndarray, members: list[list[int]]) -> None:
        n, d = problem.num_nodes, problem.num_devices
        outb = problem.output_bytes.copy()
        if problem.num_edges:
            np.maximum.at(outb, problem.src, problem.edge_bytes)
        self.own = (problem.resident_bytes + outb).tolist()
        # inputs[w]: (producer, largest edge bytes from it to w)
        self.inputs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        if problem.num_edges:
            key = problem.dst * n + problem.src
            uk, inv = np.unique(key, return_inverse=True)
            big = np.zeros(len(uk))
            np.maximum.at(big, inv, problem.edge_bytes)
            for k, b in zip(uk.tolist(), big.tolist()):
                self.inputs[k // n].append((k % n, b))
        self.unit = unit.tolist()
        self.members = members
        # inb[w]: bytes of w's inputs from outside its unit (an upper bound of its copies)
        self.inb = [sum(b for v, b in self.inputs[w] if self.unit[v] != self.unit[w]) for w in range(n)]
        self.unit_own = [sum(self.own[w] for w in m) for m in members]
        self.unit_inb = [sum(self.inb[w] for w in m) for m in members]
        self.unit_dev = [-1] * len(members)
        self.free = [float(problem.memory_bytes)] * d
        self.copy: dict[tuple[int, int], float] = {}

    def _copies(self, w: int, f: int, dev: list[int], commit: bool = False) -> float:
        extra = 0.0
        copy = self.copy
        for v, b in self.inputs[w]:
            e = dev[v]
            if e != f:
                have = copy.get((v, f), 0.0)
                if b > have:
                    extra += b - have
                    if commit:
                        copy[(v, f)] = b
        return extra

    def cost(self, w: int, f: int, dev: list[int]) -> float:
        """Bytes device ``f`` must have free to take ``w`` (with its whole group if it comes first)."""
        u = self.unit[w]
        if self.unit_dev[u] >= 0:
            return 0.0  # reserved with the group
        if len(self.members[u]) > 1:
            return self.unit_own[u] + self.unit_inb[u] - self.inb[w] + self._copies(w, f, dev)
        return self.own[w] + self._copies(w, f, dev)

    def fits(self, w: int, f: int, dev: list[int]) -> bool:
        return self.cost(w, f, dev) <= self.free[f]

    def commit(self, w: int, f: int, dev: list[int]) -> None:
        """Charge ``f`` for ``w`` (its producers must be placed already)."""
        u = self.unit[w]
        actual = self._copies(w, f, dev, commit=True)
        if self.unit_dev[u] >= 0:  # a later op of a placed group: give back the unused reservation
            self.free[f] += self.inb[w] - actual
        elif len(self.members[u]) > 1:
            self.unit_dev[u] = f
            self.free[f] -= self.unit_own[u] + self.unit_inb[u] - self.inb[w] + actual
        else:
            self.unit_dev[u] = f
            self.free[f] -= self.own[w] + actual

    def roomiest(self) -> int:
        return int(np.argmax(self.free))
