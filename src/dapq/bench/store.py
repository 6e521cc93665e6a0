"""The results store of a sweep: a locked, append-only JSONL log (:mod:`dapq.runs.log`) of cells.

``DIR/results.jsonl`` starts with a header line that marks it as a dapq results file; each further
line is one finished cell. A re-run with the same arguments skips the cells whose key is already
there, so an interrupted sweep (Ctrl-C or a killed process) loses nothing that had finished. While
a sweep writes, ``DIR/.lock`` keeps a second writer out; readers (``dapq report``) take no lock.
Records written before the one-name-per-idea rename are read under today's names
(:mod:`dapq.methods.legacy`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import DapqError
from ..methods.legacy import upgrade_record
from ..runs.log import LOCKNAME, JsonlLog

FORMAT = "dapq-results"
VERSION = 1
FILENAME = "results.jsonl"


def cell_key(**fields) -> str:
    """A stable key for one cell from everything that determines its result."""
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


class ResultsStore(JsonlLog):
    """Append-only JSONL results of one output directory, locked while open for writing."""

    header = {"format": FORMAT, "version": VERSION}
    kind = "dapq results"

    def __init__(self, out_dir: str | Path, *, writable: bool = True):
        self.dir = Path(out_dir)
        if self.dir.exists() and not self.dir.is_dir():
            raise DapqError(f"{self.dir}: exists and is not a directory (give an output directory)")
        super().__init__(self.dir / FILENAME, lock_path=self.dir / LOCKNAME, writable=writable)

    def upgrade(self, record: dict) -> dict:
        """Records written before the one-name-per-idea rename, under today's names."""
        return upgrade_record(record)

    @classmethod
    def open_existing(cls, out_dir: str | Path) -> ResultsStore:
        """Open a sweep's results read-only (no lock: a sweep may be writing them right now)."""
        path = Path(out_dir) / FILENAME
        if not path.is_file():
            raise DapqError(f"{out_dir}: no {FILENAME} here")
        return cls(out_dir, writable=False)

    def _check_header(self, header) -> None:
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise DapqError(f"{self.path}: not a dapq results file (refusing to touch it)")
        if header.get("version") != VERSION:
            raise DapqError(f"{self.path}: results format version {header.get('version')}, expected {VERSION}")


