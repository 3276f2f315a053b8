"""Direct ingress (``ServeConfig.direct_ingress``, the default): the replicas serve the service's port
themselves, so a request crosses one HTTP hop, not two (client -> Serve's proxy -> replica over Ray),
and Serve's backpressure, replica restarts and shutdown keep working on that path.

The service: Ray Serve on the session's embedded Ray, 2 replicas on 127.0.0.1, each with 2 request
slots and 1 queued request, SQLite, token auth. Every test says what the old code did.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest
import requests
from raw_http import open_request, read_response
from service_util import replica_actor_names, start_service

pytestmark = pytest.mark.slow

REPLICAS, SLOTS, QUEUED = 2, 2, 1
BODY_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def svc(ray_session, tmp_path_factory):
    from ray import serve

    s = start_service(tmp_path_factory.mktemp("service-ingress"), replicas=REPLICAS,
                      max_ongoing_requests=SLOTS, max_queued_requests=QUEUED,
                      max_requests_per_ip=100, body_timeout_s=BODY_TIMEOUT_S)
    yield s
    serve.shutdown()


def _port(svc) -> int:
    return urlparse(svc.url).port


def _replica_pids() -> set[int]:
    import ray

    pids = set()
    for name in replica_actor_names():
        h = ray.get_actor(name, namespace="serve")
        pids.add(ray.get(h.__ray_call__.remote(lambda self: os.getpid()), timeout=60))
    return pids


def _listeners(port: int) -> set[int]:
    import psutil

    return {c.pid for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_serve_http_on_binds_the_service_port_with_so_reuseport(monkeypatch):
    """The wrapper the replica installs: Serve's own server start, with the service's host and port
    and SO_REUSEPORT in place of the port Serve allotted; installing it twice wraps Serve's once."""
    import asyncio

    from ray.serve._private import replica as serve_replica
    from ray.serve.config import HTTPOptions

    from archplace.service.deployment import direct_ingress_available, serve_http_on

    assert direct_ingress_available()
    seen = []

    async def fake(app, http_options, *, event_loop, enable_so_reuseport=False):
        seen.append((http_options.host, http_options.port, enable_so_reuseport))
        return "task", "server"

    monkeypatch.setattr(serve_replica, "start_asgi_http_server", fake)
    serve_http_on("127.0.0.1", 8123)
    serve_http_on("127.0.0.1", 8124)
    out = asyncio.run(serve_replica.start_asgi_http_server(
        None, HTTPOptions(host="0.0.0.0", port=30001), event_loop=None, enable_so_reuseport=False))
    assert out == ("task", "server") and seen == [("127.0.0.1", 8124, True)]


def test_each_replica_listens_on_the_port_and_answers_it_itself(svc):
    """Both replicas, and nothing else, listen on the service's port, and the server end of a
    client's connection is a replica's. The old code's port was Serve's proxy's, which passed each
    request on to a replica over Ray: two HTTP servers' work per request (19.9 ms of CPU for an empty
    route under load, the proxy 8.9 of it)."""
    import psutil

    port = _port(svc)
    replicas = _replica_pids()
    assert len(replicas) == REPLICAS
    assert _listeners(port) == replicas
    conn = open_request(port, "GET", "/v1/health")  # keep-alive: the connection stays open
    try:
        assert read_response(conn, timeout_s=30).status_code == 200
        mine = conn.getsockname()[1]
        server = {c.pid for c in psutil.net_connections("tcp")
                  if c.laddr.port == port and c.raddr and c.raddr.port == mine}
    finally:
        conn.close()
    assert len(server) == 1 and server <= replicas
    # the guard and the OpenAPI are the replica's as before
    assert requests.get(f"{svc.url}/v1/studies", timeout=30).status_code == 401
    assert requests.get(f"{svc.url}/openapi.json", timeout=30).json()["info"]["title"] == "archplace"


def test_serve_backpressure_holds_on_the_direct_path(svc):
    """Slow authenticated bodies hold request slots; beyond a replica's 2 running and 1 queued,
    Serve answers 503 with Retry-After at once, and the held ones get the guard's 408 after the body
    deadline. Nothing hangs, and the owner's requests go through afterwards (as through the proxy)."""
    c = svc.client("alice")
    c.create_study(name="bp", models=["bert-base"], searcher="random", seed=3)
    port = _port(svc)
    n = REPLICAS * (SLOTS + QUEUED) + 6
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {svc.tokens['alice']}"}
    t0 = time.monotonic()
    slow = [open_request(port, "POST", "/v1/studies/bp/trials:suggest", headers=headers,
                         body=b'{"count": 1, "client_id": "', content_length=1000) for _ in range(n)]

    def answer(s):
        return read_response(s, timeout_s=4 * BODY_TIMEOUT_S + 60), time.monotonic() - t0

    try:
        with ThreadPoolExecutor(len(slow)) as pool:  # each answer timed as it comes
            answers = list(pool.map(answer, slow))
    finally:
        for s in slow:
            s.close()
    codes = [a.status_code for a, _ in answers]
    print(f"\n{n} slow bodies: {codes.count(408)} x 408, {codes.count(503)} x 503, "
          f"last after {max(t for _, t in answers):.1f} s")
    assert set(codes) <= {408, 503}
    assert codes.count(503) >= n - REPLICAS * (SLOTS + QUEUED) and codes.count(408) >= REPLICAS
    for a, t in answers:
        if a.status_code == 503:
            assert a.headers["retry-after"] == "2" and t < BODY_TIMEOUT_S
    t = c.suggest("bp", client_id="after")[0]
    assert c.complete("bp", t["number"], value=0.5)["value"] == 0.5
    assert c.trials("bp", state="PENDING") == []


def test_a_killed_replica_is_replaced_on_the_same_port(svc):
    """Serve replaces a killed replica, and the new one listens on the service's port again (Serve's
    own direct ingress would give it a new port from 30000 up, kept from reuse for 150 s)."""
    import ray

    port = _port(svc)
    before = _replica_pids()
    victim = replica_actor_names()[0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=False)
    c = svc.client("alice")
    c.create_study(name="kill", models=["bert-base"], searcher="random", seed=4)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        now = _listeners(port)
        if len(now) == REPLICAS and now != before:
            break
        time.sleep(1)
    assert len(_listeners(port)) == REPLICAS and _listeners(port) != before
    assert _listeners(port) == _replica_pids()
    t = c.suggest("kill", client_id="k")[0]
    assert c.complete("kill", t["number"], value=1.0)["value"] == 1.0


def test_shutdown_frees_the_port_and_the_proxy_path_still_serves(svc, tmp_path):
    """``serve.shutdown()`` lets go of the port within seconds (Serve's direct ingress holds a
    replica 30 s by default before it drains; that is turned off), and ``direct_ingress=False`` still
    serves through Serve's proxy, which then listens on the port instead of the replica."""
    from ray import serve

    from archplace.service.deployment import port_free, wait_port_free

    port = _port(svc)
    t0 = time.monotonic()
    serve.shutdown()
    assert wait_port_free("127.0.0.1", port, timeout_s=30)
    print(f"\nport free {time.monotonic() - t0:.1f} s after serve.shutdown()")

    proxied = start_service(tmp_path, direct_ingress=False)
    try:
        replicas = _replica_pids()
        on_port = _listeners(_port(proxied))
        assert len(on_port) == 1 and not on_port & replicas  # Serve's proxy
        c = proxied.client("alice")
        c.create_study(name="p", models=["bert-base"], searcher="random", seed=5)
        t = c.suggest("p", client_id="p")[0]
        assert c.complete("p", t["number"], value=2.0)["value"] == 2.0
    finally:
        serve.shutdown()
        svc.url = proxied.url  # the module's fixture shuts Serve down again: harmless
    assert port_free("127.0.0.1", port)
