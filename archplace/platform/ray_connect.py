"""Connecting the search to Ray: the embedded instance on 127.0.0.1 (never a cluster it was not given),
or ``--address`` (auto or HOST:PORT), checked before anything is created and said aloud while it waits:
the cluster joined, its CPUs, and what Ray's client last logged while an attach takes long.

And stopping a command that holds a Ray: SIGTERM or Ctrl-C at any moment (starting Ray, working,
shutting down) ends it within :data:`GRACE_S` seconds, with the embedded Ray and everything else the
process started gone, one line on stderr and exit status 128 + the signal (see
:func:`install_stop_handlers`), never a native stack dump from Ray's core worker."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings

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
        with _stop_handlers_kept():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **kw)
        return
    with _stderr_captured() as captured:
        attached = threading.Event()
        threading.Thread(target=_say_while_attaching, args=(captured, address, attached), daemon=True,
                         name="archplace-attach").start()
        try:
            with _stop_handlers_kept():
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


# ---------------------------------------------------------------------- stopping: SIGTERM and Ctrl-C
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 25.0     # from the first stop signal to the exit, whatever the command was doing
RERAISE_S = 2.0    # a stop that a library swallowed (a bare except while Ray starts) is raised again


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT stopped the command: raised in the main thread by the stop handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _StopState:
    def __init__(self) -> None:
        self.command: str | None = None   # "archplace serve": the handlers are installed
        self.signum: int | None = None    # the first stop signal
        self.at = 0.0                      # when it came (monotonic)
        self.grace_s = GRACE_S
        self.handled = threading.Event()   # the command has the stop in hand: no more interrupts
        self.lock = threading.Lock()


_STOP = _StopState()


def install_stop_handlers(command: str, grace_s: float = GRACE_S) -> bool:
    """Make SIGTERM and SIGINT stop this process as a command should (``command``: "archplace serve",
    the prefix of its lines). The first signal raises :class:`Stopped` in the main thread (a layer with
    a gentler way, the search's trials or the service's shutdown, takes it over with
    :func:`note_stop`); later ones are ignored once the command has the stop in hand (:func:`stopping`),
    so its clean-up is not cut short; a stop swallowed on the way is raised again; and ``grace_s``
    after the first signal the process ends regardless: one line, what it started killed, exit
    128 + the signal. For the command line only (a process of its own): False, and nothing done,
    outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    _STOP.command, _STOP.grace_s = command, grace_s
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    _child_subreaper()
    return True


def _child_subreaper() -> None:
    """Linux: what this process started, and what those started, stays below it even when their
    parent dies first (a raylet killed while it started its agents left them to init, running), so
    :func:`shutdown_ray` finds every one."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def stop_handlers_installed() -> bool:
    return _STOP.command is not None


def _on_stop_signal(signum: int, frame) -> None:
    note_stop(signum)
    if not _STOP.handled.is_set() and not _importing(frame):
        raise Stopped(_STOP.signum or signum)


def _importing(frame) -> bool:
    """Whether the main thread is importing a module: an interrupt there leaves it half made (Cython's
    modules print "Exception ignored" and patch nothing), and the shutdown needs Ray's modules whole.
    The watchdog sends the signal again once the import is done."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def note_stop(signum: int, handled: bool = False) -> None:
    """Record a stop signal (the first one counts, and starts the watchdog); ``handled``: the caller
    takes care of stopping (no interrupt is raised for it). Nothing happens without
    :func:`install_stop_handlers` (a Python caller's signals are its own)."""
    if _STOP.command is None:
        return
    with _STOP.lock:
        first = _STOP.signum is None
        if first:
            _STOP.signum, _STOP.at = signum, time.monotonic()
    if handled:
        _STOP.handled.set()
    if first:
        # stopping: Python's warnings, and an interrupt that met code that cannot raise (a __del__, a
        # module's init: "Exception ignored in ..."), are no news for the user; the line says it all
        warnings.simplefilter("ignore")
        default_hook = sys.unraisablehook

        def unraisable(info) -> None:
            if not isinstance(info.exc_value, KeyboardInterrupt):
                default_hook(info)

        sys.unraisablehook = unraisable
        threading.Thread(target=_watchdog, name="archplace-stop", daemon=True).start()


def stop_signal() -> int | None:
    """The signal that stopped the command (None: none came, or no stop handlers)."""
    return _STOP.signum


def stopping() -> None:
    """The command is cleaning up after a stop, or exiting: later signals are noted, not raised (the
    watchdog bounds what is left)."""
    if _STOP.command is not None:
        _STOP.handled.set()


def raise_if_stopped() -> None:
    """Raise :class:`Stopped` if a stop signal came and nothing took it in hand (a library swallowed
    the interrupt): called where a long step returns."""
    if _STOP.signum is not None and not _STOP.handled.is_set():
        raise Stopped(_STOP.signum)


def stop_line(signum: int, what: str = "") -> str:
    return f"{_STOP.command or 'archplace'}: stopped by {signal.Signals(signum).name}{what}"


def _watchdog() -> None:
    st = _STOP
    deadline, raised = st.at + st.grace_s, st.at
    while True:
        now = time.monotonic()
        if now >= deadline:
            _force_exit()
        if not st.handled.is_set() and now - raised >= RERAISE_S and not _main_unwinding():
            raised = now
            try:   # a real signal to the main thread: it also ends a wait the flag alone would not
                signal.pthread_kill(threading.main_thread().ident, st.signum)
            except (OSError, ValueError):
                pass
        time.sleep(0.2)


def _main_unwinding() -> bool:
    """Whether the main thread is handling an interrupt (its ``finally`` blocks and ``except``
    clauses run with it): not to be cut short by raising another."""
    try:
        exc = sys._current_exceptions().get(threading.main_thread().ident)
    except AttributeError:   # not CPython
        return True
    if isinstance(exc, tuple):   # Python 3.11: (type, value, traceback)
        exc = exc[1]
    return isinstance(exc, KeyboardInterrupt)


def _force_exit() -> None:
    """The clean-up took longer than the grace period: kill what this process started and exit."""
    signum = _STOP.signum or signal.SIGTERM
    _kill(_descendants())
    say(stop_line(signum, f" (its clean-up cut short after {_STOP.grace_s:g} s)"))
    os._exit(128 + signum)


def say(text: str) -> None:
    """A line on stderr; a reader that left (a closed pipe) must not stop the shutdown."""
    try:
        sys.stderr.flush()
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def _stop_handlers_kept():
    """Around ``ray.init`` in a command with stop handlers: Ray's own SIGTERM handler (``sys.exit`` in
    the middle of whatever runs) is not installed, and the core worker does not install its C++
    failure signal handler in this process, which printed a native stack trace on SIGTERM and aborted
    (SIGABRT, no clean-up); a real crash still prints the Python stack (``faulthandler``). The Ray
    workers keep theirs (their logs). A stop that came meanwhile is raised when ray.init returns."""
    if _STOP.command is None:
        yield
        return
    import faulthandler

    import ray._private.ray_constants as rc
    import ray._private.utils as ru

    if not faulthandler.is_enabled():
        faulthandler.enable()
    rc.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    saved = getattr(ru, "set_sigterm_handler", None)
    ru.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if saved is not None:
            ru.set_sigterm_handler = saved
        for sig in STOP_SIGNALS:   # ours again, whatever ray.init installed
            if signal.getsignal(sig) is not _on_stop_signal:
                signal.signal(sig, _on_stop_signal)
    raise_if_stopped()


def shutdown_ray(wait_s: float = 3.0) -> None:
    """The embedded Ray gone (``ray.shutdown``; an attached cluster is only left), then every process
    this one started that is still there after ``wait_s`` is killed: a Ray interrupted while starting
    has no node to shut down, and its agents outlived it."""
    tree = _descendants()
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - a half-started Ray: what it left is killed below
            pass
    deadline = time.monotonic() + wait_s
    while True:
        tree.update(_descendants())   # and what they started meanwhile (left to this subreaper)
        if time.monotonic() >= deadline or not any(_alive(p, t) for p, t in tree.items()):
            break
        time.sleep(0.1)
    _kill(tree)


def _descendants(root: int | None = None) -> dict[int, str]:
    """Every process below ``root`` (this one): pid -> its start time (to tell a reused pid)."""
    children: dict[int, list[tuple[int, str]]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        st = _stat(pid)
        if st is not None:
            children.setdefault(int(st[1]), []).append((pid, st[19]))
    out: dict[int, str] = {}
    todo = [os.getpid() if root is None else root]
    while todo:
        for pid, start in children.get(todo.pop(), ()):
            if pid not in out:
                out[pid] = start
                todo.append(pid)
    return out


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str) -> bool:
    st = _stat(pid)
    return st is not None and st[19] == start and st[0] not in ("Z", "X")


def _kill(tree: dict[int, str]) -> None:
    for pid, start in tree.items():
        if _alive(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
