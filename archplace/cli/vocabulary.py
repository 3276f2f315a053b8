"""One flag name per concept across the ``archplace`` commands (the table is docs/reference/flags.md):

- hardware: ``--arch NAME|FILE`` (an accelerator template), ``--gpu NAME|FILE`` (a GPU); a command
  that takes neither kind, or only one, still recognises the other and refuses it in one line naming what
  it takes (exit status 2);
- count: ``--devices N`` everywhere, ``--gpus-per-node N`` for the node shape;
- budgets name their unit: ``--max-archs``, ``--max-evals``, ``--det-time`` / ``--ilp-det-time``
  (CP-SAT deterministic seconds), ``--subsolves``; wall-clock limits end in ``-timeout`` (seconds).

Old spellings keep working and print one line on stderr naming the new flag
(``note: --accelerators is now --devices``). Argparse errors are one line (``archplace place: error:
argument --devices: invalid int value: 'x'``), with the nearest valid flag or choice for a near miss;
absurd counts are refused while parsing, before any work, with the limit."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from typing import Any

MAX_DEVICES = 65_536
"""The most devices ``place``, ``search`` and ``shard`` take: a sanity bound (a typo such as 10240000
would otherwise start a search); the other commands have their own, smaller, real limits."""

BUDGETS_KEY = "budgets"
"""The ``--json`` key of the budgets a command ran under, each named with its unit (``max_evals``)."""


# ---------------------------------------------------------------------- one-line argparse errors
class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (exit status 2), not the usage block;
    an unrecognised flag or a choice that is not one gets the nearest valid one as a hint; an
    unrecognised argument is reported by the subcommand that got it (``archplace place: error: ...``)."""

    def error(self, message: str):  # type: ignore[override]
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message}{self._hint(message)}\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            self._leaf(ns).error("unrecognized arguments: " + " ".join(extras))
        return ns

    def _leaf(self, ns) -> Parser:
        """The subcommand's parser (the one whose flags an unrecognised argument was meant for)."""
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction):
                sub = a.choices.get(getattr(ns, a.dest, None) or "")
                return sub._leaf(ns) if isinstance(sub, Parser) else self
        return self

    def visible_flags(self) -> list[str]:
        return [s for a in self._actions if a.help is not argparse.SUPPRESS for s in a.option_strings
                if s.startswith("--")]

    def _hint(self, message: str) -> str:
        if message.startswith("unrecognized arguments:"):
            flags = [t.split("=", 1)[0] for t in message.split(":", 1)[1].split() if t.startswith("--")]
            for f in flags:
                near = difflib.get_close_matches(f, self.visible_flags(), n=1, cutoff=0.6)
                if near:
                    return f" (did you mean {near[0]}?)"
            return ""
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            near = difflib.get_close_matches(m[1], re.findall(r"'([^']*)'", m[2]), n=1, cutoff=0.6)
            return f" (did you mean {near[0]}?)" if near else ""
        return ""


# ---------------------------------------------------------------------- counts and budgets
def count(flag_what: str = "devices", low: int = 1, high: int = MAX_DEVICES, why: str = "") -> Callable:
    """An argparse type: an integer in [low, high]; anything else is refused in one line with the limit."""
    def parse(text: str) -> int:
        v = int(text)  # ValueError: argparse says "invalid int value: 'x'"
        if low == high and v != low:
            raise argparse.ArgumentTypeError(f"must be {low}{why}, got {v:,}")
        if v < low:
            raise argparse.ArgumentTypeError(f"must be at least {low} ({flag_what}), got {v:,}")
        if v > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:,} {flag_what}{why}, got {v:,}")
        return v

    parse.__name__ = "int"
    return parse


def positive(kind: type = int, what: str = "") -> Callable:
    """An argparse type: a number > 0 (``what`` names its unit in the error)."""
    def parse(text: str):
        v = kind(text)
        if not v > 0:
            raise argparse.ArgumentTypeError(f"must be > 0{' ' + what if what else ''}, got {text}")
        return v

    parse.__name__ = kind.__name__
    return parse


# ---------------------------------------------------------------------- old spellings, refused kinds
class Renamed(argparse.Action):
    """An old spelling: stores into the new flag's ``dest`` and prints ``note: OLD is now NEW``."""

    def __init__(self, option_strings, dest, new: str, **kw) -> None:
        kw.setdefault("help", argparse.SUPPRESS)
        kw.setdefault("default", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kw)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        note(option_string, self.new)
        setattr(namespace, self.dest, values)


def note(old: str | None, new: str) -> None:
    print(f"note: {old} is now {new}", file=sys.stderr)


def renamed(parser, old: str, new: str, dest: str, **kw) -> None:
    """``old`` keeps working as ``new`` (``dest``), with a one-line note."""
    parser.add_argument(old, action=Renamed, new=new, dest=dest, **kw)


class Refused(argparse.Action):
    """A flag this command recognises but does not take (a kind of hardware that does not apply):
    refused in one line saying what the command takes."""

    def __init__(self, option_strings, dest, why: str, **kw) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} does not apply: {self.why}")


def refuse(parser, flags: tuple[str, ...], why: str) -> None:
    """``flags`` are refused in one line; ``--help`` says so below the options."""
    for f in flags:
        parser.add_argument(f, action=Refused, why=why)
    text = f"{' and '.join(flags)} {'do' if len(flags) > 1 else 'does'} not apply: {why}."
    parser.epilog = f"{parser.epilog}\n{text}" if parser.epilog else text


# ---------------------------------------------------------------------- the shared flags
ARCH_HELP = "accelerator template: a preset (tpuv4; see docs/reference/presets.md) or a JSON file"


def gpu_help(names, extra: str = "") -> str:
    return f"GPU preset ({', '.join(sorted(names))}) or a .json file of a GPU's fields{extra}"


def gpu_choice(names) -> Callable:
    """An argparse type: a GPU preset among ``names`` or a ``.json`` file of a GPU's fields (read and
    checked by the request, which names the bad field)."""
    allowed = sorted(names)

    def parse(text: str) -> str:
        if text in allowed or text.endswith(".json"):
            return text
        near = difflib.get_close_matches(text, allowed, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r}{hint}; allowed: {', '.join(allowed)} "
                                         "or a GPU's .json file")

    parse.__name__ = "gpu"
    return parse


def add_devices(parser, help: str, *, type: Callable | None = None, default: Any = None,
                old: tuple[str, ...] = (), old_type: Callable | None = None, metavar: str = "N",
                required: bool = False) -> None:
    """``--devices N`` and its old spellings (``--accelerators``, ``--chiplets``)."""
    parser.add_argument("--devices", type=type or count(), default=default, metavar=metavar, help=help,
                        required=required)
    for o in old:
        renamed(parser, o, "--devices", "devices", type=old_type or type or count(), metavar=metavar)


def budgets(**values: Any) -> dict[str, Any]:
    """The ``budgets`` JSON object: the given budgets that are set, keys naming their unit."""
    return {k: v for k, v in values.items() if v is not None}


# request fields whose flag differs from "--" + the field: the same everywhere, then per command
FIELD_FLAGS = {"accelerators": "--devices", "chiplets": "--devices", "machine": "--gpu",
               "ilp_budget": "--ilp-det-time", "ilp_time_limit_s": "--ilp-timeout",
               "max_deterministic_s": "--det-time", "time_limit_s": "--timeout"}
COMMAND_FIELD_FLAGS = {
    "search": {"budget": "--max-archs"},
    "partition": {"budget": "--max-evals"},
    "pipeline": {"budget": "--max-evals", "cluster": "--devices"},
    "shard": {"budget": "--max-evals"},
    "place-ops": {"budget": "--max-evals"},
}


def field_flag(command: str, field: str, args=None) -> str | None:
    """The flag that sets the request field ``field`` of ``command`` (None: the default spelling)."""
    if command == "place-ops" and field == "budget" and getattr(args, "algo", None) == "exact":
        return "--timeout"
    return COMMAND_FIELD_FLAGS.get(command, {}).get(field) or FIELD_FLAGS.get(field)
