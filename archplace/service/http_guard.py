"""The first code of the service that a request meets in a replica: a pure ASGI middleware that turns
slow and hostile clients away before they can hold a request slot.

Why it is needed: Ray Serve's proxy streams a request to a replica as soon as its headers are in,
and the replica pulls the body from the proxy while the request holds one of the replica's
``max_ongoing_requests`` slots. The proxy's HTTP server (uvicorn with httptools, started by Serve)
has no body or read timeout and no limit on header size or count, and Serve's ``HTTPOptions`` exposes
none (only ``request_timeout_s`` for the whole request and the keep-alive timeout). So before this
guard, about 130 clients that sent headers and half a body filled a replica's 128 slots for as long as
they liked, unauthenticated, and every owner's request then timed out.

What it does, in this order, all from the headers and before a byte of the body is read:

1. **Header limits**: more than ``max_header_count`` headers, or more than ``max_header_bytes`` of
   them in all, is a 431.
2. **Authentication**: a request without a valid bearer token is a 401 at once (the health check and
   the OpenAPI pages excepted). So unauthenticated requests never wait on a body while holding a slot;
   each costs the replica a dictionary lookup, or one indexed read for an unknown ``ap_`` token on a
   small thread pool of its own, so that a flood of forged tokens cannot take the threads the routes
   run on.
3. **Per-address cap**: at most ``max_requests_per_ip`` requests of one client address in flight in
   this replica; above that a 503 with ``Retry-After`` (the client retries it), rather than a hang.
4. **Body deadline and size**: the body (at most ``body_bytes``) must arrive within
   ``body_timeout_s``, or the answer is a 408; the app then gets the buffered body.

Every refusal is the service's JSON error, and those sent before the body was read close the
connection, so the unread rest of a body is never parsed as another request.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .auth import MISS
from .schemas import LIMITS

SCOPE_OWNER = "archplace.owner"  # the authenticated owner, for the routes' ``Owner`` dependency
# paths anyone may read: the health check (load balancers, the restart wait) and the API description
PUBLIC_PATHS = frozenset({"/v1/health", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"})


@dataclass(frozen=True)
class HttpLimits:
    """Limits of the HTTP layer, per replica. ``max_requests_per_ip`` None: half of the replica's
    request slots (``deployment.build`` fills it in), so one address can never hold all of them."""

    max_header_count: int = 100
    max_header_bytes: int = 16_384  # names, values and their ": " and CRLF, as on the wire
    body_bytes: int = LIMITS["body_bytes"]
    body_timeout_s: float = 10.0
    max_requests_per_ip: int | None = 64
    retry_after_s: int = 2

    def __post_init__(self) -> None:
        for name in ("max_header_count", "max_header_bytes", "body_bytes", "retry_after_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        ip = self.max_requests_per_ip
        if ip is not None and (isinstance(ip, bool) or not isinstance(ip, int) or ip < 1):
            raise ValueError(f"max_requests_per_ip must be an integer >= 1, got {ip!r}")
        t = self.body_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            raise ValueError(f"body_timeout_s must be a finite number of seconds > 0, got {t!r}")


class Guard:
    """See the module docstring. ``tokens``: a ``TokenCache`` (None: ``--auth none``, every request is
    ``local_owner``); ``error(code, message, headers)``: the app's JSON error response."""

    def __init__(self, app, limits: HttpLimits, tokens, local_owner: str, error: Callable[..., Any]) -> None:
        self.app, self.limits, self.tokens = app, limits, tokens
        self.local_owner, self.error = local_owner, error
        self.in_flight: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="archplace-auth")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        lim = self.limits
        headers = scope.get("headers") or []
        has_body = any(k in (b"content-length", b"transfer-encoding") for k, _ in headers)
        close = {"Connection": "close"} if has_body else {}

        async def refuse(code: int, message: str, extra: dict[str, str] | None = None) -> None:
            await self.error(code, message, headers={**close, **(extra or {})})(scope, receive, send)

        if len(headers) > lim.max_header_count:
            return await refuse(431, f"{len(headers)} request headers, at most {lim.max_header_count}")
        size = sum(len(k) + len(v) + 4 for k, v in headers)
        if size > lim.max_header_bytes:
            return await refuse(431, f"request headers of {size} bytes, at most {lim.max_header_bytes}")

        if self.tokens is None:
            scope[SCOPE_OWNER] = self.local_owner
        elif scope.get("path", "") not in PUBLIC_PATHS:
            who = await self._owner(headers)
            if who is None:
                return await refuse(
                    401,
                    "a valid bearer token is required (Authorization: Bearer TOKEN; "
                    "create one with `archplace serve token create OWNER`)",
                    {"WWW-Authenticate": "Bearer"},
                )
            scope[SCOPE_OWNER] = who

        client = scope.get("client")
        ip = str(client[0]) if client else "unknown"
        cap = lim.max_requests_per_ip
        if cap is not None and self.in_flight.get(ip, 0) >= cap:
            return await refuse(
                503,
                f"more than {cap} requests from {ip} in flight on this replica; retry later",
                {"Retry-After": str(lim.retry_after_s)},
            )
        self.in_flight[ip] = self.in_flight.get(ip, 0) + 1
        try:
            body = await self._body(headers, receive, refuse)
            if body is None:
                return
            replayed = False

            async def replay():
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # after the body: the disconnect, when it comes

            await self.app(scope, replay, send)
        finally:
            n = self.in_flight[ip] - 1
            if n:
                self.in_flight[ip] = n
            else:
                del self.in_flight[ip]

    async def _owner(self, headers) -> str | None:
        raw = next((v for k, v in headers if k == b"authorization"), b"")
        scheme, _, token = raw.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return None
        token = token.strip()
        who = self.tokens.peek(token)
        if who is MISS:
            who = await asyncio.get_running_loop().run_in_executor(self._pool, self.tokens.owner, token)
        return who

    async def _body(self, headers, receive, refuse) -> bytes | None:
        """The whole body, or None once a refusal was sent (or the client left)."""
        lim = self.limits
        for k, v in headers:
            if k == b"content-length":
                if not v.isdigit():
                    await refuse(413, "Content-Length must be a number of bytes")
                    return None
                if int(v) > lim.body_bytes:
                    await refuse(413, f"request body over {lim.body_bytes} bytes")
                    return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lim.body_timeout_s
        chunks: list[bytes] = []
        seen, more = 0, True
        while more:
            try:
                msg = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                await refuse(
                    408,
                    f"request body not received within {lim.body_timeout_s:g} s "
                    f"({seen} bytes arrived); send it at once",
                )
                return None
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > lim.body_bytes:
                await refuse(413, f"request body over {lim.body_bytes} bytes")
                return None
            chunks.append(chunk)
            more = msg.get("more_body", False)
        return b"".join(chunks)
