"""RLlib callbacks that carry the placers' bookkeeping through the metrics, wherever the
environments run.

With ``num_env_runners > 0`` the environments live in remote EnvRunner actors and the driver's
local runner has none, so nothing may be read off an environment object. Instead every completed
plan is logged at episode end as an ``item_series`` metric; RLlib gathers the series of all runners
into the iteration's result, and the driver keeps the best plan, the count and the history from it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.rllib.callbacks.callbacks import RLlibCallback

from ..search.mcm_baselines import stage_family

PLANS_KEY = "plans"          # [length_s, oom, *cuts] per completed pipeline plan
DEAD_ENDS_KEY = "dead_ends"  # episodes that ended with no open pivot


class PipelinePlanLog(RLlibCallback):
    def on_episode_end(self, *, episode, metrics_logger=None, **kwargs: Any) -> None:
        info = episode.get_infos(-1)
        if metrics_logger is None or not isinstance(info, dict):
            return
        if "length_s" in info:
            metrics_logger.log_value(PLANS_KEY, [float(info["length_s"]), float(bool(info["oom"])),
                                                 *(float(c) for c in info["cuts"])], reduce="item_series")
        elif info.get("dead_end"):
            metrics_logger.log_value(DEAD_ENDS_KEY, 1, reduce="sum")


def _items(series: Any) -> list[list[float]]:
    """The logged rows of an ``item_series`` metric: a list of rows, or a single row when only one
    was logged in the iteration (RLlib then reports the item itself)."""
    if series is None:
        return []
    series = list(series)
    if series and not hasattr(series[0], "__len__"):
        return [series]
    return [list(r) for r in series]


def plans_of(result: dict[str, Any]) -> list[tuple[float, bool, np.ndarray]]:
    """The plans one ``algo.train()`` result reports: (L, oom, cuts) each."""
    out = []
    for row in _items(result.get("env_runners", {}).get(PLANS_KEY)):
        row = list(row)
        out.append((float(row[0]), bool(row[1]), np.asarray(row[2:], dtype=np.int64)))
    return out


MCM_SAMPLES_KEY = "mcm_samples"   # [graph, throughput, raw_valid, repaired_valid] per sampled partition
MCM_REPAIR_KEY = "mcm_repair"     # [stage code (REPAIR_STAGE_CODES, -1: none), changed nodes] per sample
REPAIR_STAGE_CODES = ("eq4", "cpsat", "chain", "chain-cap", "complete")
MCM_BEST_KEY = "mcm_best"         # [graph, throughput, *partition] when a runner's env improves its best


class MCMSampleLog(RLlibCallback):
    def on_episode_step(self, *, episode, metrics_logger=None, **kwargs: Any) -> None:
        info = episode.get_infos(-1)
        if metrics_logger is None or not isinstance(info, dict) or "throughput" not in info:
            return
        g = float(info["graph_index"])
        metrics_logger.log_value(MCM_SAMPLES_KEY, [g, float(info["throughput"]), float(info["raw_valid"]),
                                                   float(info["repaired_valid"])], reduce="item_series")
        fam = stage_family(info.get("repair_stage"))
        code = REPAIR_STAGE_CODES.index(fam) if fam in REPAIR_STAGE_CODES else -1 if fam == "none" else -2
        metrics_logger.log_value(MCM_REPAIR_KEY, [float(code), float(info.get("changed", 0))],
                                 reduce="item_series")
        if info.get("improved"):
            metrics_logger.log_value(MCM_BEST_KEY, [g, float(info["throughput"]),
                                                    *(float(c) for c in info["repaired_action"])],
                                     reduce="item_series")


def repair_records(result: dict[str, Any]) -> list[tuple[str | None, int]]:
    """(stage family or None when no repair ran, changed nodes) per sample one result reports."""
    out = []
    for code, changed in _items(result.get("env_runners", {}).get(MCM_REPAIR_KEY)):
        c = int(code)
        out.append((REPAIR_STAGE_CODES[c] if c >= 0 else None if c == -1 else "other", int(changed)))
    return out


def mcm_records(result: dict[str, Any]) -> tuple[list[tuple[int, float, bool, bool]],
                                                   list[tuple[int, float, np.ndarray]]]:
    """(samples, improvements) one result reports: (graph, throughput, raw_valid, repaired_valid) per
    sample and (graph, throughput, padded partition) per improvement of some runner's incumbent."""
    er = result.get("env_runners", {})
    samples = [(int(r[0]), float(r[1]), bool(r[2]), bool(r[3])) for r in _items(er.get(MCM_SAMPLES_KEY))]
    best = [(int(r[0]), float(r[1]), np.asarray(r[2:], dtype=np.int64)) for r in _items(er.get(MCM_BEST_KEY))]
    return samples, best
