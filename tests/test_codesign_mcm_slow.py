"""The slow co-design MCM tests (split from test_codesign_mcm.py so `make test`'s two workers balance):
resume after a SIGKILLed driver, and the embedded answer equal to a two-node cluster's."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_codesign_mcm import GPT2, REPO, _space

from archplace import api
from archplace.platform.codesign import CodesignStore


def _stored(out: Path) -> list[dict]:
    if not (out / "search.json").exists():
        return []
    s = CodesignStore(out, "mcm")
    s.load()
    return s.rows


@pytest.mark.slow   # about 40 s: the killed driver starts its own Ray
@pytest.mark.system
def test_resume_after_a_killed_driver(ray_session, tmp_path):
    """The CLI driver (its own Ray) is SIGKILLed once its first design is stored (each design slowed to
    2 s); --resume evaluates only the rest and keeps the stored rows as they were."""
    out = tmp_path / "o"
    space = tmp_path / "space.json"
    space.write_text(json.dumps(_space(num_chiplets=[4, 8, 16])))   # JSON is YAML
    argv = [sys.executable, "-m", "archplace.cli", "search", "--target", "mcm", "--hf-config",
            str(REPO / "tests/data/small_gpt2_config.json"), "--space", str(space), "--searcher", "grid",
            "--budget", "3", "--placer", "greedy", "--workers", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "ARCHPLACE_FAULT_INJECT": "slow:*:2"}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _stored(out):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no first row"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    before = _stored(out)
    assert 1 <= len(before) < 3
    res = api.search(api.SearchRequest(models=(GPT2,), target="mcm", out_dir=str(out), space=str(space),
                                       searcher="grid", budget=3, placer="greedy", resume=True))
    assert res.evaluated == 3 and res.stats["resumed"] == len(before)
    after = {r["arch_key"]: r for r in pq.read_table(out / "evaluations.parquet").to_pylist()}
    assert len(after) == 3 and all(r["status"] == "ok" for r in after.values())
    for r in before:
        assert after[r["arch_key"]]["trial_id"] == r["trial_id"]
        assert after[r["arch_key"]]["finished_at"] == r["finished_at"]
    with pytest.raises(ValueError, match="different settings"):
        api.search(api.SearchRequest(models=(GPT2,), target="mcm", out_dir=str(out), space=str(space),
                                     searcher="grid", budget=3, placer="cpsat", resume=True))


# ---------------------------------------------------------------------- --address: a real two-node cluster
# `make test-system` (CI runs it): the search's --address path itself is covered on a two-node cluster by
# tests/test_cluster.py; this check adds that the MCM target's rows are the same there.
@pytest.mark.slow
@pytest.mark.system
def test_address_on_a_two_node_cluster_gives_the_embedded_answer(ray_session, tmp_path):
    """The same search through ``--address`` on a two-node cluster (token auth on) and on the test's
    embedded Ray: the same packages, throughputs and partitions (deterministic placer budgets)."""
    from cluster_util import ray_executable, two_node_cluster

    assert ray_executable() is not None, "the `ray` executable is not installed"  # a dependency: fail
    space = tmp_path / "space.json"
    space.write_text(json.dumps(_space(num_chiplets=[4, 8, 16])))
    opts = ["--space", str(space), "--searcher", "grid", "--budget", "3", "--placer", "greedy+lns",
            "--subsolves", "2", "--det-time", "0.1"]
    with two_node_cluster(tmp_path / "cluster", head_cpus=2, worker_cpus=2) as c:
        argv = [sys.executable, "-m", "archplace.cli", "search", "--target", "mcm", "--hf-config",
                str(REPO / "tests/data/small_gpt2_config.json"), *opts, "--address", c.gcs_address,
                "--out", str(tmp_path / "cluster-out"), "--json"]
        env = {**c.env, "PYTHONPATH": str(REPO)}
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
    remote = json.loads(done.stdout)
    local = api.search(api.SearchRequest(models=(GPT2,), target="mcm", out_dir=str(tmp_path / "local"),
                                         space=str(space), searcher="grid", budget=3, placer="greedy+lns",
                                         subsolves=2, det_time=0.1)).to_dict()
    assert remote["evaluated"] == local["evaluated"] == 3
    assert remote["common"]["per_model"] == local["common"]["per_model"]
    assert remote["pareto"] == local["pareto"]

    def table(d):
        rows = pq.read_table(d / "evaluations.parquet").to_pylist()
        return {r["arch_key"]: (r["throughput"], r["partition_json"], r["subsolves"]) for r in rows}

    assert table(tmp_path / "cluster-out") == table(tmp_path / "local")
