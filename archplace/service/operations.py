"""Managed evaluations as long-running operations: create, poll, cancel; run as Ray tasks.

An HTTP request only writes a PENDING row (or answers at once from the evaluation cache), so requests
stay short whatever the work. Each replica runs a small loop (``OperationRunner``) that:

* adopts PENDING operations, and RUNNING ones whose runner's lease ran out (a replica or the whole
  service that died mid-run), up to the cluster's free CPUs, and submits each as a Ray task owned by
  the replica (it dies with the replica; the lease then lets another replica, or the restarted
  service, run it again);
* renews the leases of what it runs, collects finished tasks, writes their results (and the cache
  entry keyed by the request's content and the code version) and carries out cancellations.

Results are cached by ``sha256(kind, canonical request, source fingerprint)``: a second request
with the same content is answered from the cache, and a code change invalidates every entry. The
layer ILP stops on deterministic budgets, so an evaluation's answer does not depend on the load of
the node that ran it; one whose slices the wall-clock safety limit stopped (``ilp.load_dependent``)
does, and is not cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from archplace import api

from .db import operations, read_tx, results_cache, write_tx
from .schemas import Operation, OperationList
from .studies import NotFound

logger = logging.getLogger(__name__)

LEASE_S = 15.0  # a runner renews every second; another adopts the operation 15 s after it died
MAX_ATTEMPTS = 3  # runs of one operation before it is FAILED (a runner died each time)
MAX_QUEUED = 256  # PENDING + RUNNING operations over all owners before creates get a 503
TERMINAL = ("DONE", "FAILED", "CANCELLED")


class QueueFull(Exception):
    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """SHA-256 over the package's Python sources and packaged configs: the cache's code version."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".yaml", ".npz") and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def cache_key(kind: str, request: dict[str, Any]) -> str:
    text = json.dumps({"kind": kind, "request": request, "code": source_fingerprint()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _model(row) -> Operation:
    return Operation(
        id=row["id"],
        resource=f"operations/{row['id']}",
        kind=row["kind"],
        state=row["state"],
        done=row["state"] in TERMINAL,
        request=json.loads(row["request_json"]),
        result=json.loads(row["result_json"]) if row["result_json"] else None,
        error=row["error"],
        cached=bool(row["cached"]),
        attempts=row["attempts"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _owned(conn: sa.Connection, owner: str, op_id: str):
    """The operation's row if ``owner`` owns it; another owner's operation is simply not found."""
    row = (
        conn.execute(sa.select(operations).where(operations.c.id == op_id, operations.c.owner == owner))
        .mappings()
        .first()
    )
    if row is None:
        raise NotFound(f"operation {op_id!r} not found")
    return row


def run_operation(kind: str, request: dict[str, Any]) -> dict[str, Any]:
    """What a Ray task runs: the public API call of ``kind`` (the same code as the CLI)."""
    if kind == "evaluate":
        req = dict(request)
        arch = req.pop("arch")
        fixed, expert = req.pop("fixed"), req.pop("expert", None)
        hbm = req.pop("hbm_gb", None)   # None: the accelerator's own (api.placement.hbm_sizes)
        return api.place(
            api.PlaceRequest(
                arch=arch, fixed=tuple(fixed) if fixed else None, expert=tuple(expert) if expert else None,
                hbm_gb=tuple(hbm) if hbm else None, **req
            )
        ).to_dict()
    if kind == "partition":
        return api.partition(api.PartitionRequest(**request)).to_dict()
    if kind == "pipeline":
        return api.pipeline(api.PipelineRequest(**request)).to_dict()
    if kind == "shard":  # algo dqn needs Ray: a Ray task has it, as partition's ppo
        from archplace.api.sharding import ShardRequest, shard

        return shard(ShardRequest(**request)).to_dict()
    if kind == "plan":
        return api.plan(api.PlanRequest(**request)).to_dict()
    raise ValueError(f"operation kind {kind!r} unknown")


class OperationService:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def create(self, owner: str, kind: str, request: dict[str, Any]) -> Operation:
        key = cache_key(kind, request)
        now = time.time()
        op_id = uuid.uuid4().hex
        with write_tx(self.engine) as conn:
            hit = conn.execute(
                sa.select(results_cache.c.result_json).where(results_cache.c.key == key)
            ).first()
            if hit is None:
                same = (
                    conn.execute(
                        sa.select(operations).where(
                            operations.c.owner == owner,
                            operations.c.cache_key == key,
                            operations.c.state.in_(("PENDING", "RUNNING")),
                        )
                    )
                    .mappings()
                    .first()
                )
                if same is not None:  # the same work is already under way for this owner
                    return _model(same)
                queued = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(operations)
                    .where(operations.c.state.in_(("PENDING", "RUNNING")))
                ).scalar_one()
                if queued >= MAX_QUEUED:
                    raise QueueFull(
                        f"{queued} operations are queued or running (at most {MAX_QUEUED}); retry later"
                    )
            conn.execute(
                sa.insert(operations).values(
                    id=op_id,
                    owner=owner,
                    kind=kind,
                    request_json=json.dumps(request, sort_keys=True),
                    cache_key=key,
                    state="DONE" if hit else "PENDING",
                    result_json=hit[0] if hit else None,
                    cached=hit is not None,
                    cancel_requested=False,
                    attempts=0,
                    created_at=now,
                    updated_at=now,
                )
            )
            row = conn.execute(sa.select(operations).where(operations.c.id == op_id)).mappings().one()
        return _model(row)

    def get(self, owner: str, op_id: str) -> Operation:
        with read_tx(self.engine) as conn:
            return _model(_owned(conn, owner, op_id))

    def list(self, owner: str, page_size: int = 100, page_token: str | None = None) -> OperationList:
        with read_tx(self.engine) as conn:
            q = sa.select(operations).where(operations.c.owner == owner)
            if page_token:
                q = q.where(operations.c.created_at < float(page_token))
            rows = (
                conn.execute(q.order_by(operations.c.created_at.desc()).limit(page_size + 1)).mappings().all()
            )
        more = len(rows) > page_size
        rows = rows[:page_size]
        return OperationList(
            operations=[_model(r) for r in rows],
            next_page_token=repr(rows[-1]["created_at"]) if more else None,
        )

    def cancel(self, owner: str, op_id: str) -> Operation:
        """PENDING: cancelled at once. RUNNING: its runner cancels the Ray task within a second or so.
        A finished operation is left as it is."""
        now = time.time()
        with write_tx(self.engine) as conn:
            row = _owned(conn, owner, op_id)
            if row["state"] == "PENDING":
                conn.execute(
                    sa.update(operations)
                    .where(operations.c.id == op_id)
                    .values(state="CANCELLED", error="cancelled before it started", updated_at=now)
                )
            elif row["state"] == "RUNNING":
                conn.execute(
                    sa.update(operations)
                    .where(operations.c.id == op_id)
                    .values(cancel_requested=True, updated_at=now)
                )
            row = conn.execute(sa.select(operations).where(operations.c.id == op_id)).mappings().one()
        return _model(row)


class OperationRunner:
    """The per-replica loop described in the module docstring."""

    def __init__(self, engine: sa.Engine, max_running: int | None = None, period_s: float = 0.5) -> None:
        self.engine = engine
        self.name = f"runner-{uuid.uuid4().hex[:12]}"
        self.max_running = max_running
        self.period_s = period_s
        self.running: dict[str, Any] = {}  # operation id -> ObjectRef
        self._task = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="archplace-operations", daemon=True)

    def start(self) -> OperationRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _capacity(self) -> int:
        if self.max_running is not None:
            return self.max_running
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # the loop must outlive a bad moment (a locked database, a lost node)
                logger.exception("operation runner step failed")
            self._stop.wait(self.period_s)

    def step(self) -> None:
        import ray

        now = time.time()
        # renew leases and pick up cancellations
        with write_tx(self.engine) as conn:
            if self.running:
                conn.execute(
                    sa.update(operations)
                    .where(operations.c.id.in_(list(self.running)), operations.c.runner == self.name)
                    .values(lease_expires_at=now + LEASE_S)
                )
                cancel = conn.execute(
                    sa.select(operations.c.id).where(
                        operations.c.id.in_(list(self.running)), operations.c.cancel_requested.is_(True)
                    )
                ).all()
                for (op_id,) in cancel:
                    ray.cancel(self.running.pop(op_id), force=True)
                    conn.execute(
                        sa.update(operations)
                        .where(operations.c.id == op_id)
                        .values(
                            state="CANCELLED", error="cancelled while running", updated_at=now, runner=None
                        )
                    )
            # adopt
            free = self._capacity() - len(self.running)
            adopted = []
            if free > 0:
                rows = (
                    conn.execute(
                        sa.select(operations)
                        .where(
                            sa.or_(
                                operations.c.state == "PENDING",
                                sa.and_(operations.c.state == "RUNNING", operations.c.lease_expires_at < now),
                            )
                        )
                        .order_by(operations.c.created_at)
                        .limit(free)
                    )
                    .mappings()
                    .all()
                )
                for r in rows:
                    if r["cancel_requested"]:
                        conn.execute(
                            sa.update(operations)
                            .where(operations.c.id == r["id"])
                            .values(
                                state="CANCELLED", error="cancelled while its runner was gone", updated_at=now
                            )
                        )
                        continue
                    if r["attempts"] >= MAX_ATTEMPTS:
                        conn.execute(
                            sa.update(operations)
                            .where(operations.c.id == r["id"])
                            .values(
                                state="FAILED",
                                updated_at=now,
                                error=f"its runner died {r['attempts']} times; not retried again",
                            )
                        )
                        continue
                    conn.execute(
                        sa.update(operations)
                        .where(operations.c.id == r["id"])
                        .values(
                            state="RUNNING",
                            runner=self.name,
                            lease_expires_at=now + LEASE_S,
                            attempts=r["attempts"] + 1,
                            updated_at=now,
                        )
                    )
                    adopted.append(r)
        if adopted and self._task is None:
            # a worker that dies is retried once by Ray; a runner that dies, by the lease
            self._task = ray.remote(num_cpus=1, max_retries=1)(run_operation)
        for r in adopted:
            self.running[r["id"]] = self._task.remote(r["kind"], json.loads(r["request_json"]))
        # collect
        if not self.running:
            return
        refs = list(self.running.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            op_id = next(k for k, v in self.running.items() if v == ref)
            self._finish(op_id, ref)

    def _finish(self, op_id: str, ref) -> None:
        import ray

        result, error = None, None
        try:
            result = ray.get(ref, timeout=30)
        except ray.exceptions.TaskCancelledError:
            error = "cancelled while running"
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            msg = str(cause).strip().splitlines()
            error = f"{type(cause).__name__}: {msg[0] if msg else ''}"[:2000]
        except Exception as e:  # a worker or node that died after the task's retries
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:2000]
        now = time.time()
        with write_tx(self.engine) as conn:
            row = conn.execute(sa.select(operations).where(operations.c.id == op_id)).mappings().first()
            self.running.pop(op_id, None)
            if row is None or row["runner"] != self.name or row["state"] != "RUNNING":
                return  # cancelled or adopted elsewhere meanwhile
            if result is not None:
                text = json.dumps(result)
                conn.execute(
                    sa.update(operations)
                    .where(operations.c.id == op_id)
                    .values(state="DONE", result_json=text, updated_at=now, runner=None)
                )
                # a placement whose layer slices the wall-clock safety limit stopped depends on the
                # load of the machine that ran it: not an answer to give the next equal request
                ilp = result.get("ilp") if isinstance(result, dict) else None
                load_dependent = bool((ilp or {}).get("load_dependent"))
                if not load_dependent and (
                    conn.execute(
                        sa.select(results_cache.c.key).where(results_cache.c.key == row["cache_key"])
                    ).first()
                    is None
                ):
                    conn.execute(
                        sa.insert(results_cache).values(
                            key=row["cache_key"], kind=row["kind"], result_json=text, created_at=now
                        )
                    )
            else:
                state = "CANCELLED" if error == "cancelled while running" else "FAILED"
                conn.execute(
                    sa.update(operations)
                    .where(operations.c.id == op_id)
                    .values(state=state, error=error, updated_at=now, runner=None)
                )
