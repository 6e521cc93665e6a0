"""Append-only JSON-lines logs: fsynced appends, torn-line recovery and an exclusive lock.

The storage every resumable dapq output shares: a sweep's results store
(:class:`dapq.bench.store.ResultsStore`) and a bulk generation's output
(:class:`dapq.bulk.GenerationLog`). A line torn by a kill in mid-write can only be the last one: it
is dropped with a warning. Any other unreadable line, or a file that is not of the log's kind, is
an error; a log never overwrites what it does not understand.

A log opened for writing holds an exclusive lock (``flock``) for as long as it is open: a second
process pointed at the same output is refused at once instead of writing the same records twice.
The kernel drops the lock when the holding process dies, so a killed run never leaves a stale
lock behind. Readers take no lock and never modify the file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import DapqError

LOCKNAME = ".lock"

# Errors that mean "no room to write here": a full disk or quota, a file system gone read-only.
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}

# Records appended by this process, per file: what an interrupted command reports as kept.
WRITTEN: dict[Path, int] = {}


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back while a record is written and counted.

    Python raises KeyboardInterrupt between any two bytecodes, so without this an interrupt could
    land after the record is on disk but before :data:`WRITTEN` counts it (the run would report
    one record fewer than it kept), or in mid-write (a torn line). A thread's signal mask cannot
    hold it (torch's threads would take the signal), so the handler itself is swapped for one that
    only notes the signal, and the noted signal is handed to the previous handler once the append
    is complete. Python runs signal handlers in the main thread only, so an append from another
    thread cannot be interrupted and needs nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted:
        if callable(previous):
            previous(signal.SIGINT, None)  # Python's default handler: KeyboardInterrupt, here
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


# One open lock per locked file and process, shared by every writer object of this process: flock
# locks belong to an open file description, so a second open() in the same process would refuse
# itself. Several writers inside one process (an ablation opens its store twice) are the caller's
# business; the lock keeps out other processes.
_HELD: dict[tuple[int, int], list] = {}  # (st_dev, st_ino) -> [fd, holders]


def _acquire(lock_path: Path, what: str) -> tuple[int, int]:
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a directory given as the output file, a parent that is a file, no permission
        raise DapqError(f"{what}: cannot write here ({exc.strerror})") from None
    st = os.fstat(fd)
    ident = (st.st_dev, st.st_ino)
    if ident in _HELD:
        os.close(fd)
        _HELD[ident][1] += 1
        return ident
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DapqError(f"{what}: another dapq process is writing here (it holds {lock_path}); "
                            "wait for it to finish or choose another output") from None
        raise
    if not _names(lock_path, ident):
        # Deleted or replaced between our open() and flock(): the lock we hold guards nothing.
        os.close(fd)
        raise DapqError(f"{what}: the output was removed while opening it; run again")
    _HELD[ident] = [fd, 1]
    return ident


def _names(path: Path, ident: tuple[int, int]) -> bool:
    """Whether ``path`` still names the file whose (st_dev, st_ino) is ``ident``."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == ident


def _release(ident: tuple[int, int]) -> None:
    entry = _HELD.get(ident)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _HELD[ident]
        os.close(entry[0])  # closing the last descriptor drops the flock


class JsonlLog:
    """Append-only JSON lines keyed by one field: fsynced appends, torn-line recovery, a lock.

    Parameters
    ----------
    path : path
        The JSONL file.
    lock_path : path, optional
        File to ``flock`` while this object is open for writing (None: no lock).
    writable : bool
        Open for appending: take the lock and cut a torn last line. A read-only log takes no
        lock and leaves the file as it found it (a running writer may be in mid-line).

    Subclasses set ``key_field`` (the field that identifies a record), ``header`` (a first line
    that marks the file as theirs, or None), ``required`` (fields every record must have) and
    ``kind`` (what the file is, for messages).
    """

    key_field = "key"
    header: dict | None = None
    required: tuple[str, ...] = ()
    kind = "dapq record"

    def __init__(self, path: str | Path, *, lock_path: str | Path | None = None, writable: bool = True):
        self.path = Path(path)
        self.writable = writable
        self.records: list[dict] = []
        self._keys: dict = {}  # key -> index in records
        self._finalizer = None
        self._lock: tuple[Path, tuple[int, int]] | None = None
        if writable and lock_path is not None:
            lock_path = Path(lock_path)
            ident = _acquire(lock_path, str(self.path.parent if lock_path.name == LOCKNAME else self.path))
            self._finalizer = weakref.finalize(self, _release, ident)
            self._lock = (lock_path, ident)
        try:
            if self.path.exists():
                self._load()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the lock (also done when the object is garbage-collected or the process ends)."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _load(self) -> None:
        raw = self.path.read_bytes()
        if self.header is not None and (json.dumps(self.header) + "\n").encode().startswith(raw):
            # Empty, or a header cut short: a run killed before its first record was durable. It
            # holds nothing; the next append writes the header again.
            if raw and self.writable:
                with open(self.path, "r+b") as fh:
                    fh.truncate(0)
            return
        *body, tail = raw.split(b"\n")  # a complete file ends with a newline: tail == b""
        first = 1
        if self.header is not None:
            if not body or not body[0].strip():
                raise DapqError(f"{self.path}: empty or not a {self.kind} file")
            self._check_header(parse_line(body[0], self.path, 1, self.kind))
            first = 2
        for number, line in enumerate(body[first - 1 :], start=first):
            record = self._record(line)
            if record is None:
                raise DapqError(f"{self.path}:{number}: corrupt record (refusing to continue)")
            self._add(record)
        duplicates = len(body) - first + 1 - len(self.records)
        if duplicates:
            # Two writers on one output (only possible before the lock checked the path) leave a
            # key twice: each key counts once, its last record, in a resume and in a report.
            print(f"dapq: warning: {self.path} holds {duplicates} duplicate record(s); counting each key "
                  "once (its last record)", file=sys.stderr)
        if tail and (record := self._record(tail)) is not None:
            # A whole record whose newline never reached the disk (or an editor that drops the
            # last newline): keep it, and complete its line before anything is appended.
            self._add(record)
            if self.writable:
                with open(self.path, "ab") as fh:
                    fh.write(b"\n")
        elif tail:
            # Only a kill in mid-write leaves text after the last newline: that record runs again.
            if self.writable:
                print(f"dapq: warning: dropping a torn last line of {self.path}", file=sys.stderr)
                with open(self.path, "r+b") as fh:
                    fh.truncate(len(raw) - len(tail))
            else:
                print(f"dapq: warning: ignoring an unfinished last line of {self.path}", file=sys.stderr)

    def _record(self, line: bytes) -> dict | None:
        """The record on one line under today's names, or None if the line is not a whole record."""
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if not isinstance(record, dict) or any(f not in record for f in (self.key_field, *self.required)):
            return None
        return self.upgrade(record)

    def _add(self, record: dict) -> None:
        key = record[self.key_field]
        if key in self._keys:
            self.records[self._keys[key]] = record
        else:
            self._keys[key] = len(self.records)
            self.records.append(record)

    def upgrade(self, record: dict) -> dict:
        """A record as read from the file, under the names of today's code (subclasses map old ones)."""
        return record

    def _check_header(self, header) -> None:
        if not isinstance(header, dict) or header.get("format") != self.header["format"]:
            raise DapqError(f"{self.path}: not a {self.kind} file (refusing to touch it)")

    def __contains__(self, key) -> bool:
        return key in self._keys

    def get(self, key) -> dict | None:
        """The record with this key, or None."""
        index = self._keys.get(key)
        return None if index is None else self.records[index]

    def __iter__(self) -> Iterator[dict]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def append(self, record: dict) -> None:
        """Write one record durably before returning."""
        if not self.writable:
            raise DapqError(f"{self.path}: opened read-only")
        if self.key_field not in record:
            raise ValueError(f"record needs a {self.key_field}")
        if self._lock is not None and not _names(*self._lock):
            # The output was deleted (or replaced) under us: our flock now guards a file nobody
            # can reach, and a second run may already be writing a new one. Stop rather than
            # append to a file we no longer hold.
            raise DapqError(f"{self.path}: the output was deleted or replaced while this run wrote it; "
                            "stopping (run again to resume from what is there)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        size = self.path.stat().st_size if self.path.exists() else 0
        text = json.dumps(record, default=str) + "\n"
        if size == 0 and self.header is not None:
            text = json.dumps(self.header) + "\n" + text
        with _interrupts_held():
            try:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                if exc.errno not in _NO_ROOM:
                    raise
                self._cut(size)
                raise DapqError(f"{self.path}: cannot write ({exc.strerror}); the {len(self)} records before it "
                                "are kept, and the same command resumes once there is room") from None
            self._add(record)
            WRITTEN[self.path] = WRITTEN.get(self.path, 0) + 1

    def _cut(self, size: int) -> None:
        """Remove a partly written line (best effort: the next open drops a torn line anyway)."""
        try:
            os.truncate(self.path, size)
        except OSError:
            pass


def json_objects(path: Path, what: str) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines input file.

    Any line that is not UTF-8, not JSON or not an object is a :class:`DapqError` naming the file,
    the line and ``what`` the file should hold: user data fails in one line, before any work.
    """
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DapqError(f"{path}:{number}: not UTF-8 text ({what})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DapqError(f"{path}:{number}: not valid JSON ({what}: {exc.msg})") from None
            if not isinstance(row, dict):
                raise DapqError(f"{path}:{number}: expected a JSON object ({what})")
            yield number, row


def parse_line(line: bytes, path: Path, number: int, what: str):
    try:
        return json.loads(line)
    except ValueError:
        raise DapqError(f"{path}:{number}: not a {what} file (refusing to touch it)") from None
