"""Max-load (throughput) placement for the ``dnn-partitioning`` format (Tarnawski et al., NeurIPS 2020).

Given an :class:`~archplace.workloads.graph.OpGraph` loaded by
:func:`~archplace.workloads.dnn_partitioning.load_dnn_partitioning`, place every node on one of ``k``
accelerators or one of ``c`` CPU cores so that the largest device load (the time per sample of the
pipeline) is as small as possible. The accounting is the one of the reference program
(``msr-fiddle/dnn-partitioning``, ``throughput-dp/dp.cpp``) and of the workload README:

* an accelerator's load is the sum of its nodes' ``acc_latency`` plus communication: a node whose
  output is consumed on another device pays its edge ``cost`` once on its own device and once on every
  other device that consumes it; a CPU's load is the sum of its nodes' ``cpu_latency`` (no communication);
* nodes sharing a colour class sit on one device; nodes with ``supported_on_acc = False`` go to a CPU;
  an accelerator's nodes fit in ``meta["max_bytes_per_acc"]`` bytes;
* contiguity is judged on the forward graph, contracted by colour classes: the devices' forward pieces
  must be orderable so that every prefix of the order is a downset (an *ideal*) -- equivalently, the
  graph of the devices (an arc from a device to another when a forward edge goes between them) has no
  cycle. This is exactly the family of splits the reference dynamic program ranges over (a chain of
  ideals ``{} = I0 < I1 < ... < Im = V``, one difference per device); it implies that every piece is
  convex. Backward nodes follow their colour class; a backward colour class with no forward node gets
  a virtual forward node whose edges mirror the backward edges touching it, as in the reference.

Two exact methods:

``dp``
    The dynamic program over ideals of the contracted forward graph, like the reference, made fast:
    ideals as bitsets (generated once each, in canonical order), per-ideal hyperedge split counts so
    that the communication of a piece ``I \\ J`` is ``F(I) + F(J) - corr(J, I)`` (``F`` sums the
    hyperedges an ideal splits; the correction involves only hyperedges both split), all
    ``(cpus+1) x (k+1)`` DP states of an ideal updated at once with numpy, and pruning by a threshold
    ``T``: only pieces of cost <= T, only ideals whose accelerator work fits the devices before them and
    whose remaining work fits the devices after them, and only sub-ideals that are themselves reachable.
    If the pruned DP finds a split, its value is the optimum (every split of value <= T survives the
    pruning); otherwise the optimum exceeds ``T``, which becomes a lower bound, and ``T`` grows. The
    first ``T`` is the value of a quick split (the same DP over the prefixes of one topological order)
    when that is close to the simple lower bound. Before enumerating ideals, zero-latency supernodes
    that touch only one other supernode are merged into it -- the reference does the same
    ("trivial node optimizations"); here only when it provably keeps the optimum (no device's load
    grows, memory and CPU-only constraints stay met).
``milp``
    The chain of ideals as a CP-SAT model with integer-scaled times: ``z[v, j]`` says supernode v lies
    in the ideal made of positions ``0..j``; the positions interleave accelerator slots with blocks of
    CPU slots, so any order of the pieces fits and no constraint needs a big-M; hyperedge cuts are
    clauses per accelerator slot. It returns the optimum with the solver's proof, or the best split and
    its bound at the time limit. The bound is corrected for the rounding of the scaled times, so it is
    a valid bound on the real-valued optimum (the gap it leaves is about 1e-7 relative).

``auto`` picks ``dp`` when the ideals number at most ``max_ideals`` (all published inputs: at most
36,596) and ``milp`` otherwise. Whatever the method, the returned split is re-evaluated by
:func:`evaluate_split`, an independent implementation of the accounting and of the feasibility checks,
and that value is returned.

Where things are (one concern per module):

- ``inputs.py``: the meta fields and columns a graph must carry, checked;
- ``evaluate.py``: ``evaluate_split``, the independent accounting and feasibility checks;
- ``contraction.py``: the contracted instance (supernodes, hyperedges) both methods solve;
- ``dp.py``: method ``dp``; ``milp.py``: method ``milp`` (CP-SAT);
- ``solve.py``: ``solve_max_load`` and ``MaxLoadResult``;
- ``reference.py``: the README's optima; ``cli.py``: ``archplace solve-dp``.

``_SMALL_LATTICE`` and ``_STRAIGHT_TO_UB`` can be set on this package and reach the modules that read
them (``solvers._settings``). This package must not import ray.
"""

from __future__ import annotations

from .._settings import forward_settings
from .cli import solve_dp_command
from .dp import _SMALL_LATTICE as _SMALL_LATTICE
from .dp import _STRAIGHT_TO_UB as _STRAIGHT_TO_UB
from .evaluate import SplitEvaluation, evaluate_split
from .reference import REFERENCE_MAX_LOADS, reference_value
from .solve import MaxLoadResult, solve_max_load

__all__ = [
    "MaxLoadResult",
    "SplitEvaluation",
    "REFERENCE_MAX_LOADS",
    "evaluate_split",
    "solve_max_load",
    "solve_dp_command",
    "reference_value",
]

# the DP's pruning knobs, which the tests set on the package (see ``solvers._settings``)
forward_settings(__name__, ("_SMALL_LATTICE", "_STRAIGHT_TO_UB"))
