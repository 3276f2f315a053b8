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


def machine(load_before: tuple[float, float, float]) -> dict:
    return {"cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "python": sys.version.split()[0], "platform": platform.platform()}


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
