"""LongBench (the 13 English tasks of the DapQ paper's Table 2) and LongBench v2.

Bai et al., "LongBench: A Bilingual, Multitask Benchmark for Long Context Understanding" (ACL
2024) and "LongBench v2" (arXiv 2412.15204). Everything follows THUDM/LongBench:

- LongBench: prompt templates and generation lengths are ``LongBench/config/dataset2prompt.json``
  and ``dataset2maxlen.json`` byte for byte; ``LongBench/pred.py``: the whole formatted prompt is
  truncated in the middle (first and last ``max_length // 2`` tokens) and the few-shot and code
  tasks skip the chat template; ``LongBench/eval.py``: trec, triviaqa and samsum score the first
  line of the prediction (after leading newlines), each ground truth is scored and the best
  kept, a task's score is ``round(100 * mean, 2)`` (in ``dapq report``).
- LongBench v2: ``prompts/0shot.txt`` filled by successive ``str.replace`` of the stripped
  fields, the whole prompt truncated in the middle (``ids[:L//2] + ids[-L//2:]``, decoded
  together), chat template, 128 new tokens, ``extract_answer`` (``pred.py``); ``result.py``'s
  columns Overall, Easy, Hard (any difficulty but "easy"), Short, Medium, Long (any length
  but "short" and "medium"), in % with one decimal.

Data (``--data DIR``), the folders LongBench's own downloads produce:

- LongBench: ``DIR/{task}.jsonl`` (unzipped ``data.zip``: give its ``data/`` folder or the
  folder above it), one object a line with ``input``, ``context``, ``answers`` (list),
  ``all_classes`` (trec), ``length``, ``_id``.
- LongBench v2: ``DIR/data.json`` (a JSON list; ``data.jsonl`` is accepted too) with ``_id``,
  ``difficulty``, ``length``, ``question``, ``choice_A``..``choice_D``, ``answer``, ``context``.

``--data hub`` loads ``THUDM/LongBench`` (one config per task, split ``test``) and
``THUDM/LongBench-v2`` (split ``train``) through ``datasets`` where the hub is reachable.
"""

from __future__ import annotations

from pathlib import Path

from .base import Sample, TaskArgs, select_tasks, taskset
from .files import data_root, hub_rows, locate, read_json_list, read_jsonl, require, require_list

# config/dataset2prompt.json of THUDM/LongBench (checked byte for byte in the tests).
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

# prompts/0shot.txt of THUDM/LongBench (LongBench v2), no trailing newline.
V2_TEMPLATE = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
    "Format your response as follows: \"The correct answer is (insert answer here)\"."
)
V2_FIELDS = (("$DOC$", "context"), ("$Q$", "question"), ("$C_A$", "choice_A"), ("$C_B$", "choice_B"),
             ("$C_C$", "choice_C"), ("$C_D$", "choice_D"))
V2_MAX_NEW_TOKENS = 128  # pred.py, without chain of thought

LONGBENCH_FIELDS = ("input", "context", "answers")
LONGBENCH_WHAT = "LongBench rows have input, context, answers, all_classes, length, _id"
V2_WHAT = "LongBench v2 rows have _id, difficulty, length, question, choice_A..choice_D, answer, context"


def _middle(tokenizer, ids: list[int], max_tokens: int) -> tuple[str, str] | None:
    """LongBench's middle truncation of token ids, as (head text, tail text); None if it fits."""
    if len(ids) <= max_tokens:
        return None
    half = max_tokens // 2
    return (tokenizer.decode(ids[:half], skip_special_tokens=True),
            tokenizer.decode(ids[-half:], skip_special_tokens=True))


def truncate_middle(tokenizer, text: str, max_tokens: int) -> str:
    """LongBench's truncation: keep the first and last ``max_tokens // 2`` tokens.

    As in ``pred.py`` the text is tokenised with the tokenizer's special tokens (a BOS counts
    towards the first half) and each half is decoded without them.
    """
    parts = _middle(tokenizer, tokenizer(text)["input_ids"], max_tokens)
    return text if parts is None else parts[0] + parts[1]


def _context_end(prompt: str, after: str, cut: int) -> int:
    """Where the context ends in a (possibly truncated) prompt whose text after the context is ``after``.

    Middle truncation keeps the prompt's end, so the context ends ``len(after)`` characters
    before the end. If the cut fell inside ``after`` itself (a question longer than half the
    budget), everything kept before the cut (``cut`` characters) is context.
    """
    if prompt.endswith(after) and len(prompt) > len(after):
        return len(prompt) - len(after)
    return max(1, min(cut, len(prompt)))


def _budget(args: TaskArgs, max_new: int) -> int:
    # Room for the chat template and the answer, as LongBench reserves room for generation.
    context = args.max_context or 8192
    limit = min(context, max(args.lengths)) if args.lengths else context
    return max(256, limit - max_new - 64)


def longbench_prompt(tokenizer, task: str, row: dict, max_tokens: int) -> tuple[str, int]:
    """The task's prompt for ``row``, middle-truncated to ``max_tokens``, and its context end."""
    before, _, after = PROMPTS[task].partition("{context}")
    before, after = before.format(**row), after.format(**row)
    prompt = before + row["context"] + after  # == PROMPTS[task].format(**row)
    parts = _middle(tokenizer, tokenizer(prompt)["input_ids"], max_tokens)
    if parts is None:
        return prompt, len(before) + len(row["context"])
    truncated = parts[0] + parts[1]
    return truncated, _context_end(truncated, after, len(parts[0]))


def _longbench_rows(root: Path | None, task: str) -> tuple[list[dict], object]:
    if root is None:
        return hub_rows("THUDM/LongBench", task, "test"), f"THUDM/LongBench ({task})"
    path = locate(root, f"{task}.jsonl")
    return read_jsonl(path, f"LongBench's data/{task}.jsonl"), path


@taskset("longbench")
def longbench_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    """The first ``--samples`` items of each LongBench task, prompts truncated to the context."""
    tasks = select_tasks(args, TASKS, "LongBench")
    root = data_root(args)
    out = []
    for task in tasks:
        rows, source = _longbench_rows(root, task)
        rows = require(rows[: args.samples], LONGBENCH_FIELDS, source, LONGBENCH_WHAT)
        require_list(rows, "answers", source, LONGBENCH_WHAT)
        if task == "trec":
            require_list(rows, "all_classes", source, LONGBENCH_WHAT)
        for i, row in enumerate(rows):
            prompt, context_end = longbench_prompt(tokenizer, task, row, _budget(args, MAX_NEW_TOKENS[task]))
            out.append(Sample(
                taskset="longbench", task=task, sample_id=f"longbench-{task}-{row.get('_id', i)}", prompt=prompt,
                references=tuple(str(a) for a in row["answers"]), metric=METRIC[task],
                max_new_tokens=MAX_NEW_TOKENS[task], chat=task not in NO_CHAT, context_end=context_end,
                metric_args={"all_classes": tuple(row["all_classes"])} if task == "trec" else {},
                # LongBench's "length" is the context's word count, not a prompt length in tokens:
                # kept under its own name so that the report's by-length table leaves it alone.
                meta={"context_words": row.get("length"), "first_line": task in FIRST_LINE},
            ))
    return out


def v2_prompt(tokenizer, row: dict, max_tokens: int) -> tuple[str, int]:
    """LongBench v2's prompt for ``row`` (``pred.py``), truncated to ``max_tokens``, and its context end."""
    prompt = V2_TEMPLATE
    for placeholder, name in V2_FIELDS:  # successive replaces, as pred.py does them
        prompt = prompt.replace(placeholder, str(row[name]).strip())
    after = V2_TEMPLATE.partition("$DOC$")[2]
    for placeholder, name in V2_FIELDS[1:]:
        after = after.replace(placeholder, str(row[name]).strip())
    ids = tokenizer(prompt)["input_ids"]  # pred.py: tokenizer.encode(prompt), special tokens included
    if len(ids) <= max_tokens:
        return prompt, _context_end(prompt, after, len(prompt))
    # pred.py: input_ids[:max_len//2] + input_ids[-max_len//2:], decoded together; -L//2 is
    # (-L)//2, one token more than L//2 when L is odd.
    head = ids[: max_tokens // 2]
    truncated = tokenizer.decode(head + ids[(-max_tokens) // 2 :], skip_special_tokens=True)
    return truncated, _context_end(truncated, after, len(tokenizer.decode(head, skip_special_tokens=True)))


def v2_splits(row: dict) -> list[str]:
    """result.py's columns: easy or hard (anything else), short, medium or long (anything else)."""
    difficulty = "easy" if row.get("difficulty") == "easy" else "hard"
    length = row.get("length") if row.get("length") in ("short", "medium") else "long"
    return [difficulty, length]


@taskset("longbench-v2")
def longbench_v2_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    """LongBench v2 multiple choice; the report adds easy/hard and short/medium/long columns."""
    root = data_root(args)
    if root is None:
        rows, source = hub_rows("THUDM/LongBench-v2", None, "train"), "THUDM/LongBench-v2"
    else:
        source = locate(root, "data.json")
        if not source.is_file() and locate(root, "data.jsonl").is_file():
            source = locate(root, "data.jsonl")
            rows = read_jsonl(source, "LongBench v2's data.json as JSON lines")
        else:
            rows = read_json_list(source, "LongBench v2's data.json")
    fields = ("_id", "question", "answer", *(name for _, name in V2_FIELDS))
    rows = require(rows[: args.samples], fields, source, V2_WHAT)
    out = []
    for row in rows:
        prompt, context_end = v2_prompt(tokenizer, row, _budget(args, V2_MAX_NEW_TOKENS))
        out.append(Sample(
            taskset="longbench-v2", task="longbench-v2", sample_id=f"longbench-v2-{row['_id']}", prompt=prompt,
            references=(str(row["answer"]),), metric="choice", max_new_tokens=V2_MAX_NEW_TOKENS,
            context_end=context_end, meta={"splits": v2_splits(row)},
        ))
    return out
