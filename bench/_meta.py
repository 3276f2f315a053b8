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
