"""``evaluate_split``: the loads and validity of a given split, written independently of the solvers.

Every split a solver returns is re-evaluated here and that value is what the caller gets, so a
solver bug shows up as a disagreement, not as a wrong number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from archplace.workloads.graph import OpGraph, kahn_order

from .inputs import _INF, _columns, _device_array, _out_cost, _params


@dataclass
class SplitEvaluation:
    """What :func:`evaluate_split` found: the loads per device (accelerators, then CPUs), the max-load,
    and every violated constraint (an empty list means the split is valid)."""

    max_load: float
    loads: list[float]
    violations: list[str]

    @property
    def valid(self) -> bool:
        return not self.violations


def evaluate_split(g: OpGraph, device_of: Any, *, num_accs: int | None = None,
                   num_cpus: int | None = None) -> SplitEvaluation:
    """Loads and validity of a split, written independently of the solvers.

    ``device_of`` gives the device of every node row (accelerator ``0..k-1``, CPU ``k + j``), or is a
    mapping node id -> device. ``num_accs`` / ``num_cpus`` default to ``g.meta``'s ``max_accs`` /
    ``max_cpus``. Checks: device range, CPU-only nodes, colour classes, accelerator memory, and
    contiguity (the graph of devices induced by the forward edges -- plus, for a backward colour class
    without forward nodes, the mirrored backward edges touching it -- must be acyclic). Loads follow the
    README: an accelerator pays ``acc_latency`` plus each crossing output's ``cost`` once as producer and
    once per consuming device; a CPU pays ``cpu_latency`` only.
    """
    k, cpus, mem = _params(g)
    k = k if num_accs is None else int(num_accs)
    cpus = cpus if num_cpus is None else int(num_cpus)
    cols = _columns(g)
    dev = _device_array(g, device_of)
    n = g.num_nodes
    ids = g.nodes["id"]
    nd = k + cpus
    viol: list[str] = []

    bad = np.flatnonzero((dev < 0) | (dev >= nd))
    if len(bad):
        viol.append(f"node {ids[bad[0]]}: device {dev[bad[0]]} out of range 0..{nd - 1} "
                    f"({len(bad)} nodes)")
        return SplitEvaluation(_INF, [_INF] * nd, viol)

    is_acc = dev < k
    bad = np.flatnonzero(is_acc & ~cols["supported_on_acc"])
    if len(bad):
        viol.append(f"node {ids[bad[0]]}: not supported on an accelerator but placed on accelerator "
                    f"{dev[bad[0]]}")

    # colour classes
    cc = cols["color_class"]
    where: dict[int, tuple[int, int]] = {}
    for r in range(n):
        c = int(cc[r])
        if c < 0:
            continue
        if c in where and where[c][1] != dev[r]:
            viol.append(f"colour class {c}: node {ids[where[c][0]]} on device {where[c][1]} but node "
                        f"{ids[r]} on device {dev[r]}")
            where[c] = (r, int(dev[r]))  # report each class at most a few times
        else:
            where.setdefault(c, (r, int(dev[r])))

    # memory
    for d in range(k):
        used = float(cols["mem_bytes"][dev == d].sum())
        if used > mem:
            viol.append(f"accelerator {d}: uses {used:.0f} bytes, more than max_bytes_per_acc = {mem:.0f}")

    # contiguity: the device graph of forward edges (and mirrored edges of orphaned backward classes)
    src, dst = g.edge_pos
    bwd = g.nodes["is_backward"].astype(bool)
    with_forward = {int(c) for c, b in zip(cc, bwd) if not b and c >= 0}

    def orphaned(r: int) -> bool:  # a backward node whose class has no forward node
        return bool(bwd[r]) and (cc[r] < 0 or int(cc[r]) not in with_forward)

    arcs: set[tuple[int, int]] = set()
    for s, t in zip(src.tolist(), dst.tolist()):
        if dev[s] == dev[t]:
            continue
        if not bwd[s] and not bwd[t]:
            arcs.add((int(dev[s]), int(dev[t])))
        elif bwd[s] and bwd[t] and (orphaned(s) or orphaned(t)):
            # the reference mirrors this edge between forward stand-ins of the two classes (which sit
            # where the classes sit); an edge inside one class lies on one device anyway
            arcs.add((int(dev[t]), int(dev[s])))
    arc_src = np.array([a for a, _ in arcs], dtype=np.int64)
    arc_dst = np.array([b for _, b in arcs], dtype=np.int64)
    order, stuck = kahn_order(nd, arc_src, arc_dst)
    if stuck >= 0:
        # the devices Kahn could not order: those on a cycle or behind one (whatever the tie-breaking)
        cyc = sorted(set(range(nd)) - set(order.tolist()))
        viol.append(f"not contiguous: the forward edges between devices {cyc} form a cycle")

    # loads
    loads = np.zeros(nd)
    np.add.at(loads, dev[is_acc], cols["acc_latency"][is_acc])
    np.add.at(loads, dev[~is_acc], cols["cpu_latency"][~is_acc])
    out_cost = _out_cost(g, cols["cost"])
    consumers: dict[int, set[int]] = {}
    for s, t in zip(src.tolist(), dst.tolist()):
        if dev[t] != dev[s]:
            consumers.setdefault(s, set()).add(int(dev[t]))
    for s, devs in consumers.items():
        c = out_cost[s]
        if dev[s] < k:
            loads[dev[s]] += c
        for d in devs:
            if d < k:
                loads[d] += c
    ml = float(loads.max()) if nd else 0.0
    return SplitEvaluation(ml, [float(x) for x in loads], viol)
