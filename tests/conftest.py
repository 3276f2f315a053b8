"""Shared test configuration. ``SHARED`` is the project's shared/ folder, which sits beside the
repository (CI clones main with shared/ next to it); ARCHPLACE_SHARED overrides it."""

import os
import sys
from pathlib import Path

SHARED = Path(os.environ.get("ARCHPLACE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
DNN_DATA = SHARED / "workloads" / "dnn-partitioning"
if not DNN_DATA.is_dir():
    raise RuntimeError(f"shared workloads not found at {DNN_DATA}; set ARCHPLACE_SHARED")

sys.path.insert(0, str(Path(__file__).parent))  # tests import helpers from each other
