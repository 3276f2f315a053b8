"""Strict request types over real HTTP (the service's FastAPI app in uvicorn, no Ray): nothing is
coerced, spaces are integer powers of two within int64, -0.0 survives bit for bit; the heartbeat
route and the per-owner limits as a client sees them."""

from __future__ import annotations

import math
import struct

import pytest
from service_core_util import GRID2, HttpApp


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    a = HttpApp(tmp_path_factory.mktemp("types") / "s.db")
    r = a.post("/v1/studies", {"name": "t", "models": ["bert-base"], "searcher": "grid", "space": GRID2})
    assert r.status_code == 201, r.text
    yield a
    a.close()


def _err(r, field: str) -> str:
    assert r.status_code == 422, (r.status_code, r.text)
    msg = r.json()["error"]["message"]
    assert msg.startswith(field + ":") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize(
    "body, field",
    [
        (b'{"count": "1", "client_id": "w"}', "count"),
        (b'{"count": true, "client_id": "w"}', "count"),
        (b'{"count": 1.0, "client_id": "w"}', "count"),
        (b'{"count": 1, "client_id": 7}', "client_id"),
    ],
)
def test_suggest_fields_are_not_coerced(app, body, field):
    """The old code read "1", true and 1.0 as the count 1 (pydantic's lax mode)."""
    _err(app.post("/v1/studies/t/trials:suggest", body), field)


@pytest.mark.parametrize(
    "body, field",
    [
        (b'{"value": true}', "value"),
        (b'{"value": "1.5"}', "value"),
        (b'{"values": {"throughput": false}}', "values.throughput"),
        (b'{"state": "FAILED", "reason": 5}', "reason"),
    ],
)
def test_complete_fields_are_not_coerced(app, body, field):
    """The old code stored ``value: true`` as 1.0 and ``"1.5"`` as 1.5."""
    t = app.post("/v1/studies/t/trials:suggest", {"count": 1, "client_id": "coerce"}).json()["trials"][0]
    _err(app.post(f"/v1/studies/t/trials/{t['number']}:complete", body), field)


@pytest.mark.parametrize("number", ["1.0", "1e0", "+1", "0x1", "１"])
def test_a_trial_number_is_digits_only(app, number):
    """The old code read the trial number ``1.0`` in a path as trial 1."""
    _err(app.get(f"/v1/studies/t/trials/{number}"), "path.number")
    _err(app.post(f"/v1/studies/t/trials/{number}:complete", {"value": 1.0}), "path.number")


@pytest.mark.parametrize(
    "axis, message",
    [
        ([2.5], "2.5 is not allowed"),
        ([2.0], "2.0 is not allowed"),
        ([3], "3 is not allowed"),
        ([2**63], f"{2**63} is not allowed"),
        ([True], "True is not allowed"),
        ({"pow2": [0.0, 2]}, "pow2 must be [lo, hi], two integers"),
        ({"pow2": [False, True]}, "pow2 must be [lo, hi], two integers"),
    ],
)
def test_space_axes_are_integer_powers_of_two_within_int64(app, axis, message):
    """The old code accepted fractional and over-int64 values at create; every suggest then failed."""
    space = {"architecture": {**GRID2["architecture"], "glb_mb": axis}}
    r = app.post("/v1/studies", {"name": "bad-space", "models": ["bert-base"], "space": space})
    msg = _err(r, "space")
    assert "space.architecture.glb_mb" in msg and message in msg


def test_negative_zero_is_kept_bit_for_bit(app):
    """The old code returned -0.0 as 0.0: SQLite stores a REAL -0.0 as the integer 0."""
    t = app.post("/v1/studies/t/trials:suggest", {"count": 1, "client_id": "negzero"}).json()["trials"][0]
    done = app.post(f"/v1/studies/t/trials/{t['number']}:complete", b'{"value": -0.0}').json()
    again = app.get(f"/v1/studies/t/trials/{t['number']}").json()
    for v in (done["value"], again["value"], again["values"]["throughput"]):
        assert struct.pack("<d", v) == struct.pack("<d", -0.0) and math.copysign(1.0, v) == -1.0
    # a retried completion with the same -0.0 is the same completion
    assert app.post(f"/v1/studies/t/trials/{t['number']}:complete", b'{"value": -0.0}').status_code == 200


def test_heartbeat_route(app):
    """Leases are renewed over HTTP by POST .../trials/{number}:heartbeat; a trial that is no longer
    PENDING answers 409 (the old service had no leases and no such route)."""
    assert app.post("/v1/studies", {"name": "hb", "models": ["bert-base"], "searcher": "random"}).ok
    r = app.post("/v1/studies/hb/trials:suggest", {"count": 1, "client_id": "hb"})
    t = r.json()["trials"][0]
    assert r.json()["client_id"] == "hb" and t["lease_expires_at"] > t["created_at"]
    hb = app.post(f"/v1/studies/hb/trials/{t['number']}:heartbeat", b"")
    assert hb.status_code == 200 and hb.json()["lease_expires_at"] >= t["lease_expires_at"]
    app.post(f"/v1/studies/hb/trials/{t['number']}:complete", {"state": "FAILED"})
    late = app.post(f"/v1/studies/hb/trials/{t['number']}:heartbeat", b"")
    assert late.status_code == 409 and "is FAILED" in late.json()["error"]["message"]
    assert app.post("/v1/studies/hb/trials/999:heartbeat", b"").status_code == 404
    anon = app.post("/v1/studies/hb/trials:suggest", {"count": 1}).json()
    assert anon["client_id"].startswith("anon-") and anon["trials"][0]["client_id"] == anon["client_id"]


def test_owner_limits_answer_409_naming_the_limit(app):
    """The old code let an owner create studies without limit."""
    n = len(app.get("/v1/studies").json()["studies"])
    app.state.studies.max_studies = n
    try:
        r = app.post("/v1/studies", {"name": "one-more", "models": ["bert-base"], "space": GRID2})
        assert r.status_code == 409 and f"the limit is {n}" in r.json()["error"]["message"]
    finally:
        app.state.studies.max_studies = 100
