"""HTTP/1.1 over a bare socket, for clients that no HTTP library plays: one that sends its headers
and only part of the body and then waits, or headers no library would send."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawResponse:
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


def open_request(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes = b"",
    content_length: int | None = None,
    timeout_s: float = 30.0,
) -> socket.socket:
    """Connect to 127.0.0.1:``port`` and send the request line, the headers and ``body``, which may
    be shorter than ``content_length`` (a slow client then leaves the rest unsent)."""
    items = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    items = [("Host", f"127.0.0.1:{port}"), *items]
    if content_length is not None or body:
        items.append(("Content-Length", str(len(body) if content_length is None else content_length)))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in items) + "\r\n"
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    s.sendall(head.encode("latin-1") + body)
    return s


def read_response(s: socket.socket, timeout_s: float) -> RawResponse:
    """The response on ``s`` (status, headers, body by Content-Length or until close); raises
    ``TimeoutError`` (socket.timeout) if none came within ``timeout_s``."""
    s.settimeout(timeout_s)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed without a response (got {buf[:200]!r})")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        rest = rest[:n]
    return RawResponse(status, headers, rest)


def request(port: int, method: str, path: str, timeout_s: float = 30.0, **kw) -> RawResponse:
    s = open_request(port, method, path, timeout_s=timeout_s, **kw)
    try:
        return read_response(s, timeout_s)
    finally:
        s.close()
