"""The client's retries against a real HTTP server on 127.0.0.1 that answers as Ray Serve's proxy does
while the service restarts: a plain-text 404 until the routes are up, a 503 with Retry-After, or no
listener at all. Fast: no Ray."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from service_util import free_port

from archplace.client import Client, ServiceError


class Script:
    """The answers the server gives, in order; the last one repeats."""

    def __init__(self, *answers: tuple[int, str, str, dict]) -> None:
        self.answers = list(answers)
        self.calls = 0

    def next(self) -> tuple[int, str, str, dict]:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def serve(script: Script, port: int | None = None) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            self.rfile.read(n)
            code, ctype, body, headers = script.next()
            data = body.encode()
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *_args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


PROXY_404 = (404, "text/plain", "Path '/v1/studies/x' not found. Ping http://.../-/routes for routes.", {})
APP_404 = (404, "application/json", json.dumps({"error": {"code": 404, "status": "NOT_FOUND",
                                                          "message": "study 'x' not found"}}), {})
BUSY = (503, "text/plain", "busy", {"Retry-After": "1"})
OK = (200, "application/json", json.dumps({"name": "x"}), {})


def test_proxy_404_and_503_are_retried_until_the_service_answers():
    """While Serve deploys the app after a restart, its proxy answers a plain-text 404; the old client
    raised it at once as an error, so a worker mid-loop failed. The app's own JSON 404 is still an
    error, at once."""
    script = Script(PROXY_404, PROXY_404, BUSY, OK)
    srv, url = serve(script)
    try:
        assert Client(url, "ap_x", backoff_s=0.05).get_study("x") == {"name": "x"}
    finally:
        srv.shutdown()
    assert script.calls == 4
    script2 = Script(APP_404)
    srv, url = serve(script2)
    try:
        with pytest.raises(ServiceError) as e:
            Client(url, "ap_x", backoff_s=0.05).get_study("x")
        assert e.value.status == 404 and e.value.message == "study 'x' not found" and script2.calls == 1
    finally:
        srv.shutdown()


class FakeClock:
    """The client's clock (``archplace.client.time``): ``sleep`` advances it, nothing else does, so
    the retries and their waits are counted, not timed."""

    def __init__(self) -> None:
        self.t, self.slept = 0.0, []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    import archplace.client

    c = FakeClock()
    monkeypatch.setattr(archplace.client, "time", c)
    return c


class Until(Script):
    """``before`` until ``at`` on ``clock``, then ``after``."""

    def __init__(self, clock: FakeClock, at: float, before, after) -> None:
        super().__init__(before)
        self.clock, self.at, self.before, self.after = clock, at, before, after

    def next(self):
        self.calls += 1
        return self.after if self.clock.t >= self.at else self.before


def test_retries_go_on_until_the_deadline_not_a_count(clock):
    """A service busy (503 without Retry-After) for 14 s, then up: the call succeeds. The old client
    stopped after 8 retries, whose backoff from 0.05 s added up to 11.4 s (23 s from its default
    0.25 s), while a restart took 30-110 s; it raised the 503 to its caller."""
    script = Until(clock, 14.0, (503, "text/plain", "busy", {}), OK)
    srv, url = serve(script)
    try:
        assert Client(url, "ap_x", backoff_s=0.05).get_study("x") == {"name": "x"}
    finally:
        srv.shutdown()
    # by hand: waits double from 0.05 s up to 5 s; the 9 waits before the 10th call add up to 16.35 s,
    # the first sum past 14 s (8 waits: 11.35 s), so the 10th call is the first the service answers
    assert clock.slept == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert script.calls == 10 and clock.t == pytest.approx(16.35)


def test_retries_stop_at_the_deadline(clock):
    script = Script(BUSY)
    srv, url = serve(script)
    try:
        with pytest.raises(ServiceError) as e:
            Client(url, "ap_x", backoff_s=0.05, retry_deadline_s=2.5).get_study("x")
    finally:
        srv.shutdown()
    # by hand: Retry-After 1 s beats the backoff; calls at 0, 1 and 2 s, a last wait cut to the 0.5 s
    # left, one more call at 2.5 s, then the deadline: the 503 is raised
    assert e.value.status == 503 and script.calls == 4
    assert clock.slept == pytest.approx([1.0, 1.0, 0.5]) and clock.t == pytest.approx(2.5)


def test_connection_refused_is_retried_until_the_service_listens():
    """No listener at first (the service is down), then the service: the call succeeds."""
    port = free_port()
    box: dict = {}

    def later() -> None:
        time.sleep(1.5)
        box["srv"], _ = serve(Script(OK), port)

    threading.Thread(target=later, daemon=True).start()
    try:
        assert Client(f"http://127.0.0.1:{port}", "ap_x", backoff_s=0.1).get_study("x") == {"name": "x"}
    finally:
        deadline = time.monotonic() + 10
        while "srv" not in box and time.monotonic() < deadline:
            time.sleep(0.05)
        if "srv" in box:
            box["srv"].shutdown()
