"""CP-SAT placement + schedule of minimum step time (issue 18): held to an independent brute force over all
placements and all per-device / per-channel orders on tiny graphs, to hand-computed optima (chain, two
chains, fork-join, co-location, resident memory), and to the simulator (never faster than an optimal
model, equal where its greedy dispatch has no choice)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from archplace.algorithms.solvers.gdp_exact import RESOLUTION, exact_placement, tick_seconds
from archplace.simulators.gpu_placement import PlacementProblem, simulate

GIB = 2**30
BW, LAT = 12e9, 10e-6  # PCIe-like link: 12 GB/s, 10 us per transfer
KW = dict(time_limit_s=20.0, workers=2, seed=0)


def problem(n, edges, compute_s, *, d=2, edge_bytes=None, out_bytes=1e6, resident=0.0, coloc=None,
            memory=16 * GIB, interconnect="pcie") -> PlacementProblem:
    src = [a for a, _ in edges]
    dst = [b for _, b in edges]
    eb = np.full(len(edges), float(out_bytes)) if edge_bytes is None else np.asarray(edge_bytes, float)
    ob = np.full(n, float(out_bytes))
    for (a, _), b in zip(edges, eb):
        ob[a] = max(ob[a], b)
    return PlacementProblem(np.broadcast_to(np.asarray(compute_s, float), (n,)).copy(), ob,
                            np.broadcast_to(np.asarray(resident, float), (n,)).copy(), src, dst, eb,
                            np.full(n, -1) if coloc is None else np.asarray(coloc), np.arange(n), d, memory,
                            BW, LAT, interconnect)


def xfer_s(nbytes: float) -> float:
    return LAT + nbytes / BW


def slack(p: PlacementProblem, tick: float) -> float:
    """Most the model's tick durations can lose against the real ones on a chain: one tick per op and
    per transfer (plus float noise)."""
    return (2 * p.num_nodes - 1) * tick + 1e-12


def check_result(p: PlacementProblem, r, *, optimal=True) -> None:
    """What every solution satisfies (module doc's inequalities)."""
    assert r.placement is not None and r.placement.shape == (p.num_nodes,)
    if optimal:
        assert r.status == "OPTIMAL" and r.gap == 0.0
        assert r.lower_bound_s == pytest.approx(r.model_step_time_s, abs=1e-15)
        # (f) the greedy simulator never beats the optimal model (up to the ticks lost by flooring)
        assert r.simulated_step_time_s >= r.model_step_time_s - 1e-12
    assert r.lower_bound_s <= r.model_step_time_s + 1e-15
    assert r.model_step_time_s - 1e-12 <= r.schedule_step_time_s <= r.model_step_time_s + slack(p, r.tick_s)
    assert r.simulated_step_time_s == simulate(p, r.placement).step_time_s


# ============================================================================================ brute force
def brute_force(p: PlacementProblem) -> float:
    """Minimum makespan over every placement, every order of each device's ops and every order of each
    channel's transfers, each order timed as its earliest-start schedule (longest path; a cyclic order
    is no schedule). Channels holding the same transfers (a PCIe send port and the receive port it
    always feeds, on 2 devices) must order them alike, so they share one order."""
    n, D = p.num_nodes, p.num_devices
    src, dst, eb = p.src.tolist(), p.dst.tolist(), p.edge_bytes.tolist()
    best = math.inf
    for P in itertools.product(range(D), repeat=n):
        groups = {}
        if any(groups.setdefault(g, P[v]) != P[v] for v, g in enumerate(p.coloc_group.tolist()) if g >= 0):
            continue
        if any(sum(p.resident_bytes[v] for v in range(n) if P[v] == d) > p.memory_bytes for d in range(D)):
            continue
        tx: dict[tuple[int, int], float] = {}  # (u, f) -> seconds
        for a, b, nb in zip(src, dst, eb):
            if P[a] != P[b]:
                tx[(a, P[b])] = max(tx.get((a, P[b]), 0.0), xfer_s(nb))
        chans: dict[tuple, list] = {}
        for (u, f) in sorted(tx):
            for c in ([("send", P[u]), ("recv", f)] if p.interconnect == "pcie" else [("pair", P[u], f)]):
                chans.setdefault(c, []).append((u, f))
        chan_sets = sorted({tuple(v) for v in chans.values()})
        dev_ops = [[v for v in range(n) if P[v] == d] for d in range(D)]
        seqs = [list(itertools.permutations(o)) for o in dev_ops] + \
               [list(itertools.permutations(c)) for c in chan_sets]
        for choice in itertools.product(*seqs):
            # activity graph: ("o", v) and ("t", u, f); arcs pred -> succ with the pred's duration
            dur = {("o", v): float(p.compute_s[v]) for v in range(n)}
            dur.update({("t", u, f): s for (u, f), s in tx.items()})
            arcs = []
            for a, b in zip(src, dst):
                arcs.append((("o", a), ("o", b)) if P[a] == P[b] else (("t", a, P[b]), ("o", b)))
            arcs += [(("o", u), ("t", u, f)) for (u, f) in tx]
            for seq in choice[:D]:
                arcs += [(("o", a), ("o", b)) for a, b in zip(seq[:-1], seq[1:])]
            for seq in choice[D:]:
                arcs += [(("t",) + a, ("t",) + b) for a, b in zip(seq[:-1], seq[1:])]
            t = longest_path(dur, arcs)
            best = min(best, t)
    return best


def longest_path(dur: dict, arcs: list) -> float:
    """Makespan of the earliest-start schedule (Kahn's order); inf when the arcs have a cycle."""
    succ = {k: [] for k in dur}
    indeg = dict.fromkeys(dur, 0)
    for a, b in set(arcs):
        succ[a].append(b)
        indeg[b] += 1
    start = dict.fromkeys(dur, 0.0)
    todo = [k for k in dur if indeg[k] == 0]
    seen = 0
    while todo:
        k = todo.pop()
        seen += 1
        for b in succ[k]:
            start[b] = max(start[b], start[k] + dur[k])
            indeg[b] -= 1
            if indeg[b] == 0:
                todo.append(b)
    if seen < len(dur):
        return math.inf
    return max(start[k] + dur[k] for k in dur)


def random_dag(n: int, seed: int, *, d=2, interconnect="pcie") -> PlacementProblem:
    """Transfers (0.1-3 ms) comparable to compute (0.5-4 ms), so placement and order both matter."""
    rng = np.random.default_rng(seed)
    edges = []
    for v in range(1, n):
        for u in rng.choice(v, size=int(rng.integers(1, min(2, v) + 1)), replace=False):
            edges.append((int(u), v))
    edges += [(0, n - 1)] if (0, n - 1) not in edges and n > 2 else []
    comp = rng.uniform(0.5e-3, 4e-3, n)
    eb = rng.uniform(1e6, 36e6, len(edges))
    return problem(n, edges, comp, d=d, edge_bytes=eb, interconnect=interconnect)


def test_brute_force_oracle_on_hand_example():
    # fork-join on 2 devices by hand (see test_fork_join_splits): 13.01 ms
    p = problem(4, [(0, 1), (0, 2), (1, 3), (2, 3)], [1e-3, 10e-3, 10e-3, 1e-3], out_bytes=12e6)
    assert brute_force(p) == pytest.approx(13.01e-3, abs=1e-12)


# seeds 3 and 5 of the 6-op graphs have optima that a model without link contention undercuts
@pytest.mark.parametrize("n,seed,d,ic", [(5, 1, 2, "pcie"), (6, 3, 2, "pcie"), (6, 5, 2, "nvlink"),
                                         (5, 4, 3, "pcie"), (5, 5, 3, "nvlink")])
def test_equals_brute_force(n, seed, d, ic):
    """(a) CP-SAT's optimum = minimum over all placements and all orders, within the tick rounding."""
    p = random_dag(n, seed, d=d, interconnect=ic)
    r = exact_placement(p, **KW)
    check_result(p, r)
    bf = brute_force(p)
    assert r.lower_bound_s <= bf + 1e-12  # the floored model bounds the real optimum from below
    assert bf <= r.model_step_time_s + slack(p, r.tick_s)
    assert r.schedule_step_time_s >= bf - 1e-12  # the re-timed schedule is a real one
    # and the symmetry breaking loses nothing
    r2 = exact_placement(p, symmetry_breaking=False, **KW)
    assert r2.status == "OPTIMAL" and r2.model_step_time_s == pytest.approx(r.model_step_time_s, abs=1e-15)


@pytest.mark.parametrize("shape,ic,opt", [
    ("fan-in", "pcie", 3e-3 + 2 * xfer_s(12e6) + 1e-3), ("fan-in", "nvlink", 3e-3 + xfer_s(12e6) + 1e-3),
    ("fan-out", "pcie", 1e-3 + 2 * xfer_s(12e6) + 3e-3), ("fan-out", "nvlink", 1e-3 + xfer_s(12e6) + 3e-3)])
def test_port_contention_on_three_devices(shape, ic, opt):
    """Three 3 ms ops feeding one 1 ms op (fan-in), or fed by one 1 ms op (fan-out), 12 MB edges
    (1.01 ms), 3 GPUs: each big op on its own GPU. Over PCIe the two transfers into (out of) the joining
    (forking) GPU queue at its receive (send) port; over NVLink they use two pair links at once.
    Two GPUs (7 ms) and one (10 ms) are slower."""
    edges = [(0, 3), (1, 3), (2, 3)] if shape == "fan-in" else [(0, 1), (0, 2), (0, 3)]
    comp = [3e-3, 3e-3, 3e-3, 1e-3] if shape == "fan-in" else [1e-3, 3e-3, 3e-3, 3e-3]
    p = problem(4, edges, comp, d=3, out_bytes=12e6, interconnect=ic)
    r = exact_placement(p, **KW)
    check_result(p, r)
    assert brute_force(p) == pytest.approx(opt, rel=1e-12)
    assert r.model_step_time_s == pytest.approx(opt, abs=slack(p, r.tick_s)) and r.model_step_time_s <= opt
    big = [0, 1, 2] if shape == "fan-in" else [1, 2, 3]
    assert len(set(r.placement[big].tolist())) == 3
    assert r.simulated_step_time_s == pytest.approx(opt, rel=1e-12)


def test_chain_stays_on_one_device():
    """(b) + (f): a chain gains nothing from a transfer; the simulator, having no choice, agrees."""
    comp = [1e-3, 2e-3, 0.5e-3, 3e-3, 1.5e-3]
    p = problem(5, [(i, i + 1) for i in range(4)], comp, d=3)
    r = exact_placement(p, **KW)
    check_result(p, r)
    assert len(set(r.placement.tolist())) == 1
    assert r.model_step_time_s == pytest.approx(sum(comp), abs=slack(p, r.tick_s))
    assert r.simulated_step_time_s == pytest.approx(sum(comp), rel=1e-12)
    assert r.schedule_step_time_s == pytest.approx(sum(comp), rel=1e-12)


@pytest.mark.parametrize("ic", ["pcie", "nvlink"])
def test_two_equal_chains_run_side_by_side(ic):
    """(c) + (f): two independent equal chains on 2 devices take one chain's time."""
    comp = [1e-3, 2e-3, 1e-3, 0.5e-3]
    edges = [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)]
    p = problem(8, edges, comp * 2, interconnect=ic)
    r = exact_placement(p, **KW)
    check_result(p, r)
    a, b = r.placement[:4], r.placement[4:]
    assert len(set(a.tolist())) == 1 and len(set(b.tolist())) == 1 and a[0] != b[0]
    assert r.model_step_time_s == pytest.approx(sum(comp), abs=slack(p, r.tick_s))
    assert r.simulated_step_time_s == pytest.approx(sum(comp), rel=1e-12)


def test_fork_join_splits():
    """(d) s (1 ms) -> a, b (10 ms each) -> t (1 ms), 12 MB edges (1.01 ms over the link). On one device:
    22 ms. Split: s, a on device 0 (0-1, 1-11), s's output reaches device 1 at 2.01, b runs 2.01-12.01;
    a's output reaches device 1 at 11 + 1.01 = 12.01 = b's end, so t runs on device 1, 12.01-13.01."""
    p = problem(4, [(0, 1), (0, 2), (1, 3), (2, 3)], [1e-3, 10e-3, 10e-3, 1e-3], out_bytes=12e6)
    r = exact_placement(p, **KW)
    check_result(p, r)
    opt = 1e-3 + 10e-3 + xfer_s(12e6) + 1e-3
    assert opt == pytest.approx(13.01e-3, rel=1e-12)
    assert r.model_step_time_s == pytest.approx(opt, abs=slack(p, r.tick_s))
    assert r.model_step_time_s <= opt
    P = r.placement
    assert P[1] != P[2]
    assert r.simulated_step_time_s == pytest.approx(opt, rel=1e-12)  # greedy finds it too
    # with a link 20x slower the transfers cost more than they save: one device, 22 ms
    slow = problem(4, [(0, 1), (0, 2), (1, 3), (2, 3)], [1e-3, 10e-3, 10e-3, 1e-3], out_bytes=240e6)
    r = exact_placement(slow, **KW)
    check_result(slow, r)
    assert len(set(r.placement.tolist())) == 1
    assert r.model_step_time_s == pytest.approx(22e-3, abs=slack(slow, r.tick_s))


def test_colocation_respected():
    """(e) four independent ops 2, 2, 1, 1 ms: 3 ms split {2,1}/{2,1}; co-locating the two 2 ms ops
    forces 4 ms."""
    comp = [2e-3, 2e-3, 1e-3, 1e-3]
    free = problem(4, [], comp)
    r = exact_placement(free, **KW)
    check_result(free, r)
    assert r.model_step_time_s == pytest.approx(3e-3, abs=slack(free, r.tick_s))
    tied = problem(4, [], comp, coloc=[7, 7, -1, -1])
    r = exact_placement(tied, **KW)
    check_result(tied, r)
    assert r.placement[0] == r.placement[1] and r.valid
    assert r.model_step_time_s == pytest.approx(4e-3, abs=slack(tied, r.tick_s))


def test_resident_memory_forces_a_split():
    """(g) a chain of four 1 ms ops with 1 GiB resident each, 2.5 GiB per GPU: two per device, one
    transfer (10 us + 1 MB / 12 GB/s). Without the memory constraint it stays on one device, which the
    simulator reports out of memory."""
    comp = [1e-3] * 4
    p = problem(4, [(0, 1), (1, 2), (2, 3)], comp, resident=GIB, memory=2.5 * GIB)
    r = exact_placement(p, **KW)
    check_result(p, r)
    assert np.bincount(r.placement, minlength=2).tolist() == [2, 2] and r.valid and r.reason == ""
    assert r.placement[0] == r.placement[1] and r.placement[2] == r.placement[3]
    opt = 4e-3 + xfer_s(1e6)
    assert r.model_step_time_s == pytest.approx(opt, abs=slack(p, r.tick_s))
    assert r.simulated_step_time_s == pytest.approx(opt, rel=1e-12)
    r = exact_placement(p, memory=False, **KW)
    check_result(p, r)
    assert len(set(r.placement.tolist())) == 1
    assert r.model_step_time_s == pytest.approx(4e-3, abs=slack(p, r.tick_s))
    assert not r.valid and "out of memory" in r.reason


def test_activation_oom_is_reported_not_hidden():
    """Activation memory is not in the model: the simulator's verdict comes back as is."""
    p = problem(3, [(0, 1), (1, 2)], 1e-3, out_bytes=GIB, memory=0.5 * GIB)
    r = exact_placement(p, **KW)
    assert r.status == "OPTIMAL" and r.placement is not None
    assert not r.valid and "out of memory" in r.reason


def test_infeasible_resident_memory():
    p = problem(3, [(0, 1), (1, 2)], 1e-3, resident=[GIB, 3 * GIB, GIB], memory=2 * GIB)
    r = exact_placement(p, **KW)
    assert r.status == "INFEASIBLE" and r.placement is None and not r.valid and "INFEASIBLE" in r.reason


@pytest.mark.parametrize("seed", [11, 12])
def test_random_dags_against_simulator(seed):
    """(f) on 12-op DAGs: the optimal model is never slower than the simulator on the same placement,
    and never slower than the best single-device or hinted placement."""
    rng = np.random.default_rng(seed)
    p = random_dag(12, seed, d=3, interconnect=["pcie", "nvlink"][seed % 2])
    h = rng.integers(0, 3, 12)
    r = exact_placement(p, hint=h, **KW)
    check_result(p, r)
    assert r.model_step_time_s <= simulate(p, h).step_time_s + 1e-12
    assert r.model_step_time_s <= float(p.compute_s.sum()) + 1e-12


def test_hint_is_relabelled_and_used():
    p = random_dag(6, 2)
    base = exact_placement(p, **KW)
    for h in (np.ones(6, int), 1 - base.placement):  # device labels swapped: same solution
        r = exact_placement(p, hint=h, **KW)
        check_result(p, r)
        assert r.model_step_time_s == pytest.approx(base.model_step_time_s, abs=1e-15)


def test_tick_scale():
    p = random_dag(6, 2)
    t = tick_seconds(p)
    assert math.log10(t) == pytest.approx(round(math.log10(t)), abs=1e-9)  # a power of ten
    arcs = list(zip(p.src.tolist(), p.dst.tolist()))
    crit = longest_path({v: float(p.compute_s[v]) for v in range(6)}, arcs)
    lb0 = max(p.compute_s.sum() / 2, crit)
    assert (2 * 6 - 1) * t <= RESOLUTION * lb0
    assert t > RESOLUTION * lb0 / (2 * 6) / 10
    # transfers of 83 s against 1 us ops: the horizon caps the tick, the chain still stays on one device
    huge = problem(20, [(i, i + 1) for i in range(19)], 1e-6, out_bytes=1e12)
    r = exact_placement(huge, **KW)
    assert r.tick_s == tick_seconds(huge) > RESOLUTION * 1e-6 * 20 / 40
    assert r.status == "OPTIMAL" and len(set(r.placement.tolist())) == 1
    assert r.simulated_step_time_s == pytest.approx(20e-6, rel=1e-9)


def test_refuses_outside_its_range():
    chain = problem(41, [(i, i + 1) for i in range(40)], 1e-4)
    with pytest.raises(ValueError, match=r"num_nodes is 41.*at most 40"):
        exact_placement(chain, **KW)
    r = exact_placement(chain, max_nodes=41, time_limit_s=10.0, workers=2)
    assert r.status in ("OPTIMAL", "FEASIBLE") and r.model_step_time_s <= 41e-4 + 1e-12
    for d in (1, 5):
        with pytest.raises(ValueError, match=rf"num_devices is {d}.*2\.\.4"):
            exact_placement(problem(3, [(0, 1)], 1e-3, d=d), **KW)
    with pytest.raises(ValueError, match="hint"):
        exact_placement(problem(3, [(0, 1)], 1e-3), hint=[0, 2, 0], **KW)
