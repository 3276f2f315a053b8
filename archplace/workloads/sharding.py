"""Sharding propagation (Auto-MAP §3.2 / GSPMD style): which dimension of each tensor is split over
which named device axis, inferred from a few decided ones, with conflicts found and the collectives
and per-device memory a plan implies.

Why a tensor-level IR of its own (``ShardGraph``) and not ``OpGraph``: an ``OpGraph`` row is a fused,
costed operator that keeps GEMM sizes but neither its operands' shapes nor the permutation of a
transpose, and propagation needs both. A ``ShardGraph`` records every tensor's shape and, per op, an
einsum-like *label* per operand dimension (``sharding_models`` builds them from a model's config, with the
parameter count checked against ``transformers``).

The rules are one mechanism: an op names each operand dimension with a label; dimensions that share a
label must be split the same way (element-wise ops, the batch and free dims of a GEMM, a transpose's
permuted dims, a reshape's dims whose groups line up). A label in the inputs but not in the output is
*contracted*: splitting it leaves a partial sum, reduced by an AllReduce of the output (GEMM K, an
embedding's vocabulary, a reduction's axis). Labels marked ``nosplit`` (a softmax's or norm's axis, a
convolution's window, the inner dims of a reshape group that do not line up) may not be split. Since
every rule is an equality, the dimensions tied together form classes (union-find, built once per
graph), and a decision fixes a whole class. On top: a tensor splits at most one dimension per axis
(with one axis, a split dimension forces the tensor's other dimensions replicated), split sizes
must divide, and a class cannot take two values. Propagation ends as the paper says: complete,
incomplete (classes left undecided) or a conflict, reported with the op and the dimensions at fault.

``reshard`` ops are the one place a tensor may change its sharding: their input and output carry
distinct labels, so they are not tied, and the change is priced (AllGather, all-to-all; a new split
is a local slice).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

UNKNOWN, REPLICATED = -1, 0  # class values; axis i of the mesh is i + 1
ROLES = ("param", "input", "const", "act")
# ops whose output aliases its input (no memory kept for the backward pass)
VIEW_KINDS = frozenset({"reshape", "transpose"})
COLLECTIVE_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall")


@dataclass(frozen=True)
class Mesh:
    """Named device axes and their sizes, e.g. ``(("model", 8),)``."""

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise ValueError("mesh field 'axes' is empty; give at least one (name, size)")
        for name, size in self.axes:
            if not (isinstance(size, int) and size >= 1):
                raise ValueError(f"mesh axis {name!r}: size {size!r} must be an integer >= 1")
        if len({a for a, _ in self.axes}) != len(self.axes):
            raise ValueError(f"mesh field 'axes' repeats a name: {self.axes}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    def value(self, axis: str | None) -> int:
        """Class value of ``axis`` (None: replicated)."""
        if axis is None:
            return REPLICATED
        if axis not in self.names:
            raise ValueError(f"axis {axis!r} unknown; allowed: {list(self.names)} or None (replicated)")
        return self.names.index(axis) + 1

    def size(self, value: int) -> int:
        return self.axes[value - 1][1] if value > 0 else 1

    def name(self, value: int) -> str | None:
        return self.axes[value - 1][0] if value > 0 else None

    @property
    def devices(self) -> int:
        return math.prod(s for _, s in self.axes)


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    role: str  # param | input | const | act
    bytes_per_element: int = 2
    producer: int = -1  # op index; -1 for params, inputs and constants

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.bytes_per_element


@dataclass(frozen=True)
class Op:
    """One operation: ``labels[i]`` names the dimensions of ``inputs[i]``, ``out_labels`` those of the
    output. ``flops`` is the whole op's arithmetic (unsplit); ``tensor_core`` says whether it is a GEMM-like
    op; ``partial_factor`` scales the bytes of the AllReduce a split contracted label costs (a
    vocabulary-parallel cross entropy reduces three per-token statistics)."""

    name: str
    kind: str
    inputs: tuple[int, ...]
    output: int
    labels: tuple[tuple[str, ...], ...]
    out_labels: tuple[str, ...]
    nosplit: frozenset[str] = frozenset()
    flops: float = 0.0
    tensor_core: bool = False
    partial_factor: float = 1.0

    def contracted(self) -> list[str]:
        out = set(self.out_labels)
        seen: list[str] = []
        for ls in self.labels:
            seen += [x for x in ls if x not in out and x not in seen]
        return seen


@dataclass(frozen=True)
class Conflict:
    """Why a set of decisions cannot hold: the op and the dimensions at fault."""

    op: str
    dims: str
    reason: str

    def __str__(self) -> str:
        return f"conflict at op {self.op!r}, {self.dims}: {self.reason}"


@dataclass
class ShardGraph:
    """Tensors and ops of one training step's forward pass (the backward pass is derived)."""

    tensors: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._classes: _Classes | None = None

    def tensor(self, name: str) -> int:
        try:
            return self._names[name]
        except AttributeError:
            self._names = {t.name: i for i, t in enumerate(self.tensors)}
            return self.tensor(name)
        except KeyError:
            raise ValueError(f"tensor {name!r} unknown ({len(self.tensors)} tensors)") from None

    def params(self) -> list[int]:
        return [i for i, t in enumerate(self.tensors) if t.role == "param"]

    def inputs(self) -> list[int]:
        return [i for i, t in enumerate(self.tensors) if t.role == "input"]

    @property
    def classes(self) -> _Classes:
        if self._classes is None:
            self._classes = _Classes(self)
        return self._classes

    def num_params(self) -> int:
        return sum(self.tensors[i].numel for i in self.params())


class _Classes:
    """Union-find of every tensor dimension ("slot") by the ops' shared labels, built once per graph."""

    def __init__(self, g: ShardGraph):
        self.offset = np.cumsum([0] + [len(t.shape) for t in g.tensors])
        n = int(self.offset[-1])
        parent = list(range(n))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        self.where: list[tuple[int, str]] = [(-1, "")] * n  # slot -> (first op using it, its label)
        nosplit_at: dict[int, tuple[int, str]] = {}
        op_slots: list[dict[str, int]] = []
        for oi, op in enumerate(g.ops):
            if len(op.labels) != len(op.inputs):
                raise ValueError(f"op {op.name!r}: {len(op.labels)} label tuples for {len(op.inputs)} inputs")
            by_label: dict[str, list[int]] = {}
            for t, ls in list(zip(op.inputs, op.labels)) + [(op.output, op.out_labels)]:
                shape = g.tensors[t].shape
                if len(ls) != len(shape):
                    raise ValueError(
                        f"op {op.name!r}: labels {ls} do not match the shape {shape} of {g.tensors[t].name!r}"
                    )
                for d, lab in enumerate(ls):
                    s = int(self.offset[t]) + d
                    by_label.setdefault(lab, []).append(s)
                    if self.where[s][0] < 0:
                        self.where[s] = (oi, lab)
            # a reshard's input and output are two layouts of one tensor, not one op's work
            op_slots.append({} if op.kind == "reshard" else {lab: sl[0] for lab, sl in by_label.items()})
            for lab, slots in by_label.items():
                sizes = {
                    g.tensors[self.tensor_of(s)].shape[s - int(self.offset[self.tensor_of(s)])] for s in slots
                }
                if len(sizes) > 1 and op.kind != "reshape":  # a reshape ties a group's leading dims
                    raise ValueError(f"op {op.name!r}: label {lab!r} has sizes {sorted(sizes)}")
                for s in slots[1:]:
                    a, b = find(slots[0]), find(s)
                    if a != b:
                        parent[b] = a
            for lab in op.nosplit:
                for s in by_label.get(lab, []):
                    nosplit_at.setdefault(s, (oi, lab))
        root = np.array([find(s) for s in range(n)], dtype=np.int64)
        uniq, self.cls = np.unique(root, return_inverse=True)
        self.num = len(uniq)
        self.members: list[list[int]] = [[] for _ in range(self.num)]
        for s, c in enumerate(self.cls.tolist()):
            self.members[c].append(s)
        self.nosplit: dict[int, tuple[int, str]] = {}
        for s, w in nosplit_at.items():
            self.nosplit.setdefault(int(self.cls[s]), w)
        sizes = [
            g.tensors[self.tensor_of(s)].shape[s - int(self.offset[self.tensor_of(s)])] for s in range(n)
        ]
        self.sizes = np.array(sizes, dtype=np.int64)
        self.gcd = np.zeros(self.num, dtype=np.int64)
        for s in range(n):
            self.gcd[self.cls[s]] = math.gcd(int(self.gcd[self.cls[s]]), int(self.sizes[s]))
        # classes of each tensor's dims, and the tensors touching each class
        self.tensor_classes = [
            self.cls[self.offset[t] : self.offset[t + 1]].tolist() for t in range(len(g.tensors))
        ]
        # per op: (class, label, slot) of each of its label classes; the ops touching each class. An op's
        # work divides along one label per axis, so these classes obey the one-split-per-axis rule too
        self.op_classes: list[list[tuple[int, str, int]]] = []
        self.ops_of: list[list[int]] = [[] for _ in range(self.num)]
        for oi, ls in enumerate(op_slots):
            seen: dict[int, tuple[int, str, int]] = {}
            for lab, sl in ls.items():
                seen.setdefault(int(self.cls[sl]), (int(self.cls[sl]), lab, sl))
            self.op_classes.append(list(seen.values()))
            for c in seen:
                self.ops_of[c].append(oi)
        self.tensors_of: list[list[int]] = [[] for _ in range(self.num)]
        for t, cs in enumerate(self.tensor_classes):
            for c in dict.fromkeys(cs):
                self.tensors_of[c].append(t)

    def tensor_of(self, slot: int) -> int:
        return int(np.searchsorted(self.offset, slot, side="right") - 1)

    def slot(self, t: int, d: int) -> int:
        return int(self.offset[t]) + d


@dataclass
class Propagation:
    """The outcome of propagating a set of decisions: a value per class, the status and any conflict."""

    graph: ShardGraph
    mesh: Mesh
    values: np.ndarray  # per class: UNKNOWN, REPLICATED or axis index + 1
    conflict: Conflict | None = None

    @property
    def status(self) -> str:
        if self.conflict is not None:
            return "conflict"
        return "complete" if bool((self.values != UNKNOWN).all()) else "incomplete"

    def spec(self, tensor: int | str) -> tuple[str | None, ...]:
        """Per dimension: the axis it is split over, None when replicated or undecided."""
        t = self.graph.tensor(tensor) if isinstance(tensor, str) else tensor
        return tuple(
            self.mesh.name(max(int(self.values[c]), 0)) for c in self.graph.classes.tensor_classes[t]
        )

    def value_of(self, tensor: int, dim: int) -> int:
        return int(self.values[self.graph.classes.tensor_classes[tensor][dim]])


def _dim_text(g: ShardGraph, slot: int) -> str:
    cl = g.classes
    t = cl.tensor_of(slot)
    d = slot - int(cl.offset[t])
    oi, lab = cl.where[slot]
    at = f" (label {lab!r} of op {g.ops[oi].name!r})" if oi >= 0 else ""
    return f"{g.tensors[t].name} dim {d}{at}"


def propagate(
    g: ShardGraph,
    mesh: Mesh,
    decisions: Mapping[tuple[str | int, int], str | None] | Iterable,
    base: np.ndarray | None = None,
) -> Propagation:
    """Apply ``decisions`` ((tensor, dim) -> axis name or None for replicated) and everything they
    imply. ``base``: class values already decided (a previous propagation's ``values``), kept."""
    cl = g.classes
    values = np.full(cl.num, UNKNOWN, dtype=np.int64) if base is None else base.copy()
    reason: dict[int, str] = {}
    items = decisions.items() if isinstance(decisions, Mapping) else decisions
    queue: list[tuple[int, int, str, int]] = []  # (class, value, why, slot)
    for (t, d), axis in items:
        ti = g.tensor(t) if isinstance(t, str) else int(t)
        if not 0 <= d < len(g.tensors[ti].shape):
            raise ValueError(
                f"decision on {g.tensors[ti].name!r}: dim {d} out of range for shape {g.tensors[ti].shape}"
            )
        s = cl.slot(ti, d)
        queue.append((int(cl.cls[s]), mesh.value(axis), f"decision on {g.tensors[ti].name} dim {d}", s))
    single = len(mesh.axes) == 1
    fmt = lambda x: f"split over {mesh.name(x)!r}" if x > 0 else "replicated"  # noqa: E731
    seeds, queue = queue, []
    for seed in seeds:  # each decision with all it implies before the next, so a conflict names the later one
        queue.append(seed)
        while queue:
            c, v, why, slot = queue.pop(0)
            have = int(values[c])
            if have == v:
                continue
            oi = cl.where[slot][0]
            at = g.ops[oi].name if oi >= 0 else g.tensors[cl.tensor_of(slot)].name
            if have != UNKNOWN:
                return Propagation(
                    g,
                    mesh,
                    values,
                    Conflict(
                        at,
                        _dim_text(g, slot),
                        f"{fmt(v)} by {why}, but {fmt(have)} by {reason.get(c, 'an earlier decision')}",
                    ),
                )
            if v > 0:
                if c in cl.nosplit:
                    noi, lab = cl.nosplit[c]
                    return Propagation(
                        g,
                        mesh,
                        values,
                        Conflict(
                            g.ops[noi].name,
                            f"label {lab!r} ({_dim_text(g, slot)})",
                            f"{g.ops[noi].kind} cannot split this dimension ({why})",
                        ),
                    )
                if int(cl.gcd[c]) % mesh.size(v):
                    return Propagation(
                        g,
                        mesh,
                        values,
                        Conflict(
                            at,
                            _dim_text(g, slot),
                            f"sizes with gcd {int(cl.gcd[c])} do not divide over "
                            f"{mesh.size(v)} devices ({why})",
                        ),
                    )
            values[c] = v
            reason[c] = why
            if v <= 0:
                continue
            for t in cl.tensors_of[c]:
                cs = cl.tensor_classes[t]
                if cs.count(c) > 1:
                    ds = [d for d, x in enumerate(cs) if x == c]
                    return Propagation(
                        g,
                        mesh,
                        values,
                        Conflict(
                            at,
                            f"{g.tensors[t].name} dims {ds}",
                            f"one split would cover two dimensions of one tensor ({why})",
                        ),
                    )
                for d, oc in enumerate(cs):
                    if oc == c:
                        continue
                    if int(values[oc]) == v:
                        other = cl.slot(t, d)
                        ooi = cl.where[other][0]
                        return Propagation(
                            g,
                            mesh,
                            values,
                            Conflict(
                                g.ops[ooi].name if ooi >= 0 else at,
                                f"{_dim_text(g, other)} and {_dim_text(g, cl.slot(t, cs.index(c)))}",
                                f"two dimensions of one tensor split over {mesh.name(v)!r}: "
                                f"{reason.get(oc, 'an earlier decision')}; "
                                f"{why}",
                            ),
                        )
                    if single:
                        queue.append(
                            (
                                oc,
                                REPLICATED,
                                f"{g.tensors[t].name} splitting dim {cs.index(c)} ({why})",
                                cl.slot(t, d),
                            )
                        )
            for oi2 in cl.ops_of[c]:
                lab_c = next(lab for x, lab, _ in cl.op_classes[oi2] if x == c)
                for oc, lab, sl in cl.op_classes[oi2]:
                    if oc == c:
                        continue
                    if int(values[oc]) == v:
                        return Propagation(
                            g,
                            mesh,
                            values,
                            Conflict(
                                g.ops[oi2].name,
                                f"labels {lab_c!r} and {lab!r}",
                                f"the op's work would split twice over {mesh.name(v)!r}: "
                                f"{reason.get(oc, 'an earlier decision')}; {why}",
                            ),
                        )
                    if single:
                        queue.append(
                            (oc, REPLICATED, f"op {g.ops[oi2].name} splitting label {lab_c!r} ({why})", sl)
                        )
    return Propagation(g, mesh, values)


# ------------------------------------------------------------------------------------ plan accounting


@dataclass(frozen=True)
class Collective:
    kind: str  # allreduce | allgather | reducescatter | alltoall
    axis: str
    devices: int
    bytes: int  # per device: the buffer each device contributes (AllReduce) or holds after (AllGather)
    phase: str  # forward | backward
    at: str  # the op (forward) or the tensor whose gradient it reduces (backward)

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "axis": self.axis,
            "devices": self.devices,
            "bytes": self.bytes,
            "phase": self.phase,
            "at": self.at,
        }


@dataclass(frozen=True)
class Memory:
    """Per-device bytes of a plan: parameters, their gradients and optimizer state (``optimizer_factor``
    bytes-of-parameters per parameter byte: Adam's two fp32 moments and fp32 master weights over bf16
    parameters make 6), and the activations kept for the backward pass."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes

    def to_dict(self) -> dict:
        return {
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activations_bytes,
            "total_bytes": self.total_bytes,
        }


def _label_values(p: Propagation, op: Op) -> dict[str, int]:
    cl = p.graph.classes
    out: dict[str, int] = {}
    for t, ls in list(zip(op.inputs, op.labels)) + [(op.output, op.out_labels)]:
        for d, lab in enumerate(ls):
            out.setdefault(lab, max(int(p.values[cl.tensor_classes[t][d]]), 0))
    return out


def local_bytes(p: Propagation, t: int) -> int:
    """Bytes of tensor ``t`` on one device."""
    ten = p.graph.tensors[t]
    div = math.prod(p.mesh.size(max(int(p.values[c]), 0)) for c in p.graph.classes.tensor_classes[t])
    return ten.nbytes // div


def split_factor(p: Propagation, op: Op) -> int:
    """How many ways the op's work divides: the product of its split labels' axis sizes (distinct axes)."""
    axes = {v for v in _label_values(p, op).values() if v > 0}
    return math.prod(p.mesh.size(a) for a in axes)


def needs_grad(g: ShardGraph) -> np.ndarray:
    """Tensors with a gradient: parameters and everything computed from one."""
    out = np.array([t.role == "param" for t in g.tensors])
    for op in g.ops:
        if any(out[i] for i in op.inputs):
            out[op.output] = True
    return out


def collectives(p: Propagation) -> list[Collective]:
    """The collectives a plan implies, forward and backward.

    Forward: an op whose contracted label is split leaves a partial sum, reduced at its output (an
    AllReduce, or a ReduceScatter when the output is split over the same axis). A ``reshard`` op
    gathers (AllGather), exchanges (all-to-all) or slices (free). Backward: each operand's gradient
    contracts the op's labels the operand lacks; where one is split over an axis the operand is not
    split over, the contribution is partial. A tensor's contributions are summed first and then
    reduced once per axis (Megatron's ``f``: one AllReduce for the input of q, k and v together; the
    data-parallel gradient AllReduce of a weight), so the count is per tensor, not per use."""
    g, mesh = p.graph, p.mesh
    out: list[Collective] = []
    grad = needs_grad(g)
    partial: dict[int, set[int]] = {}
    cl = g.classes
    for op in g.ops:
        lv = _label_values(p, op)
        if op.kind == "reshard":
            src, dst = op.inputs[0], op.output
            sv = [max(int(p.values[c]), 0) for c in cl.tensor_classes[src]]
            dv = [max(int(p.values[c]), 0) for c in cl.tensor_classes[dst]]
            for a in {x for x in sv + dv if x > 0}:
                if a in sv and a in dv and sv.index(a) != dv.index(a):
                    out.append(
                        Collective(
                            "alltoall", mesh.name(a), mesh.size(a), local_bytes(p, src), "forward", op.name
                        )
                    )
                    if grad[dst]:
                        out.append(
                            Collective(
                                "alltoall",
                                mesh.name(a),
                                mesh.size(a),
                                local_bytes(p, dst),
                                "backward",
                                g.tensors[src].name,
                            )
                        )
                elif a in sv and a not in dv:
                    out.append(
                        Collective(
                            "allgather", mesh.name(a), mesh.size(a), local_bytes(p, dst), "forward", op.name
                        )
                    )
                    if grad[dst]:
                        out.append(
                            Collective(
                                "reducescatter",
                                mesh.name(a),
                                mesh.size(a),
                                local_bytes(p, dst),
                                "backward",
                                g.tensors[src].name,
                            )
                        )
            continue
        out_axes = {v for v in (max(int(p.values[c]), 0) for c in cl.tensor_classes[op.output]) if v > 0}
        for a in dict.fromkeys(lv[lab] for lab in op.contracted() if lv[lab] > 0):
            kind = "reducescatter" if a in out_axes else "allreduce"
            out.append(
                Collective(
                    kind,
                    mesh.name(a),
                    mesh.size(a),
                    int(local_bytes(p, op.output) * op.partial_factor),
                    "forward",
                    op.name,
                )
            )
        for t, ls in zip(op.inputs, op.labels):
            if not grad[t]:
                continue
            own = {max(int(p.values[c]), 0) for c in cl.tensor_classes[t]}
            for lab, a in lv.items():
                if a > 0 and lab not in ls and a not in own:
                    partial.setdefault(t, set()).add(a)
    for t in sorted(partial):
        for a in sorted(partial[t]):
            out.append(
                Collective(
                    "allreduce", mesh.name(a), mesh.size(a), local_bytes(p, t), "backward", g.tensors[t].name
                )
            )
    return out


def memory(p: Propagation, optimizer_factor: float = 6.0) -> Memory:
    """Per-device memory of a plan (see ``Memory``): activations are every op output but views'."""
    g = p.graph
    params = sum(local_bytes(p, t) for t in g.params())
    acts = sum(local_bytes(p, op.output) for op in g.ops if op.kind not in VIEW_KINDS)
    return Memory(params, params, int(params * optimizer_factor), acts)
