"""The Ray platform: `archplace search` end to end on the session's embedded Ray.

Values are checked against the plain in-process path (prepare_layers + sweep on the same
architecture), and the fault tests against an undisturbed run of the same search.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from archplace.cli import main
from archplace.platform.trial import FAULT_ENV, SearchSettings, arch_key

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SMALL = SearchSettings(models=("bert-base",), num_devices=64, global_batch=256, microbatches=(1,),
                       hbm_gb=(32,), tmp_widths={"bert-base": (1, 2)})
CLI_SMALL = ["bert-base", "--devices", "64", "--global-batch", "256", "--microbatches", "1",
             "--hbm", "32", "--tmp-widths", "1,2"]


def _rows(out: Path) -> list[dict]:
    return pq.read_table(out / "evaluations.parquet").to_pylist()


@pytest.fixture(scope="module")
def baseline(ray_session, tmp_path_factory):
    from archplace.platform.search import run_search

    out = tmp_path_factory.mktemp("baseline")
    res = run_search(SMALL, out, budget=3, workers=2, progress=False)
    return out, res


def test_search_matches_the_in_process_path(baseline):
    from archplace.algorithms.solvers.layer_ilp import plan_layer_schedules
    from archplace.algorithms.solvers.throughput import prepare_layers, sweep
    from archplace.hardware.space import enumerate_space
    from archplace.simulators.estimate import estimate_graph
    from archplace.workloads.models import build_graph

    out, res = baseline
    rows = _rows(out)
    space = enumerate_space()
    # Phaze order: the three largest areas, TPUv4 first among them
    assert sorted(r["space_index"] for r in rows) == [0, 1, 2]
    assert all(r["status"] == "ok" for r in rows)
    for r in rows:
        acc = space.accelerator(r["space_index"])
        assert r["arch_key"] == arch_key(acc) and r["is_reference"] == (r["space_index"] == 0)
        layers, _, _ = prepare_layers("bert-base", acc, (1,), (1, 2), 64, 256, num_workers=1,
                                      **SMALL.ilp_settings())
        best, _ = sweep(layers["ilp"], 64, 256, hbm_gb=(32,), recompute=(False, True))
        # bit for bit: both paths stop every slice on the same deterministic budget
        assert r["throughput"] == best.throughput
        assert (r["p"], r["d"], r["t"]) == (best.p, best.d, best.t)
        lookups, keys = 0, set()
        for t in (1, 2):
            g = build_graph("bert-base", mbs=1, tmp=t)
            est = estimate_graph(g, acc)
            plan = plan_layer_schedules(g, est.single_s, est.all_s, acc.num_tc, acc.num_vc, est.hbm_share,
                                        est.glb_share, **SMALL.ilp_settings())
            lookups += plan.lookups
            keys |= set(plan.problems)
        # the two cache numbers: repeated layers inside the architecture, and distinct slices that
        # were answered without a solve; every distinct slice is either solved or a hit
        assert r["ilp_lookups"] == lookups and r["ilp_unique"] == len(keys)
        assert r["ilp_solved"] + r["cache_hits"] == r["ilp_unique"]
    c = res["stats"]["cache"]
    assert c["layer_lookups"] == sum(r["ilp_lookups"] for r in rows)
    assert c["within_arch_dedup"] == sum(r["ilp_lookups"] - r["ilp_unique"] for r in rows)
    best = json.loads((out / "best.json").read_text())
    top = max(rows, key=lambda r: r["throughput"])
    assert best["common"]["arch_label"] == top["arch_label"]
    assert best["common"]["throughput_avg"] == pytest.approx(top["throughput"])
    assert best["reference"]["per_model"]["bert-base"]["throughput"] == pytest.approx(
        next(r["throughput"] for r in rows if r["is_reference"]))
    assert (out / "report.md").exists() and "Pareto" in (out / "report.md").read_text()
    # compacted: one table, no part files or write-ahead log left
    assert not list((out / "evaluations").glob("part-*.parquet")) if (out / "evaluations").exists() else True
    # the schedule cache on disk holds every solved slice, with its status, gap, stop reason and dtime
    cached = (out / "schedule_cache.jsonl").read_text().splitlines()
    assert len(cached) - 1 == sum(r["ilp_solved"] for r in rows)
    assert all(len(json.loads(line)) == 6 for line in cached[1:])
    # each row: every distinct slice's solver status and gap, and the worst gap over them
    for r in rows:
        counts, slices = json.loads(r["ilp_status"]), json.loads(r["ilp_slices_json"])
        assert len({s["key"] for s in slices}) == r["ilp_unique"]
        assert sum(counts.values()) == len(slices) >= r["ilp_unique"]   # a slice shared by two cases: twice
        assert set(counts) <= {"optimal", "feasible", "fallback", "trivial"}
        assert {(s["microbatch"], s["tmp"]) for s in slices} == {(1, 1), (1, 2)}
        assert all(1 <= len(s["layers"]) <= 2 and s["num_layers"] >= len(s["layers"]) for s in slices)
        # the layers that share the slices are layer lookups of the row
        assert r["ilp_unique"] <= sum(s["num_layers"] for s in slices) <= r["ilp_lookups"]
        gaps = [s["gap"] for s in slices if s["gap"] is not None]
        assert r["ilp_worst_gap"] == max(gaps) if gaps else math.isnan(r["ilp_worst_gap"])
        assert r["ilp_gap_unknown"] == sum(1 for s in slices if s["gap"] is None
                                           and s["status"] not in ("optimal", "trivial"))
        stops = json.loads(r["ilp_stopped_by"])
        assert stops == {k: sum(s["stopped_by"] == k for s in slices) for k in stops}
        assert sum(stops.values()) == len(slices) and r["ilp_load_dependent"] == 0
    per = best["per_model"]["bert-base"]
    assert sum(per["ilp_status"].values()) > 0 and "ilp_worst_gap" in per
    overall = res["stats"]["ilp"]
    assert overall["status_counts"] == {k: sum(json.loads(r["ilp_status"]).get(k, 0) for r in rows)
                                        for k in overall["status_counts"]}
    assert overall["worst_gap"] == max(r["ilp_worst_gap"] for r in rows)
    assert overall["stopped_by"] == {k: sum(json.loads(r["ilp_stopped_by"]).get(k, 0) for r in rows)
                                     for k in overall["stopped_by"]}
    assert overall["load_dependent"] == 0


def test_resume_reuses_the_schedule_cache(baseline, tmp_path):
    """A search given the baseline's schedule cache solves nothing it already solved."""
    from archplace.platform.search import run_search

    res = run_search(SMALL, tmp_path / "again", budget=3, workers=2, progress=False, report=False,
                     schedule_cache=baseline[0] / "schedule_cache.jsonl")
    rows = _rows(tmp_path / "again")
    assert sum(r["ilp_solved"] for r in rows) == 0
    assert res["stats"]["cache"]["cross_trial_hits"] == sum(r["ilp_unique"] for r in rows) > 0
    assert {r["arch_key"]: r["throughput"] for r in rows} == pytest.approx(
        {r["arch_key"]: r["throughput"] for r in _rows(baseline[0])}, rel=1e-9)


def _solver_workers() -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if any("ray::solve_task" in a for a in (p.info["cmdline"] or []))]


def test_killed_solver_worker_does_not_change_the_result(baseline, tmp_path):
    """A worker process SIGKILLed while it solves layer slices: Ray re-executes the task."""
    from archplace.platform.search import run_search

    out = tmp_path / "killed"
    killed = []

    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for p in _solver_workers():
                try:
                    p.kill()
                    killed.append(p.pid)
                    return
                except Exception:
                    pass
            time.sleep(0.02)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    res = run_search(SMALL, out, budget=3, workers=2, progress=False, report=False)
    th.join(timeout=5)
    assert killed, "no solver task was ever seen running"
    assert res["stats"]["trial_errors"] == 0   # the task was retried, not the trial
    base = json.loads((baseline[0] / "best.json").read_text())
    assert res["common"]["arch_label"] == base["common"]["arch_label"]
    assert res["common"]["throughput_avg"] == pytest.approx(base["common"]["throughput_avg"], rel=1e-9)
    assert {r["arch_key"]: r["throughput"] for r in _rows(out)} == pytest.approx(
        {r["arch_key"]: r["throughput"] for r in _rows(baseline[0])}, rel=1e-9)


def test_failing_architecture_is_recorded_and_flaky_one_retried(ray_session, tmp_path, monkeypatch):
    from archplace.hardware.space import enumerate_space
    from archplace.platform.search import run_search

    space = enumerate_space()
    bad, flaky = arch_key(space.accelerator(1)), arch_key(space.accelerator(2))
    monkeypatch.setenv(FAULT_ENV, f"fail:{bad},flaky:{flaky}:1")
    res = run_search(SMALL, tmp_path, budget=3, workers=2, max_failures=1, progress=False)
    rows = {r["arch_key"]: r for r in _rows(tmp_path)}
    assert len(rows) == 3
    assert rows[bad]["status"] == "failed" and "injected failure" in rows[bad]["error"]
    assert rows[bad]["throughput"] == 0.0
    assert rows[flaky]["status"] == "ok" and rows[flaky]["throughput"] > 0
    assert (tmp_path / ".faults" / flaky).read_text() == "2"  # failed once, retried once
    assert res["failed"] == 1 and res["evaluated"] == 3
    assert "injected failure" in (tmp_path / "report.md").read_text()

    # --resume --retry-failed: exactly the failed architecture runs again (now without the fault)
    monkeypatch.delenv(FAULT_ENV)
    before = {r["arch_key"]: r for r in _rows(tmp_path)}
    res = run_search(SMALL, tmp_path, budget=3, workers=2, resume=True, retry_failed=True, progress=False)
    after = {r["arch_key"]: r for r in _rows(tmp_path)}
    assert res["stats"]["retried"] == 1 and res["failed"] == 0 and res["evaluated"] == 3
    assert after[bad]["status"] == "ok" and after[bad]["trial_id"] != before[bad]["trial_id"]
    for k in (arch_key(space.accelerator(0)), flaky):
        assert after[k]["trial_id"] == before[k]["trial_id"]
        assert after[k]["finished_at"] == before[k]["finished_at"]
    assert after[bad]["order"] == before[bad]["order"]


def _alive_actors_of_other_jobs(ray_session) -> dict[str, str]:
    """Alive actors that the test process's own job does not own (the GCS's actor table, read
    directly: the session's Ray runs without the dashboard that the state API needs)."""
    from ray._private import state

    me = ray_session.get_runtime_context().get_job_id()
    return {a: v["ActorClassName"] for a, v in state.actors().items()
            if v["State"] == "ALIVE" and v["JobID"] != me}


def _start_driver(ray_session, out: Path, *extra: str) -> subprocess.Popen:
    addr = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "archplace.cli", "search", *CLI_SMALL, "--out", str(out),
           "--address", addr, "--json", *extra]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _wait_rows(proc, out: Path, n: int, timeout: float = 300) -> None:
    from archplace.platform.store import ResultStore

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (out / "search.json").exists():
            s = ResultStore(out)
            s.load()
            if len(s) >= n:
                return
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} rows in {out} after {timeout} s")


@pytest.mark.system
def test_killed_driver_leaves_nothing_and_resume(ray_session, baseline, tmp_path, capsys):
    from archplace.platform.search import run_search

    out = tmp_path / "resume"
    before_actors = _alive_actors_of_other_jobs(ray_session)
    proc = _start_driver(ray_session, out, "--max-archs", "3", "--workers", "1")
    try:
        _wait_rows(proc, out, 1)
        # a second driver on the same --out is refused while the first one lives
        assert main(["search", *CLI_SMALL, "--max-archs", "3", "--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err.strip()
        assert "is in use by another search" in err and len(err.splitlines()) == 1
        # a resume elsewhere (of a copy of the baseline, nothing left to do) leaves the live search alone
        live = set(_alive_actors_of_other_jobs(ray_session)) - set(before_actors)
        assert live, "the live search has no actors"
        other = tmp_path / "other"
        shutil.copytree(baseline[0], other)
        again = run_search(SMALL, other, budget=3, resume=True, progress=False, report=False)
        assert again["stats"]["new_trials"] == 0
        assert live <= set(_alive_actors_of_other_jobs(ray_session))
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    # the dead driver's actors (Tune's trial actors) die with it: nothing is detached
    deadline = time.monotonic() + 60
    left = {}
    while time.monotonic() < deadline:
        left = {a: c for a, c in _alive_actors_of_other_jobs(ray_session).items() if a not in before_actors}
        if not left:
            break
        time.sleep(1)
    assert not left, f"actors still alive 60 s after the driver was killed: {left}"

    before = {r["arch_key"]: r for r in _rows_any(out)}
    assert 1 <= len(before) < 3
    res = run_search(SMALL, out, budget=3, workers=2, resume=True, progress=False)
    after = {r["arch_key"]: r for r in _rows(out)}
    assert len(after) == 3 and res["stats"]["resumed"] == len(before)
    for k, r in before.items():  # finished evaluations are kept as they were, not re-run
        assert after[k]["trial_id"] == r["trial_id"] and after[k]["finished_at"] == r["finished_at"]
    assert sorted(r["space_index"] for r in after.values()) == [0, 1, 2]
    assert len({r["trial_id"] for r in after.values()}) == 3
    # nothing left to do: a second resume evaluates no architecture
    again = run_search(SMALL, out, budget=3, resume=True, progress=False)
    assert again["stats"]["new_trials"] == 0 and again["evaluated"] == 3


def _rows_any(out: Path) -> list[dict]:
    """Rows of a search directory whatever state its store is in (a killed driver leaves part
    files and a write-ahead log, not the compacted table)."""
    from archplace.platform.store import ResultStore

    s = ResultStore(out)
    s.load()
    return s.table().to_pylist()


@pytest.mark.system
def test_embedded_ray_listens_on_loopback_only_and_runs_on_one_cpu(tmp_path):
    """The embedded Ray binds 127.0.0.1 only, and a search completes on a 1-CPU Ray (trials reserve
    no CPU, so the tasks' CPU is never short by a trial's fraction)."""
    code = ("import json, psutil, ray; from archplace.platform.search import connect, run_search; "
            "from archplace.platform.trial import SearchSettings; connect(None, num_cpus=1); "
            "print(ray.get_runtime_context().gcs_address); "
            "print(json.dumps(sorted({c.laddr.ip for p in psutil.Process().children(recursive=True) "
            "for c in p.net_connections('tcp') if c.status == 'LISTEN'}))); "
            "s = SearchSettings(models=('bert-base',), num_devices=64, global_batch=256, microbatches=(1,), "
            "hbm_gb=(32,), schedule='sequential'); "
            f"r = run_search(s, {str(tmp_path / 'one')!r}, searcher='grid', budget=2, progress=False, "
            "report=False, wait_timeout_s=60, task_timeout_s=120); print(r['evaluated']); ray.shutdown()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    gcs, ips, evaluated = out.stdout.strip().splitlines()[-3:]
    assert gcs.startswith("127.0.0.1:"), out.stdout
    ips = json.loads(ips)
    assert ips and set(ips) <= {"127.0.0.1", "::ffff:127.0.0.1"}, ips
    assert evaluated == "2"


@pytest.mark.parametrize("args, message", [
    (["no-such-model"], "model 'no-such-model' unknown"),
    (["bert-base", "--max-archs", "0"], "--max-archs: must be at least 1"),
    (["bert-base", "--searcher", "anneal"], "--searcher 'anneal' unknown"),
    (["bert-base", "--address", "127.0.0.1:1"], "cannot reach a Ray cluster"),
    (["bert-base", "--address", "nonsense"], "--address must be 'auto' or HOST:PORT"),
    (["bert-base", "--microbatches", "3", "--global-batch", "256"], "none of [3] divides"),
])
def test_bad_input_is_one_line(args, message, tmp_path, capsys):
    try:
        rc = main(["search", *args, "--out", str(tmp_path / "o")])
    except SystemExit as e:  # refused while parsing (one line too)
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1


def test_empty_space_and_occupied_out_dir(tmp_path, capsys):
    yml = tmp_path / "empty.yaml"
    yml.write_text("architecture:\n  num_tc: [1]\n  num_vc: [2]\n  pe_x: [2]\n  pe_y: [2]\n  glb_mb: [2]\n"
                   "constraints:\n  area_min_fraction: 0.9\n")
    rc = main(["search", "bert-base", "--space", str(yml), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "no architecture within the area constraint" in err and len(err.splitlines()) == 1
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "search.json").write_text(json.dumps({"settings": {}}))
    rc = main(["search", "bert-base", "--out", str(occupied)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "already holds a search; pass --resume" in err
    rc = main(["search", "bert-base", "--out", str(occupied), "--resume"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "different settings" in err


def test_report_command_errors_cleanly(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_settings_round_trip():
    s = SearchSettings.from_dict(json.loads(json.dumps(SMALL.to_dict())))
    assert s == SMALL
    assert s.cases("bert-base") == [(1, 1), (1, 2)]
    assert np.isfinite(s.link_bw_bytes_per_s)
