"""The service on a real PostgreSQL server, and on two replicas.

The README offers PostgreSQL for a shared deployment and ``--replicas N``, but no test started either:
every service test ran one replica over SQLite. Here the concurrency and killed-replica tests of
``test_service.py`` run again, unchanged (their functions are imported, so pytest runs them with this
module's ``svc``), its restart test among them, on services that differ in database and replica
count:

* ``postgresql-2``: PostgreSQL (``pg_server``, started by the tests with ``initdb``/``pg_ctl``) behind
  two replicas, so two processes, each with its own searcher cache, write the same study: the ask/tell
  loop, idempotent suggest, 64 concurrent clients, a killed replica and a restart, all mid-load;
* ``sqlite-2``: two replicas sharing one SQLite file: 64 concurrent clients and a killed replica.

One replica on SQLite is ``test_service.py`` itself.
"""

from __future__ import annotations

import threading

import pytest
import test_service as base
from service_util import start_service

# the functions of test_service.py, collected again here against this module's ``svc``; assigned one
# by one because pytest runs them in this order and the restart test checks the studies of the first two
test_ask_tell_loop = base.test_ask_tell_loop
test_suggest_is_idempotent_per_client = base.test_suggest_is_idempotent_per_client
test_64_concurrent_clients_never_share_a_trial_and_lose_no_completion = (
    base.test_64_concurrent_clients_never_share_a_trial_and_lose_no_completion
)
test_killed_replica_mid_load_loses_nothing = base.test_killed_replica_mid_load_loses_nothing
test_service_restart_mid_load_loses_nothing = base.test_service_restart_mid_load_loses_nothing

pytestmark = [pytest.mark.slow, pytest.mark.system]

CONFIGS = {"postgresql-2": ("postgresql", 2), "sqlite-2": ("sqlite", 2)}
# two replicas on SQLite (one replica is test_service.py): the tests where replicas contend
SQLITE_2 = {"test_64_concurrent_clients_never_share_a_trial_and_lose_no_completion",
            "test_killed_replica_mid_load_loses_nothing"}


def pytest_generate_tests(metafunc):
    if "svc" in metafunc.fixturenames:
        configs = [c for c in CONFIGS if c != "sqlite-2" or metafunc.function.__name__ in SQLITE_2]
        metafunc.parametrize("svc", configs, indirect=True, scope="module")


@pytest.fixture(scope="module")
def svc(request, ray_session, tmp_path_factory):
    from ray import serve

    backend, replicas = CONFIGS[request.param]
    tmp = tmp_path_factory.mktemp(f"service-{request.param}")
    db = None
    if backend == "postgresql":
        db = request.getfixturevalue("pg_server").create_database(request.param.replace("-", "_"))
    s = start_service(tmp, db=db, replicas=replicas)
    yield s
    serve.shutdown()


def test_a_reason_with_a_nul_character_is_refused_not_a_500(svc):
    """Old code: a completion's ``reason`` is the one request string stored as raw text (the rest is
    pattern-checked or stored as JSON, which escapes it). SQLite stored a NUL character in it;
    PostgreSQL's text cannot hold one, so psycopg raised DataError and the service answered 500. Now
    it is a 422 naming the field on every database, and other control characters are stored as sent."""
    from archplace.client import ServiceError

    c = svc.client("alice")
    c.create_study(name="nul", models=["bert-base"], searcher="random", seed=5)
    a, b = c.suggest("nul", count=2, client_id="nul")
    with pytest.raises(ServiceError) as e:
        c.complete("nul", a["number"], infeasible=True, reason="too big\x00for HBM")
    assert e.value.status == 422 and e.value.message.startswith("reason:"), e.value.message
    assert c.trial("nul", a["number"])["state"] == "PENDING"
    odd = "too big\x01\t\u00e9\U0001f600 for HBM"
    assert c.complete("nul", b["number"], infeasible=True, reason=odd)["reason"] == odd
    assert c.trial("nul", b["number"])["reason"] == odd


def test_plain_postgresql_url_gets_the_installed_driver(pg_server):
    """Old code: ``--db postgresql://...`` (the form PostgreSQL's own docs and most hosts give) went
    to SQLAlchemy as is, which picks psycopg2 for it; only psycopg 3 is installed, so every replica
    failed at start with ``No module named 'psycopg2'``."""
    import sqlalchemy as sa

    from archplace.service.db import database_url, make_engine, studies

    url = pg_server.create_database("plain_url")
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    assert database_url(plain) == url
    assert database_url(plain.replace("postgresql://", "postgres://")) == url
    assert database_url("mysql+pymysql://u@h/d") == "mysql+pymysql://u@h/d"  # other URLs as given
    engine = make_engine(plain)
    try:
        with engine.connect() as conn:
            assert engine.dialect.driver == "psycopg"
            assert conn.execute(sa.select(sa.func.count()).select_from(studies)).scalar_one() == 0
    finally:
        engine.dispose()


def test_replicas_creating_the_schema_together_on_postgresql(pg_server):
    """Old code: replicas of a fresh deployment create the schema at the same moment; PostgreSQL
    reports the losers of that race as a unique violation in its catalog (IntegrityError) or
    'relation already exists' (ProgrammingError), which make_engine's retry (OperationalError only)
    did not catch, so a replica died at start. Here 8 engines create it at once on a fresh database."""
    import sqlalchemy as sa

    from archplace.service.db import make_engine, metadata

    url = pg_server.create_database("schema_race")
    barrier = threading.Barrier(8)
    errors: list[str] = []
    engines: list = []

    def create() -> None:
        barrier.wait()
        try:
            engines.append(make_engine(url))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    for e in engines:
        e.dispose()
    assert not errors, errors[:2]
    assert len(engines) == 8
    eng = sa.create_engine(url)
    try:
        assert set(sa.inspect(eng).get_table_names()) == set(metadata.tables)
    finally:
        eng.dispose()
