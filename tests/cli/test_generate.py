"""`dapq generate`: output contract and every bad input -> one line on stderr, exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dapq.compat import attention_implementations
from dapq.errors import DapqError

from helpers import run_cli

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
    code, out, err = run(capsys, "generate", "--model", model_dir, "--method", "snapkv", "--keep-fraction", "0.5",
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
    (["--keep-fraction", "0"], "keep_fraction"),
    (["--keep-fraction", "1.5"], "keep_fraction"),
    (["--budget", "8", "--window", "0"], "window"),
    (["--budget", "abc"], "budget"),
    (["--method", "streamingllm", "--budget", "8", "--window", "4"], "no observation window"),
    (["--budget", "8", "--content", "nonsense"], "content"),
    (["--method", "snapkv"], "--budget or --keep-fraction"),
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
    truncated = tmp_path / "truncated"
    shutil.copytree(model_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a copy cut short
    for path in (unknown, no_weights, truncated):
        code, _, err = run(capsys, "generate", "--model", str(path), "--budget", "8", "--prompt", "hi")
        assert code == 2 and f"cannot load model '{path}'" in err and len(err.strip().splitlines()) == 1, err


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


def test_method_specs_and_the_keep_fraction_reach_the_method(capsys, model_dir):
    code, out, err = run(capsys, "generate", "--model", model_dir, "--method", "dapq(n_pseudo=8,keep_recent=2)",
                         "--keep-fraction", "0.5", "--prompt", "The grass is green. The sky is blue.",
                         "--max-new-tokens", "2", "--json")
    assert code == 0, err
    config = json.loads(out)["config"]
    assert (config["n_pseudo"], config["keep_recent"], config["keep_fraction"]) == (8, 2, 0.5)
    code, _, err = run(capsys, "generate", "--model", model_dir, "--ratio", "0.5", "--prompt", "x")
    assert code == 2 and "--ratio" in err and len(err.strip().splitlines()) == 1  # the old name is gone
    code, _, err = run(capsys, "generate", "--model", model_dir, "--method", "dapq(n_pseudo=8)", "--content",
                       "fixed", "--budget", "4", "--prompt", "x")
    assert code == 2 and "not both" in err
