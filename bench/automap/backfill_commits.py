"""Give the cached runs that predate per-run commit recording their commit (``_meta.backfill_commits``).

    python bench/automap/backfill_commits.py

Reads ``bench/automap/results/pipeline_eval_runs.json`` and ``pipeline_nstep_runs.json`` (keyed by
``bench/automap/pipeline.py``'s code version) and ``rl_tune_runs.json`` (``bench/platform/rl_tune.py``'s),
sets each
run's ``commit`` to the oldest commit whose source has the run's code version, marks its command as not
recorded, and writes the files back. Runs that already record a commit are left as they are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))  # rl_tune
import pipeline  # noqa: E402
import rl_tune  # noqa: E402
from _meta import backfill_commits  # noqa: E402

BENCH = Path(__file__).resolve().parents[1]
FILES = {"pipeline_eval_runs.json": pipeline.CODE, "pipeline_nstep_runs.json": pipeline.CODE,
         "rl_tune_runs.json": rl_tune.CODE}
RESULTS = {"pipeline_eval_runs.json": BENCH / "automap" / "results", "pipeline_nstep_runs.json":
           BENCH / "automap" / "results", "rl_tune_runs.json": BENCH / "platform" / "results"}


def main() -> None:
    for name, modules in FILES.items():
        path = RESULTS[name] / name
        cache = json.loads(path.read_text())
        n = backfill_commits(cache, modules)
        if n:
            path.write_text(json.dumps(cache, indent=1 if name.startswith("rl_tune") else None))
        missing = sum(1 for v in cache.values() if isinstance(v, dict) and v.get("commit") is None)
        print(f"{name}: {n} runs given a commit, {missing} with no matching commit, {len(cache)} runs")


if __name__ == "__main__":
    main()
