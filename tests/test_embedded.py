"""The embedded model's conversion is reused only when the current conversion wrote it.

The conversion itself (20 s, the real GGUF file) is checked in ``tests/slow``; here a stand-in
``convert`` keeps the reuse rule fast to test.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dapq import embedded


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPQ_HOME", str(tmp_path))
    monkeypatch.setattr(embedded, "_gguf_dir", lambda: tmp_path / "gguf")
    calls = []

    def fake_convert(gguf_path, out):
        calls.append(gguf_path)
        (out / "config.json").write_text("{}")
        embedded.write_stamp(out, {})

    monkeypatch.setattr(embedded, "convert", fake_convert)
    return tmp_path, calls


def test_stamp_decides_reuse(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert not embedded.conversion_is_current(d)  # an earlier dapq wrote no stamp
    (d / embedded.STAMP).write_text(json.dumps({"format": embedded.FORMAT - 1}))
    assert not embedded.conversion_is_current(d)
    (d / embedded.STAMP).write_text("{torn")
    assert not embedded.conversion_is_current(d)
    embedded.write_stamp(d, {})
    assert embedded.conversion_is_current(d)
    (d / "config.json").unlink()
    assert not embedded.conversion_is_current(d)


@pytest.mark.parametrize("edit", ["truncate", "same-size edit", "added", "removed"])
def test_an_edited_conversion_is_converted_again_saying_why(home, capsys, monkeypatch, edit):
    root, calls = home
    monkeypatch.setattr(embedded, "_HASHED_SIZE", 8)  # weights.bin stands for the large, mtime-checked file
    real = embedded.convert

    def convert(gguf_path, out):
        (out / "weights.bin").write_bytes(b"0123456789abcdef")
        (out / "tokenizer.json").write_text('{"v": 1}')
        real(gguf_path, out)

    monkeypatch.setattr(embedded, "convert", convert)
    target = embedded.embedded_model_dir()
    assert embedded.conversion_is_current(target) and capsys.readouterr().err == ""
    if edit == "truncate":
        (target / "weights.bin").write_bytes(b"01234567")
        changed = "weights.bin"
    elif edit == "same-size edit":
        (target / "tokenizer.json").write_text('{"v": 2}')
        changed = "tokenizer.json"
    elif edit == "added":
        (target / "extra.txt").write_text("x")
        changed = "extra.txt"
    else:
        (target / "config.json").unlink()
        changed = "config.json"
    assert not embedded.conversion_is_current(target)
    assert embedded.embedded_model_dir() == target and len(calls) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and changed in err and "converting the embedded model again" in err
    assert embedded.conversion_is_current(target) and (target / "weights.bin").read_bytes() == b"0123456789abcdef"


def test_stale_conversion_is_rebuilt_with_one_notice(home, capsys):
    root, calls = home
    stale = root / "models" / embedded.EMBEDDED_MODEL
    stale.mkdir(parents=True)
    (stale / "config.json").write_text('{"old": true}')
    (stale / "tokenizer_config.json").write_text('{"tokenizer_class": "CodeLlamaTokenizer"}')
    assert embedded.embedded_model_dir() == stale
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "older dapq conversion" in err
    assert len(calls) == 1 and embedded.conversion_is_current(stale)
    assert not (stale / "tokenizer_config.json").exists()  # nothing of the old conversion survives
    assert embedded.embedded_model_dir() == stale  # reused: no second conversion, no notice
    assert len(calls) == 1 and capsys.readouterr().err == ""


def test_first_conversion_is_silent_and_leaves_no_temporary(home, capsys):
    root, calls = home
    target = embedded.embedded_model_dir()
    assert capsys.readouterr().err == "" and len(calls) == 1
    lock = f".{embedded.EMBEDDED_MODEL}.lock"
    assert sorted(p.name for p in target.parent.iterdir()) == [lock, embedded.EMBEDDED_MODEL]


def test_workers_starting_together_convert_once(home, monkeypatch):
    # Without the lock each thread sees no conversion, converts, and the later ones remove the
    # directory the first one returned (or fail to rename onto it).
    root, calls = home
    fast = embedded.convert

    def slow_convert(gguf_path, out):
        time.sleep(0.2)
        fast(gguf_path, out)

    monkeypatch.setattr(embedded, "convert", slow_convert)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: embedded.embedded_model_dir(), range(4)))
    assert len(calls) == 1
    assert len(set(paths)) == 1 and embedded.conversion_is_current(paths[0])


def test_an_unwritable_home_is_one_error_not_a_traceback(home, monkeypatch):
    tmp_path, calls = home
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DAPQ_HOME", str(tmp_path / "a-file" / "home"))  # mkdir under a file fails
    with pytest.raises(embedded.DapqError, match="cannot write the converted embedded model.*set DAPQ_HOME"):
        embedded.embedded_model_dir()
    assert calls == []
