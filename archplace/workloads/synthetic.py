"""Seeded synthetic operator graphs: a layered random DAG, a CNN with branches, an unrolled RNN/LSTM.

Every generator is deterministic for its ``seed`` (``np.random.default_rng(seed)``) and returns a
forward-only :class:`OpGraph` whose sizes follow from tensor shapes:

* ``bytes_per_element`` (2, bf16) times the element count gives every activation's bytes;
* tensor ops (``linear``, ``matmul``, ``conv``) carry GEMM dims and ``flops = 2*b*m*n*k`` exactly,
  with ``vector_flops = 0``;
* vector ops have ``flops = vector_flops = output elements * OP_KINDS[kind].flops_per_element``
  (1 per element for add/mul/pool/..., 0 for ``cat``); ``input``/shape ops have no flops;
* ``input_bytes`` is the sum of the incoming edges' bytes (plus, for a source op, the external tensor
  it reads), ``output_bytes`` the op's output tensor, ``weight_bytes`` its parameters, and
  ``saved_bytes`` its inputs or its output as ``OP_KINDS[kind].saves`` says;
* every edge carries the producer's ``output_bytes``; ``arg`` is the argument position at the consumer;
* node ids are ``0..n-1`` in a topological order, and ``layer`` is non-decreasing along every edge,
  so each entry of ``meta["layers"]`` is a contiguous run of a topological order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .graph import OpGraph
from .ops import OP_KINDS, TENSOR_KINDS

SOURCE = "synthetic"
_UNARY_VECTOR = ("relu", "gelu", "silu", "tanh", "sigmoid", "softmax", "layernorm", "dropout")


class _Builder:
    """Accumulates operators row by row; each op's sizes are derived from its shapes."""

    def __init__(self, bytes_per_element: int) -> None:
        if bytes_per_element < 1:
            raise ValueError(f"bytes_per_element is {bytes_per_element}, must be >= 1")
        self.bpe = int(bytes_per_element)
        self.cols: dict[str, list[Any]] = {c: [] for c in (
            "name", "kind", "layer", "gemm_b", "gemm_m", "gemm_n", "gemm_k", "flops", "vector_flops",
            "input_bytes", "output_bytes", "weight_bytes", "saved_bytes")}
        self.src: list[int] = []
        self.dst: list[int] = []
        self.ebytes: list[int] = []
        self.arg: list[int] = []
        self.layers: list[str] = []

    def new_layer(self, name: str) -> None:
        self.layers.append(name)

    @property
    def num_nodes(self) -> int:
        return len(self.cols["name"])

    def op(self, kind: str, name: str, out_elems: int, inputs: tuple[int, ...] | list[int] = (), *,
           gemm: tuple[int, int, int, int] | None = None, weight_elems: int = 0,
           external_in_elems: int = 0) -> int:
        """Append one op reading ``inputs`` (node ids, in argument order); returns its id."""
        info = OP_KINDS[kind]
        out_bytes = int(out_elems) * self.bpe
        in_bytes = sum(self.cols["output_bytes"][p] for p in inputs) + int(external_in_elems) * self.bpe
        b = m = n = k = 0
        if kind in TENSOR_KINDS:
            if gemm is None:
                raise AssertionError(f"{name}: a {kind} op needs GEMM dims")
            b, m, n, k = (int(x) for x in gemm)
            flops = 2.0 * b * m * n * k
            vflops = 0.0
        elif info.core == "vector":
            flops = vflops = float(out_elems) * info.flops_per_element
        else:
            flops = vflops = 0.0
        saved = in_bytes if info.saves == "input" else out_bytes if info.saves == "output" else 0
        nid = self.num_nodes
        for col, val in (("name", name), ("kind", kind), ("layer", len(self.layers) - 1), ("gemm_b", b),
                         ("gemm_m", m), ("gemm_n", n), ("gemm_k", k), ("flops", flops),
                         ("vector_flops", vflops), ("input_bytes", in_bytes), ("output_bytes", out_bytes),
                         ("weight_bytes", int(weight_elems) * self.bpe), ("saved_bytes", saved)):
            self.cols[col].append(val)
        for a, p in enumerate(inputs):
            self.src.append(int(p))
            self.dst.append(nid)
            self.ebytes.append(self.cols["output_bytes"][p])
            self.arg.append(a)
        return nid

    def build(self, meta: dict[str, Any]) -> OpGraph:
        n = self.num_nodes
        nodes: dict[str, Any] = {"id": np.arange(n, dtype=np.int64)}
        for col, vals in self.cols.items():
            nodes[col] = np.array(vals, dtype=object) if col in ("name", "kind") else np.asarray(vals)
        nodes["flops"] = nodes["flops"].astype(np.float64)
        nodes["vector_flops"] = nodes["vector_flops"].astype(np.float64)
        edges = {"src": np.array(self.src, dtype=np.int64), "dst": np.array(self.dst, dtype=np.int64),
                 "bytes": np.array(self.ebytes, dtype=np.int64), "arg": np.array(self.arg, dtype=np.int16)}
        meta = {**meta, "source": SOURCE, "bytes_per_element": self.bpe, "layers": list(self.layers)}
        return OpGraph.from_columns(nodes, edges, meta)


def _positive(**kw: int) -> None:
    for name, v in kw.items():
        if int(v) != v or v < 1:
            raise ValueError(f"{name} is {v!r}, must be a positive integer")


# ------------------------------------------------------------------------------------------ layered DAG
def layered_dag(num_nodes: int, width: int, seed: int = 0, *, batch: int = 8, seq: int = 512,
                hidden: int = 1024, max_in: int = 3, max_skip: int = 2, p_tensor: float = 0.35,
                p_binary: float = 0.3, p_cat: float = 0.1, bytes_per_element: int = 2) -> OpGraph:
    """A layered random DAG of exactly ``num_nodes`` ops in levels of ``width`` (the last may be short).

    Level 0 holds the sources (``linear`` or ``layernorm`` on an external ``[batch*seq, hidden]`` input;
    op 0 is always a ``linear``); every other op has 1 to ``max_in`` predecessors, one from the previous
    level and the rest from the ``max_skip + 1`` levels before it, preferring outputs nobody consumes
    yet. Every activation is ``[batch*seq, w]``: ``linear`` maps w to ``hidden`` or ``4*hidden``;
    ``matmul`` of two activations is attention-like, ``X @ Y^T`` (equal widths, gives width ``seq``,
    GEMM ``(batch, seq, seq, w)``) or ``P @ V`` (P of width ``seq``, GEMM ``(batch, seq, w_V, seq)``);
    ``add``/``mul`` join equal widths, ``cat`` joins up to ``max_in`` inputs of total width <=
    ``4*hidden``; the rest are unary vector ops. Level i is layer i (``"level{i}"``).
    """
    _positive(num_nodes=num_nodes, width=width, batch=batch, seq=seq, hidden=hidden, max_in=max_in)
    if max_skip < 0:
        raise ValueError(f"max_skip is {max_skip}, must be >= 0")
    rng = np.random.default_rng(seed)
    bld = _Builder(bytes_per_element)
    rows = batch * seq
    feat: list[int] = []  # feature width of each op's output
    consumed: list[bool] = []
    level_start: list[int] = []

    def pick(cands: list[int]) -> int:
        fresh = [c for c in cands if not consumed[c]]
        pool = fresh if fresh and rng.random() < 0.8 else cands
        return int(pool[rng.integers(len(pool))])

    def add_op(kind: str, name: str, w: int, inputs: list[int], **kw: Any) -> None:
        bld.op(kind, name, rows * w, inputs, **kw)
        feat.append(w)
        consumed.append(False)
        for p in inputs:
            consumed[p] = True

    num_levels = math.ceil(num_nodes / width)
    for lvl in range(num_levels):
        bld.new_layer(f"level{lvl}")
        level_start.append(bld.num_nodes)
        for _ in range(min(width, num_nodes - lvl * width)):
            nid = bld.num_nodes
            if lvl == 0:
                if nid == 0 or rng.random() < 0.5:  # the first source is a linear: every DAG has a GEMM
                    out = int(rng.choice([hidden, 4 * hidden]))
                    add_op("linear", f"L0.linear{nid}", out, [], gemm=(1, rows, out, hidden),
                           weight_elems=hidden * out, external_in_elems=rows * hidden)
                else:
                    add_op("layernorm", f"L0.layernorm{nid}", hidden, [], weight_elems=2 * hidden,
                           external_in_elems=rows * hidden)
                continue
            prev = list(range(level_start[lvl - 1], level_start[lvl]))
            p1 = pick(prev)
            earlier = [c for c in range(level_start[max(0, lvl - 1 - max_skip)], level_start[lvl]) if c != p1]
            w1 = feat[p1]
            r = rng.random()
            if r < p_tensor:
                partners = [c for c in earlier if feat[c] == w1 or (feat[c] == seq) != (w1 == seq)]
                if max_in >= 2 and partners and rng.random() < 0.5:
                    q = pick(partners)
                    wq = feat[q]
                    if wq == w1:  # scores = X @ Y^T
                        add_op("matmul", f"L{lvl}.matmul{nid}", seq, [p1, q], gemm=(batch, seq, seq, w1))
                    else:  # context = P @ V, P the [seq x seq] scores
                        pv, v = (p1, q) if w1 == seq else (q, p1)
                        add_op("matmul", f"L{lvl}.matmul{nid}", feat[v], [pv, v],
                               gemm=(batch, seq, feat[v], seq))
                    continue
                out = int(rng.choice([hidden, 4 * hidden])) if w1 == hidden else hidden
                add_op("linear", f"L{lvl}.linear{nid}", out, [p1], gemm=(1, rows, out, w1),
                       weight_elems=w1 * out)
                continue
            r = rng.random()
            if max_in >= 2 and r < p_binary:
                partners = [c for c in earlier if feat[c] == w1]
                if partners:
                    kind = "add" if rng.random() < 0.7 else "mul"
                    add_op(kind, f"L{lvl}.{kind}{nid}", w1, [p1, pick(partners)])
                    continue
            elif max_in >= 2 and r < p_binary + p_cat:
                extra = int(rng.integers(1, max_in))
                chosen, total = [p1], w1
                for _k in range(extra):
                    fits = [c for c in earlier if c not in chosen and total + feat[c] <= 4 * hidden]
                    if not fits:
                        break
                    c = pick(fits)
                    chosen.append(c)
                    total += feat[c]
                if len(chosen) > 1:
                    add_op("cat", f"L{lvl}.cat{nid}", total, chosen)
                    continue
            kind = str(rng.choice(_UNARY_VECTOR))
            wts = 2 * w1 if kind == "layernorm" else 0
            add_op(kind, f"L{lvl}.{kind}{nid}", w1, [p1], weight_elems=wts)
    meta = {"model": f"layered_dag_n{num_nodes}_w{width}_s{seed}", "generator": "layered_dag",
            "seed": int(seed), "batch": int(batch), "seq_len": int(seq), "hidden": int(hidden)}
    return bld.build(meta)


# ------------------------------------------------------------------------------------------ CNN
def _conv_out(h: int, stride: int) -> int:
    return -(-h // stride)  # "same" padding


def cnn_graph(num_blocks: int, seed: int = 0, *, batch: int = 32, image_size: int = 224,
              in_channels: int = 3, channels: int = 64, max_channels: int = 2048, num_classes: int = 1000,
              p_inception: float = 0.5, num_stages: int = 4, bytes_per_element: int = 2) -> OpGraph:
    """A CNN: a stem, ``num_blocks`` residual or inception blocks, and a classifier head.

    Stem (layer ``"stem"``): input image, 7x7/2 conv, batchnorm, relu, 3x3/2 pool. Each block (layer
    ``"block{i}"``) is, at random, a residual block (basic or bottleneck; main path of conv-batchnorm-
    relu, a 1x1 conv-batchnorm projection on the shortcut when the shape changes, joined by ``add`` and
    a relu) or an inception block (2-4 parallel branches among 1x1, 1x1-3x3, 1x1-3x3-3x3 and pool-1x1,
    joined by ``cat``). The blocks form ``num_stages`` stages; the first block of each later stage
    halves the resolution (stride 2, never below 7x7) and doubles the channels (up to ``max_channels``).
    Head (layer ``"head"``): global average pool, linear classifier. ``conv`` ops carry GEMM dims
    ``b=1, m=batch*H_out*W_out, n=C_out, k=C_in*kh*kw``. ``num_blocks=0`` gives 7 ops; each block adds
    7 to 26.
    """
    if num_blocks < 0 or int(num_blocks) != num_blocks:
        raise ValueError(f"num_blocks is {num_blocks!r}, must be a non-negative integer")
    _positive(batch=batch, image_size=image_size, in_channels=in_channels, channels=channels,
              max_channels=max_channels, num_classes=num_classes, num_stages=num_stages)
    rng = np.random.default_rng(seed)
    bld = _Builder(bytes_per_element)
    N = batch

    def conv(x: int, cin: int, cout: int, h: int, kernel: int, stride: int, name: str) -> tuple[int, int]:
        ho = _conv_out(h, stride)
        k = cin * kernel * kernel
        nid = bld.op("conv", name, N * cout * ho * ho, [x], gemm=(1, N * ho * ho, cout, k),
                     weight_elems=cout * k)
        return nid, ho

    def bn(x: int, c: int, h: int, name: str) -> int:
        return bld.op("batchnorm", name, N * c * h * h, [x], weight_elems=2 * c)

    def relu(x: int, c: int, h: int, name: str) -> int:
        return bld.op("relu", name, N * c * h * h, [x])

    def cbr(x: int, cin: int, cout: int, h: int, kernel: int, stride: int, name: str,
            act: bool = True) -> tuple[int, int]:
        y, ho = conv(x, cin, cout, h, kernel, stride, f"{name}.conv{kernel}x{kernel}")
        y = bn(y, cout, ho, f"{name}.bn")
        if act:
            y = relu(y, cout, ho, f"{name}.relu")
        return y, ho

    bld.new_layer("stem")
    x = bld.op("input", "stem.image", N * in_channels * image_size * image_size)
    x, h = cbr(x, in_channels, channels, image_size, 7, 2, "stem")
    h2 = _conv_out(h, 2)
    x = bld.op("pool", "stem.maxpool", N * channels * h2 * h2, [x])
    c, h = channels, h2

    stage_len = max(1, math.ceil(num_blocks / num_stages))
    kinds = []
    for i in range(num_blocks):
        bld.new_layer(f"block{i}")
        down = i > 0 and i % stage_len == 0 and h >= 14
        stride = 2 if down else 1
        cout = min(2 * c, max_channels) if down else c
        ho = _conv_out(h, stride)
        pre = f"block{i}"
        if rng.random() < p_inception:
            kinds.append("inception")
            nb = int(rng.integers(2, 5))
            types = [str(t) for t in rng.choice(["1x1", "3x3", "double3x3", "pool"], size=nb, replace=False)]
            outs = [cout // nb + (1 if j < cout % nb else 0) for j in range(nb)]
            red = max(8, c // 4)
            branches = []
            for j, (t, cb) in enumerate(zip(types, outs, strict=True)):
                bp = f"{pre}.b{j}_{t}"
                if t == "1x1":
                    y, _ = cbr(x, c, cb, h, 1, stride, bp)
                elif t == "3x3":
                    y, _ = cbr(x, c, red, h, 1, 1, f"{bp}.reduce")
                    y, _ = cbr(y, red, cb, h, 3, stride, bp)
                elif t == "double3x3":
                    y, _ = cbr(x, c, red, h, 1, 1, f"{bp}.reduce")
                    y, _ = cbr(y, red, red, h, 3, 1, f"{bp}.a")
                    y, _ = cbr(y, red, cb, h, 3, stride, f"{bp}.b")
                else:
                    y = bld.op("pool", f"{bp}.pool3x3", N * c * ho * ho, [x])
                    y, _ = cbr(y, c, cb, ho, 1, 1, bp)
                branches.append(y)
            x = bld.op("cat", f"{pre}.cat", N * cout * ho * ho, branches)
        else:
            bottleneck = rng.random() < 0.5
            kinds.append("bottleneck" if bottleneck else "basic")
            if bottleneck:
                mid = max(8, cout // 4)
                y, _ = cbr(x, c, mid, h, 1, 1, f"{pre}.a")
                y, _ = cbr(y, mid, mid, h, 3, stride, f"{pre}.b")
                y, _ = cbr(y, mid, cout, ho, 1, 1, f"{pre}.c", act=False)
            else:
                y, _ = cbr(x, c, cout, h, 3, stride, f"{pre}.a")
                y, _ = cbr(y, cout, cout, ho, 3, 1, f"{pre}.b", act=False)
            sc = x
            if down or cout != c:
                sc, _ = cbr(x, c, cout, h, 1, stride, f"{pre}.proj", act=False)
            y = bld.op("add", f"{pre}.add", N * cout * ho * ho, [y, sc])
            x = relu(y, cout, ho, f"{pre}.relu")
        c, h = cout, ho

    bld.new_layer("head")
    x = bld.op("pool", "head.avgpool", N * c, [x])
    bld.op("linear", "head.fc", N * num_classes, [x], gemm=(1, N, num_classes, c),
           weight_elems=c * num_classes)
    meta = {"model": f"cnn_b{num_blocks}_s{seed}", "generator": "cnn_graph", "seed": int(seed),
            "batch": int(batch), "image_size": int(image_size), "block_kinds": kinds}
    return bld.build(meta)


# ------------------------------------------------------------------------------------------ RNN
def rnn_graph(num_steps: int, hidden: int, seed: int = 0, *, batch: int = 64, input_size: int | None = None,
              cell: str = "lstm", dropout_prob: float = 0.5, bytes_per_element: int = 2) -> OpGraph:
    """An RNN unrolled over ``num_steps`` time steps, one layer (``"step{t}"``) per step.

    Per step: the input ``x_t`` (``[batch, input_size]``, kind ``input``), at random (probability
    ``dropout_prob``, drawn from ``seed``) a dropout on it, then for ``cell="lstm"`` each of the four
    gates i, f, g, o as ``linear(x) + linear(h_prev)`` followed by sigmoid (tanh for g), and
    ``c = f*c_prev + i*g``, ``h = o*tanh(c)`` (22 ops, 23 with dropout); for ``cell="rnn"``
    ``h = tanh(linear(x) + linear(h_prev))`` (5 ops, 6 with dropout). Step 0 also holds the initial
    state inputs (``h0``, and ``c0`` for an LSTM). ``weight_bytes`` are the parameters each op reads:
    the same matrices in every step (``meta["weights_shared_across_steps"]``).
    """
    _positive(num_steps=num_steps, hidden=hidden, batch=batch)
    if cell not in ("lstm", "rnn"):
        raise ValueError(f"cell is {cell!r}; allowed: 'lstm', 'rnn'")
    isz = hidden if input_size is None else input_size
    _positive(input_size=isz)
    rng = np.random.default_rng(seed)
    bld = _Builder(bytes_per_element)
    B, H = batch, hidden
    h_prev = c_prev = -1
    dropped = []

    def gate(pre: str, g: str, act: str, x: int, h_prev: int) -> int:
        lx = bld.op("linear", f"{pre}.{g}.linear_x", B * H, [x], gemm=(1, B, H, isz), weight_elems=isz * H)
        lh = bld.op("linear", f"{pre}.{g}.linear_h", B * H, [h_prev], gemm=(1, B, H, H), weight_elems=H * H)
        a = bld.op("add", f"{pre}.{g}.add", B * H, [lx, lh])
        return bld.op(act, f"{pre}.{g}.{act}", B * H, [a])

    for t in range(num_steps):
        bld.new_layer(f"step{t}")
        pre = f"t{t}"
        if t == 0:
            h_prev = bld.op("input", "h0", B * H)
            if cell == "lstm":
                c_prev = bld.op("input", "c0", B * H)
        x = bld.op("input", f"{pre}.x", B * isz)
        drop = bool(rng.random() < dropout_prob)
        dropped.append(drop)
        if drop:
            x = bld.op("dropout", f"{pre}.dropout", B * isz, [x])

        if cell == "rnn":
            h_prev = gate(pre, "h", "tanh", x, h_prev)
            continue
        i_g, f_g, g_g, o_g = (gate(pre, g, act, x, h_prev) for g, act in
                              (("i", "sigmoid"), ("f", "sigmoid"), ("g", "tanh"), ("o", "sigmoid")))
        fc = bld.op("mul", f"{pre}.f_mul_c", B * H, [f_g, c_prev])
        ig = bld.op("mul", f"{pre}.i_mul_g", B * H, [i_g, g_g])
        c_prev = bld.op("add", f"{pre}.c", B * H, [fc, ig])
        tc = bld.op("tanh", f"{pre}.tanh_c", B * H, [c_prev])
        h_prev = bld.op("mul", f"{pre}.h", B * H, [o_g, tc])
    meta = {"model": f"{cell}_t{num_steps}_h{hidden}_s{seed}", "generator": "rnn_graph", "seed": int(seed),
            "cell": cell, "batch": int(batch), "hidden": int(hidden), "input_size": int(isz),
            "weights_shared_across_steps": True, "dropout_steps": [t for t, d in enumerate(dropped) if d]}
    return bld.build(meta)
