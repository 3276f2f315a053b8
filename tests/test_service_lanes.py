"""Replica lanes (``StudySearcher(lane=(rank, replicas))``): replicas sharing a study propose from
disjoint parts of the random or grid order, so their proposal pools do not collide; one replica proposes
exactly the order it always did, and a replica whose partners are gone still reaches every architecture."""

from __future__ import annotations

import pytest
from service_core_util import ask, replicas, study


def _config(searcher: str):
    return study("q", searcher=searcher, seed=1).model_dump(mode="json")


def _drain(s, k: int | None = None) -> list[int]:
    out = []
    while k is None or len(out) < k:
        i = s.propose()
        if i is None:
            break
        s.commit(len(out) + 1, i)
        out.append(i)
    return out


@pytest.mark.parametrize("searcher", ["random", "grid"])
def test_one_lane_is_the_whole_order_and_two_lanes_split_it(searcher):
    from archplace.service.searchers import StudySearcher

    whole = StudySearcher(_config(searcher))
    order = [int(i) for i in whole.order]
    assert _drain(whole, 50) == order[:50]                      # lane (0, 1): the order as before
    a, b = StudySearcher(_config(searcher), (0, 2)), StudySearcher(_config(searcher), (1, 2))
    assert _drain(a, 50) == order[0:100:2] and _drain(b, 50) == order[1:100:2]  # disjoint lanes


def test_a_lane_alone_still_proposes_every_architecture():
    """Replica 1 of 2 whose partner never proposes: its lane, then everything the other lane left."""
    from archplace.service.searchers import StudySearcher

    s = StudySearcher(_config("random"), (1, 2))
    got = _drain(s)
    assert sorted(got) == sorted(int(i) for i in s.order)
    half = len(s.order) // 2
    assert got[:half] == [int(i) for i in s.order[1::2]][:half]


def test_two_laned_replicas_hand_out_distinct_architectures(tmp_path):
    """Alternating suggests on two replicas with lanes: every architecture once, and no reservation
    needed a retry (each replica proposed from its own lane)."""
    from archplace.service import studies

    a, b = (replicas(tmp_path / "s.db", 1, lane=(0, 2), pool=4)
            + replicas(tmp_path / "s.db", 1, lane=(1, 2), pool=4))
    a.create("o", study("q", searcher="random", seed=1))
    taken = []
    real = studies._Taken.__init__
    studies._Taken.__init__ = lambda self, *x: (taken.append(1), real(self, *x))[1]
    try:
        got = [ask(svc, "o", "q", client_id=f"c{k}-{r}").trials[0].arch_index
               for k in range(20) for r, svc in enumerate((a, b))]
    finally:
        studies._Taken.__init__ = real
    assert len(set(got)) == 40 and not taken
