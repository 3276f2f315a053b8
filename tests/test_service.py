"""The service over HTTP: Ray Serve on 127.0.0.1 with a SQLite database, driven by the Python client.

The measurements the tests report are a closed form of the architecture (``_value``), so every
check is exact: the best trial is the arg-max of the reported values, every completion is found in
the database with the value its client sent, and no architecture is ever handed out twice."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
from service_util import replica_actor_names, start_service

pytestmark = pytest.mark.slow


def _value(params: dict) -> float:
    """A stand-in measurement: exact, and different for different architectures."""
    return params["num_tc"] * params["pe_x"] * params["pe_y"] / params["area_mm2"] + params["num_vc"] * 1e-3


@pytest.fixture(scope="module")
def svc(ray_session, tmp_path_factory):
    from ray import serve

    s = start_service(tmp_path_factory.mktemp("service"))
    yield s
    serve.shutdown()


def test_ask_tell_loop(svc):
    from archplace.hardware.presets import TPUV4

    c = svc.client("alice")
    study = c.create_study(name="loop", models=["bert-large"], searcher="phaze", max_trials=12)
    assert study["resource"] == "owners/alice/studies/loop" and study["space_size"] == 29_831
    assert c.create_study(name="loop", models=["bert-large"], searcher="phaze", max_trials=12)["trials"] == 0
    sent, seen = {}, []
    while True:
        resp = c.suggest_response("loop", count=3, client_id="tuner")
        if not resp["trials"]:
            assert resp["done"] and resp["done_reason"] == "max_trials reached"
            break
        for t in resp["trials"]:
            seen.append(t["arch_index"])
            if t["number"] == 5:
                c.complete("loop", 5, infeasible=True, reason="does not fit in 32 GB of HBM")
                continue
            sent[t["number"]] = _value(t["params"])
            done = c.complete("loop", t["number"], value=sent[t["number"]])
            assert done["state"] == "COMPLETED" and done["value"] == sent[t["number"]]
    assert seen == list(range(12))  # Phaze: decreasing area from the reference
    first = c.trial("loop", 1)["params"]
    assert {k: first[k] for k in ("num_tc", "num_vc", "pe_x", "pe_y", "glb_mb")} == {
        "num_tc": TPUV4.num_tc,
        "num_vc": TPUV4.num_vc,
        "pe_x": TPUV4.pe_x,
        "pe_y": TPUV4.pe_y,
        "glb_mb": TPUV4.glb_mb,
    }
    best = c.best("loop")
    assert best["value"] == max(sent.values()) and best["number"] == max(sent, key=sent.get)
    infeasible = c.trial("loop", 5)
    assert infeasible["state"] == "INFEASIBLE" and infeasible["value"] is None  # never a 0
    assert infeasible["reason"] == "does not fit in 32 GB of HBM"
    # paging: 5 + 5 + 2, in trial order
    numbers, token = [], None
    while True:
        page = c.request(
            "GET",
            "/v1/studies/loop/trials",
            params={"page_size": 5, **({"page_token": token} if token else {})},
        )
        numbers += [t["number"] for t in page["trials"]]
        token = page["next_page_token"]
        if not token:
            break
    assert numbers == list(range(1, 13))
    assert [t["number"] for t in c.trials("loop", state="INFEASIBLE")] == [5]
    # a completion retried with the same measurement is accepted; another measurement is a conflict
    assert c.complete("loop", 1, value=sent[1])["value"] == sent[1]
    from archplace.client import ServiceError

    with pytest.raises(ServiceError) as e:
        c.complete("loop", 1, value=sent[1] + 1)
    assert e.value.status == 409 and "already COMPLETED" in e.value.message


def test_suggest_is_idempotent_per_client(svc):
    c = svc.client("alice")
    c.create_study(name="idem", models=["bert-base"], searcher="random", seed=3)
    a = c.suggest("idem", count=2, client_id="w1")
    again = c.suggest("idem", count=2, client_id="w1")
    assert [t["number"] for t in again] == [t["number"] for t in a]  # the same pending trials
    more = c.suggest("idem", count=3, client_id="w1")  # its pending ones, then one new (count honoured)
    assert [t["number"] for t in more] == [t["number"] for t in a] + [3]
    b = c.suggest("idem", count=2, client_id="w2")
    assert not {t["arch_index"] for t in more} & {t["arch_index"] for t in b}
    for t in a:
        c.complete("idem", t["number"], value=_value(t["params"]))
    nxt = c.suggest("idem", count=2, client_id="w1")
    assert [t["number"] for t in nxt] == [3, 6]


def test_multi_objective_pareto_front(svc):
    import numpy as np

    c = svc.client("alice")
    c.create_study(
        name="mo",
        models=["bert-base"],
        searcher="grid",
        objectives=[{"name": "throughput", "goal": "maximize"}, {"name": "area", "goal": "minimize"}],
    )
    pts = {}
    for t in c.suggest("mo", count=30, client_id="x"):
        v = {"throughput": _value(t["params"]), "area": t["params"]["area_mm2"]}
        pts[t["number"]] = v
        c.complete("mo", t["number"], values=v)
    front = {t["number"] for t in c.pareto("mo")}
    brute = {
        i
        for i, p in pts.items()
        if not any(
            q["throughput"] >= p["throughput"] and q["area"] <= p["area"] and q != p for q in pts.values()
        )
    }
    assert front == brute and front
    assert np.isclose(c.best("mo")["value"], max(p["throughput"] for p in pts.values()))


def test_owners_cannot_see_each_other(svc):
    from archplace.client import ServiceError

    a, b = svc.client("alice"), svc.client("bob")
    a.create_study(name="private", models=["bert-base"])
    t = a.suggest("private", client_id="a")[0]
    for call in (
        lambda: b.get_study("private"),
        lambda: b.suggest("private"),
        lambda: b.complete("private", t["number"], value=1.0),
        lambda: b.delete_study("private"),
        lambda: b.trials("private"),
        lambda: b.best("private"),
    ):
        with pytest.raises(ServiceError) as e:
            call()
        assert e.value.status == 404
    assert "private" not in {s["name"] for s in b.list_studies()}
    assert a.trial("private", t["number"])["state"] == "PENDING"  # untouched by bob's attempts
    from archplace.client import Client

    for token in ("ap_forged", None):
        with pytest.raises(ServiceError) as e:
            Client(svc.url, token).list_studies()
        assert e.value.status == 401


def test_64_concurrent_clients_never_share_a_trial_and_lose_no_completion(svc):
    c = svc.client("alice")
    c.create_study(name="crowd", models=["bert-large"], searcher="phaze", hysteresis=1000)
    received, errors = [], []
    lock = threading.Lock()

    def worker(k: int) -> None:
        cl = svc.client("alice", retries=30)
        try:
            for _ in range(4):
                for t in cl.suggest("crowd", count=2, client_id=f"client-{k}"):
                    cl.complete("crowd", t["number"], value=_value(t["params"]))
                    with lock:
                        received.append((t["number"], t["arch_index"], _value(t["params"])))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(64)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not errors, errors[:3]
    assert len(received) == 64 * 4 * 2
    assert max(Counter(a for _, a, _ in received).values()) == 1  # no architecture twice
    assert max(Counter(n for n, _, _ in received).values()) == 1  # no trial twice
    rows = {t["number"]: t for t in c.trials("crowd")}
    assert len(rows) == len(received)
    for n, a, v in received:
        assert rows[n]["state"] == "COMPLETED" and rows[n]["value"] == v and rows[n]["arch_index"] == a
    assert sorted(a for _, a, _ in received) == list(range(len(received)))  # Phaze order, no gaps


def _load(svc, study: str, clients: int, rounds: int, disturb, after_done: int):
    """``clients`` threads doing ask/tell; ``disturb()`` runs once ``after_done`` trials are complete."""
    c = svc.client("alice", retries=60)
    c.create_study(name=study, models=["bert-large"], searcher="random", seed=7)
    received, errors, lock = [], [], threading.Lock()

    def worker(k: int) -> None:
        cl = svc.client("alice", retries=60, backoff_s=0.5)
        try:
            for _ in range(rounds):
                for t in cl.suggest(study, count=1, client_id=f"w{k}"):
                    v = _value(t["params"])
                    cl.complete(study, t["number"], value=v)
                    with lock:
                        received.append((t["number"], t["arch_index"], v))
                    time.sleep(0.05)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    # disturb once a share of the load is done (a fixed delay raced a fast machine: all 96 finished
    # inside 2 s once), and while every client still has rounds left
    deadline = time.monotonic() + 300
    while len(received) < after_done and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    n_before = len(received)
    disturb()
    for th in threads:
        th.join(timeout=600)
    assert not errors, errors[:3]
    assert 0 < n_before < clients * rounds, "the disturbance did not land mid-load"
    assert len(received) == clients * rounds
    rows = {t["number"]: t for t in svc.client("alice", retries=60).trials(study)}
    assert len(rows) == clients * rounds
    assert max(Counter(a for _, a, _ in received).values()) == 1
    for n, a, v in received:
        assert rows[n]["state"] == "COMPLETED" and rows[n]["value"] == v and rows[n]["arch_index"] == a


@pytest.mark.system   # a Serve restart under load (about 1 min): make test-system
def test_service_restart_mid_load_loses_nothing(svc):
    """``_load`` with a restart of the whole Serve instance (proxy included) once 16 trials are
    complete. A completed operation survives; one submitted just before the restart is adopted and run
    again by the restarted replicas through its lease on the database's clock. (The operation in flight
    used to be a 120-sample random partition: the same check, 40 s longer on 2 cores.)"""
    c = svc.client("alice", retries=60)
    c.create_study(name="kept", models=["bert-large"], searcher="random", seed=1)
    before = {s["name"] for s in c.list_studies()}   # what the module's tests made so far, and "kept"
    done = c.partition("bert-base", algo="greedy", chiplets=4, seq=128, timeout_s=600)
    in_flight: list[dict] = []

    def restart() -> None:
        in_flight.append(c.partition("bert-base", algo="greedy", chiplets=16, seq=128, wait=False))
        svc.restart()

    _load(svc, "restart", clients=8, rounds=12, disturb=restart, after_done=16)
    assert c.operation(done["id"]) == done  # a completed operation survives
    after = c.wait(in_flight[0]["id"], timeout_s=600)  # the one in flight is run (again) after it
    assert after["state"] == "DONE" and after["result"]["valid"] and after["result"]["chiplets"] == 16, after
    assert {s["name"] for s in c.list_studies()} >= before | {"kept", "restart"}   # every study survives


def test_killed_replica_mid_load_loses_nothing(svc):
    import ray

    def kill() -> None:
        names = replica_actor_names()
        assert names
        for n in names:
            ray.kill(ray.get_actor(n, namespace="serve"), no_restart=True)

    _load(svc, "killed", clients=8, rounds=12, disturb=kill, after_done=16)
    assert replica_actor_names()  # Serve replaced it


def test_managed_evaluation_equals_place(svc):
    from archplace import api

    c = svc.client("alice")
    op = c.evaluate("bert-base", "tpuv4", accelerators=64, global_batch=256, sequential=True, timeout_s=600)
    assert op["state"] == "DONE" and not op["cached"], op
    local = api.place(
        api.PlaceRequest(model="bert-base", arch="tpuv4", accelerators=64, global_batch=256, sequential=True)
    ).to_dict()
    got = dict(op["result"])
    for d in (got, local):
        d.pop("timing_s", None)
    assert json.loads(json.dumps(local)) == got
    again = c.evaluate("bert-base", "tpuv4", accelerators=64, global_batch=256, sequential=True)
    assert again["cached"] and again["state"] == "DONE" and again["result"] == op["result"]
    # bad input is refused before any work: a path is not an architecture
    from archplace.client import ServiceError

    with pytest.raises(ServiceError) as e:
        c.evaluate("bert-base", "/etc/passwd.json")
    assert e.value.status == 422 and "arch" in e.value.message


def test_managed_evaluation_with_the_ilp_is_cached_unless_load_dependent(svc):
    """An ILP evaluation stops on deterministic budgets, so its result is cached; one whose slices the
    wall-clock safety limit stopped depends on the load of the node that ran it and is not."""
    c = svc.client("alice")
    opts = {"accelerators": 64, "global_batch": 256, "hbm_gb": [32.0], "fixed": [1, 64, 1],
            "ilp_budget": 0.05}
    op = c.evaluate("bert-base", "tpuv4", timeout_s=600, **opts)
    assert op["state"] == "DONE" and op["result"]["ilp"]["load_dependent"] == 0
    assert op["result"]["ilp"]["budget"] == {"dtime_per_slice": 0.05, "wall_limit_s_per_slice": 120.0}
    again = c.evaluate("bert-base", "tpuv4", **opts)
    assert again["cached"] and again["result"] == op["result"]
    # another budget: the worker's in-memory schedule cache holds the slices of the first one, and
    # a cached deterministic answer does not depend on the safety limit
    opts["ilp_budget"] = 0.07
    rushed = c.evaluate("bert-base", "tpuv4", timeout_s=600, ilp_time_limit_s=1e-6, **opts)
    assert rushed["state"] == "DONE" and rushed["result"]["ilp"]["load_dependent"] > 0
    assert rushed["result"]["ilp"]["stopped_by"]["wall_limit"] == rushed["result"]["ilp"]["load_dependent"]
    assert not c.evaluate("bert-base", "tpuv4", timeout_s=600, ilp_time_limit_s=1e-6, **opts)["cached"]


def test_operation_cancel_and_partition(svc):
    c = svc.client("alice")
    op = c.partition("bert-base", algo="greedy", chiplets=16, seq=128, timeout_s=600)
    assert op["state"] == "DONE" and op["result"]["valid"] and op["result"]["chiplets"] == 16
    long = c.partition("bert-large", algo="sa", chiplets=36, budget=5000, seed=1, wait=False)
    cancelled = c.cancel(long["id"])
    assert cancelled["state"] in ("CANCELLED", "RUNNING")
    final = c.wait(long["id"], timeout_s=120)
    assert final["state"] == "CANCELLED" and final["result"] is None
    assert c.operation(long["id"])["error"].startswith("cancelled")


def test_managed_plan_equals_plan(svc):
    """``Client.plan`` waits for the ``POST /v1/plans`` operation, which a Ray task ran: the same answer
    as ``api.plan`` (best knobs and step time), cached for the next equal request; a bad field is a
    422 naming it."""
    from archplace import api
    from archplace.client import ServiceError

    c = svc.client("alice")
    op = c.plan("llama2-7b", 8, 64, gpu="a100-80gb", seq=2048, top_k=2, timeout_s=600)
    assert op["state"] == "DONE" and op["kind"] == "plan", op
    want = api.plan(api.PlanRequest(model="llama2-7b", gpus=8, global_batch=64, gpu="a100-80gb", seq=2048,
                                    top_k=2)).to_dict()
    got = op["result"]
    assert got["best"]["step_time_s"] == want["best"]["step_time_s"]
    assert {k: v for k, v in got.items() if k != "wall_s"} == json.loads(
        json.dumps({k: v for k, v in want.items() if k != "wall_s"}))
    again = c.plan("llama2-7b", 8, 64, gpu="a100-80gb", seq=2048, top_k=2)
    assert again["cached"] and again["result"] == op["result"]
    with pytest.raises(ServiceError) as e:
        c.plan("llama2-7b", 8, 64, gpu="p100-pcie")
    assert e.value.status == 422 and e.value.message.startswith("gpu:")


def test_non_loopback_bind_without_auth_is_refused(tmp_path, capsys):
    from archplace.cli import main
    from archplace.service.deployment import ServeConfig, check_config

    with pytest.raises(ValueError, match="refusing to serve without authentication"):
        check_config(ServeConfig(db=str(tmp_path / "a.db"), host="0.0.0.0", auth="none"))
    with pytest.raises(ValueError, match="has no token"):
        check_config(ServeConfig(db=str(tmp_path / "b.db"), host="0.0.0.0", auth="token"))
    check_config(ServeConfig(db=str(tmp_path / "c.db"), host="127.0.0.1", auth="none"))  # loopback: allowed
    assert main(["serve", "--host", "0.0.0.0", "--auth", "none", "--db", str(tmp_path / "d.db")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing to serve without authentication" in err


def test_token_command_prints_the_token_last_and_stores_its_hash(tmp_path, capsys):
    import sqlalchemy as sa

    from archplace.cli import main
    from archplace.service.auth import token_hash
    from archplace.service.db import make_engine, tokens

    db = str(tmp_path / "t.db")
    assert main(["serve", "token", "create", "carol", "--db", db]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    assert token.startswith("ap_") and len(token) > 40
    with make_engine(db).connect() as conn:
        rows = conn.execute(sa.select(tokens)).mappings().all()
    assert [r["owner"] for r in rows] == ["carol"] and rows[0]["token_sha256"] == token_hash(token)
    assert token not in json.dumps([dict(r) for r in rows])
    assert main(["serve", "token", "create", "Bad Owner!", "--db", db]) == 2
