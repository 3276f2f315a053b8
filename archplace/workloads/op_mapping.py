"""Measured time -> archplace graph rows, for :mod:`archplace.workloads.op_profiler` (whose docstring
describes the mapping): which exported ops each forward row stands for, how a forward op's backward time
is shared over its backward rows, and the assembly of one step's times into seconds per row plus the
unmapped rest."""

from __future__ import annotations

from typing import Any

import numpy as np

from .graph import OpGraph

PREFIX = "ap#"  # profiler range of exported op i: "ap#i"; the loss: "ap#loss"
_EVAL = "autograd::engine::evaluate_function: "
LOSS_NAME = "loss/cross_entropy"  # models.append_loss's node
_PREFIX = PREFIX


def _members(prog, names: list[str], kinds, model: str) -> list[list[int]]:
    """Per forward row of an every-block capture, the exported ops it stands for (a fused node: its
    GEMM, then the views and the vector op it absorbed); [] for model inputs and the loss node (timed
    apart). Raises when a row names no exported op."""
    from .extract import _ATEN_KIND, _target_name

    index = {n: i for i, n in enumerate(prog.names)}
    pos = {node: i for i, node in enumerate(prog.calls)}
    plain = {n.partition("+")[0] for n in names}
    out: list[list[int]] = []
    for r, name in enumerate(names):
        if kinds[r] == "input" or name == LOSS_NAME:
            out.append([])
            continue
        base, _, fused_kind = name.partition("+")
        i = index.get(base)
        if i is None:
            raise ValueError(f"profiling {model!r}: graph node {name!r} has no op in the "
                             f"program exported from the real model ({len(prog.names)} ops)")
        ids = [i]
        if fused_kind:
            v = prog.calls[i]
            while len(v.users) == 1:
                v = next(iter(v.users))
                if v.op != "call_function" or prog.names[pos[v]] in plain:
                    break
                ids.append(pos[v])
                if _ATEN_KIND.get(_target_name(v)) == fused_kind:
                    break
            if _ATEN_KIND.get(_target_name(prog.calls[ids[-1]])) != fused_kind:
                raise ValueError(f"profiling: fused node {name!r}: its {fused_kind} op was not found after "
                                 "its GEMM in the exported program")
        out.append(ids)
    return out


def _align(graph: OpGraph, ref: OpGraph) -> None:
    """The graph's forward rows and the every-block reference must be the same rows in the same order
    (``stack_expand`` orders copies as a full capture does)."""
    nf = int((~graph.nodes["is_backward"]).sum())
    same = ref.num_nodes == nf and bool(np.all(ref.nodes["kind"] == graph.nodes["kind"][:nf])) and \
        list(ref.meta.get("layers", [])) == list(graph.meta.get("layers", []))
    if not same:
        raise ValueError(f"profiling {graph.meta.get('model')!r}: the graph's {nf} forward rows do not "
                         f"line up with a capture of every block ({ref.num_nodes} rows); profile with "
                         "capture_blocks = the model's depth")


def _row_weights(nd: dict, rows: np.ndarray) -> np.ndarray:
    f = nd["flops"][rows].astype(float)
    if f.sum() > 0:
        return f / f.sum()
    b = (nd["input_bytes"][rows] + nd["output_bytes"][rows]).astype(float)
    return b / b.sum() if b.sum() > 0 else np.full(len(rows), 1.0 / len(rows))


class Mapper:
    """Turns one profiled step's events into seconds per graph row plus unmapped seconds."""

    def __init__(self, w, prog):
        g = w.graph
        nd = g.nodes
        self.n = g.num_nodes
        nf = int((~nd["is_backward"]).sum())
        if w.reference is not None:
            _align(g, w.reference)
            ref_names, ref_kinds = [str(x) for x in w.reference.nodes["name"]], w.reference.nodes["kind"]
        else:
            ref_names, ref_kinds = [str(x) for x in nd["name"][:nf]], nd["kind"][:nf]
        self.members = _members(prog, ref_names, ref_kinds, w.name)
        self.op_names = prog.names
        self.fwd_row_of_op = np.full(len(prog.calls), -1, dtype=np.int64)
        for r, ids in enumerate(self.members):
            self.fwd_row_of_op[ids] = r
        names = [str(x) for x in nd["name"]]
        self.loss_row = names.index(LOSS_NAME) if LOSS_NAME in names[:nf] else -1
        row_of_id = {int(i): r for r, i in enumerate(nd["id"])}
        bwd = {r: [] for r in range(nf)}
        for r in np.flatnonzero(nd["is_backward"]):
            f = row_of_id.get(int(nd["fwd_id"][r]), -1)
            if f >= 0:
                bwd[f].append(int(r))
        # per forward row: (rows that take the backward of its first op, rows that take the rest)
        self.split: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for r, rows in bwd.items():
            if not rows:
                continue
            vec = [x for x in rows if names[x].endswith("/grad_vec")]
            rest = np.array([x for x in rows if x not in vec], dtype=np.int64)
            vec_a = np.array(vec, dtype=np.int64)
            if len(vec) and len(self.members[r]) > 1 and len(rest):
                self.split[r] = (rest, _row_weights(nd, rest), vec_a, np.ones(len(vec)) / len(vec))
            else:
                all_rows = np.array(rows, dtype=np.int64)
                self.split[r] = (all_rows, _row_weights(nd, all_rows), np.zeros(0, np.int64), np.zeros(0))

    def from_events(self, events, top_seq: np.ndarray, base: int, loss_seq: tuple[int, int],
                    cuda: bool) -> tuple[np.ndarray, float, dict]:
        """One step measured with ``torch.profiler``: the top-level events (each op's range, each
        backward function, anything else) with their CPU time, or on CUDA the kernel time launched from
        them. Returns what :meth:`assemble` returns."""
        from torch.autograd import DeviceType

        fwd_op = np.zeros(len(self.fwd_row_of_op))
        loss_f = 0.0
        bwd: list[tuple[int, float, str]] = []
        other: dict[str, float] = {}
        for e in events:
            if e.cpu_parent is not None or e.device_type != DeviceType.CPU:
                continue
            sec = float(e.device_time_total if cuda else e.cpu_time_total) * 1e-6
            name = e.name
            if name == _PREFIX + "loss":
                loss_f += sec
            elif name.startswith(_PREFIX):
                fwd_op[int(name[len(_PREFIX):])] += sec
            elif name.startswith(_EVAL) and e.sequence_nr >= 0:
                bwd.append((int(e.sequence_nr), sec, name[len(_EVAL):]))
            else:
                key = name[len(_EVAL):] if name.startswith(_EVAL) else name
                other[key] = other.get(key, 0.0) + sec
        return self.assemble(fwd_op, loss_f, bwd, other, top_seq, base, loss_seq)

    def from_timer(self, fwd_op: np.ndarray, loss_f: float, bwd_acc: dict[int, float], top_seq: np.ndarray,
                   base: int, loss_seq: tuple[int, int]) -> tuple[np.ndarray, float, dict]:
        """One step measured by thread CPU time per op and per backward function (key -1: the
        gradient accumulators)."""
        other = {"AccumulateGrad": bwd_acc[-1]} if -1 in bwd_acc else {}
        bwd = [(k, v, "") for k, v in bwd_acc.items() if k >= 0]
        return self.assemble(fwd_op, loss_f, bwd, other, top_seq, base, loss_seq)

    def assemble(self, fwd_op: np.ndarray, loss_f: float, bwd: list[tuple[int, float, str]],
                 other: dict[str, float], top_seq: np.ndarray, base: int,
                 loss_seq: tuple[int, int]) -> tuple[np.ndarray, float, dict]:
        """(seconds per graph row, unmapped seconds, counts). ``fwd_op``: seconds per exported op;
        ``bwd``: (sequence number, seconds, name) per backward function; ``other``: seconds of the rest
        by name; ``top_seq[i]``: the last sequence number op i made (-1: none), so op i made
        (previous top, top[i]]; ``base``: the counter before the forward; ``loss_seq``: (lo, hi] the
        loss made."""
        t = np.zeros(self.n)
        bwd_op = np.zeros(len(fwd_op))
        loss_b = 0.0
        made = np.flatnonzero(top_seq >= 0)
        tops = top_seq[made]
        counts: dict[str, Any] = {"backward_functions": len(bwd), "backward_unmapped": 0}
        other = dict(other)
        for s, sec, name in bwd:
            if loss_seq[0] < s <= loss_seq[1]:
                loss_b += sec
                continue
            k = int(np.searchsorted(tops, s))  # the first op whose top >= s
            if k < len(tops) and s > (tops[k - 1] if k else base):
                bwd_op[made[k]] += sec
            else:
                counts["backward_unmapped"] += 1
                key = f"backward {name or s} (made by no exported op)"
                other[key] = other.get(key, 0.0) + sec
        for i in np.flatnonzero((self.fwd_row_of_op < 0) & ((fwd_op > 0) | (bwd_op > 0))):
            other[f"op {self.op_names[i]} (no graph node)"] = float(fwd_op[i] + bwd_op[i])
        for r, ids in enumerate(self.members):
            if not ids:
                continue
            t[r] += fwd_op[ids].sum()
            sp = self.split.get(r)
            if sp is None:
                if bwd_op[ids].sum() > 0:
                    other[f"backward of {self.op_names[ids[0]]} (its node has no backward row)"] = \
                        float(bwd_op[ids].sum())
                continue
            rows, wts, vrows, vwts = sp
            if len(vrows):
                t[rows] += bwd_op[ids[0]] * wts
                t[vrows] += bwd_op[ids[1:]].sum() * vwts
            else:
                t[rows] += bwd_op[ids].sum() * wts
        if self.loss_row >= 0:
            t[self.loss_row] += loss_f
            sp = self.split.get(self.loss_row)
            if sp is not None:
                t[sp[0]] += loss_b * sp[1]
            else:
                t[self.loss_row] += loss_b
        else:
            other["loss/seeds (the graph has no loss node)"] = loss_f + loss_b
        unmapped = float(sum(other.values()))
        counts["unmapped_top_s"] = dict(sorted(other.items(), key=lambda kv: -kv[1])[:8])
        return t, unmapped, counts
