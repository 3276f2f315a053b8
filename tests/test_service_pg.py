"""The service on a real PostgreSQL server, and on two replicas.

The README offers PostgreSQL for a shared deployment and ``--replicas N``, but no test started either:
every service test ran one replica over SQLite. Here the concurrency, restart and killed-replica tests
of ``test_service.py`` run again, unchanged (their functions are imported, so pytest runs them with
this module's ``svc``), on services that differ in database and replica count:

* ``postgresql-2``: PostgreSQL (``pg_server``, started by the tests with ``initdb``/``pg_ctl``) behind
  two replicas, so two processes, each with its own searcher cache, write the same study;
* ``sqlite-2``: the same on SQLite (the embedded default), two replicas sharing one file.

One replica on SQLite is ``test_service.py`` itself. The ask/tell loop and the idempotent suggest run
first because the restart test checks that their studies survive.
"""

from __future__ import annotations

import threading

import pytest
from service_util import start_service
from test_service import (  # noqa: F401 - collected here, against this module's svc
    test_64_concurrent_clients_never_share_a_trial_and_lose_no_completion,
    test_ask_tell_loop,
    test_killed_replica_mid_load_loses_nothing,
    test_service_restart_mid_load_loses_nothing,
    test_suggest_is_idempotent_per_client,
)

pytestmark = pytest.mark.slow

CONFIGS = {"postgresql-2": ("postgresql", 2), "sqlite-2": ("sqlite", 2)}


@pytest.fixture(scope="module", params=list(CONFIGS))
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
