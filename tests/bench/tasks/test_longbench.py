"""LongBench and LongBench v2 on fixture files in the official layouts (invented content)."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pytest

from dapq.bench.tasks import TaskArgs, build_samples
from dapq.bench.tasks.longbench import (
    FIRST_LINE,
    MAX_NEW_TOKENS,
    METRIC,
    NO_CHAT,
    PROMPTS,
    TASKS,
    V2_TEMPLATE,
    truncate_middle,
    v2_splits,
)
from dapq.errors import DapqError

FIX = Path(__file__).parent / "fixtures"
LB = FIX / "longbench"


def rows(task: str) -> list[dict]:
    return [json.loads(line) for line in (LB / "data" / f"{task}.jsonl").read_text().splitlines()]


def test_templates_and_lengths_are_the_official_config():
    # sha256 of THUDM/LongBench LongBench/config/dataset2prompt.json's 13 entries (json.dumps,
    # sorted keys), taken at commit 2e00731; dataset2maxlen.json's values written out.
    blob = json.dumps({t: PROMPTS[t] for t in TASKS}, sort_keys=True, ensure_ascii=False)
    assert hashlib.sha256(blob.encode()).hexdigest() == "8d28a345f1ff6bf023586a38388d6e4586ed0d58c1dfd517212cf276aae99ee8"
    assert MAX_NEW_TOKENS == {"qasper": 128, "multifieldqa_en": 64, "hotpotqa": 32, "2wikimqa": 32, "gov_report": 512,
                              "multi_news": 512, "trec": 64, "triviaqa": 32, "samsum": 128, "passage_count": 32,
                              "passage_retrieval_en": 32, "lcc": 64, "repobench-p": 64}
    # prompts/0shot.txt (LongBench v2), no trailing newline.
    assert hashlib.sha256(V2_TEMPLATE.encode()).hexdigest() == (
        "68a162252bc9ff71d5d7abca3d69bb31aac3c35f832d657a2866f2018b8a6950")


@pytest.mark.parametrize("data", [LB, LB / "data"])  # the unzipped data/ folder or the folder above it
def test_all_13_tasks_from_the_official_layout(tokenizer, data):
    samples = build_samples("longbench", tokenizer, TaskArgs(data=str(data), lengths=(4000,), samples=5))
    assert sorted({s.task for s in samples}) == sorted(TASKS) and len(samples) == 26
    for s in samples:
        row = next(r for r in rows(s.task) if s.sample_id == f"longbench-{s.task}-{r['_id']}")
        assert s.prompt == PROMPTS[s.task].format(**row)  # short enough: no truncation
        assert s.references == tuple(str(a) for a in row["answers"])
        assert s.metric == METRIC[s.task] and s.max_new_tokens == MAX_NEW_TOKENS[s.task]
        assert s.chat == (s.task not in NO_CHAT) and s.meta["first_line"] == (s.task in FIRST_LINE)
        assert s.meta["context_words"] == row["length"] and "length" not in s.meta  # not a token length
        # The context part ends right after the substituted context.
        assert s.prompt[: s.context_end].endswith(row["context"])
        assert s.prompt[s.context_end :] == PROMPTS[s.task].partition("{context}")[2].format(**row)
    assert NO_CHAT == {"trec", "triviaqa", "samsum", "lcc", "repobench-p"}
    assert FIRST_LINE == {"trec", "triviaqa", "samsum"}
    trec = next(s for s in samples if s.task == "trec")
    assert trec.metric_args["all_classes"][:2] == ("Individual", "Other location")
    assert next(s for s in samples if s.task == "passage_count").references == ("3",)


def test_middle_truncation_and_context_end(tokenizer, tmp_path):
    text = "alpha " * 50 + "omega " * 50
    short = truncate_middle(tokenizer, text, 20)
    assert short.startswith("alpha") and short.rstrip().endswith("omega")
    assert len(tokenizer(short, add_special_tokens=False)["input_ids"]) <= 22
    assert truncate_middle(tokenizer, "short", 20) == "short"
    # A prompt over the budget keeps both instructions; the context part still ends where the
    # (now truncated) context ends, right before the question part.
    row = {"input": "Where is Tollby?", "context": " ".join(f"Sentence {i} is about the town." for i in range(200)),
           "answers": ["inland"], "_id": "long"}
    (tmp_path / "multifieldqa_en.jsonl").write_text(json.dumps(row) + "\n")
    (s,) = build_samples("longbench", tokenizer, TaskArgs(data=str(tmp_path), lengths=(900,), samples=1,
                                                          tasks=("multifieldqa_en",)))
    budget = 900 - 64 - 64  # the length, less the answer (64 tokens) and room for the chat template
    assert len(tokenizer(PROMPTS["multifieldqa_en"].format(**row))["input_ids"]) > budget
    assert len(tokenizer(s.prompt)["input_ids"]) <= budget + 2  # re-tokenising at the cut may merge
    assert s.prompt.startswith("Read the following text and answer briefly.")
    question = PROMPTS["multifieldqa_en"].partition("{context}")[2].format(**row)
    assert s.prompt[s.context_end :] == question
    assert s.prompt[: s.context_end].endswith("Sentence 199 is about the town.")
    assert "Sentence 100 " not in s.prompt  # the middle went
    # A question longer than half the budget is cut itself: the context part is all before the cut.
    row["input"] = "Why? " * 300
    (tmp_path / "multifieldqa_en.jsonl").write_text(json.dumps(row) + "\n")
    (s,) = build_samples("longbench", tokenizer, TaskArgs(data=str(tmp_path), lengths=(900,), samples=1,
                                                          tasks=("multifieldqa_en",)))
    head, tail = s.prompt[: s.context_end], s.prompt[s.context_end :]
    assert head.startswith("Read the following") and "Sentence 0 is" in head and "Why" not in head
    assert "Sentence" not in tail and tail.endswith("Why? \nAnswer:")


def test_longbench_v2_follows_pred_py(tokenizer):
    samples = build_samples("longbench-v2", tokenizer, TaskArgs(data=str(FIX / "longbench-v2"), lengths=(4000,),
                                                                samples=5))
    items = json.loads((FIX / "longbench-v2" / "data.json").read_text())
    assert [s.references for s in samples] == [("A",), ("B",), ("C",)]
    first = samples[0]
    # pred.py strips every field before the replaces: the fixture pads the question and context.
    assert "<text>\n" + items[0]["context"].strip() + "\n</text>" in first.prompt
    assert "question: Who designed Wrenfield's lighthouse?\nChoices:\n(A) Ada Pellow\n" in first.prompt
    assert first.prompt.endswith('Format your response as follows: "The correct answer is (insert answer here)".')
    assert first.max_new_tokens == 128 and first.chat and first.metric == "choice"
    assert first.prompt[: first.context_end].endswith(items[0]["context"].strip())
    assert first.prompt[first.context_end :].startswith("\n</text>\n\nWhat is the correct answer")
    assert [s.meta["splits"] for s in samples] == [["easy", "short"], ["hard", "long"], ["hard", "medium"]]


def test_longbench_v2_columns_follow_result_py():
    # result.py: anything but "easy" is hard; anything but "short"/"medium" is long.
    assert v2_splits({"difficulty": "easy", "length": "short"}) == ["easy", "short"]
    assert v2_splits({"difficulty": "Easy", "length": "xl"}) == ["hard", "long"]
    assert v2_splits({}) == ["hard", "long"]


def test_longbench_v2_truncates_the_whole_prompt_in_the_middle(tokenizer, tmp_path):
    items = json.loads((FIX / "longbench-v2" / "data.json").read_text())
    items[1]["context"] = " ".join(f"Sentence {i} is about the railway." for i in range(200))
    (tmp_path / "data.json").write_text(json.dumps(items[1:2]))
    (s,) = build_samples("longbench-v2", tokenizer, TaskArgs(data=str(tmp_path), lengths=(1000,)))
    budget = 1000 - 128 - 64
    assert s.prompt.startswith("Please read the following text and answer the question below.\n\n<text>\nSentence 0 ")
    assert s.prompt.endswith('"The correct answer is (insert answer here)".')
    assert len(tokenizer(s.prompt)["input_ids"]) <= budget + 2  # the budget, give or take a re-merge
    assert "Sentence 100 " not in s.prompt
    assert s.prompt[: s.context_end].endswith("Sentence 199 is about the railway.")
    assert s.prompt[s.context_end :].startswith("\n</text>\n\nWhat is the correct answer to this question: What links")


@pytest.mark.parametrize("taskset", ["longbench", "longbench-v2"])
def test_missing_data_is_an_error(tokenizer, tmp_path, taskset):
    with pytest.raises(DapqError, match="no such data directory"):
        build_samples(taskset, tokenizer, TaskArgs(data=str(tmp_path / "nope")))
    with pytest.raises(DapqError, match="--data"):
        build_samples(taskset, tokenizer, TaskArgs(data=None))
    expected = "hotpotqa.jsonl" if taskset == "longbench" else "data.json"
    with pytest.raises(DapqError, match=f"{tmp_path}/{expected}: missing"):
        build_samples(taskset, tokenizer, TaskArgs(data=str(tmp_path), tasks=("hotpotqa",) if taskset == "longbench"
                                                    else ()))


def test_malformed_files_name_the_file_and_the_expectation(tokenizer, tmp_path):
    (tmp_path / "hotpotqa.jsonl").write_text('{"input": "q", "context": "c", "answers": ["a"]}\nnot json\n')
    args = TaskArgs(data=str(tmp_path), tasks=("hotpotqa",))
    with pytest.raises(DapqError, match=r"hotpotqa.jsonl:2: not valid JSON"):
        build_samples("longbench", tokenizer, args)
    (tmp_path / "hotpotqa.jsonl").write_bytes(b'{"input": "q", "context": "c", "answers": ["a"]}\n{"input": "caf\xe9"}\n')
    with pytest.raises(DapqError, match=r"hotpotqa.jsonl:2: not UTF-8 text"):
        build_samples("longbench", tokenizer, args)
    (tmp_path / "hotpotqa.jsonl").write_text('{"input": "q", "answers": ["a"]}\n')
    with pytest.raises(DapqError, match=r"hotpotqa.jsonl: row 1 has no field 'context' \(LongBench rows have"):
        build_samples("longbench", tokenizer, args)
    (tmp_path / "hotpotqa.jsonl").write_text('{"input": "q", "context": "c", "answers": "a"}\n')
    with pytest.raises(DapqError, match=r"field 'answers' must be a non-empty list"):
        build_samples("longbench", tokenizer, args)
    (tmp_path / "data.json").write_text('{"not": "a list"}')
    with pytest.raises(DapqError, match=r"data.json: expected a JSON list of objects"):
        build_samples("longbench-v2", tokenizer, TaskArgs(data=str(tmp_path)))


def test_local_data_never_imports_datasets(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # any import of it would now fail
    assert build_samples("longbench", tokenizer, TaskArgs(data=str(LB), lengths=(4000,), tasks=("trec",)))
    assert build_samples("longbench-v2", tokenizer, TaskArgs(data=str(FIX / "longbench-v2"), lengths=(4000,)))


def test_hub_errors_are_one_line(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DapqError, match=r"needs the `datasets` package"):
        build_samples("longbench", tokenizer, TaskArgs(data="hub", tasks=("trec",)))

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'THUDM/LongBench' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(DapqError) as err:
        build_samples("longbench-v2", tokenizer, TaskArgs(data="hub"))
    assert str(err.value) == ("cannot load THUDM/LongBench-v2 split train from the hub: Couldn't reach "
                              "'THUDM/LongBench' on the Hub (LocalEntryNotFoundError)")


def test_hub_rows_are_used_like_local_ones(tokenizer, monkeypatch):
    calls = []

    def load_dataset(repo, name, split):
        calls.append((repo, name, split))
        return rows("trec")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    hub = build_samples("longbench", tokenizer, TaskArgs(data="hub", lengths=(4000,), tasks=("trec",)))
    local = build_samples("longbench", tokenizer, TaskArgs(data=str(LB), lengths=(4000,), tasks=("trec",)))
    assert calls == [("THUDM/LongBench", "trec", "test")] and hub == local
