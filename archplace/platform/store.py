"""The result store of a search directory: ``evaluations.parquet`` (one row per architecture ×
model), ``best.json`` and ``search.json`` (the settings, so ``--resume`` can check them).

Both files are rewritten atomically (write a temporary file, then rename) after every finished
trial, so killing the driver at any moment loses no finished evaluation. Plain pyarrow, no Ray.
"""

from __future__ import annotations

import json
import math
import os
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
    ("ilp_solved", pa.int64()), ("cache_hits", pa.int64()), ("actor_restarts", pa.int64()),
    ("node_id", pa.string()), ("hostname", pa.string()), ("pid", pa.int64()), ("finished_at", pa.float64()),
])
_DEFAULTS = {pa.int64(): 0, pa.float64(): math.nan, pa.string(): "", pa.bool_(): False}
FINISHED = ("ok", "infeasible", "failed")
PLACEMENT_FIELDS = ("throughput", "time_per_batch_s", "p", "d", "t", "microbatch", "recompute", "hbm_gb",
                    "num_stages")


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


class ResultStore:
    """Rows of one search directory, kept in memory and mirrored to disk after every change."""

    def __init__(self, out_dir: str | Path) -> None:
        self.dir = Path(out_dir)
        self.rows: list[dict[str, Any]] = []
        self._order: dict[str, int] = {}

    @property
    def parquet_path(self) -> Path:
        return self.dir / "evaluations.parquet"

    @property
    def settings_path(self) -> Path:
        return self.dir / "search.json"

    # ------------------------------------------------------------------ settings
    def holds_search(self) -> bool:
        return self.parquet_path.exists() or self.settings_path.exists()

    def read_meta(self) -> dict[str, Any]:
        return json.loads(self.settings_path.read_text())

    def write_meta(self, meta: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.settings_path, lambda p: p.write_text(json.dumps(meta, indent=2)))

    # ------------------------------------------------------------------ rows
    def load(self) -> None:
        """Read a previous run's rows (``--resume``)."""
        if not self.parquet_path.exists():
            return
        table = pq.read_table(self.parquet_path)
        self.rows = table.to_pylist()
        for r in self.rows:
            self._order.setdefault(r["arch_key"], int(r["order"]))

    def finished(self) -> dict[str, dict[str, Any]]:
        """arch_key -> {"space_index", "value" (average throughput, 0 for failed), "rows"}."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.rows:
            e = out.setdefault(r["arch_key"], {"space_index": int(r["space_index"]), "rows": []})
            e["rows"].append(r)
        for e in out.values():
            e["failed"] = any(r["status"] == "failed" for r in e["rows"])
            e["value"] = 0.0 if e["failed"] else float(np.mean([r["throughput"] for r in e["rows"]]))
        return out

    def add(self, rows: list[dict[str, Any]], searcher: str = "") -> int:
        """Record one architecture's rows (replacing earlier rows of the same architecture)."""
        if not rows:
            return -1
        key = rows[0]["arch_key"]
        order = self._order.setdefault(key, len(self._order))
        self.rows = [r for r in self.rows if r["arch_key"] != key]
        for r in rows:
            full = {name: r.get(name, _DEFAULTS[SCHEMA.field(name).type]) for name in SCHEMA.names}
            full["order"], full["searcher"] = order, r.get("searcher", searcher)
            self.rows.append(full)
        self.flush()
        return order

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(sorted(self.rows, key=lambda r: (r["order"], r["model"])), schema=SCHEMA)

    def flush(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        table = self.table()
        _atomic_write(self.parquet_path, lambda p: pq.write_table(table, p))

    # ------------------------------------------------------------------ best
    def best(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Phaze-common best (highest across-model average), the best per model, and the TPUv4
        reference with the expert placement."""
        models = list(meta["models"])
        fin = self.finished()
        out: dict[str, Any] = {"models": models, "num_devices": meta.get("num_devices"),
                               "global_batch": meta.get("global_batch"), "searcher": meta.get("searcher"),
                               "evaluated": len(fin), "failed": sum(e["failed"] for e in fin.values()),
                               "infeasible": sum(all(r["status"] == "infeasible" for r in e["rows"])
                                                 for e in fin.values()),
                               "common": None, "per_model": {}, "reference": None, "speedup_vs_reference": {}}

        def arch_of(r):
            return {k: r[k] for k in ("num_tc", "num_vc", "pe_x", "pe_y", "pe_vc", "glb_mb")}

        def placement(r):
            return {k: _jsonable(r[k]) for k in PLACEMENT_FIELDS} | {"stages": json.loads(r["stages_json"])}

        ok = {k: e for k, e in fin.items() if not e["failed"] and e["value"] > 0}
        if ok:
            k = max(ok, key=lambda k: (ok[k]["value"], -ok[k]["space_index"]))
            rows = {r["model"]: r for r in ok[k]["rows"]}
            r0 = next(iter(rows.values()))
            out["common"] = {"arch": arch_of(r0), "arch_label": r0["arch_label"], "area_mm2": r0["area_mm2"],
                             "throughput_avg": ok[k]["value"],
                             "per_model": {m: placement(r) for m, r in rows.items()}}
        for m in models:
            cand = [r for r in self.rows if r["model"] == m and r["status"] == "ok"]
            if cand:
                r = max(cand, key=lambda r: (r["throughput"], -r["space_index"]))
                out["per_model"][m] = {"arch": arch_of(r), "arch_label": r["arch_label"],
                                       "area_mm2": r["area_mm2"], **placement(r)}
        ref_rows = [r for r in self.rows if r["is_reference"]]
        if ref_rows:
            out["reference"] = {"arch_label": ref_rows[0]["arch_label"], "per_model": {
                r["model"]: {"status": r["status"], "throughput": r["throughput"],
                             "expert_throughput": _jsonable(r["expert_throughput"]),
                             "expert_pdt": r["expert_pdt"]} for r in ref_rows}}
            for m, b in out["per_model"].items():
                ref = out["reference"]["per_model"].get(m)
                if ref and ref["throughput"] > 0:
                    out["speedup_vs_reference"][m] = b["throughput"] / ref["throughput"]
        return out

    def write_best(self, meta: dict[str, Any]) -> dict[str, Any]:
        best = self.best(meta)
        _atomic_write(self.dir / "best.json", lambda p: p.write_text(json.dumps(best, indent=2)))
        return best
