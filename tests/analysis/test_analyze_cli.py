"""`dapq analyze`: end-to-end on a tiny model, checking the identities the paper's tables rest on."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli, save_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    return save_tiny(tmp_path_factory.mktemp("tiny-analysis"), tokenizer, max_position_embeddings=1024,
                     eos_token_id=None)


run = run_cli


COMMON = ["--lengths", "300", "--samples", "1", "--taskset", "niah"]


def _records(path):
    return [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines()[1:]]


def test_similarity(capsys, model_dir, tmp_path):
    code, out, err = run(capsys, "analyze", "similarity", "--model", model_dir, *COMMON, "--window", "4",
                         "--out", str(tmp_path))
    assert code == 0, err
    records = _records(tmp_path)
    assert len(records) == 5  # 5 depths x 1 sample
    for r in records:
        # Same content at the same positions IS the real decoding query: similarity 1 at every layer.
        assert all(v == pytest.approx(1.0, abs=1e-4) for v in r["conditions"]["SC&SP"]["post"])
        assert all(v == pytest.approx(1.0, abs=1e-4) for v in r["conditions"]["SC&SP"]["pre"])
        assert r["offsets"]["0"] == pytest.approx(1.0, abs=1e-4)
        assert r["conditions"]["DC&DP"]["post"][0] < 0.99
    assert "| SC&SP | 1.000 | 1.000 | 5 |" in out
    assert (tmp_path / "similarity-box.png").exists() and (tmp_path / "similarity-offset.png").exists()


def test_recall_and_oracle_reference(capsys, model_dir, tmp_path):
    code, out, err = run(capsys, "analyze", "recall", "--model", model_dir, *COMMON, "--methods",
                         "dapq,snapkv,h2o,oracle(steps=4)", "--budget", "16", "--windows", "1,4", "--steps", "4",
                         "--out", str(tmp_path))
    assert code == 0, err
    records = _records(tmp_path)
    oracle = [r for r in records if r["method"] == "oracle"]
    assert oracle and all(v == pytest.approx(1.0) for r in oracle for v in r["recall"])  # oracle vs itself
    assert {r["window"] for r in records if r["method"] == "dapq"} == {1, 4}
    assert {r["window"] for r in records if r["method"] == "h2o"} == {None}  # its window is not swept
    assert all(0.0 <= v <= 1.0 for r in records for v in r["recall"])
    assert "Table 8 analogue" in out and (tmp_path / "recall.png").exists()
    # Resumable: a second run finds every record done and adds none.
    n = len(records)
    assert run(capsys, "analyze", "recall", "--model", model_dir, *COMMON, "--methods",
               "dapq,snapkv,h2o,oracle(steps=4)", "--budget", "16", "--windows", "1,4", "--steps", "4",
               "--out", str(tmp_path))[0] == 0
    assert len(_records(tmp_path)) == n


def test_ablation_with_accuracy(capsys, model_dir, tmp_path):
    code, out, err = run(capsys, "analyze", "ablation", "c", "--model", model_dir, *COMMON, "--budget", "16",
                         "--steps", "4", "--out", str(tmp_path))
    assert code == 0, err
    assert len(_records(tmp_path / "c")) == 5 * 7  # 5 prompts x 7 position variants
    assert "dapq(preset='paper',inside_part=1)" in out and "| full | all |" in out


def test_bad_ablation_part(capsys, model_dir, tmp_path):
    code, _, err = run(capsys, "analyze", "ablation", "z", "--model", model_dir, "--out", str(tmp_path))
    assert code == 2 and "ablation part" in err
