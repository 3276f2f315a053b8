"""Fast placement baselines for an operator graph on the GPUs of one machine (GDP, issue 18).

Each baseline is a function ``(problem, *, seed=0, ...) -> placement``: an ``int64`` array of one
device per op position of a :class:`~archplace.simulators.gpu_placement.PlacementProblem`. Every
baseline places a co-location group as one unit, so no group is ever split. None of them simulates;
``simulate(problem, placement)`` gives the step time and says whether memory held.

* ``metis``: the graph-partitioning baseline of GDP's Table 1 ("TensorFlow METIS placement", Karypis
  & Kumar 1998; spec §7). The op graph, made undirected and with every co-location group contracted to
  one vertex, is cut by ``pymetis.part_graph`` into ``num_devices`` parts with vertex weight = compute
  time and edge weight = bytes (summed over parallel and opposite edges; both scaled to integers, see
  :func:`_int_weights`), with pymetis's defaults (recursive bisection up to 8 parts, k-way above;
  METIS's default balance tolerance) and ``seed`` as METIS's seed. It balances compute and cuts bytes
  but knows nothing of memory, so it may run out of memory -- as it did on 9 of GDP's 12 graphs; the
  simulator reports that.
* ``m_topo``, ``m_etf``, ``m_sct``: the memory-constrained placers of Baechi (Jeon et al., "Baechi:
  Fast Device Placement of Machine Learning Graphs", SoCC 2020), written after the authors' code
  (``placer/m_topo.py``, ``m_etf.py``, ``m_sct.py`` of github.com/beomyeol/baechi):

  - **m-TOPO** walks a topological order (``problem.priority``) and fills device 0, then device 1, ...
    A unit goes to the current device while it has memory for it and while the device's compute, with
    half of the unit's, stays within the device's share: the compute not yet placed divided by the
    devices not yet filled (a device always takes its first unit); a full device is never revisited.
    A co-location group is placed with its first op in the order. *Changed*: Baechi's m-TOPO balances
    *memory* (share = total memory / d + the largest op's); here the share is compute (the step time
    is what GDP optimises) and the device memory is the hard cap. The "half of the unit" rule cuts the
    order at the unit whose compute straddles the share, so a device may end a little above its share.
  - **m-ETF** is earliest-task-first list scheduling (Hwang et al. 1989) with memory: it repeatedly
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
  - **m-SCT** is m-ETF with Baechi's small-communication-time (SCT) favourite-child rule: a device that
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

  **Memory model (all three).** An op costs its device ``resident_bytes + output`` where ``output`` is
  the largest of ``output_bytes`` and its out-edges' bytes (what the simulator allocates for it), plus
  one received copy per (producer, device) pair whose size is the largest edge from that producer to an
  op on the device. This counts every tensor as alive all step, an upper bound of the simulator's peak
  (which frees activations), so a placement these placers make without running out of room is valid in
  ``simulate``. A co-location group reserves, when its first op is placed, the costs of all its ops plus
  the bytes of all their inputs from outside the group (their largest copies); each later op of the
  group gives back what its copies did not use. When no device has room for a unit, it goes to the
  device with the most room left and the simulator will report out of memory.
* ``human``: human-expert-like placements (GDP does not describe its human placements, spec §7/§11
  GAP). RNN-like graphs (``family`` in ``{"rnnlm", "gnmt"}``): layer-wise round-robin, layer ``i`` on
  device ``i % d``; when layer names say so, an embedding (or ``input``) layer goes with the first
  recurrent layer, a softmax/loss layer with the last and an attention layer with the one after it
  (GNMT: encoder and decoder layer ``i`` on device ``i``, as in Wu et al. 2016). Transformer-XL and
  the others: contiguous blocks of layers balanced by compute (the largest block's compute is the
  smallest possible). Ops without a layer take that of the nearest op in the topological order.
  :func:`human_from_graph` reads layers and names from an ``OpGraph`` and puts every backward op on
  its forward op's device. ``human(problem)`` without layers (the plain :data:`BASELINES` call) makes
  every op its own layer: a compute-balanced contiguous split of the topological order. Not
  memory-aware.
* ``random_placement`` (uniform device per co-location group / op) and ``single_device`` (everything
  on device 0, the ``d = 1`` reference).

:data:`BASELINES` maps the CLI names to the functions. All are plain numpy/Python (heaps): on a
5,000-op graph and 8 GPUs m-ETF and m-SCT take 0.2-0.7 s, the others a few ms (25,000-op GNMT-8:
about 1 s and 2 s). No Ray here.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Sequence

import numpy as np

from ...simulators.gpu_placement import PlacementProblem

RNN_FAMILIES = ("rnnlm", "gnmt")
_FIRST = re.compile(r"embed|^input", re.IGNORECASE)  # RNN layers that join the first recurrent layer
_LAST = re.compile(r"softmax|loss|logit|head|classifier", re.IGNORECASE)  # ... the last one
_NEXT = re.compile(r"attention|attn", re.IGNORECASE)  # ... the next one (GNMT: the decoder's bottom layer)


# ---------------------------------------------------------------------------------------------- checks
def _check(problem: PlacementProblem) -> None:
    """Raise ``ValueError`` naming the field when ``problem`` cannot be placed."""
    if not isinstance(problem, PlacementProblem):
        raise ValueError(f"problem is a {type(problem).__name__}, expected a PlacementProblem")
    for f in ("memory_bytes", "link_bytes_per_s"):
        v = getattr(problem, f)
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{f} is {v!r}, must be finite and > 0")
    if not (np.isfinite(problem.link_latency_s) and problem.link_latency_s >= 0):
        raise ValueError(f"link_latency_s is {problem.link_latency_s!r}, must be finite and >= 0")
    for f in ("output_bytes", "resident_bytes", "edge_bytes"):
        a = getattr(problem, f)
        if len(a) and not (np.isfinite(a).all() and (a >= 0).all()):
            i = int(np.flatnonzero(~np.isfinite(a) | (a < 0))[0])
            raise ValueError(f"{f}[{i}] is {a[i]}, must be finite and >= 0")
    if problem.num_edges:
        bad = problem.priority[problem.src] >= problem.priority[problem.dst]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"priority is not a topological rank: edge {i} ({problem.src[i]} -> "
                             f"{problem.dst[i]}) goes from priority {problem.priority[problem.src[i]]} to "
                             f"{problem.priority[problem.dst[i]]}")


def _units(problem: PlacementProblem) -> tuple[np.ndarray, list[list[int]]]:
    """Unit per op (a co-location group, or the op alone) and each unit's ops in topological order."""
    g = problem.coloc_group
    n = len(g)
    unit = np.empty(n, np.int64)
    grouped = g >= 0
    _, inv = np.unique(g[grouped], return_inverse=True)
    ng = int(inv.max()) + 1 if inv.size else 0
    unit[grouped] = inv
    unit[~grouped] = ng + np.arange(int((~grouped).sum()))
    order = np.lexsort((problem.priority, unit))
    bounds = np.flatnonzero(np.diff(unit[order])) + 1
    members = [m.tolist() for m in np.split(order, bounds)] if n else []
    return unit, members


def _spread_units(unit: np.ndarray, unit_device: np.ndarray) -> np.ndarray:
    return np.asarray(unit_device, np.int64)[unit]


# ---------------------------------------------------------------------------------------------- memory
class _MemoryBook:
    """Conservative per-device memory bookkeeping of the Baechi placers (module doc, "Memory model")."""

    def __init__(self, problem: PlacementProblem, unit: np.ndarray, members: list[list[int]]) -> None:
        n, d = problem.num_nodes, problem.num_devices
        outb = problem.output_bytes.copy()
        if problem.num_edges:
            np.maximum.at(outb, problem.src, problem.edge_bytes)
        self.own = (problem.resident_bytes + outb).tolist()
        # inputs[w]: (producer, largest edge bytes from it to w)
        self.inputs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        if problem.num_edges:
            key = problem.dst * n + problem.src
            uk, inv = np.unique(key, return_inverse=True)
            big = np.zeros(len(uk))
            np.maximum.at(big, inv, problem.edge_bytes)
            for k, b in zip(uk.tolist(), big.tolist()):
                self.inputs[k // n].append((k % n, b))
        self.unit = unit.tolist()
        self.members = members
        # inb[w]: bytes of w's inputs from outside its unit (an upper bound of its copies)
        self.inb = [sum(b for v, b in self.inputs[w] if self.unit[v] != self.unit[w]) for w in range(n)]
        self.unit_own = [sum(self.own[w] for w in m) for m in members]
        self.unit_inb = [sum(self.inb[w] for w in m) for m in members]
        self.unit_dev = [-1] * len(members)
        self.free = [float(problem.memory_bytes)] * d
        self.copy: dict[tuple[int, int], float] = {}

    def _copies(self, w: int, f: int, dev: list[int], commit: bool = False) -> float:
        extra = 0.0
        copy = self.copy
        for v, b in self.inputs[w]:
            e = dev[v]
            if e != f:
                have = copy.get((v, f), 0.0)
                if b > have:
                    extra += b - have
                    if commit:
                        copy[(v, f)] = b
        return extra

    def cost(self, w: int, f: int, dev: list[int]) -> float:
        """Bytes device ``f`` must have free to take ``w`` (with its whole group if it comes first)."""
        u = self.unit[w]
        if self.unit_dev[u] >= 0:
            return 0.0  # reserved with the group
        if len(self.members[u]) > 1:
            return self.unit_own[u] + self.unit_inb[u] - self.inb[w] + self._copies(w, f, dev)
        return self.own[w] + self._copies(w, f, dev)

    def fits(self, w: int, f: int, dev: list[int]) -> bool:
        return self.cost(w, f, dev) <= self.free[f]

    def commit(self, w: int, f: int, dev: list[int]) -> None:
        """Charge ``f`` for ``w`` (its producers must be placed already)."""
        u = self.unit[w]
        actual = self._copies(w, f, dev, commit=True)
        if self.unit_dev[u] >= 0:  # a later op of a placed group: give back the unused reservation
            self.free[f] += self.inb[w] - actual
        elif len(self.members[u]) > 1:
            self.unit_dev[u] = f
            self.free[f] -= self.unit_own[u] + self.unit_inb[u] - self.inb[w] + actual
        else:
            self.unit_dev[u] = f
            self.free[f] -= self.own[w] + actual

    def roomiest(self) -> int:
        return int(np.argmax(self.free))


# ---------------------------------------------------------------------------------------------- METIS
def _int_weights(x: np.ndarray, cap: float = 1000.0, total_cap: float = 2.0**29) -> np.ndarray:
    """Positive integers proportional to ``x`` (rounded down): the largest becomes ``cap`` (less when
    the sum would pass ``total_cap``, well inside METIS's 32-bit sums); zeros and tiny values become 1."""
    x = np.asarray(x, np.float64)
    if x.size == 0 or x.max() <= 0:
        return np.ones(x.size, np.int64)
    scale = min(cap / x.max(), total_cap / x.sum())
    return np.maximum(1, np.floor(x * scale)).astype(np.int64)


def metis(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """METIS k-way partition of the undirected graph, co-location groups contracted (module doc)."""
    _check(problem)
    n, d = problem.num_nodes, problem.num_devices
    if n == 0:
        return np.zeros(0, np.int64)
    unit, members = _units(problem)
    nu = len(members)
    if d == 1 or nu == 1:
        return np.zeros(n, np.int64)
    import pymetis  # a dependency (pyproject.toml); imported here so the module loads without it

    vw = _int_weights(np.bincount(unit, weights=problem.compute_s, minlength=nu))
    a, b = unit[problem.src], unit[problem.dst]
    keep = a != b
    lo, hi = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
    key, inv = np.unique(lo * nu + hi, return_inverse=True)
    ew = _int_weights(np.bincount(inv, weights=problem.edge_bytes[keep], minlength=len(key)))
    lo, hi = key // nu, key % nu
    s = np.concatenate([lo, hi])
    t = np.concatenate([hi, lo])
    w = np.concatenate([ew, ew])
    order = np.argsort(s, kind="stable")
    xadj = np.zeros(nu + 1, np.int64)
    np.add.at(xadj, s + 1, 1)
    xadj = np.cumsum(xadj)
    adj = pymetis.CSRAdjacency(xadj, t[order])
    opts = pymetis.Options(seed=int(seed))
    _, parts = pymetis.part_graph(d, adj, vweights=vw, eweights=w[order] if len(w) else None, options=opts)
    return _spread_units(unit, np.asarray(parts, np.int64))


# ---------------------------------------------------------------------------------------------- m-TOPO
def m_topo(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """Baechi's m-TOPO: fill devices in topological order, each up to its compute share (module doc)."""
    _check(problem)
    n, d = problem.num_nodes, problem.num_devices
    if n == 0:
        return np.zeros(0, np.int64)
    unit, members = _units(problem)
    book = _MemoryBook(problem, unit, members)
    ucomp = np.bincount(unit, weights=problem.compute_s, minlength=len(members)).tolist()
    unit_l = unit.tolist()
    remaining = float(sum(ucomp))
    dev = [-1] * n
    k, load = 0, 0.0
    share = remaining / d
    for w in np.argsort(problem.priority, kind="stable").tolist():
        if dev[w] >= 0:  # a later op of a placed group
            book.commit(w, dev[w], dev)
            continue
        u = unit_l[w]
        c = ucomp[u]
        while True:
            fits = book.fits(w, k, dev)
            if fits and (load == 0.0 or load + 0.5 * c <= share * (1 + 1e-12)):
                break
            if k == d - 1:
                break
            k, load = k + 1, 0.0
            share = remaining / (d - k)
        f = k if fits else book.roomiest()
        for x in members[u]:
            dev[x] = f
        book.commit(w, f, dev)
        if f == k:
            load += c
        remaining -= c
    return np.asarray(dev, np.int64)


# ---------------------------------------------------------------------------------------------- m-ETF/SCT
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


# ---------------------------------------------------------------------------------------------- human
def _fill_layers(layer: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """Layer of every op: an op without one (-1) takes the layer of the nearest op with one in the
    topological order (by position in the order; the earlier one on a tie). No op with a layer: every
    op is its own layer, in topological order."""
    order = np.argsort(priority, kind="stable")
    lay = layer[order]
    has = lay >= 0
    if not has.any():
        out = np.empty(len(layer), np.int64)
        out[order] = np.arange(len(layer))
        return out
    pos = np.arange(len(lay))
    prev = np.maximum.accumulate(np.where(has, pos, -1))
    nxt = np.minimum.accumulate(np.where(has, pos, len(lay))[::-1])[::-1]
    dp = np.where(prev >= 0, pos - prev, np.iinfo(np.int64).max)
    dn = np.where(nxt < len(lay), nxt - pos, np.iinfo(np.int64).max)
    src = np.where(dp <= dn, prev, nxt)
    out = np.empty(len(layer), np.int64)
    out[order] = lay[src]
    return out


def _balanced_blocks(weights: np.ndarray, k: int) -> np.ndarray:
    """Block index of each item: ``k`` contiguous blocks, each non-empty, whose largest sum is the
    smallest possible (bisection on that bound, to 1e-9 relative); blocks are filled greedily up to the
    bound, each leaving at least one item for every later block."""
    L = len(weights)
    k = min(k, L)
    if k <= 1:
        return np.zeros(L, np.int64)
    S = np.concatenate([[0.0], np.cumsum(weights)])

    def cuts(T: float) -> list[int] | None:
        out, start = [], 0
        for b in range(k - 1):
            j = int(np.searchsorted(S, S[start] + T * (1 + 1e-12), side="right")) - 1
            j = min(max(j, start + 1), L - (k - 1 - b))
            if S[j] - S[start] > T * (1 + 1e-12):
                return None
            out.append(j)
            start = j
        return out if S[L] - S[start] <= T * (1 + 1e-12) else None

    lo, hi = float(np.max(weights)), float(S[L])
    for _ in range(200):
        if hi - lo <= 1e-9 * max(hi, 1e-300):
            break
        mid = 0.5 * (lo + hi)
        if cuts(mid) is None:
            lo = mid
        else:
            hi = mid
    block = np.zeros(L, np.int64)
    for c in cuts(hi) or []:
        block[c:] += 1
    return block


def human(problem: PlacementProblem, *, seed: int = 0, layer: np.ndarray | None = None,
          family: str | None = None, layer_names: Sequence[str] | None = None,
          follow: np.ndarray | None = None) -> np.ndarray:
    """Human-expert-like placement (module doc).

    ``layer``: per-op layer index (-1: none, filled by :func:`_fill_layers`; ``None``: every op is its
    own layer in topological order). ``family`` in :data:`RNN_FAMILIES`: layer-wise round-robin over the
    layers present (in index order); otherwise contiguous compute-balanced blocks. ``layer_names``
    (indexed by layer) lets an RNN's embedding (or ``input``) layer join its first recurrent layer, a
    softmax/loss/logits layer its last and an attention layer the next one (GNMT's attention feeds the
    decoder, so encoder layer ``i`` and decoder layer ``i`` share device ``i`` as in Wu et al. 2016).
    ``follow``: per-op position of an op whose device it takes (a backward op's forward op), -1 for
    none. A co-location group then goes to the device of its first op in topological order.
    """
    _check(problem)
    n, d = problem.num_nodes, problem.num_devices
    if family is not None and not isinstance(family, str):
        raise ValueError(f"family is {family!r}, expected a string or None")
    if n == 0:
        return np.zeros(0, np.int64)
    if layer is None:
        layer = np.full(n, -1, np.int64)
    layer = np.asarray(layer)
    if layer.shape != (n,) or layer.dtype.kind not in "iu":
        raise ValueError(f"layer has shape {layer.shape} and dtype {layer.dtype}, expected ({n},) integers")
    if (layer < -1).any():
        raise ValueError(f"layer[{int(np.flatnonzero(layer < -1)[0])}] is < -1")
    lay = _fill_layers(layer.astype(np.int64), problem.priority)
    ids = np.unique(lay)
    if family is not None and family.lower() in RNN_FAMILIES:
        attach: dict[int, str] = {}
        if layer_names is not None:
            if len(layer_names) <= int(ids.max()):
                raise ValueError(f"layer_names has {len(layer_names)} entries, but layer goes up to "
                                 f"{int(ids.max())}")
            for i in ids.tolist():
                name = str(layer_names[i])
                for rule, pattern in (("first", _FIRST), ("last", _LAST), ("next", _NEXT)):
                    if pattern.search(name):
                        attach[i] = rule
                        break
        body = [i for i in ids.tolist() if i not in attach]
        if not body:
            body, attach = ids.tolist(), {}
        dev_of = {i: r % d for r, i in enumerate(body)}
        for i, rule in attach.items():
            later = [j for j in body if j > i]
            j = body[0] if rule == "first" else later[0] if rule == "next" and later else body[-1]
            dev_of[i] = dev_of[j]
        lut = np.array([dev_of[int(i)] for i in ids], np.int64)
    else:
        w = np.bincount(np.searchsorted(ids, lay), weights=problem.compute_s, minlength=len(ids))
        lut = _balanced_blocks(w, d)
    dev = lut[np.searchsorted(ids, lay)]
    if follow is not None:
        follow = np.asarray(follow)
        if follow.shape != (n,) or follow.dtype.kind not in "iu" or ((follow < -1) | (follow >= n)).any():
            raise ValueError(f"follow must be ({n},) integers in -1..{n - 1}")
        f = follow >= 0
        dev = np.where(f, dev[np.where(f, follow, 0)], dev)
    unit, members = _units(problem)
    first = np.array([m[0] for m in members], np.int64)
    return dev[first][unit]


def human_from_graph(graph, problem: PlacementProblem, *, seed: int = 0,
                     family: str | None = None) -> np.ndarray:
    """:func:`human` with the layers, layer names and backward→forward map of an ``OpGraph``; the family
    is ``family``, else ``graph.meta["family"]``, else the start of ``graph.meta["model"]``."""
    if graph.num_nodes != problem.num_nodes:
        raise ValueError(f"graph has {graph.num_nodes} ops but problem has {problem.num_nodes}")
    nd = graph.nodes
    if family is None:
        family = graph.meta.get("family")
    if family is None:
        model = str(graph.meta.get("model", "")).lower()
        family = next((f for f in RNN_FAMILIES if model.startswith(f)), model or None)
    ids = nd["id"]
    order = np.argsort(ids, kind="stable")
    fwd = nd["fwd_id"]
    p = np.clip(np.searchsorted(ids[order], fwd), 0, max(len(ids) - 1, 0))
    ok = (fwd >= 0) & (ids[order][p] == fwd)
    follow = np.where(ok, order[p], -1).astype(np.int64)
    names = list(graph.meta.get("layers", [])) or None
    return human(problem, seed=seed, layer=nd["layer"].astype(np.int64), family=family, layer_names=names,
                 follow=follow)


# ---------------------------------------------------------------------------------------------- trivial
def random_placement(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """A uniform device per co-location group (and per op outside groups)."""
    _check(problem)
    unit, members = _units(problem)
    rng = np.random.default_rng(seed)
    return _spread_units(unit, rng.integers(0, problem.num_devices, len(members)))


def single_device(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """Everything on device 0: the one-GPU reference."""
    _check(problem)
    return np.zeros(problem.num_nodes, np.int64)


BASELINES: dict[str, Callable[..., np.ndarray]] = {
    "metis": metis,
    "m-topo": m_topo,
    "m-etf": m_etf,
    "m-sct": m_sct,
    "human": human,
    "random": random_placement,
    "single": single_device,
}
