"""The report of a finished architecture search: ``DIR/report.md`` plus PNG plots in ``DIR/plots/``,
built from the search's ``DIR/evaluations.parquet`` (one row per architecture × model) and
``DIR/best.json`` (the search's own choice of the Phaze-common and per-model best architectures).

The parquet is the source of truth; ``best.json`` adds the run's settings (accelerator count, global
batch) and names the architectures the search picked. Every field other than ``models`` and the
parquet's core columns (``REQUIRED_COLUMNS``) may be missing or NaN; the report then shows "—".

Plots use matplotlib's Agg canvas through ``matplotlib.figure.Figure`` (never ``pyplot``), so no GUI
backend is touched, no global backend state changes and no figure outlives its function. matplotlib
is imported lazily: ``pareto_front`` and the module import work without it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .report_plots import _plot_pareto, _plot_times, pareto_front  # noqa: F401  (pareto_front re-exported)

# The columns without which no report can be made; everything else falls back to a default.
REQUIRED_COLUMNS = ("arch_key", "arch_label", "area_mm2", "is_reference", "model", "status", "throughput")

_OPTIONAL_DEFAULTS: dict[str, Any] = {
    "order": None, "trial_id": "", "searcher": "", "num_tc": None, "num_vc": None, "pe_x": None,
    "pe_y": None, "pe_vc": None, "glb_mb": math.nan, "error": "", "time_per_batch_s": math.nan,
    "p": 0, "d": 0, "t": 0, "microbatch": 0, "num_stages": 0, "hbm_gb": math.nan, "recompute": None,
    "stages_json": "", "expert_throughput": math.nan, "expert_pdt": "", "estimate_s": math.nan,
    "ilp_s": math.nan, "dp_s": math.nan, "total_s": math.nan, "ilp_solved": 0, "cache_hits": 0,
    "ilp_lookups": 0, "ilp_unique": 0, "ilp_status": "", "ilp_worst_gap": math.nan, "ilp_gap_unknown": 0,
    "ilp_load_dependent": 0, "node_id": "", "hostname": "", "pid": None, "finished_at": math.nan,
}
_FLOAT_FIELDS = ("area_mm2", "throughput", "glb_mb", "time_per_batch_s", "hbm_gb", "expert_throughput",
                 "estimate_s", "ilp_s", "dp_s", "total_s", "finished_at")
_INT_FIELDS = ("p", "d", "t", "microbatch", "num_stages", "ilp_solved", "cache_hits", "ilp_lookups",
               "ilp_unique")
_PLACEMENT_FIELDS = ("throughput", "p", "d", "t", "microbatch", "recompute", "hbm_gb", "num_stages",
                     "time_per_batch_s", "ilp_status", "ilp_worst_gap", "ilp_gap_unknown",
                     "ilp_load_dependent")
DASH = "—"


# ---------------------------------------------------------------------------------------------- helpers
def _num(x: Any) -> float:
    """A float, NaN for None / non-numbers."""
    if x is None or isinstance(x, (str, bytes)):
        return math.nan
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _int(x: Any) -> int:
    f = _num(x)
    return int(f) if math.isfinite(f) else 0


def _finite(x: Any) -> bool:
    return math.isfinite(_num(x))


def _f(x: Any, digits: int = 1, suffix: str = "") -> str:
    """A number with thousands separators, or a dash."""
    f = _num(x)
    return f"{f:,.{digits}f}{suffix}" if math.isfinite(f) else DASH


def _ratio(num: Any, den: Any) -> str:
    n, d = _num(num), _num(den)
    if not (math.isfinite(n) and math.isfinite(d)) or d <= 0:
        return DASH
    return f"{n / d:.2f}×"


def _pdt(e: dict[str, Any]) -> str:
    p, d, t = (_int(e.get(k)) for k in ("p", "d", "t"))
    return f"{{{p},{d},{t}}}" if p and d and t else DASH


def _yes_no(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    return "yes" if bool(x) else "no"


def _cell(x: Any) -> str:
    s = str(x).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    return s.strip() or DASH


def _ilp_cell(e: dict[str, Any]) -> str:
    """The layer ILP's answer behind a placement: "optimal" when every slice was proven optimal (or
    trivial), else the worst proven gap and how many slices have no bound; how many slices the wall
    clock stopped (load-dependent); "sequential" without the ILP (``--schedule sequential``, old files)."""
    st = e.get("ilp_status")
    if isinstance(st, str):
        try:
            st = json.loads(st) if st else {}
        except ValueError:
            st = {}
    if not isinstance(st, dict) or not st:
        return "sequential"
    unknown, load = (_int(e.get(f"ilp_{k}")) for k in ("gap_unknown", "load_dependent"))
    gap, done = _num(e.get("ilp_worst_gap")), set(st) <= {"optimal", "trivial"}
    parts = ["optimal"] if done else [f"worst gap {gap:.1%}"] if math.isfinite(gap) else []
    if unknown and not done:
        parts.append(f"{unknown} slice{'s' if unknown != 1 else ''} without a bound")
    if load:
        parts.append(f"{load} slice{'s' if load != 1 else ''} stopped by the wall clock")
    return ", ".join(parts) or "not proven optimal"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str) -> str:
    """A Markdown table padded so columns line up in the source too; ``align`` has one ``l`` or ``r``
    per column."""
    cells = [[_cell(h) for h in headers]] + [[_cell(c) for c in r] for r in rows]
    widths = [max(3, *(len(r[i]) for r in cells)) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if a == "r" else c.ljust(w)
                                 for c, w, a in zip(r, widths, align)) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if a == "r" else (":" + "-" * (w - 1))
                            for w, a in zip(widths, align)) + " |"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "model"


# ---------------------------------------------------------------------------------------------- loading
def _load_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise ValueError(f"{path}: cannot read the evaluations: {str(e).splitlines()[0] if str(e) else e}") \
            from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing required column(s) {', '.join(missing)}")
    data = table.to_pydict()
    rows = []
    for i in range(table.num_rows):
        r = {k: data[k][i] for k in data}
        for k, default in _OPTIONAL_DEFAULTS.items():
            if r.get(k) is None:
                r[k] = default
        for k in _FLOAT_FIELDS:
            r[k] = _num(r.get(k))
        for k in _INT_FIELDS:
            r[k] = _int(r.get(k))
        r["arch_key"] = str(r["arch_key"] if r["arch_key"] is not None else "")
        r["arch_label"] = str(r["arch_label"] or r["arch_key"])
        r["model"] = str(r["model"] if r["model"] is not None else "")
        r["status"] = str(r["status"] or "").strip().lower() or "failed"
        r["is_reference"] = bool(r["is_reference"])
        r["error"] = str(r["error"] or "")
        r["expert_pdt"] = str(r["expert_pdt"] or "")
        if r["status"] != "ok":
            r["throughput"] = 0.0
        r["_index"] = i
        rows.append(r)
    return rows


def _load_best(path: Path) -> tuple[dict[str, Any], str]:
    """best.json as a dict (empty when missing) and a note when it could not be read."""
    if not path.exists():
        return {}, f"`{path.name}` not found; the best architectures are computed from the evaluations."
    try:
        best = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return {}, f"`{path.name}` could not be read ({e}); the best architectures are computed here."
    if not isinstance(best, dict):
        return {}, f"`{path.name}` is not a JSON object; the best architectures are computed here."
    return best, ""


def _d(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


class _Search:
    """The evaluations indexed by architecture and model."""

    def __init__(self, rows: list[dict[str, Any]], best: dict[str, Any]):
        self.best = best
        models = [str(m) for m in best.get("models") or [] if m is not None]
        for r in rows:
            if r["model"] not in models:
                models.append(r["model"])
        self.models = models
        self.rows = rows
        # one row per (architecture, model): an ok row beats a failed one, then the latest wins
        chosen: dict[tuple[str, str], dict[str, Any]] = {}
        for r in rows:
            key = (r["arch_key"], r["model"])
            old = chosen.get(key)
            if old is None or self._rank(r) >= self._rank(old):
                chosen[key] = r
        self.archs: dict[str, dict[str, Any]] = {}
        for r in sorted(chosen.values(), key=lambda r: r["_index"]):
            a = self.archs.setdefault(r["arch_key"], {"key": r["arch_key"], "label": r["arch_label"],
                                                      "area": r["area_mm2"], "is_reference": False,
                                                      "rows": {}})
            a["rows"][r["model"]] = r
            a["is_reference"] = a["is_reference"] or r["is_reference"]
            if not math.isfinite(a["area"]):
                a["area"] = r["area_mm2"]
        for a in self.archs.values():
            statuses = [a["rows"][m]["status"] if m in a["rows"] else "missing" for m in models]
            a["status"] = ("failed" if "failed" in statuses else "infeasible" if "infeasible" in statuses
                           else "incomplete" if any(s != "ok" for s in statuses) else "ok")
            tps = [a["rows"][m]["throughput"] for m in models if m in a["rows"]]
            a["avg"] = float(np.mean(tps)) if len(tps) == len(models) and models else math.nan
        self.by_label = {a["label"]: a for a in self.archs.values()}
        self.reference = next((a for a in self.archs.values() if a["is_reference"]), None)

    @staticmethod
    def _rank(r: dict[str, Any]) -> tuple:
        t = r["finished_at"]
        return (r["status"] == "ok", t if math.isfinite(t) else -math.inf, r["order"] or 0, r["_index"])

    # ------------------------------------------------------------------ best architectures
    def _entry(self, arch: dict[str, Any] | None, model: str, given: dict[str, Any],
               label: str | None = None, area: Any = None) -> dict[str, Any]:
        """A placement record for ``model`` on an architecture: best.json's fields where present and
        finite, the evaluation row's otherwise."""
        row = (arch or {}).get("rows", {}).get(model, {})
        e: dict[str, Any] = {"label": label or (arch or {}).get("label") or DASH,
                             "area": _num(area) if _finite(area) else _num((arch or {}).get("area"))}
        for k in _PLACEMENT_FIELDS:
            v = given.get(k)
            bad = v is None or (isinstance(v, float) and math.isnan(v))
            e[k] = row.get(k) if bad else v
        return e

    def common(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]], float]:
        """The Phaze-common architecture, its per-model placements and its average throughput."""
        given = _d(self.best.get("common"))
        arch = self.by_label.get(given.get("arch_label")) if given.get("arch_label") else None
        if not given.get("arch_label"):
            cands = [a for a in self.archs.values() if math.isfinite(a["avg"]) and a["avg"] > 0]
            arch = max(cands, key=lambda a: (a["avg"], -_num(a["area"])), default=None)
            if arch is None:
                return None, [], math.nan
        per = _d(given.get("per_model"))
        entries = [dict(self._entry(arch, m, _d(per.get(m)), given.get("arch_label"), given.get("area_mm2")),
                        model=m) for m in self.models]
        avg = _num(given.get("throughput_avg"))
        if not math.isfinite(avg):
            avg = arch["avg"] if arch else math.nan
        return arch, entries, avg

    def best_for(self, model: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The best architecture for ``model`` and its placement record."""
        given = _d(_d(self.best.get("per_model")).get(model))
        if given.get("arch_label"):
            arch = self.by_label.get(given["arch_label"])
            return arch, self._entry(arch, model, given, given["arch_label"], given.get("area_mm2"))
        cands = [a for a in self.archs.values()
                 if model in a["rows"] and a["rows"][model]["status"] == "ok"
                 and math.isfinite(a["rows"][model]["throughput"])]
        arch = max(cands, key=lambda a: (a["rows"][model]["throughput"], -_num(a["area"])), default=None)
        return arch, (self._entry(arch, model, {}) if arch else None)


# ---------------------------------------------------------------------------------------------- sections
def _wall(seconds: float) -> str:
    """``47.1 s``, or ``169.0 s (2.8 min)`` from two minutes: the summary's figure, as it prints it."""
    return f"{seconds:.1f} s" + (f" ({seconds / 60:,.1f} min)" if seconds >= 120 else "")


def _load_wall(path: Path) -> float | None:
    """The wall time of the search's last run, from search.json (None for a search that predates it)."""
    try:
        wall = json.loads(path.read_text()).get("wall_s")
    except (OSError, ValueError, AttributeError):
        return None
    return float(wall) if isinstance(wall, (int, float)) and math.isfinite(wall) and wall >= 0 else None


def _header(s: _Search, out_dir: Path, note: str, wall_s: float | None = None) -> list[str]:
    b = s.best
    rows = s.rows
    n_status = {k: sum(1 for a in s.archs.values() if a["status"] == k)
                for k in ("ok", "infeasible", "failed", "incomplete")}
    r_status = {k: sum(1 for r in rows if r["status"] == k) for k in ("ok", "infeasible", "failed")}
    searchers = b.get("searcher") or ", ".join(sorted({str(r["searcher"]) for r in rows if r["searcher"]}))
    lines = ["# Architecture search report", "", f"Results in `{out_dir}`.", "",
             f"- **Models:** {', '.join(s.models) if s.models else DASH}",
             f"- **Accelerators (K):** {_int(b.get('num_devices')) or DASH}",
             f"- **Global batch:** {_int(b.get('global_batch')) or DASH}",
             f"- **Searcher:** {searchers or DASH}",
             f"- **Architectures evaluated:** {len(s.archs)} — {n_status['ok']} ok / "
             f"{n_status['infeasible']} infeasible / {n_status['failed']} failed"
             + (f" / {n_status['incomplete']} incomplete" if n_status["incomplete"] else ""),
             f"- **Evaluations (architecture × model):** {len(rows)} — {r_status['ok']} ok / "
             f"{r_status['infeasible']} infeasible / {r_status['failed']} failed"]
    hosts = {str(r["hostname"] or r["node_id"]) for r in rows if r["hostname"] or r["node_id"]}
    times = [r["finished_at"] for r in rows if math.isfinite(r["finished_at"])]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    if hosts or span > 0:
        # the evaluations' own span only where the run's wall time is not recorded (an older search),
        # and never a zero one: one architecture finishes at one time
        lines.append(f"- **Ran on:** {len(hosts) or DASH} host(s)"
                     + (f", evaluations finishing over {_wall(span)}" if span > 0 and wall_s is None else ""))
    if wall_s is not None:
        lines.append(f"- **Wall time:** {_wall(wall_s)} — the last run, from the command's start to its "
                     "evaluations.parquet (Ray's start-up, the model graphs and the evaluations included)")
    lines.append("")
    lines.append("An architecture is *infeasible* when no placement fits in memory for some model, "
                 "*failed* when an evaluation raised.")
    if note:
        lines += ["", f"> {note}"]
    return lines


def _best_section(s: _Search) -> list[str]:
    lines = ["## Best architectures", ""]
    arch, entries, avg = s.common()
    rows = []
    if entries:
        for e in entries:
            rows.append(["Phaze-common", e["model"], e["label"], _f(e["area"]), _f(e["throughput"]),
                         _pdt(e), _int(e["microbatch"]) or DASH, _yes_no(e["recompute"]),
                         _f(e["hbm_gb"]), _int(e["num_stages"]) or DASH, _ilp_cell(e)])
        lines.append(f"Phaze-common (the highest throughput averaged over the models): "
                     f"**{entries[0]['label']}**, {_f(avg)} samples/s on average.")
    else:
        lines.append("No architecture ran every model.")
    for m in s.models:
        _, e = s.best_for(m)
        if e is None:
            rows.append([f"best for {m}", m, "no feasible architecture"] + [DASH] * 8)
            continue
        rows.append([f"best for {m}", m, e["label"], _f(e["area"]), _f(e["throughput"]), _pdt(e),
                     _int(e["microbatch"]) or DASH, _yes_no(e["recompute"]), _f(e["hbm_gb"]),
                     _int(e["num_stages"]) or DASH, _ilp_cell(e)])
    lines += ["", _table(["Choice", "Model", "Architecture", "Area (mm²)", "samples/s", "{p,d,t}",
                          "Microbatch", "Recompute", "HBM (GB)", "Stages", "Layer ILP"], rows, "lllrrlrlrrl")]
    return lines


def _reference_section(s: _Search) -> list[str]:
    lines = ["## Against TPUv4 (the paper's Table 2 comparison)", ""]
    ref = s.reference
    if ref is None:
        return lines + ["TPUv4: reference not evaluated."]
    given_ref = _d(_d(s.best.get("reference")).get("per_model"))
    lines.append(f"TPUv4 reference {ref['label']} ({_f(ref['area'])} mm²) with the Phaze paper's expert "
                 "{p,d,t} (Table 4) and with archplace's placement, against the best architecture for "
                 "each model with archplace's placement.")
    rows = []
    for m in s.models:
        r = ref["rows"].get(m)
        g = _d(given_ref.get(m))
        expert = r["expert_throughput"] if r and math.isfinite(r["expert_throughput"]) \
            else _num(g.get("expert_throughput"))
        expert_pdt = (r["expert_pdt"] if r and r["expert_pdt"] else str(g.get("expert_pdt") or ""))
        if r is None:
            ours = _num(g.get("throughput"))
            ours_pdt = DASH
        else:
            ours = r["throughput"] if r["status"] == "ok" else 0.0
            ours_pdt = _pdt(r) if r["status"] == "ok" else r["status"]
        arch, e = s.best_for(m)
        best = _num(e["throughput"]) if e else math.nan
        rows.append([m, f"{{{expert_pdt}}}" if expert_pdt else DASH, _f(expert), ours_pdt, _f(ours),
                     e["label"] if e else DASH, _f(best),
                     _ratio(ours, expert), _ratio(best, ours), _ratio(best, expert)])
    lines += ["", _table(["Model", "Expert {p,d,t}", "TPUv4 expert (samples/s)", "archplace {p,d,t}",
                          "TPUv4 archplace (samples/s)", "Best architecture", "Best (samples/s)",
                          "archplace / expert", "best / TPUv4 archplace", "best / expert"],
                         rows, "llrlrlrrrr")]
    lines += ["", "A dash: the model has no expert strategy, or a throughput is zero (infeasible)."]
    return lines


def _pareto_section(s: _Search, plots: Path) -> tuple[list[str], list[Path]]:
    lines = ["## Throughput vs area with the Pareto front", "",
             "Each point is a feasible architecture; the step line is the Pareto front (the highest "
             "throughput at no more area)."]
    written = []
    common_arch, _, common_avg = s.common()
    ref = s.reference
    for m in s.models:
        pts = [(a["label"], a["area"], a["rows"][m]["throughput"]) for a in s.archs.values()
               if m in a["rows"] and a["rows"][m]["status"] == "ok" and math.isfinite(a["area"])]
        rr = ref["rows"].get(m) if ref else None
        ref_pt = (ref["label"], ref["area"], rr["throughput"]) if rr and rr["status"] == "ok" else None
        arch, e = s.best_for(m)
        best_pt = (e["label"], e["area"], _num(e["throughput"])) if e and _finite(e["area"]) \
            and _finite(e["throughput"]) else None
        cr = common_arch["rows"].get(m) if common_arch else None
        common_pt = (common_arch["label"], common_arch["area"], cr["throughput"]) \
            if cr and cr["status"] == "ok" else None
        path = plots / f"pareto_model_{_slug(m)}.png"
        _plot_pareto(path, f"{m}: throughput vs area", "samples/s", pts, ref_pt, best_pt, common_pt)
        n_front = int(pareto_front([p[1] for p in pts], [p[2] for p in pts]).sum()) if pts else 0
        lines += ["", f"### {m}", "", f"{len(pts)} feasible architectures, {n_front} on the Pareto front.",
                  "", f"![{m}: throughput vs area](plots/{path.name})"]
        written.append(path)
    pts = [(a["label"], a["area"], a["avg"]) for a in s.archs.values()
           if a["status"] == "ok" and math.isfinite(a["avg"]) and math.isfinite(a["area"])]
    ref_pt = (ref["label"], ref["area"], ref["avg"]) if ref and ref["status"] == "ok" else None
    common_pt = (common_arch["label"], common_arch["area"], common_avg) \
        if common_arch and math.isfinite(common_avg) and math.isfinite(common_arch["area"]) else None
    path = plots / "pareto_average.png"
    _plot_pareto(path, "Average over the models: throughput vs area", "samples/s (average over models)",
                 pts, ref_pt, None, common_pt)
    n_front = int(pareto_front([p[1] for p in pts], [p[2] for p in pts]).sum()) if pts else 0
    lines += ["", "### Average over the models", "",
              f"{len(pts)} architectures feasible for every model, {n_front} on the Pareto front.", "",
              f"![Average over the models: throughput vs area](plots/{path.name})"]
    written.append(path)
    return lines, written


def _time_section(s: _Search, plots: Path) -> tuple[list[str], list[Path]]:
    lines = ["## Time breakdown", "",
             "Seconds summed over all evaluations of each model (every status); *other* is the total "
             "minus estimation, ILP and DP. Two different savings on the layer ILPs: *repeated layers* "
             "are layer lookups answered by an identical layer of the same architecture (a transformer's "
             "blocks; lookups - distinct slices), and *schedule-cache hits* are distinct slices answered "
             "without a solve by the search's schedule cache (earlier trials, a resumed run, or another "
             "search's cache file), as a share of the distinct slices."]
    parts: dict[str, list[float]] = {"estimation": [], "ILP": [], "DP": [], "other": []}
    solved, hits, table = [], [], []

    def sums(rs: list[dict[str, Any]]) -> tuple[float, float, float, float, float, int, int, int, int]:
        def tot(k: str) -> float:
            v = [r[k] for r in rs if math.isfinite(r[k])]
            return float(sum(v)) if v else math.nan

        est, ilp, dp, total = tot("estimate_s"), tot("ilp_s"), tot("dp_s"), tot("total_s")
        known = sum(x for x in (est, ilp, dp) if math.isfinite(x))
        other = max(0.0, total - known) if math.isfinite(total) else math.nan
        return (est, ilp, dp, other, total, sum(r["ilp_solved"] for r in rs),
                sum(r["cache_hits"] for r in rs),
                sum(r["ilp_lookups"] for r in rs), sum(r["ilp_unique"] for r in rs))

    def row(name: str, rs: list[dict[str, Any]]) -> list[Any]:
        est, ilp, dp, other, total, n_solved, n_hits, lookups, unique = sums(rs)
        dedup = _f(100.0 * (lookups - unique) / lookups, 1, " %") if lookups else DASH
        rate = _f(100.0 * n_hits / unique, 1, " %") if unique else DASH
        return [name, len(rs), _f(est), _f(ilp), _f(dp), _f(other), _f(total), f"{lookups:,}", dedup,
                f"{unique:,}", f"{n_solved:,}", f"{n_hits:,}", rate]

    for m in s.models:
        rs = [r for r in s.rows if r["model"] == m]
        est, ilp, dp, other, _total, n_solved, n_hits, _, _ = sums(rs)
        for k, v in zip(parts, (est, ilp, dp, other)):
            parts[k].append(v)
        solved.append(n_solved)
        hits.append(n_hits)
        table.append(row(m, rs))
    table.append(row("all", s.rows))
    lines += ["", _table(["Model", "Evaluations", "Estimation (s)", "ILP (s)", "DP (s)", "Other (s)",
                          "Total (s)", "Layer lookups", "Repeated layers", "Distinct slices", "Solved",
                          "Schedule-cache hits", "Hit rate"], table, "lrrrrrrrrrrrr")]
    path = plots / "time_breakdown.png"
    _plot_times(path, s.models, parts, solved, hits)
    lines += ["", f"![Time breakdown](plots/{path.name})"]
    return lines, [path]


def _failures_section(s: _Search) -> list[str]:
    lines = ["## Failures", ""]
    failed = [r for r in s.rows if r["status"] == "failed"]
    if not failed:
        lines.append("none")
    else:
        rows = []
        for r in sorted(failed, key=lambda r: (r["arch_label"], r["model"], r["_index"])):
            err = r["error"].strip().splitlines()
            msg = err[0] if err else "(no message)"
            if len(msg) > 300:
                msg = msg[:297] + "..."
            rows.append([r["arch_label"], r["model"], r["trial_id"] or DASH, r["hostname"] or DASH, msg])
        lines.append(_table(["Architecture", "Model", "Trial", "Host", "Error"], rows, "lllll"))
    infeasible = sorted({a["label"] for a in s.archs.values() if a["status"] == "infeasible"})
    if infeasible:
        lines += ["", f"Infeasible (no placement fits in memory for some model): {len(infeasible)} "
                      f"architecture(s): {', '.join(infeasible[:20])}"
                      + (f" and {len(infeasible) - 20} more" if len(infeasible) > 20 else "") + "."]
    return lines


def _top_section(s: _Search, n: int = 10) -> list[str]:
    lines = [f"## Top {n} architectures by average throughput", ""]
    ranked = sorted((a for a in s.archs.values() if math.isfinite(a["avg"])),
                    key=lambda a: (-a["avg"], _num(a["area"]) if _finite(a["area"]) else math.inf))[:n]
    if not ranked:
        return lines + ["No architecture was evaluated on every model."]
    rows = []
    for i, a in enumerate(ranked, 1):
        per = [_f(a["rows"][m]["throughput"]) if a["rows"][m]["status"] == "ok" else a["rows"][m]["status"]
               for m in s.models]
        per_area = a["avg"] / a["area"] if _finite(a["area"]) and a["area"] > 0 else math.nan
        label = a["label"] + (" (TPUv4 reference)" if a["is_reference"] else "")
        rows.append([i, label, _f(a["area"]), _f(a["avg"]), *per, _f(per_area, 2), a["status"]])
    lines.append(_table(["#", "Architecture", "Area (mm²)", "Average (samples/s)",
                         *(f"{m} (samples/s)" for m in s.models), "samples/s per mm²", "Status"],
                        rows, "rlrr" + "r" * len(s.models) + "rl"))
    return lines


# ---------------------------------------------------------------------------------------------- entry
def write_report(out_dir: str | Path) -> Path:
    """Write ``out_dir/report.md`` and its plots under ``out_dir/plots/``; returns the report's path.
    Raises ``ValueError`` when the directory or its ``evaluations.parquet`` is missing or the parquet
    lacks a required column."""
    out = Path(out_dir)
    if not out.is_dir():
        raise ValueError(f"search results directory {str(out)!r} does not exist")
    parquet = out / "evaluations.parquet"
    if not parquet.is_file():
        raise ValueError(f"{parquet}: evaluations file not found (is {str(out)!r} a search's --out "
                         "directory?)")
    rows = _load_rows(parquet)
    best, note = _load_best(out / "best.json")
    s = _Search(rows, best)
    plots = out / "plots"
    plots.mkdir(exist_ok=True)

    pareto_lines, _ = _pareto_section(s, plots)
    time_lines, _ = _time_section(s, plots)
    header = _header(s, out, note, _load_wall(out / "search.json"))
    sections = [header, _best_section(s), _reference_section(s), pareto_lines, time_lines,
                _failures_section(s), _top_section(s)]
    text = "\n\n".join("\n".join(sec) for sec in sections) + "\n"
    path = out / "report.md"
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m archplace.platform.report DIR``."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m archplace.platform.report DIR", file=sys.stderr)
        return 2
    try:
        print(write_report(args[0]))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
