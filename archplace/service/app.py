"""The HTTP API (FastAPI), versioned under ``/v1``; OpenAPI at ``/docs`` and ``/openapi.json``.

``create_app(state)`` builds a plain FastAPI app over a ``ServiceState`` (database engine, study and
operation services, auth); ``deployment.py`` serves it on Ray Serve, and tests can also drive it
in-process. Every error is JSON, ``{"error": {"code", "status", "message"}}``, with a 4xx for
anything the caller can fix; a bug is a 500 with an id to find it in the log, never a traceback.
"""

import asyncio
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .auth import LOCAL_OWNER, TokenCache
from .http_guard import SCOPE_OWNER, Guard, HttpLimits
from .operations import OperationService, QueueFull
from .schemas import (
    LIMITS,
    CompleteRequest,
    EvaluateRequest,
    Operation,
    OperationList,
    Pareto,
    PartitionRequest,
    PipelineRequest,
    PlanRequest,
    ShardRequest,
    Study,
    StudyCreate,
    StudyList,
    SuggestRequest,
    SuggestResponse,
    Trial,
    TrialList,
    TrialNumber,
)
from .studies import DEFAULT_POOL, Conflict, NotFound, StudyService

logger = logging.getLogger("archplace.service")

STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    408: "REQUEST_TIMEOUT",
    409: "ALREADY_EXISTS",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "REQUEST_HEADER_FIELDS_TOO_LARGE",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclass
class ServiceState:
    engine: Any
    auth: str = "token"  # "token" or "none" (loopback only; checked by the server)
    limits: HttpLimits = field(default_factory=HttpLimits)  # the HTTP guard's (http_guard.py)
    study_limits: dict[str, int] = field(default_factory=dict)  # StudyService's max_studies, max_points
    pool: int = DEFAULT_POOL  # proposals each study keeps ready (StudyService's pool; 0: per request)
    lane: tuple[int, int] = (0, 1)  # (this replica's rank, replicas): StudySearcher's lanes
    studies: StudyService = field(init=False)
    operations: OperationService = field(init=False)
    tokens: TokenCache = field(init=False)

    def __post_init__(self) -> None:
        if self.auth not in ("token", "none"):
            raise ValueError(f"auth must be 'token' or 'none', got {self.auth!r}")
        self.studies = StudyService(self.engine, **self.study_limits, pool=self.pool, lane=self.lane)
        self.operations = OperationService(self.engine)
        self.tokens = TokenCache(self.engine)


def error(code: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "status": STATUS.get(code, "ERROR"), "message": message, **extra}},
        status_code=code,
        headers=headers,
    )


def _field(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def create_app(state: ServiceState) -> FastAPI:
    app = FastAPI(
        title="archplace",
        version="1",
        description="Studies of accelerator architectures (ask/tell) and managed evaluations of "
        "architectures and placements, and training plans on GPUs. Every request needs "
        "`Authorization: Bearer TOKEN` unless the service runs with --auth none on 127.0.0.1.",
    )
    # outermost: header limits, the token, the per-address cap and the body deadline, before any
    # of the body is read (http_guard.py)
    app.add_middleware(
        Guard,
        limits=state.limits,
        tokens=state.tokens if state.auth == "token" else None,
        local_owner=LOCAL_OWNER,
        error=error,
    )

    # ------------------------------------------------------------------ errors
    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        errs = exc.errors()
        details = [
            {"field": _field(e.get("loc", ())), "message": str(e.get("msg", ""))[:500]} for e in errs[:20]
        ]
        first = details[0] if details else {"field": "body", "message": "invalid request"}
        return error(422, f"{first['field']}: {first['message']}", details=details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(NotFound)
    async def _not_found(_request: Request, exc: NotFound):
        return error(404, str(exc).strip("'\""))

    @app.exception_handler(Conflict)
    async def _conflict(_request: Request, exc: Conflict):
        return error(409, str(exc))

    @app.exception_handler(ValueError)
    async def _value(_request: Request, exc: ValueError):
        return error(400, str(exc).splitlines()[0][:1000] if str(exc) else "invalid request")

    @app.exception_handler(QueueFull)
    async def _full(_request: Request, exc: QueueFull):
        return error(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)})

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception):
        ref = uuid.uuid4().hex[:12]
        logger.exception("internal error %s", ref)
        return error(500, f"internal error (reference {ref} in the service log)")

    # The ask/tell routes are async and hand their database work to this pool themselves. Why: a sync
    # route (or dependency) goes through anyio's to_thread, which under Ray Serve's event loop (started
    # with run_forever, so anyio finds no root task to cache) scans every task of the loop on each call;
    # at 64 clients in flight that scan and the extra thread hop were about a fifth of a replica's CPU.
    db_threads = ThreadPoolExecutor(max_workers=32, thread_name_prefix="archplace-db")

    async def offload(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(db_threads, fn, *args)

    # ------------------------------------------------------------------ auth
    async def owner(request: Request) -> str:
        who = request.scope.get(SCOPE_OWNER)  # the guard checked the token before the body came
        if who is not None:
            return who
        if state.auth == "none":
            return LOCAL_OWNER
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        who = await offload(state.tokens.owner, token.strip()) if scheme.lower() == "bearer" else None
        if who is None:
            raise StarletteHTTPException(
                401,
                "a valid bearer token is required (Authorization: Bearer TOKEN; "
                "create one with `archplace serve token create OWNER`)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return who

    Owner = Annotated[str, Depends(owner)]
    StudyName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    Number = Annotated[TrialNumber, Path(ge=1, le=2**31 - 1)]
    OpId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]
    PageSize = Annotated[int, Query(ge=1, le=LIMITS["page_size"])]
    PageToken = Annotated[str | None, Query(max_length=40)]

    # ------------------------------------------------------------------ routes
    @app.get("/v1/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/studies", response_model=Study, status_code=201)
    def create_study(body: StudyCreate, who: Owner):
        study, created = state.studies.create(who, body)
        if not created:
            return JSONResponse(study.model_dump(mode="json"), status_code=200)
        return study

    @app.get("/v1/studies", response_model=StudyList)
    def list_studies(who: Owner, page_size: PageSize = 100, page_token: PageToken = None):
        return state.studies.list(who, page_size, page_token)

    @app.get("/v1/studies/{study}", response_model=Study)
    def get_study(study: StudyName, who: Owner):
        return state.studies.get(who, study)

    @app.delete("/v1/studies/{study}", status_code=204)
    def delete_study(study: StudyName, who: Owner):
        state.studies.delete(who, study)

    @app.post("/v1/studies/{study}/trials:suggest", response_model=SuggestResponse)
    async def suggest(study: StudyName, body: SuggestRequest, who: Owner):
        return await offload(state.studies.suggest, who, study, body)

    @app.post("/v1/studies/{study}/trials/{number}:complete", response_model=Trial)
    async def complete(study: StudyName, number: Number, body: CompleteRequest, who: Owner):
        return await offload(state.studies.complete, who, study, number, body)

    @app.post("/v1/studies/{study}/trials/{number}:heartbeat", response_model=Trial)
    async def heartbeat(study: StudyName, number: Number, who: Owner):
        return await offload(state.studies.heartbeat, who, study, number)

    @app.get("/v1/studies/{study}/trials", response_model=TrialList)
    def list_trials(
        study: StudyName,
        who: Owner,
        page_size: PageSize = 100,
        page_token: PageToken = None,
        state_filter: Annotated[
            str | None,
            Query(
                alias="state",
                pattern=r"^(PENDING|COMPLETED|"
                r"INFEASIBLE|FAILED|ABANDONED)$",
            ),
        ] = None,
    ):
        return state.studies.trials(who, study, page_size, page_token, state_filter)

    @app.get("/v1/studies/{study}/trials/{number}", response_model=Trial)
    def get_trial(study: StudyName, number: Number, who: Owner):
        return state.studies.trial(who, study, number)

    @app.get("/v1/studies/{study}/best", response_model=Trial)
    def best(study: StudyName, who: Owner):
        return state.studies.best(who, study)

    @app.get("/v1/studies/{study}/pareto", response_model=Pareto)
    def pareto(study: StudyName, who: Owner):
        return state.studies.pareto(who, study)

    @app.post("/v1/evaluations", response_model=Operation, status_code=202)
    def evaluate(body: EvaluateRequest, who: Owner):
        return state.operations.create(who, "evaluate", body.model_dump(mode="json"))

    @app.post("/v1/partitions", response_model=Operation, status_code=202)
    def partition(body: PartitionRequest, who: Owner):
        return state.operations.create(who, "partition", body.model_dump(mode="json"))

    @app.post("/v1/pipelines", response_model=Operation, status_code=202)
    def pipeline(body: PipelineRequest, who: Owner):
        return state.operations.create(who, "pipeline", body.model_dump(mode="json"))

    @app.post("/v1/shardings", response_model=Operation, status_code=202)
    def sharding(body: ShardRequest, who: Owner):
        return state.operations.create(who, "shard", body.model_dump(mode="json"))

    @app.post("/v1/plans", response_model=Operation, status_code=202)
    def plan(body: PlanRequest, who: Owner):
        return state.operations.create(who, "plan", body.model_dump(mode="json"))

    @app.get("/v1/operations", response_model=OperationList)
    def list_operations(
        who: Owner,
        page_size: PageSize = 100,
        page_token: Annotated[str | None, Query(max_length=40, pattern=r"^[0-9.e+-]+$")] = None,
    ):
        return state.operations.list(who, page_size, page_token)

    @app.get("/v1/operations/{op_id}", response_model=Operation)
    def get_operation(op_id: OpId, who: Owner):
        return state.operations.get(who, op_id)

    @app.post("/v1/operations/{op_id}:cancel", response_model=Operation)
    def cancel_operation(op_id: OpId, who: Owner):
        return state.operations.cancel(who, op_id)

    return app
