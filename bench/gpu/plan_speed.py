"""How long ``archplace plan`` takes on the issue's headline case (issue 46: GPT-3 175B on 1,024 A100 80 GB,
global batch 1,536, sequence 2,048, every knob searched; target: at most 30 s on the 2-core build machine).

Two runs, each a fresh ``archplace plan ... --json`` process (imports included, as a user waits for it):

- ``cold``: an empty graph cache (``ARCHPLACE_CACHE_DIR`` a new folder): every (micro-batch, tokens per
  rank) layer graph is captured with ``torch.export`` first, as on a fresh clone;
- ``warm``: the same command again, the graphs read from the cache that the cold run filled.

The answer must be the same in both (the search is deterministic); the JSON records the wall time, the
configurations priced and pruned, the layer timings, and the best configuration.

    nice -n 5 python bench/gpu/plan_speed.py [--out bench/gpu/results/plan_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

CMD = ["plan", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024", "--global-batch", "1536", "--seq", "2048",
       "--json"]


def run_once(cache_dir: str) -> dict:
    env = {**os.environ, "ARCHPLACE_CACHE_DIR": cache_dir}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "archplace.cli", *CMD], capture_output=True, text=True, env=env,
                       timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"archplace plan failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    d = json.loads(p.stdout)
    return {"wall_s": wall, "plan_wall_s": d["wall_s"], "evaluated": d["evaluated"], "pruned": d["pruned"],
            "invalid": d["invalid"], "splits_priced": d["splits_priced"], "layer_timings": d["timed"],
            "best": {k: d["best"][k] for k in ("tp", "pp", "dp", "cp", "vp", "mbs", "recompute",
                                               "sequence_parallel", "zero", "attention", "layers_per_stage",
                                               "step_time_s", "mfu", "memory_per_gpu_bytes")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "plan_speed.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="archplace-plan-speed-") as tmp:
        cold = run_once(tmp)
        warm = run_once(tmp)
    same = cold["best"] == warm["best"]
    doc = {"benchmark": "plan_speed", **git_state(), "command": command(), "machine": machine(load),
           "case": "archplace " + " ".join(CMD), "target_s": 30.0, "cold": cold, "warm": warm,
           "same_answer": same,
           "findings": [f"cold (empty graph cache): {cold['wall_s']:.1f} s wall, warm: "
                        f"{warm['wall_s']:.1f} s; "
                        f"{warm['evaluated']} configurations priced, {sum(warm['pruned'].values())} bounded, "
                        f"{warm['layer_timings']} layer timings; the same answer both times: {same}"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(doc["findings"][0])
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
