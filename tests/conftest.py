"""Shared test configuration. ``SHARED`` is the project's shared/ folder, which sits beside the
repository (CI clones main with shared/ next to it); ARCHPLACE_SHARED overrides it."""

import os
import sys
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("ARCHPLACE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
DNN_DATA = SHARED / "workloads" / "dnn-partitioning"
if not DNN_DATA.is_dir():
    raise RuntimeError(f"shared workloads not found at {DNN_DATA}; set ARCHPLACE_SHARED")

sys.path.insert(0, str(Path(__file__).parent))  # tests import helpers from each other


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole test session (2 CPUs, like the machine)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="archplace-tests")
    yield ray
    ray.shutdown()
