"""A real, throw-away PostgreSQL server for the tests and the load bench.

``PostgresServer.start()`` runs the installed PostgreSQL's own tools: ``initdb`` into a temporary
directory, ``pg_ctl start -w`` listening on 127.0.0.1 only (and a Unix socket inside that directory,
so nothing is written to /var/run), and ``pg_ctl stop -m fast`` at the end. Nothing is mocked: the
service talks to it over TCP with psycopg 3, as it would to a production server.

PostgreSQL refuses to run as root (``initdb: cannot be run as root``). When this process is root
(this machine, CI), the server's commands run as an unprivileged account (``postgres``, which the
Debian package creates, else ``nobody``) through ``subprocess``'s ``user=``/``group=``, and the data
directory is handed to that account; as a normal user they run as that user.

The binaries are looked up on ``PATH`` and then in ``/usr/lib/postgresql/*/bin`` (where Debian puts
them, off ``PATH``), newest version first. Without them :func:`find_bin` returns None and the tests
skip, saying so.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SUPERUSER = "archplace"


def find_bin() -> Path | None:
    """The directory holding ``pg_ctl`` and ``initdb`` of one PostgreSQL installation, or None."""
    on_path = shutil.which("pg_ctl")
    candidates = [Path(on_path).resolve().parent] if on_path else []

    def version(p: str) -> tuple[int, ...]:
        m = re.search(r"postgresql/(\d+)(?:\.(\d+))?/bin", p)
        return tuple(int(x) for x in m.groups() if x) if m else (0,)

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    for d in candidates:
        if (d / "pg_ctl").is_file() and (d / "initdb").is_file():
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> pwd.struct_passwd | None:
    """The account the server runs as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' account exists: "
                       "PostgreSQL refuses to run as root")


@dataclass
class PostgresServer:
    """One server in its own temporary directory. ``settings`` are ``postgres -c`` options; the tests
    turn durability off (``fsync=off``) because they check behaviour, not crash safety; the bench keeps
    PostgreSQL's defaults."""

    settings: dict[str, str] = field(default_factory=dict)
    bindir: Path | None = None
    port: int = 0
    password: str = ""
    root: Path | None = None
    _running: bool = False

    def _cmd(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        who = _run_as()
        kw = {"user": who.pw_uid, "group": who.pw_gid, "extra_groups": []} if who else {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = env["LANG"] = "C.UTF-8"
        if who:
            env["HOME"] = str(self.root)
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=self.root,
                           **kw)
        if check and r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            raise RuntimeError(f"{Path(args[0]).name} failed ({r.returncode}): {err}")
        return r

    @property
    def data(self) -> Path:
        return self.root / "data"

    def start(self) -> PostgresServer:
        self.bindir = self.bindir or find_bin()
        if self.bindir is None:
            raise FileNotFoundError("PostgreSQL not found: no pg_ctl on PATH or in /usr/lib/postgresql/*/bin")
        who = _run_as()
        # as root, in /tmp (world-traversable) rather than $TMPDIR, which may sit under /root; the
        # directory itself then goes to the server's account
        self.root = Path(tempfile.mkdtemp(prefix="archplace-pg-", dir="/tmp" if who else None))
        if who:
            os.chown(self.root, who.pw_uid, who.pw_gid)
        self.password = secrets.token_hex(16)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if who:
            os.chown(pwfile, who.pw_uid, who.pw_gid)
        pwfile.chmod(0o600)
        self._cmd(str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--pwfile", str(pwfile),
                  "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        opts = {"listen_addresses": "127.0.0.1", "unix_socket_directories": str(self.root),
                "max_connections": "300", **self.settings}
        last = ""
        for _ in range(3):  # the free port may be taken between the probe and the bind: try another
            self.port = _free_port()
            o = " ".join(f"-c {k}={v}" for k, v in {**opts, "port": str(self.port)}.items())
            r = self._cmd(str(self.bindir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data),
                          "-l", str(self.root / "server.log"), "-o", o, check=False)
            if r.returncode == 0:
                self._running = True
                atexit.register(self.stop)
                return self
            log = self.root / "server.log"
            last = (log.read_text()[-2000:] if log.exists() else "") or r.stderr
        self.stop()
        raise RuntimeError(f"pg_ctl start failed 3 times; server log: {last.strip()}")

    def url(self, dbname: str = "postgres") -> str:
        """A SQLAlchemy URL (psycopg 3) for ``dbname`` over TCP on 127.0.0.1."""
        return f"postgresql+psycopg://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"database name must match [a-z_][a-z0-9_]{{0,62}}, got {name!r}")
        with psycopg.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, password=self.password,
                             dbname="postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` (open connections are cut) and the directory removed."""
        if self._running:
            self._running = False
            self._cmd(str(self.bindir / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data),
                      check=False)
        if self.root is not None and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

