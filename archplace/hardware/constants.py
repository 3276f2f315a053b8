"""Every hardware constant archplace uses, in one place, each with its unit and its source.

Areas are for a 22 nm-class node (Phaze evaluates area with Accelergy at 22 nm, spec §2.2).
Logic areas come from the Aladdin component tables at 40 nm that Accelergy's Aladdin plug-in
ships (Shao et al., ISCA 2014; 32-bit multiplier 6,351 µm², 32-bit adder 278 µm², register
5.98 µm² per bit), scaled to 22 nm by (22/40)² = 0.3025 (ideal area scaling).
"""

from __future__ import annotations

NODE_SCALE_40_TO_22 = (22 / 40) ** 2  # 0.3025, ideal area scaling between the nodes

# --- logic (µm² at 22 nm)
# A 16-bit multiplier (multiplier area grows with the square of its width: 6,351·(16/32)²) plus a
# 32-bit accumulating adder (278) plus 32 bits of pipeline registers (32·5.98), at 40 nm, scaled.
MAC_AREA_UM2 = (6351 * (16 / 32) ** 2 + 278 + 32 * 5.98) * NODE_SCALE_40_TO_22  # ≈ 622 µm²
# A vector lane: a 16-bit multiply-add datapath (the template's 2-byte elements; exp/tanh/GELU are
# polynomial multiply-adds) — a 16-bit multiplier (6,351·(16/32)²), a 16-bit adder (278/2) and 32
# bits of registers, at 40 nm, scaled.
VECTOR_LANE_AREA_UM2 = (6351 * (16 / 32) ** 2 + 278 / 2 + 32 * 5.98) * NODE_SCALE_40_TO_22  # ≈ 580 µm²
# Per-core control: sequencer, instruction buffer, address generators and the on-chip network port.
# Assumption (no public per-block figure): 0.01 mm², about 8 kB of SRAM. It makes thousands of tiny
# cores pay for their control, and keeps Phaze's reported winners (e.g. {1, 1024, 256, 256, 256}
# with 8 MB, spec §6.2) inside the TPUv4 area as the paper found them.
CORE_CONTROL_AREA_UM2 = 10_000.0

# --- SRAM (µm² per byte at 22 nm)
# Intel 22 nm high-density 6T bitcell: 0.092 µm² (Karl et al., ISSCC 2012, "A 4.6 GHz 162 Mb SRAM
# design in 22 nm tri-gate CMOS"); macros reach ~60 % array efficiency, so 0.153 µm² per bit.
SRAM_UM2_PER_BIT = 0.092 / 0.60
SRAM_UM2_PER_BYTE = 8 * SRAM_UM2_PER_BIT  # ≈ 1.23 µm²/B, ≈ 1.29 mm²/MiB

# --- clocks and bandwidths
# TPUv4 runs at 1,050 MHz (Jouppi et al., ISCA 2023, Table 1); the Phaze code uses 1.05 GHz too.
DEFAULT_CLOCK_HZ = 1.05e9
# TPUv4's HBM2: 1,200 GB/s per chip (Jouppi et al., ISCA 2023, Table 1).
DEFAULT_HBM_BW_BYTES_PER_S = 1.2e12
# The GLB feeds at most 4,096 words per cycle (Phaze §3.1: "maximum value of 4096 words per cycle").
GLB_BW_MAX_WORDS_PER_CYCLE = 4096
# Single-core GLB port: 16·max(pe_x, pe_y) words/cycle (Phaze estimator, spec §11.2, num = 1).
GLB_PORT_WORDS_PER_PE_EDGE = 16

# --- pipeline depths (cycles)
# Vector lanes: a multiply-add pipeline of a few stages (assumption: 8 cycles to fill).
VECTOR_PIPELINE_CYCLES = 8
# Fixed start-up per operator: issuing, DMA descriptor set-up (assumption: 100 cycles ≈ 0.1 µs).
OP_LAUNCH_CYCLES = 100

# --- interconnect
# Phaze's accelerator-to-accelerator bandwidth: 4·1024³ B/s ("32 Gbs or 4 GBs, PCIE 3.0",
# msr-fiddle/phaze Estimator/architecture.py; spec §11.1).
PHAZE_LINK_BW_BYTES_PER_S = 4 * 1024**3
