"""The result store of a search directory: an append-only record of every finished trial, built so
that recording one trial costs the same whether it is the 10th or the 10,000th.

Layout under the search's ``--out`` directory::

    search.json                  the settings, so ``--resume`` can check them
    evaluations.wal.jsonl        write-ahead log: the rows ``add()`` accepted that are in no part yet
    evaluations/part-NNNNNN.parquet
                                 one Parquet file per flushed batch of rows (``SCHEMA``)
    evaluations.parquet          the compacted table (one row per architecture × model), by ``compact()``
    best.json                    the search's current choice of architectures

Why. The previous store rewrote both files from every row after each trial (O(N²) over a search). Here

* ``add()`` appends the trial's rows to the write-ahead log (one JSON line per row, the file object
  flushed to the OS but not fsynced) and keeps them pending in memory. Once ``flush_rows`` rows are
  pending, or ``flush_interval_s`` has passed since the last flush, the pending rows go into one new
  part file (written to a dot-prefixed temporary name, then renamed) and the log is truncated: O(1)
  amortised per trial (and compactions, below).
* A SIGKILLed driver loses nothing ``add()`` accepted: its rows are in the log before ``add()``
  returns. ``load()`` reads the compacted table, then the parts in number order, then replays the
  log. A crash between writing a part and truncating the log leaves the same rows in both; log rows
  already present (same ``arch_key``, ``model``, ``trial_id``, ``finished_at``) are skipped, so
  nothing is duplicated. A torn last line (a write cut off by the kill) is ignored: each log line
  names its ``add()`` and how many rows it had, and only complete ``add()`` calls are replayed.
  ``load()`` only reads: another process may load a directory while its (one) driver writes.
* Re-evaluating an architecture replaces its whole row set: a later ``add()`` of the same key (the
  ``arch_key``; with the phase for a screen's phase 2) supersedes the earlier one in memory, in the
  pending batch (a part holds one row set per key) and on ``load()`` (a later file's wins).
* ``finished()`` and ``best()`` come from state kept up to date by ``add()``: the per-architecture
  summaries, the failed / infeasible counts, the best architecture (across-model average) and the
  best row per model (O(models) per call); ``write_best()`` writes ``best.json`` at most every
  ``best_interval_s`` seconds (``force=True`` always writes).
* ``compact()`` writes ``evaluations.parquet`` (the latest row per (arch_key, model), sorted by
  (order, model): the file users and ``archplace.platform.report`` read) from the rows in memory, and
  removes the parts and the log: at a search's end, on resume, and once ``max(compact_parts, rows
  in evaluations.parquet // 256)`` parts are on disk (each rewrite paid for by the parts since the
  last: O(1) per part; 10,000 uncompacted parts had cost 159 MB and a 21 s load on resume, issue 29).
Files are replaced atomically (temporary file, then rename). Plain pyarrow, no Ray."""

from __future__ import annotations

import json
import math
import os
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([
    ("order", pa.int64()), ("trial_id", pa.string()), ("searcher", pa.string()),
    ("arch_key", pa.string()), ("arch_label", pa.string()), ("space_index", pa.int64()),
    ("num_tc", pa.int64()), ("num_vc", pa.int64()), ("pe_x", pa.int64()), ("pe_y", pa.int64()),
    ("pe_vc", pa.int64()), ("glb_mb", pa.float64()), ("area_mm2", pa.float64()), ("is_reference", pa.bool_()),
    ("model", pa.string()), ("status", pa.string()), ("error", pa.string()),
    ("throughput", pa.float64()), ("time_per_batch_s", pa.float64()),
    ("p", pa.int64()), ("d", pa.int64()), ("t", pa.int64()), ("microbatch", pa.int64()),
    ("num_stages", pa.int64()), ("hbm_gb", pa.float64()), ("recompute", pa.bool_()),
    ("stages_json", pa.string()), ("expert_throughput", pa.float64()), ("expert_pdt", pa.string()),
    ("estimate_s", pa.float64()), ("ilp_s", pa.float64()), ("dp_s", pa.float64()), ("total_s", pa.float64()),
    # layer slices: looked up (every layer), distinct in this architecture, solved now, answered by the
    # schedule cache (cross-trial); lookups - distinct is the de-duplication of repeated layers
    ("schedule", pa.string()), ("ilp_lookups", pa.int64()), ("ilp_unique", pa.int64()),
    ("ilp_solved", pa.int64()), ("cache_hits", pa.int64()),
    ("node_id", pa.string()), ("hostname", pa.string()), ("pid", pa.int64()), ("finished_at", pa.float64()),
    # where the evaluation's work ran (its DP or sequential tasks; comma-separated Ray node ids): the
    # trial itself only coordinates, reserves no CPU and may sit on any node, often the head
    ("task_nodes", pa.string()),
    # the layer-slice ILPs' answers (ILP schedule only; empty / NaN for sequential rows and for files
    # written before these columns, which load with these defaults): distinct slices per solver status
    # (JSON object), the worst proven relative gap (NaN: none known), slices not proven optimal that have
    # no bound, and per slice its pass, layers, status, gap, solver, stop reason, deterministic time,
    # microbatch and TMP width (JSON list); distinct slices per stop reason (JSON object: which limit
    # ended each solve) and how many of them the wall-clock safety limit or a solver failure stopped
    ("ilp_status", pa.string()), ("ilp_worst_gap", pa.float64()), ("ilp_gap_unknown", pa.int64()),
    ("ilp_slices_json", pa.string()), ("ilp_stopped_by", pa.string()), ("ilp_load_dependent", pa.int64()),
    ("phase", pa.int64()),   # 0 one-phase search; screen.py: 1 sequential screen, 2 ILP + DP of the top-k
])
_DEFAULTS = {pa.int64(): 0, pa.float64(): math.nan, pa.string(): "", pa.bool_(): False}
FINISHED = ("ok", "infeasible", "failed")
PLACEMENT_FIELDS = ("throughput", "time_per_batch_s", "p", "d", "t", "microbatch", "recompute", "hbm_gb",
                    "num_stages")

_COLUMN_DEFAULTS = {f.name: _DEFAULTS[f.type] for f in SCHEMA}
_PART_RE = re.compile(r"^part-(\d+)\.parquet$")
_WAL_ADD, _WAL_N = "_add", "_n"  # the keys a log line adds to its row: its add() and that add()'s row count


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    tmp.replace(path)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def _wal_default(v: Any) -> Any:
    """json.dumps fallback for numpy scalars in a log line (NaN stays NaN: the log allows it)."""
    for kind, cast in ((np.integer, int), (np.floating, float), (np.bool_, bool)):
        if isinstance(v, kind):
            return cast(v)
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def ilp_answer(r: dict[str, Any]) -> dict[str, Any]:
    """A row's layer-ILP answer for best.json: ``ilp_status`` (distinct slices per solver status; {} for
    sequential rows and old files), ``ilp_worst_gap`` (None: unknown), ``ilp_gap_unknown``,
    ``ilp_stopped_by`` (distinct slices per stop reason; {} for sequential rows and old files) and
    ``ilp_load_dependent`` (slices the wall-clock safety limit or a solver failure stopped)."""
    text = r.get("ilp_status") or ""
    stops = r.get("ilp_stopped_by") or ""
    return {"ilp_status": json.loads(text) if text else {},
            "ilp_worst_gap": _jsonable(r.get("ilp_worst_gap", math.nan)),
            "ilp_gap_unknown": int(r.get("ilp_gap_unknown") or 0),
            "ilp_stopped_by": json.loads(stops) if stops else {},
            "ilp_load_dependent": int(r.get("ilp_load_dependent") or 0)}


def ilp_overall(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the rows of a search: distinct slices per solver status and per stop reason (summed over
    architecture × model), the worst proven gap and where it is, how many slices have no bound and how
    many the wall-clock safety limit or a solver failure stopped. O(rows): call it once."""
    counts: dict[str, int] = {}
    stops: dict[str, int] = {}
    worst, where, unknown, load = None, None, 0, 0
    for r in rows:
        a = ilp_answer(r)
        for k, v in a["ilp_status"].items():
            counts[k] = counts.get(k, 0) + int(v)
        for k, v in a["ilp_stopped_by"].items():
            stops[k] = stops.get(k, 0) + int(v)
        unknown += a["ilp_gap_unknown"]
        load += a["ilp_load_dependent"]
        g = a["ilp_worst_gap"]
        if g is not None and (worst is None or g > worst):
            worst, where = g, {"arch_label": r["arch_label"], "model": r["model"]}
    return {"status_counts": counts, "stopped_by": stops, "load_dependent": load, "worst_gap": worst,
            "worst_gap_at": where, "gap_unknown": unknown}


def _read_parquet(path: Path) -> pa.Table:
    """A damaged file is a one-line error naming it (was pyarrow's message alone, issue 29)."""
    try:
        return pq.ParquetFile(path).read(use_threads=False)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{path} is damaged (not a readable Parquet file: {first}); move it out of "
                         f"{path.parent}, and --resume evaluates the architectures it held again") from None


def _identity(r: dict[str, Any]) -> tuple:
    """What makes a row the same evaluation: (arch_key, model, trial_id, finished_at)."""
    t = r.get("finished_at")
    if isinstance(t, float) and math.isnan(t):
        t = None
    return r["arch_key"], r["model"], r.get("trial_id"), t


def _by_model(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model, the last one given winning."""
    if len(rows) < 2:
        return list(rows)
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        out[r["model"]] = r
    return list(out.values())


def _key(r: dict[str, Any]) -> str:   # + the phase for a screen's phase 2: both phases' rows stay
    return r["arch_key"] if (r.get("phase") or 0) < 2 else f"{r['arch_key']}@{r['phase']}"


def _common_ok(e: dict[str, Any]) -> bool:   # a screen's phase-1 rows rank candidates and are never best
    return not e["failed"] and e["value"] > 0 and e["rows"][0].get("phase") != 1


def _common_key(e: dict[str, Any]) -> tuple:
    return e["value"], -e["space_index"]


def _model_ok(r: dict[str, Any] | None) -> bool:
    # an "ok" row with a NaN throughput is never a best row (NaN would make the maximum order-dependent)
    return (r is not None and r["status"] == "ok" and r["throughput"] == r["throughput"]
            and r.get("phase") != 1)


def _model_key(r: dict[str, Any]) -> tuple:
    return r["throughput"], -r["space_index"]


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """An architecture's entry in ``finished()``."""
    failed = any(r["status"] == "failed" for r in rows)
    return {"space_index": int(rows[0]["space_index"]), "rows": rows, "failed": failed,
            "value": 0.0 if failed else float(np.mean([r["throughput"] for r in rows]))}


def _infeasible(e: dict[str, Any]) -> bool:
    return all(r["status"] == "infeasible" for r in e["rows"])


class ResultStore:
    """The rows of one search directory: kept in memory, logged on every ``add()``, flushed to part
    files in batches and compacted into ``evaluations.parquet`` by ``compact()`` / ``close()``."""

    schema, column_defaults = SCHEMA, _COLUMN_DEFAULTS  # a co-design target's store has its own

    def __init__(self, out_dir: str | Path, *, flush_rows: int = 512, flush_interval_s: float = 10.0,
                 best_interval_s: float = 2.0, compact_parts: int = 64) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be >= 1, got {flush_rows}")
        if compact_parts < 1:
            raise ValueError(f"compact_parts must be >= 1, got {compact_parts}")
        self.compact_parts = int(compact_parts)
        self._num_parts: int | None = None  # parts on disk, counted on the first flush
        self._compacted_rows = 0  # rows in evaluations.parquet
        self.dir = Path(out_dir)
        self.flush_rows = int(flush_rows)
        self.flush_interval_s = float(flush_interval_s)
        self.best_interval_s = float(best_interval_s)
        self._token = uuid.uuid4().hex[:12]  # names this instance's add() calls in the log
        self._adds = 0
        self._wal = None  # the log, opened for appending on the first add()
        self._next_part: int | None = None  # found by listing evaluations/ on the first flush
        self._last_flush = time.monotonic()
        self._last_best: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._order: dict[str, int] = {}
        self._next_order = 0
        # arch_key -> {"space_index", "rows", "failed", "value"}; iteration order: by the latest add()
        self._fin: dict[str, dict[str, Any]] = {}
        self._num_rows = 0
        self._num_failed = 0
        self._num_infeasible = 0
        self._best_arch: str | None = None  # the best architecture across models (see best())
        self._best_model: dict[Any, str] = {}  # model -> the arch_key of its best row
        self._ref: dict[str, int] = {}  # arch_keys with a reference row -> position of their latest add()
        self._seq = 0
        self._pending: dict[str, list[dict[str, Any]]] = {}  # arch_key -> rows in no part yet
        self._pending_rows = 0
        self._wal_stale = False  # the log on disk holds more than the pending rows (set by load())

    # ------------------------------------------------------------------ paths
    @property
    def parquet_path(self) -> Path:
        return self.dir / "evaluations.parquet"

    @property
    def settings_path(self) -> Path:
        return self.dir / "search.json"

    @property
    def dataset_dir(self) -> Path:
        return self.dir / "evaluations"

    @property
    def wal_path(self) -> Path:
        return self.dir / "evaluations.wal.jsonl"

    def _parts(self) -> list[tuple[int, Path]]:
        if not self.dataset_dir.is_dir():
            return []
        out = []
        for p in self.dataset_dir.iterdir():
            m = _PART_RE.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
        return sorted(out)

    # ------------------------------------------------------------------ settings
    def holds_search(self) -> bool:
        return (self.parquet_path.exists() or self.settings_path.exists() or self.dataset_dir.exists()
                or self.wal_path.exists())

    def read_meta(self) -> dict[str, Any]:
        """search.json; a damaged one is a one-line error naming it (was the parser's alone, issue 29)."""
        try:
            meta = json.loads(self.settings_path.read_text())
            why = "" if isinstance(meta, dict) else f"a JSON {type(meta).__name__}, not an object"
        except (ValueError, UnicodeDecodeError) as e:
            why = f"not valid JSON: {e}"
        if why:
            raise ValueError(f"{self.settings_path} is damaged ({why}); remove it and --resume with the "
                             "search's original options (its rows are kept)")
        return meta

    def write_meta(self, meta: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.settings_path, lambda p: p.write_text(json.dumps(meta, indent=2)))

    # ------------------------------------------------------------------ reading
    @property
    def num_rows(self) -> int:
        """The current rows (one per architecture × model)."""
        return self._num_rows

    def __len__(self) -> int:
        return self._num_rows

    @property
    def rows(self) -> list[dict[str, Any]]:
        """All current rows, sorted by (order, model). Builds a list: O(N), not for every trial."""
        rows = [r for e in self._fin.values() for r in e["rows"]]
        return sorted(rows, key=lambda r: (r["order"], r["model"]))

    def table(self) -> pa.Table:
        """All current rows (one per architecture × model), sorted by (order, model)."""
        return pa.Table.from_pylist(self.rows, schema=self.schema)

    def finished(self) -> dict[str, dict[str, Any]]:
        """arch_key -> {"space_index", "rows", "failed", "value" (average throughput, 0 for failed)}.

        The store's own, kept up to date by ``add()`` (no rebuild per call): read it, do not change it."""
        return self._fin

    # ------------------------------------------------------------------ load (resume)
    def load(self) -> None:
        """Read everything a previous run left (``--resume``): the compacted table, then the parts in
        number order, then the write-ahead log. Log rows that are in no part become pending again.

        load() only reads. A second process may load a directory a live driver is writing (it may
        miss the rows of a flush happening at that moment, never see a row twice); the log's repair
        (dropping a torn last line and the rows already in a part) waits for this store's first write.
        A part removed by a concurrent compaction makes it read again."""
        self._close_wal()
        for attempt in range(5):
            try:
                self._load()
                return
            except FileNotFoundError:
                if attempt == 4:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def _load(self) -> None:
        self._reset()
        state: dict[str, list[dict[str, Any]]] = {}

        def take(rows: list[dict[str, Any]]) -> None:
            """One file's rows: each architecture's row set replaces the one read before."""
            groups: dict[str, list[dict[str, Any]]] = {}
            for r in rows:
                full = {name: r.get(name, d) for name, d in self.column_defaults.items()}
                groups.setdefault(_key(full), []).append(full)
            for key, rs in groups.items():
                self._order.setdefault(key, int(rs[0]["order"]))
                state[key] = _by_model(rs)

        if self.parquet_path.exists():
            compacted = _read_parquet(self.parquet_path).to_pylist()
            self._compacted_rows = len(compacted)
            take(compacted)
        parts = self._parts()
        # a search with slow trials leaves about one part per trial (flush_interval_s) until the next
        # compaction: read them in threads (pyarrow releases the GIL), applied in number order
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            for table in pool.map(_read_parquet, [p for _, p in parts]):
                take(table.to_pylist())
        self._next_part = parts[-1][0] + 1 if parts else 0
        self._num_parts = len(parts)

        # the log: complete add() calls only; the latest one of each architecture decides
        latest: dict[str, list[dict[str, Any]]] = {}
        for rows in self._read_wal():
            key = _key(rows[0])
            self._order.setdefault(key, int(rows[0]["order"]))
            latest.pop(key, None)
            latest[key] = _by_model(rows)
        for key, rows in latest.items():
            old = state.get(key)
            if old is not None and {_identity(r) for r in old} == {_identity(r) for r in rows}:
                continue  # already in a part (killed between writing the part and truncating the log)
            state[key] = rows
            self._pending[key] = rows
            self._pending_rows += len(rows)
        self._wal_stale = self.wal_path.exists()  # rewritten to the pending rows before the next append

        self._next_order = max(self._order.values(), default=-1) + 1
        for key in sorted(state, key=lambda k: self._order[k]):
            rows = sorted(state[key], key=lambda r: r["model"])
            for r in rows:
                r["order"] = self._order[key]
            self._fin[key] = _summary(rows)
            self._seq += 1
            if any(r["is_reference"] for r in rows):
                self._ref[key] = self._seq
        self._num_rows = sum(len(e["rows"]) for e in self._fin.values())
        self._num_failed = sum(e["failed"] for e in self._fin.values())
        self._num_infeasible = sum(_infeasible(e) for e in self._fin.values())
        self._recompute_common()
        for m in {r["model"] for e in self._fin.values() for r in e["rows"]}:
            self._recompute_model(m)
        self._last_flush = time.monotonic()

    def _read_wal(self) -> list[list[dict[str, Any]]]:
        """The log's complete add() calls, in order, as lists of rows."""
        if not self.wal_path.exists():
            return []
        calls: dict[str, list[dict[str, Any]]] = {}
        sizes: dict[str, int] = {}
        with open(self.wal_path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line torn by a kill
                if not isinstance(r, dict) or "arch_key" not in r or "model" not in r:
                    continue
                tag = str(r.pop(_WAL_ADD, f"line-{i}"))
                sizes[tag] = int(r.pop(_WAL_N, 1))
                row = {name: r.get(name, d) for name, d in self.column_defaults.items()}
                calls.setdefault(tag, []).append(row)
        return [rows for tag, rows in calls.items() if len(rows) == sizes[tag]]

    def _rewrite_wal(self) -> None:
        """The log as the pending rows alone (or no log when none is pending)."""
        if not self._pending:
            self.wal_path.unlink(missing_ok=True)
            return
        text = "".join(self._wal_lines(rows) for rows in self._pending.values())
        _atomic_write(self.wal_path, lambda p: p.write_text(text, encoding="utf-8"))

    def _wal_lines(self, rows: list[dict[str, Any]]) -> str:
        self._adds += 1
        extra = {_WAL_ADD: f"{self._token}-{self._adds}", _WAL_N: len(rows)}
        return "".join(json.dumps({**r, **extra}, allow_nan=True, default=_wal_default) + "\n" for r in rows)

    def _open_wal(self):
        if self._wal is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            if self._wal_stale:
                self._rewrite_wal()
                self._wal_stale = False
            # a log torn by a kill (and not rewritten by load()) must not glue its last line to ours
            if self.wal_path.exists() and self.wal_path.stat().st_size:
                with open(self.wal_path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    torn = f.read(1) != b"\n"
                if torn:
                    with open(self.wal_path, "a", encoding="utf-8") as f:
                        f.write("\n")
            self._wal = open(self.wal_path, "a", encoding="utf-8")  # kept open across add() calls
        return self._wal

    def _close_wal(self) -> None:
        if self._wal is not None:
            self._wal.close()
            self._wal = None

    # ------------------------------------------------------------------ writing
    def add(self, rows: list[dict[str, Any]], searcher: str = "") -> int:
        """Record one architecture's rows, replacing its earlier rows; returns its ``order`` (the
        first-seen position of its ``arch_key``). O(1) amortised: a log line per row, a part file
        every ``flush_rows`` rows or ``flush_interval_s`` seconds."""
        if not rows:
            return -1
        key = _key(rows[0])
        order = self._order.get(key)
        if order is None:
            order = self._order[key] = self._next_order
            self._next_order += 1
        full_rows = []
        for r in rows:
            full = {name: r.get(name, d) for name, d in self.column_defaults.items()}
            full["order"], full["searcher"] = order, r.get("searcher", searcher)
            full_rows.append(full)
        full_rows = _by_model(full_rows)

        # the log first: once add() returns, a kill loses nothing
        wal = self._open_wal()
        wal.write(self._wal_lines(full_rows))
        wal.flush()

        old = self._fin.pop(key, None)  # popped so the architecture moves last, as its latest add()
        new = self._fin[key] = _summary(full_rows)
        self._seq += 1
        if old is not None:
            self._num_rows -= len(old["rows"])
            self._num_failed -= old["failed"]
            self._num_infeasible -= _infeasible(old)
        self._num_rows += len(new["rows"])
        self._num_failed += new["failed"]
        self._num_infeasible += _infeasible(new)
        if any(r["is_reference"] for r in full_rows):
            self._ref[key] = self._seq
        else:
            self._ref.pop(key, None)
        self._update_best(key, old, new)

        superseded = self._pending.pop(key, None)  # a part holds at most one row set per architecture
        if superseded is not None:
            self._pending_rows -= len(superseded)
        self._pending[key] = full_rows
        self._pending_rows += len(full_rows)
        if (self._pending_rows >= self.flush_rows
                or time.monotonic() - self._last_flush >= self.flush_interval_s):
            self.flush()
        return order

    def flush(self) -> None:
        """The pending rows into one new part file, then the log truncated (a no-op when none is
        pending); a compaction once ``compact_parts`` parts are on disk."""
        self._flush()
        if (self._num_parts or 0) >= max(self.compact_parts, self._compacted_rows // 256):
            self.compact()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._pending:
            if self._wal_stale and self._wal is None:  # a loaded log whose rows were all in parts
                self._rewrite_wal()
                self._wal_stale = False
            return
        table = pa.Table.from_pylist([r for rs in self._pending.values() for r in rs], schema=self.schema)
        self.dataset_dir.mkdir(parents=True, exist_ok=True)
        if self._next_part is None:
            parts = self._parts()
            self._next_part = parts[-1][0] + 1 if parts else 0
            self._num_parts = len(parts)
        path = self.dataset_dir / f"part-{self._next_part:06d}.parquet"
        _atomic_write(path, lambda p: pq.write_table(table, p))  # temp name ".part-…tmp": no reader sees it
        self._next_part += 1
        self._num_parts = (self._num_parts or 0) + 1
        # a kill here leaves the rows in the part and in the log; load() skips the log's copies
        if self._wal is not None:
            self._wal.seek(0)
            self._wal.truncate()
        elif self.wal_path.exists():
            self.wal_path.write_bytes(b"")
        self._wal_stale = False
        self._pending.clear()
        self._pending_rows = 0

    def parts_on_disk(self) -> int:  # part files in evaluations/ (a listing: a resume's start, not per trial)
        return len(self._parts())

    def discard_if_empty(self) -> None:
        """Remove search.json, best.json, an empty table and the log when no row was ever stored: they
        made the corrected command fail with "already holds a search" (issue 29). The cache stays."""
        if (self._num_rows or self._pending or self.parts_on_disk() or self._read_wal()
                or (self.parquet_path.exists() and pq.ParquetFile(self.parquet_path).metadata.num_rows)):
            return
        self._close_wal()
        for p in (self.settings_path, self.dir / "best.json", self.parquet_path, self.wal_path):
            p.unlink(missing_ok=True)
        if self.dataset_dir.is_dir() and not any(self.dataset_dir.iterdir()):
            self.dataset_dir.rmdir()

    def compact(self) -> None:
        """Flush, write ``evaluations.parquet`` (the current rows, sorted by (order, model)), then
        remove the parts — oldest first, so a kill part-way leaves only parts newer than any removed
        one, which ``load()`` re-applies harmlessly over the compacted table — and the log."""
        self._flush()
        self.dir.mkdir(parents=True, exist_ok=True)
        table = self.table()
        _atomic_write(self.parquet_path, lambda p: pq.write_table(table, p))
        for _, p in self._parts():
            p.unlink()
        if self.dataset_dir.is_dir():
            for p in self.dataset_dir.glob(".part-*.tmp"):
                p.unlink(missing_ok=True)
            try:
                self.dataset_dir.rmdir()
            except OSError:  # something else lives there; leave it
                pass
        self._close_wal()
        self.wal_path.unlink(missing_ok=True)
        self._wal_stale = False
        self._next_part = 0
        self._num_parts, self._compacted_rows = 0, table.num_rows

    def close(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The end of a search: flush, write ``best.json``, compact; returns ``best(meta)``."""
        self._flush()
        best = self.write_best(meta, force=True)
        self.compact()
        return best

    # ------------------------------------------------------------------ best, kept incrementally
    def _update_best(self, key: str, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        """Bring the best architecture (across models) and the best row per model up to date after
        ``key``'s rows changed from ``old`` to ``new``. ``key`` is now last in ``self._fin``, so on a
        tie it loses to the incumbent, as in a max() over ``self._fin``. When the incumbent itself got
        worse (a best architecture re-evaluated with worse or failed rows), the maximum is recomputed
        over all architectures: O(N), but rare (re-evaluations are retries of failed trials)."""
        cur = self._best_arch
        if cur == key:
            if not (_common_ok(new) and _common_key(new) > _common_key(old)):
                self._recompute_common()
        elif _common_ok(new) and (cur is None or _common_key(new) > _common_key(self._fin[cur])):
            self._best_arch = key

        new_rows = {r["model"]: r for r in new["rows"]}
        old_rows = {r["model"]: r for r in old["rows"]} if old is not None else {}
        for m in new_rows.keys() | old_rows.keys():
            r = new_rows.get(m)
            r = r if _model_ok(r) else None
            cur = self._best_model.get(m)
            if cur == key:
                if r is None or not _model_key(r) > _model_key(old_rows[m]):
                    self._recompute_model(m)
            elif r is not None and (cur is None or _model_key(r) > _model_key(self._row(cur, m))):
                self._best_model[m] = key

    def _row(self, key: str, model: Any) -> dict[str, Any]:
        return next(r for r in self._fin[key]["rows"] if r["model"] == model)

    def _recompute_common(self) -> None:
        best, best_key = None, None
        for k, e in self._fin.items():
            if _common_ok(e) and (best is None or _common_key(e) > best_key):
                best, best_key = k, _common_key(e)
        self._best_arch = best

    def _recompute_model(self, model: Any) -> None:
        best, best_key = None, None
        for k, e in self._fin.items():
            for r in e["rows"]:
                if r["model"] == model and _model_ok(r) and (best is None or _model_key(r) > best_key):
                    best, best_key = k, _model_key(r)
        if best is None:
            self._best_model.pop(model, None)
        else:
            self._best_model[model] = best

    def best(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Phaze-common best (highest across-model average, then lowest space_index), the best per
        model (highest throughput, then lowest space_index), and the TPUv4 reference with the expert
        placement. O(models) from the maxima ``add()`` keeps."""
        models = list(meta["models"])
        out: dict[str, Any] = {"models": models, "num_devices": meta.get("num_devices"),
                               "global_batch": meta.get("global_batch"), "searcher": meta.get("searcher"),
                               "evaluated": len(self._fin), "failed": self._num_failed,
                               "infeasible": self._num_infeasible,
                               "common": None, "per_model": {}, "reference": None, "speedup_vs_reference": {}}

        def arch_of(r):
            return {k: r[k] for k in ("num_tc", "num_vc", "pe_x", "pe_y", "pe_vc", "glb_mb")}

        def placement(r):
            return ({k: _jsonable(r[k]) for k in PLACEMENT_FIELDS} | {"stages": json.loads(r["stages_json"])}
                    | ilp_answer(r))

        if self._best_arch is not None:
            e = self._fin[self._best_arch]
            rows = {r["model"]: r for r in e["rows"]}
            r0 = next(iter(rows.values()))
            out["common"] = {"arch": arch_of(r0), "arch_label": r0["arch_label"], "area_mm2": r0["area_mm2"],
                             "throughput_avg": e["value"],
                             "per_model": {m: placement(r) for m, r in rows.items()}}
        for m in models:
            k = self._best_model.get(m)
            if k is not None:
                r = self._row(k, m)
                out["per_model"][m] = {"arch": arch_of(r), "arch_label": r["arch_label"],
                                       "area_mm2": r["area_mm2"], **placement(r)}
        if self._ref:
            ref_rows = [r for k in sorted(self._ref, key=self._ref.__getitem__)
                        for r in self._fin[k]["rows"] if r["is_reference"]]
            out["reference"] = {"arch_label": ref_rows[0]["arch_label"], "per_model": {
                r["model"]: {"status": r["status"], "throughput": r["throughput"],
                             "expert_throughput": _jsonable(r["expert_throughput"]),
                             "expert_pdt": r["expert_pdt"]} for r in ref_rows}}
            for m, b in out["per_model"].items():
                ref = out["reference"]["per_model"].get(m)
                if ref and ref["throughput"] > 0:
                    out["speedup_vs_reference"][m] = b["throughput"] / ref["throughput"]
        return out

    def write_best(self, meta: dict[str, Any], force: bool = False) -> dict[str, Any]:
        """``best(meta)``; also written to ``best.json`` (atomically) when ``force`` or when
        ``best_interval_s`` has passed since the last write (the first call always writes)."""
        best = self.best(meta)
        now = time.monotonic()
        if force or self._last_best is None or now - self._last_best >= self.best_interval_s:
            self.dir.mkdir(parents=True, exist_ok=True)
            text = json.dumps(best, indent=2)
            _atomic_write(self.dir / "best.json", lambda p: p.write_text(text))
            self._last_best = time.monotonic()
        return best
