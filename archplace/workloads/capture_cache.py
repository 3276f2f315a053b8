"""An on-disk cache of captured operator graphs, shared by every process of one user.

Why: capturing a model (``torch.export`` on the meta device, op mapping, block expansion) costs
seconds per model and per process (bert-base ~2.5 s cold, most of it ``torch.export`` warming up),
and the in-process ``lru_cache`` of the graph builders dies with the process. The CLI, every Ray
worker and every ``archplace`` subprocess recaptured the same models. With this cache the first
process captures and the others read a file (milliseconds).

Where: ``$ARCHPLACE_CACHE_DIR/graphs`` (default ``~/.cache/archplace/graphs``, beside ZigZag's
``zigzag`` cache). ``ARCHPLACE_CACHE_DIR=""`` turns the cache off (the CLI's ``--no-cache`` sets it),
and then every graph is captured again, as before.

Staleness: the file name is a hash of the model's identity (what the builder was asked for: preset
name or config-file fingerprint, sizes, capture options), the **code version** (a hash of every source
file of ``archplace.workloads``, where capture, op mapping and expansion live: any edit there changes
it), the versions of Python, numpy, torch and transformers, and :data:`FORMAT_VERSION`. A stale entry
therefore has a different name and is never read; old entries are left behind (delete the folder to
reclaim the space, a few hundred kB per graph).

Safety: an entry is written to a temporary file in the same folder and renamed over the final name
(``os.replace`` is atomic on POSIX), so concurrent writers (pytest-xdist workers, Ray workers) never
leave a half-written entry, and a reader sees either no file or a whole one. Each file carries a
digest of its payload and the key it was written for; an entry whose digest or key does not match
(a truncated or corrupt file) is ignored with a warning, captured again and rewritten. The payload is
a pickle: it is the only format that gives back the very same graph (dtypes, the tuples in ``meta``);
the folder is created owner-only, like any per-user cache, and the digest is checked before unpickling.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import sys
import tempfile
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from .graph import OpGraph

__all__ = ["ENV_CACHE_DIR", "FORMAT_VERSION", "cache_dir", "code_version", "entry_key", "cached_graph",
           "load", "store"]

ENV_CACHE_DIR = "ARCHPLACE_CACHE_DIR"
FORMAT_VERSION = 1  # bump when the file layout below changes
_MAGIC = b"archplace-graph\n"
_DIGEST_BYTES = 32
_PACKAGE_DIR = Path(__file__).resolve().parent
_code_version: str | None = None
_status = logging.getLogger("archplace.status")   # phases (the CLI prints them: cli/status.py)


class CacheWarning(RuntimeWarning):
    """A cache entry could not be read or written; the graph was captured instead."""


def cache_dir() -> Path | None:
    """The graph cache folder: ``$ARCHPLACE_CACHE_DIR/graphs``, ``~/.cache/archplace/graphs`` when the
    variable is unset, ``None`` (no cache) when it is set to the empty string."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env is None:
        try:
            return Path.home() / ".cache" / "archplace" / "graphs"
        except RuntimeError as e:  # no HOME and no passwd entry: say so, and capture every time
            warnings.warn(f"graph cache: off ({e}); set {ENV_CACHE_DIR}", CacheWarning, stacklevel=2)
            return None
    return Path(env).expanduser() / "graphs" if env.strip() else None


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def code_version() -> str:
    """Hash of every ``.py`` file of ``archplace.workloads`` (relative path and bytes, in path order)
    and of the library versions a capture depends on. Computed once per process (~1 ms)."""
    global _code_version
    if _code_version is None:
        h = hashlib.blake2b(digest_size=16)
        for path in sorted(_PACKAGE_DIR.rglob("*.py")):
            h.update(str(path.relative_to(_PACKAGE_DIR)).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        libs = {"python": sys.version.split()[0], "numpy": _version("numpy"), "torch": _version("torch"),
                "transformers": _version("transformers"), "format": FORMAT_VERSION}
        h.update(json.dumps(libs, sort_keys=True).encode())
        _code_version = h.hexdigest()
    return _code_version


def entry_key(kind: str, identity: dict[str, Any]) -> str:
    """The file name stem of a graph: ``kind`` (which builder) and ``identity`` (its arguments, JSON
    values) hashed together with :func:`code_version`."""
    text = json.dumps({"kind": kind, "identity": identity, "code": code_version()}, sort_keys=True)
    return f"{kind}-{hashlib.blake2b(text.encode(), digest_size=16).hexdigest()}"


def _path(folder: Path, key: str) -> Path:
    return folder / f"{key}.pkl"


def load(key: str, folder: Path | None = None) -> OpGraph | None:
    """The graph stored under ``key``, or ``None`` when there is none or the cache is off. A corrupt
    entry (bad magic, digest or key, or a payload that does not unpickle to a valid graph) warns
    (:class:`CacheWarning`) and reads as missing, so the caller captures and rewrites it."""
    folder = cache_dir() if folder is None else folder
    if folder is None:
        return None
    path = _path(folder, key)
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        warnings.warn(f"graph cache: cannot read {path} ({e}); capturing instead", CacheWarning,
                      stacklevel=2)
        return None
    try:
        head = len(_MAGIC)
        if raw[:head] != _MAGIC:
            raise ValueError("not a graph cache file")
        digest, body = raw[head:head + _DIGEST_BYTES], raw[head + _DIGEST_BYTES:]
        if hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest() != digest:
            raise ValueError("digest mismatch (truncated or corrupt)")
        stored_key, graph = pickle.loads(body)
        if stored_key != key or not isinstance(graph, OpGraph):
            raise ValueError("written for another key")
        graph.validate()
    except Exception as e:  # noqa: BLE001 - any unreadable entry is a miss, said once, then rewritten
        warnings.warn(f"graph cache: ignoring corrupt entry {path} ({type(e).__name__}: {e}); "
                      "capturing again", CacheWarning, stacklevel=2)
        return None
    return graph


def store(key: str, graph: OpGraph, folder: Path | None = None) -> Path | None:
    """Write ``graph`` under ``key`` atomically (a temporary file renamed over the entry). Returns the
    entry's path, or ``None`` when the cache is off or the folder is not writable (which warns: the
    graph is still returned to the caller, only not kept)."""
    folder = cache_dir() if folder is None else folder
    if folder is None:
        return None
    body = pickle.dumps((key, graph), protocol=pickle.HIGHEST_PROTOCOL)
    data = _MAGIC + hashlib.blake2b(body, digest_size=_DIGEST_BYTES).digest() + body
    path = _path(folder, key)
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        warnings.warn(f"graph cache: cannot write {path} ({e}); the graph is not kept", CacheWarning,
                      stacklevel=2)
        return None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


def cached_graph(kind: str, identity: dict[str, Any], build: Callable[[], OpGraph]) -> OpGraph:
    """``build()``'s graph, read from the cache when an entry for (``kind``, ``identity``, code
    version) exists, else built and stored. Errors of ``build`` propagate and nothing is stored."""
    folder = cache_dir()
    what = _label(identity)
    if folder is None:
        _status.info(f"capturing the graph of {what} (the graph cache is off)")
        return build()
    key = entry_key(kind, identity)
    graph = load(key, folder)
    if graph is None:
        _status.info(f"capturing the graph of {what} (first time: not in the graph cache yet)")
        graph = build()
        store(key, graph, folder)
    else:
        _status.info(f"read the cached graph of {what}")
    return graph


def _label(identity: dict[str, Any]) -> str:
    """The model's name for people: the preset, or the file name of an ``hf:`` reference."""
    name = str(identity.get("name", "the model"))
    return Path(name[3:].split("?", 1)[0]).name if name.startswith("hf:") else name
