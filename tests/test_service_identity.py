"""Study identity and replica caches: two ``StudyService`` objects over one SQLite file are two
replicas (a Serve replica is exactly that, with HTTP in front)."""

from __future__ import annotations

import gc
import sqlite3
import weakref

import pytest
from service_core_util import GRID2, ask, replicas, study, tell


def test_delete_and_recreate_on_another_replica_never_hands_out_the_old_study(tmp_path):
    """The old code reused a deleted study's id (SQLite INTEGER PRIMARY KEY without AUTOINCREMENT),
    and each replica cached its searcher by that id: replica A, which had served 30 rounds of study R,
    answered the recreated 2-point R with the old study's architectures (arch_index 6747, 23992, ...)
    and the other replica answered 400."""
    a, b = replicas(tmp_path / "s.db")
    old, _ = a.create("alice", study("R", searcher="random", seed=1))
    old_archs = set()
    for k in range(30):
        t = ask(a, "alice", "R").trials[0]
        old_archs.add(t.arch_index)
        tell(a, "alice", "R", t.number, float(k))
    assert len(old_archs) == 30 and max(old_archs) > 1
    b.delete("alice", "R")
    new, created = b.create("alice", study("R", searcher="grid", space=GRID2))
    assert created and new.space_size == 2
    got = ask(a, "alice", "R", count=2, client_id="x").trials  # through the replica with the stale cache
    assert sorted(t.arch_index for t in got) == [0, 1]
    assert sorted(t.params["num_tc"] for t in got) == [1, 2]
    assert [t.number for t in got] == [1, 2]
    more = ask(a, "alice", "R", count=1, client_id="y")
    assert more.trials == [] and more.done
    assert ask(b, "alice", "R", count=1, client_id="z").done  # and B agrees
    for t in got:
        assert tell(b, "alice", "R", t.number, 1.0).state == "COMPLETED"
    with a.engine.connect() as conn:
        ids = [r[0] for r in conn.exec_driver_sql("SELECT id, uid FROM studies")]
        if conn.dialect.name == "sqlite":
            assert dict(conn.exec_driver_sql("SELECT name, seq FROM sqlite_sequence").all())["studies"] == 2
    assert len(ids) == 1 and ids[0] > 1  # the id of the deleted R is not reused
    assert a.get("alice", "R").space_size == 2 and old.space_size == 29_831


def test_delete_frees_the_searcher_on_every_replica(tmp_path):
    """The old code dropped a study's searcher only on the replica that served the DELETE, and the
    space's arrays stayed in ``enumerate_space``'s process-wide cache even there."""
    a, b = replicas(tmp_path / "s.db", sweep_s=0.0)
    a.create("alice", study("big", searcher="phaze"))
    ask(a, "alice", "big")
    uid = a.cache.uids()[0]
    ref = weakref.ref(a.cache.entry({"uid": uid, "space_size": 0}).searcher)
    assert ref() is not None
    b.delete("alice", "big")
    a.list("alice")  # any later request sweeps
    gc.collect()
    assert a.cache.uids() == [] and ref() is None  # nothing else held the searcher or its arrays


def test_reads_never_build_a_searcher(tmp_path, monkeypatch):
    """The old code built a searcher (enumerating the space, 5.2 s and 425 MB for a ~1M-point study)
    to answer a listing on a replica that had not cached the study."""
    from archplace.service import searchers

    (a,) = replicas(tmp_path / "s.db", 1)
    a.create("alice", study("s1", searcher="optuna"))
    t = ask(a, "alice", "s1").trials[0]
    tell(a, "alice", "s1", t.number, 2.5)
    (cold,) = replicas(tmp_path / "s.db", 1)

    def refuse(*_a, **_k):
        raise AssertionError("a read built a searcher")

    monkeypatch.setattr(searchers.StudySearcher, "__init__", refuse)
    listing = cold.list("alice").studies
    assert [(s.name, s.space_size, s.trials) for s in listing] == [("s1", 29_831, 1)]
    assert cold.get("alice", "s1").space_size == 29_831
    assert [x.value for x in cold.trials("alice", "s1").trials] == [2.5]
    assert cold.best("alice", "s1").number == t.number
    assert cold.cache.uids() == []


def test_per_owner_caps_on_studies_and_space_points(tmp_path):
    """The old code had no limit on an owner's studies or their total size."""
    from archplace.service.studies import LimitExceeded

    (a,) = replicas(tmp_path / "s.db", 1, max_studies=2, max_points=40_000)
    a.create("alice", study("one"))  # 29,831 feasible architectures
    with pytest.raises(LimitExceeded, match="over the limit of 40,000"):
        a.create("alice", study("two"))
    a.create("alice", study("two", space=GRID2))
    with pytest.raises(LimitExceeded, match="has 2 studies, the limit is 2"):
        a.create("alice", study("three", space=GRID2))
    a.create("bob", study("three", space=GRID2))  # per owner
    a.delete("alice", "two")
    a.create("alice", study("three", space=GRID2))


def test_a_database_of_the_old_schema_is_refused_in_one_line(tmp_path):
    """The old schema has no study uid; serving it would reuse ids and keep the unique index over
    every trial's architecture, so it is refused with a message saying what to do."""
    from archplace.service.db import make_engine

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE studies (id INTEGER PRIMARY KEY, owner VARCHAR(64), name VARCHAR(64), "
            "config_json TEXT, created_at FLOAT, seq INTEGER, trial_count INTEGER, done_reason TEXT)"
        )
    with pytest.raises(ValueError) as e:
        make_engine(str(db))
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "schema 1" in msg and "start with a new one" in msg
    assert str(db) in msg


def test_serve_checks_the_schema_and_passes_the_owner_limits(tmp_path):
    """`archplace serve` on a loopback host opened the database only inside the replicas, so an
    old-schema database made the start time out after 120 s instead of a one-line error; and the
    per-owner limits had no flags. Both are now checked and passed before Serve starts."""
    from archplace.service.app import ServiceState
    from archplace.service.db import make_engine
    from archplace.service.deployment import ServeConfig, check_config

    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE studies (id INTEGER PRIMARY KEY, owner VARCHAR(64), name VARCHAR(64), "
            "config_json TEXT, created_at FLOAT, seq INTEGER, trial_count INTEGER, done_reason TEXT)"
        )
    with pytest.raises(ValueError, match="schema 1"):
        check_config(ServeConfig(db=str(db), host="127.0.0.1", auth="none"))
    with pytest.raises(ValueError, match="--max-studies-per-owner must be >= 1, got 0"):
        check_config(ServeConfig(db=str(tmp_path / "new.db"), max_studies_per_owner=0))
    cfg = ServeConfig(db=str(tmp_path / "new.db"), max_studies_per_owner=3)
    check_config(cfg)
    assert cfg.study_limits() == {"max_studies": 3, "max_points": 5_000_000}
    state = ServiceState(make_engine(cfg.db), auth="none", study_limits=cfg.study_limits())
    assert (state.studies.max_studies, state.studies.max_points) == (3, 5_000_000)
