"""Every ``archplace`` command's ``--json`` output on small inputs, compared with stored copies
(``tests/golden/cli/``). The copies were written before the command line moved from
``archplace/platform/cli.py`` to ``archplace/cli/``: the move must not change a flag, a key or a value.

Fields that measure the machine rather than the answer (``*wall_s``, ``timing_s``, solver seconds) and
temporary paths are left out of the comparison. A change that means to alter a command's JSON rewrites
the copies with ``ARCHPLACE_UPDATE_GOLDEN=1 pytest tests/test_cli_json.py`` and says why in its commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import DNN_DATA

from archplace.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden" / "cli"
UPDATE = os.environ.get("ARCHPLACE_UPDATE_GOLDEN") == "1"
# keys that measure the machine (wall clock), not the answer
VOLATILE = ("wall_s", "timing_s", "solve_time_s", "elapsed_s")
VOLATILE_KEYS = ("time_s", "lattice_s")  # the max-load solver's seconds in solve-dp's stats
LAYER_GRAPH = "throughput-inputs/LayerGraphs/bert24_training.json"

SMALL = {
    "models": ["models"],
    "graph": ["graph", "bert-base", "--seq", "32"],
    "estimate": ["estimate", "bert-base", "--arch", "tpuv4", "--seq", "32"],
    "estimate-gpu": ["estimate", "bert-base", "--gpu", "h200", "--seq", "32"],
    "place-sequential": ["place", "bert-base", "--arch", "tpuv4", "--accelerators", "8",
                         "--global-batch", "64", "--seq", "64", "--sequential", "--hbm", "32"],
    # the layer ILP stops on deterministic budgets (issue 28), so its answer can be stored too; a
    # small budget keeps it quick (a few backward slices stop at it)
    "place-ilp": ["place", "bert-base", "--arch", "tpuv4", "--accelerators", "8", "--global-batch", "64",
                  "--seq", "64", "--hbm", "32", "--ilp-budget", "0.2"],
    "solve-dp": ["solve-dp", "{dnn}/" + LAYER_GRAPH],
    "pipeline": ["pipeline", "bert-48", "--cluster", "B"],
    "place-ops": ["place-ops", "txl-2", "--algo", "m-etf"],
    "partition": ["partition", "bert-base", "--seq", "128", "--chiplets", "8", "--algo", "sa",
                  "--budget", "10"],
}


def scrub(x, tmp: str = ""):
    """``x`` without the machine-dependent fields, temporary paths replaced by ``TMP``."""
    if isinstance(x, dict):
        return {k: scrub(v, tmp) for k, v in x.items() if not k.endswith(VOLATILE) and k not in VOLATILE_KEYS}
    if isinstance(x, list):
        return [scrub(v, tmp) for v in x]
    if isinstance(x, str) and tmp and tmp in x:
        return x.replace(tmp, "TMP")
    return x


def skeleton(x):
    """The keys of ``x`` and the types of its leaves: the shape of a result whose values depend on
    training that is not bit-reproducible (``tune-rl``)."""
    if isinstance(x, dict):
        return {k: skeleton(v) for k, v in x.items()}
    if isinstance(x, list):
        return [skeleton(x[0])] if x else []
    return "number" if isinstance(x, (int, float)) and not isinstance(x, bool) else type(x).__name__


def check_golden(name: str, res: dict, tmp: str = "", keys_only: bool = False) -> None:
    """``res`` (scrubbed) equals ``tests/golden/cli/NAME.json`` (with ``keys_only``: its keys and leaf
    types do)."""
    got = scrub(res, tmp)
    if keys_only:
        got = skeleton(got)
    path = GOLDEN / f"{name}.json"
    if UPDATE or not path.exists():
        assert UPDATE, f"no golden copy {path}: run with ARCHPLACE_UPDATE_GOLDEN=1 to write it"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True, default=str) + "\n")
        return
    want = json.loads(path.read_text())
    assert_close(json.loads(json.dumps(got, default=str)), want, name)


def assert_close(got, want, where: str) -> None:
    """Equal structure and values; floats to a relative 1e-12 (the last bits of a sum may differ)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, sorted(got), sorted(want))
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-300), (where, got, want)
    else:
        assert got == want, (where, got, want)


def run_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(SMALL))
def test_command_json_is_unchanged(name, capsys):
    dnn = str(DNN_DATA)
    argv = [a.replace("{dnn}", dnn) for a in SMALL[name]]
    check_golden(name, run_json(capsys, argv), dnn)


def test_search_and_report_json_are_unchanged(ray_session, tmp_path, capsys):
    out = tmp_path / "s"
    res = run_json(capsys, ["search", "bert-base", "--accelerators", "64", "--global-batch", "256",
                            "--microbatches", "1", "--hbm", "32", "--tmp-widths", "1",
                            "--schedule", "sequential", "--budget", "2", "--workers", "1", "--out", str(out)])
    check_golden("search", res, str(tmp_path))
    check_golden("report", run_json(capsys, ["report", str(out)]), str(tmp_path))
