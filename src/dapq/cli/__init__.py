"""The ``dapq`` command line.

Every user error (a :class:`~dapq.errors.DapqError`, a bad option, a missing file) is printed as
one line on stderr with exit code 2; an interrupt exits 130 after one line; tracebacks are kept
for real bugs.

- :mod:`.app`: the typer applications; :mod:`.options`: options and readers shared by commands;
  :mod:`.setup`: loading the model and choosing the executor (local or Ray);
- :mod:`.generate`, :mod:`.bench` (bench, bench speed, report), :mod:`.analyze`, :mod:`.misc`
  (methods, demo): the commands, each registered on import.
"""

from __future__ import annotations

import sys

import typer

from ..errors import DapqError
from ..runs.log import WRITTEN
from . import analyze, bench, generate, misc  # noqa: F401  (registers the commands)
from .app import app

__all__ = ["app", "main"]


def _argv(argv: list[str]) -> list[str]:
    """Spellings typer cannot parse, rewritten: ``bench speed`` and ``--ray=ADDRESS``."""
    if argv[:2] == ["bench", "speed"]:
        # `dapq bench speed` has its own options; typer cannot mix them into the task-set command.
        argv = ["bench-speed", *argv[2:]]
    # typer has no option with an optional value: `--ray` is a flag, `--ray=ADDRESS` is --ray-address.
    if argv[:1] in (["bench"], ["generate"]):  # the commands that have --ray-address
        argv = ["--ray-address=" + a[len("--ray="):] if a.startswith("--ray=") else a for a in argv]
    return argv


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    argv = _argv(list(sys.argv[1:] if argv is None else argv))
    try:
        code = app(args=argv, standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except typer.TyperException as exc:  # usage errors: bad option, bad value, missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        print(f"dapq: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(2)
    except DapqError as exc:
        print(f"dapq: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if isinstance(code, int) and code:
        # Without standalone mode click returns an interrupted run's exit code instead of raising.
        if code == 130:
            _interrupted()
        sys.exit(code)


def _interrupted() -> None:
    """Exit 130 after one line: what this run had finished and kept, and how to go on."""
    kept = ", ".join(f"{n} in {path}" for path, n in WRITTEN.items()) or "nothing new"
    print(f"dapq: interrupted; kept what had finished ({kept}); the same command resumes", file=sys.stderr)
    sys.exit(130)
