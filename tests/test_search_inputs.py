"""`archplace search`'s bad input and damaged files (issue 29): each is a one-line error naming the
flag or the file, exit 2, before Ray starts, and leaves nothing behind that refuses the corrected
command. The checks that need no Ray run with ``connect`` replaced by a tripwire, so a check that
came after Ray's start-up fails the test instead of passing slowly."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from archplace.cli import main
from archplace.platform.store import ResultStore

TINY = ["bert-base", "--devices", "64", "--global-batch", "256", "--microbatches", "1", "--hbm", "32",
        "--schedule", "sequential", "--searcher", "grid", "--max-archs", "1"]


@pytest.fixture
def no_ray(monkeypatch):
    """``connect`` (the only place a search starts or attaches to Ray) raises if reached."""
    import archplace.platform.search as ps

    def tripwire(*args, **kwargs):
        raise AssertionError("Ray was started before the input was checked")

    monkeypatch.setattr(ps, "connect", tripwire)


def _one_line_error(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("archplace search: error: ")
    return err


def test_space_yaml_that_does_not_parse(no_ray, tmp_path, capsys):
    """Old: yaml.safe_load's ScannerError escaped the CLI's handlers, a 61-line traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("architecture:\n  num_tc: [1\n  bad: : :\n")
    err = _one_line_error(capsys, ["search", *TINY, "--space", str(bad), "--out", str(tmp_path / "o")])
    assert f"--space {bad}: not valid YAML" in err and "line 3 column 6" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("widths, message", [
    ("3", "--tmp-widths: 3 is not a power of two"),
    ("1,8", "--tmp-widths: tmp width 8 does not divide field 'num_attention_heads' = 12 of model "
            "'bert-base'; allowed widths: [1, 2, 4]"),
])
def test_tmp_widths_checked_before_ray(no_ray, tmp_path, capsys, widths, message):
    """Old: ``--tmp-widths 3`` passed the checks, Ray started, the graph task raised after about 20 s
    with a Ray task traceback, and search.json stayed behind, so the corrected command was refused
    with "already holds a search"."""
    out = tmp_path / "o"
    err = _one_line_error(capsys, ["search", *TINY, "--tmp-widths", widths, "--out", str(out)])
    assert message in err
    assert not (out / "search.json").exists()


def test_out_is_a_file(no_ray, tmp_path, capsys):
    """Old: "[Errno 17] File exists: '...'" from mkdir, naming neither --out nor what is wrong."""
    f = tmp_path / "afile"
    f.write_text("")
    err = _one_line_error(capsys, ["search", *TINY, "--out", str(f)])
    assert f"--out {f} is a file, not a directory" in err
    err = _one_line_error(capsys, ["search", *TINY, "--out", str(f / "below")])
    assert f"--out {f / 'below'}: {f} is a file, not a directory" in err


def test_schedule_cache_is_a_directory(no_ray, tmp_path, capsys):
    """Old: accepted; an ILP search failed after Ray's start-up with "[Errno 21] Is a directory"
    (a sequential one never noticed)."""
    d = tmp_path / "cache"
    d.mkdir()
    for schedule in ("ilp", "sequential"):
        err = _one_line_error(capsys, ["search", *TINY, "--schedule", schedule, "--schedule-cache", str(d),
                                       "--out", str(tmp_path / "o")])
        assert f"--schedule-cache {d} is a directory" in err
    assert not (tmp_path / "o" / "search.json").exists()


def test_unreadable_schedule_cache_is_an_error_before_ray(no_ray, tmp_path, capsys):
    """A cache file that is not text (Old: a UnicodeDecodeError traceback after Ray's start-up)."""
    c = tmp_path / "c.jsonl"
    c.write_bytes(b"\xff\xfe\x00junk\n")
    err = _one_line_error(capsys, ["search", *TINY, "--schedule", "ilp", "--schedule-cache", str(c),
                                   "--out", str(tmp_path / "o")])
    assert f"--schedule-cache {c}: cannot read it" in err


def _search_dir(out: Path, n_archs: int = 3) -> list[dict]:
    """A search directory as ``archplace search TINY`` writes it: its search.json, and ``n_archs``
    architectures in one part file each (``flush_rows=1``)."""
    from archplace import api
    from archplace.hardware.space import enumerate_space
    from archplace.platform.evaluate import arch_columns

    req = api.SearchRequest(models=("bert-base",), accelerators=64, global_batch=256, microbatches=(1,),
                            hbm_gb=(32.0,), schedule="sequential", searcher="grid", budget=1)
    s = req.settings()
    meta = {"settings": s.to_dict(), "searcher": "grid", "seed": 0, "hysteresis": 6, "area_bucket_mm2": 0.01,
            "models": ["bert-base"], "num_devices": 64, "global_batch": 256}
    store = ResultStore(out, flush_rows=1)
    store.write_meta(json.loads(json.dumps(meta)))
    space = enumerate_space()
    for i in range(n_archs):
        store.add([{**arch_columns(space.accelerator(i)), "space_index": i, "model": "bert-base",
                    "status": "ok", "throughput": 100.0 + i, "stages_json": "[]", "trial_id": f"t{i}",
                    "finished_at": 1.7e9 + i}],
                  "grid")
    return store.rows


def test_truncated_search_json(no_ray, tmp_path, capsys):
    """Old: "Expecting value: line 1 column 1 (char 0)", the JSON parser's message alone."""
    out = tmp_path / "o"
    _search_dir(out)
    text = (out / "search.json").read_text()
    (out / "search.json").write_text(text[:len(text) // 2])
    err = _one_line_error(capsys, ["search", *TINY, "--out", str(out), "--resume"])
    assert f"{out / 'search.json'} is damaged (not valid JSON" in err and "remove it and --resume" in err
    (out / "search.json").write_text("[1, 2]")
    err = _one_line_error(capsys, ["search", *TINY, "--out", str(out), "--resume"])
    assert "is damaged (a JSON list, not an object)" in err


def test_corrupt_parquet_part(no_ray, tmp_path, capsys):
    """Old: pyarrow's "Parquet magic bytes not found in footer..." without the file's name."""
    out = tmp_path / "o"
    _search_dir(out)
    part = out / "evaluations" / "part-000001.parquet"
    data = part.read_bytes()
    part.write_bytes(data[:len(data) // 2])
    err = _one_line_error(capsys, ["search", *TINY, "--out", str(out), "--resume"])
    assert f"{part} is damaged (not a readable Parquet file" in err
    assert "--resume evaluates the architectures it held again" in err


def test_corrupt_parquet_part_moved_away_then_resume_keeps_the_rest(tmp_path, capsys):
    """The way out the message gives: move the part away; the resume keeps the other rows (no Ray:
    ``--budget 2`` is already reached by the two rows left)."""
    out = tmp_path / "o"
    rows = _search_dir(out)
    part = out / "evaluations" / "part-000001.parquet"
    part.write_bytes(b"not parquet")
    part.rename(tmp_path / "moved.parquet")
    argv = ["search", *TINY[:-1], "2", "--out", str(out), "--resume", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    got = pq.read_table(out / "evaluations.parquet").to_pylist()
    assert [(r["arch_key"], r["trial_id"]) for r in got] == [(r["arch_key"], r["trial_id"])
                                                             for r in rows if r["space_index"] != 1]


def test_damaged_compacted_table(no_ray, tmp_path, capsys):
    out = tmp_path / "o"
    _search_dir(out)
    store = ResultStore(out)
    store.load()
    store.compact()
    (out / "evaluations.parquet").write_bytes(b"PAR1 and nothing else")
    err = _one_line_error(capsys, ["search", *TINY, "--out", str(out), "--resume"])
    assert f"{out / 'evaluations.parquet'} is damaged" in err
