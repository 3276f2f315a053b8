"""Load on the archplace service (``archplace serve``): ask/tell latency and throughput under 1, 16 and
64 concurrent clients, and managed-evaluation throughput, fresh and cached.

The bench starts the real service itself: an embedded Ray (``platform.search.connect(None)``, all the
machine's CPUs), Ray Serve on 127.0.0.1 with its defaults (one replica, 128 requests in flight, 512
queued), a SQLite database in a temporary directory, and token auth with one token. Clients are
threads in this process, each with its own ``archplace.client.Client`` (its own HTTP connection) and
its own ``client_id``, so client-side Python is part of what is measured, as it is for a user.

* **ask/tell**: for each level (1, 16, 64 clients) a fresh study (random searcher on the Phaze
  Table 1 space, bert-base) and a fixed number of rounds split evenly over the clients (default 384:
  384 suggests + 384 completes per level). A round is ``suggest(count=1)`` then ``complete`` with a
  closed-form value of the architecture. The latencies are per request as the client sees them
  (retries on 5xx included; their count is reported); requests/s is all requests of the level over
  its wall time, from a barrier that releases every client at once to the last client done. After
  each level the bench checks that no trial number and no architecture was handed out twice and
  that every completion is in the database with the value its client sent (counting the rows).
* **managed evaluation**: ``POST /v1/evaluations`` of bert-base on tpuv4 with the sequential layer
  schedule. First a warm-up, one evaluation per CPU, reported apart (each Ray worker captures the
  model graph once, ~15 s); then N distinct requests (different accelerator counts and global
  batches, so the result cache cannot answer) submitted at once and polled until all are done:
  evaluations/s and wall time. Then the same N requests again, several times: answered from the
  result cache, so this is the latency of the cached path (checked: ``cached`` and the same result).

    python bench/serve_load.py [--rounds 384] [--levels 1,16,64] [--evaluations 16]
                               [--max-ongoing-requests N] [--out FILE.json]

Run it on a quiet machine (``uptime`` load < 1.5): it takes about 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _meta import command, git_state, machine


def value(params: dict) -> float:
    """A stand-in measurement: exact, and different for different architectures."""
    return params["num_tc"] * params["pe_x"] * params["pe_y"] / params["area_mm2"] + params["num_vc"] * 1e-3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(tmp: Path, max_ongoing_requests: int | None):
    from archplace.platform.search import connect
    from archplace.service.auth import create_token
    from archplace.service.db import make_engine
    from archplace.service.deployment import ServeConfig, start

    connect(None)
    db = str(tmp / "service.db")
    engine = make_engine(db)
    token = create_token(engine, "bench")
    engine.dispose()
    cfg = ServeConfig(db=db, host="127.0.0.1", port=free_port(), auth="token")
    if max_ongoing_requests is not None:
        cfg = dataclasses.replace(cfg, max_ongoing_requests=max_ongoing_requests)
    return start(cfg), token, cfg


def client(url: str, token: str, retried: list[int] | None = None):
    """A Client whose 5xx answers (the 502/503/504 and proxy 500s it retries) count in ``retried[0]``."""
    from archplace.client import Client

    c = Client(url, token, retries=30)
    if retried is not None:
        send = c.session.request

        def counted(*a, **kw):
            r = send(*a, **kw)
            if r.status_code >= 500:
                retried[0] += 1
            return r

        c.session.request = counted
    return c


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def ask_tell(url: str, token: str, clients: int, rounds: int) -> dict:
    study = f"load-{clients}"
    admin = client(url, token)
    admin.create_study(name=study, models=["bert-base"], searcher="random", seed=clients)
    per = rounds // clients
    barrier = threading.Barrier(clients + 1)
    lock = threading.Lock()
    suggest_s: list[float] = []
    complete_s: list[float] = []
    received: list[tuple[int, int, float]] = []
    errors: list[str] = []
    retried = [0]

    def worker(k: int) -> None:
        mine = [0]
        cl = client(url, token, mine)
        s_s, c_s, got = [], [], []
        barrier.wait()
        try:
            for _ in range(per):
                t0 = time.perf_counter()
                trials = cl.suggest(study, count=1, client_id=f"client-{k}")
                t1 = time.perf_counter()
                if len(trials) != 1:
                    raise RuntimeError(f"suggest returned {len(trials)} trials")
                t = trials[0]
                v = value(t["params"])
                t2 = time.perf_counter()
                cl.complete(study, t["number"], value=v)
                t3 = time.perf_counter()
                s_s.append(t1 - t0)
                c_s.append(t3 - t2)
                got.append((t["number"], t["arch_index"], v))
        except Exception as e:  # noqa: BLE001 - reported and fails the bench below
            errors.append(repr(e))
        with lock:
            suggest_s.extend(s_s)
            complete_s.extend(c_s)
            received.extend(got)
            retried[0] += mine[0]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed at {clients} clients: {errors[:3]}")

    # no trial and no architecture twice; every completion stored with the value its client sent
    rows = {t["number"]: t for t in admin.trials(study)}
    stored = sum(1 for n, _, v in received if rows.get(n, {}).get("state") == "COMPLETED"
                 and rows[n]["value"] == v)
    verified = {"rounds": len(received), "rows": len(rows), "stored_as_sent": stored,
                "max_times_a_trial_was_handed_out": max(Counter(n for n, _, _ in received).values()),
                "max_times_an_architecture_was_handed_out": max(Counter(a for _, a, _ in received).values())}
    verified["ok"] = (len(received) == per * clients == len(rows) == stored
                      and verified["max_times_a_trial_was_handed_out"] == 1
                      and verified["max_times_an_architecture_was_handed_out"] == 1)
    n_req = len(suggest_s) + len(complete_s)
    return {"clients": clients, "rounds": per * clients, "requests": n_req, "wall_s": wall,
            "requests_per_s": n_req / wall, "rounds_per_s": per * clients / wall,
            "suggest_ms": {q: pct(suggest_s, p) for q, p in (("p50", 50), ("p99", 99), ("max", 100))},
            "complete_ms": {q: pct(complete_s, p) for q, p in (("p50", 50), ("p99", 99), ("max", 100))},
            "retried_5xx": retried[0], "verified": verified}


def wait_all(cl, ids: list[str], timeout_s: float = 600) -> tuple[dict[str, dict], float]:
    """Poll until every operation is done; returns them and when the last one was seen done."""
    done: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < len(ids):
        for i in ids:
            if i not in done:
                op = cl.operation(i)
                if op["done"]:
                    done[i] = op
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ids) - len(done)} evaluations not done after {timeout_s:.0f} s")
        if len(done) < len(ids):
            time.sleep(0.1)
    return done, time.perf_counter()


def evaluations(url: str, token: str, n: int, repeats: int) -> dict:
    import ray

    cl = client(url, token)
    cpus = int(ray.cluster_resources().get("CPU", 1))
    base = {"sequential": True}

    def submit(reqs: list[dict]) -> list[dict]:
        return [cl.evaluate("bert-base", "tpuv4", wait=False, **base, **r) for r in reqs]

    # warm-up: one evaluation per CPU, so every Ray worker has captured the model graph
    t0 = time.perf_counter()
    warm = submit([{"accelerators": 16 * (i + 1), "global_batch": 512} for i in range(cpus)])
    _, t_end = wait_all(cl, [o["id"] for o in warm])
    warm_wall = t_end - t0

    reqs = [{"accelerators": 32 * (i + 2), "global_batch": 1024 * (1 + i % 4)} for i in range(n)]
    t0 = time.perf_counter()
    ops = submit(reqs)
    t_submitted = time.perf_counter()
    done, t_end = wait_all(cl, [o["id"] for o in ops])
    wall = t_end - t0
    finals = [done[o["id"]] for o in ops]
    states = Counter(o["state"] for o in finals)
    if states != Counter({"DONE": n}) or any(o["cached"] for o in finals):
        raise RuntimeError(f"fresh evaluations: states {dict(states)}, "
                           f"cached {[o['cached'] for o in finals]}")
    run_s = [o["updated_at"] - o["created_at"] for o in finals]
    feasible = sum(bool(o["result"]["placement"]["feasible"]) for o in finals)

    # the cached path: the same requests again
    lat, mismatched = [], 0
    for _ in range(repeats):
        for r, first in zip(reqs, finals, strict=True):
            t = time.perf_counter()
            op = cl.evaluate("bert-base", "tpuv4", wait=False, **base, **r)
            lat.append(time.perf_counter() - t)
            mismatched += not (op["done"] and op["cached"] and op["result"] == first["result"])
    if mismatched:
        raise RuntimeError(f"{mismatched} repeated evaluations were not answered from the cache")
    return {"model": "bert-base", "arch": "tpuv4", "sequential": True, "cpus": cpus,
            "warmup": {"evaluations": cpus, "wall_s": warm_wall},
            "fresh": {"evaluations": n, "submit_s": t_submitted - t0, "wall_s": wall,
                      "evaluations_per_s": n / wall, "feasible": feasible,
                      "server_time_s": {"p50": float(np.median(run_s)), "max": float(max(run_s))},
                      "requests": reqs},
            "cached": {"requests": len(lat), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                       "max_ms": pct(lat, 100), "requests_per_s": len(lat) / sum(lat)}}


def print_evaluations(evals: dict) -> None:
    f, c = evals["fresh"], evals["cached"]
    print(f"\nmanaged evaluation: bert-base on tpuv4, sequential schedule, {evals['cpus']} CPUs")
    print(f"  warm-up: {evals['warmup']['evaluations']} evaluations in {evals['warmup']['wall_s']:.1f} s "
          "(model graph capture in each worker)")
    print(f"  {f['evaluations']} distinct evaluations submitted at once ({f['submit_s'] * 1e3:.0f} ms to "
          f"submit): all done in {f['wall_s']:.1f} s = {f['evaluations_per_s']:.2f} evaluations/s "
          f"({f['feasible']} feasible; per operation p50 {f['server_time_s']['p50']:.1f} s "
          "from creation to done)")
    print(f"  cached: {c['requests']} repeated requests answered at once: p50 {c['p50_ms']:.1f} ms, "
          f"p99 {c['p99_ms']:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=384,
                    help="ask/tell rounds per level (split evenly over the clients)")
    ap.add_argument("--levels", default="1,16,64", help="concurrent clients per level")
    ap.add_argument("--evaluations", type=int, default=16, help="distinct managed evaluations (0: none)")
    ap.add_argument("--cached-repeats", type=int, default=5, help="times the cached requests are repeated")
    ap.add_argument("--max-ongoing-requests", type=int, default=None,
                    help="the replica's concurrent requests (default: ServeConfig's)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve_load.json"))
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if any(args.rounds % c for c in levels):
        ap.error(f"--rounds {args.rounds} must be a multiple of every level {levels}")

    import ray
    from ray import serve

    load_before = os.getloadavg()
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        url, token, cfg = start_service(Path(tmp), args.max_ongoing_requests)
        try:
            warm = client(url, token)       # first requests (connections, code paths): not measured
            warm.create_study(name="warmup", models=["bert-base"], searcher="random")
            for _ in range(10):
                t = warm.suggest("warmup", client_id="w")[0]
                warm.complete("warmup", t["number"], value=value(t["params"]))
            levels_out = [ask_tell(url, token, c, args.rounds) for c in levels]
            evals = (evaluations(url, token, args.evaluations, args.cached_repeats)
                     if args.evaluations else None)
        finally:
            serve.shutdown()
            ray.shutdown()
    total = time.perf_counter() - t_all

    print(f"ask/tell: random searcher, one study per level, {args.rounds} rounds "
          f"({2 * args.rounds} requests) per level")
    print(f"{'clients':>7s} {'suggest p50':>11s} {'p99':>7s} {'complete p50':>12s} {'p99':>7s} {'req/s':>7s} "
          f"{'wall s':>6s} {'5xx':>5s}  verified")
    for r in levels_out:
        print(f"{r['clients']:7d} {r['suggest_ms']['p50']:9.1f}ms {r['suggest_ms']['p99']:5.1f}ms "
              f"{r['complete_ms']['p50']:10.1f}ms {r['complete_ms']['p99']:5.1f}ms "
              f"{r['requests_per_s']:7.1f} "
              f"{r['wall_s']:6.1f} {r['retried_5xx']:5d}  {r['verified']['ok']} "
              f"({r['verified']['rows']} rows, {r['verified']['stored_as_sent']} as sent)")
    if evals:
        print_evaluations(evals)
    print(f"\ntotal {total:.0f} s")

    ok = all(r["verified"]["ok"] for r in levels_out)
    out = {"bench": "serve_load", "git": git_state(), "command": command(), "machine": machine(load_before),
           "service": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("db", "port")}
           | {"db": "sqlite"},
           "rounds_per_level": args.rounds, "ask_tell": levels_out, "evaluations": evals,
           "verified": ok, "total_s": total}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
