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


def contend(db: Path, searcher: str, **replica_kw) -> None:
    """Eight threads on each of two replicas suggest (count 2) and complete on one study; every fifth
    trial is abandoned and the shared clock runs its lease out. Asserts: no error, no architecture held
    twice, every completion stored with its value, more than 50 of them, and some released architectures
    handed out again (tests/test_service_leases.py, and with a proposal pool tests/test_service_pool.py)."""
    from collections import Counter

    from archplace.service.studies import Conflict

    clock = Clock()
    a, b = replicas(db, clock=clock, **replica_kw)
    a.create("alice", study("c", searcher=searcher, lease_s=100, seed=3))
    done, errors, lock = {}, [], threading.Lock()

    def worker(svc, k: int) -> None:
        try:
            for r in range(6):
                for t in ask(svc, "alice", "c", count=2, client_id=f"w{k}-{r}").trials:
                    if (t.number + k) % 5 == 0:
                        continue  # abandoned: its lease runs out below
                    try:
                        tell(svc, "alice", "c", t.number, float(t.arch_index % 11))
                    except Conflict as e:  # its lease ran out first: the trial is ABANDONED
                        assert "ABANDONED" in str(e)
                        continue
                    with lock:
                        done[t.number] = float(t.arch_index % 11)
                if k == 0:
                    clock.advance(60)  # leases run out now and then
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(svc, k)) for k in range(8) for svc in (a, b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    assert not errors, errors[:3]
    rows = a.trials("alice", "c", page_size=1000).trials
    held = [t.arch_index for t in rows if not (t.state == "ABANDONED")]
    assert max(Counter(held).values()) == 1
    by_number = {t.number: t for t in rows}
    for n, v in done.items():
        assert by_number[n].state == "COMPLETED" and by_number[n].value == v
    assert len(done) > 50
    released = {t.arch_index for t in rows if t.state == "ABANDONED"}
    assert released and released & set(held)  # leases ran out and their architectures went out again


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
