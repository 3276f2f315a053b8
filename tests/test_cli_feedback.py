"""What ``archplace`` says while it works, and what it refuses before it works.

* No silent minute: a command run as a program prints its phases on stderr (``archplace place [0:02]
  reading config.json ...``), in the order it does them, before anything else; ``--json`` stdout stays
  one JSON object. (That the first line comes within 2 s is measured, not asserted: a test asserts no
  wall time.)
* One clock: a search's summary, its progress line and its report.md count from the process start
  and agree; "over 0.0 min" cannot be written.
* Bad input before any work: a transformers config without its heads, hidden size or depth is refused
  in one line and the fields transformers filled with its defaults are listed in one note; ``serve
  --db`` in a folder that does not exist exits 2 and creates nothing; a search whose ``--address``
  cannot be reached, or that fails while starting, leaves no ``--out`` behind.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL_GPT2 = REPO / "tests" / "data" / "small_gpt2_config.json"
PHASE = re.compile(r"^archplace (\S+) \[\d+:\d\d(?::\d\d)?\] (.+)$")
TINY_SEARCH = ["bert-base", "--devices", "64", "--global-batch", "256", "--microbatches", "1", "--hbm", "32",
               "--schedule", "sequential", "--searcher", "grid", "--max-archs", "1"]
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 176, "vocab_size": 512, "max_position_embeddings": 32}


def _env(**extra: str) -> dict[str, str]:
    """A CLI subprocess's environment: no RAY_* variable (no cluster to follow), this checkout first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "ARCHPLACE_FAULT_INJECT"}
    return {**env, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _run(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "archplace.cli", *args], cwd=REPO, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def _phases(stderr: str, command: str) -> list[str]:
    return [m[2] for line in stderr.splitlines() if (m := PHASE.match(line)) and m[1] == command]


def _in_order(phases: list[str], *wanted: str) -> None:
    """Each of ``wanted`` is (part of) a phase, after the one before it."""
    at = -1
    for w in wanted:
        hits = [i for i, p in enumerate(phases) if w in p and i > at]
        assert hits, f"no phase {w!r} after position {at} in {phases}"
        at = hits[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- the status printer itself
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _visible(st) -> None:
    deadline = time.monotonic() + 30
    while not st._visible:
        assert time.monotonic() < deadline, "the status printer never became visible"
        time.sleep(0.01)


def test_status_lines_plain_when_not_a_terminal():
    from archplace.cli.status import Status, note, phase

    stream = io.StringIO()
    with Status("place", "checking the input", stream=stream, delay_s=0, tick_s=3600) as st:
        _visible(st)
        phase("reading config.json")                                # a layer below, through logging
        logging.getLogger("archplace.status").info("capturing the graph of x")
        note("note: config.json lacks vocab_size, using 32000 (transformers' default)")
        st._tick()                                                  # no redraw off a terminal
    lines = stream.getvalue().splitlines()
    assert [PHASE.match(line)[2] if PHASE.match(line) else line for line in lines] == [
        "checking the input", "reading config.json", "capturing the graph of x",
        "note: config.json lacks vocab_size, using 32000 (transformers' default)"]
    assert all(PHASE.match(line)[1] == "place" for line in lines[:3])
    phase("after the command")                                      # nobody prints it any more
    assert stream.getvalue().splitlines() == lines


def test_status_line_on_a_terminal_moves_its_clock_and_gives_way_to_a_progress_line():
    from archplace.cli.status import Status, phase

    term = _Terminal()
    with Status("search", "checking the input", stream=term, start=time.time() - 75, delay_s=0,
                tick_s=3600) as st:
        _visible(st)
        st._tick()
        assert term.getvalue().endswith("\rarchplace search [1:15] checking the input\x1b[K")
        phase("evaluating 4 architecture(s)", handover=True)       # the search's own bar follows
        shown = term.getvalue()
        assert shown.endswith("\narchplace search [1:15] evaluating 4 architecture(s)\n")
        st._tick()
        assert term.getvalue() == shown                             # the bar owns the line now
        phase("writing report.md")
    assert term.getvalue().endswith("archplace search [1:15] writing report.md\r\x1b[K")  # cleared at the end


def test_nothing_before_the_delay_and_nothing_when_disabled():
    from archplace.cli.status import Status, phase

    stream = io.StringIO()
    with Status("graph", "building the graph", stream=stream, start=time.time(), delay_s=3600):
        phase("capturing the graph of bert-base")
    assert stream.getvalue() == ""          # a command done within the delay says nothing more
    with Status("graph", "building the graph", stream=stream, enabled=False, delay_s=0):
        phase("capturing the graph of bert-base")
    assert stream.getvalue() == ""


def test_progress_eta_only_once_it_means_something():
    from archplace.platform.search import _Progress

    stream = io.StringIO()
    p = _Progress(100, stream=stream, start=time.time() - 125)
    p.update(1.0)
    assert "ETA" not in stream.getvalue() and "elapsed 2:05" in stream.getvalue()   # the run's clock
    for _ in range(8):
        p.update(2.0)
    assert "ETA" not in stream.getvalue()   # 9 of 100: under 10 %
    p.update(2.0)
    assert "ETA" in stream.getvalue().splitlines()[-1]
    q = _Progress(3, stream=io.StringIO())
    q.update(1.0)
    assert "ETA" not in q.stream.getvalue()   # one unit: no rate yet
    q.update(1.0)
    assert "ETA" in q.stream.getvalue().splitlines()[-1]
    q.update(1.0)
    assert "ETA" not in q.stream.getvalue().splitlines()[-1]   # done
    b = _Progress(30, stream=io.StringIO())
    b.update_many([1.0] * 10)
    assert "ETA" not in b.stream.getvalue()   # a first batch of 10: one result, no rate yet
    b.update_many([1.0] * 10)
    assert "20/30" in b.stream.getvalue().splitlines()[-1] and "ETA" in b.stream.getvalue().splitlines()[-1]


def test_report_says_the_wall_time_and_never_over_zero_minutes(tmp_path):
    from archplace.hardware.space import enumerate_space
    from archplace.platform.evaluate import arch_columns
    from archplace.platform.report import write_report
    from archplace.platform.store import ResultStore

    meta = {"models": ["bert-base"], "num_devices": 64, "global_batch": 256, "searcher": "grid"}
    store = ResultStore(tmp_path)
    store.write_meta(meta)
    acc = enumerate_space().accelerator(0)
    store.add([{**arch_columns(acc), "space_index": 0, "model": "bert-base", "status": "ok",
                "throughput": 100.0, "stages_json": "[]", "trial_id": "t0", "hostname": "h",
                "finished_at": 1.7e9}], "grid")
    store.close(meta)
    text = write_report(tmp_path).read_text()
    assert "over 0.0" not in text and "Wall time" not in text   # one architecture: no span to give
    store.write_meta({**meta, "wall_s": 169.04})
    text = write_report(tmp_path).read_text()
    assert "- **Wall time:** 169.0 s (2.8 min)" in text and "over 0.0" not in text


# ---------------------------------------------------------------------- transformers configs
def _write(tmp_path: Path, name: str, d: dict) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_hf_config_missing_heads_is_refused_in_one_line(tmp_path):
    cfg = _write(tmp_path, "noheads.json", {k: v for k, v in LLAMA.items() if k != "num_attention_heads"})
    run = _run("graph", "--hf-config", str(cfg))
    errors = [line for line in run.stderr.splitlines() if not PHASE.match(line)]
    assert run.returncode == 2, run.stderr[-3000:]
    assert errors == ["archplace graph: error: hf-config noheads.json lacks num_attention_heads: "
                      "LlamaForCausalLM's size cannot be known without it (transformers would take its "
                      "default, 32, silently); add it to the file"]


def test_hf_config_defaulted_fields_are_listed_once(tmp_path, caplog):
    from archplace.workloads.hf_config import hf_model, hf_ref

    cfg = _write(tmp_path, "nokv.json", {k: v for k, v in LLAMA.items()
                                         if k not in ("num_key_value_heads", "vocab_size")})
    with caplog.at_level(logging.INFO, logger="archplace.status"):
        m = hf_model(hf_ref(cfg))
        hf_model(hf_ref(cfg))   # cached: said once
    notes = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert notes == ["note: nokv.json lacks num_key_value_heads, vocab_size; using 4, 32000 "
                     "(transformers' defaults)"]
    assert m.num_parameters > 0
    full = _write(tmp_path, "full.json", LLAMA)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="archplace.status"):
        hf_model(hf_ref(full))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_hf_config_fields_in_a_family_spelling_are_given():
    """GPT-2 spells the heads n_head (its attribute_map); BART the depth encoder_layers: not missing."""
    import transformers

    from archplace.workloads.hf_config import check_fields, make_config

    gpt2_cls = transformers.GPT2LMHeadModel
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
            "n_positions": 64}
    assert check_fields(gpt2, gpt2_cls, make_config(gpt2, gpt2_cls)) == []
    no_heads = {k: v for k, v in gpt2.items() if k != "n_head"}
    with pytest.raises(ValueError, match=r"lacks num_attention_heads \(n_head\)"):
        check_fields(no_heads, gpt2_cls, make_config(no_heads, gpt2_cls))
    bart = {"model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 100,
            "max_position_embeddings": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128}
    assert check_fields(bart, transformers.BartModel, make_config(bart, transformers.BartModel)) == []


# ---------------------------------------------------------------------- a command's phases, --json pure
def test_place_names_its_phases_in_order_and_json_stays_pure():
    run = _run("place", "--hf-config", str(SMALL_GPT2), "--arch", "tpuv4", "--sequential", "--devices", "8",
               "--global-batch", "64", "--json", ARCHPLACE_STATUS_DELAY="0")
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(run.stdout)                       # one JSON object, nothing else on stdout
    assert res["throughput"] > 0 and "archplace place [" not in run.stdout
    first = run.stderr.splitlines()[0]
    assert PHASE.match(first) and PHASE.match(first)[2] == "checking the input", run.stderr[-3000:]
    _in_order(_phases(run.stderr, "place"), "checking the input", "reading small_gpt2_config.json",
              "graph of small_gpt2_config.json", "solving layer schedules: 1 of",
              "choosing the pipeline stages")


def test_an_error_found_at_once_is_one_line_even_for_an_hf_config():
    """The other fields are checked before the config is read (torch and transformers: seconds)."""
    run = _run("place", "--hf-config", str(SMALL_GPT2), "--arch", "no-such-arch")
    assert run.returncode == 2
    assert "unknown accelerator preset 'no-such-arch'" in run.stderr.splitlines()[-1]
    assert not [p for p in _phases(run.stderr, "place") if "reading" in p]   # the config was not read


# ---------------------------------------------------------------------- nothing created by a failed start
def test_serve_db_in_a_missing_folder_exits_2_and_creates_nothing(tmp_path):
    missing = tmp_path / "no" / "such"
    run = _run("serve", "--db", str(missing / "service.db"), "--port", str(_free_port()), timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines()[-1] == (f"archplace serve: error: --db {missing / 'service.db'}: the "
                                           f"folder {missing} does not exist; create it first, or give a "
                                           "database in an existing folder (nothing was created)")
    url = _run("serve", "--db", f"sqlite:///{missing}/s.db", "--port", str(_free_port()), timeout=120)
    assert url.returncode == 2 and "does not exist" in url.stderr
    assert not (tmp_path / "no").exists()
    # the first token sets a service up: it makes the folder, and says so
    token = _run("serve", "token", "create", "alice", "--db", str(missing / "t.db"), timeout=120)
    assert token.returncode == 0 and f"note: creating the folder {missing} for the database" in token.stderr


def test_unreachable_address_leaves_no_out(tmp_path):
    out = tmp_path / "o"
    run = _run("search", *TINY_SEARCH, "--address", f"127.0.0.1:{_free_port()}", "--out", str(out))
    assert run.returncode == 2 and "cannot reach a Ray cluster there" in run.stderr.splitlines()[-1]
    assert not out.exists()


def test_a_search_that_fails_while_starting_removes_the_out_it_made(tmp_path, monkeypatch):
    """Here the attach fails after --out was made (a cluster that refuses this driver): the folder the
    run created goes; one that existed stays, with what it held."""
    import archplace.platform.search as ps
    from archplace import api

    def refused(*args, **kwargs):
        raise ValueError("--address x: the cluster refused this driver's token")

    monkeypatch.setattr(ps, "connect", refused)
    settings = api.SearchRequest(models=("bert-base",), accelerators=64, global_batch=256, microbatches=(1,),
                                 hbm_gb=(32.0,), schedule="sequential", searcher="grid", budget=1).settings()
    out = tmp_path / "new" / "o"
    with pytest.raises(ValueError, match="refused"):
        ps.run_search(settings, out, searcher="grid", budget=1, progress=False)
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="refused"):
        ps.run_search(settings, kept, searcher="grid", budget=1, progress=False)
    assert (kept / "notes.txt").read_text() == "mine" and not (kept / "search.json").exists()


# ---------------------------------------------------------------------- one clock (a real search)
@pytest.mark.system
def test_tiny_search_one_clock_and_phases(tmp_path):
    out = tmp_path / "o"
    run = _run("search", *TINY_SEARCH, "--out", str(out), ARCHPLACE_STATUS_DELAY="0")
    assert run.returncode == 0, run.stderr[-3000:]
    _in_order(_phases(run.stderr, "search"), "checking the input", "starting Ray",
              "capturing the graphs of bert-base", "evaluating 1 architecture", "evaluations.parquet",
              "report.md")
    bar = [line for line in run.stderr.splitlines() if "1/1 architectures" in line]
    assert bar and "elapsed" in bar[-1] and "ETA" not in bar[-1]
    summary = re.search(r"\) in (\d+\.\d) s with", run.stdout)
    report = re.search(r"- \*\*Wall time:\*\* (\d+\.\d) s", (out / "report.md").read_text())
    assert summary and report, (run.stdout, (out / "report.md").read_text()[:2000])
    assert summary[1] == report[1]
    assert "over 0.0" not in (out / "report.md").read_text()
    elapsed = re.search(r"elapsed (\d+):(\d\d)", bar[-1])
    assert int(elapsed[1]) * 60 + int(elapsed[2]) <= float(summary[1]) + 1   # the same clock, read earlier
