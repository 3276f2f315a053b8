"""Python client of the archplace service (``archplace serve``).

    from archplace.client import Client

    c = Client("http://127.0.0.1:8000", token)
    study = c.create_study(name="bert", models=["bert-large"])
    for trial in c.suggest(study["name"], count=2, client_id="worker-0"):
        c.complete(study["name"], trial["number"], value=my_measurement(trial["params"]))
    print(c.best(study["name"]))

Every call is idempotent, and is retried until ``retry_deadline_s`` (300 s by default) has passed:
on connection errors and timeouts, on 408/502/503/504 (honouring Retry-After), and on a 404 or 500
that Ray Serve's proxy wrote rather than the service (not the service's JSON error): a plain-text 404
while the routes come up after a restart, a 500 for a replica that died under the request. A suggest
with the same ``client_id`` returns the same pending trials, a repeated completion with the same
measurement is accepted, and a repeated create of an identical study returns it. So a client that
outlives a service restart (30-110 s were measured) or a killed replica loses nothing. Errors are
raised as ``ServiceError`` carrying the HTTP status and the service's one-line message.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import requests

RETRY_STATUS = (408, 502, 503, 504)
TRANSPORT_ERRORS = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


def _proxy_error(r: requests.Response) -> bool:
    """A 404 or 500 that Ray Serve's proxy wrote, not the app: a 404 for a route not (yet) known while
    the application deploys after a restart, a 500 for a replica that died under the request. The
    app's own errors are always JSON with an "error" object. Safe to retry, as every call is
    idempotent (the app's own 404, an unknown study, is not retried)."""
    if r.status_code not in (404, 500):
        return False
    try:
        body = r.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and isinstance(body.get("error"), dict))


class ServiceError(Exception):
    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.body = status, message, body or {}


class Client:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int | None = None,
        backoff_s: float = 0.25,
        retry_deadline_s: float = 300.0,
    ) -> None:
        """``timeout_s``: per HTTP request. A call is retried until ``retry_deadline_s`` after it
        began (and at most ``retries`` times, if given), with backoff from ``backoff_s`` up to 5 s."""
        if retries is not None and retries < 0:
            raise ValueError(f"retries must be >= 0 or None, got {retries}")
        if not retry_deadline_s >= 0:
            raise ValueError(f"retry_deadline_s must be >= 0, got {retry_deadline_s}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.retry_deadline_s = retry_deadline_s
        self.session = requests.Session()
        # this Client's worker identity for suggest (not "default": workers would share trials)
        self.client_id = f"py-{uuid.uuid4().hex}"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    # ------------------------------------------------------------------ transport
    def request(
        self, method: str, path: str, json: Any = None, params: dict | None = None, retry: bool = True
    ) -> Any:
        deadline = time.monotonic() + self.retry_deadline_s
        delay, attempt = self.backoff_s, 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            try:
                r = self.session.request(
                    method,
                    self.url + path,
                    json=json,
                    params=params,
                    timeout=max(1.0, min(self.timeout_s, left)) if retry else self.timeout_s,
                )
            except TRANSPORT_ERRORS:
                # refused while the service restarts, or a request that went to a replica killed
                # under it and hung until the read timeout: every call is idempotent, so send it again
                if not self._again(retry, attempt, deadline, delay):
                    raise
                delay = min(delay * 2, 5.0)
                continue
            if r.status_code in RETRY_STATUS or _proxy_error(r):
                wait = r.headers.get("Retry-After")
                if self._again(retry, attempt, deadline, float(wait) if wait and wait.isdigit() else delay):
                    delay = min(delay * 2, 5.0)
                    continue
            if r.status_code == 204:
                return None
            try:
                body = r.json()
            except ValueError:
                body = {"error": {"message": r.text[:500]}}
            if r.status_code >= 400:
                err = body.get("error", {}) if isinstance(body, dict) else {}
                raise ServiceError(r.status_code, err.get("message", r.reason), body)
            return body

    def _again(self, retry: bool, attempt: int, deadline: float, wait: float) -> bool:
        """Sleep before the next attempt if one is allowed (by ``retry``, ``retries`` and the
        deadline); whether to try again."""
        if not retry or (self.retries is not None and attempt > self.retries):
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(wait, left))
        return True

    # ------------------------------------------------------------------ studies
    def create_study(self, name: str, models: list[str], **config: Any) -> dict[str, Any]:
        """Create (or, if identical, get) a study. ``config``: searcher, objectives, space,
        max_area_mm2, max_trials, seed, hysteresis, area_bucket_mm2, accelerators, global_batch."""
        return self.request("POST", "/v1/studies", {"name": name, "models": list(models), **config})

    def get_study(self, study: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/studies/{study}")

    def list_studies(self) -> list[dict[str, Any]]:
        return self._all("/v1/studies", "studies")

    def delete_study(self, study: str) -> None:
        self.request("DELETE", f"/v1/studies/{study}")

    def suggest(self, study: str, count: int = 1, client_id: str | None = None) -> list[dict[str, Any]]:
        """Trials to evaluate: the ``client_id``'s pending trials first, then new ones, ``count`` in all.
        The default ``client_id`` is this Client's own (``self.client_id``, random per Client), so a
        retried call gets the same trials and two workers never share theirs; give one Client per
        worker, or an id per worker. An empty list means the study suggests nothing more (see
        ``suggest_response`` for the reason)."""
        return self.suggest_response(study, count, client_id)["trials"]

    def suggest_response(self, study: str, count: int = 1, client_id: str | None = None) -> dict[str, Any]:
        body = {"count": count, "client_id": client_id or self.client_id}
        return self.request("POST", f"/v1/studies/{study}/trials:suggest", body)

    def heartbeat(self, study: str, trial: int) -> dict[str, Any]:
        """Renew a pending trial's lease (the study's ``lease_s``); a 409 says the trial is no longer
        PENDING (its lease expired and its architecture went to another worker): stop working on it."""
        return self.request("POST", f"/v1/studies/{study}/trials/{int(trial)}:heartbeat")

    def complete(
        self,
        study: str,
        trial: int,
        value: float | None = None,
        *,
        values: dict[str, float] | None = None,
        infeasible: bool = False,
        failed: bool = False,
        abandoned: bool = False,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Report a measurement (``value`` of the first objective, or ``values`` of all), or that the
        trial was infeasible (with ``reason``), failed or abandoned."""
        flags = [
            s for s, f in (("INFEASIBLE", infeasible), ("FAILED", failed), ("ABANDONED", abandoned)) if f
        ]
        if len(flags) > 1:
            raise ValueError("give at most one of infeasible, failed, abandoned")
        body: dict[str, Any] = {"state": flags[0] if flags else "COMPLETED"}
        if value is not None:
            body["value"] = value
        if values is not None:
            body["values"] = values
        if reason is not None:
            body["reason"] = reason
        return self.request("POST", f"/v1/studies/{study}/trials/{int(trial)}:complete", body)

    def trials(self, study: str, state: str | None = None) -> list[dict[str, Any]]:
        return self._all(f"/v1/studies/{study}/trials", "trials", {"state": state} if state else None)

    def trial(self, study: str, trial: int) -> dict[str, Any]:
        return self.request("GET", f"/v1/studies/{study}/trials/{int(trial)}")

    def best(self, study: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/studies/{study}/best")

    def pareto(self, study: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/studies/{study}/pareto")["trials"]

    # ------------------------------------------------------------------ operations
    def evaluate(
        self,
        model: str,
        arch: str | dict = "tpuv4",
        wait: bool = True,
        timeout_s: float = 3600,
        **options: Any,
    ) -> dict[str, Any]:
        """Placement and throughput of ``model`` on ``arch`` (a preset name or the six architecture
        fields): the finished operation when ``wait``, else the operation to poll."""
        return self._operation("/v1/evaluations", {"model": model, "arch": arch, **options}, wait, timeout_s)

    def partition(
        self, model: str, wait: bool = True, timeout_s: float = 3600, **options: Any
    ) -> dict[str, Any]:
        return self._operation("/v1/partitions", {"model": model, **options}, wait, timeout_s)

    def pipeline(
        self, model: str, wait: bool = True, timeout_s: float = 3600, **options: Any
    ) -> dict[str, Any]:
        return self._operation("/v1/pipelines", {"model": model, **options}, wait, timeout_s)

    def shard(
        self, model: str, wait: bool = True, timeout_s: float = 3600, **options: Any
    ) -> dict[str, Any]:
        """Operator sharding (OPP) or, with ``data_parallel=True``, ADP (``archplace shard``)."""
        return self._operation("/v1/shardings", {"model": model, **options}, wait, timeout_s)

    def plan(
        self, model: str, gpus: int, global_batch: int, wait: bool = True, timeout_s: float = 3600,
        **options: Any,
    ) -> dict[str, Any]:
        """The fastest way to train ``model`` on ``gpus`` GPUs (``archplace plan``); ``options``: gpu or
        instance (one is required), gpus_per_node, network, seq, optimizer, grad_reduce_dtype, fixed,
        top_k, max_mbs, op_model, overlap."""
        body = {"model": model, "gpus": gpus, "global_batch": global_batch, **options}
        return self._operation("/v1/plans", body, wait, timeout_s)

    def operation(self, op_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/operations/{op_id}")

    def cancel(self, op_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/operations/{op_id}:cancel")

    def wait(self, op_id: str, timeout_s: float = 3600, poll_s: float = 0.2) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            op = self.operation(op_id)
            if op["done"]:
                return op
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"operation {op_id} not done after {timeout_s:.0f} s (state {op['state']})"
                )
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 2.0)

    def _operation(self, path: str, body: dict[str, Any], wait: bool, timeout_s: float) -> dict[str, Any]:
        op = self.request("POST", path, body)
        return self.wait(op["id"], timeout_s) if wait and not op["done"] else op

    def _all(self, path: str, key: str, params: dict | None = None) -> list[dict[str, Any]]:
        out, token = [], None
        while True:
            page = self.request(
                "GET",
                path,
                params={**(params or {}), "page_size": 1000, **({"page_token": token} if token else {})},
            )
            out += page[key]
            token = page.get("next_page_token")
            if not token:
                return out
