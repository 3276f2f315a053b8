"""The result store's compaction during a search and on resume, and what a failed new search leaves
(issue 29). Plain pyarrow, no Ray: where ``run_search`` is called, ``connect`` is replaced by a probe
that records the directory as Ray would find it and stops the run there."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from test_store import MODELS, _arch

from archplace.platform.store import ResultStore


def _identities(rows: list[dict]) -> list[tuple]:
    return sorted((r["arch_key"], r["model"], r["trial_id"], r["finished_at"], r["throughput"]) for r in rows)


def _loaded(out) -> list[dict]:
    s = ResultStore(out)
    s.load()
    return s.rows


def test_parts_are_compacted_every_compact_parts(tmp_path):
    """Old: with trials finishing more than ``flush_interval_s`` apart (every ILP search) each trial
    became one part, and nothing compacted them before the search's end: 10,000 trials left 10,000
    parts (159 MB, a 21 s load on resume). Now at most ``compact_parts - 1`` parts are ever on disk,
    and a reader sees exactly the rows the writer holds at every step, re-evaluations included."""
    store = ResultStore(tmp_path, flush_rows=1, compact_parts=8)
    most = 0
    for i in range(120):
        store.add(_arch(i % 90, tps=(100.0 + i, 50.0 + i), trial=f"t{i}"))   # 30 re-evaluations
        most = max(most, store.parts_on_disk())
        if i % 20 == 19:
            assert _identities(_loaded(tmp_path)) == _identities(store.rows)
    assert most == 7
    assert store.parts_on_disk() == 120 % 8 and (tmp_path / "evaluations.parquet").exists()
    assert len(store.rows) == 90 * len(MODELS)
    assert _identities(_loaded(tmp_path)) == _identities(store.rows)


def test_default_compaction_bounds_the_parts_of_a_many_trial_run(tmp_path):
    store = ResultStore(tmp_path, flush_rows=1)
    for i in range(300):
        store.add(_arch(i))
    assert store.compact_parts == 64 and store.parts_on_disk() == 300 % 64
    assert pq.ParquetFile(tmp_path / "evaluations.parquet").metadata.num_rows == 256 * len(MODELS)
    assert _identities(_loaded(tmp_path)) == _identities(store.rows)


def test_compaction_killed_part_way_reads_the_same_rows(tmp_path):
    """Exactly once across a compaction cut short: the compacted table written, only the oldest part
    removed (compaction removes oldest first), the log still there."""
    store = ResultStore(tmp_path, flush_rows=1, compact_parts=10**6)
    for i in range(10):
        store.add(_arch(i))
    want = _identities(store.rows)
    parts = [p for _, p in store._parts()]
    pq.write_table(store.table(), tmp_path / "evaluations.parquet")
    parts[0].unlink()
    assert _identities(_loaded(tmp_path)) == want


def _meta(settings) -> dict:
    """search.json as ``run_search(settings, searcher="grid")`` writes it."""
    return json.loads(json.dumps({
        "settings": settings.to_dict(), "searcher": "grid", "seed": 0, "hysteresis": 6,
        "area_bucket_mm2": 0.01, "models": list(settings.models), "num_devices": settings.num_devices,
        "global_batch": settings.global_batch}))


class _RayReached(Exception):
    pass


def test_resume_compacts_before_ray_starts(tmp_path, monkeypatch):
    """Old: a resume read the killed driver's parts and left them there; the new trials added more
    parts, and every later resume read them all again. Now the resume compacts them into
    evaluations.parquet first: when Ray would start, the directory is one table with the same rows."""
    import archplace.platform.search as ps
    from archplace.platform.trial import SearchSettings

    settings = SearchSettings(models=tuple(MODELS), schedule="sequential")
    old = ResultStore(tmp_path, flush_rows=1, compact_parts=10**6)   # as the store before issue 29
    old.write_meta(_meta(settings))
    for i in range(200):
        old.add(_arch(i))
    old._close_wal()
    want = _identities(old.rows)
    assert old.parts_on_disk() == 200
    seen = {}

    def probe(*args, **kwargs):
        seen["parts"] = ResultStore(tmp_path).parts_on_disk()
        seen["rows"] = _identities(pq.read_table(tmp_path / "evaluations.parquet").to_pylist())
        raise _RayReached

    monkeypatch.setattr(ps, "connect", probe)
    with pytest.raises(_RayReached):
        ps.run_search(settings, tmp_path, searcher="grid", budget=210, resume=True, progress=False,
                      report=False)
    assert seen == {"parts": 0, "rows": want}
    assert (tmp_path / "search.json").exists()   # a resumed search keeps its files when it fails
    assert _identities(_loaded(tmp_path)) == want


def test_new_search_failing_before_its_first_row_leaves_no_search_json(tmp_path, monkeypatch):
    """Old: search.json was written before Ray's start-up and stayed when the search then failed, so
    the corrected command was refused ("already holds a search; pass --resume")."""
    import archplace.platform.search as ps
    from archplace.platform.trial import SearchSettings

    settings = SearchSettings(models=tuple(MODELS), schedule="sequential")

    import archplace.platform.tasks as tasks

    def no_cpus(timeout_s, *args, **kwargs):   # a failure after search.json was written
        assert (tmp_path / "o" / "search.json").exists()
        raise TimeoutError(f"the Ray cluster offers 0 CPUs after {timeout_s:.0f} s")

    monkeypatch.setattr(ps, "connect", lambda *args, **kwargs: None)
    monkeypatch.setattr(tasks, "wait_for_cpus", no_cpus)
    with pytest.raises(TimeoutError):
        ps.run_search(settings, tmp_path / "o", searcher="grid", budget=2, progress=False, report=False)
    assert not ResultStore(tmp_path / "o").holds_search()


def test_discard_if_empty_removes_only_a_search_without_rows(tmp_path):
    empty = ResultStore(tmp_path / "empty")
    empty.write_meta({"models": MODELS})
    empty.close({"models": MODELS})   # best.json and an empty evaluations.parquet, as close() writes them
    assert empty.holds_search()
    empty.discard_if_empty()
    assert not empty.holds_search() and not (tmp_path / "empty" / "best.json").exists()

    full = ResultStore(tmp_path / "full", flush_rows=1)
    full.write_meta({"models": MODELS})
    full.add(_arch(0))
    ResultStore(tmp_path / "full").discard_if_empty()   # a fresh instance: the rows are only on disk
    assert (tmp_path / "full" / "search.json").exists() and len(_loaded(tmp_path / "full")) == 2
