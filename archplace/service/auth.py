"""Bearer tokens per owner.

A token is 32 random bytes (``secrets.token_urlsafe``) behind the prefix ``ap_``; the database keeps
only its SHA-256. A fast hash is the right one here: unlike a password, the token has 256 bits of
entropy, so nothing can be gained by guessing and a slow KDF would only slow every request. A
request's owner is the token's owner; every study and operation is scoped to it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

import sqlalchemy as sa

from .db import tokens, write_tx

OWNER_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
LOCAL_OWNER = "local"  # the owner of every request when the service runs with --auth none


class _Miss:
    def __repr__(self) -> str:
        return "MISS"


MISS = _Miss()  # TokenCache.peek: not cached (or stale), the database must be asked


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(engine: sa.Engine, owner: str) -> str:
    """A new token for ``owner`` (shown once; only its hash is stored)."""
    if not OWNER_RE.match(owner or ""):
        raise ValueError(
            f"owner must match {OWNER_RE.pattern} (lower-case letters, digits, '_' and '-', "
            f"starting with a letter, at most 64), got {owner!r}"
        )
    token = "ap_" + secrets.token_urlsafe(32)
    with write_tx(engine) as conn:
        conn.execute(
            sa.insert(tokens).values(
                owner=owner,
                token_sha256=token_hash(token),
                prefix=token[:10],
                created_at=time.time(),
                revoked=False,
            )
        )
    return token


def revoke_tokens(engine: sa.Engine, owner: str) -> int:
    with write_tx(engine) as conn:
        return conn.execute(
            sa.update(tokens).where(tokens.c.owner == owner, tokens.c.revoked.is_(False)).values(revoked=True)
        ).rowcount


def count_tokens(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).select_from(tokens).where(tokens.c.revoked.is_(False))
            ).scalar_one()
        )


class TokenCache:
    """Token hash -> owner, re-read from the database at most every ``ttl_s`` seconds per token, so
    a revoked token stops working within that time and a request costs no database read.

    Unknown tokens are cached apart from known ones, each side bounded: a flood of forged tokens
    clears only the negative side, never the owners' entries (it used to clear both)."""

    def __init__(self, engine: sa.Engine, ttl_s: float = 2.0, max_entries: int = 10_000) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._known: dict[str, tuple[str, float]] = {}
        self._unknown: dict[str, float] = {}

    @staticmethod
    def _plausible(token: str) -> bool:
        return token.startswith("ap_") and len(token) <= 128

    def peek(self, token: str):
        """The owner (or None for a bad token) if that is known without the database, else
        ``MISS``. Never blocks, so the HTTP guard calls it on the event loop."""
        if not self._plausible(token):
            return None
        h = token_hash(token)
        now = time.monotonic()
        hit = self._known.get(h)
        if hit is not None and now - hit[1] < self.ttl_s:
            return hit[0]
        seen = self._unknown.get(h)
        if seen is not None and now - seen < self.ttl_s:
            return None
        return MISS

    def owner(self, token: str) -> str | None:
        cached = self.peek(token)
        if cached is not MISS:
            return cached
        h = token_hash(token)
        now = time.monotonic()
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(tokens.c.owner).where(tokens.c.token_sha256 == h, tokens.c.revoked.is_(False))
            ).first()
        if row is None:
            if len(self._unknown) >= self.max_entries:
                self._unknown.clear()
            self._unknown[h] = now
            self._known.pop(h, None)  # revoked since it was cached
            return None
        if len(self._known) >= self.max_entries:
            self._known.clear()
        self._known[h] = (row[0], now)
        self._unknown.pop(h, None)
        return row[0]
