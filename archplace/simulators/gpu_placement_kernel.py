"""The compiled event loop of :mod:`archplace.simulators.gpu_placement` (numba), kept apart from the
problem and result types so that the rules (``simulate_reference`` there) and their fast form can each
be read on their own.

A placement costs O((n + m) log n), with nothing per placement left to Python. Each placement of a batch
gives the numbers the sort-based version (commit 8409844) gave, bit for bit; what makes it 3.3-4.7x
faster (placements/s on the 5,000-op DAG and gnmt-8 of bench/gdp/gdp_scaling.py, one thread):

* **Memory is swept while simulating, not sorted afterwards** (building the records and sorting them
  was about half the time). Every allocation and free happens at an instant the event loop visits in
  time order: an op's start, a completion, a transfer's start or end. So each device's activation total
  is kept as it changes and its peak is read whenever time moves on; frees and allocations of one
  instant all land before that read, as in the sweep. An op's output is freed when its countdown (local
  consumers + outgoing transfers) reaches 0, a received copy when its last consumer on that device
  finishes; finishing ops find both through their in-edges. The totals are sums of the same byte counts
  in another order within an instant, so they are exact while byte counts are integers below 2**53.
* **A received copy whose transfer waits for a port** is allocated when the transfer that frees that
  port (or NVLink pair) ends, from a list kept on that transfer: the start time is that end time.
* **The event heap orders by time only.** The events of one instant are taken out together and run in
  (type, seq) order, the reference's ``heapq`` order; an event pushed meanwhile for the same instant (a
  0 s transfer) sorts after all of them, so it runs next. The pop is Floyd's (the hole goes to a leaf by
  the earlier child, one comparison a level, without a branch since which child is earlier is a coin
  flip to the branch predictor; the last event then sifts up, usually not at all).
* **Dispatch visits only the devices touched at an instant**, in device order (the reference's dispatch
  events run in that order, and the seq they give decides ties later).
* **The per-device ready heaps keep the priority next to the op** and sift exactly as before, so ops of
  equal priority still run in the same order; a +max priority one past the end lets the pop pick the
  lower child without a branch.
* **Op and device ids are unsigned**, which spares numba's negative-index wrap-around on each lookup.
* **Buffers are allocated once per batch** (once per thread with :func:`run_batch_parallel`, which
  splits a batch's placements over threads; a placement's numbers do not depend on the thread).
"""

from __future__ import annotations

import numpy as np

try:  # numba compiles the event loop (~100x the Python loop); see pyproject.toml
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; gpu_placement says what to install
    numba = None

_SEQ_BITS = 40  # event key: type << 40 | seq; seq < n * d < 2**40
_TYPE_XFER = np.int64(1) << _SEQ_BITS
_PRIO_END = np.iinfo(np.int64).max  # priority one past a ready heap's end


def _workspace(n, d):
    """Per-thread buffers, reused across the placements a thread simulates."""
    ncap = n + n * d + 16  # events ever pushed: one finish per op, at most d - 1 transfers per op
    return (np.empty((d, n), np.uint32), np.empty((d, n + 1), np.int64),  # ready heaps: op, priority
            np.zeros(d, np.int64),  # ready heap sizes
            np.empty(ncap + 1), np.empty(ncap + 1, np.int64),  # event heap: time, key
            np.empty(ncap, np.int64),  # keys of the events of one instant
            np.empty(ncap, np.uint32),  # event payload by seq: op (finish) or transfer id
            np.empty(n * d), np.empty(n * d, np.uint32), np.empty(n * d, np.uint16),  # xfer size, src, dst
            np.empty(n * d, np.int64),  # consumers left of a received copy
            np.full((n, d), -1, np.int64),  # transfer id of (op, destination device) while its copy lives
            np.empty(n * d, np.int64), np.empty(n * d, np.int64),  # copies allocated at its end: head, next
            np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n))  # pending inputs, countdown, finish


def _row(dev, compute, prio, ptr, out_dst, out_b, in_ptr, in_src, indeg, outb_node, resident, d, pcie,
         bw, lat, ws, step, peak, busy_s, tbytes, ntrans, r):
    """Simulate placement ``dev`` into row ``r`` of the outputs (the module doc's loop)."""
    (rh, rk, rsz, et, ek, gk, epay, tsz, tsrc, tdst, xleft, xid, whead, wnext, pending, left, fin) = ws
    n = dev.shape[0]
    isbusy = np.zeros(d, np.bool_)
    dirty = np.ones(d, np.bool_)  # devices touched this instant, also listed in dl[:nd]
    dl = np.arange(d)
    nd = d
    size = np.zeros(d)
    ecount = np.zeros(d, np.int64)
    send_free = np.zeros(d)
    recv_free = np.zeros(d)
    pair_free = np.zeros((d, d))
    last_send = np.empty(d, np.int64)  # the transfer that frees a port (or NVLink pair) last, so far
    last_recv = np.empty(d, np.int64)
    last_pair = np.empty((d, d), np.int64)
    cur = np.zeros(d)
    touched = np.zeros(d, np.bool_)
    tlist = np.empty(d, np.int64)
    for e in range(d):
        rsz[e] = 0
        rk[e, 0] = _PRIO_END
        peak[r, e] = 0.0
    for v in range(n):
        pending[v] = indeg[v]
        fin[v] = -1.0
        if indeg[v] == 0:
            _rpush(rh, rk, rsz, dev[v], v, prio[v])
    esz = 0
    et[0] = np.inf  # the heap keeps +inf one past its end (see _epop)
    ntl = 0  # touched devices since the last peak read
    seq = 0
    nt = 0
    tb = 0.0
    t = 0.0
    # Dispatch needs no events: once every completion at an instant is processed, each device they
    # touched starts its best ready op. The reference's dispatch events sort after the completions at an
    # instant, so the two agree whenever a transfer takes more than 0 s.
    while True:
        for i in range(1, nd):  # in device order, as the reference's dispatch events (seq decides ties)
            e = dl[i]
            j = i - 1
            while j >= 0 and dl[j] > e:
                dl[j + 1] = dl[j]
                j -= 1
            dl[j + 1] = e
        for i in range(nd):
            e = dl[i]
            dirty[e] = False
            if not isbusy[e] and rsz[e] > 0:
                v = _rpop(rh, rk, rsz, e)
                fin[v] = t + compute[v]
                isbusy[e] = True
                cur[e] += outb_node[v]  # its output is allocated when it starts
                if not touched[e]:
                    touched[e] = True
                    tlist[ntl] = e
                    ntl += 1
                epay[seq] = v
                esz = _epush(et, ek, esz, fin[v], seq)
                seq += 1
        nd = 0
        if esz == 0:
            break
        if et[0] != t:  # time moves on: read the peaks of the instant just done
            for i in range(ntl):
                e = tlist[i]
                touched[e] = False
                if cur[e] > peak[r, e]:
                    peak[r, e] = cur[e]
            ntl = 0
            t = et[0]
        while esz > 0 and et[0] == t:
            # The heap orders by time only; the events of this instant are taken out together and run
            # in (type, seq) order, the reference's order. An event pushed meanwhile for this instant (a
            # 0 s transfer) sorts after all of them, so it runs in the next round of this loop.
            ng = 0
            while esz > 0 and et[0] == t:
                gk[ng] = ek[0]
                ng += 1
                esz = _epop(et, ek, esz)
            for i in range(1, ng):
                key = gk[i]
                j = i - 1
                while j >= 0 and gk[j] > key:
                    gk[j + 1] = gk[j]
                    j -= 1
                gk[j + 1] = key
            for gi in range(ng):
                key = gk[gi]
                if key < _TYPE_XFER:  # an op finished
                    v = epay[key]
                    e = dev[v]
                    isbusy[e] = False
                    if not dirty[e]:
                        dirty[e] = True
                        dl[nd] = e
                        nd += 1
                    nloc = 0
                    for k in range(ptr[v], ptr[v + 1]):
                        w = out_dst[k]
                        f = dev[w]
                        if f == e:
                            nloc += 1
                            pending[w] -= 1
                            if pending[w] == 0:
                                _rpush(rh, rk, rsz, e, w, prio[w])
                        else:
                            ecount[f] += 1
                            if out_b[k] > size[f]:
                                size[f] = out_b[k]
                    left[v] = nloc
                    for f in range(d if nloc < ptr[v + 1] - ptr[v] else 0):  # skipped with no remote consumer
                        if ecount[f] > 0:
                            sz = size[f]
                            dur = lat + sz / bw  # collectives.p2p_s, inlined for numba
                            if pcie:
                                s = max(t, max(send_free[e], recv_free[f]))
                                z = last_send[e] if send_free[e] == s else last_recv[f]
                                send_free[e] = s + dur
                                recv_free[f] = s + dur
                                last_send[e] = nt
                                last_recv[f] = nt
                            else:
                                s = max(t, pair_free[e, f])
                                z = last_pair[e, f]
                                pair_free[e, f] = s + dur
                                last_pair[e, f] = nt
                            xid[v, f] = nt
                            tsz[nt] = sz
                            tsrc[nt] = v
                            tdst[nt] = f
                            xleft[nt] = ecount[f]
                            whead[nt] = -1
                            tb += sz
                            left[v] += 1
                            if s == t:  # the copy's buffer is allocated when the transfer starts
                                cur[f] += sz
                                if not touched[f]:
                                    touched[f] = True
                                    tlist[ntl] = f
                                    ntl += 1
                            else:  # it starts as transfer z, which frees its port, ends: z allocates it
                                wnext[nt] = whead[z]
                                whead[z] = nt
                            epay[seq] = nt
                            esz = _epush(et, ek, esz, s + dur, _TYPE_XFER | seq)
                            seq += 1
                            nt += 1
                            ecount[f] = 0
                            size[f] = 0.0
                    if left[v] == 0:  # no consumer waits for it: freed as it finishes
                        cur[e] -= outb_node[v]
                    # v was the consumer of its inputs: free those it was the last to need on e
                    for k in range(in_ptr[v], in_ptr[v + 1]):
                        u = in_src[k]
                        if dev[u] == e:
                            left[u] -= 1
                            if left[u] == 0:
                                cur[e] -= outb_node[u]
                        else:
                            x = xid[u, e]
                            xleft[x] -= 1
                            if xleft[x] == 0:
                                cur[e] -= tsz[x]
                                xid[u, e] = -1
                    if not touched[e]:
                        touched[e] = True
                        tlist[ntl] = e
                        ntl += 1
                else:  # a transfer arrived
                    x = epay[key - _TYPE_XFER]
                    y = whead[x]
                    while y >= 0:  # transfers that start now that x frees their port: allocate their copies
                        g = tdst[y]
                        cur[g] += tsz[y]
                        if not touched[g]:
                            touched[g] = True
                            tlist[ntl] = g
                            ntl += 1
                        y = wnext[y]
                    v = tsrc[x]
                    f = tdst[x]
                    if not dirty[f]:
                        dirty[f] = True
                        dl[nd] = f
                        nd += 1
                    for k in range(ptr[v], ptr[v + 1]):
                        w = out_dst[k]
                        if dev[w] == f:
                            pending[w] -= 1
                            if pending[w] == 0:
                                _rpush(rh, rk, rsz, f, w, prio[w])
                    left[v] -= 1
                    if left[v] == 0:  # the send buffer was the last use of v's output
                        e = dev[v]
                        cur[e] -= outb_node[v]
                        if not touched[e]:
                            touched[e] = True
                            tlist[ntl] = e
                            ntl += 1
    for i in range(ntl):
        e = tlist[i]
        if cur[e] > peak[r, e]:
            peak[r, e] = cur[e]
    mx = 0.0
    for v in range(n):
        if fin[v] < 0:
            mx = np.inf  # a cycle: never finished (the caller raises); forget its transfers
            xid[:, :] = -1
            break
        if fin[v] > mx:
            mx = fin[v]
    step[r] = mx
    ntrans[r] = nt
    tbytes[r] = tb
    for e in range(d):
        busy_s[r, e] = 0.0
    for v in range(n):
        peak[r, dev[v]] += resident[v]
        busy_s[r, dev[v]] += compute[v]


def run_batch(P, compute, prio, ptr, out_dst, out_b, in_ptr, in_src, indeg, outb_node, resident, d, pcie,
              bw, lat, step, peak, busy_s, tbytes, ntrans):
    """Every row of ``P`` on one thread, with one set of buffers."""
    K, n = P.shape
    ws = _workspace(n, d)
    for r in range(K):
        _row(P[r], compute, prio, ptr, out_dst, out_b, in_ptr, in_src, indeg, outb_node, resident, d, pcie,
             bw, lat, ws, step, peak, busy_s, tbytes, ntrans, r)


def run_batch_parallel(P, compute, prio, ptr, out_dst, out_b, in_ptr, in_src, indeg, outb_node, resident, d,
                       pcie, bw, lat, step, peak, busy_s, tbytes, ntrans, nchunks):
    """:func:`run_batch` with the rows split into ``nchunks`` contiguous chunks run in parallel, each with
    its own buffers. A row's numbers do not depend on which thread computes it."""
    K, n = P.shape
    for c in numba.prange(nchunks):
        lo = c * K // nchunks
        hi = (c + 1) * K // nchunks
        if hi > lo:
            ws = _workspace(n, d)
            for r in range(lo, hi):
                _row(P[r], compute, prio, ptr, out_dst, out_b, in_ptr, in_src, indeg, outb_node, resident,
                     d, pcie, bw, lat, ws, step, peak, busy_s, tbytes, ntrans, r)


# ------------------------------------------------------------------------------------------------ heaps
def _rpush(rh, rk, rsz, e, v, p):
    """Push op ``v`` of priority ``p`` on device ``e``'s ready heap (binary, min priority on top)."""
    i = rsz[e]
    rsz[e] += 1
    rk[e, i + 1] = _PRIO_END
    while i > 0:
        q = (i - 1) // 2
        if rk[e, q] <= p:
            break
        rh[e, i] = rh[e, q]
        rk[e, i] = rk[e, q]
        i = q
    rh[e, i] = v
    rk[e, i] = p


def _rpop(rh, rk, rsz, e):
    """Pop the op of lowest priority; the sift is the textbook one, so ties pop in a fixed order."""
    top = rh[e, 0]
    rsz[e] -= 1
    s = rsz[e]
    v = rh[e, s]
    p = rk[e, s]
    rk[e, s] = _PRIO_END
    i = 0
    while True:
        c = 2 * i + 1
        if c >= s:
            break
        c += rk[e, c + 1] < rk[e, c]  # the right child if it is lower (a missing one is _PRIO_END)
        if p <= rk[e, c]:
            break
        rh[e, i] = rh[e, c]
        rk[e, i] = rk[e, c]
        i = c
    rh[e, i] = v
    rk[e, i] = p
    return top


def _epush(et, ek, esz, t, key):
    """Push event (t, key), ordered by time only (the caller orders an instant's events by key). The
    slot past the end is kept at +inf, so :func:`_epop` needs no bounds test for a right child."""
    i = esz
    et[esz + 1] = np.inf
    while i > 0:
        q = (i - 1) // 2
        if et[q] <= t:
            break
        et[i] = et[q]
        ek[i] = ek[q]
        i = q
    et[i] = t
    ek[i] = key
    return esz + 1


def _epop(et, ek, esz):
    """Drop the earliest event (the caller has read it); returns the new size. Floyd's pop: the hole
    goes down to a leaf by the earlier child (one comparison a level), then the last event sifts up
    from there, usually not at all since it is among the latest."""
    esz -= 1
    t = et[esz]
    key = ek[esz]
    et[esz] = np.inf
    i = 0
    c = 1
    while c < esz:
        c += et[c + 1] < et[c]  # no branch: which child is earlier is a coin flip to the predictor
        et[i] = et[c]
        ek[i] = ek[c]
        i = c
        c = 2 * i + 1
    while i > 0:
        q = (i - 1) // 2
        if et[q] <= t:
            break
        et[i] = et[q]
        ek[i] = ek[q]
        i = q
    et[i] = t
    ek[i] = key
    return esz


if numba is not None:
    _jit = numba.njit(cache=True)
    _rpush, _rpop, _epush, _epop = (_jit(f) for f in (_rpush, _rpop, _epush, _epop))
    _workspace = _jit(_workspace)
    _row = _jit(_row)
    run_batch = _jit(run_batch)
    run_batch_parallel = numba.njit(cache=True, parallel=True)(run_batch_parallel)
