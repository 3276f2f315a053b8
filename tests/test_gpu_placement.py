"""The GPU placement simulator (issue 18) against hand-computed step times and memory peaks: compute
on one stream, transfers, PCIe port and NVLink pair contention, the ready-queue priority, activation
lifetimes, out of memory and split co-location groups as results; the compiled event loop equals the
plain-Python reference on random DAGs and placements."""

from __future__ import annotations

import numpy as np
import pytest

from archplace.hardware.gpu_machines import GIB, gpu_machine
from archplace.simulators.gpu_placement import (
    PlacementProblem,
    simulate,
    simulate_batch,
    simulate_reference,
)
from archplace.workloads.graph import OpGraph

BW, LAT = 10e9, 1e-5


def problem(compute, edges, *, out=None, resident=None, coloc=None, d=2, mem=1e12, ic="pcie", prio=None,
            edge_bytes=None):
    n = len(compute)
    src = [u for u, _ in edges]
    dst = [v for _, v in edges]
    eb = edge_bytes if edge_bytes is not None else [1e8] * len(edges)
    return PlacementProblem(compute, out if out is not None else [0] * n,
                            resident if resident is not None else [0] * n, src, dst, eb,
                            coloc if coloc is not None else [-1] * n,
                            prio if prio is not None else list(range(n)), d, mem, BW, LAT, ic)


def both(p, placement):
    """The compiled and the reference result, after checking they agree."""
    fast, ref = simulate(p, placement), simulate_reference(p, placement)
    assert fast.step_time_s == pytest.approx(ref.step_time_s, rel=1e-12)
    assert np.allclose(fast.peak_memory_bytes, ref.peak_memory_bytes)
    assert fast.valid == ref.valid and fast.reason == ref.reason
    return fast


XFER = LAT + 1e8 / BW  # one 100 MB transfer: 10.01 ms


def test_chain_on_one_device_is_the_sum_of_compute_and_across_devices_pays_one_transfer():
    p = problem([1e-3, 2e-3], [(0, 1)])
    assert both(p, [0, 0]).step_time_s == pytest.approx(3e-3)
    r = both(p, [0, 1])
    assert r.step_time_s == pytest.approx(1e-3 + XFER + 2e-3)
    assert r.num_transfers == 1 and r.transfer_bytes == pytest.approx(1e8)
    assert r.compute_busy_s.tolist() == pytest.approx([1e-3, 2e-3])


def test_parallel_branches_overlap_on_two_devices():
    # 0 -> {1, 2} -> 3: with 1 on the other device, both branches run at once
    p = problem([1e-3, 5e-3, 5e-3, 1e-3], [(0, 1), (0, 2), (1, 3), (2, 3)], edge_bytes=[1e3] * 4)
    small = LAT + 1e3 / BW
    assert both(p, [0, 0, 0, 0]).step_time_s == pytest.approx(12e-3)
    assert both(p, [0, 1, 0, 0]).step_time_s == pytest.approx(1e-3 + small + 5e-3 + small + 1e-3)


@pytest.mark.parametrize("ic", ["pcie", "nvlink"])
def test_two_transfers_into_one_gpu_share_its_pcie_receive_port_but_not_nvlink(ic):
    # 0 on gpu0 and 1 on gpu1 finish together at 1 ms; both feed 2 on gpu2
    p = problem([1e-3, 1e-3, 1e-3], [(0, 2), (1, 2)], d=3, ic=ic)
    expect = 1e-3 + (2 * XFER if ic == "pcie" else XFER) + 1e-3
    assert both(p, [0, 1, 2]).step_time_s == pytest.approx(expect)


@pytest.mark.parametrize("ic", ["pcie", "nvlink"])
def test_one_gpu_sending_to_two_shares_its_send_port_on_pcie(ic):
    # 0 on gpu0 feeds 1 on gpu1 and 2 on gpu2
    p = problem([1e-3, 1e-3, 1e-3], [(0, 1), (0, 2)], d=3, ic=ic)
    expect = 1e-3 + (2 * XFER if ic == "pcie" else XFER) + 1e-3
    assert both(p, [0, 1, 2]).step_time_s == pytest.approx(expect)


def test_one_transfer_per_destination_device_sized_by_the_largest_edge():
    # 0 feeds 1 and 2, both on gpu1: one transfer of max(1e8, 3e8) bytes
    p = problem([1e-3, 1e-3, 1e-3], [(0, 1), (0, 2)], edge_bytes=[1e8, 3e8])
    r = both(p, [0, 1, 1])
    assert r.num_transfers == 1 and r.transfer_bytes == pytest.approx(3e8)
    assert r.step_time_s == pytest.approx(1e-3 + LAT + 3e8 / BW + 2e-3)


def test_ready_queue_runs_the_lower_priority_first():
    # 1 (10 ms) and 2 (1 ms) are both ready on gpu0 after 0; 3 (10 ms, on gpu1) needs only 2
    comp, edges = [1e-3, 10e-3, 1e-3, 10e-3], [(0, 1), (0, 2), (2, 3)]
    long_first = problem(comp, edges, prio=[0, 1, 2, 3], edge_bytes=[0.0] * 3)
    short_first = problem(comp, edges, prio=[0, 2, 1, 3], edge_bytes=[0.0] * 3)
    assert both(long_first, [0, 0, 0, 1]).step_time_s == pytest.approx(1e-3 + 10e-3 + 1e-3 + LAT + 10e-3)
    assert both(short_first, [0, 0, 0, 1]).step_time_s == pytest.approx(1e-3 + 1e-3 + LAT + 10e-3)


def test_activation_memory_peak_on_a_chain_frees_before_allocating():
    # outputs 100, 200, 400 bytes; a's output lives until b ends, b's until c ends
    p = problem([1e-3] * 3, [(0, 1), (1, 2)], out=[100, 200, 400], edge_bytes=[100, 200],
                resident=[10, 20, 30], d=1)
    r = both(p, [0, 0, 0])
    assert r.peak_memory_bytes[0] == pytest.approx(max(100 + 200, 200 + 400) + 60)


def test_memory_across_devices_holds_the_send_buffer_and_the_received_copy():
    # a (gpu0, out 1e8) -> b (gpu1, out 50): gpu0 keeps a's output until the transfer ends,
    # gpu1 holds the copy from the transfer's start until b ends, plus b's own output
    p = problem([1e-3, 1e-3], [(0, 1)], out=[1e8, 50], resident=[7, 9])
    r = both(p, [0, 1])
    assert r.peak_memory_bytes.tolist() == pytest.approx([1e8 + 7, 1e8 + 50 + 9])


def test_out_of_memory_and_split_groups_are_results_with_reasons():
    p = problem([1e-3, 1e-3, 1e-3], [(0, 1), (1, 2)], resident=[6 * GIB, 6 * GIB, 6 * GIB],
                coloc=[0, 0, -1], mem=16 * GIB, edge_bytes=[0, 0])
    r = both(p, [0, 0, 0])
    assert not r.valid and r.reason == "out of memory on device 0: peak 18.00 GiB > 16.00 GiB"
    assert r.step_time_s == pytest.approx(3e-3)  # still reported
    ok = both(p, [0, 0, 1])
    assert ok.valid and ok.reason == ""
    split = both(p, [0, 1, 1])
    assert not split.valid
    assert split.reason.startswith("co-location group 0 (with 0) is split over devices 0, 1")


def test_bad_placements_are_refused_naming_the_entry():
    p = problem([1e-3, 1e-3], [(0, 1)])
    with pytest.raises(ValueError, match=r"placement\[0\]\[1\] is device 2, allowed 0..1"):
        simulate(p, [0, 2])
    with pytest.raises(ValueError, match="expected"):
        simulate(p, [0, 0, 0])


def _random_problem(n, d, seed, ic):
    rng = np.random.default_rng(seed)
    src, dst = [], []
    for v in range(1, n):
        for u in rng.choice(v, size=min(v, int(rng.integers(1, 3))), replace=False):
            src.append(int(u))
            dst.append(v)
    m = len(src)
    return PlacementProblem(rng.uniform(1e-4, 1e-3, n), rng.integers(1, 10**7, n), rng.integers(0, 10**8, n),
                            src, dst, rng.integers(0, 10**7, m),
                            np.where(rng.random(n) < 0.2, rng.integers(0, 3, n), -1), rng.permutation(n),
                            d, 5e8, 12e9, 1e-5, ic)


@pytest.mark.parametrize("ic", ["pcie", "nvlink"])
def test_compiled_equals_reference_on_random_dags(ic):
    for s in range(12):
        n, d = 6 + 3 * s, 2 + s % 3
        p = _random_problem(n, d, s, ic)
        P = np.random.default_rng(100 + s).integers(0, d, (4, n))
        b = simulate_batch(p, P)
        for k in range(4):
            ref = simulate_reference(p, P[k])
            assert b.step_time_s[k] == pytest.approx(ref.step_time_s, rel=1e-12)
            assert np.allclose(b.peak_memory_bytes[k], ref.peak_memory_bytes)
            assert b.valid[k] == ref.valid and b.num_transfers[k] == ref.num_transfers
            assert b.transfer_bytes[k] == pytest.approx(ref.transfer_bytes)


def test_compiled_equals_reference_when_many_events_share_an_instant():
    # whole-millisecond compute and transfer times: completions and arrivals coincide, so the order of the
    # events of one instant (finishes first, then by creation) and the peaks read per instant are tested
    for s in range(8):
        n, d = 12 + 4 * s, 2 + s % 3
        q = _random_problem(n, d, s, ["pcie", "nvlink"][s % 2])
        rng = np.random.default_rng(s)
        p = PlacementProblem(rng.integers(0, 3, n) * 1e-3, q.output_bytes, q.resident_bytes, q.src, q.dst,
                             rng.integers(1, 3, q.num_edges) * 1e6, q.coloc_group, q.priority, d, 5e8, 1e9,
                             1e-3, q.interconnect)
        P = rng.integers(0, d, (4, n))
        b = simulate_batch(p, P)
        for k in range(4):
            ref = simulate_reference(p, P[k])
            assert b.step_time_s[k] == pytest.approx(ref.step_time_s, rel=1e-12)
            assert np.array_equal(b.peak_memory_bytes[k], ref.peak_memory_bytes)
            assert b.num_transfers[k] == ref.num_transfers


@pytest.mark.parametrize("ic", ["pcie", "nvlink"])
def test_threads_split_the_batch_without_changing_a_bit(ic):
    p = _random_problem(60, 4, 7, ic)
    P = np.random.default_rng(7).integers(0, 4, (13, 60))
    one = simulate_batch(p, P)
    for threads in (2, 5, 13, 40):
        many = simulate_batch(p, P, threads=threads)
        for f in ("step_time_s", "valid", "oom", "coloc_violated", "peak_memory_bytes", "compute_busy_s",
                  "transfer_bytes", "num_transfers"):
            assert np.array_equal(getattr(one, f), getattr(many, f)), f
    with pytest.raises(ValueError, match="threads"):
        simulate_batch(p, P, threads=0)


def test_from_graph_roofline_and_resident_state():
    g = OpGraph.from_columns(
        {"id": [0, 1, 2], "kind": ["input", "matmul", "matmul"], "flops": [0, 2e12, 1e6],
         "input_bytes": [0, 4e6, 4e6], "output_bytes": [4e6, 4e6, 4e6], "weight_bytes": [0, 4e6, 0],
         "is_backward": [False, False, True], "fwd_id": [-1, -1, 1]},
        {"src": [0, 1], "dst": [1, 2], "bytes": [4e6, 4e6]},
        extra_nodes={"coloc_group": np.array([-1, 5, 5])})
    m = gpu_machine("p100-pcie", 2)
    p = PlacementProblem.from_graph(g, m)
    assert p.compute_s[0] == 0.0  # a model input costs nothing
    assert p.compute_s[1] == pytest.approx(2e12 / 9.3e12 + 5e-6)  # compute-bound
    assert p.compute_s[2] == pytest.approx(8e6 / 732e9 + 5e-6)  # memory-bound: inputs + outputs
    assert p.resident_bytes.tolist() == [0, 16e6, 0]  # weights x 4 (Adam), forward op only
    assert p.coloc_group.tolist() == [-1, 5, 5] and p.memory_bytes == 16 * GIB
    r = simulate(p, [0, 0, 1])
    assert not r.valid and "co-location group 5" in r.reason
