"""The search report (archplace.platform.report) on a synthetic search directory."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from archplace.platform.report import REQUIRED_COLUMNS, pareto_front, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODELS = ["bert-large", "gpt2-xl"]
REF = (8, 2, 128, 128, 128)
FAILED = (16, 2, 64, 64, 64)
INFEASIBLE = (1, 1, 32, 32, 4)
ERROR = "CP-SAT worker crashed: segmentation fault in slice 17"


def _label(a):
    return f"{{{a[0]},{a[1]},{a[2]},{a[3]},{a[2]}}} glb{a[4]:g}MB"


def _key(a):
    return f"{a[0]}-{a[1]}-{a[2]}-{a[3]}-{a[2]}-glb{a[4]:g}"


# (architecture, area mm², bert-large samples/s, gpt2-xl samples/s); the reference does 1000 / 200
ARCHS = [
    (REF, 400.0, 1000.0, 200.0),
    ((8, 4, 128, 128, 256), 520.0, 1070.0, 230.0),   # best for bert-large: 1.07× the reference
    ((16, 4, 128, 128, 256), 700.0, 1050.0, 260.0),  # best for gpt2-xl, Phaze-common (avg 655)
    ((4, 2, 128, 128, 64), 220.0, 600.0, 120.0),
    ((4, 4, 64, 64, 64), 120.0, 300.0, 50.0),
    ((8, 2, 64, 64, 128), 250.0, 590.0, 110.0),      # dominated by {4,2,128,128,128} for both
    ((2, 2, 128, 128, 32), 110.0, 350.0, 60.0),
    ((8, 8, 64, 128, 128), 330.0, 800.0, 150.0),
    ((32, 4, 64, 64, 256), 900.0, 1040.0, 250.0),    # dominated by the 700 mm² one
    ((1, 2, 256, 256, 64), 150.0, 420.0, 80.0),
    (FAILED, 300.0, 700.0, None),
    (INFEASIBLE, 30.0, None, None),
]
EXPERT = {"bert-large": (900.0, "8,128,1"), "gpt2-xl": (160.0, "16,64,1")}


def _rows():
    rows = []
    for order, (a, area, *tps) in enumerate(ARCHS):
        for m, tp in zip(MODELS, tps):
            status = "ok" if tp is not None else ("failed" if a == FAILED else "infeasible")
            ok = status == "ok"
            ref = a == REF
            rows.append({
                "order": order, "trial_id": f"t{order:03d}", "searcher": "phaze",
                "arch_key": _key(a), "arch_label": _label(a), "num_tc": a[0], "num_vc": a[1],
                "pe_x": a[2], "pe_y": a[3], "pe_vc": a[2], "glb_mb": float(a[4]), "area_mm2": area,
                "is_reference": ref, "model": m, "status": status,
                "error": ERROR if status == "failed" else "",
                "throughput": float(tp) if ok else 0.0,
                "time_per_batch_s": 4096 / tp if ok else math.nan,
                "p": 4 if ok else 0, "d": 64 if ok else 0, "t": 4 if ok else 0,
                "microbatch": 8 if ok else 0, "num_stages": 4 if ok else 0,
                "hbm_gb": 21.5 if ok else math.nan, "recompute": m == "gpt2-xl",
                "stages_json": json.dumps([{"first": 0, "last": 9, "devices": 256, "load_s": 0.1}] * 4)
                if ok else "[]",
                "expert_throughput": EXPERT[m][0] if ref else math.nan,
                "expert_pdt": EXPERT[m][1] if ref else "",
                "estimate_s": 1.0, "ilp_s": 2.0 if m == "bert-large" else 3.0, "dp_s": 0.5, "total_s": 4.0,
                "ilp_solved": 10, "cache_hits": 30, "ilp_lookups": 160, "ilp_unique": 40,
                "node_id": "n1", "hostname": "host-a", "pid": 1234, "finished_at": 1.7e9 + 60 * order,
            })
    return rows


def _placement(tp):
    return {"throughput": tp, "p": 4, "d": 64, "t": 4, "microbatch": 8, "recompute": False, "hbm_gb": 21.5,
            "num_stages": 4, "time_per_batch_s": 4096 / tp}


def _best():
    common = ARCHS[2]
    return {
        "models": MODELS, "num_devices": 1024, "global_batch": 4096, "searcher": "phaze",
        "evaluated": len(ARCHS), "failed": 1,
        "common": {"arch": {"num_tc": 16}, "arch_label": _label(common[0]), "area_mm2": common[1],
                   "throughput_avg": (common[2] + common[3]) / 2,
                   "per_model": {m: _placement(tp) for m, tp in zip(MODELS, common[2:])}},
        "per_model": {
            "bert-large": {"arch": {}, "arch_label": _label(ARCHS[1][0]), "area_mm2": ARCHS[1][1],
                           **_placement(1070.0)},
            "gpt2-xl": {"arch": {}, "arch_label": _label(ARCHS[2][0]), "area_mm2": ARCHS[2][1],
                        **_placement(260.0)},
        },
        "reference": {"arch_label": _label(REF), "per_model": {
            m: {"throughput": tp, "expert_throughput": EXPERT[m][0], "expert_pdt": EXPERT[m][1]}
            for m, tp in zip(MODELS, ARCHS[0][2:])}},
        "speedup_vs_reference": {"bert-large": 1.07, "gpt2-xl": 1.3},
    }


def _write(tmp_path, rows=None, best=True, drop=()):
    rows = _rows() if rows is None else rows
    table = pa.Table.from_pylist(rows)
    for c in drop:
        table = table.drop_columns([c])
    pq.write_table(table, tmp_path / "evaluations.parquet")
    if best:
        (tmp_path / "best.json").write_text(json.dumps(_best()))
    return tmp_path


def _assert_png(path):
    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_MAGIC, path


def _section(text, title):
    start = text.index(title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_report_contents_and_plots(tmp_path):
    out = _write(tmp_path)
    path = write_report(out)
    assert path == out / "report.md"
    text = path.read_text()

    # header
    assert "bert-large, gpt2-xl" in text
    assert "**Accelerators (K):** 1024" in text and "**Global batch:** 4096" in text
    assert "**Searcher:** phaze" in text
    assert "**Architectures evaluated:** 12 — 10 ok / 1 infeasible / 1 failed" in text

    # best architectures
    best = _section(text, "## Best architectures")
    assert _label(ARCHS[2][0]) in best and "655.0 samples/s on average" in best
    assert "| best for bert-large" in best and _label(ARCHS[1][0]) in best and "1,070.0" in best
    assert "{4,64,4}" in best

    # the Table 2 comparison: archplace on TPUv4 / expert, best / TPUv4, best / expert
    t2 = _section(text, "## Against TPUv4")
    bert = next(line for line in t2.splitlines() if line.startswith("| bert-large"))
    assert "{8,128,1}" in bert and "900.0" in bert and "1,000.0" in bert and "1,070.0" in bert
    assert f"{1000 / 900:.2f}×" in bert and "1.07×" in bert and f"{1070 / 900:.2f}×" in bert
    gpt = next(line for line in t2.splitlines() if line.startswith("| gpt2-xl"))
    assert "1.30×" in gpt and "1.25×" in gpt and f"{260 / 160:.2f}×" in gpt
    assert "reference not evaluated" not in text

    # time breakdown: bert 12 evaluations × (1 + 2 + 0.5) s; the two cache numbers apart: repeated
    # layers (160 - 40) / 160 of the lookups, schedule-cache hits 30 of the 40 distinct slices
    tb = _section(text, "## Time breakdown")
    bert = next(line for line in tb.splitlines() if line.startswith("| bert-large"))
    cells = [c.strip() for c in bert.strip("|").split("|")]
    assert cells[:3] == ["bert-large", "12", "12.0"] and cells[3] == "24.0" and cells[6] == "48.0"
    assert cells[7:] == ["1,920", "75.0 %", "480", "120", "360", "75.0 %"]
    all_row = next(line for line in tb.splitlines() if line.startswith("| all"))
    assert "96.0" in all_row and "240" in all_row and "720" in all_row

    # failures and infeasible
    fail = _section(text, "## Failures")
    assert ERROR in fail and _label(FAILED) in fail and "gpt2-xl" in fail
    assert _label(INFEASIBLE) in fail

    # top 10: ranked by average, the Phaze-common one first, the failed one not above the reference
    top = _section(text, "## Top 10")
    ranks = [line for line in top.splitlines()
             if line.startswith("|") and line.split("|")[1].strip().isdigit()]
    assert len(ranks) == 10 and _label(ARCHS[2][0]) in ranks[0] and "655.0" in ranks[0]
    assert any("(TPUv4 reference)" in line for line in ranks)

    # tables are aligned: every line of a table has the same length
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.startswith("|")]
        if lines:
            assert len({len(line) for line in lines}) == 1, block

    # plots, linked relatively
    plots = out / "plots"
    names = ["pareto_model_bert-large.png", "pareto_model_gpt2-xl.png", "pareto_average.png",
             "time_breakdown.png"]
    for name in names:
        _assert_png(plots / name)
        assert f"](plots/{name})" in text


def test_report_without_best_json_and_reference(tmp_path):
    rows = [r for r in _rows() if not r["is_reference"]]
    out = _write(tmp_path, rows=rows, best=False, drop=("expert_throughput", "ilp_s", "cache_hits"))
    text = write_report(out).read_text()
    assert "reference not evaluated" in text
    assert "best.json` not found" in text
    best = _section(text, "## Best architectures")
    assert _label(ARCHS[2][0]) in best and "655.0 samples/s on average" in best  # computed here
    assert _label(ARCHS[1][0]) in best
    assert "**Accelerators (K):** —" in text
    for name in ("pareto_model_bert-large.png", "pareto_average.png", "time_breakdown.png"):
        _assert_png(out / "plots" / name)


def test_report_all_infeasible(tmp_path):
    rows = [dict(r, status="infeasible", throughput=0.0) for r in _rows()]
    text = write_report(_write(tmp_path, rows=rows, best=False)).read_text()
    assert "**Architectures evaluated:** 12 — 0 ok / 12 infeasible / 0 failed" in text
    assert "no feasible architecture" in text
    assert _section(text, "## Failures").splitlines()[2] == "none"
    _assert_png(tmp_path / "plots" / "pareto_average.png")


def _brute_front(a, v):
    n = len(a)
    out = np.zeros(n, dtype=bool)
    for i in range(n):
        if math.isnan(a[i]) or math.isnan(v[i]):
            continue
        out[i] = not any(
            j != i and not (math.isnan(a[j]) or math.isnan(v[j]))
            and a[j] <= a[i] and v[j] >= v[i] and (a[j] < a[i] or v[j] > v[i])
            for j in range(n))
    return out


def test_pareto_front_hand_made():
    area = [1, 2, 2, 3, 4, 4, 5, np.nan]
    value = [1, 3, 2, 3, 5, 5, 4, 9]
    assert pareto_front(area, value).tolist() == [True, True, False, False, True, True, False, False]
    assert pareto_front([], []).tolist() == []
    with pytest.raises(ValueError):
        pareto_front([1, 2], [1])


@pytest.mark.parametrize("seed", range(8))
def test_pareto_front_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    # small integer grids force ties in area, in value and exact duplicates
    a = rng.integers(0, 15, n).astype(float)
    v = rng.integers(0, 15, n).astype(float)
    if seed % 2:
        a = rng.random(n) * 100
        v = rng.random(n) * 100
    a[rng.random(n) < 0.05] = np.nan
    assert np.array_equal(pareto_front(a, v), _brute_front(a, v))


def test_missing_directory_and_columns(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        write_report(tmp_path / "nope")
    with pytest.raises(ValueError, match="evaluations.parquet"):
        write_report(tmp_path)
    _write(tmp_path, drop=("throughput",))
    with pytest.raises(ValueError, match=r"evaluations\.parquet.*missing required column\(s\) throughput"):
        write_report(tmp_path)
    assert "throughput" in REQUIRED_COLUMNS
    (tmp_path / "evaluations.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="evaluations.parquet"):
        write_report(tmp_path)


def test_report_module_does_not_import_ray_or_pyplot():
    code = ("import sys, archplace.platform.report as r; "
            "assert 'ray' not in sys.modules and 'matplotlib.pyplot' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_report_minimal_columns_and_sparse_best_json(tmp_path):
    rows = [{c: r[c] for c in REQUIRED_COLUMNS} for r in _rows()]
    rows[8]["throughput"] = None  # a null in a core column (an ok row of a non-reference architecture)
    _write(tmp_path, rows=rows, best=False)
    (tmp_path / "best.json").write_text(json.dumps({
        "models": MODELS, "num_devices": None, "reference": None, "speedup_vs_reference": {},
        "common": {"arch_label": _label(ARCHS[2][0]), "throughput_avg": float("nan")},
        "per_model": {"bert-large": {"arch_label": _label(ARCHS[1][0]), "throughput": float("nan")}},
    }))
    text = write_report(tmp_path).read_text()
    best = _section(text, "## Best architectures")
    assert "655.0 samples/s on average" in best and "1,070.0" in best  # filled from the evaluations
    assert "1.07×" in _section(text, "## Against TPUv4")
    assert "**Accelerators (K):** —" in text
    assert "(no message)" in _section(text, "## Failures")  # no error column
    _assert_png(tmp_path / "plots" / "time_breakdown.png")


def test_pareto_plot_of_a_tiny_area_spread_is_readable(tmp_path):
    """16 designs within 0.1 mm² at ~249 mm² (a default run's neighbourhood of TPUv4): plain tick
    labels (no "+2.49e2" offset), distinct area ticks, and a zoomed inset that spreads the points out."""
    from archplace.platform.report import _plot_pareto

    pts = [(f"a{i}", 249.0 + i * 0.1 / 15, 1000.0 + 0.5 * i) for i in range(16)]
    fig = _plot_pareto(tmp_path / "p.png", "t", "samples/s", pts, pts[-1], pts[3], None)
    _assert_png(tmp_path / "p.png")
    (ax,) = fig.axes
    assert ax.xaxis.get_offset_text().get_text() == "" and ax.yaxis.get_offset_text().get_text() == ""
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert len(set(ticks)) >= 4 and all(t.startswith("249.") or t.startswith("248.") for t in ticks)
    (ins,) = ax.child_axes
    lo, hi = ins.get_ylim()
    assert 990 < lo < 1000 and 1007.5 < hi < 1010   # zoomed on the throughputs, not from 0
    assert ins.xaxis.get_offset_text().get_text() == ""
    # a wide spread: no inset; areas over two orders of magnitude: a log-spaced area axis
    wide = [("a", 10.0, 100.0), ("b", 100.0, 500.0), ("c", 1000.0, 900.0)]
    fig = _plot_pareto(tmp_path / "w.png", "t", "samples/s", wide, None, None)
    assert not fig.axes[0].child_axes and fig.axes[0].get_xscale() == "log"


def test_best_table_shows_the_layer_ilp_answer(tmp_path):
    """Each best placement says whether its layer schedules were proven optimal, else the worst proven
    gap and the slices without a bound (from the Parquet's ilp_* columns); best.json's own fields win."""
    rows = _rows()
    for r in rows:
        r["ilp_status"], r["ilp_worst_gap"], r["ilp_gap_unknown"] = json.dumps({"optimal": 5}), 0.0, 0
        r["ilp_load_dependent"] = 0
        if r["model"] == "gpt2-xl":
            r["ilp_status"] = json.dumps({"optimal": 3, "feasible": 2, "fallback": 1})
            r["ilp_worst_gap"], r["ilp_gap_unknown"] = 0.0734, 1
            r["ilp_load_dependent"] = 2  # two slices stopped by the wall-clock safety limit
    out = _write(tmp_path, rows=rows, best=False)
    text = write_report(out).read_text()
    header = next(ln for ln in text.splitlines() if ln.startswith("| Choice"))
    assert header.rstrip(" |").endswith("Layer ILP")
    best_bert = next(ln for ln in text.splitlines() if ln.startswith("| best for bert-large"))
    best_gpt = next(ln for ln in text.splitlines() if ln.startswith("| best for gpt2-xl"))
    assert best_bert.rstrip(" |").endswith("optimal")
    assert "worst gap 7.3%, 1 slice without a bound, 2 slices stopped by the wall clock" in best_gpt
    for r in rows:
        r["ilp_status"] = ""  # sequential schedules
    text = write_report(_write(tmp_path, rows=rows, best=False)).read_text()
    assert next(ln for ln in text.splitlines() if ln.startswith("| best for gpt2-xl")).rstrip(" |").endswith(
        "sequential")
