"""What every bench JSON records about how it was made: the commit (and whether the tree had
uncommitted changes), the exact command, and the machine with its load before and after."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path


def git_state() -> dict:
    def run(*args):
        try:
            return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True,
                                  text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    try:   # not stripped: each porcelain line starts with its two status columns, maybe blank
        status = subprocess.run(["git", "status", "--porcelain"], cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        status = ""
    changed = [ln[3:] for ln in status.splitlines() if ln.strip()]
    # the files that differ from the commit, so a reader can see whether they touch what was measured
    return {"commit": run("rev-parse", "HEAD") or None, "dirty": bool(changed), "dirty_files": changed}


LIBRARIES = ("numpy", "scipy", "torch", "ray", "ortools", "highspy", "numba", "transformers", "pyarrow",
             "sqlalchemy", "fastapi", "torch_geometric", "gymnasium")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
                    "RAY_num_cpus", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")


def libraries() -> dict:
    """Versions of the libraries a number can depend on (summation order, kernels, solver versions):
    the same command on another setup is only comparable when these match."""
    from importlib import metadata

    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def threads() -> dict:
    """The thread settings in force: the environment variables, and torch's own counts and
    deterministic-algorithm flag when torch is already imported by the bench (never imported here)."""
    out: dict = {"env": {k: os.environ.get(k) for k in THREAD_VARIABLES}}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_threads"] = torch.get_num_threads()
        out["torch_interop_threads"] = torch.get_num_interop_threads()
        out["torch_deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    try:
        out["affinity_cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["affinity_cpus"] = None
    return out


def machine(load_before: tuple[float, float, float]) -> dict:
    """The machine, its load before and after, and the libraries and threads a number depends on."""
    return {"cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "python": sys.version.split()[0], "platform": platform.platform(), "libraries": libraries(),
            "threads": threads()}


def command() -> list[str]:
    return [sys.executable, *sys.argv]


def code_version(*modules: str) -> str:
    """A short hash of the source of the named packages/modules (dotted names under the repository,
    e.g. ``archplace.algorithms.rl``) and the tune_configs YAMLs: bench caches key their entries by it,
    so a change to the code a number depends on re-runs that number."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    files: list[Path] = []
    for mod in modules:
        p = root / Path(*mod.split("."))
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p.with_suffix(".py")]
    files += sorted((root / "archplace" / "tune_configs").glob("*.yaml"))
    for f in files:
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _code_version_at(commit: str, modules: tuple[str, ...], blobs: dict) -> str | None:
    """:func:`code_version` of the tree of ``commit`` (read from git objects, not the working tree)."""
    import hashlib

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60).stdout

    listing = {}
    for line in git("ls-tree", "-r", commit, "--", "archplace").splitlines():
        meta, path = line.split("\t", 1)
        listing[path] = meta.split()[2]
    files: list[Path] = []
    for mod in modules:
        p = Path(*mod.split("."))
        inside = sorted(Path(f) for f in listing if f.startswith(str(p) + "/") and f.endswith(".py"))
        if inside:
            files += inside
        elif str(p.with_suffix(".py")) in listing:
            files.append(p.with_suffix(".py"))
        else:
            return None  # the module did not exist yet
    cfg = "archplace/tune_configs/"
    files += sorted(Path(f) for f in listing
                    if f.startswith(cfg) and f.endswith(".yaml") and "/" not in f[len(cfg):])
    h = hashlib.sha256()
    for f in files:
        sha = listing[str(f)]
        if sha not in blobs:
            blobs[sha] = subprocess.run(["git", "cat-file", "blob", sha], cwd=root, capture_output=True,
                                        timeout=60).stdout
        h.update(str(f).encode())
        h.update(blobs[sha])
    return h.hexdigest()[:12]


def backfill_commits(cache: dict, modules: tuple[str, ...]) -> int:
    """Give every cached run that predates per-run commit recording (keys ``"<code version>|..."``, no
    ``"commit"``) the oldest commit whose source hashes to its key's code version, and say that its command
    was not recorded. Returns how many entries changed. The commit is exact for the code the run measured
    (that is what the key encodes); the command that produced it is unknown and is not guessed."""
    todo = {k.split("|", 1)[0] for k, v in cache.items() if isinstance(v, dict) and "commit" not in v}
    if not todo:
        return 0
    root = Path(__file__).resolve().parents[1]
    commits = subprocess.run(["git", "rev-list", "--reverse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=60).stdout.split()
    found: dict[str, str] = {}
    blobs: dict = {}
    for c in commits:
        v = _code_version_at(c, modules, blobs)
        if v in todo and v not in found:
            found[v] = c
            if len(found) == len(todo):
                break
    n = 0
    for k, v in cache.items():
        if isinstance(v, dict) and "commit" not in v:
            v["commit"] = found.get(k.split("|", 1)[0])
            v["commit_basis"] = ("the oldest commit whose code version equals this run's key" if v["commit"]
                                 else "no commit in the history has this run's code version")
            v["command"] = "not recorded (cached before bench runs recorded their command, 5c21358)"
            n += 1
    return n
