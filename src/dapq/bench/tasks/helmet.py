"""HELMET's ICL, LongQA and RAG subsets (the DapQ paper's Table 14).

Yen et al., "HELMET: How to Evaluate Long-Context Language Models Effectively and Thoroughly"
(arXiv 2410.02694). HELMET builds its inputs from many source datasets; dapq reads one JSONL
file per subset from ``--data DIR`` (``icl.jsonl``, ``longqa.jsonl``, ``rag.jsonl``), one item a
line, with HELMET's own field names where it has them:

- ``icl``: ``context`` (the demonstrations), ``question``, ``answers`` (label strings). Metric:
  exact match of the first line (HELMET's ICL accuracy).
- ``longqa``: ``context`` (the book or document), ``question``, ``answers``. Metric: ROUGE-L F1
  (HELMET's NarrativeQA / InfBench QA metric).
- ``rag``: ``question``, ``answers`` and either ``ctxs`` (list of ``{title, text}``, HELMET's KILT
  files) or ``context``. Metric: substring exact match (SubEM).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import DapqError
from .base import Sample, TaskArgs, select_tasks, taskset
from .longbench import _budget, _data_dir, read_jsonl, truncate_middle

SUBSETS = {
    "icl": ("Use the examples below to label the last input. Answer with the label only.\n\n{context}\n\n"
            "{question}\nlabel:", "exact_match", 20),
    "longqa": ("You are given a story, which can be either a novel or a movie script, and a question. Answer the "
               "question as concisely as you can, using a single phrase if possible.\n\n{context}\n\n"
               "Question: {question}\nAnswer:", "rouge_l", 64),
    "rag": ("Write a high-quality answer for the given question using only the provided search results.\n\n"
            "{context}\n\nQuestion: {question}\nAnswer:", "subem", 20),
}


def _context(row: dict) -> str:
    if "ctxs" in row:
        return "\n\n".join(f"Document (Title: {c.get('title', '')}): {c.get('text', '')}" for c in row["ctxs"])
    return row["context"]


@taskset("helmet")
def helmet_samples(tokenizer, args: TaskArgs) -> list[Sample]:
    subsets = select_tasks(args, tuple(SUBSETS), "HELMET")
    root = _data_dir(args)
    if root is None:
        raise DapqError("HELMET has no single hub dataset; give --data DIR with icl/longqa/rag .jsonl files")
    out = []
    for subset in subsets:
        template, metric, max_new = SUBSETS[subset]
        path = Path(root) / f"{subset}.jsonl"
        if not path.is_file():
            raise DapqError(f"{path}: missing")
        for i, row in enumerate(read_jsonl(path)[: args.samples]):
            context = truncate_middle(tokenizer, _context(row), _budget(args, max_new))
            answers = row["answers"] if isinstance(row["answers"], list) else [row["answers"]]
            out.append(Sample(
                taskset="helmet", task=subset, sample_id=f"helmet-{subset}-{row.get('id', i)}",
                prompt=template.format(context=context, question=row["question"]),
                references=tuple(str(a) for a in answers), metric=metric, max_new_tokens=max_new,
            ))
    return out
