"""One Tune trial = one or more architectures (``--archs-per-trial``), each evaluated for every
model of the search.

ILP schedule (default), per architecture: a ``prepare_task`` per model turns the architecture into
layer-slice ILP instances for every (microbatch, TMP width) from the search's shared graphs; slices
already in the search's schedule cache are taken from it, the rest are solved by ``solve_task``s
(spread over the cluster); the placement DP runs as one ``dp_task`` per microbatch. Sequential
schedule: one ``sequential_task`` evaluates all the trial's architectures (no ILP). The trial reports
after every architecture (at most every ``REPORT_EVERY_S`` for cheap sequential ones), so results
stream into the store and the searcher sees each value as soon as it exists.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray

from ..algorithms.solvers.placement import PlacementLayers
from ..algorithms.solvers.throughput import slice_report, slice_summary
from .evaluate import arch_columns, arch_key, expert_for, hbm_for, placement_row
from .settings import SearchSettings
from .tasks import dp_task, get, prepare_task, sequential_task, solve_task

METRIC = "throughput_avg"
FAULT_ENV = "ARCHPLACE_FAULT_INJECT"
SCHEDULES = ("ilp", "sequential")
REPORT_EVERY_S = 0.5
SOLVED_REPORT_EVERY_S = 2.0   # solved slices reach the driver's schedule cache at least this often
SOLVES_PER_TASK = 2       # layer slices per solve_task: few enough to spread, enough to amortise a task

__all__ = ["METRIC", "FAULT_ENV", "SCHEDULES", "SearchSettings", "arch_columns", "arch_key",
           "evaluate_architecture", "search_trainable"]


def _inject_fault(key: str, out_dir: str | None, spec: str = "", stage: str = "start") -> None:
    """Fault injection for tests and chaos runs: ``ARCHPLACE_FAULT_INJECT="fail:KEY"`` makes that
    architecture's evaluation always raise; ``"flaky:KEY:N"`` raises on its first N attempts
    (counted in ``OUT/.faults``); ``"slow:KEY:S"`` sleeps S seconds first. KEY ``*`` matches every
    architecture; ``"slowdp:KEY:S"`` sleeps S seconds after its layer ILPs, before the placement DP
    (a driver killed then must have the solved slices in its schedule cache). Several specs are
    separated by commas."""
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        if parts[1] not in (key, "*") or (parts[0] == "slowdp") != (stage == "dp"):
            continue
        if parts[0] == "slowdp":
            time.sleep(float(parts[2]))
        if parts[0] == "fail":
            raise RuntimeError(f"injected failure for architecture {key}")
        if parts[0] == "slow":
            time.sleep(float(parts[2]))
        if parts[0] == "flaky" and out_dir:
            marker = Path(out_dir) / ".faults" / key
            marker.parent.mkdir(parents=True, exist_ok=True)
            n = int(marker.read_text()) if marker.exists() else 0
            marker.write_text(str(n + 1))
            if n < int(parts[2]):
                raise RuntimeError(f"injected transient failure {n + 1}/{parts[2]} for architecture {key}")


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _as_completed(refs: list, what: str, timeout_s: float):
    """(index, value) of each ref as its task finishes, all within ``timeout_s`` (``tasks.get``'s
    one-line error otherwise)."""
    from .tasks import resources_line

    deadline = time.monotonic() + timeout_s
    index = {r: i for i, r in enumerate(refs)}
    waiting = list(refs)
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError(f"{what} did not finish within {timeout_s:.0f} s; {resources_line()}")
        for r in ready:
            yield index[r], ray.get(r)


def evaluate_architecture(acc, settings: SearchSettings, graphs: dict[tuple[str, int, int], Any],
                          cache: dict[str, list], timeout_s: float = 1800.0,
                          on_solved: Callable[[dict[str, list], bool], None] | None = None,
                          before_dp: Callable[[], None] | None = None
                          ) -> tuple[float, list[dict[str, Any]], dict[str, list]]:
    """(across-model average throughput, one row per model, newly solved slices {key: [makespan,
    status, gap, stopped_by, dtime]}) for one architecture under the ILP schedule, through Ray tasks.

    Counts in each row: ``ilp_lookups`` layer slices looked up; ``ilp_unique`` distinct slices of
    this architecture and model (lookups - unique is the de-duplication of repeated layers inside
    the architecture); ``cache_hits`` distinct slices answered without solving them in this trial
    (the search's schedule cache: earlier trials, resumed runs, or the worker's own memory);
    ``ilp_solved`` slices solved now; ``ilp_status`` (JSON: distinct slices per solver status),
    ``ilp_worst_gap`` (the largest proven relative gap; NaN when none is known), ``ilp_gap_unknown``
    (slices not proven optimal without a bound), ``ilp_stopped_by`` (JSON: distinct slices per stop
    reason), ``ilp_load_dependent`` (slices stopped by the wall-clock safety limit or a solver
    failure) and ``ilp_slices_json`` (per slice: pass, layers, status, gap, solver, stopped_by,
    dtime, microbatch, tmp).

    ``on_solved(slices, final)`` gets the slices solved by each task as it finishes, and
    ``final=True`` once the ILPs are done: the trial passes them on to the driver's schedule cache
    then, not only with the architecture's rows (a driver that died meanwhile lost them, issue 29).
    """
    common = arch_columns(acc)
    arch = acc.to_dict()
    ilp = settings.ilp_settings()
    t0 = time.perf_counter()
    preps = {m: prepare_task.remote(arch, settings.cases(m), settings.optimizer,
                                    settings.link_bw_bytes_per_s, ilp,
                                    *[graphs[(m, mbs, t)] for mbs, t in settings.cases(m)])
             for m in settings.models}
    preps = dict(zip(preps, get(list(preps.values()), f"estimates of {common['arch_key']}", timeout_s)))
    t_est = time.perf_counter()
    # distinct slices over every model and case of this architecture; cached ones are not solved
    problems: dict[str, Any] = {}
    for p in preps.values():
        for _, plan in p["cases"].values():
            problems.update(plan.problems)
    makespan = {k: float(cache[k][0]) for k in problems if k in cache}
    # each slice's solver status, gap, stop reason and deterministic time spent
    answer = {k: {"status": cache[k][1], "gap": cache[k][2], "stopped_by": cache[k][3], "dtime": cache[k][4]}
              for k in makespan}
    hits = set(makespan)
    todo = [(k, problems[k]) for k in problems if k not in makespan]
    solved: dict[str, list] = {}
    solve_s = 0.0
    if todo:
        refs = [solve_task.remote(chunk, ilp) for chunk in _chunks(todo, SOLVES_PER_TASK)]
        done: dict[int, list] = {}
        for i, res in _as_completed(refs, f"layer ILPs of {common['arch_key']}", timeout_s):
            done[i] = res
            if on_solved is not None:
                on_solved({r["key"]: [r["makespan_s"], r["status"], r.get("gap"), r["stopped_by"], r["dtime"]]
                           for r in res if r["solved"]}, False)
        for res in (done[i] for i in range(len(refs))):   # in submission order, as before
            for r in res:
                makespan[r["key"]] = r["makespan_s"]
                answer[r["key"]] = {"status": r["status"], "gap": r.get("gap"),  # peaks: None from the cache
                                    "stopped_by": r["stopped_by"], "dtime": r["dtime"],
                                    "peak_hbm_share": r.get("peak_hbm_share"),
                                    "peak_glb_share": r.get("peak_glb_share")}
                if r["solved"]:
                    solved[r["key"]] = [r["makespan_s"], r["status"], r.get("gap"), r["stopped_by"],
                                        r["dtime"]]
                    solve_s += r["solve_time_s"]
                else:
                    hits.add(r["key"])
    if on_solved is not None:
        on_solved({}, True)
    t_ilp = time.perf_counter()
    if before_dp is not None:
        before_dp()
    rows = []
    dp_refs = {}
    for m, p in preps.items():
        by_mbs: dict[int, dict[int, PlacementLayers]] = {}
        for (mbs, t), (base, plan) in p["cases"].items():
            fw, bw = plan.assemble(makespan)
            by_mbs.setdefault(mbs, {})[t] = dataclasses.replace(base, forward_s=fw, backward_s=bw)
        expert = expert_for(m, settings.num_devices)
        dp_refs[m] = (expert, [dp_task.remote(lys, settings.num_devices, settings.global_batch, mbs,
                                              hbm_for(acc, settings), settings.recompute,
                                              settings.link_bw_bytes_per_s, expert, settings.sync_model,
                                              settings.grad_reduce_dtype)
                               for mbs, lys in by_mbs.items()])
    for m, (expert, refs) in dp_refs.items():
        outs = get(refs, f"placement DP of {common['arch_key']} for {m}", timeout_s)
        plans = [plan for _, plan in preps[m]["cases"].values()]
        keys = set().union(*(plan.problems for plan in plans))
        # per slice its first and last layer and how many share it (the full list is place's), so a
        # row stays small in sweeps of many architectures
        slices = [{**e, "layers": e["layers"][:1] + e["layers"][1:][-1:], "num_layers": len(e["layers"]),
                   "microbatch": mbs, "tmp": t}
                  for (mbs, t), (_, plan) in preps[m]["cases"].items()
                  for e in slice_report(plan.keys, answer, plan.layers)]
        summ = slice_summary(slices)
        row = {**common, **placement_row(m, outs, expert), "schedule": "ilp",
               "ilp_status": json.dumps(summ["status_counts"], sort_keys=True),
               "ilp_worst_gap": math.nan if summ["worst_gap"] is None else float(summ["worst_gap"]),
               "ilp_gap_unknown": int(summ["gap_unknown"]),
               "ilp_stopped_by": json.dumps(summ["stopped_by"], sort_keys=True),
               "ilp_load_dependent": int(summ["load_dependent"]), "ilp_slices_json": json.dumps(slices),
               "estimate_s": float(preps[m]["estimate_s"]), "ilp_s": float(t_ilp - t_est),
               "ilp_lookups": int(sum(plan.lookups for plan in plans)), "ilp_unique": len(keys),
               "ilp_solved": len(keys & set(solved)), "cache_hits": len(keys & hits),
               "task_nodes": ",".join(sorted({o.get("node_id", "") for o in outs} - {""}))}
        row["total_s"] = time.perf_counter() - t0
        rows.append(row)
    avg = float(np.mean([r["throughput"] for r in rows]))
    return avg, rows, solved


def _indices(config: dict[str, Any], space) -> list[int]:
    from ..algorithms.search import nearest_index

    if "archs" in config:
        return [int(i) for i in config["archs"]]
    return [nearest_index(space, config)]


def search_trainable(config: dict[str, Any], settings_dict: dict[str, Any], graphs: dict, cache: dict,
                     out_dir: str, faults: str = "", timeout_s: float = 1800.0) -> None:
    """The Tune function trainable. ``graphs`` maps (model, microbatch, TMP width) to an object ref
    of the graph; ``cache`` is the schedule cache as the search started (``ScheduleCacheFile.load``);
    ``faults`` is the driver's ``ARCHPLACE_FAULT_INJECT`` (trial workers do not inherit its
    environment)."""
    from ray import tune

    from ..hardware.space import enumerate_space

    settings = SearchSettings.from_dict(settings_dict)
    space = enumerate_space(settings.space)
    indices = _indices(config, space)
    ctx = tune.get_context()
    here = {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
            "pid": os.getpid()}
    pending: list[tuple[int, float, list[dict[str, Any]]]] = []
    solved_all: dict[str, list] = {}
    last = time.monotonic()
    value = 0.0   # the metric of a report that carries solved slices only (no architecture finished)

    def emit(force: bool, every_s: float = REPORT_EVERY_S) -> None:
        nonlocal pending, solved_all, last, value
        if not (pending or solved_all) or not (force or time.monotonic() - last >= every_s):
            return
        rows = []
        for i, _, rs in pending:
            for r in rs:
                rows.append({**r, **here, "trial_id": ctx.get_trial_id(), "space_index": i})
        value = pending[-1][1] if pending else value
        tune.report({METRIC: value, "evaluated": [[i, v] for i, v, _ in pending],
                     "rows_json": json.dumps(rows), "solved_json": json.dumps(solved_all)})
        pending, solved_all, last = [], {}, time.monotonic()

    def on_solved(slices: dict[str, list], final: bool) -> None:
        solved_all.update(slices)
        emit(force=final, every_s=SOLVED_REPORT_EVERY_S)

    if settings.schedule == "sequential":
        accs = [space.accelerator(i) for i in indices]
        for acc in accs:
            _inject_fault(arch_key(acc), out_dir, faults)
        keys = settings.graph_keys()
        ref = sequential_task.remote([a.to_dict() for a in accs], settings_dict, keys,
                                     *[graphs[k] for k in keys])
        results = get(ref, f"sequential evaluation of {len(accs)} architecture(s)", timeout_s)
        for i, res in zip(indices, results):
            now = time.time()
            pending.append((i, res["value"], [{**r, "finished_at": now} for r in res["rows"]]))
        emit(force=True)
        return
    for i in indices:
        acc = space.accelerator(i)
        _inject_fault(arch_key(acc), out_dir, faults)
        key = arch_key(acc)
        avg, rows, _ = evaluate_architecture(
            acc, settings, graphs, cache, timeout_s, on_solved=on_solved,
            before_dp=lambda: _inject_fault(key, out_dir, faults, stage="dp"))  # noqa: B023 - called now
        now = time.time()
        pending.append((i, avg, [{**r, "finished_at": now} for r in rows]))
        emit(force=False)
    emit(force=True)
