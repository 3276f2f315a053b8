"""Measure a model's training step per archplace graph node: ``archplace profile`` and
``python -m archplace.workloads.op_profiler`` (an :class:`~archplace.workloads.op_profile.OpProfile`).

**What runs.** The model is built with real (seeded) weights on the local device (``cpu``, or ``cuda``
where there is one), in the dtype asked for, and captured with ``torch.export`` exactly as the graph
builders capture it on the meta device (``extract.capture_ops``; the same fx node names come out). One
training step is the exported program run op by op (forward; each value is dropped after its last
reader, as eager Python drops temporaries, so memory is reused as in the model's own step), a
cross-entropy loss over the largest output where the graph has a loss node (``models.append_loss``:
transformers models with a head, every GDP preset), the other outputs seeded with ones, and
autograd's backward. No optimizer: the archplace
graph has none. Dropout follows the graph (off in the transformers presets, which are captured in eval
mode; on in the GDP presets, captured in training mode).

**How it is timed** (``method``):

- ``timer`` (the CPU's default): this thread's CPU time (``time.thread_time``) around each exported op
  and, through autograd pre- and post-hooks, around each backward function; the step is measured the
  same way. On a machine shared with other processes, wall times swing by 2-5x with their load while
  thread CPU time does not count the time they take the core (it is the wall time of a one-thread
  step on an idle core): that is why the CPU uses it, with ``torch.set_num_threads(1)`` by default;
- ``profiler`` (CUDA's only method, and available on the CPU): ``torch.profiler``, each exported op in
  a profiler range of its own; an op's time is the CPU time of its range on ``cpu``, the CUDA kernel
  time launched from it on ``cuda`` (the profiler's device events, linked to their op by correlation
  id); backward functions are the ``autograd::engine::evaluate_function: XBackward0`` events. The step
  is then measured in wall time (``torch.cuda.synchronize`` around it on CUDA).

**The mapping** (measured time -> graph node, ``op_mapping.py``), per step:

- *forward*: the graph's forward node of an exported op's name gets that op's time; a fused node
  (``transforms.fuse_tensor_vector``: ``linear+gelu``) gets the time of its GEMM and of the ops it
  absorbed. Graphs whose block stacks were captured in part and replicated (``capture_blocks`` below
  the depth) are aligned row by row with a capture of every block (``stack_expand`` keeps the row
  order of a full capture; kinds and layers are checked), so the replicated blocks get their own
  measured times;
- *backward*: autograd gives each backward function the sequence number of the forward op that made
  it (the profiler's events carry it too). Every sequence number created while a forward op ran
  belongs to that op (the counter only grows, and nothing else runs in between), so each backward
  function's time goes to the forward op that made it. A node's backward rows
  (``backward.derive_backward``, ``fwd_id``) share it: the backward of a fused node's absorbed ops goes
  to ``/grad_vec``; the rest is split over the rows in proportion to their flops (bytes where they
  have none). PyTorch computes ``dgrad`` and ``wgrad`` inside one backward function, so that split is
  the only modelled part of the mapping;
- *unmapped* (``unmapped_s``): timed work that has no node: gradient accumulation into ``.grad``
  (``AccumulateGrad``), ops on constants the capture folds away (position ids, masks), views of
  parameters, the output seeds and loss of a graph without a loss node; ``details["unmapped_top_s"]``
  lists the largest. ``coverage`` = mapped / (mapped + unmapped).

Python between ops (the interpreter, the autograd engine's bookkeeping) is in no timed region: it is
the gap between ``profiled_step_s`` and ``measured_step_s`` (the model's own eager step, run without
instruments), and the profile reports both; nothing is rescaled.
Tiny models are dominated by that gap (a 64-wide Llama: the ops are 85-95% of its CPU step); at the
tested sizes the ops are the step within 10%. ``details`` also holds the exported program's step
without instruments, the instrumented step and the wall times. Each of the ``steps`` rounds after
``warmup`` times an eager step, the exported program's step and an instrumented step back to back; the
profile keeps the round whose ratio instrumented / eager is the median, with that round's node times and
its eager step as ``measured_step_s``. So the node times add up to a step that happened, and the two
steps compared ran seconds apart: on a loaded machine the time of a step drifts by more than 10% between
rounds (issue 30: the median eager step against the median instrumented one differed by 36% with the
test suite running beside it), while the two halves of one round see the same load.

Imports: torch, transformers, numpy and ``archplace.workloads`` only (no Ray, no pyarrow), and no
package metadata, so that ``PYTHONPATH=. python -m archplace.workloads.op_profiler`` runs from a
checkout on a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .graph import OpGraph
from .op_mapping import PREFIX as _PREFIX
from .op_mapping import Mapper
from .op_profile import BYTES_PER_ELEMENT, DEVICES, DTYPES, OpProfile


@dataclass
class _Workload:
    """What one profile needs: the graph whose names the profile keys on, a forward graph of the same
    model with every block captured (row-aligned with the graph's forward rows), the real model and
    its inputs."""
    name: str
    graph: OpGraph
    reference: OpGraph | None  # None: the graph's forward rows are themselves a capture of every block
    module: Any
    args: tuple
    kwargs: dict
    has_loss: bool
    seq: int | None


def _torch_dtype(dtype: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def _materialize(tree, device: str, float_dtype, high: int):
    """Meta-device example inputs -> real ones: token ids uniform in [0, high), floats standard normal
    (seeded by the caller)."""
    import torch
    from torch.utils import _pytree as pytree

    def real(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.dtype.is_floating_point:
            return torch.randn(tuple(t.shape), device=device).to(float_dtype)
        if t.dtype == torch.bool:
            return torch.ones(tuple(t.shape), dtype=torch.bool, device=device)
        return torch.randint(0, max(int(high), 1), tuple(t.shape), dtype=t.dtype, device=device)
    return pytree.tree_map(real, tree)


def _check(field: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{field} is {value!r}; allowed: {allowed}")


def _workload(model: str, *, device: str, dtype: str, mbs: int, seq: int | None,
              capture_blocks: int | None) -> _Workload:
    import torch

    from .gdp_models import GDP_PRESETS

    fdt = _torch_dtype(dtype)
    if model in GDP_PRESETS:
        from .gdp_models import build_module, example_inputs, gdp_graph, gdp_preset

        if dtype != "fp32":
            raise ValueError(f"dtype is {dtype!r}; GDP preset {model!r} is an fp32 graph: allowed: ['fp32']")
        from .models import CAPTURE_BLOCKS

        if capture_blocks not in (None, CAPTURE_BLOCKS):
            raise ValueError(f"capture_blocks applies to transformers models; GDP preset {model!r} is "
                             "captured whole")
        p = gdp_preset(model)
        g = gdp_graph(model, batch=mbs)
        gseq = g.meta.get("seq")
        if seq is not None and seq != gseq:
            raise ValueError(f"seq is {seq}; GDP preset {model!r} has its sequence fixed by the preset: "
                             f"allowed: {gseq}")
        module = build_module(p, device=device)
        args = _materialize(example_inputs(p, mbs), device, fdt, getattr(p.sizes, "vocab_tokens", 2))
        return _Workload(model, g, None, module, tuple(args), {}, True, gseq)
    import transformers

    from .models import CAPTURE_BLOCKS, build_graph, preset

    p = preset(model)
    seq = p.seq_len if seq is None else seq
    cb = CAPTURE_BLOCKS if capture_blocks is None else capture_blocks
    bpe = BYTES_PER_ELEMENT[dtype]
    g = build_graph(model, seq=seq, mbs=mbs, bytes_per_element=bpe, capture_blocks=cb)
    full = max([*p.depths.values(), 3])
    ref = build_graph(model, seq=seq, mbs=mbs, bytes_per_element=bpe, training=False,
                      capture_blocks=cb if cb >= full else full)
    cfg = p.make_config()
    with torch.device(device):
        module = getattr(transformers, p.model_class)(cfg)
    module = module.to(device=device, dtype=fdt).eval()  # eval: as captured (dropout off)
    args, kwargs = p.example_inputs(seq, mbs)
    high = getattr(cfg, "vocab_size", None) or getattr(getattr(cfg, "text_config", None), "vocab_size", 2)
    args, kwargs = _materialize((args, kwargs), device, fdt, high)
    return _Workload(model, g, ref, module, tuple(args), dict(kwargs), bool(p.has_loss), seq)


# ---------------------------------------------------------------------- the exported program
class _Program:
    """The exported program of the real model, run op by op (with or without profiler ranges)."""

    def __init__(self, w: _Workload):
        import torch
        from torch.utils import _pytree as pytree

        from .extract import _inline_wrapped_regions, _module_path

        ep = torch.export.export(w.module, w.args, kwargs=w.kwargs, strict=False)
        _inline_wrapped_regions(ep)
        self.ep = ep
        params = dict(w.module.named_parameters(remove_duplicate=False))
        buffers = dict(w.module.named_buffers(remove_duplicate=False))
        leaves = [x for x in pytree.tree_leaves((w.args, w.kwargs))]
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        specs = ep.graph_signature.input_specs
        n_user = sum(s.kind.name == "USER_INPUT" for s in specs)
        user = iter(tensors if n_user == len(tensors) else leaves)
        if n_user not in (len(tensors), len(leaves)):
            raise ValueError(f"model {w.name!r}: the exported program takes {n_user} inputs, the example "
                             f"has {len(tensors)} tensors")
        self.fixed: dict[Any, Any] = {}
        for node, spec in zip([n for n in ep.graph.nodes if n.op == "placeholder"], specs):
            kind = spec.kind.name
            if kind == "PARAMETER":
                self.fixed[node] = params[spec.target]
            elif kind == "BUFFER":
                self.fixed[node] = buffers.get(spec.target, ep.state_dict.get(spec.target))
            elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
                self.fixed[node] = ep.constants[spec.target]
            elif kind == "USER_INPUT":
                self.fixed[node] = next(user)
            else:
                raise ValueError(f"model {w.name!r}: exported input of kind {kind} is not supported")
        self.calls = [n for n in ep.graph.nodes if n.op == "call_function"]
        self.output = next(n for n in ep.graph.nodes if n.op == "output")
        self.names = [f"{_module_path(n) or 'model'}/{n.name}" for n in self.calls]
        # values dropped after op i, their last reader (as eager Python drops temporaries), so that memory
        # is reused as in the model's own step; autograd keeps what the backward needs
        last: dict[Any, int] = {}
        pos = {n: i for i, n in enumerate(self.calls)}
        for i, n in enumerate(self.calls):
            for a in n.all_input_nodes:
                if a in pos:
                    last[a] = i
        kept = set(self.output.all_input_nodes)
        self.drop: list[list[Any]] = [[] for _ in self.calls]
        for a, i in last.items():
            if a not in kept:
                self.drop[i].append(a)
        self.params = [p for p in params.values()]
        try:
            from torch._C._profiler import _RecordFunctionFast as ranges
        except ImportError:  # older torch
            from torch.autograd.profiler import record_function as ranges
        self._range = ranges
        self.labels = [f"{_PREFIX}{i}" for i in range(len(self.calls))]

    def forward(self, mode: str | None) -> tuple[list, np.ndarray, np.ndarray]:
        """Run the program. ``mode``: None (plain), "profiler" (each op in a profiler range) or "timer"
        (each op's thread CPU time). Returns the output leaves, per op the highest autograd sequence
        number it created (-1: none; not tracked when plain) and per op its seconds (timer)."""
        import torch
        from torch.fx.node import map_arg

        env = dict(self.fixed)
        get = env.__getitem__
        n = len(self.calls)
        top = np.full(n, -1, dtype=np.int64)
        secs = np.zeros(n)
        clock = time.thread_time
        last = -1
        for i, node in enumerate(self.calls):
            a = map_arg(node.args, get)
            kw = map_arg(node.kwargs, get)
            if mode is None:
                env[node] = node.target(*a, **kw)
            else:
                if mode == "profiler":
                    with self._range(self.labels[i]):
                        out = node.target(*a, **kw)
                else:
                    c = clock()
                    out = node.target(*a, **kw)
                    secs[i] = clock() - c
                env[node] = out
                for t in (out if isinstance(out, (tuple, list)) else (out,)):
                    fn = t.grad_fn if isinstance(t, torch.Tensor) else None
                    if fn is not None:
                        s = fn._sequence_nr()
                        if s > last:
                            top[i] = max(top[i], s)
                if top[i] > last:
                    last = int(top[i])
                out = t = fn = None
            a = kw = None
            for x in self.drop[i]:
                del env[x]
        from torch.utils import _pytree as pytree

        return pytree.tree_leaves(map_arg(self.output.args[0], get)), top, secs


def _time_backward(roots: list, base: int) -> tuple[dict[int, float], list]:
    """Hooks on every autograd function made after sequence number ``base`` and on the gradient
    accumulators (key -1) that add its thread CPU time, keyed by sequence number, to the returned dict
    as backward runs; and the hook handles (remove them after the backward: accumulators outlive it)."""
    clock = time.thread_time
    acc: dict[int, float] = {}
    handles: list = []
    seen: set = set()
    todo = [r.grad_fn for r in roots if r.grad_fn is not None]
    while todo:
        fn = todo.pop()
        if fn is None:
            continue
        grad_acc = type(fn).__name__ == "AccumulateGrad"
        ident = ("acc", id(fn.variable)) if grad_acc else fn._sequence_nr()
        if ident in seen or (not grad_acc and ident <= base):
            continue  # seen, or made before this step
        seen.add(ident)
        key = -1 if grad_acc else ident
        start = [0.0]

        def pre(_grads, start=start):
            start[0] = clock()

        def post(_gi, _go, start=start, key=key):
            acc[key] = acc.get(key, 0.0) + clock() - start[0]
        handles += [fn.register_prehook(pre), fn.register_hook(post)]
        todo.extend(f for f, _ in fn.next_functions)
    return acc, handles


def _loss_and_seeds(outs: list, has_loss: bool, labels):
    """The step's backward roots: first the cross-entropy of the largest floating output (when the graph
    has a loss node), then every other differentiable output, seeded with ones."""
    import torch
    import torch.nn.functional as F

    outs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    big = max(range(len(outs)), key=lambda i: outs[i].numel()) if outs and has_loss else -1
    roots, grads = [], []
    if big >= 0:
        o = outs[big]
        roots.append(F.cross_entropy(o.reshape(-1, o.shape[-1]).float(), labels))
        grads.append(None)
    for i, o in enumerate(outs):
        if i != big:
            roots.append(o)
            grads.append(torch.ones_like(o))
    return roots, grads


# ---------------------------------------------------------------------- the profile
def _software(device: str) -> tuple[str, dict]:
    import torch
    import transformers

    sw = {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
          "python": platform.python_version()}
    if device == "cuda":
        sw["cuda"] = torch.version.cuda
        sw["cudnn"] = torch.backends.cudnn.version()
        sw["driver"] = _driver_version()
        return torch.cuda.get_device_name(), sw
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), name)
    except OSError:
        pass
    return name, sw


def _driver_version() -> str:
    import subprocess

    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


METHODS = ("timer", "profiler")


def profile_model(model: str, *, device: str = "cpu", dtype: str = "fp32", mbs: int = 1,
                  seq: int | None = None, capture_blocks: int | None = None, method: str | None = None,
                  steps: int = 5, warmup: int = 2, threads: int | None = 1, seed: int = 0,
                  log: Callable[[str], None] | None = None) -> OpProfile:
    """Profile one training step of ``model`` (a transformers preset, an ``hf:PATH`` config reference
    or a GDP preset) per node of its graph (module docstring). After ``warmup`` rounds, ``steps``
    rounds each time the eager model's step and the exported program's step without instruments, and
    one instrumented step (``method``: "timer" = thread CPU time per op, CPU only and its default;
    "profiler" = torch.profiler, the only one on CUDA). ``threads``: torch's intra-op threads on the
    CPU (None: leave torch's setting)."""
    import torch

    _check("device", device, device in DEVICES, str(list(DEVICES)))
    _check("dtype", dtype, dtype in DTYPES, str(list(DTYPES)))
    cuda = device == "cuda"
    method = method or ("profiler" if cuda else "timer")
    _check("method", method, method in (("profiler",) if cuda else METHODS),
           "['profiler'] on cuda" if cuda else str(list(METHODS)))
    for f, v, low in (("mbs", mbs, 1), ("steps", steps, 1), ("warmup", warmup, 0), ("seed", seed, 0)):
        _check(f, v, isinstance(v, int) and not isinstance(v, bool) and v >= low, f"an integer >= {low}")
    if seq is not None:
        _check("seq", seq, isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1,
               "a positive integer")
    if threads is not None:
        _check("threads", threads, isinstance(threads, int) and threads >= 1, "a positive integer or None")
    if cuda and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but torch sees no CUDA device here; allowed: ['cpu']")
    say = log or (lambda s: None)
    if threads is not None and not cuda:
        torch.set_num_threads(threads)
    if dtype == "fp32" and cuda:  # fp32 means fp32: no TF32 tensor cores (the GDP measurements' setting)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    w = _workload(model, device=device, dtype=dtype, mbs=mbs, seq=seq, capture_blocks=capture_blocks)
    say(f"graph {w.graph.num_nodes} nodes, model built ({time.perf_counter() - t0:.1f} s)")
    prog = _Program(w)
    mapper = Mapper(w, prog)
    say(f"exported {len(prog.calls)} ops ({time.perf_counter() - t0:.1f} s)")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():  # the outputs' shapes (no graph kept: on a GPU it would hold the activations)
        outs = _leaves(w.module(*w.args, **w.kwargs))
        shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]
        del outs
    logits = max(shapes, key=lambda s: int(np.prod(s))) if shapes else None
    gen = torch.Generator(device="cpu").manual_seed(seed)
    labels = None if not logits else torch.randint(
        0, int(logits[-1]), (int(np.prod(logits)) // int(logits[-1]),), generator=gen).to(device)
    params = prog.params
    probe_leaf = torch.zeros((), requires_grad=True)

    def clear() -> None:
        for p in params:
            p.grad = None

    def timed(fn) -> tuple[float, float]:
        """(wall, this thread's CPU time) of ``fn()``, the device synchronised around it."""
        clear()
        sync()
        s, c = time.perf_counter(), time.thread_time()
        fn()
        sync()
        return time.perf_counter() - s, time.thread_time() - c

    def eager_step() -> None:
        roots, grads = _loss_and_seeds(_leaves(w.module(*w.args, **w.kwargs)), w.has_loss, labels)
        torch.autograd.backward(roots, grads)

    def program_step() -> None:
        roots, grads = _loss_and_seeds(prog.forward(None)[0], w.has_loss, labels)
        torch.autograd.backward(roots, grads)

    def instrumented_step():
        clear()
        base = int((probe_leaf * 1.0).grad_fn._sequence_nr())  # the counter before this forward
        if method == "timer":
            s, c = time.perf_counter(), time.thread_time()
            outs, top, fwd = prog.forward("timer")
            lc = time.thread_time()
            roots, grads = _loss_and_seeds(outs, w.has_loss, labels)
            loss_f = time.thread_time() - lc
            acc, handles = _time_backward(roots, base)
            torch.autograd.backward(roots, grads)
            wall, cpu = time.perf_counter() - s, time.thread_time() - c
            for h in handles:
                h.remove()
            hi = roots[0].grad_fn._sequence_nr() if w.has_loss and roots else -1
            res = mapper.from_timer(fwd, loss_f, acc, top, base, (int(top.max(initial=base)), hi))
            return res, wall, cpu
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        sync()
        with profile(activities=acts) as prof:
            s, c = time.perf_counter(), time.thread_time()
            outs, top, _ = prog.forward("profiler")
            with prog._range(_PREFIX + "loss"):
                roots, grads = _loss_and_seeds(outs, w.has_loss, labels)
            torch.autograd.backward(roots, grads)
            sync()
            wall, cpu = time.perf_counter() - s, time.thread_time() - c
        hi = roots[0].grad_fn._sequence_nr() if w.has_loss and roots else -1
        return mapper.from_events(prof.events(), top, base, (int(top.max(initial=base)), hi), cuda), wall, cpu

    for _ in range(warmup):
        timed(eager_step)
        timed(program_step)
        instrumented_step()
    # the step's measure: the method's (module docstring): wall time with the profiler (synchronised
    # on CUDA), thread CPU time with the timer; both are in `details`
    pick = 0 if method == "profiler" else 1
    eager, program, inst, rows, unm, infos = [], [], [], [], [], []
    for k in range(steps):
        e = timed(eager_step)
        q = timed(program_step)
        (t, u, info), wall, cpu = instrumented_step()
        eager.append(e)
        program.append(q)
        inst.append((wall, cpu))
        rows.append(t)
        unm.append(u)
        infos.append(info)
        say(f"step {k + 1}/{steps}: eager {e[pick] * 1e3:.1f} ms, exported {q[pick] * 1e3:.1f} ms, "
            f"{method} ops {(t.sum() + u) * 1e3:.1f} ms (wall: {e[0] * 1e3:.1f}, {q[0] * 1e3:.1f}, "
            f"{wall * 1e3:.1f} ms)")
    # the round whose instrumented / eager ratio is the median (an odd count: the middle one; an even
    # one: the lower middle): its node times add up to a step that happened, and its eager step ran just
    # before them under the same load (module docstring)
    totals = [float(t.sum()) + u for t, u in zip(rows, unm)]
    ratios = [tot / e[pick] if e[pick] > 0 else float("inf") for tot, e in zip(totals, eager)]
    mid = int(np.argsort(ratios, kind="stable")[(len(ratios) - 1) // 2])
    time_s, unmapped = rows[mid], unm[mid]
    mapped = float(time_s.sum())
    measured = float(eager[mid][pick])

    def med(xs, i):
        return float(statistics.median(x[i] for x in xs))
    device_name, sw = _software(device)
    details = {"method": method, "step_measure": "wall" if pick == 0 else "thread cpu time",
               "steps": steps, "warmup": warmup, "threads": torch.get_num_threads() if not cuda else None,
               "seed": seed, "capture_blocks": capture_blocks,
               "eager_step_s": [x[pick] for x in eager], "measured_wall_s": med(eager, 0),
               "measured_cpu_s": med(eager, 1), "exported_step_s": med(program, pick),
               "instrumented_step_s": med(inst, pick), "instrumented_wall_s": med(inst, 0),
               "exported_cpu_s": med(program, 1), "instrumented_cpu_s": med(inst, 1),
               "profiled_over_measured": (mapped + unmapped) / measured if measured > 0 else None,
               "profiled_steps_s": totals, "profiled_step_index": mid, "round_ratios": ratios,
               "median_eager_step_s": med(eager, pick),
               "graph_nodes": w.graph.num_nodes, "exported_ops": len(prog.calls),
               "nodes_without_time": int((time_s == 0).sum()), **infos[mid]}
    return OpProfile(model=w.name, device=device, device_name=device_name, dtype=dtype, mbs=mbs, seq=w.seq,
                     names=tuple(str(n) for n in w.graph.nodes["name"]), time_s=time_s,
                     measured_step_s=measured, profiled_step_s=mapped + unmapped, unmapped_s=unmapped,
                     coverage=mapped / (mapped + unmapped) if mapped + unmapped > 0 else 0.0,
                     software=sw, details=details)


def _leaves(out) -> list:
    from torch.utils import _pytree as pytree

    if hasattr(out, "to_tuple"):  # a transformers ModelOutput
        out = out.to_tuple()
    return pytree.tree_leaves(out)


# ---------------------------------------------------------------------- command line
def summary(p: OpProfile, top: int = 10) -> dict[str, Any]:
    """The ``--json`` answer of ``archplace profile`` (the profile itself is in the file)."""
    return {"model": p.model, "device": p.device, "device_name": p.device_name, "dtype": p.dtype,
            "mbs": p.mbs, "seq": p.seq, "nodes": len(p.names), "measured_step_s": p.measured_step_s,
            "profiled_step_s": p.profiled_step_s, "unmapped_s": p.unmapped_s, "coverage": p.coverage,
            "profiled_over_measured": p.profiled_step_s / p.measured_step_s if p.measured_step_s else None,
            "exported_step_s": p.details.get("exported_step_s"),
            "profiler_wall_s": p.details.get("profiler_wall_s"), "top_ops": p.top(top),
            "software": p.software}


def print_summary(d: dict[str, Any], out: str | None = None) -> None:
    print(f"{d['model']} on {d['device']} ({d['device_name']}), {d['dtype']}, mbs {d['mbs']}, "
          f"seq {d['seq']}: {d['nodes']} nodes")
    print(f"  measured step {d['measured_step_s'] * 1e3:.2f} ms (eager, no instruments); profiled "
          f"{d['profiled_step_s'] * 1e3:.2f} ms = {d['profiled_over_measured']:.3f}x; unmapped "
          f"{d['unmapped_s'] * 1e3:.2f} ms; coverage {d['coverage']:.1%}")
    print("  top ops:")
    for t in d["top_ops"]:
        print(f"    {t['time_s'] * 1e3:9.3f} ms  {t['share']:6.1%}  {t['name']}")
    if out:
        print(f"  profile written to {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m archplace.workloads.op_profiler",
                                 description="Profile a model's training step per archplace graph node.")
    ap.add_argument("model", nargs="?", help="transformers preset or GDP preset (or --hf-config)")
    ap.add_argument("--hf-config", help="a transformers config.json")
    ap.add_argument("--device", default="cpu", choices=DEVICES)
    ap.add_argument("--dtype", default="fp32", choices=DTYPES)
    ap.add_argument("--mbs", type=int, default=1)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--capture-blocks", type=int)
    ap.add_argument("--method", choices=METHODS, help="timer (CPU default) or profiler (CUDA: the only one)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        if (a.model is None) == (a.hf_config is None):
            raise ValueError("give MODEL or --hf-config FILE (one of them)")
        model = a.model
        if a.hf_config:
            from .hf_config import hf_ref

            model = hf_ref(a.hf_config)
        prof = profile_model(model, device=a.device, dtype=a.dtype, mbs=a.mbs, seq=a.seq,
                             capture_blocks=a.capture_blocks, method=a.method, steps=a.steps, warmup=a.warmup,
                             threads=a.threads or None, seed=a.seed,
                             log=None if a.json else (lambda s: print(s, file=sys.stderr)))
        path = prof.save(a.out)
    except ValueError as e:
        print(f"op_profiler: error: {e}", file=sys.stderr)
        return 2
    d = dict(summary(prof), out=str(path))
    if a.json:
        print(json.dumps(d, indent=1))
    else:
        print_summary(d, str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
