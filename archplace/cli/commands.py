"""The archplace command line: a human summary by default, one JSON
object with ``--json``. Bad input ends with a one-line error and exit status 2, never a traceback.

The top floor of the package: each command group lives in its own module (``graphs``, ``placement``,
``searching``, ``operator_placement``, ``partitioning``, ``pipelining``, ``tune_rl``, ``planning``,
``serve``), a thin layer over ``archplace.api`` (``archplace.service`` for ``serve``). This module puts
them in one parser and turns errors into one-line messages."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from archplace import api
from archplace.cli import (
    graphs,
    operator_placement,
    partitioning,
    pipelining,
    placement,
    planning,
    profiling,
    searching,
    serve,
    sharding,
    status,
    tune_rl,
    vocabulary,
)
from archplace.platform import ray_connect

# a subcommand: (add its parser, run it -> the --json dict, print that dict for people)
Command = tuple[Callable, Callable[..., dict[str, Any]], Callable[[dict[str, Any]], None]]


def _entry(module, command: str) -> Command:
    """A command's functions, by the group modules' naming convention."""
    name = command.replace("-", "_")
    return (getattr(module, f"add_{name}_parser"), getattr(module, f"cmd_{name}"),
            getattr(module, f"print_{name}"))


# every one-shot subcommand, in the order of `archplace --help` (serve, a server, is handled apart)
COMMANDS = {command: _entry(module, command) for command, module in (
    ("models", graphs), ("graph", graphs), ("estimate", graphs), ("place", placement),
    ("solve-dp", placement), ("search", searching), ("place-ops", operator_placement),
    ("partition", partitioning), ("tune-rl", tune_rl), ("pipeline", pipelining), ("profile", profiling),
    ("report", searching), ("shard", sharding), ("plan", planning))}


def build_parser() -> argparse.ArgumentParser:
    p = vocabulary.Parser(prog="archplace", description=__doc__.split("\n")[0])
    p.add_argument("--no-cache", action="store_true",
                   help="capture every model graph again instead of reading ~/.cache/archplace/graphs (as "
                        "ARCHPLACE_CACHE_DIR='' does; the Ray workers this command starts inherit it)")
    sub = p.add_subparsers(dest="command", required=True)
    for add, _, _ in COMMANDS.values():
        add(sub)
    serve.add_parser(sub)
    return p


# request fields whose flag is not "--" + the field with "-" for "_"
# (and vocabulary.field_flag: the renamed ones, some per command)
FLAGS = {"model": "MODEL", "models": "MODEL", "file": "FILE", "out_dir": "--out", "hbm_gb": "--hbm",
         "contention": "--no-contention",
         "wait_timeout_s": "--wait-timeout", "area_bucket_mm2": "--area-bucket"}


def _flag(field: str, args=None) -> str:
    command = getattr(args, "command", "")
    return (vocabulary.field_flag(command, field, args) or FLAGS.get(field)
            or "--" + field.replace("_", "-"))


# what a command does first (status.py prints it once the command has run a second)
FIRST_PHASE = {"models": "listing the models", "graph": "building the graph",
               "report": "reading the evaluations and writing report.md",
               "solve-dp": "solving the max-load split"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None:   # the program: SIGTERM or Ctrl-C at any moment ends it in seconds, in one line
        ray_connect.install_stop_handlers(f"archplace {args.command}")
    if args.no_cache:  # in the environment, so the Ray workers this process starts inherit it
        os.environ["ARCHPLACE_CACHE_DIR"] = ""
    if args.command == "serve":   # a long-running server (or its token commands), not a one-shot result
        try:
            with status.Status("serve", "checking the configuration", enabled=argv is None):
                rc = serve.run(args)
            ray_connect.stopping()   # done: a signal while the process exits is noted, not raised
            return rc
        except KeyboardInterrupt as e:   # stopped while starting (serving, it shuts down by itself)
            return stopped(args.command, e)
        except (ValueError, OSError, TimeoutError) as e:
            print(f"archplace serve: error: {e}", file=sys.stderr)
            return 2
    _, run, show = COMMANDS[args.command]
    # phase lines on stderr when run as the program (argv None); a caller passing argv gets results
    # and errors only, as before
    try:
        with status.Status(args.command, FIRST_PHASE.get(args.command, "checking the input"),
                           enabled=argv is None):
            res = run(args)
    except KeyboardInterrupt as e:
        return stopped(args.command, e)
    except api.InvalidRequest as e:  # the API names request fields; the CLI user knows the flags
        print(f"archplace {args.command}: error: {e.render({f: _flag(f, args) for f in e.fields})}",
              file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"archplace {args.command}: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.json:
            print(json.dumps(api.strict_json(res), default=str, allow_nan=False))
        else:
            show(res)
    except BrokenPipeError:  # `archplace ... | head`: the reader left, nothing is wrong
        sys.stderr.close()
    except KeyboardInterrupt as e:   # stopped while printing the result
        return stopped(args.command, e)
    ray_connect.stopping()   # done: a signal while the process exits (Ray's shutdown) is noted, not raised
    return partitioning.exit_status(res) if args.command == "partition" else 0  # 1: no partition fits


def stopped(command: str, e: KeyboardInterrupt) -> int:
    """SIGTERM or Ctrl-C stopped the command: the embedded Ray and every process this one started go
    (the watchdog of ``ray_connect.install_stop_handlers`` bounds it), then one line, and exit status
    128 + the signal (130 for Ctrl-C, 143 for SIGTERM). What a search stored stays (``--resume``)."""
    hint = getattr(e, "hint", None)
    if ray_connect.stop_handlers_installed():
        ray_connect.stopping()   # later signals wait for this clean-up instead of cutting it short
        ray_connect.shutdown_ray()
    elif hint is None:   # a Python caller's Ctrl-C (main(argv)) is its own, and so is its Ray
        raise e
    signum = ray_connect.stop_signal() or getattr(e, "signum", None) or signal.SIGINT
    ray_connect.say(f"archplace {command}: stopped by {signal.Signals(signum).name}"
                    + (f", {hint}" if hint else ""))
    return 128 + signum
