"""The issue's reproduction on the real service with two Serve replicas over one SQLite file."""

from __future__ import annotations

import pytest
from service_core_util import GRID2
from service_util import start_service

pytestmark = pytest.mark.slow


def test_two_replicas_delete_and_recreate_never_hand_out_the_old_study(ray_session, tmp_path):
    """With 2 replicas the old code answered the recreated 2-point study R with the deleted R's
    architectures (arch_index 6747, 23992, ...) from the replica whose cache was keyed by the reused
    id, and the other replica answered 400. Serve spreads the requests over both replicas; 40
    suggests from 40 clients after the recreate reach both with near certainty."""
    from ray import serve

    svc = start_service(tmp_path, replicas=2)
    try:
        c = svc.client("alice", retries=30)
        c.create_study(name="R", models=["bert-base"], searcher="random", seed=5)
        for k in range(30):
            for t in c.suggest("R", count=1, client_id=f"w{k % 4}"):
                c.complete("R", t["number"], value=float(k))
        c.delete_study("R")
        assert c.create_study(name="R", models=["bert-base"], searcher="grid", space=GRID2)["space_size"] == 2
        got = []
        for k in range(40):
            resp = c.suggest_response("R", count=1, client_id=f"n{k}")
            got += [(t["number"], t["arch_index"], t["params"]["num_tc"]) for t in resp["trials"]]
            if not resp["trials"]:
                assert resp["done"]
        # the new grid's two architectures, once each, as trials 1 and 2 (which replica answered first,
        # and so which architecture is trial 1, depends on Serve's routing: each proposes its own lane)
        assert sorted((a, p) for _, a, p in got) == [(0, 2), (1, 1)]
        assert sorted(n for n, _, _ in got) == [1, 2]
    finally:
        serve.shutdown()
