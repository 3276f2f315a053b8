"""The MCM partition evaluator (archplace.simulators.mcm): the paper's Fig. 2 examples, hand-computed
throughput and memory, and brute-force references (longest chip paths, position-by-position memory)
on seeded random small instances."""

import dataclasses

import numpy as np
import pytest

from archplace.simulators import mcm
from archplace.simulators.mcm import (
    MB,
    MCMProblem,
    check,
    evaluate,
    greedy_partition,
    memory_peak_bytes,
    memory_valid,
    static_valid,
    static_violations,
)

# Fig. 2-like graph: 0->1, 0->2, 1->3, 2->4, 3->4 (ids are already a topological order)
FIG2_SRC = [0, 0, 1, 2, 3]
FIG2_DST = [1, 2, 3, 4, 4]


def fig2(**kw) -> MCMProblem:
    args = dict(time_s=[1e-3] * 5, out_bytes=[10, 20, 40, 80, 160], weight_bytes=[1, 2, 4, 8, 16])
    args.update(kw)
    return MCMProblem.from_arrays(4, FIG2_SRC, FIG2_DST, **args)


# ------------------------------------------------------------------------------ brute-force reference
def longest_paths(edges: set[tuple[int, int]], c: int) -> list[list[int]]:
    """Longest path length from a to b in a chip DAG whose edges go up (-1: unreachable)."""
    lp = [[-1] * c for _ in range(c)]
    for a in range(c):
        lp[a][a] = 0
        for b in range(a + 1, c):
            lp[a][b] = max([lp[a][k] + 1 for k in range(a, b) if (k, b) in edges and lp[a][k] >= 0],
                           default=-1)
    return lp


def ref_eval(p: MCMProblem, f) -> dict:
    n, c = p.num_nodes, p.num_chips
    f = [int(x) for x in f]
    src, dst = p.src.tolist(), p.dst.tolist()
    succ = [[] for _ in range(n)]
    for u, v in zip(src, dst):
        succ[u].append(v)
    eq2 = any(f[u] > f[v] for u, v in zip(src, dst))
    eq3 = set(f) != set(range(max(f) + 1))
    chip_edges = {(f[u], f[v]) for u, v in zip(src, dst) if f[u] < f[v]}
    lp = longest_paths(chip_edges, c)
    eq4 = any(lp[a][b] >= 2 for a, b in chip_edges)
    compute, link = [0.0] * c, [0.0] * c
    for u in range(n):
        compute[f[u]] += p.time_s[u]
        for lnk in range(f[u], max([f[u]] + [f[v] for v in succ[u]])):
            link[lnk] += p.out_bytes[u]
    lat = [compute[d] + link[d] / p.link_bw_bytes_per_s for d in range(c)]
    pos = {int(u): i for i, u in enumerate(p.topo)}
    peak = []
    for d in range(c):
        best = 0.0
        for t in range(n):
            live = 0.0
            for u in range(n):
                cons = [pos[v] for v in succ[u] if f[v] == d]
                if f[u] == d:
                    end = max([pos[u]] + cons)
                elif cons:
                    end = max(cons)
                else:
                    continue
                if pos[u] <= t <= end:
                    live += p.out_bytes[u]
            best = max(best, live)
        peak.append(sum(p.weight_bytes[u] for u in range(n) if f[u] == d) + best)
    static_ok = not (eq2 or eq3 or eq4)
    mem_ok = max(peak) <= p.sram_bytes
    return dict(eq2=eq2, eq3=eq3, eq4=eq4, latency=lat, peak=peak,
                throughput=1 / max(lat) if static_ok and mem_ok else 0.0)


def random_problem(rng: np.random.Generator, n: int, c: int, p_edge: float = 0.35) -> MCMProblem:
    """A random DAG whose ids are shuffled (so ids are not a topological order) and whose topo is a
    random linear extension; integer byte counts keep the memory sums exact."""
    label = rng.permutation(n)
    src, dst = [], []
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < p_edge:
                src.append(label[i])
                dst.append(label[j])
                if rng.random() < 0.1:  # a duplicate edge (x * x)
                    src.append(label[i])
                    dst.append(label[j])
    indeg = np.bincount(np.array(dst, dtype=int), minlength=n)
    ready, topo = [u for u in range(n) if indeg[u] == 0], []
    while ready:
        u = ready.pop(int(rng.integers(len(ready))))
        topo.append(u)
        for s, d in zip(src, dst):
            if s == u:
                indeg[d] -= 1
                if indeg[d] == 0:
                    ready.append(d)
    return MCMProblem.from_arrays(c, src, dst, rng.uniform(0.1, 2.0, n) * 1e-3,
                                  rng.integers(0, 100, n).astype(float), rng.integers(0, 50, n).astype(float),
                                  topo=topo, link_bw_bytes_per_s=1e5,
                                  sram_bytes=float(rng.integers(100, 400)))


# ------------------------------------------------------------------------------ Fig. 2 examples
def test_fig2_valid_partition():
    p = fig2()
    f = [0, 0, 1, 1, 1]
    assert check(p, f) == []
    r = evaluate(p, f)
    assert r.valid.tolist() == [True] and r.static_ok[0] and r.memory_ok[0]
    # chip 0: 2 ms compute, link 0 carries node 0 (10 B) and node 1 (20 B)
    assert np.allclose(r.latency_s[0], [2e-3 + 30 / mcm.MCM_LINK_BW_BYTES_PER_S, 3e-3, 0, 0])
    assert r.throughput[0] == pytest.approx(1 / 3e-3)


@pytest.mark.parametrize("f, which, reason", [
    ([0, 0, 1, 0, 0], "eq2", "eq2: edge 2->4 goes from chip 1 to chip 0"),
    ([0, 0, 2, 2, 2], "eq3", "eq3: chip 1 is skipped (no op on it, but chip 2 is used)"),
    ([0, 1, 2, 2, 2], "eq4", "eq4: chips 0->2 direct and via 1"),
])
def test_fig2_static_violations(f, which, reason):
    p = fig2()
    v = static_violations(p, f)
    assert {k: bool(a[0]) for k, a in v.items()} == {k: k == which for k in ("eq2", "eq3", "eq4")}
    assert check(p, f) == [reason]
    r = evaluate(p, f)
    assert not r.static_ok[0] and r.memory_ok[0] and not r.valid[0] and r.throughput[0] == 0.0
    assert r.max_latency_s[0] > 0  # latencies are still reported


def test_fig2_memory_violation():
    # node 3 (chip 1) holds 38 MB of weights; activations scaled to 0.01 MB units
    p = fig2(out_bytes=np.array([10, 20, 40, 80, 160]) * 0.01 * MB, weight_bytes=[0, 0, 0, 38 * MB, 0])
    f = [0, 0, 1, 1, 1]
    assert static_valid(p, f).tolist() == [True]
    assert memory_valid(p, f).tolist() == [False]
    assert np.allclose(memory_peak_bytes(p, f)[0], [0.3 * MB, 40.8 * MB, 0, 0])
    assert check(p, f) == ["memory: chip 1 peaks at 40.8 MB > 32 MB"]
    r = evaluate(p, f)
    assert r.static_ok[0] and not r.memory_ok[0] and r.throughput[0] == 0.0


def test_memory_peak_hand_computed():
    """Chip 0 holds ops 0, 1: outputs 10 ([0,1]) and 20 ([1,1]) -> 30 + weights 3. Chip 1 receives
    op 0's output ([0,2]) and op 1's ([1,3]) and runs 2, 3, 4: at position 4 the outputs of 2, 3 and 4
    (40 + 80 + 160) are live -> 280 + weights 28."""
    p = fig2()
    assert memory_peak_bytes(p, [0, 0, 1, 1, 1]).tolist() == [[33.0, 308.0, 0.0, 0.0]]
    # a consumer-less output still occupies its chip at its own step: one op per chip on a chain
    q = MCMProblem.from_arrays(3, [0, 1], [1, 2], [1.0] * 3, out_bytes=[5, 7, 11], weight_bytes=[1, 0, 0])
    assert memory_peak_bytes(q, [0, 1, 2]).tolist() == [[6.0, 12.0, 18.0]]
    # byte counts past 2**31 in total take the int64 scan; the values scale exactly
    scale = 2.0**33
    big = fig2(out_bytes=np.array([10, 20, 40, 80, 160]) * scale,
               weight_bytes=np.array([1, 2, 4, 8, 16]) * scale)
    assert big._pre.live_dtype == np.int64 and p._pre.live_dtype == np.int32
    assert memory_peak_bytes(big, [0, 0, 1, 1, 1]).tolist() == [[33 * scale, 308 * scale, 0.0, 0.0]]
    # fractional activation sizes are counted in whole bytes, rounded up
    frac = fig2(out_bytes=[9.5, 19.2, 40, 80, 160])
    assert memory_peak_bytes(frac, [0, 0, 1, 1, 1]).tolist() == [[33.0, 308.0, 0.0, 0.0]]


# ------------------------------------------------------------------------------ cost model
def test_throughput_hand_computed_multi_hop():
    """n0@0 feeds n1@1 and n2@2 (sent once over links 0 and 1), n1@1 and n2@2 feed n3@3 (n1 crosses
    links 1 and 2). Chip graph 0->1, 0->2, 1->3, 2->3 has no triangle."""
    p = MCMProblem.from_arrays(4, [0, 0, 1, 2], [1, 2, 3, 3], [1e-3, 2e-3, 3e-3, 4e-3],
                               out_bytes=[2e6, 1e6, 0.5e6, 999], link_bw_bytes_per_s=1e9)
    f = [0, 1, 2, 3]
    assert check(p, f) == []
    r = evaluate(p, f)
    # links: 0 -> 2e6 (2 ms), 1 -> 2e6 + 1e6 (3 ms), 2 -> 1e6 + 0.5e6 (1.5 ms), 3 -> 0
    assert np.allclose(r.latency_s[0], [3e-3, 5e-3, 4.5e-3, 4e-3])
    assert r.max_latency_s[0] == pytest.approx(5e-3)
    assert r.throughput[0] == pytest.approx(200.0)
    # everything on chip 0: no communication, 10 ms
    assert evaluate(p, [0, 0, 0, 0]).throughput[0] == pytest.approx(100.0)
    # a consumer on the producer's chip and one two chips on: one send over links 0 and 1 (latencies
    # are reported whatever the validity; chip 1 is empty and only forwards)
    q = MCMProblem.from_arrays(3, [0, 0], [1, 2], [1e-3] * 3, out_bytes=[4e6, 0, 0], link_bw_bytes_per_s=1e9)
    assert np.allclose(mcm.chip_latency_s(q, [0, 0, 2])[0], [2e-3 + 4e-3, 4e-3, 1e-3])


def test_greedy_partition():
    chain = MCMProblem.from_arrays(4, list(range(7)), list(range(1, 8)), [1.0] * 8)
    assert greedy_partition(chain).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    big_first = MCMProblem.from_arrays(4, [0, 1, 2], [1, 2, 3], [5.0, 1.0, 1.0, 1.0])
    assert greedy_partition(big_first).tolist() == [0, 1, 1, 2]  # target 2: never skips a chip
    zero = MCMProblem.from_arrays(4, [0], [1], [0.0, 0.0])
    assert greedy_partition(zero).tolist() == [0, 0]
    # walks the topological order, not the ids: 2 -> 1 -> 0
    rev = MCMProblem.from_arrays(3, [2, 1], [1, 0], [1.0, 1.0, 1.0])
    assert greedy_partition(rev).tolist() == [2, 1, 0]
    # a residual skip over the middle chip gives an eq4 triangle (repair is someone else's job)
    res = MCMProblem.from_arrays(3, [0, 1, 0], [1, 2, 2], [1.0, 1.0, 1.0])
    g = greedy_partition(res)
    assert g.tolist() == [0, 1, 2]
    assert {k: bool(v[0]) for k, v in static_violations(res, g).items()} == {"eq2": False, "eq3": False,
                                                                             "eq4": True}


# ------------------------------------------------------------------------------ brute force
def test_eq4_bitmask_matches_longest_path():
    rng = np.random.default_rng(4)
    agree = {True: 0, False: 0}
    for case in range(300):
        c = int(rng.integers(2, 11)) if case < 290 else int(rng.integers(40, 65))
        density = rng.uniform(0.05, 0.6) if c <= 10 else 0.08
        edges = {(a, b) for a in range(c) for b in range(a + 1, c) if rng.random() < density}
        # one op per chip and one graph edge per chip edge reproduces the chip graph exactly
        src, dst = zip(*sorted(edges)) if edges else ((), ())
        p = MCMProblem.from_arrays(c, list(src), list(dst), [1.0] * c)
        lp = longest_paths(edges, c)
        want = any(lp[a][b] >= 2 for a, b in edges)
        got = bool(static_violations(p, np.arange(c))["eq4"][0])
        assert got == want, (c, sorted(edges))
        agree[want] += 1
    assert min(agree.values()) > 50  # both outcomes are well represented
    # the top bit of a 64-chip bitmask: a chain 0 -> 1 -> ... -> 63 plus 0 -> 63 or 62 -> 63 only
    chain = [(a, a + 1) for a in range(63)]
    for extra, bad in (((0, 63), True), ((61, 63), True), (None, False)):
        edges = chain + ([extra] if extra else [])
        src, dst = zip(*edges)
        p = MCMProblem.from_arrays(64, list(src), list(dst), [1.0] * 64)
        assert bool(static_violations(p, np.arange(64))["eq4"][0]) == bad


def test_random_partitions_match_reference_one_by_one():
    rng = np.random.default_rng(11)
    seen = {"eq2": 0, "eq3": 0, "eq4": 0, "memory": 0, "valid": 0}
    for _ in range(40):
        n, c = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        p = random_problem(rng, n, c)
        parts = rng.integers(0, c, size=(12, n))
        parts[:6] = np.sort(parts[:6], axis=1)[:, np.argsort(p.topo)]  # non-decreasing along topo
        res = evaluate(p, parts)
        viol = static_violations(p, parts)
        peak = memory_peak_bytes(p, parts)
        for i, f in enumerate(parts):
            ref = ref_eval(p, f)
            for k in ("eq2", "eq3", "eq4"):
                assert bool(viol[k][i]) == ref[k], (k, p, f)
                seen[k] += ref[k]
            assert peak[i].tolist() == ref["peak"]  # integer bytes: exact
            assert np.allclose(res.latency_s[i], ref["latency"], rtol=1e-12, atol=0)
            assert res.throughput[i] == pytest.approx(ref["throughput"], rel=1e-12)
            seen["memory"] += not res.memory_ok[i]
            seen["valid"] += bool(res.valid[i])
            assert (check(p, f) == []) == bool(res.valid[i])
    assert min(seen.values()) > 10, seen


def test_batch_equals_single_and_chunking(monkeypatch):
    rng = np.random.default_rng(5)
    p = random_problem(rng, 30, 6, p_edge=0.12)
    parts = rng.integers(0, 6, size=(50, 30))
    parts[:25] = np.sort(parts[:25], axis=1)[:, np.argsort(p.topo)]
    for i in range(25, 35):  # 1 to 3 chips in topological order: rarely a triangle
        parts[i] = np.sort(rng.integers(0, 1 + i % 3, 30))[np.argsort(p.topo)]
    # an SRAM size that half of the statically valid rows meet
    worst = memory_peak_bytes(p, parts).max(axis=1)[static_valid(p, parts)]
    p = dataclasses.replace(p, sram_bytes=float(np.median(worst)))
    full = evaluate(p, parts)
    monkeypatch.setattr(mcm, "_CHUNK_ROWS", 7)
    monkeypatch.setattr(mcm, "_MEM_ELEMENTS", 3 * 31 * 6)  # memory scan: 3 rows a pass
    assert mcm._scan_rows(p) == 3
    chunked = evaluate(p, parts)
    assert np.array_equal(mcm.chip_latency_s(p, parts), full.latency_s)  # reduceat path
    assert np.array_equal(memory_peak_bytes(p, parts), full.peak_bytes)
    singles = [evaluate(p, f) for f in parts]
    for name in ("throughput", "valid", "static_ok", "memory_ok", "latency_s", "max_latency_s", "peak_bytes"):
        a, b = getattr(full, name), getattr(chunked, name)
        s = np.concatenate([getattr(r, name) for r in singles])
        assert a.shape[0] == 50 and np.array_equal(a, b) and np.allclose(a, s, rtol=1e-12, atol=0), name
    assert full.valid.any() and not full.valid.all()
    assert evaluate(p, parts[:0]).throughput.shape == (0,)


# ------------------------------------------------------------------------------ validation
def test_input_validation():
    with pytest.raises(ValueError, match="parts"):
        evaluate(fig2(), [0, 0, 1, 1, 4])
    with pytest.raises(ValueError, match="parts"):
        evaluate(fig2(), [0, 0, 1, 1, -1])
    with pytest.raises(ValueError, match="parts"):
        static_violations(fig2(), [[0, 0, 1, 1]])
    with pytest.raises(ValueError, match="parts"):
        evaluate(fig2(), np.zeros(5))
    with pytest.raises(ValueError, match="num_chips"):
        MCMProblem.from_arrays(65, [0], [1], [1.0, 1.0])
    with pytest.raises(ValueError, match="time_s"):
        MCMProblem.from_arrays(2, [0], [1], [1.0, -1.0])
    with pytest.raises(ValueError, match="out_bytes"):
        MCMProblem.from_arrays(2, [0], [1], [1.0, 1.0], out_bytes=[1.0])
    with pytest.raises(ValueError, match="dst"):
        MCMProblem(2, [0], [2], [1.0, 1.0], [0, 0], [0, 0], [0, 1], 1.0, 1.0)
    with pytest.raises(ValueError, match="topo"):
        MCMProblem(2, [0], [1], [1.0, 1.0], [0, 0], [0, 0], [1, 0], 1.0, 1.0)
    with pytest.raises(ValueError, match="src"):
        MCMProblem.from_arrays(2, [0, 1], [1, 0], [1.0, 1.0])  # a cycle
    with pytest.raises(ValueError, match="sram_bytes"):
        MCMProblem.from_arrays(2, [0], [1], [1.0, 1.0], sram_bytes=0)
    p = fig2()
    assert p.num_nodes == 5 and not p.time_s.flags.writeable


# ------------------------------------------------------------------------------ real graphs
def test_from_graph_cnn_and_forward_only():
    from archplace.hardware.presets import mcm_package
    from archplace.workloads.backward import derive_backward
    from archplace.workloads.synthetic import cnn_graph

    g = cnn_graph(3, seed=1, batch=1)
    p = MCMProblem.from_graph(g)
    assert (p.num_chips, p.num_nodes, p.num_edges) == (36, g.num_nodes, g.num_edges)
    assert p.sram_bytes == 32 * MB and p.link_bw_bytes_per_s == 32e9
    tensor = np.isin(g.nodes["kind"], ["conv", "linear"])
    assert (p.time_s[tensor] > 0).all() and (p.time_s >= 0).all()
    assert p.out_bytes.tolist() == g.nodes["output_bytes"].astype(float).tolist()
    assert p.names[0] == g.nodes["name"][0]
    f = greedy_partition(p)
    v = static_violations(p, f)
    assert not v["eq2"][0] and not v["eq3"][0]
    assert evaluate(p, f).latency_s.max() > 0
    train = MCMProblem.from_graph(derive_backward(g), mcm_package(8))
    assert train.num_nodes == g.num_nodes and train.num_chips == 8
    both = MCMProblem.from_graph(derive_backward(g), mcm_package(8), forward_only=False)
    assert both.num_nodes > g.num_nodes


def test_from_graph_bert_forward():
    """BERT-base forward at int8 (the chiplet's precision; at bf16 the 44.7 MB word embedding alone
    overflows a 32 MB chip, so no partition could pass H): the greedy walk meets Eqs. 2 and 3 and
    memory, but residual connections skip a chip, so Eq. 4 fails -- the reason FIX repair exists."""
    from archplace.workloads.models import build_graph

    # seq 64: at 128 the cuts happen to leave no chip inside a residual span since copies (the heads'
    # transposes made contiguous) cost their bytes; at 64, 256 and 512 one does
    g = build_graph("bert-base", seq=64, training=False, bytes_per_element=1)  # ~7 s, once per process
    p = MCMProblem.from_graph(g)  # ~10 ms
    assert p.num_nodes == g.num_nodes and p.time_s.sum() > 0
    assert (p.time_s[g.nodes["kind"] == "linear"] > 0).all()
    f = greedy_partition(p)
    assert 1 <= f.max() <= 35 and set(f.tolist()) == set(range(f.max() + 1))
    v = static_violations(p, f)
    assert not v["eq2"][0] and not v["eq3"][0] and v["eq4"][0]
    reasons = check(p, f)
    assert reasons and all(r.startswith("eq4: chips ") for r in reasons)
    r = evaluate(p, f)
    assert r.memory_ok[0] and not r.static_ok[0] and r.throughput[0] == 0 and r.max_latency_s[0] > 0
