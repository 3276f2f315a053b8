"""Loader for the profiled graphs of ``msr-fiddle/dnn-partitioning`` (Tarnawski et al., NeurIPS 2020).

One JSON object per file; the published graphs are bundled in ``DATA_DIR`` (their README says where they
come from, MIT licence)::

    {"maxSizePerFPGA": bytes, "maxFPGAs": k, "maxCPUs": c,
     "nodes": [{"id", "supportedOnFpga", "cpuLatency", "fpgaLatency", "isBackwardNode",
                "size"?, "colorClass"?, "name"?, "layerId"?}, ...],
     "edges": [{"sourceId", "destId", "cost", "size"?}, ...]}

Required and optional fields follow the reference program (``throughput-dp/dp.cpp``): a node needs
``id``, ``supportedOnFpga``, ``cpuLatency``, ``fpgaLatency`` and ``isBackwardNode``; ``size`` defaults
to 0 and ``colorClass`` to "none" (-1 here). An edge needs ``sourceId``, ``destId`` and ``cost``, and
all out-edges of one node must carry the same ``cost``.

Every node becomes an operator of kind ``"profiled"`` (core ``"none"``): the format gives measured
times, not shapes, so the flop/byte columns stay 0 and the measurements travel as extra columns:

========================  =========  ==========================================================
extra node column          dtype      source field
========================  =========  ==========================================================
``cpu_latency``            float64    ``cpuLatency`` (time on a CPU core)
``acc_latency``            float64    ``fpgaLatency`` (time on an accelerator)
``supported_on_acc``       bool       ``supportedOnFpga``
``color_class``            int64      ``colorClass``; -1 when absent
``mem_bytes``              float64    ``size`` (memory on an accelerator, bytes); 0 when absent
``layer_id``               int64      ``layerId`` (informational); -1 when absent
========================  =========  ==========================================================

Extra edge columns: ``cost`` (float64, time to move the source's output between an accelerator and CPU
memory) and ``size_bytes`` (float64, the edge's undocumented ``size`` field; -1 when absent). The edge
``bytes`` column is 0: the objective of the format charges ``cost``, not bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .graph import OpGraph

SOURCE = "dnn-partitioning"
# the graphs of msr-fiddle/dnn-partitioning, shipped as package data (MIT, LICENSE.txt beside them)
DATA_DIR = Path(__file__).resolve().parent / "data" / "dnn-partitioning"


def bundled_graphs() -> dict[str, Path]:
    """The bundled graphs by name: ``gnmt_training`` (a layer graph), ``OperatorGraphs/bert_l-3_training``
    (either folder may be named; a bare stem means the layer graph where both folders have it)."""
    out: dict[str, Path] = {}
    for folder in ("OperatorGraphs", "LayerGraphs"):   # LayerGraphs last: its stems win the bare names
        for f in sorted((DATA_DIR / "throughput-inputs" / folder).glob("*.json")):
            out[f"{folder}/{f.stem}"] = f
            out[f.stem] = f
    return out


def resolve_graph_file(name: str) -> Path | None:
    """``name`` as a path when that file exists, else the bundled graph of that name (``.json`` optional),
    else None: so users and the docs can say ``archplace solve-dp gnmt_training`` from any folder."""
    path = Path(name)
    if path.is_file():
        return path
    key = name[: -len(".json")] if name.endswith(".json") else name
    return bundled_graphs().get(key)

# field -> (kind, required); kinds: "int", "bool01", "number", "str"
_NODE_FIELDS: dict[str, tuple[str, bool]] = {
    "id": ("int", True),
    "supportedOnFpga": ("bool01", True),
    "cpuLatency": ("number", True),
    "fpgaLatency": ("number", True),
    "isBackwardNode": ("bool01", True),
    "size": ("number", False),
    "colorClass": ("int", False),
    "layerId": ("int", False),
    "name": ("str", False),
}
_EDGE_FIELDS: dict[str, tuple[str, bool]] = {
    "sourceId": ("int", True),
    "destId": ("int", True),
    "cost": ("number", True),
    "size": ("number", False),
}
_TOP_FIELDS: dict[str, tuple[str, bool]] = {
    "maxSizePerFPGA": ("number", True),
    "maxFPGAs": ("int", True),
    "maxCPUs": ("int", True),
}
_NON_NEGATIVE = {"cpuLatency", "fpgaLatency", "size", "cost", "maxSizePerFPGA", "maxFPGAs", "maxCPUs"}
# Out-edge costs of one node may differ by this much (the reference program's tolerance).
_COST_TOLERANCE = 1e-6


def _check(value: Any, kind: str, where: str, name: str) -> Any:
    """Return ``value`` converted to its Python type, or raise naming ``where`` and the field."""
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: field {name!r} is {value!r} ({type(value).__name__}), "
                             "expected an integer")
        out: Any = int(value)
    elif kind == "bool01":
        if isinstance(value, bool):
            out = value
        elif isinstance(value, int) and value in (0, 1):
            out = bool(value)
        else:
            raise ValueError(f"{where}: field {name!r} is {value!r} ({type(value).__name__}), "
                             "expected true/false or 0/1")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: field {name!r} is {value!r} ({type(value).__name__}), "
                             "expected a number")
        out = float(value)
        if not math.isfinite(out):
            raise ValueError(f"{where}: field {name!r} is {value!r}, expected a finite number")
    elif kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{where}: field {name!r} is {value!r} ({type(value).__name__}), "
                             "expected a string")
        out = value
    else:  # pragma: no cover - programming error
        raise AssertionError(kind)
    if name in _NON_NEGATIVE and out < 0:
        raise ValueError(f"{where}: field {name!r} is {value!r}, must be non-negative")
    return out


def _record(obj: Any, spec: dict[str, tuple[str, bool]], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    out = {}
    for name, (kind, required) in spec.items():
        if name not in obj:
            if required:
                raise ValueError(f"{where}: field {name!r} is missing")
            continue
        out[name] = _check(obj[name], kind, where, name)
    return out


def parse_dnn_partitioning(data: Any, model: str = "?") -> OpGraph:
    """Build the graph from an already decoded JSON object (see :func:`load_dnn_partitioning`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{model}: expected a JSON object at the top level, got {type(data).__name__}")
    top = _record(data, _TOP_FIELDS, model)
    for key in ("nodes", "edges"):
        if key not in data:
            raise ValueError(f"{model}: field {key!r} is missing")
        if not isinstance(data[key], list):
            raise ValueError(f"{model}: field {key!r} is {type(data[key]).__name__}, expected a list")

    nodes = []
    for i, raw in enumerate(data["nodes"]):
        where = f"node {raw['id']}" if isinstance(raw, dict) and isinstance(raw.get("id"), int) \
            and not isinstance(raw.get("id"), bool) else f"node #{i}"
        nodes.append(_record(raw, _NODE_FIELDS, where))
    seen: dict[int, int] = {}
    for i, nd in enumerate(nodes):
        if nd["id"] in seen:
            raise ValueError(f"node {nd['id']}: field 'id' is not unique (nodes #{seen[nd['id']]} and #{i})")
        seen[nd["id"]] = i

    edges = []
    out_cost: dict[int, tuple[float, int]] = {}
    for i, raw in enumerate(data["edges"]):
        where = f"edge #{i}"
        if isinstance(raw, dict) and "sourceId" in raw and "destId" in raw:
            where = f"edge #{i} ({raw['sourceId']!r} -> {raw['destId']!r})"
        ed = _record(raw, _EDGE_FIELDS, where)
        for end in ("sourceId", "destId"):
            if ed[end] not in seen:
                raise ValueError(f"{where}: field {end!r} names node {ed[end]}, which does not exist")
        if ed["sourceId"] == ed["destId"]:
            raise ValueError(f"{where}: fields 'sourceId' and 'destId' are equal (a self-loop is a cycle)")
        src = ed["sourceId"]
        if src in out_cost and abs(out_cost[src][0] - ed["cost"]) > _COST_TOLERANCE:
            prev_cost, prev_i = out_cost[src]
            raise ValueError(f"{where}: field 'cost' is {ed['cost']!r}, but edge #{prev_i} out of the same "
                             f"node {src} has cost {prev_cost!r}; all out-edges of a node must cost the same")
        out_cost.setdefault(src, (ed["cost"], i))
        edges.append(ed)

    ids = np.array([nd["id"] for nd in nodes], dtype=np.int64)
    n = len(nodes)
    node_cols = {
        "id": ids,
        "name": np.array([nd.get("name", f"op{nd['id']}") for nd in nodes], dtype=object),
        "kind": np.full(n, "profiled", dtype=object),
        "core": np.full(n, "none", dtype=object),
        "is_backward": np.array([nd["isBackwardNode"] for nd in nodes], dtype=bool),
        "layer": np.full(n, -1, dtype=np.int32),
    }
    extra_nodes = {
        "cpu_latency": np.array([nd["cpuLatency"] for nd in nodes], dtype=np.float64),
        "acc_latency": np.array([nd["fpgaLatency"] for nd in nodes], dtype=np.float64),
        "supported_on_acc": np.array([nd["supportedOnFpga"] for nd in nodes], dtype=bool),
        "color_class": np.array([nd.get("colorClass", -1) for nd in nodes], dtype=np.int64),
        "mem_bytes": np.array([nd.get("size", 0.0) for nd in nodes], dtype=np.float64),
        "layer_id": np.array([nd.get("layerId", -1) for nd in nodes], dtype=np.int64),
    }
    m = len(edges)
    edge_cols = {
        "src": np.array([ed["sourceId"] for ed in edges], dtype=np.int64),
        "dst": np.array([ed["destId"] for ed in edges], dtype=np.int64),
        "bytes": np.zeros(m, dtype=np.int64),
        "arg": np.zeros(m, dtype=np.int16),
    }
    extra_edges = {
        "cost": np.array([ed["cost"] for ed in edges], dtype=np.float64),
        "size_bytes": np.array([ed.get("size", -1.0) for ed in edges], dtype=np.float64),
    }
    meta = {
        "model": model,
        "source": SOURCE,
        "max_bytes_per_acc": top["maxSizePerFPGA"],
        "max_accs": top["maxFPGAs"],
        "max_cpus": top["maxCPUs"],
    }
    try:
        return OpGraph.from_columns(node_cols, edge_cols, meta, extra_nodes, extra_edges)
    except ValueError as e:  # cycles (the checks above cover the rest): say which file
        raise ValueError(f"{model}: {e}") from e


def _read_json(path: Path) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e


def load_dnn_partitioning(path: str | Path) -> OpGraph:
    """Load one dnn-partitioning JSON file as an :class:`OpGraph` (``meta["model"]`` is the file stem).

    Raises ``ValueError`` naming the node or edge and the field when a required field is missing,
    has the wrong type or a negative value, when an edge names an unknown node, or on a cycle.
    """
    path = Path(path)
    return parse_dnn_partitioning(_read_json(path), model=path.stem)


# ---------------------------------------------------------------------------------------------- experts
@dataclass
class ExpertSplit:
    """A human expert's placement (``human-experts/*.json``).

    ``accs[i]`` / ``cpus[j]`` list the node ids placed on accelerator i / CPU j. ``acc_loads``,
    ``cpu_loads`` and ``max_load`` are the loads written in the file, ``None`` where the file has -1
    (not computed; every published file has -1 for the accelerators and the max-load).
    """

    model: str
    accs: list[list[int]]
    cpus: list[list[int]]
    acc_loads: list[float | None] = field(default_factory=list)
    cpu_loads: list[float | None] = field(default_factory=list)
    max_load: float | None = None

    @property
    def num_accs(self) -> int:
        return len(self.accs)

    def device_of(self) -> dict[int, int]:
        """Node id -> device: ``0..num_accs-1`` for accelerators, ``num_accs + j`` for CPU j."""
        out: dict[int, int] = {}
        for d, ids in enumerate(self.accs + self.cpus):
            for i in ids:
                out[i] = d
        return out

    def device_array(self, graph: OpGraph) -> np.ndarray:
        """The device of every row of ``graph`` (numbering as in :meth:`device_of`).

        A training graph may be paired with an inference split: a node the split does not list,
        if it is a backward node, goes to the device of the forward node of its colour class.
        Raises ``ValueError`` when a node stays unplaced or the split names a node not in the graph.
        """
        dev = self.device_of()
        ids = graph.nodes["id"]
        known = set(ids.tolist())
        unknown = sorted(set(dev) - known)
        if unknown:
            raise ValueError(f"expert split {self.model}: node {unknown[0]} is not in graph "
                             f"{graph.meta.get('model', '?')}")
        out = np.array([dev.get(int(i), -1) for i in ids], dtype=np.int64)
        missing = out < 0
        if missing.any() and "color_class" in graph.extra_nodes:
            cc = graph.extra_nodes["color_class"]
            bwd = graph.nodes["is_backward"]
            cc_dev = {int(c): int(d) for c, d, b in zip(cc, out, bwd, strict=True)
                      if not b and d >= 0 and c >= 0}
            for r in np.flatnonzero(missing & bwd):
                out[r] = cc_dev.get(int(cc[r]), -1)
        if (out < 0).any():
            r = int(np.flatnonzero(out < 0)[0])
            raise ValueError(f"expert split {self.model}: node {ids[r]} ({graph.nodes['name'][r]}) "
                             "is placed on no device")
        return out


def _load_or_none(x: Any, where: str) -> float | None:
    v = _check(x, "number", where, "load")
    return None if v == -1 else v


def load_expert_split(path: str | Path) -> ExpertSplit:
    """Load ``human-experts/<model>_expert.json``: ``{"fpgas": [{"load", "nodes"}], "cpus": [...],
    "maxLoad"}``. ``model`` is the file stem without ``_expert``. A node listed twice raises."""
    path = Path(path)
    data = _read_json(path)
    model = path.stem.removesuffix("_expert")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    groups: dict[str, list[list[int]]] = {}
    loads: dict[str, list[float | None]] = {}
    for key in ("fpgas", "cpus"):
        if key not in data:
            raise ValueError(f"{path}: field {key!r} is missing")
        if not isinstance(data[key], list):
            raise ValueError(f"{path}: field {key!r} is {type(data[key]).__name__}, expected a list")
        groups[key], loads[key] = [], []
        for d, dev in enumerate(data[key]):
            where = f"{path}: {key}[{d}]"
            if not isinstance(dev, dict):
                raise ValueError(f"{where}: expected a JSON object")
            if "nodes" not in dev:
                raise ValueError(f"{where}: field 'nodes' is missing")
            if not isinstance(dev["nodes"], list):
                raise ValueError(f"{where}: field 'nodes' is {type(dev['nodes']).__name__}, expected a list")
            groups[key].append([_check(i, "int", where, "nodes") for i in dev["nodes"]])
            loads[key].append(_load_or_none(dev["load"], where) if "load" in dev else None)
    seen: dict[int, str] = {}
    for key in ("fpgas", "cpus"):
        for d, ids in enumerate(groups[key]):
            for i in ids:
                if i in seen:
                    raise ValueError(f"{path}: field 'nodes': node {i} is listed in {seen[i]} and {key}[{d}]")
                seen[i] = f"{key}[{d}]"
    max_load = _load_or_none(data["maxLoad"], f"{path}") if "maxLoad" in data else None
    return ExpertSplit(model=model, accs=groups["fpgas"], cpus=groups["cpus"], acc_loads=loads["fpgas"],
                       cpu_loads=loads["cpus"], max_load=max_load)
