"""The search report's figures and its Pareto front: matplotlib's Agg canvas through
``matplotlib.figure.Figure`` (never ``pyplot``, so no GUI backend is needed), imported lazily, so
``pareto_front`` and importing this module work without matplotlib."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


# ---------------------------------------------------------------------------------------------- Pareto
def pareto_front(area: Sequence[float] | np.ndarray, value: Sequence[float] | np.ndarray) -> np.ndarray:
    """Boolean mask of the points on the Pareto front of (small ``area``, large ``value``): a point is
    on the front when no other point has area <= and value >= with at least one of the two strict.
    Points with a NaN coordinate are never on the front and dominate nothing; exact duplicates do not
    dominate each other, so both stay on the front. O(n log n)."""
    a = np.asarray(area, dtype=np.float64).ravel()
    v = np.asarray(value, dtype=np.float64).ravel()
    if a.shape != v.shape:
        raise ValueError(f"pareto_front: area and value differ in length ({a.size} vs {v.size})")
    mask = np.zeros(a.size, dtype=bool)
    idx = np.flatnonzero(~(np.isnan(a) | np.isnan(v)))
    if idx.size == 0:
        return mask
    order = idx[np.lexsort((-v[idx], a[idx]))]  # area ascending, value descending within an area
    a_s, v_s = a[order], v[order]
    _, starts, inverse = np.unique(a_s, return_index=True, return_inverse=True)
    group_max = v_s[starts]  # the largest value at each distinct area
    # the largest value at any strictly smaller area
    prev_max = np.concatenate(([-np.inf], np.maximum.accumulate(group_max)[:-1]))
    mask[order] = (v_s == group_max[inverse]) & (v_s > prev_max[inverse])
    return mask


# ---------------------------------------------------------------------------------------------- plots
def _figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (7.0, 4.8)):
    from matplotlib.figure import Figure  # the Agg canvas is used on save; pyplot is never imported

    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes.ravel()


def _plain_axes(ax) -> None:
    """Tick labels as plain numbers: no offset ("+2.49e2") and no scientific notation, so that a reader
    can read an area or a throughput off the axis."""
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() != "linear":
            continue
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_scientific(False)
        axis.set_major_formatter(fmt)


TINY_SPREAD = 0.05   # relative spread below which the throughput-vs-area plot gets a zoomed inset
LOG_AREA_RATIO = 30.0  # areas spanning more than this factor: log-spaced area axis


def _spread(x: np.ndarray) -> float:
    """(max - min) / max of the finite positive values; 0 for fewer than two."""
    x = x[np.isfinite(x)]
    return float((x.max() - x.min()) / abs(x.max())) if x.size > 1 and x.max() != 0 else 0.0


def _plot_pareto(path: Path, title: str, ylabel: str, points: list[tuple[str, float, float]],
                 reference: tuple[str, float, float] | None, best: tuple[str, float, float] | None,
                 common: tuple[str, float, float] | None = None):
    """Throughput vs area with the Pareto front; returns the figure (saved to ``path``). Axes carry
    plain numbers (no offset notation). When the designs' areas or throughputs lie within
    ``TINY_SPREAD`` of each other, a zoomed inset shows them spread out (the main axes start the
    throughput at 0, where such points would sit on top of each other); areas spanning more than
    ``LOG_AREA_RATIO`` get a log-spaced area axis."""
    fig, (ax,) = _figure()
    if points:
        area = np.array([p[1] for p in points])
        value = np.array([p[2] for p in points])
        on = pareto_front(area, value)
        ax.scatter(area[~on], value[~on], s=18, color="tab:gray", alpha=0.6, label="evaluated")
        ax.scatter(area[on], value[on], s=26, color="tab:blue", label="Pareto front", zorder=3)
        o = np.argsort(area[on], kind="stable")
        fx, fy = area[on][o], value[on][o]
        xmax = float(np.nanmax(area))
        ax.step(np.append(fx, xmax), np.append(fy, fy[-1]), where="post", color="tab:blue", lw=1.4)
        if reference is not None:
            ax.scatter([reference[1]], [reference[2]], marker="*", s=220, color="tab:red", zorder=4,
                       edgecolor="black", linewidth=0.5, label=f"TPUv4 reference {reference[0]}")
        if common is not None:
            ax.scatter([common[1]], [common[2]], marker="s", s=90, facecolor="none", zorder=5,
                       edgecolor="tab:purple", linewidth=1.6, label=f"Phaze-common {common[0]}")
        if best is not None:
            ax.scatter([best[1]], [best[2]], marker="D", s=80, color="tab:green", zorder=4,
                       edgecolor="black", linewidth=0.5, label=f"best {best[0]}")
        ax.legend(fontsize=7, loc="best")
        ax.set_ylim(bottom=0)
        pos = area[np.isfinite(area) & (area > 0)]
        if pos.size > 1 and pos.max() / pos.min() > LOG_AREA_RATIO:
            ax.set_xscale("log")
        if len(points) > 1 and (0 < _spread(area) < TINY_SPREAD or 0 < _spread(value) < TINY_SPREAD):
            _zoom_inset(ax, area, value, on, [reference, common, best])
    else:
        ax.text(0.5, 0.5, "no feasible architecture", ha="center", va="center", transform=ax.transAxes)
    _plain_axes(ax)
    ax.set_xlabel("area (mm²)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110, format="png")
    return fig


def _zoom_inset(ax, area: np.ndarray, value: np.ndarray, on: np.ndarray,
                marks: list[tuple[str, float, float] | None]) -> None:
    """An inset zoomed on the evaluated designs (their own area and throughput ranges, 5 % margins)."""
    ins = ax.inset_axes([0.5, 0.08, 0.47, 0.42])
    ins.scatter(area[~on], value[~on], s=10, color="tab:gray", alpha=0.6)
    ins.scatter(area[on], value[on], s=14, color="tab:blue", zorder=3)
    styles = [("*", "tab:red", 90), ("s", "tab:purple", 40), ("D", "tab:green", 30)]
    for m, (marker, color, size) in zip(marks, styles):
        if m is not None:
            ins.scatter([m[1]], [m[2]], marker=marker, s=size, color=color, zorder=4)

    def lim(x: np.ndarray) -> tuple[float, float]:
        lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
        pad = (hi - lo) * 0.05 or abs(hi) * 1e-3 or 1.0
        return lo - pad, hi + pad

    ins.set_xlim(*lim(area))
    ins.set_ylim(*lim(value))
    _plain_axes(ins)
    ins.tick_params(labelsize=6)
    for lab in ins.get_xticklabels():
        lab.set_rotation(30)
    ins.set_title("zoom on the evaluated designs", fontsize=7)
    ins.grid(alpha=0.3)


def _plot_times(path: Path, models: list[str], parts: dict[str, list[float]], solved: list[int],
                hits: list[int]) -> None:
    fig, (ax, ax2) = _figure(1, 2, (11.0, 4.6))
    x = np.arange(len(models))
    bottom = np.zeros(len(models))
    colors = {"estimation": "tab:blue", "ILP": "tab:orange", "DP": "tab:green", "other": "tab:gray"}
    for name, vals in parts.items():
        v = np.nan_to_num(np.asarray(vals, dtype=np.float64))
        ax.bar(x, v, 0.6, bottom=bottom, label=name, color=colors.get(name))
        bottom += v
    ax.set_xticks(x, models, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("seconds (summed over evaluations)")
    ax.set_title("Evaluation time by phase")
    top = float(bottom.max()) if bottom.size else 0.0
    ax.set_ylim(0, top * 1.3 if top > 0 else 1.0)  # headroom for the legend
    ax.legend(fontsize=8, loc="upper left", ncols=4)
    ax.grid(axis="y", alpha=0.3)
    w = 0.38
    ax2.bar(x - w / 2, solved, w, label="slices solved (ILP)", color="tab:orange")
    ax2.bar(x + w / 2, hits, w, label="schedule-cache hits", color="tab:cyan")
    ax2.set_xticks(x, models, rotation=20, ha="right", fontsize=8)
    ax2.set_ylabel("layer slices")
    ax2.set_title("Distinct layer slices: solved vs. from the schedule cache")
    top = max([*solved, *hits, 0])
    ax2.set_ylim(0, top * 1.3 if top > 0 else 1.0)
    ax2.legend(fontsize=8, loc="upper left", ncols=2)
    ax2.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110, format="png")
