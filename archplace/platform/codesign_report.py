"""The report of a co-design search (``--target mcm`` or ``gpu-cluster``): ``DIR/report.md`` and the
throughput-vs-cost Pareto plot ``DIR/plots/pareto_cost.png``, from ``evaluations.parquet`` and
``best.json``. ``archplace report DIR`` picks this report or the Phaze one from ``search.json``'s
``target`` (:func:`write_any_report`).

Plots: matplotlib's ``Figure`` on the Agg canvas, never ``pyplot`` (as ``report.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from .report import pareto_front

OBJECTIVE = "throughput_per_kusd"   # average throughput per thousand USD: the co-design searches' single goal


def pareto_mask(throughput: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Designs no other design beats on both (throughput >=, cost <=, one strictly)."""
    return pareto_front(cost, throughput)


def write_any_report(out_dir: str | Path) -> Path:
    """The report a search directory calls for: this one for a co-design target, else Phaze's."""
    out = Path(out_dir)
    meta_path = out / "search.json"
    target = None
    if meta_path.exists():
        try:
            target = json.loads(meta_path.read_text()).get("target")
        except ValueError:
            target = None
    if target in ("mcm", "gpu-cluster"):
        return write_report(out)
    from .report import write_report as phaze_report

    return phaze_report(out)


def _f(x: Any, digits: int = 2) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "—"
    return f"{v:,.{digits}f}" if math.isfinite(v) else "—"


def _designs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["arch_key"], []).append(r)
    out = []
    for key, rs in by.items():
        ok = all(r["status"] == "ok" for r in rs)
        tp = float(np.mean([r["throughput"] for r in rs])) if ok else 0.0
        out.append({"arch_key": key, "label": rs[0]["arch_label"], "ok": ok, "throughput_avg": tp,
                    "cost_usd": float(rs[0]["cost_usd"]), "rows": rs})
    return out


def _plot(path: Path, ds: list[dict[str, Any]], best: dict[str, Any], unit: str, cost: str) -> None:
    from matplotlib.figure import Figure

    ok = [d for d in ds if d["ok"] and d["throughput_avg"] > 0 and math.isfinite(d["cost_usd"])]
    fig = Figure(figsize=(7.0, 4.8))
    ax = fig.subplots()
    if ok:
        tp = np.array([d["throughput_avg"] for d in ok])
        c = np.array([d["cost_usd"] for d in ok])
        on = pareto_mask(tp, c)
        ax.scatter(c[~on], tp[~on], s=14, color="0.7", label="evaluated")
        order = np.argsort(c[on])
        ax.plot(c[on][order], tp[on][order], "o-", color="C0", label="Pareto front")
        common = best.get("common")
        if common:
            ax.scatter([common["cost_usd"]], [common["throughput_avg"]], s=90, marker="*", color="C3",
                       label=f"best {OBJECTIVE}", zorder=5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(cost)
    ax.set_ylabel(f"average throughput ({unit})")
    ax.set_title(f"{best.get('target')}: throughput vs cost ({len(ok)} feasible of {len(ds)} designs)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, format="png")


def write_report(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    best = json.loads((out / "best.json").read_text())
    rows = pq.read_table(out / "evaluations.parquet").to_pylist()
    ds = _designs(rows)
    unit, cost = best.get("throughput_unit", ""), best.get("cost", "cost (USD)")
    plot = out / "plots" / "pareto_cost.png"
    _plot(plot, ds, best, unit, cost)
    lines = [f"# Co-design search: {best.get('target')}", "",
             f"Models: {', '.join(best['models'])}. Searcher {best.get('searcher')}"
             + (f", placer {best['placer']}" if best.get("placer") else "")
             + f". {best['evaluated']} designs evaluated ({best['failed']} failed, {best['infeasible']} "
             f"infeasible for some model). Objective: average throughput per thousand USD ({OBJECTIVE}).", ""]
    c = best.get("common")
    if c is None:
        lines += ["No design was feasible for every model.", ""]
    else:
        lines += ["## Best design", "", f"**{c['arch_label']}**: average {_f(c['throughput_avg'], 1)} {unit} "
                  f"at {_f(c['cost_usd'])} USD ({_f(c[OBJECTIVE], 1)} per k$).", "",
                  "| field | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in c["hardware"].items()]
        for k in ("chiplet_area_mm2", "silicon_area_mm2", "die_yield", "kgd_usd", "package_yield",
                  "peak_tops"):
            if k in c:
                lines.append(f"| {k} | {_f(c[k], 3)} |")
        lines += ["", "| model | throughput | status | details |", "|---|---:|---|---|"]
        for m, p in c["per_model"].items():
            if "chips_used" in p:
                det = (f"{p['chips_used']} chips used, placer {p['placer']}, {p['subsolves']} sub-solves"
                       + (", fell back to greedy" if p.get("fallback") else ""))
            else:
                det = (f"iteration {_f(p.get('iteration_time_s'), 4)} s, "
                       f"{_f(p.get('cost_per_step_usd'), 4)} USD/step")
            lines.append(f"| {m} | {_f(p['throughput'], 1)} | {p['status']} | {det} |")
        lines.append("")
    lines += ["## Pareto front (throughput vs cost)", "", f"![Pareto](plots/{plot.name})", "",
              f"| design | {cost} | average throughput ({unit}) | per k$ |", "|---|---:|---:|---:|"]
    lines += [f"| {p['arch_label']} | {_f(p['cost_usd'])} | {_f(p['throughput_avg'], 1)} | "
              f"{_f(p[OBJECTIVE], 1)} |" for p in best.get("pareto", [])]
    if best.get("target") == "mcm":
        topo = {}
        for d in ds:
            if d["ok"]:
                t = d["rows"][0]["topology"]
                topo[t] = max(topo.get(t, 0.0), d["throughput_avg"] / d["cost_usd"] * 1e3)
        if topo:
            lines += ["", "Best throughput per k$ by topology: "
                      + ", ".join(f"{t} {_f(v, 1)}" for t, v in sorted(topo.items()))
                      + " (a mesh runs the ring's chain with shortcuts for tensors that skip chips and "
                      "pays for 4 D2D ports instead of 2; see platform/mcm_trial.py)."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
