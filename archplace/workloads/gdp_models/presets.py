"""The GDP presets: each model family's sizes and the preset table :data:`GDP_PRESETS`.

Sizes are all our choice: the paper gives none (spec §8 **[GAP]**), so every size is picked to be of the
scale of the papers GDP builds on and to give graphs of a few hundred to a few thousand nodes for the
2-layer variants, and over 20,000 for 8-layer GNMT. The 8-layer RNNLM is in the paper's appendix
Table 3 only; it is given 8 devices here by the pattern of the others (**[INFERENCE]**).
"""

from __future__ import annotations

from dataclasses import dataclass

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
