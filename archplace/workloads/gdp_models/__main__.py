"""``python -m archplace.workloads.gdp_models``: every preset's node count, parameters and capture time."""

import time

from .capture import gdp_graph, num_parameters
from .presets import GDP_PRESETS

for preset_name in GDP_PRESETS:
    t0 = time.perf_counter()
    graph = gdp_graph(preset_name)
    dt = time.perf_counter() - t0
    print(f"{preset_name:14s} {graph.num_nodes:7d} nodes {graph.num_edges:7d} edges "
          f"{num_parameters(preset_name):13,d} params  {dt:6.1f} s  "
          f"unmapped {graph.meta['unmapped_ops']}")
