"""Hardware presets: accelerators and the clusters they run in. Each documents its numbers.

- ``tpuv4``: the Phaze area reference, {8, 2, 128, 128, 128} with a 128 MB GLB (spec phaze.md §2.2);
  32 GB HBM2 at 1.2 TB/s and 1.05 GHz as the real TPUv4 (Jouppi et al., ISCA 2023, Table 1).
- ``v100-server`` A/B/C: 2, 3, 4 servers of 8 V100 on NVLink, 25 Gbps between servers (Auto-MAP
  Table 2, spec automap.md §11).
- ``gpu_servers(gpu, n)``: n servers of 8 of any GPU preset of ``hardware/gpus.py`` on its NVLink, its
  InfiniBand NIC between servers (``pipeline --gpu``).
- ``mcm-36``: 36 chiplets on a uni-directional ring, "tens of MBs SRAM" per chip and links of "tens of
  GB/s" (MCM paper §2, spec mcm.md; no exact numbers are published, ours are below).
- ``flat``: K identical accelerators on one flat network (Phaze: K = 1024 at 4 GiB/s).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .accelerator import Accelerator
from .constants import PHAZE_LINK_BW_BYTES_PER_S
from .gpus import GPUS, V100_SXM2, GPUSpec, gpu_spec


@dataclass(frozen=True)
class GPU:
    """A GPU described by its roofline (used for the Auto-MAP clusters), built from a
    :class:`~archplace.hardware.gpus.GPUSpec` at one training dtype (``spec`` keeps the rest)."""

    name: str
    peak_tensor_flops: float  # dense tensor-core FLOP/s at ``dtype``
    peak_vector_flops: float  # fp32 CUDA-core FLOP/s
    hbm_bw: float  # bytes/s
    hbm_gb: float  # GiB
    spec: GPUSpec | None = field(default=None, compare=False)
    dtype: str = "fp16"

    @classmethod
    def from_spec(cls, spec: GPUSpec, dtype: str = "fp16", name: str | None = None) -> GPU:
        return cls(name or spec.name, spec.peak(dtype), spec.vector_flops_per_s, spec.hbm_bytes_per_s,
                   spec.memory_bytes / 2**30, spec, dtype)


# NVIDIA Tesla V100 SXM2 32 GB: 125 TFLOP/s fp16 tensor, 15.7 TFLOP/s fp32, 900 GB/s HBM2
# (NVIDIA V100 datasheet, 2018; the preset ``v100-sxm2`` of hardware/gpus.py).
V100 = GPU.from_spec(V100_SXM2, "fp16", name="V100-SXM2-32GB")
# NVLink 2 on V100 SXM2: six links of 25 GB/s per direction = 150 GB/s per direction per GPU
# (NVIDIA V100 architecture whitepaper, 2017).
NVLINK2_BW_BYTES_PER_S = V100_SXM2.nvlink_bytes_per_s  # 150e9
# Auto-MAP's inter-server network: 25 Gbps = 3.125 GB/s.
INTER_SERVER_25GBPS_BYTES_PER_S = 25e9 / 8


@dataclass(frozen=True)
class Cluster:
    """Devices and the network between them.

    ``topology``: ``flat`` (every pair at ``link_bw``), ``servers`` (``devices_per_server`` on
    ``link_bw`` inside a server, ``inter_server_bw`` between servers), ``uni-ring`` (device i sends
    only to i+1 at ``link_bw``).
    """

    name: str
    num_devices: int
    device: Accelerator | GPU
    link_bw: float  # bytes/s
    topology: str = "flat"
    devices_per_server: int = 0
    inter_server_bw: float = 0.0

    def __post_init__(self) -> None:
        if self.topology not in ("flat", "servers", "uni-ring"):
            raise ValueError(f"cluster field 'topology' is {self.topology!r}; "
                             "allowed: ['flat', 'servers', 'uni-ring']")
        if self.num_devices < 1:
            raise ValueError(f"cluster field 'num_devices' must be >= 1, got {self.num_devices}")
        if not self.link_bw > 0:
            raise ValueError(f"cluster field 'link_bw' must be > 0, got {self.link_bw}")
        if self.topology == "servers" and (self.devices_per_server < 1 or not self.inter_server_bw > 0
                                           or self.num_devices % self.devices_per_server):
            raise ValueError("a 'servers' cluster needs devices_per_server >= 1 dividing num_devices "
                             "and inter_server_bw > 0")

    @property
    def num_servers(self) -> int:
        return self.num_devices // self.devices_per_server if self.devices_per_server else 1


TPUV4 = Accelerator(8, 2, 128, 128, 128, 128, hbm_gb=32.0, name="tpuv4")
# Phaze-Common (paper Section 6.1, spec §7.2): compute {2, 512, 256, 256, 256}, memory {32 MB GLB, 4096
# words/cycle, 1 MB L2 per tensor core, 4 KB L2 per vector core}, 64 GB HBM; the same peak tensor MACs as
# TPUv4 (2·256·256 = 8·128·128). The paper's ILP-vs-sequential ablation (Appendix D) runs on it.
PHAZE_COMMON = Accelerator(2, 512, 256, 256, 256, 32.0, glb_bw=4096, l2_tc_kb=1024.0, l2_vc_kb=4.0,
                           hbm_gb=64.0, name="phaze-common")

# An edge-TPU-class chiplet for the MCM package: one 64×64 int8 systolic array at 480 MHz (≈ 4 TOPS,
# the Coral Edge TPU's rating) with 32 MB of SRAM ("tens of MBs") and no off-chip memory; its
# "hbm_bw" is the SRAM bandwidth, 64 B/cycle.
MCM_CHIPLET = Accelerator(1, 1, 64, 64, 64, 32, hbm_gb=1.0, hbm_bw=64 * 480e6, clock_hz=480e6,
                          bytes_per_element=1, name="mcm-chiplet")
MCM_LINK_BW_BYTES_PER_S = 32e9  # "tens of GB/s"

_ACCELERATORS = {"tpuv4": TPUV4, "phaze-common": PHAZE_COMMON, "mcm-chiplet": MCM_CHIPLET}


def preset_accelerator(name: str) -> Accelerator:
    try:
        return _ACCELERATORS[name]
    except KeyError:
        raise ValueError(f"unknown accelerator preset {name!r}; known: {sorted(_ACCELERATORS)}") from None


def flat_cluster(num_devices: int = 1024, device: Accelerator = TPUV4,
                 link_bw: float = PHAZE_LINK_BW_BYTES_PER_S) -> Cluster:
    return Cluster(f"flat-{num_devices}", num_devices, device, link_bw)


def v100_cluster(config: str) -> Cluster:
    """Auto-MAP's V100 clusters A, B, C: 2, 3, 4 servers of 8 GPUs (NVLink inside, 25 Gbps between)."""
    servers = {"A": 2, "B": 3, "C": 4}
    if config not in servers:
        raise ValueError(f"v100-server config must be one of {sorted(servers)}, got {config!r}")
    return v100_servers(servers[config], name=f"v100-server-{config}")


def v100_servers(num_servers: int, name: str | None = None) -> Cluster:
    """``num_servers`` servers of 8 V100s like Auto-MAP's clusters (larger pipeline cases)."""
    if not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers must be a positive integer, got {num_servers!r}")
    return Cluster(name or f"v100-{num_servers}x8", 8 * num_servers, V100, NVLINK2_BW_BYTES_PER_S, "servers",
                   8, INTER_SERVER_25GBPS_BYTES_PER_S)


def gpu_servers(gpu: str, num_servers: int, dtype: str = "fp16") -> Cluster:
    """``num_servers`` servers of 8 ``gpu`` (a preset of hardware/gpus.py) on NVLink inside a server and
    the GPU's InfiniBand NIC (one per GPU) between servers, the DGX layout of that GPU's generation."""
    spec = gpu_spec(gpu)
    if not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers must be a positive integer, got {num_servers!r}")
    if not spec.nvlink_bytes_per_s > 0:
        raise ValueError(f"gpu {gpu!r} has no NVLink; a pipeline server needs one (allowed: "
                         f"{sorted(n for n, g in GPUS.items() if g.nvlink_bytes_per_s > 0)})")
    return Cluster(f"{gpu}-{num_servers}x8", 8 * num_servers, GPU.from_spec(spec, dtype),
                   spec.nvlink_bytes_per_s, "servers", 8, spec.ib_bytes_per_s)


def mcm_package(num_chips: int = 36) -> Cluster:
    return Cluster(f"mcm-{num_chips}", num_chips, MCM_CHIPLET, MCM_LINK_BW_BYTES_PER_S, "uni-ring")


def preset_cluster(name: str) -> Cluster:
    """``flat[-K]``, ``v100-server-A|B|C``, ``mcm-36``."""
    if name.startswith("v100-server-"):
        return v100_cluster(name.rsplit("-", 1)[1])
    if name == "mcm-36":
        return mcm_package(36)
    if name == "flat" or name.startswith("flat-"):
        k = name.split("-", 1)[1] if "-" in name else "1024"
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"flat cluster size must be a positive integer, got {k!r}")
        return flat_cluster(int(k))
    raise ValueError(f"unknown cluster preset {name!r}; known: flat[-K], v100-server-A|B|C, mcm-36")
