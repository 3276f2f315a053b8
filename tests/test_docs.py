"""The README stays a short front page whose examples cannot drift: every command in its ``bash`` blocks
is one that the guides run (tests/test_docs_guides.py runs every guide command), or one of the few
that set the project up (``git clone``, ``cd``, a ``make`` target of the Makefile). The site itself is
checked by ``mkdocs build --strict`` in ``make test``."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs_guides import GUIDES, PAGES, commands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 200


def _norm(cmd: str) -> str:
    """One line, single spaces: a command split over lines with backslashes equals the same on one."""
    return " ".join(cmd.replace("\\\n", " ").split())


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def _setup_command(cmd: str, targets: set[str]) -> bool:
    words = cmd.split()
    if words[:2] == ["git", "clone"] or words[0] == "cd":
        return True
    return words[0] == "make" and len(words) >= 2 and all(w in targets for w in words[1:])


def test_readme_is_short() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, (f"README.md has {n} lines, at most {MAX_README_LINES}: the details belong "
                                   "in docs/ (a guide, a results page or the reference)")


def test_readme_commands_are_in_the_guides() -> None:
    shown = [(no, _norm(c)) for no, c in commands(README.read_text())]
    assert shown, "README.md shows no ```bash command (how to install and run belongs on the front page)"
    assert PAGES, f"no guides in {GUIDES}"
    guided = {_norm(c) for page in PAGES for _, c in commands((GUIDES / page).read_text())}
    targets = _make_targets()
    stray = [f"README.md:{no}: {c}" for no, c in shown if c not in guided and not _setup_command(c, targets)]
    assert not stray, ("README commands that no guide runs (copy each into the guide it belongs to, or "
                       "show it in a ```text block):\n" + "\n".join(stray))


def test_setup_commands() -> None:
    targets = {"test", "install", "run"}
    assert _setup_command("make test", targets) and _setup_command("git clone URL archplace", targets)
    assert _setup_command("cd archplace", targets)
    assert not _setup_command("make nonsense", targets)
    assert not _setup_command("archplace search bert-large", targets)
