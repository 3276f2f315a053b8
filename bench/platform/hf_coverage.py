"""Op coverage of bring-your-own-model capture: every decoder, encoder and encoder-decoder family that
the installed ``transformers`` ships, built from its config class's defaults on the meta device and
captured as ``--hf-config`` captures it. Each family either captures with transformers' exact
parameter count or fails with a one-line reason.

Families come from transformers' auto mappings: ``causal-lm`` = MODEL_FOR_CAUSAL_LM (its causal-LM
class) less the encoder-decoder and masked-LM families; ``encoder-decoder`` = MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM;
``encoder`` = MODEL_FOR_MASKED_LM (its masked-LM class), then the families with a sequence- or
token-classification or question-answering head and no LM class (their base model); ``multimodal`` =
any of these that transformers also maps as an image-, audio- or video-and-text model (their towers
never run on input_ids alone). Each config keeps its default widths (the meta device holds no
weights, so width costs nothing) with every depth field over ``--depth`` cut to it, and per-layer
lists of that length cut with it (where the cut config does not build, the default depth is used and
the row says so); ``head_dim``, ``num_key_value_heads``, ``num_experts_per_tok``, ``n_routed_experts``
and ``n_shared_experts`` that a default config leaves None are completed (``config_completed`` in the
row). The forward graph is captured at
sequence ``--seq``; with ``--probe-unmapped`` a family whose ops include some without a cost model is
captured again with them allowed, to show what mapping them would give.

Each family runs in a pool of ``--workers`` processes with a per-family ``--timeout``; a worker that
overruns it is killed and replaced. Prints a table and writes JSON (default
bench/platform/results/hf_coverage.json).

    nice -n 10 python bench/platform/hf_coverage.py [--families llama gemma2] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))      # measure this tree's archplace, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta

CATEGORIES = ("causal-lm", "encoder", "encoder-decoder", "multimodal")
# transformers' mappings of models that take images, audio or video besides text: their towers do not
# run on input_ids alone, so --hf-config's text-only capture cannot reach them (listed apart)
_MULTIMODAL_MAPPINGS = tuple(f"MODEL_FOR_{m}_MAPPING_NAMES" for m in (
    "IMAGE_TEXT_TO_TEXT", "VISION_2_SEQ", "SPEECH_SEQ_2_SEQ", "MULTIMODAL_LM", "TEXT_TO_WAVEFORM",
    "TEXT_TO_SPECTROGRAM", "AUDIO_TOKENIZATION", "CTC", "AUDIO_CLASSIFICATION"))
# config fields that some shipped default configs leave None although the model needs them; the sweep
# completes them (and records it per family) so that the capture, not the default, is measured
_COMPLETE = {
    "head_dim": lambda c: c["hidden_size"] // c["num_attention_heads"],
    "num_key_value_heads": lambda c: c["num_attention_heads"],
    "num_experts_per_tok": lambda c: 2,
    "n_routed_experts": lambda c: 8,   # Dots1's default names no expert count
    "n_shared_experts": lambda c: 1,
}


def list_families() -> list[dict]:
    """Every (family, category, model class) of the installed transformers, in a fixed order."""
    from transformers.models.auto import modeling_auto as ma

    def first(v):
        return v[0] if isinstance(v, (list, tuple)) else v

    causal, masked = ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    rows: dict[str, tuple[str, str]] = {}
    for mt, cls in ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.items():
        rows[mt] = ("encoder-decoder", first(cls))
    for mt, cls in causal.items():
        if mt not in rows and mt not in masked:
            rows[mt] = ("causal-lm", first(cls))
    for mt, cls in masked.items():
        if mt not in rows:
            rows[mt] = ("encoder", first(cls))
    for mapping in (ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
                    ma.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
                    ma.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES):
        for mt in mapping:
            if mt not in rows and mt in ma.MODEL_MAPPING_NAMES:
                rows[mt] = ("encoder", first(ma.MODEL_MAPPING_NAMES[mt]))
    multimodal = {mt for name in _MULTIMODAL_MAPPINGS for mt in getattr(ma, name, {})}
    order = {c: i for i, c in enumerate(CATEGORIES)}
    out = [{"family": mt, "category": "multimodal" if mt in multimodal else cat, "mapping": cat,
            "model_class": cls} for mt, (cat, cls) in rows.items()]
    return sorted(out, key=lambda r: (order[r["category"]], r["family"]))


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def _stage(msg: str) -> str:
    if "unmapped aten ops" in msg:
        return "unmapped-ops"
    if "torch.export" in msg:
        return "export"
    if "building" in msg and "meta device" in msg:
        return "build"
    if "does not make a" in msg:
        return "config"
    if "takes" in msg and ("input_ids or pixel_values" in msg or "sees" in msg):
        return "inputs"
    if "stack" in msg:
        return "stack"
    return "other"


def capture_family(row: dict, seq: int, depth: int, workdir: Path, probe: bool = False) -> dict:
    """Capture one family; never raises (the reason is in the result)."""
    import re
    import warnings

    import transformers

    from archplace.workloads.block_kinds import ParameterMismatchError
    from archplace.workloads.hf_config import _DEPTH_KEYS, hf_model, hf_ref
    from archplace.workloads.models import build_graph

    out = dict(row, status="failed", stage="", reason="", params_expected=None, params_captured=None)
    t0 = time.perf_counter()
    try:
        cls = getattr(transformers, row["model_class"])
        cfg = cls.config_class()
    except Exception as e:  # noqa: BLE001 - any failure is the family's one-line reason
        out.update(stage="class", reason=_one_line(e))
        return out
    defaults = cfg.to_dict()
    completed = {}
    for k, fill in _COMPLETE.items():
        if k in defaults and defaults[k] is None:
            try:
                completed[k] = fill(defaults)
            except (KeyError, TypeError, ZeroDivisionError):
                pass
    caps = {k: depth for k in _DEPTH_KEYS if isinstance(defaults.get(k), int) and defaults[k] > depth}
    # per-layer lists of a cut depth field are cut with it (a default layer_types of 54 entries)
    lists = {k: v[:caps[dk]] for dk in caps for k, v in defaults.items()
             if isinstance(v, list) and len(v) == defaults[dk] and k not in caps}
    path = workdir / f"{row['family']}.json"
    if completed:
        out["config_completed"] = completed

    # the fields a config must give (archplace refuses a config without them rather than take
    # transformers' defaults silently): the class's own defaults, in the class's own spelling
    from archplace.workloads.hf_config import REQUIRED_FIELDS
    names = {n for std, aliases in REQUIRED_FIELDS.items() for n in (std, *aliases)}
    required = {k: v for k, v in defaults.items() if k in names and v is not None}

    def write(cut: bool) -> None:
        d = {"architectures": [row["model_class"]], "model_type": row["family"], **required, **completed,
             **(caps if cut else {}), **(lists if cut else {})}
        path.write_text(json.dumps(d))
        out["depth_overrides"] = caps if cut else {}

    def attempt(allow: bool) -> dict:
        res: dict = {}
        try:
            ref = hf_ref(path, allow_unmapped_ops=allow)
            m = hf_model(ref)
            res["params_expected"] = m.num_parameters
            s = min(seq, m.seq_len) if m.main_input == "input_ids" else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g = build_graph(ref, seq=s, training=False)
            fwd = ~g.nodes["is_backward"]
            # every parameter once (a tied one is held by each layer that reads it), as graph --json
            res["params_captured"] = g.totals()["weight_bytes"] // g.meta["bytes_per_element"]
            res["status"] = "exact" if res["params_captured"] == m.num_parameters else "mismatch"
            res["stacks"] = {st: {"blocks": n, "captured": g.meta["captured_blocks"][st],
                                  "kinds": len(set(g.meta["block_kinds"][st]))}
                             for st, n in g.meta["blocks"].items()}
            res["forward_ops"] = int(fwd.sum())
            if g.meta.get("unmapped_ops"):
                res["unmapped_ops"] = list(g.meta["unmapped_ops"])
        except ParameterMismatchError as e:
            res.update(status="mismatch", stage="parameters", reason=_one_line(e),
                       params_captured=e.graph_params, params_expected=e.model_params)
        except Exception as e:  # noqa: BLE001
            res.update(status="failed", stage=_stage(str(e)), reason=_one_line(e))
            if res["stage"] == "unmapped-ops":
                res["unmapped_ops"] = sorted(set(re.findall(r"(\w+) \(first in", str(e))))
        return res

    write(cut=bool(caps))
    first = attempt(False)
    if caps and first.get("stage") in ("config", "build"):  # the cut depth does not make a model
        out["depth_note"] = f"default depth: cutting it to {depth} failed ({first['reason'][:160]})"
        write(cut=False)
        first = attempt(False)
    out.update(first)
    if probe and out["stage"] == "unmapped-ops":
        allowed = attempt(True)
        out["if_allowed"] = {k: allowed.get(k) for k in ("status", "stage", "reason", "params_captured")
                             if allowed.get(k) is not None}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _worker(tasks, results, seq: int, depth: int, workdir: str, probe: bool) -> None:
    import transformers  # noqa: F401 - imported once per worker
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    while True:
        row = tasks.get()
        if row is None:
            return
        results.put(("start", os.getpid(), row["family"], time.time()))
        res = capture_family(row, seq, depth, Path(workdir), probe)
        results.put(("done", os.getpid(), row["family"], res))


def run_pool(rows: list[dict], workers: int, timeout_s: float, seq: int, depth: int, workdir: Path,
             log, probe: bool = False) -> list[dict]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    for r in rows:
        tasks.put(r)
    procs: dict[int, object] = {}

    def spawn():
        p = ctx.Process(target=_worker, args=(tasks, results, seq, depth, str(workdir), probe),
                        daemon=True)
        p.start()
        procs[p.pid] = p

    for _ in range(min(workers, len(rows))):
        spawn()
    running: dict[int, tuple[str, float]] = {}
    by_family = {r["family"]: r for r in rows}
    done: dict[str, dict] = {}
    while len(done) < len(rows):
        try:
            kind, pid, fam, val = results.get(timeout=2.0)
            if kind == "start":
                running[pid] = (fam, val)
            else:
                running.pop(pid, None)
                done[fam] = val
                log(val, len(done), len(rows))
        except queue.Empty:
            pass
        now = time.time()
        for pid, (fam, t) in list(running.items()):
            if now - t > timeout_s:
                procs[pid].kill()
                procs[pid].join()
                del procs[pid], running[pid]
                done[fam] = dict(by_family[fam], status="failed", stage="timeout",
                                 reason=f"no result within {timeout_s:.0f} s (worker killed)",
                                 params_expected=None, params_captured=None, seconds=timeout_s)
                log(done[fam], len(done), len(rows))
                spawn()
        for pid, p in list(procs.items()):  # a worker that died (out of memory, a crash)
            if not p.is_alive() and pid in running:
                fam, _ = running.pop(pid)
                del procs[pid]
                done[fam] = dict(by_family[fam], status="failed", stage="crash",
                                 reason=f"worker exited with code {p.exitcode}",
                                 params_expected=None, params_captured=None)
                log(done[fam], len(done), len(rows))
                spawn()
    for _ in procs:
        tasks.put(None)
    for p in procs.values():
        p.join(timeout=10)
    return [done[r["family"]] for r in rows]


def summarize(results: list[dict]) -> dict:
    out = {}
    for cat in CATEGORIES:
        rs = [r for r in results if r["category"] == cat]
        counts = {s: sum(r["status"] == s for r in rs) for s in ("exact", "mismatch", "failed")}
        stages: dict[str, int] = {}
        for r in rs:
            if r["status"] == "failed":
                stages[r["stage"]] = stages.get(r["stage"], 0) + 1
        out[cat] = {"families": len(rs), **counts,
                    "exact_share": round(counts["exact"] / len(rs), 4) if rs else None,
                    "failed_by_stage": dict(sorted(stages.items()))}
    # each auto mapping as transformers lists it, its multimodal families included
    out["by_mapping"] = {}
    for cat in CATEGORIES[:3]:
        rs = [r for r in results if r.get("mapping") == cat]
        out["by_mapping"][cat] = {"families": len(rs), "exact": sum(r["status"] == "exact" for r in rs),
                                  "exact_share": round(sum(r["status"] == "exact" for r in rs) / len(rs), 4)
                                  if rs else None}
    ops: dict[str, int] = {}
    for r in results:
        for op in r.get("unmapped_ops", []) if r["status"] == "failed" else []:
            ops[op] = ops.get(op, 0) + 1
    out["unmapped_ops_by_families"] = dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def main() -> int:
    from _meta import command, git_state, machine

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", nargs="*", help="model types to run (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per family")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--depth", type=int, default=8, help="cut every config depth field above this")
    ap.add_argument("--probe-unmapped", action="store_true",
                    help="capture a family with unmapped ops again with them allowed (what mapping gives)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "hf_coverage.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    import tempfile

    import torch
    import transformers

    rows = list_families()
    if args.families:
        unknown = sorted(set(args.families) - {r["family"] for r in rows})
        if unknown:
            raise SystemExit(f"--families: unknown {unknown}")
        rows = [r for r in rows if r["family"] in set(args.families)]
    t0 = time.time()

    def log(r: dict, i: int, n: int) -> None:
        exp, got = r.get("params_expected"), r.get("params_captured")
        nums = f"{got:,}/{exp:,}" if isinstance(exp, int) and isinstance(got, int) else ""
        print(f"[{i:3d}/{n}] {r['family']:28s} {r['category']:15s} {r['status']:8s} {nums:>27s} "
              f"{r.get('seconds', 0):6.1f}s  {r.get('reason', '')[:110]}", flush=True)

    with tempfile.TemporaryDirectory() as wd:
        results = run_pool(rows, args.workers, args.timeout, args.seq, args.depth, Path(wd), log,
                           args.probe_unmapped)
    summary = summarize(results)
    print(f"\n{'category':16s} {'families':>8s} {'exact':>6s} {'mismatch':>8s} {'failed':>6s} "
          f"{'exact %':>8s}")
    for cat in CATEGORIES:
        s = summary[cat]
        share = f"{100 * s['exact_share']:.1f}" if s["exact_share"] is not None else "-"
        print(f"{cat:16s} {s['families']:8d} {s['exact']:6d} {s['mismatch']:8d} {s['failed']:6d} {share:>8s}")
    for cat, s in summary["by_mapping"].items():
        if s["families"]:
            print(f"  {cat} mapping with its multimodal families: {s['exact']}/{s['families']} exact "
                  f"({100 * s['exact_share']:.1f} %)")
    doc = {"benchmark": "hf_coverage", **git_state(), "command": command(), "machine": machine(load),
           "wall_s": round(time.time() - t0, 1), "transformers": transformers.__version__,
           "torch": torch.__version__,
           "settings": {"seq": args.seq, "depth": args.depth, "timeout_s": args.timeout,
                        "workers": args.workers, "probe_unmapped": args.probe_unmapped,
                        "families_requested": args.families},
           "summary": summary, "families": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
