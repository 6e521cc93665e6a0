"""A Ctrl-C during an append never loses count of a record that reached the disk."""

from __future__ import annotations

import json
import os
import signal

import pytest

import dapq.runs.log as log


def test_an_interrupt_during_an_append_lands_after_the_record_is_written_and_counted(tmp_path, monkeypatch):
    store = log.JsonlLog(tmp_path / "results.jsonl")
    store.append({"key": "a"})
    real_fsync = os.fsync

    def fsync_then_ctrl_c(fd):
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, right after the bytes are durable

    monkeypatch.setattr(log.os, "fsync", fsync_then_ctrl_c)
    # Python's own handler, as a command run from a terminal has; a test run started in the
    # background inherits SIGINT ignored, and an ignored Ctrl-C raises nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            store.append({"key": "b"})
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back
    finally:
        signal.signal(signal.SIGINT, previous)
    # The interrupt still arrives, but only once the record is in the file, the index and the count.
    lines = [json.loads(line)["key"] for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines == ["a", "b"] and "b" in store._keys
    assert log.WRITTEN[store.path] == 2
