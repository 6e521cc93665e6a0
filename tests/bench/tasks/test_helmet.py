"""HELMET's 11 Table-14 sub-tasks on fixture files in HELMET's data/ layout (invented content).

The sampling steps HELMET takes through ``datasets`` (``shuffle(seed)``, ``train_test_split``)
are checked against ``datasets`` itself where it is installed (the optional ``hub`` extra).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import sys
from pathlib import Path

import pytest

from dapq.bench.tasks import TaskArgs, build_samples
from dapq.bench.tasks.helmet import ICL_USER, RAG_USER, TASKS, balance_labels
from dapq.errors import DapqError

HELMET = Path(__file__).parent / "fixtures" / "helmet"
DATA = HELMET / "data"
TABLE_14 = ("icl_banking77", "icl_clinic150", "icl_nlu", "icl_trec_coarse", "icl_trec_fine", "narrativeqa",
            "infbench_qa_eng", "kilt_hotpotqa", "kilt_nq", "kilt_popqa_3", "kilt_triviaqa")


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def build(tokenizer, tasks=(), data=HELMET, length=4000, samples=3):
    return build_samples("helmet", tokenizer, TaskArgs(data=str(data), lengths=(length,), samples=samples,
                                                       tasks=tuple(tasks), max_context=8192))


@pytest.mark.parametrize("data", [HELMET, DATA])  # HELMET's data/ folder or the folder above it
def test_the_11_tasks_with_helmets_settings(tokenizer, data):
    samples = build(tokenizer, data=data)
    assert tuple(TASKS) == TABLE_14 and {s.task for s in samples} == set(TABLE_14)
    by = {}
    for s in samples:
        by.setdefault(s.task, []).append(s)
    for name in ("icl_banking77", "icl_trec_fine"):  # configs/icl.yaml
        s = by[name][0]
        assert (s.metric, s.max_new_tokens, s.chat, s.stop) == ("exact_match", 20, False, ("\n",))
        assert s.metric_args == {"helmet": {"system_template": "label:", "prepend": True, "parsed_only": True}}
        assert s.prompt.endswith("\nlabel:")
    for name in ("kilt_nq", "kilt_popqa_3"):  # configs/rag.yaml
        s = by[name][0]
        assert (s.metric, s.max_new_tokens, s.chat, s.stop) == ("substring_exact_match", 20, False, ("\n",))
        assert s.metric_args == {"helmet": {"system_template": "Answer:", "prepend": True, "parsed_only": False}}
        assert s.prompt.endswith("\nAnswer:")
    for name, new in (("narrativeqa", 100), ("infbench_qa_eng", 10)):  # configs/longqa.yaml
        s = by[name][0]
        assert (s.metric, s.max_new_tokens, s.chat, s.stop) == ("rougeL_f1", new, True, ())
        assert s.metric_args == {"helmet": {"system_template": "Answer:", "prepend": False, "parsed_only": False}}
        assert re.search(r"\n\nQuestion: [^\n]+$", s.prompt)  # the chat template adds no "Answer:"
    # PopQA's popularity filter drops the question with s_pop 5000 (log10 >= 3), as a test
    # question and as a demonstration.
    assert "which river reaches the sea" not in " ".join(s.prompt for s in by["kilt_popqa_3"])
    assert "which river reaches the sea" in " ".join(s.prompt for s in by["kilt_nq"])
    assert len(by["kilt_popqa_3"]) == 3 and len(by["kilt_nq"]) == 3


def test_rag_prompt_is_helmets_template_with_two_demos(tokenizer):
    (s,) = build(tokenizer, ("kilt_nq",), samples=1)
    rows, demos = jsonl(DATA / "kilt/nq-dev-multikilt_1000_k50_dep6.jsonl"), jsonl(
        DATA / "kilt/nq-train-multikilt_1000_k3_dep6.jsonl")
    docs = lambda ctxs: "\n\n".join(f"Document (Title: {c['title']}): {c['text']}" for c in ctxs)  # noqa: E731
    # nq has no ids, so HELMET keys by question; its demo draw (shuffle seeded by the sha256 of
    # the question, de-duplicated, first two) picks these for the first question.
    picked = [demos[3], demos[0]]
    assert [d["question"] for d in picked] == ["what does the ferry cross", "what is tollby known for"]
    demo_text = "\n\n".join(f"{docs(d['ctxs'])}\n\nQuestion: {d['question']}\nAnswer: {d['answers'][0]}"
                            for d in picked) + "\n\n"
    row = next(r for r in rows if r["question"] == "who designed the wrenfield lighthouse")
    expected = RAG_USER.format(demos=demo_text, context=docs(row["ctxs"]), question=row["question"]) + "\nAnswer:"
    assert s.prompt == expected
    assert s.prompt.startswith("Use the given documents to write a concise and short answer to the question. "
                               "Write your answer in the following format:\nAnswer: [answer]\n\n")
    assert s.references == ("Ada Pellow",)
    assert s.prompt[: s.context_end].endswith(docs(row["ctxs"]))
    assert s.prompt[s.context_end :] == "\n\nQuestion: who designed the wrenfield lighthouse\nAnswer:"


def test_rag_demos_and_subset_match_datasets(tokenizer, tmp_path):
    datasets = pytest.importorskip("datasets", reason="the optional `datasets` package is not installed")
    rng = random.Random(3)
    ctx = [{"title": "T", "text": "x"}]
    rows = [{"id": f"q{rng.randrange(260)}", "question": f"question {i}", "answers": [f"a{i}"], "ctxs": ctx}
            for i in range(150)]
    demos = [{"id": f"d{rng.randrange(5)}", "question": f"demo {i}", "answers": [f"b{i}"], "ctxs": ctx}
             for i in range(12)]
    write_jsonl(tmp_path / "kilt/triviaqa-dev-multikilt_1000_k50_dep6.jsonl", rows)
    write_jsonl(tmp_path / "kilt/triviaqa-train-multikilt_1000_k3_dep6.jsonl", demos)
    samples = build(tokenizer, ("kilt_triviaqa",), data=tmp_path, samples=1000)
    # HELMET: random.seed(42); 100 ids from the sorted set; the rows with those ids, in file order.
    random.seed(42)
    ids = sorted({r["id"] for r in rows})
    chosen = random.sample(ids, 100)
    kept = [r for r in rows if r["id"] in chosen]
    assert len(ids) > 100 and len(kept) >= 100  # a real draw, repeated ids kept with their rows
    assert [s.sample_id for s in samples] == [f"helmet-kilt_triviaqa-{r['id']}" for r in kept]
    # Demos: datasets' shuffle seeded by the sha256 of the id, duplicates dropped, the first two.
    demo_ds = datasets.Dataset.from_list(demos)
    for s, row in list(zip(samples, kept, strict=True))[:10]:
        seed = int(hashlib.sha256(row["id"].encode()).hexdigest(), 16) % 2**31
        shuffled, seen, want = demo_ds.shuffle(seed=seed), set(), []
        for d in shuffled:
            if d["id"] not in seen:
                seen.add(d["id"])
                want.append(d["question"])
        assert re.findall(r"Question: (demo \d+)\n", s.prompt) == want[:2]


def test_icl_prompt_labels_and_demos(tokenizer):
    samples = build(tokenizer, ("icl_trec_coarse",), length=8192, samples=3)
    train = jsonl(DATA / "hf/CogComp/trec/train.jsonl")
    test = jsonl(DATA / "hf/CogComp/trec/test.jsonl")
    coarse = {r["text"]: r["coarse_label"] for r in train}
    for s, row in zip(samples, test, strict=True):  # 3 test texts <= 500: HELMET keeps them in order
        assert s.prompt.startswith('Use the provided mapping from the text to label to assign a label to the text. '
                                   'Only output "label: {label}" and nothing else. \n\n')
        assert s.prompt.endswith(f"\n\n{row['text']}\nlabel:")
        assert s.prompt[s.context_end :] == f"\n\n{row['text']}\nlabel:"
        demos = re.findall(r"([^\n]+)\nlabel: (\d+)", s.prompt[: s.context_end])
        # Many shots (400 at 8k) cut to the length: rounds of 4 labels, each label once a round.
        assert len(demos) > 8
        rounds = [demos[i : i + 4] for i in range(0, len(demos) - 3, 4)]
        assert all(len({coarse[t] for t, _ in r}) == 4 for r in rounds)
        # Labels are integers from one shuffled mapping per test text: a class always shows the
        # same integer, the test text's class included.
        shown = {coarse[t]: label for t, label in demos}
        assert len(set(shown.values())) == 4 and all(shown[coarse[t]] == label for t, label in demos)
        assert s.references == (shown[row["coarse_label"]],)
    assert [s.references for s in samples] == [("1",), ("5",), ("5",)]  # pinned: seeds from the sha256 of each text
    assert ICL_USER.partition("{context}")[0].format() in samples[0].prompt


def test_balance_labels():
    rows = [{"l": "a", "i": i} for i in range(3)] + [{"l": "b", "i": i} for i in range(2)] + [{"l": "c", "i": 0}]
    out = balance_labels(rows, "l", 7, seed=5)
    # ceil(7 / 3) = 3 rounds, each with every label once (c, with one row, repeats it); the
    # rounds are shuffled and the last cut to 7. Pinned: random.Random(5) draws.
    assert [(r["l"], r["i"]) for r in out] == [("a", 2), ("c", 0), ("b", 0), ("c", 0), ("b", 1), ("a", 1), ("b", 0)]
    assert all(sorted(r["l"] for r in out[k : k + 3]) == ["a", "b", "c"] for k in (0, 3))


def test_icl_test_set_is_label_balanced_above_500(tokenizer, tmp_path):
    # Over 500 test texts HELMET shuffles them (seed 42) and keeps 500 in label-balanced rounds.
    train = [{"text": f"train {i}", "label": i % 4} for i in range(40)]
    test = [{"text": f"test {i}", "label": 0 if i < 560 else 1 + i % 3} for i in range(600)]
    write_jsonl(tmp_path / "hf/PolyAI/banking77/train.jsonl", train)
    write_jsonl(tmp_path / "hf/PolyAI/banking77/test.jsonl", test)
    samples = build(tokenizer, ("icl_banking77",), data=tmp_path, length=2000, samples=8)
    label = {r["text"]: r["label"] for r in test}
    questions = [s.prompt.rsplit("\n\n", 1)[1].removesuffix("\nlabel:") for s in samples]
    assert sorted(label[q] for q in questions[:4]) == [0, 1, 2, 3]
    assert sorted(label[q] for q in questions[4:]) == [0, 1, 2, 3]


def test_nlu_split_and_infbench_order_match_datasets(tokenizer):
    datasets = pytest.importorskip("datasets", reason="the optional `datasets` package is not installed")
    rows = jsonl(DATA / "hf/xingkunliuxtracta/nlu_evaluation_data/train.jsonl")
    split = datasets.Dataset.from_list(rows).train_test_split(test_size=0.1, seed=42)
    samples = build(tokenizer, ("icl_nlu",), samples=10)
    assert len(samples) == math.ceil(0.1 * len(rows)) == 4
    assert [s.prompt.rsplit("\n\n", 1)[1].removesuffix("\nlabel:") for s in samples] == split["test"]["text"]
    train_texts = set(split["train"]["text"])
    assert all(set(re.findall(r"([^\n]+)\nlabel: \d+", s.prompt[: s.context_end])) <= train_texts for s in samples)

    inf = jsonl(DATA / "hf/xinrongzhang2022/infinitebench/longbook_qa_eng.jsonl")
    ds = datasets.Dataset.from_list(inf)
    samples = build(tokenizer, ("infbench_qa_eng",), samples=10)
    assert [s.sample_id for s in samples] == [f"helmet-infbench_qa_eng-{i}" for i in ds.shuffle(seed=42)["id"]]
    for s in samples:
        row = next(r for r in inf if s.sample_id.endswith(f"-{r['id']}"))
        demos = ds.filter(lambda x, rid=row["id"]: x["id"] != rid).shuffle(seed=42).select(range(2))
        block = "\n\n".join(f"[story text]\nQuestion: {d['input']}\nAnswer: {d['answer'][0]}" for d in demos)
        assert s.prompt == (
            "You are given a story and a question. Answer the question as concisely as you can, using a single phrase "
            f"if possible.\n\nFor example:\n\n{block}\n\nNow, read the following story:\n\n{row['context']}\n\n"
            f"Question: {row['input']}")
        assert s.references == tuple(row["answer"])


def test_narrativeqa_prompt(tokenizer):
    samples = build(tokenizer, ("narrativeqa",), samples=5)
    test = jsonl(DATA / "hf/narrativeqa/test.jsonl")
    assert len(samples) == 2
    for s in samples:
        row = test[int(s.sample_id.rsplit("-", 1)[1])]
        assert s.prompt.startswith("You are given a story, which can be either a novel or a movie script, and a "
                                   "question. Answer the question as concisely as you can, using a single phrase if "
                                   "possible.\n\nFor example:\n\nQuestion: ")
        assert "\n\nNow, use the following story to answer the question:\n\n" + row["document"]["text"] in s.prompt
        assert s.prompt[: s.context_end].endswith(row["document"]["text"])
        assert s.prompt[s.context_end :] == f"\n\nQuestion: {row['question']['text']}"
        assert s.references == tuple(a["text"] for a in row["answers"])


def test_truncation_cuts_the_end_of_the_context(tokenizer):
    from dapq.prompts import encode_prompts

    (full,) = build(tokenizer, ("kilt_hotpotqa",), samples=1)
    (short,) = build(tokenizer, ("kilt_hotpotqa",), length=1300, samples=1)
    limit = 1300 - 20  # the length less the generation
    assert len(encode_prompts(tokenizer, [full.prompt])[0]) > limit
    assert len(encode_prompts(tokenizer, [short.prompt])[0]) <= limit + 2  # HELMET's one cut, as HELMET makes it
    before = full.prompt[: full.context_end]
    kept = short.prompt[: short.context_end]
    assert before.startswith(kept) and len(kept) < len(before)  # the end of the documents went
    assert short.prompt[short.context_end :] == full.prompt[full.context_end :]  # the question stayed
    with pytest.raises(DapqError, match="does not fit 80 tokens even without its context"):
        build(tokenizer, ("kilt_hotpotqa",), length=100, samples=1)


def test_errors_name_the_file_and_what_was_expected(tokenizer, tmp_path, monkeypatch):
    with pytest.raises(DapqError, match=r"kilt/nq-dev-multikilt_1000_k105_dep6.jsonl: missing"):
        build_samples("helmet", tokenizer, TaskArgs(data=str(HELMET), lengths=(10000,), tasks=("kilt_nq",)))
    with pytest.raises(DapqError, match=r"hf/CogComp/trec/train.jsonl: missing \(HELMET icl_trec_fine: a JSON-lines "
                                        r"export of CogComp/trec split train"):
        build(tokenizer, ("icl_trec_fine",), data=tmp_path)
    write_jsonl(tmp_path / "hf/PolyAI/banking77/train.jsonl", [{"text": "x", "label": 77}])
    with pytest.raises(DapqError, match=r"banking77/train.jsonl: row 1: label must be an integer label id in \[0, 77\)"):
        build(tokenizer, ("icl_banking77",), data=tmp_path)
    write_jsonl(tmp_path / "kilt/nq-dev-multikilt_1000_k50_dep6.jsonl", [{"question": "q", "answers": ["a"]}])
    with pytest.raises(DapqError, match=r"nq-dev-multikilt_1000_k50_dep6.jsonl: row 1 has no field 'ctxs'"):
        build(tokenizer, ("kilt_nq",), data=tmp_path)
    with pytest.raises(DapqError, match="no such data directory"):
        build(tokenizer, data=tmp_path / "nope")
    with pytest.raises(DapqError, match="unknown HELMET task"):
        build(tokenizer, ("icl",))
    monkeypatch.setitem(sys.modules, "datasets", None)  # local data never needs `datasets`
    assert build(tokenizer, ("icl_nlu", "narrativeqa"), samples=1)
    with pytest.raises(DapqError, match="data.tar.gz"):
        build_samples("helmet", tokenizer, TaskArgs(data="hub", tasks=("kilt_nq",)))
    with pytest.raises(DapqError, match="needs the `datasets` package"):
        build_samples("helmet", tokenizer, TaskArgs(data="hub", tasks=("icl_trec_coarse",)))
