"""Phaze's per-layer schedule ILP (spec ``phaze.md`` §4; paper Section 4, Figure 3, Appendix A).

One layer (or TMP layer slice), forward or backward, is a DAG of operators. Each operator runs
either *intra-op parallel* (``y_i = 1``: on all cores of its type, latency ℓ̂_i, and nothing else
runs at the same time) or on one core (latency ℓ_i): a tensor core (TC-operator), a vector core
(VC-operator) or a paired tensor+vector core with the same index ``c < min(num_tc, num_vc)`` (fused
operator). The ILP minimises the makespan ``T``.

Formulation (Figure 3; all sixteen families are emitted by both backends):

- (1) ``T ≥ t_i + p_i``; (2) ``p_i = y_i ℓ̂_i + (1 − y_i) ℓ_i`` (an explicit variable ``p_i``);
- (3) ``x_ij + x_ji ≤ 1``; (4) ``x_ik ≥ x_ij + x_jk − 1``; (5) ``x_ij = 1`` and (6) ``x_ji = 0`` for
  ``i ≺ j``; (7) ``t_i + p_i ≤ t_j`` for ``i ≺ j``; (8) ``t_i + p_i − H(1 − x_ij) ≤ t_j`` and
  (9) ``x_ij + x_ji ≥ y_i`` for incomparable ``i, j``;
- (10)/(11) ``y_i + Σ_c z_ic = 1`` per core type the op needs; (12)/(13) ``z = 0`` for the type an
  op does not use; (14) ``z^tc_ic = z^vc_ic`` for fused ops; (15)/(16) same-core incomparable ops
  are ordered.

``x`` exists for every ordered pair ``i ≠ j`` (``n(n−1)`` binaries) and (5)/(6) fix the comparable
ones. Instances that are tautologies once (5), (6), (12), (13) have fixed their constants are not
emitted: (3) for comparable pairs, (4) for triples where ``x_ik`` is fixed to 1 or ``x_ij`` / ``x_jk``
to 0, (15)/(16) for pairs where one op cannot use that core type. Big-M ``H = min(Σ ℓ̂, Σ ℓ)``
(spec §11.3); it is a valid bound because both "all sequential" schedules are feasible, so the
optimum is ``≤ H`` and CP-SAT's time domains are ``[0, H]``.

Core indices (0-based here; 1-based in the paper) are only needed up to ``K_tc = min(num_tc, n_tc)``
where ``n_tc`` counts the ops that can use a tensor core (TC and fused), likewise ``K_vc``: any
valid assignment can be relabelled into those ranges (permute the pairs used by fused ops jointly
to the front, the other used cores of each side after them). ``z_ic = 0`` for fused ops on
unpaired cores ``c >= min(num_tc, num_vc)`` is the "implied constraint" the paper mentions, added
whenever z-variables of a type exist (it matters when only one type has them).

Lazy resource constraints (Appendix A, spec §4.5): round 0 omits every z-variable and (10)–(16).
The solution is rebuilt into a float schedule (below) and the peak number of cores of each type in
use is counted (intra-op TC op: all ``num_tc``; intra VC: all ``num_vc``; intra fused: ``min`` of
each; otherwise 1, fused 1 TC + 1 VC). An over-subscribed type gets its z-variables and
constraints back and the ILP is re-solved; ``lazy_rounds`` counts these additions. Counting alone
is not sufficient when fused ops exist (a fused op needs *the same* index on both sides, a
pre-colouring problem): so when the counts fit, cores are assigned by an exact bounded colouring
search, and if that fails the types without z-variables are added back too. The returned core
assignment therefore always satisfies the paper's constraints; it comes from ``z`` for types that
have z-variables, from the colouring otherwise.

Rebuilding a solution: the solver's ``x`` (a strict partial order containing ``≺``), plus the
interval order of the solver's start times (``t``-order, ties broken by topological rank), defines a
DAG; every op starts as soon as its predecessors in that DAG finish, with the *float* latency of its
chosen mode. Everything the solver separated stays separated, so the schedule is valid; its
makespan is what is reported (``makespan_s``), computed from the float ℓ/ℓ̂.

CP-SAT integer scaling: CP-SAT needs integer times. Latencies are rounded to multiples of
``res = H · 2**-30`` (``TIME_RESOLUTION_REL``; ``H_int ≈ 1.07e9`` fits easily in CP-SAT's int64
domains). Each rounded latency is within ``res/2`` of the float one, so along any chain of at most
``n`` ops a makespan moves by at most ``n·res/2``. Hence the reported makespan of a schedule that is
optimal for the rounded problem exceeds the true optimum by at most ``n·res = n·H·2**-30`` (about
``1.2e-7·H`` for 130 ops); in relative terms at most ``n·2**-30·H/T*``. The HiGHS backend keeps
float latencies (times in units of ``H/1000`` for numerics); its error is its feasibility
tolerance (``1e-6`` of a unit, i.e. ``1e-9·H``) before the float rebuild removes it.

Shared HBM and GLB bandwidth (issue 19; ``contention.py``): the paper gives every concurrently
running op the full HBM and GLB bandwidth. A ``LayerProblem`` may carry per-op ``hbm_share`` /
``glb_share`` (the fraction of the shared bandwidth a single-core op draws while it runs at ℓ;
``simulators.latency.bandwidth_shares``). Then, at every instant, the summed shares of the running
single-core ops are ≤ 1 per resource: a cumulative resource of capacity 1 (integer demands
``ceil(share·10⁴)`` against 10⁴ in every method, so that they agree exactly). Intra-op ops need no
demand: (9) already keeps them apart from everything. Ops whose demand together exceeds the
bandwidth *serialise* rather than stretch: stretching would make an op's duration depend on what
runs beside it (a schedule-dependent latency, outside this model); serialising keeps ℓ and gives a
feasible, conservative schedule (the bandwidth is never exceeded, and an op never runs faster
than ℓ). How each method enforces it: CP-SAT one ``add_cumulative`` per resource (also in the
interval warm start); the list heuristics and the enumeration start an op only where the load
leaves room; HiGHS ``x_ij + x_ji ≥ 1`` for incomparable pairs whose demands exceed the capacity
together, plus lazy cuts (``lazy.py``) for larger overlapping sets found in the rebuilt schedule.
The float rebuild keeps every pair the solver separated separated, so (Helly property of intervals)
any set of ops that overlaps after rebuilding overlapped in the solver too and still fits;
``check_schedule`` checks the capacity anyway and ``LayerSchedule.peak_hbm_share`` /
``peak_glb_share`` report the peak load. No shares (the default), or ``solve_layer(...,
contention=False)``, is the paper's model with its old cache keys.

Time limits never crash: a solve that ends without a solution returns a greedy list schedule
(critical-path priority, per-op greedy intra-op choice, explicit cores; or the sequential schedule
when that is shorter) with status ``"fallback"`` and its gap against the solver's bound (NaN when
there is none).

What makes CP-SAT fast on real layers (none of it changes the optimum; details in each function):

- series decomposition (``solve._solve_layer``): when every op of a prefix of the DAG precedes every
  other op, the segments are solved separately and concatenated (exact);
- implied global constraints and one dominance rule (``cpsat._cpsat_redundant``): a chain bound
  ``T ≥ Σ y_i ℓ̂_i + Σ_{i∈C} (1−y_i) ℓ_i`` for every chain C, exclusivity and per-type capacity as
  cumulatives over optional fixed-size intervals, a no-overlap per core when z exists, an energy
  bound, and ``y_i = 0`` when ``ℓ̂_i ≥ ℓ_i``; core-relabelling symmetry breaking
  (``cpsat._cpsat_symmetry``); the bound of an earlier lazy round as a lower bound on ``T``;
- hints: the greedy/sequential schedule; on 8+ ops, if a 1 s first attempt does not prove
  optimality, a schedule from a compact interval model (``cpsat._warm_start``), then the lazy
  rounds go on. Finding good incumbents, not the bound, is what takes CP-SAT long on these instances.

The HiGHS backend gets the formulation only (no redundant constraints), which keeps it an
independent cross-check; HiGHS's MIP symmetry detection is switched off (it returned a suboptimal
point as optimal on one random 7-op instance). OR-Tools and highspy ship clashing copies of
``libhighs.so.1``, so HiGHS runs in a worker subprocess (see ``workers.py``).

Where things are (one concern per module; read them in this order):

- ``problem.py``: ``LayerProblem``, the instance, and how one is built from a graph's rows;
- ``contention.py``: the shared-bandwidth demands and peak loads on fixed timings;
- ``schedule.py``: ``LayerSchedule``, ``check_schedule`` and the helpers on fixed timings (rank,
  ASAP starts, core counting and colouring) that every method shares;
- ``heuristics.py``: the sequential, greedy and repaired list schedules (hints and fallback);
- ``exhaustive.py``: the solver-free exact reference for tiny instances;
- ``model.py``: the constraint index arrays of one round and a backend's raw answer;
- ``cpsat.py`` / ``milp.py``: the two backends (and CP-SAT's interval warm start);
- ``workers.py``: the subprocesses that keep OR-Tools and HiGHS apart;
- ``lazy.py``: Appendix A's lazy rounds and the state they carry (``_LazyState``);
- ``solve.py``: ``solve_layer``, the closed forms, series decomposition, time budget, fallback;
- ``cache.py``: the content-hash cache; ``planning.py``: whole graphs (``schedule_layers``).

The package re-exports what other code imports; the tunables below can be set on the package
itself (``layer_ilp.QUICK_ATTEMPT_S = ...``) and reach the module that reads them
(``solvers._settings``). This package must not import ray.
"""

from __future__ import annotations

from .._settings import forward_settings
from .budget import DEFAULT_BUDGET, DEFAULT_TIME_LIMIT_S, STOP_REASONS
from .cache import CACHE_MAX_ENTRIES as CACHE_MAX_ENTRIES
from .cache import clear_schedule_cache, effective_limit, effective_time_limit_s, schedule_cache_key
from .contention import SHARE_QUANTUM as SHARE_QUANTUM
from .cpsat import _CPSAT_REDUNDANT as _CPSAT_REDUNDANT
from .cpsat import _CPSAT_SYMMETRY as _CPSAT_SYMMETRY
from .cpsat import CPSAT_INTERLEAVE as CPSAT_INTERLEAVE
from .cpsat import TIME_RESOLUTION_REL
from .exhaustive import exhaustive_schedule
from .heuristics import greedy_schedule, sequential_schedule
from .lazy import _run_backend as _run_backend
from .milp import MILP_NODES_PER_DTIME as MILP_NODES_PER_DTIME
from .milp import MILP_TIME_UNITS as MILP_TIME_UNITS
from .model import _Raw as _Raw
from .planning import LayerPlan, layer_problems, plan_layer_schedules, schedule_layers
from .problem import CORE_TO_KIND, KIND_FUSED, KIND_TC, KIND_VC, LayerProblem
from .problem import KIND_NAMES as KIND_NAMES
from .schedule import STATUSES as STATUSES
from .schedule import LayerSchedule, check_schedule, peak_shares
from .solve import BACKENDS, solve_layer
from .solve import QUICK_ATTEMPT_DTIME as QUICK_ATTEMPT_DTIME
from .solve import WARM_START_MAX_DTIME as WARM_START_MAX_DTIME
from .solve import WARM_START_MIN_OPS as WARM_START_MIN_OPS
from .solve import WARM_START_SHARE as WARM_START_SHARE
from .solve import _run_warm_start as _run_warm_start
from .solve import _series_segments as _series_segments
from .solve import _trivial as _trivial

# ``__all__`` is what it was when this was one module; the ``X as X`` imports above stay reachable as
# ``layer_ilp.X`` too: constants, the tunables and hooks forwarded below, internals the tests use
__all__ = [
    "BACKENDS", "CORE_TO_KIND", "DEFAULT_BUDGET", "DEFAULT_TIME_LIMIT_S", "KIND_FUSED", "KIND_TC", "KIND_VC",
    "LayerPlan", "LayerProblem", "LayerSchedule", "STOP_REASONS", "TIME_RESOLUTION_REL", "check_schedule",
    "clear_schedule_cache", "effective_limit", "effective_time_limit_s", "exhaustive_schedule",
    "greedy_schedule", "layer_problems", "peak_shares",
    "plan_layer_schedules", "schedule_cache_key", "schedule_layers", "sequential_schedule", "solve_layer",
]

# knobs and hooks that tests and benchmarks set on the package (see ``solvers._settings``)
forward_settings(__name__, (
    "QUICK_ATTEMPT_DTIME", "WARM_START_MIN_OPS", "WARM_START_SHARE", "WARM_START_MAX_DTIME",
    "CPSAT_INTERLEAVE", "MILP_NODES_PER_DTIME", "CACHE_MAX_ENTRIES", "_CPSAT_REDUNDANT", "_CPSAT_SYMMETRY",
    "_run_backend", "_run_warm_start",
))
