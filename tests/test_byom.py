"""Bring your own model (``--hf-config``, ``from_hf_config``, ``from_module``) and no silent fallbacks:
unmapped aten ops, MoE expert GEMMs, tensor-parallel roles from the per-family table.

Small configs (4 blocks, 3 captured and one replicated) keep every capture to seconds; parameter
counts are compared with transformers' own model built on the meta device."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from archplace import api
from archplace.cli import main
from archplace.workloads.byom import find_layer_stacks, hf_model, hf_ref
from archplace.workloads.extract import UnmappedOpsError
from archplace.workloads.tp_roles import TP_ROLES, weight_role

SEQ = 32
_LM = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, vocab_size=512,
           max_position_embeddings=128)
CONFIGS = {
    "mistral": dict(_LM, architectures=["MistralForCausalLM"], model_type="mistral", intermediate_size=160,
                    num_key_value_heads=2),
    "qwen2": dict(_LM, architectures=["Qwen2ForCausalLM"], model_type="qwen2", intermediate_size=160,
                  num_key_value_heads=2, tie_word_embeddings=True),
    "gpt_neox": dict(_LM, architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox", intermediate_size=256),
    "vit": dict(architectures=["ViTForImageClassification"], model_type="vit", hidden_size=64,
                intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, image_size=32,
                patch_size=8, num_labels=10),
    "mixtral": dict(_LM, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=96,
                    num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2),
}


@pytest.fixture(scope="module")
def config_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    out = {}
    for name, cfg in CONFIGS.items():
        out[name] = d / f"{name}.json"
        out[name].write_text(json.dumps(cfg))
    return out


def _transformers_count(name: str) -> int:
    cfg = dict(CONFIGS[name])
    cls = getattr(transformers, cfg.pop("architectures")[0])
    cfg.pop("model_type")
    with torch.device("meta"):
        model = cls(cls.config_class(**cfg))
    return sum(p.numel() for p in model.parameters())


def _cli_graph(capsys, *argv: str) -> dict:
    assert main(["graph", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _seq(name: str) -> list[str]:
    return [] if name == "vit" else ["--seq", str(SEQ)]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_config_parameters_equal_transformers(name, config_files, capsys):
    res = _cli_graph(capsys, "--hf-config", str(config_files[name]), *_seq(name))
    assert res["parameters"] == _transformers_count(name)
    assert res["model"] == f"hf:{config_files[name].resolve()}"
    # 4 blocks: 3 captured, the 4th replicated, all one repeat group after block 0
    assert any(g["count"] >= 3 for g in res["repeated_layer_groups"])
    assert "unmapped_ops" not in res


def test_gqa_slicing_keeps_kv_heads(config_files):
    """Mistral-like GQA at t = 2: K and V project to 2 kv heads × 16, each device keeps one."""
    g1 = api.from_hf_config(config_files["mistral"], seq=SEQ, tmp=1, training=False)
    g2 = api.from_hf_config(config_files["mistral"], seq=SEQ, tmp=2, training=False)
    for g, t in ((g1, 1), (g2, 2)):
        nd = g.nodes
        k = [i for i in range(g.num_nodes) if "layers.1.self_attn.k_proj" in nd["name"][i]
             and nd["core"][i] in ("tensor", "fused")]
        assert len(k) == 1 and nd["gemm_n"][k[0]] == 2 * 16 // t and nd["tp_role"][k[0]] == "col"


def test_mixtral_expert_gemm_flops_closed_form(config_files):
    """Top-k routing: each token runs through k of E experts, so the grouped expert GEMMs cost
    tokens · k · (2·h·2f + 2·f·h) per layer; the router a tokens × h × E GEMM."""
    c = CONFIGS["mixtral"]
    h, f, k, e, L = (c["hidden_size"], c["intermediate_size"], c["num_experts_per_tok"],
                     c["num_local_experts"], c["num_hidden_layers"])
    mbs = 2
    g = api.from_hf_config(config_files["mixtral"], seq=SEQ, mbs=mbs, training=False)
    nd = g.nodes
    tokens = mbs * SEQ
    gemm = 2.0 * nd["gemm_b"] * nd["gemm_m"] * nd["gemm_n"] * nd["gemm_k"]
    experts = np.array([".mlp.experts/" in s for s in nd["name"]]) & (nd["gemm_m"] > 0)
    router = np.array([".mlp.gate/" in s for s in nd["name"]]) & (nd["gemm_m"] > 0)
    assert experts.sum() == 2 * L and router.sum() == L
    assert gemm[experts].sum() == L * tokens * k * (2 * h * 2 * f + 2 * f * h)
    assert gemm[router].sum() == L * 2 * tokens * h * e
    # all E experts' weights are held (and counted once), only k of them run per token
    assert nd["weight_bytes"][experts].sum() == L * e * 3 * h * f * 2
    assert g.meta["unmapped_ops"] == []


def test_gpt_neox_tensor_parallel_slices_attention_and_mlp(config_files):
    """GPT-NeoX at t = 2 (``attention.dense`` was not sliced by the old name guess): every block's
    attention and MLP weights are exactly halved, and each block has its two forward AllReduces."""
    g1 = api.from_hf_config(config_files["gpt_neox"], seq=SEQ, tmp=1, training=False)
    g2 = api.from_hf_config(config_files["gpt_neox"], seq=SEQ, tmp=2, training=False)
    mods = ("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
    layers = g1.meta["layers"]
    blocks = [i for i, n in enumerate(layers) if n.startswith("gpt_neox.layers.")]
    assert len(blocks) == 4 and g2.meta["layers"] == layers

    def block_weights(g, li, mod):
        nd = g.nodes
        return sum(int(nd["weight_bytes"][i]) for i in range(g.num_nodes)
                   if nd["layer"][i] == li and f".{mod}/" in nd["name"][i])

    for li in blocks:
        for mod in mods:
            w1, w2 = block_weights(g1, li, mod), block_weights(g2, li, mod)
            assert w1 > 0 and w2 * 2 == w1, (layers[li], mod)
        ar = (g2.nodes["kind"] == "allreduce") & (g2.nodes["layer"] == li)
        names = sorted(g2.nodes["name"][ar])
        assert len(names) == 2 and ".attention.dense/" in names[0] and ".mlp.dense_4h_to_h/" in names[1]
    # outside the blocks the embedding (512 x 64) and the untied LM head (64 -> 512) split by vocabulary
    # (256 rows each, 2 bytes); the final LayerNorm (weight + bias of 64) stays whole
    other = ~np.isin(g2.nodes["layer"], blocks)
    other1 = ~np.isin(g1.nodes["layer"], blocks)
    assert g1.nodes["weight_bytes"][other1].sum() == 2 * 512 * 64 * 2 + 2 * 64 * 2
    assert g2.nodes["weight_bytes"][other].sum() == 2 * 256 * 64 * 2 + 2 * 64 * 2


def test_hf_model_widths_and_stacks(config_files):
    m = hf_model(hf_ref(config_files["mistral"]))
    assert m.stacks == {"model.layers": 4} and m.depth_keys == {"num_hidden_layers": 4}
    assert m.tmp_widths == (1, 2)  # 2 kv heads: t = 4 cannot split them
    assert m.num_parameters == _transformers_count("mistral")
    v = hf_model(hf_ref(config_files["vit"]))
    assert v.seq_len == (32 // 8) ** 2 + 1 and v.main_input == "pixel_values"


# ---------------------------------------------------------------------- tensor-parallel role table
_TINY = {
    "bert": (transformers.BertModel, dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=64, vocab_size=64)),
    "gpt2": (transformers.GPT2LMHeadModel, dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64)),
    "opt": (transformers.OPTForCausalLM, dict(hidden_size=32, num_hidden_layers=1, ffn_dim=64,
                                              num_attention_heads=2, word_embed_proj_dim=32,
                                              vocab_size=64)),
    "llama": (transformers.LlamaForCausalLM, dict(hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=1, num_attention_heads=2,
                                                  vocab_size=64)),
    "t5": (transformers.T5ForConditionalGeneration, dict(d_model=32, d_ff=64, d_kv=16, num_layers=1,
                                                         num_heads=2, vocab_size=64)),
    "mistral": (transformers.MistralForCausalLM, dict(hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=1, num_attention_heads=2,
                                                      vocab_size=64)),
    "qwen2": (transformers.Qwen2ForCausalLM, dict(hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=1, num_attention_heads=2,
                                                  vocab_size=64)),
    "mixtral": (transformers.MixtralForCausalLM, dict(hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=1, num_attention_heads=2,
                                                      num_local_experts=4, vocab_size=64)),
    "gpt_neox": (transformers.GPTNeoXForCausalLM, dict(hidden_size=32, intermediate_size=64,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       vocab_size=64)),
    "vit": (transformers.ViTModel, dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, image_size=16, patch_size=8)),
}


def test_role_table_covers_every_family_block_weight():
    """Every GEMM weight (2-D or 3-D, not an embedding) inside the blocks of each family in the table
    has a role, and each block has column and row GEMMs."""
    assert set(_TINY) == set(TP_ROLES)
    for family, (cls, kw) in _TINY.items():
        with torch.device("meta"):
            model = cls(cls.config_class(**kw))
        stacks = [s for s, _ in find_layer_stacks(model)]
        assert stacks, family
        emb = {n for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
        roles = set()
        for pname, p in model.named_parameters():
            if p.ndim < 2 or not any(pname.startswith(s + ".") for s in stacks):
                continue
            if pname.rsplit(".", 1)[0] in emb:
                continue
            role = weight_role(pname, TP_ROLES[family])
            assert role is not None, f"{family}: {pname} has no role"
            roles.add(role)
        assert {"col", "row"} <= roles, family


def test_weight_role_matches_whole_components():
    assert weight_role("model.layers.3.self_attn.o_proj.weight", TP_ROLES["llama"]) == "row"
    assert weight_role("model.layers.3.mlp.experts.gate_up_proj", TP_ROLES["mixtral"]) == "col"
    assert weight_role("model.layers.3.mlp.gate.weight", TP_ROLES["mixtral"]) == "replicate"
    assert weight_role("encoder.layer.0.attention.output.dense.bias", TP_ROLES["bert"]) == "row"
    assert weight_role("x.my_fc1.weight", TP_ROLES["opt"]) is None  # "fc1" is a whole component only
    assert weight_role("pooler.dense.weight", TP_ROLES["bert"]) is None


# ---------------------------------------------------------------------- from_module and clear errors
class _Block(nn.Module):
    def __init__(self, d: int, op=None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.in_proj = nn.Linear(d, 4 * d)
        self.out_proj = nn.Linear(4 * d, d)
        self.op = op

    def forward(self, x):
        y = torch.relu(self.in_proj(self.norm(x)))
        if self.op is not None:
            y = self.op(y)
        return x + self.out_proj(y)


class _Net(nn.Module):
    def __init__(self, d: int = 16, n: int = 3, op=None) -> None:
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.blocks = nn.ModuleList([_Block(d, op) for _ in range(n)])

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return x


def test_unmapped_op_is_an_error_naming_it():
    x = torch.zeros(2, 8, 16)
    with pytest.raises(UnmappedOpsError, match=r"unmapped aten ops cumprod \(first in blocks\.0\)"
                                               r".*allow_unmapped_ops=True \(CLI: --allow-unmapped-ops\)"):
        api.from_module(_Net(op=lambda y: torch.cumprod(y, dim=-1)), x)
    with pytest.warns(UserWarning, match=r"unmapped aten ops counted as element-wise vector ops: "
                                         r"\['cumprod'\]"):
        g = api.from_module(_Net(op=lambda y: torch.cumprod(y, dim=-1)), x, allow_unmapped_ops=True)
    assert g.meta["unmapped_ops"] == ["cumprod"]
    assert api.graph_summary(g)["unmapped_ops"] == ["cumprod"]


def test_unknown_tp_role_is_an_error_naming_the_module():
    x = torch.zeros(2, 8, 16)
    net = _Net()
    g = api.from_module(net, x, training=False)  # t = 1 needs no roles
    assert g.meta["tp_unknown"] == ["blocks.0.in_proj", "blocks.0.out_proj", "blocks.1.in_proj",
                                    "blocks.1.out_proj", "blocks.2.in_proj", "blocks.2.out_proj"]
    with pytest.raises(ValueError, match=r"block GEMM in module 'blocks\.0\.in_proj' \(and 5 more\) has no "
                                         r"tensor-parallel role for family None; families with a role "
                                         r"table: \['bert', "):
        api.from_module(net, x, tmp=2)
    # with a table the same module slices: each block's GEMM weights halve, one AllReduce per block
    roles = {"in_proj": "col", "out_proj": "row"}
    full = api.from_module(net, x, tp_roles=roles, training=False)
    half = api.from_module(net, x, tp_roles=roles, tmp=2, training=False)
    blk = [i for i, n in enumerate(full.meta["layers"]) if n.startswith("blocks.")]
    assert len(blk) == 3
    for li in blk:
        w1 = full.nodes["weight_bytes"][(full.nodes["layer"] == li) & (full.nodes["core"] != "vector")].sum()
        w2 = half.nodes["weight_bytes"][(half.nodes["layer"] == li) & (half.nodes["core"] != "vector")].sum()
        assert w2 * 2 == w1
        assert ((half.nodes["kind"] == "allreduce") & (half.nodes["layer"] == li)).sum() == 1
    with pytest.raises(ValueError, match=r"tp_roles\['in_proj'\] is 'column'; allowed: \['col', 'row', "
                                         r"'replicate'\]"):
        api.from_module(net, x, tp_roles={"in_proj": "column"})


def test_from_module_layer_stack_found_or_named():
    """ViT's stack (``vit.layers`` in transformers 5, ``vit.encoder.layer`` before) needs no guess."""
    cfg = transformers.ViTConfig(**{k: v for k, v in CONFIGS["vit"].items()
                                    if k not in ("architectures", "model_type")},
                                 attn_implementation="eager")
    with torch.device("meta"):
        vit = transformers.ViTForImageClassification(cfg)
    pix = torch.zeros(1, 3, 32, 32, device="meta")
    g = api.from_module(vit, pix, training=False)
    assert [n for n in g.meta["layers"] if n.startswith("vit.")] == [f"vit.layers.{i}" for i in range(4)]
    assert api.graph_summary(g)["parameters"] == _transformers_count("vit")
    assert g.nodes["kind"][-1] == "cross_entropy"  # a classification head: loss appended

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.ModuleList([_Block(16) for _ in range(2)])
            self.dec = nn.ModuleList([_Block(16) for _ in range(2)])

        def forward(self, x):
            for b in [*self.enc, *self.dec]:
                x = b(x)
            return x

    with pytest.raises(ValueError, match=r"layer_stack: the module tree has 2 candidate block stacks "
                                         r"\['enc', 'dec'\]; name them"):
        api.from_module(Two(), torch.zeros(1, 4, 16))
    with pytest.raises(ValueError, match=r"layer_stack 'encoder\.layer' is not a ModuleList in the module; "
                                         r"candidates: \['vit\.layers'\]"):
        api.from_module(vit, pix, layer_stack="encoder.layer")
    two = api.from_module(Two(), torch.zeros(1, 4, 16), layer_stack=("enc", "dec"), training=False)
    assert [n for n in two.meta["layers"] if "." in n] == ["enc.0", "enc.1", "dec.0", "dec.1"]


@pytest.mark.parametrize("argv, message", [
    (["graph", "--hf-config", "/nonexistent/config.json"],
     "hf-config '/nonexistent/config.json' does not exist"),
    (["graph"], "MODEL or --hf-config CONFIG.json is required"),
    (["graph", "bert-base", "--hf-config", "x.json"], "give MODEL or --hf-config, not both"),
    (["search", "--max-archs", "1"], "give one or more MODELs or --hf-config CONFIG.json"),
])
def test_cli_model_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_bad_config_fields(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"]}))
    assert main(["graph", "--hf-config", str(tmp_path)]) == 2  # a directory holding config.json works
    assert "field 'architectures': 'NoSuchModelForCausalLM' is not a model class" in capsys.readouterr().err
    bad.write_text(json.dumps({"hidden_size": 4}))
    assert main(["estimate", "--hf-config", str(bad), "--arch", "tpuv4"]) == 2
    assert "needs 'architectures' (a transformers model class) or 'model_type'" in capsys.readouterr().err


def test_allow_unmapped_ops_travels_in_the_reference(config_files):
    ref = hf_ref(config_files["qwen2"], allow_unmapped_ops=True)
    assert ref.endswith("?allow-unmapped-ops")
    assert hf_model(ref).allow_unmapped_ops and not hf_model(hf_ref(config_files["qwen2"])).allow_unmapped_ops


def test_place_and_search_take_hf_configs(config_files, capsys):
    """``place`` runs the layer schedules and the DP on a config's graphs (its TMP widths 1 and 2);
    ``search`` checks a config before Ray starts, as it checks presets."""
    assert main(["place", "--hf-config", str(config_files["mistral"]), "--arch", "tpuv4", "--accelerators",
                 "2", "--global-batch", "2", "--seq", str(SEQ), "--sequential", "--hbm", "80", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["model"] == hf_ref(config_files["mistral"]) and res["placement"]["feasible"]
    assert {c["t"] for c in res["configs"]} <= {1, 2} and res["throughput"] > 0
    ref = hf_ref(config_files["gpt_neox"])
    api.SearchRequest(models=("bert-base", ref), accelerators=8, global_batch=8, budget=1).validate()
    with pytest.raises(ValueError, match="model 'nope' unknown; allowed: .*or a transformers config"):
        api.SearchRequest(models=("nope",), budget=1).validate()
