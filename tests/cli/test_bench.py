"""`dapq bench` and `dapq report`: sweeps from the command line, and every bad input -> one line, exit 2."""

from __future__ import annotations

import pytest

from helpers import run_cli

run = run_cli


@pytest.mark.parametrize("args,needle", [
    (["nope"], "unknown task set"),
    (["niah", "--lengths", "100000"], "longer than the model's context"),
    (["longbench", "--data", "/no/such/dir"], "no such data directory"),
    (["niah", "--budgets", "64,abc"], "budgets must be integers"),
    (["niah", "--methods", "full,bogus"], "unknown method"),
    (["niah", "--methods", "dapq(preset='nope')"], "no preset"),
    (["niah", "--decode-batch", "0"], "--decode-batch"),
    (["niah", "--compress", "question"], "--compress must be one of prompt, context"),
    (["niah", "--keep-fractions", "0.5,1.5"], "kept fractions must lie in (0, 1)"),
    (["niah", "--methods", "full,kvpress:"], "cannot parse method"),
    (["niah", "--methods", "snapkv(window=x)"], "bad parameter"),
    (["niah", "--lengths", "200", "--depths", "0.001,0.004"], "two samples share the id"),
    (["niah", "--depths", "0,1.5"], "--depths must lie in [0, 1]"),
    (["niah", "--depths", "-0.1"], "--depths must lie in [0, 1]"),
    (["niah", "--samples", "0"], "--samples must be >= 1"),
    (["niah", "--workers", "2"], "need --ray"),
    (["niah", "--ray=somewhere:6379", "--workers", "0"], "--workers must be >= 1"),  # --ray=ADDR is parsed
])
def test_bench_bad_input(capsys, model_dir, tmp_path, args, needle):
    code, _, err = run(capsys, "bench", *args, "--model", model_dir, "--out", str(tmp_path / "o"))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_bench_context_mode_with_ratios(capsys, model_dir, tmp_path):
    out = tmp_path / "ctx"
    code, stdout, err = run(capsys, "bench", "niah", "--model", model_dir, "--lengths", "200", "--depths", "0.5",
                            "--samples", "1", "--methods", "full,dapq", "--keep-fractions", "0.5", "--compress", "context",
                            "--out", str(out))
    assert code == 0, err
    assert "| method | budget | compress | NIAH |" in stdout and "| dapq | 50% | context |" in stdout
    assert "| dapq | 64 |" not in stdout  # --keep-fractions alone: no default budgets


def test_bench_out_is_a_file(capsys, model_dir, tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("mine\n")
    code, _, err = run(capsys, "bench", "niah", "--model", model_dir, "--out", str(path))
    assert code == 2 and "not a directory" in err and len(err.strip().splitlines()) == 1, err
    assert path.read_text() == "mine\n"


def test_bench_bad_data_file_is_one_line(capsys, model_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "trec.jsonl").write_text('{"input": "q", "context": "c"}\n')
    code, _, err = run(capsys, "bench", "longbench", "--data", str(tmp_path), "--tasks", "trec", "--model", model_dir,
                       "--out", str(tmp_path / "o"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{data / 'trec.jsonl'}: row 1 has no field 'answers'" in err
    code, _, err = run(capsys, "bench", "helmet", "--data", str(tmp_path), "--tasks", "kilt_nq", "--model", model_dir,
                       "--out", str(tmp_path / "o"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "kilt/nq-dev-multikilt_1000_k50_dep6.jsonl: missing" in err


def test_bench_then_report(capsys, model_dir, tmp_path):
    out = tmp_path / "sweep"
    args = ["bench", "niah", "--model", model_dir, "--lengths", "200", "--depths", "0,1", "--samples", "1",
            "--methods", "full,dapq", "--budgets", "16", "--out", str(out)]
    code, stdout, err = run(capsys, *args)
    assert code == 0, err
    assert "| full | all |" in stdout and "| dapq | 16 |" in stdout
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 4
    code, stdout, _ = run(capsys, *args)  # a re-run finds every cell done
    assert code == 0 and (out / "results.jsonl").read_text().splitlines() == lines
    code, stdout, err = run(capsys, "report", str(out))
    assert code == 0 and "## niah" in stdout and (out / "niah-budget.png").exists()
    code, _, err = run(capsys, "report", str(tmp_path / "empty"))
    assert code == 2 and "no results.jsonl" in err


def test_an_interrupted_bench_exits_130_keeps_its_records_and_resumes(model_dir, tmp_path):
    import json
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "dapq.cli", "bench", "niah", "--model", model_dir, "--lengths", "200", "--depths",
            ",".join(str(d / 10) for d in range(11)), "--samples", "60", "--methods", "full,dapq,snapkv,h2o",
            "--budgets", "16,32,48", "--out", str(out)]  # 660 prompts: minutes, far longer than the wait below
    # A child of a background job starts with SIGINT ignored (and Python then installs no
    # KeyboardInterrupt handler): give it the default disposition, as a terminal's Ctrl-C would find.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not results.exists() or results.read_text().count("\n") < 4):
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=60)
    kept = [json.loads(line)["key"] for line in results.read_text().splitlines()[1:]]
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("dapq: interrupted; kept what had finished (")
    assert f"{len(kept)} in {results}" in err and "Traceback" not in err and "| full |" not in stdout
    # The same command resumes: the kept records stay as they were, and each key is written once.
    resume = [a if a != "60" else "2" for a in args[:-6]] + ["--methods", "full", "--out", str(out)]
    done = subprocess.run(resume, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = [json.loads(line)["key"] for line in results.read_text().splitlines()[1:]]
    assert after[: len(kept)] == kept and len(set(after)) == len(after)


def test_a_full_disk_is_one_line_and_the_run_resumes(capsys, model_dir, tmp_path, monkeypatch):
    import errno
    import os

    import dapq.runs.log as log

    out = tmp_path / "sweep"
    args = ["bench", "niah", "--model", model_dir, "--lengths", "200", "--depths", "0,0.5,1", "--samples", "1",
            "--methods", "full,dapq", "--budgets", "16", "--out", str(out)]
    real, calls = os.fsync, {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(log.os, "fsync", fsync)
    code, stdout, err = run(capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "No space left on device" in err and "the 2 records before it are kept" in err and "| full |" not in stdout
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 2  # the failed record's partial line was cut
    monkeypatch.setattr(log.os, "fsync", real)
    code, stdout, err = run(capsys, *args)
    assert code == 0 and (out / "results.jsonl").read_text().splitlines()[:3] == lines
    assert len((out / "results.jsonl").read_text().splitlines()) == 1 + 6


def test_a_results_directory_of_another_precision_is_refused(capsys, model_dir, tmp_path):
    import json

    out = tmp_path / "sweep"
    args = ["bench", "niah", "--model", model_dir, "--lengths", "200", "--depths", "0.5", "--samples", "1",
            "--methods", "full", "--out", str(out)]
    assert run(capsys, *args)[0] == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()[1:]]
    assert [(r["dtype"], r["device"]) for r in records] == [("float32", "cpu")]
    before = (out / "results.jsonl").read_text()
    code, stdout, err = run(capsys, *args, "--dtype", "bfloat16")
    assert code == 2 and len(err.strip().splitlines()) == 1 and not stdout, err
    assert "holds results made in float32 on cpu; this run is bfloat16 on cpu" in err
    assert (out / "results.jsonl").read_text() == before
    # Another directory takes the bf16 run, under keys of its own.
    assert run(capsys, *args[:-1], str(tmp_path / "bf16"), "--dtype", "bfloat16")[0] == 0
    bf16 = json.loads((tmp_path / "bf16" / "results.jsonl").read_text().splitlines()[1])
    assert bf16["dtype"] == "bfloat16" and bf16["key"] != records[0]["key"]


def test_report_with_records_lacking_fields_or_a_directory_that_takes_no_files(capsys, model_dir, tmp_path,
                                                                              monkeypatch):
    import errno
    import json

    out = tmp_path / "sweep"
    args = ["bench", "niah", "--model", model_dir, "--lengths", "200", "--depths", "0,1", "--samples", "1",
            "--methods", "full", "--out", str(out)]
    assert run(capsys, *args)[0] == 0
    with open(out / "results.jsonl", "a") as fh:  # a record cut down by hand
        fh.write(json.dumps({"key": "cut", "label": "full", "score": 1.0}) + "\n")
    code, stdout, err = run(capsys, "report", str(out), "--no-plots")
    assert code == 0 and "2 finished cells" in stdout and "| full | all |" in stdout
    assert err.count("\n") == 1 and "1 record(s) lack fields the report needs (kv_bytes_full" in err
    code, stdout, err = run(capsys, *args)  # bench prints its table from the same store
    assert code == 0 and "| full | all |" in stdout and "lack fields" in err

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    (out / "report.md").unlink()
    monkeypatch.setattr("pathlib.Path.write_text", full)
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", full)
    code, stdout, err = run(capsys, "report", str(out))
    assert code == 0 and "## niah" in stdout and not (out / "report.md").exists()
    assert "cannot write the report's files" in err and "No space left on device" in err
    assert len([line for line in err.splitlines() if "cannot write" in line]) == 1


def test_report_gives_n_intervals_and_paired_differences(capsys, model_dir, tmp_path):
    import json

    from dapq.bench import stats

    out = tmp_path / "sweep"
    depths = ",".join(str(d / 10) for d in range(11))
    assert run(capsys, "bench", "niah", "--model", model_dir, "--lengths", "200", "--depths", depths, "--samples",
               "1", "--methods", "full,dapq,snapkv", "--budgets", "16", "--out", str(out))[0] == 0
    code, stdout, err = run(capsys, "report", str(out), "--against", "snapkv")
    assert code == 0, err
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()[1:]]
    dapq_scores = {r["sample_id"]: r["score"] for r in records if r["label"] == "dapq"}
    snap_scores = {r["sample_id"]: r["score"] for r in records if r["label"] == "snapkv"}
    # The intervals table: n = 11 prompts, the exact binomial interval when the scores are 0/1.
    expected = stats.interval(list(dapq_scores.values()))
    row = next(line for line in stdout.splitlines() if line.startswith("| dapq | 16 | 1 | 11 |"))
    assert expected.points() in row and expected.how in row
    # The paired table: dapq minus snapkv on the same 11 prompts, counted won/lost/tied.
    diff = [dapq_scores[k] - snap_scores[k] for k in dapq_scores]
    won, lost = sum(d > 0 for d in diff), sum(d < 0 for d in diff)
    line = next(line for line in stdout.splitlines() if line.startswith("| dapq | 16 | 11 |"))
    assert f"| {won} / {lost} / {11 - won - lost} |" in line and f"{100 * sum(diff) / 11:+.1f}" in line
    assert "### niah: paired difference to snapkv" in stdout and (out / "niah-budget.png").exists()
    # --output puts a second report beside the first: report.md keeps its --against, the links still resolve.
    (out / "vs").mkdir()
    code, stdout, err = run(capsys, "report", str(out), "--against", "dapq", "--output", str(out / "vs" / "dapq.md"))
    assert code == 0, err
    assert "paired difference to dapq" in (out / "vs" / "dapq.md").read_text()
    assert "paired difference to snapkv" in (out / "report.md").read_text()
    assert "](../niah-budget.png)" in stdout and "](niah-budget.png)" in (out / "report.md").read_text()
    code, stdout, err = run(capsys, "report", str(out), "--output", str(out / "nosuch" / "r.md"))
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err and not stdout
    code, stdout, err = run(capsys, "report", str(out), "--against", "nosuch", "--no-plots")
    assert code == 2 and "no such rows" in err and "its labels are dapq, full, snapkv" in err and not stdout
