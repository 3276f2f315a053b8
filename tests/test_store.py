"""The append-only result store (archplace.platform.store): parts + write-ahead log + compaction,
crash safety, replacement of re-evaluated architectures, and the incrementally kept best."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from archplace.platform.store import _DEFAULTS, PLACEMENT_FIELDS, SCHEMA, ResultStore, _jsonable

REPO = Path(__file__).resolve().parents[1]
MODELS = ["bert-large", "gpt2-xl"]
META = {"models": MODELS, "num_devices": 1024, "global_batch": 4096, "searcher": "phaze"}
STAGES = json.dumps([{"first": 0, "last": 11, "devices": 256, "load_s": 0.0125}] * 4)


def _row(i: int, model: str, status: str = "ok", tp: float = 100.0, *, ref: bool = False,
         trial: str | None = None, t: float | None = None, area: float | None = None) -> dict:
    """A row of architecture ``i`` (space_index i, arch_key a<i>); all other columns realistic."""
    ok = status == "ok"
    return {
        "trial_id": trial or f"t{i:05d}", "arch_key": f"a{i}", "arch_label": f"{{{i},2,128,128,128}} glb64MB",
        "space_index": i, "num_tc": 1 + i % 16, "num_vc": 2, "pe_x": 128, "pe_y": 128, "pe_vc": 128,
        "glb_mb": 64.0, "area_mm2": area if area is not None else 100.0 + i, "is_reference": ref,
        "model": model, "status": status, "error": "" if status != "failed" else "solver crashed",
        "throughput": tp if ok else 0.0, "time_per_batch_s": 4096 / tp if ok and tp > 0 else math.nan,
        "p": 4 if ok else 0, "d": 64 if ok else 0, "t": 4 if ok else 0, "microbatch": 8 if ok else 0,
        "num_stages": 4 if ok else 0, "hbm_gb": 21.5 if ok else math.nan, "recompute": model == "gpt2-xl",
        "stages_json": STAGES if ok else "[]",
        "expert_throughput": 900.0 if ref else math.nan, "expert_pdt": "8,128,1" if ref else "",
        "estimate_s": 1.0, "ilp_s": 2.0, "dp_s": 0.5, "total_s": 3.5, "ilp_solved": 10, "cache_hits": 30,
        "node_id": "n1", "hostname": "host-a", "pid": 1234, "finished_at": t if t is not None else 1.7e9 + i,
    }


def _arch(i: int, status: str = "ok", tps=(100.0, 50.0), **kw) -> list[dict]:
    return [_row(i, m, status, tp, **kw) for m, tp in zip(MODELS, tps)]


def _key(r: dict) -> tuple:
    return r["arch_key"], r["model"], r["trial_id"], r["status"], r["throughput"], r["order"]


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _rows_equal(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert set(g) == set(SCHEMA.names)
        bad = [c for c in SCHEMA.names if not _same(g[c], w[c])]
        assert not bad, (bad, g, w)


# ---------------------------------------------------------------------------------- the brute force
class _Reference:
    """The previous store's semantics, recomputed from scratch over a list of rows."""

    def __init__(self):
        self.rows: list[dict] = []
        self.order: dict[str, int] = {}

    def add(self, rows, searcher=""):
        key = rows[0]["arch_key"]
        order = self.order.setdefault(key, len(self.order))
        self.rows = [r for r in self.rows if r["arch_key"] != key]
        for r in rows:
            full = {n: r.get(n, _DEFAULTS[SCHEMA.field(n).type]) for n in SCHEMA.names}
            full["order"], full["searcher"] = order, r.get("searcher", searcher)
            self.rows.append(full)
        return order

    def finished(self):
        out = {}
        for r in self.rows:
            e = out.setdefault(r["arch_key"], {"space_index": int(r["space_index"]), "rows": []})
            e["rows"].append(r)
        for e in out.values():
            e["failed"] = any(r["status"] == "failed" for r in e["rows"])
            e["value"] = 0.0 if e["failed"] else float(np.mean([r["throughput"] for r in e["rows"]]))
        return out

    def best(self, meta):
        models = list(meta["models"])
        fin = self.finished()
        out = {"models": models, "num_devices": meta.get("num_devices"),
               "global_batch": meta.get("global_batch"), "searcher": meta.get("searcher"),
               "evaluated": len(fin), "failed": sum(e["failed"] for e in fin.values()),
               "infeasible": sum(all(r["status"] == "infeasible" for r in e["rows"]) for e in fin.values()),
               "common": None, "per_model": {}, "reference": None, "speedup_vs_reference": {}}

        def arch_of(r):
            return {k: r[k] for k in ("num_tc", "num_vc", "pe_x", "pe_y", "pe_vc", "glb_mb")}

        def placement(r):
            # the layer-ILP answer: rows without those columns (as here, and files written before them)
            # read as no slices and an unknown gap
            ilp = {"ilp_status": json.loads(r.get("ilp_status") or "{}"),
                   "ilp_worst_gap": _jsonable(r.get("ilp_worst_gap", math.nan)),
                   "ilp_gap_unknown": int(r.get("ilp_gap_unknown") or 0),
                   "ilp_stopped_by": json.loads(r.get("ilp_stopped_by") or "{}"),
                   "ilp_load_dependent": int(r.get("ilp_load_dependent") or 0)}
            return ({k: _jsonable(r[k]) for k in PLACEMENT_FIELDS} | {"stages": json.loads(r["stages_json"])}
                    | ilp)

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

    def sorted_rows(self):
        return sorted(self.rows, key=lambda r: (r["order"], r["model"]))


def _assert_finished(store: ResultStore, ref: _Reference) -> None:
    got, want = store.finished(), ref.finished()
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert (g["space_index"], g["failed"], g["value"]) == (w["space_index"], w["failed"], w["value"]), k
        assert sorted(_key(r) for r in g["rows"]) == sorted(_key(r) for r in w["rows"]), k


# ---------------------------------------------------------------------------------- layout
def test_compact_writes_sorted_rows_and_removes_parts_and_wal(tmp_path):
    store, ref = ResultStore(tmp_path, flush_rows=3), _Reference()
    for i in (5, 2, 9, 7):  # orders 0..3 in this sequence; the table sorts by order, not space_index
        assert store.add(list(reversed(_arch(i))), "grid") == ref.add(list(reversed(_arch(i))), "grid")
    assert store.dataset_dir.is_dir() and store.wal_path.exists()
    assert not store.parquet_path.exists()
    store.compact()
    assert not store.dataset_dir.exists() and not store.wal_path.exists()
    table = pq.read_table(store.parquet_path)
    assert table.schema.equals(SCHEMA)
    got = table.to_pylist()
    _rows_equal(got, ref.sorted_rows())
    assert [(r["order"], r["model"]) for r in got] == [(o, m) for o in range(4) for m in MODELS]
    assert {r["searcher"] for r in got} == {"grid"}
    # the compacted file alone loads back to the same store
    again = ResultStore(tmp_path)
    again.load()
    _rows_equal(again.table().to_pylist(), got)


def test_dataset_dir_reads_as_one_table_before_compaction(tmp_path):
    import pandas as pd

    store = ResultStore(tmp_path, flush_rows=2)
    for i in range(5):
        store.add(_arch(i))
    store.add([_row(9, "bert-large", tp=1.0)])  # pending, in the log only
    parts = sorted(p.name for p in store.dataset_dir.iterdir())
    assert parts == [f"part-{i:06d}.parquet" for i in range(5)]
    # a temporary part left by a kill mid-write is dot-prefixed: both readers skip it
    (store.dataset_dir / ".part-000005.parquet.123.tmp").write_bytes(b"not parquet")
    table = ds.dataset(store.dataset_dir, format="parquet").to_table()
    assert table.num_rows == 10 and table.schema.equals(SCHEMA)
    assert sorted(zip(table["arch_key"].to_pylist(), table["model"].to_pylist())) == sorted(
        (f"a{i}", m) for i in range(5) for m in MODELS)
    df = pd.read_parquet(store.dataset_dir)
    assert len(df) == 10 and df["throughput"].sum() == pytest.approx(5 * 150.0)
    assert len(store) == 11 and store.num_rows == 11


def test_holds_search(tmp_path):
    assert not ResultStore(tmp_path).holds_search()
    store = ResultStore(tmp_path / "a", flush_rows=100)
    store.add(_arch(0))  # log only
    assert store.wal_path.exists() and not store.dataset_dir.exists()
    assert ResultStore(tmp_path / "a").holds_search()
    store.flush()
    store.wal_path.unlink()
    assert ResultStore(tmp_path / "a").holds_search()  # the parts alone


# ---------------------------------------------------------------------------------- crash safety
def test_wal_replay_after_the_store_is_dropped(tmp_path):
    store, ref = ResultStore(tmp_path, flush_rows=10_000, flush_interval_s=1e9), _Reference()
    for i in range(7):
        rows = _arch(i, "ok" if i % 3 else "failed")
        rows[0]["finished_at"] = math.nan  # NaN survives the log
        rows[1]["throughput"] = np.float64(12.5) if i % 3 else 0.0  # numpy scalars too
        store.add(rows, "phaze")
        ref.add(rows, "phaze")
    assert not store.dataset_dir.exists()  # nothing flushed: everything is in the log
    del store  # no close(), no flush()
    again = ResultStore(tmp_path)
    again.load()
    assert len(again) == 14
    _rows_equal(again.table().to_pylist(), ref.sorted_rows())
    assert math.isnan(again.table().to_pylist()[0]["finished_at"])
    _assert_finished(again, ref)
    assert again.best(META) == ref.best(META)
    # the replayed rows are pending again: a flush puts them into a part and empties the log
    again.flush()
    assert len(list(again.dataset_dir.glob("part-*.parquet"))) == 1
    assert again.wal_path.read_text() == ""


def test_sigkill_loses_no_accepted_row(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO / 'tests')!r})
        from test_store import _arch
        from archplace.platform.store import ResultStore
        store = ResultStore(sys.argv[1], flush_rows=5, flush_interval_s=1e9)
        for i in range(13):
            store.add(_arch(i, tps=(100.0 + i, 50.0)))
        print("added", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and "added" in proc.stdout, proc.stderr
    # 26 rows: 4 parts of 6 rows, the last architecture's 2 rows only in the log
    assert len(store_parts(tmp_path)) == 4
    assert len(ResultStore(tmp_path).wal_path.read_text().splitlines()) == 2
    store = ResultStore(tmp_path)
    store.load()
    assert len(store) == 26 and len(store.finished()) == 13
    assert store.finished()["a12"]["value"] == pytest.approx((112.0 + 50.0) / 2)
    assert store.best(META)["common"]["arch_label"] == _row(12, "x")["arch_label"]


def store_parts(d: Path) -> list[str]:
    return sorted(p.name for p in (d / "evaluations").glob("part-*.parquet"))


def test_kill_between_part_and_wal_truncate_gives_no_duplicates(tmp_path):
    store, ref = ResultStore(tmp_path, flush_rows=10_000, flush_interval_s=1e9), _Reference()
    for rows in (_arch(0), _arch(1, "failed"), _arch(2), _arch(1, tps=(300.0, 200.0), trial="t-retry")):
        store.add(rows)
        ref.add(rows)
    wal = store.wal_path.read_bytes()
    store.flush()  # writes part 0 (a1 superseded by its retry), then truncates the log ...
    store.wal_path.write_bytes(wal)  # ... which the kill prevented
    assert store_parts(tmp_path) == ["part-000000.parquet"]
    del store
    again = ResultStore(tmp_path)
    again.load()
    assert len(again) == 6
    _rows_equal(again.table().to_pylist(), ref.sorted_rows())
    assert again.finished()["a1"]["failed"] is False and again.finished()["a1"]["value"] == 250.0
    again.flush()  # everything in the log was in the part: nothing pending, no new part
    assert store_parts(tmp_path) == ["part-000000.parquet"]
    assert not again.wal_path.exists()  # the log's copies dropped
    again.compact()
    assert pq.read_table(again.parquet_path).num_rows == 6


def test_torn_last_log_line_is_ignored(tmp_path):
    store = ResultStore(tmp_path, flush_rows=10_000, flush_interval_s=1e9)
    store.add(_arch(0))
    store.add(_arch(1))
    line = store.wal_path.read_text().splitlines()[-1]
    lines = store.wal_path.read_text().splitlines(keepends=True)
    # the kill cut the second add() after its first row and part-way through that row's line
    store.wal_path.write_text("".join(lines[:3]) + line[: len(line) // 2])
    del store
    # a store that appends without load() first does not glue its line to the torn one
    writer = ResultStore(tmp_path, flush_rows=10_000, flush_interval_s=1e9)
    writer.add(_arch(2))
    del writer
    again = ResultStore(tmp_path)
    torn = again.wal_path.read_text()
    again.load()
    assert sorted(again.finished()) == ["a0", "a2"]  # the incomplete add() of a1 is not replayed
    assert len(again) == 4
    assert again.wal_path.read_text() == torn  # load() only reads
    again.add(_arch(3))  # the first write repairs the log: the pending rows, then the new ones
    assert [json.loads(line)["arch_key"] for line in again.wal_path.read_text().splitlines()] == [
        "a0", "a0", "a2", "a2", "a3", "a3"]
    last = ResultStore(tmp_path)
    last.load()
    assert sorted(last.finished()) == ["a0", "a2", "a3"] and len(last) == 6


def test_a_reader_loading_a_live_directory_does_not_disturb_the_writer(tmp_path):
    writer = ResultStore(tmp_path, flush_rows=6, flush_interval_s=1e9)
    for i in range(4):  # 3 adds flushed into part 0, the 4th in the log
        writer.add(_arch(i))
    reader = ResultStore(tmp_path)
    reader.load()
    assert len(reader) == 8
    for i in range(4, 6):  # appended to the same log the reader read
        writer.add(_arch(i))
    reader.load()
    assert len(reader) == 12
    del writer  # killed: the log still holds every row in no part
    again = ResultStore(tmp_path)
    again.load()
    assert sorted(again.finished()) == [f"a{i}" for i in range(6)] and len(again) == 12


# ---------------------------------------------------------------------------------- replacement
def test_failed_architecture_re_added_ok_replaces_its_rows(tmp_path):
    store = ResultStore(tmp_path, flush_rows=2)
    assert store.add(_arch(0)) == 0
    assert store.add(_arch(1, "failed", trial="first")) == 1
    assert store.add(_arch(2)) == 2
    assert store.finished()["a1"]["failed"] is True
    assert store.best(META)["failed"] == 1
    assert store.add(_arch(1, tps=(500.0, 300.0), trial="retry")) == 1  # order unchanged
    e = store.finished()["a1"]
    assert e["failed"] is False and e["value"] == 400.0 and len(e["rows"]) == 2
    assert {r["trial_id"] for r in e["rows"]} == {"retry"}
    assert len(store) == 6
    best = store.best(META)
    assert best["failed"] == 0 and best["common"]["throughput_avg"] == 400.0
    rows = store.table().to_pylist()
    assert [(r["order"], r["arch_key"], r["trial_id"]) for r in rows if r["arch_key"] == "a1"] == [
        (1, "a1", "retry"), (1, "a1", "retry")]


def test_replacement_across_load_of_a_partially_flushed_store(tmp_path):
    store = ResultStore(tmp_path, flush_rows=4, flush_interval_s=1e9)
    store.add(_arch(0))
    store.add(_arch(1, "failed", trial="first"))  # 4 rows: flushed into part 0
    store.add(_arch(2))
    store.add(_arch(1, tps=(500.0, 300.0), trial="retry"))  # 4 rows: part 1 (a2, a1 ok)
    store.add(_arch(3, "failed", trial="first"))
    store.add(_arch(3, "infeasible", trial="second"))  # the log only, superseding the failed one
    assert store_parts(tmp_path) == ["part-000000.parquet", "part-000001.parquet"]
    del store
    again = ResultStore(tmp_path)
    again.load()
    assert len(again) == 8
    fin = again.finished()
    assert list(fin) == ["a0", "a1", "a2", "a3"]
    assert fin["a1"]["failed"] is False and {r["trial_id"] for r in fin["a1"]["rows"]} == {"retry"}
    assert fin["a3"]["failed"] is False and {r["status"] for r in fin["a3"]["rows"]} == {"infeasible"}
    assert [r["order"] for r in again.table().to_pylist()] == [0, 0, 1, 1, 2, 2, 3, 3]
    best = again.best(META)
    assert (best["evaluated"], best["failed"], best["infeasible"]) == (4, 0, 1)
    # new architectures continue the order; a re-add after load keeps its old order
    assert again.add(_arch(4)) == 4 and again.add(_arch(0, tps=(1.0, 1.0), trial="again")) == 0
    again.compact()
    rows = pq.read_table(again.parquet_path).to_pylist()
    assert [(r["arch_key"], r["order"]) for r in rows[::2]] == [(f"a{i}", i) for i in range(5)]
    assert rows[0]["trial_id"] == "again"


# ---------------------------------------------------------------------------------- best
def test_best_matches_brute_force_after_every_add(tmp_path):
    rnd = random.Random(7)
    store, ref = ResultStore(tmp_path, flush_rows=7, flush_interval_s=1e9, best_interval_s=1e9), _Reference()
    tps = [50.0, 100.0, 150.0, 200.0, 250.0]  # few values: ties, broken by the lowest space_index
    REF_I = 17
    replaced_best = 0
    for step in range(300):
        if step % 23 == 11 and ref.best(META)["common"]:
            # the current best architecture re-evaluated with worse (or failed) rows
            label = ref.best(META)["common"]["arch_label"]
            i = int(label[1:label.index(",")])
            status = rnd.choice(["ok", "failed", "infeasible"])
            rows = _arch(i, status, (10.0, 5.0), ref=i == REF_I, trial=f"s{step}", t=float(step))
            replaced_best += 1
        elif step % 29 == 13 and ref.best(META)["per_model"]:
            m = rnd.choice(MODELS)
            if m not in ref.best(META)["per_model"]:
                continue
            label = ref.best(META)["per_model"][m]["arch_label"]
            i = int(label[1:label.index(",")])
            rows = _arch(i, "ok", (1.0, 1.0), ref=i == REF_I, trial=f"s{step}", t=float(step))
        else:
            i = rnd.randrange(120)
            kind = rnd.random()
            if kind < 0.1:
                rows = _arch(i, "failed", ref=i == REF_I)
                if rnd.random() < 0.5:  # one model failed, the other ok
                    rows[0] = _row(i, MODELS[0], "ok", rnd.choice(tps), ref=i == REF_I)
            elif kind < 0.2:
                rows = _arch(i, "infeasible", ref=i == REF_I)
                if rnd.random() < 0.5:  # feasible on one model only
                    rows[1] = _row(i, MODELS[1], "ok", rnd.choice(tps), ref=i == REF_I)
            else:
                rows = _arch(i, "ok", (rnd.choice(tps), rnd.choice(tps) / 2), ref=i == REF_I)
            for r in rows:
                r["trial_id"], r["finished_at"] = f"s{step}", float(step)
        assert store.add(rows, "phaze") == ref.add(rows, "phaze")
        assert store.best(META) == ref.best(META), step
        assert store.write_best(META) == ref.best(META)
        assert len(store) == len(ref.rows)
    _assert_finished(store, ref)
    want = ref.best(META)
    assert want["reference"] is not None and want["failed"] and want["infeasible"] and replaced_best >= 10
    assert want["speedup_vs_reference"]
    # the same after a resume (parts + log) and after compaction
    again = ResultStore(tmp_path)
    again.load()
    ref_loaded = _Reference()  # the old store's load(): rows in file order, i.e. sorted by (order, model)
    ref_loaded.rows, ref_loaded.order = ref.sorted_rows(), dict(ref.order)
    assert again.best(META) == ref_loaded.best(META)
    _assert_finished(again, ref_loaded)
    assert len(again) == len({(r["arch_key"], r["model"]) for r in ref.rows})
    _rows_equal(again.table().to_pylist(), ref.sorted_rows())
    assert again.close(META) == ref_loaded.best(META)
    assert json.loads((tmp_path / "best.json").read_text()) == json.loads(json.dumps(ref_loaded.best(META)))
    _rows_equal(pq.read_table(again.parquet_path).to_pylist(), ref.sorted_rows())


def test_write_best_is_throttled(tmp_path):
    store = ResultStore(tmp_path, best_interval_s=3600)
    path = tmp_path / "best.json"
    store.add(_arch(0, tps=(100.0, 100.0)))
    store.write_best(META)  # the first call always writes
    assert json.loads(path.read_text())["evaluated"] == 1
    store.add(_arch(1, tps=(200.0, 200.0)))
    best = store.write_best(META)  # returned, but not written: too soon
    assert best["evaluated"] == 2 and best["common"]["throughput_avg"] == 200.0
    assert json.loads(path.read_text())["evaluated"] == 1
    store.write_best(META, force=True)
    assert json.loads(path.read_text())["evaluated"] == 2
    fast = ResultStore(tmp_path / "fast", best_interval_s=0.0)
    fast.add(_arch(0))
    fast.write_best(META)
    fast.add(_arch(1))
    fast.write_best(META)
    assert json.loads((tmp_path / "fast" / "best.json").read_text())["evaluated"] == 2


def test_len_after_load_counts_distinct_architecture_model_pairs(tmp_path):
    store = ResultStore(tmp_path, flush_rows=3, flush_interval_s=1e9)
    store.add(_arch(0))
    store.add(_arch(1))
    store.add(_arch(0, "failed", trial="x"))
    store.add([_row(2, "bert-large")])  # one model only
    store.add(_arch(1, trial="y"))
    assert len(store) == 5
    again = ResultStore(tmp_path)
    again.load()
    assert len(again) == again.num_rows == 5 == len(again.table())
    assert len(again.rows) == 5


def test_compacted_file_reads_in_the_report(tmp_path):
    from archplace.platform.report import _load_rows

    store = ResultStore(tmp_path, flush_rows=3)
    for i in range(4):
        store.add(_arch(i, ref=i == 0))
    best = store.close(META)
    rows = _load_rows(store.parquet_path)
    assert len(rows) == 8 and best["reference"]["arch_label"] == rows[0]["arch_label"]
    assert json.loads((tmp_path / "best.json").read_text())["evaluated"] == 4


def test_store_module_does_not_import_ray():
    code = "import sys, archplace.platform.store; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={**os.environ})


def test_ilp_answer_columns_round_trip_and_old_files_load(tmp_path):
    """The layer-ILP columns (solver statuses, worst gap) reach best.json; a compacted file written
    before those columns existed still loads, its rows reading as no slices and an unknown gap."""
    from archplace.platform.store import ilp_overall

    new = tmp_path / "new"
    store = ResultStore(new)
    rows = _arch(1)
    for r, gap in zip(rows, (0.0, 0.125)):
        r.update(ilp_status=json.dumps({"optimal": 3, "feasible": 1 if gap else 0}), ilp_worst_gap=gap,
                 ilp_gap_unknown=0, ilp_slices_json="[]",
                 ilp_stopped_by=json.dumps({"optimal": 3, "deterministic_limit" if gap else "wall_limit": 1}),
                 ilp_load_dependent=0 if gap else 1)
    store.add(rows, "phaze")
    best = store.close(META)
    again = ResultStore(new)
    again.load()
    for b in (best, again.best(META)):
        assert b["per_model"]["gpt2-xl"]["ilp_status"] == {"optimal": 3, "feasible": 1}
        assert b["per_model"]["gpt2-xl"]["ilp_worst_gap"] == 0.125
        assert b["per_model"]["bert-large"]["ilp_worst_gap"] == 0.0
        assert b["per_model"]["gpt2-xl"]["ilp_stopped_by"] == {"optimal": 3, "deterministic_limit": 1}
        assert b["per_model"]["bert-large"]["ilp_load_dependent"] == 1
    overall = ilp_overall(again.rows)
    assert overall["status_counts"] == {"optimal": 6, "feasible": 1} and overall["worst_gap"] == 0.125
    assert overall["stopped_by"] == {"optimal": 6, "deterministic_limit": 1, "wall_limit": 1}
    assert overall["load_dependent"] == 1
    assert overall["worst_gap_at"] == {"arch_label": rows[1]["arch_label"], "model": "gpt2-xl"}

    old = tmp_path / "old"
    old.mkdir()
    legacy = pa.schema([f for f in SCHEMA if not f.name.startswith("ilp_") or f.name in
                        ("ilp_lookups", "ilp_unique", "ilp_solved")])
    rows = [{**r, "order": 0} for r in _arch(2)]
    pq.write_table(pa.Table.from_pylist(rows, schema=legacy), old / "evaluations.parquet")
    store = ResultStore(old)
    store.load()
    assert len(store) == 2
    assert all(r["ilp_status"] == "" and math.isnan(r["ilp_worst_gap"]) for r in store.rows)
    b = store.best(META)["per_model"]["bert-large"]
    assert b["ilp_status"] == {} and b["ilp_worst_gap"] is None
    assert b["ilp_stopped_by"] == {} and b["ilp_load_dependent"] == 0
    assert ilp_overall(store.rows)["worst_gap"] is None
