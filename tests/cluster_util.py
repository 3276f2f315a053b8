"""A real two-node Ray cluster on 127.0.0.1 for tests, started with the ``ray`` CLI.

``two_node_cluster`` runs ``ray start --head --block`` and ``ray start --address ... --block`` as
subprocesses, each in its own session (process group), so that the cluster is fully isolated from
any Ray instance the test process itself runs (``ray.init(num_cpus=2)`` in a session fixture):

* (Ray resolves ``--node-ip-address 127.0.0.1`` to the machine's own IP, so node IPs and the
  ``RAY_ADDRESS`` a job sees show that IP; everything still stays on this machine.)
* every port is explicit and freshly allocated (GCS, dashboard, client server, and per node the
  node manager, object manager, dashboard agent, runtime-env agent and metrics ports);
* ``--temp-dir`` is a private, short directory under /tmp (Unix socket paths must stay under 107
  bytes), so the cluster's ``ray_current_cluster`` file never makes a plain ``ray.init()`` in the
  test process attach to it, and its logs/sockets are its own;
* token authentication is on (``RAY_AUTH_MODE=token``) with a fresh random token passed as
  ``RAY_AUTH_TOKEN``, which takes precedence over ``~/.ray/auth_token``; ``info.env`` carries it for
  subprocesses and ``info.headers`` for the Jobs API / dashboard REST.

Stopping never uses ``ray stop``, which kills every Ray process on the machine (the test session's
included). Instead it SIGTERMs the two ``ray start --block`` processes (which take their GCS,
raylet, dashboard, ... down with them), then SIGKILLs whatever is left of: the process trees
collected before the SIGTERM, the two process groups, and any process whose command line mentions
the cluster's private temp dir (every Ray daemon and worker of this cluster does; no other process
does). Job drivers run in their own sessions under a worker process and are covered by the tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # a Ray dependency

REPO_ROOT = Path(__file__).resolve().parents[1]

# Variables that would point a child process at another cluster or another token.
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER: a process that ran an embedded search has it at "0"
# (platform.search), and a worker's `ray start` then refuses to join ("not supported on Windows and OSX")
_SCRUBBED_ENV = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_JOB_ID",
                 "RAY_NODE_ID", "RAY_RAYLET_PID", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")


def ray_executable() -> str | None:
    """The ``ray`` CLI of the running interpreter's environment, else the first one on PATH."""
    beside = Path(sys.executable).parent / "ray"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("ray")


@dataclass
class ClusterInfo:
    gcs_address: str                  # "127.0.0.1:PORT", for ray.init(address=...) / --address
    dashboard_url: str                # "http://127.0.0.1:PORT", for JobSubmissionClient
    env: dict[str, str]               # environment for subprocesses talking to this cluster
    token: str | None                 # the auth token, None when auth is disabled
    temp_dir: Path                    # the cluster's private --temp-dir
    log_dir: Path                     # where the two `ray start` outputs go
    head_node_id: str | None = None
    worker_node_id: str | None = None
    nodes: list[dict] = field(default_factory=list)
    _worker: subprocess.Popen | None = None

    def stop_worker(self, grace_s: float = 15.0) -> None:
        """Take the worker node down as ``ray stop`` on that machine would: SIGTERM its ``ray start
        --block`` process (which stops the node's raylet and workers), then SIGKILL whatever is left
        of the tree collected before. The head and its processes are untouched."""
        if self._worker is None:
            raise RuntimeError("no worker node to stop")
        victims = _cluster_processes([self._worker], marker="")
        with contextlib.suppress(ProcessLookupError):
            self._worker.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._worker.wait(timeout=grace_s)
        alive = [p for p in victims.values() if p.is_running()]
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers for the dashboard / Jobs API (the bearer token when auth is on)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def list_nodes(self, timeout: float = 10.0) -> list[dict]:
        """Nodes as the dashboard's state API lists them (``node_id``, ``state``, ``is_head_node``,
        ``resources_total``, ...)."""
        req = urllib.request.Request(f"{self.dashboard_url}/api/v0/nodes?limit=100&detail=true",
                                     headers=self.headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = json.load(resp)
        if not body.get("result"):
            raise RuntimeError(f"state API error: {body.get('msg')}")
        return body["data"]["result"]["result"]

    def logs(self, max_chars: int = 4000) -> str:
        """The tail of both `ray start` outputs, for failure messages."""
        parts = []
        for name in ("head", "worker"):
            path = self.log_dir / f"ray-start-{name}.log"
            if path.exists():
                parts.append(f"--- {path} ---\n{path.read_text(errors='replace')[-max_chars:]}")
        return "\n".join(parts)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _node_port_args(ports: list[int]) -> list[str]:
    nm, om, agent_http, agent_grpc, runtime_env, metrics = ports
    return ["--node-manager-port", str(nm), "--object-manager-port", str(om),
            "--dashboard-agent-listen-port", str(agent_http), "--dashboard-agent-grpc-port", str(agent_grpc),
            "--runtime-env-agent-port", str(runtime_env), "--metrics-export-port", str(metrics)]


def _popen(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    # No SIGTERM drain (default: wait up to 30 s for the node to go idle): stop promptly.
    env = {**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        # Own session: its process group is ours to signal, and Ctrl-C in the terminal doesn't hit it.
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _cluster_processes(roots: list[subprocess.Popen], marker: str) -> dict[int, psutil.Process]:
    """The started `ray start` processes, their descendants, and every process whose command line
    mentions ``marker`` (the cluster's private temp dir)."""
    found: dict[int, psutil.Process] = {}
    for popen in roots:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(popen.pid)
            found[proc.pid] = proc
            for child in proc.children(recursive=True):
                found[child.pid] = child
    me = os.getpid()
    for proc in psutil.process_iter(["cmdline"]) if marker else ():
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            if proc.pid != me and any(marker in arg for arg in cmdline):
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
    found.pop(me, None)
    return found


def stop_cluster(roots: list[subprocess.Popen], marker: str, grace_s: float = 15.0) -> None:
    """Stop exactly the processes of one cluster (see the module docstring); never ``ray stop``."""
    victims = _cluster_processes(roots, marker)
    for popen in reversed(roots):          # worker first, then head
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for popen in roots:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=max(0.1, deadline - time.monotonic()))
    # Whatever survived the graceful shutdown, plus anything started meanwhile.
    victims.update(_cluster_processes([], marker))
    for popen in roots:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)   # the group id is the pid (start_new_session)
    alive = [p for p in victims.values() if p.is_running()]
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)
    for popen in roots:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)


def _wait_for_nodes(info: ClusterInfo, want: int, roots: list[subprocess.Popen], timeout: float,
                    worker_resource: str | None) -> list[dict]:
    deadline = time.monotonic() + timeout
    last_error: Exception | str | None = None
    while time.monotonic() < deadline:
        for popen in roots:
            if popen.poll() is not None:
                raise RuntimeError(f"`ray start` exited with {popen.returncode}\n{info.logs()}")
        try:
            nodes = [n for n in info.list_nodes() if n.get("state") == "ALIVE"]
            heads = [n for n in nodes if n.get("is_head_node")]
            workers = [n for n in nodes if not n.get("is_head_node")
                       and (worker_resource is None or worker_resource in (n.get("resources_total") or {}))]
            if len(heads) == 1 and len(heads) + len(workers) >= want:
                return nodes
            last_error = f"{len(nodes)} alive node(s)"
        except (OSError, urllib.error.URLError, RuntimeError, ValueError, KeyError) as exc:
            last_error = exc
        time.sleep(1.0)
    raise TimeoutError(f"cluster did not reach {want} alive node(s) in {timeout:.0f} s "
                       f"(last: {last_error!r})\n{info.logs()}")


@contextlib.contextmanager
def two_node_cluster(tmp_path: Path, head_cpus: float = 1, worker_cpus: float = 1,
                     worker_resource: str = "archplace_worker", *, auth: bool = True,
                     object_store_mb: int = 300, start_timeout: float = 120.0) -> Iterator[ClusterInfo]:
    """Start a head (``head_cpus`` CPUs) and a worker (``worker_cpus`` CPUs plus one unit of
    ``worker_resource``) on 127.0.0.1, wait until both are ALIVE, yield a ``ClusterInfo``, and
    always stop exactly these processes afterwards."""
    ray = ray_executable()
    if ray is None:
        raise FileNotFoundError("the `ray` executable was not found")
    tmp_path = Path(tmp_path)
    log_dir = tmp_path / "ray-cluster-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    temp_dir = Path(tempfile.mkdtemp(prefix="aprc-", dir="/tmp"))  # short: Unix socket paths

    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    token = secrets.token_hex(32) if auth else None
    if auth:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = token
    else:
        env["RAY_AUTH_MODE"] = "disabled"
        env.pop("RAY_AUTH_TOKEN", None)

    gcs_port, dash_port, client_port, *node_ports = _free_ports(3 + 2 * 6)
    info = ClusterInfo(gcs_address=f"127.0.0.1:{gcs_port}", dashboard_url=f"http://127.0.0.1:{dash_port}",
                       env=env, token=token, temp_dir=temp_dir, log_dir=log_dir)
    common = ["--block", "--temp-dir", str(temp_dir), "--node-ip-address", "127.0.0.1",
              "--object-store-memory", str(object_store_mb * 1024 * 1024), "--disable-usage-stats"]
    head_cmd = [ray, "start", "--head", "--port", str(gcs_port), "--num-cpus", str(head_cpus),
                "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                "--dashboard-port", str(dash_port), "--ray-client-server-port", str(client_port),
                *_node_port_args(node_ports[:6]), *common]
    worker_cmd = [ray, "start", "--address", info.gcs_address, "--num-cpus", str(worker_cpus),
                  "--resources", json.dumps({worker_resource: 1}), *_node_port_args(node_ports[6:]), *common]

    roots: list[subprocess.Popen] = []
    try:
        roots.append(_popen(head_cmd, env, log_dir / "ray-start-head.log"))
        _wait_for_nodes(info, 1, roots, start_timeout, None)
        roots.append(_popen(worker_cmd, env, log_dir / "ray-start-worker.log"))
        info.nodes = _wait_for_nodes(info, 2, roots, start_timeout, worker_resource)
        info._worker = roots[1]
        for node in info.nodes:
            if node.get("is_head_node"):
                info.head_node_id = node["node_id"]
            elif worker_resource in (node.get("resources_total") or {}):
                info.worker_node_id = node["node_id"]
        yield info
    finally:
        stop_cluster(roots, str(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
