"""Exact capture of heterogeneous block stacks: dense then mixture-of-experts layers (Qwen2-MoE's
``mlp_only_layers`` and ``decoder_sparse_step``, DeepSeek's ``first_k_dense_replace``) and sliding /
global attention in turn (Gemma-2, Gemma-3's five local layers per global one).

Each config's graph must hold exactly the parameters ``transformers`` counts for the same config (built
here on the meta device), the kinds found must be the ones the config defines, and the graph grown
from the captured blocks must equal a capture of every block. Tiny widths keep each capture to
seconds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from archplace import api
from archplace.workloads.block_kinds import ParameterMismatchError, capture_depth, covers

SEQ = 16
_LM = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
           max_position_embeddings=64)
_QWEN2_MOE = dict(_LM, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_hidden_layers=6,
                  intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                  num_experts=4, num_experts_per_tok=2)
# name -> (config, each block's kind, blocks captured at the default capture_blocks=3)
CASES = {
    # the case: dense layers 0-2, MoE after (18% of the parameters went missing)
    "qwen2_moe_mlp_only_layers": (dict(_QWEN2_MOE, mlp_only_layers=[0, 1, 2]), [0, 0, 0, 1, 1, 1], 5),
    # MoE on every second layer ((i + 1) % 2 == 0)
    "qwen2_moe_sparse_step": (dict(_QWEN2_MOE, decoder_sparse_step=2), [0, 1, 0, 1, 0, 1], 4),
    # DeepSeek-V3: three dense layers first (every MoE layer went missing)
    "deepseek_v3_first_k_dense": (
        dict(_LM, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", num_hidden_layers=6,
             num_key_value_heads=4, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4,
             n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=3, n_group=1, topk_group=1,
             q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8),
        [0, 0, 0, 1, 1, 1], 5),
    # Gemma-2: sliding and global attention in turn (layer_types)
    "gemma2_alternating": (dict(_LM, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                                num_hidden_layers=6, intermediate_size=64, head_dim=8, sliding_window=8),
                           [0, 1, 0, 1, 0, 1], 4),
    # Gemma-3: five sliding layers, then a global one
    "gemma3_five_to_one": (dict(_LM, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                num_hidden_layers=8, intermediate_size=64, head_dim=8, sliding_window=8),
                           [0, 0, 0, 0, 0, 1, 0, 0], 7),
}


def _transformers_count(cfg: dict) -> int:
    cfg = dict(cfg)
    cls = getattr(transformers, cfg.pop("architectures")[0])
    cfg.pop("model_type")
    with torch.device("meta"):
        model = cls(cls.config_class(**cfg))
    return sum(p.numel() for p in model.parameters())  # each parameter once, as num_parameters()


@pytest.mark.parametrize("name", list(CASES))
def test_heterogeneous_stack_has_transformers_parameter_count(name):
    cfg, kinds, captured = CASES[name]
    g = api.from_hf_config(cfg, seq=SEQ, training=False)
    assert api.graph_summary(g)["parameters"] == _transformers_count(cfg)
    assert g.meta["block_kinds"] == {"model.layers": kinds}
    assert g.meta["captured_blocks"] == {"model.layers": captured}
    layers = [n for n in g.meta["layers"] if n.startswith("model.layers.")]
    assert layers == [f"model.layers.{i}" for i in range(len(kinds))]  # the model's layer order


@pytest.mark.parametrize("name", ["qwen2_moe_mlp_only_layers", "gemma2_alternating"])
def test_grown_stack_equals_a_capture_of_every_block(name):
    cfg, kinds, _ = CASES[name]
    grown = api.from_hf_config(cfg, seq=SEQ, mbs=2, training=False)
    full = api.from_hf_config(cfg, seq=SEQ, mbs=2, training=False, capture_blocks=len(kinds))
    assert full.meta["captured_blocks"] == {"model.layers": len(kinds)}
    assert grown.meta["layers"] == full.meta["layers"]
    for col in ("kind", "core", "layer", "gemm_b", "gemm_m", "gemm_n", "gemm_k", "flops", "input_bytes",
                "output_bytes", "weight_bytes", "tp_role"):
        assert np.array_equal(grown.nodes[col], full.nodes[col]), col
    for a, b in zip(grown.edge_pos, full.edge_pos):
        assert np.array_equal(a, b)
    assert np.array_equal(grown.edges["bytes"], full.edges["bytes"])
    # the MoE layers' expert GEMMs are where the model has them
    moe = [i for i, k in enumerate(kinds) if k == 1]
    nd = grown.nodes
    expert_layers = {grown.meta["layers"][li] for li, n in zip(nd["layer"], nd["name"])
                     if ".mlp.experts/" in n}
    if name.startswith("qwen2_moe"):
        assert expert_layers == {f"model.layers.{i}" for i in moe}


def test_weights_rescaled_in_place_are_the_weights():
    """RWKV, when not training, divides every second block's output weights in place and halves the
    hidden state after it (rescale_every=2). The halving runs in the layer loop between blocks, so
    blocks 1 and 2 differ in their ops: a one-line error at the default capture, exact when every
    block is captured. The in-place update of a parameter from parameters alone is the parameter:
    its bytes stay with the block that computes with it."""
    cfg = dict(architectures=["RwkvForCausalLM"], model_type="rwkv", vocab_size=128, hidden_size=32,
               attention_hidden_size=32, intermediate_size=64, num_hidden_layers=6, context_length=64,
               rescale_every=2)
    with pytest.raises(ValueError, match=r"^stack 'rwkv.blocks': blocks 1 and 2 are of one kind but their "
                                         r"captured ops differ \(\d+ vs \d+ ops\); capture every block"):
        api.from_hf_config(cfg, seq=SEQ, training=False)
    g = api.from_hf_config(cfg, seq=SEQ, training=False, capture_blocks=6)
    assert api.graph_summary(g)["parameters"] == _transformers_count(cfg)
    nd, layers = g.nodes, g.meta["layers"]
    per_block = [int(nd["weight_bytes"][nd["layer"] == layers.index(f"rwkv.blocks.{i}")].sum())
                 for i in range(6)]
    assert len(set(per_block[1:])) == 1  # block 0 also holds the pre-LayerNorm


def test_capture_blocks_is_refused_for_graph_files(tmp_path):
    f = tmp_path / "graph.json"
    f.write_text("{}")
    with pytest.raises(ValueError, match="capture_blocks applies to captured models"):
        api.GraphRequest(str(f), capture_blocks=5).validate()


def test_heads_of_a_config_with_per_layer_attributes():
    """transformers' heterogeneous configs (Dots3-Note) refuse a global num_attention_heads; the
    tensor-parallel check takes what divides every layer's heads."""
    import math

    from archplace.workloads.hf_config import attention_heads

    cfg = transformers.Dots3NoteTextConfig()
    assert cfg.is_heterogeneous
    layers = cfg.per_layer_config
    want = {k: math.gcd(*(getattr(c, k) for c in layers))
            for k in ("num_attention_heads", "num_key_value_heads")}
    assert attention_heads(cfg) == want


def test_capture_depth_closed_forms():
    """The fewest leading blocks holding every (kind before, kind) pair at a position >= 2 and
    ending on the last block's kind."""
    assert capture_depth([0] * 96, 3) == 3                       # homogeneous: as before
    assert capture_depth([0] + [1] * 11, 3) == 3                 # T5: block 0 differs
    assert capture_depth([0] * 3 + [1] * 58, 3) == 5             # DeepSeek-V3: 3 dense, then MoE
    assert capture_depth([0, 1] * 23, 3) == 4                    # Gemma-2: alternating
    assert capture_depth(([0] * 5 + [1]) * 10 + [0] * 2, 3) == 7  # Gemma-3: 5 local, 1 global
    assert capture_depth([0] * 9 + [1], 3) == 10                 # a last block of its own kind: all
    assert capture_depth([0] * 12, 20) == 12                     # never more than the stack
    assert covers([0, 0, 0, 1, 1, 1], 5) and not covers([0, 0, 0, 1, 1, 1], 4)


def test_cli_capture_blocks_and_stack_summary(tmp_path, capsys):
    import json

    from archplace.cli import main

    cfg, kinds, captured = CASES["qwen2_moe_mlp_only_layers"]
    path = tmp_path / "qwen2_moe.json"
    path.write_text(json.dumps(cfg))
    assert main(["graph", "--hf-config", str(path), "--seq", str(SEQ), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["stacks"] == {"model.layers": {"blocks": 6, "kinds": 2, "captured": captured}}
    assert res["parameters"] == _transformers_count(cfg)
    argv = ["graph", "--hf-config", str(path), "--seq", str(SEQ)]
    assert main([*argv, "--capture-blocks", "6", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["stacks"]["model.layers"]["captured"] == 6 and full["parameters"] == res["parameters"]
    assert main(["graph", "--hf-config", str(path), "--capture-blocks", "2", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "capture-blocks" in err and "got 2" in err and len(err.splitlines()) == 1


# HY-V4: a "shared" layer reuses the sparse-attention top-k of the last "full" layer, so block 3 reads
# block 1, two back: a block's inputs depend on where it sits, not on its kind, and copies of captured
# blocks cannot reproduce that
_HY_V4 = dict(architectures=["HYV4ForCausalLM"], model_type="hy_v4", vocab_size=128, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
              num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
              max_position_embeddings=64, n_routed_experts=4, num_experts_per_tok=2, q_lora_rank=16,
              kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, index_topk=4,
              index_head_dim=8, index_n_heads=2, mlp_layer_types=["dense"] * 8,
              layer_types=["indexed_attention"] * 8,
              indexer_types=["full", "full", "shared", "shared", "shared", "full", "shared", "shared"])


def test_unsupported_stack_is_a_one_line_error_and_a_full_capture_is_exact():
    with pytest.raises(ValueError) as e:
        api.from_hf_config(_HY_V4, seq=SEQ, training=False)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert msg.startswith("stack 'model.layers': block 3 reads block 1 (not its predecessor, not block 0)")
    assert msg.endswith("capture every block (capture_blocks=8)")
    g = api.from_hf_config(_HY_V4, seq=SEQ, training=False, capture_blocks=8)  # what the error suggests
    assert api.graph_summary(g)["parameters"] == _transformers_count(_HY_V4)


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.fc(x))


class _WithUnusedHead(nn.Module):
    """Two blocks and a head that forward never calls: its parameters are in the model, not the graph."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block(d), _Block(d)])
        self.unused = nn.Linear(d, 3)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return x


def test_blocks_sharing_a_parameter_are_all_captured():
    """A parameter two blocks hold (Zamba's shared transformer): which one a copy would read is not in
    the blocks' structure, so the whole stack is captured; without sharing, 3 blocks are."""
    from archplace.workloads.block_kinds import capture_depths, model_census

    m = _WithUnusedHead()
    m.layers.extend([_Block(8), _Block(8), _Block(8)])
    census = model_census(m, ["layers"])
    assert not census.stacks["layers"].shares_parameters
    assert capture_depths(census, 3, ["layers"]) == {"layers": 3}
    m.layers[3].fc = m.layers[1].fc
    census = model_census(m, ["layers"])
    assert census.stacks["layers"].shares_parameters
    assert capture_depths(census, 3, ["layers"]) == {"layers": 5}
    assert census.total_params == 4 * 72 + 27  # the shared Linear counted once, in block 1
    assert census.stacks["layers"].block_params == (72, 72, 72, 0, 72)


def test_parameter_mismatch_is_a_one_line_error_naming_what_differs():
    m = _WithUnusedHead()
    with pytest.raises(ParameterMismatchError) as e:
        api.from_module(m, torch.zeros(2, 8), training=False)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert "holds 144 parameters, the model 171" in msg   # 2·(8·8+8), and 8·3+3 more
    assert "outside the blocks 0 vs 27" in msg and "unused.weight" in msg and "unused.bias" in msg
    assert (e.value.graph_params, e.value.model_params) == (144, 171)
