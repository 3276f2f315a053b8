"""``place --tp-from shard`` (issue 34, deliverable 5): the TP slices from the sharding that ``shard --algo
ilp`` finds. Where the ILP plan is Megatron's (T5-base at widths 2 and 4: every q, k, v and wi by
columns, o and wo by rows, the shared vocabulary split), the derived role table is the built-in one and
the slices are the role tables' node for node; where it is not, the slicer follows it or says in one
line, naming ``tp_from``, why it cannot."""

from __future__ import annotations

import numpy as np
import pytest

from archplace import api
from archplace.api.sharding import ShardRequest, shard
from archplace.api.tp_shard import retag, roles_from_plan, shard_graph_fn
from archplace.workloads.models import build_graph
from archplace.workloads.tp_roles import TP_ROLES

SEQ = 128


@pytest.mark.parametrize("t", [2, 4])
def test_where_the_ilp_plan_is_megatrons_the_slices_are_the_role_tables(t):
    plan = shard(ShardRequest("t5-base", devices=t, algo="ilp", seq=SEQ, batch=1))
    assert plan.status == "optimal" and plan.reference["differs"] == 0   # the plan equals Megatron's
    source, graph_fn = shard_graph_fn("t5-base", [t], SEQ, 1, 3)
    w = source["widths"][t]
    assert w["equals_role_tables"] and w["differences"] == [] and w["vocab_split"] and w["heads_split"]
    assert w["roles"] == {k: TP_ROLES["t5"][k] for k in w["roles"]} and len(w["roles"]) == 10
    # relative_attention_bias split on the heads: outside the slicer's roles, so listed, not silent
    assert any("relative_attention_bias" in n for n in w["not_applied"])
    got = graph_fn("t5-base", seq=SEQ, mbs=1, tmp=t, capture_blocks=3)
    want = build_graph("t5-base", seq=SEQ, mbs=1, tmp=t, capture_blocks=3)
    assert got.meta == want.meta
    for c in want.nodes:
        assert np.array_equal(got.nodes[c], want.nodes[c]), c
    for c in want.edges:
        assert np.array_equal(got.edges[c], want.edges[c]), c


def test_a_replicated_unit_and_vocabulary_lose_their_roles():
    fwd = build_graph("t5-base", seq=SEQ, mbs=1, tmp=1, training=False)
    roles = dict(TP_ROLES["t5"], **{f"SelfAttention.{p}": "replicate" for p in "qkvo"})
    g = retag(fwd, roles, vocab_split=False, attention_split=True)
    name, old, new = fwd.nodes["name"], fwd.nodes["tp_role"], g.nodes["tp_role"]
    self_attn = np.array(["SelfAttention" in str(n) for n in name])
    assert (old[self_attn] != "").any() and (new[self_attn] == "").all()
    rest = ~self_attn & (old != "vocab")
    assert np.array_equal(new[rest], old[rest])          # cross-attention and MLP keep Megatron's roles
    assert (old == "vocab").any() and not (new == "vocab").any()
    assert g.meta["heads"] == fwd.meta["heads"]
    # no attention split at all: the width need not divide the heads
    none = dict(roles, **{f"EncDecAttention.{p}": "replicate" for p in "qkvo"})
    assert "heads" not in retag(fwd, none, vocab_split=True, attention_split=False).meta


def test_plans_the_slicer_cannot_follow_are_one_line_naming_tp_from():
    block = "h.*/attn/{}/kernel"
    ok = {block.format(p): -1 for p in "qkvo"}
    ok |= {"h.*/mlp/c_fc/kernel": 1, "h.*/mlp/c_proj/kernel": 0, "wte": -1}
    roles, vocab, not_applied = roles_from_plan("gpt2", ok, 2)
    assert roles == {"attn.c_attn": "replicate", "attn.c_proj": "replicate", "mlp.c_fc": "col",
                     "mlp.c_proj": "row"} and not vocab and not_applied == []
    for bad, says in (({**ok, block.format("q"): [1, -1]}, "differently across blocks"),
                      ({**ok, block.format("q"): 1}, "two roles"),             # q split, k and v whole
                      ({**ok, "h.*/mlp/c_fc/kernel": 0}, "mlp")):            # c_fc by rows
        with pytest.raises(ValueError, match=says) as e:
            roles_from_plan("gpt2", bad, 2)
        assert str(e.value).startswith("tp_from") and "\n" not in str(e.value)


def test_tp_from_is_checked():
    for model, says in (("opt-350m", "t5-base"), ("bert-base", None)):
        req = api.PlaceRequest(model, "tpuv4", tp_from="shard")
        if says is None:
            req.validate()
            continue
        with pytest.raises(ValueError, match="tp_from") as e:
            req.validate()
        assert says in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="tp_from"):
        api.PlaceRequest("bert-base", "tpuv4", tp_from="tables").validate()


def test_place_reports_both_and_the_default_output_is_unchanged():
    kw = dict(accelerators=8, global_batch=8, sequential=True, fixed=(1, 4, 2), seq=SEQ, hbm_gb=(32.0,))
    roles = api.place(api.PlaceRequest("t5-base", "tpuv4", **kw))
    assert "tp_source" not in roles.to_dict()               # the golden JSON of place stays as it was
    both = api.place(api.PlaceRequest("t5-base", "tpuv4", tp_from="shard", **kw)).to_dict()
    src = both["tp_source"]
    assert list(src["widths"]) == [2] and src["widths"][2]["equals_role_tables"]
    # equal slices, equal answer: the role tables' placement beside it is this one
    assert src["roles"]["throughput"] == both["throughput"] == roles.throughput > 0
