"""`dapq generate`: output contract and every bad input -> one line on stderr, exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from dapq.compat import attention_implementations
from dapq.errors import DapqError

from helpers import run_cli, save_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), tokenizer, max_position_embeddings=256)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=320)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


run = run_cli


def test_generate_json(capsys, model_dir):
    code, out, err = run(capsys, "generate", "--model", model_dir, "--method", "dapq", "--budget", "8",
                         "--prompt", "The grass is green. The sky is blue. The sun is yellow.", "--chat",
                         "--max-new-tokens", "4", "--json")
    assert code == 0, err
    record = json.loads(out)
    for key in ("text", "method", "budget", "prompt_tokens", "kept_tokens_per_head", "kv_bytes_full",
                "kv_bytes_kept", "prefill_s", "compress_s", "decode_tokens_per_s"):
        assert key in record
    assert record["method"] == "dapq" and record["budget"] == 8
    assert record["kept_tokens_per_head"] == [8] * 4
    assert record["kv_bytes_kept"] < record["kv_bytes_full"]


def test_generate_plain_text(capsys, model_dir, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("Paris is the capital of France.")
    code, out, err = run(capsys, "generate", "--model", model_dir, "--method", "snapkv", "--ratio", "0.5",
                         "--prompt-file", str(prompt), "--max-new-tokens", "3")
    assert code == 0, err
    assert not out.lstrip().startswith("{")


def test_generate_context_then_questions(capsys, model_dir, tmp_path):
    context = tmp_path / "doc.txt"
    context.write_text("The grass is green. The sky is blue. The sun is yellow. " * 4)
    code, out, err = run(capsys, "generate", "--model", model_dir, "--method", "snapkv", "--budget", "8",
                         "--context-file", str(context), "--question", "What is green?", "--question", "And blue?",
                         "--chat", "--max-new-tokens", "3", "--json")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["question"] for r in records] == ["What is green?", "And blue?"]
    for r in records:
        assert r["kept_tokens_per_head"] == [8] * 4 and r["question_tokens"] > 0
        assert r["prompt_tokens"] > 8  # the context, compressed to 8 per head
    assert records[0]["prompt_tokens"] == records[1]["prompt_tokens"]  # one context, compressed once
    code, out, err = run(capsys, "generate", "--model", model_dir, "--budget", "8", "--context-file", str(context),
                         "--question", "What is green?", "--max-new-tokens", "3")
    assert code == 0 and not out.lstrip().startswith("{") and not out.startswith("[1]"), err


def test_context_mode_bad_input(capsys, model_dir, tmp_path):
    context = tmp_path / "doc.txt"
    context.write_text("The grass is green.")
    for args, needle in [
        (["--context-file", str(context)], "at least one non-empty --question"),
        (["--context-file", str(context), "--question", " "], "at least one non-empty --question"),
        (["--context-file", str(context), "--question", "q", "--prompt", "p"], "not both"),
        (["--question", "q", "--prompt", "p"], "--question needs --context-file"),
        (["--context-file", str(tmp_path / "none.txt"), "--question", "q"], "no such file"),
    ]:
        code, _, err = run(capsys, "generate", "--model", model_dir, "--budget", "8", *args)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err)


@pytest.mark.parametrize("args,needle", [
    (["--method", "bogus", "--budget", "8"], "unknown method"),
    (["--budget", "0"], "budget"),
    (["--budget", "-5"], "budget"),
    (["--ratio", "0"], "ratio"),
    (["--ratio", "1.5"], "ratio"),
    (["--budget", "8", "--window", "0"], "window"),
    (["--budget", "abc"], "budget"),
    (["--method", "streamingllm", "--budget", "8", "--window", "4"], "no window"),
    (["--budget", "8", "--content", "nonsense"], "content"),
    (["--method", "snapkv"], "--budget or --ratio"),
    (["--budget", "8", "--preset", "nope"], "no preset"),
    (["--no-such-flag"], "no-such-flag"),
    (["--budget", "8", "--workers", "2"], "run bulk generation"),  # not silently ignored
])
def test_bad_options(capsys, model_dir, args, needle):
    code, out, err = run(capsys, "generate", "--model", model_dir, "--prompt", "hi", *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("args,needle", [
    (["--device", "tpu9"], "unknown device 'tpu9'"),
    (["--attn", "magic"], "unknown attention implementation 'magic'"),
    # Which flash implementations exist depends on the transformers release; every one needs CUDA.
    (["--attn", "flash_attention_2", "--device", "cpu"], "needs a CUDA device"),
])
def test_bad_device_and_attention(capsys, model_dir, args, needle):
    code, _, err = run(capsys, "generate", "--model", model_dir, "--budget", "8", "--prompt", "hi", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this check needs a machine without CUDA")
def test_cuda_without_cuda(capsys, model_dir):
    code, _, err = run(capsys, "generate", "--model", model_dir, "--budget", "8", "--prompt", "hi", "--device", "cuda")
    assert code == 2 and "CUDA is not available" in err and len(err.strip().splitlines()) == 1, err


def test_flash_attention_needs_a_half_precision_dtype():
    from dapq.models import check_attention

    # Every supported release registers flash_attention_2 (the bad-input test above relies on it too).
    # transformers itself only warns about fp32 here and fails at the first forward.
    with pytest.raises(DapqError, match="needs --dtype bfloat16 or float16"):
        check_attention("flash_attention_2", torch.device("cuda"), torch.float32)
    check_attention("flash_attention_2", torch.device("cuda"), torch.bfloat16)


def test_model_dirs_that_cannot_load_are_one_line(capsys, model_dir, tmp_path):
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    shutil.copy(Path(model_dir) / "config.json", no_weights / "config.json")
    for path in (unknown, no_weights):
        code, _, err = run(capsys, "generate", "--model", str(path), "--budget", "8", "--prompt", "hi")
        assert code == 2 and "cannot load model" in err and len(err.strip().splitlines()) == 1, err


def test_attention_list_follows_the_installed_transformers():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    valid = attention_implementations()
    assert valid[:2] == ("eager", "sdpa")
    # Every flash implementation offered is one this release registers, and none is missing.
    registered = {k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if k.startswith("flash_attention_")}
    assert set(valid[2:]) == registered


def test_bad_prompt_files(capsys, model_dir, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait".encode("latin-1"))
    for path, needle in [(tmp_path / "missing.txt", "no such file"), (empty, "empty"), (latin1, "not UTF-8")]:
        code, _, err = run(capsys, "generate", "--model", model_dir, "--budget", "8", "--prompt-file", str(path))
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_prompt_longer_than_context(capsys, model_dir):
    code, _, err = run(capsys, "generate", "--model", model_dir, "--budget", "8", "--prompt", "green sky " * 200)
    assert code == 2 and "context" in err and len(err.strip().splitlines()) == 1


def test_unsupported_architecture(capsys, gpt2_dir):
    code, _, err = run(capsys, "generate", "--model", gpt2_dir, "--budget", "8", "--prompt", "hi")
    assert code == 2 and "gpt2" in err and "llama" in err and len(err.strip().splitlines()) == 1


def test_missing_model_dir(capsys):
    code, _, err = run(capsys, "generate", "--model", "./no/such/dir", "--budget", "8", "--prompt", "hi")
    assert code == 2 and "no such model directory" in err


@pytest.mark.parametrize("args,needle", [
    (["nope"], "unknown task set"),
    (["niah", "--lengths", "100000"], "longer than the model's context"),
    (["longbench", "--data", "/no/such/dir"], "no such data directory"),
    (["niah", "--budgets", "64,abc"], "budgets must be integers"),
    (["niah", "--methods", "full,bogus"], "unknown method"),
    (["niah", "--methods", "dapq(preset='nope')"], "no preset"),
    (["niah", "--decode-batch", "0"], "--decode-batch"),
    (["niah", "--compress", "question"], "--compress must be one of prompt, context"),
    (["niah", "--ratios", "0.5,1.5"], "ratios must lie in (0, 1)"),
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
                            "--samples", "1", "--methods", "full,dapq", "--ratios", "0.5", "--compress", "context",
                            "--out", str(out))
    assert code == 0, err
    assert "| method | budget | compress | NIAH |" in stdout and "| dapq | 50% | context |" in stdout
    assert "| dapq | 64 |" not in stdout  # --ratios alone: no default budgets


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
