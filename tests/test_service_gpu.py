"""The service's pipeline operation takes issue 30's GPU fields (``gpu``, ``op_model``, ``dtype``,
``attention``) and gives what the API gives. Before, ``PipelineRequest`` of the service had none of them:
a client could only plan on Auto-MAP's V100s under the roofline, while the CLI could choose the GPU."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from archplace import api
from archplace.service.operations import run_operation
from archplace.service.schemas import GPU_NAMES, PipelineRequest


def test_pipeline_operation_runs_on_a_gpu_preset_with_its_op_model():
    body = PipelineRequest(model="bert-base", cluster="A", gpu="h200", op_model="calibrated", dtype="bf16",
                           attention="sdpa").model_dump(mode="json")
    got = run_operation("pipeline", body)
    want = api.pipeline(api.PipelineRequest(model="bert-base", cluster="A", gpu="h200", op_model="calibrated",
                                            dtype="bf16", attention="sdpa")).to_dict()
    assert got["op_model"] == want["op_model"] and got["op_model"]["op_model"] == "calibrated"
    assert got["optimum"]["length_s"] == want["optimum"]["length_s"] > 0
    assert got["optimum"]["cuts"] == want["optimum"]["cuts"]
    # the default request is Auto-MAP's V100 roofline, as before the fields existed
    plain = run_operation("pipeline", PipelineRequest(model="bert-base", cluster="A").model_dump(mode="json"))
    assert "op_model" not in plain and plain["optimum"]["length_s"] != got["optimum"]["length_s"]


def test_pipeline_request_names_the_gpu_field_and_its_allowed_values():
    assert "p100-pcie" not in GPU_NAMES and {"h200", "a100-80gb", "v100-sxm2"} <= set(GPU_NAMES)
    with pytest.raises(ValidationError, match="gpu"):
        PipelineRequest(model="bert-base", gpu="p100-pcie")   # no NVLink: no pipeline server
    with pytest.raises(ValidationError, match="op_model"):
        PipelineRequest(model="bert-base", op_model="profiled")  # a profile file is not on the server


# ---------------------------------------------------------------------------------------- plan
# the request of the tests of ``POST /v1/plans``: Llama 2 7B on one server of 8 A100s
PLAN = {"model": "llama2-7b", "gpus": 8, "global_batch": 64, "gpu": "a100-80gb", "seq": 2048, "top_k": 2}


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    from service_core_util import HttpApp

    a = HttpApp(tmp_path_factory.mktemp("plan") / "s.db")
    yield a
    a.close()


def test_a_plan_operation_gives_the_apis_plan(http):
    """``POST /v1/plans`` (here through ``Client.plan``) queues an operation whose request carries every
    field of ``api.PlanRequest`` with its default, and the operation's body (``run_operation``, what the
    Ray task runs) returns what ``api.plan`` returns: the same best knobs and step time."""
    import dataclasses

    from archplace.client import Client
    from archplace.service.schemas import PlanRequest as ServicePlanRequest

    assert list(ServicePlanRequest.model_fields) == [f.name for f in dataclasses.fields(api.PlanRequest)]
    c = Client(http.url, retry_deadline_s=0)
    op = c.plan(PLAN["model"], PLAN["gpus"], PLAN["global_batch"], gpu="a100-80gb", seq=2048, top_k=2,
                wait=False)
    assert op["kind"] == "plan" and op["state"] == "PENDING" and not op["done"]
    want_request = api.PlanRequest(**PLAN).to_dict()
    assert op["request"] == want_request
    # the same request again while it is queued is the same operation (no second run)
    assert http.post("/v1/plans", PLAN).json()["id"] == op["id"]
    assert c.operation(op["id"])["kind"] == "plan"
    spec = http.get("/openapi.json").json()
    assert spec["paths"]["/v1/plans"]["post"]["responses"].keys() >= {"202", "422"}

    got = run_operation("plan", op["request"])
    want = api.plan(api.PlanRequest(**PLAN)).to_dict()
    assert got["fits"] and got["best"]["step_time_s"] == want["best"]["step_time_s"] > 0
    knobs = ("tp", "pp", "dp", "cp", "vp", "mbs", "recompute", "sequence_parallel", "zero", "attention")
    assert {k: got["best"][k] for k in knobs} == {k: want["best"][k] for k in knobs}
    assert {k: v for k, v in got.items() if k != "wall_s"} == {k: v for k, v in want.items() if k != "wall_s"}


@pytest.mark.parametrize(
    "change, field, says",
    [
        ({"gpus": 0}, "gpus", "greater than or equal to 1"),
        ({"gpus": True}, "gpus", "integer"),
        ({"model": "t5-base"}, "model", "one stack of blocks"),   # encoder-decoder: two stacks
        ({"model": "hf:/etc/passwd"}, "model", "allowed"),         # never a file on the server
        ({"gpu": "p100-pcie"}, "gpu", "a100-80gb"),                # no NVLink
        ({"gpu": "/tmp/my.json"}, "gpu", "a100-80gb"),             # a GPU file is not on the server
        ({"instance": "p9.large"}, "instance", "p4d.24xlarge"),
        ({"top_k": 101}, "top_k", "less than or equal to 100"),
        ({"fixed": {"tpp": 2}}, "fixed.tpp.[key]", "sequence_parallel"),
        ({"fixed": {"recompute": "most"}}, "body", "fixed"),
        ({"gpu": None}, "body", "gpu or instance is required"),
        ({"gpus": 12}, "body", "gpus 12 is not a whole number of servers"),
        ({"seq": 8192}, "body", "seq 8192 exceeds"),
        ({"overlap": 1}, "overlap", "boolean"),
        ({"budget": 5}, "budget", "Extra inputs"),
    ],
)
def test_bad_plan_requests_are_422_naming_the_field(http, change, field, says):
    r = http.post("/v1/plans", {**PLAN, **change})
    assert r.status_code == 422, (r.status_code, r.text)
    msg = r.json()["error"]["message"]
    assert msg.startswith(field + ":") and says in msg and "\n" not in msg, msg
