"""What defines a search's results, in one frozen dataclass: the trial runner, the Ray tasks, the
resume check and the API all read it. It lives apart from ``trial.py`` and ``tasks.py`` (which import
Ray) so that both of them, and the API, can import it without a circle and without starting Ray."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..hardware.constants import PHAZE_LINK_BW_BYTES_PER_S

# a search's layer-slice ILP: the work budget in deterministic seconds (``layer_ilp/budget.py``), which
# decides the answer, and the wall-clock safety limit, which only stops a runaway solve
SEARCH_ILP_BUDGET = 1.0
SEARCH_ILP_TIME_LIMIT_S = 300.0


@dataclass(frozen=True)
class SearchSettings:
    """Everything that defines a search's results (a resumed search must match it). ``space`` is the
    search space's content (``load_space_config``), ``None`` for the packaged Phaze space: shipped
    to the workers by value, so no node needs the YAML file."""

    models: tuple[str, ...]
    num_devices: int = 1024
    global_batch: int = 4096
    microbatches: tuple[int, ...] = (1, 2, 4, 8)
    hbm_gb: tuple[float, ...] = (32, 64, 80)
    recompute: tuple[bool, ...] = (False, True)
    seq: int | None = None
    optimizer: str = "adam"         # sgd | adam | adafactor: optimizer state in the memory fit
    sync_model: str = "exposed"     # gradient sync: "exposed" (1F1B overlap) or "paper" (eq. 18)
    grad_reduce_dtype: str = "bf16"  # the gradients' dtype: their memory and the AllReduce's bytes
    link_bw_bytes_per_s: float = PHAZE_LINK_BW_BYTES_PER_S
    ilp_budget: float = SEARCH_ILP_BUDGET  # per layer slice, deterministic seconds (the answer's budget)
    ilp_time_limit_s: float = SEARCH_ILP_TIME_LIMIT_S  # per layer slice, wall-clock safety limit
    space: dict | None = None
    tmp_widths: dict[str, tuple[int, ...]] = field(default_factory=dict)
    schedule: str = "ilp"
    contention: bool = True  # layer ILP: concurrently running ops share the HBM/GLB bandwidth
    capture_blocks: int = 3  # leading blocks captured per stack (more where its block kinds need them)

    def ilp_settings(self) -> dict[str, Any]:
        """The ``solve_layer`` options of this search's layer slices."""
        return {"budget": self.ilp_budget, "time_limit_s": self.ilp_time_limit_s,
                "contention": self.contention}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["models"] = list(self.models)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchSettings:
        d = dict(d)
        for k in ("models", "microbatches", "hbm_gb", "recompute"):
            d[k] = tuple(d[k])
        d["tmp_widths"] = {m: tuple(v) for m, v in (d.get("tmp_widths") or {}).items()}
        return cls(**d)

    def widths(self, model: str) -> tuple[int, ...]:
        from ..workloads.models import preset

        w = self.tmp_widths.get(model) or preset(model).tmp_widths
        return tuple(t for t in w if t <= self.num_devices)

    def cases(self, model: str) -> list[tuple[int, int]]:
        return [(m, t) for m in self.microbatches if self.global_batch % m == 0 for t in self.widths(model)]

    def graph_keys(self) -> list[tuple[str, int, int]]:
        """Every (model, microbatch, TMP width) graph the search needs."""
        return [(m, mbs, t) for m in self.models for mbs, t in self.cases(m)]

