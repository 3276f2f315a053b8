"""``archplace serve``: run the service, and manage its tokens.

archplace serve [--host 127.0.0.1] [--port 8000] [--db PATH|URL] [--address ADDR] [--auth token|none]
archplace serve token create OWNER [--db ...]     # prints the new token as its last line
archplace serve token revoke OWNER [--db ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path


def default_db() -> str:
    return str(Path(os.environ.get("ARCHPLACE_DATA_DIR", "~/.archplace")).expanduser() / "service.db")


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="run the study / evaluation service on Ray Serve (HTTP, /v1)")
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; another one needs --auth token and a token)",
    )
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--db",
        default=None,
        help="SQLite file or SQLAlchemy URL (default $ARCHPLACE_DATA_DIR/"
        "service.db, ~/.archplace/service.db)",
    )
    s.add_argument("--address", default=None, help="Ray cluster to attach to (default: an embedded Ray)")
    s.add_argument(
        "--auth",
        choices=("token", "none"),
        default="token",
        help="bearer tokens per owner (default), or none (127.0.0.1 only)",
    )
    s.add_argument("--replicas", type=int, default=1)
    s.add_argument("--no-direct-ingress", action="store_true",
                   help="serve through Ray Serve's HTTP proxy (a second hop) instead of each replica serving "
                        "--port itself (the default: Serve's direct ingress)")
    s.add_argument("--max-ongoing-requests", type=int, default=128)
    s.add_argument("--max-queued-requests", type=int, default=512)
    s.add_argument(
        "--max-requests-per-ip",
        type=int,
        default=None,
        help="requests of one client address in flight per replica, above which it gets 503 with "
        "Retry-After (default: half of --max-ongoing-requests)",
    )
    s.add_argument(
        "--body-timeout-s",
        type=float,
        default=10.0,
        help="a request body must arrive within this many seconds, else 408 (default 10)",
    )
    s.add_argument("--max-studies-per-owner", type=int, default=None,
                   help="studies one owner may keep; a create above it is a 409 (default 100)")
    s.add_argument("--max-points-per-owner", type=int, default=None,
                   help="feasible architectures over all of one owner's studies; a create above it is "
                   "a 409 (default 5,000,000)")
    s.add_argument("--json", action="store_true", help="print one JSON line once the service is up")
    tsub = s.add_subparsers(dest="serve_command")
    tok = tsub.add_parser("token", help="create or revoke an owner's bearer tokens")
    tok.add_argument("action", choices=("create", "revoke"))
    tok.add_argument("owner")
    tok.add_argument("--db", dest="token_db", default=None)


def db_folder(db: str | None) -> Path | None:
    """The folder of an explicit SQLite ``--db`` (None for the default database or another kind)."""
    if db is None:
        return None
    text = str(db)
    if "://" in text:
        if not text.startswith("sqlite:///") or text == "sqlite:///:memory:":
            return None   # another database: its server says what is wrong
        text = text[len("sqlite:///"):]
    path = Path(text).expanduser()
    return path.parent if path.parent != Path("") else Path(".")


def check_db_folder(db: str | None) -> None:
    """``serve --db`` must name a file in a folder that exists: the service creates the database file,
    never the folders above it (a typo would leave a new tree anywhere, and a service running on it).
    Said in one line before anything is created or started; the default database's folder is made."""
    parent = db_folder(db)
    if parent is not None and not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise ValueError(f"--db {db}: the folder {parent} {what}; create it first, or give a database in "
                         "an existing folder (nothing was created)")


def run(args) -> int:
    """Returns the exit status; errors are one line on stderr, as everywhere in the CLI."""
    if args.serve_command != "token":
        check_db_folder(args.db)
    from archplace.service.auth import create_token, revoke_tokens
    from archplace.service.db import make_engine
    from archplace.service.deployment import secure_db_file

    if args.serve_command == "token":
        db = args.token_db or args.db or default_db()
        parent = db_folder(args.token_db or args.db)
        if parent is not None and not parent.exists():   # the first token sets a service up: said, though
            print(f"note: creating the folder {parent} for the database", file=sys.stderr)
        secure_db_file(db)  # the first token usually creates the database: 0600 from the start
        engine = make_engine(db)
        if args.action == "create":
            token = create_token(engine, args.owner)
            print(f"token for owner {args.owner!r} (shown once; only its hash is stored):")
            print(token)
        else:
            n = revoke_tokens(engine, args.owner)
            print(f"revoked {n} token(s) of owner {args.owner!r}")
        return 0
    return serve_forever(args)


def serve_forever(args) -> int:
    import json

    from archplace.cli import status
    from archplace.platform import ray_connect
    from archplace.platform.search import connect
    from archplace.service.deployment import ServeConfig, check_config, port_free, start, wait_port_free

    cfg = ServeConfig(
        db=args.db or default_db(),
        host=args.host,
        port=args.port,
        auth=args.auth,
        replicas=args.replicas,
        max_ongoing_requests=args.max_ongoing_requests,
        max_queued_requests=args.max_queued_requests,
        max_requests_per_ip=args.max_requests_per_ip,
        body_timeout_s=args.body_timeout_s,
        max_studies_per_owner=args.max_studies_per_owner,
        max_points_per_owner=args.max_points_per_owner,
        direct_ingress=not args.no_direct_ingress,
    )
    check_config(cfg)
    if not port_free(cfg.host, cfg.port):
        raise ValueError(f"--port {cfg.port} on {cfg.host} is in use")
    connect(args.address)
    status.phase(f"starting the service on Ray Serve ({cfg.replicas} replica(s), port {cfg.port})")
    try:
        url = start(cfg)
        ray_connect.raise_if_stopped()   # a stop that Serve's start-up swallowed
    except KeyboardInterrupt:
        # stopped while Serve starts: the embedded Ray goes with this process (commands.stopped); on an
        # attached cluster the half-started service is shut down, as a stop while serving does
        if args.address is not None:
            ray_connect.stopping()
            _serve_shutdown()
        raise
    except Exception as e:  # Ray or Serve could not start it: one line, as every CLI error
        if isinstance(e, (ValueError, OSError, TimeoutError)):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise OSError(f"Ray Serve could not start the service: {type(e).__name__}: {first}") from None
    started = status.active()
    if started is not None:   # up: the status line gives way to the service's own lines
        started.close()
    info = {"url": url, "docs": f"{url}/docs", "db": cfg.db, "auth": cfg.auth}
    if args.json:
        print(json.dumps(info), flush=True)
    else:
        print(
            f"archplace service on {url} (OpenAPI: {url}/docs), database {cfg.db}, auth {cfg.auth}",
            flush=True,
        )
        if cfg.auth == "token":
            print(
                "requests need 'Authorization: Bearer TOKEN' (archplace serve token create OWNER)", flush=True
            )
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum, frame) -> None:   # the first one shuts the service down; later ones wait for it
        signals.append(signum)
        ray_connect.note_stop(signum, handled=True)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    if ray_connect.stop_signal() is not None:   # one came between the start and these handlers
        on_signal(ray_connect.stop_signal(), None)
    stop.wait()
    _say("shutting down")
    if _ray_gone():
        # a SIGTERM or Ctrl-C to the whole process group (a terminal, systemd, docker stop) stopped the
        # embedded Ray's processes too: Serve's shutdown would wait 30 s for a dead controller, then 30 s
        # for the port, and Ray's client a minute more for its GCS, printing errors
        _say("Ray's processes were stopped with this one: nothing left to shut down")
    else:
        _serve_shutdown()
        # exit only once the proxy has let go of the port, so a restart on it can bind at once
        if not wait_port_free(cfg.host, cfg.port, timeout_s=20):
            _say(f"warning: --port {cfg.port} still in use 20 s after shutdown")
    if ray_connect.stop_handlers_installed():   # the program (a Python caller's Ray is its own):
        # the embedded Ray shut down here, not in Python's exit, and anything of it left killed: the
        # line below is the last one, and nothing of the service outlives it
        ray_connect.shutdown_ray()
    _say(f"archplace serve: stopped by {signal.Signals(signals[0]).name}" if signals else
         "archplace serve: stopped")
    return 0   # the service was up and shut down cleanly on request


def _serve_shutdown() -> None:
    from ray import serve

    try:
        serve.shutdown()
    except Exception as e:  # noqa: BLE001 - a controller already gone: what is left goes with Ray
        _say(f"note: Serve's shutdown: {type(e).__name__}: {str(e).strip()[:200]}")


def _ray_gone(wait_s: float = 1.0) -> bool:
    """Whether the Ray this command started (not a cluster it attached to) has lost a process: a
    signal to the process group reaches them as well, and they may take a moment to go."""
    import time

    try:
        from ray._private import worker

        node = worker._global_node
        if node is None or not node.all_processes:
            return False
        deadline = time.monotonic() + wait_s
        while not node.dead_processes():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True
    except Exception:  # noqa: BLE001 - Ray's internals moved: shut down as before
        return False


def _say(text: str) -> None:
    """A line on stderr while shutting down; a stderr whose reader has gone (a closed pipe, a parent
    that exited) must not stop the shutdown: the error skipped Serve's shutdown, and Ray's exit then
    took a minute of GCS errors."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="archplace")
    add_parser(p.add_subparsers(dest="command", required=True))
    return p
