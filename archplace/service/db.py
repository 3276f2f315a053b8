"""The service's tables and engine (SQLAlchemy Core): owners' tokens, studies, trials, long-running
operations and the evaluation cache.

SQLite in WAL mode under a data directory is the embedded default; any SQLAlchemy URL (PostgreSQL for
a shared deployment) works too. The database is the single source of truth: a service replica keeps
nothing that a restart could lose, only caches rebuilt from these rows.

One writer per study: every mutation of a study runs in ``write_tx``, which on SQLite takes the
database's write lock at the start of the transaction (``BEGIN IMMEDIATE``), and on other databases
locks the study's row (``SELECT ... FOR UPDATE``: ``statements.SQL["study_for_update"]``). The
transaction only reserves rows: the searcher proposes outside it (``studies.py``). A unique index on
(study, architecture) over the trials that hold their architecture (all but those whose lease expired)
makes a double suggestion impossible even if that discipline were broken.

Identity: a study's ``uid`` (a random 128-bit hex) is never reused, and neither is its ``id``
(AUTOINCREMENT on SQLite; a sequence elsewhere). Replica caches are keyed by the uid, so a study
deleted and created again under the same name is a different study to every replica.

Schema version 2 (uid, leases, released architectures, stored space size). A database written by an
earlier version is refused at start with a one-line message: its unique index over every trial's
architecture cannot be relaxed in place on SQLite, so it must be moved aside and created anew.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
import weakref
from collections import deque
from contextlib import contextmanager, nullcontext
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event

from .fifo_lock import FifoLock

metadata = sa.MetaData()
SCHEMA_VERSION = 2

meta = sa.Table(
    "meta",
    metadata,
    sa.Column("key", sa.String(32), primary_key=True),
    sa.Column("value", sa.String(64), nullable=False),
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False, index=True),
    sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),  # never the token itself
    sa.Column("prefix", sa.String(16), nullable=False),  # shown in listings to tell tokens apart
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked", sa.Boolean, nullable=False, default=False),
)

studies = sa.Table(
    "studies",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    # the study's identity: never reused, unlike a name (and, before schema 2, the id on SQLite)
    sa.Column("uid", sa.String(32), nullable=False, unique=True, default=lambda: uuid.uuid4().hex),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("config_json", sa.Text, nullable=False),
    sa.Column("space_size", sa.Integer, nullable=False),  # feasible architectures: listings need no searcher
    sa.Column("created_at", sa.Float, nullable=False),
    # bumped by every trial creation and completion: a replica's searcher replays what came after
    # the sequence number it last saw
    sa.Column("seq", sa.Integer, nullable=False, default=0),
    sa.Column("trial_count", sa.Integer, nullable=False, default=0),
    sa.Column("done_reason", sa.Text, nullable=True),  # why the searcher suggests nothing more
    sa.UniqueConstraint("owner", "name", name="uq_study_owner_name"),
    sqlite_autoincrement=True,  # a deleted study's id is never handed out again
)

trials = sa.Table(
    "trials",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study_id", sa.Integer, sa.ForeignKey("studies.id", ondelete="CASCADE"), nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("arch_index", sa.Integer, nullable=False),
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("client_id", sa.String(128), nullable=False),
    # PENDING, COMPLETED, INFEASIBLE, FAILED, ABANDONED
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("value", sa.Float, nullable=True),  # the primary objective; NULL unless COMPLETED
    sa.Column("values_json", sa.Text, nullable=True),  # every objective, when COMPLETED
    sa.Column("reason", sa.Text, nullable=True),  # why INFEASIBLE / FAILED / ABANDONED
    sa.Column("created_seq", sa.Integer, nullable=False),
    sa.Column("completed_seq", sa.Integer, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("completed_at", sa.Float, nullable=True),
    sa.Column("lease_expires_at", sa.Float, nullable=True),  # a PENDING trial is ABANDONED after this
    # an ABANDONED trial whose lease expired gives its architecture back to the pool
    sa.Column("released", sa.Boolean, nullable=False, default=False),
    sa.UniqueConstraint("study_id", "number", name="uq_trial_number"),
    sa.Index("ix_trials_lease", "study_id", "state", "lease_expires_at"),
    sa.Index("ix_trials_client", "study_id", "client_id", "state"),
    sa.Index("ix_trials_completed_seq", "study_id", "completed_seq"),
)

operations = sa.Table(
    "operations",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),  # evaluate, partition, pipeline, shard
    sa.Column("request_json", sa.Text, nullable=False),
    sa.Column("cache_key", sa.String(64), nullable=False, index=True),
    # PENDING, RUNNING, DONE, FAILED, CANCELLED
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("result_json", sa.Text, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("cached", sa.Boolean, nullable=False, default=False),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, default=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("runner", sa.String(64), nullable=True),  # the replica running it
    sa.Column("lease_expires_at", sa.Float, nullable=True),  # another replica adopts it after this
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

# no architecture twice among the trials that hold one
_held = trials.c.released == sa.false()
sa.Index(
    "uq_trial_arch_held",
    trials.c.study_id,
    trials.c.arch_index,
    unique=True,
    sqlite_where=_held,
    postgresql_where=_held,
)

results_cache = sa.Table(
    "results_cache",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),  # sha256 of kind, request and code version
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("result_json", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)


def database_url(db: str | Path) -> str:
    """A SQLAlchemy URL from ``--db``: a URL as is, anything else a SQLite file path. A plain
    ``postgresql://`` (or ``postgres://``) URL gets the psycopg 3 driver, the one archplace installs:
    SQLAlchemy's default for it is psycopg2, which is not installed (it failed with
    ``No module named 'psycopg2'``)."""
    text = str(db)
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme in ("postgresql", "postgres"):
            return f"postgresql+psycopg://{rest}"
        return text
    path = Path(text).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def make_engine(db: str | Path) -> sa.Engine:
    """The engine with the schema created. SQLite gets WAL (readers never block the writer), a
    5 s busy timeout and ``BEGIN IMMEDIATE`` transactions (see the module docstring)."""
    url = database_url(db)
    if url.startswith("sqlite"):
        engine = sa.create_engine(
            url, connect_args={"timeout": 30, "check_same_thread": False}, pool_size=8, max_overflow=32
        )

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record) -> None:
            dbapi_conn.isolation_level = None  # SQLAlchemy issues BEGIN below, not the driver
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("write") else "BEGIN")
    else:
        # pre-ping: a pooled connection that a database restart cut is replaced, not handed to a request
        args = {"connect_timeout": 10} if url.startswith("postgresql") else {}
        engine = sa.create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=32, connect_args=args)
    if engine.dialect.name == "postgresql":
        # Replicas starting together race to create the schema, and PostgreSQL reports the loser as
        # a unique violation in its catalog (IntegrityError) or "already exists" (ProgrammingError),
        # which the retry below did not catch: the second replica of a fresh deployment died. DDL is
        # transactional here, so one transaction-scoped advisory lock serialises the creators.
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK_KEY})
            metadata.create_all(conn)
        check_schema(engine)
        return engine
    for attempt in range(5):  # replicas starting together may race to create the schema
        try:
            metadata.create_all(engine)
            break
        except sa.exc.OperationalError:
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    check_schema(engine)
    return engine


def check_schema(engine: sa.Engine) -> None:
    """Record the schema version in a new database; refuse one an earlier version wrote (see the
    module docstring) with a one-line message, rather than fail later on a missing column."""
    cols = {c["name"] for c in sa.inspect(engine).get_columns("studies")}
    where = engine.url.render_as_string(hide_password=True)
    for attempt in range(2):  # replicas starting together may both insert the version
        try:
            with write_tx(engine) as conn:
                got = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema")).scalar()
                if got is None and "uid" in cols:
                    conn.execute(sa.insert(meta).values(key="schema", value=str(SCHEMA_VERSION)))
                    return
            break
        except sa.exc.IntegrityError:
            if attempt:
                raise
    if got != str(SCHEMA_VERSION):
        raise ValueError(
            f"database {where} has service schema {got or 1}, this archplace needs {SCHEMA_VERSION}: "
            "move it aside and start with a new one (studies cannot be migrated in place)"
        )


_SCHEMA_LOCK_KEY = 0x61726368706C6163 & 0x7FFFFFFFFFFFFFFF  # "archplac": any fixed bigint shared by replicas


class _SQLiteWriter:
    """On SQLite, one writing thread per process at a time, and one process at a time per file.

    Why: SQLite has one write lock for the whole file, and its busy handler sleeps in growing steps
    (up to 100 ms) while it waits. Inside a process, 32 request threads contending for it spent most
    of their time asleep (measured: 72 requests/s at 16 clients fell to 14 at 64), so they queue on a
    ``FifoLock`` that hands the write lock over at once. Between processes (replicas on one file) the
    same sleeps let one replica starve the other's requests for seconds, so the holder also takes an
    ``flock`` on a file beside the database, in whose queue the kernel wakes a waiting process the
    moment it is released (the busy handler stays as the backstop for writers that do not take it)."""

    def __init__(self, path: str | None) -> None:
        self._threads = FifoLock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if path else None

    def __enter__(self) -> _SQLiteWriter:
        self._threads.acquire()
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # blocks without the GIL
            except BaseException:
                self._threads.release()
                raise
        return self

    def locked(self) -> bool:
        return self._threads.locked()

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()


# per engine, gone with it (an id() key could be reused by a later engine on another file)
_SQLITE_WRITERS: weakref.WeakKeyDictionary[sa.Engine, _SQLiteWriter] = weakref.WeakKeyDictionary()
_QUEUES: weakref.WeakKeyDictionary[sa.Engine, deque] = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def _writer_lock(engine: sa.Engine):
    """The engine's ``_SQLiteWriter`` on SQLite; none elsewhere (PostgreSQL's row locks are per study)."""
    if engine.dialect.name != "sqlite":
        return nullcontext()
    with _GUARD:
        w = _SQLITE_WRITERS.get(engine)
        if w is None:
            file = engine.url.database
            path = f"{file}.writer-lock" if file and file != ":memory:" else None
            w = _SQLITE_WRITERS[engine] = _SQLiteWriter(path)
            if w._fd is not None:
                weakref.finalize(engine, os.close, w._fd)
        return w


@contextmanager
def write_tx(engine: sa.Engine):
    """A transaction that may write: on SQLite it holds the write lock from its first statement, so
    a read-then-write (suggest, complete) cannot interleave with another writer."""
    with _writer_lock(engine), _write_transaction(engine) as conn:
        yield conn


@contextmanager
def _write_transaction(engine: sa.Engine):
    """A transaction marked as a writer's (``BEGIN IMMEDIATE`` on SQLite), for a caller that already
    holds the writer lock; the pooled connection forgets the mark afterwards."""
    with engine.connect() as conn:
        conn.info["write"] = True
        try:
            with conn.begin():
                yield conn
        finally:
            conn.info.pop("write", None)


class _Write:
    """One request's part of a group commit: its function, then its result or its error."""

    __slots__ = ("fn", "done", "value", "error")

    def __init__(self, fn) -> None:
        self.fn, self.done, self.value, self.error = fn, False, None, None


def group_write(engine: sa.Engine, fn):
    """``fn(conn)`` in a write transaction shared with every other ``group_write`` of this process
    that is waiting for the write lock (a group commit), its result once that transaction committed.

    Why: on SQLite one writer serves the whole file, so concurrent completes queue for the write lock
    one transaction each; the thread that gets the lock now commits all that queued behind it in one
    ``BEGIN IMMEDIATE`` ... ``COMMIT``, and a second replica waits for the file's lock once per batch
    instead of once per request. Each function runs inside its own SAVEPOINT: one that raises (a
    conflict, a bad value) rolls back only its own statements and gets its own exception; a commit
    that fails fails every request of the batch, none of which was answered yet, so nothing
    acknowledged is lost. Other databases have row locks per study and their own concurrency: there
    ``fn`` runs in its own ``write_tx``."""
    if engine.dialect.name != "sqlite":
        with write_tx(engine) as conn:
            return fn(conn)
    me = _Write(fn)
    with _GUARD:
        q = _QUEUES.setdefault(engine, deque())
    q.append(me)  # deque.append and popleft are atomic
    with _writer_lock(engine):
        if not me.done:  # nobody committed it while this thread waited: lead a batch
            batch = []
            while q:
                batch.append(q.popleft())
            try:
                with _write_transaction(engine) as conn:
                    for w in batch:
                        try:
                            with conn.begin_nested():
                                w.value = w.fn(conn)
                        except Exception as e:  # noqa: BLE001 - handed to its own request below
                            w.error = e
            except Exception as e:  # noqa: BLE001 - the commit failed: every request of the batch
                for w in batch:
                    w.error = w.error or e
            for w in batch:
                w.done = True
    if me.error is not None:
        raise me.error
    return me.value


@contextmanager
def read_tx(engine: sa.Engine):
    with engine.connect() as conn, conn.begin():
        yield conn
