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
        while len(db._QUEUES.get(engine, ())) < 8:
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
    assert not db._QUEUES[engine]
    with engine.connect() as conn:  # the pooled connection no longer asks for the write lock
        assert "write" not in conn.info


def test_fifo_lock_serves_waiters_in_arrival_order():
    from archplace.service.fifo_lock import FifoLock

    lock, order = FifoLock(), []

    def waiter(k: int) -> None:
        with lock:
            order.append(k)

    threads = []
    with lock:
        for k in range(6):  # each queues before the next starts
            th = threading.Thread(target=waiter, args=(k,))
            th.start()
            threads.append(th)
            deadline = time.monotonic() + 30
            while len(lock._waiters) < k + 1:
                assert time.monotonic() < deadline
                time.sleep(0.005)
    for th in threads:
        th.join(30)
    assert order == list(range(6))
    assert not lock._held


def test_two_engines_on_one_file_take_turns_through_the_file_lock(tmp_path):
    """Two engines (two replicas' worth) on one SQLite file: while one holds the writer lock, the other
    waits in the kernel's file lock rather than in SQLite's sleeping busy handler."""
    a, b = db.make_engine(tmp_path / "s.db"), db.make_engine(tmp_path / "s.db")
    got = []
    with db._writer_lock(a):
        th = threading.Thread(target=lambda: got.append(db.group_write(b, _insert(7))))
        th.start()
        th.join(0.3)
        assert th.is_alive() and not got  # blocked behind a's file lock
    th.join(30)
    assert got == [49]
    assert (tmp_path / "s.db.writer-lock").stat().st_mode & 0o777 == 0o600
