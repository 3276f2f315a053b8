"""The real service for tests: Ray Serve on the session's embedded Ray, HTTP on 127.0.0.1, a SQLite
database in a temporary directory (or a PostgreSQL URL, see pg_util.py), token auth with two owners."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningService:
    url: str
    db: str
    cfg: object
    tokens: dict[str, str]

    def client(self, owner: str = "alice", **kw):
        from archplace.client import Client

        return Client(self.url, self.tokens[owner], **kw)

    def restart(self) -> None:
        """Stop the whole Serve instance (proxy included) and start it again on the same database."""
        from ray import serve

        from archplace.service.deployment import start

        serve.shutdown()
        self.url = start(self.cfg)


def start_service(tmp: Path, db: str | None = None, **cfg_kw) -> RunningService:
    """``db``: a database URL (PostgreSQL); by default a SQLite file in ``tmp``."""
    from archplace.service.auth import create_token
    from archplace.service.db import make_engine
    from archplace.service.deployment import ServeConfig, start

    db = db or str(tmp / "service.db")
    engine = make_engine(db)
    tokens = {o: create_token(engine, o) for o in ("alice", "bob")}
    engine.dispose()
    cfg = ServeConfig(db=db, host="127.0.0.1", port=free_port(), **cfg_kw)
    return RunningService(url=start(cfg), db=db, cfg=cfg, tokens=tokens)


def replica_actor_names() -> list[str]:
    import ray

    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::archplace#archplace")
    ]
