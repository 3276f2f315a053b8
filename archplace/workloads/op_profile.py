"""Measured op times of one training step (:class:`OpProfile`), as ``archplace profile`` writes them.

A profile holds one time per node of an archplace training graph (forward and backward rows), keyed by
the node's name, so that the cost models can take measured times instead of a roofline
(``--op-model profiled``, ``--profile FILE``): :meth:`OpProfile.times_for` returns them in the row order
of any graph built for the same model, micro-batch and sequence. How the times are measured and mapped
to nodes is in :mod:`archplace.workloads.op_profiler`.

The file is JSON: the fields below, ``time_s`` as a list. Only numpy and this package's graph type are
needed to read one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .ops import DTYPE_BYTES

if TYPE_CHECKING:
    from .graph import OpGraph

PROFILE_FORMAT = 1  # bump when the fields change
DEVICES = ("cpu", "cuda")
DTYPES = ("fp32", "bf16", "fp16")
BYTES_PER_ELEMENT = DTYPE_BYTES  # the graph built for a profile uses the dtype's bytes


@dataclass(frozen=True, eq=False)
class OpProfile:
    """One training step of ``model`` on ``device``, timed per graph node.

    ``profiled_step_s`` is ``time_s.sum() + unmapped_s``: the op (CPU) or kernel (CUDA) time the
    profiler saw; ``measured_step_s`` is the wall time of the same step timed without the profiler, so
    their ratio says how much of the step the profile explains (Python overhead between ops, profiler
    overhead). ``coverage`` = mapped / (mapped + unmapped) op time. ``details`` records how the numbers
    were taken (steps, threads, the profiler's wall time, counts of mapped events)."""

    model: str
    device: str                       # "cpu" | "cuda"
    device_name: str                  # CPU model or "NVIDIA H200"; driver in `software`
    dtype: str                        # fp32 | bf16 | fp16
    mbs: int
    seq: int | None
    names: tuple[str, ...]            # graph node names (forward and backward rows) in graph order
    time_s: np.ndarray                # per node, seconds of one training step
    measured_step_s: float            # wall time of the same step, timed without the profiler
    profiled_step_s: float            # sum over time_s + unmapped_s
    unmapped_s: float                 # op/kernel time the mapping could not give to a node
    coverage: float                   # mapped / (mapped + unmapped) op time
    software: dict                    # torch, cuda, driver, transformers versions
    details: dict = field(default_factory=dict)  # how it was measured (not in the contract's list)

    def __post_init__(self) -> None:
        t = np.asarray(self.time_s, dtype=np.float64)
        object.__setattr__(self, "time_s", t)
        object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        if t.ndim != 1 or len(t) != len(self.names):
            raise ValueError(f"profile time_s has {t.size} entries for {len(self.names)} names")
        if not np.isfinite(t).all() or (t < 0).any():
            raise ValueError("profile time_s must be finite and >= 0 seconds")
        if len(set(self.names)) != len(self.names):
            raise ValueError("profile names must be unique")
        if self.device not in DEVICES:
            raise ValueError(f"profile device is {self.device!r}; allowed: {list(DEVICES)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"profile dtype is {self.dtype!r}; allowed: {list(DTYPES)}")

    @property
    def mapped_s(self) -> float:
        return float(self.time_s.sum())

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "model": self.model, "device": self.device,
                "device_name": self.device_name, "dtype": self.dtype, "mbs": self.mbs, "seq": self.seq,
                "measured_step_s": self.measured_step_s, "profiled_step_s": self.profiled_step_s,
                "unmapped_s": self.unmapped_s, "coverage": self.coverage, "software": self.software,
                "details": self.details, "names": list(self.names), "time_s": self.time_s.tolist()}

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON (parent folders are made); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return p

    @classmethod
    def from_dict(cls, d: Any, where: str = "profile") -> OpProfile:
        if not isinstance(d, dict):
            raise ValueError(f"{where} must hold a JSON object, got {type(d).__name__}")
        need = ("model", "device", "device_name", "dtype", "mbs", "seq", "names", "time_s",
                "measured_step_s", "profiled_step_s", "unmapped_s", "coverage", "software")
        missing = [k for k in need if k not in d]
        if missing:
            raise ValueError(f"{where} is not an archplace op profile: missing field(s) {missing}")
        if d.get("format", PROFILE_FORMAT) != PROFILE_FORMAT:
            raise ValueError(f"{where} has format {d.get('format')!r}; this archplace reads {PROFILE_FORMAT}")
        for k in ("measured_step_s", "profiled_step_s", "unmapped_s", "coverage"):
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{where}: field {k!r} must be a number >= 0, got {v!r}")
        for k in ("mbs", "seq"):
            v = d[k]
            if (k == "mbs" or v is not None) and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{where}: field {k!r} must be a positive integer, got {v!r}")
        if not isinstance(d["names"], list) or not isinstance(d["time_s"], list):
            raise ValueError(f"{where}: fields 'names' and 'time_s' must be lists")
        try:
            return cls(model=str(d["model"]), device=d["device"], device_name=str(d["device_name"]),
                       dtype=d["dtype"], mbs=d["mbs"], seq=d["seq"], names=tuple(d["names"]),
                       time_s=np.asarray(d["time_s"], dtype=np.float64),
                       measured_step_s=float(d["measured_step_s"]),
                       profiled_step_s=float(d["profiled_step_s"]), unmapped_s=float(d["unmapped_s"]),
                       coverage=float(d["coverage"]), software=dict(d["software"]),
                       details=dict(d.get("details") or {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None

    @classmethod
    def load(cls, path: str | Path) -> OpProfile:
        """Read a profile written by :meth:`save`; a missing or invalid file is a one-line error."""
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"profile {str(path)!r} does not exist (write one with `archplace profile`)")
        try:
            d = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"profile {str(path)!r} cannot be read: {e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"profile {str(path)!r} is not valid JSON: {e}") from None
        return cls.from_dict(d, where=f"profile {str(path)!r}")

    def times_for(self, graph: OpGraph) -> np.ndarray:
        """Seconds per row of ``graph`` (forward and backward rows), by node name. The graph must be
        of the profiled model at the profiled micro-batch and sequence (``graph.meta`` ``mbs`` and
        ``seq`` where it has them); a graph with nodes the profile lacks is a one-line ValueError."""
        index = {n: i for i, n in enumerate(self.names)}
        names = graph.nodes["name"]
        meta = graph.meta
        rows = np.fromiter((index.get(str(n), -1) for n in names), dtype=np.int64, count=len(names))
        lack = np.flatnonzero(rows < 0)
        if len(lack):
            raise ValueError(f"profile of {self.model} (mbs {self.mbs}, seq {self.seq}) lacks {len(lack)} of "
                             f"the graph's {len(names)} nodes, e.g. {str(names[lack[0]])!r} (graph of "
                             f"{meta.get('model', '?')!r}): profile the same model with `archplace profile`")
        for key, mine in (("mbs", self.mbs), ("seq", self.seq)):
            theirs = meta.get(key)
            if theirs is not None and mine is not None and int(theirs) != int(mine):
                raise ValueError(f"profile of {self.model} was measured at {key} {mine}, the graph is "
                                 f"built at {key} {theirs}: profile the graph's {key}")
        return self.time_s[rows]

    def top(self, k: int = 10) -> list[dict[str, Any]]:
        """The ``k`` slowest nodes: [{name, time_s, share}] (share of the profiled step)."""
        order = np.argsort(-self.time_s, kind="stable")[:k]
        total = self.profiled_step_s or 1.0
        return [{"name": self.names[i], "time_s": float(self.time_s[i]),
                 "share": float(self.time_s[i] / total)} for i in order]
