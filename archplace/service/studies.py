"""Studies and trials: create, suggest (ask), complete (tell), list, best, Pareto front.

The guarantees the tests hold us to, and how:

* **No double suggestion.** A suggest runs in one write transaction (``db.write_tx``): it reads the
  study, brings the replica's searcher up to date with every trial row written since it last looked
  (``StudySearcher.catch_up`` via ``_sync``), asks, and inserts the new trials. A unique index on
  (study, architecture) backs this up.
* **Idempotent suggest per client.** A client that already holds PENDING trials gets exactly those
  again (a retried request whose response was lost gets the same trials, as in Vizier).
* **No lost or doubled completion.** Completing a PENDING trial records it; completing it again with
  the same measurement returns the trial unchanged (a retry); with a different one is a 409.
* **Restarts lose nothing.** Searchers are caches rebuilt from the rows; nothing else is kept.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import sqlalchemy as sa

from .db import lock_study, read_tx, studies, trials, write_tx
from .schemas import (
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
from .searchers import StudySearcher, arch_params


class NotFound(LookupError):
    pass


class Conflict(Exception):
    pass


def _study_model(row, owner: str, space_size: int, done_reason: str | None = None) -> Study:
    return Study(
        name=row["name"],
        resource=f"owners/{owner}/studies/{row['name']}",
        owner=owner,
        config=json.loads(row["config_json"]),
        space_size=space_size,
        trials=row["trial_count"],
        created_at=row["created_at"],
        state="DONE" if done_reason else "ACTIVE",
        done_reason=done_reason,
    )


def _trial_model(row, owner: str, study: str) -> TrialModel:
    return TrialModel(
        number=row["number"],
        resource=f"owners/{owner}/studies/{study}/trials/{row['number']}",
        client_id=row["client_id"],
        state=row["state"],
        arch_index=row["arch_index"],
        params=json.loads(row["params_json"]),
        value=row["value"],
        values=json.loads(row["values_json"]) if row["values_json"] else None,
        reason=row["reason"],
        created_at=row["created_at"],
        completed_at=row["completed_at"],
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

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._searchers: dict[int, StudySearcher] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()

    # ------------------------------------------------------------------ helpers
    def _lock(self, study_id: int) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(study_id, threading.Lock())

    def _searcher(self, row) -> StudySearcher:
        s = self._searchers.get(row["id"])
        if s is None:
            s = StudySearcher(json.loads(row["config_json"]))
            self._searchers[row["id"]] = s
        return s

    def _sync(self, conn: sa.Connection, row, s: StudySearcher) -> None:
        """Replay the trial rows written since ``s.seq`` into the searcher (created, then completed,
        in the order they were written)."""
        if s.seq >= row["seq"]:
            return
        sid = row["id"]
        created = conn.execute(
            sa.select(trials.c.number, trials.c.arch_index)
            .where(trials.c.study_id == sid, trials.c.created_seq > s.seq)
            .order_by(trials.c.created_seq)
        ).all()
        for number, index in created:
            s.mark(number, index)
        done = conn.execute(
            sa.select(trials.c.number, trials.c.arch_index, trials.c.state, trials.c.value)
            .where(trials.c.study_id == sid, trials.c.completed_seq > s.seq)
            .order_by(trials.c.completed_seq)
        ).all()
        for number, index, state, value in done:
            s.tell(number, index, state, value)
        s.seq = row["seq"]

    def _get_row(self, conn, owner: str, name: str, lock: bool = False):
        row = (
            lock_study(conn, owner, name)
            if lock
            else conn.execute(sa.select(studies).where(studies.c.owner == owner, studies.c.name == name))
            .mappings()
            .first()
        )
        if row is None:
            raise NotFound(f"study {name!r} not found")
        return row

    # ------------------------------------------------------------------ studies
    def create(self, owner: str, req: StudyCreate) -> tuple[Study, bool]:
        """The new study, or the existing one when a study of that name has the same configuration
        (a retried create); a different configuration under the same name is a 409."""
        config = req.model_dump(mode="json")
        s = StudySearcher(config)  # checks the space and constraint before anything is written
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
                return _study_model(row, owner, len(s.space)), False
            conn.execute(
                sa.insert(studies).values(
                    owner=owner, name=req.name, config_json=text, created_at=time.time(), seq=0, trial_count=0
                )
            )
            row = (
                conn.execute(sa.select(studies).where(studies.c.owner == owner, studies.c.name == req.name))
                .mappings()
                .one()
            )
        self._searchers[row["id"]] = s
        return _study_model(row, owner, len(s.space)), True

    def get(self, owner: str, name: str) -> Study:
        with read_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name)
        s = self._searchers.get(row["id"])
        size = len(s.space) if s else len(StudySearcher(json.loads(row["config_json"])).space)
        return _study_model(row, owner, size, row["done_reason"])

    def list(self, owner: str, page_size: int = 100, page_token: str | None = None) -> StudyList:
        after = _page_token(page_token)
        with read_tx(self.engine) as conn:
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
        out = []
        for r in rows:
            s = self._searchers.get(r["id"])
            size = len(s.space) if s else len(StudySearcher(json.loads(r["config_json"])).space)
            out.append(_study_model(r, owner, size, r["done_reason"]))
        return StudyList(studies=out, next_page_token=str(rows[-1]["id"]) if more else None)

    def delete(self, owner: str, name: str) -> None:
        with write_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name, lock=True)
            conn.execute(sa.delete(trials).where(trials.c.study_id == row["id"]))
            conn.execute(sa.delete(studies).where(studies.c.id == row["id"]))
        self._searchers.pop(row["id"], None)

    # ------------------------------------------------------------------ ask / tell
    def suggest(self, owner: str, name: str, req: SuggestRequest) -> SuggestResponse:
        with read_tx(self.engine) as conn:
            sid = self._get_row(conn, owner, name)["id"]
        with self._lock(sid):
            try:
                return self._suggest_locked(owner, name, req)
            except BaseException:
                self._searchers.pop(sid, None)  # the cache may have run ahead of the rows: rebuild it
                raise

    def _suggest_locked(self, owner: str, name: str, req: SuggestRequest) -> SuggestResponse:
        now = time.time()
        with write_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name, lock=True)
            sid = row["id"]
            pending = (
                conn.execute(
                    sa.select(trials)
                    .where(
                        trials.c.study_id == sid,
                        trials.c.client_id == req.client_id,
                        trials.c.state == "PENDING",
                    )
                    .order_by(trials.c.number)
                )
                .mappings()
                .all()
            )
            if pending:
                return SuggestResponse(trials=[_trial_model(r, owner, name) for r in pending])
            s = self._searcher(row)
            self._sync(conn, row, s)
            config = json.loads(row["config_json"])
            count = req.count
            if config.get("max_trials") is not None:
                count = min(count, config["max_trials"] - row["trial_count"])
            seq, number = row["seq"], row["trial_count"]
            new, done_reason = [], None
            for _ in range(max(count, 0)):
                i = s.ask(number + 1)
                if i is None:
                    done_reason = s.done_reason
                    break
                number += 1
                seq += 1
                new.append(
                    {
                        "study_id": sid,
                        "number": number,
                        "arch_index": i,
                        "params_json": json.dumps(arch_params(s.space, i)),
                        "client_id": req.client_id,
                        "state": "PENDING",
                        "created_seq": seq,
                        "created_at": now,
                    }
                )
            if count <= 0:
                done_reason = "max_trials reached"
            if new:
                conn.execute(sa.insert(trials), new)
            if new or (done_reason and done_reason != row["done_reason"]):
                conn.execute(
                    sa.update(studies)
                    .where(studies.c.id == sid)
                    .values(seq=seq, trial_count=number, done_reason=done_reason)
                )
            rows = (
                conn.execute(
                    sa.select(trials)
                    .where(trials.c.study_id == sid, trials.c.number > row["trial_count"])
                    .order_by(trials.c.number)
                )
                .mappings()
                .all()
                if new
                else []
            )
        s.seq = seq
        return SuggestResponse(
            trials=[_trial_model(r, owner, name) for r in rows],
            done=done_reason is not None and not new,
            done_reason=done_reason,
        )

    def complete(self, owner: str, name: str, number: int, req: CompleteRequest) -> TrialModel:
        with write_tx(self.engine) as conn:
            row = self._get_row(conn, owner, name, lock=True)
            config = json.loads(row["config_json"])
            t = (
                conn.execute(
                    sa.select(trials).where(trials.c.study_id == row["id"], trials.c.number == number)
                )
                .mappings()
                .first()
            )
            if t is None:
                raise NotFound(f"trial {number} of study {name!r} not found")
            value, values = self._measurement(config, req)
            if t["state"] != "PENDING":
                same = (
                    t["state"] == req.state
                    and t["value"] == value
                    and (json.loads(t["values_json"]) if t["values_json"] else None) == values
                )
                if same:
                    return _trial_model(t, owner, name)  # a retried completion: nothing changes
                raise Conflict(
                    f"trial {number} is already {t['state']}"
                    + (f" with value {t['value']}" if t["value"] is not None else "")
                )
            seq = row["seq"] + 1
            conn.execute(
                sa.update(trials)
                .where(trials.c.id == t["id"])
                .values(
                    state=req.state,
                    value=value,
                    values_json=json.dumps(values) if values is not None else None,
                    reason=req.reason,
                    completed_seq=seq,
                    completed_at=time.time(),
                )
            )
            conn.execute(sa.update(studies).where(studies.c.id == row["id"]).values(seq=seq))
            t = conn.execute(sa.select(trials).where(trials.c.id == t["id"])).mappings().one()
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
