"""The proposal pool (issue 47): a served replica keeps each study's next proposals ready, refilled by
a background thread outside any request, and a suggest that finds enough takes them in its one write
transaction. The guarantees of tests/test_service_leases.py must hold with it: no architecture handed
out twice, none lost, the same proposals as without a pool on one replica, released architectures
suggested again."""

from __future__ import annotations

import time

import pytest
from service_core_util import ask, contend, replicas, study, tell


def _wait_pool(svc, owner: str, name: str, n: int, timeout_s: float = 30.0) -> None:
    """Until the study's pool holds ``n`` proposals (the refill runs in the background)."""
    uid = svc._uids[(owner, name)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        e = svc.cache.get(uid)
        if e is not None and len(e.pool) >= n and not e.refill_queued:
            return
        time.sleep(0.01)
    raise AssertionError("the pool was not refilled")


@pytest.mark.parametrize("searcher", ["phaze", "random", "grid", "optuna"])
def test_one_replica_suggests_what_it_would_without_a_pool(tmp_path, searcher):
    """The pool only moves proposing earlier: one client on one replica gets the same architectures
    in the same order (searchers that learn from values see the same values: one completion per
    suggest, as without a pool, except that the pool's proposals were made before the last ones)."""
    got = {}
    for pool in (0, 8):
        (s,) = replicas(tmp_path / f"s{pool}.db", 1, pool=pool)
        s.create("o", study("p", searcher=searcher, seed=5))
        seq = []
        for _ in range(20):
            t = ask(s, "o", "p", client_id="w").trials[0]
            tell(s, "o", "p", t.number, float(t.arch_index % 13))
            seq.append(t.arch_index)
            if pool:
                _wait_pool(s, "o", "p", pool)
        got[pool] = seq
    if searcher != "optuna":   # TPE models the values it was told; the pool proposes before the last ones
        assert got[8] == got[0]
    assert len(set(got[8])) == 20


def test_a_pooled_suggest_is_one_transaction(tmp_path, monkeypatch):
    """With the pool full, a suggest opens one transaction, a (group) write, and runs no searcher."""
    from archplace.service import db, searchers, studies

    (s,) = replicas(tmp_path / "s.db", 1, pool=4)
    s.create("o", study("p", searcher="random", seed=1))
    ask(s, "o", "p", client_id="warm")
    _wait_pool(s, "o", "p", 4)
    opened, proposed = [], []
    real_read, real_write, real_group = db.read_tx, db.write_tx, db.group_write
    monkeypatch.setattr(studies, "read_tx", lambda eng: (opened.append("read"), real_read(eng))[1])
    monkeypatch.setattr(studies, "write_tx", lambda eng: (opened.append("write"), real_write(eng))[1])
    monkeypatch.setattr(studies, "group_write",
                        lambda eng, fn: (opened.append("write"), real_group(eng, fn))[1])
    real_propose = searchers.StudySearcher.propose
    monkeypatch.setattr(searchers.StudySearcher, "propose",
                        lambda self: (proposed.append(1), real_propose(self))[1])
    e = s.cache.get(s._uids[("o", "p")])
    with e.lock:   # the refill cannot run meanwhile
        first = list(e.pool)
        got = s._suggest("o", "p", 2, "c", e)
    assert opened == ["write"] and not proposed
    assert [t.arch_index for t in got.trials] == first[:2]


@pytest.mark.parametrize("searcher", ["phaze", "optuna"])
def test_two_pooled_replicas_under_contention_hand_out_no_architecture_twice(tmp_path, searcher):
    """tests/test_service_leases.py's contention test with a pool on both replicas: their pools hold
    the same architectures all the time, so reservations collide constantly and must all end in a retry;
    leases run out meanwhile and their architectures go out again."""
    contend(tmp_path / "s.db", searcher, pool=6)
