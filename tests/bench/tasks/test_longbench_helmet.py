"""LongBench, LongBench v2 and HELMET loaders on small fixture files in the official layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapq.bench.tasks import TaskArgs, build_samples
from dapq.bench.tasks.longbench import PROMPTS, truncate_middle
from dapq.errors import DapqError

FIX = Path(__file__).parent / "fixtures"


def test_longbench_templates_and_metrics(tokenizer):
    samples = build_samples("longbench", tokenizer, TaskArgs(data=str(FIX / "longbench"), lengths=(4000,),
                                                              tasks=("hotpotqa", "trec", "passage_count")))
    by = {s.task: s for s in samples}
    assert by["hotpotqa"].prompt.startswith("Answer the question based on the given passages.")
    assert by["hotpotqa"].prompt.endswith("Question: Which river flows past the lighthouse?\nAnswer:")
    assert by["hotpotqa"].metric == "qa_f1" and by["hotpotqa"].max_new_tokens == 32 and by["hotpotqa"].chat
    assert by["trec"].metric == "classification" and not by["trec"].chat and by["trec"].meta["first_line"]
    assert by["trec"].metric_args["all_classes"][0] == "Individual"
    assert by["passage_count"].references == ("2",)
    assert len(PROMPTS) == 13


def test_middle_truncation(tokenizer):
    text = "alpha " * 50 + "omega " * 50
    short = truncate_middle(tokenizer, text, 20)
    assert short.startswith("alpha") and short.rstrip().endswith("omega")
    assert len(tokenizer(short, add_special_tokens=False)["input_ids"]) <= 22
    assert truncate_middle(tokenizer, "short", 20) == "short"


def test_longbench_v2_and_helmet(tokenizer):
    v2 = build_samples("longbench-v2", tokenizer, TaskArgs(data=str(FIX / "longbench-v2"), lengths=(4000,)))
    assert [s.references for s in v2] == [("A",), ("B",)]
    assert v2[0].meta["splits"] == ["easy", "short"] and "(A) Sourdough" in v2[0].prompt
    helmet = build_samples("helmet", tokenizer, TaskArgs(data=str(FIX / "helmet"), lengths=(4000,)))
    by = {s.task: s for s in helmet}
    assert by["rag"].metric == "subem" and "Document (Title: Garden): Clover" in by["rag"].prompt
    assert by["icl"].metric == "exact_match" and by["longqa"].metric == "rouge_l"


@pytest.mark.parametrize("taskset", ["longbench", "longbench-v2", "helmet"])
def test_missing_data_is_an_error(tokenizer, tmp_path, taskset):
    with pytest.raises(DapqError, match="no such data directory"):
        build_samples(taskset, tokenizer, TaskArgs(data=str(tmp_path / "nope")))
    with pytest.raises(DapqError, match="--data"):
        build_samples(taskset, tokenizer, TaskArgs(data=None))
