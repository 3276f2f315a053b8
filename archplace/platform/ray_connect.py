"""Connecting the search to Ray: the embedded instance on 127.0.0.1 (never a cluster it was not given),
or ``--address`` (auto or HOST:PORT), checked before anything is created and said aloud while it waits:
the cluster joined, its CPUs, and what Ray's client last logged while an attach takes long."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import tempfile
import threading

_status = logging.getLogger("archplace.status")


def connect(address: str | None, num_cpus: int | None = None) -> None:
    """Start the embedded Ray, or attach to the cluster at ``address`` ("auto" or HOST:PORT).
    An unreachable address is a one-line ValueError, not a hang or a traceback."""
    check_address(address)
    if "ray" not in sys.modules or not sys.modules["ray"].is_initialized():
        _status.info("starting Ray (a local instance of this command's own)" if address is None else
                     f"attaching to the Ray cluster at {address}"
                     + (" (the one RAY_ADDRESS or a `ray start` on this machine names)" if address == "auto"
                        else ""))
    import ray

    if ray.is_initialized():
        return
    kw = {"log_to_driver": False, "configure_logging": True, "logging_level": "ERROR"}
    if address is None:
        _loopback_only()
        # "local": always a new Ray of our own. Without it, ray.init() joins the cluster a `ray start`
        # on this machine recorded in /tmp/ray/ray_current_cluster, or RAY_ADDRESS (issue 29)
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kw)
        return
    with _stderr_captured() as captured:
        attached = threading.Event()
        threading.Thread(target=_say_while_attaching, args=(captured, address, attached), daemon=True,
                         name="archplace-attach").start()
        try:
            ray.init(address=address, **kw)
            error = None
        except (ConnectionError, RuntimeError, ValueError) as e:
            error = e
        finally:
            attached.set()
    said = captured.text
    if error is None:
        if said.strip():   # what a successful attach said (warnings), as Ray would have said it
            sys.stderr.write(said)
        _say_cluster(ray)
        return
    msg = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if "InvalidAuthToken" in said or "Unauthenticated" in said:
        raise ValueError(f"--address {address}: the cluster refused this driver's token (it runs with "
                         "token authentication; set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, or "
                         "~/.ray/auth_token, to its token, see deploy/README.md)") from None
    raise ValueError(f"--address {address}: could not attach to a Ray cluster: {msg} (a cluster with "
                     "token authentication needs RAY_AUTH_MODE=token and its token, see deploy/README.md)"
                     ) from None


def check_address(address: str | None) -> None:
    """``--address``: "auto", or HOST:PORT where something listens (a one-line ValueError otherwise,
    in at most 5 s, before anything is created or started)."""
    if address is None or address == "auto":
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address must be 'auto' or HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise ValueError(f"--address {address}: cannot reach a Ray cluster there ({e.strerror or e})"
                         ) from None


def _say_cluster(ray) -> None:
    """The cluster this driver joined, as a note that stays on screen: its address, CPUs and nodes,
    and whether they are busy (then the search waits for them, and says so)."""
    try:
        where = ray.get_runtime_context().gcs_address
        total, free = ray.cluster_resources(), ray.available_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    except Exception:  # noqa: BLE001 - a note must not fail the attach
        return
    cpus, idle = float(total.get("CPU", 0.0)), float(free.get("CPU", 0.0))
    _status.warning(f"joined the Ray cluster at {where}: {cpus:g} CPUs on {nodes} node(s), {idle:g} free")
    if cpus >= 1 > idle:
        _status.info(f"waiting: all {cpus:g} CPUs of the cluster are busy with other work")


def _say_while_attaching(captured: _Captured, address: str, done: threading.Event,
                         every_s: float = 10.0) -> None:
    """While an attach takes long (a cluster that does not answer as Ray expects retries for minutes),
    the phase says what Ray's client last logged, every ``every_s`` seconds it has something new."""
    said = ""
    while not done.wait(every_s):
        last = next((ln for ln in reversed(captured.peek().splitlines()) if ln.strip()), "")
        last = re.sub(r"^\[[^\]]*\]\s*[\w.]+:\d+:\s*", "", last).strip()   # Ray's "[time W pid] file:line: "
        if last and last != said:
            said = last
            _status.info(f"attaching to the Ray cluster at {address}, still; Ray's client says: {last[:200]}")


class _Captured:
    text = ""
    fd: int | None = None

    def peek(self, limit: int = 65536) -> str:
        """The end of what was captured so far, read without moving the capture's file offset."""
        if self.fd is None:
            return ""
        try:
            size = os.fstat(self.fd).st_size
            return os.pread(self.fd, min(size, limit), max(0, size - limit)).decode(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def _stderr_captured():
    """File descriptor 2 into a temporary file while attaching: Ray's C++ client logs every failed
    GCS handshake there (about 20 lines of ``gcs_client.cc`` warnings for a missing token, issue 29),
    bypassing Python's ``sys.stderr``. The caller decides what of it to show (``.text``)."""
    cap = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as fh:
        os.dup2(fh.fileno(), 2)
        cap.fd = fh.fileno()
        try:
            yield cap
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            fh.seek(0)
            cap.text = fh.read().decode(errors="replace")
            cap.fd = None


def _loopback_only() -> None:
    """Make the embedded Ray listen on 127.0.0.1 only. Ray binds its servers (GCS, raylet, object
    manager, workers) to the node IP, and resolves 127.0.0.1 to the machine's outward address unless
    multi-node mode is off: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (the default on macOS and
    Windows). The variable is read when ray is imported, so the constant is set here as well; the
    processes ray.init starts inherit the environment."""
    import ray._private.ray_constants as rc

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    rc.ENABLE_RAY_CLUSTER = False
