"""Capture a `transformers` model into the forward operator graph, with shapes and no weights.

The model is built from its config on the meta device (no memory for weights, nothing downloaded)
and captured with ``torch.export`` (``transformers.utils.fx`` is gone in transformers 5). Eager
attention keeps the two attention GEMMs and the softmax as separate ops.

Only a few blocks of each layer stack are captured (``capture_blocks``, default 3); the last one is
replicated in the IR to the configured depth. Identical transformer blocks give identical operator
graphs, so this is exact, keeps capture of a 96-layer GPT-3 to seconds, and is why models whose
weights would never fit in memory still work. ``tests/test_extract.py`` checks a replicated BERT
against a full capture.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .graph import OpGraph
from .ops import OP_KINDS, TENSOR_KINDS

# aten op name (without overload) -> op kind. Anything shape-only maps to "view".
_ATEN_KIND = {
    "linear": "linear", "addmm": "linear", "mm": "matmul", "matmul": "matmul", "bmm": "matmul",
    "baddbmm": "matmul", "addbmm": "matmul", "einsum": "matmul", "convolution": "conv", "conv1d": "conv",
    "conv2d": "conv", "embedding": "embedding", "layer_norm": "layernorm",
    "native_layer_norm": "layernorm", "rms_norm": "layernorm", "softmax": "softmax",
    "_softmax": "softmax", "_safe_softmax": "softmax", "gelu": "gelu", "relu": "relu",
    "silu": "silu", "tanh": "tanh", "sigmoid": "sigmoid", "dropout": "dropout",
    "native_dropout": "dropout", "add": "add", "add_": "add", "sub": "sub", "rsub": "sub",
    "mul": "mul", "mul_": "mul", "div": "div", "div_": "div", "pow": "pow", "exp": "exp",
    "log": "log", "rsqrt": "rsqrt", "sqrt": "rsqrt", "neg": "neg", "mean": "mean", "sum": "sum",
    "cat": "cat", "where": "where", "masked_fill": "where", "batch_norm": "batchnorm",
    "max_pool2d": "pool", "avg_pool2d": "pool", "adaptive_avg_pool2d": "pool", "abs": "elementwise",
    "log1p": "log", "clamp": "elementwise", "minimum": "elementwise", "maximum": "elementwise",
    "erf": "elementwise", "cos": "elementwise", "sin": "elementwise", "square": "mul",
    "reciprocal": "div", "lt": "elementwise", "gt": "elementwise", "ge": "elementwise",
    "le": "elementwise", "eq": "elementwise", "ne": "elementwise", "full_like": "elementwise",
    "scaled_dot_product_attention": "attention_sdpa",
    # mixture of experts (transformers' grouped-GEMM experts): the top-k router's bookkeeping is small
    # vector work; the grouped GEMM runs every (token, chosen expert) row through its expert's weights
    "topk": "elementwise", "sort": "elementwise", "argsort": "elementwise", "histc": "elementwise",
    "bincount": "elementwise", "cumsum": "elementwise", "one_hot": "elementwise",
    "floor_divide": "elementwise", "remainder": "elementwise", "index_put": "elementwise",
    "index_put_": "elementwise", "index_add": "add", "index_add_": "add", "scatter_add": "add",
    "scatter_add_": "add", "empty_like": "elementwise", "grouped_mm_fallback": "linear",
    "_grouped_mm": "linear", "grouped_mm": "linear",
    # found by the op-coverage sweep (bench/platform/hf_coverage.py): plain arithmetic and data movement.
    # Masks and routing bookkeeping are element-wise; copies into a new layout (stack, pad, flip)
    # move bytes like cat; reductions count their inputs like sum; transcendentals like exp
    "bitwise_not": "elementwise", "bitwise_and": "elementwise", "bitwise_or": "elementwise",
    "bitwise_xor": "elementwise", "__and__": "elementwise", "__or__": "elementwise",
    "__xor__": "elementwise", "__invert__": "elementwise", "logical_not": "elementwise",
    "logical_and": "elementwise", "logical_or": "elementwise", "scatter": "elementwise",
    "scatter_": "elementwise", "clamp_min": "elementwise", "clamp_max": "elementwise",
    "clamp_": "elementwise", "acos": "elementwise", "sign": "elementwise", "multiply": "mul",
    "stack": "cat", "concat": "cat", "concatenate": "cat", "pad": "cat", "constant_pad_nd": "cat",
    "flip": "cat", "roll": "cat", "im2col": "cat",
    "max": "sum", "min": "sum", "amax": "sum", "amin": "sum", "linalg_vector_norm": "sum",
    "var": "mean", "std": "mean", "logsumexp": "softmax",
    "expm1": "exp", "softplus": "exp", "log_sigmoid": "sigmoid",
}
_GROUPED_MM = {"grouped_mm_fallback", "_grouped_mm", "grouped_mm"}
_VIEW_OPS = {
    "view", "_unsafe_view", "transpose", "permute", "expand", "unsqueeze", "squeeze", "alias",
    "select", "slice", "getitem", "split", "split_with_sizes", "chunk", "t", "detach", "unbind",
    "lift_fresh_copy", "expand_as", "view_as", "narrow", "_assert_tensor_metadata", "dim", "size",
    "numpy_T", "unfold", "view_as_complex", "view_as_real", "real",
}
# ops that move data: each reads and writes its bytes (op kind "copy"); the conditional ones only
# when they cannot return a view (a reshape of a transposed tensor, a cast that changes the dtype)
_COPY_OPS = {"clone", "_to_copy", "copy", "copy_", "repeat", "repeat_interleave"}
_GATHER_OPS = {"gather", "index", "index_select"}  # (data, indices...): read the elements they gather
_COPY_UNLESS_VIEW = {"reshape", "reshape_as", "flatten", "contiguous"}
_COPY_IF_CAST = {"to", "type_as"}
_CONSTANT_OPS = {"arange", "zeros", "ones", "full", "scalar_tensor", "empty", "zeros_like",
                 "ones_like", "tensor", "triu", "tril", "new_ones", "new_zeros", "new_empty",
                 "new_full"}

_BLOCK_RE = re.compile(r"^(.*?\b(?:layer|layers|h|block))\.(\d+)(?:\.|$)")


@dataclass
class _Op:
    name: str
    kind: str
    module: str
    block: tuple[str, int] | None
    gemm: tuple[int, int, int, int]
    flops: float
    vector_flops: float
    in_bytes: int
    out_bytes: int
    weight_bytes: int
    saved_bytes: int
    args: list[tuple[int, int]]  # (producer op index, argument position)
    out_numel: int
    params: tuple[str, ...] = ()  # the parameters the op reads (all readers, not only the first)
    param_paths: tuple[str, ...] = ()  # their paths in the module (model.layers.0.mlp.up_proj.weight)
    reads: tuple[tuple[str, str, int], ...] = ()  # (parameter, its path, its bytes), each once
    table_rows: int = 0  # an embedding lookup's table rows (its vocabulary)


def _numel(v: Any) -> int:
    if isinstance(v, (list, tuple)):
        return sum(_numel(x) for x in v)
    shape = getattr(v, "shape", None)
    return int(math.prod(shape)) if shape is not None else 0


def _nbytes(v: Any, bpe: int, wide_bpe: int | None = None) -> int:
    """Floating tensors count `bpe` bytes per element (training precision); integer and boolean
    tensors (ids, masks) their own itemsize. ``wide_bpe`` (a half-precision capture): fp32 tensors
    count that many (4), because a bf16 training step really keeps them in fp32 (the fp32 softmax and
    norm statistics of Llama/OPT/T5 and the casts around them)."""
    if isinstance(v, (list, tuple)):
        return sum(_nbytes(x, bpe, wide_bpe) for x in v)
    if getattr(v, "shape", None) is None:
        return 0
    dt = v.dtype
    size = bpe if dt.is_floating_point else dt.itemsize
    if wide_bpe is not None and dt.is_floating_point and dt.itemsize >= 4:
        size = wide_bpe
    return _numel(v) * size


def _target_name(node) -> str:
    t = node.target
    name = getattr(t, "__name__", str(t))
    if hasattr(t, "_opname"):
        name = t._opname
    return name.split(".")[0]


def _module_path(node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path.removeprefix("L['self'].").removeprefix("L__self__")


def _gemm(target: str, node, fx_args: list) -> tuple[int, int, int, int]:
    """GEMM dimensions (b, m, n, k) of a tensor op."""
    out = node.meta["val"]
    shapes = [getattr(a.meta.get("val"), "shape", None) if hasattr(a, "meta") else None
              for a in fx_args]
    if target == "linear":
        x, w = shapes[0], shapes[1]
        n, k = int(w[0]), int(w[1])
        return (1, _numel(out) // n, n, k)
    if target == "addmm":  # addmm(bias, x[M,K], w[K,N]) as in GPT-2's Conv1D
        x, w = shapes[1], shapes[2]
        return (1, int(x[0]), int(w[1]), int(x[1]))
    if target == "baddbmm":  # baddbmm(bias, a[B,M,K], b[B,K,N]): BLOOM's scores with the ALiBi bias
        a, b = shapes[1], shapes[2]
        return (int(a[0]), int(a[1]), int(b[2]), int(a[2]))
    if target == "addbmm":  # addbmm(bias[M,N], a[B,M,K], b[B,K,N]): a sum of B GEMMs into one output
        a, b = shapes[1], shapes[2]
        return (int(a[0]), int(a[1]), int(b[2]), int(a[2]))
    if target in _GROUPED_MM:  # grouped_mm(x[S,K], w[E,K,N], offs): S rows, each through one expert
        n = int(out.shape[-1])
        return (1, _numel(out) // n, n, int(shapes[0][-1]))
    if target in ("convolution", "conv1d", "conv2d"):
        w = shapes[1]
        cout, cin_g = int(w[0]), int(w[1])
        ksz = int(math.prod(w[2:]))
        m = _numel(out) // cout
        return (1, m, cout, cin_g * ksz)
    a, b = shapes[0], shapes[1]
    k = int(a[-1])
    n = int(b[-1]) if len(b) >= 2 else 1
    m = int(a[-2]) if len(a) >= 2 else 1
    batch = _numel(out) // max(m * n, 1)
    return (batch, m, n, k)


def _moves_data(target: str, node, data) -> bool:
    """Whether a view-like aten op moves data: always for copies and gathers; for a reshape, flatten or
    contiguous when its input's strides admit no view of the output shape; for a cast when the dtype
    changes (the same dtype returns its input)."""
    if target in _COPY_OPS or target in _GATHER_OPS:
        return True
    out = node.meta.get("val")
    src = getattr(data, "meta", {}).get("val") if data is not None else None
    if getattr(out, "shape", None) is None or getattr(src, "shape", None) is None:
        return False
    if target in _COPY_IF_CAST:
        return src.dtype != out.dtype
    if target in _COPY_UNLESS_VIEW:
        import torch

        probe = torch.empty_strided(tuple(src.shape), tuple(src.stride()), dtype=src.dtype, device="meta")
        if target == "contiguous":
            return not probe.is_contiguous()
        try:
            probe.view(tuple(out.shape))
        except RuntimeError:
            return True
    return False


class UnmappedOpsError(ValueError):
    """The captured graph holds aten ops without a cost mapping (``_ATEN_KIND``)."""


def capture_ops(model, example_args: tuple, example_kwargs: dict, bytes_per_element: int = 2,
                stacks: tuple[str, ...] | None = None, allow_unmapped_ops: bool = False):
    """Export ``model`` and turn its graph into a list of ``_Op`` (constants folded away).

    ``stacks`` names the module paths of the block stacks (``model.layers``): an op in
    ``STACK.i`` belongs to block i of that stack. None: the stacks are guessed from the path
    (``...layer|layers|h|block.i``), as the presets and the GDP models have always been captured.

    An aten op with no entry in the op table is an error naming it (its cost would be a guess);
    ``allow_unmapped_ops`` counts such ops as element-wise vector ops instead, with a warning that
    lists them, and the graph's ``meta["unmapped_ops"]`` keeps the list.

    A model whose parameters are bf16/fp16 (``models._capture_forward_graph`` casts a preset so when
    ``bytes_per_element`` is 2) is captured as it trains: a cast that changes the dtype is a ``copy``
    (``_moves_data``) and its fp32 side counts 4 bytes per element (``_nbytes``), as does any other
    fp32 tensor (softmax(dtype=float32)'s output). An fp32 model counts every float at
    ``bytes_per_element``, as before.
    """
    import torch

    half = next((p.dtype in (torch.bfloat16, torch.float16) for p in model.parameters()
                 if p.dtype.is_floating_point), False)
    wide = 4 if half and bytes_per_element < 4 else None

    def nbytes(v: Any) -> int:
        return _nbytes(v, bytes_per_element, wide)

    ep = torch.export.export(model, example_args, kwargs=example_kwargs, strict=False)
    _inline_wrapped_regions(ep)
    params: dict[str, int] = {}  # placeholder name -> numel
    shape_of: dict[str, tuple[int, ...]] = {}  # placeholder name -> shape
    fqn: dict[str, str] = {}  # placeholder name -> parameter path (model.layers.0.mlp.up_proj.weight)
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "PARAMETER":
            params[spec.arg.name] = 0
            fqn[spec.arg.name] = str(spec.target)
    user_inputs = {spec.arg.name for spec in ep.graph_signature.input_specs
                   if spec.kind.name == "USER_INPUT"}
    stack_order = sorted(stacks or (), key=len, reverse=True)
    ops: list[_Op] = []
    index: dict[str, int] = {}  # fx node name -> op index
    live: set[str] = set(user_inputs)  # values that depend on a model input or parameter
    root: dict[str, str] = {}  # parameter placeholders and shape-only views of them -> the parameter
    owned: set[str] = set()  # parameters already attributed to an op
    unmapped: dict[str, str] = {}  # aten op -> the module of its first occurrence
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in params:
                params[node.name] = _numel(node.meta.get("val"))
                shape_of[node.name] = tuple(int(x) for x in getattr(node.meta.get("val"), "shape", ()))
                live.add(node.name)
                root[node.name] = node.name
            elif node.name in user_inputs:
                v = node.meta.get("val")
                index[node.name] = len(ops)
                ops.append(_Op(node.name, "input", "", None, (0, 0, 0, 0), 0.0, 0.0, 0,
                               nbytes(v), 0, 0, [], _numel(v)))
            continue
        if node.op != "call_function":
            continue
        fx_args = [a for a in _flat_args(node.args) + _flat_args(list(node.kwargs.values()))
                   if hasattr(a, "op")]
        if not any(a.name in live for a in fx_args):
            continue  # a constant (masks from arange, rotary tables): folded like a buffer
        live.add(node.name)
        target = _target_name(node)
        if target in _CONSTANT_OPS:
            kind = "elementwise"
        elif target in _VIEW_OPS:
            kind = "view"
        elif target in _COPY_OPS | _GATHER_OPS | _COPY_UNLESS_VIEW | _COPY_IF_CAST:
            kind = "copy" if _moves_data(target, node, fx_args[0] if fx_args else None) else "view"
        else:
            kind = _ATEN_KIND.get(target)
            if kind is None:
                unmapped.setdefault(target, _module_path(node) or "model")
                kind = "elementwise"
        if kind == "attention_sdpa":
            raise ValueError("scaled_dot_product_attention found: build the model with "
                             "attn_implementation='eager' so attention splits into GEMMs and softmax")
        live_args = [a for a in fx_args if a.name in live]
        if (kind in ("view", "copy") or target.endswith("_")) and live_args and \
                all(a.name in root for a in live_args):
            # a view, cast or copy of a parameter (a transposed expert weight) is the parameter
            # itself: its bytes go to the op that computes with it; so is a parameter updated in place
            # from parameters and constants only (RWKV rescales its weights so in inference, not in a
            # training step)
            root[node.name] = root[live_args[0].name]
            continue
        if target in _GATHER_OPS and fx_args and fx_args[0].name in root:
            kind = "embedding"  # rows of a parameter picked by live indices (weight[ids]): a lookup
        val = node.meta.get("val")
        # argument position counts activations only, so x is arg 0 of linear(x, W) and addmm(b, x, W)
        act_args = list(zip([a for a in fx_args if a.name not in root], range(len(fx_args))))
        w_args = [a for a in fx_args if a.name in root]
        if kind == "matmul" and w_args:
            kind = "linear"  # x @ W with a parameter operand
        in_bytes = sum(nbytes(a.meta.get("val")) for a, _ in act_args)
        out_bytes = nbytes(val)
        out_numel = _numel(val)
        wbytes = 0
        for a in w_args:
            r = root[a.name]
            if r not in owned:
                owned.add(r)
                wbytes += params[r] * bytes_per_element
        read = tuple(dict.fromkeys(root[a.name] for a in w_args))  # each parameter once per op
        table_rows = 0
        info = OP_KINDS[kind]
        gemm = (0, 0, 0, 0)
        if kind in TENSOR_KINDS:
            gemm = _gemm(target, node, fx_args)
            flops = 2.0 * math.prod(gemm)
            vflops = 0.0
        elif info.core == "vector":
            work = max(out_numel, sum(_numel(a.meta.get("val")) for a, _ in act_args)
                       if kind in ("mean", "sum", "layernorm", "softmax", "cross_entropy") else 0)
            flops = vflops = info.flops_per_element * work
        else:
            flops = vflops = 0.0
        saved = {"input": in_bytes, "output": out_bytes}.get(info.saves, 0)
        if kind == "embedding":
            # a lookup reads the rows it gathers (at most the whole table), not the table: its input
            # bytes are the ids and those rows; it keeps the ids for the backward scatter-add
            table = sum(params[r] for r in read) * bytes_per_element
            table_rows = int(shape_of[read[0]][0]) if read else 0
            saved = in_bytes
            in_bytes += min(out_bytes, table) if read else out_bytes
        elif kind == "copy" and target in _GATHER_OPS:
            # a gather reads the elements it picks (its output's worth) and its indices, which it
            # keeps for the backward scatter-add
            idx = sum(nbytes(a.meta.get("val")) for a, _ in act_args[1:])
            in_bytes, saved = out_bytes + idx, idx
        module = _module_path(node)
        block = _block_of(module, stack_order) if stacks is not None else None
        if stacks is None:
            m = _BLOCK_RE.match(module)
            block = (m.group(1), int(m.group(2))) if m else None
        args = [(index[a.name], pos) for a, pos in act_args if a.name in index]
        index[node.name] = len(ops)
        ops.append(_Op(f"{module or 'model'}/{node.name}", kind, module, block, gemm, flops, vflops,
                       in_bytes, out_bytes, wbytes, saved, args, out_numel,
                       tuple(root[a.name] for a in w_args), tuple(fqn[root[a.name]] for a in w_args),
                       tuple((r, fqn[r], params[r] * bytes_per_element) for r in read), table_rows))
    if unmapped and not allow_unmapped_ops:
        listed = ", ".join(f"{op} (first in {mod})" for op, mod in sorted(unmapped.items()))
        raise UnmappedOpsError(
            f"unmapped aten ops {listed}: archplace has no cost model for them (map each in "
            "archplace/workloads/extract.py _ATEN_KIND), or allow them as element-wise ops with "
            "allow_unmapped_ops=True (CLI: --allow-unmapped-ops)")
    if unmapped:
        warnings.warn(f"unmapped aten ops counted as element-wise vector ops: {sorted(unmapped)}",
                      stacklevel=2)
    num_params = sum(params.values())
    return ops, num_params, sorted(unmapped)


_REGION_WRAPPERS = ("wrap_with_set_grad_enabled", "wrap_with_autocast")


def _inline_wrapped_regions(ep) -> None:
    """Inline the subgraphs that torch.export wraps ``torch.no_grad()`` and autocast regions in
    (higher-order ops holding a submodule), so that their ops are captured like any other: a forward
    run under ``no_grad`` (HRM's reasoning cycles, CPM-Ant's position buckets) still computes."""
    import operator

    gm, graph = ep.graph_module, ep.graph
    todo = True
    while todo:
        todo = False
        for node in list(graph.nodes):
            if node.op != "call_function" or getattr(node.target, "__name__", "") not in _REGION_WRAPPERS:
                continue
            pos = next(i for i, a in enumerate(node.args) if getattr(a, "op", None) == "get_attr")
            sub = getattr(gm, node.args[pos].target)
            env = dict(zip([n for n in sub.graph.nodes if n.op == "placeholder"], node.args[pos + 1:]))
            outs: Any = ()
            with graph.inserting_before(node):
                for n in sub.graph.nodes:
                    if n.op == "placeholder":
                        continue
                    if n.op == "output":
                        outs = n.args[0]
                        break
                    if n.op == "get_attr":  # a region nested in this one: its submodule moves up
                        name = f"_inlined_{len(list(gm.children()))}_{n.target}"
                        gm.add_submodule(name, getattr(sub, n.target))
                        env[n] = graph.get_attr(name)
                        continue
                    env[n] = graph.node_copy(n, env.__getitem__)
            outs = outs if isinstance(outs, (list, tuple)) else (outs,)
            for user in list(node.users):
                if user.op == "call_function" and user.target is operator.getitem:
                    user.replace_all_uses_with(env[outs[user.args[1]]])
                    graph.erase_node(user)
            if node.users:
                raise ValueError(f"cannot inline the {node.target.__name__} region {node.name}: it has "
                                 f"users other than getitem ({list(node.users)})")
            graph.erase_node(node)
            todo = True


def _block_of(module: str, stacks: list[str]) -> tuple[str, int] | None:
    """(stack, i) when ``module`` is inside block i of one of ``stacks`` (longest first)."""
    for st in stacks:
        rest = module[len(st) + 1:] if module.startswith(st + ".") else None
        if rest:
            head = rest.split(".", 1)[0]
            if head.isdigit():
                return (st, int(head))
    return None


def _flat_args(args) -> list:
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_flat_args(a))
        else:
            out.append(a)
    return out


SHARED_WEIGHTS = ("every_layer", "first_reader")


def _shared_weights(ops: list[_Op], layer_of: np.ndarray, layer_names: list[str], mode: str,
                    vocab_param: str = "") -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Each op's weight bytes and the parameters that several layers read (tied weights).

    ``every_layer``: the first reader of a parameter in each layer holds its bytes, so a tied
    embedding and LM head on different stages both hold (and read) the table; ``meta["shared_params"]``
    lists each such parameter once ({param, bytes, layers, vocab}: its path, its bytes per device,
    the layers holding it, whether it is the word embedding split by vocabulary), which counts every
    parameter once (``graph.shared_extra_bytes``) and tells the placement which layers share a
    gradient.
    ``first_reader``: only a parameter's first reader in the graph holds it (GDP graphs, whose
    co-location groups keep every reader of a weight on one device)."""
    if mode not in SHARED_WEIGHTS:
        raise ValueError(f"shared_weights {mode!r} unknown; allowed: {list(SHARED_WEIGHTS)}")
    if mode == "first_reader":
        return np.array([o.weight_bytes for o in ops], dtype=np.int64), []
    wbytes = np.zeros(len(ops), dtype=np.int64)
    held: dict[tuple[str, int], int] = {}  # (parameter, layer) -> its first reader there
    info: dict[str, tuple[str, int]] = {}
    for i, op in enumerate(ops):
        for r, path, nbytes in op.reads:
            info.setdefault(r, (path, nbytes))
            if (r, int(layer_of[i])) not in held:
                held[(r, int(layer_of[i]))] = i
                wbytes[i] += nbytes
    layers_of: dict[str, list[int]] = {}
    for r, li in held:
        layers_of.setdefault(r, []).append(li)
    shared = [{"param": info[r][0], "bytes": info[r][1], "layers": [layer_names[li] for li in lis],
               "vocab": r == vocab_param} for r, lis in layers_of.items() if len(lis) > 1]
    return wbytes, shared


def _vocab_ops(ops: list[_Op], layer_of: np.ndarray,
               layer_names: list[str]) -> tuple[np.ndarray, int, str]:
    """Ops split by vocabulary under tensor parallelism (Megatron's vocab-parallel embedding and LM
    head) and the vocabulary: the lookups of the largest embedding table outside the blocks (the
    word embedding), the GEMMs outside the blocks that read that table (a tied LM head), and the
    weighted GEMMs of the ``head`` layer with one output per vocabulary entry (an untied LM head)."""
    mask = np.zeros(len(ops), dtype=bool)
    lookups = [o for o in ops if o.kind == "embedding" and o.block is None and o.reads]
    if not lookups:
        return mask, 0, ""
    word = max(lookups, key=lambda o: sum(b for _, _, b in o.reads))
    table, vocab = word.reads[0][0], word.table_rows
    for i, o in enumerate(ops):
        if o.block is not None or not o.reads:
            continue
        reads_table = any(r == table for r, _, _ in o.reads)
        if o.kind == "embedding" and reads_table:
            mask[i] = True
        elif o.kind in TENSOR_KINDS and (reads_table or (layer_names[layer_of[i]] == "head"
                                                         and o.gemm[2] == vocab)):
            mask[i] = True
    return mask, vocab, table


def ops_to_graph(ops: list[_Op], meta: dict[str, Any], fuse: bool = True,
                 roles: dict[str, str] | None = None, shared_weights: str = "every_layer") -> OpGraph:
    """Assign layers (blocks by module path; the runs of other ops in execution order become
    ``embed``, ``head`` or a named layer in between), tag Megatron roles, fuse tensor→vector pairs.

    ``roles`` is the family's tensor-parallel table (``tp_roles.TP_ROLES``): each block GEMM with a
    weight takes its role from it; the block GEMMs left without one (not in the table, or a GEMM
    without weights outside every column→row span) are listed in ``meta["tp_unknown"]``, and
    ``slice_tensor_parallel`` refuses to slice such a graph. The word embedding's lookups and the LM
    head take the role ``vocab`` (``_vocab_ops``; ``meta["vocab_size"]``). ``shared_weights`` says
    which readers of a parameter hold its bytes (``_shared_weights``)."""
    from .tp_roles import weight_role

    table_role = [weight_role(o.param_paths[0], roles) if o.block is not None and o.param_paths
                  and o.kind in TENSOR_KINDS else None for o in ops]
    # ---- layers
    blocks = _with_loop_glue(ops)
    layer_names: list[str] = []
    layer_of = np.empty(len(ops), dtype=np.int32)
    block_layer: dict[tuple[str, int], int] = {}
    current = -1
    seen_block = False
    last_block_pos = max((i for i, b in enumerate(blocks) if b), default=-1)
    for i, op in enumerate(ops):
        if blocks[i] is not None:
            if blocks[i] not in block_layer:
                block_layer[blocks[i]] = len(layer_names)
                layer_names.append(f"{blocks[i][0]}.{blocks[i][1]}")
            current = block_layer[blocks[i]]
            seen_block = True
        elif current < 0 or ((op.module or i > last_block_pos) and _is_block_name(layer_names[current])):
            # a run of non-block ops starts: before all blocks, after them, or in between
            name = "embed" if not seen_block else "head" if i > last_block_pos else op.module
            layer_names.append(name)
            current = len(layer_names) - 1
        # ops of the root module join the run they execute in; after the last block, the head (so the
        # last block holds the ops every block holds, and copies of it stay exact)
        layer_of[i] = current
    vocab, vocab_size, table = _vocab_ops(ops, layer_of, layer_names)
    wbytes, shared = _shared_weights(ops, layer_of, layer_names, shared_weights, table)
    # ---- edges
    src, dst, arg = [], [], []
    for i, op in enumerate(ops):
        for j, pos in op.args:
            src.append(j)
            dst.append(i)
            arg.append(pos)
    src_a, dst_a = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    cols = {
        "id": np.arange(len(ops)), "name": np.array([o.name for o in ops], dtype=object),
        "kind": np.array([o.kind for o in ops], dtype=object),
        "layer": layer_of,
        "gemm_b": [o.gemm[0] for o in ops], "gemm_m": [o.gemm[1] for o in ops],
        "gemm_n": [o.gemm[2] for o in ops], "gemm_k": [o.gemm[3] for o in ops],
        "flops": [o.flops for o in ops], "vector_flops": [o.vector_flops for o in ops],
        "input_bytes": [o.in_bytes for o in ops], "output_bytes": [o.out_bytes for o in ops],
        "weight_bytes": wbytes, "saved_bytes": [o.saved_bytes for o in ops],
        "tp_role": np.array(["vocab" if v else r if r in ("col", "row") else ""
                             for r, v in zip(table_role, vocab)], dtype=object),
    }
    out_bytes = np.array([o.out_bytes for o in ops], dtype=np.int64)
    edges = {"src": src_a, "dst": dst_a, "bytes": out_bytes[src_a] if len(src_a) else [], "arg": arg}
    meta = dict(meta, layers=layer_names, shared_params=shared, vocab_size=vocab_size)
    g = OpGraph.from_columns(cols, edges, meta)
    from .transforms import fuse_tensor_vector, tag_tensor_parallel

    # roles first: an activation feeding a fused pair's vector part (the gate of a gated FFN into
    # ``up_proj+mul``) lies between the column and the row GEMM, which only the unfused graph shows
    g = tag_tensor_parallel(g)
    if fuse:
        g = fuse_tensor_vector(g)
    # block GEMMs with no known role: weighted ones the table misses, weightless ones outside
    # every column→row span (node ids are op indices; a fused node keeps its GEMM's id)
    nd = g.nodes
    unknown: list[str] = []
    for i, core, role in zip(nd["id"], nd["core"], nd["tp_role"]):
        op = ops[int(i)]
        if core in ("tensor", "fused") and op.block is not None and role == "" \
                and table_role[int(i)] is None and op.module not in unknown:
            unknown.append(op.module)
    g.meta["tp_unknown"] = unknown
    return g


def _with_loop_glue(ops: list[_Op]) -> list[tuple[str, int] | None]:
    """Each op's block, where the ops of the layer loop itself (ops of a module that holds the stack,
    or of the root, run between two blocks of the stack: XLNet's per-layer memory, Gemma-3n's
    per-layer input slices) belong to the block they run before, so that every block holds its own."""
    out = [op.block for op in ops]
    nxt: list[tuple[str, int] | None] = [None] * len(ops)
    after = None
    for i in range(len(ops) - 1, -1, -1):
        nxt[i] = after
        if ops[i].block is not None:
            after = ops[i].block
    prev: tuple[str, int] | None = None
    for i, op in enumerate(ops):
        if op.block is not None:
            prev = op.block
            continue
        b = nxt[i]
        if prev is not None and b is not None and prev[0] == b[0] and (
                op.module == "" or b[0].startswith(op.module + ".")):
            out[i] = b
    return out


def _is_block_name(name: str) -> bool:
    return bool(re.search(r"\.\d+$", name))
