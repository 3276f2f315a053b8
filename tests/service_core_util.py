"""Helpers for the tests of the service's ask/tell core without Ray: replicas are ``StudyService``
objects over one SQLite file (that is all a Serve replica is), and the HTTP API is the real FastAPI app
served by uvicorn in a thread on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import requests


class Clock:
    """An injectable clock for lease tests: time moves only when the test says so."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def replicas(db: Path, n: int = 2, **kw):
    """``n`` StudyService instances over the database file ``db``, each with its own engine."""
    from archplace.service.db import make_engine
    from archplace.service.studies import StudyService

    return [StudyService(make_engine(str(db)), **kw) for _ in range(n)]


def study(name: str, **kw):
    from archplace.service.schemas import StudyCreate

    return StudyCreate(name=name, models=["bert-base"], **kw)


def ask(svc, owner: str, name: str, count: int = 1, client_id: str | None = "w"):
    from archplace.service.schemas import SuggestRequest

    return svc.suggest(owner, name, SuggestRequest(count=count, client_id=client_id))


def tell(svc, owner: str, name: str, number: int, value: float):
    from archplace.service.schemas import CompleteRequest

    return svc.complete(owner, name, number, CompleteRequest(value=value))


GRID2 = {  # a 2-point space: num_tc in {1, 2}, everything else fixed
    "architecture": {
        "num_tc": {"pow2": [0, 1]},
        "num_vc": {"pow2": [0, 0]},
        "pe_x": {"pow2": [1, 1]},
        "pe_y": {"pow2": [1, 1]},
        "glb_mb": {"pow2": [1, 1]},
    },
    "constraints": {"area_min_fraction": 0.0},
}


class HttpApp:
    """The service's FastAPI app over ``db`` (auth none), served by uvicorn in a daemon thread."""

    def __init__(self, db: Path) -> None:
        import uvicorn
        from service_util import free_port

        from archplace.service.app import ServiceState, create_app
        from archplace.service.db import make_engine

        self.state = ServiceState(make_engine(str(db)), auth="none")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(self.state), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    def post(self, path: str, body: bytes | dict) -> requests.Response:
        if isinstance(body, dict):
            return requests.post(self.url + path, json=body, timeout=60)
        return requests.post(
            self.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=60
        )

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=60)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
