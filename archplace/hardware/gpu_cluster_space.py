"""The GPU-cluster co-design space (``archplace search --target gpu-cluster``, issue 32 item 2): which GPU,
how many per server, how many servers, and how fast the links inside and between servers are.

A point of the space is a :class:`ClusterShape`; :func:`cluster_of_shape` turns it into the
:class:`~archplace.hardware.presets.Cluster` the pipeline cost model and its exact DP take
(``simulators/pipeline.py``, ``algorithms/solvers/pipeline_dp.py``): ``servers`` topology,
``gpus_per_server`` devices on the intra-server link, the inter-server link between servers. The
space itself is YAML (default ``tune_configs/gpu_cluster_space.yaml``), read by :func:`load_space`.

Bandwidth classes. The cost model's ``link_bw`` / ``inter_server_bw`` are rates *per direction* that one
transfer (an activation between pipeline stages, a ring AllReduce step) gets:

- intra-server ``nvlink``: the GPU's NVLink per direction (``hardware/gpus.py``: V100 150 GB/s, A100
  300 GB/s, H100/H200 450 GB/s, from each datasheet's bidirectional figure halved);
- intra-server ``pcie``: the GPU's PCIe x16 per direction (Gen3 16 GB/s on V100, Gen4 32 GB/s on A100,
  Gen5 64 GB/s on H100/H200; same datasheets), the "PCIe server without NVLink" alternative;
- inter-server (:data:`NETWORKS`): the *server's* network, all its NICs together, as published for an
  instance or a NIC, shared by the server's GPUs. A transfer between servers gets one GPU's share,
  ``Gb/s per server / 8 / GPUs per server`` bytes/s, and never more than the GPU's PCIe x16 (GPUDirect
  RDMA reaches the NIC over it). A p4d.24xlarge has 4 x 100 Gb/s of EFA for 8 A100s: 6.25 GB/s per GPU,
  not 50. The classes are the networks of the instances ``hardware/cluster_prices.py`` prices
  (``efa-100g`` p3dn, ``efa-400g`` p4d/p4de, ``efa-3200g`` p5/p5e) and two NIC builds (``eth-25g``: one
  25 GbE port, Auto-MAP's V100 servers; ``ib-hdr-200g``: one 200 Gb/s HDR InfiniBand port, whose share
  at 8 GPUs per server is the 25 Gb/s per transfer of the ``v100-server-A|B|C`` presets). No protocol
  overhead is charged (as the presets do). Each class has a price per server-hour
  (``cluster_prices.network_usd_per_hour``), so a faster network is no longer free.

With one server there is no inter-server traffic and the inter class changes only the price; with one
GPU per server the intra class changes nothing. Both stay in the shape so that the grid is a plain
product.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .gpus import GPUS, GPUSpec, gpu_spec
from .presets import GPU, Cluster

DEFAULT_SPACE = "gpu_cluster_space.yaml"
# The GPU presets the space can hold: the four generations issue 32 names (V100 / A100 / H100 / H200),
# each with a cited price (hardware/cluster_prices.py). The P100 PCIe has no NVLink and no price row.
CLUSTER_GPUS = ("v100-sxm2", "a100-40gb", "a100-80gb", "h100-sxm", "h200")
INTRA_CLASSES = ("pcie", "nvlink")


@dataclass(frozen=True)
class Network:
    """An inter-server network class: what one server has towards the others, all NICs together."""

    name: str
    gbps_per_server: float   # Gb/s per direction, the server's NICs together
    what: str                # what it is and where the figure is published


# the server's whole network; one GPU's share is gbps_per_server / GPUs per server (module doc)
NETWORKS: dict[str, Network] = {n.name: n for n in (
    Network("eth-25g", 25.0, "one 25 GbE port per server (Auto-MAP's V100 servers, spec automap.md §11)"),
    Network("efa-100g", 100.0, "p3dn.24xlarge: 100 Gb/s (EFA) for 8 V100 "
            "(aws.amazon.com/ec2/instance-types/p3/)"),
    Network("ib-hdr-200g", 200.0, "one 200 Gb/s HDR InfiniBand port (ConnectX-6) per server"),
    Network("efa-400g", 400.0, "p4d/p4de.24xlarge: 4 x 100 Gb/s EFA for 8 A100 "
            "(aws.amazon.com/ec2/instance-types/p4/)"),
    Network("efa-3200g", 3200.0, "p5/p5e.48xlarge: 32 x 100 Gb/s EFA for 8 H100/H200 "
            "(aws.amazon.com/ec2/instance-types/p5/); the DGX H100's 8 x 400 Gb/s NDR is the same rate"),
)}
INTER_CLASSES = tuple(NETWORKS)
MAX_GPUS_PER_SERVER = 8    # an HGX / DGX baseboard holds 8 SXM GPUs
MAX_SERVERS = 64
SHAPE_FIELDS = ("gpu", "gpus_per_server", "num_servers", "intra_class", "inter_class")
_ALLOWED = {"gpu": CLUSTER_GPUS, "intra_class": INTRA_CLASSES, "inter_class": INTER_CLASSES}


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class ClusterShape:
    """One GPU cluster to rent or build: ``num_servers`` servers of ``gpus_per_server`` GPUs of preset
    ``gpu``, linked by ``intra_class`` inside a server and ``inter_class`` between servers (module doc)."""

    gpu: str                 # GPU preset of hardware/gpus.py, one of CLUSTER_GPUS
    gpus_per_server: int     # GPUs in one server, 1 .. 8
    num_servers: int         # servers, 1 .. 64
    intra_class: str         # "pcie" | "nvlink": the link between GPUs of one server
    inter_class: str         # one of INTER_CLASSES: the server's network (NETWORKS)

    def __post_init__(self) -> None:
        for f, allowed in _ALLOWED.items():
            v = getattr(self, f)
            if v not in allowed:
                raise ValueError(f"gpu-cluster field {f!r} is {v!r}; allowed: {list(allowed)}")
        if not (_is_int(self.gpus_per_server) and 1 <= self.gpus_per_server <= MAX_GPUS_PER_SERVER):
            raise ValueError(f"gpu-cluster field 'gpus_per_server' is {self.gpus_per_server!r}; allowed: "
                             f"integers 1..{MAX_GPUS_PER_SERVER}")
        if not (_is_int(self.num_servers) and 1 <= self.num_servers <= MAX_SERVERS):
            raise ValueError(f"gpu-cluster field 'num_servers' is {self.num_servers!r}; allowed: integers "
                             f"1..{MAX_SERVERS}")
        object.__setattr__(self, "gpus_per_server", int(self.gpus_per_server))
        object.__setattr__(self, "num_servers", int(self.num_servers))

    @property
    def spec(self) -> GPUSpec:
        return gpu_spec(self.gpu)

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_server * self.num_servers

    @property
    def intra_server_bytes_per_s(self) -> float:
        """Per direction, between two GPUs of one server."""
        s = self.spec
        return float(s.nvlink_bytes_per_s if self.intra_class == "nvlink" else s.pcie_bytes_per_s)

    @property
    def network_gbps_per_server(self) -> float:
        """The server's network, all NICs, Gb/s per direction (:data:`NETWORKS`)."""
        return NETWORKS[self.inter_class].gbps_per_server

    @property
    def inter_server_bytes_per_s(self) -> float:
        """Per direction, what one GPU's transfer to another server gets: its share of the server's
        network (``Gb/s / 8 / gpus_per_server``), at most its PCIe x16 (the NIC is reached over it)."""
        share = self.network_gbps_per_server * 1e9 / 8 / self.gpus_per_server
        return float(min(share, self.spec.pcie_bytes_per_s))

    @property
    def name(self) -> str:
        return f"{self.gpu}-{self.num_servers}x{self.gpus_per_server}-{self.intra_class}-{self.inter_class}"

    def to_dict(self) -> dict[str, Any]:
        """The five fields plus the derived numbers, with units, for a result row."""
        return {**asdict(self), "num_gpus": self.num_gpus,
                "intra_server_bytes_per_s": self.intra_server_bytes_per_s,
                "network_gbps_per_server": self.network_gbps_per_server,
                "inter_server_bytes_per_s": self.inter_server_bytes_per_s,
                "hbm_gib_per_gpu": self.spec.memory_bytes / 2**30}


def shape_from_config(config: dict) -> ClusterShape:
    """One sampled point of the space (a Tune config, a grid row) as a shape. Reads the five
    ``SHAPE_FIELDS``; other keys (the trial's own settings) are left alone. A missing or bad field gets a
    one-line error naming it and what is allowed."""
    if not isinstance(config, dict):
        raise ValueError(f"gpu-cluster config must be a dict with fields {list(SHAPE_FIELDS)}, "
                         f"got {type(config).__name__}")
    missing = [f for f in SHAPE_FIELDS if f not in config]
    if missing:
        raise ValueError(f"gpu-cluster config is missing field(s) {missing}; needs {list(SHAPE_FIELDS)}")
    return ClusterShape(*(config[f] for f in SHAPE_FIELDS))


def cluster_of_shape(shape: ClusterShape, dtype: str = "fp16") -> Cluster:
    """The cluster the pipeline DP takes: ``servers`` topology, the GPU's roofline at ``dtype`` (the
    training dtype of the GEMMs; fp16 as Auto-MAP), its HBM as the memory limit, and between servers one
    GPU's share of the server's network (``inter_server_bytes_per_s``: the cost model's
    ``inter_server_bw`` is the rate of one transfer, and every GPU of a server sends at once)."""
    if not isinstance(shape, ClusterShape):
        raise ValueError(f"shape must be a ClusterShape, got {type(shape).__name__}")
    return Cluster(shape.name, shape.num_gpus, GPU.from_spec(shape.spec, dtype),
                   shape.intra_server_bytes_per_s, "servers", shape.gpus_per_server,
                   shape.inter_server_bytes_per_s)


# --------------------------------------------------------------------------------------------- the space
def load_space(path: str | dict | None = None) -> dict:
    """The co-design space: the packaged ``tune_configs/gpu_cluster_space.yaml`` (``None``), a YAML file, or
    the already-read content as a dict (what a search ships to its trials and keeps for a resume).
    Returns ``{"cluster": {field: [values]}, "training": {...}}`` with every value checked (one-line
    errors naming the field)."""
    from .space import read_space_spec

    cfg, where = read_space_spec(path, DEFAULT_SPACE, "gpu-cluster space", "gpu-cluster space file")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("cluster"), dict):
        raise ValueError(f"{where}: field 'cluster' is missing (a mapping of {list(SHAPE_FIELDS)} to lists)")
    cl = cfg["cluster"]
    unknown = sorted(set(cl) - set(SHAPE_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) cluster.{unknown}; allowed: {list(SHAPE_FIELDS)}")
    for f in SHAPE_FIELDS:
        vals = cl.get(f)
        if not isinstance(vals, list) or not vals:
            raise ValueError(f"{where}: field 'cluster.{f}' must be a non-empty list")
        if len(set(vals)) != len(vals):
            raise ValueError(f"{where}: field 'cluster.{f}' lists a value twice: {vals}")
        probe = {"gpu": CLUSTER_GPUS[0], "gpus_per_server": 1, "num_servers": 1, "intra_class": "nvlink",
                 "inter_class": INTER_CLASSES[0]}
        for v in vals:
            try:
                shape_from_config({**probe, f: v})
            except ValueError as e:
                raise ValueError(f"{where}: cluster.{f}: {e}") from None
    training = cfg.get("training", {}) or {}
    if not isinstance(training, dict):
        raise ValueError(f"{where}: field 'training' must be a mapping")
    allowed_training = {"dtype", "op_model", "stages", "attention", "planner"}
    unknown = sorted(set(training) - allowed_training)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) training.{unknown}; allowed: {sorted(allowed_training)}")
    return {"cluster": {f: list(cl[f]) for f in SHAPE_FIELDS}, "training": dict(training)}


def grid_points(space: dict) -> list[dict]:
    """Every point of the space as a config dict, in a fixed order (the product of the lists)."""
    cl = space["cluster"]
    return [dict(zip(SHAPE_FIELDS, combo)) for combo in itertools.product(*(cl[f] for f in SHAPE_FIELDS))]


def sample_points(space: dict, n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct points drawn uniformly without replacement (seeded); all of them, shuffled, when
    ``n`` is at least the grid size."""
    if not (_is_int(n) and n >= 1):
        raise ValueError(f"n must be a positive integer, got {n!r}")
    pts = grid_points(space)
    order = np.random.default_rng(seed).permutation(len(pts))[: min(n, len(pts))]
    return [pts[i] for i in order]


def _check_presets() -> None:
    # the space's GPUs must stay presets of hardware/gpus.py (a rename there would break every YAML)
    missing = [g for g in CLUSTER_GPUS if g not in GPUS]
    if missing:
        raise ImportError(f"gpu_cluster_space: GPU presets {missing} are not in hardware/gpus.py")


_check_presets()
