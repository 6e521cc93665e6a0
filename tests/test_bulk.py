"""Bulk generation (`dapq generate --input/--output`): validation, resume, the --json fields, the lock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapq.bulk import GenerationLog
from dapq.errors import DapqError

from conftest import TOKENIZER
from helpers import lock_held_by_another_process, run_cli, save_tiny

REQUESTS = [
    {"id": "a", "prompt": "The grass is green. The sky is blue. What color is the sky?"},
    {"id": 2, "messages": [{"role": "user", "content": "Paris is the capital of France."}], "method": "snapkv"},
    {"id": "c", "prompt": "One of the special magic numbers for sleepy-owl is: 4817263.", "method": "full"},
    {"id": "d", "prompt": "There and back again. The sun is yellow.", "keep_fraction": 0.5},
    {"id": "e", "prompt": "Berlin is the capital of Germany. 0123456789 Here we go.", "budget": 6,
     "method": "dapq(n_pseudo=4)"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("model"), TOKENIZER, max_position_embeddings=1024)


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_resume_skips_finished_ids_and_matches_single_runs(model_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", REQUESTS)
    out = tmp_path / "out.jsonl"
    common = ["generate", "--model", model_dir, "--input", src, "--output", str(out), "--budget", "8",
              "--max-new-tokens", "6"]
    assert run_cli(capsys, *common, "--batch-size", "2")[0] == 0
    first = out.read_text().splitlines()
    assert len(first) == len(REQUESTS)
    out.write_text("\n".join(first[:3]) + '\n{"id": "d", "text": "tor')  # killed in mid-line
    code, _, err = run_cli(capsys, *common)
    assert code == 0 and "torn" in err and "2 generated, 3 already" in err
    again = out.read_text().splitlines()
    assert again[:3] == first[:3]
    assert {json.loads(x)["id"]: json.loads(x)["text"] for x in again} == {
        json.loads(x)["id"]: json.loads(x)["text"] for x in first}
    assert run_cli(capsys, *common)[0] == 0 and out.read_text().splitlines() == again  # nothing left to do
    # Each record equals `dapq generate --json` on that request alone, plus its id.
    by_id = {json.loads(x)["id"]: json.loads(x) for x in again}
    code, alone, _ = run_cli(capsys, "generate", "--model", model_dir, "--prompt", REQUESTS[3]["prompt"],
                             "--keep-fraction", "0.5", "--max-new-tokens", "6", "--json")
    alone = json.loads(alone)
    assert set(by_id["d"]) == set(alone) | {"id", "settings"}
    assert {k: by_id["d"][k] for k in ("text", "token_ids", "budget", "keep_fraction", "kept_tokens_per_head", "config")} == {
        k: alone[k] for k in ("text", "token_ids", "budget", "keep_fraction", "kept_tokens_per_head", "config")}
    assert by_id["e"]["config"]["n_pseudo"] == 4 and by_id["e"]["budget"] == 6
    assert by_id[2]["method"] == "snapkv" and by_id[2]["budget"] == 8 and by_id["c"]["method"] == "full"


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"prompt": "x"}', "missing id"),
    ('{"id": "a", "prompt": "x"}', "duplicate id 'a' (first on line 1)"),
    ('{"id": "z"}', "exactly one of prompt and messages"),
    ('{"id": "z", "prompt": "x", "messages": []}', "exactly one of prompt and messages"),
    ('{"id": "z", "messages": [{"role": "user"}]}', "string content"),
    ('{"id": "z", "prompt": "x", "method": "bogus"}', "unknown method"),
    ('{"id": "z", "prompt": "x", "budget": 0}', "budget must be"),
    ('{"id": "z", "prompt": "x", "budget": 8, "keep_fraction": 0.5}', "not both"),
    ('[1, 2]', "JSON object"),
    ('{"id": "z", "prompt": "x", "keep_fraction": "0.5"}', "keep_fraction must be a number"),
    ('{"id": "z", "prompt": "x", "budget": true}', "budget must be an integer"),
    ('{"id": "z", "prompt": "x", "budget": [8]}', "budget must be an integer"),
    ('{"id": "z", "prompt": "caf\\u00e9"}', "not UTF-8"),
])
def test_a_bad_request_names_its_line(model_dir, tmp_path, capsys, line, message):
    src = _write(tmp_path / "in.jsonl", [REQUESTS[0], line])
    if "not UTF-8" in message:  # the same line saved as Latin-1
        (tmp_path / "in.jsonl").write_bytes(open(src, "rb").read().replace(b"caf\\u00e9", "café".encode("latin-1")))
    out = tmp_path / "out.jsonl"
    code, _, err = run_cli(capsys, "generate", "--model", model_dir, "--input", src, "--output", str(out),
                           "--budget", "8")
    assert code == 2 and err.count("\n") == 1 and "in.jsonl:2: " in err and message in err, err
    assert not out.exists()  # checked before anything is loaded or written


def test_bad_bulk_options(model_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", REQUESTS[:1])
    for args, message in [
        (["--input", src], "both --input and --output"),
        (["--input", src, "--output", src], "must not be the --input"),
        (["--input", src, "--output", str(tmp_path / "o"), "--prompt", "x"], "not both"),
        (["--input", str(tmp_path / "none.jsonl"), "--output", str(tmp_path / "o")], "no such file"),
        (["--prompt", "x", "--ray"], "--gpus-per-worker run bulk generation"),
        (["--input", src, "--output", str(tmp_path)], "cannot write here"),
        (["--input", src, "--output", str(Path(src) / "o.jsonl")], "cannot write here"),
    ]:
        code, _, err = run_cli(capsys, "generate", "--model", model_dir, "--budget", "8", *args)
        assert code == 2 and message in err and err.count("\n") == 1, (args, err)
    foreign = _write(tmp_path / "foreign.jsonl", [{"something": "else"}])
    code, _, err = run_cli(capsys, "generate", "--model", model_dir, "--budget", "8", "--input", src,
                           "--output", foreign)
    assert code == 2 and "foreign.jsonl:1: corrupt record" in err


def test_the_output_is_locked_against_a_second_writer(model_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", REQUESTS[:1])
    out = tmp_path / "out.jsonl"
    with lock_held_by_another_process("from dapq.bulk import GenerationLog\nlog = GenerationLog(sys.argv[1])", out):
        code, _, err = run_cli(capsys, "generate", "--model", model_dir, "--budget", "8", "--input", src,
                               "--output", str(out))
        assert code == 2 and "another dapq process is writing" in err and err.count("\n") == 1
        assert out.read_text() == ""
    assert run_cli(capsys, "generate", "--model", model_dir, "--budget", "8", "--input", src, "--output",
                   str(out), "--max-new-tokens", "4")[0] == 0
    assert [r["id"] for r in GenerationLog(out, writable=False)] == ["a"]


def test_a_deleted_output_stops_its_writer_and_a_last_line_without_newline_is_kept(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    first = GenerationLog(out)
    first.append({"id": "a", "text": "x"})
    out.unlink()  # deleted in mid-run: the first writer's lock now guards nothing
    second = GenerationLog(out)
    second.append({"id": "a", "text": "y"})
    with pytest.raises(DapqError, match="deleted or replaced"):
        first.append({"id": "b", "text": "x"})
    second.close()
    first.close()
    with open(out, "a") as fh:
        fh.write('{"id": "b", "text": "z"}')  # a whole record whose newline was lost
    assert [(r["id"], r["text"]) for r in GenerationLog(out)] == [("a", "y"), ("b", "z")]
    assert out.read_text().endswith('"z"}\n') and "torn" not in capsys.readouterr().err


def test_a_resume_with_other_settings_is_refused_naming_the_requests(model_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", REQUESTS[:3])
    out = tmp_path / "out.jsonl"
    common = ["generate", "--model", model_dir, "--input", src, "--output", str(out), "--budget", "8"]
    assert run_cli(capsys, *common, "--max-new-tokens", "6")[0] == 0
    before = out.read_text()
    for extra, needle in ((["--max-new-tokens", "4"], "max_new_tokens"), (["--method", "h2o"], "method"),
                          (["--budget", "6", "--max-new-tokens", "6"], "budget")):
        code, stdout, err = run_cli(capsys, *common, *extra)
        assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
        assert "finished request(s) were made with other settings" in err and out.read_text() == before
    # "c" names its own method (full): another --method changes only "a", the other two keep theirs.
    code, _, err = run_cli(capsys, *common, "--max-new-tokens", "6", "--method", "h2o")
    assert code == 2 and "1 finished request(s)" in err and "'a' (method)" in err
    code, _, err = run_cli(capsys, *common, "--max-new-tokens", "6", "--dtype", "bfloat16")
    assert code == 2 and "3 finished request(s)" in err and "(dtype)" in err
    # The same settings resume (nothing to do), whatever the decode mode.
    assert run_cli(capsys, *common, "--max-new-tokens", "6", "--decode", "eager")[0] == 0 and out.read_text() == before
