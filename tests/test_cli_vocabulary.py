"""One flag per concept across the ``archplace`` commands (docs/reference/flags.md): ``--arch`` /
``--gpu`` for hardware, ``--devices`` for the count, budgets named by their unit; old spellings keep
working with one note line; argparse errors are one line with exit status 2.

The API calls are replaced by fakes that keep the request: these tests check parsing and the mapping
to the request, not the solvers (one real ``place-ops`` run aside)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from archplace import api
from archplace.cli import build_parser, main


class Fake:
    """Stands in for an API call: keeps the request, returns ``out`` as the result's dict."""

    def __init__(self, out: dict | None = None):
        self.req, self.out = None, out or {}

    def __call__(self, req, **kw):
        self.req = req
        return SimpleNamespace(to_dict=lambda: dict(self.out))


@pytest.fixture
def fakes(monkeypatch):
    """Every API call the commands make, faked."""
    import archplace.cli.sharding as cli_sharding
    import archplace.platform.search as search_mod
    import archplace.platform.tune_rl as tune_rl_mod

    f = {name: Fake() for name in ("estimate", "estimate_gpu", "place", "solve_dp", "search", "place_ops",
                                   "partition", "pipeline", "shard")}
    f["pipeline"].out, f["partition"].out = {"budget": 77}, {"valid": True}
    for name in ("estimate", "estimate_gpu", "place", "solve_dp", "search", "place_ops", "partition",
                 "pipeline"):
        monkeypatch.setattr(api, name, f[name])
    monkeypatch.setattr(cli_sharding, "shard", f["shard"])
    monkeypatch.setattr(search_mod, "connect", lambda address=None: None)
    tune = {}

    def fake_tune_rl(placer, **kw):
        tune.update(placer=placer, **kw)
        return {"iterations": kw["iterations"] or 12}

    monkeypatch.setattr(tune_rl_mod, "tune_rl", fake_tune_rl)
    f["tune_rl"] = tune
    return f


def run(capsys, *argv) -> tuple[int, dict | None, str]:
    """(exit status, the --json output or None, stderr); argparse's exits become their status."""
    try:
        code = main([*argv, "--json"])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


# ---------------------------------------------------------------------- the new words reach the request
NEW_WORDS = [
    # (argv, API call, {request field: value}, budgets in the JSON)
    (["estimate", "bert-base", "--arch", "tpuv4", "--devices", "1"], "estimate", {"arch": "tpuv4"}, None),
    (["estimate", "bert-base", "--gpu", "h200", "--devices", "1"], "estimate_gpu", {"gpu": "h200"}, None),
    (["place", "bert-base", "--arch", "tpuv4", "--devices", "64", "--ilp-det-time", "0.5",
      "--ilp-timeout", "30"], "place",
     {"arch": "tpuv4", "accelerators": 64, "ilp_budget": 0.5, "ilp_time_limit_s": 30.0},
     {"ilp_det_time_s": 0.5, "ilp_timeout_s": 30.0}),
    (["place", "bert-base", "--arch", "tpuv4", "--sequential"], "place", {"accelerators": 1024}, {}),
    (["solve-dp", "x.json", "--timeout", "5"], "solve_dp", {"time_limit_s": 5.0}, {"timeout_s": 5.0}),
    (["place-ops", "txl-2", "--gpu", "h200", "--devices", "2", "--algo", "sa", "--max-evals", "300"],
     "place_ops", {"machine": "h200", "devices": 2, "budget": 300}, {"max_evals": 300}),
    (["place-ops", "txl-2", "--gpu", "v100-nvlink", "--algo", "exact", "--timeout", "5"], "place_ops",
     {"machine": "v100-nvlink", "budget": 5.0}, {"timeout_s": 5.0}),
    (["place-ops", "txl-2", "--algo", "gdp"], "place_ops", {"machine": "p100-pcie", "budget": None},
     {"max_evals": 2000}),
    (["place-ops", "txl-2", "--gpu", "p100-pcie"], "place_ops", {"machine": "p100-pcie"}, {}),
    (["pipeline", "bert-48", "--devices", "16", "--gpu", "h100-sxm", "--algo", "rainbow", "--max-evals", "77",
      "--gpus-per-node", "8"], "pipeline", {"cluster": "A", "gpu": "h100-sxm", "budget": 77},
     {"max_evals": 77}),
    (["pipeline", "bert-48", "--devices", "32"], "pipeline", {"cluster": "C", "gpu": None}, {}),
    (["shard", "t5-base", "--devices", "8", "--gpu", "h200", "--det-time", "3"], "shard",
     {"devices": 8, "gpu": "h200", "max_deterministic_s": 3.0}, {"det_time_s": 3.0}),
    (["shard", "t5-base", "--devices", "8", "--algo", "random", "--max-evals", "50"], "shard",
     {"budget": 50}, {"max_evals": 50}),
    (["partition", "bert-base", "--devices", "8", "--max-evals", "10"], "partition",
     {"chiplets": 8, "budget": 10}, {"max_evals": 10}),
    (["search", "bert-base", "--devices", "64", "--max-archs", "3", "--ilp-det-time", "0.2"], "search",
     {"accelerators": 64, "budget": 3, "ilp_budget": 0.2},
     {"max_archs": 3, "ilp_det_time_s": 0.2, "ilp_timeout_s": api.SearchRequest.ilp_time_limit_s}),
    (["search", "bert-base", "--target", "mcm", "--det-time", "0.5", "--subsolves", "4"], "search",
     {"det_time": 0.5, "subsolves": 4}, {"max_archs": 16, "subsolves": 4, "det_time_s": 0.5}),
]


@pytest.mark.parametrize("argv, call, fields, budgets", NEW_WORDS, ids=lambda x: None)
def test_new_words_reach_the_request(capsys, fakes, argv, call, fields, budgets):
    code, res, err = run(capsys, *argv)
    assert code == 0 and err == "", err
    req = fakes[call].req
    assert {k: getattr(req, k) for k in fields} == fields
    if budgets is None:
        assert "budgets" not in res
    else:
        assert res["budgets"] == budgets


def test_tune_rl_devices_reach_the_case(capsys, fakes):
    code, res, err = run(capsys, "tune-rl", "mcm", "--devices", "16", "--samples", "3")
    assert code == 0 and err == "" and fakes["tune_rl"]["case"] == {"chiplets": 16}
    assert res["budgets"] == {"trials": 3, "max_iterations": 12}
    code, res, err = run(capsys, "tune-rl", "pipeline", "--devices", "24", "--iterations", "4")
    assert code == 0 and err == "" and fakes["tune_rl"]["case"] == {"cluster": "B"}
    assert res["budgets"] == {"trials": 8, "max_iterations": 4}


# ---------------------------------------------------------------------- old spellings: one note each
OLD_SPELLINGS = [
    # (argv, note, API call, {request field: value})
    (["place", "bert-base", "--arch", "tpuv4", "--accelerators", "32"], "--accelerators is now --devices",
     "place", {"accelerators": 32}),
    (["place", "bert-base", "--arch", "tpuv4", "--ilp-budget", "0.3"], "--ilp-budget is now --ilp-det-time",
     "place", {"ilp_budget": 0.3}),
    (["place", "bert-base", "--arch", "tpuv4", "--ilp-time-limit", "9"],
     "--ilp-time-limit is now --ilp-timeout", "place", {"ilp_time_limit_s": 9.0}),
    (["solve-dp", "x.json", "--time-limit", "7"], "--time-limit is now --timeout", "solve_dp",
     {"time_limit_s": 7.0}),
    (["search", "bert-base", "--accelerators", "64"], "--accelerators is now --devices", "search",
     {"accelerators": 64}),
    (["search", "bert-base", "--budget", "4"], "--budget is now --max-archs", "search", {"budget": 4}),
    (["search", "bert-base", "--ilp-budget", "0.4"], "--ilp-budget is now --ilp-det-time", "search",
     {"ilp_budget": 0.4}),
    (["place-ops", "txl-2", "--machine", "v100-nvlink"], "--machine is now --gpu", "place_ops",
     {"machine": "v100-nvlink"}),
    (["place-ops", "txl-2", "--algo", "sa", "--budget", "100"], "--budget is now --max-evals", "place_ops",
     {"budget": 100}),
    (["place-ops", "txl-2", "--algo", "exact", "--budget", "3"], "--budget is now --timeout", "place_ops",
     {"budget": 3}),
    (["partition", "bert-base", "--chiplets", "8"], "--chiplets is now --devices", "partition",
     {"chiplets": 8}),
    (["partition", "bert-base", "--budget", "12"], "--budget is now --max-evals", "partition",
     {"budget": 12}),
    (["pipeline", "bert-48", "--cluster", "B"], "--cluster is now --devices", "pipeline", {"cluster": "B"}),
    (["pipeline", "bert-48", "--devices", "16", "--algo", "rainbow", "--budget", "50"],
     "--budget is now --max-evals", "pipeline", {"budget": 50}),
    (["shard", "t5-base", "--devices", "8", "--algo", "random", "--budget", "20"],
     "--budget is now --max-evals", "shard", {"budget": 20}),
    (["shard", "t5-base", "--devices", "8", "--max-deterministic-time", "2"],
     "--max-deterministic-time is now --det-time", "shard", {"max_deterministic_s": 2.0}),
]


@pytest.mark.parametrize("argv, note, call, fields", OLD_SPELLINGS, ids=lambda x: None)
def test_old_spellings_work_with_one_note(capsys, fakes, argv, note, call, fields):
    code, _, err = run(capsys, *argv)
    assert code == 0 and err == f"note: {note}\n"
    req = fakes[call].req
    assert {k: getattr(req, k) for k in fields} == fields


@pytest.mark.parametrize("old, case", [("--chiplets", {"chiplets": 12}), ("--cluster", {"cluster": "A"})])
def test_tune_rl_old_spellings(capsys, fakes, old, case):
    placer, value = ("mcm", "12") if old == "--chiplets" else ("pipeline", "A")
    code, _, err = run(capsys, "tune-rl", placer, old, value)
    assert code == 0 and err == f"note: {old} is now --devices\n" and fakes["tune_rl"]["case"] == case


def test_parse_level_names():
    """The parsed namespace uses the new names (what other code reads)."""
    p = build_parser()
    a = p.parse_args(["place", "bert-base", "--arch", "tpuv4", "--ilp-budget", "0.3"])
    assert (a.devices, a.ilp_det_time, a.ilp_timeout) == (1024, 0.3, api.PlaceRequest.ilp_time_limit_s)
    a = p.parse_args(["pipeline", "bert-48", "--cluster", "C"])
    assert (a.devices, a.gpus_per_node) == (32, 8)


# ---------------------------------------------------------------------- --help names the words
HARDWARE = {"estimate": ("--arch", "--gpu"), "place": ("--arch",), "place-ops": ("--gpu",),
            "pipeline": ("--gpu", "--gpus-per-node"), "shard": ("--gpu",), "partition": (),
            "search": (), "tune-rl": ()}


@pytest.mark.parametrize("command", sorted(HARDWARE))
def test_help_names_devices_and_hardware(capsys, command):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "--devices N" in out
    for flag in HARDWARE[command]:
        assert f"{flag} N" in out, flag  # shown with its metavar (NAME, NAME|FILE, N)
    for flag in {"--arch", "--gpu"} - set(HARDWARE[command]):  # the other kinds say they do not apply
        assert f"{flag} does not apply" in out or f"{flag} and" in out or f"and {flag} do not apply" in out
    for old in ("--accelerators", "--chiplets", "--cluster", "--machine", "--budget", "--ilp-budget"):
        assert old not in out  # old spellings are not advertised
    assert "V100 only" not in out


def test_pipeline_help_is_not_v100_only(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "pipeline cuts of a model on GPU servers" in " ".join(out.split())


# ---------------------------------------------------------------------- refused kinds and counts
@pytest.mark.parametrize("argv, match", [
    (["place", "bert-base", "--arch", "tpuv4", "--gpu", "h200"], "--gpu does not apply: place takes --arch"),
    (["place-ops", "txl-2", "--arch", "tpuv4"], "--arch does not apply: place-ops places operators on GPUs"),
    (["pipeline", "bert-48", "--devices", "16", "--arch", "tpuv4"], "--arch does not apply"),
    (["shard", "t5-base", "--devices", "8", "--arch", "tpuv4"], "--arch does not apply"),
    (["partition", "bert-base", "--gpu", "h200"], "--gpu does not apply: partition's hardware is"),
    (["partition", "bert-base", "--arch"], "--arch does not apply"),
    (["search", "bert-base", "--gpu", "h200"], "--gpu does not apply: search searches the hardware"),
    (["tune-rl", "mcm", "--arch", "tpuv4"], "--arch does not apply"),
    (["place", "bert-base", "--arch", "tpuv4", "--devices", "65537"], "at most 65,536"),
    (["search", "bert-base", "--devices", "1000000"], "at most 65,536"),
    (["shard", "t5-base", "--devices", "70000"], "at most 65,536"),
    (["place", "bert-base", "--arch", "tpuv4", "--devices", "0"], "must be at least 1"),
    (["place", "bert-base", "--arch", "tpuv4", "--devices", "-4"], "must be at least 1"),
    (["place-ops", "txl-2", "--devices", "65"], "at most 64"),
    (["partition", "bert-base", "--devices", "100"], "at most 64"),
    (["pipeline", "bert-48", "--devices", "20"], "must be 16, 24, 32 GPUs"),
    (["pipeline", "bert-48", "--cluster", "D"], "argument --cluster: must be one of A, B, C"),
    (["pipeline", "bert-48"], "--devices N is required"),
    (["pipeline", "bert-48", "--devices", "16", "--gpus-per-node", "4"], "--gpus-per-node must be 8"),
    (["tune-rl", "pipeline", "--devices", "20"], "--devices must be 16, 24, 32"),
    (["estimate", "bert-base", "--gpu", "h200", "--devices", "8"], "must be 1 (estimate costs one device"),
    (["place-ops", "txl-2", "--max-evals", "10"], "--max-evals applies to --algo sa"),
    (["place-ops", "txl-2", "--algo", "sa", "--timeout", "10"], "--timeout applies to --algo exact"),
    (["search", "bert-base", "--max-archs", "0"], "argument --max-archs: must be at least 1"),
    (["place", "bert-base", "--arch", "tpuv4", "--ilp-det-time", "0"], "must be > 0 deterministic seconds"),
])
def test_refusals_are_one_line(capsys, fakes, argv, match):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out is None and match in err, err
    assert err.count("\n") == 1 and "usage:" not in err
    assert err.startswith(f"archplace {argv[0]}: error: ")
    assert all(f.req is None for k, f in fakes.items() if k != "tune_rl") and not fakes["tune_rl"]


# ---------------------------------------------------------------------- argparse errors: one line
@pytest.mark.parametrize("argv, line", [
    (["place", "bert-base", "--arch", "tpuv4", "--devices", "x"],
     "archplace place: error: argument --devices: invalid int value: 'x'"),
    (["place-ops", "txl-2", "--gpux", "h200"],
     "archplace place-ops: error: unrecognized arguments: --gpux h200 (did you mean --gpu?)"),
    (["place-ops", "txl-2", "--gpu", "h20"], "(did you mean h200?)"),
    (["shard", "t5-base", "--devices", "8", "--max-eval", "3", "--det-tme", "2"],
     "(did you mean --det-time?)"),
    (["partition", "bert-base", "--algo", "nope"],
     "archplace partition: error: argument --algo: invalid choice"),
    (["shard", "t5-base"], "archplace shard: error: the following arguments are required: --devices"),
    (["plce", "bert-base"], "archplace: error: argument command: invalid choice: 'plce'"),
])
def test_argparse_errors_are_one_line(capsys, argv, line):
    with pytest.raises(SystemExit) as e:
        main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and err.count("\n") == 1 and "usage:" not in err
    assert line in err, err


# ---------------------------------------------------------------------- one real run
def test_place_ops_on_one_h200(capsys):
    """The issue's example: ``archplace place-ops txl-2 --gpu h200 --devices 1 --json`` (a few seconds)."""
    code, res, err = run(capsys, "place-ops", "txl-2", "--gpu", "h200", "--devices", "1")
    assert code == 0 and err == ""
    assert res["machine"] == "h200" and res["devices"] == 1 and res["valid"] and res["budgets"] == {}


# ---------------------------------------------------------------------- the page agrees with the parser
def test_flags_page_names_flags_the_commands_have():
    """Every row of docs/reference/flags.md's two flag tables: each command it names has at least one of
    its flags (new spelling), and each old spelling exists on the commands it is listed for."""
    import re
    from pathlib import Path

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    flags = {c: {s for a in p._actions for s in a.option_strings} for c, p in sub.choices.items()}
    page = (Path(__file__).resolve().parents[1] / "docs/reference/flags.md").read_text()
    rows = [r.split(" | ") for r in page.splitlines()
            if r.startswith("| ") and r.count(" | ") == 4 and not r.startswith(("| Concept", "| Budget"))]
    assert len(rows) >= 14

    def commands(text: str) -> set[str]:
        return {w for w in re.findall(r"[a-z][a-z-]*", re.sub(r"`[^`]*`", "", text)) if w in flags}

    for _, new, _, where, old in rows:
        new_flags = set(re.findall(r"--[a-z-]+", new))
        assert commands(where), where
        for c in commands(where):
            assert new_flags & flags[c], (c, new_flags)
        for segment in old.split(";"):
            for c in commands(segment):
                for f in re.findall(r"--[a-z-]+", segment):
                    assert f in flags[c], (c, f)
