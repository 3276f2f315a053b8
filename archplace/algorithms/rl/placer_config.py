"""``--config FILE`` of the RL placers: a YAML with the placer's section (``ppo:`` for MCM, ``dqn:``
for pipeline) and optionally ``model:`` / ``env:``, each overriding the packaged YAML key by key.
``archplace tune-rl`` writes such a file (``best_config.yaml``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def load_placer_config(path: str | None, section: str) -> dict[str, Any]:
    """The ``section`` (``ppo`` / ``dqn``) of a YAML written by tune-rl (or by hand), for ``--config``."""
    if not path:
        return {}
    p = Path(path)
    if not p.exists():
        raise ValueError(f"config {path} does not exist")
    cfg = yaml.safe_load(p.read_text()) or {}
    if not isinstance(cfg, dict) or not isinstance(cfg.get(section, {}), dict):
        raise ValueError(f"config {path}: expected a mapping with a '{section}:' section")
    unknown = set(cfg) - {section, "model", "env"}
    if unknown:
        raise ValueError(
            f"config {path}: unknown section(s) {sorted(unknown)}; allowed: {section}, model, env"
        )
    return cfg
