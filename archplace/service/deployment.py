"""The service on Ray Serve: one FastAPI ingress deployment over the shared database, and
``serve_forever`` behind ``archplace serve``.

Each replica builds the app at start (``__serve_build_asgi_app__``) over its own engine and runs an
``OperationRunner``. Replicas share nothing but the database, so any number of them is safe (the
study guarantees live in the transactions, see ``studies.py``); with SQLite, which is a file, the
replicas are pinned to the node that started the service. Backpressure is Serve's: at most
``max_ongoing_requests`` per replica at once and ``max_queued_requests`` waiting, beyond which the
proxy answers 503 with ``Retry-After``; long work never holds a request (operations).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.config import BackpressureConfig

logger = logging.getLogger("archplace.service")

APP_NAME = "archplace"


@dataclass(frozen=True)
class ServeConfig:
    db: str
    host: str = "127.0.0.1"
    port: int = 8000
    auth: str = "token"
    replicas: int = 1
    max_ongoing_requests: int = 128
    max_queued_requests: int = 512
    retry_after_s: int = 2
    max_running_operations: int | None = None  # default: the cluster's CPUs


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_config(cfg: ServeConfig) -> None:
    """Refuse what would be unsafe or cannot work, with a one-line error."""
    from .auth import count_tokens
    from .db import make_engine

    if cfg.auth not in ("token", "none"):
        raise ValueError(f"--auth must be 'token' or 'none', got {cfg.auth!r}")
    if not 1 <= cfg.port <= 65535:
        raise ValueError(f"--port must be in [1, 65535], got {cfg.port}")
    if cfg.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {cfg.replicas}")
    if not is_loopback(cfg.host):
        if cfg.auth == "none":
            raise ValueError(
                f"--host {cfg.host} is not a loopback address: refusing to serve without "
                "authentication (use --auth token and create tokens with "
                "`archplace serve token create OWNER`)"
            )
        if count_tokens(make_engine(cfg.db)) == 0:
            raise ValueError(
                f"--host {cfg.host} is not a loopback address and the database has no token: "
                "create one first with `archplace serve token create OWNER --db ...`"
            )


@serve.ingress()
class ArchplaceService:
    def __init__(self, db: str, auth: str, max_running_operations: int | None) -> None:
        from .app import ServiceState
        from .db import make_engine
        from .operations import OperationRunner

        self.state = ServiceState(make_engine(db), auth=auth)
        self.runner = OperationRunner(self.state.engine, max_running=max_running_operations).start()

    def __serve_build_asgi_app__(self):
        from .app import create_app

        return create_app(self.state)

    def __del__(self) -> None:
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.stop()


def build(cfg: ServeConfig):
    """The bound Serve application for ``cfg``."""
    import ray

    options: dict[str, Any] = {"num_cpus": 0}  # the ingress waits on the database; CPUs go to evaluations
    if cfg.db.startswith("sqlite") or "://" not in cfg.db:
        options["resources"] = {f"node:{ray.util.get_node_ip_address()}": 0.001}
    dep = serve.deployment(
        ArchplaceService,
        name="archplace",
        num_replicas=cfg.replicas,
        ray_actor_options=options,
        max_ongoing_requests=cfg.max_ongoing_requests,
        max_queued_requests=cfg.max_queued_requests,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=cfg.retry_after_s),
        health_check_period_s=2,
        health_check_timeout_s=10,
        graceful_shutdown_timeout_s=5,
    )
    return dep.bind(cfg.db, cfg.auth, cfg.max_running_operations)


def start(cfg: ServeConfig, wait_s: float = 120.0) -> str:
    """Deploy on the connected Ray and wait until the app answers; returns the base URL."""
    import urllib.request

    check_config(cfg)
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(build(cfg), name=APP_NAME, route_prefix="/")
    url = f"http://{'127.0.0.1' if cfg.host in ('0.0.0.0', 'localhost') else cfg.host}:{cfg.port}"
    if ":" in cfg.host and not cfg.host.startswith("["):
        url = f"http://[{cfg.host}]:{cfg.port}"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/v1/health", timeout=5) as r:
                if r.status == 200:
                    return url
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the service did not answer on {url} within {wait_s:.0f} s")
        time.sleep(0.25)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
