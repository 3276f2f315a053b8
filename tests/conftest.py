"""Shared test configuration. ``DNN_DATA`` is the bundled dnn-partitioning data (package data of
``archplace.workloads``): the suite needs nothing outside the repository."""

import os
import sys
from pathlib import Path

import pytest

from archplace.workloads.dnn_partitioning import DATA_DIR as DNN_DATA  # noqa: F401  (tests import it from here)

sys.path.insert(0, str(Path(__file__).parent))  # tests import helpers from each other

_CACHE_OWNER = "_ARCHPLACE_TEST_CACHE_OWNER"


def pytest_configure(config):
    """One graph cache (``archplace.workloads.capture_cache``) for the whole session, empty at its
    start: the first process to capture a model writes it, and the other xdist worker, the Ray workers
    and the CLI subprocesses of the tests read it (they inherit the environment). It is never the
    user's ``~/.cache``, so a run from a fresh clone measures what CI measures. The controller (or a
    run without xdist) makes it; xdist workers, started after this hook, inherit the variable."""
    if os.environ.get(_CACHE_OWNER) is None:
        import tempfile

        os.environ["ARCHPLACE_CACHE_DIR"] = tempfile.mkdtemp(prefix="archplace-test-cache-")
        os.environ[_CACHE_OWNER] = str(os.getpid())


def pytest_unconfigure(config):
    if os.environ.get(_CACHE_OWNER) == str(os.getpid()):
        import shutil

        shutil.rmtree(os.environ["ARCHPLACE_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole test session (2 CPUs, like the machine)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="archplace-tests")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def pg_server():
    """One real PostgreSQL server for the test session (``pg_util.PostgresServer``: initdb in a
    temporary directory, 127.0.0.1 only), started on first use. Tests that need it skip, saying why,
    when PostgreSQL is not installed. Durability is off (fsync): tests check behaviour, not crashes."""
    from pg_util import PostgresServer, find_bin

    if find_bin() is None:
        pytest.skip("PostgreSQL is not installed: no pg_ctl on PATH or in /usr/lib/postgresql/*/bin "
                    "(`apt-get install postgresql`; .ci/run does this)")
    server = PostgresServer(settings={"fsync": "off", "synchronous_commit": "off",
                                      "full_page_writes": "off"}).start()
    yield server
    server.stop()
