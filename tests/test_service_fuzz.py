"""Fuzz the real service over HTTP with malformed requests (seeded, ``random.Random(0)``).

Every request below is invalid by construction: a wrong type, a value out of bounds, a missing or
unknown field, an unparseable or oversized body, bad or missing credentials (also with a body, which
is refused before it is read), a wrong content type, a wrong method, an unknown study / trial /
operation, a bad page size or token, an architecture that looks like a file path, too many or too
large headers (431), and a body that stops half way (408 after the body deadline, sent from bare
sockets in parallel). For every response the test holds the service to its error contract: a 4xx
(never a 2xx, never a 5xx), a JSON body ``{"error": {"code": STATUS, "status", "message"}}`` with a
non-empty message, and no traceback anywhere. The requests go out through a plain
``requests.Session`` (no retries) and deliberately bypass ``archplace.client``. Afterwards the service
must still work normally and nothing the malformed requests touched may have changed.

Left out on purpose: a Content-Length that is not a number or overflows 64 bits. The HTTP server of
Ray Serve's proxy (uvicorn) rejects such a request line itself, with a plain-text 400, before any of
the service's code runs. Types are strict (issue 29): a boolean, a numeric string or a float such as
``1.0`` is not an integer, so ``"count": true`` and ``"count": "1"`` are 422s (pydantic's lax mode
read them as 1, and did so before).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from raw_http import RawResponse, open_request, read_response
from service_util import start_service

pytestmark = pytest.mark.slow

MIN_REQUESTS = 1000
RANDOM = 100            # random multi-field mutations on top of the enumerated cases
LIMIT = 65_536          # the service's body limit (schemas.LIMITS["body_bytes"])

NAN, INF, NINF = float("nan"), float("inf"), float("-inf")


class Raw:
    """A JSON token written as is (``1e400``, a 5000-digit integer, ...)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dumps(obj: Any, ascii: bool = False) -> bytes:
    """JSON with NaN / Infinity written as the bare tokens Python's json emits, and ``Raw`` tokens;
    non-ASCII text as UTF-8 (a lone surrogate then makes the body invalid UTF-8), or as \\u escapes
    with ``ascii`` (a lone surrogate is then valid JSON)."""
    raws: list[str] = []

    def sub(o: Any) -> Any:
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"@@RAW{len(raws) - 1}@@"
        if isinstance(o, dict):
            return {k: sub(v) for k, v in o.items()}
        if isinstance(o, list):
            return [sub(v) for v in o]
        return o

    text = json.dumps(sub(obj), ensure_ascii=ascii)
    for i, r in enumerate(raws):
        text = text.replace(f'"@@RAW{i}@@"', r)
    return text.encode("utf-8", "surrogatepass")


@dataclass
class Case:
    cat: str
    method: str
    path: str
    expect: frozenset[int]
    body: bytes | None = None
    ctype: str | None = "application/json"
    auth: Any = "alice"            # an owner's name, None (no header), or Header(raw value)
    params: dict[str, Any] | None = None
    chunked: bool = False          # no Content-Length: Transfer-Encoding chunked
    content_length: str | None = None   # a Content-Length that lies about the body
    fresh: bool = False            # own connection (a body the server may not read)
    files: dict | None = None
    headers: list[tuple[str, str]] | None = None   # extra headers
    slow: int | None = None        # a bare socket sends only this many bytes of the body, then waits


@dataclass
class Header:
    value: str | bytes


def codes(*c: int) -> frozenset[int]:
    return frozenset(c)


V = codes(422)             # validation
V4 = codes(400, 422)       # validation or a check in the service
ARCH_OK = {"num_tc": [1, 2], "num_vc": [1, 2], "pe_x": [2], "pe_y": [2], "glb_mb": [2]}

# ---------------------------------------------------------------------------- invalid values per kind
BAD_NAME = [123, 1.5, True, None, [], ["fz"], {"a": 1}, "", " fz", "-fz", ".fz", "_fz", "fz!", "f z",
            "x" * 65, "研究", "🚀", "fz🚀", "ｆｚ", "fz\u0000", "fz\n", "\ud800", "../etc/passwd",
            "/etc/passwd", "fz/../x", "C:\\x", "%2e%2e", "fz;DROP TABLE studies", "fz'--", "<script>"]
# null is not bad: a suggest without a client_id gets a fresh one
BAD_CLIENT_ID = [c for c in BAD_NAME if c not in ("x" * 65, None)] + ["x" * 129, "🤖-worker", "w\tx"]
BAD_MODEL = [None, 5, [], ["bert-base"], {}, "", "nope", "/etc/passwd", "../../etc/passwd", "bert-base.json",
             "BERT-BASE", "🚀", "bert-base\u0000", "bert-base ", "x" * 5000, "bért"]
BAD_MODELS = [None, 5, {}, "bert-base", [], ["nope"], ["bert-base", "bert-base"], [1], [None],
              [["bert-base"]], ["/etc/passwd"], ["../bert-base"], ["bert-base.yaml"], ["BERT-BASE"], ["bért"],
              ["🚀"], ["bert-base\u0000"], ["bert-base"] * 9]
BAD_OBJECTIVES = (
    [None, 5, "throughput", {"name": "throughput"}, [], ["throughput"], [[]], [None],
     [{"goal": "maximize"}], [{"name": "throughput", "extra": 1}],
     [{"name": "throughput"}, {"name": "throughput"}],
     [{"name": f"o{i}"} for i in range(5)],
     [{"name": "throughput", "goal": "minimize"}]]        # phaze maximises its first objective
    + [[{"name": n}] for n in ("Throughput", "1x", "", "x" * 33, "🚀", "through put", 5, None, [])]
    + [[{"name": "throughput", "goal": g}] for g in ("up", "", None, 1, "MAXIMIZE", [])])
BAD_SPACE = [
    "/etc/passwd", "phaze_table1.yaml", "file:///etc/passwd", "../tune_configs/phaze_table1.yaml", 5, True,
    [], [ARCH_OK], {}, {"architecture": None}, {"architecture": 5}, {"architecture": 1.5},
    {"architecture": "/etc/passwd"}, {"architecture": []}, {"architecture": {}}, {"architecture": True},
    {"architecture": {**ARCH_OK, "num_tc": "/etc/passwd"}}, {"architecture": {**ARCH_OK, "num_tc": 4}},
    {"architecture": {**ARCH_OK, "num_tc": {"pow2": [0, 99]}}},
    {"architecture": {**ARCH_OK, "num_tc": {"pow2": [5, 1]}}},
    {"architecture": {**ARCH_OK, "num_tc": {"pow2": "x"}}},
    {"architecture": {**ARCH_OK, "num_tc": {"pow2": [0, 2], "x": 1}}},
    {"architecture": {**ARCH_OK, "num_tc": [-1]}}, {"architecture": {**ARCH_OK, "num_tc": [0]}},
    {"architecture": {**ARCH_OK, "num_tc": [NAN]}}, {"architecture": {**ARCH_OK, "num_tc": []}},
    {"architecture": {**ARCH_OK, "num_tc": ["1"]}}, {"architecture": {**ARCH_OK, "num_tc": [None]}},
    {"architecture": {**ARCH_OK, "glb_mb": [INF]}}, {"architecture": {**ARCH_OK, "glb_mb": [2, INF]}},
    {"architecture": {**ARCH_OK, "glb_mb": [2, Raw("1e400")]}},
    {"architecture": {**ARCH_OK, "hbm": [1]}}, {"architecture": {k: {"pow2": [0, 20]} for k in ARCH_OK}},
    {"architecture": {k: v for k, v in ARCH_OK.items() if k != "pe_y"}},
    {"architecture": ARCH_OK, "constraints": "abc"}, {"architecture": ARCH_OK, "constraints": 5},
    {"architecture": ARCH_OK, "constraints": []},
    {"architecture": ARCH_OK, "constraints": {"area_max_preset": "/etc/passwd"}},
    {"architecture": ARCH_OK, "constraints": {"area_max_preset": [1]}},
    {"architecture": ARCH_OK, "constraints": {"area_max_preset": {}}},
    {"architecture": ARCH_OK, "constraints": {"area_min_fraction": 2}},
    {"architecture": ARCH_OK, "constraints": {"area_min_fraction": "abc"}},
    {"architecture": ARCH_OK, "constraints": {"area_min_fraction": [1]}},
    {"architecture": ARCH_OK, "constraints": {"area_min_fraction": NAN}},
    {"architecture": ARCH_OK, "constraints": {"area_max_mm2": -1}},
    {"architecture": ARCH_OK, "constraints": {"area_max_mm2": "big"}},
    {"architecture": ARCH_OK, "training": 5}, {"architecture": ARCH_OK, "training": "abc"},
    {"architecture": ARCH_OK, "training": {"hbm_gb": 5}}, {"architecture": ARCH_OK, "training": []},
    {"architecture": ARCH_OK, "bogus": 1}, {"architecture": ARCH_OK, "path": "/etc/passwd"},
]
BAD_ARCH = ["/etc/passwd", "../../../etc/passwd", "./tpuv4", "tpuv4.json", "tpuv4.yaml", "~/.ssh/id_rsa",
            "file:///etc/passwd", "C:\\Windows\\win.ini", "\\\\server\\share", "tpuv4/../tpuv4", "/dev/zero",
            "/proc/self/environ", "tpuv4\u0000", "", "TPUV4", "x" * 33, "🚀", 5, 1.5, None, [], ["tpuv4"],
            True, {}, {"path": "/etc/passwd"}, {"num_tc": 1}]
ARCH_FIELDS_OK = {"num_tc": 8, "num_vc": 2, "pe_x": 128, "pe_y": 128, "pe_vc": 128, "glb_mb": 128.0}
BAD_ARCH += [{**ARCH_FIELDS_OK, **change} for change in (
    {"extra": 1}, {"num_tc": 0}, {"pe_x": 4097}, {"glb_mb": NAN}, {"glb_mb": INF}, {"glb_mb": 0},
    {"glb_mb": "abc"}, {"num_vc": "/etc/passwd"}, {"pe_y": [128]}, {"pe_vc": None})]
BAD_ARCH += [{k: v for k, v in ARCH_FIELDS_OK.items() if k != "glb_mb"}]
# null is allowed: the accelerator's own HBM (api.placement.hbm_sizes)
BAD_HBM = [[], [0], [-1], [NAN], [INF], "32", 32, [32] * 9, [5000], [[32]], ["abc"], {}]
BAD_FIXED = [[1, 2], [1, 2, 3, 4], [0, 1, 1], [1, 1, 65537], "abc", [1.5, 1, 1], 5, {}, [None, 1, 1], []]
BAD_BOOL = ["maybe", 2, -1, 1.5, [], {}, None, "🚀", "truee"]
BAD_VALUE = ["abc", "", [], {}, NAN, INF, NINF, "NaN", "inf", Raw("1e400"), Raw("-1e400"), None]
BAD_VALUES = ["abc", [], 5, {"throughput": "abc"}, {"throughput": NAN}, {"throughput": INF},
              {"throughput": None}, {"x" * 33: 1.0}, {f"o{i}": 1.0 for i in range(9)}, {"bogus": 1.0},
              {"throughput": [1]}, {"throughput": {}}, {"throughput": 2.0}, {"": 1.0},
              {"throughput": Raw("NaN")}]
BAD_REASON = [5, [], {}, True, "x" * 2001, "a\x00b"]  # NUL: PostgreSQL text cannot hold it (was a 500 there)


# Each numeric field gets the core invalid values below, plus a few of the extras (seeded picks, so
# every run sends the same requests): all of them on every field would only repeat the same checks.
_PICK = random.Random(0)
INT_EXTRA = [" ", "1 2", "0x10", "", "🚀", [], -0.5, 2**63, -10**30, NINF, Raw("-1e400"), Raw("1" * 5000),
             "1.5", "1e3", {"$gt": 0}, "true"]
FLOAT_EXTRA = ["", [1.0], NINF, "Infinity", "-inf", Raw("-1e400"), Raw("1" * 5000), "1,5", {"value": 1.0}]


def bad_int(lo: int, hi: int, optional: bool) -> list:
    out = ["abc", "١٢", [1], {"v": 1}, 1.5, lo - 1, hi + 1, 10**30, NAN, INF, Raw("1e400"),
           *_PICK.sample(INT_EXTRA, 3), True, False, str(lo), float(lo)]  # strict: no coercion
    if not optional:
        out.append(None)
    return out


def bad_float(lo: float, hi: float, lo_open: bool, optional: bool) -> list:
    out = ["abc", [], {}, NAN, INF, "NaN", Raw("1e400"), hi * 2 + 1, lo if lo_open else lo - 1,
           *_PICK.sample(FLOAT_EXTRA, 3)]
    if not optional:
        out.append(None)
    if lo_open and lo == 0:
        out += [False, -1e-300]
    return out


def bad_literal(allowed: list[str]) -> list:
    return ["bogus", "", 1, None, [], {}, True, "🚀", allowed[0].swapcase(), " " + allowed[0],
            allowed[0] + "\u0000"]


def bad_optional_literal(allowed: list[str]) -> list:
    """Like :func:`bad_literal` for a field whose null means "the default"."""
    return [v for v in bad_literal(allowed) if v is not None]


# endpoint -> (path, a valid body, {field: invalid values})
ENDPOINTS: dict[str, tuple[str, dict, dict[str, list]]] = {
    "create_study": ("/v1/studies", {"name": "fz-new", "models": ["bert-base"]}, {
        "name": BAD_NAME, "models": BAD_MODELS, "objectives": BAD_OBJECTIVES, "space": BAD_SPACE,
        "searcher": bad_literal(["phaze", "optuna", "random", "grid"]),
        "max_area_mm2": bad_float(0, 10_000, True, True), "max_trials": bad_int(1, 1_000_000, True),
        "seed": bad_int(0, 2**31 - 1, False), "hysteresis": bad_int(1, 1000, False),
        "area_bucket_mm2": bad_float(0, 1000, False, False), "accelerators": bad_int(1, 65_536, False),
        "global_batch": bad_int(1, 2**24, False)}),
    "suggest": ("/v1/studies/fz/trials:suggest", {"count": 1, "client_id": "fz-fuzz"}, {
        "count": bad_int(1, 64, False), "client_id": BAD_CLIENT_ID}),
    "complete": ("/v1/studies/fz/trials/2:complete", {"state": "COMPLETED", "value": 1.0}, {
        "state": bad_literal(["COMPLETED", "INFEASIBLE", "FAILED", "ABANDONED"]) + ["PENDING"],
        "value": BAD_VALUE, "values": BAD_VALUES, "reason": BAD_REASON}),
    "evaluate": ("/v1/evaluations", {"model": "bert-base", "arch": "tpuv4", "accelerators": 64,
                                     "global_batch": 256, "sequential": True}, {
        "model": BAD_MODEL, "arch": BAD_ARCH, "accelerators": bad_int(1, 65_536, False),
        "global_batch": bad_int(1, 2**24, False), "hbm_gb": BAD_HBM, "sequential": BAD_BOOL,
        "fixed": BAD_FIXED, "seq": bad_int(1, 32_768, True),
        "ilp_budget": bad_float(0, 120, True, False), "ilp_time_limit_s": bad_float(0, 600, True, False)}),
    "partition": ("/v1/partitions", {"model": "bert-base", "chiplets": 8}, {
        "model": BAD_MODEL, "chiplets": bad_int(1, 64, False),
        "algo": bad_literal(["greedy", "random", "sa", "ppo", "ppo-lns"]), "budget": bad_int(1, 5000, False),
        "seed": bad_int(0, 2**31 - 1, False), "seq": bad_int(1, 32_768, True),
        "mbs": bad_int(1, 1024, False), "polish": bad_float(0, 600, False, False)}),
    "pipeline": ("/v1/pipelines", {"model": "bert-base"}, {
        "model": BAD_MODEL, "cluster": bad_literal(["A", "B", "C"]) + ["D", "a"],
        "stages": bad_int(2, 8, True), "algo": bad_literal(["exact", "rainbow", "pretrained"]),
        "budget": bad_int(1, 20_000, True), "seed": bad_int(0, 2**31 - 1, False),
        "finetune": bad_int(0, 20_000, False), "radius": bad_int(0, 8, False),
        "gpu": bad_optional_literal(["h200", "a100-80gb"]) + ["H200", "p100-pcie"],
        "op_model": bad_optional_literal(["roofline", "calibrated"]) + ["profiled"],
        "dtype": bad_optional_literal(["bf16", "fp32"]) + ["float32"],
        "attention": bad_literal(["eager", "sdpa"])}),
    "shard": ("/v1/shardings", {"model": "bert-base", "devices": 4}, {
        "model": BAD_MODEL + ["hf:/etc/passwd"], "devices": bad_int(1, 1024, False),
        "algo": bad_literal(["ilp", "greedy", "megatron", "random", "exhaustive", "dqn"]) + ["exhaustive"],
        "data_parallel": BAD_BOOL, "seq": bad_int(1, 32_768, True), "batch": bad_int(1, 4096, False),
        "gpu": bad_literal(["v100-sxm2", "h200"]), "dtype": bad_literal(["fp16", "bf16"]) + ["float32"],
        "budget": bad_int(1, 100_000, True), "reward": bad_literal(["paper", "cost"]),
        "max_deterministic_s": bad_float(0, 120, True, False), "seed": bad_int(0, 2**31 - 1, False)}),
}
REQUIRED = {"create_study": ["name", "models"], "evaluate": ["model"], "partition": ["model"],
            "pipeline": ["model"], "shard": ["model"]}
EXTRA_FIELDS = [{"bogus": 1}, {"Name": "x"}, {"__proto__": {}}, {"constructor": 1}, {"": 1}, {"🚀": 1},
                {"name ": "x"}, {"x" * 4000: 1}, {"\ud800": 1}, {"id": "0" * 32}, {"owner": "bob"}]
INVALID_JSON = [b"{", b"}", b'{"name": }', b"{'name': 'x'}", b'{"count": 1,}', b'{"a":1}{"b":2}', b"// c\n{}",
                b'{"count": 1 /* c */}', b"\x00", b'{"name": "\\x41"}', b"[1,2", b"tru", b"nul",
                b'{"count": 01}',
                b'{"count": .5}', b'{"count": +1}', b'{"count": 0x10}', b'{"count": 1e}', b"\xef\xbb\xbf{",
                b'{"a": "\t"}', b'{"count": nan}', b'{"count": inf}', b'{"count": -NaN}', b"{" * 10, b"\"",
                b'{"count" 1}', b'{count: 1}', b"[", b"NaN", b"Infinity"]
NON_JSON_DOCS = [b"null", b"[]", b'"x"', b"5", b"true", b"[1, 2]", b'[{"count": 1}]']
NON_UTF8 = ['{"name": "café", "models": ["bert-base"]}'.encode("latin-1"), b'{"name": "\xff\xfe"}',
            b'{"count": 1, "client_id": "\xc3\x28"}', b'{"model": "bert-base\xed\xa0\x80"}', b"\xff" * 20,
            b'\x80{"count": 1}', "{\"state\": \"FAILED\", \"reason\": \"é\"}".encode("cp1252") + b"\x9d"]


def body_cases(rng: random.Random) -> list[Case]:
    out: list[Case] = []
    for ep, (path, base, fields) in ENDPOINTS.items():
        bodyish = codes(400, 409, 422)
        for f, values in fields.items():
            for v in values:
                out.append(Case(f"wrong-value:{ep}", "POST", path, bodyish, dumps({**base, f: v})))
                if dumps({f: v}) != dumps({f: v}, ascii=True):     # non-ASCII: also as \\u escapes
                    out.append(Case(f"wrong-value:{ep}", "POST", path, bodyish,
                                    dumps({**base, f: v}, ascii=True)))
        for f in REQUIRED.get(ep, []):
            without = {k: v for k, v in base.items() if k != f}
            out.append(Case("missing-field", "POST", path, V, dumps(without)))
        for extra in EXTRA_FIELDS:
            out.append(Case("extra-field", "POST", path, V4, dumps({**base, **extra})))
            out.append(Case("extra-field", "POST", path, V4, dumps({**base, **extra}, ascii=True)))
        # the body is parsed before any route-specific code: every document on one route, a few on the rest
        docs = INVALID_JSON + NON_JSON_DOCS
        for raw in docs if ep == "create_study" else rng.sample(docs, 8):
            out.append(Case("invalid-json", "POST", path, V4, raw))
        for raw in NON_UTF8:
            out.append(Case("non-utf8", "POST", path, V4, raw))
        for _ in range(3):
            out.append(Case("non-utf8", "POST", path, V4, b"{" + rng.randbytes(rng.randint(8, 200))))
        # empty body; a body of {} where the model has required fields
        out.append(Case("missing-field", "POST", path, V, b""))
        if ep != "suggest":
            out.append(Case("missing-field", "POST", path, V, b"{}"))
        # content types
        valid = dumps(base)
        for ct in ("text/plain", "application/x-www-form-urlencoded", "application/xml", "text/json",
                   "application/jsonx", "multipart/form-data; boundary=x", "image/png", None):
            out.append(Case("content-type", "POST", path, codes(415, 422), valid, ctype=ct))
        out.append(Case("content-type", "POST", path, codes(415, 422), None, ctype=None,
                        files={"file": ("body.json", valid, "application/json")}))
        # huge bodies: a big field, padding up to one byte over the limit, a lying or absent length
        out.append(Case("huge", "POST", path, codes(413), dumps({**base, "pad": "x" * 70_000}), fresh=True))
        out.append(Case("huge", "POST", path, codes(413), dumps({**base, "pad": ["x"] * 40_000}), fresh=True))
        padded = b" " * (LIMIT + 1 - len(valid)) + valid
        out.append(Case("huge", "POST", path, codes(413), padded, fresh=True))
        out.append(Case("huge", "POST", path, codes(413), b"[" * 1_000_000, fresh=True))
        out.append(Case("huge", "POST", path, codes(413), valid, content_length=str(LIMIT + 1), fresh=True))
        out.append(Case("huge", "POST", path, codes(413), valid, content_length="9" * 11, fresh=True))
        # a Content-Length shorter than the body: the service reads a truncated document
        out.append(Case("short-length", "POST", path, V4, valid, content_length=str(len(valid) // 2),
                        fresh=True))
        out.append(Case("huge", "POST", path, codes(413), dumps({**base, "pad": "y" * 100_000}), chunked=True,
                        fresh=True))
        # just at the limit (parsed, then refused for its content)
        at_limit = dumps({**base, "pad": ""})
        at_limit = at_limit[:-2] + b"z" * (LIMIT - len(at_limit)) + b'"}'
        out.append(Case("huge", "POST", path, V, at_limit, fresh=True))
        out.append(Case("chunked", "POST", path, V, dumps({**base, "bogus": 1}), chunked=True, fresh=True))
        # deep nesting, at the top level and inside a field
        for depth in (100, 900, 1000, 5000, 30_000) if ep == "create_study" else rng.sample([900, 5000], 1):
            for raw in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth):
                out.append(Case("deep", "POST", path, codes(413) if len(raw) > LIMIT else V4, raw))
    # nested inside the one free-form field (a study's space), under and over Python's recursion limit
    for depth in (10, 50, 200, 500, 800, 900, 950, 990, 1100, 3000):
        nest = b'{"a":' * depth + b"1" + b"}" * depth
        for key in ("training", "constraints", "bogus"):
            out.append(Case("deep", "POST", "/v1/studies", V4,
                            b'{"name": "fz-deep", "models": ["bert-base"], "space": {"architecture": '
                            + dumps(ARCH_OK) + b', "' + key.encode() + b'": ' + nest + b"}}"))
        out.append(Case("deep", "POST", "/v1/studies", V4,
                        b'{"name": "fz-deep", "models": [' + b"[" * depth + b"]" * depth + b"]}"))
    # completions that are invalid only together
    for body in ({"state": "COMPLETED"}, {"state": "INFEASIBLE"}, {"state": "INFEASIBLE", "reason": "   "},
                 {"state": "FAILED", "value": 1.0}, {"state": "ABANDONED", "values": {"throughput": 1.0}},
                 {"state": "INFEASIBLE", "reason": "x", "value": 0.0},
                 {"value": 1.0, "values": {"throughput": 2.0}}, {"state": "COMPLETED", "values": {}},
                 {"state": "COMPLETED", "value": None, "values": None}):
        out.append(Case("combination", "POST", "/v1/studies/fz/trials/2:complete", V4, dumps(body)))
    # conflicts: trial 1 is COMPLETED with 1.0; study fz exists with another configuration
    for body in ({"value": 2.0}, {"state": "FAILED"}, {"state": "INFEASIBLE", "reason": "too big"},
                 {"state": "ABANDONED"}, {"value": -1.0}):
        out.append(Case("conflict", "POST", "/v1/studies/fz/trials/1:complete", codes(409), dumps(body)))
    other = dumps({"name": "fz", "models": ["bert-large"]})
    out.append(Case("conflict", "POST", "/v1/studies", codes(409), other))
    return out


def path_cases() -> list[Case]:
    out: list[Case] = []
    ok_suggest = dumps({"count": 1, "client_id": "fz-fuzz"})
    ok_complete = dumps({"state": "COMPLETED", "value": 1.0})
    # unknown studies (valid names), another owner's study, unknown trials
    for name in ("nope", "fz-nope", "FZ", "fz.", "a" * 64, "0", "fz-empty2"):
        for m, p, b in (("GET", "", None), ("DELETE", "", None), ("POST", "/trials:suggest", ok_suggest),
                        ("POST", "/trials/1:complete", ok_complete), ("GET", "/trials", None),
                        ("GET", "/trials/1", None), ("GET", "/best", None), ("GET", "/pareto", None)):
            out.append(Case("unknown-study", m, f"/v1/studies/{name}{p}", codes(404), b))
    for m, p, b in (("GET", "", None), ("DELETE", "", None), ("POST", "/trials:suggest", ok_suggest),
                    ("POST", "/trials/2:complete", ok_complete), ("GET", "/trials", None),
                    ("GET", "/trials/2", None), ("GET", "/best", None), ("GET", "/pareto", None)):
        out.append(Case("other-owner", m, f"/v1/studies/fz{p}", codes(404), b, auth="bob"))
    out.append(Case("unknown-study", "GET", "/v1/studies/fz-empty/best", codes(404)))
    for n in (4, 5, 99, 1000, 123_456, 2**31 - 1):
        out.append(Case("unknown-trial", "GET", f"/v1/studies/fz/trials/{n}", codes(404)))
        out.append(Case("unknown-trial", "POST", f"/v1/studies/fz/trials/{n}:complete", codes(404),
                        ok_complete))
    for n in ("0", "-1", str(2**31), str(10**30), "abc", "1.5", "1e3", "٣", "🚀", "0x1", "NaN", "inf",
              "%00", "1;2", "'1'", "null", "true", "-0"):
        out.append(Case("bad-trial-number", "GET", f"/v1/studies/fz/trials/{n}", V))
        out.append(Case("bad-trial-number", "POST", f"/v1/studies/fz/trials/{n}:complete", V, ok_complete))
    # malformed study names in paths: unicode, emoji, traversal, too long
    for name in ("研究", "🚀", "fz🚀", "-fz", ".fz", "_fz", "a" * 65, "fz%20x", "fz%00", "%ff", "fz%2Fx",
                 "fz%5C..", "%2e%2e", "fz'--", "fz;x", "fz*", "ｆｚ", "fz%0A"):
        for m, p, b in (("GET", "", None), ("DELETE", "", None), ("POST", "/trials:suggest", ok_suggest),
                        ("GET", "/trials", None), ("GET", "/best", None)):
            out.append(Case("bad-study-name", m, f"/v1/studies/{name}{p}", codes(404, 422), b))
    # operations: unknown ids (well formed), malformed ids
    rng = random.Random(1)
    for _ in range(12):
        op = f"{rng.getrandbits(128):032x}"
        out.append(Case("unknown-operation", "GET", f"/v1/operations/{op}", codes(404)))
        out.append(Case("unknown-operation", "POST", f"/v1/operations/{op}:cancel", codes(404)))
    for op in ("0" * 31, "0" * 33, "A" * 32, "g" * 32, "🚀", "0" * 31 + "🚀", "x", "..", "%2e%2e%2fetc",
               "' OR 1=1 --", "%00" * 4, "0" * 4000, "0" * 31 + "\u0661", "0" * 16 + "-" + "0" * 15,
               "{" + "0" * 30 + "}", "null", "ＡＢ"):
        out.append(Case("bad-operation-id", "GET", f"/v1/operations/{op}", codes(404, 422)))
        out.append(Case("bad-operation-id", "POST", f"/v1/operations/{op}:cancel", codes(404, 422)))
    # unknown paths
    for m, p in (("GET", "/"), ("GET", "/v1"), ("GET", "/v2/studies"), ("GET", "/v1/studie"),
                 ("POST", "/v1/study"), ("GET", "/v1/studies/fz/trials/1/extra"),
                 ("GET", "/v1/operations/x/y"), ("POST", "/v1/studies/fz/trials:ask"),
                 ("GET", "/v1/studies//trials"), ("GET", "/etc/passwd"), ("GET", "/v1/%F0%9F%9A%80"),
                 ("POST", "/v1/evaluation"), ("GET", "/v1/health/x"), ("GET", "/admin"), ("GET", "/.env")):
        out.append(Case("unknown-path", m, p, codes(404), dumps({}) if m == "POST" else None))
    # ".../trials/1:finish" is the GET route of trial "1:finish": POST is a wrong method there
    out.append(Case("unknown-path", "POST", "/v1/studies/fz/trials/1:finish", codes(404, 405), dumps({})))
    # wrong methods on existing paths
    hexid = "0" * 32
    for m, p in (("PUT", "/v1/studies"), ("DELETE", "/v1/studies"), ("PATCH", "/v1/studies"),
                 ("PUT", "/v1/studies/fz"), ("POST", "/v1/studies/fz"), ("PATCH", "/v1/studies/fz"),
                 ("GET", "/v1/studies/fz/trials:suggest"), ("PUT", "/v1/studies/fz/trials:suggest"),
                 ("DELETE", "/v1/studies/fz/trials:suggest"), ("POST", "/v1/studies/fz/trials"),
                 ("DELETE", "/v1/studies/fz/trials"), ("PUT", "/v1/studies/fz/trials/1"),
                 ("DELETE", "/v1/studies/fz/trials/1"), ("POST", "/v1/studies/fz/trials/1"),
                 ("PUT", "/v1/studies/fz/trials/1:complete"), ("POST", "/v1/studies/fz/best"),
                 ("DELETE", "/v1/studies/fz/pareto"), ("GET", "/v1/evaluations"), ("PUT", "/v1/evaluations"),
                 ("GET", "/v1/partitions"), ("DELETE", "/v1/pipelines"), ("POST", "/v1/operations"),
                 ("GET", "/v1/shardings"), ("PUT", "/v1/shardings"),
                 ("DELETE", f"/v1/operations/{hexid}"), ("PUT", f"/v1/operations/{hexid}"),
                 ("GET", f"/v1/operations/{hexid}:cancel"), ("POST", "/v1/health"), ("DELETE", "/v1/health"),
                 ("PUT", "/v1/health"), ("OPTIONS", "/v1/studies"), ("OPTIONS", "/v1/evaluations"),
                 ("PATCH", "/v1/operations")):
        # GET .../X:cancel is the GET route of an operation with the id "X:cancel": a 422
        expect = codes(405, 422) if p.endswith(":cancel") and m == "GET" else codes(405)
        body = dumps({"count": 1}) if m in ("POST", "PUT", "PATCH") else None
        out.append(Case("wrong-method", m, p, expect, body))
    # page_size / page_token / state abuse on the three listings
    for p in ("/v1/studies", "/v1/studies/fz/trials", "/v1/operations"):
        for ps in ("0", "-1", "1001", "abc", "1.5", "", "1e3", "9" * 30, "١", "🚀", "0x10", "NaN", "[1]",
                   "true"):
            out.append(Case("page-size", "GET", p, V, params={"page_size": ps}))
        tokens = ("x" * 41, "🚀" * 41)
        if p == "/v1/operations":
            tokens += ("abc", "e", "-", "..", "1..2", "1e5e5", "+-", "NaN", "0x10", "🚀", "'", "1;2", "1 2")
        else:
            tokens += ("abc", "-1", "1.5", "1" * 13, "²", "1e3", "🚀", "0x10", " 1", "1 ", "+1", "NaN", "'1'")
        for pt in tokens:
            out.append(Case("page-token", "GET", p, V4, params={"page_token": pt}))
        out.append(Case("page-size", "GET", p, V, params={"page_size": "0", "page_token": "abc"}))
    for st in ("BOGUS", "pending", "🚀", "PENDING;DROP", "", "COMPLETED ", "PEND%"):
        out.append(Case("state-filter", "GET", "/v1/studies/fz/trials", V, params={"state": st}))
    return out


def auth_cases(rng: random.Random, revoked: str) -> list[Case]:
    out: list[Case] = []
    ok_create = dumps({"name": "fz-auth", "models": ["bert-base"]})
    model = dumps({"model": "bert-base"})
    routes = [("GET", "/v1/studies", None), ("POST", "/v1/studies", ok_create),
              ("GET", "/v1/studies/fz", None), ("DELETE", "/v1/studies/fz", None),
              ("POST", "/v1/studies/fz/trials:suggest", dumps({"count": 1})),
              ("POST", "/v1/studies/fz/trials/2:complete", dumps({"value": 1.0})),
              ("GET", "/v1/studies/fz/trials", None), ("GET", "/v1/studies/fz/trials/1", None),
              ("GET", "/v1/studies/fz/best", None), ("GET", "/v1/studies/fz/pareto", None),
              ("POST", "/v1/evaluations", dumps({"model": "bert-base", "sequential": True})),
              ("POST", "/v1/partitions", model), ("POST", "/v1/pipelines", model),
              ("POST", "/v1/shardings", model),
              ("GET", "/v1/operations", None), ("GET", "/v1/operations/" + "0" * 32, None),
              ("POST", f"/v1/operations/{'0' * 32}:cancel", None)]
    headers = [None, Header("Bearer"), Header("Bearer "), Header("Bearer ap_forged"),
               Header("Basic dXNlcjpwYXNz"), Header("Token {alice}"), Header("{alice}"),
               Header("Bearer {alice}x"), Header("Bearer {alice} extra"), Header("Bearer ap_" + "a" * 200),
               Header("Bearer " + revoked), Header("Bearer\t{alice}"),
               Header("Bearer {alice_upper}"), Header("Bearer ap_🚀".encode()), Header(b"Bearer ap_\xff\xfe"),
               Header("Bearer null"), Header("Bearer undefined"), Header("Bearer " + "ap_" + "0" * 43)]
    for m, p, b in routes:     # no credentials on every route, each wrong one on a few
        out.append(Case("auth", m, p, codes(401), b, auth=None))
    for h in headers[1:]:
        for m, p, b in rng.sample(routes, 5):
            out.append(Case("auth", m, p, codes(401), b, auth=h))
    return out


HEADER_COUNT, HEADER_BYTES = 100, 16_384      # the HTTP guard's limits (http_guard.HttpLimits)


def header_cases() -> list[Case]:
    """Too many headers, or too many bytes of them: a 431 before the token or the body is looked at.
    The old code had no limit (a 10 MB header was accepted)."""
    out: list[Case] = []
    ok_suggest = dumps({"count": 1, "client_id": "fz-fuzz"})
    routes = [("GET", "/v1/studies", None), ("POST", "/v1/studies/fz/trials:suggest", ok_suggest),
              ("GET", "/v1/health", None), ("GET", "/v1/nope", None)]
    for m, p, b in routes:
        for n in (HEADER_COUNT + 1, 150, 1000):
            out.append(Case("headers", m, p, codes(431), b, headers=[(f"x-fz-{i}", "1") for i in range(n)],
                            fresh=True))
        for size in (HEADER_BYTES + 1, 100_000, 1_000_000, 10_000_000):
            out.append(Case("headers", m, p, codes(431), b, headers=[("x-fz-big", "b" * size)], fresh=True))
        out.append(Case("headers", m, p, codes(431), b, headers=[(f"x-fz-{i}", "v" * 200) for i in range(90)],
                        fresh=True))                          # 90 headers of 200 bytes: over in total
    for auth in (None, Header("Bearer ap_forged")):           # no valid token: still a 431 first
        out.append(Case("headers", "GET", "/v1/studies", codes(431), auth=auth,
                        headers=[("x-fz-big", "b" * 20_000)], fresh=True))
    out.append(Case("headers", "GET", "/v1/studies", codes(431), auth=Header("Bearer ap_" + "a" * 20_000),
                    fresh=True))
    # under the limits, invalid for another reason: the limits do not fire early
    out.append(Case("headers", "POST", "/v1/studies/fz/trials:suggest", V, b'{"count": 0}',
                    headers=[(f"x-fz-{i}", "v" * 100) for i in range(80)]))
    out.append(Case("headers", "POST", "/v1/studies/fz/trials:suggest", V, b'{"count": 0}',
                    headers=[("x-fz-big", "b" * 12_000)]))
    return out


def unauthenticated_body_cases() -> list[Case]:
    """No valid token, and a body: a 401 from the headers alone, whatever the body is (huge, lying
    about its length, chunked, unparseable). The old code read the body first."""
    out: list[Case] = []
    for auth in (None, Header("Bearer ap_forged"), Header("Basic dXNlcjpwYXNz")):
        for p in ("/v1/studies", "/v1/studies/fz/trials:suggest", "/v1/evaluations"):
            out.append(Case("unauth-body", "POST", p, codes(401), b"x" * 70_000, auth=auth, fresh=True))
            out.append(Case("unauth-body", "POST", p, codes(401), b"{", auth=auth))
            out.append(Case("unauth-body", "POST", p, codes(401), b'{"count": 1}', auth=auth,
                            content_length=str(LIMIT + 1), fresh=True))
            out.append(Case("unauth-body", "POST", p, codes(401), b"y" * 100_000, auth=auth, chunked=True,
                            fresh=True))
    return out


def slow_cases() -> list[Case]:
    """Bodies that stop half way, sent from bare sockets that then wait: a 408 once the body deadline
    (10 s) has passed with a valid token, and at once without one or with a length over the limit.
    The old code waited for the rest of the body as long as the client kept the connection."""
    ok_suggest = dumps({"count": 1, "client_id": "fz-slow"})
    create = dumps({"name": "fz-slow", "models": ["bert-base"]})
    out = []
    for p, body in (("/v1/studies/fz/trials:suggest", ok_suggest), ("/v1/studies", create),
                    ("/v1/studies/fz/trials/2:complete", dumps({"value": 1.0}))):
        for sent in (0, 1, len(body) // 2, len(body) - 1):
            out.append(Case("slow-body", "POST", p, codes(408), body, slow=sent))
        out.append(Case("slow-body", "POST", p, codes(401), body, slow=len(body) // 2, auth=None))
        out.append(Case("slow-body", "POST", p, codes(401), body, slow=3, auth=Header("Bearer ap_forged")))
        out.append(Case("slow-body", "POST", p, codes(413), body, slow=3, content_length=str(LIMIT + 1)))
        out.append(Case("slow-body", "POST", p, codes(431), body, slow=3,
                        headers=[("x-fz-big", "b" * 20_000)]))
    return out


# ---------------------------------------------------------------------------- random combinations
def random_case(rng: random.Random) -> Case:
    ep = rng.choice(list(ENDPOINTS))
    path, base, fields = ENDPOINTS[ep]
    body = dict(base)
    for f in rng.sample(list(fields), k=min(len(fields), rng.randint(1, 3))):
        body[f] = rng.choice(fields[f])
    if rng.random() < 0.3:
        body.update(rng.choice(EXTRA_FIELDS))
    if rng.random() < 0.2:
        for f in REQUIRED.get(ep, []):
            body.pop(f, None)
    return Case(f"random:{ep}", "POST", path, codes(400, 409, 413, 422), dumps(body))


# ---------------------------------------------------------------------------- the test
@pytest.fixture(scope="module")
def svc(ray_session, tmp_path_factory):
    from ray import serve

    s = start_service(tmp_path_factory.mktemp("service-fuzz"))
    yield s
    serve.shutdown()


def _auth_header(svc, case: Case) -> str | bytes | None:
    if isinstance(case.auth, Header):
        v = case.auth.value
        if isinstance(v, str):
            v = v.format(alice=svc.tokens["alice"], alice_upper=svc.tokens["alice"].upper())
        return v
    return None if case.auth is None else f"Bearer {svc.tokens[case.auth]}"


def _send_slow(svc, case: Case, wait_s: float) -> RawResponse:
    """Headers, the first ``case.slow`` bytes of the body, then nothing until the answer."""
    headers = [("Content-Type", case.ctype or "application/json"), *(case.headers or [])]
    auth = _auth_header(svc, case)
    if auth is not None:
        headers.append(("Authorization", auth if isinstance(auth, str) else auth.decode("latin-1")))
    length = int(case.content_length) if case.content_length is not None else len(case.body or b"")
    port = int(svc.url.rsplit(":", 1)[1])
    s = open_request(port, case.method, case.path, headers=headers, body=(case.body or b"")[:case.slow],
                     content_length=length)
    try:
        return read_response(s, wait_s)
    finally:
        s.close()


def _send(session: requests.Session, svc, case: Case) -> requests.Response:
    headers: dict[str, Any] = dict(case.headers or [])
    if case.ctype is not None and case.files is None:
        headers["Content-Type"] = case.ctype
    auth = _auth_header(svc, case)
    if auth is not None:
        headers["Authorization"] = auth
    data: Any = case.body
    if case.chunked and data is not None:
        raw = data
        data = (raw[i:i + 8192] for i in range(0, len(raw), 8192))
    if case.fresh:
        headers["Connection"] = "close"
    req = requests.Request(case.method, svc.url + case.path, data=data, headers=headers, params=case.params,
                           files=case.files)
    prep = session.prepare_request(req)
    if case.content_length is not None:
        prep.headers["Content-Length"] = case.content_length
    if case.fresh:
        with requests.Session() as own:
            return own.send(prep, timeout=30, allow_redirects=False)
    return session.send(prep, timeout=30, allow_redirects=False)


def _check(case: Case, r: requests.Response) -> str | None:
    """What is wrong with the response, or None."""
    if "Traceback" in r.text:
        return "a traceback in the body"
    if r.status_code not in case.expect:
        return f"status {r.status_code}, expected {sorted(case.expect)}: {r.text[:300]!r}"
    if not 400 <= r.status_code < 500:
        return f"status {r.status_code} is not a 4xx"
    if not r.headers.get("content-type", "").startswith("application/json"):
        return f"content-type {r.headers.get('content-type')!r}: {r.text[:200]!r}"
    try:
        body = r.json()
    except ValueError:
        return f"not JSON: {r.text[:200]!r}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return f"no error object: {r.text[:200]!r}"
    if err.get("code") != r.status_code:
        return f"error.code {err.get('code')!r} != status {r.status_code}"
    if not isinstance(err.get("message"), str) or not err["message"].strip():
        return f"empty message: {r.text[:200]!r}"
    if not isinstance(err.get("status"), str) or not err["status"]:
        return f"no error.status: {r.text[:200]!r}"
    return None


@pytest.mark.system   # about 1.5 min of fuzzed requests against a served app: make test-system
def test_malformed_requests_get_json_4xx_and_change_nothing(svc):
    from archplace.service.auth import create_token, revoke_tokens
    from archplace.service.db import make_engine

    a = svc.client("alice")
    a.create_study(name="fz", models=["bert-base"], searcher="random", seed=1)
    setup = a.suggest("fz", count=3, client_id="fz-setup")
    assert [t["number"] for t in setup] == [1, 2, 3]
    a.complete("fz", 1, value=1.0)
    a.create_study(name="fz-empty", models=["bert-base"], searcher="random")
    engine = make_engine(svc.db)
    revoked = create_token(engine, "carol")
    revoke_tokens(engine, "carol")
    engine.dispose()
    before = {t["number"]: (t["state"], t["value"]) for t in a.trials("fz")}

    rng = random.Random(0)
    cases = (body_cases(rng) + path_cases() + auth_cases(rng, revoked) + header_cases()
             + unauthenticated_body_cases())
    rng.shuffle(cases)
    cases += [random_case(rng) for _ in range(RANDOM)]
    assert len(cases) >= MIN_REQUESTS

    hist: Counter[int] = Counter()
    by_cat: Counter[str] = Counter()
    problems: list[str] = []
    t0 = time.monotonic()
    with requests.Session() as session:
        for case in cases:
            try:
                r = _send(session, svc, case)
            except requests.RequestException as e:
                problems.append(f"{case.cat} {case.method} {case.path[:80]}: no response "
                                f"({type(e).__name__}: {e})")
                hist["no-response"] += 1
                continue
            hist[r.status_code] += 1
            by_cat[case.cat.split(":")[0]] += 1
            bad = _check(case, r)
            if bad:
                body = (case.body or b"")[:120]
                problems.append(f"{case.cat} {case.method} {case.path[:80]} params={case.params} "
                                f"body={body!r}: {bad}")
    # the slow bodies, all at once: each waits for the 10 s body deadline
    slow = slow_cases()
    with ThreadPoolExecutor(len(slow)) as pool:
        futures = [(case, pool.submit(_send_slow, svc, case, 60.0)) for case in slow]
        for case, fut in futures:
            try:
                r = fut.result()
            except OSError as e:
                problems.append(f"{case.cat} {case.method} {case.path[:80]} slow={case.slow}: no response "
                                f"({type(e).__name__}: {e})")
                hist["no-response"] += 1
                continue
            hist[r.status_code] += 1
            by_cat[case.cat] += 1
            bad = _check(case, r)
            if bad:
                problems.append(f"{case.cat} {case.method} {case.path[:80]} slow={case.slow}: {bad}")
    cases += slow
    wall = time.monotonic() - t0
    print(f"\nfuzz: {len(cases)} requests in {wall:.1f} s; "
          f"status histogram {dict(sorted(hist.items(), key=str))}")
    print(f"fuzz: by category {dict(sorted(by_cat.items()))}")
    assert not problems, f"{len(problems)} bad responses:\n" + "\n".join(problems[:40])
    assert sum(hist.values()) >= MIN_REQUESTS

    # the service still answers, and nothing the malformed requests aimed at has changed
    assert requests.get(f"{svc.url}/v1/health", timeout=10).status_code == 200
    assert {t["number"]: (t["state"], t["value"]) for t in a.trials("fz")} == before
    assert {s["name"] for s in a.list_studies()} == {"fz", "fz-empty"}
    assert not svc.client("bob").list_studies()
    assert not a.request("GET", "/v1/operations")["operations"]       # no malformed request queued work
    study = a.create_study(name="after-fuzz", models=["bert-base"], searcher="random", seed=2)
    assert study["trials"] == 0
    t = a.suggest("after-fuzz", count=1, client_id="after")[0]
    done = a.complete("after-fuzz", t["number"], value=3.5)
    assert done["state"] == "COMPLETED" and done["value"] == 3.5
    assert a.best("after-fuzz")["number"] == t["number"]
