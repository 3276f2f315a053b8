"""``archplace serve`` as a user runs it: a subprocess with its own embedded Ray, on a free loopback
port, stopped with SIGTERM and started again on the same port and database while clients keep working.
Also what it exposes: the database file's mode and the addresses its Serve replica listens on.
Every test says what the old code did."""

from __future__ import annotations

import json
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from service_util import free_port

pytestmark = [pytest.mark.slow, pytest.mark.system]

ROOT = Path(__file__).resolve().parents[1]
UP_S = 300  # a start of Ray and Serve on the loaded 2-core machine; generous, never asserted


def _env() -> dict[str, str]:
    # this checkout's archplace; RAY_ADDRESS=local: a Ray of its own even if a `ray start` cluster is up
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "local"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "archplace.cli", *args], env=_env(), capture_output=True,
                          text=True, timeout=120)


class Served:
    """One ``archplace serve --json`` process."""

    def __init__(self, db: Path, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "archplace.cli", "serve", "--db", str(db), "--port", str(port), "--json"],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append), daemon=True).start()

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line)

    def wait_up(self, timeout_s: float = UP_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(f"archplace serve did not come up (exit {self.proc.poll()}): "
                             + "".join(self.err)[-2000:])

    def stop(self, timeout_s: float = 120) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the service and its Ray
            self.proc.wait(timeout=60)


def _show_port(port: int) -> None:
    """Print what the old port check tripped on: the service's closed connections in TIME_WAIT, and
    whether a bind without SO_REUSEADDR is refused now (it holds the port for no time at all)."""
    import socket

    import psutil

    tw = [c for c in psutil.net_connections("tcp")
          if c.status == psutil.CONN_TIME_WAIT and c.laddr.port == port]
    with socket.socket() as plain:
        try:
            plain.bind(("127.0.0.1", port))
            old = "allowed"
        except OSError:
            old = "refused"
    print(f"\nafter SIGTERM: {len(tw)} connections of the service in TIME_WAIT on its port; a bind without "
          f"SO_REUSEADDR (the old port check) {old}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-restart")
    db = tmp / "data" / "service.db"
    out = _cli("serve", "token", "create", "alice", "--db", str(db))
    assert out.returncode == 0, out.stderr
    state = {"db": db, "port": free_port(), "token": out.stdout.strip().splitlines()[-1]}
    state["served"] = Served(db, state["port"])
    state["url"] = state["served"].wait_up()["url"]
    yield state
    state["served"].kill()


def test_database_file_is_owner_only(served):
    """The SQLite file and its WAL files are 0600 from the first token on. The old code left them to
    the umask: 0644, so anyone on the machine could read every study and the token hashes."""
    db = served["db"]
    files = [p for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()]
    assert db in files
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {p.name: "0o600" for p in files}


def test_nothing_of_the_service_listens_beyond_loopback(served):
    """Every process of ``archplace serve`` on loopback: the HTTP proxy, Serve's controller and
    replica, Ray's GCS, raylet and agents. Serve binds the replica's gRPC server for calls between
    deployments to all interfaces (``[::]:0``) whatever ``--host`` says, so the old code's replica
    listened on the network; it is now bound to the Ray node's address, 127.0.0.1 for the embedded Ray
    (the rest is Ray's own, on the node address)."""
    import psutil

    root = psutil.Process(served["served"].proc.pid)
    loopback = ("127.0.0.1", "::ffff:127.0.0.1", "::1")
    wide, replica_ports, n = [], [], 0
    for p in [root, *root.children(recursive=True)]:
        try:
            title = " ".join(p.cmdline()[:1])
            listen = [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            continue
        n += len(listen)
        wide += [f"{title[:50]} {a.ip}:{a.port}" for a in listen if a.ip not in loopback]
        if "ServeReplica" in title:
            replica_ports += [a.port for a in listen]
    print(f"\n{n} listening sockets in the service's process tree, {len(replica_ports)} of the replica")
    assert wide == []
    # Ray's core worker and Serve's gRPC server, both on loopback, and (direct ingress, issue 47) the
    # service's own HTTP port, which the replica serves itself
    assert len(replica_ports) == 3 and served["port"] in replica_ports


def test_client_keeps_working_through_a_sigterm_restart_on_the_same_port(served):
    """Four workers do suggest/complete rounds while the service gets SIGTERM and is started again
    at once on the same port and database. The restart must come up; every worker finishes without an
    error; no trial is left PENDING and every completed value is stored.

    The old code refused the restart for about 60 s (``port_free`` bound without SO_REUSEADDR and
    tripped on the closed connections in TIME_WAIT), and the client gave up after about 23 s of
    retries and did not retry the proxy's plain-text 404 while the routes came up, so workers raised
    connection errors to their callers and left trials PENDING."""
    from archplace.client import Client

    url, token = served["url"], served["token"]
    c = Client(url, token)
    c.create_study(name="restart", models=["bert-base"], searcher="random", seed=11)
    workers, rounds = 4, 12
    done: list[tuple[int, float]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        cl = Client(url, token)  # the default deadline of 300 s
        try:
            for _ in range(rounds):
                for t in cl.suggest("restart", count=1, client_id=f"worker-{k}"):
                    v = float(t["arch_index"]) + 0.25 * k
                    assert cl.complete("restart", t["number"], value=v)["value"] == v
                    with lock:
                        done.append((t["number"], v))
                    time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 300
    while len(done) < 8 and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    before = len(done)
    t0 = time.monotonic()
    assert served["served"].stop() == 0
    stopped = time.monotonic() - t0
    _show_port(served["port"])
    served["served"] = Served(served["db"], served["port"])  # the same port, at once
    served["served"].wait_up()
    up = time.monotonic() - t0
    for th in threads:
        th.join(timeout=600)
    print(f"\nSIGTERM -> exit {stopped:.1f} s, -> up again on the same port {up:.1f} s; "
          f"{before} rounds before, {len(done)} in all")
    assert not errors, errors[:3]
    assert 0 < before < workers * rounds, "the restart did not land mid-load"
    assert len(done) == workers * rounds
    rows = {t["number"]: t for t in c.trials("restart")}
    assert [n for n, t in rows.items() if t["state"] == "PENDING"] == []
    assert len(rows) == workers * rounds
    for n, v in done:
        assert rows[n]["state"] == "COMPLETED" and rows[n]["value"] == v
