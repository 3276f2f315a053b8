"""What every API call shares: request (de)serialisation and field checks, bad-input errors,
progress reports and cancellation. Standard library only, so ``import archplace.api`` stays cheap."""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ProgressFn = Callable[[str, dict], None]
"""``progress(stage_name, info)``: called when a phase of a call ends; ``info`` is JSON-able."""


class Cancelled(Exception):
    """Raised when ``cancel.is_set()`` is seen between phases."""


class InvalidRequest(ValueError):
    """A request field holds a value that is not allowed. ``str(e)`` names the fields as the request
    does (``accelerators must be ...``); ``render(names)`` spells them otherwise: the CLI passes its
    flags (``--accelerators must be ...``). ``template`` marks each field as ``{field}``."""

    def __init__(self, template: str, *fields: str) -> None:
        self.template, self.fields = template, fields
        super().__init__(self.render())

    def render(self, names: Mapping[str, str] | None = None) -> str:
        names = names or {}
        return re.sub(r"\{(\w+)\}", lambda m: names.get(m[1], m[1]) if m[1] in self.fields else m[0],
                      self.template)


def invalid(field: str, text: str) -> InvalidRequest:
    """``{field} text``: the common one-field message."""
    return InvalidRequest("{" + field + "} " + text, field)


# ---------------------------------------------------------------------- field checks
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_int(field: str, v: Any, low: int = 1, high: int | None = None, optional: bool = False) -> None:
    """An integer in [low, high] (``None`` too when ``optional``)."""
    if optional and v is None:
        return
    if is_int(v) and v >= low and (high is None or v <= high):
        return
    if high is not None:
        raise invalid(field, f"must be in [{low}, {high}], got {v!r}")
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    raise invalid(field, f"must be {what}, got {v!r}")


def check_positive_number(field: str, v: Any) -> None:
    if not (is_number(v) and v > 0):
        raise invalid(field, f"must be a positive number, got {v!r}")


def check_bool(field: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise invalid(field, f"must be true or false, got {v!r}")


def check_choice(field: str, v: Any, allowed: tuple[str, ...]) -> None:
    if v not in allowed:
        raise invalid(field, f"must be one of {list(allowed)}, got {v!r}")


def check_optional_str(field: str, v: Any) -> None:
    if v is not None and not (isinstance(v, str) and v):
        raise invalid(field, f"must be a non-empty string (a path) or None, got {v!r}")


def check_gpu(field: str, gpu: Any, presets: Sequence[str], nvlink: bool = False) -> None:
    """A GPU preset among ``presets``, or the ``.json`` file of a user's GPU, read and checked (with
    ``nvlink`` it must have NVLink: a server of 8); a bad file names its field in one line."""
    from ..hardware.gpus import GPUS, is_gpu_file, load_gpu_file

    if not is_gpu_file(gpu):
        check_choice(field, gpu, tuple(presets))
        return
    try:
        spec = load_gpu_file(gpu)
    except ValueError as e:
        raise invalid(field, str(e)) from None
    if nvlink and not spec.nvlink_bytes_per_s > 0:
        raise invalid(field, f"gpu {gpu!r} has no NVLink; a server of 8 needs it (presets with it: "
                             f"{sorted(n for n, g in GPUS.items() if g.nvlink_bytes_per_s > 0)})")


def is_bundled_graph(name: str) -> bool:
    """A bundled dnn-partitioning graph's name (``gnmt_training``), as ``load_graph`` reads it."""
    from ..workloads.dnn_partitioning import resolve_graph_file

    return resolve_graph_file(name) is not None


def check_model(model: Any, files: bool) -> None:
    """A preset name or a transformers config's ``hf:PATH`` reference (``--hf-config``); with ``files``
    also an existing dnn-partitioning ``.json`` or graph ``.parquet``."""
    if not (isinstance(model, str) and model):
        raise invalid("model", f"must be a model preset name{' or a graph file path' if files else ''}, "
                               f"got {model!r}")
    if files and model.endswith((".json", ".parquet")) and not model.startswith("hf:"):
        if not Path(model).exists() and not (model.endswith(".json") and is_bundled_graph(model)):
            raise ValueError(f"graph file {model!r} does not exist")
        return
    from ..workloads.models import PRESETS, preset

    if files and model not in PRESETS and is_bundled_graph(model):
        return

    preset(model)  # "unknown model 'x'; known models: [...]"; an hf: config is read and checked


# ---------------------------------------------------------------------- requests and results
def check_capture_blocks(model: Any, capture_blocks: Any) -> None:
    """``capture_blocks``: an integer >= 3 (leading blocks of each stack captured, more where a stack's
    block kinds need them); it applies to captured models (presets, ``hf:`` configs), not graph files."""
    from ..workloads.models import CAPTURE_BLOCKS

    check_int("capture_blocks", capture_blocks, low=3)
    if (capture_blocks != CAPTURE_BLOCKS and isinstance(model, str) and not model.startswith("hf:")
            and model.endswith((".json", ".parquet"))):
        raise invalid("capture_blocks", f"applies to captured models (a preset or a transformers config), "
                                        f"not to the graph file {model!r}")


def plain(x: Any) -> Any:
    """``x`` with tuples as lists and numpy scalars and arrays as Python numbers and lists."""
    if isinstance(x, Mapping):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if hasattr(x, "tolist") and type(x).__module__ == "numpy":
        return plain(x.tolist())
    return x


def strict_json(x: Any) -> Any:
    """``plain(x)`` with every non-finite float (inf, NaN) as ``None``: strict JSON, which has no
    Infinity or NaN. Each result says why a value is missing (``reason``, a status)."""
    x = plain(x)
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [strict_json(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class Request:
    """Base of the frozen request dataclasses: a JSON round trip and ``validate()``."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        """The request ``to_dict()`` gave (lists back to tuples); unknown or missing keys are a
        ValueError naming them. Values are checked by ``validate()``, not here."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{cls.__name__}.from_dict needs a dict, got {type(d).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; allowed: {list(fields)}")
        missing = [n for n, f in fields.items() if n not in d and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ValueError(f"{cls.__name__} field(s) {missing} missing (required)")
        return cls(**{k: tuple(v) if isinstance(v, list) and "tuple[" in str(fields[k].type) else v
                      for k, v in d.items()})

    def validate(self) -> None:  # pragma: no cover - every request overrides it
        raise NotImplementedError


class Result:
    """Base of the result dataclasses: ``to_dict()`` is the fields in order, as plain Python and
    strict JSON (a value that does not exist, such as the time of an infeasible placement, is None)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: strict_json(getattr(self, f.name)) for f in dataclasses.fields(self)}


class DetailsResult(Result):
    """A result whose last fields are ``details`` (algorithm-specific keys) and ``wall_s``: ``to_dict()``
    flattens the details in before ``wall_s``, so ``--json`` has one level."""

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        details, wall = d.pop("details"), d.pop("wall_s")
        return {**d, **details, "wall_s": wall}


class ExtraResult(Result):
    """A result read back from a store a newer archplace may have written: its last field is ``extra``,
    the keys this version does not know. ``from_dict`` keeps them there and ``to_dict`` writes them back
    at the top level, so reading and rewriting a ``best.json`` loses nothing."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in d.items() if k in names},
                   extra={k: v for k, v in d.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        extra = d.pop("extra")
        return {**d, **extra}


# ---------------------------------------------------------------------- progress and cancellation
class Steps:
    """Reports the end of each phase to ``progress`` and raises ``Cancelled`` at the next boundary
    once ``cancel`` is set (also at the start: a call with a pre-set event does no work)."""

    def __init__(self, call: str, progress: ProgressFn | None, cancel: threading.Event | None) -> None:
        self.call, self.progress, self.cancel = call, progress, cancel
        self.last: str | None = None
        self.check()

    def check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            when = f"after stage {self.last!r}" if self.last else "before it started"
            raise Cancelled(f"{self.call} cancelled {when}")

    def stage(self, name: str, **info: Any) -> None:
        """Phase ``name`` ended: report it, then stop here if cancelled."""
        self.last = name
        if self.progress is not None:
            self.progress(name, plain(info))
        self.check()

    def done(self, **info: Any) -> None:
        if self.progress is not None:
            self.progress("done", plain(info))


def require_ray(what: str) -> None:
    """The API never starts Ray itself: the caller (CLI, service, script) owns that decision."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(f"{what} runs on Ray, which is not started in this process: call "
                           "archplace.platform.search.connect(address) (None: an embedded local Ray) "
                           "or ray.init() first")
