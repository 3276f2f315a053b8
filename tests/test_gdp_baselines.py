"""GDP placement baselines (issue 18): METIS, Baechi's m-TOPO / m-ETF / m-SCT, human-like, random, single.

Hand-made graphs with placements and step times worked out by hand; seeded random DAGs for the
invariants (co-location groups never split, memory-aware placers stay within memory).
"""

from __future__ import annotations

import numpy as np
import pytest

from archplace.algorithms.search import gdp_baselines as gb
from archplace.simulators.gpu_placement import PlacementProblem, coloc_violations, simulate

GB = 1e9
LAT, BW = 10e-6, 12e9


def xfer(nbytes: float) -> float:
    return LAT + nbytes / BW


def make(compute, src=(), dst=(), edge_bytes=None, *, d=2, memory=16 * GB, resident=None, output=None,
         coloc=None, priority=None) -> PlacementProblem:
    n = len(compute)
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    eb = np.zeros(len(src)) if edge_bytes is None else np.broadcast_to(np.asarray(edge_bytes, float),
                                                                          len(src))
    return PlacementProblem(
        np.asarray(compute, float), np.zeros(n) if output is None else np.asarray(output, float),
        np.zeros(n) if resident is None else np.asarray(resident, float), src, dst, eb,
        np.full(n, -1) if coloc is None else np.asarray(coloc), np.arange(n) if priority is None else
        np.asarray(priority), d, float(memory), BW, LAT, "pcie")


def chain(compute, edge_bytes=0.0, **kw) -> PlacementProblem:
    n = len(compute)
    return make(compute, range(n - 1), range(1, n), edge_bytes, **kw)


def random_dag(n: int, seed: int, *, d: int = 4, groups: int = 0, memory: float = 16 * GB,
               resident_scale: float = 0.0) -> PlacementProblem:
    """Layered random DAG (width 10): 1-3 inputs from the previous layer, sometimes a skip edge;
    ``groups`` co-location groups pair an op of layer l with one of the mirror layer (fwd/bwd-like)."""
    rng = np.random.default_rng(seed)
    width = 10
    L = n // width
    src, dst = [], []
    for lay in range(1, L):
        for i in range(width):
            v = lay * width + i
            for u in rng.choice(width, size=int(rng.integers(1, 4)), replace=False):
                src.append((lay - 1) * width + int(u))
                dst.append(v)
            if lay >= 2 and rng.random() < 0.2:
                src.append((lay - 2) * width + int(rng.integers(width)))
                dst.append(v)
    n = L * width
    out = rng.uniform(1e4, 1e7, n)
    coloc = np.full(n, -1)
    for g in range(groups):
        lay, i = g % (L // 2), g // (L // 2)
        coloc[lay * width + i] = coloc[(L - 1 - lay) * width + i] = g
    res = rng.uniform(0, resident_scale, n)
    return make(rng.uniform(1e-5, 1e-3, n), src, dst, out[np.asarray(src)], d=d, memory=memory,
                resident=res, output=out, coloc=coloc)


# ---------------------------------------------------------------------------------------------- m-ETF
def test_m_etf_keeps_a_chain_with_a_huge_op_on_one_device():
    p = chain([1e-4, 1e-4, 5e-2, 1e-4, 1e-4], edge_bytes=1e6, d=4)
    for fn in (gb.m_etf, gb.m_sct):
        P = fn(p)
        assert P.tolist() == [0, 0, 0, 0, 0]
        assert simulate(p, P).step_time_s == pytest.approx(p.compute_s.sum(), rel=1e-12)


def test_m_etf_puts_two_heavy_chains_on_two_devices_with_closed_form_step_time():
    launch = 5e-6
    a = np.array([3e-3, 2e-3, 4e-3]) + launch
    b = np.array([1e-3, 5e-3, 1e-3]) + launch
    # ops 0,2,4 = chain A; 1,3,5 = chain B; priorities interleave the chains
    comp = np.empty(6)
    comp[0::2], comp[1::2] = a, b
    p = make(comp, [0, 2, 1, 3], [2, 4, 3, 5], 1e8)  # 1e8 B: an 8 ms transfer, longer than any op
    trace = {}
    P = gb._list_schedule(p, sct=False, trace=trace)
    assert P.tolist() == [0, 1, 0, 1, 0, 1]
    assert np.array_equal(P, gb.m_etf(p))
    r = simulate(p, P)
    assert r.valid and r.num_transfers == 0
    assert r.step_time_s == pytest.approx(max(a.sum(), b.sum()), rel=1e-12)
    assert trace["finish"].max() == pytest.approx(r.step_time_s, rel=1e-12)  # the model's schedule
    assert r.step_time_s < simulate(p, gb.single_device(p)).step_time_s


def test_m_etf_spreads_independent_ops():
    p = make([1e-3] * 4, d=4)
    assert gb.m_etf(p).tolist() == [0, 1, 2, 3]
    assert simulate(p, gb.m_etf(p)).step_time_s == pytest.approx(1e-3)


def naive_etf(p: PlacementProblem) -> list[int]:
    """ETF by its definition, O(n^2 d), without memory: the (ready op, device) pair of the earliest
    start, ties to the lower priority then device; a placed group pins its other ops."""
    n, d = p.num_nodes, p.num_devices
    dev, fin, avail = [-1] * n, [0.0] * n, [0.0] * d
    preds = [[] for _ in range(n)]
    for s_, t_, b_ in zip(p.src.tolist(), p.dst.tolist(), p.edge_bytes.tolist()):
        preds[t_].append((s_, b_))
    pin = [-1] * n
    for _ in range(n):
        best = None
        for w in range(n):
            if dev[w] >= 0 or any(dev[v] < 0 for v, _ in preds[w]):
                continue
            for f in range(d):
                if pin[w] >= 0 and pin[w] != f:
                    continue
                arr = max([fin[v] + (0.0 if dev[v] == f else xfer(max(b for u, b in preds[w] if u == v)))
                           for v, _ in preds[w]], default=0.0)
                key = (max(avail[f], arr), int(p.priority[w]), f, w)
                best = key if best is None or key < best else best
        t, _, f, w = best
        dev[w], fin[w], avail[f] = f, t + p.compute_s[w], t + p.compute_s[w]
        for x in np.flatnonzero((p.coloc_group == p.coloc_group[w]) & (p.coloc_group >= 0)):
            pin[x] = f
    return dev


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_m_etf_matches_the_definition(seed):
    p = random_dag(120, seed, d=3, groups=8)
    assert gb.m_etf(p, contention=False).tolist() == naive_etf(p)


def test_m_etf_sees_the_send_port_queue_on_pcie():
    """A -> B, C, D with 0.6 ms transfers, 1 ms ops, 4 GPUs. Without queues ETF sends C and D away
    (both would arrive at 1.6 ms); A's send port serialises them, so D would arrive at 2.2 ms, after
    device 0 is free again (2 ms): the contention-aware m-ETF keeps D."""
    x = 7.08e6
    p = make([1e-3] * 4, [0, 0, 0], [1, 2, 3], x, d=4)
    plain, queued = gb.m_etf(p, contention=False), gb.m_etf(p)
    assert plain.tolist() == [0, 0, 1, 2]
    assert queued.tolist() == [0, 0, 1, 0]
    assert simulate(p, plain).step_time_s == pytest.approx(2e-3 + 2 * xfer(x), rel=1e-12)
    assert simulate(p, queued).step_time_s == pytest.approx(3e-3, rel=1e-12)
    p.interconnect = "nvlink"  # one link per pair: no queue
    assert gb.m_etf(p).tolist() == [0, 0, 1, 2]


def test_m_sct_keeps_the_favourite_child_where_m_etf_moves_it():
    """A -> B (big edge), A -> C (small edge); C has the lower priority. m-ETF runs C after A on
    device 0 and sends B's input away; m-SCT keeps A's favourite child B and sends C's instead."""
    big, small = 6e6, 1.2e6
    p = make([1e-3, 1e-3, 1e-3], [0, 0], [1, 2], [big, small], priority=[0, 2, 1])
    etf, sct = gb.m_etf(p), gb.m_sct(p)
    assert etf.tolist() == [0, 1, 0]
    assert sct.tolist() == [0, 0, 1]
    assert simulate(p, etf).step_time_s == pytest.approx(2e-3 + xfer(big), rel=1e-12)
    assert simulate(p, sct).step_time_s == pytest.approx(2e-3 + xfer(small), rel=1e-12)


def test_favourite_children_are_a_matching_on_the_largest_transfers():
    #  0 -> 1 (5), 0 -> 2 (9), 3 -> 2 (7), 3 -> 4 (1)
    p = make([1.0] * 5, [0, 0, 3, 3], [1, 2, 2, 4], [5, 9, 7, 1], priority=[0, 3, 4, 1, 2])
    assert gb._favourite_children(p) == [2, -1, -1, 4, -1]


# ---------------------------------------------------------------------------------------------- m-TOPO
def test_m_topo_cuts_the_topological_order_at_the_compute_shares():
    # total 21, d=3: share 7 -> ops 0-2 (6); then share 15/2 -> ops 3-4 (9); then op 5
    p = chain([1, 2, 3, 4, 5, 6], d=3)
    assert gb.m_topo(p).tolist() == [0, 0, 0, 1, 1, 2]
    assert gb.m_topo(chain([1.0] * 6, d=3)).tolist() == [0, 0, 1, 1, 2, 2]


def test_m_topo_moves_on_when_a_device_is_full():
    # op 1 does not fit next to op 0 (6 + 6 > 10 GB): device 1 starts at op 1 with share 5/2
    p = chain([1.0] * 6, d=3, resident=np.array([6, 6, 1, 1, 1, 1]) * GB, memory=10 * GB)
    P = gb.m_topo(p)
    assert P.tolist() == [0, 1, 1, 1, 2, 2]
    assert simulate(p, P).valid
    assert not simulate(p, gb.single_device(p)).valid


# ---------------------------------------------------------------------------------------------- METIS
def test_metis_separates_two_cliques_joined_by_a_light_edge():
    src, dst, eb = [], [], []
    for base in (0, 5):
        for i in range(5):
            for j in range(i + 1, 5):
                src.append(base + i)
                dst.append(base + j)
                eb.append(1e8)
    src.append(4)
    dst.append(5)
    eb.append(1e3)
    p = make([1e-3] * 10, src, dst, eb)
    for seed in (0, 1, 2):
        P = gb.metis(p, seed=seed)
        assert len(set(P[:5].tolist())) == 1 and len(set(P[5:].tolist())) == 1
        assert P[0] != P[5]


def test_metis_contracts_groups_and_ignores_memory():
    p = random_dag(200, 3, groups=12, memory=1 * GB, resident_scale=0.2 * GB)
    P = gb.metis(p, seed=0)
    assert not coloc_violations(p, P[None])[0]
    assert set(P.tolist()) == {0, 1, 2, 3}
    assert not simulate(p, P).valid  # ~20 GB of weights on 4 x 1 GB: METIS is not memory-aware


def test_int_weights_are_positive_and_bounded():
    w = gb._int_weights(np.array([0.0, 1e-9, 0.5, 2.0]))
    assert w.tolist() == [1, 1, 250, 1000]
    assert gb._int_weights(np.full(10**6, 7.0)).sum() <= 2**29  # METIS sums weights in 32 bits


# ---------------------------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("seed", [0, 1])
def test_no_baseline_splits_a_colocation_group(seed):
    p = random_dag(300, seed, groups=25)
    layer = np.arange(p.num_nodes) // 30
    for name, fn in gb.BASELINES.items():
        P = fn(p, seed=seed, layer=layer) if name == "human" else fn(p, seed=seed)
        assert P.dtype == np.int64 and P.shape == (p.num_nodes,), name
        assert P.min() >= 0 and P.max() < p.num_devices, name
        assert not coloc_violations(p, P[None])[0], name


@pytest.mark.parametrize("seed", [0, 1])
def test_memory_aware_baselines_fit_where_one_device_does_not(seed):
    # 8 GB of weights in the first third of the ops, 4 x 3 GB: neither one device nor compute-balanced
    # contiguous blocks (human without layers) fit; the Baechi placers spread the weights
    p = random_dag(300, seed, groups=20, memory=3 * GB)
    p.resident_bytes = np.where(np.arange(p.num_nodes) < 100, 80e6, 0.0)
    assert not simulate(p, gb.single_device(p)).valid
    assert not simulate(p, gb.human(p)).valid
    for fn in (gb.m_topo, gb.m_etf, gb.m_sct):
        r = simulate(p, fn(p))
        assert r.valid, (fn.__name__, r.reason)
        assert (r.peak_memory_bytes <= p.memory_bytes).all()


def test_the_memory_estimate_bounds_the_simulated_peak():
    p = random_dag(200, 5, groups=10, resident_scale=50e6)
    for fn in (gb.m_topo, gb.m_etf, gb.m_sct):
        P = fn(p)
        unit, members = gb._units(p)
        book = gb._MemoryBook(p, unit, members)
        dev = P.tolist()
        for w in np.argsort(p.priority).tolist():
            book.commit(w, dev[w], dev)
        used = p.memory_bytes - np.array(book.free)
        assert (simulate(p, P).peak_memory_bytes <= used * (1 + 1e-12)).all()


def test_placers_fall_back_to_the_roomiest_device_when_nothing_fits():
    p = chain([1e-3] * 4, d=2, resident=np.full(4, 3 * GB), memory=4 * GB)
    for fn in (gb.m_topo, gb.m_etf, gb.m_sct):
        P = fn(p)
        assert sorted(np.bincount(P, minlength=2).tolist()) == [2, 2]
        assert not simulate(p, P).valid


def test_baselines_are_seeded_and_place_every_op_on_a_2000_op_dag():
    # their speed is not asserted here (a wall-clock bound fails on a loaded machine and proves little
    # on an idle one): each baseline places every op on one of the 8 devices, the same way twice
    p = random_dag(2000, 7, d=8, groups=100)
    for name, fn in gb.BASELINES.items():
        P = fn(p, seed=3)
        assert P.shape == (2000,) and P.min() >= 0 and P.max() < 8, name
        assert np.array_equal(P, fn(p, seed=3)), name
    assert not np.array_equal(gb.random_placement(p, seed=1), gb.random_placement(p, seed=2))


# ---------------------------------------------------------------------------------------------- human
def test_human_round_robin_for_rnns():
    p = chain([1e-3] * 10, d=2)
    layer = np.repeat(np.arange(5), 2)
    assert gb.human(p, layer=layer, family="rnnlm").tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0]
    names = ["embedding", "lstm0", "lstm1", "lstm2", "lstm3", "softmax_loss"]
    layer = np.array([0, 1, 2, 3, 4, 5, 5])
    p = chain([1e-3] * 7, d=2)
    P = gb.human(p, layer=layer, family="GNMT", layer_names=names)
    assert P.tolist() == [0, 0, 1, 0, 1, 1, 1]


def test_human_gnmt_puts_encoder_and_decoder_layer_i_on_device_i():
    names = ["src_embedding", "tgt_embedding", "encoder_layers.0", "encoder_layers.1", "attention",
             "decoder_layers.0", "decoder_layers.1", "softmax"]
    p = chain([1e-3] * 8, d=2)
    P = gb.human(p, layer=np.arange(8), family="gnmt", layer_names=names)
    assert P.tolist() == [0, 0, 0, 1, 0, 0, 1, 1]


def test_human_contiguous_blocks_balanced_by_compute():
    p = chain([4, 1, 1, 1, 1], d=2)
    assert gb.human(p, layer=np.arange(5), family="transformer_xl").tolist() == [0, 1, 1, 1, 1]
    p = chain([1.0] * 8, d=4)
    assert gb.human(p, layer=np.repeat(np.arange(4), 2)).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    p = chain([5, 1, 1, 1], d=3)  # every device gets a layer when the bound allows it
    assert gb.human(p, layer=np.arange(4)).tolist() == [0, 1, 1, 2]


def test_human_fills_missing_layers_from_the_nearest_op_in_topological_order():
    lay = gb._fill_layers(np.array([-1, 0, 0, -1, -1, 1, 1, -1]), np.arange(8))
    assert lay.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gb._fill_layers(np.array([-1, -1]), np.array([1, 0])).tolist() == [1, 0]


def test_human_follow_and_colocation():
    # 0,1 forward of layers 0,1; 2,3 their backward ops (follow); 4 shares a group with 0
    p = make([1.0] * 5, [0, 1, 2, 3], [1, 2, 3, 4], d=2, coloc=[0, -1, -1, -1, 0])
    P = gb.human(p, layer=np.array([0, 1, 1, 0, 1]), family="rnnlm", follow=np.array([-1, -1, 1, 0, -1]))
    assert P.tolist() == [0, 1, 1, 0, 0]


def test_human_from_graph_reads_layers_family_and_backward_map():
    from archplace.hardware.gpu_machines import gpu_machine
    from archplace.workloads.graph import OpGraph

    g = OpGraph.from_columns(
        {"id": [10, 11, 12, 13, 14], "kind": ["embedding", "linear", "linear", "linear", "linear"],
         "layer": [0, 1, 2, 2, 1], "is_backward": [False, False, False, True, True],
         "fwd_id": [-1, -1, -1, 12, 11], "flops": [1e9] * 5, "output_bytes": [1000] * 5},
        {"src": [10, 11, 12, 13], "dst": [11, 12, 13, 14], "bytes": [1000] * 4},
        meta={"model": "rnnlm-2", "layers": ["embedding", "lstm0", "lstm1"]})
    p = PlacementProblem.from_graph(g, gpu_machine("p100-pcie", 3))
    # rnnlm: lstm0 -> 0, lstm1 -> 1, embedding with lstm0; backward ops 13, 14 follow 12, 11
    assert gb.human_from_graph(g, p).tolist() == [0, 0, 1, 1, 0]
    # blocks: layers weigh 1, 2, 2 ops of equal compute -> one layer per device
    assert gb.human_from_graph(g, p, family="transformer").tolist() == [0, 1, 2, 2, 1]


# ---------------------------------------------------------------------------------------------- misc
def test_trivial_baselines_and_registry():
    p = random_dag(100, 2, groups=5)
    assert gb.single_device(p).tolist() == [0] * p.num_nodes
    assert set(gb.BASELINES) == {"metis", "m-topo", "m-etf", "m-sct", "human", "random", "single"}
    q = make([], d=3)
    for fn in gb.BASELINES.values():
        assert fn(q).shape == (0,)
    one = make([1e-3] * 3, [0, 1], [1, 2], d=1)
    for fn in gb.BASELINES.values():
        assert fn(one).tolist() == [0, 0, 0]


def test_bad_input_names_the_field():
    p = make([1.0] * 3, [0, 1], [1, 2], priority=[0, 2, 1])
    for fn in gb.BASELINES.values():
        with pytest.raises(ValueError, match="priority"):
            fn(p)
    with pytest.raises(ValueError, match="problem"):
        gb.m_etf("not a problem")
    with pytest.raises(ValueError, match="memory_bytes"):
        gb.m_topo(make([1.0], memory=0.0))
    q = chain([1.0] * 3)
    with pytest.raises(ValueError, match="layer"):
        gb.human(q, layer=[0, 1])
    with pytest.raises(ValueError, match="family"):
        gb.human(q, layer=[0, 1, 2], family=3)
    with pytest.raises(ValueError, match="layer_names"):
        gb.human(q, layer=[0, 1, 2], family="rnnlm", layer_names=["a"])
    with pytest.raises(ValueError, match="follow"):
        gb.human(q, layer=[0, 1, 2], follow=[0, 5, -1])
