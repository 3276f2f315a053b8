"""The service on Ray Serve: one FastAPI ingress deployment over the shared database, and
``serve_forever`` behind ``archplace serve``.

Each replica builds the app at start (``__serve_build_asgi_app__``) over its own engine and runs an
``OperationRunner``. Replicas share nothing but the database, so any number of them is safe (the
study guarantees live in the transactions, see ``studies.py``); with SQLite, which is a file, the
replicas are pinned to the node that started the service. Backpressure is Serve's: at most
``max_ongoing_requests`` per replica at once and ``max_queued_requests`` waiting, beyond which the
service answers 503 with ``Retry-After``; long work never holds a request (operations). In front of the
app, ``http_guard.Guard`` turns slow and hostile clients away before they can hold a slot.

Ingress (``ServeConfig.direct_ingress``, on by default): each replica serves HTTP itself on
``--host:--port`` with Serve's direct ingress (``RAY_SERVE_ENABLE_DIRECT_INGRESS``: uvicorn in the
replica's process, Serve's own admission, ``max_queued_requests`` and 503s, drain on shutdown), so a
request crosses one HTTP hop instead of two (client -> Serve's proxy -> the replica over Ray). Serve
gives each such replica a port of its own from 30000 up, published only to its controller; here every
replica binds ``--port`` itself with ``SO_REUSEPORT`` instead (``serve_http_on``), so clients keep the
one URL they had and the kernel spreads their connections over the replicas (all on the node that
started the service, whose port that is), and a replica that restarts takes the same port again.
Serve still runs its proxy (its direct ingress needs one), on 127.0.0.1 and a port of the kernel's
choosing, which nothing is told of. Off, the proxy serves ``--port`` and forwards to the replicas as
before.

Exposure: the HTTP port binds ``--host``; each replica's internal gRPC server (Serve binds it to all
interfaces) is bound to the Ray node's address instead, which is 127.0.0.1 for the embedded Ray; the
SQLite file is made 0600 before anything opens it (``secure_db_file``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.serve.config import BackpressureConfig

logger = logging.getLogger("archplace.service")

APP_NAME = "archplace"

# the environment of the controller and each replica under direct ingress. No minimum draining period
# (it lets an external load balancer deregister a replica first, and kept every shutdown 30 s long;
# here the kernel stops handing a closed listener connections at once). And three of Serve's
# RAY_SERVE_THROUGHPUT_OPTIMIZED settings, for the replica: the app on the replica's own event loop
# rather than a second loop in a thread of its own (each request's messages crossed between the two;
# the routes still run in the app's thread pool, the token lookups in the guard's), access-log lines
# written 1,000 at a time (at once for an error), and the objects of start-up frozen out of the
# garbage collector's scans. bench/service/serve_hop.py measures each.
DIRECT_INGRESS_ENV = {
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_FREEZE_GC_ON_STARTUP": "1",
}


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
    max_requests_per_ip: int | None = None  # per replica; default: half of max_ongoing_requests
    body_timeout_s: float = 10.0  # the whole body must arrive within this, else a 408
    max_studies_per_owner: int | None = None  # default: schemas.LIMITS["studies_per_owner"]
    max_points_per_owner: int | None = None  # feasible architectures over an owner's studies
    direct_ingress: bool = True  # each replica serves --port itself (no proxy hop); see the module doc

    def study_limits(self) -> dict[str, int]:
        from .schemas import LIMITS

        return {"max_studies": self.max_studies_per_owner or LIMITS["studies_per_owner"],
                "max_points": self.max_points_per_owner or LIMITS["space_points_per_owner"]}

    def http_limits(self):
        from .http_guard import HttpLimits

        per_ip = self.max_requests_per_ip
        return HttpLimits(
            body_timeout_s=self.body_timeout_s,
            max_requests_per_ip=max(1, self.max_ongoing_requests // 2) if per_ip is None else per_ip,
            retry_after_s=self.retry_after_s,
        )


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
    if cfg.max_requests_per_ip is not None and cfg.max_requests_per_ip < 1:
        raise ValueError(f"--max-requests-per-ip must be >= 1, got {cfg.max_requests_per_ip}")
    if not 0 < cfg.body_timeout_s <= 3600:
        raise ValueError(f"--body-timeout-s must be in (0, 3600], got {cfg.body_timeout_s}")
    for flag, v in (("--max-studies-per-owner", cfg.max_studies_per_owner),
                    ("--max-points-per-owner", cfg.max_points_per_owner)):
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v}")
    secure_db_file(cfg.db)
    # opened here on every host, so a database this version cannot use (an older schema) is refused
    # in one line before Serve starts, not inside a replica's constructor (a start timeout)
    engine = make_engine(cfg.db)
    if not is_loopback(cfg.host):
        if cfg.auth == "none":
            raise ValueError(
                f"--host {cfg.host} is not a loopback address: refusing to serve without "
                "authentication (use --auth token and create tokens with "
                "`archplace serve token create OWNER`)"
            )
        if count_tokens(engine) == 0:
            raise ValueError(
                f"--host {cfg.host} is not a loopback address and the database has no token: "
                "create one first with `archplace serve token create OWNER --db ...`"
            )


def secure_db_file(db: str) -> None:
    """Make a SQLite database file readable by its owner only (0600), creating it empty if need be,
    before SQLite opens it: SQLite gives its -wal and -shm files the database file's mode, and would
    otherwise create all three with the umask's (0644 before, so anyone on the machine could read the
    studies and token hashes). An existing file is narrowed, with its -wal and -shm. A URL of another
    database is left alone."""
    from .db import database_url

    url = database_url(db)  # creates the parent directory
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        return
    path = url[len("sqlite:///"):]
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    for p in (path, path + "-wal", path + "-shm"):
        try:
            if os.stat(p).st_mode & 0o077:
                os.chmod(p, 0o600)
        except FileNotFoundError:
            pass


def bind_internal_grpc_to_node_ip() -> None:
    """Serve starts a gRPC server in every replica for calls between deployments and binds it to
    ``[::]:0``, all interfaces, whatever ``--host`` says. Serve dials it at the replica's Ray node
    address, so binding that address alone loses nothing, and for the embedded Ray it is 127.0.0.1.
    Serve has no option for it: this wraps the function its replica calls, in this replica's process
    only (called from the replica's constructor, which Serve runs before it starts that server)."""
    import ray
    from ray.serve._private import replica as serve_replica

    add = getattr(serve_replica, "add_port_to_grpc_server", None)
    if add is None or getattr(add, "_archplace", False):
        if add is None:
            logger.warning("this Ray Serve has no replica.add_port_to_grpc_server: its internal gRPC "
                           "server keeps Serve's own address")
        return
    ip = ray.util.get_node_ip_address()
    host = f"[{ip}]" if ":" in ip else ip

    def bind(server, address: str):
        return add(server, f"{host}:0" if address == "[::]:0" else address)

    bind._archplace = True  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = bind


def direct_ingress_available() -> bool:
    """Whether this Ray Serve has the direct ingress ``serve_http_on`` relies on: the replica's HTTP
    server started through ``replica.start_asgi_http_server(app, http_options, *, event_loop,
    enable_so_reuseport)`` (Ray 2.5x-2.60). Asked in the driver, whose Ray the replicas run."""
    import inspect

    try:
        from ray.serve._private import replica as serve_replica
    except ImportError:
        return False
    start = getattr(serve_replica, "start_asgi_http_server", None)
    replica_cls = getattr(serve_replica, "Replica", None)
    if start is None or not hasattr(replica_cls, "_maybe_start_direct_ingress_servers"):
        return False
    start = getattr(start, "_archplace_wrapped", start)
    params = inspect.signature(start).parameters
    return "enable_so_reuseport" in params and "http_options" in params


def serve_http_on(host: str, port: int) -> None:
    """Make this replica's direct-ingress HTTP server listen on ``host:port`` with ``SO_REUSEPORT``
    instead of the port Serve's controller allotted it. All replicas on a node then share the
    service's one port and the kernel spreads new connections over them; a replica that stops closes
    only its own listener (its accept queue is reset, and clients retry), and one that restarts binds
    the port again. Called from the replica's constructor, which Serve runs before it starts that
    server; wraps the function in this replica's process only (as ``bind_internal_grpc_to_node_ip``).
    ``SO_REUSEPORT`` lets only processes of the same user share a port."""
    from ray.serve._private import replica as serve_replica

    start = serve_replica.start_asgi_http_server
    if getattr(start, "_archplace_wrapped", None) is not None:
        start = start._archplace_wrapped

    async def bind(app, http_options, **kw):
        kw["enable_so_reuseport"] = True
        opts = http_options.model_copy(update={"host": host, "port": port})
        return await start(app, opts, **kw)

    bind._archplace_wrapped = start  # type: ignore[attr-defined]
    serve_replica.start_asgi_http_server = bind


@serve.ingress()
class ArchplaceService:
    def __init__(self, db: str, auth: str, max_running_operations: int | None, limits=None,
                 study_limits: dict[str, int] | None = None,
                 listen: tuple[str, int] | None = None) -> None:
        """``listen``: the (host, port) every replica serves under direct ingress, else None."""
        from .app import ServiceState
        from .db import make_engine
        from .http_guard import HttpLimits
        from .operations import OperationRunner

        bind_internal_grpc_to_node_ip()
        if listen is not None:
            serve_http_on(*listen)
        ctx = serve.get_replica_context()  # replicas propose from their own lanes (StudySearcher)
        self.state = ServiceState(make_engine(db), auth=auth, limits=limits or HttpLimits(),
                                  study_limits=study_limits or {}, lane=(ctx.rank.rank, ctx.world_size))
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
    # on the node that started the service: SQLite is a file there; and under direct ingress the
    # replicas serve that node's --port, the URL clients are given (a replica on another node would
    # serve its own node's port, which nobody is told of)
    if cfg.direct_ingress or cfg.db.startswith("sqlite") or "://" not in cfg.db:
        options["resources"] = {f"node:{ray.util.get_node_ip_address()}": 0.001}
    if cfg.direct_ingress:
        options["runtime_env"] = {"env_vars": dict(DIRECT_INGRESS_ENV)}
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
    listen = (cfg.host, cfg.port) if cfg.direct_ingress else None
    return dep.bind(cfg.db, cfg.auth, cfg.max_running_operations, cfg.http_limits(), cfg.study_limits(),
                    listen)


def start(cfg: ServeConfig, wait_s: float = 120.0) -> str:
    """Deploy on the connected Ray and wait until the app answers; returns the base URL."""
    import urllib.request

    from ray.exceptions import RayActorError

    check_config(cfg)
    if cfg.direct_ingress and not direct_ingress_available():
        import ray

        raise ValueError(f"this Ray ({ray.__version__}) has no Serve direct ingress that archplace can "
                         "use: serve through Serve's proxy instead (direct_ingress=False)")
    if cfg.direct_ingress:
        # the proxy Serve's direct ingress still starts: loopback, a port of the kernel's choosing,
        # not advertised (the replicas serve --host:--port themselves)
        http_options: dict[str, Any] = {"host": "127.0.0.1", "port": 0}
        controller = {"runtime_env": {"env_vars": dict(DIRECT_INGRESS_ENV)}}
    else:
        http_options, controller = {"host": cfg.host, "port": cfg.port}, None
    for attempt in range(3):
        # Serve's controller kills a proxy that is not ready within 5 s and starts another with a
        # longer limit, but serve.start raises on the first one: on a loaded machine that made a
        # start (or restart) fail for nothing, so it is asked again, saying so
        try:
            serve.start(http_options=http_options, controller_options=controller)
            break
        except RayActorError as e:
            if attempt == 2:
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            logger.warning("Serve's HTTP proxy died while starting (%s); starting Serve again", first)
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
    """Whether the service (its replicas; Serve's proxy without direct ingress) can bind ``host:port``.
    With ``SO_REUSEADDR``, as every server sets it: without it the connections a stopped service closed
    (TIME_WAIT, 60 s on Linux) made the port look taken, and a restart on the same port was refused for
    a minute; a live listener still counts (the replicas' ``SO_REUSEPORT`` does not admit this socket,
    which does not set it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    """Wait until nothing listens on ``host:port`` (the replicas, or Serve's proxy, are processes of
    their own that let go of the port a moment after ``serve.shutdown()`` returns)."""
    deadline = time.monotonic() + timeout_s
    while not port_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
