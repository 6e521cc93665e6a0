"""The results store of a sweep: one JSON record per finished cell, appended and fsynced.

``results.jsonl`` starts with a header line that marks it as a dapq results file; each further
line is one finished cell. A re-run with the same arguments skips the cells whose key is already
there, so an interrupted sweep (Ctrl-C or a killed process) loses nothing that had finished. A
line torn by a kill in mid-write can only be the last one: it is dropped with a warning. Any
other unreadable line, or a file that is not a dapq results file, is an error; the store never
overwrites what it does not understand.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import DapqError

FORMAT = "dapq-results"
VERSION = 1
FILENAME = "results.jsonl"


def cell_key(**fields) -> str:
    """A stable key for one cell from everything that determines its result."""
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


class ResultsStore:
    """Append-only JSONL results of one output directory."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        if self.dir.exists() and not self.dir.is_dir():
            raise DapqError(f"{self.dir}: exists and is not a directory (give an output directory)")
        self.path = self.dir / FILENAME
        self.records: list[dict] = []
        self._keys: set[str] = set()
        if self.path.exists():
            self._load()

    @classmethod
    def open_existing(cls, out_dir: str | Path) -> ResultsStore:
        path = Path(out_dir) / FILENAME
        if not path.is_file():
            raise DapqError(f"{out_dir}: no {FILENAME} here")
        return cls(out_dir)

    def _load(self) -> None:
        raw = self.path.read_bytes()
        *body, tail = raw.split(b"\n")  # a complete file ends with a newline: tail == b""
        if not body or not body[0].strip():
            raise DapqError(f"{self.path}: empty or not a dapq results file")
        header = _parse(body[0], self.path, 1)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise DapqError(f"{self.path}: not a dapq results file (refusing to touch it)")
        if header.get("version") != VERSION:
            raise DapqError(f"{self.path}: results format version {header.get('version')}, expected {VERSION}")
        for number, line in enumerate(body[1:], start=2):
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or "key" not in record:
                    raise ValueError("no key")
            except ValueError:
                raise DapqError(f"{self.path}:{number}: corrupt record (refusing to continue)") from None
            self.records.append(record)
            self._keys.add(record["key"])
        if tail:
            # Only a kill in mid-write leaves text after the last newline: that cell re-runs.
            print(f"dapq: warning: dropping a torn last line of {self.path}", file=sys.stderr)
            with open(self.path, "r+b") as fh:
                fh.truncate(len(raw) - len(tail))

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def get(self, key: str) -> dict | None:
        """The record of a finished cell, or None."""
        if key not in self._keys:
            return None
        return next(r for r in reversed(self.records) if r["key"] == key)

    def __iter__(self) -> Iterator[dict]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def append(self, record: dict) -> None:
        """Write one finished cell durably before returning."""
        if "key" not in record:
            raise ValueError("record needs a key")
        self.dir.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        with open(self.path, "a", encoding="utf-8") as fh:
            if new:
                fh.write(json.dumps({"format": FORMAT, "version": VERSION}) + "\n")
            fh.write(json.dumps(record, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.records.append(record)
        self._keys.add(record["key"])


def _parse(line: bytes, path: Path, number: int):
    try:
        return json.loads(line)
    except ValueError:
        raise DapqError(f"{path}:{number}: not a dapq results file (refusing to touch it)") from None
