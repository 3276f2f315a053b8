"""NVIDIA data-centre GPUs as the cost models see them: dense peaks per dtype, HBM, memory, links.

Every number is a datasheet figure (per GPU, dense, i.e. without 2:4 sparsity; NVIDIA's tables list the
sparse rate with an asterisk and the dense rate is half of it). Link rates are *per direction*: NVIDIA
quotes NVLink and PCIe as the sum of both directions, which we halve.

- ``v100-sxm2``: NVIDIA Tesla V100 datasheet (2018), SXM2 32 GB: 125 TFLOP/s fp16 tensor, 15.7 TFLOP/s
  fp32, 900 GB/s HBM2; NVLink 2 300 GB/s (6 links x 25 GB/s per direction = 150 GB/s per direction,
  V100 architecture whitepaper 2017); PCIe Gen3 x16 32 GB/s. InfiniBand: a DGX-1 has four 100 Gb/s EDR
  ports for eight GPUs (DGX-1 datasheet), 6.25 GB/s per GPU. No bf16 and no TF32 on Volta: ``bf16`` is
  counted at the fp16 tensor rate (the model would run in fp16) and ``tf32`` at the fp32 rate.
- ``p100-pcie``: NVIDIA Tesla P100 PCIe datasheet (2016), 16 GB: 9.3 TFLOP/s fp32, 18.7 TFLOP/s fp16,
  732 GB/s HBM2, PCIe Gen3 x16 32 GB/s, no NVLink. No tensor cores: ``bf16``/``fp16`` are its fp16
  rate, ``tf32`` its fp32 rate. InfiniBand as one 100 Gb/s EDR NIC per GPU (12.5 GB/s), an assumption
  (PCIe servers of 2016 had no fixed NIC count).
- ``a100-40gb`` / ``a100-80gb``: NVIDIA A100 Tensor Core GPU datasheet (2021), SXM: 312 TFLOP/s bf16/fp16
  tensor, 156 TFLOP/s TF32 tensor, 19.5 TFLOP/s fp32; HBM2 1,555 GB/s (40 GB) / HBM2e 2,039 GB/s (80 GB);
  NVLink 3 600 GB/s; PCIe Gen4 64 GB/s. InfiniBand: DGX A100 datasheet, eight 200 Gb/s HDR ConnectX-6
  (one per GPU, 25 GB/s).
- ``h100-sxm``: NVIDIA H100 Tensor Core GPU datasheet (2023), SXM 80 GB: 1,979 / 989 TFLOP/s sparse bf16
  / TF32 tensor (dense 989.5 / 494.5), 67 TFLOP/s fp32, HBM3 3.35 TB/s; NVLink 4 900 GB/s; PCIe Gen5
  128 GB/s. InfiniBand: DGX H100 datasheet, eight 400 Gb/s NDR ConnectX-7 (one per GPU, 50 GB/s).
- ``h200``: NVIDIA H200 Tensor Core GPU datasheet (2024), SXM 141 GB: the H100's compute (989.5 dense
  bf16, 494.5 dense TF32, 67 fp32), HBM3e 4.8 TB/s, NVLink 4 900 GB/s, PCIe Gen5 128 GB/s; InfiniBand as
  the DGX H200 (eight 400 Gb/s NDR, 50 GB/s per GPU).

Memory is in GiB: HBM stacks come in binary sizes (a V100 32 GB reports 32,768 MiB in nvidia-smi); the
H200's 141 GB is taken as 141 GiB (nvidia-smi reports 143,771 MiB, 140.4 GiB).

``launch_s`` is the 5 us kernel launch the place-ops roofline has always charged (GDP, issue 18); the
calibrated op model measures its own floor instead (``simulators/gpu_ops.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

DTYPES = ("bf16", "fp16", "tf32", "fp32")
GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: dense peak FLOP/s per dtype (tensor cores for bf16/fp16/tf32, CUDA cores for fp32), the
    fp32 CUDA-core rate for non-GEMM arithmetic, HBM bandwidth and size, and per-direction link rates."""

    name: str
    label: str
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    vector_flops_per_s: float
    hbm_bytes_per_s: float
    memory_bytes: int
    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float
    ib_bytes_per_s: float
    launch_s: float
    source: str
    sram_bytes_per_sm: int | None = None   # shared memory a fused attention kernel tiles for (a GPU file's)

    def __post_init__(self) -> None:
        if set(self.peak_flops_per_s) != set(DTYPES):
            raise ValueError(f"gpu {self.name!r} field 'peak_flops_per_s' needs the dtypes {list(DTYPES)}")
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(dict(self.peak_flops_per_s)))
        for f in ("vector_flops_per_s", "hbm_bytes_per_s", "memory_bytes", "pcie_bytes_per_s",
                  "ib_bytes_per_s"):
            if not getattr(self, f) > 0:
                raise ValueError(f"gpu {self.name!r} field {f!r} is {getattr(self, f)!r}, must be > 0")
        if not (self.nvlink_bytes_per_s >= 0 and self.launch_s >= 0):
            raise ValueError(f"gpu {self.name!r} fields 'nvlink_bytes_per_s' and 'launch_s' must be >= 0")

    def __reduce__(self):
        # a mappingproxy neither pickles nor deep-copies; RLlib deep-copies its env config (which holds the
        # pipeline cluster, its GPU and this spec), and Ray pickles it: rebuild from a plain dict
        return (type(self), tuple(dict(v) if isinstance(v, MappingProxyType) else v
                                  for v in (getattr(self, f.name) for f in fields(self))))

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s of a GEMM in ``dtype``."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype is {dtype!r}; allowed: {list(DTYPES)}")
        return self.peak_flops_per_s[dtype]


def _peaks(half: float, tf32: float, fp32: float) -> dict[str, float]:
    return {"bf16": half, "fp16": half, "tf32": tf32, "fp32": fp32}


V100_SXM2 = GPUSpec("v100-sxm2", "NVIDIA Tesla V100 SXM2 32 GB", _peaks(125e12, 15.7e12, 15.7e12), 15.7e12,
                    900e9, 32 * GIB, 150e9, 16e9, 100e9 / 8 / 2, 5e-6,
                    "NVIDIA Tesla V100 datasheet (2018); V100 architecture whitepaper (2017); "
                    "DGX-1 datasheet")
P100_PCIE = GPUSpec("p100-pcie", "NVIDIA Tesla P100 PCIe 16 GB", _peaks(18.7e12, 9.3e12, 9.3e12), 9.3e12,
                    732e9, 16 * GIB, 0.0, 16e9, 100e9 / 8, 5e-6, "NVIDIA Tesla P100 PCIe datasheet (2016)")
_A100_PEAKS = _peaks(312e12, 156e12, 19.5e12)
A100_40GB = GPUSpec("a100-40gb", "NVIDIA A100 SXM 40 GB", _A100_PEAKS, 19.5e12, 1555e9, 40 * GIB, 300e9, 32e9,
                    200e9 / 8, 5e-6, "NVIDIA A100 Tensor Core GPU datasheet (2021); DGX A100 datasheet")
A100_80GB = GPUSpec("a100-80gb", "NVIDIA A100 SXM 80 GB", _A100_PEAKS, 19.5e12, 2039e9, 80 * GIB, 300e9, 32e9,
                    200e9 / 8, 5e-6, "NVIDIA A100 Tensor Core GPU datasheet (2021); DGX A100 datasheet")
_HOPPER_PEAKS = _peaks(989.5e12, 494.5e12, 67e12)
H100_SXM = GPUSpec("h100-sxm", "NVIDIA H100 SXM 80 GB", _HOPPER_PEAKS, 67e12, 3.35e12, 80 * GIB, 450e9, 64e9,
                   400e9 / 8, 5e-6, "NVIDIA H100 Tensor Core GPU datasheet (2023); DGX H100 datasheet")
H200 = GPUSpec("h200", "NVIDIA H200 SXM 141 GB", _HOPPER_PEAKS, 67e12, 4.8e12, 141 * GIB, 450e9, 64e9,
               400e9 / 8, 5e-6, "NVIDIA H200 Tensor Core GPU datasheet (2024); DGX H200 datasheet")

GPUS: dict[str, GPUSpec] = {g.name: g for g in (V100_SXM2, P100_PCIE, A100_40GB, A100_80GB, H100_SXM, H200)}


GPU_FILE_FIELDS = ("name", "label", "peak_flops_per_s", "vector_flops_per_s", "hbm_bytes_per_s",
                   "memory_bytes", "nvlink_bytes_per_s", "pcie_bytes_per_s", "ib_bytes_per_s", "launch_s",
                   "source", "sram_bytes_per_sm")
_GPU_FILE_DEFAULTS = {"nvlink_bytes_per_s": 0.0, "launch_s": 5e-6}


def is_gpu_file(name: object) -> bool:
    """A ``.json`` path: a GPU of the user's own, described by ``GPUSpec``'s fields."""
    return isinstance(name, str) and name.endswith(".json")


def load_gpu_file(path: str) -> GPUSpec:
    """A GPU from a JSON object of ``GPUSpec``'s fields (units in the names: FLOP/s, bytes/s, bytes, s).
    ``label`` defaults to ``name``, ``source`` to the file, ``nvlink_bytes_per_s`` to 0 (no NVLink) and
    ``launch_s`` to 5 us; ``memory_gib`` may stand for ``memory_bytes``; ``sram_bytes_per_sm`` is the
    shared memory a fused attention kernel tiles for (227 KiB on Hopper). The name must not be a preset's,
    so a result never shows a preset's name for other numbers. Read again on every call (cheap), so Ray
    workers and processes that did not parse the command line resolve the same path the same way."""
    import json
    from pathlib import Path

    f = Path(path)
    if not f.is_file():
        raise ValueError(f"gpu file {path!r} does not exist (a GPU is a preset, {sorted(GPUS)}, "
                         "or a .json file of its fields)")
    try:
        raw = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"gpu file {path!r} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"gpu file {path!r} must hold a JSON object of the fields {list(GPU_FILE_FIELDS)}")
    raw = dict(raw)
    if "memory_gib" in raw and "memory_bytes" not in raw:
        raw["memory_bytes"] = int(float(raw.pop("memory_gib")) * GIB)
    unknown = sorted(set(raw) - set(GPU_FILE_FIELDS))
    if unknown:
        raise ValueError(f"gpu file {path!r} field {unknown[0]!r} is unknown; allowed: "
                         f"{list(GPU_FILE_FIELDS)} (or memory_gib)")
    raw = {**_GPU_FILE_DEFAULTS, "source": f"user file {f.name}", **raw}
    name = raw.get("name")
    if not (isinstance(name, str) and name):
        raise ValueError(f"gpu file {path!r} field 'name' must be a non-empty string")
    if name in GPUS:
        raise ValueError(f"gpu file {path!r} field 'name' is {name!r}, a preset's name; give the GPU its "
                         "own")
    raw.setdefault("label", name)
    missing = [k for k in GPU_FILE_FIELDS if k not in raw]
    if missing:
        raise ValueError(f"gpu file {path!r} lacks the field {missing[0]!r} (needs {list(GPU_FILE_FIELDS)})")
    for k in GPU_FILE_FIELDS:
        if k not in ("name", "label", "source", "peak_flops_per_s") and not isinstance(raw[k], (int, float)) \
                and not (k == "sram_bytes_per_sm" and raw[k] is None):
            raise ValueError(f"gpu file {path!r} field {k!r} must be a number, got {raw[k]!r}")
    if not (isinstance(raw["peak_flops_per_s"], dict)
            and all(isinstance(v, (int, float)) and v > 0 for v in raw["peak_flops_per_s"].values())):
        raise ValueError(f"gpu file {path!r} field 'peak_flops_per_s' must map each of {list(DTYPES)} to a "
                         "positive FLOP/s")
    raw["memory_bytes"] = int(raw["memory_bytes"])
    if raw["sram_bytes_per_sm"] is not None:
        raw["sram_bytes_per_sm"] = int(raw["sram_bytes_per_sm"])
    return GPUSpec(**{k: raw[k] for k in GPU_FILE_FIELDS})


def gpu_spec(name: str) -> GPUSpec:
    """The preset ``name``, or the GPU of a ``.json`` file (``load_gpu_file``); a one-line error
    listing the presets otherwise."""
    if is_gpu_file(name):
        return load_gpu_file(name)
    try:
        return GPUS[name]
    except (KeyError, TypeError):
        raise ValueError(f"gpu is {name!r}; allowed: {sorted(GPUS)} or a .json file of a GPU's "
                         "fields") from None
