"""`archplace search` on a real Ray (issue 29): a failure after Ray's start-up leaves nothing that
refuses the corrected command; Ctrl-C exits 130 and ``--resume`` completes; Tune's logs hold no rows;
solved layer slices reach the schedule cache while their architecture is still being evaluated;
without ``--address`` a search starts its own Ray beside a live ``ray start`` cluster; and attaching
to a token-auth cluster without the token is one line."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from archplace.cli import main
from archplace.platform.store import ResultStore

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SEQ = ["bert-base", "--devices", "64", "--global-batch", "256", "--microbatches", "1", "--hbm", "32",
       "--schedule", "sequential", "--searcher", "grid"]
ILP = ["bert-base", "--devices", "64", "--global-batch", "256", "--microbatches", "1", "--hbm", "32",
       "--tmp-widths", "1,2", "--searcher", "grid"]


def _env(auth: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a search subprocess: no RAY_* variable (no RAY_ADDRESS to follow), except,
    with ``auth``, the token settings the session's Ray was started with (to attach to it)."""
    env = {k: v for k, v in os.environ.items() if k != "ARCHPLACE_FAULT_INJECT"
           and (not k.startswith("RAY_") or (auth and k.startswith("RAY_AUTH")))}
    return {**env, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "archplace.cli", "search", *args]


def _stored(out: Path) -> list[dict]:
    """The rows of a search directory in whatever state its store is (parts, log or compacted)."""
    if not (out / "search.json").exists():
        return []
    s = ResultStore(out)
    s.load()
    return s.rows


def _wait(pred, proc: subprocess.Popen, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the search exited ({proc.returncode}) before {what}: "
                                 f"{proc.stderr.read().decode()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} after {timeout} s")


# ---------------------------------------------------------------------- a late failure
def test_failure_after_ray_started_leaves_no_search_json(ray_session, tmp_path, capsys):
    """Old: a new search that failed after writing search.json (here: the model graphs not built
    within ``--wait-timeout``; in the issue, ``--tmp-widths 3`` in the graph task) left it behind,
    and the corrected command was refused with "already holds a search; pass --resume"."""
    out = tmp_path / "o"
    rc = main(["search", *SEQ, "--max-archs", "1", "--out", str(out), "--wait-timeout", "0.001"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "did not finish within 0 s" in err and len(err.splitlines()) == 1, err
    assert not (out / "search.json").exists() and not (out / "best.json").exists()
    assert main(["search", *SEQ, "--max-archs", "1", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluated"] == 1


# ---------------------------------------------------------------------- Ctrl-C, then --resume
BUDGET = 6


@pytest.fixture(scope="module")
def interrupted(ray_session, tmp_path_factory):
    """A search started as a user would (its own Ray), each architecture slowed to 2 s, sent SIGINT
    (to its process group, as a terminal's Ctrl-C is) once its first row is stored; then resumed."""
    out = tmp_path_factory.mktemp("ctrl-c") / "o"
    proc = subprocess.Popen(_cli(*SEQ, "--max-archs", str(BUDGET), "--workers", "1", "--out", str(out)),
                            cwd=REPO, env=_env(ARCHPLACE_FAULT_INJECT="slow:*:2"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait(lambda: len(_stored(out)) >= 1, proc, "a first row")
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    before = _stored(out)
    resumed = main(["search", *SEQ, "--max-archs", str(BUDGET), "--out", str(out), "--resume", "--json"])
    return {"out": out, "rc": proc.returncode, "stdout": stdout.decode(), "stderr": stderr.decode(),
            "before": before, "resumed_rc": resumed}


@pytest.mark.system
def test_ctrl_c_exits_130_and_keeps_the_rows(interrupted):
    """Old: Tune's SIGINT handler ended the run as if it had finished: exit 0 and the normal summary,
    with no word that the search was cut short."""
    assert interrupted["rc"] == 130, interrupted["stderr"][-3000:]
    last = interrupted["stderr"].strip().splitlines()[-1]
    assert last == "archplace search: stopped by SIGINT, resume with --resume"
    assert "Traceback" not in interrupted["stderr"] and interrupted["stdout"] == ""
    assert 1 <= len(interrupted["before"]) < BUDGET


@pytest.mark.system
def test_resume_after_ctrl_c_completes_and_keeps_what_finished(interrupted):
    assert interrupted["resumed_rc"] == 0
    after = {r["arch_key"]: r for r in pq.read_table(interrupted["out"] / "evaluations.parquet").to_pylist()}
    assert len(after) == BUDGET and all(r["status"] == "ok" for r in after.values())
    for r in interrupted["before"]:   # evaluated once: the rows stored before Ctrl-C are kept as they were
        assert after[r["arch_key"]]["trial_id"] == r["trial_id"]
        assert after[r["arch_key"]]["finished_at"] == r["finished_at"]


@pytest.mark.system
def test_tune_logs_hold_no_rows(interrupted):
    """Old: every row went to Tune in the result (``rows_json``) and Tune wrote it again into
    result.json, progress.csv, a TensorBoard file and its experiment state, and the callback's
    closure pickled the store into tuner.pkl: OUT/tune was about 150x evaluations.parquet. Now no
    file under OUT/tune holds a row; what is left is a fixed cost per run (the pickled searcher,
    whose search space is the bulk), not a cost per row."""
    out = interrupted["out"]
    files = [p for p in (out / "tune").rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert not names & {"result.json", "progress.csv"} and not any(n.startswith("events.out") for n in names)
    rows = pq.read_table(out / "evaluations.parquet").to_pylist()
    needles = [b"stages_json", b"rows_json", b"solved_json"] + [r["stages_json"].encode() for r in rows]
    for p in files:
        data = p.read_bytes()
        assert not [n for n in needles if n in data], p
    # what is left is per run and per trial, not per row: Tune's experiment state (about 10 KB per
    # trial), and the searcher's state twice (tuner.pkl, searcher-state-*.pkl; tuner.pkl held the
    # whole search space too, 1.7 MB for the Phaze space)
    runs = sorted({p.relative_to(out / "tune").parts[0] for p in files})
    assert len(runs) == 2   # the interrupted run and the resume
    trials = 0
    for run in runs:
        state = max((out / "tune" / run).glob("experiment_state-*.json"))
        trials += len(json.loads(state.read_text())["trial_data"])
    tuner = [p.stat().st_size for p in files if p.name == "tuner.pkl"]
    state_bytes = sum(p.stat().st_size for p in files if not p.name.endswith(".pkl"))
    total = sum(p.stat().st_size for p in files)
    parquet = (out / "evaluations.parquet").stat().st_size
    print(f"OUT/tune {total} bytes: tuner.pkl {tuner}, {state_bytes} bytes of state for {trials} trials; "
          f"evaluations.parquet {parquet} bytes")
    assert max(tuner) < 400_000
    assert state_bytes < 16_000 * trials


# ---------------------------------------------------------------------- the schedule cache
@pytest.mark.system
def test_slices_reach_the_schedule_cache_before_their_architecture_finishes(ray_session, tmp_path):
    """Old: a trial sent the slices it solved with the architecture's rows, at its end, so a driver
    killed meanwhile lost them and the resume solved them all again (no cache hits). Here the
    architecture sleeps after its ILPs (fault ``slowdp``), the driver is SIGKILLed once the cache
    holds slices, and the resume answers every one of them from the cache."""
    out = tmp_path / "o"
    gcs = ray_session.get_runtime_context().gcs_address
    proc = subprocess.Popen(_cli(*ILP, "--max-archs", "1", "--out", str(out), "--address", gcs, "--json"),
                            cwd=REPO, env=_env(auth=True, ARCHPLACE_FAULT_INJECT="slowdp:*:600"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    cache = out / "schedule_cache.jsonl"
    lines = {"n": 0, "since": time.monotonic()}

    def settled() -> bool:
        """Slices in the cache, and no more for 10 s (the ILP phase's last report is forced)."""
        n = len(cache.read_text().splitlines()) if cache.exists() else 0
        if n != lines["n"]:
            lines.update(n=n, since=time.monotonic())
        return n > 1 and time.monotonic() - lines["since"] > 10

    try:
        _wait(settled, proc, "solved slices in the schedule cache")
        assert _stored(out) == []   # the architecture itself has not finished
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    cached = [json.loads(line)[0] for line in cache.read_text().splitlines()[1:]]
    from archplace.platform.search import run_search
    from archplace.platform.trial import SearchSettings

    s = SearchSettings(models=("bert-base",), num_devices=64, global_batch=256, microbatches=(1,),
                       hbm_gb=(32,), tmp_widths={"bert-base": (1, 2)})
    res = run_search(s, out, searcher="grid", budget=1, resume=True, progress=False, report=False)
    (row,) = pq.read_table(out / "evaluations.parquet").to_pylist()
    assert res["stats"]["cache_loaded"] == len(set(cached)) > 0
    # every slice solved before the kill is a hit now, and only the rest is solved again
    assert row["cache_hits"] == len(set(cached))
    assert row["ilp_solved"] + row["cache_hits"] == row["ilp_unique"]
    print(f"slices: {row['ilp_unique']} distinct, {row['cache_hits']} from the cache after the kill")


# ---------------------------------------------------------------------- a `ray start` cluster beside
@pytest.fixture(scope="module")
def ray_start_cluster(tmp_path_factory):
    """``ray start --head`` with token authentication on 127.0.0.1, its temp dir private through
    ``RAY_TMPDIR`` (so it records itself in $RAY_TMPDIR/ray/ray_current_cluster, as a plain ``ray
    start`` does in /tmp/ray, without touching the machine's other Ray users). Stopped by killing
    exactly its processes (``cluster_util.stop_cluster``), never a machine-wide ``ray stop``."""
    from cluster_util import _free_ports, _node_port_args, _popen, ray_executable, stop_cluster

    ray = ray_executable()
    assert ray is not None, "the `ray` executable was not found"  # a dependency: fail, not skip
    logs = tmp_path_factory.mktemp("ray-start")
    tmp = Path(tempfile.mkdtemp(prefix="aprs-", dir="/tmp"))   # short: Unix socket paths
    token = secrets.token_hex(32)
    env = _env(RAY_TMPDIR=str(tmp), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    gcs, client, *node = _free_ports(8)
    head = _popen([ray, "start", "--head", "--block", "--port", str(gcs), "--num-cpus", "1",
                   "--include-dashboard", "false", "--ray-client-server-port", str(client),
                   *_node_port_args(node), "--node-ip-address", "127.0.0.1",
                   "--object-store-memory", str(300 * 2**20), "--disable-usage-stats"],
                  env, logs / "head.log")
    try:
        marker = tmp / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert head.poll() is None and time.monotonic() < deadline, \
                (logs / "head.log").read_text()[-3000:]
            time.sleep(0.5)
        yield {"gcs": f"127.0.0.1:{gcs}", "env": env, "tmp": tmp}
    finally:
        stop_cluster([head], str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.system
def test_search_without_address_does_not_join_a_ray_start_cluster(ray_start_cluster, tmp_path):
    """Old: ``ray.init()`` without an address reads the address a ``ray start`` recorded (and
    RAY_ADDRESS), so a search without ``--address`` silently joined that cluster, which may span
    other machines, instead of starting its own loopback-only Ray."""
    c = ray_start_cluster
    # the situation: a plain ray.init() here joins the cluster
    probe = subprocess.run([sys.executable, "-c", "import json, ray; ray.init(logging_level='ERROR'); "
                            "print(json.dumps([ray.get_runtime_context().gcs_address, "
                            "[n['NodeID'] for n in ray.nodes()]]))"],
                           env=c["env"], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    joined_gcs, cluster_nodes = json.loads(probe.stdout.strip().splitlines()[-1])
    assert joined_gcs.endswith(c["gcs"].rpartition(":")[2])
    out = tmp_path / "o"
    run = subprocess.run(_cli(*SEQ, "--max-archs", "1", "--out", str(out), "--json"), cwd=REPO, env=c["env"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = pq.read_table(out / "evaluations.parquet").to_pylist()
    assert row["node_id"] and row["node_id"] not in cluster_nodes
    assert not set(row["task_nodes"].split(",")) & set(cluster_nodes)


@pytest.mark.system
def test_address_without_the_token_is_one_line(ray_start_cluster, tmp_path):
    """Old: Ray's C++ client wrote about 20 ``gcs_client.cc`` warnings (one per failed handshake)
    to the terminal before the one-line error."""
    c = ray_start_cluster
    env = {k: v for k, v in c["env"].items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    run = subprocess.run(_cli(*SEQ, "--max-archs", "1", "--out", str(tmp_path / "o"), "--address", c["gcs"]),
                         cwd=REPO, env={**env, "HOME": str(tmp_path)},   # no ~/.ray/auth_token either
                         capture_output=True, text=True, timeout=600)
    # the status lines that name each phase ("archplace search [0:02] attaching to ...") come first
    status = re.compile(r"archplace search \[\d+:\d\d")
    err = "\n".join(ln for ln in run.stderr.strip().splitlines() if not status.match(ln))
    assert run.returncode == 2 and len(err.splitlines()) == 1, run.stderr[-3000:]
    assert err.startswith(f"archplace search: error: --address {c['gcs']}: the cluster refused")
    assert "token" in err
    assert not (tmp_path / "o" / "search.json").exists()
