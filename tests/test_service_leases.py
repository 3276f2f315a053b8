"""Trial leases, client ids, ``count``, and the scope of the write lock, on ``StudyService`` replicas
over one SQLite file with an injected clock (no sleeping)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from service_core_util import Clock, ask, contend, replicas, study, tell


def _held(svc, owner: str, name: str) -> list[int]:
    return [t.arch_index for t in svc.trials(owner, name, page_size=1000).trials if t.state != "ABANDONED"]


def test_an_expired_lease_abandons_the_trial_and_returns_its_architecture(tmp_path):
    """The old code kept a dead worker's PENDING trials forever: their architectures were never
    evaluated, and nothing told the worker, if it came back, that its trial had been given up."""
    from archplace.service.studies import Conflict

    clock = Clock()
    (s,) = replicas(tmp_path / "s.db", 1, clock=clock)
    s.create("alice", study("l", searcher="random", seed=4, lease_s=10))
    dead = ask(s, "alice", "l", count=2, client_id="dead").trials
    assert [t.lease_expires_at for t in dead] == [clock.t + 10] * 2
    clock.advance(10.5)
    again = ask(s, "alice", "l", count=3, client_id="alive")
    # the released architectures first, in the order they were handed out, then the next new one
    assert [t.arch_index for t in again.trials[:2]] == [t.arch_index for t in dead]
    assert [t.number for t in again.trials] == [3, 4, 5]
    for t in dead:
        old = s.trial("alice", "l", t.number)
        assert old.state == "ABANDONED" and old.reason.startswith("lease expired")
        assert old.lease_expires_at is None
        with pytest.raises(Conflict, match="already ABANDONED"):
            tell(s, "alice", "l", t.number, 1.0)
        with pytest.raises(Conflict, match="is ABANDONED: lease expired"):
            s.heartbeat("alice", "l", t.number)
    assert max(Counter(_held(s, "alice", "l")).values()) == 1


def test_heartbeat_suggest_and_complete_renew_a_lease(tmp_path):
    """Without leases there was nothing to renew; with them, a live worker must keep its trials."""
    clock = Clock()
    (s,) = replicas(tmp_path / "s.db", 1, clock=clock)
    s.create("alice", study("h", searcher="phaze", lease_s=10))
    t1, t2, t3 = ask(s, "alice", "h", count=3, client_id="w").trials
    clock.advance(8)
    assert s.heartbeat("alice", "h", t1.number).lease_expires_at == clock.t + 10
    tell(s, "alice", "h", t2.number, 5.0)  # the client is alive: t3 is renewed too
    clock.advance(8)  # 16 s after the suggest, 8 s after the renewals
    other = ask(s, "alice", "h", count=1, client_id="other").trials
    assert other[0].arch_index == 3  # nothing was released
    states = [s.trial("alice", "h", t.number).state for t in (t1, t2, t3)]
    assert states == ["PENDING", "COMPLETED", "PENDING"]
    again = ask(s, "alice", "h", count=2, client_id="w").trials  # its own suggest renews as well
    assert [t.number for t in again] == [t1.number, t3.number]
    assert {t.lease_expires_at for t in again} == {clock.t + 10}


def test_expiry_on_listing_and_release_seen_by_another_replica(tmp_path):
    """A trial expires on the next listing as well as on a suggest; the release is written by one
    replica and the other's cached searcher, which had handed the architecture out, proposes it again
    without handing anything out twice."""
    clock = Clock()
    a, b = replicas(tmp_path / "s.db", clock=clock)
    a.create("alice", study("x", searcher="phaze", lease_s=5))
    first = ask(a, "alice", "x", count=2, client_id="w1").trials  # archs 0, 1 via A
    assert [t.arch_index for t in first] == [0, 1]
    clock.advance(6)
    listed = b.trials("alice", "x").trials  # the listing on B expires them
    assert [t.state for t in listed] == ["ABANDONED", "ABANDONED"]
    got = ask(a, "alice", "x", count=3, client_id="w2").trials  # A learns the release from the rows
    assert [t.arch_index for t in got] == [0, 1, 2]
    assert [t.arch_index for t in ask(b, "alice", "x", count=1, client_id="w3").trials] == [3]
    assert sorted(_held(a, "alice", "x")) == [0, 1, 2, 3]


def test_missing_client_id_gets_a_fresh_one_and_count_is_honoured(tmp_path):
    """The old code gave every request without a client_id the id "default", so two workers that
    omitted it got each other's trials; and a client holding PENDING trials got only those, whatever
    ``count`` it asked for."""
    (s,) = replicas(tmp_path / "s.db", 1)
    s.create("alice", study("c", searcher="random", seed=2))
    r1 = ask(s, "alice", "c", count=2, client_id=None)
    r2 = ask(s, "alice", "c", count=2, client_id=None)
    assert r1.client_id != r2.client_id and r1.client_id.startswith("anon-")
    assert {t.client_id for t in r1.trials} == {r1.client_id}
    assert not {t.number for t in r1.trials} & {t.number for t in r2.trials}
    w = ask(s, "alice", "c", count=2, client_id="w").trials
    w5 = ask(s, "alice", "c", count=5, client_id="w").trials
    assert [t.number for t in w5[:2]] == [t.number for t in w] and len(w5) == 5
    assert [t.number for t in ask(s, "alice", "c", count=5, client_id="w").trials] == [t.number for t in w5]
    assert [t.number for t in ask(s, "alice", "c", count=1, client_id="w").trials] == [w[0].number]
    tell(s, "alice", "c", w[0].number, 1.0)
    after = ask(s, "alice", "c", count=5, client_id="w").trials
    assert [t.number for t in after[:4]] == [t.number for t in w5[1:]] and after[4].number == 10


def test_max_trials_counts_neither_released_trials_nor_reopens_a_done_study_wrongly(tmp_path):
    """A trial abandoned by its lease does not use up the budget: its architecture is evaluated
    again under max_trials."""
    clock = Clock()
    (s,) = replicas(tmp_path / "s.db", 1, clock=clock)
    s.create("alice", study("m", searcher="grid", max_trials=3, lease_s=1))
    a = ask(s, "alice", "m", count=3, client_id="a").trials
    assert ask(s, "alice", "m", count=1, client_id="b").done_reason == "max_trials reached"
    tell(s, "alice", "m", a[0].number, 1.0)
    clock.advance(2)  # a[1], a[2] expire
    b = ask(s, "alice", "m", count=3, client_id="b").trials
    assert [t.arch_index for t in b] == [a[1].arch_index, a[2].arch_index]
    assert ask(s, "alice", "m", count=1, client_id="c").done


def test_the_write_lock_is_not_held_while_the_searcher_works(tmp_path, monkeypatch):
    """The old code ran the searcher (replay and ask) inside the process-wide SQLite write lock, so
    one owner's 1M-point Optuna study made another owner's complete wait for its TPE (p50 17 -> 172
    ms). Here alice's searcher blocks inside its proposal until bob's complete has finished: with the
    old lock scope bob's complete could never finish and the join below would time out."""
    from archplace.service import db, searchers

    (s,) = replicas(tmp_path / "s.db", 1)
    lock = db._writer_lock(s.engine)
    s.create("bob", study("b", searcher="random"))
    bt = ask(s, "bob", "b").trials[0]
    big = {  # 459,571 feasible architectures (bench/service/serve_memory.py's space)
        "architecture": {
            "num_tc": {"pow2": [0, 15]},
            "num_vc": {"pow2": [0, 16]},
            "pe_x": {"pow2": [0, 14]},
            "pe_y": {"pow2": [0, 16]},
            "glb_mb": {"pow2": [0, 12]},
        },
        "constraints": {"area_min_fraction": 0.0},
    }
    s.create("alice", study("a", searcher="optuna", space=big, max_area_mm2=10_000.0))
    for k in range(3):  # the searcher has something to replay and TPE something to model
        t = ask(s, "alice", "a", client_id=f"w{k}").trials[0]
        tell(s, "alice", "a", t.number, float(k))
    entered, go = threading.Event(), threading.Event()
    seen: list[bool] = []
    real_propose, real_tell = searchers.StudySearcher.propose, searchers.StudySearcher.tell

    def propose(self):
        seen.append(lock.locked())
        if not entered.is_set():
            entered.set()
            assert go.wait(300), "bob's complete never finished"
        return real_propose(self)

    def tell_(self, *args):
        seen.append(lock.locked())
        return real_tell(self, *args)

    monkeypatch.setattr(searchers.StudySearcher, "propose", propose)
    monkeypatch.setattr(searchers.StudySearcher, "tell", tell_)
    from archplace.service.studies import StudyService

    s2 = StudyService(s.engine)  # a cold replica (the replay runs too) on the engine of bob's complete
    out: dict = {}
    alice = threading.Thread(target=lambda: out.setdefault("a", ask(s2, "alice", "a", client_id="z")))
    alice.start()
    assert entered.wait(300)
    bob = threading.Thread(target=lambda: out.setdefault("b", tell(s, "bob", "b", bt.number, 7.0)))
    bob.start()
    bob.join(300)
    assert not bob.is_alive() and out["b"].state == "COMPLETED"
    assert alice.is_alive()  # still inside its searcher
    go.set()
    alice.join(300)
    assert len(out["a"].trials) == 1 and out["a"].trials[0].number == 4
    assert seen and not any(seen)  # the write lock was never held while the searcher ran
    assert len(seen) >= 4  # three replayed completions and at least one proposal


def test_a_proposal_taken_by_another_replica_meanwhile_is_retried(tmp_path, monkeypatch):
    """Both replicas' caches propose the same next architecture; the one that reserves second sees it
    taken in its transaction, writes nothing, catches up and takes the next one."""
    from archplace.service import searchers

    a, b = replicas(tmp_path / "s.db")
    a.create("alice", study("p", searcher="phaze"))
    ask(a, "alice", "p", client_id="warm")  # A's cache exists (arch 0)
    ask(b, "alice", "p", client_id="warm2")  # B's too (arch 1); A has not seen it yet
    real = searchers.StudySearcher.propose
    calls = []

    def propose(self):
        i = real(self)
        if not calls:  # A has proposed arch 2; B reserves it first
            calls.append(i)
            assert [t.arch_index for t in ask(b, "alice", "p", client_id="b").trials] == [i]
        return i

    monkeypatch.setattr(searchers.StudySearcher, "propose", propose)
    got = ask(a, "alice", "p", client_id="a").trials
    assert calls == [2] and [t.arch_index for t in got] == [3]
    assert sorted(_held(a, "alice", "p")) == [0, 1, 2, 3]


@pytest.mark.parametrize("searcher", ["phaze", "optuna"])
def test_two_replicas_under_contention_hand_out_no_architecture_twice(tmp_path, searcher):
    """Eight threads on each of two replicas suggest and complete on one study, so proposals made
    outside the write lock collide across replicas all the time: every collision must end in a retry,
    never in a duplicate, a lost completion or an error. (The old code held the write lock around the
    searcher, so it never collided; this is the new reservation's own test.) Every fifth trial its
    worker abandons by letting its lease run out on the shared clock, so released architectures are
    handed out again in the middle of it all."""
    contend(tmp_path / "s.db", searcher)


@pytest.mark.parametrize("name", ["phaze", "random", "grid", "optuna"])
def test_an_architecture_retracted_then_released_is_proposed_once(name):
    """An architecture can sit in both of a searcher's queues: retracted by this replica (another
    took it meanwhile), then released when that other trial's lease ran out. A first version of the
    new searcher proposed it twice in one batch, and the reservation then hit the unique index (seen on
    PostgreSQL, where replicas run truly in parallel)."""
    from archplace.service.searchers import StudySearcher

    s = StudySearcher(study("q", searcher=name, seed=1).model_dump(mode="json"))
    i = s.propose()
    s.retract(i)  # another replica reserved i first ...
    s.mark(7, i)  # ... as its trial 7 (learnt from the rows)
    s.release(7, i)  # trial 7's lease ran out
    batch = [s.propose() for _ in range(3)]
    assert batch[0] == i and len(set(batch)) == 3
