"""One accelerator of the Phaze template (spec ``phaze.md`` §2): tensor cores of ``pe_x × pe_y``
MACs, vector cores of ``pe_vc`` lanes, a global buffer (GLB), per-core L2 buffers and HBM.

L2 sizes and the GLB bandwidth are derived from the core shape unless given explicitly (spec §2.2,
§11.2), so an architecture is usually named by its five compute numbers and its GLB size.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .constants import DEFAULT_CLOCK_HZ, DEFAULT_HBM_BW_BYTES_PER_S, GLB_BW_MAX_WORDS_PER_CYCLE


def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def l2_tc_kb(pe_x: int, pe_y: int) -> float:
    """Tensor-core L2: 2^(log2 pe_x + log2 pe_y − 6) KB, at least 1 KB (1 MB at 256×256)."""
    return max(1.0, 2.0 ** (math.log2(pe_x) + math.log2(pe_y) - 6))


def l2_vc_kb(pe_vc: int) -> float:
    """Vector-core L2: 2^(log2 pe_vc − 6) KB within [1, 4] KB (4 KB at 256 lanes; spec §2.1 [INF])."""
    return min(4.0, max(1.0, 2.0 ** (math.log2(pe_vc) - 6)))


def core_grid(num: int) -> tuple[int, int]:
    """Cores laid out on a 2-D grid as in the Phaze estimator: (larger side, smaller side)."""
    d1 = 2 ** int(math.floor(math.log2(num) / 2)) if num > 0 else 1
    d2 = max(num // d1, 1)
    return max(d1, d2), min(d1, d2)


def glb_bw_words(num_tc: int, pe_x: int, pe_y: int) -> int:
    """GLB bandwidth (words/cycle) scaled to keep the tensor cores busy, capped at 4096 (spec
    §2.2): 16·max(pe_x, pe_y) words per cycle per core along the longer side of the core grid —
    the Phaze estimator's formula, which gives 2048 for one 128×128 core and the cap for TPUv4."""
    side, _ = core_grid(num_tc)
    return int(min(GLB_BW_MAX_WORDS_PER_CYCLE, max(4, 16 * max(pe_x, pe_y) * side)))


@dataclass(frozen=True)
class Accelerator:
    """A point of the architecture space. Units are in the field names; ``glb_bw`` is in words per
    cycle, ``hbm_bw`` in bytes per second."""

    num_tc: int
    num_vc: int
    pe_x: int
    pe_y: int
    pe_vc: int
    glb_mb: float
    glb_bw: int = 0  # 0: derived (glb_bw_words)
    l2_tc_kb: float = 0.0  # 0: derived
    l2_vc_kb: float = 0.0  # 0: derived
    hbm_gb: float = 80.0
    hbm_bw: float = DEFAULT_HBM_BW_BYTES_PER_S
    clock_hz: float = DEFAULT_CLOCK_HZ
    bytes_per_element: int = 2
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for f in ("num_tc", "num_vc", "pe_x", "pe_y", "pe_vc", "bytes_per_element"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"accelerator field {f!r} must be a positive integer, got {v!r}")
        for f in ("num_tc", "num_vc", "pe_x", "pe_y", "pe_vc"):
            if not _pow2(getattr(self, f)):
                raise ValueError(f"accelerator field {f!r} must be a power of two, got {getattr(self, f)}")
        if self.pe_vc != self.pe_x:
            raise ValueError(f"accelerator field 'pe_vc' ({self.pe_vc}) must equal 'pe_x' ({self.pe_x}): "
                             "the template ties vector-lane width to the tensor-core width")
        for f in ("glb_mb", "hbm_gb", "hbm_bw", "clock_hz"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
                raise ValueError(f"accelerator field {f!r} must be a positive number, got {v!r}")
        for f in ("glb_bw", "l2_tc_kb", "l2_vc_kb"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"accelerator field {f!r} must be >= 0 (0 = derived), got {v!r}")
        if self.bytes_per_element not in (1, 2, 4):
            raise ValueError(f"accelerator field 'bytes_per_element' must be 1, 2 or 4, "
                             f"got {self.bytes_per_element}")
        if not self.glb_bw:
            object.__setattr__(self, "glb_bw", glb_bw_words(self.num_tc, self.pe_x, self.pe_y))
        if not self.l2_tc_kb:
            object.__setattr__(self, "l2_tc_kb", l2_tc_kb(self.pe_x, self.pe_y))
        if not self.l2_vc_kb:
            object.__setattr__(self, "l2_vc_kb", l2_vc_kb(self.pe_vc))

    # ------------------------------------------------------------------ derived
    @property
    def compute(self) -> tuple[int, int, int, int, int]:
        """Phaze's compute tuple {num_tc, num_vc, pe_x, pe_y, pe_vc}."""
        return (self.num_tc, self.num_vc, self.pe_x, self.pe_y, self.pe_vc)

    @property
    def num_fused(self) -> int:
        """Fused cores: the first min(num_tc, num_vc) tensor cores paired with as many vector cores."""
        return min(self.num_tc, self.num_vc)

    @property
    def peak_macs_per_s(self) -> float:
        return self.num_tc * self.pe_x * self.pe_y * self.clock_hz

    @property
    def peak_flops(self) -> float:
        return 2.0 * self.peak_macs_per_s

    @property
    def glb_bytes(self) -> float:
        return self.glb_mb * 2**20

    def label(self) -> str:
        return self.name or (f"{{{self.num_tc},{self.num_vc},{self.pe_x},{self.pe_y},{self.pe_vc}}}"
                             f" glb{self.glb_mb:g}MB")

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Accelerator:
        if not isinstance(d, dict):
            raise ValueError(f"an accelerator description must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown accelerator field(s) {unknown}; allowed: {sorted(known)}")
        required = ("num_tc", "num_vc", "pe_x", "pe_y", "glb_mb")
        missing = [f for f in required if f not in d]
        if missing:
            raise ValueError(f"accelerator field {missing[0]!r} is missing (required: {list(required)})")
        d = dict(d)
        d.setdefault("pe_vc", d["pe_x"])
        return cls(**d)

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> Accelerator:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"architecture file {str(path)!r} does not exist") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"architecture file {str(path)!r} is not valid JSON: {e}") from None
        return cls.from_dict(d)

    def with_(self, **changes: Any) -> Accelerator:
        """A copy with some fields changed; derived sizes are derived again unless given."""
        derived = {"glb_bw": 0, "l2_tc_kb": 0.0, "l2_vc_kb": 0.0}
        return replace(self, **{**derived, **changes})
