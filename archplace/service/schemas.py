"""The service's request and response models (pydantic v2).

Every request model forbids unknown fields, bounds every size (trials per suggest, models per study,
string lengths, list lengths, the search space's grid) and rejects NaN and infinities, so bad input
is a 422 naming the field and what is allowed before any work starts. Types are strict: nothing is
coerced (``true`` is not 1, ``"1"`` is not a count, ``1.0`` is not a trial number), and a space's axis
values are integer powers of two within int64. Nothing from a request is ever
unpickled, evaluated or used as a file path: architectures and models are preset names or plain
numbers.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..api.planning import KNOB_NAMES as _PLAN_KNOBS
from ..api.planning import instances as _plan_instances
from ..hardware.gpu_cluster_space import NETWORKS
from ..hardware.gpus import GPUS

# the GPU presets a pipeline request may name: those with NVLink (a pipeline server is 8 GPUs on NVLink)
GPU_NAMES = tuple(n for n, g in GPUS.items() if g.nvlink_bytes_per_s > 0)
_PLAN_INSTANCES = tuple(_plan_instances())  # plan's cloud instance types (hardware.cluster_prices)

LIMITS = {
    "body_bytes": 65_536,  # the whole request body
    "models_per_study": 8,
    "objectives_per_study": 4,
    "trials_per_suggest": 64,
    "space_grid_points": 1_000_000,  # product of the search space's axis lengths
    "page_size": 1000,
    "max_trials": 1_000_000,
    "reason_chars": 2000,
    "lease_s": 7 * 86_400,  # the longest trial lease a study may ask for
    # per owner, defaults of StudyService (a replica holds a study's space as arrays of ~40 bytes a
    # point while it serves it)
    "studies_per_owner": 100,
    "space_points_per_owner": 5_000_000,  # feasible architectures over all of an owner's studies
}

Name = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="letters, digits, '.', '_' and '-', at most 64, starting with a letter or digit",
    ),
]
ClientId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]


class Strict(BaseModel):
    # strict: JSON's true, "1" and 1.0 are not integers, true and "1" are not numbers
    model_config = ConfigDict(extra="forbid", str_max_length=4096, allow_inf_nan=False, strict=True)


def _digits(v: Any) -> Any:
    """A path's trial number is digits only: ``1.0``, ``1e0`` or ``+1`` would be coerced to 1."""
    if isinstance(v, str) and not re.fullmatch(r"[0-9]{1,10}", v):
        raise ValueError(f"must be a whole number written in digits, got {v[:20]!r}")
    return v


TrialNumber = Annotated[int, BeforeValidator(_digits)]


def _known_models() -> list[str]:
    from ..workloads.models import PRESETS

    return sorted(PRESETS)


def _check_models(models: list[str]) -> list[str]:
    known = _known_models()
    for m in models:
        if m not in known:
            raise ValueError(f"model {m!r} unknown; allowed: {known}")
    if len(set(models)) != len(models):
        raise ValueError(f"{models} lists a model twice")
    return models


# ---------------------------------------------------------------------------------------- studies
class Objective(Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    goal: Literal["maximize", "minimize"] = "maximize"


class StudyCreate(Strict):
    name: Name
    models: list[str] = Field(min_length=1, max_length=LIMITS["models_per_study"])
    searcher: Literal["phaze", "optuna", "random", "grid"] = "phaze"
    target: Literal["accelerator", "mcm"] = Field(
        default="accelerator",
        description="accelerator: the Phaze space; mcm: chiplet packages (tune_configs/mcm_codesign.yaml; "
        "a trial's params are one package; searchers random, grid, optuna)",
    )
    objectives: list[Objective] = Field(
        default_factory=lambda: [Objective(name="throughput")],
        min_length=1,
        max_length=LIMITS["objectives_per_study"],
    )
    space: dict[str, Any] | None = Field(
        default=None,
        description="a search space as the YAML of tune_configs/phaze_table1.yaml, as JSON; "
        "default: the Phaze Table 1 space",
    )
    max_area_mm2: Finite | None = Field(
        default=None, gt=0, le=10_000, description="constraint: only architectures of at most this area"
    )
    max_trials: int | None = Field(default=None, ge=1, le=LIMITS["max_trials"])
    seed: Seed = 0
    hysteresis: int = Field(default=6, ge=1, le=1000)
    area_bucket_mm2: Finite = Field(default=0.01, ge=0, le=1000)
    accelerators: int = Field(default=1024, ge=1, le=65_536, description="context for managed evaluation")
    global_batch: int = Field(default=4096, ge=1, le=2**24)
    lease_s: int = Field(
        default=3600,
        ge=1,
        le=LIMITS["lease_s"],
        description="a PENDING trial not completed or heart-beaten within this many seconds is "
        "ABANDONED and its architecture suggested again",
    )

    _check = field_validator("models")(classmethod(lambda cls, v: _check_models(v)))

    @field_validator("space")
    @classmethod
    def _space(cls, v: dict[str, Any] | None, info) -> dict[str, Any] | None:
        if v is not None:
            (_check_mcm_space if info.data.get("target") == "mcm" else _check_space)(v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> StudyCreate:
        names = [o.name for o in self.objectives]
        if len(set(names)) != len(names):
            raise ValueError(f"objectives: {names} names an objective twice")
        if self.target == "mcm" and (self.searcher == "phaze" or self.max_area_mm2 is not None):
            raise ValueError("target mcm: searcher must be random, grid or optuna, and max_area_mm2 is not "
                             "allowed (a package's cost and area are in each trial's params)")
        if self.searcher == "phaze" and self.objectives[0].goal != "maximize":
            raise ValueError(
                "objectives[0].goal: the phaze searcher maximises its first objective "
                "(throughput); use 'maximize' or another searcher"
            )
        return self


SPACE_FIELDS = {
    "architecture": None,  # checked field by field by load_space_config
    "constraints": {
        "pe_vc_equals_pe_x",
        "area_max_preset",
        "area_min_fraction",
        "area_min_exempt_single_core",
        "area_max_mm2",
    },
    "training": {"hbm_gb", "microbatch", "recompute"},
}


def _depth(x: Any) -> int:
    """How deeply lists and objects nest in ``x`` (iteratively: no recursion on hostile input)."""
    deepest, stack = 0, [(x, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict | list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


def _check_mcm_space(space: dict[str, Any]) -> None:
    """An MCM co-design space (``axes`` and ``cost``, as tune_configs/mcm_codesign.yaml): its shape and
    size here, its values by ``mcm_trial.load_space`` (one-line errors naming the axis)."""
    import json

    from ..platform.mcm_trial import load_space, space_size

    if _depth(space) > 3:
        raise ValueError("space: nested too deeply (an mcm space is axes.AXIS = [values] and cost.FIELD)")
    try:
        json.dumps(space, allow_nan=False)
    except ValueError:
        raise ValueError("space: NaN and infinite numbers are not allowed") from None
    axes = space.get("axes")
    if isinstance(axes, dict) and any(isinstance(v, list) and len(v) > 64 for v in axes.values()):
        raise ValueError("space: an mcm axis lists at most 64 values")
    n = space_size(load_space(space))
    if n > LIMITS["space_grid_points"]:
        raise ValueError(f"space: {n:,} points, more than {LIMITS['space_grid_points']:,}")


def _check_space(space: dict[str, Any]) -> None:
    import json

    from ..hardware.space import ARCH_FIELDS, _values, load_space_config

    # the shape first, so nothing below meets a type it does not expect (a TypeError would be a 500)
    if _depth(space) > 4:
        raise ValueError("space: nested too deeply (a space is architecture.FIELD.pow2 = [lo, hi] at most)")
    unknown = sorted(set(space) - set(SPACE_FIELDS))
    if unknown:
        raise ValueError(f"space: unknown field(s) {unknown}; allowed: {list(SPACE_FIELDS)}")
    try:
        json.dumps(space, allow_nan=False)
    except ValueError:
        raise ValueError("space: NaN and infinite numbers are not allowed") from None
    if not isinstance(space.get("architecture"), dict):
        raise ValueError(f"space.architecture must be an object with the fields {list(ARCH_FIELDS)}")
    for part in ("constraints", "training"):
        given = space.get(part)
        if given is None:
            continue
        if not isinstance(given, dict):
            raise ValueError(f"space.{part} must be an object")
        unknown = sorted(set(given) - SPACE_FIELDS[part])
        if unknown:
            raise ValueError(
                f"space.{part}: unknown field(s) {unknown}; allowed: {sorted(SPACE_FIELDS[part])}"
            )
        for k, v in given.items():
            items = v if part == "training" else [v]
            if not isinstance(items, list) or not all(isinstance(x, bool | int | float | str) for x in items):
                raise ValueError(
                    f"space.{part}.{k}: must be "
                    + (
                        "a list of numbers, strings or booleans"
                        if part == "training"
                        else "a number, string or boolean"
                    )
                )
    for f, spec in space["architecture"].items():  # before load_space_config reads them as floats
        _check_axis(f, spec)
    cfg = load_space_config(space)  # field errors name the field
    points = 1
    for f in ARCH_FIELDS:
        points *= len(_values(cfg["architecture"][f], f"architecture.{f}"))
    if points > LIMITS["space_grid_points"]:
        raise ValueError(
            f"space: the grid has {points:,} points; at most {LIMITS['space_grid_points']:,} are allowed"
        )


def _check_axis(f: str, spec: Any) -> None:
    """An axis is ``{pow2: [lo, hi]}`` with integers, or a list of integer powers of two within int64:
    a fractional or overflowing value passed the old check and made every suggest fail."""
    where = f"space.architecture.{f}"
    if isinstance(spec, dict):
        bounds = spec.get("pow2")
        if not (
            isinstance(bounds, list) and len(bounds) == 2 and all(type(b) is int for b in bounds)
        ):
            raise ValueError(f"{where}.pow2 must be [lo, hi], two integers, got {bounds!r}")
        return
    if isinstance(spec, list):
        for v in spec:
            if type(v) is not int or not 1 <= v <= 2**62 or v & (v - 1):
                raise ValueError(
                    f"{where}: {v!r} is not allowed; values must be integer powers of two from 1 to 2^62"
                )


class Study(BaseModel):
    name: str
    resource: str  # owners/OWNER/studies/NAME
    owner: str
    config: dict[str, Any]
    space_size: int  # feasible architectures under the constraints
    trials: int
    created_at: float
    state: Literal["ACTIVE", "DONE"]
    done_reason: str | None = None


class StudyList(BaseModel):
    studies: list[Study]
    next_page_token: str | None = None


# ---------------------------------------------------------------------------------------- trials
class SuggestRequest(Strict):
    count: int = Field(
        default=1,
        ge=1,
        le=LIMITS["trials_per_suggest"],
        description="trials the client holds after the call: its PENDING ones first, then new ones",
    )
    client_id: ClientId | None = Field(
        default=None,
        description="the worker's identity; its PENDING trials come back to it. None: a fresh id "
        "(returned), so workers that omit it never share trials",
    )


TrialState = Literal["PENDING", "COMPLETED", "INFEASIBLE", "FAILED", "ABANDONED"]


class Trial(BaseModel):
    number: int
    resource: str
    client_id: str
    state: TrialState
    arch_index: int
    params: dict[str, Any]  # the architecture's fields, area and label
    value: float | None = None
    values: dict[str, float] | None = None
    reason: str | None = None
    created_at: float
    completed_at: float | None = None
    lease_expires_at: float | None = None  # PENDING: ABANDONED unless completed or heart-beaten by then


class SuggestResponse(BaseModel):
    client_id: str  # the request's, or the fresh one made for it
    trials: list[Trial]
    done: bool = False  # nothing more will be suggested
    done_reason: str | None = None


class CompleteRequest(Strict):
    state: Literal["COMPLETED", "INFEASIBLE", "FAILED", "ABANDONED"] = "COMPLETED"
    value: Finite | None = Field(default=None, description="the first objective's value")
    values: dict[Annotated[str, Field(max_length=32)], Finite] | None = Field(default=None, max_length=8)
    reason: str | None = Field(default=None, max_length=LIMITS["reason_chars"], pattern=r"^[^\x00]*$")

    @model_validator(mode="after")
    def _shape(self) -> CompleteRequest:
        has_value = self.value is not None or self.values is not None
        if self.state == "COMPLETED" and not has_value:
            raise ValueError("state COMPLETED needs 'value' or 'values'")
        if self.state != "COMPLETED" and has_value:
            raise ValueError(
                f"state {self.state} takes no 'value'/'values' (an infeasible or failed trial "
                "is never recorded as a number)"
            )
        if self.state == "INFEASIBLE" and not (self.reason or "").strip():
            raise ValueError("state INFEASIBLE needs a 'reason'")
        return self


class TrialList(BaseModel):
    trials: list[Trial]
    next_page_token: str | None = None


class Pareto(BaseModel):
    objectives: list[Objective]
    trials: list[Trial]


# ---------------------------------------------------------------------------------------- operations
class ArchFields(Strict):
    num_tc: int = Field(ge=1, le=65_536)
    num_vc: int = Field(ge=1, le=65_536)
    pe_x: int = Field(ge=1, le=4096)
    pe_y: int = Field(ge=1, le=4096)
    pe_vc: int = Field(ge=1, le=4096)
    glb_mb: Finite = Field(gt=0, le=65_536)


class EvaluateRequest(Strict):
    """One architecture × model × accelerators × global batch: placement and throughput through the
    layer ILP and the placement DP, exactly as ``archplace place``."""

    model: str
    arch: Annotated[str, Field(max_length=32)] | ArchFields = "tpuv4"
    accelerators: int = Field(default=1024, ge=1, le=65_536)
    global_batch: int = Field(default=4096, ge=1, le=2**24)
    # None: the accelerator's own (a preset is the chip it names), 32/64/80 for a design without one
    hbm_gb: list[Annotated[float, Field(gt=0, le=4096, allow_inf_nan=False)]] | None = Field(
        default=None, min_length=1, max_length=8
    )
    sequential: bool = False
    fixed: list[Annotated[int, Field(ge=1, le=65_536)]] | None = Field(
        default=None, min_length=3, max_length=3
    )  # fixed [p, d, t]; the DP chooses the stage split
    expert: list[Annotated[int, Field(ge=1, le=65_536)]] | None = Field(
        default=None, min_length=3, max_length=3
    )  # the expert placement [p, d, t] exactly: an even block split (archplace place --expert)
    seq: int | None = Field(default=None, ge=1, le=32_768)
    # per layer slice: the work budget in deterministic seconds (archplace place's default; it decides
    # the answer, so equal requests give equal results on any load) and the wall-clock safety limit
    ilp_budget: Finite = Field(default=10.0, gt=0, le=120)
    ilp_time_limit_s: Finite = Field(default=120.0, gt=0, le=600)
    contention: bool = True  # False: the paper's model (concurrent ops each get the full HBM/GLB bandwidth)
    optimizer: Literal["sgd", "adam", "adafactor"] = "adam"  # optimizer state counted in the HBM fit
    sync_model: Literal["exposed", "paper"] = "exposed"  # gradient sync: 1F1B-exposed or eq. 18
    # the gradients' dtype: their memory and the AllReduce's bytes (archplace place --grad-reduce-dtype)
    grad_reduce_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    capture_blocks: int = Field(default=3, ge=3, le=1024)  # leading blocks captured per stack
    # TP slices: Megatron's role tables, or the ILP sharding of `shard --algo ilp` (archplace place --tp-from)
    tp_from: Literal["roles", "shard"] = "roles"

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        return _check_models([v])[0]

    @model_validator(mode="after")
    def _tp_from(self) -> EvaluateRequest:
        """tp_from shard needs a model shard has a tensor graph for: refused before any work starts."""
        if self.tp_from == "shard":
            from ..api.tp_shard import check_shard_model

            check_shard_model(self.model)
        return self

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: Any) -> Any:
        if isinstance(v, str):
            from ..hardware.presets import preset_accelerator

            preset_accelerator(v)  # a preset name only: never a path on the server
        return v


class PartitionRequest(Strict):
    """An MCM chiplet partition (``archplace partition``)."""

    model: str
    chiplets: int = Field(default=36, ge=1, le=64)
    algo: Literal["greedy", "random", "sa", "ppo", "ppo-lns"] = "greedy"
    budget: int = Field(default=200, ge=1, le=5000)
    seed: Seed = 0
    seq: int | None = Field(default=None, ge=1, le=32_768)
    mbs: int = Field(default=1, ge=1, le=1024)
    polish: float = Field(default=0.0, ge=0.0, le=600.0)  # CP-SAT neighbourhood search seconds (ppo-lns: > 0)
    polish_subsolves: int | None = Field(default=None, ge=1, le=10_000)  # deterministic polish (sub-solves)

    _check = field_validator("model")(classmethod(lambda cls, v: _check_models([v])[0]))


class PipelineRequest(Strict):
    """Pipeline cuts on GPU servers (``archplace pipeline``): Auto-MAP's V100 clusters, or ``gpu``."""

    model: str
    cluster: Literal["A", "B", "C"] = "C"
    stages: int | None = Field(default=None, ge=2, le=8)
    algo: Literal["dp", "exact", "rainbow", "pretrained"] = "dp"
    budget: int | None = Field(default=None, ge=1, le=20_000)
    seed: Seed = 0
    finetune: int = Field(default=0, ge=0, le=20_000)
    radius: int = Field(default=3, ge=0, le=8)
    # issue 30: the GPU and its op model (as `archplace pipeline --gpu/--op-model/--dtype/--attention`);
    # `profiled` is left out: it reads a profile file, and a client's files are not on the server
    gpu: Literal[GPU_NAMES] | None = None  # None: Auto-MAP's V100 servers
    op_model: Literal["roofline", "calibrated"] | None = None  # None: the GPU's default
    dtype: Literal["bf16", "fp16", "tf32", "fp32"] | None = None  # None: fp16, Auto-MAP's
    attention: Literal["eager", "sdpa"] = "eager"

    _check = field_validator("model")(classmethod(lambda cls, v: _check_models([v])[0]))


def _shard_models() -> list[str]:
    """The models ``archplace shard`` builds a tensor graph for: the presets of its families, and VGG-19
    (a config file, ``hf:PATH``, is a client's file and not on the server)."""
    from ..api.sharding import SHARD_FAMILIES
    from ..workloads.models import PRESETS

    return sorted(n for n, p in PRESETS.items() if p.family in SHARD_FAMILIES) + ["vgg19"]


class ShardRequest(Strict):
    """Operator sharding (OPP) or data-parallel dimensions (ADP) of a model over T devices
    (``archplace shard``, Auto-MAP). ``algo`` dqn runs on the service's Ray cluster, as partition's ppo."""

    model: str
    devices: int = Field(default=8, ge=1, le=1024)
    algo: Literal["ilp", "greedy", "megatron", "random", "exhaustive", "dqn"] = "ilp"
    data_parallel: bool = False
    seq: int | None = Field(default=None, ge=1, le=32_768)
    batch: int = Field(default=8, ge=1, le=4096)
    gpu: Literal[tuple(sorted(GPUS))] = "v100-sxm2"
    dtype: Literal["bf16", "fp16", "tf32", "fp32"] = "fp16"
    budget: int | None = Field(default=None, ge=1, le=100_000)  # random / dqn: propagation calls
    reward: Literal["paper", "cost"] = "paper"
    max_deterministic_s: Finite = Field(default=10.0, gt=0, le=120)  # ilp: CP-SAT deterministic time
    seed: Seed = 0

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        known = _shard_models()
        if v not in known:
            raise ValueError(f"model {v!r} has no sharding graph; allowed: {known}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ShardRequest:
        """The API's own checks (algo against data_parallel and the model), before any work starts."""
        from ..api.sharding import ShardRequest as ApiShardRequest

        ApiShardRequest(**self.model_dump()).validate()
        if self.algo == "megatron" and self.model == "vgg19":
            raise ValueError(
                "algo megatron: VGG-19 has no Megatron sharding (Megatron-LM splits transformers); use ilp"
            )
        return self


def _plan_models() -> list[str]:
    """The models ``archplace plan`` takes: the presets with one stack of blocks (a config file,
    ``hf:PATH``, is a client's file and not on the server)."""
    from ..workloads.models import PRESETS

    return sorted(n for n, p in PRESETS.items() if len(dict(p.stacks)) == 1)


class PlanRequest(Strict):
    """The fastest way to train a model on N GPUs (``archplace plan``): tensor, pipeline, data and
    context parallel sizes, micro-batch, recomputation, sequence parallelism, ZeRO stage, attention.
    ``gpu`` or ``instance`` is required; ``fixed`` holds knobs at a value (the rest are searched)."""

    model: str
    gpus: int = Field(ge=1, le=65_536)
    global_batch: int = Field(ge=1, le=2**24)
    gpu: Literal[GPU_NAMES] | None = None  # None: the instance's (a GPU file is not on the server)
    gpus_per_node: int | None = Field(default=None, ge=1, le=64)  # None: the instance's, else 8
    network: Literal[tuple(NETWORKS)] | None = None  # None: the instance's, else the GPU's own NICs
    instance: Literal[tuple(sorted(_PLAN_INSTANCES))] | None = None  # GPU, node, network and price
    seq: int | None = Field(default=None, ge=1, le=2**20)  # None: the model's; at most its positions
    optimizer: Literal["sgd", "adam", "adafactor"] = "adam"
    grad_reduce_dtype: Literal["bf16", "fp32"] = "bf16"
    fixed: dict[Literal[_PLAN_KNOBS], int | bool | str] | None = None
    top_k: int = Field(default=5, ge=1, le=100)
    max_mbs: int = Field(default=8, ge=1, le=1024)
    op_model: Literal["calibrated", "roofline"] = "calibrated"
    overlap: bool = True  # TP all-reduces behind wgrad GEMMs, DP collectives behind compute
    ray_tasks: bool = False  # the enumeration in Ray tasks (a managed operation runs on the service's Ray)
    memory_headroom: float = Field(default=0.1, ge=0.0, lt=1.0)  # fraction of each GPU's memory kept free

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        known = _plan_models()
        if v not in known:
            raise ValueError(f"model {v!r} is not a preset with one stack of blocks; allowed: {known}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> PlanRequest:
        """The API's own checks (gpu or instance, the fixed knobs' values, the instance's GPU, whole
        servers, the model's positions), before any work starts."""
        from ..api.planning import PlanRequest as ApiPlanRequest

        ApiPlanRequest(**self.model_dump()).validate()
        return self


OperationState = Literal["PENDING", "RUNNING", "DONE", "FAILED", "CANCELLED"]


class Operation(BaseModel):
    id: str
    resource: str
    kind: Literal["evaluate", "partition", "pipeline", "plan", "shard"]
    state: OperationState
    done: bool
    request: dict[str, Any]
    result: dict[str, Any] | None = None
    error: str | None = None
    cached: bool = False
    attempts: int = 0
    created_at: float
    updated_at: float


class OperationList(BaseModel):
    operations: list[Operation]
    next_page_token: str | None = None


def finite_or_none(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
