"""Group commit on SQLite (``service.db.group_write``): writes waiting for the file's write lock commit
in one transaction, each in its own savepoint, and every caller gets its own result or its own error."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa
from sqlalchemy import event

from archplace.service import db


def _insert(k: int):
    def fn(conn):
        conn.execute(sa.insert(db.meta).values(key=f"k{k}", value=str(k)))
        if k == 3:
            raise ValueError("bad 3")  # after its insert: the savepoint must take the row back
        return k * k

    return fn


def test_waiting_writes_commit_once_and_a_failure_stays_its_own(tmp_path):
    engine = db.make_engine(tmp_path / "s.db")
    commits: list[int] = []
    event.listen(engine, "commit", lambda _conn: commits.append(1))
    results, errors = {}, {}

    def worker(k: int) -> None:
        try:
            results[k] = db.group_write(engine, _insert(k))
        except ValueError as e:
            errors[k] = str(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    with db._writer_lock(engine):  # hold the write lock until all eight are queued behind it
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while len(db._QUEUES.get(id(engine), ())) < 8:
            assert time.monotonic() < deadline, "the writers never queued"
            time.sleep(0.01)
    for th in threads:
        th.join(30)
    assert results == {k: k * k for k in range(8) if k != 3}
    assert errors == {3: "bad 3"}
    assert len(commits) == 1  # one transaction for all eight
    with db.read_tx(engine) as conn:
        keys = set(conn.execute(sa.select(db.meta.c.key).where(db.meta.c.key.like("k%"))).scalars())
    assert keys == {f"k{k}" for k in range(8) if k != 3}


def test_a_lone_write_commits_alone_and_leaves_the_connection_for_readers(tmp_path):
    engine = db.make_engine(tmp_path / "s.db")
    assert db.group_write(engine, _insert(5)) == 25
    assert not db._QUEUES[id(engine)]
    with engine.connect() as conn:  # the pooled connection no longer asks for the write lock
        assert "write" not in conn.info
