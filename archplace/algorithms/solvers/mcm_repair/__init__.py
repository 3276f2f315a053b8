"""Constraint repair for multi-chip-module partitioning: the SAMPLE and FIX procedures (spec ``mcm.md`` §3;
paper §4.2, Algorithms 1 and 2) on OR-Tools' classic constraint solver (``pywrapcp``).

A partition maps each node ``u`` of a DAG to a chip ``y_u`` in ``[0, C)`` of a uni-directional ring. The
static constraints are

* Eq. 2 (acyclic dataflow): ``y_src <= y_dst`` for every edge;
* Eq. 3 (no skipped chips): the used chips are exactly ``{0, ..., max(y)}``;
* Eq. 4 (chip triangle dependency): in the chip graph ``A = {(y_u, y_v) : (u, v) in E, y_u != y_v}`` no
  direct edge ``a -> b`` coexists with a path ``a -> k -> ... -> b`` of length >= 2.

Model (built once per graph by :class:`MCMRepairer`; :func:`repair` caches the last few):

* one ``IntVar`` ``y_u`` in ``[0, C-1]`` per node; Eq. 2 as ``y_src <= y_dst`` (bounds propagation in C++);
* Eq. 3 in C++: ``Distribute(y, card)`` counts the nodes per chip, ``used_d = (card_d >= 1)``,
  ``used_d >= used_{d+1}``: a chip that lies at or below a used chip keeps at least one node that can take
  it (the solver fails when none can, binds the last candidate, and drops an unusable chip and all chips
  above it from every domain). In Python, before every decision, a matching check: the empty chips up to
  the largest lower bound of any node need *distinct* unbound nodes whose domains hold them (Hall's
  condition, greedy repair of the previous matching, Kuhn's algorithm when that fails);
* Eq. 4 in Python (:class:`_State`, a ``pywrapcp.PyConstraint`` with a range demon on every variable):
  when a node is bound its chip edges to the bound neighbours join the chip graph, kept as ``C`` bitmasks
  (``C <= 64``) with reachability tables. A value ``x`` for a node is tested exactly against all its bound
  neighbours at once (the "star" test: with ``P``/``Q`` the chips of its bound predecessors/successors,
  the new edges ``P -> x -> Q`` break Eq. 4 iff an in-edge of ``x`` gets a longer path into ``x``, an
  out-edge gets a longer path out of ``x``, or an existing edge ``c -> d`` gets a path ``c ~> x ~> d``).
  Binding a node to a value that fails the test fails; its unbound neighbours lose the values that fail
  (forward checking). For every edge ``(p, q)`` with another path ``p ~> m ~> q``, ``y_m`` must equal
  ``y_p`` or ``y_q`` (a chip strictly between would give a longer chip path), which is propagated when
  two of the three are bound. Adding chip edges never repairs a violation, so all of this is sound. The
  Python state lives in lists with an undo trail whose length is a ``RevInteger``: the solver restores
  it on backtracking and each entry point pops the trail back to it.

Search: a ``pywrapcp.PyDecisionBuilder`` returns ``AssignVariableValue(y_u, c)`` decisions (the paper's
``set_domain(u, {c})``; ``Min``/``Max``/``Contains`` and the Python view of the domain are its
``get_domain``). The solver propagates after each decision; on failure it backtracks and applies the
refutation ``y_u != c``, so a refuted value leaves the domain and the builder is asked again for the node.
Values that fail the star test are skipped without a decision (the bind would fail on them at once).

* FIX (Algorithm 2): the first pass over the order keeps ``y_u`` when it is in ``u``'s domain, else
  defers ``u`` (a kept value refuted later defers it too); the second pass gives every deferred node a
  value of its domain drawn from ``probs[u]`` renormalised over the domain when ``probs`` is given (FIX
  with the policy's probabilities), uniformly otherwise.
* SAMPLE (Algorithm 1): one pass; each node draws from ``probs[u]`` renormalised over its domain (uniform
  over the domain when that mass is zero).

The default order is a random *topological* order from ``seed`` (Kahn's algorithm, a uniformly random
ready node at each step; a random permutation if the graph has a cycle): a node is decided after its
predecessors, so Eq. 2 and Eq. 4 conflicts surface at the decision that causes them instead of many
decisions later (the paper draws a random order; ours is random among the orders that follow the DAG).
All randomness comes from one ``numpy.random.Generator(PCG64(seed))``.

Restarts (our addition; the paper leaves the backtracking policy open). Chronological backtracking has no
memory of why a branch failed, and with tens of chips Eq. 4 conflicts often surface many decisions after
their cause, so the search can thrash. Stages, each a fresh search with the same order and procedure
(except stage 2):

1. ``"eq4"``: the search above, up to ``restart_failures`` failures (default ``max(32, N // 4)``);
2. ``"cpsat"`` (ours, when stage 1 gives up and ``MCMRepairer.cpsat`` is on): the stages below find a
   valid reference partition ``h`` first; then OR-Tools CP-SAT (:func:`_cpsat_repair`: ``x[u, d]``
   booleans, Eqs. 2–4 with chip-pair edge/reachability booleans as in ``mcm_exact``; one worker, a seed
   from the repair's generator, ``cpsat_dtime`` deterministic seconds, hint ``h``) returns the partition
   that keeps the most nodes at ``y`` (FIX: minimal change) or, for SAMPLE, maximises the log-probability
   under ``probs`` perturbed by Gumbel noise from the generator (so repeated SAMPLE calls differ; without
   the noise it would be the most likely valid partition). Each node's domain is every chip when ``C <=
   cpsat_full_chips`` (default 12; the optimum is then the global one over all valid partitions),
   otherwise the chips within ``cpsat_window`` (default 2) of ``h_u`` plus its proposal (``y_u``, or the
   Gumbel-max sample of ``probs[u]``), always within the pins of :meth:`MCMRepairer.restrict`. The
   output is checked against Eqs. 2–4 and used when it scores at least as well as ``h``; otherwise (or
   when CP-SAT returns nothing) ``h`` is returned with the stage that produced it. The chain stages
   below are thus the last resort;
3. ``"chain"``: the same plus the *sufficient* condition ``y_dst <= y_src + 1`` (every edge crosses at
   most one chip boundary, so all chip edges are ``d -> d+1`` and Eq. 4 cannot fail), up to
   ``chain_failures`` failures (default ``max(64, N)``). Bounds propagation decides Eq. 2 plus this
   condition without backtracking; only Eq. 3 can still fail, and it fails at once;
4. ``"chain-cap<k>"``: the chain condition with every chip ``<= k``, ``k`` halving from ``(C - 1) // 2``;
5. ``"complete"``: the plain search of stage 1 without a failure limit.

A stage that *exhausts* its tree without a partition moves on (a restricted stage to stage 5; stage 1 means
no partition exists). Stage 5 is complete, so the repair returns a valid partition whenever one exists,
reports "infeasible" when the whole tree of stage 1 or 4 is exhausted and "unknown" when
``time_limit_s`` runs out. Without pins (:meth:`MCMRepairer.restrict`) the static problem is never
infeasible: all nodes on chip 0 meets Eqs. 2–4, and stage 4 reaches ``k = 0``. With ``restart_failures <=
0`` the repair goes straight to stage 5 (no CP-SAT stage).

The result records its stage: partitions from stages 3–4 meet the chain condition and tend to use fewer
chips and to change more of ``y`` than the paper's procedure would with a perfect propagator; "cpsat"
partitions are a non-paper variant (spec §3.1 (c): an objective towards ``y``) and cost one CP-SAT solve
(about 0.1–0.5 s for FIX on 36 chips and 70–180 nodes, up to a few seconds for SAMPLE; milliseconds on
8-chip graphs of <= 50 nodes, bench/mcm/mcm_repair_stages.py). ``bench/mcm/mcm_repair_stages.py`` measures how
often each stage runs on uniform proposals.

Where things are (one concern per module; at run time each imports only modules listed above it):

- ``common.py``: ``MAX_CHIPS``, the modes, :class:`RepairResult` and the chip-bitmask helpers;
- ``graph.py``: the random topological order and the skip triples of the DAG;
- ``propagation.py``: ``_State``, the Python constraint for Eq. 4 and the Eq. 3 matching check;
- ``search.py``: ``_RepairBuilder``, FIX and SAMPLE as a decision builder;
- ``cpsat.py``: the "cpsat" stage's CP-SAT model and the final check of its output;
- ``repairer.py``: :class:`MCMRepairer` (the model of a graph and the restart stages) and :func:`repair`.

This package must not import ray.
"""

from __future__ import annotations

from .common import MAX_CHIPS, RepairResult
from .repairer import MCMRepairer, repair

__all__ = ["MAX_CHIPS", "MCMRepairer", "RepairResult", "repair"]
