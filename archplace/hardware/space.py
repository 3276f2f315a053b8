"""The Phaze architecture search space, defined once in ``tune_configs/phaze_table1.yaml`` and
enumerated here: every grid point, its area, the area constraint, sorted by decreasing area.

Vectorised: the ~76k grid points are a few numpy arrays, so enumeration takes milliseconds.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .accelerator import Accelerator
from .area import accelerator_area_mm2, area_mm2

ARCH_FIELDS = ("num_tc", "num_vc", "pe_x", "pe_y", "glb_mb")
DEFAULT_SPACE = "phaze_table1.yaml"


SpaceSpec = str | Path | dict | None


def read_space_spec(spec: SpaceSpec, default_file: str, label: str, file_label: str) -> tuple[Any, str]:
    """A space spec as every search target takes it: the already-read content (a dict, returned as is),
    ``None`` (the packaged ``tune_configs/default_file``) or a YAML path. Returns the parsed content,
    unchecked, and where it came from for error messages (``label`` for a dict; a missing file is
    ``"{file_label} 'path' does not exist"``)."""
    import yaml

    if isinstance(spec, dict):
        return spec, label
    if spec is None:
        text = resources.files("archplace.tune_configs").joinpath(default_file).read_text()
        return yaml.safe_load(text), default_file
    p = Path(spec)
    if not p.exists():
        raise ValueError(f"{file_label} {str(p)!r} does not exist")
    return yaml.safe_load(p.read_text()), str(p)


def load_space_config(path: SpaceSpec = None) -> dict[str, Any]:
    """Read and check a search space: the packaged Phaze space (``None``), a YAML file, or the
    already-read content as a dict (what a search ships to its workers, so no worker node needs the
    file)."""
    cfg, where = read_space_spec(path, DEFAULT_SPACE, "search space", "search-space file")
    if not isinstance(cfg, dict) or "architecture" not in cfg:
        raise ValueError(f"{where}: field 'architecture' is missing")
    arch = cfg["architecture"]
    for f in ARCH_FIELDS:
        if f not in arch:
            raise ValueError(f"{where}: field 'architecture.{f}' is missing")
        _values(arch[f], f"{where}: architecture.{f}")
    unknown = set(arch) - set(ARCH_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) architecture.{sorted(unknown)}; "
                         f"allowed: {list(ARCH_FIELDS)}")
    return cfg


def _values(spec: Any, where: str) -> np.ndarray:
    """``{pow2: [lo, hi]}`` or an explicit list of positive numbers."""
    if isinstance(spec, dict) and set(spec) == {"pow2"}:
        lo, hi = spec["pow2"] if isinstance(spec["pow2"], list) and len(spec["pow2"]) == 2 else (None, None)
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= 20):
            raise ValueError(f"{where}: 'pow2' needs [lo, hi] with 0 <= lo <= hi <= 20, got {spec['pow2']!r}")
        return 2.0 ** np.arange(lo, hi + 1)
    if isinstance(spec, list) and spec and all(isinstance(v, (int, float)) and v > 0 for v in spec):
        return np.asarray(sorted(set(spec)), dtype=np.float64)
    raise ValueError(f"{where}: must be {{pow2: [lo, hi]}} or a non-empty list of positive numbers, "
                     f"got {spec!r}")


@dataclass(frozen=True)
class ArchSpace:
    """The feasible architectures as columns, largest area first."""

    num_tc: np.ndarray
    num_vc: np.ndarray
    pe_x: np.ndarray
    pe_y: np.ndarray
    glb_mb: np.ndarray
    area_mm2: np.ndarray
    area_max_mm2: float
    area_min_mm2: float
    training: dict[str, list]

    def __len__(self) -> int:
        return len(self.area_mm2)

    @property
    def pe_vc(self) -> np.ndarray:
        return self.pe_x

    def accelerator(self, i: int, **fixed: Any) -> Accelerator:
        """The i-th architecture (``fixed`` sets the non-searched fields, e.g. hbm_gb)."""
        return Accelerator(int(self.num_tc[i]), int(self.num_vc[i]), int(self.pe_x[i]), int(self.pe_y[i]),
                           int(self.pe_x[i]), float(self.glb_mb[i]), **fixed)

    def accelerators(self, **fixed: Any) -> list[Accelerator]:
        return [self.accelerator(i, **fixed) for i in range(len(self))]

    def index_of(self, acc: Accelerator) -> int:
        hit = np.flatnonzero((self.num_tc == acc.num_tc) & (self.num_vc == acc.num_vc) &
                             (self.pe_x == acc.pe_x) & (self.pe_y == acc.pe_y) &
                             (self.glb_mb == acc.glb_mb))
        if not len(hit):
            raise ValueError(f"{acc.label()} is not in the feasible space")
        return int(hit[0])


@functools.lru_cache(maxsize=8)
def _enumerate_cached(path: str | None) -> ArchSpace:
    return _enumerate(load_space_config(path))


@functools.lru_cache(maxsize=8)
def _enumerate_content(text: str) -> ArchSpace:
    return _enumerate(load_space_config(json.loads(text)))


def _enumerate(cfg: dict[str, Any]) -> ArchSpace:
    from .presets import preset_accelerator

    arch, cons = cfg["architecture"], cfg.get("constraints", {}) or {}
    axes = [_values(arch[f], f"architecture.{f}") for f in ARCH_FIELDS]
    grid = np.meshgrid(*axes, indexing="ij")
    tc, vc, px, py, glb = (a.ravel() for a in grid)
    area = area_mm2(tc, vc, px, py, glb)
    ref_name = cons.get("area_max_preset", "tpuv4")
    ref = preset_accelerator(ref_name)
    amax = amax_ref = accelerator_area_mm2(ref)
    # an explicit area budget (a study's constraint) caps the space; the lower bound stays relative to
    # the preset, so the budget only removes architectures and never adds small ones
    if cons.get("area_max_mm2") is not None:
        amax_given = cons["area_max_mm2"]
        if isinstance(amax_given, bool) or not isinstance(amax_given, (int, float)) or not amax_given > 0:
            raise ValueError(f"constraints.area_max_mm2 must be a positive number, got {amax_given!r}")
        amax = float(amax_given)
    frac = float(cons.get("area_min_fraction", 0.0))
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"constraints.area_min_fraction must be in [0, 1], got {frac}")
    lower = frac * amax_ref
    exempt = ((tc == 1) | (vc == 1) if cons.get("area_min_exempt_single_core", False)
              else np.zeros_like(tc, bool))
    ok = (area <= amax * (1 + 1e-12)) & ((area >= lower) | exempt)
    # decreasing area; ties broken by the compute tuple so the order is deterministic
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((glb[idx], py[idx], px[idx], vc[idx], tc[idx], -area[idx]))]
    if not len(order):
        raise ValueError("the search space has no architecture within the area constraint")
    training = cfg.get("training", {}) or {}
    as_int = lambda a: a[order].astype(np.int64)  # noqa: E731
    return ArchSpace(as_int(tc), as_int(vc), as_int(px), as_int(py), glb[order], area[order], amax,
                     lower, {k: list(v) for k, v in training.items()})


def enumerate_space(path: SpaceSpec = None) -> ArchSpace:
    """Feasible architectures of the space in ``path`` (default: the packaged Phaze space), or of a
    space given by content (a dict as ``load_space_config`` returns it)."""
    if isinstance(path, dict):
        return _enumerate_content(json.dumps(path, sort_keys=True))
    return _enumerate_cached(None if path is None else str(path))
