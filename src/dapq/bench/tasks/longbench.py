"""LongBench (the 13 English tasks of the DapQ paper's Table 2) and LongBench v2.

Bai et al., "LongBench: A Bilingual, Multitask Benchmark for Long Context Understanding" (ACL
2024) and "LongBench v2" (arXiv 2412.15204). Prompt templates, generation lengths, the tasks
that skip the chat template, middle truncation and the metrics follow the official
``config/dataset2prompt.json``, ``dataset2maxlen.json``, ``pred.py`` and ``metrics.py``.

Data is read from a local directory in the official layouts (``{task}.jsonl`` files with
``input``, ``context``, ``answers``, ``all_classes``, ``_id``; LongBench v2's ``data.json``), or
with ``--data hub`` from the Hugging Face hub where it is reachable.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import DapqError
from .base import Sample, TaskArgs, select_tasks, taskset

PROMPTS = {
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in the "
        "article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or "
        "\"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on "
        "the above article as concisely as you can, using a single phrase or sentence if possible. If the question "
        "cannot be answered based on the information in the article, write \"unanswerable\". If the question is a "
        "yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\n"
        "Question: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on "
        "the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "hotpotqa": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
        "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "2wikimqa": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
        "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n"
        "{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
        "Now, write a one-page summary of all the news.\n\nSummary:"
    ),
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other "
        "words. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In "
        "other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final "
        "count of unique paragraphs after removing duplicates. The output format should only contain the number, "
        "such as 1, 2, 3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of "
        "the paragraph that the abstract is from. The answer format must be like \"Paragraph 1\", \"Paragraph 2\", "
        "etc.\n\nThe answer is: "
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}
MAX_NEW_TOKENS = {
    "qasper": 128, "multifieldqa_en": 64, "hotpotqa": 32, "2wikimqa": 32, "gov_report": 512, "multi_news": 512,
    "trec": 64, "triviaqa": 32, "samsum": 128, "passage_count": 32, "passage_retrieval_en": 32, "lcc": 64,
    "repobench-p": 64,
}
METRIC = {
    "qasper": "qa_f1", "multifieldqa_en": "qa_f1", "hotpotqa": "qa_f1", "2wikimqa": "qa_f1",
    "gov_report": "rouge_l", "multi_news": "rouge_l", "trec": "classification", "triviaqa": "qa_f1",
    "samsum": "rouge_l", "passage_count": "count", "passage_retrieval_en": "retrieval", "lcc": "code_sim",
    "repobench-p": "code_sim",
}
TASKS = tuple(PROMPTS)
# pred.py: few-shot and code tasks are not wrapped in the chat template.
NO_CHAT = {"trec", "triviaqa", "samsum", "lcc", "repobench-p"}
# metrics.py: for these, only the first line of the prediction is scored.
FIRST_LINE = {"trec", "triviaqa", "samsum"}

V2_TEMPLATE = (
    "Please read the following text and answer the question below.\n\n<text>\n{context}\n</text>\n\n"
    "What is the correct answer to this question: {question}\nChoices:\n(A) {A}\n(B) {B}\n(C) {C}\n(D) {D}\n\n"
    "Format your response as follows: \"The correct answer is (insert answer here)\"."
)


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    raise DapqError(f"{path}:{number}: not valid JSON") from None
    return rows


def _data_dir(args: TaskArgs) -> Path | None:
    if args.data is None:
        raise DapqError("this task set needs --data DIR (the official JSON/JSONL files) or --data hub")
    if args.data == "hub":
        return None
    path = Path(args.data).expanduser()
    if not path.is_dir():
        raise DapqError(f"{args.data}: no such data directory")
    return path


def _hub(repo: str, name: str | None, split: str) -> list[dict]:
    try:
        from datasets import load_dataset
    except ImportError:
        raise DapqError("--data hub needs the `datasets` package") from None
    try:
        return list(load_dataset(repo, name, split=split))
    except Exception as exc:  # network errors come in many types
        raise DapqError(f"cannot load {repo} from the hub: {str(exc).splitlines()[0]}") from None


def truncate_middle(tokenizer, text: str, max_tokens: int) -> str:
    """LongBench's truncation: keep the first and last ``max_tokens // 2`` tokens."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    half = max_tokens // 2
    return tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(ids[-half:], skip_special_tokens=True)


def _budget(args: TaskArgs, max_new: int) -> int:
    # Room for the chat template and the answer, as LongBench reserves room for generation.
    context = args.max_context or 8192
    limit = min(context, max(args.lengths)) if args.lengths else context
    return max(256, limit - max_new - 64)


@taskset("longbench")
def longbench_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    """The first ``--samples`` items of each LongBench task, prompts truncated to the context."""
    tasks = select_tasks(args, TASKS, "LongBench")
    root = _data_dir(args)
    out = []
    for task in tasks:
        if root is None:
            rows = _hub("THUDM/LongBench", task, "test")
        else:
            path = root / f"{task}.jsonl"
            if not path.is_file():
                raise DapqError(f"{path}: missing (LongBench's data/{task}.jsonl)")
            rows = read_jsonl(path)
        for i, row in enumerate(rows[: args.samples]):
            prompt = truncate_middle(tokenizer, PROMPTS[task].format(**row), _budget(args, MAX_NEW_TOKENS[task]))
            out.append(Sample(
                taskset="longbench", task=task, sample_id=f"longbench-{task}-{row.get('_id', i)}", prompt=prompt,
                references=tuple(str(a) for a in row["answers"]), metric=METRIC[task], max_new_tokens=MAX_NEW_TOKENS[task],
                chat=task not in NO_CHAT,
                metric_args={"all_classes": tuple(row.get("all_classes") or ())} if task == "trec" else {},
                meta={"length": row.get("length"), "first_line": task in FIRST_LINE},
            ))
    return out


@taskset("longbench-v2")
def longbench_v2_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    """LongBench v2 multiple choice; the report adds easy/hard and short/medium/long columns."""
    root = _data_dir(args)
    if root is None:
        rows = _hub("THUDM/LongBench-v2", None, "train")
    else:
        path = root / "data.json"
        if path.is_file():
            try:
                rows = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                raise DapqError(f"{path}: not valid JSON") from None
        elif (root / "data.jsonl").is_file():
            rows = read_jsonl(root / "data.jsonl")
        else:
            raise DapqError(f"{root}: no data.json (LongBench v2's file)")
    out = []
    for row in rows[: args.samples]:
        context = truncate_middle(tokenizer, row["context"], _budget(args, 32))
        prompt = V2_TEMPLATE.format(context=context, question=row["question"], A=row["choice_A"], B=row["choice_B"],
                                    C=row["choice_C"], D=row["choice_D"])
        out.append(Sample(
            taskset="longbench-v2", task="longbench-v2", sample_id=f"longbench-v2-{row['_id']}", prompt=prompt,
            references=(row["answer"],), metric="choice", max_new_tokens=32,
            meta={"splits": [row.get("difficulty", "?"), row.get("length", "?")]},
        ))
    return out
