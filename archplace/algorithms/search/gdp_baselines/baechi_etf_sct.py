"""Baechi's m-ETF and m-SCT (Jeon et al., "Baechi: Fast Device Placement of Machine Learning Graphs",
SoCC 2020), written after the authors' code (``placer/m_etf.py``, ``m_sct.py`` of
github.com/beomyeol/baechi): one list scheduler, :func:`_list_schedule`, runs both.

**m-ETF** is earliest-task-first list scheduling (Hwang et al. 1989) with memory: it repeatedly
starts the (ready op, device) pair with the earliest start time ``max(device free, inputs there)``
and skips devices without memory left for the op. Ties go to the lower ``priority`` (Baechi's
topological order), then the lower device. An op is *ready* once all its producers are scheduled
(classic ETF). An input from another device takes the simulator's ``link_latency_s + bytes /
link_bytes_per_s`` and, as in the simulator (and in Baechi's channels), queues: on the sender's send
port and the receiver's receive port (``pcie``) or on the directed pair's link (``nvlink``). A
transfer is booked when its consumer is scheduled (the inputs of one op in their producers' finish
order), and an output already sent to a device serves every later consumer there.
``contention=False`` gives textbook ETF (no queues). *Simplified*: the simulator sends an output
when its producer finishes, in device order, with the largest of its edges to that device; here
the transfer is booked at the consumer's scheduling with that consumer's edge. A device found
without memory for an op is skipped for that op for good. When the first op of a co-location group
is scheduled, the group's other ops are pinned to its device.

**m-SCT** is m-ETF with Baechi's small-communication-time (SCT) favourite-child rule: a device that
has just run op ``v`` waits for ``v``'s favourite child ``c`` when ``c`` is ready and can start on
this device no later than on any other device, unless an *urgent* op (one that could already start
on every device) can run first; the waiting device wins ties for ``c``. *Simplified*: Baechi picks
favourite children with an LP relaxation of the SCT schedule (infinitely many devices, rounded at
0.5, solved with MOSEK); here each op's favourite child is the child with the largest transfer,
chosen greedily over edges in decreasing bytes so that every op has at most one favourite child and
is the favourite child of at most one parent (the LP's rules 4 and 5). The urgent time of a ready op
is ``max(latest free time over devices, latest input arrival over devices as estimated when the op
became ready)`` (Baechi takes the max of its current per-device start times over the devices with
memory for it); only ops not pinned by an already placed co-location group count as urgent, and only
the one of the earliest urgent time is considered.

Memory: the model of :mod:`.baechi_memory`.
"""

from __future__ import annotations

import heapq

import numpy as np

from ....simulators.gpu_placement import PlacementProblem
from .baechi_memory import _MemoryBook
from .units import _check, _units


def _favourite_children(problem: PlacementProblem) -> list[int]:
    """Greedy SCT favourite children: edges by decreasing bytes; each op gets at most one favourite
    child and is the favourite child of at most one parent (module doc)."""
    n = problem.num_nodes
    fav = [-1] * n
    if not problem.num_edges:
        return fav
    key = problem.src * n + problem.dst
    uk, inv = np.unique(key, return_inverse=True)
    b = np.zeros(len(uk))
    np.maximum.at(b, inv, problem.edge_bytes)
    s, t = uk // n, uk % n
    order = np.lexsort((problem.priority[t], problem.priority[s], -b))
    has_parent = [False] * n
    for i in order.tolist():
        if b[i] <= 0:
            break
        v, c = int(s[i]), int(t[i])
        if fav[v] < 0 and not has_parent[c]:
            fav[v] = c
            has_parent[c] = True
    return fav


def _list_schedule(problem: PlacementProblem, sct: bool, contention: bool = True, trace: dict | None = None
                   ) -> np.ndarray:
    """m-ETF (``sct=False``) or m-SCT list scheduling (module doc).

    Per device, a heap of the ready ops whose inputs are there by the time the device is free (by
    priority) and a heap of the others (by input arrival); an entry's arrival is a lower bound (links
    only get busier) that is recomputed when the entry comes to the top, and the entry goes back when it
    grew, so each device's top is exact. ``contention=False`` drops the link queues (textbook ETF).
    ``trace``, when given, receives the model's schedule: ``start`` and ``finish`` per op."""
    _check(problem)
    n, d = problem.num_nodes, problem.num_devices
    if n == 0:
        return np.zeros(0, np.int64)
    unit, members = _units(problem)
    book = _MemoryBook(problem, unit, members)
    unit_l = unit.tolist()
    comp = problem.compute_s.tolist()
    prio = problem.priority.tolist()
    lat, bw = float(problem.link_latency_s), float(problem.link_bytes_per_s)
    pcie = problem.interconnect == "pcie"
    ptr, out_dst, _, indeg = problem.csr()
    ptr_l, out_l, pend = ptr.tolist(), out_dst.tolist(), indeg.tolist()
    inputs = book.inputs
    fav = _favourite_children(problem) if sct else None

    dev = [-1] * n  # device of a scheduled op
    pin = [-1] * n  # device an op must go to (its group is placed, or it was forced)
    fin = [0.0] * n
    arrive: list[list[float] | None] = [None] * n  # per device: when all inputs of a ready op are there
    alive = [0] * n  # devices still considered for a ready op
    avail = [0.0] * d
    last = [-1] * d
    ready_heap: list[list[tuple]] = [[] for _ in range(d)]  # (priority, op): inputs there by avail
    wait_heap: list[list[tuple]] = [[] for _ in range(d)]  # (arrival, priority, op)
    urgent: list[tuple] = []  # (latest arrival over devices, priority, op), m-SCT only
    ustatic = [0.0] * n
    send_free, recv_free = [0.0] * d, [0.0] * d  # pcie ports
    pair_free = [[0.0] * d for _ in range(d)]  # nvlink: directed pairs
    sent: dict[int, float] = {}  # producer * d + device -> arrival of its output there (booked)

    def arrival(w: int, f: int, book_it: bool = False) -> float:
        """When all inputs of ``w`` are on ``f``: transfers not booked yet queue, in producer finish
        order, behind the booked ones on the sender's and receiver's ports (pcie) or the pair's link."""
        t = 0.0
        remote = []
        for v, b in inputs[w]:
            e = dev[v]
            if e == f:
                if fin[v] > t:
                    t = fin[v]
            elif not contention:
                x = fin[v] + lat + b / bw
                if x > t:
                    t = x
            else:
                x = sent.get(v * d + f)
                if x is None:
                    remote.append((fin[v], v, e, b))
                elif x > t:
                    t = x
        if remote:
            remote.sort()
            port: dict[int, float] = {}
            rf = recv_free[f]
            for tf, v, e, b in remote:
                if pcie:
                    st = max(tf, port.get(e, send_free[e]), rf)
                else:
                    st = max(tf, port.get(e, pair_free[e][f]))
                end = st + lat + b / bw
                port[e] = rf = end
                if end > t:
                    t = end
                if book_it:
                    sent[v * d + f] = end
            if book_it:
                for e, x in port.items():
                    if pcie:
                        send_free[e] = x
                    else:
                        pair_free[e][f] = x
                if pcie:
                    recv_free[f] = rf
        return t

    def push(w: int, f: int) -> None:
        t = arrive[w][f]
        if t <= avail[f]:
            heapq.heappush(ready_heap[f], (prio[w], w))
        else:
            heapq.heappush(wait_heap[f], (t, prio[w], w))

    def make_ready(w: int) -> None:
        arr = [arrival(w, f) for f in range(d)]
        arrive[w] = arr
        if pin[w] >= 0:
            alive[w] = 1
            push(w, pin[w])
        else:
            alive[w] = d
            for f in range(d):
                push(w, f)
            if sct:
                ustatic[w] = max(arr)
                heapq.heappush(urgent, (ustatic[w], prio[w], w))

    forced = [0]  # ops forced so far (a pass that forced one may have to look again)

    def force(w: int) -> None:  # no device has room: the roomiest takes it (the simulator reports OOM)
        forced[0] += 1
        f = book.roomiest()
        pin[w] = f
        alive[w] = 1
        push(w, f)

    def valid(w: int, f: int) -> bool:
        return dev[w] < 0 and (pin[w] < 0 or pin[w] == f)

    def candidate(f: int) -> tuple[float, int, int] | None:
        """Device ``f``'s earliest (start, priority, op) among ops with room on it, or None."""
        rh, wh, a = ready_heap[f], wait_heap[f], avail[f]
        while True:
            while wh and wh[0][0] <= a:
                _, p, w = heapq.heappop(wh)
                heapq.heappush(rh, (p, w))
            if rh:
                p, w = rh[0]
                t, h = a, rh
            elif wh:
                t, p, w = wh[0]
                h = wh
            else:
                return None
            if not valid(w, f):
                heapq.heappop(h)
                continue
            if contention:
                x = arrival(w, f)
                arrive[w][f] = x
                if x > max(t, a):  # its inputs got later: back in line
                    heapq.heappop(h)
                    heapq.heappush(wh, (x, p, w))
                    continue
            if pin[w] < 0 and not book.fits(w, f, dev):
                heapq.heappop(h)
                alive[w] -= 1
                if alive[w] == 0:
                    force(w)
                continue
            return t, p, w

    def sct_candidate(f: int) -> tuple[float, int, int] | None:
        """The favourite child (or an urgent op) that device ``f`` waits for, or None (module doc)."""
        if last[f] < 0:
            return None
        c = fav[last[f]]
        if c < 0 or dev[c] >= 0 or arrive[c] is None or not valid(c, f):
            return None
        arr = arrive[c]
        if contention:
            arr[f] = arrival(c, f)
        s = max(avail[f], arr[f])
        if pin[c] < 0:
            if not book.fits(c, f, dev):
                return None
            for g in range(d):
                if g != f and max(avail[g], arr[g]) < s:
                    if contention:
                        arr[g] = arrival(c, g)
                    if max(avail[g], arr[g]) < s:
                        return None
        while urgent and (dev[urgent[0][2]] >= 0 or pin[urgent[0][2]] >= 0):
            heapq.heappop(urgent)
        if urgent and urgent[0][2] != c:
            _, p, u = urgent[0]
            t = max(ustatic[u], max(avail))
            if t <= s and book.fits(u, f, dev):
                return t, p, u
        return s, prio[c], c

    for w in range(n):
        if pend[w] == 0:
            make_ready(w)
    for _ in range(n):
        while True:
            best = None
            before = forced[0]
            for f in range(d):
                cand = sct_candidate(f) if sct else None
                key = None
                if cand is not None:
                    key = (cand[0], 0, cand[1], f)
                else:
                    cand = candidate(f)
                    if cand is not None:
                        key = (cand[0], 1, cand[1], f)
                if key is not None and (best is None or key < best[0]):
                    best = (key, cand[2])
            if best is not None:
                break
            if forced[0] == before:  # pragma: no cover - _check guarantees a DAG
                raise RuntimeError("no op can be scheduled: the graph has a cycle")
        (t, _, _, f), w = best
        t = max(t, avail[f], arrival(w, f, book_it=True))
        u = unit_l[w]
        first = book.unit_dev[u] < 0
        dev[w] = f
        book.commit(w, f, dev)
        if first:
            for x in members[u]:
                pin[x] = f
                if x != w and arrive[x] is not None:  # ready already: its entry on f may be gone
                    alive[x] = 1
                    push(x, f)
        pin[w] = f
        fin[w] = t + comp[w]
        avail[f] = fin[w]
        last[f] = w
        for k in range(ptr_l[w], ptr_l[w + 1]):
            x = out_l[k]
            pend[x] -= 1
            if pend[x] == 0:
                make_ready(x)
    if trace is not None:
        trace["finish"] = np.asarray(fin)
        trace["start"] = np.asarray(fin) - problem.compute_s
    return np.asarray(dev, np.int64)


def m_etf(problem: PlacementProblem, *, seed: int = 0, contention: bool = True) -> np.ndarray:
    """Baechi's m-ETF: memory-constrained earliest-task-first list scheduling (module doc)."""
    return _list_schedule(problem, sct=False, contention=contention)


def m_sct(problem: PlacementProblem, *, seed: int = 0, contention: bool = True) -> np.ndarray:
    """Baechi's m-SCT: m-ETF with the favourite-child rule (module doc)."""
    return _list_schedule(problem, sct=True, contention=contention)
