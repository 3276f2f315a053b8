"""The Ray platform: `archplace search` end to end on the session's embedded Ray.

Values are checked against the plain in-process path (prepare_layers + sweep on the same
architecture), and the fault tests against an undisturbed run of the same search.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from archplace.platform.cli import main
from archplace.platform.trial import FAULT_ENV, SearchSettings, arch_key

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SMALL = SearchSettings(models=("bert-base",), num_devices=64, global_batch=256, microbatches=(1,),
                       hbm_gb=(32,), tmp_widths={"bert-base": (1, 2)}, ilp_time_limit_s=30.0)
CLI_SMALL = ["bert-base", "--accelerators", "64", "--global-batch", "256", "--microbatches", "1",
             "--hbm", "32", "--tmp-widths", "1,2", "--ilp-time-limit", "30"]


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
    keys = set()
    for r in rows:
        acc = space.accelerator(r["space_index"])
        assert r["arch_key"] == arch_key(acc) and r["is_reference"] == (r["space_index"] == 0)
        layers, _, _ = prepare_layers("bert-base", acc, (1,), (1, 2), 64, 256, time_limit_s=30.0,
                                      num_workers=1)
        best, _ = sweep(layers["ilp"], 64, 256, hbm_gb=(32,), recompute=(False, True))
        assert r["throughput"] == pytest.approx(best.throughput, rel=1e-9)
        assert (r["p"], r["d"], r["t"]) == (best.p, best.d, best.t)
        for t in (1, 2):
            g = build_graph("bert-base", mbs=1, tmp=t)
            est = estimate_graph(g, acc)
            keys |= set(plan_layer_schedules(g, est.single_s, est.all_s, acc.num_tc, acc.num_vc,
                                             time_limit_s=30.0).problems)
    # the shared cache: every distinct layer slice was solved exactly once across all trials
    assert sum(r["ilp_solved"] for r in rows) == len(keys)
    best = json.loads((out / "best.json").read_text())
    top = max(rows, key=lambda r: r["throughput"])
    assert best["common"]["arch_label"] == top["arch_label"]
    assert best["common"]["throughput_avg"] == pytest.approx(top["throughput"])
    assert best["reference"]["per_model"]["bert-base"]["throughput"] == pytest.approx(
        next(r["throughput"] for r in rows if r["is_reference"]))
    assert (out / "report.md").exists() and "Pareto" in (out / "report.md").read_text()
    assert res["stats"]["cache"]["solver_restarts"] == 0


def test_killed_solver_actor_does_not_change_the_result(baseline, tmp_path):
    import ray

    from archplace.platform.pools import NAMESPACE
    from archplace.platform.search import run_search

    out = tmp_path / "killed"
    killed = []

    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            try:
                prefix = json.loads((out / "search.json").read_text())["actor_prefix"]
                cache = ray.get_actor(f"{prefix}-cache", namespace=NAMESPACE)
                if ray.get(cache.stats.remote())["entries"] >= 1:  # trials are solving layer slices
                    ray.kill(ray.get_actor(f"{prefix}-solver-0", namespace=NAMESPACE))
                    killed.append(prefix)
                    return
            except Exception:
                pass
            time.sleep(0.05)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    res = run_search(SMALL, out, budget=3, workers=2, progress=False)
    th.join(timeout=5)
    assert killed, "the solver actor was never killed"
    assert res["stats"]["cache"]["solver_restarts"] >= 1
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


def test_resume_after_the_driver_is_killed(ray_session, tmp_path):
    from archplace.platform.search import run_search

    out = tmp_path / "resume"
    addr = ray_session.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "archplace.platform.cli", "search", *CLI_SMALL, "--budget", "3",
           "--workers", "1", "--out", str(out), "--address", addr, "--json"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (out / "evaluations.parquet").exists() and len(_rows(out)) >= 1:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    before = {r["arch_key"]: r for r in _rows(out)}
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


@pytest.mark.parametrize("args, message", [
    (["no-such-model"], "model 'no-such-model' unknown"),
    (["bert-base", "--budget", "0"], "--budget must be a positive"),
    (["bert-base", "--searcher", "anneal"], "--searcher 'anneal' unknown"),
    (["bert-base", "--address", "127.0.0.1:1"], "cannot reach a Ray cluster"),
    (["bert-base", "--address", "nonsense"], "--address must be 'auto' or HOST:PORT"),
    (["bert-base", "--microbatches", "3", "--global-batch", "256"], "none of [3] divides"),
])
def test_bad_input_is_one_line(args, message, tmp_path, capsys):
    rc = main(["search", *args, "--out", str(tmp_path / "o")])
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
