"""What the service's HTTP path costs: Serve's proxy in front of the replica (two hops: client -> proxy
-> replica over Ray) against direct ingress (one hop: each replica serves the port itself,
``ServeConfig.direct_ingress``), in CPU per request by process and requests/s.

Modes, each in a fresh subprocess with its own embedded Ray (all the machine's CPUs), 1 replica,
SQLite, token auth, ``ServeConfig`` defaults otherwise:

* ``proxy``: ``direct_ingress=False``, the path before direct ingress.
* ``direct-threaded``: Serve's direct ingress alone (the app on a second event loop in a thread of its
  own, Serve's default; access-log lines written one by one).
* ``direct``: ``direct_ingress=True``, what ``archplace serve`` runs: direct ingress with the app on
  the replica's own event loop, access logs buffered, the start-up objects frozen out of the garbage
  collector (``deployment.DIRECT_INGRESS_ENV``).
* ``direct-tput``: ``direct`` with ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` in every Ray process (also:
  no replica logs on stderr, the router in the same loop, gRPC between deployments).

Routes, at each level of concurrent clients (threads in this process, one keep-alive connection each):

* ``empty``: ``GET /empty`` of a bare FastAPI deployment deployed the same way (the floor of the path).
* ``health``: archplace's ``GET /v1/health`` (the guard, no database).
* ``suggest``: rounds of ``suggest(count=1)`` then ``complete`` with ``archplace.client.Client`` on a
  fresh study (random searcher, bert-base on the Phaze Table 1 space); requests are both kinds. Checked:
  no trial or architecture handed out twice, every completion stored as sent.

CPU: seconds by process over each level (this process = the clients; Serve's proxy, controller and
replica; Ray's GCS and raylet) divided by the requests. The machine's load average is recorded: on a
busy machine wall times and requests/s stretch, the CPU per request much less.

    python bench/service/serve_hop.py [--modes proxy,direct-threaded,direct,direct-tput] [--levels 16,64]
                                      [--requests 1200] [--rounds 256] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_load's helpers
from _meta import command, git_state, machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
OUT = ROOT / "bench" / "service" / "results" / "serve_hop.json"
MODES = ("proxy", "direct-threaded", "direct", "direct-tput")


# ---------------------------------------------------------------------- CPU by process
def ray_core_pids() -> dict[str, int]:
    import psutil

    out = {}
    for p in psutil.Process().children(recursive=False):
        try:
            name = p.name()
        except psutil.Error:
            continue
        for key in ("gcs_server", "raylet"):
            if key in name:
                out[key] = p.pid
    return out


class Meter:
    def __init__(self, pids: dict[str, int]) -> None:
        from serve_load import _cpu_s

        self.pids, self._cpu = {**pids, "clients (bench process)": os.getpid()}, _cpu_s

    def _sample(self) -> dict[str, float]:
        return {k: self._cpu(p) for k, p in self.pids.items()}

    def start(self) -> None:
        self.t0, self.s0 = time.perf_counter(), self._sample()

    def stop(self, requests: int) -> dict:
        s1, wall = self._sample(), time.perf_counter() - self.t0
        ms = {k: round(1e3 * max(s1[k] - self.s0[k], 0.0) / requests, 2) for k in s1}
        ms["total"] = round(sum(ms.values()), 2)
        return {"wall_s": round(wall, 2), "requests": requests, "requests_per_s": round(requests / wall, 1),
                "cpu_ms_per_request": ms}


# ---------------------------------------------------------------------- the empty deployment
def empty_app_class():
    from fastapi import FastAPI
    from ray import serve

    app = FastAPI()

    @app.get("/empty")
    def empty() -> dict:
        return {}

    @serve.ingress(app)
    class Empty:
        def __init__(self, listen) -> None:
            from archplace.service.deployment import bind_internal_grpc_to_node_ip, serve_http_on

            bind_internal_grpc_to_node_ip()
            if listen is not None:
                serve_http_on(*listen)

    return Empty


def start_empty(cfg) -> str:
    """The bare deployment with ``cfg``'s ingress, options and backpressure, as ``deployment.start``."""
    import urllib.request

    from ray import serve
    from ray.serve.config import BackpressureConfig

    from archplace.service.deployment import DIRECT_INGRESS_ENV

    options: dict = {"num_cpus": 0}
    if cfg.direct_ingress:
        options["runtime_env"] = {"env_vars": dict(DIRECT_INGRESS_ENV)}
        serve.start(http_options={"host": "127.0.0.1", "port": 0},
                    controller_options={"runtime_env": {"env_vars": dict(DIRECT_INGRESS_ENV)}})
    else:
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
    dep = serve.deployment(empty_app_class(), name="empty", num_replicas=1, ray_actor_options=options,
                           max_ongoing_requests=cfg.max_ongoing_requests,
                           max_queued_requests=cfg.max_queued_requests,
                           backpressure_config=BackpressureConfig(status_code=503,
                                                                  retry_after_s=cfg.retry_after_s))
    serve.run(dep.bind((cfg.host, cfg.port) if cfg.direct_ingress else None), name="empty", route_prefix="/")
    url = f"http://{cfg.host}:{cfg.port}"
    for _ in range(240):
        try:
            with urllib.request.urlopen(f"{url}/empty", timeout=5) as r:
                if r.status == 200:
                    return url
        except OSError:
            time.sleep(0.25)
    raise TimeoutError("the empty deployment did not answer")


# ---------------------------------------------------------------------- load
def get_level(url: str, path: str, clients: int, requests_total: int, token: str | None, pids) -> dict:
    import requests
    from serve_load import run_threads, stats

    per = requests_total // clients
    lat: list[float] = []
    bad: list[int] = []
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def work(k: int, n: int, keep: bool) -> None:
        s = requests.Session()
        mine, wrong = [], 0
        for _ in range(n):
            t0 = time.perf_counter()
            r = s.get(url + path, headers=headers, timeout=60)
            mine.append(time.perf_counter() - t0)
            wrong += r.status_code != 200
        if keep:
            with lock:
                lat.extend(mine)
                bad.append(wrong)

    run_threads(clients, lambda k: work(k, 4, False))  # warm: connections, the replica's first calls
    meter = Meter(pids)
    meter.start()
    run_threads(clients, lambda k: work(k, per, True))
    out = meter.stop(per * clients)
    out.update(clients=clients, latency_ms=stats(lat), non_200=sum(bad))
    return out


def suggest_level(url: str, token: str, clients: int, rounds: int, pids) -> dict:
    from serve_load import ask_tell

    meter = Meter(pids)
    meter.start()
    r = ask_tell(url, token, clients, rounds, tag="hop")
    out = meter.stop(r["requests"] + 1)  # + the study's create
    out.update(clients=clients, suggest_ms=r["suggest_ms"], complete_ms=r["complete_ms"],
               retried_5xx=r["retried_5xx"], verified=r["verified"])
    return out


def child(mode: str, levels: list[int], requests_total: int, rounds: int) -> dict:
    if mode == "direct-tput":
        os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"  # before Ray starts: every process inherits it
    if mode == "direct-threaded":
        from archplace.service import deployment

        for k in ("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE",
                  "RAY_SERVE_FREEZE_GC_ON_STARTUP"):
            deployment.DIRECT_INGRESS_ENV.pop(k)  # Serve's defaults
    import ray
    from ray import serve
    from serve_load import free_port, serve_pids

    from archplace.service.deployment import ServeConfig

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    direct = mode != "proxy"
    core = ray_core_pids()
    result: dict = {"mode": mode, "direct_ingress": direct, "routes": {}}

    cfg = ServeConfig(db="unused", host="127.0.0.1", port=free_port(), direct_ingress=direct)
    url = start_empty(cfg)
    pids = {**serve_pids(), **core}
    result["routes"]["empty"] = [get_level(url, "/empty", c, requests_total, None, pids) for c in levels]
    serve.shutdown()  # the proxy's port is Serve's until it stops

    url, token = deploy(str(Path(tempfile.mkdtemp(prefix="serve_hop_")) / "service.db"), direct)
    pids = {**serve_pids(), **core}
    result["processes"] = sorted(pids)
    result["routes"]["health"] = [get_level(url, "/v1/health", c, requests_total, token, pids)
                                  for c in levels]
    result["routes"]["suggest"] = [suggest_level(url, token, c, rounds, pids) for c in levels]
    serve.shutdown()
    ray.shutdown()
    return result


def deploy(db: str, direct: bool) -> tuple[str, str]:
    """archplace on a fresh SQLite database, 1 replica, token auth; returns the URL and a token."""
    from serve_load import free_port

    from archplace.service.auth import create_token
    from archplace.service.db import make_engine
    from archplace.service.deployment import ServeConfig, start

    engine = make_engine(db)
    token = create_token(engine, "bench")
    engine.dispose()
    return start(ServeConfig(db=db, host="127.0.0.1", port=free_port(), direct_ingress=direct)), token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--levels", default="16,64")
    ap.add_argument("--requests", type=int, default=1200, help="GET requests per level (empty, health)")
    ap.add_argument("--rounds", type=int, default=256, help="suggest+complete rounds per level")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.child:
        print("RESULT " + json.dumps(child(args.child, levels, args.requests, args.rounds)), flush=True)
        return

    load_before = os.getloadavg()
    runs = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        t0 = time.perf_counter()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_SERVE_")}
        p = subprocess.run([sys.executable, __file__, "--child", mode, "--levels", args.levels,
                            "--requests", str(args.requests), "--rounds", str(args.rounds)],
                           env={**env, "RAY_ADDRESS": "local"}, capture_output=True, text=True, timeout=3600)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if p.returncode or line is None:
            raise SystemExit(f"mode {mode} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        run = json.loads(line[len("RESULT "):])
        run["loadavg_after"] = os.getloadavg()
        run["wall_s"] = round(time.perf_counter() - t0, 1)
        runs.append(run)
        for route, rows in run["routes"].items():
            for r in rows:
                print(f"{mode:12s} {route:8s} {r['clients']:3d} clients: {r['requests_per_s']:7.1f} req/s, "
                      f"CPU {r['cpu_ms_per_request']['total']:6.2f} ms/request "
                      + " ".join(f"{k.split(' ')[0]}={v}" for k, v in r["cpu_ms_per_request"].items()
                                 if k != "total"), flush=True)
    out = {"bench": "serve_hop", "command": command(), "git": git_state(), "machine": machine(load_before),
           "replicas": 1, "database": "sqlite", "levels": levels, "requests_per_level": args.requests,
           "rounds_per_level": args.rounds, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
