"""Reading benchmark data in the official layouts: local files, or the Hugging Face hub.

Every problem with a file (missing, not JSON, a row without a field it needs) is a
:class:`~dapq.errors.DapqError` whose one line names the file and what was expected there.
``datasets`` is imported only by :func:`hub_rows`, i.e. only for ``--data hub``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ...errors import DapqError, first_line
from ...runs.log import json_objects
from .base import TaskArgs

HUB = "hub"


def data_root(args: TaskArgs) -> Path | None:
    """``--data``: a directory, or None for ``--data hub``."""
    if args.data is None:
        raise DapqError("this task set needs --data DIR (the benchmark's own data folder) or --data hub")
    if args.data == HUB:
        return None
    path = Path(args.data).expanduser()
    if not path.is_dir():
        raise DapqError(f"{args.data}: no such data directory")
    return path


def locate(root: Path, relative: str) -> Path:
    """``root/relative``, or ``root/data/relative`` when ``root`` is the folder above ``data/``.

    The download scripts unpack into a ``data/`` folder; either it or its parent may be given.
    A file found in neither place is reported at the path where it was expected.
    """
    for base in (root, root / "data"):
        if (base / relative).exists():
            return base / relative
    return root / "data" / relative if (root / "data").is_dir() else root / relative


def read_jsonl(path: Path, what: str) -> list[dict]:
    """The JSON objects of a JSON-lines file; ``what`` says what the file should be."""
    if not path.is_file():
        raise DapqError(f"{path}: missing ({what})")
    rows = [row for _, row in json_objects(path, what)]
    if not rows:
        raise DapqError(f"{path}: empty ({what})")
    return rows


def read_json_list(path: Path, what: str) -> list[dict]:
    """A JSON file holding a list of objects (LongBench v2's ``data.json``)."""
    if not path.is_file():
        raise DapqError(f"{path}: missing ({what})")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise DapqError(f"{path}: not valid JSON ({what})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DapqError(f"{path}: expected a JSON list of objects ({what})")
    if not rows:
        raise DapqError(f"{path}: empty ({what})")
    return rows


def require(rows: list[dict], fields: Iterable[str], source: object, what: str) -> list[dict]:
    """Check that every row has ``fields`` (dotted names reach into nested objects)."""
    for number, row in enumerate(rows, start=1):
        for name in fields:
            value: object = row
            for part in name.split("."):
                if not isinstance(value, dict) or part not in value:
                    raise DapqError(f"{source}: row {number} has no field {name!r} ({what})")
                value = value[part]
    return rows


def require_list(rows: list[dict], name: str, source: object, what: str, *, nonempty: bool = True) -> None:
    """Check that field ``name`` of every row is a list (of at least one item)."""
    for number, row in enumerate(rows, start=1):
        value = row.get(name)
        if not isinstance(value, list) or (nonempty and not value):
            raise DapqError(f"{source}: row {number}: field {name!r} must be a {'non-empty ' if nonempty else ''}"
                            f"list ({what})")


def hub_rows(repo: str, name: str | None, split: str, **kwargs) -> list[dict]:
    """Rows of a hub dataset through ``datasets`` (the optional ``hub`` extra)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise DapqError("--data hub needs the `datasets` package (pip install 'dapq[hub]')") from None
    try:
        return [dict(row) for row in load_dataset(repo, name, split=split, **kwargs)]
    except Exception as exc:  # network and hub errors come in many types
        detail = first_line(exc, type(exc).__name__)
        raise DapqError(f"cannot load {repo}{f' ({name})' if name else ''} split {split} from the hub: {detail}") from None
