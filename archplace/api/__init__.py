"""archplace's one public Python API: typed requests in, typed results out.

The command line (``archplace.cli``), the service (``archplace.service``) and Python users
all call these functions, so that an answer does not depend on the door it was asked through: the
CLI only turns argv into a request and prints ``result.to_dict()``; the service turns JSON into a
request with ``from_dict`` and returns ``to_dict()``.

Every call is ``fn(request, *, progress=None, cancel=None) -> Result``:

* the request is a frozen dataclass with ``to_dict()`` / ``from_dict()`` (a JSON round trip; tuples
  travel as lists) and ``validate()``, which raises a one-line ``ValueError`` naming the field and
  what is allowed (``InvalidRequest`` where the field is known; each call validates first);
* the result is a dataclass whose ``to_dict()`` is plain JSON-able Python, the ``--json`` output of
  the matching CLI command;
* ``progress(stage, info)`` is called as each phase ends (the stages are in each function's
  docstring, the last is always ``done``); ``cancel``, a ``threading.Event``, is checked between
  phases and raises ``Cancelled``;
* nothing prints, and nothing changes process-wide state: no ``ray.init`` (the algorithms that need
  Ray raise RuntimeError unless it runs; ``archplace.platform.search.connect`` starts or attaches it),
  no environment variables, no logging configuration. ``search`` is the exception, see its docstring.

Importing this package imports neither Ray nor the heavy model libraries; each call imports what it
needs.
"""

from ._common import Cancelled, InvalidRequest, ProgressFn, strict_json
from .gpu_estimate import GpuEstimateRequest, GpuEstimateResult, estimate_gpu
from .graphs import (
    EstimateRequest,
    EstimateResult,
    GraphRequest,
    GraphResult,
    estimate,
    from_hf_config,
    from_module,
    graph,
    graph_summary,
    load_accelerator,
    load_graph,
)
from .operator_placement import PLACE_OPS_ALGOS, PlaceOpsRequest, PlaceOpsResult, place_ops
from .partitioning import PARTITION_ALGOS, PartitionRequest, PartitionResult, partition
from .pipelining import PIPELINE_ALGOS, PipelineRequest, PipelineResult, pipeline
from .placement import PlaceRequest, PlaceResult, SolveDpRequest, SolveDpResult, place, solve_dp
from .planning import PlanRequest, PlanResult, plan
from .profiling import (
    PROFILE_DEVICES,
    PROFILE_DTYPES,
    PROFILE_METHODS,
    ProfileRequest,
    ProfileResult,
    profile,
)
from .searching import RECOMPUTE, SearchRequest, SearchResult, search

__all__ = [
    "PARTITION_ALGOS", "PIPELINE_ALGOS", "PLACE_OPS_ALGOS", "PlaceOpsRequest", "PlaceOpsResult", "place_ops",
    "RECOMPUTE", "Cancelled", "EstimateRequest", "EstimateResult", "GpuEstimateRequest",
    "GpuEstimateResult", "estimate_gpu",
    "GraphRequest", "GraphResult", "InvalidRequest", "PartitionRequest", "PartitionResult",
    "PipelineRequest", "PipelineResult", "PROFILE_DEVICES", "PROFILE_DTYPES", "PROFILE_METHODS",
    "ProfileRequest", "ProfileResult", "profile",
    "PlaceRequest", "PlaceResult", "PlanRequest", "PlanResult", "ProgressFn", "SearchRequest",
    "SearchResult", "SolveDpRequest", "SolveDpResult", "estimate", "from_hf_config", "from_module", "graph",
    "graph_summary",
    "load_accelerator", "load_graph", "partition", "pipeline", "place", "plan", "search", "solve_dp",
    "strict_json",
]
