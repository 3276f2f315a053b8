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

Where things are (one concern per module; each family's module docstring describes its model):

- ``presets.py``: the sizes, :class:`GdpPreset` and the preset table :data:`GDP_PRESETS`;
- the model families: ``lstm.py`` (the unrolled LSTM cell RNNLM and GNMT share), ``rnnlm.py``,
  ``gnmt.py``, ``transformer_xl.py``, ``amoebanet.py``, ``wavenet.py``; Inception-v3 is
  :mod:`archplace.workloads.inception_v3`;
- ``capture.py``: a preset's module, its capture into an ``OpGraph`` (:func:`gdp_graph`), its layers and
  co-location groups;
- ``features.py``: :func:`node_features`, the per-node feature matrix for the placement policy.

No Ray import here. ``python -m archplace.workloads.gdp_models`` prints every preset's node count and
capture time.
"""

from .capture import (
    BYTES_PER_ELEMENT,
    build_module,
    colocation_groups,
    example_inputs,
    gdp_graph,
    num_parameters,
)
from .features import node_features
from .lstm import LSTMCell, lstm_cell_params
from .presets import GDP_PRESETS, GdpPreset, gdp_preset
from .wavenet import wavenet_block_params

__all__ = ["BYTES_PER_ELEMENT", "GDP_PRESETS", "GdpPreset", "LSTMCell", "build_module", "colocation_groups",
           "example_inputs", "gdp_graph", "gdp_preset", "lstm_cell_params", "node_features", "num_parameters",
           "wavenet_block_params"]
