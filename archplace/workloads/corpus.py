"""The graph corpus for MCM partitioning pre-training and transfer (spec mcm.md §3, checklist §7).

The paper pre-trains on 87 CNN/RNN graphs of "tens to hundreds of nodes" split 66 / 5 / 16 into
train / validation / test and deploys on BERT. Its graphs are not published, so ours are built from
the foundation's sources, 87 graphs in five families:

=============  =====  ==========================================================================
family         count  source
=============  =====  ==========================================================================
synthetic         40  ``synthetic.layered_dag``: 30-300 ops, widths 2-8, skips up to 3 levels
cnn               26  ``synthetic.cnn_graph``: 2-12 residual / inception blocks (20-300 ops)
rnn                5  ``synthetic.rnn_graph`` with the plain tanh cell, 8-40 unrolled steps
lstm               6  ``synthetic.rnn_graph`` with the LSTM cell, 3-10 unrolled steps
transformer       10  real ``transformers`` models (BERT, GPT-2, OPT, Llama, T5) at small widths
                      and 1-3 blocks, exported like ``models.build_graph`` (forward only)
=============  =====  ==========================================================================

Split (:func:`split_by_family`): **train** = synthetic + cnn (66), **validation** = rnn (5), **test**
= lstm + transformer (16). The validation and test families never occur in training: the test set
measures transfer to unseen architectures (recurrent cells and attention, the paper's BERT gap).

Sizes are chosen so that every graph fits the ``mcm-36`` package: activations are int8
(``bytes_per_element=1``, the chiplet's precision), batch 1 for the CNNs and small widths for the
DAGs and transformers keep every tensor and every weight well below the 32 MB SRAM of a chip.

Every builder is cached (``functools.cache``, an unbounded ``lru_cache``), so a second
``mcm_corpus()`` in the same process is free. Building the whole corpus cold takes about 10-20 s on
a 2-core machine, nearly all of it in ``torch.export`` of the ten transformers;
``python -m archplace.workloads.corpus`` prints the time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .graph import OpGraph
from .synthetic import cnn_graph, layered_dag, rnn_graph

BPE = 1  # int8, the MCM chiplet's element size

SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("synthetic", "cnn"),
    "validation": ("rnn",),
    "test": ("lstm", "transformer"),
}


@dataclass(frozen=True)
class CorpusGraph:
    name: str
    family: str
    graph: OpGraph

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes


# ------------------------------------------------------------------------------------------ builders
@functools.cache
def _dag(num_nodes: int, width: int, seed: int, seq: int, hidden: int, max_skip: int) -> OpGraph:
    return layered_dag(num_nodes, width, seed, batch=1, seq=seq, hidden=hidden, max_skip=max_skip,
                       bytes_per_element=BPE)


@functools.cache
def _cnn(num_blocks: int, seed: int, image_size: int, channels: int, max_channels: int,
         p_inception: float) -> OpGraph:
    return cnn_graph(num_blocks, seed, batch=1, image_size=image_size, channels=channels,
                     max_channels=max_channels, p_inception=p_inception, bytes_per_element=BPE)


@functools.cache
def _rnn(num_steps: int, hidden: int, seed: int, cell: str, batch: int) -> OpGraph:
    return rnn_graph(num_steps, hidden, seed, batch=batch, cell=cell, bytes_per_element=BPE)


# (family, base preset for the transformers class, layers, hidden, heads, ffn, seq, vocab)
TRANSFORMERS: tuple[tuple[str, int, int, int, int, int, int], ...] = (
    ("bert", 1, 256, 4, 1024, 128, 4096),
    ("bert", 2, 384, 6, 1536, 128, 8192),
    ("bert", 3, 256, 4, 1024, 64, 4096),
    ("gpt2", 1, 256, 4, 1024, 128, 4096),
    ("gpt2", 2, 384, 6, 1536, 128, 8192),
    ("opt", 2, 256, 4, 1024, 128, 4096),
    ("llama", 1, 256, 4, 768, 128, 4096),
    ("llama", 2, 256, 4, 768, 64, 4096),
    ("t5", 1, 256, 4, 1024, 64, 4096),
    ("t5", 2, 256, 4, 1024, 64, 4096),
)
_BASE_PRESET = {"bert": "bert-base", "gpt2": "gpt2-xl", "opt": "opt-350m", "llama": "llama2-7b",
                "t5": "t5-base"}
_HAS_LOSS = {"gpt2", "opt", "llama", "t5"}


def _transformer_overrides(family: str, layers: int, hidden: int, heads: int, ffn: int, seq: int,
                           vocab: int) -> dict[str, Any]:
    if family == "bert":
        return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                    intermediate_size=ffn, vocab_size=vocab, max_position_embeddings=max(seq, 128))
    if family == "gpt2":
        return dict(n_layer=layers, n_embd=hidden, n_head=heads, n_inner=ffn, n_positions=max(seq, 128),
                    vocab_size=vocab, bos_token_id=0, eos_token_id=0)  # GPT-2's 50256 is past the vocab
    if family == "opt":
        return dict(hidden_size=hidden, num_hidden_layers=layers, ffn_dim=ffn, num_attention_heads=heads,
                    word_embed_proj_dim=hidden, vocab_size=vocab, max_position_embeddings=max(seq, 128),
                    do_layer_norm_before=True)
    if family == "llama":
        return dict(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab,
                    max_position_embeddings=max(seq, 128))
    if family == "t5":
        return dict(d_model=hidden, d_ff=ffn, d_kv=hidden // heads, num_layers=layers,
                    num_decoder_layers=layers, num_heads=heads, vocab_size=vocab)
    raise ValueError(f"unknown transformer family {family!r}; known: {sorted(_BASE_PRESET)}")


@functools.cache
def small_transformer(family: str, layers: int, hidden: int, heads: int, ffn: int, seq: int,
                      vocab: int) -> OpGraph:
    """The forward graph of a real ``transformers`` model at a small size: the preset's class and
    config with the widths, depth and vocabulary overridden, exported on the meta device exactly as
    :func:`archplace.workloads.models.build_graph` does (eager attention, fused tensor-vector pairs,
    a cross-entropy op after an LM head), every block captured (no replication). Kept on disk across
    processes too (``capture_cache``)."""
    from .capture_cache import cached_graph

    identity = dict(family=family, layers=layers, hidden=hidden, heads=heads, ffn=ffn, seq=seq, vocab=vocab)
    return cached_graph("small-transformer", identity, lambda: _capture_small_transformer(**identity))


def _capture_small_transformer(family: str, layers: int, hidden: int, heads: int, ffn: int, seq: int,
                               vocab: int) -> OpGraph:
    import torch
    import transformers

    from .extract import capture_ops, ops_to_graph
    from .models import _append_loss, preset

    p = preset(_BASE_PRESET[family])
    cfg = p.make_config(**_transformer_overrides(family, layers, hidden, heads, ffn, seq, vocab))
    with torch.device("meta"):
        model = getattr(transformers, p.model_class)(cfg)
    model.eval()
    ids = torch.zeros((1, seq), dtype=torch.long, device="meta")
    kwargs: dict[str, Any] = {}
    if family in _HAS_LOSS:
        kwargs["use_cache"] = False
    if family == "t5":
        kwargs["decoder_input_ids"] = ids
    ops, _, unmapped = capture_ops(model, (ids,), kwargs, BPE, stacks=tuple(p.stacks))
    name = f"{family}-l{layers}-h{hidden}-s{seq}"
    meta = {"model": name, "source": f"transformers {transformers.__version__} {p.model_class} (small)",
            "seq": seq, "mbs": 1, "tmp": 1, "bytes_per_element": BPE, "unmapped_ops": unmapped}
    g = ops_to_graph(ops, dict(meta, family=family), fuse=True, roles=p.roles)
    return _append_loss(g) if family in _HAS_LOSS else g


# ------------------------------------------------------------------------------------------ corpus
@functools.lru_cache(maxsize=8)
def _corpus(seed: int) -> tuple[CorpusGraph, ...]:
    rng = np.random.default_rng(seed)
    out: list[CorpusGraph] = []

    def seed_of() -> int:
        return int(rng.integers(0, 2**31 - 1))

    # synthetic layered DAGs: sizes spread log-uniformly over 30..300
    for i, n in enumerate(np.geomspace(30, 300, 40).round().astype(int)):
        width = int(rng.integers(2, 9))
        seq = int(rng.choice([64, 128, 256]))
        hidden = int(rng.choice([128, 256, 512]))
        skip = int(rng.integers(1, 4))
        s = seed_of()
        out.append(CorpusGraph(f"dag{i:02d}_n{n}_w{width}", "synthetic",
                               _dag(int(n), width, s, seq, hidden, skip)))
    # CNNs: 2..12 blocks, mixed residual / inception
    for i in range(26):
        blocks = 2 + i % 11
        img = int(rng.choice([32, 64, 128, 224]))
        ch = int(rng.choice([16, 32, 64]))
        maxc = int(rng.choice([256, 512]))
        p_inc = float(rng.choice([0.0, 0.3, 0.5, 0.8]))
        s = seed_of()
        out.append(CorpusGraph(f"cnn{i:02d}_b{blocks}_i{img}", "cnn", _cnn(blocks, s, img, ch, maxc, p_inc)))
    # vanilla RNNs (validation) and LSTMs (test)
    for i, steps in enumerate((8, 16, 24, 32, 40)):
        hidden = int(rng.choice([256, 512]))
        out.append(CorpusGraph(f"rnn{i}_t{steps}_h{hidden}", "rnn",
                               _rnn(steps, hidden, seed_of(), "rnn", int(rng.choice([16, 32, 64])))))
    for i, steps in enumerate((3, 4, 5, 6, 8, 10)):
        hidden = int(rng.choice([256, 512]))
        out.append(CorpusGraph(f"lstm{i}_t{steps}_h{hidden}", "lstm",
                               _rnn(steps, hidden, seed_of(), "lstm", int(rng.choice([16, 32, 64])))))
    # real transformers (test): fixed architectures, independent of the seed
    for spec in TRANSFORMERS:
        g = small_transformer(*spec)
        out.append(CorpusGraph(g.meta["model"], "transformer", g))
    return tuple(out)


def mcm_corpus(seed: int = 0) -> list[CorpusGraph]:
    """87 graphs (see the module docstring); ``seed`` draws the synthetic graphs' sizes and seeds."""
    return list(_corpus(int(seed)))


def split_by_family(corpus: list[CorpusGraph],
                    splits: dict[str, tuple[str, ...]] | None = None) -> dict[str, list[CorpusGraph]]:
    """``{"train": [...], "validation": [...], "test": [...]}`` by family (default :data:`SPLITS`):
    no family is in two splits, so validation and test graphs are of architectures never trained on."""
    splits = SPLITS if splits is None else splits
    seen: dict[str, str] = {}
    for split, fams in splits.items():
        for f in fams:
            if f in seen:
                raise ValueError(f"family {f!r} is in both {seen[f]!r} and {split!r}")
            seen[f] = split
    out: dict[str, list[CorpusGraph]] = {s: [] for s in splits}
    for cg in corpus:
        if cg.family not in seen:
            raise ValueError(f"graph {cg.name!r}: family {cg.family!r} is in no split; "
                             f"splits: {dict(splits)}")
        out[seen[cg.family]].append(cg)
    return out


if __name__ == "__main__":
    import time

    t0 = time.perf_counter()
    c = mcm_corpus()
    dt = time.perf_counter() - t0
    for split, gs in split_by_family(c).items():
        sizes = [g.num_nodes for g in gs]
        print(f"{split:10s} {len(gs):3d} graphs, {min(sizes)}-{max(sizes)} nodes, "
              f"families {sorted({g.family for g in gs})}")
    print(f"built {len(c)} graphs in {dt:.1f} s")
