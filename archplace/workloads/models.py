"""Model presets (configs written in code from their published values) and ``build_graph``.

The workloads of the Phaze paper's Table 2 (spec ``phaze.md`` §6) plus bert-base and t5-base.
Megatron GPT models use the GPT-2 architecture (Megatron-LM's GPT is GPT-2 with its own widths).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from .backward import derive_backward
from .capture_cache import cached_graph
from .extract import UnmappedOpsError, capture_ops, ops_to_graph
from .graph import OpGraph
from .hf_config import attention_heads, hf_model, is_hf_ref
from .transforms import slice_tensor_parallel

CAPTURE_BLOCKS = 3  # default leading blocks captured per stack (more where the block kinds need them)


@dataclass(frozen=True)
class ModelPreset:
    name: str
    family: str  # bert | gpt2 | opt | llama | t5
    model_class: str  # transformers class
    seq_len: int
    config: dict[str, Any]
    tmp_widths: tuple[int, ...]
    source: str
    layer_keys: tuple[str, ...] = field(default=())  # config fields holding stack depths

    def make_config(self, **overrides):
        import transformers

        cls = getattr(transformers, {"bert": "BertConfig", "gpt2": "GPT2Config", "opt": "OPTConfig",
                                     "llama": "LlamaConfig", "t5": "T5Config"}[self.family])
        return cls(**{**self.config, **overrides}, attn_implementation="eager")

    @property
    def depths(self) -> dict[str, int]:
        return {k: self.config[k] for k in self.layer_keys}

    @property
    def max_positions(self) -> int | None:
        """The most positions the model embeds (``None``: T5's relative positions), read from the preset
        alone: ``build_graph`` checks ``seq`` against it without importing transformers (and torch), so
        a process whose graphs all come from ``capture_cache`` never loads them. Equal to the
        transformers config's ``n_positions`` / ``max_position_embeddings`` (tests/test_capture_cache)."""
        c = self.config
        return (c.get("n_positions") or c.get("max_position_embeddings")
                or _DEFAULT_MAX_POSITIONS.get(self.family))

    # the interface the graph builder shares with hf_config.HfModel (a model from a config file)
    allow_unmapped_ops = False
    fingerprint = ""

    @property
    def stacks(self) -> dict[str, int]:
        """Block stack path -> depth in the full model."""
        return {_STACKS[self.family][k]: v for k, v in self.depths.items()}

    @property
    def has_loss(self) -> bool:
        return self.family in _HAS_LOSS

    @property
    def roles(self) -> dict[str, str]:
        from .tp_roles import TP_ROLES

        return TP_ROLES[self.family]

    def build_model(self, capture_blocks: int | None = None):
        """The model on the meta device, each stack at most ``capture_blocks`` deep if given."""
        import torch
        import transformers

        over = {} if capture_blocks is None else {k: min(v, capture_blocks) for k, v in self.depths.items()}
        with torch.device("meta"):
            model = getattr(transformers, self.model_class)(self.make_config(**over))
        model.eval()  # dropout stays in the graph (aten.dropout with train=False is still captured)
        return model

    def example_inputs(self, seq: int, mbs: int) -> tuple[tuple, dict[str, Any]]:
        import torch

        ids = torch.zeros((mbs, seq), dtype=torch.long, device="meta")
        kwargs: dict[str, Any] = {}
        if self.family in _HAS_LOSS:
            kwargs["use_cache"] = False
        if self.family == "t5":
            kwargs["decoder_input_ids"] = ids
        return (ids,), kwargs


# transformers' default where a preset's config leaves the field out (BertConfig.max_position_embeddings)
_DEFAULT_MAX_POSITIONS = {"bert": 512}


def _gpt(n_layer: int, n_embd: int, n_head: int, seq: int, act: str = "gelu") -> dict:
    return dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=seq, vocab_size=50257,
                activation_function=act)


PRESETS: dict[str, ModelPreset] = {p.name: p for p in [
    ModelPreset("bert-base", "bert", "BertModel", 512,
                dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072), (1, 2, 4), "Devlin et al. 2019, BERT-Base",
                ("num_hidden_layers",)),
    ModelPreset("bert-large", "bert", "BertModel", 512,
                dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                     intermediate_size=4096), (1, 2, 4, 8), "Devlin et al. 2019, BERT-Large",
                ("num_hidden_layers",)),
    ModelPreset("gpt2-xl", "gpt2", "GPT2LMHeadModel", 1024, _gpt(48, 1600, 25, 1024, "gelu_new"),
                (1,), "Radford et al. 2019, GPT-2 XL (48 layers, 25 heads, hidden 1600)", ("n_layer",)),
    ModelPreset("opt-350m", "opt", "OPTForCausalLM", 2048,
                dict(hidden_size=1024, num_hidden_layers=24, ffn_dim=4096, num_attention_heads=16,
                     word_embed_proj_dim=512, do_layer_norm_before=False, vocab_size=50272,
                     max_position_embeddings=2048), (1, 2, 4, 8), "Zhang et al. 2022, OPT-350M",
                ("num_hidden_layers",)),
    ModelPreset("llama2-7b", "llama", "LlamaForCausalLM", 4096,
                dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                     max_position_embeddings=4096, rms_norm_eps=1e-5),
                (1, 2, 4, 8), "Touvron et al. 2023, Llama 2 7B", ("num_hidden_layers",)),
    ModelPreset("t5-base", "t5", "T5ForConditionalGeneration", 512,
                dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_decoder_layers=12,
                     num_heads=12, vocab_size=32128), (1, 2, 4), "Raffel et al. 2020, T5-Base",
                ("num_layers", "num_decoder_layers")),
    # Auto-MAP's Table 1 models (spec automap.md §11): BERT-48 is BERT-Large made 48 layers deep
    # (640M parameters); T5-3B / T5-11B are the published T5 sizes.
    ModelPreset("bert-48", "bert", "BertModel", 512,
                dict(hidden_size=1024, num_hidden_layers=48, num_attention_heads=16,
                     intermediate_size=4096), (1,), "Auto-MAP Table 1, BERT-48 (BERT-Large, 48 layers)",
                ("num_hidden_layers",)),
    ModelPreset("t5-3b", "t5", "T5ForConditionalGeneration", 512,
                dict(d_model=1024, d_ff=16384, d_kv=128, num_layers=24, num_decoder_layers=24,
                     num_heads=32, vocab_size=32128), (1,), "Raffel et al. 2020, T5-3B",
                ("num_layers", "num_decoder_layers")),
    ModelPreset("t5-11b", "t5", "T5ForConditionalGeneration", 512,
                dict(d_model=1024, d_ff=65536, d_kv=128, num_layers=24, num_decoder_layers=24,
                     num_heads=128, vocab_size=32128), (1,), "Raffel et al. 2020, T5-11B",
                ("num_layers", "num_decoder_layers")),
    ModelPreset("megatron-2.5b", "gpt2", "GPT2LMHeadModel", 1024, _gpt(54, 1920, 20, 1024),
                (1, 2, 4), "Shoeybi et al. 2019, Megatron-LM GPT-2 2.5B (54 layers)", ("n_layer",)),
    ModelPreset("megatron-8.3b", "gpt2", "GPT2LMHeadModel", 1024, _gpt(72, 3072, 32, 1024),
                (1, 2, 4, 8), "Shoeybi et al. 2019, Megatron-LM GPT-2 8.3B (72 layers)", ("n_layer",)),
    ModelPreset("gpt3-175b", "gpt2", "GPT2LMHeadModel", 2048, _gpt(96, 12288, 96, 2048),
                (1, 2, 4, 8), "Brown et al. 2020, GPT-3 175B (96 layers, hidden 12288)", ("n_layer",)),
]}

# The experts' {p, d, t} for 1024 accelerators and a global batch of 4096 (Phaze Table 4, spec
# phaze.md §8.3): the reference placements that searched placements are compared against.
EXPERT_STRATEGIES: dict[str, tuple[int, int, int]] = {
    "opt-350m": (12, 85, 1),
    "bert-large": (8, 128, 1),
    "gpt2-xl": (32, 32, 1),
    "llama2-7b": (8, 128, 1),
    "megatron-2.5b": (8, 32, 4),
    "megatron-8.3b": (8, 16, 8),
    "gpt3-175b": (32, 8, 4),
}

# which block stack each depth field grows, by family (module path prefix of the blocks)
_STACKS = {
    "bert": {"num_hidden_layers": "encoder.layer"},
    "gpt2": {"n_layer": "transformer.h"},
    "opt": {"num_hidden_layers": "model.decoder.layers"},
    "llama": {"num_hidden_layers": "model.layers"},
    "t5": {"num_layers": "encoder.block", "num_decoder_layers": "decoder.block"},
}
_HAS_LOSS = {"gpt2", "opt", "llama", "t5"}  # models with an LM head get a cross-entropy loss op


def preset(name: str):
    """The preset ``name``, or the model of an ``hf:PATH`` reference (``hf_config.hf_ref``): a
    ``ModelPreset`` or a ``hf_config.HfModel``, which share what the graph builders use."""
    if is_hf_ref(name):
        return hf_model(name)
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; known models: {sorted(PRESETS)}, or a transformers "
                         "config as hf:PATH (CLI: --hf-config PATH)") from None


def full_model_parameters(name: str) -> int:
    """Parameter count that transformers reports for the full model (built on the meta device)."""
    return preset(name).build_model().num_parameters()


@functools.lru_cache(maxsize=32)
def _forward_graph(name: str, seq: int, mbs: int, bytes_per_element: int, capture_blocks: int,
                   fuse: bool, fingerprint: str = "") -> OpGraph:
    """:func:`_capture_forward_graph`, kept per process (this ``lru_cache``) and across processes
    (``capture_cache``: the CLI, Ray workers and subprocesses would otherwise each capture again)."""
    identity = {"name": name, "seq": seq, "mbs": mbs, "bytes_per_element": bytes_per_element,
                "capture_blocks": capture_blocks, "fuse": fuse, "fingerprint": fingerprint}
    return cached_graph("forward", identity, lambda: _capture_forward_graph(
        name, seq, mbs, bytes_per_element, capture_blocks, fuse))


def _capture_forward_graph(name: str, seq: int, mbs: int, bytes_per_element: int, capture_blocks: int,
                           fuse: bool) -> OpGraph:
    """The full-depth forward graph: the full model is built on the meta device, each block stack cut
    to the leading blocks that hold every kind of block it has (``block_kinds``), captured, grown back
    block kind by block kind (``stack_expand``), and its parameters checked against the model's.
    (:func:`_forward_graph`'s ``fingerprint``, the content hash of an ``hf:`` config file, keys both
    caches, so that an edited file is captured again.)"""
    import torch.nn as nn
    import transformers

    from .block_kinds import (
        capture_depths,
        check_parameters,
        model_census,
        truncate_stacks,
        unread_parameters,
    )
    from .stack_expand import expand_stack

    p = preset(name)
    stacks = p.stacks
    model = p.build_model()
    if bytes_per_element == 2:
        # captured as a bf16 run trains: the model's own fp32 islands (softmax(dtype=float32), the
        # norms' upcasts) and the casts around them are real kernels and fp32 bytes (extract.capture_ops);
        # an fp32 capture would see every cast as a no-op view. fp16 runs share it (PyTorch's fused
        # half->float softmax aside)
        import torch

        model = model.to(torch.bfloat16)
    modules = dict(model.named_modules())
    for st, total in stacks.items():
        got = modules.get(st)
        if not isinstance(got, nn.ModuleList):
            raise ValueError(f"model {name!r}: block stack {st!r} not found in {p.model_class}")
        if len(got) != total:
            raise ValueError(f"model {name!r}: stack {st!r} has {len(got)} blocks, its config {total}")
    census = model_census(model, stacks)
    depth_values = set(p.depths.values())
    captured = capture_depths(census, capture_blocks, [st for st, n in stacks.items() if n in depth_values])
    truncate_stacks(model, captured)
    args, kwargs = p.example_inputs(seq, mbs)
    try:
        ops, _, unmapped = capture_ops(model, args, kwargs, bytes_per_element, stacks=tuple(stacks),
                                       allow_unmapped_ops=p.allow_unmapped_ops)
    except UnmappedOpsError:
        raise
    except Exception as e:  # noqa: BLE001 - torch.export of a user's config: one line, not a traceback
        if isinstance(e, ValueError) and "attn_implementation='eager'" in str(e):
            raise
        msg = (str(e).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"model {name!r}: torch.export of {p.model_class} failed: "
                         f"{type(e).__name__}: {msg}") from e
    meta = {"model": name, "source": f"transformers {transformers.__version__} "
            f"{p.model_class}", "family": p.family, "seq": seq, "mbs": mbs, "tmp": 1,
            "bytes_per_element": bytes_per_element, "unmapped_ops": unmapped,
            "captured_blocks": captured, "blocks": dict(stacks),
            "heads": attention_heads(p.make_config()),
            "block_kinds": {st: list(census.stacks[st].kinds) for st in stacks}}
    g = ops_to_graph(ops, meta, fuse=fuse, roles=p.roles)
    missing = [f"{st}.{j}" for st, n in captured.items() for j in range(n)
               if f"{st}.{j}" not in g.meta["layers"]]
    if missing:
        raise ValueError(f"model {name!r}: captured block(s) {missing[:3]} ran no op in the forward pass "
                         f"of {p.model_class}")
    if p.has_loss:
        g = append_loss(g)
    for st in stacks:
        g = expand_stack(g, st, census.stacks[st].kinds)
    check_parameters(g, census, name, unread_parameters(model, (p for op in ops for p in op.param_paths)))
    return g


def append_loss(g: OpGraph) -> OpGraph:
    """Cross-entropy over the logits (the op with the largest output among the sinks)."""
    import numpy as np

    src, _ = g.edge_pos
    sinks = np.setdiff1d(np.arange(g.num_nodes), src)
    logits = sinks[np.argmax(g.nodes["output_bytes"][sinks])]
    nd = g.nodes
    lb = int(nd["output_bytes"][logits])
    elems = lb / g.meta["bytes_per_element"]
    new_id = int(nd["id"].max()) + 1
    row = dict(id=new_id, name="loss/cross_entropy", kind="cross_entropy", core="vector",
               layer=int(nd["layer"][logits]), flops=5.0 * elems, vector_flops=5.0 * elems,
               input_bytes=lb, output_bytes=4, saved_bytes=lb)
    cols = {c: np.concatenate([v, np.array([row.get(c, "" if v.dtype == object else
                                                    (-1 if c == "fwd_id" else 0))], dtype=v.dtype)])
            for c, v in nd.items()}
    edges = {k: np.concatenate([v, np.array([{"src": nd["id"][logits], "dst": new_id, "bytes": lb,
                                              "arg": 0}[k]], dtype=v.dtype)])
             for k, v in g.edges.items()}
    return OpGraph(cols, edges, dict(g.meta))


_append_loss = append_loss  # the name corpus.py and gdp_models.py import


def build_graph(name: str, seq: int | None = None, mbs: int = 1, tmp: int = 1, training: bool = True,
                bytes_per_element: int = 2, capture_blocks: int = CAPTURE_BLOCKS,
                fuse: bool = True) -> OpGraph:
    """The operator graph of preset ``name`` (or of a config file's ``hf:PATH`` reference, see
    ``byom.from_hf_config``): one device's TMP slice of width ``tmp`` at microbatch
    ``mbs`` and sequence ``seq`` (the preset's by default), with the backward pass when
    ``training``."""
    p = preset(name)
    seq = p.seq_len if seq is None else seq
    for field_name, value, allowed in (("mbs", mbs, None), ("seq", seq, None),
                                       ("bytes_per_element", bytes_per_element, (1, 2, 4))):
        if not isinstance(value, int) or value < 1 or (allowed and value not in allowed):
            raise ValueError(f"{field_name} must be a positive integer"
                             f"{' in ' + str(allowed) if allowed else ''}, got {value!r}")
    max_pos = p.max_positions
    if isinstance(max_pos, int) and max_pos > 0 and seq > max_pos:
        raise ValueError(f"seq {seq} exceeds {name}'s maximum of {max_pos} positions")
    if not isinstance(capture_blocks, int) or isinstance(capture_blocks, bool) or capture_blocks < 3:
        raise ValueError(f"capture_blocks must be an integer >= 3 (block 0 can differ; two more give the "
                         f"pattern), got {capture_blocks!r}")
    g = _forward_graph(name, seq, mbs, bytes_per_element, capture_blocks, fuse, p.fingerprint)
    g = slice_tensor_parallel(g, tmp)
    return derive_backward(g) if training else g

