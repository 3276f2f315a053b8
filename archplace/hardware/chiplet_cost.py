"""What a multi-chip-module (MCM) package costs to build: chiplet area, die yield, known-good-die cost and
packaging, in the style of Chiplet Actuary (Y. Feng and K. Ma, "Chiplet Actuary: A Quantitative Cost
Model and Multi-Chiplet Architecture Exploration", DAC 2022, arXiv 2203.12268, Section 3).

Why a cost model: a co-design search over chiplet packages (``archplace search --target mcm``) that
only maximises throughput always picks the largest package. The question the search answers is which
package gives the most throughput per dollar, and where the throughput-vs-cost Pareto front lies.

The model, per package of ``n`` identical chiplets (all numbers in :class:`CostParams`, units in the
names):

* **chiplet area** ``A`` (mm²): the Phaze area model of ``hardware/area.py`` for one tensor core of
  ``pe × pe`` MACs, one vector core of ``pe`` lanes and ``sram_mb`` of SRAM (the chiplet's only memory),
  plus the die-to-die (D2D) PHYs: ``ports × link_gbs × d2d_phy_mm2_per_gbs`` (a ring chiplet has 2
  ports, in and out; a 2-D mesh chiplet 4);
* **dies per wafer** (Chiplet Actuary Eq. 2, the usual gross-die estimate with edge loss):
  ``N = π (d/2)² / A − π d / sqrt(2 A)`` for a wafer of diameter ``d``;
* **die yield**, negative binomial (Chiplet Actuary Eq. 1; Cunningham, IEEE Trans. Semicond. Manuf. 1990):
  ``Y = (1 + A · D0 / α) ** (−α)`` with defect density ``D0`` (per cm², A converted to cm²) and
  clustering parameter ``α``;
* **raw die cost** ``wafer_usd / N``; **known-good-die (KGD) cost** ``(raw + test) / Y``: every good die
  pays for the bad ones, and each die is tested (wafer sort) before it is bonded;
* **packaging** (Chiplet Actuary's MCM flow, chip-last): a substrate of area ``A_pkg = n · A ·
  substrate_area_factor`` at ``substrate_usd_per_mm2`` and ``bond_usd_per_chiplet`` per chiplet. The
  assembly succeeds with ``Y_pkg = substrate_yield · bond_yield ** n``; a failed assembly scraps its
  known-good dies too, so
  ``package_usd = (n · KGD + substrate + n · bond) / Y_pkg``.

The D2D energy (``link_pj_per_bit``) is not a cost here; the trial reports it as energy per sample.

Sources of the defaults (:data:`DEFAULT_PARAMS`):

* ``wafer_usd`` 3,677: the foundry sale price of a 300 mm wafer at 20 nm (the area model is 22 nm class)
  in the CSET report's table of foundry sale price per wafer by node (S. M. Khan and A. Mann, "AI Chips:
  What They Are and Why They Matter", CSET, April 2020, Appendix);
* ``wafer_diameter_mm`` 300: the wafer the price is for;
* ``defect_density_per_cm2`` 0.1 and ``clustering_alpha`` 3: the values Chiplet Actuary's examples use for
  a mature node and the usual negative-binomial clustering parameter (assumption: we could not quote the
  paper's table here; both are inputs of the YAML space and the test checks the formula, not them);
* ``test_usd_per_die`` 0.5, ``substrate_usd_per_mm2`` 0.005, ``substrate_area_factor`` 1.5,
  ``bond_usd_per_chiplet`` 1.0, ``bond_yield`` 0.99, ``substrate_yield`` 0.99: assumptions of the order of
  Chiplet Actuary's organic-substrate MCM example (cheap substrate, per-chiplet bonding cost and yield
  the terms that make many tiny chiplets expensive); all are YAML inputs;
* ``d2d_phy_mm2_per_gbs`` 0.02: assumption (0.64 mm² for a 32 GB/s port), the order of a UCIe
  standard-package module (UCIe 1.0 white paper, 2022) — no public per-GB/s area figure.

Plain Python and numpy; no Ray.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .area import area_mm2

TOPOLOGY_PORTS = {"ring": 2, "mesh": 4}  # D2D ports per chiplet: ring in/out; 2-D mesh N/E/S/W


@dataclass(frozen=True)
class CostParams:
    """The cost model's constants (module doc for their sources)."""

    wafer_usd: float = 3677.0
    wafer_diameter_mm: float = 300.0
    defect_density_per_cm2: float = 0.1
    clustering_alpha: float = 3.0
    test_usd_per_die: float = 0.5
    substrate_usd_per_mm2: float = 0.005
    substrate_area_factor: float = 1.5
    substrate_yield: float = 0.99
    bond_usd_per_chiplet: float = 1.0
    bond_yield: float = 0.99
    d2d_phy_mm2_per_gbs: float = 0.02

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"cost field {f.name!r} must be a finite number >= 0, got {v!r}")
        for name in ("wafer_usd", "wafer_diameter_mm", "clustering_alpha", "substrate_area_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"cost field {name!r} must be > 0, got {getattr(self, name)!r}")
        for name in ("substrate_yield", "bond_yield"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"cost field {name!r} must be in (0, 1], got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> CostParams:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"cost: unknown field(s) {bad}; allowed: {sorted(known)}")
        return cls(**{k: float(v) for k, v in d.items()})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT_PARAMS = CostParams()


@dataclass(frozen=True)
class PackageCost:
    """One package's cost breakdown. ``package_usd`` is the cost of one good package."""

    chiplet_area_mm2: float      # one chiplet, PHYs included
    phy_area_mm2: float          # of which D2D PHYs
    dies_per_wafer: float
    die_yield: float
    raw_die_usd: float
    kgd_usd: float               # one known-good die
    substrate_usd: float
    bond_usd: float              # all chiplets
    package_yield: float
    package_usd: float
    silicon_area_mm2: float      # all chiplets

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def chiplet_area_mm2(pe: int, sram_mb: float, link_gbs: float, topology: str,
                     params: CostParams = DEFAULT_PARAMS) -> tuple[float, float]:
    """(chiplet area, of which D2D PHY area) in mm²: the Phaze area model of one ``pe × pe`` tensor core,
    one ``pe``-lane vector core and ``sram_mb`` of SRAM, plus ``ports × link_gbs`` of PHY."""
    if topology not in TOPOLOGY_PORTS:
        raise ValueError(f"topology {topology!r} unknown; allowed: {sorted(TOPOLOGY_PORTS)}")
    core = float(area_mm2(1, 1, pe, pe, sram_mb))
    phy = TOPOLOGY_PORTS[topology] * float(link_gbs) * params.d2d_phy_mm2_per_gbs
    return core + phy, phy


def dies_per_wafer(area_mm2_: float, diameter_mm: float) -> float:
    """Gross dies per wafer with edge loss (Chiplet Actuary Eq. 2): ``π r² / A − π d / sqrt(2 A)``."""
    if not area_mm2_ > 0:
        raise ValueError(f"die area must be > 0 mm², got {area_mm2_}")
    n = math.pi * (diameter_mm / 2) ** 2 / area_mm2_ - math.pi * diameter_mm / math.sqrt(2 * area_mm2_)
    if n < 1:
        raise ValueError(f"a die of {area_mm2_:.0f} mm² does not fit on a {diameter_mm:g} mm wafer")
    return n


def die_yield(area_mm2_: float, defect_density_per_cm2: float, alpha: float) -> float:
    """Negative-binomial die yield (Chiplet Actuary Eq. 1): ``(1 + A · D0 / α) ** (−α)``, A in cm²."""
    return (1.0 + area_mm2_ / 100.0 * defect_density_per_cm2 / alpha) ** (-alpha)


def package_cost(num_chiplets: int, pe: int, sram_mb: float, link_gbs: float, topology: str,
                 params: CostParams = DEFAULT_PARAMS) -> PackageCost:
    """The cost of one good package of ``num_chiplets`` identical chiplets (module doc)."""
    if isinstance(num_chiplets, bool) or not isinstance(num_chiplets, int) or num_chiplets < 1:
        raise ValueError(f"num_chiplets must be a positive integer, got {num_chiplets!r}")
    a, phy = chiplet_area_mm2(pe, sram_mb, link_gbs, topology, params)
    n_wafer = dies_per_wafer(a, params.wafer_diameter_mm)
    y = die_yield(a, params.defect_density_per_cm2, params.clustering_alpha)
    raw = params.wafer_usd / n_wafer
    kgd = (raw + params.test_usd_per_die) / y
    substrate = num_chiplets * a * params.substrate_area_factor * params.substrate_usd_per_mm2
    bond = num_chiplets * params.bond_usd_per_chiplet
    y_pkg = params.substrate_yield * params.bond_yield ** num_chiplets
    total = (num_chiplets * kgd + substrate + bond) / y_pkg
    return PackageCost(a, phy, n_wafer, y, raw, kgd, substrate, bond, y_pkg, total, num_chiplets * a)
