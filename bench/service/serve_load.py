"""Load on the archplace service (``archplace serve``): ask/tell latency and throughput at 1, 16 and
64 concurrent clients, with 1 and 2 replicas, on SQLite and on PostgreSQL, against Optuna's RDB
storage on the same databases as the anchor; and managed-evaluation throughput, fresh and cached.

The bench starts everything itself: an embedded Ray (``platform.search.connect(None)``, all the
machine's CPUs), a real PostgreSQL server (``tests/pg_util.py``: ``initdb`` in a temporary directory,
127.0.0.1 only, PostgreSQL's default durability: ``fsync`` and ``synchronous_commit`` on), and for each
configuration Ray Serve on 127.0.0.1 (``ServeConfig`` defaults: 128 requests in flight per replica,
512 queued) over a fresh database, with token auth. Clients are threads in this process, each with its
own ``archplace.client.Client`` (its own HTTP connection) and ``client_id``, so client-side Python is
part of what is measured, as it is for a user.

* **configurations**: ``sqlite-1``, ``sqlite-2``, ``postgresql-1``, ``postgresql-2`` (database and
  replicas). SQLite is the service's file in WAL mode with ``synchronous=NORMAL`` (durable across a
  process crash, not a power cut), as ``archplace serve`` makes it.
* **ask/tell**: for each level (1, 16, 64 clients) a fresh study (random searcher on the Phaze Table 1
  space, bert-base) and a fixed number of rounds split evenly over the clients (default 384: 384
  suggests + 384 completes per level). A round is ``suggest(count=1)`` then ``complete`` with a
  closed-form value of the architecture. Latencies are per request as the client sees them (retries
  on 5xx included; their count is reported); requests/s is all requests of the level over its wall
  time, from a barrier that releases every client at once to the last client done. After each level
  the bench checks that no trial number and no architecture was handed out twice and that every
  completion is in the database with the value its client sent.
* **Optuna anchor**: the same levels and rounds with Optuna's ``RDBStorage`` in this process (a thread
  per client, as Optuna's ``n_jobs``): ``study.ask`` with one integer parameter over the same space
  size, then ``study.tell``. On SQLite the storage's connections get the service's settings (WAL,
  ``synchronous=NORMAL``, 30 s busy timeout) and its pool size; on PostgreSQL it uses the same server.
  No HTTP, no Serve: the cost of the database round trips alone, which the service adds to.
* **CPU**: over each 64-client level, CPU seconds by process (this process = the clients; Serve's
  proxy, controller and each replica; the PostgreSQL server) and the machine's total busy time, so a
  reader sees where two cores went.
* **profile** (``--profile``): py-spy samples one replica during each 64-client level of a
  two-replica configuration; the JSON keeps the top functions by own time and by package.
* **managed evaluation** (first configuration only): ``POST /v1/evaluations`` of bert-base on tpuv4
  with the sequential layer schedule, a warm-up of one evaluation per CPU (each Ray worker captures
  the model graph once), then N distinct requests at once, polled until done; then the same requests
  again, answered from the result cache.

    python bench/service/serve_load.py [--quick] [--configs sqlite-1,sqlite-2,postgresql-1,postgresql-2]
                               [--rounds 384] [--levels 1,16,64] [--evaluations 16] [--profile]
                               [--no-optuna] [--out FILE.json]

The full run takes about 6-8 minutes on an idle 2-core machine; ``--quick`` (1 and 16 clients, 64
rounds, no evaluations) about 2. Run it on a quiet machine (``uptime`` load < 1.5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# this checkout's archplace, in this process and in Ray's workers (the Serve replicas), not another
# checkout's editable install; and pg_util, the tests' PostgreSQL
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

CONFIGS = {"sqlite-1": ("sqlite", 1), "sqlite-2": ("sqlite", 2),
           "postgresql-1": ("postgresql", 1), "postgresql-2": ("postgresql", 2)}


def value(params: dict) -> float:
    """A stand-in measurement: exact, and different for different architectures."""
    return params["num_tc"] * params["pe_x"] * params["pe_y"] / params["area_mm2"] + params["num_vc"] * 1e-3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(db: str, replicas: int, max_ongoing_requests: int | None):
    """Serve over ``db`` (a fresh database); returns the URL, a token and the config."""
    from archplace.service.auth import create_token
    from archplace.service.db import make_engine
    from archplace.service.deployment import ServeConfig, start

    engine = make_engine(db)
    token = create_token(engine, "bench")
    engine.dispose()
    cfg = ServeConfig(db=db, host="127.0.0.1", port=free_port(), auth="token", replicas=replicas)
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
    return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else float("nan")


def stats(xs: list[float]) -> dict:
    return {q: pct(xs, p) for q, p in (("p50", 50), ("p99", 99), ("max", 100))}


def run_threads(clients: int, work) -> float:
    """``work(k)`` in ``clients`` threads released together; the wall time to the last one done."""
    barrier = threading.Barrier(clients + 1)

    def body(k: int) -> None:
        barrier.wait()
        work(k)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------- CPU by process
def serve_pids() -> dict[str, int]:
    """The pids of Serve's actors (proxy, controller, replicas), asked of the actors themselves."""
    import ray

    out: dict[str, int] = {}
    replicas = 0
    for a in sorted(ray.util.list_named_actors(all_namespaces=True), key=lambda a: a["name"]):
        if a.get("namespace") != "serve":
            continue
        name = a["name"]
        h = ray.get_actor(name, namespace="serve")
        pid = ray.get(h.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
        if "REPLICA" in name:
            out[f"replica-{replicas}"] = pid
            replicas += 1
        elif "PROXY" in name:
            out["proxy"] = pid
        elif "CONTROLLER" in name:
            out["controller"] = pid
    return out


def _cpu_s(pid: int, children: bool = False) -> float:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)] if children else [p]
        return sum(sum(q.cpu_times()[:2]) for q in procs if q.is_running())
    except psutil.Error:
        return 0.0


class CpuMeter:
    """CPU seconds of named processes and of the whole machine between ``start`` and ``stop``.
    PostgreSQL's backends come and go: its CPU is its postmaster's children, sampled at both ends.
    With ``pg``, also the server's WAL flushes (``pg_stat_wal``, timed: ``track_wal_io_timing``):
    every commit waits for one unless ``synchronous_commit`` is off."""

    def __init__(self, pids: dict[str, int], pg_pid: int | None, pg=None) -> None:
        self.pids, self.pg_pid, self.pg = pids, pg_pid, pg

    def _sample(self) -> dict[str, float]:
        import psutil

        s = {k: _cpu_s(p) for k, p in self.pids.items()}
        s["clients (bench process)"] = _cpu_s(os.getpid())
        if self.pg_pid:
            s["postgresql"] = _cpu_s(self.pg_pid, children=True)
        t = psutil.cpu_times()
        s["machine busy"] = t.user + t.system + t.nice + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
        return s

    def _wal(self) -> dict[str, float] | None:
        if self.pg is None:
            return None
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.pg.port, user="archplace", password=self.pg.password,
                             dbname="postgres", autocommit=True) as conn:
            row = conn.execute("SELECT wal_records, wal_sync, wal_sync_time, wal_write, wal_write_time "
                               "FROM pg_stat_wal").fetchone()
        return dict(zip(("records", "syncs", "sync_ms", "writes", "write_ms"), map(float, row)))

    def start(self) -> None:
        self.w0 = self._wal()
        self.t0, self.s0 = time.perf_counter(), self._sample()

    def stop(self) -> dict:
        s1, wall = self._sample(), time.perf_counter() - self.t0
        cpu = {k: round(max(s1[k] - self.s0.get(k, 0.0), 0.0), 2) for k in s1}
        out = {"wall_s": round(wall, 2), "cpu_s": cpu,
               "machine_cores_busy": round(cpu["machine busy"] / wall, 2)}
        if self.pg is not None:
            time.sleep(1.2)  # backends publish their WAL statistics at most once a second
            w1 = self._wal()
            d = {k: w1[k] - self.w0[k] for k in w1}
            out["postgresql_wal"] = {"records": d["records"], "syncs": d["syncs"],
                                     "sync_ms_total": round(d["sync_ms"], 1),
                                     "sync_ms_per_sync": (round(d["sync_ms"] / d["syncs"], 2)
                                                          if d["syncs"] else None),
                                     "write_ms_total": round(d["write_ms"], 1)}
        return out


def pg_postmaster_pid(server) -> int | None:
    try:
        return int((server.data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# ---------------------------------------------------------------------- py-spy
def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


class Profiler:
    """py-spy on one process for as long as it runs (``record`` until SIGINT), raw collapsed stacks."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen([py_spy(), "record", "-p", str(pid), "-r", "100", "--gil", "-f", "raw",
                                      "-o", str(out)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out.exists():
            return {"error": (err or b"").decode(errors="replace").strip()[-500:]}
        return summarize_stacks(self.out.read_text())


def _package(frame: str) -> str:
    """'func (pkg/sub/mod.py:12)' -> 'pkg' ('archplace.service.studies' for ours); py-spy prints paths
    relative to the entry of sys.path they came from, so a bare file name is the standard library."""
    path = frame[frame.rfind("(") + 1:].rsplit(":", 1)[0]
    parts = Path(path).parts
    if "archplace" in parts:
        i = len(parts) - 1 - parts[::-1].index("archplace")
        return ".".join(parts[i:]).removesuffix(".py")
    if path.startswith("<"):
        return "python stdlib"
    return parts[0].removesuffix(".py") if len(parts) > 1 else "python stdlib"


def summarize_stacks(raw: str, top: int = 15) -> dict:
    own: Counter = Counter()
    by_pkg: Counter = Counter()
    incl: Counter = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        by_pkg[_package(frames[-1])] += n
        for f in {f for f in frames if "archplace" in f or "sqlalchemy/engine/base.py" in f}:
            incl[f] += n
    share = (lambda c: [[k, round(v / total, 4)] for k, v in c.most_common(top)]) if total else (lambda c: [])
    return {"samples": total, "own_time_by_package": share(by_pkg), "own_time_by_function": share(own),
            "inclusive_archplace_functions": share(incl)}


# ---------------------------------------------------------------------- ask/tell on the service
def ask_tell(url: str, token: str, clients: int, rounds: int, tag: str) -> dict:
    study = f"load_{tag}_{clients}"
    admin = client(url, token)
    admin.create_study(name=study, models=["bert-base"], searcher="random", seed=clients)
    per = rounds // clients
    lock = threading.Lock()
    suggest_s: list[float] = []
    first_s: list[float] = []    # each client's first suggest: all arrive at once on a fresh study
    later_s: list[float] = []
    complete_s: list[float] = []
    received: list[tuple[int, int, float]] = []
    errors: list[str] = []
    retried = [0]

    def worker(k: int) -> None:
        mine = [0]
        cl = client(url, token, mine)
        s_s, c_s, got = [], [], []
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
            first_s.extend(s_s[:1])
            later_s.extend(s_s[1:])
            complete_s.extend(c_s)
            received.extend(got)
            retried[0] += mine[0]

    wall = run_threads(clients, worker)
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed at {clients} clients: {errors[:3]}")
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
            "suggest_ms": stats(suggest_s), "complete_ms": stats(complete_s),
            # the burst at the start (every client's first suggest at once, on a study no replica has
            # a searcher for yet) apart from the steady state after it
            "suggest_first_round_ms": stats(first_s),
            "suggest_later_rounds_ms": stats(later_s),
            "retried_5xx": retried[0], "verified": verified}


# ---------------------------------------------------------------------- the Optuna anchor
def optuna_storage(backend: str, where):
    """Optuna's RDBStorage with the service's settings: on SQLite its connections get the same pragmas
    (WAL, synchronous=NORMAL, 30 s busy timeout) and the same pool; on PostgreSQL the same server."""
    import optuna

    pool = {"pool_size": 8, "max_overflow": 32}
    if backend == "sqlite":
        path = str(where)

        def connect():
            c = sqlite3.connect(path, timeout=30, check_same_thread=False)
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=30000"):
                c.execute(f"PRAGMA {pragma}")
            return c

        return optuna.storages.RDBStorage(f"sqlite:///{path}", engine_kwargs={"creator": connect, **pool})
    return optuna.storages.RDBStorage(where, engine_kwargs={"pool_pre_ping": True, **pool})


def optuna_ask_tell(storage, clients: int, rounds: int, space_size: int) -> dict:
    import optuna
    from optuna.distributions import IntDistribution

    name = f"load_{clients}"
    optuna.create_study(study_name=name, storage=storage, direction="maximize",
                        sampler=optuna.samplers.RandomSampler(seed=clients))
    per = rounds // clients
    dist = {"arch_index": IntDistribution(0, space_size - 1)}
    lock = threading.Lock()
    ask_s: list[float] = []
    tell_s: list[float] = []
    sent: dict[int, float] = {}
    errors: list[str] = []

    def worker(k: int) -> None:
        study = optuna.load_study(study_name=name, storage=storage,
                                  sampler=optuna.samplers.RandomSampler(seed=1000 * clients + k))
        a_s, t_s, got = [], [], {}
        try:
            for _ in range(per):
                t0 = time.perf_counter()
                trial = study.ask(dist)
                t1 = time.perf_counter()
                v = float(trial.params["arch_index"]) * 1e-3 + trial.number
                t2 = time.perf_counter()
                study.tell(trial, v)
                t3 = time.perf_counter()
                a_s.append(t1 - t0)
                t_s.append(t3 - t2)
                got[trial._trial_id] = v
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(repr(e)[:300])
        with lock:
            ask_s.extend(a_s)
            tell_s.extend(t_s)
            sent.update(got)

    wall = run_threads(clients, worker)
    done = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    stored = sum(1 for t in done if t.state == optuna.trial.TrialState.COMPLETE
                 and sent.get(t._trial_id) == t.value)
    n_req = len(ask_s) + len(tell_s)
    return {"clients": clients, "rounds": len(tell_s), "requests": n_req, "wall_s": wall,
            "requests_per_s": n_req / wall, "ask_ms": stats(ask_s), "tell_ms": stats(tell_s),
            "errors": len(errors), "first_errors": errors[:3],
            "verified": {"trials": len(done), "stored_as_sent": stored,
                         "ok": not errors and stored == len(sent) == per * clients}}


# ---------------------------------------------------------------------- managed evaluation
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


# ---------------------------------------------------------------------- one configuration
def run_config(name: str, db: str, args, levels: list[int], pg, prof_dir: Path | None,
               with_evaluations: bool) -> dict:
    from ray import serve

    backend, replicas = CONFIGS[name]
    t0 = time.perf_counter()
    url, token, cfg = deploy(db, replicas, args.max_ongoing_requests)
    started = time.perf_counter() - t0
    out: dict = {"config": name, "db": backend, "replicas": replicas, "start_s": started}
    try:
        warm = client(url, token)  # first requests (connections, code paths, every replica): not measured
        warm.create_study(name="warmup", models=["bert-base"], searcher="random")
        for i in range(10 * replicas):
            t = warm.suggest("warmup", client_id=f"w{i}")[0]
            warm.complete("warmup", t["number"], value=value(t["params"]))
        pids = serve_pids()
        out["ask_tell"] = []
        for c in levels:
            meter = CpuMeter(pids, pg_postmaster_pid(pg) if pg else None, pg) if c == max(levels) else None
            prof = None
            if meter:
                meter.start()
                if prof_dir is not None and replicas > 1 and "replica-0" in pids:
                    prof = Profiler(pids["replica-0"], prof_dir / f"{name}-replica-0.txt")
            r = ask_tell(url, token, c, args.rounds, name.replace("-", "_"))
            if meter:
                r["cpu"] = meter.stop()
                # the cost of one request in each process: load on the machine stretches wall times,
                # much less these; two cores give at most 2000 ms of CPU per second
                r["cpu"]["ms_per_request"] = {k: round(1e3 * v / r["requests"], 2)
                                              for k, v in r["cpu"]["cpu_s"].items() if k != "machine busy"}
            if prof:
                r["profile_replica_0"] = prof.stop()
            out["ask_tell"].append(r)
            print(f"  {name} {c:3d} clients: {r['requests_per_s']:6.1f} req/s, suggest p50/p99 "
                  f"{r['suggest_ms']['p50']:.0f}/{r['suggest_ms']['p99']:.0f} ms (first round "
                  f"{r['suggest_first_round_ms']['p99']:.0f}, later "
                  f"{r['suggest_later_rounds_ms']['p99']:.0f}), verified "
                  f"{r['verified']['ok']}", flush=True)
        out["evaluations"] = (evaluations(url, token, args.evaluations, args.cached_repeats)
                              if with_evaluations else None)
        out["service"] = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("db", "port")}
    finally:
        serve.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 and 16 clients, 64 rounds, no managed evaluation (~2 min)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"any of {list(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=None,
                    help="ask/tell rounds per level, split evenly over the clients (default 384; quick 64)")
    ap.add_argument("--levels", default=None,
                    help="concurrent clients per level (default 1,16,64; quick 1,16)")
    ap.add_argument("--evaluations", type=int, default=None,
                    help="distinct managed evaluations on the first configuration (default 16; quick 0)")
    ap.add_argument("--cached-repeats", type=int, default=5, help="times the cached requests are repeated")
    ap.add_argument("--max-ongoing-requests", type=int, default=None,
                    help="each replica's concurrent requests (default: ServeConfig's)")
    ap.add_argument("--pg-synchronous-commit", choices=("on", "off"), default="on",
                    help="PostgreSQL's synchronous_commit (on, its default: each commit waits for its WAL "
                         "flush; off: as SQLite's synchronous=NORMAL, a crash of the machine may lose the "
                         "last commits but never corrupts)")
    ap.add_argument("--no-optuna", action="store_true", help="skip the Optuna RDBStorage anchor")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy one replica during the largest level of each two-replica configuration")
    ap.add_argument("--out", default=None,
                    help="the JSON (default bench/service/results/serve_load.json; quick: "
                        "serve_load_quick.json)")
    args = ap.parse_args()
    args.rounds = args.rounds or (64 if args.quick else 384)
    args.levels = args.levels or ("1,16" if args.quick else "1,16,64")
    args.evaluations = args.evaluations if args.evaluations is not None else (0 if args.quick else 16)
    args.out = args.out or str(Path(__file__).parent / "results" /
                               ("serve_load_quick.json" if args.quick else "serve_load.json"))
    levels = [int(x) for x in args.levels.split(",")]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"--configs: unknown {bad}; allowed: {list(CONFIGS)}")
    if any(args.rounds % c for c in levels):
        ap.error(f"--rounds {args.rounds} must be a multiple of every level {levels}")
    if args.profile and not py_spy():
        ap.error("--profile needs py-spy beside this Python or on PATH (pip install py-spy)")

    import optuna
    import ray

    from archplace.platform.search import connect

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    load_before = os.getloadavg()
    t_all = time.perf_counter()
    pg = None
    results, anchors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        try:
            if any(CONFIGS[c][0] == "postgresql" for c in configs):
                from pg_util import PostgresServer

                # PostgreSQL's default durability unless --pg-synchronous-commit off; WAL flushes timed
                pg = PostgresServer(settings={"synchronous_commit": args.pg_synchronous_commit,
                                              "track_wal_io_timing": "on"}).start()
            connect(None)
            prof_dir = tmp if args.profile else None
            for i, name in enumerate(configs):
                backend, _ = CONFIGS[name]
                db = (pg.create_database(f"svc_{name.replace('-', '_')}") if backend == "postgresql"
                      else str(tmp / f"{name}.db"))
                print(f"{name}: starting", flush=True)
                results.append(run_config(name, db, args, levels, pg if backend == "postgresql" else None,
                                          prof_dir, with_evaluations=(i == 0 and args.evaluations > 0)))
            if not args.no_optuna:
                from archplace.service.schemas import StudyCreate
                from archplace.service.searchers import StudySearcher

                size = len(StudySearcher(StudyCreate(name="x", models=["bert-base"], searcher="random")
                                         .model_dump(mode="json")).space)
                for backend in sorted({CONFIGS[c][0] for c in configs}, reverse=True):
                    storage = optuna_storage(backend, tmp / "optuna.db" if backend == "sqlite"
                                             else pg.create_database("optuna"))
                    for c in levels:
                        r = optuna_ask_tell(storage, c, args.rounds, size)
                        r["db"] = backend
                        anchors.append(r)
                        print(f"  optuna {backend} {c:3d} threads: {r['requests_per_s']:6.1f} req/s, ask "
                              f"p50/p99 {r['ask_ms']['p50']:.0f}/{r['ask_ms']['p99']:.0f} ms, "
                              f"errors {r['errors']}", flush=True)
                    storage.engine.dispose()
        finally:
            ray.shutdown()
            pg_settings = None
            if pg is not None:
                pg_settings = pg_show(pg)
                pg.stop()
    total = time.perf_counter() - t_all

    print(f"\nask/tell: random searcher, one study per level, {args.rounds} rounds "
          f"({2 * args.rounds} requests) per level")
    print(f"{'config':>13s} {'clients':>7s} {'suggest p50':>11s} {'p99':>7s} {'complete p50':>12s} "
          f"{'p99':>7s} {'req/s':>7s} {'5xx':>5s}  verified")
    for res in results:
        for r in res["ask_tell"]:
            print(f"{res['config']:>13s} {r['clients']:7d} {r['suggest_ms']['p50']:9.1f}ms "
                  f"{r['suggest_ms']['p99']:5.0f}ms {r['complete_ms']['p50']:10.1f}ms "
                  f"{r['complete_ms']['p99']:5.0f}ms {r['requests_per_s']:7.1f} {r['retried_5xx']:5d}  "
                  f"{r['verified']['ok']}")
    for r in anchors:
        print(f"{'optuna-' + r['db']:>13s} {r['clients']:7d} {r['ask_ms']['p50']:9.1f}ms "
              f"{r['ask_ms']['p99']:5.0f}ms {r['tell_ms']['p50']:10.1f}ms {r['tell_ms']['p99']:5.0f}ms "
              f"{r['requests_per_s']:7.1f} {r['errors']:5d}  {r['verified']['ok']}")
    print(f"\ntotal {total:.0f} s")

    target = []
    for res in results:
        if res["replicas"] == 2:
            top = [r for r in res["ask_tell"] if r["clients"] == 64]
            if top:
                r = top[0]
                target.append({"config": res["config"], "clients": 64, "requests_per_s": r["requests_per_s"],
                               "suggest_p99_ms": r["suggest_ms"]["p99"],
                               "met": r["requests_per_s"] >= 150 and r["suggest_ms"]["p99"] < 1000})
    ok = (all(r["verified"]["ok"] for res in results for r in res["ask_tell"])
          and all(r["verified"]["ok"] for r in anchors))
    out = {"bench": "serve_load", "git": git_state(), "command": command(), "machine": machine(load_before),
           "quick": args.quick, "rounds_per_level": args.rounds, "levels": levels,
           "postgresql": pg_settings, "configs": results, "optuna_anchor": anchors,
           "target_2_replicas_64_clients": {"goal": ">= 150 requests/s with suggest p99 < 1 s",
                                            "results": target},
           "verified": ok, "total_s": total}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return 0 if ok else 1


def pg_show(pg) -> dict:
    """The server's version and the settings that bear on the numbers."""
    import sqlalchemy as sa

    eng = sa.create_engine(pg.url())
    try:
        with eng.connect() as conn:
            keys = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
                    "shared_buffers", "max_connections")
            return {k: conn.exec_driver_sql(f"SHOW {k}").scalar_one() for k in keys}
    finally:
        eng.dispose()


if __name__ == "__main__":
    sys.exit(main())
