"""Fast placement baselines for an operator graph on the GPUs of one machine (GDP, issue 18).

Each baseline is a function ``(problem, *, seed=0, ...) -> placement``: an ``int64`` array of one
device per op position of a :class:`~archplace.simulators.gpu_placement.PlacementProblem`. Every
baseline places a co-location group as one unit, so no group is ever split. None of them simulates;
``simulate(problem, placement)`` gives the step time and says whether memory held.

Where things are (one concern per module; each module's docstring describes its placers):

* ``metis`` (``metis_partition.py``): the graph-partitioning baseline of GDP's Table 1 ("TensorFlow
  METIS placement", Karypis & Kumar 1998; spec §7).
* ``m_topo``, ``m_etf``, ``m_sct``: the memory-constrained placers of Baechi (Jeon et al., "Baechi:
  Fast Device Placement of Machine Learning Graphs", SoCC 2020), written after the authors' code
  (``placer/m_topo.py``, ``m_etf.py``, ``m_sct.py`` of github.com/beomyeol/baechi):
  **m-TOPO** in ``baechi_topo.py``, **m-ETF** and **m-SCT** in ``baechi_etf_sct.py``, the memory model
  all three share in ``baechi_memory.py``.
* ``human`` and ``human_from_graph`` (``human_like.py``): human-expert-like placements.
* ``random_placement`` (uniform device per co-location group / op) and ``single_device`` (everything
  on device 0, the ``d = 1`` reference).
* ``units.py``: the checks of a problem and its placement units (co-location groups), shared by all.

:data:`BASELINES` maps the CLI names to the functions. All are plain numpy/Python (heaps): on a
5,000-op graph and 8 GPUs m-ETF and m-SCT take 0.2-0.7 s, the others a few ms (25,000-op GNMT-8:
about 1 s and 2 s). No Ray here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .baechi_etf_sct import _favourite_children as _favourite_children
from .baechi_etf_sct import _list_schedule as _list_schedule
from .baechi_etf_sct import m_etf, m_sct
from .baechi_memory import _MemoryBook as _MemoryBook
from .baechi_topo import m_topo
from .human_like import RNN_FAMILIES, human, human_from_graph
from .human_like import _fill_layers as _fill_layers
from .metis_partition import _int_weights as _int_weights
from .metis_partition import metis
from .trivial import random_placement, single_device
from .units import _units as _units

__all__ = ["BASELINES", "FAST_PLACERS", "RNN_FAMILIES", "fast_placements",
           "human", "human_from_graph", "m_etf", "m_sct", "m_topo", "metis",
           "random_placement", "single_device"]

BASELINES: dict[str, Callable[..., np.ndarray]] = {
    "metis": metis,
    "m-topo": m_topo,
    "m-etf": m_etf,
    "m-sct": m_sct,
    "human": human,
    "random": random_placement,
    "single": single_device,
}

# the fast placers a search starts from (sa / lns, and GDP's warm start): the best of them is the start
FAST_PLACERS = ("human", "metis", "m-topo", "m-etf", "m-sct")


def fast_placements(graph, problem, seed: int = 0,
                    algos: tuple[str, ...] = FAST_PLACERS) -> dict[str, np.ndarray]:
    """Each fast placer's placement (``graph``: the op graph, which the human-like placer reads)."""
    return {a: human_from_graph(graph, problem) if a == "human" else BASELINES[a](problem, seed=seed)
            for a in algos}
