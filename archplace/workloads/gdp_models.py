"""GDP's workloads (spec ``gdp.md`` §8) as training-step operator graphs, built as named presets.

GDP (Zhou et al.) places the TensorFlow training graphs of twelve models on 2-8 GPUs: RNNLM and
GNMT with 2, 4 and 8 layers, Transformer-XL with 2, 4 and 8 layers, Inception-v3, AmoebaNet and
WaveNet with 2 stacks of 18 layers and 4 stacks of 36 (Table 1; the device count of each is in
:attr:`GdpPreset.devices` and ``graph.meta["devices"]``). The TensorFlow graphs were never
published, so each model is written here as a small ``torch.nn.Module`` and captured with the same
``torch.export`` path as the ``transformers`` models (:func:`archplace.workloads.extract.capture_ops`
on the meta device, so no weight memory is ever allocated), a loss op is appended and
:func:`archplace.workloads.backward.derive_backward` adds the backward pass.

Why explicit modules, not ``nn.LSTM``: a placement decides per *operation*, and TensorFlow's static
unrolled RNN graph has every time step's ops as separate nodes. ``nn.LSTM`` is one fused op, so the
cell is written with two ``nn.Linear`` (input and recurrent weights) and element-wise gates, and the
Python loop over time steps unrolls it: every step's GEMMs and gates appear in the graph. The same
goes for GNMT's attention (one attention per decoder step) and WaveNet's blocks.

Families (sizes are in :data:`GDP_PRESETS`; the paper gives none, spec §8 **[GAP]**, so every size is
our choice, picked to be of the scale of the papers GDP builds on and to give graphs of a few
hundred to a few thousand nodes for the 2-layer variants, and over 20,000 for 8-layer GNMT):

* ``rnnlm-L``: word embedding → L stacked LSTM layers unrolled over ``time_steps`` → softmax
  projection; dropout on the non-recurrent connections (Zaremba et al. 2014). The initial (h, c) of
  every layer is a model input: truncated back-propagation carries it over from the previous segment.
  The paper's Table 1 has 2 and 4 layers; its appendix Table 3 also trains an 8-layer RNNLM, given
  8 devices here by the pattern of the others (**[INFERENCE]**).
* ``gnmt-L``: GNMT (Wu et al. 2016) with L encoder and L decoder layers: the bottom encoder layer is
  bidirectional (its outputs concatenated), residual connections from the third layer on, additive
  (Bahdanau) attention whose query is the bottom decoder layer's output and whose context feeds every
  decoder layer above it and the bottom layer at the next step (TensorFlow NMT's GNMT attention cell).
  The decoder starts from the encoder's final states (the bidirectional layer's forward direction).
  Simplification: GNMT's *normalised* attention (``g·v/‖v‖``) is plain ``v``.
* ``txl-L``: Transformer-XL (Dai et al. 2019) decoder blocks: relative multi-head attention over the
  concatenation of the previous segment's memory (one model input per layer, as TXL's ``mems``) and
  the current segment, causal mask, post-layer-norm residuals, ReLU feed-forward. The relative
  positions are TXL's own, not simplified: sinusoidal embeddings of the distances projected per layer
  (``r_net``), the content and position biases ``u`` and ``v`` (``r_w_bias``, ``r_r_bias``, untied:
  one pair per layer) and the ``rel_shift`` (pad, reshape, slice). Simplifications: a plain
  embedding and full softmax instead of the adaptive ones, no dropout on the positional embedding.
* ``inception-v3``: torchvision's Inception-v3 without the auxiliary head
  (:mod:`archplace.workloads.inception_v3`), 299×299 images, 94 convolutions.
* ``amoebanet``: AmoebaNet-A (Real et al. 2019), the cell network the paper names. Its normal and
  reduction cells are the genotype the DARTS code base publishes (Liu et al. 2019, ``genotypes.py``,
  Apache-2.0), built with DARTS's ImageNet network layout (two stride-2 stems, reduction cells at one
  and two thirds of the depth, channels doubled at each): ``normal_cells_per_stage`` normal cells,
  a reduction cell, the same, a reduction cell, the same. AmoebaNet-A, not NASNet-A, because GDP's
  Table 1 reports AmoebaNet. Drop-path is left out (a random mask multiply, no change in structure).
* ``wavenet-SxL``: WaveNet (van den Oord et al. 2016): a causal convolution of the one-hot μ-law
  input, then S stacks of L/S residual blocks with dilations 1, 2, 4, ... 256 (so "2-stack 18-layer"
  is 2 × 9 blocks and "4-stack 36-layer" 4 × 9), each block a dilated causal convolution pair
  (filter and gate) → ``tanh · sigmoid`` → a 1×1 residual convolution added to the block input and a
  1×1 skip convolution; the skips are summed, then ReLU → 1×1 → ReLU → 1×1 to 256 logits per sample.
  The last block has no residual 1×1: its output would feed nothing (TensorFlow runs only what the
  loss needs), and a dead op would seed a gradient of its own in the backward pass.
  Causality: the convolution pads both sides and the trailing outputs are sliced off.

Loss: a cross-entropy op after the logits (for WaveNet the softmax over the 256 quantised sample
values), appended like the transformer presets' (``models._append_loss``).

**Co-location groups** (``graph.extra_nodes["coloc_group"]``, int64, -1 for none). TensorFlow
colocates a variable with the ops that read it and with its gradient and update ops, and GDP counts a
placement that splits such a group as invalid (spec §2.1 and §4). In this IR a weight lives with the op the
capture attributes it to (its first reader: :func:`capture_ops` charges a parameter's bytes to one
op), so every forward op that reads a parameter, every other op reading the same parameter (an
unrolled LSTM's later time steps, a tied embedding) and all backward ops that differentiate any of them
(``fwd_id``) form one group; groups are numbered 0, 1, ... by their first reader's row. Keeping all
readers of a weight together is stricter than TensorFlow, which lets a variable's readers run elsewhere
and copies the variable to them each step: the simulator does not model those copies, so letting
readers spread would make them free.

**Layers** (``graph.meta["layers"]``): a layer is a module path up to its index in a stack of
blocks (``lstm_layers.1``, ``encoder_layers.0``, ``cells.3``, ``blocks.17``), else its top-level
module (``embedding``, ``attention``, ``Mixed_6b``, ``softmax``); ops of the root module join the
layer of their first input. A human-expert placement puts whole layers on devices.

:func:`node_features` gives the per-node feature matrix for the placement policy. No Ray import here.
``python -m archplace.workloads.gdp_models`` prints every preset's node count and capture time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backward import derive_backward
from .extract import capture_ops, ops_to_graph
from .graph import OpGraph
from .inception_v3 import Inception3
from .models import _append_loss
from .ops import OP_KINDS

BYTES_PER_ELEMENT = 4  # fp32: assumed for GDP's TensorFlow training graphs (the paper does not say)
_DROPOUT = 0.1  # the probability never changes the graph; dropout ops are there because training has them


# ============================================================================ sizes (units in names)
@dataclass(frozen=True)
class RnnlmSizes:
    lstm_layers: int
    hidden_units: int  # LSTM state width, also the word-embedding width
    vocab_tokens: int
    time_steps: int  # unrolled steps per segment (truncated back-propagation length)


@dataclass(frozen=True)
class GnmtSizes:
    lstm_layers: int  # per side: the encoder has this many (bottom one bidirectional), the decoder too
    hidden_units: int
    vocab_tokens: int  # shared word-piece vocabulary size (source and target embeddings are separate)
    source_steps: int
    target_steps: int


@dataclass(frozen=True)
class TxlSizes:
    transformer_layers: int
    model_units: int  # d_model
    heads: int
    head_units: int  # d_head
    ffn_units: int  # d_inner
    segment_tokens: int  # tgt_len
    memory_tokens: int  # mem_len
    vocab_tokens: int


@dataclass(frozen=True)
class InceptionSizes:
    image_px: int  # input side, pixels
    classes: int


@dataclass(frozen=True)
class AmoebaSizes:
    normal_cells_per_stage: int
    initial_channels: int  # C of the first cells (F in the AmoebaNet paper); doubled at each reduction
    image_px: int
    classes: int


@dataclass(frozen=True)
class WavenetSizes:
    stacks: int
    blocks_per_stack: int  # residual blocks per stack, dilations 1, 2, ..., 2**(blocks_per_stack-1)
    residual_channels: int
    dilation_channels: int  # filter and gate outputs
    skip_channels: int
    quantization_levels: int  # μ-law classes: the one-hot input width and the softmax width
    filter_taps: int  # kernel width of the dilated convolutions
    initial_filter_taps: int  # kernel width of the first causal convolution
    audio_samples: int  # samples per training example


Sizes = RnnlmSizes | GnmtSizes | TxlSizes | InceptionSizes | AmoebaSizes | WavenetSizes


@dataclass(frozen=True)
class GdpPreset:
    name: str
    family: str  # rnnlm | gnmt | txl | inception | amoebanet | wavenet
    devices: int  # GPUs the paper places this graph on (Table 1)
    batch_examples: int  # sequences, sentence pairs, images or audio clips per training step
    sizes: Sizes
    source: str  # where the architecture comes from


# Sizes, all our choice (spec §8 GAP): of the scale of the models' own papers, and giving graphs of a
# few hundred to a few thousand nodes at 2 layers.
# * RNNLM: 2048-unit LSTMs (the width of Jozefowicz et al. 2016's LSTM-2048-512, without its
#   projection), a 32k vocabulary, 20 unrolled steps, 64 sequences.
# * GNMT: Wu et al.'s 1024 units and a 32k word-piece vocabulary, 128 sentence pairs; 20 source and 20
#   target steps for 2 and 4 layers, 35 and 35 for 8 layers, which takes 8-layer GNMT's training graph
#   past the 20,000 nodes the scaling tests need (GDP's TensorFlow graph of it has over 50k nodes;
#   TensorFlow graphs also hold variable reads, identities and optimizer updates, which are no ops here).
# * Transformer-XL: its enwik8 base widths (d_model 512, 8 heads of 64, d_inner 2048), 128-token
#   segments and memories, a 32k vocabulary, 32 segments.
# * Inception-v3: 299 px, 1000 classes, 32 images.
# * AmoebaNet: 2 normal cells per stage (8 cells in all) at 224 px, 32 images, with 128 initial
#   channels, which puts its training step in the range of Inception-v3's flops (GDP's step times for
#   the two are alike: 0.39 s and 0.41 s).
# * WaveNet: the channel widths of the common open-source TensorFlow WaveNet (residual 32, dilation 32,
#   skip 512, 256 μ-law levels, a 32-tap first convolution), one-second 16 kHz clips, 8 clips.
def _rnnlm(layers: int) -> GdpPreset:
    return GdpPreset(f"rnnlm-{layers}", "rnnlm", layers, 64, RnnlmSizes(layers, 2048, 32000, 20),
                     "stacked LSTM language model (Zaremba et al. 2014; Jozefowicz et al. 2016)")


def _gnmt(layers: int, steps: int) -> GdpPreset:
    return GdpPreset(f"gnmt-{layers}", "gnmt", layers, 128, GnmtSizes(layers, 1024, 32000, steps, steps),
                     "GNMT (Wu et al. 2016) with TensorFlow NMT's GNMT attention")


def _txl(layers: int) -> GdpPreset:
    return GdpPreset(f"txl-{layers}", "txl", layers, 32, TxlSizes(layers, 512, 8, 64, 2048, 128, 128, 32000),
                     "Transformer-XL (Dai et al. 2019), relative attention with segment memory")


def _wavenet(stacks: int, devices: int) -> GdpPreset:
    return GdpPreset(f"wavenet-{stacks}x{9 * stacks}", "wavenet", devices, 8,
                     WavenetSizes(stacks, 9, 32, 32, 512, 256, 2, 32, 16000),
                     "WaveNet (van den Oord et al. 2016), gated dilated causal convolutions")


GDP_PRESETS: dict[str, GdpPreset] = {p.name: p for p in [
    _rnnlm(2), _rnnlm(4), _rnnlm(8),
    _gnmt(2, 20), _gnmt(4, 20), _gnmt(8, 35),
    _txl(2), _txl(4), _txl(8),
    GdpPreset("inception-v3", "inception", 2, 32, InceptionSizes(299, 1000),
              "Inception-v3 (Szegedy et al. 2016) as torchvision defines it, no auxiliary head"),
    GdpPreset("amoebanet", "amoebanet", 4, 32, AmoebaSizes(2, 128, 224, 1000),
              "AmoebaNet-A cells (Real et al. 2019; genotype from DARTS) in DARTS's ImageNet network"),
    _wavenet(2, 2), _wavenet(4, 4),
]}


def gdp_preset(name: str) -> GdpPreset:
    try:
        return GDP_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown GDP preset {name!r}; allowed: {sorted(GDP_PRESETS)}") from None


# ============================================================================ recurrent models
class LSTMCell(nn.Module):
    """One LSTM step with explicit GEMMs: ``gates = W_x·x + b + W_h·h`` (one bias), then
    ``c' = σ(f)·c + σ(i)·tanh(g)`` and ``h' = σ(o)·tanh(c')``. Parameters: ``4H(X + H) + 4H``.

    ``x`` may be a list of tensors, concatenated first (GNMT's ``[input ; context]``); dropout on
    the input (the non-recurrent connection) is part of the cell, so these ops sit in its layer."""

    def __init__(self, input_units: int, hidden_units: int) -> None:
        super().__init__()
        self.ih = nn.Linear(input_units, 4 * hidden_units)
        self.hh = nn.Linear(hidden_units, 4 * hidden_units, bias=False)

    def forward(self, x: Tensor | list[Tensor], h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat(x, -1) if isinstance(x, list) else x
        x = F.dropout(x, _DROPOUT, self.training)
        i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


def lstm_cell_params(input_units: int, hidden_units: int) -> int:
    return 4 * hidden_units * (input_units + hidden_units) + 4 * hidden_units


class RNNLM(nn.Module):
    """Inputs: token ids ``[B, T]``, initial states ``h0``, ``c0`` ``[L, B, H]``; output: logits
    ``[T·B, V]`` (time-major rows)."""

    def __init__(self, s: RnnlmSizes) -> None:
        super().__init__()
        self.time_steps = s.time_steps
        self.embedding = nn.Embedding(s.vocab_tokens, s.hidden_units)
        self.lstm_layers = nn.ModuleList(LSTMCell(s.hidden_units, s.hidden_units)
                                         for _ in range(s.lstm_layers))
        self.softmax = nn.Linear(s.hidden_units, s.vocab_tokens)

    def forward(self, ids: Tensor, h0: Tensor, c0: Tensor) -> Tensor:
        x = self.embedding(ids)
        h = [h0[i] for i in range(len(self.lstm_layers))]
        c = [c0[i] for i in range(len(self.lstm_layers))]
        outs = []
        for t in range(self.time_steps):
            inp = x[:, t]
            for i, cell in enumerate(self.lstm_layers):
                h[i], c[i] = cell(inp, h[i], c[i])
                inp = h[i]
            outs.append(F.dropout(inp, _DROPOUT, self.training))
        return self.softmax(torch.cat(outs, 0))


class BiLSTMLayer(nn.Module):
    """GNMT's bottom encoder layer: a forward and a backward LSTM over the source."""

    def __init__(self, input_units: int, hidden_units: int) -> None:
        super().__init__()
        self.fw = LSTMCell(input_units, hidden_units)
        self.bw = LSTMCell(input_units, hidden_units)


class AdditiveAttention(nn.Module):
    """Bahdanau attention: ``score_j = v·tanh(W_q·q + b + W_k·k_j)``; the keys ``W_k·k`` are
    projected once per sentence (``memory_layer``), the query once per decoder step."""

    def __init__(self, units: int) -> None:
        super().__init__()
        self.memory_layer = nn.Linear(units, units, bias=False)
        self.query_layer = nn.Linear(units, units)
        self.v = nn.Linear(units, 1, bias=False)

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor) -> Tensor:
        scores = self.v(torch.tanh(keys + self.query_layer(query).unsqueeze(1))).squeeze(-1)  # [B, S]
        probs = F.softmax(scores, dim=-1)
        return torch.bmm(probs.unsqueeze(1), memory).squeeze(1)  # [B, H]


class GNMT(nn.Module):
    """Inputs: source and target ids ``[B, S]``, ``[B, T]``; output: logits ``[T·B, V]``."""

    def __init__(self, s: GnmtSizes) -> None:
        super().__init__()
        h = s.hidden_units
        self.sizes = s
        self.src_embedding = nn.Embedding(s.vocab_tokens, h)
        self.tgt_embedding = nn.Embedding(s.vocab_tokens, h)
        self.encoder_layers = nn.ModuleList(
            [BiLSTMLayer(h, h)] + [LSTMCell(2 * h if i == 1 else h, h) for i in range(1, s.lstm_layers)])
        self.attention = AdditiveAttention(h)
        # every decoder layer reads [its input ; attention context]
        self.decoder_layers = nn.ModuleList(LSTMCell(2 * h, h) for _ in range(s.lstm_layers))
        self.softmax = nn.Linear(h, s.vocab_tokens)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        s = self.sizes
        b, h = src.shape[0], s.hidden_units
        zeros = torch.zeros(b, h, device=src.device)  # a constant: folded, not an op
        x = self.src_embedding(src)
        steps = [x[:, t] for t in range(s.source_steps)]
        final: list[tuple[Tensor, Tensor]] = []
        bi = self.encoder_layers[0]
        fw, bw = [], []
        hf, cf, hb, cb = zeros, zeros, zeros, zeros
        for t in range(s.source_steps):
            hf, cf = bi.fw(steps[t], hf, cf)
            fw.append(hf)
        for t in reversed(range(s.source_steps)):
            hb, cb = bi.bw(steps[t], hb, cb)
            bw.append(hb)
        final.append((hf, cf))
        steps = [torch.cat([f, r], -1) for f, r in zip(fw, bw[::-1])]
        for i in range(1, s.lstm_layers):
            cell, hi, ci, outs = self.encoder_layers[i], zeros, zeros, []
            for t in range(s.source_steps):
                hi, ci = cell(steps[t], hi, ci)
                outs.append(hi + steps[t] if i >= 2 else hi)  # residual from the third layer
            final.append((hi, ci))
            steps = outs
        memory = torch.cat([o.unsqueeze(1) for o in steps], 1)  # [B, S, H]
        keys = self.attention.memory_layer(memory)
        y = self.tgt_embedding(tgt)
        hd = [hc[0] for hc in final]
        cd = [hc[1] for hc in final]
        ctx = zeros
        outs = []
        for t in range(s.target_steps):
            hd[0], cd[0] = self.decoder_layers[0]([y[:, t], ctx], hd[0], cd[0])
            ctx = self.attention(hd[0], keys, memory)
            inp = hd[0]
            for i in range(1, s.lstm_layers):
                hd[i], cd[i] = self.decoder_layers[i]([inp, ctx], hd[i], cd[i])
                inp = hd[i] + inp if i >= 2 else hd[i]
            outs.append(F.dropout(inp, _DROPOUT, self.training))
        return self.softmax(torch.cat(outs, 0))


# ============================================================================ Transformer-XL
class RelMultiHeadAttn(nn.Module):
    """TXL's ``RelPartialLearnableMultiHeadAttn`` (post-norm), batch-first. With queries ``q`` of
    the segment and keys ``k``, values of memory + segment and ``R`` the sinusoidal embedding of the
    distances: ``score = (q + u)·kᵀ + rel_shift((q + v)·(W_r R)ᵀ)``."""

    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        n, dh, d = s.heads, s.head_units, s.model_units
        self.n, self.dh, self.scale = n, dh, 1.0 / math.sqrt(dh)
        self.qkv_net = nn.Linear(d, 3 * n * dh, bias=False)
        self.r_net = nn.Linear(d, n * dh, bias=False)
        self.o_net = nn.Linear(n * dh, d, bias=False)
        self.layer_norm = nn.LayerNorm(d)
        # shaped [n, 1, dh] so that the add reads the parameter itself (no view op owns the weight)
        self.r_w_bias = nn.Parameter(torch.zeros(n, 1, dh))
        self.r_r_bias = nn.Parameter(torch.zeros(n, 1, dh))

    @staticmethod
    def rel_shift(x: Tensor) -> Tensor:
        b, n, q, k = x.shape
        pad = torch.zeros(b, n, q, 1, device=x.device, dtype=x.dtype)  # constant: folded
        return torch.cat([pad, x], -1).view(b, n, k + 1, q)[:, :, 1:].reshape(b, n, q, k)

    def forward(self, w: Tensor, r: Tensor, mem: Tensor, mask: Tensor) -> Tensor:
        b, qlen, _ = w.shape
        klen = qlen + mem.shape[1]
        q, k, v = self.qkv_net(torch.cat([mem, w], 1)).chunk(3, dim=-1)
        q = q[:, -qlen:].reshape(b, qlen, self.n, self.dh).transpose(1, 2)  # [B, n, q, dh]
        k = k.reshape(b, klen, self.n, self.dh).transpose(1, 2)
        v = v.reshape(b, klen, self.n, self.dh).transpose(1, 2)
        rk = self.r_net(r).reshape(klen, self.n, self.dh).transpose(0, 1)  # [n, k, dh]
        ac = torch.matmul(q + self.r_w_bias, k.transpose(-1, -2))
        bd = self.rel_shift(torch.matmul(q + self.r_r_bias, rk.transpose(-1, -2)))
        score = ((ac + bd) * self.scale).masked_fill(mask, float("-inf"))
        prob = F.dropout(F.softmax(score, dim=-1), _DROPOUT, self.training)
        vec = torch.matmul(prob, v).transpose(1, 2).reshape(b, qlen, self.n * self.dh)
        return self.layer_norm(w + F.dropout(self.o_net(vec), _DROPOUT, self.training))


class PositionwiseFF(nn.Module):
    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        self.fc1 = nn.Linear(s.model_units, s.ffn_units)
        self.fc2 = nn.Linear(s.ffn_units, s.model_units)
        self.layer_norm = nn.LayerNorm(s.model_units)

    def forward(self, x: Tensor) -> Tensor:
        core = F.dropout(F.relu(self.fc1(x)), _DROPOUT, self.training)
        return self.layer_norm(x + F.dropout(self.fc2(core), _DROPOUT, self.training))


class TxlBlock(nn.Module):
    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        self.attn = RelMultiHeadAttn(s)
        self.ff = PositionwiseFF(s)

    def forward(self, x: Tensor, r: Tensor, mem: Tensor, mask: Tensor) -> Tensor:
        return self.ff(self.attn(x, r, mem, mask))


class TransformerXL(nn.Module):
    """Inputs: token ids ``[B, q]`` and one memory ``[B, m, d]`` per layer; output: logits ``[B, q, V]``."""

    def __init__(self, s: TxlSizes) -> None:
        super().__init__()
        self.sizes = s
        self.embedding = nn.Embedding(s.vocab_tokens, s.model_units)
        self.layers = nn.ModuleList(TxlBlock(s) for _ in range(s.transformer_layers))
        self.softmax = nn.Linear(s.model_units, s.vocab_tokens)
        inv_freq = 1.0 / (10000 ** (torch.arange(0.0, s.model_units, 2.0) / s.model_units))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, ids: Tensor, mems: list[Tensor]) -> Tensor:
        s = self.sizes
        qlen, mlen = ids.shape[1], mems[0].shape[1]
        klen = qlen + mlen
        x = F.dropout(self.embedding(ids) * math.sqrt(s.model_units), _DROPOUT, self.training)
        ones = torch.ones(qlen, klen, dtype=torch.bool, device=ids.device)
        mask = torch.triu(ones, diagonal=1 + mlen)  # constant: folded
        pos = torch.arange(klen - 1, -1, -1.0, device=ids.device)
        sinusoid = torch.outer(pos, self.inv_freq)
        r = torch.cat([sinusoid.sin(), sinusoid.cos()], -1)  # [k, d], constant: folded
        for layer, mem in zip(self.layers, mems):
            x = layer(x, r, mem, mask)
        return self.softmax(x)


# ============================================================================ AmoebaNet-A
# The AmoebaNet-A genotype as DARTS's genotypes.py publishes it: (operation, input state) pairs, two
# per intermediate node; states 0 and 1 are the two previous cells' outputs.
AMOEBANET_NORMAL = (("avg_pool_3x3", 0), ("max_pool_3x3", 1), ("sep_conv_3x3", 0), ("sep_conv_5x5", 2),
                    ("sep_conv_3x3", 0), ("avg_pool_3x3", 3), ("sep_conv_3x3", 1), ("skip_connect", 1),
                    ("skip_connect", 0), ("avg_pool_3x3", 1))
AMOEBANET_NORMAL_CONCAT = (4, 5, 6)
AMOEBANET_REDUCE = (("avg_pool_3x3", 0), ("sep_conv_3x3", 1), ("max_pool_3x3", 0), ("sep_conv_7x7", 2),
                    ("sep_conv_7x7", 0), ("avg_pool_3x3", 1), ("max_pool_3x3", 0), ("max_pool_3x3", 1),
                    ("conv_7x1_1x7", 0), ("sep_conv_3x3", 5))
AMOEBANET_REDUCE_CONCAT = (3, 4, 6)


class ReLUConvBN(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int) -> None:
        super().__init__(nn.ReLU(), nn.Conv2d(c_in, c_out, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(c_out))


class SepConv(nn.Sequential):
    """Two (ReLU, depthwise k×k, pointwise 1×1, BN) stacks; the first carries the stride."""

    def __init__(self, c: int, kernel: int, stride: int) -> None:
        p = kernel // 2
        super().__init__(nn.ReLU(), nn.Conv2d(c, c, kernel, stride, p, groups=c, bias=False),
                         nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c),
                         nn.ReLU(), nn.Conv2d(c, c, kernel, 1, p, groups=c, bias=False),
                         nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))


class Conv7x1_1x7(nn.Sequential):
    def __init__(self, c: int, stride: int) -> None:
        super().__init__(nn.ReLU(), nn.Conv2d(c, c, (1, 7), (1, stride), (0, 3), bias=False),
                         nn.Conv2d(c, c, (7, 1), (stride, 1), (3, 0), bias=False), nn.BatchNorm2d(c))


class FactorizedReduce(nn.Module):
    """Halve the resolution with two offset stride-2 1×1 convolutions (DARTS)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv_1 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.conv_2 = nn.Conv2d(c_in, c_out // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(x)
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(x[:, :, 1:, 1:])], 1))


def _cell_op(name: str, c: int, stride: int) -> nn.Module:
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride, 1, count_include_pad=False)
    if name == "max_pool_3x3":
        return nn.MaxPool2d(3, stride, 1)
    if name == "skip_connect":
        return nn.Identity() if stride == 1 else FactorizedReduce(c, c)
    if name.startswith("sep_conv_"):
        return SepConv(c, int(name[-1]), stride)
    if name == "conv_7x1_1x7":
        return Conv7x1_1x7(c, stride)
    raise ValueError(f"unknown cell operation {name!r}")


class AmoebaCell(nn.Module):
    def __init__(self, c_prev_prev: int, c_prev: int, c: int, reduction: bool, reduction_prev: bool) -> None:
        super().__init__()
        self.preprocess0 = FactorizedReduce(c_prev_prev, c) if reduction_prev else ReLUConvBN(
            c_prev_prev, c, 1, 1, 0)
        self.preprocess1 = ReLUConvBN(c_prev, c, 1, 1, 0)
        genotype = AMOEBANET_REDUCE if reduction else AMOEBANET_NORMAL
        self.concat = AMOEBANET_REDUCE_CONCAT if reduction else AMOEBANET_NORMAL_CONCAT
        self.indices = [i for _, i in genotype]
        self.ops = nn.ModuleList(_cell_op(op, c, 2 if reduction and i < 2 else 1) for op, i in genotype)
        self.multiplier = len(self.concat)

    def forward(self, s0: Tensor, s1: Tensor) -> Tensor:
        states = [self.preprocess0(s0), self.preprocess1(s1)]
        for k in range(len(self.ops) // 2):
            a, b = 2 * k, 2 * k + 1
            states.append(self.ops[a](states[self.indices[a]]) + self.ops[b](states[self.indices[b]]))
        return torch.cat([states[i] for i in self.concat], 1)


class AmoebaNet(nn.Module):
    """DARTS's ``NetworkImageNet`` layout with AmoebaNet-A cells: N normal, reduction, N normal,
    reduction, N normal (``N = normal_cells_per_stage``), channels doubled at each reduction."""

    def __init__(self, s: AmoebaSizes) -> None:
        super().__init__()
        c = s.initial_channels
        self.stem0 = nn.Sequential(nn.Conv2d(3, c // 2, 3, 2, 1, bias=False), nn.BatchNorm2d(c // 2),
                                   nn.ReLU(), nn.Conv2d(c // 2, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c))
        self.stem1 = nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c))
        n = s.normal_cells_per_stage
        c_pp, c_p, c_cur = c, c, c
        cells, reduction_prev = [], True
        for i in range(3 * n + 2):
            reduction = i in (n, 2 * n + 1)
            c_cur = 2 * c_cur if reduction else c_cur
            cell = AmoebaCell(c_pp, c_p, c_cur, reduction, reduction_prev)
            cells.append(cell)
            reduction_prev = reduction
            c_pp, c_p = c_p, cell.multiplier * c_cur
        self.cells = nn.ModuleList(cells)
        self.global_pooling = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c_p, s.classes)

    def forward(self, x: Tensor) -> Tensor:
        s0 = self.stem0(x)
        s1 = self.stem1(s0)
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return self.classifier(torch.flatten(self.global_pooling(s1), 1))


# ============================================================================ WaveNet
class ResidualBlock(nn.Module):
    """Gated dilated causal convolution block. Parameters (with biases, taps ``k``, residual ``r``,
    dilation ``g``, skip ``s`` channels): ``2(g·r·k + g) + (r·g + r) + (s·g + s)``; the last block
    has no residual 1×1 (``residual=False``, minus ``r·g + r``): its output would feed nothing, and
    TensorFlow runs only what the loss needs."""

    def __init__(self, s: WavenetSizes, dilation: int, residual: bool = True) -> None:
        super().__init__()
        pad = (s.filter_taps - 1) * dilation
        r, g = s.residual_channels, s.dilation_channels
        self.filter = nn.Conv1d(r, g, s.filter_taps, dilation=dilation, padding=pad)
        self.gate = nn.Conv1d(r, g, s.filter_taps, dilation=dilation, padding=pad)
        self.dense = nn.Conv1d(g, r, 1) if residual else None
        self.skip = nn.Conv1d(g, s.skip_channels, 1)

    def forward(self, x: Tensor, skips: Tensor | None) -> tuple[Tensor | None, Tensor]:
        """Returns the next block's input and the running sum of the skip outputs (summed here,
        block by block, so the adds belong to the blocks)."""
        t = x.shape[-1]
        # causal: the convolutions pad both sides; the tail (outputs that saw the future) is sliced off
        z = torch.tanh(self.filter(x)[..., :t]) * torch.sigmoid(self.gate(x)[..., :t])
        skip = self.skip(z)
        out = None if self.dense is None else x + self.dense(z)
        return out, skip if skips is None else skips + skip


def wavenet_block_params(s: WavenetSizes) -> int:
    r, g, k, sk = s.residual_channels, s.dilation_channels, s.filter_taps, s.skip_channels
    return 2 * (g * r * k + g) + (r * g + r) + (sk * g + sk)


class WaveNet(nn.Module):
    """Input: one-hot μ-law samples ``[B, Q, T]``; output: logits ``[B, Q, T]``."""

    def __init__(self, s: WavenetSizes) -> None:
        super().__init__()
        q, r = s.quantization_levels, s.residual_channels
        self.causal_conv = nn.Conv1d(q, r, s.initial_filter_taps, padding=s.initial_filter_taps - 1)
        n = s.stacks * s.blocks_per_stack
        self.blocks = nn.ModuleList(ResidualBlock(s, 2 ** (i % s.blocks_per_stack), residual=i < n - 1)
                                    for i in range(n))
        self.postprocess1 = nn.Conv1d(s.skip_channels, s.skip_channels, 1)
        self.postprocess2 = nn.Conv1d(s.skip_channels, q, 1)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[-1]
        h = self.causal_conv(x)[..., :t]
        total = None
        for block in self.blocks:
            h, total = block(h, total)
        return self.postprocess2(F.relu(self.postprocess1(F.relu(total))))


# ============================================================================ graph building
def build_module(preset: GdpPreset) -> nn.Module:
    """The preset's model on the meta device, in training mode."""
    s = preset.sizes
    builders = {"rnnlm": RNNLM, "gnmt": GNMT, "txl": TransformerXL, "amoebanet": AmoebaNet,
                "wavenet": WaveNet, "inception": lambda sz: Inception3(sz.classes, aux_logits=False)}
    if preset.family not in builders:
        raise ValueError(f"preset {preset.name!r}: family {preset.family!r} is unknown; "
                         f"allowed: {sorted(builders)}")
    with torch.device("meta"):
        return builders[preset.family](s).train()


def example_inputs(preset: GdpPreset, batch: int) -> tuple:
    """Meta-device example inputs of the preset's model for ``batch`` examples."""
    s = preset.sizes

    def z(*shape, dtype=torch.float32):
        return torch.zeros(shape, dtype=dtype, device="meta")

    if isinstance(s, RnnlmSizes):
        st = (s.lstm_layers, batch, s.hidden_units)
        return z(batch, s.time_steps, dtype=torch.long), z(*st), z(*st)
    if isinstance(s, GnmtSizes):
        return z(batch, s.source_steps, dtype=torch.long), z(batch, s.target_steps, dtype=torch.long)
    if isinstance(s, TxlSizes):
        return (z(batch, s.segment_tokens, dtype=torch.long),
                [z(batch, s.memory_tokens, s.model_units) for _ in range(s.transformer_layers)])
    if isinstance(s, (InceptionSizes, AmoebaSizes)):
        return (z(batch, 3, s.image_px, s.image_px),)
    if isinstance(s, WavenetSizes):
        return (z(batch, s.quantization_levels, s.audio_samples),)
    raise ValueError(f"preset {preset.name!r}: no inputs for sizes {type(s).__name__}")


_STACK_SUFFIXES = ("layers", "cells", "blocks")


def _layer_key(name: str) -> str | None:
    """Layer of an op from its name ``module/node``: the module path up to the index in a block
    stack, else the top-level module; None for root-module ops and inputs."""
    if "/" not in name:
        return None
    module = name.split("/", 1)[0]
    if module == "model":  # extract names root-module ops "model/..."
        return None
    parts = module.split(".")
    for i in range(1, len(parts)):
        if parts[i].isdigit() and parts[i - 1].endswith(_STACK_SUFFIXES):
            return ".".join(parts[:i + 1])
    return parts[0]


def _assign_layers(g: OpGraph) -> OpGraph:
    """Re-layer a forward graph by module (module docstring): root-module ops join their first
    input's layer, sources without a module (the inputs) their first consumer's."""
    n = g.num_nodes
    src, dst = g.edge_pos
    keys: list[str | None] = [_layer_key(str(nm)) for nm in g.nodes["name"]]
    order = g.topo_order()
    first_in = np.full(n, -1)
    first_out = np.full(n, -1)
    for e in range(len(src) - 1, -1, -1):  # edges are sorted by source: the last write is the first
        first_out[src[e]] = dst[e]
    by_dst = np.lexsort((src, g.edges["arg"], dst))  # per destination: argument 0 first
    for e in by_dst[::-1]:
        first_in[dst[e]] = src[e]
    for u in order:
        if keys[u] is None and first_in[u] >= 0:
            keys[u] = keys[first_in[u]]
    for u in order[::-1]:
        if keys[u] is None and first_out[u] >= 0:
            keys[u] = keys[first_out[u]]
    names: list[str] = []
    index: dict[str, int] = {}
    layer = np.empty(n, dtype=np.int32)
    for u in order:
        k = keys[u] or "input"
        if k not in index:
            index[k] = len(names)
            names.append(k)
        layer[u] = index[k]
    nodes = dict(g.nodes, layer=layer)
    return OpGraph(nodes, dict(g.edges), dict(g.meta, layers=names), dict(g.extra_nodes),
                   dict(g.extra_edges))


def colocation_groups(g: OpGraph, params_read: dict[int, tuple[str, ...]] | None = None) -> np.ndarray:
    """Group per node (int64, -1 for none; module doc): the forward ops that read one parameter
    (``params_read``: forward op id -> the parameters it reads; without it, each op with
    ``weight_bytes > 0`` is its own reader set) and the backward ops whose ``fwd_id`` is one of them share
    a group; groups are numbered by their first reader's row."""
    nd = g.nodes
    ids = nd["id"]
    row_of = {int(i): r for r, i in enumerate(ids.tolist())}
    if params_read is None:
        params_read = {int(ids[r]): (f"w{r}",) for r in
                       np.flatnonzero(~nd["is_backward"] & (nd["weight_bytes"] > 0))}
    parent = list(range(g.num_nodes))  # union-find over rows

    def find(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    first_reader: dict[str, int] = {}
    readers = sorted(row_of[i] for i, ps in params_read.items() if ps and i in row_of)
    for r in readers:
        for name in params_read[int(ids[r])]:
            if name in first_reader:
                a, b = find(first_reader[name]), find(r)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                first_reader[name] = r
    group = np.full(g.num_nodes, -1, dtype=np.int64)
    root_gid: dict[int, int] = {}
    for r in readers:
        root = find(r)
        if root not in root_gid:
            root_gid[root] = len(root_gid)
        group[r] = root_gid[root]
    reader_gid = {int(ids[r]): int(group[r]) for r in readers}
    bwd = np.flatnonzero(nd["is_backward"])
    group[bwd] = np.array([reader_gid.get(int(f), -1) for f in nd["fwd_id"][bwd]], dtype=np.int64)
    return group


def _check_int(field_name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{field_name} must be an integer >= {minimum}, got {value!r}")


# Megatron roles (tp_roles.py's format) of the GEMMs these graphs have always had. GDP graphs are never
# sliced; a row GEMM stays out of a fused pair when ``fuse`` is on.
_TP_ROLES = {"txl": {"ff.fc1": "col", "ff.fc2": "row"}}


@functools.lru_cache(maxsize=16)
def _graph(name: str, batch: int, training: bool, fuse: bool) -> OpGraph:
    p = gdp_preset(name)
    model = build_module(p)
    ops, num_params, unmapped = capture_ops(model, example_inputs(p, batch), {}, BYTES_PER_ELEMENT)
    meta = {"model": name, "family": p.family, "devices": p.devices, "batch": batch,
            "sizes": asdict(p.sizes), "source": p.source, "mbs": batch, "tmp": 1,
            "bytes_per_element": BYTES_PER_ELEMENT, "num_parameters": int(num_params),
            "unmapped_ops": unmapped}
    if isinstance(p.sizes, (RnnlmSizes, TxlSizes)):
        meta["seq"] = p.sizes.time_steps if isinstance(p.sizes, RnnlmSizes) else p.sizes.segment_tokens
    g = _assign_layers(ops_to_graph(ops, meta, fuse=fuse, roles=_TP_ROLES.get(p.family)))
    # op i of the capture is node id i (ops_to_graph numbers nodes in capture order), so each node's
    # parameters are those of its op; fusing keeps the GEMM's id and drops the absorbed op's, whose
    # parameters then join no group (fuse is off for GDP by default)
    params_read = {i: op.params for i, op in enumerate(ops) if op.params}
    if training:
        g = derive_backward(_append_loss(g))
    g.extra_nodes["coloc_group"] = colocation_groups(g, params_read)
    return g


def gdp_graph(name: str, *, batch: int | None = None, training: bool = True, fuse: bool = False) -> OpGraph:
    """The operator graph of GDP preset ``name`` (see :data:`GDP_PRESETS`) for ``batch`` examples
    (the preset's by default): the training step (forward, loss, backward) when ``training``, else the
    forward pass. ``fuse`` merges each GEMM with the element-wise op after it (Phaze's fused cores);
    GDP places TensorFlow ops one by one, so it is off by default.

    Graphs are cached per arguments (capturing 8-layer GNMT takes tens of seconds): the same object
    comes back for the same arguments, so treat it as read-only."""
    p = gdp_preset(name)
    batch = p.batch_examples if batch is None else batch
    _check_int("batch", batch)
    for field_name, value in (("training", training), ("fuse", fuse)):
        if not isinstance(value, bool):
            raise ValueError(f"{field_name} must be True or False, got {value!r}")
    return _graph(name, int(batch), training, fuse)


def num_parameters(name: str) -> int:
    """Parameters of the preset's module (``nn.Module.parameters``, built on the meta device)."""
    return sum(t.numel() for t in build_module(gdp_preset(name)).parameters())


# ============================================================================ policy features
_KIND_NAMES = sorted(OP_KINDS)


def node_features(graph: OpGraph) -> tuple[np.ndarray, list[str]]:
    """Per-node features for the placement policy, ``[n, F]`` float32 and their names: a one-hot op
    kind (over the sorted :data:`OP_KINDS`), ``log1p`` of output bytes, flops and weight bytes,
    ``log1p`` of in- and out-degree, ``is_backward`` and the topological rank scaled to [0, 1]
    (Kahn's order, smallest row first, so deterministic). GDP's own list is "operation type, output
    shape, adjacent node ids" (spec §3.1, encoding unspecified); sizes stand in for shapes here, and the
    degrees and rank for the adjacency, which the graph network reads from the edges anyway."""
    nd = graph.nodes
    n = graph.num_nodes
    kind_index = {k: i for i, k in enumerate(_KIND_NAMES)}
    onehot = np.zeros((n, len(_KIND_NAMES)), dtype=np.float32)
    onehot[np.arange(n), [kind_index[k] for k in nd["kind"]]] = 1.0
    src, dst = graph.edge_pos
    indeg = np.bincount(dst, minlength=n)
    outdeg = np.bincount(src, minlength=n)
    rank = np.empty(n, dtype=np.float64)
    rank[graph.topo_order()] = np.arange(n)
    rank /= max(n - 1, 1)
    dense = np.stack([np.log1p(nd["output_bytes"].astype(np.float64)), np.log1p(nd["flops"]),
                      np.log1p(nd["weight_bytes"].astype(np.float64)), np.log1p(indeg), np.log1p(outdeg),
                      nd["is_backward"].astype(np.float64), rank], axis=1).astype(np.float32)
    names = [f"kind={k}" for k in _KIND_NAMES] + [
        "log1p_output_bytes", "log1p_flops", "log1p_weight_bytes", "log1p_in_degree", "log1p_out_degree",
        "is_backward", "topo_rank"]
    return np.concatenate([onehot, dense], axis=1), names


if __name__ == "__main__":
    import time

    for preset_name in GDP_PRESETS:
        t0 = time.perf_counter()
        graph = gdp_graph(preset_name)
        dt = time.perf_counter() - t0
        print(f"{preset_name:14s} {graph.num_nodes:7d} nodes {graph.num_edges:7d} edges "
              f"{num_parameters(preset_name):13,d} params  {dt:6.1f} s  "
              f"unmapped {graph.meta['unmapped_ops']}")
