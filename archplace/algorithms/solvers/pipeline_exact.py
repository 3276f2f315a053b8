"""Candidate pivots for pipeline cuts (Auto-MAP's pruning, spec automap.md §9.2) and the exact optimum
over them by enumeration — the yardstick the DQN agent is measured against.

Pruning: the *centre solution* puts device cuts on network (server) boundaries; a pivot p can be the
j-th cut when the device cut it implies, D · C(p) / C(n) with C the compute prefix, lies within
``radius`` devices of the centre's j-th cut. Each stage must own at least one trainable variable.
Pivots that differ in nothing but the activation they cut (a run of ops with no compute, parameters
or saved activations) are collapsed to the one that cuts the fewest bytes: the others can never be
better, so the optimum over the collapsed set is the optimum over the pruned set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...hardware.presets import Cluster
from ...simulators.pipeline import PipelineProfile, evaluate


def centre_device_cuts(cluster: Cluster, num_stages: int) -> np.ndarray:
    """Device cuts on server boundaries (the paper's centre solution); an even split when the
    servers are fewer than the stages or the boundaries cannot be told apart."""
    d = cluster.num_devices
    per = cluster.devices_per_server or d
    servers = d // per
    j = np.arange(1, num_stages)
    cuts = per * np.rint(j * servers / num_stages).astype(np.int64)
    if len(np.unique(cuts)) != len(cuts) or (cuts <= 0).any() or (cuts >= d).any():
        cuts = np.rint(j * d / num_stages).astype(np.int64)
    return cuts


@dataclass(frozen=True)
class Candidates:
    """The pivots each cut may take: ``per_cut[j]`` sorted pivot indices for the (j+1)-th cut."""

    per_cut: tuple[np.ndarray, ...]
    centre_device_cuts: np.ndarray
    radius: int

    @property
    def all(self) -> np.ndarray:
        return np.unique(np.concatenate(self.per_cut)) if self.per_cut else np.zeros(0, np.int64)


def _dominated(prof: PipelineProfile, pivots: np.ndarray) -> np.ndarray:
    """Mask of pivots kept after collapsing runs that differ only in the bytes they cut."""
    keys = np.stack([prof.compute_s_prefix, prof.param_bytes_prefix, prof.saved_bytes_prefix,
                     prof.ckpt_bytes_prefix, prof.trainable_prefix], axis=1)[pivots]
    keep = np.ones(len(pivots), bool)
    if len(pivots) < 2:
        return keep
    same = np.r_[False, (keys[1:] == keys[:-1]).all(axis=1) & (np.diff(pivots) == 1)]
    run_id = np.cumsum(~same)
    cross = prof.cross_bytes[pivots]
    order = np.lexsort((pivots, cross, run_id))  # by run, then fewest bytes, then earliest
    first = np.r_[True, run_id[order][1:] != run_id[order][:-1]]
    keep[:] = False
    keep[order[first]] = True
    return keep


def candidate_pivots(prof: PipelineProfile, cluster: Cluster, num_stages: int,
                     radius: int | None = 3, collapse: bool = True) -> Candidates:
    """Pruned pivots per cut; ``radius=None`` keeps every pivot (no centre-solution pruning);
    ``collapse=False`` keeps dominated pivots (a fixed action set across profiles)."""
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"stages must be a positive integer, got {num_stages!r}")
    if num_stages > cluster.num_devices:
        raise ValueError(f"stages must be <= the cluster's {cluster.num_devices} devices, got {num_stages}")
    if radius is not None and (not isinstance(radius, int) or radius < 0):
        raise ValueError(f"radius must be a non-negative integer or None, got {radius!r}")
    n = prof.num_ops
    if num_stages > n:
        raise ValueError(f"stages must be <= the model's {n} forward ops, got {num_stages}")
    centre = centre_device_cuts(cluster, num_stages)
    p = np.arange(1, n)
    c = prof.compute_s_prefix
    pos = cluster.num_devices * c[p] / c[-1]
    tv = prof.trainable_prefix
    per_cut = []
    for j in range(1, num_stages):
        ok = (tv[p] >= j) & (tv[-1] - tv[p] >= num_stages - j)
        if radius is not None:
            ok &= np.abs(pos - centre[j - 1]) <= radius + 1e-9
        cand = p[ok]
        per_cut.append(cand[_dominated(prof, cand)] if collapse else cand)
    return Candidates(tuple(per_cut), centre, -1 if radius is None else radius)


@dataclass
class PipelinePlan:
    """A cut set and what the cost model says of it."""

    cuts: np.ndarray  # pivots, (K-1,)
    length_s: float
    oom: bool
    device_cuts: np.ndarray
    devices: np.ndarray
    evaluated: int
    wall_s: float
    optimal: bool  # proven optimal over the candidates

    @property
    def feasible(self) -> bool:
        return not self.oom


def _valid_trainable(prof: PipelineProfile, cuts: np.ndarray) -> np.ndarray:
    n = prof.num_ops
    b = np.concatenate([np.zeros((len(cuts), 1), np.int64), cuts, np.full((len(cuts), 1), n)], axis=1)
    tv = prof.trainable_prefix[b]
    return (np.diff(b, axis=1) > 0).all(axis=1) & (np.diff(tv, axis=1) >= 1).all(axis=1)


def solve_exact(prof: PipelineProfile, cluster: Cluster, cand: Candidates,
                chunk: int = 400_000) -> PipelinePlan:
    """Enumerate every increasing cut set over the candidates; the best memory-feasible one (or, when
    all run out of memory, the shortest with ``oom=True``: the case is infeasible)."""
    t0 = time.perf_counter()
    k1 = len(cand.per_cut)
    if k1 == 0:
        r = evaluate(prof, cluster, np.zeros((1, 0), np.int64))
        return PipelinePlan(np.zeros(0, np.int64), float(r.length_s[0]), bool(r.oom[0]),
                            r.device_cuts[0], r.devices[0], 1, time.perf_counter() - t0, True)
    if any(len(c) == 0 for c in cand.per_cut):
        raise ValueError("no candidate pivot for some cut: widen the radius or use fewer stages")
    best: tuple[float, bool, np.ndarray] | None = None
    evaluated = 0
    rest = cand.per_cut[1:]
    rest_grid = (np.stack(np.meshgrid(*rest, indexing="ij"), -1).reshape(-1, k1 - 1)
                 if rest else np.zeros((1, 0), np.int64))
    step = max(1, chunk // max(1, len(rest_grid)))
    first = cand.per_cut[0]
    for s in range(0, len(first), step):
        head = first[s:s + step]
        if len(rest_grid) > chunk:  # very large windows: split the rest as well
            parts = [rest_grid[i:i + chunk] for i in range(0, len(rest_grid), chunk)]
        else:
            parts = [rest_grid]
        for part in parts:
            cuts = np.concatenate([np.repeat(head, len(part))[:, None], np.tile(part, (len(head), 1))], 1)
            if k1 > 1:
                cuts = cuts[(np.diff(cuts, axis=1) > 0).all(axis=1)]
            cuts = cuts[_valid_trainable(prof, cuts)]
            if not len(cuts):
                continue
            r = evaluate(prof, cluster, cuts)
            evaluated += len(cuts)
            score = np.where(r.oom, np.inf, r.length_s)
            i = int(np.argmin(score))
            if np.isinf(score[i]):
                i = int(np.argmin(r.length_s))
            cand_best = (float(r.length_s[i]), bool(r.oom[i]), cuts[i])
            if best is None or (cand_best[1], cand_best[0]) < (best[1], best[0]):
                best = cand_best
    if best is None:
        raise ValueError("no cut set gives every stage a trainable variable")
    r = evaluate(prof, cluster, best[2][None, :])
    return PipelinePlan(best[2], best[0], best[1], r.device_cuts[0], r.devices[0], evaluated,
                        time.perf_counter() - t0, True)
