"""Actor pools shared by every trial of a search: simulator actors (graphs + latency estimates),
solver actors (layer-schedule ILPs) and one schedule cache, plus the DP as plain Ray tasks.

Why this shape:
- Graphs depend only on (model, microbatch, TMP width), never on the architecture, so each
  simulator actor keeps the graphs it has built and a trial only ships an architecture to it.
- A layer slice's ILP is keyed by ``schedule_cache_key`` (ops, latencies, core counts, settings).
  Keys are routed to a fixed solver actor (key hash modulo pool size) and every solver actor
  consults the one ``ScheduleCache`` actor before solving, so a slice solved once is never solved
  again by any trial, even one that asked for it concurrently (the actor serialises its calls).
- Actors are named (``{prefix}-solver-{i}``) and detached, so that one re-created by a trial
  outlives that trial; the driver kills them when the search ends (and ``--resume`` kills those a
  killed driver left behind). A caller that finds one dead re-creates it under the
  same name (``get_if_exists``) and resends the request, so killing an actor mid-search costs a
  re-solve at most, never the search. The cache lives in its own actor and survives that.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

NAMESPACE = "archplace"
# logical CPU shares: W trials + W solvers + W simulators (0.8 W) leave 0.2 W for the DP tasks
TRIAL_CPUS = 0.2
SOLVER_CPUS = 0.4
SIMULATOR_CPUS = 0.2
DP_CPUS = 0.2
_DEAD = (RayActorError, ActorDiedError, ActorUnavailableError)


def _stable_hash(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@ray.remote(num_cpus=0)
class ScheduleCache:
    """Makespans of solved layer slices by cache key (and how often each was asked for)."""

    def __init__(self) -> None:
        self._makespan: dict[str, float] = {}
        self._status: dict[str, str] = {}
        self._starts: dict[str, int] = {}
        self.lookups = 0
        self.hits = 0

    def register(self, name: str) -> None:
        """A solver actor started (again, if it was killed): counted per name."""
        self._starts[name] = self._starts.get(name, 0) + 1

    def get_many(self, keys: list[str]) -> dict[str, float]:
        self.lookups += len(keys)
        out = {k: self._makespan[k] for k in keys if k in self._makespan}
        self.hits += len(out)
        return out

    def put(self, key: str, makespan_s: float, status: str) -> None:
        self._makespan[key] = float(makespan_s)
        self._status[key] = status

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._makespan), "lookups": self.lookups, "hits": self.hits,
                "solver_starts": sum(self._starts.values()),
                "solver_restarts": sum(n - 1 for n in self._starts.values())}


@ray.remote
class SolverActor:
    """Solves layer-slice ILPs one at a time (CP-SAT with one worker: the pool is the parallelism)."""

    def __init__(self, pools: Pools) -> None:
        self._pools = pools
        self.solved = 0
        ray.get(pools.cache().register.remote(ray.get_runtime_context().get_actor_name() or "?"))

    def solve(self, key: str, problem: Any, settings: dict[str, Any]) -> dict[str, Any]:
        from ..algorithms.solvers.layer_ilp import solve_layer

        cache = self._pools.cache()  # by name: a re-created cache is found too
        hit = ray.get(cache.get_many.remote([key])).get(key)
        if hit is not None:
            return {"makespan_s": hit, "solved": False, "solve_time_s": 0.0}
        s = solve_layer(problem, num_workers=1, **settings)
        self.solved += 1
        cache.put.remote(key, s.makespan_s, s.status)
        return {"makespan_s": s.makespan_s, "solved": not s.from_cache, "solve_time_s": s.solve_time_s,
                "status": s.status}

    def where(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


@ray.remote
class SimulatorActor:
    """Builds operator graphs once and turns (architecture, graph) into ILP instances and the DP's
    per-layer memory and traffic (everything that needs the graph stays on this actor)."""

    def __init__(self, max_graphs: int = 64) -> None:
        self._graphs: dict[tuple, Any] = {}
        self._max = max_graphs

    def _graph(self, model: str, seq: int | None, mbs: int, tmp: int):
        from ..workloads.models import build_graph

        key = (model, seq, mbs, tmp)
        if key not in self._graphs:
            if len(self._graphs) >= self._max:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = build_graph(model, seq=seq, mbs=mbs, tmp=tmp)
        return self._graphs[key]

    def prepare(self, model: str, arch: dict[str, Any], cases: list[tuple[int, int]], seq: int | None,
                optimizer: str, link_bw: float, ilp_settings: dict[str, Any]) -> dict[str, Any]:
        """For each (microbatch, TMP width): the layer plan (unique ILP instances) and the DP input
        with sequential layer times. Graph building and estimation times are returned separately."""
        from ..algorithms.solvers.layer_ilp import plan_layer_schedules
        from ..algorithms.solvers.throughput import placement_layers
        from ..hardware.accelerator import Accelerator
        from ..simulators.estimate import estimate_graph

        acc = Accelerator.from_dict(arch)
        out: dict[str, Any] = {"cases": {}, "graph_s": 0.0, "estimate_s": 0.0}
        for mbs, t in cases:
            t0 = time.perf_counter()
            g = self._graph(model, seq, mbs, t)
            t1 = time.perf_counter()
            est = estimate_graph(g, acc, link_bw=link_bw)
            base = placement_layers(g, est.single_s, est.all_s, sequential=True, optimizer=optimizer)
            plan = plan_layer_schedules(g, est.single_s, est.all_s, acc.num_tc, acc.num_vc, **ilp_settings)
            out["graph_s"] += t1 - t0
            out["estimate_s"] += time.perf_counter() - t1
            out["cases"][(mbs, t)] = (base, plan)
        return out


@ray.remote(num_cpus=DP_CPUS)
def dp_sweep(layers_by_t: dict[int, Any], num_devices: int, global_batch: int, mbs: int,
             hbm_gb: tuple[float, ...], recompute: tuple[bool, ...], link_bw: float,
             expert_pdt: tuple[int, int, int] | None) -> dict[str, Any]:
    """The placement DP for one microbatch size over HBM sizes and recomputation, and the expert
    strategy's throughput when one is given (a Ray task: stateless, retried on worker failure)."""
    from ..algorithms.solvers.placement import expert_placement
    from ..algorithms.solvers.throughput import sweep

    t0 = time.perf_counter()
    best, rows = sweep({mbs: layers_by_t}, num_devices, global_batch, hbm_gb, recompute, link_bw)
    expert = None
    if expert_pdt is not None and expert_pdt[2] in layers_by_t:
        p, d, t = expert_pdt

        def ev(lys, setup):
            return expert_placement(lys[t], setup, p, d)

        expert, _ = sweep({mbs: layers_by_t}, num_devices, global_batch, hbm_gb, recompute, link_bw, ev)
    return {"best": best, "rows": rows, "expert": expert, "dp_s": time.perf_counter() - t0}


@dataclass(frozen=True)
class Pools:
    """Names and sizes of one search's actors (handles are looked up by name, so a trial process
    and a re-created actor agree without passing handles around)."""

    prefix: str
    num_solvers: int
    num_simulators: int

    @property
    def cache_name(self) -> str:
        return f"{self.prefix}-cache"

    def solver_name(self, i: int) -> str:
        return f"{self.prefix}-solver-{i}"

    def simulator_name(self, i: int) -> str:
        return f"{self.prefix}-simulator-{i}"

    # ------------------------------------------------------------------ creation / lookup
    def cache(self):
        return ScheduleCache.options(name=self.cache_name, namespace=NAMESPACE, get_if_exists=True,
                                     lifetime="detached", scheduling_strategy="DEFAULT").remote()

    def solver(self, i: int):
        return SolverActor.options(name=self.solver_name(i), namespace=NAMESPACE, get_if_exists=True,
                                   lifetime="detached", num_cpus=SOLVER_CPUS, scheduling_strategy="SPREAD",
                                   max_concurrency=1).remote(self)

    def simulator(self, i: int):
        return SimulatorActor.options(name=self.simulator_name(i), namespace=NAMESPACE, get_if_exists=True,
                                      lifetime="detached", num_cpus=SIMULATOR_CPUS,
                                      scheduling_strategy="SPREAD").remote()

    def start(self) -> dict[str, Any]:
        """Create every actor and wait until they are up; returns where each one runs."""
        ray.get(self.cache().__ray_ready__.remote())
        for i in range(self.num_solvers):
            self.solver(i)
        for i in range(self.num_simulators):
            self.simulator(i)
        where = [call_with_restart(self, "solver", i, "where")[0] for i in range(self.num_solvers)]
        for i in range(self.num_simulators):
            call_with_restart(self, "simulator", i, "__ray_ready__")
        return {"solvers": where}

    def stop(self, max_index: int | None = None) -> None:
        """Kill this search's actors (``max_index`` covers pools that were larger)."""
        n_sol = max(self.num_solvers, max_index or 0)
        n_sim = max(self.num_simulators, max_index or 0)
        names = ([self.solver_name(i) for i in range(n_sol)]
                 + [self.simulator_name(i) for i in range(n_sim)] + [self.cache_name])
        for n in names:
            try:
                ray.kill(ray.get_actor(n, namespace=NAMESPACE))
            except ValueError:
                pass

    def cache_stats(self) -> dict[str, int]:
        return ray.get(self.cache().stats.remote())


def call_with_restart(pools: Pools, kind: str, index: int, method: str, *args: Any,
                      retries: int = 3) -> tuple[Any, int]:
    """``actor.method(*args)`` on the named pool actor, re-creating it and resending when it died.
    Returns (result, number of restarts it took)."""
    get = pools.solver if kind == "solver" else pools.simulator
    restarts = 0
    while True:
        actor = get(index)
        try:
            return ray.get(getattr(actor, method).remote(*args)), restarts
        except _DEAD:
            if restarts >= retries:
                raise
            restarts += 1
            time.sleep(0.2 * restarts)


def solve_unique(pools: Pools, problems: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Makespans for every key in ``problems``: cache hits first, the rest on the solver pool
    (requests to one actor are pipelined; a dead actor is re-created and its requests resent)."""
    keys = list(problems)
    out: dict[str, Any] = {"makespan_s": {}, "solved": 0, "cache_hits": 0, "solve_time_s": 0.0,
                           "restarts": 0}
    if not keys:
        return out
    hits = ray.get(pools.cache().get_many.remote(keys))
    out["makespan_s"].update(hits)
    out["cache_hits"] += len(hits)
    todo = [k for k in keys if k not in hits]
    attempt = 0
    while todo:
        route = {k: _stable_hash(k) % pools.num_solvers for k in todo}
        handles = {i: pools.solver(i) for i in set(route.values())}
        refs = {handles[route[k]].solve.remote(k, problems[k], settings): k for k in todo}
        failed = []
        for ref, k in refs.items():
            try:
                r = ray.get(ref)
            except _DEAD:
                failed.append(k)
                continue
            out["makespan_s"][k] = r["makespan_s"]
            if r["solved"]:
                out["solved"] += 1
                out["solve_time_s"] += r["solve_time_s"]
            else:
                out["cache_hits"] += 1
        if failed:
            attempt += 1
            out["restarts"] += 1
            if attempt > 3:
                raise RuntimeError(f"solver actors kept dying; {len(failed)} layer slice(s) unsolved")
            time.sleep(0.2 * attempt)
        todo = failed
    return out


def where_am_i() -> dict[str, Any]:
    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "hostname": socket.gethostname(), "pid": os.getpid()}
