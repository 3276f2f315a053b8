"""Multi-GPU machines for operator placement (GDP, issue 18): one host with ``num_devices`` GPUs.

GDP measured its placements on "one Intel Broadwell CPU and up to eight Nvidia P100 GPUs" (spec §6); the
paper gives neither the interconnect nor the memory size (spec §6 GAP). Two presets cover the two
machines of that era:

* ``p100-pcie``: Tesla P100 PCIe 16 GB (9.3 TFLOP/s fp32, 732 GB/s HBM2; NVIDIA P100 datasheet, 2016)
  behind a PCIe 3.0 x16 switch. Each GPU has one send and one receive port of 12 GB/s (the usable part
  of 15.75 GB/s per direction) and 10 us per transfer; two transfers out of one GPU, or into one GPU, share
  its port (contention).
* ``v100-nvlink``: Tesla V100 SXM2 16 GB (15.7 TFLOP/s fp32, 900 GB/s; NVIDIA V100 datasheet, 2018)
  with one NVLink 2 brick of 25 GB/s per direction between every pair (the DGX-1 hybrid cube mesh gives
  one or two bricks per pair; one is the conservative reading), 5 us per transfer; two transfers over the
  same directed pair share it.

fp32 throughout: the paper's TensorFlow graphs of 2019 trained in fp32, and the P100 has no tensor cores.
The kernel launch overhead (5 us) is what makes placing many tiny ops apart cost something even when
links are free. The simulator is ``simulators/gpu_placement.py``.

Every GPU preset of ``hardware/gpus.py`` (``a100-40gb``, ``h100-sxm``, ``h200``, ...) is a machine too:
N GPUs of that kind in an NVSwitch server (the DGX layout), a link per directed pair at the GPU's full
NVLink rate per direction (the switch lets any one pair use all of it; the simulator's per-pair links
do not make a GPU's concurrent transfers to several peers share its NVLink, so fan-out is optimistic),
5 us per transfer, the GPU's full memory, fp32 unless a dtype is given. The two GDP-era machines
keep their own link numbers; their GPUs come from the same presets (``gpu`` names it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .gpus import GPUS, V100_SXM2, GPUSpec, gpu_spec, is_gpu_file
from .gpus import P100_PCIE as P100_PCIE_SPEC

INTERCONNECTS = ("pcie", "nvlink")


@dataclass(frozen=True)
class GPUMachine:
    """One host with ``num_devices`` identical GPUs and the links between them."""

    name: str
    num_devices: int
    peak_flops_per_s: float  # fp32 FLOP/s of one GPU
    hbm_bytes_per_s: float  # device-memory bandwidth of one GPU
    memory_bytes: int  # device memory of one GPU
    link_bytes_per_s: float  # one port (pcie) or one directed pair link (nvlink)
    link_latency_s: float  # fixed cost of one transfer
    interconnect: str  # "pcie": per-GPU send/receive ports; "nvlink": a link per directed pair
    kernel_launch_s: float = 5e-6  # fixed cost of one op
    gpu: str = ""  # the GPU preset (hardware/gpus.py) the numbers come from
    dtype: str = "fp32"  # the dtype ``peak_flops_per_s`` is taken at

    def __post_init__(self) -> None:
        if self.interconnect not in INTERCONNECTS:
            raise ValueError(f"interconnect is {self.interconnect!r}; allowed: {list(INTERCONNECTS)}")
        if not (isinstance(self.num_devices, int) and 1 <= self.num_devices <= 64):
            raise ValueError(f"num_devices is {self.num_devices!r}, must be an integer in 1..64")
        for f in ("peak_flops_per_s", "hbm_bytes_per_s", "memory_bytes", "link_bytes_per_s"):
            if not getattr(self, f) > 0:
                raise ValueError(f"{f} is {getattr(self, f)!r}, must be > 0")
        for f in ("link_latency_s", "kernel_launch_s"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"{f} is {getattr(self, f)!r}, must be >= 0")

    def with_devices(self, num_devices: int) -> GPUMachine:
        return replace(self, num_devices=num_devices)

    @property
    def spec(self) -> GPUSpec:
        return gpu_spec(self.gpu)

    @classmethod
    def from_spec(cls, spec: GPUSpec, num_devices: int = 8, dtype: str = "fp32", ref: str | None = None
                  ) -> GPUMachine:
        """N GPUs of ``spec`` on NVLink (on PCIe ports if it has none). ``ref`` is how ``gpu_spec`` finds
        the GPU again (a preset's name, or the path of a GPU's .json file); the spec's name by default."""
        gpu = ref or spec.name
        if not spec.nvlink_bytes_per_s > 0:
            return cls(spec.name, num_devices, spec.peak(dtype), spec.hbm_bytes_per_s, spec.memory_bytes,
                       spec.pcie_bytes_per_s, 10e-6, "pcie", spec.launch_s, gpu, dtype)
        return cls(spec.name, num_devices, spec.peak(dtype), spec.hbm_bytes_per_s, spec.memory_bytes,
                   spec.nvlink_bytes_per_s, 5e-6, "nvlink", spec.launch_s, gpu, dtype)


GIB = 1024**3
P100_PCIE = GPUMachine("p100-pcie", 8, P100_PCIE_SPEC.peak("fp32"), P100_PCIE_SPEC.hbm_bytes_per_s,
                       P100_PCIE_SPEC.memory_bytes, 12e9, 10e-6, "pcie", gpu="p100-pcie")
# the V100 SXM2 16 GB of the DGX-1 (the preset's numbers but 16 GiB of memory)
V100_NVLINK = GPUMachine("v100-nvlink", 8, V100_SXM2.peak("fp32"), V100_SXM2.hbm_bytes_per_s, 16 * GIB, 25e9,
                         5e-6, "nvlink", gpu="v100-sxm2")
GPU_MACHINES = {m.name: m for m in (P100_PCIE, V100_NVLINK)}
MACHINE_NAMES = sorted(set(GPU_MACHINES) | set(GPUS))


def gpu_machine(name: str, num_devices: int | None = None, dtype: str | None = None) -> GPUMachine:
    """Preset ``name`` (``p100-pcie`` | ``v100-nvlink`` | a GPU preset of hardware/gpus.py), optionally
    with ``num_devices`` GPUs (8 by default) and the peak of ``dtype`` (fp32 by default)."""
    if name not in MACHINE_NAMES and not is_gpu_file(name):
        raise ValueError(f"machine is {name!r}; allowed: {MACHINE_NAMES} or a GPU's .json file")
    if name in GPU_MACHINES:
        m = GPU_MACHINES[name]
        if dtype is not None and dtype != m.dtype:
            m = replace(m, peak_flops_per_s=m.spec.peak(dtype), dtype=dtype)
    else:
        m = GPUMachine.from_spec(gpu_spec(name), 8, dtype or "fp32", ref=name)
    return m if num_devices is None else m.with_devices(num_devices)
