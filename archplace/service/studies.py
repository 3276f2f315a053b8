"""Studies and trials: create, suggest (ask), complete (tell), heartbeat, list, best, Pareto front.

The guarantees the tests hold us to, and how:

* **No double suggestion.** The searcher proposes outside the database's write lock (a replica's
  searcher is a cache of the trial rows, brought up to date by ``_sync``); a short write transaction
  then reserves the proposals as trial rows, after checking that no trial holds them. If another
  replica took one meanwhile the transaction writes nothing, the cache catches up and proposes again.
  A unique index on (study, architecture) over the trials that hold one backs this up.
* **One searcher work at a time per study in a replica, none under the write lock.** So one owner's
  slow searcher (TPE over a large space) never holds up another owner's complete.
* **Identity.** A replica's cache is keyed by the study's ``uid`` (never reused) and checked against
  the row on each use, so a study deleted on one replica and created again under the same name is
  a new study everywhere. Deleted studies' caches are dropped at the next sweep (``sweep_s``), and the
  cache holds at most ``cache_points`` architectures over all studies (least recently used first out).
* **Idempotent suggest per client.** A client gets its PENDING trials first, then new ones up to
  ``count`` (a retried request whose response was lost gets the same trials, as in Vizier). A request
  without a ``client_id`` gets a fresh one, never another worker's trials.
* **Leases.** A PENDING trial must be completed, or heart-beaten, within the study's ``lease_s``
  (its client's suggests and completions renew it too); after that the next suggest or listing of the
  study marks it ABANDONED and its architecture is suggested again.
* **No lost or doubled completion.** Completing a PENDING trial records it; completing it again with
  the same measurement returns the trial unchanged (a retry); with a different one is a 409.
* **Restarts lose nothing.** Searchers are caches rebuilt from the rows; nothing else is kept.
* **Bounded.** Per owner at most ``max_studies`` studies and ``max_points`` feasible architectures in
  all; reads (get, list, trials) never build a searcher.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import sqlalchemy as sa

from .db import group_write, read_tx, studies, trials, write_tx
from .schemas import (
    LIMITS,
    CompleteRequest,
    Pareto,
    Study,
    StudyCreate,
    StudyList,
    SuggestRequest,
    SuggestResponse,
    TrialList,
)
from .schemas import Trial as TrialModel
from .searchers import Entry, SearcherCache, StudySearcher, arch_params
from .statements import SQL


class NotFound(LookupError):
    pass


class Conflict(Exception):
    pass


class LimitExceeded(Conflict):
    """A per-owner limit (a 409 naming it)."""


class _Moved(Exception):
    """The study's row now has another uid (deleted and created again): start over."""


class _Taken(Exception):
    """A proposal was reserved by another replica meanwhile: roll back, catch up, propose again.
    ``clash``: the proposals found taken."""

    def __init__(self, clash: set[int] | None = None) -> None:
        super().__init__()
        self.clash = set(clash or ())


RESERVE_TRIES = 64
DEFAULT_POOL = 8   # proposals each study keeps ready in a served replica (ServiceState)

_LEASE_EXPIRED = ("lease expired: neither completed nor heart-beaten within the study's lease_s; its "
                  "architecture is suggested again")
_JITTER = random.Random(0)  # timing only: never decides what is suggested


def _study_model(row, owner: str) -> Study:
    done_reason = row["done_reason"]
    return Study(
        name=row["name"],
        resource=f"owners/{owner}/studies/{row['name']}",
        owner=owner,
        config=json.loads(row["config_json"]),
        space_size=row["space_size"],
        trials=row["trial_count"],
        created_at=row["created_at"],
        state="DONE" if done_reason else "ACTIVE",
        done_reason=done_reason,
    )


def _trial_model(row, owner: str, study: str) -> TrialModel:
    values = json.loads(row["values_json"]) if row["values_json"] else None
    return TrialModel(
        number=row["number"],
        resource=f"owners/{owner}/studies/{study}/trials/{row['number']}",
        client_id=row["client_id"],
        state=row["state"],
        arch_index=row["arch_index"],
        params=json.loads(row["params_json"]),
        # from the JSON: SQLite stores a REAL -0.0 as the integer 0, and the sign is the client's
        value=next(iter(values.values())) if values else row["value"],
        values=values,
        reason=row["reason"],
        created_at=row["created_at"],
        completed_at=row["completed_at"],
        lease_expires_at=row["lease_expires_at"] if row["state"] == "PENDING" else None,
    )


def _page_token(token: str | None) -> int:
    if token is None or token == "":
        return 0
    if not token.isdigit() or len(token) > 12:
        raise ValueError(f"page_token must be a token returned by the previous page, got {token[:40]!r}")
    return int(token)


class StudyService:
    """All study operations of one replica. Methods take the request's owner; a study of another
    owner is simply not found (404), so owners cannot even learn each other's study names."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        max_studies: int = LIMITS["studies_per_owner"],
        max_points: int = LIMITS["space_points_per_owner"],
        cache_points: int = 4 * LIMITS["space_grid_points"],
        sweep_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        pool: int = 0,
        lane: tuple[int, int] = (0, 1),
    ) -> None:
        self.engine, self.lane = engine, lane  # lane: (replica rank, replicas), see StudySearcher
        self.max_studies, self.max_points, self.clock = max_studies, max_points, clock
        self.cache = SearcherCache(cache_points, sweep_s)
        self._uids: dict[tuple[str, str], str] = {}   # (owner, name) -> the study uid last seen here
        # pool > 0: each study keeps up to ``pool`` proposals ready, refilled by a background thread outside
        # any request (OSS Vizier's REQUESTED pool), taken in a suggest's one write; 0: propose per request
        self.pool = int(pool)
        self._refills: queue.SimpleQueue[Entry] = queue.SimpleQueue()
        if self.pool > 0:
            threading.Thread(target=self._refill_loop, daemon=True, name="archplace-proposal-pool").start()

    def _sync(self, conn: sa.Connection, row, s: StudySearcher) -> None:
        """Replay the trial events written since ``s.seq`` into the searcher, in the order of the
        study's sequence numbers: creations, completions, and leases that expired (whose
        architectures go back to the pool)."""
        if s.seq >= row["seq"]:
            return
        args = {"p_sid": row["id"], "p_lo": s.seq, "p_hi": row["seq"]}
        created = conn.execute(SQL["sync_created"], args).all()
        done = conn.execute(SQL["sync_done"], args).all()
        events = [(q, 0, n, i, None, None, False) for q, n, i in created] + [
            (q, 1, n, i, st, v, rel) for q, n, i, st, v, rel in done
        ]
        for _seq, kind, number, index, state, value, released in sorted(events):
            if kind == 0:
                s.mark(number, index)
            elif released:
                s.release(number, index)
            else:
                s.tell(number, index, state, value)
        s.seq = row["seq"]

    def _get_row(self, conn, owner: str, name: str, lock: bool = False):
        q = SQL["study_for_update"] if lock and conn.dialect.name != "sqlite" else SQL["study"]
        row = conn.execute(q, {"p_owner": owner, "p_name": name}).mappings().first()
        if row is None:
            raise NotFound(f"study {name!r} not found")
        return row

    # ------------------------------------------------------------------ studies
    def create(self, owner: str, req: StudyCreate) -> tuple[Study, bool]:
        """The new study, or the existing one when a study of that name has the same configuration
        (a retried create); a different configuration under the same name is a 409, and so is a study
        over the owner's limits."""
        config = req.model_dump(mode="json")
        if config.get("target") == "accelerator":  # as before the field existed: old studies compare equal
            del config["target"]
        s = StudySearcher(config, self.lane)  # checks the space and constraint before anything is written
        text = json.dumps(config, sort_keys=True)
        with write_tx(self.engine) as conn:
            row = (
                conn.execute(sa.select(studies).where(studies.c.owner == owner, studies.c.name == req.name))
                .mappings()
                .first()
            )
            if row is not None:
                if row["config_json"] != text:
                    raise Conflict(
                        f"study {req.name!r} exists with another configuration; delete it first "
                        "or choose another name"
                    )
                return _study_model(row, owner), False
            n, points = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(studies.c.space_size), 0)).where(
                    studies.c.owner == owner
                )
            ).one()
            if n + 1 > self.max_studies:
                raise LimitExceeded(
                    f"owner {owner!r} has {n} studies, the limit is {self.max_studies}: delete one first"
                )
            if points + s.points > self.max_points:
                raise LimitExceeded(
                    f"space: {s.points:,} feasible architectures would bring owner {owner!r} to "
                    f"{points + s.points:,}, over the limit of {self.max_points:,} over all studies"
                )
            uid = uuid.uuid4().hex
            conn.execute(
                sa.insert(studies).values(
                    uid=uid,
                    owner=owner,
                    name=req.name,
                    config_json=text,
                    space_size=s.points,
                    created_at=time.time(),
                    seq=0,
                    trial_count=0,
                )
            )
            row = conn.execute(sa.select(studies).where(studies.c.uid == uid)).mappings().one()
        self.cache.entry(row).searcher = s
        return _study_model(row, owner), True

    def get(self, owner: str, name: str) -> Study:
        with read_tx(self.engine) as conn:
            return _study_model(self._get_row(conn, owner, name), owner)

    def list(self, owner: str, page_size: int = 100, page_token: str | None = None) -> StudyList:
        after = _page_token(page_token)
        with read_tx(self.engine) as conn:
            self.cache.sweep(conn)
            rows = (
                conn.execute(
                    sa.select(studies)
                    .where(studies.c.owner == owner, studies.c.id > after)
                    .order_by(studies.c.id)
                    .limit(page_size + 1)
                )
                .mappings()
                .all()
            )
        more = len(rows) > page_size
        rows = rows[:page_size]
        return StudyList(
            studies=[_study_model(r, owner) for r in rows],
            next_page_token=str(rows[-1]["id"]) if more else None,
        )

    def delete(self, owner: str, name: str) -> None:
        with write_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name, lock=True)
            conn.execute(sa.delete(trials).where(trials.c.study_id == row["id"]))
            conn.execute(sa.delete(studies).where(studies.c.id == row["id"]))
        self.cache.drop(row["uid"])

    # ------------------------------------------------------------------ leases
    def _expire(self, conn: sa.Connection, row, now: float) -> tuple[int, list[tuple[int, int]]]:
        """Mark the study's PENDING trials whose lease ended before ``now`` ABANDONED, releasing their
        architectures; returns the study's new sequence number and the (number, arch) released."""
        gone = conn.execute(SQL["overdue_ids"], {"p_sid": row["id"], "p_now": now}).all()
        seq = row["seq"]
        for tid, _number, _ in gone:
            seq += 1
            conn.execute(SQL["abandon"], {"p_tid": tid, "p_reason": _LEASE_EXPIRED, "p_seq": seq,
                                          "p_now": now})
        if gone:
            conn.execute(SQL["study_seq"], {"p_sid": row["id"], "p_seq": seq})
        return seq, [(n, i) for _, n, i in gone]

    def expire(self, owner: str, name: str) -> int:
        """Expire the study's overdue leases now (listings call this); returns how many."""
        now = self.clock()
        with read_tx(self.engine) as conn:
            sid = self._get_row(conn, owner, name)["id"]
            overdue = conn.execute(
                sa.select(sa.func.count()).where(
                    trials.c.study_id == sid, trials.c.state == "PENDING", trials.c.lease_expires_at < now
                )
            ).scalar()
        if not overdue:
            return 0
        with write_tx(self.engine) as conn:
            return len(self._expire(conn, self._get_row(conn, owner, name, lock=True), now)[1])

    def heartbeat(self, owner: str, name: str, number: int) -> TrialModel:
        """Renew a PENDING trial's lease; a trial no longer PENDING (its lease expired, or it was
        completed) is a 409, so a worker learns to stop."""
        now = self.clock()
        with write_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name, lock=True)
            t = self._trial_row(conn, row, name, number)
            if t["state"] != "PENDING":
                why = f": {t['reason']}" if t["reason"] else ""
                raise Conflict(f"trial {number} is {t['state']}{why}")
            lease = json.loads(row["config_json"]).get("lease_s", 3600)
            conn.execute(sa.update(trials).where(trials.c.id == t["id"]).values(lease_expires_at=now + lease))
            t = conn.execute(sa.select(trials).where(trials.c.id == t["id"])).mappings().one()
        return _trial_model(t, owner, name)

    @staticmethod
    def _trial_row(conn: sa.Connection, row, name: str, number: int):
        t = conn.execute(SQL["trial"], {"p_sid": row["id"], "p_number": number}).mappings().first()
        if t is None:
            raise NotFound(f"trial {number} of study {name!r} not found")
        return t

    # ------------------------------------------------------------------ ask / tell
    def suggest(self, owner: str, name: str, req: SuggestRequest) -> SuggestResponse:
        client = req.client_id or f"anon-{uuid.uuid4().hex}"
        for attempt in range(RESERVE_TRIES):
            # a study this replica has seen needs no read to find its cache entry: _suggest checks the
            # uid against the row in its own transaction
            e = self.cache.get(self._uids.get((owner, name)))
            if e is None:
                with read_tx(self.engine) as conn:
                    self.cache.sweep(conn)
                    row = self._get_row(conn, owner, name)
                e = self.cache.entry(row)
                if len(self._uids) > 10_000:
                    self._uids.clear()
                self._uids[(owner, name)] = row["uid"]
            with e.lock:
                try:
                    return self._suggest(owner, name, req.count, client, e)
                except _Taken:
                    pass  # another replica reserved the proposals meanwhile: catch up, propose again
                except _Moved:
                    self._uids.pop((owner, name), None)
                    continue  # the study was deleted and created again since the row was read
                except BaseException:
                    e.searcher = None  # the cache may have run ahead of the rows: rebuild it
                    e.pool = []        # its proposals went with it
                    raise
            # lost a race: step aside a little (jittered, so two replicas do not collide in step)
            time.sleep(_JITTER.uniform(0, 0.002 * (attempt + 1)))
        raise Conflict(f"study {name!r} is contended: no proposal survived {RESERVE_TRIES} tries; retry")

    def _suggest(self, owner: str, name: str, count: int, client: str, e: Entry) -> SuggestResponse:
        now = self.clock()
        e.where = (owner, name)
        if self.pool > 0 and e.searcher is not None and e._config is not None and len(e.pool) >= count:
            try:
                return self._suggest_from_pool(owner, name, count, client, e, now)
            finally:
                self._queue_refill(e)
        try:
            return self._suggest_proposing(owner, name, count, client, e, now)
        finally:
            if self.pool > 0:
                self._queue_refill(e)

    def _suggest_from_pool(self, owner: str, name: str, count: int, client: str, e: Entry,
                           now: float) -> SuggestResponse:
        """One group write: the pool's first ``count`` proposals reserved (those another replica took
        meanwhile are retracted; none left and nothing pending: ``_Taken``, the caller retries)."""
        s = e.searcher
        synced = s.seq
        proposals = e.pool[:count]
        try:
            out = group_write(self.engine, lambda conn: self._reserve(
                conn, owner, name, e, e._config[1], count, client, proposals, False, now))
        except _Taken:   # every proposal it needed is held elsewhere: the pool is stale, drop it all;
            for i in e.pool:   # the retry proposes after catching up, as without a pool
                s.retract(i)
            e.pool = []
            raise
        used, seq_before, seq_after, expired, clash = out.pop("_meta")
        for number, index in used:
            s.commit(number, index)
        gone = {index for _, index in used} | clash
        for i in clash:
            s.retract(i)   # another replica holds it
        e.pool = [i for i in e.pool if i not in gone]
        if seq_before == synced and not expired:
            s.seq = seq_after  # nothing else was written in between: the cache has it all
        return SuggestResponse(**out)

    def _queue_refill(self, e: Entry) -> None:
        if not e.refill_queued and len(e.pool) < self.pool:
            e.refill_queued = True
            self._refills.put(e)

    def _refill_loop(self) -> None:
        while True:
            e = self._refills.get()
            try:
                self._refill(e)
            except Exception:  # noqa: BLE001 - a refill is an optimisation: the next suggest proposes itself
                with e.lock:
                    for i in e.pool:
                        if e.searcher is not None:
                            e.searcher.retract(i)
                    e.pool = []
                    e.searcher = None
            finally:
                e.refill_queued = False

    def _refill(self, e: Entry) -> None:
        """Outside any request: bring the study's searcher up to date and propose until its pool holds
        ``pool`` proposals (or the searcher has nothing more)."""
        with e.lock:
            if e.searcher is None or e.where is None or self.cache.get(e.uid) is not e:
                return
            owner, name = e.where
            with read_tx(self.engine) as conn:
                row = self._get_row(conn, owner, name)
                if row["uid"] != e.uid:
                    return
                self._sync(conn, row, e.searcher)
            while len(e.pool) < self.pool:
                i = e.searcher.propose()
                if i is None:
                    break
                e.pool.append(i)

    def _suggest_proposing(self, owner: str, name: str, count: int, client: str, e: Entry,
                           now: float) -> SuggestResponse:
        # 1. outside the write lock: bring the cache up to date, release overdue leases, propose
        with read_tx(self.engine) as conn:
            self.cache.sweep(conn)
            row = self._get_row(conn, owner, name)
            if row["uid"] != e.uid:
                raise _Moved
            if e.searcher is None:
                e.searcher = StudySearcher(json.loads(row["config_json"]), self.lane)
            s = e.searcher
            self._sync(conn, row, s)
            held = conn.execute(SQL["held"], {"p_sid": row["id"], "p_client": client, "p_now": now}).scalar()
            config = e.config(row["config_json"])
            released = (  # only a budget needs it
                conn.execute(SQL["released"], {"p_sid": row["id"]}).scalar()
                if config.get("max_trials") is not None
                else 0
            )
            overdue = conn.execute(SQL["overdue"], {"p_sid": row["id"], "p_now": now}).all()
        synced = s.seq
        for number, index in overdue:
            s.release(number, index)  # written below; a trial completed meanwhile is told back by _sync
        want = count - held
        if config.get("max_trials") is not None:  # the trials that hold an architecture count
            want = min(want, config["max_trials"] - (row["trial_count"] - released - len(overdue)))
        proposals: list[int] = []
        exhausted = False  # the searcher has nothing more to propose
        for _ in range(max(want, 0)):
            i = s.propose()
            if i is None:
                exhausted = True
                break
            proposals.append(i)
        # 2. under the write lock: expire, return the client's pending trials, reserve the proposals
        try:
            with write_tx(self.engine) as conn:
                out = self._reserve(conn, owner, name, e, config, count, client, proposals, exhausted, now)
        except BaseException:
            for i in proposals:
                s.retract(i)
            raise
        used, seq_before, seq_after, expired, _clash = out.pop("_meta")
        for number, index in used:
            s.commit(number, index)
        taken = {index for _, index in used}
        for i in proposals:
            if i not in taken:
                s.retract(i)  # not needed after all, or reserved by another replica meanwhile
        if seq_before == synced and {n for n, _ in expired} <= {n for n, _ in overdue}:
            s.seq = seq_after  # nothing else was written in between: the cache has it all
        return SuggestResponse(**out)

    def _reserve(self, conn, owner, name, e, config, count, client, proposals, exhausted, now) -> dict:
        row = self._get_row(conn, owner, name, lock=True)
        if row["uid"] != e.uid:
            raise _Moved
        sid, seq_before = row["id"], row["seq"]
        seq, released = self._expire(conn, row, now)
        lease = config.get("lease_s", 3600)
        # the client is alive: its leases start again
        conn.execute(SQL["renew"], {"p_sid": sid, "p_client": client, "p_until": now + lease})
        pending = conn.execute(SQL["pending"], {"p_sid": sid, "p_client": client,
                                                "p_limit": count}).mappings().all()
        want = count - len(pending)
        if config.get("max_trials") is not None:
            live = row["trial_count"] - conn.execute(SQL["released"], {"p_sid": sid}).scalar()
            want = min(want, config["max_trials"] - live)
        take = proposals[: max(want, 0)]
        short = exhausted and len(take) < want  # the searcher has nothing more
        clash: set[int] = set()
        if take:  # another replica may have reserved some meanwhile: take the rest
            clash = set(conn.execute(SQL["clash"], {"p_sid": sid, "p_archs": list(take)}).scalars())
            take = [i for i in take if i not in clash]
            if not take and not pending:
                raise _Taken(clash)  # rolls back this transaction, the expiry included
        number, new = row["trial_count"], []
        for i in take:
            number += 1
            seq += 1
            new.append(
                {
                    "study_id": sid,
                    "number": number,
                    "arch_index": i,
                    "params_json": json.dumps(arch_params(e.searcher.space, i)),
                    "client_id": client,
                    "state": "PENDING",
                    "created_seq": seq,
                    "created_at": now,
                    "lease_expires_at": now + lease,
                    "released": False,
                }
            )
        done_reason = None
        if want <= 0 and not pending and config.get("max_trials") is not None:
            done_reason = "max_trials reached"
        elif short:
            done_reason = e.searcher.done_reason
        if new:
            conn.execute(SQL["insert"], new)
        if new or (done_reason and done_reason != row["done_reason"]):
            conn.execute(SQL["study_after_reserve"], {"p_sid": sid, "p_seq": seq, "p_count": number,
                                                      "p_done": done_reason})
        rows = list(pending)
        if new:
            rows += conn.execute(SQL["new_trials"],
                                 {"p_sid": sid, "p_after": row["trial_count"]}).mappings().all()
        return {
            "client_id": client,
            "trials": [_trial_model(r, owner, name) for r in rows],
            "done": not rows and done_reason is not None,
            "done_reason": done_reason,
            "_meta": ([(t["number"], t["arch_index"]) for t in new], seq_before, seq, released, clash),
        }

    def complete(self, owner: str, name: str, number: int, req: CompleteRequest) -> TrialModel:
        """Store a trial's result. On SQLite completes waiting for the write lock commit together
        (``db.group_write``), each in its own savepoint."""
        now = self.clock()
        return group_write(self.engine, lambda conn: self._complete(conn, owner, name, number, req, now))

    def _complete(self, conn, owner: str, name: str, number: int, req: CompleteRequest, now: float):
        row = self._get_row(conn, owner, name, lock=True)
        config = json.loads(row["config_json"])
        t = self._trial_row(conn, row, name, number)
        value, values = self._measurement(config, req)
        if t["state"] != "PENDING":
            old_values = json.loads(t["values_json"]) if t["values_json"] else None
            if t["state"] == req.state and t["value"] == value and old_values == values:
                return _trial_model(t, owner, name)  # a retried completion: nothing changes
            raise Conflict(
                f"trial {number} is already {t['state']}"
                + (f" with value {t['value']}" if t["value"] is not None else "")
                + (" (its lease expired)" if t["released"] else "")
            )
        seq = row["seq"] + 1
        conn.execute(SQL["complete"], {
            "p_tid": t["id"], "p_state": req.state, "p_value": value,
            "p_values": json.dumps(values) if values is not None else None, "p_reason": req.reason,
            "p_seq": seq, "p_now": now})
        # the client is alive: its other trials' leases start again
        conn.execute(SQL["renew_live"], {"p_sid": row["id"], "p_client": t["client_id"], "p_now": now,
                                         "p_until": now + config.get("lease_s", 3600)})
        conn.execute(SQL["study_seq"], {"p_sid": row["id"], "p_seq": seq})
        t = conn.execute(SQL["trial_by_id"], {"p_tid": t["id"]}).mappings().one()
        return _trial_model(t, owner, name)

    @staticmethod
    def _measurement(config: dict[str, Any], req: CompleteRequest) -> tuple[float | None, dict | None]:
        if req.state != "COMPLETED":
            return None, None
        names = [o["name"] for o in config["objectives"]]
        values = dict(req.values or {})
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"values: unknown objective(s) {unknown}; the study's objectives are {names}")
        if req.value is not None:
            if names[0] in values and values[names[0]] != req.value:
                raise ValueError(f"value {req.value} and values[{names[0]!r}] {values[names[0]]} disagree")
            values[names[0]] = req.value
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(
                f"values: objective(s) {missing} missing; a completed trial reports all of {names}"
            )
        return float(values[names[0]]), {n: float(values[n]) for n in names}

    # ------------------------------------------------------------------ reads
    def trials(
        self,
        owner: str,
        name: str,
        page_size: int = 100,
        page_token: str | None = None,
        state: str | None = None,
    ) -> TrialList:
        after = _page_token(page_token)
        self.expire(owner, name)
        with read_tx(self.engine) as conn:
            sid = self._get_row(conn, owner, name)["id"]
            q = sa.select(trials).where(trials.c.study_id == sid, trials.c.number > after)
            if state:
                q = q.where(trials.c.state == state)
            rows = conn.execute(q.order_by(trials.c.number).limit(page_size + 1)).mappings().all()
        more = len(rows) > page_size
        rows = rows[:page_size]
        return TrialList(
            trials=[_trial_model(r, owner, name) for r in rows],
            next_page_token=str(rows[-1]["number"]) if more and rows else None,
        )

    def trial(self, owner: str, name: str, number: int) -> TrialModel:
        with read_tx(self.engine) as conn:
            sid = self._get_row(conn, owner, name)["id"]
            t = (
                conn.execute(sa.select(trials).where(trials.c.study_id == sid, trials.c.number == number))
                .mappings()
                .first()
            )
        if t is None:
            raise NotFound(f"trial {number} of study {name!r} not found")
        return _trial_model(t, owner, name)

    def best(self, owner: str, name: str) -> TrialModel:
        with read_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name)
            goal = json.loads(row["config_json"])["objectives"][0]["goal"]
            order = trials.c.value.desc() if goal == "maximize" else trials.c.value.asc()
            t = (
                conn.execute(
                    sa.select(trials)
                    .where(trials.c.study_id == row["id"], trials.c.state == "COMPLETED")
                    .order_by(order, trials.c.number)
                    .limit(1)
                )
                .mappings()
                .first()
            )
        if t is None:
            raise NotFound(f"study {name!r} has no completed trial yet")
        return _trial_model(t, owner, name)

    def pareto(self, owner: str, name: str) -> Pareto:
        """The completed trials no other completed trial dominates (all objectives, each in its own
        direction); for a single objective, the best trial(s)."""
        with read_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name)
            objectives = json.loads(row["config_json"])["objectives"]
            rows = (
                conn.execute(
                    sa.select(trials)
                    .where(trials.c.study_id == row["id"], trials.c.state == "COMPLETED")
                    .order_by(trials.c.number)
                )
                .mappings()
                .all()
            )
        if not rows:
            return Pareto(objectives=objectives, trials=[])
        sign = np.array([1.0 if o["goal"] == "maximize" else -1.0 for o in objectives])
        pts = np.array([[json.loads(r["values_json"])[o["name"]] for o in objectives] for r in rows]) * sign
        keep = pareto_mask(pts)
        return Pareto(
            objectives=objectives, trials=[_trial_model(r, owner, name) for r, k in zip(rows, keep) if k]
        )


def pareto_mask(points: np.ndarray) -> np.ndarray:
    """Non-dominated rows of ``points`` (every column maximised): a row is dominated when another is
    >= in every column and > in one. Sorting by the first column lets each row be checked against
    the current front only."""
    n = len(points)
    order = np.lexsort(tuple(-points[:, j] for j in reversed(range(points.shape[1]))))
    front: list[int] = []
    keep = np.zeros(n, dtype=bool)
    for i in order:
        p = points[i]
        if front:
            f = points[front]
            if np.any(np.all(f >= p, axis=1) & np.any(f > p, axis=1)):
                continue
        front.append(i)
        keep[i] = True
    return keep
