"""An event simulation of one training step of a pipeline under PipeDream-Flush (1F1B), with each
stage's data-parallel gradient sync: the reference the placement DP's closed form (time per batch =
(B + s − 1) · max-load + the largest exposed sync, ``algorithms/solvers/grad_sync.py``) is checked
against.

Stage k runs its ops one at a time in 1F1B order: ``min(s − k − 1, B)`` warm-up forwards, then one
forward and one backward alternately, then the remaining backwards. A forward waits for its input
activation from stage k − 1, a backward for its gradient from stage k + 1. Every transfer goes out on
the sender's link, one at a time in the order the sender produced them; a stage's gradient sync
starts on its own link when its last backward has ended and the link is free. The step ends when
the last backward and the last sync have ended.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OneFOneBResult:
    step_s: float            # the whole step, syncs included
    pipeline_s: float        # the last backward's end
    last_backward_s: np.ndarray  # per stage: when its last backward ended
    sync_end_s: np.ndarray   # per stage: when its sync ended


def one_f_one_b_order(stage: int, num_stages: int, microbatches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s ops in 1F1B order: ("F", i) and ("B", i) for microbatches i."""
    warm = min(num_stages - stage - 1, microbatches)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while b < microbatches:
        if f < microbatches:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


def simulate_1f1b(forward_s, backward_s, activation_s, gradient_s, sync_s, microbatches: int
                  ) -> OneFOneBResult:
    """One step of ``microbatches`` microbatches through stages with compute times ``forward_s`` /
    ``backward_s`` (per stage), transfer times ``activation_s[k]`` (stage k to k + 1) and
    ``gradient_s[k]`` (stage k + 1 to k), and gradient sync times ``sync_s`` (all seconds)."""
    fw, bw = np.asarray(forward_s, float), np.asarray(backward_s, float)
    act, grad, sync = (np.asarray(v, float) for v in (activation_s, gradient_s, sync_s))
    s, n = len(fw), int(microbatches)
    orders = [one_f_one_b_order(k, s, n) for k in range(s)]
    pos = [0] * s
    free = np.zeros(s)        # stage k's compute is free from
    link = np.zeros(s)        # stage k's outgoing link is free from
    act_in = np.full((s, n), np.nan)   # when mb i's activation has arrived at stage k
    grad_in = np.full((s, n), np.nan)  # when mb i's gradient has arrived at stage k
    act_in[0, :] = 0.0
    grad_in[s - 1, :] = np.nan  # the last stage needs no gradient: its backward follows its forward
    fw_end = np.full((s, n), np.nan)
    last_bw = np.zeros(s)
    done = 0
    total = sum(len(o) for o in orders)
    while done < total:
        progressed = False
        for k in range(s):
            while pos[k] < len(orders[k]):
                kind, i = orders[k][pos[k]]
                if kind == "F":
                    ready = act_in[k, i]
                else:
                    ready = fw_end[k, i] if k == s - 1 else grad_in[k, i]
                if np.isnan(ready):
                    break
                start = max(free[k], ready)
                end = start + (fw[k] if kind == "F" else bw[k])
                free[k] = end
                if kind == "F":
                    fw_end[k, i] = end
                    if k + 1 < s:
                        link[k] = max(link[k], end) + act[k]
                        act_in[k + 1, i] = link[k]
                else:
                    last_bw[k] = end
                    if k > 0:
                        link[k] = max(link[k], end) + grad[k - 1]
                        grad_in[k - 1, i] = link[k]
                pos[k] += 1
                done += 1
                progressed = True
        if not progressed:
            raise RuntimeError("1F1B simulation deadlocked (a bug: the order is always feasible)")
    sync_end = np.maximum(link, last_bw) + sync
    return OneFOneBResult(float(max(last_bw.max(), sync_end.max())), float(last_bw.max()), last_bw, sync_end)
