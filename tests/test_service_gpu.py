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
