"""Solver budgets that do not depend on the machine's load (DESIGN.md, "Answers do not depend on the
machine's load"; issue 28 item 6).

A layer slice's solve is limited by *work*, counted in CP-SAT's deterministic time ("dtime",
deterministic seconds: CP-SAT's count of its own basic operations, scaled to roughly a second of one
core). The same model, parameters, seed and OR-Tools build spend the same dtime and find the same
answer on an idle and on a busy machine, so a slice stopped by its budget gives the same schedule
every time. HiGHS has no such clock: its work is counted in branch-and-bound nodes,
``MILP_NODES_PER_DTIME`` nodes for one deterministic second (``milp.py``).

The budget of a slice is split deterministically: series segments share what is left by their
weight, the quick first attempt, the interval warm start and the lazy rounds each get a part of what
is left, and every solver call charges the dtime it reports (``Allowance``). The wall clock stays
only as an outer safety limit (``time_limit_s``): a solve it stops is recorded as such
(``stopped_by == "wall_limit"``), because then the answer does depend on the load; such a schedule
is not put in the schedule cache, so a later run solves the slice again.

Why each slice stopped (``LayerSchedule.stopped_by``, ``STOP_REASONS``):

- ``closed_form``: no solver needed (total order, empty, zero latencies);
- ``optimal``: proven optimal;
- ``gap_target``: stopped at the relative gap target (``rel_gap``);
- ``deterministic_limit``: the work budget ran out (the answer is reproducible);
- ``wall_limit``: the wall-clock safety limit ran out first (the answer depends on the load);
- ``solver_failed``: a solver worker failed or returned no usable answer; the list schedule stands.

A slice solved in series segments reports the most telling reason of its segments (the later in
``STOP_REASONS``).
"""

from __future__ import annotations

import math
import time

STOP_REASONS = ("closed_form", "optimal", "gap_target", "deterministic_limit", "wall_limit", "solver_failed")
LOAD_DEPENDENT = ("wall_limit", "solver_failed")  # answers that may differ under another load: not cached
# CP-SAT: one fixed seed, and with several workers the interleaved search, which is deterministic
# (for a fixed number of workers) when limited by deterministic time; HiGHS: one thread, one seed
SOLVER_SEED = 0
# the default work budget of one layer slice (deterministic seconds) and its wall-clock safety limit
DEFAULT_BUDGET = 10.0
DEFAULT_TIME_LIMIT_S = 300.0


def worst_stop(reasons: list[str]) -> str:
    """The most telling of several stop reasons (the later in ``STOP_REASONS``)."""
    return max(reasons, key=STOP_REASONS.index) if reasons else "closed_form"


def check_budget(name: str, value: float) -> float:
    """``value`` as a positive float (``math.inf`` allowed: no work limit, the wall clock alone)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of deterministic seconds, got {value!r}")
    return float(value)


class Allowance:
    """What is left of one solve's budget: ``work`` deterministic seconds and a wall-clock deadline.

    ``part`` carves out a sub-budget (a share of the work left, optionally capped); what a part
    spends is charged to every allowance above it. The wall deadline is shared by all parts: it is
    one safety limit for the whole slice, not something to divide."""

    def __init__(self, work: float, wall_s: float, *, deadline: float | None = None,
                 parent: Allowance | None = None) -> None:
        self.work = float(work)
        self.spent = 0.0
        self.deadline = time.perf_counter() + float(wall_s) if deadline is None else deadline
        self.parent = parent

    def work_left(self) -> float:
        return max(0.0, self.work - self.spent)

    def wall_left(self) -> float:
        return self.deadline - time.perf_counter()

    def stop(self) -> str | None:
        """``"wall_limit"`` or ``"deterministic_limit"`` when that limit has run out, else None."""
        if self.wall_left() <= 0:
            return "wall_limit"
        if self.work_left() <= 0:
            return "deterministic_limit"
        return None

    def spend(self, dtime: float) -> None:
        if not math.isfinite(dtime) or dtime < 0:
            dtime = 0.0
        self.spent += dtime
        if self.parent is not None:
            self.parent.spend(dtime)

    def part(self, share: float = 1.0, cap: float = math.inf) -> Allowance:
        """A sub-budget of ``min(share · work left, cap)`` deterministic seconds, the same deadline."""
        left = self.work_left()
        work = min(left * share if math.isfinite(left) else left, cap)
        return Allowance(work, 0.0, deadline=self.deadline, parent=self)
