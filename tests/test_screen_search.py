"""``--searcher screen`` (issue 33): phase 1 screens every architecture with the sequential schedule,
phase 2 solves the top k with the ILP. On a small space the screen's winner equals the exhaustive
ILP + DP winner (every architecture through the Tune grid searcher) whenever that winner ranks within
phase 1's top k; a search stopped in phase 1, and one run phase 1 only, resume to the same answer;
rows carry their phase, and phase-1 rows are never a best row."""

from __future__ import annotations

import dataclasses
import json
import threading

import pyarrow.parquet as pq
import pytest
import yaml

from archplace.platform.screen import COMMON, candidates, rankings, run_screen, winner_ranks
from archplace.platform.settings import SearchSettings
from archplace.platform.store import ResultStore

MODEL = "bert-base"


# ---------------------------------------------------------------------- rankings, no Ray
def _entry(i: int, tps: dict[str, float], failed: bool = False) -> dict:
    rows = [{"model": m, "status": "failed" if failed else "ok" if tp > 0 else "infeasible",
             "throughput": tp} for m, tp in tps.items()]
    return {"space_index": i, "rows": rows, "failed": failed,
            "value": 0.0 if failed else sum(tps.values()) / len(tps)}


def test_rankings_order_ties_infeasible_and_failed():
    es = [_entry(0, {"a": 5.0, "b": 1.0}), _entry(1, {"a": 5.0, "b": 3.0}), _entry(2, {"a": 0.0, "b": 9.0}),
          _entry(3, {"a": 7.0, "b": 2.0}, failed=True), _entry(4, {"a": 6.0, "b": 0.5})]
    r = rankings(es, ["a", "b"])
    assert r["a"] == [4, 0, 1]            # 2 infeasible for a; 3 failed; tie 0/1: lower index first
    assert r["b"] == [2, 1, 0, 4]
    assert r[COMMON] == [2, 1, 4, 0]      # averages 4.5, 4.0, 3.25, 3.0 (2's infeasible a counts as 0)
    assert candidates(r, 1) == [2, 4]
    assert candidates(r, 2, extra=[3]) == [0, 1, 2, 3, 4]


def test_winner_ranks_counts_winners_deep_in_phase_1():
    p1 = {"a": [4, 0, 1, 2], "b": [2, 1, 0, 4], COMMON: [2, 1, 4, 0]}
    p2 = {"a": [1, 4], "b": [2], COMMON: [0, 2]}
    w = winner_ranks(p1, p2, top_k=4)
    assert {k: v["phase1_rank"] for k, v in w["per_objective"].items()} == {"a": 2, "b": 0, COMMON: 3}
    assert w["outside_top_half"] == 2 and w["outside_top_k"] == 0 and w["objectives"] == 3
    assert winner_ranks(p1, p2, top_k=2)["outside_top_k"] == 2


def test_store_keeps_both_phases_and_never_picks_a_phase_1_row(tmp_path):
    def rows(key, i, tp, phase):
        return [{"arch_key": key, "arch_label": key, "space_index": i, "model": MODEL, "status": "ok",
                 "throughput": tp, "phase": phase, "trial_id": f"t{phase}", "finished_at": float(phase),
                 "stages_json": "[]"}]

    s = ResultStore(tmp_path, flush_rows=1)
    s.add(rows("x", 0, 10.0, 1), "screen")
    s.add(rows("y", 1, 50.0, 1), "screen")    # the best screen value, never solved exactly
    s.add(rows("x", 0, 12.0, 2), "screen")    # the same architecture, phase 2: kept beside phase 1
    meta = {"models": [MODEL]}
    b = s.best(meta)
    assert b["common"]["arch_label"] == "x" and b["per_model"][MODEL]["throughput"] == 12.0
    assert len(s) == 3
    s.close(meta)
    t = pq.read_table(tmp_path / "evaluations.parquet").to_pylist()
    assert sorted((r["arch_key"], r["phase"], r["throughput"]) for r in t) == [
        ("x", 1, 10.0), ("x", 2, 12.0), ("y", 1, 50.0)]
    again = ResultStore(tmp_path)
    again.load()
    assert len(again) == 3 and again.best(meta)["common"]["arch_label"] == "x"


# ---------------------------------------------------------------------- on Ray
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Four architectures (one or two tensor cores, PE width 2 or 4) and the exhaustive ILP + DP over
    them through the Tune grid searcher; its schedule cache answers the screens' phase-2 slices."""
    from archplace.hardware.space import enumerate_space, load_space_config

    d = tmp_path_factory.mktemp("screen")
    p = d / "space.yaml"
    p.write_text(yaml.safe_dump({
        "architecture": {"num_tc": {"pow2": [0, 1]}, "num_vc": {"pow2": [1, 1]}, "pe_x": {"pow2": [1, 2]},
                         "pe_y": {"pow2": [1, 1]}, "glb_mb": {"pow2": [1, 1]}},
        "constraints": {"area_max_preset": "tpuv4", "area_min_fraction": 0.0}}))
    space = load_space_config(str(p))
    n = len(enumerate_space(space))
    assert n == 4
    settings = SearchSettings(models=(MODEL,), num_devices=64, global_batch=256, microbatches=(1,),
                              hbm_gb=(32,), space=space, ilp_budget=0.1)
    return {"dir": d, "settings": settings, "n": n, "cache": d / "schedule_cache.jsonl"}


@pytest.fixture(scope="module")
def exhaustive(ray_session, small):
    from archplace.platform.search import run_search

    out = small["dir"] / "grid"
    run_search(small["settings"], out, searcher="grid", budget=small["n"], schedule_cache=small["cache"],
               progress=False, report=False)
    rows = pq.read_table(out / "evaluations.parquet").to_pylist()
    by_index = {r["space_index"]: r["throughput"] for r in rows}
    assert len(by_index) == small["n"] and all(v > 0 for v in by_index.values())
    return by_index


def _screen(small, name, k, **kw):
    return run_screen(small["settings"], small["dir"] / name, top_k=k, schedule_cache=small["cache"],
                      progress=False, report=False, **kw)


def test_screen_equals_exhaustive_whenever_the_winner_is_within_top_k(small, exhaustive):
    win = min(exhaustive, key=lambda i: (-exhaustive[i], i))
    within = 0
    for k in (1, 2, small["n"]):
        res = _screen(small, f"k{k}", k)
        rows = pq.read_table(small["dir"] / f"k{k}" / "evaluations.parquet").to_pylist()
        p1 = {r["space_index"]: r["throughput"] for r in rows if r["phase"] == 1}
        p2 = {r["space_index"]: r["throughput"] for r in rows if r["phase"] == 2}
        order = sorted(p1, key=lambda i: (-p1[i], i))
        assert len(p1) == small["n"] and sorted(p2) == sorted(order[:k])   # no TPUv4 in this space
        assert all(p2[i] == pytest.approx(exhaustive[i], rel=1e-12) for i in p2)   # the same ILP + DP
        assert all(p2[i] >= p1[i] * (1 - 1e-9) for i in p2)   # the ILP never loses to sequential
        obj = res["stats"]["screen"]["per_objective"][MODEL]
        if order.index(win) < k:
            within += 1
            assert obj["winner_index"] == win
            assert res["per_model"][MODEL]["throughput"] == pytest.approx(exhaustive[win], rel=1e-12)
            assert res["common"]["throughput_avg"] == pytest.approx(exhaustive[win], rel=1e-12)
        assert obj["phase1_rank"] == order.index(obj["winner_index"])
    assert within >= 1


def test_resume_of_a_two_phase_search(small, exhaustive):
    name = "resumed"
    cancel = threading.Event()
    seen: list[dict] = []

    def hook(info):
        seen.append(info)
        cancel.set()                    # stop in phase 1, after its first architecture

    first = _screen(small, name, 2, workers=1, on_evaluated=hook, cancel=cancel)
    assert first["stats"]["cancelled"] and first["common"] is None
    assert seen[0]["phase"] == 1 and "phase2" not in first["stats"]
    with pytest.raises(ValueError, match="already holds a search"):
        _screen(small, name, 2)
    # resume, phase 1 only: the stored architectures are not screened again
    mid = _screen(small, name, 2, resume=True, phase2=False)
    kept = {(r["space_index"], r["finished_at"]) for r in _rows(small, name) if r["phase"] == 1}
    assert mid["stats"]["phase1"]["new"] == small["n"] - first["stats"]["phase1"]["new"]
    assert mid["stats"]["phase1"]["remaining"] == 0 and mid["common"] is None
    done = _screen(small, name, 2, resume=True)
    assert done["stats"]["phase1"]["new"] == 0 and done["stats"]["phase2"]["new"] == 2
    rows = _rows(small, name)
    assert {(r["space_index"], r["finished_at"]) for r in rows if r["phase"] == 1} == kept
    again = _screen(small, name, 2, resume=True)    # nothing left: no Ray work, the same answer
    assert again["stats"]["phase1"]["new"] == 0 and again["stats"]["phase2"]["new"] == 0
    straight = _screen(small, "straight", 2)
    for res in (done, again):
        assert res["common"]["arch_label"] == straight["common"]["arch_label"]
        assert res["common"]["throughput_avg"] == straight["common"]["throughput_avg"]
    with pytest.raises(ValueError, match="different settings"):
        run_screen(dataclasses.replace(small["settings"], hbm_gb=(64,)), small["dir"] / name, top_k=2,
                   resume=True, progress=False, report=False)


def _rows(small, name):
    return pq.read_table(small["dir"] / name / "evaluations.parquet").to_pylist()


def test_phase_marks_in_the_store(small, exhaustive):
    _screen(small, "marks", 1)
    rows = _rows(small, "marks")
    assert {r["phase"] for r in rows} == {1, 2}
    assert all(r["schedule"] == ("sequential" if r["phase"] == 1 else "ilp") for r in rows)
    assert sorted(r["space_index"] for r in rows if r["phase"] == 1) == list(range(small["n"]))
    (exact,) = [r for r in rows if r["phase"] == 2]
    best = json.loads((small["dir"] / "marks" / "best.json").read_text())
    assert best["searcher"] == "screen"
    assert best["common"]["arch_label"] == exact["arch_label"]
    assert best["per_model"][MODEL]["throughput"] == exact["throughput"]
    meta = json.loads((small["dir"] / "marks" / "search.json").read_text())
    assert meta["searcher"] == "screen"


def test_screen_inputs_are_one_line_errors(tmp_path):
    from archplace import api

    base = dict(models=(MODEL,), accelerators=64, global_batch=256, microbatches=(1,), hbm_gb=(32.0,))
    with pytest.raises(ValueError, match="screen_top_k.*screen searcher only"):
        api.SearchRequest(**base, searcher="phaze", screen_top_k=4).validate()
    with pytest.raises(ValueError, match="screen_top_k"):
        api.SearchRequest(**base, searcher="screen", screen_top_k=0).validate()
    s = SearchSettings(models=(MODEL,), num_devices=64, global_batch=256, microbatches=(1,), hbm_gb=(32,))
    with pytest.raises(ValueError, match="--schedule sequential: the screen searcher"):
        run_screen(dataclasses.replace(s, schedule="sequential"), tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="--screen-top-k must be an integer >= 1"):
        run_screen(s, tmp_path / "b", top_k=0, progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_screen_prune_gives_the_full_screens_answer(small, exhaustive, capsys):
    """``search --searcher screen --screen-prune`` (the flag reaches ``run_screen(prune=True)``): the same
    winner and throughput as the full screen, every architecture either screened or listed as pruned."""
    from archplace.cli import main

    out = small["dir"] / "cli-pruned"
    rc = main(["search", MODEL, "--searcher", "screen", "--screen-prune", "--screen-top-k", "1",
               "--space", str(small["dir"] / "space.yaml"), "--accelerators", "64", "--global-batch", "256",
               "--microbatches", "1", "--hbm", "32", "--ilp-budget", "0.1",
               "--schedule-cache", str(small["cache"]), "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    rec = json.loads((out / "screen_prune.json").read_text())
    assert rec["complete"] and rec["evaluated"] + rec["pruned"] == small["n"] and rec["top_k"] == 1
    assert f"pruned       {rec['pruned']:,} of {small['n']:,} architectures" in text
    full = _screen(small, "cli-full", 1)
    best = json.loads((out / "best.json").read_text())
    assert best["common"]["arch_label"] == full["common"]["arch_label"]
    assert best["common"]["throughput_avg"] == full["common"]["throughput_avg"]
    p1 = [r["space_index"] for r in _rows(small, "cli-pruned") if r["phase"] == 1]
    assert sorted(p1 + rec["pruned_index"]) == list(range(small["n"]))
    from archplace import api

    with pytest.raises(ValueError, match="screen_prune.*screen searcher only"):
        api.SearchRequest(models=(MODEL,), searcher="phaze", screen_prune=True).validate()
