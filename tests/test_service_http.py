"""Slow and hostile clients against the real service: Ray Serve with 2 replicas on 127.0.0.1 (the
same deployment ``archplace serve`` runs, its proxy included), each replica with 16 request slots, so
32 in all, and a SQLite database.

The clients are bare sockets (``raw_http``) that send their headers and half of the body they
announced, then wait: the pattern that took the service down. Every test says what the old code did.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

import pytest
import requests
from raw_http import open_request, read_response, request
from service_util import start_service

pytestmark = pytest.mark.slow

REPLICAS, SLOTS = 2, 16
BODY_TIMEOUT_S = 4.0
PER_IP = SLOTS // 2  # the default: half of a replica's slots


@pytest.fixture(scope="module")
def svc(ray_session, tmp_path_factory):
    from ray import serve

    s = start_service(
        tmp_path_factory.mktemp("service-http"),
        replicas=REPLICAS,
        max_ongoing_requests=SLOTS,
        body_timeout_s=BODY_TIMEOUT_S,
    )
    yield s
    serve.shutdown()


def _port(svc) -> int:
    return urlparse(svc.url).port


def _half_body(port: int, token: str | None, path: str = "/v1/studies/s/trials:suggest"):
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return open_request(port, "POST", path, headers=headers, body=b'{"count": 1, "client_id": "',
                        content_length=1000)


def test_300_slow_unauthenticated_connections_do_not_stop_an_owner(svc):
    """300 connections (more than the 32 request slots of both replicas together) send headers and
    half a body, without a token or with a forged one, and stay open. An owner's suggest must still be
    answered, and each slow connection gets a JSON 401 without sending the rest of its body.

    The old code read the body before it checked the token, so each such request held a replica
    slot for as long as its client liked: about 130 of them filled the 128 slots of one replica, and
    every owner's request then timed out, with no 503. The bound of 15 s is the issue's own and is
    deliberately loose: on this shared 2-core machine the 300 refusals pass through Serve's proxy and
    router in about a second or two; a regression hangs until the client's timeout instead."""
    c = svc.client("alice")
    c.create_study(name="s", models=["bert-base"], searcher="random", seed=5)
    port = _port(svc)
    slow = []
    for i in range(300):
        token = None if i % 3 else ("ap_forged" + "x" * 40 if i % 2 else "not-a-token")
        slow.append(_half_body(port, token))
    try:
        t0 = time.monotonic()
        r = requests.post(f"{svc.url}/v1/studies/s/trials:suggest", json={"count": 1, "client_id": "owner"},
                          headers={"Authorization": f"Bearer {svc.tokens['alice']}"}, timeout=15)
        took = time.monotonic() - t0
        print(f"\nowner's suggest beside 300 slow unauthenticated connections: {took:.2f} s")
        # no wall-clock assert beside it: the request's own timeout (15 s) is the bound, a regression
        # hangs into it and raises ReadTimeout; what is checked is that the owner got its answer
        assert r.status_code == 200 and len(r.json()["trials"]) == 1, r.text
        answers = [read_response(s, timeout_s=60) for s in slow]
    finally:
        for s in slow:
            s.close()
    assert {a.status_code for a in answers} == {401}
    for a in answers:
        assert a.json()["error"]["status"] == "UNAUTHENTICATED" and a.headers["connection"] == "close"
    # the service is not left degraded: a full ask/tell round still works
    t = c.suggest("s", client_id="after")[0]
    assert c.complete("s", t["number"], value=2.5)["value"] == 2.5


def test_slow_authenticated_bodies_get_408_and_one_address_beyond_its_cap_503(svc):
    """Slow bodies with a valid token: each replica lets one address hold at most 8 of its 16 slots
    (503 with Retry-After above that, at once), and a body that has not arrived after the deadline
    is a 408. Nothing hangs, and afterwards the owner's requests go through.

    The old code had no body deadline and no per-address cap: each of these requests held its slot
    until its client gave up, so 32 of them stopped the service for everybody."""
    c = svc.client("alice")
    c.create_study(name="cap", models=["bert-base"], searcher="random", seed=6)
    port = _port(svc)
    n = REPLICAS * PER_IP + 12
    t0 = time.monotonic()
    slow = [_half_body(port, svc.tokens["alice"], "/v1/studies/cap/trials:suggest") for _ in range(n)]
    try:
        answers = [(read_response(s, timeout_s=BODY_TIMEOUT_S + 60), time.monotonic() - t0) for s in slow]
    finally:
        for s in slow:
            s.close()
    codes = [a.status_code for a, _ in answers]
    print(f"\n{n} slow authenticated bodies: {codes.count(408)} x 408, {codes.count(503)} x 503, "
          f"last answer after {max(t for _, t in answers):.1f} s")
    assert set(codes) <= {408, 503}
    assert codes.count(503) >= n - REPLICAS * PER_IP and codes.count(408) >= 1
    for a, _ in answers:
        err = a.json()["error"]
        assert err["code"] == a.status_code and a.headers["connection"] == "close"
        if a.status_code == 503:
            assert a.headers["retry-after"] == "2" and "requests from 127.0.0.1 in flight" in err["message"]
        else:
            assert err["status"] == "REQUEST_TIMEOUT" and "not received within 4 s" in err["message"]
    t = c.suggest("cap", client_id="after")[0]
    assert c.complete("cap", t["number"], value=1.5)["value"] == 1.5
    assert c.trials("cap", state="PENDING") == []  # no slow request reached the searcher


def test_headers_over_the_limits_get_431(svc):
    """More than 100 headers, or more than 16 KiB of them, is a JSON 431, checked before the token.
    The old code had no limit: a 10 MB header was accepted and carried to a replica."""
    port = _port(svc)
    auth = {"Authorization": f"Bearer {svc.tokens['alice']}"}

    many = request(port, "GET", "/v1/studies", headers=[*auth.items(), *((f"x{i}", "1") for i in range(120))])
    assert many.status_code == 431 and "at most 100" in many.json()["error"]["message"]
    big = request(port, "GET", "/v1/studies", headers={**auth, "x-big": "b" * 20_000})
    assert big.status_code == 431 and "at most 16384" in big.json()["error"]["message"]
    assert request(port, "GET", "/v1/studies", headers={"x-big": "b" * 20_000}).status_code == 431
    ok = request(port, "GET", "/v1/studies", headers={**auth, "x-fine": "f" * 8000})
    assert ok.status_code == 200
